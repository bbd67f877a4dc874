//! Group commit for fsyncs that commit in full: an fsync that would start the running
//! transaction's commit waits once, briefly, while other fsyncs are under way and have
//! not reached their commit yet, so that one commit and one flush carry them all (JBD2
//! batches synchronous handles the same way, `j_min_batch_time`/`j_max_batch_time`;
//! fast commits have their own, `crate::fast_commit`).
//!
//! Without it, fsyncs that each append and sync fall into cohorts: the first to arrive
//! starts a commit at once, the others join the next. Measured with `jext bench dwsl
//! --repetitions 3` on the loop device, small appends journaled (`small_syncs=journal`):
//! two threads went from 0.78–0.80 to 0.50–0.52 flushes per fsync, eight from 0.24–0.27 to
//! 0.14–0.15, and eight threads' fsyncs/s from a median of 9,307 to 11,965
//! (`bench/results/2026-11-27-small-syncs`). A fsync under way that will not commit in
//! full (a fast commit) still counts as coming: the others then wait their half average.
//! One waiting for an earlier transaction's round counts as coming only where rounds are
//! shorter than the longest wait (`SyncBatch::not_coming`): on a device whose flush takes
//! milliseconds it cannot come back in time, and waiting for it only made two threads
//! take turns on the flush.
//!
//! The flush thread's durable round waits the same way, once, before it flushes
//! (`SyncBatch::round_wait`): while fsyncs under way have not come to wait for a full
//! commit, or wait for one not dispatched yet. Rounds otherwise fall into cohorts too: on
//! the simulated plain SSD (`jext bench dwsl --only plain-ssd`), 8 threads went from
//! 78-84 to 110-133 fsyncs/s (bench/results/2026-11-28-group-flush).
//!
//! Promises: a lone fsync (no other under way) never waits; no fsync waits more than once
//! for company at its commit (and its round once more), nor longer than half an average
//! commit (a round: half an average round) (at most fast commits' `MAX_BATCH_WAIT`, 5 ms);
//! the last fsync of a batch to arrive starts the commit at once and wakes the others.
//! Must never: wait while holding anything but the journal's state lock, which the wait
//! releases.

use crate::fast_commit::{company_wait, fold_average, MAX_BATCH_WAIT};
use crate::journal::{request_commit, Shared, State};
use crate::tid::{tid_geq, tid_gt, Tid};
use parking_lot::MutexGuard;
use std::time::{Duration, Instant};

/// What the state keeps for batching.
#[derive(Default)]
pub(crate) struct SyncBatch {
    /// The newest transaction fsyncs came to commit, and how many came.
    arrived: Option<(Tid, usize)>,
    /// Moving average of an fsync's full commit, from its request to durability.
    average_commit: Duration,
    /// The transaction each fsync waiting for its full commit to be durable waits for:
    /// what the flush thread's round waits for ([`SyncBatch::round_wait`]).
    waiting: Vec<Tid>,
    /// Moving average of a durable round of the flush thread.
    average_round: Duration,
    /// The first transaction of the last round that waited for company: a round waits
    /// once.
    round_waited: Option<Tid>,
}

impl Shared {
    /// fsync's full commit of `tid`: waits for company (module comment), then commits and
    /// waits until `tid` is durable.
    pub(crate) fn fsync_commit(&self, tid: Tid) -> Result<(), crate::JournalError> {
        let under_way = self.fast_commits.fsyncs_under_way();
        let mut st = self.state.lock();
        let started = Instant::now();
        // Alone: nobody to wait for, and nobody to hand the commit to
        // (`crate::inline_commit`).
        if under_way <= 1 && self.commit_on_own_thread(&mut st, tid) {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            st.sync_batch.note_commit(started.elapsed());
            return Ok(());
        }
        let arrived = st.sync_batch.arrive(tid);
        let not_coming = st.sync_batch.not_coming(tid);
        self.wait_for_company(&mut st, tid, under_way > arrived + not_coming);
        st.sync_batch.waiting.push(tid);
        if st.sync_batch.waiting.len() >= under_way {
            // The last to come: a round waiting for company need not wait longer.
            self.flush_wake.notify_all();
        }
        drop(st);
        let started = Instant::now();
        let result = self.wait_for(tid, true);
        let mut st = self.state.lock();
        st.sync_batch.stop_waiting(tid);
        if result.is_ok() {
            st.sync_batch.note_commit(started.elapsed());
        }
        result
    }

    /// Waits, once, while `tid` runs uncommitted and `others_coming` (fsyncs under way
    /// that have not come to commit it: writing their data, or waiting for an earlier
    /// commit, after which their thread may sync again); the last to come wakes the
    /// others.
    fn wait_for_company(&self, st: &mut MutexGuard<'_, State>, tid: Tid, others_coming: bool) {
        let wait = company_wait(st.sync_batch.average_commit).filter(|_| others_coming);
        let Some(wait) = wait else {
            // The others waiting need not wait longer: this request commits them all.
            request_commit(self, st, tid, true);
            self.changed.notify_all();
            return;
        };
        let deadline = Instant::now() + wait;
        while uncommitted_running(st, tid) && Instant::now() < deadline {
            self.changed.wait_until(st, deadline);
        }
    }
}

