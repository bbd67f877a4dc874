//! Replay of ext4 fast commits at mount: the records recovery found after the last full
//! commit are applied, in log order, through the file system's own code (directories,
//! extent trees, allocator, inode cache) as one transaction, which the mount then commits
//! and waits for.
//!
//! Semantics are the kernel's (`ext4_fc_replay_*` in fs/ext4/fast_commit.c):
//! - UNLINK removes a name (a missing name is ignored) and drops a link;
//! - LINK adds a name and a link (an existing name is ignored);
//! - CREAT marks the inode in use, gives a directory a fresh "." and "..", adds the name,
//!   and sets a non-directory's link count to 1;
//! - INODE copies the logged inode except `i_block`: an extent-mapped inode keeps its
//!   on-disk extent root (a fresh empty one if that root is not a valid extent header),
//!   and the blocks the old tree mapped are cleared in the bitmaps (`ext4_ext_clear_bb`);
//!   the inode is marked in use;
//! - ADD_RANGE maps `lblk..lblk+len` to `pblk..`, replacing (and clearing in the bitmap)
//!   what was mapped there; DEL_RANGE unmaps and clears;
//! - finally, as `ext4_fc_set_bitmaps_and_counters`, every data and extent-tree block of
//!   every inode the replay touched is marked used, with group and in-memory counts exact,
//!   and its `i_blocks` is recomputed.
//!
//! Where the kernel leaves a file system e2fsck rejects, jext keeps it consistent
//! (checked against Linux 6.18): a directory's link count is recounted from its entries
//! (the kernel sets 1, and never counts the new subdirectory in its parent); `i_blocks`
//! counts the xattr block; a fast symlink or device node takes `i_block` from its logged
//! inode (the kernel keeps the on-disk bytes, which for a new inode are zeros); an UNLINK
//! whose name now names another inode changes nothing (the kernel drops a link of the
//! logged inode, which is not idempotent); an unlinked directory is deleted (the kernel
//! leaves it with one link and no name). An inode that loses its last link is deleted
//! there and then, blocks and number freed, as the kernel's `iput` does: a later INODE
//! record may reuse the number and must find an empty extent tree.
//!
//! Promises: idempotent (the records applied again to the result give the same file
//! system), so a crash before the replay's commit is durable is harmless; every block a
//! record names is held from the allocator until the replay commits, so no block the
//! replay allocates (directory or extent-tree blocks) can be one a later record maps.
//! Every record is checked before anything changes: an inode number out of range or
//! reserved, a block beyond the device or on the file system's own metadata, an invalid
//! name, a logged inode of the wrong size, or a name in a non-directory is an error that
//! names the record. Must never panic on a record's contents.

use crate::alloc::{self, mark_blocks, mark_inode_used};
use crate::blockmap;
use crate::dir;
use crate::error::{FsError, FsResult};
use crate::extent_tree;
use crate::format::extent::{Extent, Node};
use crate::format::group_desc::FLAG_INODE_UNINIT;
use crate::format::inode::{flags, Inode, GOOD_OLD_INODE_SIZE};
use crate::format::Location;
use crate::groups::read_desc;
use crate::meta::{MetaIo, MetaRead};
use crate::namei::LINK_MAX;
use crate::op::Op;
use crate::orphan;
use crate::state::FsInner;
use crate::tx::Tx;
use crate::types::{FileKind, Timestamp, ROOT_INO};
use crate::xattr_ops;
use jext_journal::format::fast_commit::{max_range_len, Dentry, FcRecord};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

/// `i_block` in the raw inode: bytes 0x28..0x64 (format/inode.rs).
const I_BLOCK: std::ops::Range<usize> = 0x28..0x64;
/// `i_flags` in the raw inode.
const I_FLAGS: usize = 0x20;
/// `i_extra_isize` in the raw inode.
const I_EXTRA_ISIZE: usize = 0x80;
/// One past the last logical block an extent can map.
const LOGICAL_END: u64 = 1 << 32;

/// What applying the fast commits did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    /// Records applied, of every kind.
    pub records: usize,
    /// Records of each kind: INODE, ADD_RANGE, DEL_RANGE, CREAT, LINK, UNLINK.
    pub inodes: usize,
    pub add_ranges: usize,
    pub del_ranges: usize,
    pub creates: usize,
    pub links: usize,
    pub unlinks: usize,
    /// Records that changed nothing, as in the kernel: a name to remove that is gone (or
    /// names another inode), a name to add that exists, an inode that is not in use.
    pub skipped: usize,
    /// Inodes whose blocks the final pass marked in the bitmaps.
    pub inodes_marked: usize,
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} fast-commit records replayed (inode {}, add_range {}, del_range {}, creat {}, \
             link {}, unlink {}; {} changed nothing), blocks of {} inodes marked",
            self.records,
            self.inodes,
            self.add_ranges,
            self.del_ranges,
            self.creates,
            self.links,
            self.unlinks,
            self.skipped,
            self.inodes_marked
        )
    }
}

/// Applies recovered fast commits, in log order, as changes of the running transaction.
pub(crate) fn apply(op: &mut Op, records: &[FcRecord]) -> FsResult<ReplayReport> {
    let fs = op.fs;
    assert!(
        op.is_exclusive(),
        "fast-commit replay runs with the file system to itself"
    );
    let mut report = ReplayReport::default();
    if records.is_empty() {
        return Ok(report);
    }
    let mut meta = MetadataMap::new(fs)?;
    for (i, record) in records.iter().enumerate() {
        check_record(fs, record, &mut meta).map_err(|why| bad_record(i, record, why))?;
    }
    // One handle for the whole replay: it must commit as one transaction, since once
    // the fast commits' tid commits they are no longer valid.
    let mut tx = Tx::begin(op, fs.journal.max_transaction_blocks() / 2)?;
    let tid = tx.tid();
    for record in records {
        if let FcRecord::AddRange { pblk, len, .. } = record {
            tx.fs.alloc.pending.lock().hold(*pblk, u64::from(*len), tid);
        }
    }
    let mut touched = Touched::default();
    let result = (|| {
        for (i, record) in records.iter().enumerate() {
            ensure_credits(&tx, RECORD_CREDITS)?;
            let changed =
                apply_record(&mut tx, &mut touched, record).map_err(|e| in_record(i, record, e))?;
            count(&mut report, record, changed);
        }
        finish(&mut tx, &touched, &mut report)
    })();
    tx.end(result.map(|()| report))
}

