//! File data: reads, writes, writeback, sync, truncate and fallocate.
//!
//! Writes land in the page cache (delayed allocation): a page that has no block yet
//! reserves one, so that writeback can never run out of space for data already accepted.
//! Writeback allocates contiguous runs for consecutive dirty pages and writes the data
//! while its handle is still open, so the transaction that maps the blocks cannot commit
//! before the data was sent (data=ordered); the commit's preflush then makes both durable.
//! With data=journal the pages go through the journal instead.
//!
//! The on-disk size only grows in the transaction that maps the data under it, so a crash
//! never shows a file longer than what reached the disk.

use crate::blockmap;
use crate::error::{FsError, FsResult};
use crate::format::extent::Extent;
use crate::inodes::inode_time;
use crate::namei::ensure_space;
use crate::options::DataMode;
use crate::state::{FsInner, FsState};
use crate::truncate;
use crate::tx::Tx;
use crate::types::{FallocateMode, Timestamp};
use jext_io::{IoFlags, WriteRequest};
use jext_journal::{tid_geq, Tid};
use std::sync::Arc;

/// Pages read ahead from a contiguous extent on a miss.
const READAHEAD_PAGES: u64 = 64;
/// Pages written back in one transaction.
const WRITEBACK_BATCH_PAGES: usize = 2048;
/// Metadata blocks (extent and bitmap blocks) a preallocation may need besides its data.
const ALLOCATION_METADATA_BLOCKS: u64 = 16;
/// Largest file: 2^32 - 1 blocks, as ext4 limits extent-mapped files (`ext4_max_size`:
/// logical block numbers are 32 bits and a run's end must fit too), so every logical
/// block and every run end fits a `u32`.
const MAX_FILE_BLOCKS: u64 = (1 << 32) - 1;

