//! The fast-commit area's writer: appends one fast commit (records the file system
//! built for one fsync) to the area after the log, and makes it durable.
//!
//! A fast commit carries the running transaction's tid and counts at recovery only while
//! that tid is the first one not in the log. So the writer:
//! 1. waits until every earlier transaction is durable (else recovery would stop before
//!    the fast commit's tid and drop it);
//! 2. skips the write if the tid itself became durable meanwhile (its full commit holds
//!    everything the fast commit would say);
//! 3. starts the area over (with a HEAD) at the first fast commit of a new tid: the older
//!    tid is durable, so what the area held is obsolete;
//! 4. writes the blocks once the flush that covers the files' data is done (the data,
//!    written before, must be durable before anything points at it; someone else's flush
//!    may have done it already), and makes them durable (FUA), as Linux's
//!    `REQ_PREFLUSH | REQ_FUA` on the tail block (see [`write_durably`]).
//!
//! Fast commits are written in ticket order (the order the file system planned them in,
//! under its lock): replay applies records in log order, so a newer inode image must
//! never land before an older one. Fsyncs that arrive while one is being written go out
//! together next, as one fast commit with one flush (group commit, see [`write`]); while
//! other fsyncs are under way and still writing their data, the group waits a moment for
//! them (`AreaState::batch_wait`). An area without room refuses, and the caller commits
//! in full instead; so does every later fast commit of the same tid, which may rely on
//! records the refused one carried. Must never: write a fast commit of a tid whose predecessor is not
//! durable, or overwrite the area while a tid it holds is not durable.

use crate::format::fast_commit::{FastCommitWriter, FcRecord};
use crate::journal::Shared;
use crate::tid::{tid_geq, Tid};
use crate::JournalError;
use jext_io::{IoFlags, WriteRequest};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What became of one fast commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastCommitOutcome {
    /// Written and durable, in this many blocks.
    Written { blocks: u32 },
    /// Its tid was durable before it was written: nothing to write.
    Obsolete,
    /// The area (or the journal: no fast-commit area) has no room: commit in full.
    NoRoom,
}

/// An fsync under way, from its start (before its data is written) to its return: what
/// tells a group ready to be written that company is coming (`AreaState::batch_wait`).
pub struct FsyncUnderWay<'a> {
    area: &'a FastCommitArea,
}

impl<'a> FsyncUnderWay<'a> {
    pub(crate) fn new(area: &'a FastCommitArea) -> FsyncUnderWay<'a> {
        area.state.lock().under_way += 1;
        FsyncUnderWay { area }
    }
}

impl Drop for FsyncUnderWay<'_> {
    fn drop(&mut self) {
        let mut st = self.area.state.lock();
        debug_assert!(st.under_way > 0, "an fsync left that never came");
        st.under_way -= 1;
    }
}

impl FastCommitArea {
    /// fsyncs between their start and their return (`FsyncUnderWay`).
    pub(crate) fn fsyncs_under_way(&self) -> usize {
        self.state.lock().under_way
    }
}

/// The area's state: which tid it holds and where the next fast commit goes.
pub(crate) struct FastCommitArea {
    /// First journal block of the area and its length (0 without the feature).
    pub(crate) first: u32,
    pub(crate) len: u32,
    state: Mutex<AreaState>,
    turn: Condvar,
}

struct AreaState {
    /// The tid the area's fast commits carry, if any was written since load.
    tid: Option<Tid>,
    /// The area block the next fast commit starts at.
    next_block: u32,
    /// The ticket whose turn it is.
    next_ticket: u64,
    /// A fast commit of this tid was not written (no room): no later one of the tid may
    /// be, since it may rely on what the unwritten one carried (an unlink said once).
    failed_tid: Option<Tid>,
    /// Fast commits handed in and not yet taken by a writer, by ticket.
    waiting: BTreeMap<u64, HandedIn>,
    /// What became of each ticket a writer took, until its fsync picks it up.
    done: HashMap<u64, Result<FastCommitOutcome, JournalError>>,
    /// A writer is writing a group now (with the lock released).
    writing: bool,
    /// Fsyncs under way ([`FsyncUnderWay`]), handed in or not yet, and how long writing
    /// a group takes (a moving average): what [`AreaState::batch_wait`] decides from.
    under_way: usize,
    average_write: Duration,
}