/// Journal blocks one record may change at most (inode table, bitmaps and descriptors of
/// the groups a range spans, directory and extent-tree blocks), kept free before each.
const RECORD_CREDITS: u32 = 64;

/// Fails, before anything more changes, if the replay's transaction is nearly full: the
/// replay must commit as one transaction.
fn ensure_credits(tx: &Tx, need: u32) -> FsResult<()> {
    if tx.credits_left() < need {
        return Err(FsError::Unsupported(format!(
            "the fast commits change more blocks than one transaction holds ({} blocks); \
             mount the image once with Linux to replay them",
            tx.fs.journal.max_transaction_blocks() / 2
        )));
    }
    Ok(())
}

/// What the replay changed, for the final pass.
#[derive(Default)]
struct Touched {
    /// Inodes whose blocks are marked used at the end (the kernel's modified inodes).
    inodes: BTreeSet<u32>,
    /// Directories whose link count is recounted at the end.
    dirs: BTreeSet<u32>,
}

fn count(report: &mut ReplayReport, record: &FcRecord, changed: bool) {
    report.records += 1;
    if !changed {
        report.skipped += 1;
    }
    let kind = match record {
        FcRecord::Inode { .. } => &mut report.inodes,
        FcRecord::AddRange { .. } => &mut report.add_ranges,
        FcRecord::DelRange { .. } => &mut report.del_ranges,
        FcRecord::Creat(_) => &mut report.creates,
        FcRecord::Link(_) => &mut report.links,
        FcRecord::Unlink(_) => &mut report.unlinks,
    };
    *kind += 1;
}

/// A record, as errors and logs show it.
fn describe(record: &FcRecord) -> String {
    let dentry = |kind: &str, d: &Dentry| {
        format!(
            "{kind} {:?} in directory {} -> inode {}",
            String::from_utf8_lossy(&d.name),
            d.parent,
            d.ino
        )
    };
    match record {
        FcRecord::AddRange {
            ino,
            lblk,
            len,
            pblk,
            unwritten,
        } => format!(
            "ADD_RANGE inode {ino} blocks {lblk}+{len} -> {pblk}{}",
            if *unwritten { " unwritten" } else { "" }
        ),
        FcRecord::DelRange { ino, lblk, len } => {
            format!("DEL_RANGE inode {ino} blocks {lblk}+{len}")
        }
        FcRecord::Creat(d) => dentry("CREAT", d),
        FcRecord::Link(d) => dentry("LINK", d),
        FcRecord::Unlink(d) => dentry("UNLINK", d),
        FcRecord::Inode { ino, raw } => format!("INODE {ino} ({} bytes)", raw.len()),
    }
}

fn bad_record(i: usize, record: &FcRecord, why: String) -> FsError {
    FsError::Inconsistent(format!(
        "fast-commit record {i} ({}) cannot be replayed: {why}",
        describe(record)
    ))
}

/// Names the record an error happened in (device and journal errors are not the
/// record's and stay as they are).
fn in_record(i: usize, record: &FcRecord, err: FsError) -> FsError {
    match err {
        FsError::Device(_) | FsError::Journal(_) => err,
        other => bad_record(i, record, other.to_string()),
    }
}

/// Blocks no record may map: the metadata ranges of each group (read once per group) and
/// the journal's blocks.
struct MetadataMap {
    groups: HashMap<u32, Vec<(u64, u64)>>,
    journal: Vec<(u64, u64)>,
}

impl MetadataMap {
    fn new(fs: &FsInner) -> FsResult<MetadataMap> {
        let ino = match fs.sb.lock().journal_inum() {
            0 => 8,
            n => n,
        };
        let raw = crate::inodes::read_record(fs, ino)?;
        let journal = blockmap::extents(fs, ino, &raw)?
            .iter()
            .map(|e| (e.start, e.start + u64::from(e.len)))
            .collect();
        Ok(MetadataMap {
            groups: HashMap::new(),
            journal,
        })
    }
}

/// Checks what a record names before anything changes.
fn check_record(fs: &FsInner, record: &FcRecord, meta: &mut MetadataMap) -> Result<(), String> {
    match record {
        FcRecord::AddRange {
            ino,
            lblk,
            len,
            pblk,
            unwritten,
        } => {
            check_ino(fs, *ino)?;
            let longest = max_range_len(*unwritten);
            if *len > longest {
                return Err(format!("an extent of {len} blocks (at most {longest})"));
            }
            if u64::from(*lblk) + u64::from(*len) > LOGICAL_END {
                return Err("the range passes logical block 2^32".into());
            }
            check_blocks(fs, *pblk, u64::from(*len), meta)
        }
        FcRecord::DelRange { ino, .. } => check_ino(fs, *ino),
        FcRecord::Creat(d) | FcRecord::Link(d) | FcRecord::Unlink(d) => {
            check_ino(fs, d.ino)?;
            if d.parent != ROOT_INO {
                check_ino(fs, d.parent)?;
            }
            if d.parent == d.ino {
                return Err(format!("inode {} named in itself", d.ino));
            }
            dir::check_name(&d.name).map_err(|e| e.to_string())
        }
        FcRecord::Inode { ino, raw } => {
            check_ino(fs, *ino)?;
            logged_inode_len(fs, raw).map(|_| ())
        }
    }
}

/// Inodes a record may name: ordinary ones (the reserved ones, the journal's among them,
/// are never logged).
fn check_ino(fs: &FsInner, ino: u32) -> Result<(), String> {
    let geo = &fs.geo;
    if ino < geo.first_ino || ino > geo.inodes_count {
        return Err(format!(
            "inode {ino} is not an ordinary inode of this file system ({}..={})",
            geo.first_ino, geo.inodes_count
        ));
    }
    Ok(())
}

