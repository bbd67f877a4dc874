//! Per-core i-transaction rings (`ijournal=percore`, iJournaling §5.2): the fast-commit
//! region split into N rings, each with its own lock and head, so that concurrent fsyncs
//! of different files write to different rings and share neither a lock nor a log head.
//! The on-disk form is format/itransaction.rs.
//!
//! An fsync takes a free ring if there is one. If every ring is busy, it queues its
//! i-transaction on one and waits for the ring: whoever takes the ring next writes every
//! i-transaction queued there for the same tid, one after the other in one write, and
//! makes them durable with one flush (a group commit per ring). Each keeps its own
//! header, sub-tid and CRC, so recovery sees them as if written one by one. The ring is
//! free again once that write transferred; its flush is shared by every ring's writer
//! that comes to it, and waits a moment for those under way (`crate::group_flush`).
//!
//! Promises:
//! - an i-transaction of tid T is written only once T - 1 is durable (its tid must be the
//!   first one recovery does not find), never once T is (it would be obsolete), and a
//!   ring restarts at its first block only for a newer tid, whose predecessors are all
//!   durable, so nothing live is ever overwritten;
//! - a ring's lock is held from the choice of its head until the write transferred: the
//!   next write on a ring goes only once the one before it completed, and a flush that
//!   makes the later durable makes the earlier durable too (it covers every write
//!   completed before it, as `jext_io` promises), so a ring's i-transactions become
//!   durable in ring order and a torn one is its last;
//! - an i-transaction is written without FUA and made durable by a flush after it, one
//!   flush for every ring whose write completed before it was dispatched (the rings
//!   share flushes as a single log's group commit shares one), and a writer waits
//!   briefly for the fsyncs under way to come to its flush (`crate::group_flush`);
//! - writes in different rings go in parallel, but [`write`] returns `Written` only once
//!   every lower sub-tid is settled (durable, obsolete or refused): recovery replays a
//!   tid's i-transactions in sub-tid order up to the first one missing, so an fsync
//!   returns only when nothing below it can be that gap. A refused one (its ring full)
//!   makes every later sub-tid of its tid refuse too: replay would stop at its gap.
//! - recovery ([`scan`]) reads every ring of every possible ring count, keeps the valid
//!   i-transactions whose tid is the first not in the log, and orders them.
//!
//! Must never: let an fsync return while a lower sub-tid of its tid may still be missing
//! on disk, or leave a sub-tid unsettled (every later fsync would wait for ever).

use crate::fast_commit::{write_after_data, FastCommitOutcome};
use crate::format::fast_commit::{FastCommitScan, FcRecord};
use crate::format::itransaction::{
    decode, decode_header, encode, in_order, ring_bounds, CarriedBlock, ITransaction, MAX_RINGS,
};
use crate::format::superblock::JournalSuperblock;
use crate::journal::Shared;
use crate::recovery::read_block;
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::{JournalArea, JournalError};
use jext_io::{IoFlags, IoQueue};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The rings and the order their i-transactions settle in.
pub(crate) struct Rings {
    rings: Vec<Ring>,
    /// First journal block of the region and its length (the fast-commit area).
    region_first: u32,
    region_blocks: u32,
    order: Mutex<OrderState>,
    settled: Condvar,
    /// Where the next [`Rings::pick`] starts looking.
    next_turn: AtomicUsize,
}

struct Ring {
    /// Held from the choice of the head until the write is durable.
    head: Mutex<RingState>,
    /// I-transactions waiting for whoever takes `head` next, and what became of those
    /// written for someone else, by sub-tid.
    queue: Mutex<Queue>,
    /// A writer of this ring finished: its queue's fsyncs look again.
    finished: Condvar,
}

/// One ring: which tid it holds and where its next i-transaction goes.
struct RingState {
    tid: Option<Tid>,
    next_block: u32,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Queued>,
    outcomes: HashMap<u64, Result<FastCommitOutcome, JournalError>>,
}

/// One fsync's i-transaction as it waits in a ring's queue.
struct Queued {
    sub_tid: u64,
    first_sub_tid: u64,
    tid: Tid,
    data_flush: u64,
    records: Vec<FcRecord>,
    data: Vec<CarriedBlock>,
}

struct OrderState {
    /// Every sub-tid below this one is settled.
    next_unsettled: u64,
    /// Settled sub-tids above `next_unsettled`.
    settled_ahead: BTreeSet<u64>,
    /// The lowest refused sub-tid of the newest tid that had one: later sub-tids of
    /// that tid are refused (replay stops at its gap).
    first_refused: Option<(Tid, u64)>,
}

