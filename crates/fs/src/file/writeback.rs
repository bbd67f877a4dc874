//! Writeback: dirty pages of a file get blocks, in contiguous runs for consecutive pages,
//! and their data is written with no journal handle open (see [`super::DataInFlight`]):
//! the blocks of holes are allocated unwritten in a short handle, the data goes to the
//! device with the inode released, and a second short handle marks the blocks written
//! and grows the on-disk size once the data transferred. With data=journal the pages go
//! through the journal, in the handle that maps them.
//!
//! Each writeback owns the file's writeback ([`super::ownership`]) from before it looks at
//! the dirty pages until its last batch is done, so that no two allocate blocks for one
//! file's pages and an fsync that comes after a writeback finds its data on the device.
//!
//! Promises: the on-disk size only grows in the transaction that marks written the data
//! under it, so a crash never shows a file longer than what reached the disk; a block is
//! marked written only after its data transferred. Must never write a page into a block
//! another file may still own (blocks freed by uncommitted transactions are not reused),
//! nor hold a handle or an inode lock while data transfers (exclusive operations excepted:
//! they hold the file system alone).

use super::ownership::Owned;
use super::{DataInFlight, Run};
use crate::blockmap;
use crate::error::FsResult;
use crate::op::{Op, Reach};
use crate::options::IJournal;
use crate::state::FsInner;
use crate::tx::Tx;
use jext_io::{IoFlags, WriteRequest};
use jext_journal::Tid;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Pages written back in one batch.
const WRITEBACK_BATCH_PAGES: usize = 2048;

/// Files [`write_back_files`] writes back at once. A file's writeback waits for its own
/// data before it marks its blocks written, so one thread keeps one file's data in
/// flight; a sync of many small files (an unpacked tarball: 7,945 files, 16 KiB each on
/// average) then paid one device round trip per file, 2 to 5 s on a loop device.
const PARALLEL_WRITEBACKS: usize = 16;

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

/// Writes back the dirty pages of `ino` (held by `op`, and the only inode it holds unless
/// the operation is exclusive; and, with `with_times`, its timestamps), waiting first for
/// any writeback of the file under way; returns the last transaction used.
pub(crate) fn writeback(op: &mut Op, ino: u32, with_times: bool) -> FsResult<Option<Tid>> {
    let fs = op.fs;
    let _owned = own_writeback(op, ino);
    let dirty = fs.pages.lock().dirty_indices(ino);
    let journal_data = fs.journals_data(op.inode(ino));
    let mut tid = None;
    for batch in batches(fs, journal_data, &dirty) {
        tid = writeback_batch(op, ino, batch, Urgency::Sync)?.or(tid);
        if !op.is_current(ino) {
            // Deleted while its data transferred.
            return Ok(tid);
        }
    }
    Ok(write_back_metadata(op, ino, with_times)?.or(tid))
}

/// Owns the writeback of `ino`, which `op` holds; waits for the owner with `ino` released.
pub(crate) fn own_writeback<'fs>(op: &mut Op<'fs>, ino: u32) -> Owned<'fs> {
    let owners = &op.fs.writeback_owners;
    if let Some(owned) = owners.try_own(ino) {
        return owned;
    }
    assert!(
        !op.is_exclusive(),
        "nobody owns a writeback while an exclusive operation runs"
    );
    op.unlocked(ino, || owners.own(ino))
}

/// Writes back the pages of `ino` that are dirty when it starts, one batch per hold of its
/// lock and ownership, each batch's data transferring with nothing locked: a large file's
/// writeback (dirty throttling, the writeback thread, sync, a big fsync) holds up other
/// operations on the file only while it plans each batch and marks its blocks written,
/// never for the data's transfer. Pages dirtied after it started are left for the next
/// writeback, so a writer that keeps dirtying the file cannot keep it going. With
/// `with_times`, the inode's times (and a size past the data) are journaled at the end
/// unless new pages were dirtied meanwhile, which leaves them to the next writeback. The
/// caller holds no operation.
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
    let journal_data = fs.journals_data(&slot.lock());
    drop(slot);
    let dirty = fs.pages.lock().dirty_indices(ino);
    let batches: Vec<Vec<u64>> = batches(fs, journal_data, &dirty)
        .into_iter()
        .map(<[u64]>::to_vec)
        .collect();
    for batch in batches {
        let mut op = Op::shared(fs);
        let _owned = fs.writeback_owners.own(ino);
        if !op.lock_if_cached(ino, Reach::First) {
            return Ok(());
        }
        crate::tx::check_writable(fs)?;
        writeback_batch(&mut op, ino, &batch, urgency)?;
    }
    if with_times {
        let mut op = Op::shared(fs);
        let _owned = fs.writeback_owners.own(ino);
        if op.lock_if_cached(ino, Reach::First) && !fs.pages.lock().has_dirty(ino) {
            write_back_metadata(&mut op, ino, with_times)?;
        }
    }
    Ok(())
}

