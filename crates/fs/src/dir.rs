//! Directories: names to inode numbers, in linear blocks or a hashed tree (htree).
//!
//! A linear directory is scanned block by block. An indexed one (`INDEX` flag, with the
//! `dir_index` feature) keeps an index in block 0 and up to one level of index nodes (two
//! with `large_dir`) that sends a name's hash to the leaf block holding it: a lookup reads
//! one block per level and one leaf, O(log n). A linear directory becomes indexed when
//! its only block fills, as ext4 does; a full leaf splits in two by hash; a full node
//! splits and passes an entry up; a full root moves into a node, adding a level.
//!
//! Promises: every block read is checked (checksum tail, entry chain, index) before use,
//! its checksum and the order of its index hashes once while it stays cached (see
//! [`read_checked`]); every block written gets a fresh checksum; an index lookup binary-
//! searches the block's bytes in place; an index entry's hash is the lowest hash in
//! its subtree, with bit 0 set when a hash run continues from the previous leaf. A failed
//! capacity check happens before anything changes.
//! Readdir cookies: byte offsets in linear directories, hash positions in indexed ones, so
//! a leaf split during a listing neither repeats nor skips an entry. A listing streams:
//! each batch starts at the cookie's leaf (found through the index, O(log n)) and reads
//! only the leaves it returns.

use crate::blockmap;
use crate::error::{FsError, FsResult};
use crate::format::csum::inode_seed;
use crate::format::dirent::{self, EntryRef, RawEntry, MAX_NAME_LEN};
use crate::format::hash::dirhash;
use crate::format::htree::{
    self, DxEntries, DxEntry, DxRootInfo, NODE_COUNT_OFFSET, ROOT_COUNT_OFFSET,
};
use crate::format::inode::{flags, Inode};
use crate::format::Location;
use crate::state::FsInner;
use crate::tx::Tx;
use std::sync::Arc;

/// Where a name was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Found {
    pub ino: u32,
    pub file_type: u8,
    pub logical: u32,
    pub offset: usize,
}

/// Where a name a lookup did not find would go in an indexed directory: the leaf its hash
/// leads to and the first record there with room for it. The lookup that showed the name
/// absent finds it in the same walk, so that the insert need not walk the index and scan
/// the leaf again (for 10^6 names in one directory: root, node and leaf resolved twice,
/// and the leaf scanned twice, per create). Good while the caller holds the directory's
/// inode lock from the lookup to the insert, as a create does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    phys: u64,
    offset: usize,
    /// The size of the record the room was found for.
    needed: usize,
}

/// One listed entry with its readdir cookie.
pub(crate) struct Listed {
    pub ino: u32,
    pub file_type: u8,
    pub name: Vec<u8>,
    pub next_cookie: u64,
}

/// Checks a name a user wants to create.
pub(crate) fn check_name(name: &[u8]) -> FsResult<()> {
    let shown = || String::from_utf8_lossy(name).into_owned();
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(FsError::Invalid(format!(
            "{:?} is not a valid file name",
            shown()
        )));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(FsError::NameTooLong(shown()));
    }
    Ok(())
}

fn tail(fs: &FsInner) -> bool {
    fs.csum_seed.is_some()
}

fn seed(fs: &FsInner, ino: u32, raw: &Inode) -> Option<u32> {
    fs.csum_seed.map(|s| inode_seed(s, ino, raw.generation()))
}

pub(crate) fn is_indexed(fs: &FsInner, raw: &Inode) -> bool {
    fs.dir_index && raw.flags() & flags::INDEX != 0
}

fn block_count(fs: &FsInner, raw: &Inode) -> u32 {
    (raw.size() / u64::from(fs.geo.block_size)) as u32
}

/// The physical block of directory block `logical`.
fn block_of(fs: &FsInner, ino: u32, raw: &Inode, logical: u32) -> FsResult<u64> {
    let extent = blockmap::lookup(fs, ino, raw, logical)?;
    let Some(e) = extent.filter(|e| !e.unwritten) else {
        return Err(FsError::Inconsistent(format!(
            "directory {ino} has a hole at block {logical}"
        )));
    };
    Ok(e.start + u64::from(logical - e.logical))
}

/// The physical block and bytes of directory block `logical`, unchecked.
fn read_block(fs: &FsInner, ino: u32, raw: &Inode, logical: u32) -> FsResult<(u64, Arc<[u8]>)> {
    let phys = block_of(fs, ino, raw, logical)?;
    Ok((phys, fs.cache.get(phys)?.bytes()))
}

/// What a directory block is read as: each kind has its own checks, run once while the
/// block stays cached ([`jext_cache::BufferCache::get_checked`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A linear block or an htree leaf: its checksum tail.
    Leaf = 1,
    /// Block 0 of an indexed directory: its fields, entries and checksum.
    Root = 2,
    /// An interior index node: its entries and checksum.
    Node = 3,
}