/// Blocks a range may map: on the device, and not the file system's own metadata.
fn check_blocks(fs: &FsInner, start: u64, len: u64, meta: &mut MetadataMap) -> Result<(), String> {
    let geo = &fs.geo;
    let end = start.saturating_add(len);
    if start < geo.first_data_block || end > geo.blocks_count {
        return Err(format!(
            "blocks {start}..{end} are not all on the device ({}..{})",
            geo.first_data_block, geo.blocks_count
        ));
    }
    if len == 0 {
        return Ok(());
    }
    let overlap =
        |ranges: &[(u64, u64)]| ranges.iter().find(|(s, e)| *s < end && *e > start).copied();
    if let Some((s, e)) = overlap(&meta.journal) {
        return Err(format!(
            "blocks {start}..{end} overlap the journal at {s}..{e}"
        ));
    }
    for group in geo.group_of_block(start)..=geo.group_of_block(end - 1) {
        let ranges = match meta.groups.get(&group) {
            Some(r) => r,
            None => {
                let r = alloc::metadata_in_group(fs, group).map_err(|e| e.to_string())?;
                meta.groups.entry(group).or_insert(r)
            }
        };
        if let Some((s, e)) = overlap(ranges) {
            return Err(format!(
                "blocks {start}..{end} overlap file system metadata at {s}..{e}"
            ));
        }
    }
    Ok(())
}

/// The bytes of a logged inode that count: 128 plus its `i_extra_isize` (as e2fsck's
/// replay reads it); an error if they do not fit this file system's inodes.
fn logged_inode_len(fs: &FsInner, raw: &[u8]) -> Result<usize, String> {
    let size = fs.geo.inode_size as usize;
    if raw.len() < GOOD_OLD_INODE_SIZE || raw.len() > size {
        return Err(format!(
            "a logged inode of {} bytes on a file system of {size}-byte inodes",
            raw.len()
        ));
    }
    if size == GOOD_OLD_INODE_SIZE || raw.len() == GOOD_OLD_INODE_SIZE {
        // An inode with no extra fields in use is logged as its first 128 bytes.
        return Ok(GOOD_OLD_INODE_SIZE);
    }
    if raw.len() < I_EXTRA_ISIZE + 2 {
        return Err("the logged inode stops inside i_extra_isize".into());
    }
    let extra = usize::from(u16::from_le_bytes([
        raw[I_EXTRA_ISIZE],
        raw[I_EXTRA_ISIZE + 1],
    ]));
    let len = GOOD_OLD_INODE_SIZE + extra;
    if extra % 4 != 0 || len > raw.len() {
        return Err(format!(
            "i_extra_isize {extra} does not fit the {} bytes logged",
            raw.len()
        ));
    }
    Ok(len)
}

/// Applies one record; returns whether it changed anything.
fn apply_record(tx: &mut Tx, touched: &mut Touched, record: &FcRecord) -> FsResult<bool> {
    match record {
        FcRecord::Inode { ino, raw } => replay_inode(tx, touched, *ino, raw).map(|()| true),
        FcRecord::AddRange {
            ino,
            lblk,
            len,
            pblk,
            unwritten,
        } => {
            let e = Extent {
                logical: *lblk,
                len: *len,
                start: *pblk,
                unwritten: *unwritten,
            };
            add_range(tx, touched, *ino, e)
        }
        FcRecord::DelRange { ino, lblk, len } => {
            let end = (u64::from(*lblk) + u64::from(*len)).min(LOGICAL_END);
            del_range(tx, touched, *ino, *lblk, end)
        }
        FcRecord::Creat(d) => create(tx, touched, d).map(|()| true),
        FcRecord::Link(d) => link(tx, touched, d),
        FcRecord::Unlink(d) => unlink(tx, touched, d),
    }
}

/// True if inode `ino`'s slot was never used (its group's table is uninitialised there),
/// so its bytes on disk mean nothing.
fn slot_never_used(fs: &FsInner, ino: u32) -> FsResult<bool> {
    let (group, index) = fs.geo.inode_position(ino);
    let desc = read_desc(fs, group)?;
    Ok(desc.has_flag(FLAG_INODE_UNINIT)
        || index >= fs.geo.inodes_per_group.saturating_sub(desc.itable_unused))
}

/// The record of `ino` if it is in use (a type and a link: what the kernel's `iget`
/// accepts), loaded in the inode cache.
fn in_use(tx: &mut Tx, ino: u32) -> FsResult<Option<Inode>> {
    if ino == 0 || ino > tx.fs.geo.inodes_count {
        return Err(FsError::Inconsistent(format!(
            "inode number {ino} is out of range (1..={})",
            tx.fs.geo.inodes_count
        )));
    }
    let cached = tx.op.holds(ino) || tx.fs.inodes.cached(ino).is_some();
    if !cached && slot_never_used(tx.fs, ino)? {
        return Ok(None);
    }
    let raw = match cached {
        true => tx.inode(ino)?.raw.clone(),
        false => crate::inodes::read_record(tx.fs, ino)?,
    };
    if raw.mode() == 0 || raw.links_count() == 0 {
        return Ok(None);
    }
    tx.inode(ino)?;
    Ok(Some(raw))
}

/// The current bytes of `ino`'s record, without judging them: zeros for a slot never
/// used, else the cached copy or the table's bytes.
fn current_bytes(tx: &mut Tx, ino: u32) -> FsResult<Vec<u8>> {
    let size = tx.fs.geo.inode_size as usize;
    if tx.op.holds(ino) || tx.fs.inodes.cached(ino).is_some() {
        return Ok(tx.inode(ino)?.raw.raw().to_vec());
    }
    if slot_never_used(tx.fs, ino)? {
        return Ok(vec![0; size]);
    }
    let (block, offset) = crate::inodes::table_location(tx.fs, ino)?;
    Ok(tx
        .buffer(block)?
        .read(|b| b[offset..offset + size].to_vec()))
}

fn is_dir_mode(mode: u16) -> bool {
    FileKind::from_mode(u32::from(mode)) == Some(FileKind::Directory)
}

