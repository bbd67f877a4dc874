//! The flush thread (BarrierFS's data plane): makes dispatched transactions durable, many
//! with one flush (group commit), publishes the durable tid and wakes the fsync waiters.
//!
//! Each round takes every transaction dispatched so far and:
//!
//! - on a device with a barrier write, the commit blocks are already out, in order behind
//!   their logged blocks: one flush (none if the device has no volatile cache) makes them
//!   all durable;
//! - with single-I/O commits (no barrier write), the commit blocks went out in the same
//!   write as their transactions: one flush makes the round durable, and is the only
//!   ordering there is, so a round asked for ordering (fbarrier) is a durable one;
//! - on any other device, nothing orders a commit block behind its logged blocks but a
//!   flush (the IO layer never pretends): the round waits until the logged blocks
//!   transferred, flushes, then writes the commit blocks (publishing them dispatched:
//!   fbarrier's point) and, if durability is wanted, makes them durable — with FUA when
//!   the round holds one transaction and none is committing behind it, else with one
//!   more flush. That flush also covers the logged blocks of later transactions that
//!   transferred before it, so their round needs no flush before its commit blocks:
//!   under a stream of fsyncs, consecutive rounds share flushes and a round costs one.
//!
//! - without a log (`crate::home`), the blocks went home as the commit: the round waits
//!   until they transferred and flushes once; an ordering asked for is a durable round.
//!
//! A round runs when someone needs durability (fsync, the timer's commits, the
//! checkpoint, shutdown), or, on a device without a barrier write, an ordering (fbarrier).
//! A durable round first waits a moment, once, while fsyncs under way are still coming to
//! it (`crate::sync_batch`), so that one flush makes them all durable.
//!
//! Promises: transactions become durable, and are published, in tid order; a tid is
//! published durable only after its commit block is; a durable revoke is published only
//! while no checkpoint write is in flight (`Shared::checkpoint_io`). With `barrier` off
//! (ext4 `nobarrier`) no flush is issued and "durable" means only "transferred".

use crate::journal::{Shared, State};
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::JournalError;
use jext_io::{IoFlags, IoTicket, WriteRequest};
use parking_lot::MutexGuard;
use std::sync::Arc;
use std::time::Instant;

/// One committing transaction as a round sees it.
struct Item {
    tid: Tid,
    ticket: IoTicket,
    commit_issued: bool,
    /// Where its commit block goes (`None` without a log: there is none).
    commit_position: Option<u32>,
    log_durable: bool,
    has_revokes: bool,
}

pub(crate) fn flush_thread(shared: Arc<Shared>) {
    let mut st = shared.state.lock();
    loop {
        let Some(durable) = wait_for_work(&shared, &mut st) else {
            return;
        };
        st.round_busy = true;
        if round(&shared, &mut st, durable).is_err() {
            return;
        }
    }
}

/// One round over every issued committing transaction, by whoever set `State::round_busy`
/// (this thread, or an fsync on its own thread: `crate::inline_commit`), which it clears.
/// An error aborts the journal.
pub(crate) fn round(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    durable: bool,
) -> Result<(), JournalError> {
    debug_assert!(st.round_busy, "one round at a time");
    let mut items = take_items(st);
    let started = Instant::now();
    let result = if items.is_empty() {
        Ok(())
    } else {
        MutexGuard::unlocked(st, || run_round(shared, &mut items, durable))
    };
    match result {
        Err(ref err) => shared.abort(st, err.clone()),
        Ok(()) if durable => {
            complete(shared, st, &items);
            st.sync_batch.note_round(started.elapsed());
        }
        Ok(()) => give_back(st, items),
    }
    st.round_busy = false;
    result
}