/// The buffer cache's name for "checked as `kind` with this checksum seed".
fn checked_as(kind: Kind, seed: Option<u32>) -> u64 {
    (kind as u64) << 33 | u64::from(seed.is_some()) << 32 | u64::from(seed.unwrap_or(0))
}

/// Directory block `logical` read as `kind`, checked once while it stays cached: every
/// change this process makes to a directory block rewrites its checksum (see the writers
/// below), so a cached copy that passed stays good. The checks that every read needs to
/// walk the block (the entry chain, an index block's `limit` and `count`) run at each use.
fn read_checked(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    logical: u32,
    kind: Kind,
) -> FsResult<(u64, Arc<[u8]>)> {
    let phys = block_of(fs, ino, raw, logical)?;
    let seed = seed(fs, ino, raw);
    let loc = Location::Block {
        block: phys,
        ino: Some(ino),
    };
    let check = |bytes: &[u8]| -> FsResult<()> {
        match kind {
            Kind::Leaf => {
                if let Some(seed) = seed {
                    if !dirent::has_tail(bytes) {
                        return Err(FsError::Corrupt(crate::format::FormatError::new(
                            "directory block",
                            loc,
                            "no checksum tail in a metadata_csum file system",
                        )));
                    }
                    dirent::verify_checksum(bytes, seed, loc)?;
                }
            }
            Kind::Root => {
                let levels = max_indirect_levels(fs);
                let (_, entries) = htree::root_in_place(bytes, tail(fs), levels, loc)?;
                entries.check_order(loc)?;
                if let Some(seed) = seed {
                    htree::verify_checksum(bytes, ROOT_COUNT_OFFSET, seed, loc)?;
                }
            }
            Kind::Node => {
                htree::node_in_place(bytes, tail(fs), loc)?.check_order(loc)?;
                if let Some(seed) = seed {
                    htree::verify_checksum(bytes, NODE_COUNT_OFFSET, seed, loc)?;
                }
            }
        }
        Ok(())
    };
    let buf = fs.cache.get_checked(phys, checked_as(kind, seed), check)?;
    Ok((phys, buf.bytes()))
}

/// Parses a leaf (or linear) block read with [`read_checked`].
fn parse_leaf(fs: &FsInner, ino: u32, phys: u64, bytes: &[u8]) -> FsResult<Vec<RawEntry>> {
    let mut entries = Vec::new();
    visit_leaf(fs, ino, phys, bytes, |e| entries.push(e.to_owned()))?;
    Ok(entries)
}

/// Shows each record of a leaf (or linear) block read with [`read_checked`] to `visit`
/// as [`dirent::for_each_entry`] does, without copying names.
fn visit_leaf<'a>(
    fs: &FsInner,
    ino: u32,
    phys: u64,
    bytes: &'a [u8],
    visit: impl FnMut(EntryRef<'a>),
) -> FsResult<()> {
    let loc = Location::Block {
        block: phys,
        ino: Some(ino),
    };
    Ok(dirent::for_each_entry(bytes, tail(fs), loc, visit)?)
}

fn hash_version(fs: &FsInner, stored: u8) -> u8 {
    if fs.hash_unsigned && stored <= 2 {
        stored + 3
    } else {
        stored
    }
}

fn name_hash(fs: &FsInner, version: u8, name: &[u8], ino: u32) -> FsResult<(u32, u32)> {
    dirhash(name, hash_version(fs, version), fs.hash_seed)
        .ok_or_else(|| FsError::Unsupported(format!("directory {ino} uses hash version {version}")))
}

/// Looks `name` up in directory `ino`.
pub(crate) fn lookup(fs: &FsInner, ino: u32, raw: &Inode, name: &[u8]) -> FsResult<Option<Found>> {
    Ok(lookup_for_add(fs, ino, raw, name)?.ok())
}

/// Looks `name` up in directory `ino`; when it is not there, says where [`add_at`] can
/// put it without another walk, if the directory is indexed and the leaf has room.
pub(crate) fn lookup_for_add(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    name: &[u8],
) -> FsResult<Result<Found, Option<Room>>> {
    if is_indexed(fs, raw) {
        return htree_lookup(fs, ino, raw, name);
    }
    for logical in 0..block_count(fs, raw) {
        let (phys, bytes) = read_checked(fs, ino, raw, logical, Kind::Leaf)?;
        if let (Some(found), _) = search(fs, ino, (logical, phys, &bytes), name, None)? {
            return Ok(Ok(found));
        }
    }
    Ok(Err(None))
}

