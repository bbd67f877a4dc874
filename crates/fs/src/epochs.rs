//! Barrier-delimited epochs: `fbarrier` and `fdatabarrier` (BarrierFS §4) kept by the
//! journal, with no device IO on the caller's path and no flush (issue 12 item 4).
//!
//! A barrier on file f ends an epoch: what fsync (fdatasync) of f would make durable must
//! persist before anything written after the call returns, without being durable yet.
//! BarrierFS dispatches f's data and a journal commit as barrier writes, which needs a
//! device that keeps a barrier write's order; no disk here has one. jext keeps the same
//! promise with its journal instead:
//!
//! - **f's data goes into the running transaction**: a barrier makes an ordered file
//!   journal its data, in memory only ([`crate::journal_mode::journal_in_memory`]; it goes
//!   back to ordered only at a later fsync, once the checkpoint passed its journaled
//!   blocks), so the barrier writes back its dirty pages
//!   into the journal, beside its metadata and every earlier change;
//! - **later journaled changes come after it**: they go into the same transaction or a
//!   later one, and transactions count in order (recovery stops at the first that is not
//!   whole, `jext_journal::recovery`), so none is replayed without this one. Two epochs
//!   in one transaction are atomic together: a crash still leaves a prefix of them;
//! - **what bypasses the journal waits**: an in-place overwrite (data=ordered) issued
//!   after the barrier is held, before it reaches the IO layer, until the barrier's
//!   transaction is durable ([`Epochs::unreached`], `file::writeback`); a fast commit,
//!   which recovery would replay without the running transaction, is refused until then
//!   (`fast_commit::Ineligible::Barrier`).
//!
//! So a barrier costs what buffering its data in the journal costs; the transaction
//! commits when it is due (`commit=`, a full log, an fsync) with the one flush every
//! commit has, and the epochs it holds are delimited without a commit of their own.
//! Choice measured with `jext bench ordered-write` (bench/results/2026-11-27-barrier-epochs):
//! 4 KiB random overwrites each followed by fdatabarrier run at 0.99× (data=ordered) and
//! 0.85× (data=journal) the IOPS of the same writes with no sync on the loop device, with
//! no write and no flush per barrier; before, each fdatabarrier committed and waited for a
//! flush (0.06×). A flush per epoch issued off the caller's path, the other way to order
//! data written in place, would still cap barriers at the device's flush rate, since
//! epochs cannot share one flush without being atomic together, which only the journal
//! makes them.
//!
//! Without a journal (`Journal::without_log`) there is no order to lean on: a barrier
//! there commits and waits as fsync does (`crate::api`).
//!
//! Promises: after a crash, what the file system shows is a prefix of the
//! barrier-delimited epochs. Must never: let an in-place overwrite issued after a barrier
//! returned reach the IO layer before the barrier's transaction is durable, nor let a
//! fast commit be written in that window.

use jext_journal::{tid_geq, tid_gt, Tid};
use std::sync::atomic::{AtomicU64, Ordering};

/// Set in [`Epochs::fence`] when a barrier is recorded; the low 32 bits hold its tid.
const ARMED: u64 = 1 << 32;

/// The newest barrier's transaction: everything an in-place write or a fast commit must
/// not overtake.
#[derive(Default)]
pub(crate) struct Epochs {
    /// `ARMED | tid` once a barrier has returned; 0 before any.
    fence: AtomicU64,
}

impl Epochs {
    /// Ends an epoch at transaction `tid` (the running one when the barrier returns):
    /// nothing written in place after this may persist before `tid` is durable.
    pub(crate) fn end_epoch(&self, tid: Tid) {
        let _ = self
            .fence
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                let newer = now & ARMED == 0 || tid_gt(tid, now as Tid);
                newer.then_some(ARMED | u64::from(tid))
            });
    }

    /// The barrier transaction an in-place write issued now must wait for, if it is not
    /// durable yet (`durable`: the journal's last durable tid).
    pub(crate) fn unreached(&self, durable: Tid) -> Option<Tid> {
        let now = self.fence.load(Ordering::Acquire);
        if now & ARMED == 0 {
            return None;
        }
        let tid = now as Tid;
        if tid_geq(durable, tid) {
            // Reached: disarm, unless a newer barrier came meanwhile (tids wrap, so an
            // old one must not stay to be compared with them forever).
            let _ = self
                .fence
                .compare_exchange(now, 0, Ordering::AcqRel, Ordering::Acquire);
            return None;
        }
        Some(tid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_holds_until_its_transaction_is_durable() {
        let epochs = Epochs::default();
        assert_eq!(epochs.unreached(0), None, "no barrier yet");
        epochs.end_epoch(7);
        assert_eq!(epochs.unreached(6), Some(7));
        // An older barrier's tid never lowers the fence.
        epochs.end_epoch(5);
        assert_eq!(epochs.unreached(6), Some(7));
        epochs.end_epoch(9);
        assert_eq!(epochs.unreached(8), Some(9));
        assert_eq!(epochs.unreached(9), None, "durable: nothing to wait for");
        assert_eq!(epochs.unreached(3), None, "disarmed once reached");
    }

    #[test]
    fn tids_compare_across_the_wrap() {
        let epochs = Epochs::default();
        epochs.end_epoch(u32::MAX);
        epochs.end_epoch(2);
        assert_eq!(epochs.unreached(u32::MAX), Some(2));
        assert_eq!(epochs.unreached(2), None);
    }
}
