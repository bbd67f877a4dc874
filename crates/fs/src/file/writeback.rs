//! Writeback: dirty pages of a file get blocks, in contiguous runs for consecutive pages,
//! and their data is written while the handle that maps them is still open, so the
//! transaction cannot commit before the data was sent (data=ordered); the commit's
//! preflush then makes both durable. With data=journal the pages go through the journal.
//!
//! Data writes go in flight ([`super::DataInFlight`]): the last batch's writes, and the
//! handle that maps their blocks, come back to the caller, who may wait for them with the
//! inode released (fsync does); earlier batches are waited for before the next handle
//! starts.
//!
//! Promises: the on-disk size only grows in the transaction that maps the data under it,
//! so a crash never shows a file longer than what reached the disk. Must never write a
//! page into a block another file may still own (blocks freed by uncommitted transactions
//! are not reused).

use super::DataInFlight;
use crate::blockmap;
use crate::error::FsResult;
use crate::op::{Op, Reach};
use crate::state::FsInner;
use crate::tx::Tx;
use jext_io::{IoFlags, WriteRequest};
use jext_journal::Tid;

/// Pages written back in one transaction.
const WRITEBACK_BATCH_PAGES: usize = 2048;

/// Whether someone waits for a writeback now, which decides how its data writes queue at
/// the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// fsync, sync, a mode switch, unmount: its writes go ahead of background ones.
    Sync,
    /// The writeback thread and dirty throttling: its writes yield to every other write
    /// (`IoFlags::BACKGROUND`), so a neighbour's fsync never queues behind them.
    Background,
}

impl Urgency {
    fn io_flags(self) -> IoFlags {
        match self {
            Urgency::Sync => IoFlags::empty(),
            Urgency::Background => IoFlags::BACKGROUND,
        }
    }
}

/// Writes back the dirty pages of `ino` (held by `op`; and, with `with_times`, its
/// timestamps) and waits for the writes with it held; returns the last transaction used.
pub(crate) fn writeback(op: &mut Op, ino: u32, with_times: bool) -> FsResult<Option<Tid>> {
    let fs = op.fs;
    let (tid, in_flight) = issue_writeback(op, ino, with_times)?;
    in_flight.finish(fs)?;
    Ok(tid)
}

/// Writes back the pages of `ino` that are dirty when it starts, one batch per hold of its
/// lock, each batch's data waited for with nothing locked: a large file's writeback
/// (dirty throttling, the writeback thread, sync, a big fsync) holds up other operations
/// on the file only while it plans each batch, never for the data's transfer. Pages
/// dirtied after it started are left for the next writeback, so a writer that keeps
/// dirtying the file cannot keep it going. With `with_times`, the inode's times (and a size
/// past the data) are journaled at the end unless new pages were dirtied meanwhile, which
/// leaves them to the next writeback. The caller holds no operation.
pub(crate) fn write_back_unlocked(
    fs: &FsInner,
    ino: u32,
    with_times: bool,
    urgency: Urgency,
) -> FsResult<()> {
    let Some(slot) = fs.inodes.cached(ino) else {
        // Not in memory: nothing of it is dirty.
        return Ok(());
    };
    let journal_data = fs.journals_data(&slot.lock().raw);
    drop(slot);
    let dirty = fs.pages.lock().dirty_indices(ino);
    let batches: Vec<Vec<u64>> = batches(fs, journal_data, &dirty)
        .into_iter()
        .map(<[u64]>::to_vec)
        .collect();
    for batch in batches {
        let in_flight = {
            let mut op = Op::shared(fs);
            if !op.lock_if_cached(ino, Reach::First) {
                return Ok(());
            }
            crate::tx::check_writable(fs)?;
            // Another writeback (or a truncate) may have taken some of them meanwhile.
            let still_dirty: Vec<u64> = {
                let pages = fs.pages.lock();
                batch
                    .into_iter()
                    .filter(|&i| pages.is_dirty(ino, i))
                    .collect()
            };
            if still_dirty.is_empty() {
                continue;
            }
            op.note_data_change(ino);
            writeback_batch(&mut op, ino, &still_dirty, false, urgency)?.1
        };
        in_flight.finish(fs)?;
    }
    if with_times {
        let mut op = Op::shared(fs);
        if op.lock_if_cached(ino, Reach::First) && !fs.pages.lock().has_dirty(ino) {
            write_back_metadata(&mut op, ino, with_times)?;
        }
    }
    Ok(())
}