/// Looks `name` up in one leaf (or linear) block at logical block `logical`; with
/// `needed`, also finds the first record with that much room (what [`insert_into`] would
/// take), in the same scan.
fn search(
    fs: &FsInner,
    ino: u32,
    (logical, phys, bytes): (u32, u64, &[u8]),
    name: &[u8],
    needed: Option<usize>,
) -> FsResult<(Option<Found>, Option<Room>)> {
    let (mut found, mut room) = (None, None);
    visit_leaf(fs, ino, phys, bytes, |e| {
        if found.is_none() && e.inode != 0 && e.name == name {
            found = Some(Found {
                ino: e.inode,
                file_type: e.file_type,
                logical,
                offset: e.offset,
            });
        }
        if let Some(needed) = needed.filter(|&n| room.is_none() && e.rec_len - e.used_size() >= n) {
            room = Some(Room {
                phys,
                offset: e.offset,
                needed,
            });
        }
    })?;
    Ok((found, room))
}

/// One index block on the path to a leaf: the root (logical block 0) or a node.
struct Level {
    phys: u64,
    /// The bytes as read, which passed [`read_checked`].
    bytes: Arc<[u8]>,
    count_offset: usize,
    /// The entry taken.
    slot: usize,
}

impl Level {
    fn entries(&self) -> DxEntries<'_> {
        DxEntries::of_checked(&self.bytes, self.count_offset)
    }

    /// The logical block the taken entry points at.
    fn child(&self) -> u32 {
        self.entries().get(self.slot).block
    }
}

/// The path through the index to the leaf for one hash.
struct DxPath {
    info: DxRootInfo,
    /// The root, then one level per node, from the root down.
    levels: Vec<Level>,
}

impl DxPath {
    fn leaf(&self) -> u32 {
        self.levels.last().expect("a path holds its root").child()
    }
}

/// Index levels below the root this file system allows (2 with `large_dir`).
fn max_indirect_levels(fs: &FsInner) -> u8 {
    if fs.large_dir {
        htree::MAX_INDIRECT_LEVELS_LARGE_DIR
    } else {
        htree::MAX_INDIRECT_LEVELS
    }
}