/// INODE: the logged inode over the on-disk one, `i_block` aside.
fn replay_inode(tx: &mut Tx, touched: &mut Touched, ino: u32, logged: &[u8]) -> FsResult<()> {
    let len = logged_inode_len(tx.fs, logged).map_err(FsError::Inconsistent)?;
    let old_bytes = current_bytes(tx, ino)?;
    let old = Inode::decode(&old_bytes, ino, None)?;
    let old_in_use = old.mode() != 0 && old.links_count() != 0;
    if old_in_use {
        clear_blocks_of(tx, ino, &old)?;
    }
    let mut bytes = old_bytes;
    bytes[..I_BLOCK.start].copy_from_slice(&logged[..I_BLOCK.start]);
    bytes[I_BLOCK.end..len].copy_from_slice(&logged[I_BLOCK.end..len]);
    let new_flags = u32::from_le_bytes(bytes[I_FLAGS..I_FLAGS + 4].try_into().expect("4 bytes"));
    if new_flags & flags::EXTENTS != 0 {
        let root = &mut bytes[I_BLOCK];
        if Node::decode(root, true, Location::InodeBlockArea { ino }).is_err() {
            extent_tree::init_root(root);
        }
    } else {
        // Inline data, a fast symlink's target, a device number: the logged bytes are
        // the truth (the kernel copies them only for inline data).
        bytes[I_BLOCK].copy_from_slice(&logged[I_BLOCK]);
    }
    let raw = Inode::decode(&bytes, ino, None)?;
    if FileKind::from_mode(u32::from(raw.mode())).is_none() {
        return Err(FsError::Inconsistent(format!(
            "the logged inode has no valid file type (mode {:o})",
            raw.mode()
        )));
    }
    let was_dir = old_in_use && is_dir_mode(old.mode());
    mark_inode_used(tx, ino, is_dir_mode(raw.mode()), was_dir)?;
    tx.op.put_inode(ino, raw)?;
    tx.write_inode(ino)?;
    touched.inodes.insert(ino);
    Ok(())
}

/// Clears in the bitmaps every block the inode's extent tree maps and holds
/// (`ext4_ext_clear_bb`); the final pass marks again those still mapped.
fn clear_blocks_of(tx: &mut Tx, ino: u32, raw: &Inode) -> FsResult<()> {
    if raw.flags() & flags::EXTENTS == 0
        || Node::decode(raw.i_block(), true, Location::InodeBlockArea { ino }).is_err()
    {
        return Ok(());
    }
    let (extents, index) = blockmap::extents_and_index(tx.fs, ino, raw)?;
    for e in extents {
        mark_blocks(tx, e.start, u64::from(e.len), false)?;
    }
    for block in index {
        mark_blocks(tx, block, 1, false)?;
    }
    Ok(())
}

/// The inode a range record changes, if it is in use and extent-mapped.
fn range_target(tx: &mut Tx, ino: u32) -> FsResult<bool> {
    let Some(raw) = in_use(tx, ino)? else {
        return Ok(false);
    };
    blockmap::require_extents(ino, &raw)?;
    Ok(true)
}

/// ADD_RANGE: whatever `e`'s logical blocks mapped goes, `e` takes its place.
fn add_range(tx: &mut Tx, touched: &mut Touched, ino: u32, e: Extent) -> FsResult<bool> {
    if !range_target(tx, ino)? {
        return Ok(false);
    }
    touched.inodes.insert(ino);
    if e.len > 0 {
        blockmap::with_root(tx, ino, |tx, root, owner| {
            let mut io = ReplayIo { tx };
            extent_tree::remove_range(&mut io, root, owner, e.logical, e.end())?;
            extent_tree::insert(&mut io, root, owner, e)
        })?;
    }
    tx.op.note_data_change(ino);
    tx.write_inode(ino)?;
    Ok(true)
}

/// DEL_RANGE: `[from, to)` unmapped, its blocks cleared in the bitmaps.
fn del_range(tx: &mut Tx, touched: &mut Touched, ino: u32, from: u32, to: u64) -> FsResult<bool> {
    if !range_target(tx, ino)? {
        return Ok(false);
    }
    touched.inodes.insert(ino);
    if u64::from(from) < to {
        blockmap::with_root(tx, ino, |tx, root, owner| {
            extent_tree::remove_range(&mut ReplayIo { tx }, root, owner, from, to)
        })?;
    }
    tx.op.note_data_change(ino);
    tx.write_inode(ino)?;
    Ok(true)
}

/// The directory a dentry record names, if it is in use; an error if it is not a
/// directory.
fn parent_dir(tx: &mut Tx, d: &Dentry) -> FsResult<Option<Inode>> {
    let Some(raw) = in_use(tx, d.parent)? else {
        return Ok(None);
    };
    if !is_dir_mode(raw.mode()) {
        return Err(FsError::NotDir(format!(
            "inode {} (mode {:o}) is not a directory",
            d.parent,
            raw.mode()
        )));
    }
    Ok(Some(raw))
}

/// The directory entry type for inode `raw`.
fn entry_type(fs: &FsInner, raw: &Inode) -> u8 {
    match (fs.filetype, FileKind::from_mode(u32::from(raw.mode()))) {
        (true, Some(kind)) => kind.dirent_type(),
        _ => 0,
    }
}

/// Adds `d.name -> d.ino` unless the name exists; returns whether it added it.
fn add_name(tx: &mut Tx, touched: &mut Touched, d: &Dentry, child: &Inode) -> FsResult<bool> {
    let Some(parent) = parent_dir(tx, d)? else {
        return Ok(false);
    };
    if dir::lookup(tx.fs, d.parent, &parent, &d.name)?.is_some() {
        return Ok(false);
    }
    let file_type = entry_type(tx.fs, child);
    dir::add(tx, d.parent, &d.name, d.ino, file_type)?;
    tx.write_inode(d.parent)?;
    if is_dir_mode(child.mode()) {
        touched.dirs.insert(d.parent);
    }
    Ok(true)
}