/// Waits until a round is due; returns whether it must make its transactions durable,
/// or `None` when the thread must exit.
fn wait_for_work(shared: &Shared, st: &mut MutexGuard<'_, State>) -> Option<bool> {
    loop {
        if st.aborted.is_some() {
            return None;
        }
        if st.round_busy {
            shared.flush_wake.wait(st);
            continue;
        }
        let issued: Vec<(Tid, bool)> = st
            .committing
            .iter()
            .take_while(|t| t.log_ticket.is_some())
            .map(|t| (t.tid, t.commit_issued))
            .collect();
        if let Some(&(first, _)) = issued.first() {
            // Single-I/O commit blocks are already out with their transactions: only a
            // flush can order what follows them, so an ordering asked for costs one.
            // Without a log likewise: its blocks went home as the commit, and nothing but a
            // flush orders what follows them.
            let ordering_is_durability = shared
                .log
                .as_ref()
                .is_none_or(|log| log.layout.single_io() && !shared.barrier_device);
            let durable = st.helpers_stop
                || st.durable_requested.is_some_and(|r| tid_geq(r, first))
                || (ordering_is_durability
                    && st.dispatch_requested.is_some_and(|r| tid_geq(r, first)));
            let ordering = issued
                .iter()
                .find(|(_, done)| !done)
                .is_some_and(|(tid, _)| st.dispatch_requested.is_some_and(|r| tid_geq(r, *tid)));
            if durable && !st.helpers_stop && waited_for_company(shared, st, first) {
                // Look again: more transactions may have been dispatched meanwhile.
                continue;
            }
            // An fsync on its own thread may have taken the round while the lock was let
            // go; it wakes this thread when it is done if work is left.
            if (durable || ordering) && !st.round_busy {
                return Some(durable);
            }
        } else if st.helpers_stop && st.committing.is_empty() {
            return None;
        }
        shared.flush_wake.wait(st);
    }
}

/// Before a durable round whose first transaction is `first`: waits, once per round, while
/// fsyncs under way are still coming to it (`SyncBatch::round_wait`): not yet waiting for
/// a full commit, or waiting for one the commit thread has not dispatched yet. Returns
/// whether it waited.
fn waited_for_company(shared: &Shared, st: &mut MutexGuard<'_, State>, first: Tid) -> bool {
    let under_way = |st: &mut MutexGuard<'_, State>| {
        MutexGuard::unlocked(st, || shared.fast_commits.fsyncs_under_way())
    };
    let now_under_way = under_way(st);
    let Some(wait) = st.sync_batch.round_wait(first, now_under_way) else {
        return false;
    };
    let deadline = Instant::now() + wait;
    loop {
        let undispatched =
            st.commit_requested.is_some() || st.committing.iter().any(|t| t.log_ticket.is_none());
        let others_coming = undispatched || under_way(st) > st.sync_batch.waiting();
        if !others_coming || shared.flush_wake.wait_until(st, deadline).timed_out() {
            return true;
        }
    }
}

/// Takes the tickets of every issued committing transaction, oldest first.
fn take_items(st: &mut State) -> Vec<Item> {
    let mut items = Vec::new();
    for t in st.committing.iter_mut() {
        let Some(ticket) = t.log_ticket.take() else {
            break;
        };
        items.push(Item {
            tid: t.tid,
            ticket,
            commit_issued: t.commit_issued,
            commit_position: t.commit_position,
            log_durable: t.log_durable,
            has_revokes: !t.revokes.is_empty(),
        });
    }
    items
}

/// Puts back the tickets of a round that only dispatched commit blocks.
fn give_back(st: &mut State, items: Vec<Item>) {
    for (t, item) in st.committing.iter_mut().zip(items) {
        debug_assert_eq!(t.tid, item.tid);
        t.log_ticket = Some(item.ticket);
        t.commit_issued = item.commit_issued;
    }
}

/// The IO of one round (outside the lock).
fn run_round(shared: &Shared, items: &mut [Item], durable: bool) -> Result<(), JournalError> {
    let barrier = shared.config.barrier;
    let mut fua = false;
    if items.iter().any(|i| !i.commit_issued) {
        fua = write_commit_blocks(shared, items, durable)?;
    }
    if !durable {
        return Ok(());
    }
    if shared.barrier_device {
        for item in items.iter() {
            if barrier {
                item.ticket.wait_durable()?;
            } else {
                item.ticket.wait_transferred()?;
            }
        }
        return Ok(());
    }
    for item in items.iter() {
        item.ticket.wait_transferred()?;
    }
    if !barrier || fua {
        return Ok(());
    }
    // The flush that makes this round durable also covers the logged blocks of later
    // transactions that transferred meanwhile: their rounds skip their first flush.
    let last = items.last().map(|i| i.tid);
    let carried = last.map_or_else(Vec::new, |tid| transferred_after(shared, tid));
    shared.io.flush()?;
    mark_log_durable(shared, &carried);
    Ok(())
}