/// One fsync's fast commit, handed in and waiting for a writer.
struct HandedIn {
    tid: Tid,
    /// The flush that makes its file's data durable ([`jext_io::IoQueue::covering_flush`]).
    data_flush: u64,
    records: Vec<FcRecord>,
}

/// The fast commits one writer takes: consecutive tickets of one tid.
struct Group {
    tickets: std::ops::Range<u64>,
    tid: Tid,
    /// The latest of its members' data flushes.
    data_flush: u64,
    records: Vec<FcRecord>,
}

impl FastCommitArea {
    pub(crate) fn new(first: u32, len: u32) -> FastCommitArea {
        FastCommitArea {
            first,
            len,
            state: Mutex::new(AreaState {
                tid: None,
                next_block: 0,
                next_ticket: 0,
                failed_tid: None,
                waiting: BTreeMap::new(),
                done: HashMap::new(),
                writing: false,
                under_way: 0,
                average_write: Duration::ZERO,
            }),
            turn: Condvar::new(),
        }
    }
}

impl AreaState {
    /// The run of consecutive tickets from `next_ticket` that share its tid, taken out of
    /// `waiting`; `None` if `next_ticket` has not come in yet.
    fn take_group(&mut self) -> Option<Group> {
        let tid = self.waiting.get(&self.next_ticket)?.tid;
        let first = self.next_ticket;
        let mut next = first;
        let mut data_flush = 0;
        let mut records = Vec::new();
        while self.waiting.get(&next).is_some_and(|h| h.tid == tid) {
            let mut member = self.waiting.remove(&next).expect("just looked");
            data_flush = data_flush.max(member.data_flush);
            records.append(&mut member.records);
            next += 1;
        }
        Some(Group {
            tickets: first..next,
            tid,
            data_flush,
            records,
        })
    }

    /// How long an fsync that could take the next group now should wait for company
    /// (JBD2 batches synchronous handles the same way): only while other fsyncs are under
    /// way and have not handed their tickets in yet, writing their data. Each fsync waits
    /// once at most, and the last to hand in takes the group at once. Without it, fsyncs
    /// that each append and sync fall into cohorts that take turns writing (two threads:
    /// every fast commit alone; eight: two groups of four), each group one flush and one
    /// FUA write. Half a group's write time at most: a lone fsync pays at worst half again
    /// its time, a joiner saves a whole write. A single syncing thread never waits.
    fn batch_wait(&self) -> Option<Duration> {
        let group_ready = self.waiting.contains_key(&self.next_ticket);
        let others_coming = self.under_way > self.waiting.len();
        company_wait(self.average_write).filter(|_| group_ready && others_coming)
    }

    /// Folds one group's write time into the moving average (an eighth of the new one).
    fn note_write_time(&mut self, took: Duration) {
        self.average_write = fold_average(self.average_write, took);
    }
}

/// The longest an fsync waits for company (JBD2's `max_batch_time` is 15 ms; a fast
/// commit on a slow disk must not wait that long alone).
pub(crate) const MAX_BATCH_WAIT: Duration = Duration::from_millis(5);

/// How long a group may wait for company, given the `average` time of what it waits to
/// share (a write, a commit, a flush): half of it, at most [`MAX_BATCH_WAIT`]; `None`
/// while nothing was measured yet. Half: a lone fsync pays at worst half again its time,
/// a joiner saves a whole one.
pub(crate) fn company_wait(average: Duration) -> Option<Duration> {
    (!average.is_zero()).then(|| (average / 2).min(MAX_BATCH_WAIT))
}

/// `average` (zero: none yet) with `took` folded in for an eighth: the moving average the
/// group commits wait from.
pub(crate) fn fold_average(average: Duration, took: Duration) -> Duration {
    match average.is_zero() {
        true => took,
        false => (average * 7 + took) / 8,
    }
}