/// [`writeback`], except that the last batch's data writes (and the handle mapping their
/// blocks) are returned in flight for the caller to finish.
pub(crate) fn issue_writeback(
    op: &mut Op,
    ino: u32,
    with_times: bool,
) -> FsResult<(Option<Tid>, DataInFlight)> {
    let fs = op.fs;
    let dirty = fs.pages.lock().dirty_indices(ino);
    if !dirty.is_empty() {
        op.note_data_change(ino);
    }
    let mut tid = None;
    let mut in_flight = DataInFlight::default();
    let journal_data = fs.journals_data(&op.inode(ino).raw);
    for batch in batches(fs, journal_data, &dirty) {
        // A handle held open by data in flight must stop before the next one starts.
        std::mem::take(&mut in_flight).finish(fs)?;
        let (batch_tid, batch_in_flight) =
            writeback_batch(op, ino, batch, with_times, Urgency::Sync)?;
        tid = batch_tid.or(tid);
        in_flight = batch_in_flight;
    }
    if dirty.is_empty() {
        tid = write_back_metadata(op, ino, with_times)?.or(tid);
    }
    Ok((tid, in_flight))
}

/// For a file with no dirty pages: journals a size change past the data (a hole) and,
/// with `with_times`, changed times; returns the transaction, if one was needed.
fn write_back_metadata(op: &mut Op, ino: u32, with_times: bool) -> FsResult<Option<Tid>> {
    let info = op.inode(ino);
    let size_unwritten = info.raw.size() != info.size && info.is_reg();
    let times = with_times && info.dirty;
    if !(size_unwritten || times) {
        return Ok(None);
    }
    let mut tx = Tx::begin(op, 4)?;
    let r = sync_size_and_inode(&mut tx, ino, u64::MAX);
    tx.end(r).map(Some)
}

/// Sets the on-disk size as far as `written_end` allows and journals the inode.
pub(super) fn sync_size_and_inode(tx: &mut Tx, ino: u32, written_end: u64) -> FsResult<Tid> {
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
fn batches<'p>(fs: &FsInner, journal_data: bool, dirty: &'p [u64]) -> Vec<&'p [u64]> {
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
    op: &mut Op,
    ino: u32,
    pages: &[u64],
    with_times: bool,
    urgency: Urgency,
) -> FsResult<(Option<Tid>, DataInFlight)> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    let journal_data = fs.journals_data(&raw);
    let runs = consecutive_runs(pages);
    let last_end = (pages.last().copied().unwrap_or(0) + 1) * u64::from(fs.geo.block_size);
    let info = &op.inode(ino);
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
    // Times only need a handle when they changed since the inode was last journaled.
    let times = with_times && info.dirty;
    if !(needs_blocks || any_unwritten || journal_data || grows || times) {
        // Pure overwrite of mapped blocks: no metadata changes, no handle.
        let in_flight = write_pages_in_place(op, ino, &raw, &runs, urgency)?;
        op.inode_mut(ino).unflushed_data = true;
        return Ok((None, in_flight));
    }
    let mut tx = Tx::begin(op, batch_credits(runs.len(), pages.len(), journal_data))?;
    let r = (|| {
        for &(first, len) in &runs {
            write_run(&mut tx, ino, first, len, journal_data, urgency)?;
        }
        sync_size_and_inode(&mut tx, ino, last_end)
    })();
    let (tid, in_flight) = tx.end_with_data_in_flight(r)?;
    Ok((Some(tid), in_flight))
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
    op: &mut Op,
    ino: u32,
    raw: &crate::format::inode::Inode,
    runs: &[(u64, u64)],
    urgency: Urgency,
) -> FsResult<DataInFlight> {
    let fs = op.fs;
    let bs = u64::from(fs.geo.block_size);
    // Every lookup (which may fail) before any page goes in flight: a page marked clean
    // and in flight but never sent would be lost.
    let mut blocks = Vec::new();
    for &(first, len) in runs {
        for index in first..first + len {
            let (Mapping::Written(phys), _) = mapping_at(fs, ino, raw, index)? else {
                unreachable!("only mapped pages are written in place");
            };
            blocks.push((index, phys));
        }
    }
    let mut requests = Vec::new();
    let mut pages = Vec::new();
    let mut cache = fs.pages.lock();
    for (index, phys) in blocks {
        let page = cache
            .start_writeback(ino, index)
            .expect("dirty pages are cached");
        requests.push(WriteRequest::new(
            phys * bs,
            page.data.clone(),
            urgency.io_flags(),
        ));
        pages.push(page);
    }
    drop(cache);
    let mut in_flight = DataInFlight::default();
    in_flight.add(fs.io.submit(requests), pages);
    Ok(in_flight)
}