/// The path's root: block 0, at slot 0 (see [`dx_seek`]).
fn dx_root(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<DxPath> {
    let (phys, bytes) = read_checked(fs, ino, raw, 0, Kind::Root)?;
    let loc = Location::Block {
        block: phys,
        ino: Some(ino),
    };
    let (info, _) = htree::root_in_place(&bytes, tail(fs), max_indirect_levels(fs), loc)?;
    let mut levels = Vec::with_capacity(1 + usize::from(info.indirect_levels));
    levels.push(Level {
        phys,
        bytes,
        count_offset: ROOT_COUNT_OFFSET,
        slot: 0,
    });
    Ok(DxPath { info, levels })
}

/// Descends from the root to the leaf for `hash`: one block read per level, O(log n).
fn dx_seek(fs: &FsInner, ino: u32, raw: &Inode, path: &mut DxPath, hash: u32) -> FsResult<()> {
    path.levels.truncate(1);
    let root = &mut path.levels[0];
    root.slot = root.entries().slot_for(hash);
    descend(fs, ino, raw, path, Some(hash))
}

/// Fills `path.levels` below the deepest level it holds: at the slot for `hash`, or at
/// slot 0 of each node when `hash` is `None` (after moving to the next entry above).
fn descend(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    path: &mut DxPath,
    hash: Option<u32>,
) -> FsResult<()> {
    while path.levels.len() <= usize::from(path.info.indirect_levels) {
        let logical = path.leaf();
        let (phys, bytes) = read_checked(fs, ino, raw, logical, Kind::Node)?;
        let loc = Location::Block {
            block: phys,
            ino: Some(ino),
        };
        let entries = htree::node_in_place(&bytes, tail(fs), loc)?;
        let slot = hash.map_or(0, |h| entries.slot_for(h));
        path.levels.push(Level {
            phys,
            bytes,
            count_offset: NODE_COUNT_OFFSET,
            slot,
        });
    }
    Ok(())
}

/// Moves to the next leaf in hash order; returns the hash that leaf starts at.
fn dx_next(fs: &FsInner, ino: u32, raw: &Inode, path: &mut DxPath) -> FsResult<Option<u32>> {
    // The deepest level that has an entry after its slot moves; those below restart.
    while let Some(level) = path.levels.last_mut() {
        let entries = level.entries();
        let next = level.slot + 1;
        if next < entries.len() {
            let hash = entries.get(next).hash;
            level.slot = next;
            descend(fs, ino, raw, path, None)?;
            return Ok(Some(hash));
        }
        path.levels.pop();
    }
    // The last leaf was passed; the path is spent.
    Ok(None)
}

/// The htree lookup; the room is in the first leaf, the one `htree_add` inserts into.
fn htree_lookup(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    name: &[u8],
) -> FsResult<Result<Found, Option<Room>>> {
    let mut path = dx_root(fs, ino, raw)?;
    let (major, _) = name_hash(fs, path.info.hash_version, name, ino)?;
    dx_seek(fs, ino, raw, &mut path, major)?;
    let mut needed = Some(dirent::entry_size(name.len()));
    let mut room = None;
    loop {
        let logical = path.leaf();
        let (phys, bytes) = read_checked(fs, ino, raw, logical, Kind::Leaf)?;
        let (found, leaf_room) = search(fs, ino, (logical, phys, &bytes), name, needed.take())?;
        if let Some(found) = found {
            return Ok(Ok(found));
        }
        room = room.or(leaf_room);
        // A run of equal hashes may continue in the next leaf (bit 0 of its hash).
        match dx_next(fs, ino, raw, &mut path)? {
            Some(next) if next & 1 == 1 && next & !1 == major => continue,
            _ => return Ok(Err(room)),
        }
    }
}

/// Entries a readdir batch aims at: enough to fill a FUSE reply, few enough that each
/// call reads a handful of blocks however large the directory is. A READDIR reply is as
/// large as the reader's buffer (32 KiB for glibc's `readdir`), about 1,000 short names;
/// each batch also walks again the leaf where the last one stopped (a cookie names a hash,
/// and the leaf holding it may hold nothing after it), so fewer, larger batches list a
/// large directory with fewer leaves walked twice.
pub(crate) const READDIR_BATCH_ENTRIES: usize = 1024;

/// Lists every entry from `cookie` on (0 starts at the beginning).
pub(crate) fn list(fs: &FsInner, ino: u32, raw: &Inode, cookie: u64) -> FsResult<Vec<Listed>> {
    list_batch(fs, ino, raw, cookie, usize::MAX)
}

/// Lists entries from `cookie` on, stopping at a block boundary once `at_least` are
/// gathered (the caller continues from the last entry's `next_cookie`; an empty answer
/// means the end). Reads only the blocks it lists, starting where the cookie points: a
/// listing never rescans the directory from its start.
pub(crate) fn list_batch(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    cookie: u64,
    at_least: usize,
) -> FsResult<Vec<Listed>> {
    if is_indexed(fs, raw) {
        return htree_list(fs, ino, raw, cookie, at_least);
    }
    let bs = u64::from(fs.geo.block_size);
    let mut out = Vec::new();
    for logical in (cookie / bs) as u32..block_count(fs, raw) {
        if out.len() >= at_least {
            break;
        }
        let (phys, bytes) = read_checked(fs, ino, raw, logical, Kind::Leaf)?;
        for e in parse_leaf(fs, ino, phys, &bytes)? {
            let position = u64::from(logical) * bs + e.offset as u64;
            if e.inode != 0 && position >= cookie {
                out.push(Listed {
                    ino: e.inode,
                    file_type: e.file_type,
                    name: e.name,
                    next_cookie: position + e.rec_len as u64,
                });
            }
        }
    }
    Ok(out)
}

/// The cookie of an entry in an indexed directory: after "." (0) and ".." (1), entries
/// sort by (major, minor) hash, kept below 2^62 so the cookie is a valid file offset.
/// A cookie names a hash position, not a block, so it stays valid while other names are
/// added and leaves split.
fn hash_cookie(major: u32, minor: u32) -> u64 {
    3 + ((u64::from(major >> 1) << 31) | u64::from(minor >> 1))
}

/// The major hash a cookie starts at (the inverse of [`hash_cookie`] on its high part).
fn cookie_major(cookie: u64) -> u32 {
    (((cookie.saturating_sub(3)) >> 31) << 1) as u32
}

/// Lists an indexed directory from `cookie`: descends to the leaf holding the cookie's
/// hash and walks leaves in hash order. A batch ends only where the next leaf starts a
/// new hash (bit 0 of its index hash clear), so a run of equal hashes spread over leaves
/// is always listed, and sorted, within one batch; its last entry's `next_cookie` is then
/// that leaf's first hash position, so the next batch starts there instead of walking
/// (and hashing) again the leaf this one ended with.
fn htree_list(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    cookie: u64,
    at_least: usize,
) -> FsResult<Vec<Listed>> {
    let mut path = dx_root(fs, ino, raw)?;
    let info = path.info;
    // A batch passes `at_least` by at most about a leaf (a leaf holds at most a twelfth of
    // a block in names): reserved at once, the vector is not regrown and copied (8% of
    // the daemon's time listing 10^6 names through the mount).
    let leaf_names = fs.geo.block_size as usize / dirent::entry_size(1);
    let mut out = Vec::with_capacity(at_least.min(READDIR_BATCH_ENTRIES) + leaf_names);
    for (key, name, entry_ino) in [
        (0u64, &b"."[..], info.dot_inode),
        (1, b"..", info.dotdot_inode),
    ] {
        if key >= cookie {
            out.push(Listed {
                ino: entry_ino,
                file_type: 2,
                name: name.to_vec(),
                next_cookie: key + 1,
            });
        }
    }
    dx_seek(fs, ino, raw, &mut path, cookie_major(cookie))?;
    let next_leaf_major = loop {
        let logical = path.leaf();
        let (phys, bytes) = read_checked(fs, ino, raw, logical, Kind::Leaf)?;
        // Names are copied only for the entries listed: most of a leaf may lie before
        // the cookie.
        let mut unhashable = None;
        visit_leaf(fs, ino, phys, &bytes, |e| {
            if e.inode == 0 || unhashable.is_some() {
                return;
            }
            match name_hash(fs, info.hash_version, e.name, ino) {
                Ok((major, minor)) => {
                    let key = hash_cookie(major, minor);
                    if key >= cookie {
                        out.push(Listed {
                            ino: e.inode,
                            file_type: e.file_type,
                            name: e.name.to_vec(),
                            next_cookie: key + 1,
                        });
                    }
                }
                Err(err) => unhashable = Some(err),
            }
        })?;
        if let Some(err) = unhashable {
            return Err(err);
        }
        match dx_next(fs, ino, raw, &mut path)? {
            None => break None,
            Some(next) if next & 1 == 0 && out.len() >= at_least => break Some(next),
            Some(_) => {}
        }
    };
    // "." and ".." (cookies 1 and 2) sort before every hash (3 and up). Unstable: no two
    // entries share a cookie but in a hash collision, whose order no cookie could keep.
    out.sort_unstable_by_key(|l| l.next_cookie);
    if let (Some(major), Some(last)) = (next_leaf_major, out.last_mut()) {
        // Every name before that leaf hashes below `major`, every name in it or after at
        // or above: the position is past the last entry and at or before the next.
        last.next_cookie = last.next_cookie.max(hash_cookie(major, 0));
    }
    Ok(out)
}

/// True if the directory holds nothing but "." and "..".
pub(crate) fn is_empty(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<bool> {
    Ok(list(fs, ino, raw, 0)?
        .iter()
        .all(|l| l.name == b"." || l.name == b".."))
}

/// Writes a fresh first block for new directory `ino` with "." and "..".
pub(crate) fn init(tx: &mut Tx, ino: u32, parent: u32) -> FsResult<()> {
    let with_tail = tail(tx.fs);
    let phys = append_block(tx, ino)?.1;
    let raw = tx.raw_inode(ino)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        dirent::init_dot_block(b, ino, parent, 2, with_tail);
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })
}

