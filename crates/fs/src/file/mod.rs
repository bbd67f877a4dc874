//! File data, in three parts: `read` (page cache, readahead), `write` (into the page
//! cache with delayed allocation and dirty throttling) and `writeback` (blocks for dirty
//! pages, data written before a transaction marks them written, or through the journal;
//! `in_flight` and `ownership` are its helpers). Here: what
//! fsync must do first, size changes (truncate, extend), fallocate and punching holes,
//! extents and SEEK_DATA/SEEK_HOLE.
//!
//! Promises: the on-disk size only grows in the transaction that maps the data under it,
//! so a crash never shows a file longer than what reached the disk. Must never wait for a
//! commit (callers do, with nothing locked). Every function here works on inodes the
//! caller's operation holds.

mod in_flight;
mod ownership;
mod read;
mod write;
mod writeback;

use in_flight::{DataInFlight, Run};
pub(crate) use ownership::WritebackOwners;
use read::page_data;
pub(crate) use read::read;
pub(crate) use write::{balance_dirty, write};
pub(crate) use writeback::{
    files_with_dirty_pages, own_writeback, write_back_files, write_back_unlocked, writeback,
    Urgency,
};
use writeback::{release_reservations, sync_size_and_inode};

use crate::blockmap;
use crate::error::{FsError, FsResult};
use crate::format::extent::Extent;
use crate::inodes::stamp;
use crate::namei::ensure_space;
use crate::op::Op;
use crate::truncate;
use crate::tx::Tx;
use crate::types::{FallocateMode, Timestamp};
use jext_journal::{tid_geq, Tid};
use std::collections::BTreeSet;

/// Metadata blocks (extent and bitmap blocks) a preallocation may need besides its data.
const ALLOCATION_METADATA_BLOCKS: u64 = 16;

/// Largest file: 2^32 - 1 blocks, as ext4 limits extent-mapped files (`ext4_max_size`:
/// logical block numbers are 32 bits and a run's end must fit too), so every logical
/// block and every run end fits a `u32`.
const MAX_FILE_BLOCKS: u64 = (1 << 32) - 1;

/// Fails unless `ino` (held by `op`) is a regular file.
fn check_regular(op: &Op, ino: u32) -> FsResult<()> {
    let info = op.inode(ino);
    if info.is_dir() {
        return Err(FsError::IsDir(format!("inode {ino}")));
    }
    if !info.is_reg() {
        return Err(FsError::Invalid(format!(
            "inode {ino} is not a regular file"
        )));
    }
    Ok(())
}

/// Makes `ino` (the only inode `op` holds) ready to be durable: writes back its data
/// (and metadata unless `datasync`), after any writeback of it already under way, with
/// the inode released while data transfers; returns the transaction to wait for and
/// whether a flush is needed.
pub(crate) fn prepare_sync(op: &mut Op, ino: u32, datasync: bool) -> FsResult<(Option<Tid>, bool)> {
    let fs = op.fs;
    if !fs.is_read_only() {
        writeback(op, ino, !datasync)?;
    }
    let committed = fs.journal.committed_tid();
    let info = op.inode_mut(ino);
    // A directory's entries are its data: fdatasync of a directory must make them durable
    // as fsync does (SQLite syncs the directory so after deleting a rollback journal).
    let datasync = datasync && !info.is_dir();
    let wanted = if datasync {
        info.datasync_tid.or(info.sync_tid)
    } else {
        later_tid(info.sync_tid, info.datasync_tid)
    };
    let tid = wanted.filter(|t| !tid_geq(committed, *t));
    let flush = std::mem::take(&mut info.unflushed_data);
    Ok((tid, flush))
}

fn later_tid(a: Option<Tid>, b: Option<Tid>) -> Option<Tid> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if tid_geq(a, b) { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Zeroes bytes `[from, to)` of page `index`. A page over a hole or an unwritten block
/// that nobody dirtied already reads as zeros, so it is dropped rather than dirtied.
fn zero_in_page(op: &mut Op, ino: u32, index: u64, from: usize, to: usize) -> FsResult<()> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    let written = blockmap::lookup(fs, ino, &raw, index as u32)?.is_some_and(|e| !e.unwritten);
    // A page in flight is data too: its block is marked written only once the write
    // transferred.
    let has_data = fs
        .pages
        .lock()
        .get(ino, index)
        .is_some_and(|p| p.is_dirty() || p.in_writeback());
    if written || has_data {
        page_data(op, ino, index)?;
        fs.pages.lock().modify(ino, index, |p| p[from..to].fill(0));
    } else {
        fs.pages.lock().discard(ino, index, index + 1);
    }
    Ok(())
}