/// Writes one run of dirty pages, allocating or converting blocks as needed.
fn write_run(
    tx: &mut Tx,
    ino: u32,
    first: u64,
    len: u64,
    journal_data: bool,
    urgency: Urgency,
) -> FsResult<()> {
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
                    let run = Run {
                        index: u64::from(e.logical),
                        phys: e.start,
                        count: u64::from(e.len),
                    };
                    put_data(tx, ino, run, journal_data, true, urgency)?;
                }
                hole
            }
            Mapping::Unwritten(phys) => {
                let n = left.min(first + len - index);
                let run = Run {
                    index,
                    phys,
                    count: n,
                };
                put_data(tx, ino, run, journal_data, true, urgency)?;
                blockmap::mark_written(tx, ino, index as u32, index + n)?;
                n
            }
            Mapping::Written(phys) => {
                let n = left.min(first + len - index);
                let run = Run {
                    index,
                    phys,
                    count: n,
                };
                put_data(tx, ino, run, journal_data, false, urgency)?;
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

pub(super) fn release_reservations(tx: &mut Tx, ino: u32, first: u64, count: u64) {
    let info = tx.op.inode_mut(ino);
    let mut released = 0;
    for i in first..first + count {
        if info.reserved_pages.remove(&i) {
            released += 1;
        }
    }
    tx.fs.alloc.totals.lock().reserved_blocks -= released;
}

/// `count` pages from page `index` on, going to blocks from `phys` on.
#[derive(Clone, Copy)]
struct Run {
    index: u64,
    phys: u64,
    count: u64,
}

/// Sends a run of pages to its blocks: written in place (before the handle stops, which
/// orders them before the commit), or journaled. `newly_mapped`: this transaction maps
/// the blocks (allocated, or unwritten made written), so its commit must not reach the
/// disk before their data (data=ordered); an overwrite of mapped blocks exposes nothing
/// stale whatever the order.
fn put_data(
    tx: &mut Tx,
    ino: u32,
    run: Run,
    journal_data: bool,
    newly_mapped: bool,
    urgency: Urgency,
) -> FsResult<()> {
    let Run { index, phys, count } = run;
    let bs = u64::from(tx.fs.geo.block_size);
    let mut requests = Vec::new();
    let mut pages = Vec::new();
    for i in 0..count {
        let block = phys + i;
        if journal_data {
            let data = tx
                .fs
                .pages
                .lock()
                .get(ino, index + i)
                .map(|p| p.data().clone());
            let Some(data) = data else {
                continue;
            };
            let buf = match tx.fs.cache.peek(block) {
                Some(buf) => buf,
                None => tx.fs.cache.get_new(block),
            };
            tx.modify_buf(&buf, |b| b.copy_from_slice(&data))?;
            // The data now lives in this transaction: fdatasync must wait for it even
            // when nothing else about the file changed (an overwrite in place).
            tx.mark_datasync(ino);
            tx.fs.pages.lock().mark_clean(ino, index + i);
        } else {
            let page = tx
                .fs
                .pages
                .lock()
                .start_writeback(ino, index + i)
                .expect("the pages of a run are cached and dirty");
            requests.push(WriteRequest::new(
                block * bs,
                page.data.clone(),
                IoFlags::ORDERED | urgency.io_flags(),
            ));
            pages.push(page);
        }
    }
    if !requests.is_empty() {
        let ticket = tx.fs.io.submit(requests);
        tx.data_in_flight(ticket, pages);
        // data=writeback promises no order between data and the commit that maps it.
        if newly_mapped && tx.fs.options.data_mode != crate::options::DataMode::Writeback {
            tx.note_ordered_data();
        }
    }
    Ok(())
}
