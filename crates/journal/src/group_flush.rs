//! Group flush for per-core rings: a ring writer whose i-transactions transferred waits,
//! once and briefly, before it asks for the flush that makes them durable, while other
//! fsyncs are under way that have not come to that flush yet. One device flush then
//! makes them all durable, as the single area's group commit (`AreaState::batch_wait`)
//! and full commits (`crate::sync_batch`) do.
//!
//! Without it, rings' fsyncs fall into two cohorts that take turns on the device's one
//! flush in flight (`jext_io`'s scheduler): while one cohort's flush runs, the other's
//! fsyncs write their rings and queue for the next; when it completes, the next goes at
//! once with that queue alone, and the cohort just released comes a write's time too late
//! for it. Each flush so makes durable about half of the fsyncs in flight. On the
//! simulated plain SSD, whose flush costs milliseconds, `jext bench dwsl` went from 20 to
//! 37 fsyncs/s with 2 threads and from 79 to 132-137 with 8 (0.24 to 0.13 flushes per
//! fsync; bench/results/2026-11-28-group-flush).
//!
//! Promises: a lone fsync (no other under way) never waits; no fsync waits more than once,
//! nor longer than half an average flush (at most `MAX_BATCH_WAIT`); the last to come
//! ends everyone's wait, and a writer finding its flush dispatched by someone else ends
//! its own. The flush waited for is numbered when the writer comes, after its writes
//! completed, so it covers them whoever dispatches it.
//!
//! Must never: wait holding any lock but its own state lock, which the wait releases (a
//! ring's head is free by then, so fsyncs queued on that ring can come too).

use crate::fast_commit::{company_wait, fold_average};
use crate::journal::Shared;
use crate::JournalError;
use parking_lot::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The arrivals at the next flush, and how long flushes take.
#[derive(Default)]
pub(crate) struct GroupFlush {
    state: Mutex<Arrivals>,
    came: Condvar,
}

#[derive(Default)]
struct Arrivals {
    /// The flush number writers are coming to, and how many fsyncs came.
    flush: u64,
    arrived: usize,
    /// Moving average of a flush, from asking for it to its completion.
    average_flush: Duration,
}

impl Arrivals {
    /// Counts `fsyncs` more come to flush `number` (a writer and those whose
    /// i-transactions it wrote); returns how many came for it, or `None` if writers come
    /// to a later flush already (this one's number was taken before the lock).
    fn arrive(&mut self, number: u64, fsyncs: usize) -> Option<usize> {
        if number < self.flush {
            return None;
        }
        if number > self.flush {
            self.flush = number;
            self.arrived = 0;
        }
        self.arrived += fsyncs;
        Some(self.arrived)
    }

    /// How long a writer may wait for company (`None`: no flush measured yet).
    fn wait_allowed(&self) -> Option<Duration> {
        company_wait(self.average_flush)
    }
}

impl Shared {
    /// Makes every write completed before this call durable, for `fsyncs` fsyncs (whose
    /// i-transactions the caller wrote), with one flush shared with the fsyncs under way
    /// that come to it within the wait (module comment).
    pub(crate) fn group_flush(&self, fsyncs: usize) -> Result<(), JournalError> {
        let number = self.io.next_flush();
        let group = &self.group_flush;
        let mut st = group.state.lock();
        let arrived = st.arrive(number, fsyncs);
        let others_under_way =
            arrived.is_some_and(|arrived| self.fast_commits.fsyncs_under_way() > arrived);
        match st.wait_allowed().filter(|_| others_under_way) {
            Some(wait) => {
                let deadline = Instant::now() + wait;
                while self.others_coming(&st, number) {
                    if group.came.wait_until(&mut st, deadline).timed_out() {
                        break;
                    }
                }
            }
            // The last to come ends the wait of those before it.
            None => {
                group.came.notify_all();
            }
        }
        drop(st);
        let asked = Instant::now();
        self.io.wait_for_flush(number)?;
        let took = asked.elapsed();
        let mut st = group.state.lock();
        st.average_flush = fold_average(st.average_flush, took);
        Ok(())
    }

    /// Whether a writer waiting for company for flush `number` should go on waiting: it
    /// is still the one writers come to, not dispatched yet, and fewer came than fsyncs
    /// are under way.
    fn others_coming(&self, st: &Arrivals, number: u64) -> bool {
        st.flush == number
            && self.io.next_flush() == number
            && st.arrived < self.fast_commits.fsyncs_under_way()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fast_commit::MAX_BATCH_WAIT;

    #[test]
    fn arrivals_count_per_flush_number() {
        let mut st = Arrivals::default();
        assert_eq!(st.arrive(3, 1), Some(1));
        // A writer of a ring's queue comes for all it wrote.
        assert_eq!(st.arrive(3, 3), Some(4));
        // Flush 3 went: writers now come to the next one.
        assert_eq!(st.arrive(4, 1), Some(1));
        // A writer that took flush 3's number before the lock: nobody waits with it.
        assert_eq!(st.arrive(3, 1), None);
    }

    #[test]
    fn the_wait_is_half_an_average_flush_and_capped() {
        let mut st = Arrivals::default();
        // No flush measured yet: nothing to wait from.
        assert_eq!(st.wait_allowed(), None);
        st.average_flush = Duration::from_micros(800);
        assert_eq!(st.wait_allowed(), Some(Duration::from_micros(400)));
        st.average_flush = Duration::from_millis(40);
        assert_eq!(st.wait_allowed(), Some(MAX_BATCH_WAIT));
    }
}