/// CREAT: the inode (logged by an INODE record before) in use and named.
fn create(tx: &mut Tx, touched: &mut Touched, d: &Dentry) -> FsResult<()> {
    let Some(child) = in_use(tx, d.ino)? else {
        return Err(FsError::Inconsistent(format!(
            "inode {} is not in use: no INODE record came before its CREAT",
            d.ino
        )));
    };
    let is_dir = is_dir_mode(child.mode());
    mark_inode_used(tx, d.ino, is_dir, is_dir)?;
    touched.inodes.insert(d.ino);
    if is_dir {
        if parent_dir(tx, d)?.is_none() {
            // As the kernel: no parent, no "." and "..", but the name is still tried.
            return add_name(tx, touched, d, &child).map(|_| ());
        }
        init_dir(tx, d.ino, d.parent)?;
        touched.dirs.insert(d.ino);
    }
    let child = tx.raw_inode(d.ino)?;
    add_name(tx, touched, d, &child)?;
    if !is_dir {
        tx.inode(d.ino)?.raw.set_links_count(1);
        tx.write_inode(d.ino)?;
    }
    Ok(())
}

/// A new directory's contents: one block with "." and ".." (what was there goes; the
/// records that follow add its entries again).
fn init_dir(tx: &mut Tx, ino: u32, parent: u32) -> FsResult<()> {
    blockmap::with_root(tx, ino, |tx, root, owner| {
        extent_tree::remove_range(&mut ReplayIo { tx }, root, owner, 0, LOGICAL_END)
    })?;
    let info = tx.inode(ino)?;
    info.size = 0;
    info.raw.set_size(0);
    info.raw.set_flags(info.raw.flags() & !flags::INDEX);
    info.raw.set_links_count(2);
    dir::init(tx, ino, parent)?;
    tx.write_inode(ino)
}

/// LINK: one more name for an inode in use.
fn link(tx: &mut Tx, touched: &mut Touched, d: &Dentry) -> FsResult<bool> {
    let Some(child) = in_use(tx, d.ino)? else {
        return Ok(false);
    };
    if is_dir_mode(child.mode()) {
        // Linux logs no LINK of a directory (renaming one makes fsync commit in full).
        return Err(FsError::NotPermitted(format!(
            "a second name for directory {}",
            d.ino
        )));
    }
    if !add_name(tx, touched, d, &child)? {
        return Ok(false);
    }
    let info = tx.inode(d.ino)?;
    info.raw
        .set_links_count(info.raw.links_count().saturating_add(1).min(LINK_MAX));
    tx.write_inode(d.ino)?;
    Ok(true)
}

/// UNLINK: the name goes if it names the inode; an inode left without links is deleted.
fn unlink(tx: &mut Tx, touched: &mut Touched, d: &Dentry) -> FsResult<bool> {
    let Some(child) = in_use(tx, d.ino)? else {
        return Ok(false);
    };
    let Some(parent) = parent_dir(tx, d)? else {
        return Ok(false);
    };
    match dir::lookup(tx.fs, d.parent, &parent, &d.name)? {
        Some(found) if found.ino == d.ino => {}
        _ => return Ok(false),
    }
    dir::remove(tx, d.parent, &d.name)?;
    tx.write_inode(d.parent)?;
    let is_dir = is_dir_mode(child.mode());
    if is_dir {
        touched.dirs.insert(d.parent);
    }
    let links = if is_dir {
        0
    } else {
        child.links_count().saturating_sub(1)
    };
    if links == 0 {
        return delete(tx, d.ino, is_dir).map(|()| true);
    }
    tx.inode(d.ino)?.raw.set_links_count(links);
    tx.write_inode(d.ino)?;
    Ok(true)
}

/// Deletes an inode whose last name went, as the kernel's `iput` does during its replay:
/// its blocks and xattr block are freed and its number is free again, so an INODE record
/// later in the log that reuses the number starts from an empty extent tree.
fn delete(tx: &mut Tx, ino: u32, is_dir: bool) -> FsResult<()> {
    blockmap::with_root(tx, ino, |tx, root, owner| {
        extent_tree::remove_range(&mut ReplayIo { tx }, root, owner, 0, LOGICAL_END)
    })?;
    xattr_ops::drop_block(tx, ino)?;
    orphan::remove(tx, ino)?;
    let now = Timestamp::now();
    let bs = tx.fs.geo.block_size;
    let info = tx.inode(ino)?;
    info.size = 0;
    info.raw.set_size(0);
    info.raw.set_blocks_512(0, bs);
    info.raw.set_links_count(0);
    info.raw
        .set_dtime(now.seconds.clamp(1, i64::from(u32::MAX)) as u32);
    tx.write_inode(ino)?;
    tx.op.note_data_change(ino);
    alloc::free_inode(tx, ino, is_dir)
}

/// The final pass: directory link counts, then every touched inode's blocks marked used
/// and its `i_blocks` recomputed.
fn finish(tx: &mut Tx, touched: &Touched, report: &mut ReplayReport) -> FsResult<()> {
    for &ino in &touched.dirs {
        recount_dir_links(tx, ino)?;
    }
    for &ino in &touched.inodes {
        if mark_blocks_of(tx, ino)? {
            report.inodes_marked += 1;
        }
    }
    Ok(())
}

/// Sets a directory's link count to 2 plus its subdirectories (1 past the limit with
/// `dir_nlink`, as ext4 counts "many").
fn recount_dir_links(tx: &mut Tx, ino: u32) -> FsResult<()> {
    let Some(raw) = in_use(tx, ino)? else {
        return Ok(());
    };
    if !is_dir_mode(raw.mode()) {
        return Ok(());
    }
    let mut subdirs: u32 = 0;
    for entry in dir::list(tx.fs, ino, &raw, 0)? {
        if entry.name == b"." || entry.name == b".." {
            continue;
        }
        let is_dir = match FileKind::from_dirent_type(entry.file_type) {
            Some(kind) if tx.fs.filetype => kind == FileKind::Directory,
            _ => in_use(tx, entry.ino)?.is_some_and(|r| is_dir_mode(r.mode())),
        };
        subdirs += u32::from(is_dir);
    }
    let links = 2 + subdirs;
    let links = if links > u32::from(LINK_MAX) {
        1
    } else {
        links as u16
    };
    tx.inode(ino)?.raw.set_links_count(links);
    tx.write_inode(ino)
}

/// Journal blocks marking one extent may change: the bitmaps and descriptor blocks of
/// the groups it spans (an extent of 32768 blocks spans at most 5 groups of 8192), and the
/// inode's table block.
const MARK_CREDITS: u32 = 12;