/// Points ".." of directory `ino` at `parent`.
pub(crate) fn set_dotdot(tx: &mut Tx, ino: u32, parent: u32) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let indexed = is_indexed(tx.fs, &raw);
    let (phys, bytes) = read_block(tx.fs, ino, &raw, 0)?;
    let second = &bytes[12..];
    if second[6] != 2 || &second[8..10] != b".." {
        return Err(FsError::Inconsistent(format!(
            "directory {ino}: the second entry of block 0 is not \"..\""
        )));
    }
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        b[12..16].copy_from_slice(&parent.to_le_bytes());
        match (seed, indexed) {
            (Some(seed), true) => htree::set_checksum(b, ROOT_COUNT_OFFSET, seed),
            (Some(seed), false) => dirent::set_checksum(b, seed),
            (None, _) => {}
        }
    })
}

/// Grows directory `ino` by one zeroed block; the caller writes the inode.
fn append_block(tx: &mut Tx, ino: u32) -> FsResult<(u32, u64)> {
    let bs = u64::from(tx.fs.geo.block_size);
    let logical = (tx.inode(ino)?.size / bs) as u32;
    let placed = blockmap::allocate(tx, ino, logical, 1, false)?;
    let phys = placed[0].start;
    tx.new_block(phys)?;
    let info = tx.inode(ino)?;
    info.size += bs;
    info.raw.set_size(info.size);
    Ok((logical, phys))
}

/// Rewrites leaf `phys` to hold exactly `entries`.
fn write_leaf(tx: &mut Tx, ino: u32, phys: u64, entries: &[Hashed<'_>]) -> FsResult<()> {
    let with_tail = tail(tx.fs);
    let raw = tx.raw_inode(ino)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        dirent::pack_block(b, with_tail, entries.iter().map(|h| h.2));
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })
}