/// The files with dirty pages, oldest dirtied first.
pub(crate) fn files_with_dirty_pages(fs: &FsInner) -> Vec<u32> {
    let files = fs.pages.lock().dirty_files();
    files.into_iter().map(|(ino, _)| ino).collect()
}

/// Writes back each of `files` as [`write_back_unlocked`] does (without times), several
/// files at once so that many files' data is in flight together; returns the first error
/// after trying every file. The caller holds no operation. Each file is written back by
/// one thread, as by one fsync: files run at once as operations on different files do.
pub(crate) fn write_back_files(fs: &FsInner, files: &[u32], urgency: Urgency) -> FsResult<()> {
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    let work = || {
        while let Some(&ino) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
            if let Err(err) = write_back_unlocked(fs, ino, false, urgency) {
                first_error.lock().get_or_insert(err);
            }
        }
    };
    let helpers = files.len().min(PARALLEL_WRITEBACKS).saturating_sub(1);
    std::thread::scope(|scope| {
        for _ in 0..helpers {
            let started = std::thread::Builder::new()
                .name("jext-sync-writeback".into())
                .spawn_scoped(scope, work);
            // Without a helper, the calling thread still writes every file below.
            if started.is_err() {
                break;
            }
        }
        work();
    });
    first_error.into_inner().map_or(Ok(()), Err)
}