fn load_regular(fs: &FsInner, st: &mut FsState, ino: u32) -> FsResult<()> {
    crate::inodes::load(fs, st, ino)?;
    let info = &st.inodes[&ino];
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

/// Reads up to `len` bytes at `offset`.
pub(crate) fn read(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    offset: u64,
    len: usize,
) -> FsResult<Vec<u8>> {
    load_regular(fs, st, ino)?;
    crate::inodes::note_access(fs, st.inodes.get_mut(&ino).expect("loaded"));
    let size = st.inodes[&ino].size;
    if offset >= size || len == 0 {
        return Ok(Vec::new());
    }
    let end = (offset + len as u64).min(size);
    let bs = u64::from(fs.geo.block_size);
    let mut out = Vec::with_capacity((end - offset) as usize);
    let mut pos = offset;
    while pos < end {
        let index = pos / bs;
        let page = page_data(fs, st, ino, index)?;
        let within = (pos % bs) as usize;
        let n = ((end - pos) as usize).min(bs as usize - within);
        out.extend_from_slice(&page[within..within + n]);
        pos += n as u64;
    }
    st.pages.evict_over_capacity();
    Ok(out)
}

/// The bytes of page `index`: cached, or read from disk (with readahead), or zeros.
fn page_data(fs: &FsInner, st: &mut FsState, ino: u32, index: u64) -> FsResult<Arc<[u8]>> {
    if let Some(page) = st.pages.get(ino, index) {
        return Ok(page.data().clone());
    }
    let bs = fs.geo.block_size as usize;
    let raw = st.inodes[&ino].raw.clone();
    let size_pages = st.inodes[&ino].size.div_ceil(bs as u64);
    let extent = if index < MAX_FILE_BLOCKS {
        blockmap::lookup(fs, ino, &raw, index as u32)?
    } else {
        None
    };
    let Some(e) = extent.filter(|e| !e.unwritten) else {
        let zeros: Arc<[u8]> = Arc::from(vec![0u8; bs]);
        st.pages.insert_clean(ino, index, zeros.clone());
        return Ok(zeros);
    };
    let ahead = (e.end() - index)
        .min(READAHEAD_PAGES)
        .min(size_pages.saturating_sub(index))
        .max(1);
    let phys = e.start + (index - u64::from(e.logical));
    let mut bytes = vec![0u8; ahead as usize * bs];
    fs.io.read(phys * bs as u64, &mut bytes)?;
    let mut first = None;
    for (i, chunk) in bytes.chunks(bs).enumerate() {
        let block = phys + i as u64;
        // A journaled copy not yet written home is newer than the home block.
        if fs.options.data_mode != DataMode::Journal {
            let cached = fs.cache.peek(block).is_some();
            let committed = fs.journal.committed_copy(block).is_some();
            assert!(!cached && !committed, "data block {block} of inode {ino} (page {}) has a journal copy: cached {cached} committed {committed}", index + i as u64);
        }
        let data: Arc<[u8]> = match fs.cache.peek(block).or_else(|| {
            fs.journal
                .committed_copy(block)
                .map(|d| Arc::new(jext_journal::JBuf::new(block, d)))
        }) {
            Some(buf) => buf.bytes(),
            None => Arc::from(chunk),
        };
        if i == 0 {
            first = Some(data.clone());
        }
        st.pages.insert_clean(ino, index + i as u64, data);
    }
    Ok(first.expect("at least one page was read"))
}

/// Writes `data` at `offset`; returns the bytes written. `touch_times`: the write moves
/// mtime and ctime to now (not when the caller keeps the times itself).
pub(crate) fn write(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    offset: u64,
    data: &[u8],
    touch_times: bool,
) -> FsResult<usize> {
    crate::tx::check_writable(fs, st)?;
    load_regular(fs, st, ino)?;
    let info = &st.inodes[&ino];
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
    reserve(fs, st, ino, offset / bs, end.div_ceil(bs))?;
    let mut pos = offset;
    while pos < end {
        let index = pos / bs;
        let within = (pos % bs) as usize;
        let n = ((end - pos) as usize).min(bs as usize - within);
        let src = &data[(pos - offset) as usize..(pos - offset) as usize + n];
        if n < bs as usize && !st.pages.contains(ino, index) {
            page_data(fs, st, ino, index)?;
        }
        st.pages.modify(ino, index, |page| {
            page[within..within + n].copy_from_slice(src)
        });
        pos += n as u64;
    }
    let info = st.inodes.get_mut(&ino).expect("loaded");
    info.size = info.size.max(end);
    if touch_times {
        let t = inode_time(Timestamp::now());
        info.raw.set_mtime(t);
        info.raw.set_ctime(t);
    }
    info.dirty = true;
    balance_dirty(fs, st, ino)?;
    Ok(data.len())
}

/// Reserves a block for every page in `[first, last)` that has none yet.
fn reserve(fs: &FsInner, st: &mut FsState, ino: u32, first: u64, last: u64) -> FsResult<()> {
    let raw = st.inodes[&ino].raw.clone();
    let mut needed = Vec::new();
    let mut index = first;
    while index < last {
        match blockmap::lookup(fs, ino, &raw, index as u32)? {
            Some(e) => index = e.end(),
            None => {
                if !st.inodes[&ino].reserved_pages.contains(&index) {
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
    if st.alloc.available_for_data(fs) < count + st.alloc.pending_blocks(fs.journal.committed_tid())
    {
        // Frees waiting for a commit may make the room: `Fs::with_room` commits with the
        // lock released and tries again.
        return Err(FsError::NoSpace(format!(
            "inode {ino}: {count} blocks for a write"
        )));
    }
    st.alloc.reserved_blocks += count;
    st.inodes
        .get_mut(&ino)
        .expect("loaded")
        .reserved_pages
        .extend(needed);
    Ok(())
}

/// Writes back when dirty data passes the throttle threshold, this file first.
fn balance_dirty(fs: &FsInner, st: &mut FsState, ino: u32) -> FsResult<()> {
    let percent = jext_cache::WritebackPolicy::default().throttle_percent as usize;
    let limit = st.pages.capacity_bytes() / 100 * percent;
    if st.pages.dirty_bytes() <= limit {
        return Ok(());
    }
    writeback(fs, st, ino, false)?;
    write_back_oldest(fs, st, limit / 2, false)?;
    st.pages.evict_over_capacity();
    Ok(())
}

/// Writes back files, oldest dirtied first, until no more than `limit_bytes` are dirty.
/// The order is taken once: sorting every dirty file again after each one made a cache
/// full of small files quadratic.
pub(crate) fn write_back_oldest(
    fs: &FsInner,
    st: &mut FsState,
    limit_bytes: usize,
    with_times: bool,
) -> FsResult<()> {
    for (ino, _) in st.pages.dirty_files() {
        if st.pages.dirty_bytes() <= limit_bytes {
            break;
        }
        writeback(fs, st, ino, with_times)?;
    }
    Ok(())
}

/// Writes back the dirty pages of `ino` (and, with `with_times`, its timestamps);
/// returns the last transaction used, if any.
pub(crate) fn writeback(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    with_times: bool,
) -> FsResult<Option<Tid>> {
    let dirty = st.pages.dirty_indices(ino);
    let mut tid = None;
    for batch in batches(fs, &dirty) {
        tid = writeback_batch(fs, st, ino, batch, with_times)?.or(tid);
    }
    let info = st.inodes.get(&ino);
    let size_unwritten = info.is_some_and(|i| i.raw.size() != i.size && i.is_reg());
    let times = with_times && info.is_some_and(|i| i.dirty);
    if dirty.is_empty() && (size_unwritten || times) {
        // Only metadata is dirty: a size change past the data (a hole), or times.
        let mut tx = Tx::begin(fs, st, 4)?;
        let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
        tid = Some(tx.end(r)?);
    }
    Ok(tid)
}

/// Sets the on-disk size as far as `written_end` allows and journals the inode.
fn sync_size_and_inode(tx: &mut Tx, ino: u32, written_end: u64) -> FsResult<Tid> {
    let info = tx.inode(ino)?;
    let disk = info
        .size
        .min(written_end)
        .max(info.raw.size().min(info.size));
    if disk != info.raw.size() {
        info.raw.set_size(disk);
        tx.mark_datasync(ino);
    }
    tx.write_inode(ino)?;
    Ok(tx.tid())
}

/// Journal credits a writeback batch needs: a base for the inode and group blocks, some
/// per run of pages (allocation, extent tree, bitmaps), and every page under data=journal.
fn batch_credits(runs: usize, pages: usize, journal_data: bool) -> u32 {
    16 + 12 * runs as u32 + if journal_data { pages as u32 } else { 0 }
}

/// Splits sorted dirty page indices into batches that each fit one handle.
fn batches<'p>(fs: &FsInner, dirty: &'p [u64]) -> Vec<&'p [u64]> {
    let journal_data = fs.options.data_mode == DataMode::Journal;
    let cap = fs.journal.max_transaction_blocks() / 2;
    let mut out = Vec::new();
    let (mut start, mut runs) = (0, 0);
    for i in 0..dirty.len() {
        let new_run = i == start || dirty[i] != dirty[i - 1] + 1;
        let pages = i + 1 - start;
        let credits = batch_credits(runs + usize::from(new_run), pages, journal_data);
        if i > start && (credits > cap || pages > WRITEBACK_BATCH_PAGES) {
            out.push(&dirty[start..i]);
            start = i;
            runs = 1;
        } else if new_run {
            runs += 1;
        }
    }
    if start < dirty.len() {
        out.push(&dirty[start..]);
    }
    out
}

/// One state of a run of consecutive pages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mapping {
    Hole,
    Unwritten(u64),
    Written(u64),
}

fn mapping_at(
    fs: &FsInner,
    ino: u32,
    raw: &crate::format::inode::Inode,
    index: u64,
) -> FsResult<(Mapping, u64)> {
    Ok(match blockmap::lookup(fs, ino, raw, index as u32)? {
        None => (Mapping::Hole, 1),
        Some(e) => {
            let phys = e.start + (index - u64::from(e.logical));
            let left = e.end() - index;
            if e.unwritten {
                (Mapping::Unwritten(phys), left)
            } else {
                (Mapping::Written(phys), left)
            }
        }
    })
}

fn writeback_batch(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    pages: &[u64],
    with_times: bool,
) -> FsResult<Option<Tid>> {
    let raw = st.inodes[&ino].raw.clone();
    let journal_data = fs.options.data_mode == DataMode::Journal;
    let runs = consecutive_runs(pages);
    let last_end = (pages.last().copied().unwrap_or(0) + 1) * u64::from(fs.geo.block_size);
    let info = &st.inodes[&ino];
    let grows = info.raw.size() < info.size.min(last_end);
    // Decided by the block map itself: a page over a hole needs a block whether or not it
    // holds a reservation.
    let (mut needs_blocks, mut any_unwritten) = (false, false);
    for &(first, len) in &runs {
        let mut i = first;
        while i < first + len {
            let (m, left) = mapping_at(fs, ino, &raw, i)?;
            needs_blocks |= m == Mapping::Hole;
            any_unwritten |= matches!(m, Mapping::Unwritten(_));
            i += left.max(1);
        }
    }
    if !(needs_blocks || any_unwritten || journal_data || grows || with_times) {
        // Pure overwrite of mapped blocks: no metadata changes, no handle.
        write_pages_in_place(fs, st, ino, &raw, &runs)?;
        st.inodes.get_mut(&ino).expect("loaded").unflushed_data = true;
        return Ok(None);
    }
    let mut tx = Tx::begin(fs, st, batch_credits(runs.len(), pages.len(), journal_data))?;
    let r = (|| {
        for &(first, len) in &runs {
            write_run(&mut tx, ino, first, len, journal_data)?;
        }
        sync_size_and_inode(&mut tx, ino, last_end)
    })();
    tx.end(r).map(Some)
}

/// (first index, length) of each run of consecutive indices.
fn consecutive_runs(indices: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &i in indices {
        match runs.last_mut() {
            Some((first, len)) if *first + *len == i => *len += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

fn write_pages_in_place(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    raw: &crate::format::inode::Inode,
    runs: &[(u64, u64)],
) -> FsResult<()> {
    let bs = u64::from(fs.geo.block_size);
    let mut requests = Vec::new();
    for &(first, len) in runs {
        for index in first..first + len {
            let (Mapping::Written(phys), _) = mapping_at(fs, ino, raw, index)? else {
                unreachable!("only mapped pages are written in place");
            };
            let data = st
                .pages
                .get(ino, index)
                .expect("dirty pages are cached")
                .data()
                .clone();
            requests.push(WriteRequest::new(phys * bs, data, IoFlags::empty()));
        }
    }
    fs.io.submit(requests).wait()?;
    for &(first, len) in runs {
        for index in first..first + len {
            st.pages.mark_clean(ino, index);
        }
    }
    Ok(())
}

/// Writes one run of dirty pages, allocating or converting blocks as needed.
fn write_run(tx: &mut Tx, ino: u32, first: u64, len: u64, journal_data: bool) -> FsResult<()> {
    let mut index = first;
    while index < first + len {
        let raw = tx.raw_inode(ino)?;
        let (mapping, left) = mapping_at(tx.fs, ino, &raw, index)?;
        let n = match mapping {
            Mapping::Hole => {
                let hole = hole_len(tx, ino, &raw, index, first + len)?;
                let placed = blockmap::allocate(tx, ino, index as u32, hole as u32, false)?;
                release_reservations(tx, ino, index, hole);
                for e in placed {
                    put_data(
                        tx,
                        ino,
                        u64::from(e.logical),
                        e.start,
                        u64::from(e.len),
                        journal_data,
                    )?;
                }
                hole
            }
            Mapping::Unwritten(phys) => {
                let n = left.min(first + len - index);
                put_data(tx, ino, index, phys, n, journal_data)?;
                blockmap::mark_written(tx, ino, index as u32, index + n)?;
                n
            }
            Mapping::Written(phys) => {
                let n = left.min(first + len - index);
                put_data(tx, ino, index, phys, n, journal_data)?;
                n
            }
        };
        index += n;
    }
    Ok(())
}

/// Length of the hole at `index`, up to `limit`.
fn hole_len(
    tx: &mut Tx,
    ino: u32,
    raw: &crate::format::inode::Inode,
    index: u64,
    limit: u64,
) -> FsResult<u64> {
    let mut end = index + 1;
    while end < limit && blockmap::lookup(tx.fs, ino, raw, end as u32)?.is_none() {
        end += 1;
    }
    Ok(end - index)
}

fn release_reservations(tx: &mut Tx, ino: u32, first: u64, count: u64) {
    let info = tx.st.inodes.get_mut(&ino).expect("loaded");
    let mut released = 0;
    for i in first..first + count {
        if info.reserved_pages.remove(&i) {
            released += 1;
        }
    }
    tx.st.alloc.reserved_blocks -= released;
}

/// Sends `count` pages from `index` to blocks from `phys`: written in place (before the
/// handle stops, which orders them before the commit), or journaled.
fn put_data(
    tx: &mut Tx,
    ino: u32,
    index: u64,
    phys: u64,
    count: u64,
    journal_data: bool,
) -> FsResult<()> {
    let bs = u64::from(tx.fs.geo.block_size);
    let mut requests = Vec::new();
    for i in 0..count {
        let Some(page) = tx.st.pages.get(ino, index + i) else {
            continue;
        };
        let data = page.data().clone();
        let block = phys + i;
        if journal_data {
            let buf = match tx.fs.cache.peek(block) {
                Some(buf) => buf,
                None => tx.fs.cache.get_new(block),
            };
            tx.modify_buf(&buf, |b| b.copy_from_slice(&data))?;
            // The data now lives in this transaction: fdatasync must wait for it even
            // when nothing else about the file changed (an overwrite in place).
            tx.mark_datasync(ino);
        } else {
            requests.push(WriteRequest::new(block * bs, data, IoFlags::ORDERED));
        }
        tx.st.pages.mark_clean(ino, index + i);
    }
    if !requests.is_empty() {
        tx.fs.io.submit(requests).wait()?;
    }
    Ok(())
}

/// Makes `ino` ready to be durable: writes back its data (and metadata unless
/// `datasync`); returns the transaction to wait for and whether a flush is needed.
pub(crate) fn prepare_sync(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    datasync: bool,
) -> FsResult<(Option<Tid>, bool)> {
    crate::inodes::load(fs, st, ino)?;
    if !fs.is_read_only() {
        writeback(fs, st, ino, !datasync)?;
    }
    let committed = fs.journal.committed_tid();
    let info = st.inodes.get_mut(&ino).expect("loaded");
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
fn zero_in_page(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    index: u64,
    from: usize,
    to: usize,
) -> FsResult<()> {
    let raw = st.inodes[&ino].raw.clone();
    let written = blockmap::lookup(fs, ino, &raw, index as u32)?.is_some_and(|e| !e.unwritten);
    let dirty = st.pages.get(ino, index).is_some_and(|p| p.is_dirty());
    if written || dirty {
        page_data(fs, st, ino, index)?;
        st.pages.modify(ino, index, |p| p[from..to].fill(0));
    } else {
        st.pages.discard(ino, index, index + 1);
    }
    Ok(())
}

/// Changes the size of `ino` to `new_size`.
pub(crate) fn set_size(fs: &FsInner, st: &mut FsState, ino: u32, new_size: u64) -> FsResult<()> {
    load_regular(fs, st, ino)?;
    let bs = u64::from(fs.geo.block_size);
    if new_size > MAX_FILE_BLOCKS * bs {
        return Err(FsError::FileTooBig(format!("inode {ino}: size {new_size}")));
    }
    let old = st.inodes[&ino].size;
    if new_size < old {
        // Zero the tail of the new last page, so growing the file later shows zeros.
        if !new_size.is_multiple_of(bs) {
            let within = (new_size % bs) as usize;
            zero_in_page(fs, st, ino, new_size / bs, within, bs as usize)?;
        }
        let keep_pages = new_size.div_ceil(bs);
        st.pages.truncate(ino, keep_pages);
        let info = st.inodes.get_mut(&ino).expect("loaded");
        let dropped: Vec<u64> = info.reserved_pages.range(keep_pages..).copied().collect();
        for i in &dropped {
            info.reserved_pages.remove(i);
        }
        st.alloc.reserved_blocks -= dropped.len() as u64;
    }
    let t = inode_time(Timestamp::now());
    let info = st.inodes.get_mut(&ino).expect("loaded");
    info.size = new_size;
    info.raw.set_mtime(t);
    info.raw.set_ctime(t);
    if new_size < old {
        truncate::shrink(fs, st, ino, new_size)
    } else {
        let mut tx = Tx::begin(fs, st, 4)?;
        let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
        tx.end(r).map(|_| ())
    }
}

/// `fallocate`: preallocates (unwritten blocks) or punches a hole in `[offset, offset+len)`.
pub(crate) fn fallocate(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    offset: u64,
    len: u64,
    mode: FallocateMode,
) -> FsResult<()> {
    load_regular(fs, st, ino)?;
    crate::tx::check_writable(fs, st)?;
    let only_allocates = !mode.punch_hole && !mode.zero_range;
    crate::inode_guard::check_fallocate(ino, st.inodes[&ino].raw.flags(), only_allocates)?;
    let bs = u64::from(fs.geo.block_size);
    let end = offset
        .checked_add(len)
        .filter(|&e| len > 0 && e <= MAX_FILE_BLOCKS * bs);
    let Some(end) = end else {
        return Err(FsError::Invalid(format!("fallocate range {offset}+{len}")));
    };
    if mode.punch_hole {
        return punch_hole(fs, st, ino, offset, end);
    }
    if mode.zero_range {
        // A hole, then unwritten blocks over it: reads give zeros, the space stays
        // allocated, and the size grows unless asked not to, as ext4's zero range.
        punch_hole(fs, st, ino, offset, end)?;
    }
    let raw = st.inodes[&ino].raw.clone();
    let mut holes = Vec::new();
    let mut index = offset / bs;
    while index < end.div_ceil(bs) {
        match blockmap::lookup(fs, ino, &raw, index as u32)? {
            Some(e) => index = e.end(),
            None => {
                let start = index;
                while index < end.div_ceil(bs)
                    && blockmap::lookup(fs, ino, &raw, index as u32)?.is_none()
                {
                    index += 1;
                }
                holes.push((start, index - start));
            }
        }
    }
    let wanted: u64 = holes.iter().map(|(_, n)| n).sum();
    ensure_space(fs, st, wanted + ALLOCATION_METADATA_BLOCKS, false)?;
    for chunk in holes.chunks(16) {
        let mut tx = Tx::begin(fs, st, 32 + 12 * chunk.len() as u32)?;
        let r = (|| {
            for &(start, n) in chunk {
                blockmap::allocate(&mut tx, ino, start as u32, n as u32, true)?;
                release_reservations(&mut tx, ino, start, n);
            }
            tx.write_inode(ino)
        })();
        tx.end(r)?;
    }
    let t = inode_time(Timestamp::now());
    let info = st.inodes.get_mut(&ino).expect("loaded");
    info.raw.set_ctime(t);
    if !mode.keep_size && end > info.size {
        info.size = end;
        info.raw.set_mtime(t);
    }
    let mut tx = Tx::begin(fs, st, 4)?;
    let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
    tx.end(r).map(|_| ())
}

fn punch_hole(fs: &FsInner, st: &mut FsState, ino: u32, offset: u64, end: u64) -> FsResult<()> {
    let bs = u64::from(fs.geo.block_size);
    let size = st.inodes[&ino].size;
    let end = end.min(size.max(offset));
    if end <= offset {
        return Ok(());
    }
    // Zero the partial pages at either edge in place.
    for (from, to) in [
        (offset, end.min((offset / bs + 1) * bs)),
        ((end / bs * bs).max(offset), end),
    ] {
        if from < to && (from % bs != 0 || to % bs != 0) {
            let (a, b) = ((from % bs) as usize, ((to - 1) % bs) as usize + 1);
            zero_in_page(fs, st, ino, from / bs, a, b)?;
        }
    }
    let (first_full, end_full) = (offset.div_ceil(bs), end / bs);
    if first_full < end_full {
        st.pages.discard(ino, first_full, end_full);
        let info = st.inodes.get_mut(&ino).expect("loaded");
        let dropped: Vec<u64> = info
            .reserved_pages
            .range(first_full..end_full)
            .copied()
            .collect();
        for i in &dropped {
            info.reserved_pages.remove(i);
        }
        st.alloc.reserved_blocks -= dropped.len() as u64;
        truncate::unmap_chunked(fs, st, ino, first_full, end_full)?;
    }
    let t = inode_time(Timestamp::now());
    let info = st.inodes.get_mut(&ino).expect("loaded");
    info.raw.set_mtime(t);
    info.raw.set_ctime(t);
    let mut tx = Tx::begin(fs, st, 4)?;
    let r = tx.write_inode(ino);
    tx.end(r)
}

/// Extents of any extent-mapped inode (SEEK_DATA/SEEK_HOLE, `jext debug`, tests).
pub(crate) fn extents(fs: &FsInner, st: &mut FsState, ino: u32) -> FsResult<Vec<Extent>> {
    crate::inodes::load(fs, st, ino)?;
    let raw = st.inodes[&ino].raw.clone();
    blockmap::extents(fs, ino, &raw)
}

/// `lseek(SEEK_DATA)` (`hole == false`) or `lseek(SEEK_HOLE)` (`hole == true`) from `offset`.
/// Data is every block an extent maps (unwritten ones too: POSIX lets a file system call
/// a hole data, and an unwritten extent may have dirty pages over it) and every dirty
/// page not yet allocated (delayed allocation). ENXIO past the end, as Linux answers.
pub(crate) fn seek(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    offset: u64,
    hole: bool,
) -> FsResult<u64> {
    crate::inodes::load(fs, st, ino)?;
    let size = st.inodes[&ino].size;
    if offset >= size {
        return Err(FsError::NoSuchOffset(format!(
            "offset {offset} is at or past the end ({size} bytes) of inode {ino}"
        )));
    }
    let no_data = || FsError::NoSuchOffset(format!("no data after offset {offset} in inode {ino}"));
    let bs = u64::from(fs.geo.block_size);
    let mut data_blocks: Vec<(u64, u64)> = extents(fs, st, ino)?
        .iter()
        .map(|e| (u64::from(e.logical), e.end()))
        .collect();
    let per_page = st.pages.page_size() as u64 / bs;
    data_blocks.extend(
        st.pages
            .dirty_indices(ino)
            .into_iter()
            .map(|p| (p * per_page, (p + 1) * per_page)),
    );
    data_blocks.sort_unstable();
    let mut block = offset / bs;
    for (start, end) in data_blocks {
        if end <= block {
            continue;
        }
        if hole {
            if start > block {
                break; // a gap before this run: the hole starts at `block`
            }
            block = end;
        } else {
            let at = (start.max(block) * bs).max(offset);
            return if at < size { Ok(at) } else { Err(no_data()) };
        }
    }
    if hole {
        Ok((block * bs).max(offset).min(size))
    } else {
        Err(no_data())
    }
}