impl Rings {
    /// `nr_rings` rings (at least 1, at most 8, at most one per block) over the region.
    pub(crate) fn new(region_first: u32, region_blocks: u32, nr_rings: u32) -> Rings {
        let n = nr_rings.clamp(1, MAX_RINGS).min(region_blocks.max(1));
        Rings {
            rings: (0..n)
                .map(|_| Ring {
                    head: Mutex::new(RingState {
                        tid: None,
                        next_block: 0,
                    }),
                    queue: Mutex::new(Queue::default()),
                    finished: Condvar::new(),
                })
                .collect(),
            region_first,
            region_blocks,
            order: Mutex::new(OrderState {
                next_unsettled: 0,
                settled_ahead: BTreeSet::new(),
                first_refused: None,
            }),
            settled: Condvar::new(),
            next_turn: AtomicUsize::new(0),
        }
    }

    pub(crate) fn count(&self) -> u32 {
        self.rings.len() as u32
    }

    /// The first free ring from the next one in turn, or the one in turn if all are busy
    /// (`None`: the caller queues there and waits). In turn rather than by CPU: there are
    /// more rings than cores (fsyncs in flight wait for the device, not a CPU), and turns
    /// fill the rings evenly, so one ring does not run out of room (a full commit) while
    /// others sit empty.
    fn pick(&self) -> (usize, Option<MutexGuard<'_, RingState>>) {
        let n = self.rings.len();
        let first = self.next_turn.fetch_add(1, Ordering::Relaxed) % n;
        for i in (first..n).chain(0..first) {
            if let Some(guard) = self.rings[i].head.try_lock() {
                return (i, Some(guard));
            }
        }
        (first, None)
    }

    /// Marks `sub_tid` settled (`refused`: not on disk, a gap for its tid).
    fn settle(&self, sub_tid: u64, tid: Tid, refused: bool) {
        let mut order = self.order.lock();
        if refused {
            order.first_refused = match order.first_refused {
                Some((t, s)) if t == tid => Some((t, s.min(sub_tid))),
                Some((t, _)) if tid_gt(t, tid) => order.first_refused,
                _ => Some((tid, sub_tid)),
            };
        }
        order.settled_ahead.insert(sub_tid);
        loop {
            let next = order.next_unsettled;
            if !order.settled_ahead.remove(&next) {
                break;
            }
            order.next_unsettled = next + 1;
        }
        self.settled.notify_all();
    }

    /// Whether a sub-tid of `tid` below `sub_tid` was refused.
    fn gap_below(&self, tid: Tid, sub_tid: u64) -> bool {
        self.order
            .lock()
            .first_refused
            .is_some_and(|(t, s)| t == tid && s < sub_tid)
    }

    /// Waits until every sub-tid below `sub_tid` is settled.
    fn wait_lower_settled(&self, sub_tid: u64) {
        let mut order = self.order.lock();
        while order.next_unsettled < sub_tid {
            self.settled.wait(&mut order);
        }
    }
}

/// Settles sub-tids as refused unless told otherwise first: whatever ends a write early
/// (an error), later fsyncs must never wait for them for ever.
struct Unsettled<'a> {
    rings: &'a Rings,
    pending: Vec<(u64, Tid)>,
}

impl<'a> Unsettled<'a> {
    fn new(rings: &'a Rings, pending: Vec<(u64, Tid)>) -> Unsettled<'a> {
        Unsettled { rings, pending }
    }

    /// Settles them all with `outcomes` (in the same order).
    fn settle(mut self, outcomes: &[FastCommitOutcome]) {
        assert_eq!(outcomes.len(), self.pending.len(), "an outcome for each");
        for (&(sub_tid, tid), outcome) in self.pending.iter().zip(outcomes) {
            self.rings
                .settle(sub_tid, tid, *outcome == FastCommitOutcome::NoRoom);
        }
        self.pending.clear();
    }

    /// Hands them to someone else to settle (a ring's queue).
    fn hand_over(mut self) {
        self.pending.clear();
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        for &(sub_tid, tid) in &self.pending {
            self.rings.settle(sub_tid, tid, true);
        }
    }
}

/// One fsync's i-transaction, as the file system planned it.
pub(crate) struct Planned<'a> {
    /// Handed out 0, 1, 2, ... where the records were built; each comes here once.
    pub sub_tid: u64,
    /// The first sub-tid handed out in `tid`.
    pub first_sub_tid: u64,
    pub tid: Tid,
    /// The flush that makes durable the data its records point at and it does not carry
    /// ([`jext_io::IoQueue::covering_flush`]).
    pub data_flush: u64,
    pub records: &'a [FcRecord],
    /// Blocks of data-journaling files it carries, to be written home at recovery.
    pub data: &'a [CarriedBlock],
}