/// Inserts into leaf `phys`, read as `bytes`, if there is room; hands `bytes` back if
/// there is none. The caller's copy of the bytes is dropped before the change, so the
/// buffer changes in place: a copy held over it made every create copy its leaf.
fn insert_into(
    tx: &mut Tx,
    ino: u32,
    (phys, bytes): (u64, Arc<[u8]>),
    name: &[u8],
    child: u32,
    file_type: u8,
) -> FsResult<Option<Arc<[u8]>>> {
    let needed = dirent::entry_size(name.len());
    let mut room = None;
    visit_leaf(tx.fs, ino, phys, &bytes, |e| {
        if room.is_none() && e.rec_len - e.used_size() >= needed {
            room = Some(e.offset);
        }
    })?;
    let Some(offset) = room else {
        return Ok(Some(bytes));
    };
    drop(bytes);
    // The inode lock held over this operation kept the block as `bytes` showed it.
    insert_record(tx, ino, (phys, offset), name, child, file_type)?;
    Ok(None)
}

/// Puts `name` -> `child` into the slack of the record at `offset` of leaf `phys`, which
/// has room for it, and reseals the leaf's checksum.
fn insert_record(
    tx: &mut Tx,
    ino: u32,
    (phys, offset): (u64, usize),
    name: &[u8],
    child: u32,
    file_type: u8,
) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        dirent::insert_at(b, offset, child, file_type, name);
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })
}

/// [`add`], at `room` when the lookup that showed `name` absent found some (the
/// directory's inode lock held since then kept it as the lookup saw it).
pub(crate) fn add_at(
    tx: &mut Tx,
    ino: u32,
    name: &[u8],
    child: u32,
    file_type: u8,
    room: Option<Room>,
) -> FsResult<()> {
    let needed = dirent::entry_size(name.len());
    let Some(room) = room.filter(|r| r.needed == needed) else {
        return add(tx, ino, name, child, file_type);
    };
    check_name(name)?;
    // Checked again rather than trusted: a wrong room is a fallback, never a panic.
    let fits = tx
        .buffer(room.phys)?
        .read(|b| dirent::room_at(b, room.offset) >= Some(needed));
    if !fits {
        return add(tx, ino, name, child, file_type);
    }
    insert_record(tx, ino, (room.phys, room.offset), name, child, file_type)
}

/// Adds `name` -> `child` to directory `ino` (which must not hold `name`). May grow the
/// directory; the caller writes the directory inode afterwards.
pub(crate) fn add(tx: &mut Tx, ino: u32, name: &[u8], child: u32, file_type: u8) -> FsResult<()> {
    check_name(name)?;
    let raw = tx.raw_inode(ino)?;
    if is_indexed(tx.fs, &raw) {
        return htree_add(tx, ino, name, child, file_type);
    }
    let blocks = block_count(tx.fs, &raw);
    for logical in 0..blocks {
        let leaf = read_checked(tx.fs, ino, &raw, logical, Kind::Leaf)?;
        if insert_into(tx, ino, leaf, name, child, file_type)?.is_none() {
            return Ok(());
        }
    }
    if tx.fs.dir_index && blocks == 1 {
        make_indexed(tx, ino)?;
        return htree_add(tx, ino, name, child, file_type);
    }
    let (_, phys) = append_block(tx, ino)?;
    let with_tail = tail(tx.fs);
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        dirent::init_empty_block(b, with_tail);
        dirent::insert(b, with_tail, child, file_type, name)
            .expect("an empty block holds any name");
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })
}

/// A live entry of a leaf and its (major, minor) hash, borrowed from the leaf's bytes.
type Hashed<'a> = (u32, u32, EntryRef<'a>);

/// The live entries of leaf bytes read with [`read_checked`], after its first `skip`
/// records, sorted by hash (equal hashes in block order). Names are not copied: a split
/// used to allocate one vector per name of the leaf.
fn by_hash<'a>(
    fs: &FsInner,
    version: u8,
    ino: u32,
    (phys, bytes): (u64, &'a [u8]),
    skip: usize,
) -> FsResult<Vec<Hashed<'a>>> {
    let mut hashed = Vec::with_capacity(fs.geo.block_size as usize / dirent::entry_size(1));
    let (mut record, mut unhashable) = (0, None);
    visit_leaf(fs, ino, phys, bytes, |e| {
        record += 1;
        if record <= skip || e.inode == 0 || unhashable.is_some() {
            return;
        }
        match name_hash(fs, version, e.name, ino) {
            Ok((major, minor)) => hashed.push((major, minor, e)),
            Err(err) => unhashable = Some(err),
        }
    })?;
    if let Some(err) = unhashable {
        return Err(err);
    }
    hashed.sort_unstable_by_key(|(major, minor, e)| (*major, *minor, e.offset));
    Ok(hashed)
}