/// Marks every block inode `ino` maps (data, unwritten too, and extent-tree blocks) used
/// and recomputes `i_blocks` (the xattr block counts, as e2fsck counts it). Returns false
/// if the inode is no longer in use.
fn mark_blocks_of(tx: &mut Tx, ino: u32) -> FsResult<bool> {
    let raw = tx.raw_inode(ino)?;
    if raw.mode() == 0 || raw.links_count() == 0 {
        // Deleted, or never named: the kernel's `iget` skips it too.
        return Ok(false);
    }
    let mut blocks = u64::from(raw.file_acl() != 0);
    if raw.flags() & flags::EXTENTS != 0 {
        let (extents, index) = blockmap::extents_and_index(tx.fs, ino, &raw)?;
        for e in &extents {
            ensure_credits(tx, MARK_CREDITS)?;
            mark_blocks(tx, e.start, u64::from(e.len), true)?;
            blocks += u64::from(e.len);
        }
        for &block in &index {
            ensure_credits(tx, MARK_CREDITS)?;
            mark_blocks(tx, block, 1, true)?;
        }
        blocks += index.len() as u64;
    } else if raw.flags() & flags::INLINE_DATA == 0 && raw.blocks_raw() != 0 {
        // A block-mapped (ext2/ext3) file: jext cannot walk it, so its count stays.
        return Ok(true);
    }
    let bs = tx.fs.geo.block_size;
    tx.inode(ino)?
        .raw
        .set_blocks_512(blocks * u64::from(bs / 512), bs);
    tx.write_inode(ino)?;
    Ok(true)
}

/// The transaction as the extent tree's metadata IO during replay: frees only clear
/// bitmap bits (whatever they were: a record may free what an INODE record already
/// cleared), and hold the blocks until the replay commits.
struct ReplayIo<'r, 'a, 'fs> {
    tx: &'r mut Tx<'a, 'fs>,
}

impl MetaRead for ReplayIo<'_, '_, '_> {
    fn block_size(&self) -> usize {
        self.tx.block_size()
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        self.tx.read_block(block)
    }
}