/// Writes `plan` to a ring. Returns once it and every lower sub-tid are settled.
pub(crate) fn write(
    shared: &Shared,
    rings: &Rings,
    plan: Planned<'_>,
) -> Result<FastCommitOutcome, JournalError> {
    let (sub_tid, tid) = (plan.sub_tid, plan.tid);
    let pending = Unsettled::new(rings, vec![(sub_tid, tid)]);
    let outcome = match settled_before_the_ring(shared, rings, &plan)? {
        Some(outcome) => {
            pending.settle(&[outcome]);
            outcome
        }
        None => {
            pending.hand_over();
            through_a_ring(shared, rings, Queued::from(plan))?
        }
    };
    rings.wait_lower_settled(sub_tid);
    let written = matches!(outcome, FastCommitOutcome::Written { .. });
    if written && rings.gap_below(tid, sub_tid) {
        // Durable, but replay stops at the lower one's gap before reaching it.
        return Ok(FastCommitOutcome::NoRoom);
    }
    Ok(outcome)
}

/// What becomes of `plan` without a ring: `Some` if it is obsolete or follows a gap.
/// Waits for the tid before it to be durable first.
fn settled_before_the_ring(
    shared: &Shared,
    rings: &Rings,
    plan: &Planned<'_>,
) -> Result<Option<FastCommitOutcome>, JournalError> {
    let tid = plan.tid;
    shared.wait_for(tid.wrapping_sub(1), true)?;
    if tid_geq(shared.committed(), tid) {
        return Ok(Some(FastCommitOutcome::Obsolete));
    }
    if rings.gap_below(tid, plan.sub_tid) {
        return Ok(Some(FastCommitOutcome::NoRoom));
    }
    Ok(None)
}

impl From<Planned<'_>> for Queued {
    fn from(plan: Planned<'_>) -> Queued {
        Queued {
            sub_tid: plan.sub_tid,
            first_sub_tid: plan.first_sub_tid,
            tid: plan.tid,
            data_flush: plan.data_flush,
            records: plan.records.to_vec(),
            data: plan.data.to_vec(),
        }
    }
}

/// Queues `item` on a ring and returns what became of it: written (and settled) by
/// whoever took the ring next, which may be this caller.
fn through_a_ring(
    shared: &Shared,
    rings: &Rings,
    item: Queued,
) -> Result<FastCommitOutcome, JournalError> {
    let sub_tid = item.sub_tid;
    let (index, mut head) = rings.pick();
    let ring = &rings.rings[index];
    let mut queue = ring.queue.lock();
    queue.waiting.push(item);
    loop {
        if let Some(outcome) = queue.outcomes.remove(&sub_tid) {
            return outcome;
        }
        let queued = queue.waiting.iter().any(|q| q.sub_tid == sub_tid);
        if queued && head.is_none() {
            head = ring.head.try_lock();
        }
        if let (true, Some(mut state)) = (queued, head.take()) {
            let batch = queue.take_batch(sub_tid);
            drop(queue);
            let pending = Unsettled::new(rings, batch.iter().map(|q| (q.sub_tid, q.tid)).collect());
            let written = write_batch(shared, rings, index as u32, &mut state, &batch);
            // The head is free once the write transferred (module comment): a woken fsync
            // whose i-transaction was not in this batch takes the ring and comes to the
            // same flush.
            drop(state);
            ring.wake_queue();
            let outcomes = written.and_then(|outcomes| make_durable(shared, outcomes));
            if let Ok(outcomes) = &outcomes {
                pending.settle(outcomes);
            }
            let mine = finish_batch(ring, &batch, outcomes, sub_tid);
            ring.wake_queue();
            return mine;
        }
        ring.finished.wait(&mut queue);
    }
}

