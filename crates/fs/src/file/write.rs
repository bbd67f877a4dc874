//! Writing file data: writes land in the page cache (delayed allocation), and a page that
//! has no block yet reserves one, so writeback can never run out of space for data already
//! accepted. Dirty data over the throttle threshold is written back by the writer itself,
//! its own file and then the oldest, after the write released the lock ([`balance_dirty`]).
//!
//! Promises: a write that returned is in the page cache with its block reserved and the
//! in-memory size covering it. Must never allocate blocks (writeback does) nor wait for a
//! commit (a write that needs room that only a commit frees says so, and `Fs::with_room`
//! commits with the lock released).

use super::{check_regular, page_data, writeback, MAX_FILE_BLOCKS};
use crate::blockmap;
use crate::error::{FsError, FsResult};
use crate::inodes::stamp;
use crate::op::Op;
use crate::state::FsInner;
use crate::types::Timestamp;
use std::sync::Arc;

/// Pages a write copies into the cache before it gives way to whatever waits for its CPU,
/// as the kernel's own write loop does (`cond_resched` per page in `generic_perform_write`).
/// The scheduler lets a running thread finish its slice before a woken one runs there;
/// without this, a 1 MiB write (about 1.2 ms of copying here) held up the per-CPU kernel
/// worker that completes the device's IO, and with it the fsync of a file beside: one
/// fsync in ten took 1.2-1.5 ms longer beside a 100 MiB/s writer (`perf sched timehist`).
const YIELD_EVERY_PAGES: u64 = 16;

/// Writes `data` at `offset`; returns the bytes written. `touch_times`: the write moves
/// mtime and ctime to now (not when the caller keeps the times itself).
pub(crate) fn write(
    op: &mut Op,
    ino: u32,
    offset: u64,
    data: &[u8],
    touch_times: bool,
) -> FsResult<usize> {
    let fs = op.fs;
    crate::tx::check_writable(fs)?;
    check_regular(op, ino)?;
    let info = op.inode(ino);
    crate::inode_guard::check_write(ino, info.raw.flags(), offset, info.size)?;
    if data.is_empty() {
        return Ok(0);
    }
    let bs = u64::from(fs.geo.block_size);
    let end = offset
        .checked_add(data.len() as u64)
        .filter(|&e| e <= MAX_FILE_BLOCKS * bs);
    let Some(end) = end else {
        return Err(FsError::FileTooBig(format!(
            "inode {ino}: write past the largest ext4 file"
        )));
    };
    reserve(op, ino, offset / bs, end.div_ceil(bs))?;
    // A data-journaled file's clean page holds what its block holds at home once the
    // journal's copies of it are checkpointed: kept, it lets the journal log the change
    // as the bytes changed (`writeback::journal_pages`).
    let keep_base = fs.journals_data(op.inode(ino));
    let mut pos = offset;
    let mut pages_copied = 0;
    while pos < end {
        pages_copied += 1;
        if pages_copied % YIELD_EVERY_PAGES == 0 {
            std::thread::yield_now();
        }
        let index = pos / bs;
        let within = (pos % bs) as usize;
        let n = ((end - pos) as usize).min(bs as usize - within);
        let src = &data[(pos - offset) as usize..(pos - offset) as usize + n];
        if n == bs as usize {
            // Made before the lock is taken: under it only the page is swapped in.
            let page: Arc<[u8]> = Arc::from(src);
            fs.pages.lock().replace(ino, index, page, keep_base);
        } else {
            if !fs.pages.lock().contains(ino, index) {
                page_data(op, ino, index)?;
            }
            let change = |page: &mut [u8]| page[within..within + n].copy_from_slice(src);
            match keep_base {
                true => fs.pages.lock().modify_keeping_base(ino, index, change),
                false => fs.pages.lock().modify(ino, index, change),
            }
        }
        pos += n as u64;
    }
    let info = op.inode_mut(ino);
    info.size = info.size.max(end);
    // Only a change of the record dirties the inode (the size is written back with the
    // data): a write within the clock tick of the last one leaves nothing to commit.
    if touch_times {
        let t = stamp(info, Timestamp::now());
        if info.raw.mtime() != t || info.raw.ctime() != t {
            info.raw.set_mtime(t);
            info.raw.set_ctime(t);
            info.dirty = true;
        }
    }
    Ok(data.len())
}

/// Reserves a block for every page in `[first, last)` that has none yet.
fn reserve(op: &mut Op, ino: u32, first: u64, last: u64) -> FsResult<()> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    let mut needed = Vec::new();
    let mut index = first;
    while index < last {
        match blockmap::lookup(fs, ino, &raw, index as u32)? {
            Some(e) => index = e.end(),
            None => {
                if !op.inode(ino).reserved_pages.contains(&index) {
                    needed.push(index);
                }
                index += 1;
            }
        }
    }
    if needed.is_empty() {
        return Ok(());
    }
    let count = needed.len() as u64;
    let pending = fs.alloc.pending_blocks(fs.journal.committed_tid());
    {
        let mut totals = fs.alloc.totals.lock();
        if !totals.has_room_for_data(fs, count, pending) {
            // Frees waiting for a commit may make the room: `Fs::with_room` commits with
            // nothing locked and tries again.
            return Err(FsError::NoSpace(format!(
                "inode {ino}: {count} blocks for a write"
            )));
        }
        totals.reserved_blocks += count;
    }
    op.inode_mut(ino).reserved_pages.extend(needed);
    Ok(())
}

/// Dirty throttling, called after a write with nothing locked: when dirty data passed the
/// throttle threshold, the writer writes back its own file, then the oldest dirty files
/// until dirty data is at half the threshold, as the kernel's `balance_dirty_pages` holds
/// a writer back. Each file goes out a batch per hold of its inode, its data waited for
/// with nothing locked, so other operations (an fsync beside a bulk writer) are not held
/// up for the transfer. The order of the other files is taken once: sorting every dirty
/// file again after each one made a cache full of small files quadratic.
pub(crate) fn balance_dirty(fs: &FsInner, ino: u32) -> FsResult<()> {
    let limit = fs.dirty_limits.throttle_bytes;
    let oldest = {
        let pages = fs.pages.lock();
        if pages.dirty_bytes() <= limit {
            return Ok(());
        }
        pages.dirty_files()
    };
    writeback::write_back_unlocked(fs, ino, false, writeback::Urgency::Background)?;
    for (other, _) in oldest {
        if fs.pages.lock().dirty_bytes() <= limit / 2 {
            break;
        }
        writeback::write_back_unlocked(fs, other, false, writeback::Urgency::Background)?;
    }
    fs.pages.lock().evict_over_capacity();
    Ok(())
}