/// Whether `tid` is still the running transaction and nobody asked for its commit.
fn uncommitted_running(st: &State, tid: Tid) -> bool {
    st.running.as_ref().is_some_and(|t| t.tid == tid)
        && st.commit_requested.is_none_or(|r| !tid_geq(r, tid))
}

impl SyncBatch {
    /// Counts one more fsync come to commit `tid`; returns how many came for it.
    fn arrive(&mut self, tid: Tid) -> usize {
        let count = match self.arrived {
            Some((t, n)) if t == tid => n + 1,
            _ => 1,
        };
        self.arrived = Some((tid, count));
        count
    }

    /// How many fsyncs under way will not come to commit `tid` within a company wait:
    /// those waiting for an earlier transaction's round, when a round takes longer than
    /// the longest wait. The round then waits for this commit instead, and one flush
    /// carries both (on the simulated plain SSD, 50 ms flushes, two threads went from
    /// 18–38 to 34–36 fsyncs/s). Where rounds are short they come back in time and join
    /// this transaction, one commit for both (on the loop device, counting them as not
    /// coming took four threads from 4,698 to 3,798 fsyncs/s).
    fn not_coming(&self, tid: Tid) -> usize {
        if self.average_round <= MAX_BATCH_WAIT {
            return 0;
        }
        self.waiting.iter().filter(|&&t| tid_gt(tid, t)).count()
    }

    /// How many fsyncs wait for a full commit to be durable.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn stop_waiting(&mut self, tid: Tid) {
        let i = self
            .waiting
            .iter()
            .position(|&t| t == tid)
            .expect("an fsync stops waiting once, for what it waited for");
        self.waiting.swap_remove(i);
    }

    /// Folds one commit's time into the moving average (an eighth of the new one).
    fn note_commit(&mut self, took: Duration) {
        self.average_commit = fold_average(self.average_commit, took);
    }

    /// How long the flush thread's durable round whose first transaction is `first` may
    /// wait for company, if `under_way` fsyncs are under way: once per round, only while
    /// some of them are not waiting for a full commit yet (their thread just got the last
    /// round's answer and comes back, or is still writing), for at most half an average
    /// round. Without it, syncing threads fall into cohorts that take turns on the flush
    /// thread: a round goes as soon as the one before completes, with the fsyncs that
    /// came during it, and those it released come a moment too late.
    pub(crate) fn round_wait(&mut self, first: Tid, under_way: usize) -> Option<Duration> {
        let others_coming = under_way > self.waiting.len();
        let wait = company_wait(self.average_round)
            .filter(|_| others_coming && self.round_waited != Some(first))?;
        self.round_waited = Some(first);
        Some(wait)
    }

    /// Folds one durable round's time into its moving average.
    pub(crate) fn note_round(&mut self, took: Duration) {
        self.average_round = fold_average(self.average_round, took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_count_per_transaction() {
        let mut batch = SyncBatch::default();
        assert_eq!(batch.arrive(7), 1);
        assert_eq!(batch.arrive(7), 2);
        // The next transaction starts a new count.
        assert_eq!(batch.arrive(8), 1);
        assert_eq!(batch.arrive(8), 2);
    }

    #[test]
    fn a_round_waits_once_and_only_while_fsyncs_are_still_coming() {
        let mut batch = SyncBatch::default();
        // No round measured yet: nothing to wait from.
        assert_eq!(batch.round_wait(5, 2), None);
        batch.note_round(Duration::from_millis(2));
        batch.waiting = vec![4];
        // Everyone under way waits for a full commit already: go.
        assert_eq!(batch.round_wait(5, 1), None);
        assert_eq!(batch.round_wait(5, 3), Some(Duration::from_millis(1)));
        // Once per round.
        assert_eq!(batch.round_wait(5, 3), None);
        assert_eq!(batch.round_wait(6, 3), Some(Duration::from_millis(1)));
        for _ in 0..64 {
            batch.note_round(Duration::from_millis(40));
        }
        assert_eq!(batch.round_wait(7, 3), Some(MAX_BATCH_WAIT));
    }

    #[test]
    fn fsyncs_waiting_for_an_earlier_round_come_back_only_where_rounds_are_short() {
        let mut batch = SyncBatch {
            waiting: vec![4, 4, 5],
            ..SyncBatch::default()
        };
        batch.note_round(Duration::from_micros(600));
        // They come back within a company wait: all may still come to 6.
        assert_eq!(batch.not_coming(6), 0);
        for _ in 0..64 {
            batch.note_round(Duration::from_millis(50));
        }
        assert_eq!(batch.not_coming(6), 3);
        // Those waiting for 5 itself arrived for it already; only those before it count.
        assert_eq!(batch.not_coming(5), 2);
        batch.stop_waiting(4);
        assert_eq!(batch.not_coming(6), 2);
        assert_eq!(batch.waiting(), 2);
    }

    #[test]
    fn the_average_commit_moves_an_eighth_of_the_way() {
        let mut batch = SyncBatch::default();
        batch.note_commit(Duration::from_micros(800));
        assert_eq!(batch.average_commit, Duration::from_micros(800));
        batch.note_commit(Duration::from_micros(1600));
        assert_eq!(batch.average_commit, Duration::from_micros(900));
    }
}