/// Changes the size of `ino` to `new_size`.
pub(crate) fn set_size(op: &mut Op, ino: u32, new_size: u64) -> FsResult<()> {
    let fs = op.fs;
    check_regular(op, ino)?;
    let bs = u64::from(fs.geo.block_size);
    if new_size > MAX_FILE_BLOCKS * bs {
        return Err(FsError::FileTooBig(format!("inode {ino}: size {new_size}")));
    }
    let old = op.inode(ino).size;
    if new_size < old {
        // Zero the tail of the new last page, so growing the file later shows zeros.
        if !new_size.is_multiple_of(bs) {
            let within = (new_size % bs) as usize;
            zero_in_page(op, ino, new_size / bs, within, bs as usize)?;
        }
        let keep_pages = new_size.div_ceil(bs);
        fs.pages.lock().truncate(ino, keep_pages);
        let info = op.inode_mut(ino);
        let dropped: Vec<u64> = info.reserved_pages.range(keep_pages..).copied().collect();
        for i in &dropped {
            info.reserved_pages.remove(i);
        }
        fs.alloc.totals.lock().reserved_blocks -= dropped.len() as u64;
    }
    let info = op.inode_mut(ino);
    let t = stamp(info, Timestamp::now());
    info.size = new_size;
    info.raw.set_mtime(t);
    info.raw.set_ctime(t);
    if new_size < old {
        truncate::shrink(op, ino, new_size)
    } else {
        let mut tx = Tx::begin(op, 4)?;
        let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
        tx.end(r).map(|_| ())
    }
}

/// `fallocate`: preallocates (unwritten blocks) or punches a hole in `[offset, offset+len)`.
pub(crate) fn fallocate(
    op: &mut Op,
    ino: u32,
    offset: u64,
    len: u64,
    mode: FallocateMode,
) -> FsResult<()> {
    let fs = op.fs;
    check_regular(op, ino)?;
    // Preallocated and zeroed ranges read differently afterwards.
    op.note_data_change(ino);
    crate::tx::check_writable(fs)?;
    let only_allocates = !mode.punch_hole && !mode.zero_range;
    crate::inode_guard::check_fallocate(ino, op.inode(ino).raw.flags(), only_allocates)?;
    let bs = u64::from(fs.geo.block_size);
    let end = offset
        .checked_add(len)
        .filter(|&e| len > 0 && e <= MAX_FILE_BLOCKS * bs);
    let Some(end) = end else {
        return Err(FsError::Invalid(format!("fallocate range {offset}+{len}")));
    };
    if mode.punch_hole {
        return punch_hole(op, ino, offset, end);
    }
    if mode.zero_range {
        // A hole, then unwritten blocks over it: reads give zeros, the space stays
        // allocated, and the size grows unless asked not to, as ext4's zero range.
        punch_hole(op, ino, offset, end)?;
    }
    let raw = op.inode(ino).raw.clone();
    let holes = blockmap::holes_in(fs, ino, &raw, offset / bs, end.div_ceil(bs))?;
    let wanted: u64 = holes.iter().map(|(_, n)| n).sum();
    // As ext4, preallocation leaves the metadata reserve and the dirty pages' blocks
    // alone: a later punch that splits an extent, or writeback, may need them.
    let pending = fs.alloc.pending_blocks(fs.journal.committed_tid());
    let room =
        fs.alloc
            .totals
            .lock()
            .has_room_for_data(fs, wanted + ALLOCATION_METADATA_BLOCKS, pending);
    if !room {
        // Frees waiting for a commit may make the room: `Fs::with_room` commits with
        // nothing locked and tries again.
        return Err(FsError::NoSpace(format!(
            "inode {ino}: {wanted} blocks to preallocate"
        )));
    }
    for chunk in holes.chunks(16) {
        let mut tx = Tx::begin(op, 32 + 12 * chunk.len() as u32)?;
        let r = (|| {
            for &(start, n) in chunk {
                blockmap::allocate(&mut tx, ino, start as u32, n as u32, true)?;
                release_reservations(&mut tx, ino, start, n);
            }
            tx.write_inode(ino)
        })();
        tx.end(r)?;
    }
    let info = op.inode_mut(ino);
    let t = stamp(info, Timestamp::now());
    info.raw.set_ctime(t);
    if !mode.keep_size && end > info.size {
        info.size = end;
        info.raw.set_mtime(t);
    }
    let mut tx = Tx::begin(op, 4)?;
    let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
    tx.end(r).map(|_| ())
}

