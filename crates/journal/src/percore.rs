//! Per-core i-transaction rings (`ijournal=percore`, iJournaling §5.2): the fast-commit
//! region split into N rings, each with its own lock and head, so that concurrent fsyncs
//! of different files write to different rings and share neither a lock nor a log head.
//! The on-disk form is format/itransaction.rs.
//!
//! Promises:
//! - an i-transaction of tid T is written only once T - 1 is durable (its tid must be the
//!   first one recovery does not find), never once T is (it would be obsolete), and a
//!   ring restarts at its first block only for a newer tid, whose predecessors are all
//!   durable, so nothing live is ever overwritten;
//! - a ring's lock is held from the choice of its head until the write is durable, so a
//!   ring's i-transactions become durable in ring order and a torn one is its last;
//! - an i-transaction is written without FUA and made durable by a flush after it, one
//!   flush for every ring whose write completed before it was dispatched (the rings
//!   share flushes as a single log's group commit shares one; `Durably::SharedFlush`);
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

use crate::fast_commit::{write_durably, Durably, FastCommitOutcome};
use crate::format::fast_commit::{FastCommitScan, FcRecord};
use crate::format::itransaction::{
    decode, decode_header, encode, in_order, ring_bounds, ITransaction, MAX_RINGS,
};
use crate::format::superblock::JournalSuperblock;
use crate::journal::Shared;
use crate::recovery::read_block;
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::{JournalArea, JournalError};
use jext_io::IoQueue;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The rings and the order their i-transactions settle in.
pub(crate) struct Rings {
    rings: Vec<Mutex<RingState>>,
    /// First journal block of the region and its length (the fast-commit area).
    region_first: u32,
    region_blocks: u32,
    order: Mutex<OrderState>,
    settled: Condvar,
    /// Where the next [`Rings::pick`] starts looking.
    next_turn: AtomicUsize,
}

/// One ring: which tid it holds and where its next i-transaction goes.
struct RingState {
    tid: Option<Tid>,
    next_block: u32,
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
                .map(|_| {
                    Mutex::new(RingState {
                        tid: None,
                        next_block: 0,
                    })
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

    /// The first free ring from the next one in turn; waits for that one if all are
    /// busy. In turn rather than by CPU: there are more rings than cores (fsyncs in
    /// flight wait for the device, not a CPU), and turns fill the rings evenly, so one
    /// ring does not run out of room (a full commit) while others sit empty.
    fn pick(&self) -> (u32, MutexGuard<'_, RingState>) {
        let n = self.rings.len();
        let first = self.next_turn.fetch_add(1, Ordering::Relaxed) % n;
        for i in (first..n).chain(0..first) {
            if let Some(guard) = self.rings[i].try_lock() {
                return (i as u32, guard);
            }
        }
        (first as u32, self.rings[first].lock())
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

/// Settles its sub-tid as refused if the write ends early (an error): later fsyncs must
/// never wait for it for ever.
struct Unsettled<'a> {
    rings: &'a Rings,
    sub_tid: u64,
    tid: Tid,
    done: bool,
}

impl Unsettled<'_> {
    fn settle(mut self, refused: bool) {
        self.done = true;
        self.rings.settle(self.sub_tid, self.tid, refused);
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.rings.settle(self.sub_tid, self.tid, true);
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
    /// The flush that makes its file's data durable ([`jext_io::IoQueue::covering_flush`]).
    pub data_flush: u64,
    pub records: &'a [FcRecord],
}

/// Writes `plan` to a free ring. Returns once it and every lower sub-tid are settled.
pub(crate) fn write(
    shared: &Shared,
    rings: &Rings,
    plan: Planned<'_>,
) -> Result<FastCommitOutcome, JournalError> {
    let pending = Unsettled {
        rings,
        sub_tid: plan.sub_tid,
        tid: plan.tid,
        done: false,
    };
    let outcome = write_in_ring(shared, rings, &plan)?;
    pending.settle(outcome == FastCommitOutcome::NoRoom);
    rings.wait_lower_settled(plan.sub_tid);
    let written = matches!(outcome, FastCommitOutcome::Written { .. });
    if written && rings.gap_below(plan.tid, plan.sub_tid) {
        // Durable, but replay stops at the lower one's gap before reaching it.
        return Ok(FastCommitOutcome::NoRoom);
    }
    Ok(outcome)
}

fn write_in_ring(
    shared: &Shared,
    rings: &Rings,
    plan: &Planned<'_>,
) -> Result<FastCommitOutcome, JournalError> {
    let tid = plan.tid;
    shared.wait_for(tid.wrapping_sub(1), true)?;
    if tid_geq(shared.committed(), tid) {
        return Ok(FastCommitOutcome::Obsolete);
    }
    if rings.gap_below(tid, plan.sub_tid) {
        return Ok(FastCommitOutcome::NoRoom);
    }
    let (ring, mut st) = rings.pick();
    // Checked again under the ring's lock: a newer tid may have restarted this ring
    // since, which only happens once this tid is durable.
    if tid_geq(shared.committed(), tid) || st.tid.is_some_and(|t| tid_gt(t, tid)) {
        return Ok(FastCommitOutcome::Obsolete);
    }
    let (ring_first, ring_blocks) =
        ring_bounds(rings.region_first, rings.region_blocks, rings.count(), ring);
    let start = if st.tid == Some(tid) {
        st.next_block
    } else {
        0
    };
    let it = ITransaction {
        ring: ring as u8,
        nr_rings: rings.count() as u8,
        tid,
        sub_tid: plan.sub_tid,
        first_sub_tid: plan.first_sub_tid,
        records: plan.records.to_vec(),
    };
    let blocks = encode(&it, shared.block_size as usize);
    if start as usize + blocks.len() > ring_blocks as usize {
        return Ok(FastCommitOutcome::NoRoom);
    }
    shared.point_superblock_at_log(tid)?;
    let written = write_durably(
        shared,
        ring_first + start,
        blocks,
        plan.data_flush,
        Durably::SharedFlush,
    )?;
    st.tid = Some(tid);
    st.next_block = start + written;
    drop(st);
    shared.note_fast_commit(written);
    Ok(FastCommitOutcome::Written { blocks: written })
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