/// Writes fast commit `ticket` (tickets are handed out 0, 1, 2, ... by the caller, and
/// every ticket must be passed here exactly once, even when there is nothing to write).
///
/// Group commit: the fsync whose ticket is next becomes the writer and takes every
/// consecutive ticket of the same tid that has come in, as one fast commit (their records
/// in ticket order, one TAIL, one flush and one FUA write); the others wait for its
/// outcome. While it writes, with the lock released, later fsyncs queue up for the next
/// group, so concurrent fsyncs share the device's flushes as full commits do.
/// `data_flush` is the flush that makes the fsync's file data durable
/// ([`jext_io::IoQueue::covering_flush`], taken once its data writes completed).
pub(crate) fn write(
    shared: &Shared,
    ticket: u64,
    tid: Tid,
    data_flush: u64,
    records: Vec<FcRecord>,
) -> Result<FastCommitOutcome, JournalError> {
    let area = &shared.fast_commits;
    let mut st = area.state.lock();
    assert!(
        ticket >= st.next_ticket,
        "fast-commit ticket {ticket} handed in twice"
    );
    st.waiting.insert(
        ticket,
        HandedIn {
            tid,
            data_flush,
            records,
        },
    );
    let mut batched = false;
    loop {
        if let Some(outcome) = st.done.remove(&ticket) {
            return outcome;
        }
        if !st.writing {
            // While this one waits, whoever hands in the next ticket takes this one along
            // (`take_group` starts at `next_ticket`) and wakes it when the group is done.
            if let Some(wait) = st.batch_wait().filter(|_| !batched) {
                batched = true;
                area.turn.wait_for(&mut st, wait);
                continue;
            }
            if let Some(group) = st.take_group() {
                st.writing = true;
                drop(st);
                let started = Instant::now();
                let outcome = write_group(shared, &group);
                let took = started.elapsed();
                st = area.state.lock();
                if matches!(outcome, Ok(Written::At { .. })) {
                    st.note_write_time(took);
                }
                settle(&mut st, &group, outcome);
                area.turn.notify_all();
                continue;
            }
        }
        area.turn.wait(&mut st);
    }
}

/// Writes one group with the area's lock released: only the writer touches the area's
/// position until `settle`.
fn write_group(shared: &Shared, group: &Group) -> Result<Written, JournalError> {
    let area = &shared.fast_commits;
    if area.len == 0 {
        return Ok(Written::Not(FastCommitOutcome::NoRoom));
    }
    shared.wait_for(group.tid.wrapping_sub(1), true)?;
    if tid_geq(shared.committed(), group.tid) {
        return Ok(Written::Not(FastCommitOutcome::Obsolete));
    }
    let (failed_tid, area_tid, next_block) = {
        let st = area.state.lock();
        (st.failed_tid, st.tid, st.next_block)
    };
    if failed_tid == Some(group.tid) {
        return Ok(Written::Not(FastCommitOutcome::NoRoom));
    }
    let first_of_tid = area_tid != Some(group.tid);
    let start = if first_of_tid { 0 } else { next_block };
    let block_size = shared.block_size as usize;
    let mut writer = FastCommitWriter::new(block_size, group.tid, first_of_tid);
    for record in &group.records {
        writer.push(record);
        if start as usize + writer.blocks_so_far() > area.len as usize {
            return Ok(Written::Refused);
        }
    }
    let blocks: Vec<Arc<[u8]>> = writer.finish().into_iter().map(Arc::from).collect();
    if start as usize + blocks.len() > area.len as usize {
        return Ok(Written::Refused);
    }
    shared.point_superblock_at_log(group.tid)?;
    let written = write_durably(shared, area.first + start, blocks, group.data_flush)?;
    shared.note_fast_commit(written);
    Ok(Written::At { start, written })
}

/// What a writer did with its group, for `settle`.
enum Written {
    /// Durable at area block `start`, `written` blocks.
    At { start: u32, written: u32 },
    /// No room: this tid's later fast commits must be refused too.
    Refused,
    /// Nothing to write, and nothing changes in the area.
    Not(FastCommitOutcome),
}