/// Splits hash-sorted entries in two; returns (kept, moved, index hash of the moved part).
fn split_by_hash<'h, 'a>(hashed: &'h [Hashed<'a>]) -> (&'h [Hashed<'a>], &'h [Hashed<'a>], u32) {
    let (kept, moved) = hashed.split_at(hashed.len() / 2);
    let mut split_hash = moved[0].0;
    if kept
        .last()
        .is_some_and(|(major, _, _)| *major == split_hash)
    {
        split_hash |= 1;
    }
    (kept, moved, split_hash)
}

/// Turns a full one-block linear directory into an indexed one with two leaves.
fn make_indexed(tx: &mut Tx, ino: u32) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let (phys0, bytes) = read_checked(tx.fs, ino, &raw, 0, Kind::Leaf)?;
    let mut dots = Vec::with_capacity(2);
    visit_leaf(tx.fs, ino, phys0, &bytes, |e| {
        if dots.len() < 2 {
            dots.push((e.name, e.inode));
        }
    })?;
    let [(b".", dot_inode), (b"..", dotdot_inode)] = dots[..] else {
        return Err(FsError::Inconsistent(format!(
            "directory {ino}: block 0 does not start with \".\" and \"..\""
        )));
    };
    let info = DxRootInfo {
        dot_inode,
        dotdot_inode,
        hash_version: tx.fs.default_hash_version,
        indirect_levels: 0,
    };
    let hashed = by_hash(tx.fs, info.hash_version, ino, (phys0, &bytes), 2)?;
    let (kept, moved, split_hash) = split_by_hash(&hashed);
    let (left, left_phys) = append_block(tx, ino)?;
    let (right, right_phys) = append_block(tx, ino)?;
    write_leaf(tx, ino, left_phys, kept)?;
    write_leaf(tx, ino, right_phys, moved)?;
    let root = vec![
        DxEntry {
            hash: 0,
            block: left,
        },
        DxEntry {
            hash: split_hash,
            block: right,
        },
    ];
    write_root(tx, ino, phys0, &info, &root)?;
    let info = tx.inode(ino)?;
    info.raw.set_flags(info.raw.flags() | flags::INDEX);
    Ok(())
}

fn write_root(
    tx: &mut Tx,
    ino: u32,
    phys: u64,
    info: &DxRootInfo,
    entries: &[DxEntry],
) -> FsResult<()> {
    let with_tail = tail(tx.fs);
    let raw = tx.raw_inode(ino)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        htree::encode_root(b, info, entries, with_tail);
        if let Some(seed) = seed {
            htree::set_checksum(b, ROOT_COUNT_OFFSET, seed);
        }
    })
}

fn write_node(tx: &mut Tx, ino: u32, phys: u64, entries: &[DxEntry]) -> FsResult<()> {
    let with_tail = tail(tx.fs);
    let raw = tx.raw_inode(ino)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        htree::encode_node(b, entries, with_tail);
        if let Some(seed) = seed {
            htree::set_checksum(b, NODE_COUNT_OFFSET, seed);
        }
    })
}

fn htree_add(tx: &mut Tx, ino: u32, name: &[u8], child: u32, file_type: u8) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let mut path = dx_root(tx.fs, ino, &raw)?;
    let info = path.info;
    let (major, _) = name_hash(tx.fs, info.hash_version, name, ino)?;
    dx_seek(tx.fs, ino, &raw, &mut path, major)?;
    let leaf = path.leaf();
    let (phys, bytes) = read_checked(tx.fs, ino, &raw, leaf, Kind::Leaf)?;
    let Some(bytes) = insert_into(tx, ino, (phys, bytes), name, child, file_type)? else {
        return Ok(());
    };
    check_index_room(tx, &path)?;
    // `bytes` stays the leaf as read: the rewrite below goes to a copy of the buffer.
    let hashed = by_hash(tx.fs, info.hash_version, ino, (phys, &bytes), 0)?;
    let (kept, moved, split_hash) = split_by_hash(&hashed);
    let (new_leaf, new_phys) = append_block(tx, ino)?;
    write_leaf(tx, ino, phys, kept)?;
    write_leaf(tx, ino, new_phys, moved)?;
    dx_insert(
        tx,
        ino,
        &mut path,
        DxEntry {
            hash: split_hash,
            block: new_leaf,
        },
    )?;
    let (target_phys, target_entries) = if major >= split_hash {
        (new_phys, moved)
    } else {
        (phys, kept)
    };
    let target_bytes = tx.buffer(target_phys)?.bytes();
    if cfg!(debug_assertions) {
        let parsed = parse_leaf(tx.fs, ino, target_phys, &target_bytes)?;
        assert_eq!(
            parsed.iter().filter(|e| e.inode != 0).count(),
            target_entries.len()
        );
    }
    let target = (target_phys, target_bytes);
    if insert_into(tx, ino, target, name, child, file_type)?.is_none() {
        return Ok(());
    }
    Err(FsError::Inconsistent(format!(
        "directory {ino}: no room for a name after a leaf split"
    )))
}

