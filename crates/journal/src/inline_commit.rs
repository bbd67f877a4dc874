//! An fsync alone commits on its own thread: when no other fsync is under way and
//! neither the commit thread nor the flush thread is at work, the fsync's caller locks
//! down the running transaction, dispatches it and runs the durable round itself, instead
//! of waking the commit thread, which wakes the flush thread, which wakes the caller.
//!
//! Each of those hand-offs is a sleep and a wake-up on the fsync's path; a single-threaded
//! database (SQLite syncs its journal and its database file in turn) pays them on every
//! transaction. The threads stay for everything else: commits asked for by several fsyncs
//! at once (group commit, `crate::sync_batch`), the timer's commits, fbarrier, and
//! whatever arrives while a commit or a round is under way.
//!
//! Promises: the same two rules the threads keep, by the same two flags
//! (`State::commit_busy`, `State::round_busy`): one committer at a time, so transactions
//! reach the log in tid order, and one round at a time, so they become durable in tid
//! order. The caller's round takes every issued transaction, older ones included, as the
//! flush thread's would. Whatever came due meanwhile is handed back to the threads when
//! the flags are let go. An error aborts the journal as it would on the threads.
//! Must never: take a flag another thread holds, or wait for company (a lone fsync has
//! none to wait for).

use crate::commit::commit_due;
use crate::journal::{Shared, State};
use crate::tid::{tid_geq, tid_gt, Tid};
use parking_lot::MutexGuard;
use std::time::Duration;

impl Shared {
    /// Commits `tid` and makes it durable on the calling thread if it is the running
    /// transaction and both threads are idle; returns whether it did (then `tid` is
    /// durable, or the journal aborted).
    pub(crate) fn commit_on_own_thread(&self, st: &mut MutexGuard<'_, State>, tid: Tid) -> bool {
        let idle = !st.commit_busy && !st.round_busy;
        let open = st.aborted.is_none() && !st.shutting_down && !st.helpers_stop;
        let running = st
            .running
            .as_ref()
            .is_some_and(|t| t.tid == tid && !t.locked);
        if !(idle && open && running) {
            return false;
        }
        st.commit_busy = true;
        st.round_busy = true;
        if st.durable_requested.is_none_or(|r| tid_gt(tid, r)) {
            st.durable_requested = Some(tid);
        }
        crate::commit::commit_running(self, st);
        st.commit_busy = false;
        let interval = Duration::from_millis(self.config.commit_interval_ms);
        if commit_due(st, interval) || st.shutting_down {
            self.commit_wake.notify_one();
        }
        if st.aborted.is_some() {
            st.round_busy = false;
            return true;
        }
        // An error aborts the journal; the caller finds it there.
        let _ = crate::flush::round(self, st, true);
        st.stats.inline_commits += 1;
        let issued = st
            .committing
            .front()
            .is_some_and(|t| t.log_ticket.is_some());
        if issued || st.helpers_stop {
            // The commit thread dispatched more meanwhile, or the journal shuts down
            // while the flush thread waited for the flag: its turn.
            self.flush_wake.notify_one();
        }
        debug_assert!(
            st.aborted.is_some() || tid_geq(st.committed, tid) || tid_geq(tid, st.next_tid),
            "a round on the fsync's own thread left {tid} not durable"
        );
        true
    }
}