fn punch_hole(op: &mut Op, ino: u32, offset: u64, end: u64) -> FsResult<()> {
    let fs = op.fs;
    let bs = u64::from(fs.geo.block_size);
    let size = op.inode(ino).size;
    let end = end.min(size.max(offset));
    if end <= offset {
        return Ok(());
    }
    // A hole inside one extent splits it, and the split may need new extent-tree blocks.
    // Make sure of them before changing anything: on a full file system the punch then
    // waits for the blocks earlier punches freed (`Fs::with_room` commits them and runs
    // it again), where failing halfway would abort the journal.
    let (first_full, end_full) = (offset.div_ceil(bs), end / bs);
    // The lookup reads the extent tree with only this inode locked, and `ensure_space`
    // takes the allocator's leaf locks for the counts alone, so no leaf lock is held
    // across IO. Like every room check here, it does not reserve: another operation may
    // take the room before the split, as it could before any create's allocation.
    if first_full < end_full {
        let raw = op.inode(ino).raw.clone();
        if let Some(e) = blockmap::lookup(fs, ino, &raw, first_full as u32)? {
            if u64::from(e.logical) < first_full && e.end() > end_full {
                ensure_space(fs, ALLOCATION_METADATA_BLOCKS, false)?;
            }
        }
    }
    // Zero the partial pages at either edge in place.
    for (from, to) in [
        (offset, end.min((offset / bs + 1) * bs)),
        ((end / bs * bs).max(offset), end),
    ] {
        if from < to && (from % bs != 0 || to % bs != 0) {
            let (a, b) = ((from % bs) as usize, ((to - 1) % bs) as usize + 1);
            zero_in_page(op, ino, from / bs, a, b)?;
        }
    }
    if first_full < end_full {
        fs.pages.lock().discard(ino, first_full, end_full);
        let info = op.inode_mut(ino);
        let dropped: Vec<u64> = info
            .reserved_pages
            .range(first_full..end_full)
            .copied()
            .collect();
        for i in &dropped {
            info.reserved_pages.remove(i);
        }
        fs.alloc.totals.lock().reserved_blocks -= dropped.len() as u64;
        truncate::unmap_chunked(op, ino, first_full, end_full)?;
    }
    let info = op.inode_mut(ino);
    let t = stamp(info, Timestamp::now());
    info.raw.set_mtime(t);
    info.raw.set_ctime(t);
    let mut tx = Tx::begin(op, 4)?;
    let r = tx.write_inode(ino);
    tx.end(r)
}

/// Extents of any extent-mapped inode (SEEK_DATA/SEEK_HOLE, `jext debug`, tests).
pub(crate) fn extents(op: &mut Op, ino: u32) -> FsResult<Vec<Extent>> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    blockmap::extents(fs, ino, &raw)
}

/// `lseek(SEEK_DATA)` (`hole == false`) or `lseek(SEEK_HOLE)` (`hole == true`) from `offset`.
/// Data is every block an extent maps (unwritten ones too: POSIX lets a file system call
/// a hole data, and an unwritten extent may have dirty pages over it) and every dirty
/// page not yet allocated (delayed allocation). ENXIO past the end, as Linux answers.
pub(crate) fn seek(op: &mut Op, ino: u32, offset: u64, hole: bool) -> FsResult<u64> {
    let fs = op.fs;
    let size = op.inode(ino).size;
    if offset >= size {
        return Err(FsError::NoSuchOffset(format!(
            "offset {offset} is at or past the end ({size} bytes) of inode {ino}"
        )));
    }
    let bs = u64::from(fs.geo.block_size);
    // A page is a block: page `i` holds logical block `i`.
    let dirty_blocks: BTreeSet<u64> = fs.pages.lock().dirty_indices(ino).into_iter().collect();
    let raw = op.inode(ino).raw.clone();
    let (first, end) = (offset / bs, size.div_ceil(bs));
    let no_data = || FsError::NoSuchOffset(format!("no data after offset {offset} in inode {ino}"));
    let found = if hole {
        // Past every mapped run, and every dirty block a hole would start at.
        let mut block = first;
        loop {
            let at = blockmap::next_hole_or_mapped(fs, ino, &raw, (block, end), true)?;
            let at = at.unwrap_or(end);
            if at >= end || !dirty_blocks.contains(&at) {
                break at;
            }
            block = at + 1;
        }
    } else {
        let mapped = blockmap::next_hole_or_mapped(fs, ino, &raw, (first, end), false)?;
        let dirty = dirty_blocks.range(first..).next().copied();
        mapped.into_iter().chain(dirty).min().ok_or_else(no_data)?
    };
    let at = (found * bs).max(offset).min(size);
    if !hole && at >= size {
        return Err(no_data());
    }
    Ok(at)
}