/// Fails (before anything changes) if a leaf split could not be indexed: every level on
/// the path is full and the tree already has as many levels as the file system allows.
fn check_index_room(tx: &Tx, path: &DxPath) -> FsResult<()> {
    let bs = tx.fs.geo.block_size as usize;
    let root_limit = htree::limit(bs, ROOT_COUNT_OFFSET, tail(tx.fs));
    let node_limit = htree::limit(bs, NODE_COUNT_OFFSET, tail(tx.fs));
    let nodes_full = path.levels[1..]
        .iter()
        .all(|l| l.entries().len() >= node_limit);
    let root_full = path.levels[0].entries().len() >= root_limit;
    let max_levels = max_indirect_levels(tx.fs);
    if nodes_full && root_full && path.info.indirect_levels >= max_levels {
        return Err(FsError::NoSpace(format!(
            "directory index is full ({} index levels{})",
            max_levels + 1,
            if tx.fs.large_dir {
                ""
            } else {
                "; large_dir would allow one more"
            }
        )));
    }
    Ok(())
}

/// Adds an index entry after the path's slot at its deepest level. A full node splits in
/// two and passes the new half's entry up; a full root moves its entries into a new node
/// below it, adding a level (the tree grows at the top, as ext4's does).
fn dx_insert(tx: &mut Tx, ino: u32, path: &mut DxPath, entry: DxEntry) -> FsResult<()> {
    let bs = tx.fs.geo.block_size as usize;
    let root_limit = htree::limit(bs, ROOT_COUNT_OFFSET, tail(tx.fs));
    let node_limit = htree::limit(bs, NODE_COUNT_OFFSET, tail(tx.fs));
    let mut entry = entry;
    while path.levels.len() > 1 {
        let node = path.levels.pop().expect("more than the root");
        let mut entries = node.entries().to_vec();
        entries.insert(node.slot + 1, entry);
        if entries.len() <= node_limit {
            return write_node(tx, ino, node.phys, &entries);
        }
        let moved = entries.split_off(entries.len() / 2);
        let (new_node, new_phys) = append_block(tx, ino)?;
        write_node(tx, ino, node.phys, &entries)?;
        write_node(tx, ino, new_phys, &moved)?;
        entry = DxEntry {
            hash: moved[0].hash,
            block: new_node,
        };
    }
    let root = &path.levels[0];
    let (root_phys, mut entries) = (root.phys, root.entries().to_vec());
    entries.insert(root.slot + 1, entry);
    if entries.len() <= root_limit {
        return write_root(tx, ino, root_phys, &path.info, &entries);
    }
    assert!(
        path.info.indirect_levels < max_indirect_levels(tx.fs),
        "check_index_room ran first"
    );
    debug_assert!(root_limit < node_limit, "a root's entries fit one node");
    let (node_logical, node_phys) = append_block(tx, ino)?;
    write_node(tx, ino, node_phys, &entries)?;
    let info = DxRootInfo {
        indirect_levels: path.info.indirect_levels + 1,
        ..path.info
    };
    let root = [DxEntry {
        hash: 0,
        block: node_logical,
    }];
    write_root(tx, ino, root_phys, &info, &root)
}

/// Removes `name` from directory `ino`; returns what it named.
pub(crate) fn remove(tx: &mut Tx, ino: u32, name: &[u8]) -> FsResult<Found> {
    let raw = tx.raw_inode(ino)?;
    let found = lookup(tx.fs, ino, &raw, name)?
        .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
    let phys = block_of(tx.fs, ino, &raw, found.logical)?;
    let with_tail = tail(tx.fs);
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        dirent::remove(b, with_tail, found.offset);
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })?;
    Ok(found)
}

/// Points the existing entry `name` of directory `ino` at `child` (rename over a target).
pub(crate) fn retarget(
    tx: &mut Tx,
    ino: u32,
    name: &[u8],
    child: u32,
    file_type: u8,
) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let found = lookup(tx.fs, ino, &raw, name)?
        .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
    let phys = block_of(tx.fs, ino, &raw, found.logical)?;
    let seed = seed(tx.fs, ino, &raw);
    tx.modify(phys, |b| {
        b[found.offset..found.offset + 4].copy_from_slice(&child.to_le_bytes());
        b[found.offset + 7] = file_type;
        if let Some(seed) = seed {
            dirent::set_checksum(b, seed);
        }
    })
}