/// Records a group's outcome for each of its tickets and moves the area on.
fn settle(st: &mut AreaState, group: &Group, written: Result<Written, JournalError>) {
    let outcome = match written {
        Ok(Written::At { start, written }) => {
            st.tid = Some(group.tid);
            st.next_block = start + written;
            Ok(FastCommitOutcome::Written { blocks: written })
        }
        Ok(Written::Refused) => {
            st.failed_tid = Some(group.tid);
            Ok(FastCommitOutcome::NoRoom)
        }
        Ok(Written::Not(outcome)) => Ok(outcome),
        Err(err) => Err(err),
    };
    for ticket in group.tickets.clone() {
        st.done.insert(ticket, outcome.clone());
    }
    st.next_ticket = group.tickets.end;
    st.writing = false;
}

/// Writes `blocks` from journal block `first` with FUA (Linux's `REQ_FUA` on a fast
/// commit's blocks) and returns their count once they are durable. Every block carries
/// FUA (they merge into one write): a FUA only on the last would leave the others in the
/// device's cache when the fsync returns. The single area writes one group at a time, and
/// its next group's fsyncs mostly wait in this one, so a flush after it would serve
/// nobody else.
pub(crate) fn write_durably(
    shared: &Shared,
    first: u32,
    blocks: Vec<Arc<[u8]>>,
    data_flush: u64,
) -> Result<u32, JournalError> {
    let flags = match shared.config.barrier {
        true => IoFlags::FUA,
        false => IoFlags::empty(),
    };
    write_after_data(shared, first, blocks, data_flush, flags)
}

/// Writes `blocks` from journal block `first` with `flags` and returns their count once
/// they transferred.
///
/// First the files' data they point at must be durable: flush `data_flush`, the one due
/// when that data's writes completed. Someone else's flush (another ring's, a full
/// commit's, an fsync beside) may have done it already; then there is no flush of its
/// own. A flush rather than a PREFLUSH on the first block, because a PREFLUSH write holds
/// back every write issued after it until its flush is done, which would make concurrent
/// fsyncs (other files' data writes, other rings) queue behind this one.
pub(crate) fn write_after_data(
    shared: &Shared,
    first: u32,
    blocks: Vec<Arc<[u8]>>,
    data_flush: u64,
    flags: IoFlags,
) -> Result<u32, JournalError> {
    let count = blocks.len() as u32;
    if shared.config.barrier {
        shared.io.wait_for_flush(data_flush)?;
    }
    let requests = blocks
        .into_iter()
        .enumerate()
        .map(|(i, block)| {
            let offset = shared.area().byte_offset(first + i as u32);
            WriteRequest::new(offset, block, flags)
        })
        .collect();
    shared.io.submit(requests).wait()?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area_with(tickets: &[u64], under_way: usize) -> AreaState {
        let area = FastCommitArea::new(0, 64);
        let mut st = area.state.into_inner();
        for &t in tickets {
            st.waiting.insert(
                t,
                HandedIn {
                    tid: 7,
                    data_flush: 0,
                    records: Vec::new(),
                },
            );
        }
        st.under_way = under_way;
        st.note_write_time(Duration::from_millis(2));
        st
    }

    #[test]
    fn a_fast_commit_waits_for_company_only_while_other_fsyncs_are_under_way() {
        let st = area_with(&[0], 2);
        assert_eq!(st.batch_wait(), Some(Duration::from_millis(1)));
        // The only fsync under way: nobody to wait for.
        let st = area_with(&[0], 1);
        assert_eq!(st.batch_wait(), None);
        // Every fsync under way handed in: the group goes at once.
        let st = area_with(&[0, 1, 2], 3);
        assert_eq!(st.batch_wait(), None);
        // Ticket 0 not handed in yet: no group to take.
        let st = area_with(&[1], 2);
        assert_eq!(st.batch_wait(), None);
    }

    #[test]
    fn the_wait_is_capped_and_follows_the_average_write() {
        let mut st = area_with(&[0], 2);
        for _ in 0..64 {
            st.note_write_time(Duration::from_millis(40));
        }
        assert_eq!(st.batch_wait(), Some(MAX_BATCH_WAIT));
    }
}