/// Journals a size change past the written data (a hole, or pages whose writeback is
/// done) and, with `with_times`, changed times; returns the transaction, if one was
/// needed. The size grows at most to the first page still dirty (one dirtied while the
/// batches transferred): the disk never shows a size over data it does not have.
fn write_back_metadata(op: &mut Op, ino: u32, with_times: bool) -> FsResult<Option<Tid>> {
    let info = op.inode(ino);
    let size_unwritten = info.raw.size() != info.size && info.is_reg();
    let times = with_times && info.dirty;
    if !(size_unwritten || times) {
        return Ok(None);
    }
    let bs = u64::from(op.fs.geo.block_size);
    let first_dirty = op.fs.pages.lock().dirty_indices(ino).first().copied();
    let written_end = first_dirty.map_or(u64::MAX, |index| index * bs);
    let mut tx = Tx::begin(op, 4)?;
    let r = sync_size_and_inode(&mut tx, ino, written_end);
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

/// Journal credits a handle of a writeback batch needs: a base for the inode and group
/// blocks, some per run of pages (allocation, extent tree, bitmaps), and every page under
/// data=journal.
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mapping {
    Hole,
    Unwritten(u64),
    Written(u64),
}

/// Consecutive pages that share one mapping state: (first page, pages, mapping of the
/// first).
type Piece = (u64, u64, Mapping);

/// The mapping of page `index` and how many pages from it on share its state.
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

/// The pieces of the runs `runs` as the block map has them: (first page, pages, mapping).
fn mapped_pieces(
    fs: &FsInner,
    ino: u32,
    raw: &crate::format::inode::Inode,
    runs: &[(u64, u64)],
) -> FsResult<Vec<Piece>> {
    let mut pieces: Vec<Piece> = Vec::new();
    for &(first, len) in runs {
        let mut index = first;
        while index < first + len {
            let (mapping, left) = mapping_at(fs, ino, raw, index)?;
            let n = left.max(1).min(first + len - index);
            match pieces.last_mut() {
                Some((start, count, Mapping::Hole))
                    if mapping == Mapping::Hole && *start + *count == index =>
                {
                    *count += n
                }
                _ => pieces.push((index, n, mapping)),
            }
            index += n;
        }
    }
    Ok(pieces)
}

/// Writes back the pages of `batch` still dirty (others may have been truncated or
/// written back since it was planned) of `ino` (held by `op`, which owns its writeback);
/// returns the last transaction used.
fn writeback_batch(
    op: &mut Op,
    ino: u32,
    batch: &[u64],
    urgency: Urgency,
) -> FsResult<Option<Tid>> {
    let fs = op.fs;
    let pages: Vec<u64> = {
        let cache = fs.pages.lock();
        batch
            .iter()
            .copied()
            .filter(|&i| cache.is_dirty(ino, i))
            .collect()
    };
    if pages.is_empty() {
        return Ok(None);
    }
    op.note_data_change(ino);
    let runs = consecutive_runs(&pages);
    let bs = u64::from(fs.geo.block_size);
    let batch_end = (pages.last().copied().unwrap_or(0) + 1) * bs;
    if fs.journals_data(op.inode(ino)) {
        return journal_batch(op, ino, &runs, batch_end).map(Some);
    }
    let raw = op.inode(ino).raw.clone();
    // Every lookup (which may fail) before any page goes in flight: a page marked clean
    // and in flight but never sent would be lost.
    let pieces = mapped_pieces(fs, ino, &raw, &runs)?;
    let (allocated, pieces) = allocate_unwritten(op, ino, pieces)?;
    let (mut in_flight, requests, overwrites) = take_pages(op, ino, pieces, urgency);
    // Looked at once the pages were taken: a page dirtied after a barrier returned is
    // written with that barrier's fence in view.
    let hold = match overwrites {
        true => fs.epochs.unreached(fs.journal.committed_tid()),
        false => None,
    };
    let send = || -> FsResult<()> {
        if let Some(barrier) = hold {
            fs.journal.commit_and_wait(barrier)?;
        }
        in_flight.issue(fs, requests);
        in_flight.wait()
    };
    let transferred = if op.holds_only(ino) {
        op.unlocked(ino, send)
    } else {
        send()
    };
    if let Err(err) = transferred {
        in_flight.release(fs, |_| true);
        return Err(err);
    }
    if !op.is_current(ino) {
        // Deleted meanwhile: its pages and blocks are gone with it.
        in_flight.release(fs, |_| false);
        return Ok(allocated);
    }
    op.note_data_change(ino);
    match mark_written(op, ino, &in_flight, batch_end) {
        Ok((tid, redirty)) => {
            in_flight.release(fs, |page| redirty.contains(&page.index));
            Ok(tid.or(allocated))
        }
        Err(err) => {
            in_flight.release(fs, |_| true);
            Err(err)
        }
    }
}

/// Allocates unwritten blocks for the holes among `pieces`, in a handle of its own that
/// stops at once (unwritten blocks read as zeros, so no data is ordered before its
/// commit); returns the transaction, if there were holes, and the pieces with each hole
/// replaced by the blocks it got.
fn allocate_unwritten(
    op: &mut Op,
    ino: u32,
    pieces: Vec<Piece>,
) -> FsResult<(Option<Tid>, Vec<Piece>)> {
    let holes = pieces.iter().filter(|p| p.2 == Mapping::Hole).count();
    if holes == 0 {
        return Ok((None, pieces));
    }
    let mut tx = Tx::begin(op, batch_credits(holes, 0, false))?;
    let tid = tx.tid();
    let r = (|| {
        let mut placed = Vec::with_capacity(pieces.len());
        for (index, count, mapping) in pieces {
            if mapping != Mapping::Hole {
                placed.push((index, count, mapping));
                continue;
            }
            for e in blockmap::allocate(&mut tx, ino, index as u32, count as u32, true)? {
                let (logical, len) = (u64::from(e.logical), u64::from(e.len));
                placed.push((logical, len, Mapping::Unwritten(e.start)));
            }
            release_reservations(&mut tx, ino, index, count);
        }
        Ok(placed)
    })();
    tx.end(r).map(|placed| (Some(tid), placed))
}

/// Takes the pages of `pieces`, which all have blocks now, into flight and returns the
/// writes that carry them, and whether any overwrites a block in place (no transaction
/// orders it: it waits for a barrier's, `crate::epochs`); notes the runs written into
/// unwritten blocks, to be marked written once the data transferred.
fn take_pages(
    op: &mut Op,
    ino: u32,
    pieces: Vec<Piece>,
    urgency: Urgency,
) -> (DataInFlight, Vec<WriteRequest>, bool) {
    let fs = op.fs;
    let bs = u64::from(fs.geo.block_size);
    let mut in_flight = DataInFlight::default();
    let mut requests = Vec::new();
    let mut pages = Vec::new();
    let mut in_place = false;
    let mut cache = fs.pages.lock();
    for (index, count, mapping) in pieces {
        let (phys, unwritten) = match mapping {
            Mapping::Unwritten(phys) => (phys, true),
            Mapping::Written(phys) => (phys, false),
            Mapping::Hole => unreachable!("the batch's holes were just allocated"),
        };
        for i in 0..count {
            let page = cache
                .start_writeback(ino, index + i)
                .expect("a batch's pages are cached and dirty while it owns the file");
            requests.push(WriteRequest::new(
                (phys + i) * bs,
                page.data.clone(),
                urgency.io_flags(),
            ));
            pages.push(page);
        }
        match unwritten {
            true => in_flight.to_mark_written.push(Run { index, phys, count }),
            false => in_place = true,
        }
    }
    drop(cache);
    in_flight.add_pages(pages);
    if in_place {
        // An overwrite in place is in no transaction: fsync flushes for it.
        op.inode_mut(ino).unflushed_data = true;
    }
    (in_flight, requests, in_place)
}

/// Once the batch's data transferred: marks written the blocks it went to and grows the
/// on-disk size over them, in one short handle. A page is marked only if it is still the
/// page written (not dropped by a truncate or a punched hole meanwhile) over the same
/// unwritten block; a page whose block changed under it is dirtied again, with every
/// page after it in the batch, and the size stops before it. Returns the transaction,
/// if one was needed, and the pages to dirty again.
fn mark_written(
    op: &mut Op,
    ino: u32,
    in_flight: &DataInFlight,
    batch_end: u64,
) -> FsResult<(Option<Tid>, HashSet<u64>)> {
    let fs = op.fs;
    let bs = u64::from(fs.geo.block_size);
    let current: HashSet<u64> = {
        let cache = fs.pages.lock();
        in_flight
            .pages()
            .iter()
            .filter(|page| cache.is_current(page))
            .map(|page| page.index)
            .collect()
    };
    let raw = op.inode(ino).raw.clone();
    let mut first_moved = u64::MAX;
    for run in &in_flight.to_mark_written {
        let pieces = mapped_pieces(fs, ino, &raw, &[(run.index, run.count)])?;
        for (index, count, mapping) in pieces {
            let expected = Mapping::Unwritten(run.phys + (index - run.index));
            let moved = (index..index + count).find(|i| current.contains(i));
            if let (true, Some(i)) = (mapping != expected, moved) {
                first_moved = first_moved.min(i);
            }
        }
    }
    let redirty: HashSet<u64> = current
        .iter()
        .copied()
        .filter(|&i| i >= first_moved)
        .collect();
    let written_end = batch_end.min(first_moved.saturating_mul(bs));
    let marked: Vec<u64> = in_flight
        .to_mark_written
        .iter()
        .flat_map(|run| run.index..run.index + run.count)
        .filter(|i| *i < first_moved && current.contains(i))
        .collect();
    let to_mark = consecutive_runs(&marked);
    let info = op.inode(ino);
    let grows = info.raw.size() < info.size.min(written_end);
    if to_mark.is_empty() && !grows {
        return Ok((None, redirty));
    }
    let mut tx = Tx::begin(op, batch_credits(to_mark.len(), 0, false))?;
    let r = (|| {
        for &(index, count) in &to_mark {
            blockmap::mark_written(&mut tx, ino, index as u32, index + count)?;
        }
        // data=writeback promises no order between data and the commit that maps it.
        if !to_mark.is_empty() && fs.options.data_mode != crate::options::DataMode::Writeback {
            tx.note_ordered_data();
        }
        sync_size_and_inode(&mut tx, ino, written_end)
    })();
    tx.end(r).map(|tid| (Some(tid), redirty))
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

/// data=journal (or a `chattr +j` file): the batch's pages go into the journal in the
/// handle that maps their blocks, so mapping and data commit together; no data write.
fn journal_batch(op: &mut Op, ino: u32, runs: &[(u64, u64)], batch_end: u64) -> FsResult<Tid> {
    let pages = runs.iter().map(|&(_, len)| len as usize).sum();
    let mut tx = Tx::begin(op, batch_credits(runs.len(), pages, true))?;
    let r = (|| {
        for &(first, len) in runs {
            journal_run(&mut tx, ino, first, len)?;
        }
        sync_size_and_inode(&mut tx, ino, batch_end)
    })();
    tx.end(r)
}

/// Journals one run of dirty pages, allocating or converting blocks as needed.
fn journal_run(tx: &mut Tx, ino: u32, first: u64, len: u64) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    for (index, count, mapping) in mapped_pieces(tx.fs, ino, &raw, &[(first, len)])? {
        match mapping {
            Mapping::Hole => {
                let placed = blockmap::allocate(tx, ino, index as u32, count as u32, false)?;
                release_reservations(tx, ino, index, count);
                for e in placed {
                    let logical = u64::from(e.logical);
                    journal_pages(tx, ino, logical, e.start, u64::from(e.len), false)?;
                }
            }
            Mapping::Unwritten(phys) => {
                journal_pages(tx, ino, index, phys, count, false)?;
                blockmap::mark_written(tx, ino, index as u32, index + count)?;
            }
            Mapping::Written(phys) => journal_pages(tx, ino, index, phys, count, true)?,
        }
    }
    Ok(())
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

/// Journals `count` pages from page `index` on as the new contents of the blocks from
/// `phys` on; `written`: the blocks hold the file's data already (not just allocated, nor
/// unwritten, whose home holds garbage).
///
/// A written block's buffer is the one the journal logged it in, if still cached (its
/// bytes are the page's before this change); if not, the page's base (its clean bytes,
/// kept since the write dirtied it) is what the block holds at home: the file journals
/// its data, so nothing writes its blocks in place, the journal switch flushed what was
/// written in place before, and the journal holds nothing of the block (its buffer
/// stays cached while it does). The journal may then log only the bytes that changed.
/// Any other block gets a new zeroed buffer, replacing a stale one.
fn journal_pages(
    tx: &mut Tx,
    ino: u32,
    index: u64,
    phys: u64,
    count: u64,
    written: bool,
) -> FsResult<()> {
    // The cache's lock is taken once for the run's pages and once to clean them, not for
    // every page: a writer copying into the cache beside keeps taking it, and each wait
    // for it costs a sleep and a wake-up. The file's inode lock keeps its pages as read.
    let pages: Vec<_> = {
        let mut cache = tx.fs.pages.lock();
        (0..count)
            .filter_map(|i| {
                let page = cache.get(ino, index + i)?;
                Some((i, page.data().clone(), page.base().cloned()))
            })
            .collect()
    };
    for (i, data, base) in &pages {
        let block = phys + i;
        let buf = match (written, tx.fs.cache.peek(block), base) {
            (true, Some(buf), _) => buf,
            (true, None, Some(base)) => tx.fs.cache.get_with_home(block, base.clone()),
            _ => tx.fs.cache.get_new(block),
        };
        tx.modify_buf(&buf, |b| b.copy_from_slice(data))?;
        // The data now lives in this transaction: fdatasync must wait for it even when
        // nothing else about the file changed (an overwrite in place).
        tx.mark_datasync(ino);
    }
    let tid = tx.tid();
    if tx.fs.options.ijournal == IJournal::PerCore {
        // The fsync's i-transaction carries these bytes, as this transaction has them.
        let fc = &mut tx.op.inode_mut(ino).fc;
        for (i, data, _) in &pages {
            fc.note_journaled(tid, phys + i, data.clone());
        }
    }
    {
        let mut cache = tx.fs.pages.lock();
        for (i, _, _) in &pages {
            cache.mark_clean(ino, index + i);
        }
    }
    tx.op.inode_mut(ino).journaled_data_tid = Some(tid);
    Ok(())
}