impl MetaIo for ReplayIo<'_, '_, '_> {
    fn modify_block(&mut self, block: u64, change: &mut dyn FnMut(&mut [u8])) -> FsResult<()> {
        self.tx.modify_block(block, change)
    }

    fn alloc_meta_block(&mut self, goal: u64) -> FsResult<u64> {
        self.tx.alloc_meta_block(goal)
    }

    fn free_meta_block(&mut self, block: u64) -> FsResult<()> {
        mark_blocks(self.tx, block, 1, false)?;
        // No longer metadata: its buffer must not be written home over what reuses it.
        self.tx.forget_block(block)
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> FsResult<()> {
        mark_blocks(self.tx, start, count, false).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::bitmap;
    use crate::{mkfs, Fs, MkfsOptions, MountOptions};
    use jext_io::IoFlags;
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    /// A jext image file in a scratch directory, removed on drop.
    struct Image(PathBuf);

    impl Image {
        fn new(name: &str) -> Image {
            let dir =
                std::env::temp_dir().join(format!("jext-fc-replay-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("fs.img");
            std::fs::File::create(&path)
                .unwrap()
                .set_len(64 << 20)
                .unwrap();
            let dev = jext_device::open_path(&path, false).unwrap();
            let opts = MkfsOptions {
                block_size: Some(1024),
                fast_commit: true,
                assume_zeroed: true,
                ..MkfsOptions::default()
            };
            mkfs(dev.clone(), &opts).unwrap();
            dev.release_owner();
            Image(path)
        }

        fn mount(&self) -> Fs {
            Fs::open_path(&self.0, MountOptions::default()).unwrap()
        }

        fn e2fsck_clean(&self) {
            let out = std::process::Command::new("e2fsck")
                .args(["-fn", self.0.to_str().unwrap()])
                .output();
            match out {
                Err(e) => eprintln!("SKIPPED the e2fsck check: cannot run e2fsck ({e})"),
                Ok(out) => assert!(
                    out.status.success(),
                    "e2fsck -fn {}:\n{}{}",
                    self.0.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            }
        }
    }

    impl Drop for Image {
        fn drop(&mut self) {
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    }

    /// Inode numbers and blocks the records use, found on the mounted file system.
    struct Plan {
        bs: usize,
        /// Free inode numbers for the new inodes.
        new_inos: Vec<u32>,
        /// A run of free blocks for the new data, far from where the allocator looks.
        free_run: u64,
        existing: u32,
        trunc: u32,
        dir_a: u32,
        /// A block of the journal.
        journal_block: u64,
    }

    /// The committed state the fast commits build on: a directory with two files.
    fn base_state(fs: &Fs) -> Plan {
        fs.mkdir_path("/a", 0o755).unwrap();
        for (name, len) in [("/a/existing", 5000), ("/a/trunc", 5 * 1024)] {
            let f = fs.create_file(name, 0o644).unwrap();
            f.write_at(0, &pattern(9, len)).unwrap();
            f.fsync().unwrap();
        }
        fs.sync().unwrap();
        fs.with_exclusive(|op| {
            let inner = op.fs;
            let geo = &inner.geo;
            let last = geo.group_count - 1;
            let desc = read_desc(inner, last).unwrap();
            let bytes = inner.cache.get(desc.block_bitmap).unwrap().bytes();
            let bits = geo.blocks_in_group(last);
            // The last 8 free blocks of the last group.
            let bit = (0..bits - 8)
                .rev()
                .find(|&b| (b..b + 8).all(|i| !bitmap::test_bit(&bytes, i)))
                .expect("a free run");
            let ibytes = inner
                .cache
                .get(read_desc(inner, 0).unwrap().inode_bitmap)
                .unwrap()
                .bytes();
            let new_inos = (geo.first_ino..geo.inodes_per_group)
                .filter(|&i| !bitmap::test_bit(&ibytes, i - 1))
                .skip(10)
                .take(3)
                .collect();
            let mut lookup = |parent: u32, name: &str| {
                op.lock(parent, crate::op::Reach::First).unwrap();
                crate::namei::lookup(op, parent, name.as_bytes()).unwrap()
            };
            let dir_a = lookup(ROOT_INO, "a");
            Plan {
                bs: geo.block_size as usize,
                new_inos,
                free_run: geo.group_first_block(last) + u64::from(bit),
                existing: lookup(dir_a, "existing"),
                trunc: lookup(dir_a, "trunc"),
                dir_a,
                journal_block: {
                    let journal = crate::inodes::read_record(inner, 8).unwrap();
                    blockmap::extents(inner, 8, &journal).unwrap()[0].start + 5
                },
            }
        })
        .unwrap()
    }

    /// The logged form of a new inode: what an INODE record carries.
    fn logged(fs: &FsInner, ino: u32, mode: u32, size: u64, links: u16) -> Vec<u8> {
        let mut raw = crate::inodes::new_record(fs, mode, 0, 0, ino * 3, Timestamp::now(), 0);
        raw.set_size(size);
        raw.set_links_count(links);
        let len = GOOD_OLD_INODE_SIZE + usize::from(raw.extra_isize());
        raw.encode(ino, fs.csum_seed)[..len].to_vec()
    }

    fn dentry(parent: u32, ino: u32, name: &str) -> Dentry {
        Dentry {
            parent,
            ino,
            name: name.as_bytes().to_vec(),
        }
    }

    /// Records of a new file with data and a hard link, a new directory with a file, an
    /// unlink and a truncate, as Linux would log them; their data goes to the device.
    fn records(fs: &Fs, plan: &Plan) -> Vec<FcRecord> {
        let [file, dir, inner_file] = plan.new_inos[..] else {
            panic!("three free inodes")
        };
        let bs = plan.bs;
        let data = pattern(1, 3 * bs);
        let inner_data = pattern(2, bs);
        fs.with_exclusive(|op| {
            let inner = op.fs;
            let write = |block: u64, bytes: &[u8]| {
                inner
                    .io
                    .write(
                        block * bs as u64,
                        Arc::from(bytes.to_vec()),
                        IoFlags::empty(),
                    )
                    .unwrap()
            };
            write(plan.free_run, &data);
            write(plan.free_run + 3, &inner_data);
            let file_size = (3 * bs - 100) as u64;
            vec![
                FcRecord::Inode {
                    ino: file,
                    raw: logged(inner, file, 0o100644, file_size, 1),
                },
                FcRecord::AddRange {
                    ino: file,
                    lblk: 0,
                    len: 3,
                    pblk: plan.free_run,
                    unwritten: false,
                },
                FcRecord::Creat(dentry(ROOT_INO, file, "new-file")),
                FcRecord::Inode {
                    ino: dir,
                    raw: logged(inner, dir, 0o40755, bs as u64, 2),
                },
                FcRecord::Creat(dentry(ROOT_INO, dir, "new-dir")),
                FcRecord::Inode {
                    ino: inner_file,
                    raw: logged(inner, inner_file, 0o100600, 700, 1),
                },
                FcRecord::AddRange {
                    ino: inner_file,
                    lblk: 0,
                    len: 1,
                    pblk: plan.free_run + 3,
                    unwritten: false,
                },
                FcRecord::Creat(dentry(dir, inner_file, "inner")),
                FcRecord::Link(dentry(dir, file, "hard")),
                FcRecord::Unlink(dentry(plan.dir_a, plan.existing, "existing")),
                FcRecord::DelRange {
                    ino: plan.trunc,
                    lblk: 2,
                    len: 3,
                },
                FcRecord::Inode {
                    ino: file,
                    raw: logged(inner, file, 0o100644, file_size, 2),
                },
            ]
        })
        .unwrap()
    }

    fn replay(fs: &Fs, records: &[FcRecord]) -> FsResult<ReplayReport> {
        let report = fs.with_exclusive(|op| apply(op, records))?;
        fs.sync()?;
        report
    }

    /// Path -> (kind, size, links, bytes), and the free counts: what must not depend on
    /// how many times the records were applied.
    /// Path -> (kind, size, links, bytes).
    type Tree = BTreeMap<String, (FileKind, u64, u32, Vec<u8>)>;

    fn snapshot(fs: &Fs) -> (Tree, u64, u64) {
        let mut out = BTreeMap::new();
        let mut stack = vec![(ROOT_INO, String::new())];
        while let Some((dir, rel)) = stack.pop() {
            for e in fs.readdir(dir, 0).unwrap() {
                if e.name == b"." || e.name == b".." {
                    continue;
                }
                let path = format!("{rel}/{}", String::from_utf8_lossy(&e.name));
                let st = fs.stat(e.ino).unwrap();
                let bytes = match st.kind {
                    FileKind::Regular => fs.read(e.ino, 0, st.size as usize).unwrap(),
                    FileKind::Directory => {
                        stack.push((e.ino, path.clone()));
                        Vec::new()
                    }
                    _ => Vec::new(),
                };
                out.insert(path, (st.kind, st.size, st.nlink, bytes));
            }
        }
        let sfs = fs.statfs().unwrap();
        (out, sfs.blocks_free, sfs.inodes_free)
    }

    fn check_result(fs: &Fs, plan: &Plan) {
        let bs = plan.bs;
        let file = fs.resolve("/new-file").unwrap();
        let st = fs.stat(file).unwrap();
        assert_eq!((st.size, st.nlink), ((3 * bs - 100) as u64, 2));
        assert_eq!(st.blocks_512, (3 * bs / 512) as u64, "i_blocks recomputed");
        assert_eq!(fs.read(file, 0, 3 * bs).unwrap(), pattern(1, 3 * bs - 100));
        assert_eq!(fs.resolve("/new-dir/hard").unwrap(), file);
        let inner_file = fs.resolve("/new-dir/inner").unwrap();
        assert_eq!(fs.read(inner_file, 0, 700).unwrap(), pattern(2, 700));
        let dir = fs.stat(fs.resolve("/new-dir").unwrap()).unwrap();
        assert_eq!(dir.nlink, 2);
        assert!(fs.resolve("/a/existing").is_err(), "unlinked");
        let trunc = fs.stat(plan.trunc).unwrap();
        assert_eq!(
            trunc.blocks_512,
            (2 * bs / 512) as u64,
            "blocks 2..5 unmapped"
        );
        assert_eq!(
            fs.stat(ROOT_INO).unwrap().nlink,
            5,
            "/, lost+found, a, new-dir"
        );
    }

    #[test]
    fn records_replay_into_files_and_replaying_twice_changes_nothing() {
        let mut results = Vec::new();
        for times in [1, 2] {
            let image = Image::new(&format!("twice-{times}"));
            let fs = image.mount();
            let plan = base_state(&fs);
            let records = records(&fs, &plan);
            let mut reports = Vec::new();
            for _ in 0..times {
                reports.push(replay(&fs, &records).unwrap());
            }
            assert_eq!(reports[0].records, records.len());
            assert_eq!(reports[0].skipped, 0, "{}", reports[0]);
            if times == 2 {
                // The unlinked name is gone; "new-dir" is made afresh by its CREAT, so
                // the LINK into it adds "hard" again (and the INODE after it sets the
                // link count back), as in the kernel.
                assert_eq!(reports[1].skipped, 1, "{}", reports[1]);
            }
            check_result(&fs, &plan);
            fs.unmount().unwrap();
            image.e2fsck_clean();
            let fs = image.mount();
            check_result(&fs, &plan);
            results.push(snapshot(&fs));
            fs.unmount().unwrap();
            image.e2fsck_clean();
        }
        assert_eq!(results[0], results[1], "once and twice agree");
    }

    #[test]
    fn bad_records_are_refused_by_name_before_anything_changes() {
        let image = Image::new("bad");
        let fs = image.mount();
        let plan = base_state(&fs);
        let before = snapshot(&fs);
        let blocks = fs.with_exclusive(|op| op.fs.geo.blocks_count).unwrap();
        let inodes = fs.statfs().unwrap().inodes as u32;
        let good = records(&fs, &plan);
        let bad: Vec<(FcRecord, &str)> = vec![
            (
                FcRecord::DelRange {
                    ino: inodes + 1,
                    lblk: 0,
                    len: 1,
                },
                "not an ordinary inode",
            ),
            (
                FcRecord::Inode {
                    ino: 8,
                    raw: vec![0; 160],
                },
                "not an ordinary inode",
            ),
            (
                FcRecord::AddRange {
                    ino: plan.trunc,
                    lblk: 0,
                    len: 4,
                    pblk: blocks - 2,
                    unwritten: false,
                },
                "not all on the device",
            ),
            (
                FcRecord::AddRange {
                    ino: plan.trunc,
                    lblk: 0,
                    len: 1,
                    pblk: 1,
                    unwritten: false,
                },
                "metadata",
            ),
            (
                FcRecord::AddRange {
                    ino: plan.trunc,
                    lblk: 0,
                    len: 2,
                    pblk: plan.journal_block,
                    unwritten: false,
                },
                "overlap the journal",
            ),
            (
                FcRecord::Creat(dentry(ROOT_INO, plan.trunc, "a/b")),
                "not a valid file name",
            ),
            (
                FcRecord::Inode {
                    ino: plan.trunc,
                    raw: vec![0; 4000],
                },
                "logged inode of 4000 bytes",
            ),
            (
                FcRecord::Inode {
                    ino: plan.trunc,
                    raw: vec![0; 129],
                },
                "stops inside i_extra_isize",
            ),
            (
                FcRecord::Inode {
                    ino: plan.trunc,
                    raw: {
                        let mut raw = vec![0; 160];
                        raw[I_EXTRA_ISIZE] = 64;
                        raw
                    },
                },
                "i_extra_isize 64 does not fit",
            ),
            (
                FcRecord::Unlink(dentry(plan.trunc, plan.trunc, "x")),
                "named in itself",
            ),
            (
                FcRecord::Link(dentry(plan.trunc, plan.existing, "x")),
                "not a directory",
            ),
            (
                FcRecord::Link(dentry(ROOT_INO, plan.dir_a, "x")),
                "a second name for directory",
            ),
        ];
        for (record, why) in bad {
            // Good records first: a bad one later stops the replay all the same.
            let mut list = good.clone();
            let changes = ["not a directory", "a second name for directory"];
            let at = if changes.contains(&why) {
                0
            } else {
                list.len()
            };
            list.insert(at, record);
            let err = fs
                .with_exclusive(|op| apply(op, &list))
                .unwrap()
                .expect_err(why);
            let text = err.to_string();
            assert!(
                text.contains(&format!("fast-commit record {at} (")) && text.contains(why),
                "{why}: {text}"
            );
        }
        assert_eq!(snapshot(&fs), before, "a refused replay changes nothing");
        fs.unmount().unwrap();
        image.e2fsck_clean();
    }

    #[test]
    fn a_replay_larger_than_a_transaction_fails_cleanly_and_changes_nothing() {
        let image = Image::new("too-big");
        let fs = image.mount();
        let plan = base_state(&fs);
        let before = snapshot(&fs);
        // New inodes on hundreds of inode-table blocks: more than one handle may change.
        let (records, limit) = fs
            .with_exclusive(|op| {
                let inner = op.fs;
                let geo = &inner.geo;
                let records: Vec<FcRecord> = (0..geo.inodes_count)
                    .map(|i| geo.inodes_count - i)
                    .filter(|&ino| ino >= geo.first_ino)
                    .step_by(geo.inodes_per_block() as usize)
                    .take(3000)
                    .map(|ino| FcRecord::Inode {
                        ino,
                        raw: logged(inner, ino, 0o100644, 0, 1),
                    })
                    .collect();
                (records, inner.journal.max_transaction_blocks() / 2)
            })
            .unwrap();
        assert!(records.len() as u32 > limit, "{} records", records.len());
        let err = fs
            .with_exclusive(|op| apply(op, &records))
            .unwrap()
            .expect_err("too large for one transaction");
        assert!(
            err.to_string()
                .contains("more blocks than one transaction holds"),
            "{err}"
        );
        // The journal stopped: nothing of the replay reaches the disk.
        assert!(fs.create_file("/after", 0o644).is_err(), "writes stop");
        drop(fs);
        let fs = image.mount();
        assert_eq!(snapshot(&fs), before, "the image is as before the replay");
        assert!(fs.resolve("/a/trunc").is_ok() && plan.new_inos.len() == 3);
        fs.unmount().unwrap();
        image.e2fsck_clean();
    }
}