impl Queue {
    /// Every waiting i-transaction of the tid of `sub_tid`'s (which waits here), in
    /// sub-tid order: one write takes them all. Those of another tid wait for the next.
    fn take_batch(&mut self, sub_tid: u64) -> Vec<Queued> {
        let tid = self
            .waiting
            .iter()
            .find(|q| q.sub_tid == sub_tid)
            .expect("the caller's i-transaction waits in the queue")
            .tid;
        let (mut batch, rest) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|q: &Queued| q.tid == tid);
        self.waiting = rest;
        batch.sort_by_key(|q| q.sub_tid);
        batch
    }
}

/// Hands the others in `batch` their outcomes (an error is everyone's) and returns the
/// caller's (`sub_tid`).
fn finish_batch(
    ring: &Ring,
    batch: &[Queued],
    outcomes: Result<Vec<FastCommitOutcome>, JournalError>,
    sub_tid: u64,
) -> Result<FastCommitOutcome, JournalError> {
    let mut queue = ring.queue.lock();
    let mut mine = None;
    for (i, item) in batch.iter().enumerate() {
        let outcome = outcomes.as_ref().map(|o| o[i]).map_err(Clone::clone);
        match item.sub_tid == sub_tid {
            true => mine = Some(outcome),
            false => {
                queue.outcomes.insert(item.sub_tid, outcome);
            }
        }
    }
    mine.expect("the caller's i-transaction is in its batch")
}

impl Ring {
    /// Wakes the fsyncs queued here: the head is free, or their outcomes are in.
    fn wake_queue(&self) {
        let _queue = self.queue.lock();
        self.finished.notify_all();
    }
}

/// Makes the i-transactions a batch wrote durable (one flush, shared with the other
/// rings' writers coming to it: `crate::group_flush`) and counts them.
fn make_durable(
    shared: &Shared,
    outcomes: Vec<FastCommitOutcome>,
) -> Result<Vec<FastCommitOutcome>, JournalError> {
    let written = |o: &&FastCommitOutcome| matches!(o, FastCommitOutcome::Written { .. });
    let count = outcomes.iter().filter(written).count();
    if count > 0 && shared.config.barrier {
        shared.group_flush(count)?;
    }
    for outcome in &outcomes {
        if let FastCommitOutcome::Written { blocks } = outcome {
            shared.note_fast_commit(*blocks);
        }
    }
    Ok(outcomes)
}

/// Writes `batch` (one tid, sub-tid order) at the head of ring `ring`, whose lock the
/// caller holds (`st`), in one write, and returns once it transferred, with each one's
/// outcome (not durable yet: [`make_durable`]). An i-transaction that does not fit, and
/// every one after it, is refused.
fn write_batch(
    shared: &Shared,
    rings: &Rings,
    ring: u32,
    st: &mut RingState,
    batch: &[Queued],
) -> Result<Vec<FastCommitOutcome>, JournalError> {
    let tid = batch[0].tid;
    assert!(
        batch.iter().all(|q| q.tid == tid),
        "one tid per batch: a ring restarts for a newer one"
    );
    // Checked again under the ring's lock: a newer tid may have restarted this ring
    // since, which only happens once this tid is durable.
    if tid_geq(shared.committed(), tid) || st.tid.is_some_and(|t| tid_gt(t, tid)) {
        return Ok(vec![FastCommitOutcome::Obsolete; batch.len()]);
    }
    let (ring_first, ring_blocks) =
        ring_bounds(rings.region_first, rings.region_blocks, rings.count(), ring);
    let start = if st.tid == Some(tid) {
        st.next_block
    } else {
        0
    };
    let mut blocks = Vec::new();
    let mut outcomes = Vec::with_capacity(batch.len());
    for item in batch {
        // Replay stops at a gap: nothing after one below counts.
        let after_gap = outcomes.last() == Some(&FastCommitOutcome::NoRoom)
            || rings.gap_below(tid, item.sub_tid);
        let it = item.itransaction(ring as u8, rings.count() as u8);
        let encoded = (!after_gap).then(|| encode(&it, shared.block_size as usize));
        let room = (ring_blocks - start) as usize - blocks.len();
        match encoded {
            Some(encoded) if encoded.len() <= room => {
                outcomes.push(FastCommitOutcome::Written {
                    blocks: encoded.len() as u32,
                });
                blocks.extend(encoded);
            }
            _ => outcomes.push(FastCommitOutcome::NoRoom),
        }
    }
    if !blocks.is_empty() {
        shared.point_superblock_at_log(tid)?;
        let data_flush = batch.iter().map(|q| q.data_flush).max().unwrap_or(0);
        // Plain writes, made durable by a flush after them: rings write at the same
        // time, and where the device has no native FUA (a loop device, an image file)
        // each FUA write is a write and a flush of its own. With 8 threads of `jext
        // bench dwsl`, FUA made 0.48 flushes and 0.98 FUA writes per fsync, a shared
        // flush 0.86 flushes.
        let written = write_after_data(
            shared,
            ring_first + start,
            blocks,
            data_flush,
            IoFlags::empty(),
        )?;
        st.tid = Some(tid);
        st.next_block = start + written;
    }
    Ok(outcomes)
}