/// On a device without a barrier write: a flush after the logged blocks transferred
/// (unless an earlier round's flush covered them), then the commit blocks. Returns
/// whether they went with FUA (one transaction, and none behind it that a final flush
/// could serve as well).
fn write_commit_blocks(
    shared: &Shared,
    items: &mut [Item],
    durable: bool,
) -> Result<bool, JournalError> {
    let barrier = shared.config.barrier;
    for item in items.iter().filter(|i| !i.commit_issued) {
        item.ticket.wait_transferred()?;
    }
    if barrier && items.iter().any(|i| !i.commit_issued && !i.log_durable) {
        shared.io.flush()?;
    }
    let fua = barrier
        && durable
        && items.len() == 1
        && items.last().is_some_and(|i| nothing_after(shared, i.tid));
    let mut last = None;
    for item in items.iter_mut().filter(|i| !i.commit_issued) {
        let mut flags = IoFlags::ORDERED;
        if fua {
            flags |= IoFlags::FUA;
        }
        let commit = shared
            .layout()
            .commit_block(item.tid, std::time::SystemTime::now(), None);
        let position = item
            .commit_position
            .expect("a commit block to write has its place in the log");
        let offset = shared.area().byte_offset(position);
        item.ticket = shared
            .io
            .issue(vec![WriteRequest::new(offset, commit, flags)]);
        item.commit_issued = true;
        last = Some(item.tid);
    }
    for item in items.iter() {
        item.ticket.wait_dispatched()?;
    }
    if let Some(tid) = last {
        let mut st = shared.state.lock();
        shared.publish_dispatched(&mut st, tid);
    }
    Ok(fua)
}

/// Committing transactions after `tid` whose logged blocks (only) have transferred.
fn transferred_after(shared: &Shared, tid: Tid) -> Vec<Tid> {
    let st = shared.state.lock();
    st.committing
        .iter()
        .filter(|t| tid_gt(t.tid, tid) && !t.commit_issued && !t.log_durable)
        .filter(|t| t.log_ticket.as_ref().is_some_and(|k| k.is_transferred()))
        .map(|t| t.tid)
        .collect()
}

/// No transaction after `tid` is committing.
fn nothing_after(shared: &Shared, tid: Tid) -> bool {
    let st = shared.state.lock();
    st.committing.iter().all(|t| !tid_gt(t.tid, tid))
}

/// A completed flush covered the logged blocks of `tids`.
fn mark_log_durable(shared: &Shared, tids: &[Tid]) {
    if tids.is_empty() {
        return;
    }
    let mut st = shared.state.lock();
    for t in st.committing.iter_mut() {
        if tids.contains(&t.tid) {
            t.log_durable = true;
        }
    }
}

/// The round's transactions are durable: they leave the committing list for the
/// checkpoint list, in order, and the durable tid is published.
fn complete(shared: &Shared, st: &mut MutexGuard<'_, State>, items: &[Item]) {
    let Some(last) = items.last() else {
        return;
    };
    let revokes = items.iter().any(|i| i.has_revokes);
    // `checkpoint_io` comes before the state lock.
    let _io = revokes.then(|| MutexGuard::unlocked(st, || shared.checkpoint_io.lock()));
    for item in items {
        let t = st
            .committing
            .pop_front()
            .expect("a durable transaction was on the committing list");
        assert_eq!(t.tid, item.tid, "transactions become durable in tid order");
        for block in &t.revokes {
            st.checkpoint.blocks.remove(block);
        }
        st.stats.commits += 1;
        match shared.log {
            Some(_) => st.stats.blocks_logged += t.blocks.len() as u64,
            None => st.stats.blocks_written_home += t.blocks.len() as u64,
        }
        st.stats.blocks_as_records += t.records;
        st.stats.records_on_home += t.records_on_home;
        st.stats.record_bytes += t.record_bytes;
        st.stats.log_bytes += u64::from(t.log_blocks) * u64::from(shared.block_size);
        st.stats.revokes_logged += t.revokes.len() as u64;
        if shared.log.is_some() {
            for (block, data) in t.blocks {
                st.checkpoint.blocks.insert(block, (t.tid, data));
            }
        }
    }
    st.stats.durability_rounds += 1;
    shared.publish_dispatched(st, last.tid);
    shared.publish_committed(st, last.tid);
    if shared.log_wants_checkpoint(st) || st.checkpoint_requested {
        shared.checkpoint_wake.notify_one();
    }
}
