//! Extended attributes of an inode: in the inode's spare bytes while they fit, then in one
//! external block.
//!
//! Promises: a set or remove changes the inode and its block in one transaction; a block
//! shared by several inodes (refcount > 1, as Linux makes when identical attribute sets
//! are deduplicated) is never changed in place: this inode gets its own copy. A value that
//! cannot fit is refused with ENOSPC before anything changes.

use crate::blockmap::add_blocks;
use crate::error::{FsError, FsResult};
use crate::format::inode::Inode;
use crate::format::xattr::{self, XattrEntry};
use crate::meta::MetaIo;
use crate::state::FsInner;
use crate::tx::Tx;

/// How `set` treats an existing attribute (`setxattr` flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSetMode {
    /// Create or replace.
    #[default]
    Either,
    /// `XATTR_CREATE`: fail with EEXIST if it exists.
    Create,
    /// `XATTR_REPLACE`: fail with ENODATA if it does not.
    Replace,
}

struct Attrs {
    in_inode: Vec<XattrEntry>,
    in_block: Vec<XattrEntry>,
    block: u64,
    refcount: u32,
}

fn read_all(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<Attrs> {
    let in_inode = xattr::decode_inode_area(raw.xattr_area(), ino)?;
    let block = raw.file_acl();
    let (in_block, refcount) = if block == 0 {
        (Vec::new(), 0)
    } else {
        if block >= fs.geo.blocks_count {
            return Err(FsError::Inconsistent(format!(
                "inode {ino}: xattr block {block} is beyond the file system"
            )));
        }
        let bytes = fs.cache.get(block)?.bytes();
        let (header, entries) = xattr::decode_block(&bytes, block, fs.csum_seed)?;
        (entries, header.refcount)
    };
    Ok(Attrs {
        in_inode,
        in_block,
        block,
        refcount,
    })
}

fn parse_name(full: &[u8]) -> FsResult<XattrEntry> {
    if full.len() > 255 {
        return Err(FsError::Range(format!(
            "xattr name of {} bytes",
            full.len()
        )));
    }
    let entry = XattrEntry::from_full_name(full, Vec::new()).ok_or_else(|| {
        FsError::Unsupported(format!(
            "xattr namespace of {:?}",
            String::from_utf8_lossy(full)
        ))
    })?;
    if entry.name.is_empty() && entry.name_index != 2 && entry.name_index != 3 {
        return Err(FsError::Invalid(format!(
            "xattr name {:?} has nothing after its prefix",
            String::from_utf8_lossy(full)
        )));
    }
    Ok(entry)
}

fn same(a: &XattrEntry, b: &XattrEntry) -> bool {
    a.name_index == b.name_index && a.name == b.name
}

/// Whether the inode may have attributes at all (a quick test before a lookup: an inode
/// with neither an xattr block nor the in-inode area's magic has none).
pub(crate) fn may_have_any(raw: &Inode) -> bool {
    let area = raw.xattr_area();
    raw.file_acl() != 0 || area.get(..4) == Some(&xattr::XATTR_MAGIC.to_le_bytes()[..])
}

/// Full names of every attribute.
pub(crate) fn list(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<Vec<Vec<u8>>> {
    let attrs = read_all(fs, ino, raw)?;
    Ok(attrs
        .in_inode
        .iter()
        .chain(&attrs.in_block)
        .map(|e| e.full_name())
        .collect())
}

/// The value of attribute `name`.
pub(crate) fn get(fs: &FsInner, ino: u32, raw: &Inode, name: &[u8]) -> FsResult<Vec<u8>> {
    let key = parse_name(name)?;
    let attrs = read_all(fs, ino, raw)?;
    attrs
        .in_inode
        .iter()
        .chain(&attrs.in_block)
        .find(|e| same(e, &key))
        .map(|e| e.value.clone())
        .ok_or_else(|| FsError::NoAttribute(String::from_utf8_lossy(name).into_owned()))
}

/// Sets attribute `name` to `value`.
pub(crate) fn set(
    tx: &mut Tx,
    ino: u32,
    name: &[u8],
    value: &[u8],
    mode: XattrSetMode,
) -> FsResult<()> {
    let mut entry = parse_name(name)?;
    entry.value = value.to_vec();
    let raw = tx.raw_inode(ino)?;
    let mut attrs = read_all(tx.fs, ino, &raw)?;
    let existed = remove_from(&mut attrs, &entry);
    match (mode, existed) {
        (XattrSetMode::Create, true) => {
            return Err(FsError::Exists(String::from_utf8_lossy(name).into_owned()))
        }
        (XattrSetMode::Replace, false) => {
            return Err(FsError::NoAttribute(
                String::from_utf8_lossy(name).into_owned(),
            ))
        }
        _ => {}
    }
    let bs = tx.fs.geo.block_size as usize;
    let area = raw.xattr_area().len();
    let mut with_new = attrs.in_inode.clone();
    with_new.push(entry.clone());
    if xattr::fits_inode_area(area, &with_new) {
        attrs.in_inode = with_new;
    } else {
        let mut block = attrs.in_block.clone();
        block.push(entry);
        if !xattr::fits_block(bs, &block) {
            return Err(FsError::NoSpace(format!(
                "{} bytes of attributes do not fit an inode's xattr block",
                xattr::space_needed(&block)
            )));
        }
        attrs.in_block = block;
    }
    store(tx, ino, attrs)
}

/// Removes attribute `name`.
pub(crate) fn remove(tx: &mut Tx, ino: u32, name: &[u8]) -> FsResult<()> {
    let key = parse_name(name)?;
    let raw = tx.raw_inode(ino)?;
    let mut attrs = read_all(tx.fs, ino, &raw)?;
    if !remove_from(&mut attrs, &key) {
        return Err(FsError::NoAttribute(
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    store(tx, ino, attrs)
}

fn remove_from(attrs: &mut Attrs, key: &XattrEntry) -> bool {
    let before = attrs.in_inode.len() + attrs.in_block.len();
    attrs.in_inode.retain(|e| !same(e, key));
    attrs.in_block.retain(|e| !same(e, key));
    before != attrs.in_inode.len() + attrs.in_block.len()
}

/// Writes the inode's attribute area and its block.
fn store(tx: &mut Tx, ino: u32, attrs: Attrs) -> FsResult<()> {
    tx.fc_ineligible(crate::fast_commit::Ineligible::Xattr);
    let fits = xattr::encode_inode_area(tx.inode(ino)?.raw.xattr_area_mut(), &attrs.in_inode);
    assert!(fits, "in-inode attributes were sized before storing");
    let bs = tx.fs.geo.block_size as usize;
    let seed = tx.fs.csum_seed;
    let mut block = attrs.block;
    if attrs.in_block.is_empty() {
        drop_block(tx, ino)?;
    } else {
        if block == 0 || attrs.refcount > 1 {
            if block != 0 {
                release_shared(tx, block, attrs.refcount)?;
            } else {
                add_blocks(tx, ino, 1)?;
            }
            let goal = tx.fs.geo.group_first_block(tx.fs.geo.inode_position(ino).0);
            block = tx.alloc_meta_block(goal)?;
            tx.inode(ino)?.raw.set_file_acl(block);
        }
        tx.modify(block, |b| {
            assert!(
                xattr::encode_block(b, 1, &attrs.in_block, block, seed),
                "block attributes were sized before storing"
            );
        })?;
        debug_assert_eq!(bs, tx.fs.geo.block_size as usize);
    }
    tx.write_inode(ino)
}

/// Lets go of a block other inodes still share: one reference fewer.
fn release_shared(tx: &mut Tx, block: u64, refcount: u32) -> FsResult<()> {
    let bytes = tx.buffer(block)?.bytes();
    let (_, entries) = xattr::decode_block(&bytes, block, tx.fs.csum_seed)?;
    let seed = tx.fs.csum_seed;
    tx.modify(block, |b| {
        assert!(xattr::encode_block(b, refcount - 1, &entries, block, seed));
    })
}

/// Drops the inode's xattr block (freed, or one reference fewer if shared).
pub(crate) fn drop_block(tx: &mut Tx, ino: u32) -> FsResult<()> {
    let block = tx.inode(ino)?.raw.file_acl();
    if block == 0 {
        return Ok(());
    }
    let bytes = tx.buffer(block)?.bytes();
    let (header, _) = xattr::decode_block(&bytes, block, tx.fs.csum_seed)?;
    if header.refcount > 1 {
        release_shared(tx, block, header.refcount)?;
    } else {
        tx.free_meta_block(block)?;
    }
    tx.inode(ino)?.raw.set_file_acl(0);
    add_blocks(tx, ino, -1)
}