impl Queued {
    fn itransaction(&self, ring: u8, nr_rings: u8) -> ITransaction {
        ITransaction {
            ring,
            nr_rings,
            tid: self.tid,
            sub_tid: self.sub_tid,
            first_sub_tid: self.first_sub_tid,
            records: self.records.clone(),
            data: self.data.clone(),
        }
    }
}

/// One valid i-transaction a ring holds, where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingEntry {
    pub journal_block: u32,
    pub blocks: u32,
    pub itransaction: ITransaction,
}

/// What the scan of the rings found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RingsScan {
    /// Every valid i-transaction of the tid recovery wants, ring by ring.
    pub entries: Vec<RingEntry>,
    /// Those recovery replays, as fast-commit records in sub-tid order.
    pub replay: FastCommitScan,
}

/// Reads every ring of every possible ring count (the count the writer used is in each
/// header, not in the superblock) and keeps the i-transactions of `end_tid` up to the
/// first missing sub-tid.
pub fn scan(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
    end_tid: Tid,
) -> Result<RingsScan, JournalError> {
    let Some(region_first) = sb.fast_commit_first().filter(|&b| b < sb.maxlen()) else {
        return Ok(RingsScan::default());
    };
    let region_blocks = sb.maxlen() - region_first - 1;
    let mut out = RingsScan::default();
    for nr_rings in 1..=MAX_RINGS.min(region_blocks) {
        for ring in 0..nr_rings {
            let bounds = ring_bounds(region_first, region_blocks, nr_rings, ring);
            scan_ring(
                io,
                area,
                bounds,
                (ring, nr_rings),
                end_tid,
                &mut out.entries,
            )?;
        }
    }
    let found = out.entries.iter().map(|e| e.itransaction.clone()).collect();
    let ordered = in_order(found).map_err(|problem| JournalError::Corrupt {
        structure: "per-core i-transaction",
        journal_block: region_first,
        problem,
    })?;
    let by_sub = |sub: u64| out.entries.iter().find(|e| e.itransaction.sub_tid == sub);
    out.replay = FastCommitScan {
        fast_commits: ordered.kept.len() as u32,
        blocks_used: ordered
            .kept
            .iter()
            .filter_map(|it| by_sub(it.sub_tid))
            .map(|e| e.blocks)
            .sum(),
        carried: ordered.kept.iter().flat_map(|it| it.data.clone()).collect(),
        records: ordered.kept.into_iter().flat_map(|it| it.records).collect(),
        stopped_by: ordered.stopped_by,
    };
    Ok(out)
}

/// The valid i-transactions of `tid` at the start of one ring, until the first block
/// that does not continue them.
fn scan_ring(
    io: &IoQueue,
    area: &JournalArea,
    (ring_first, ring_blocks): (u32, u32),
    (ring, nr_rings): (u32, u32),
    tid: Tid,
    out: &mut Vec<RingEntry>,
) -> Result<(), JournalError> {
    let block_size = area.block_size as usize;
    let read = |block: u32| read_block(io, area, block);
    let mut at = 0;
    while at < ring_blocks {
        let first = read(ring_first + at)?;
        let Some(header) = decode_header(&first, block_size) else {
            return Ok(());
        };
        let ours = u32::from(header.ring) == ring && u32::from(header.nr_rings) == nr_rings;
        if !ours || header.tid != tid || at + header.nr_blocks > ring_blocks {
            return Ok(());
        }
        let mut blocks = vec![first];
        for i in 1..header.nr_blocks {
            blocks.push(read(ring_first + at + i)?);
        }
        let Ok(it) = decode(&header, &blocks, block_size) else {
            return Ok(());
        };
        out.push(RingEntry {
            journal_block: ring_first + at,
            blocks: header.nr_blocks,
            itransaction: it,
        });
        at += header.nr_blocks;
    }
    Ok(())
}
