//! The commit thread (JBD2's kjournald2, BarrierFS's control plane): closes the running
//! transaction and dispatches it, then goes on to the next without waiting for durability.
//!
//! A commit is due when someone asked for it (fsync, fbarrier, a full transaction), when
//! the running transaction is `commit_interval_ms` old, or at shutdown. Committing is:
//!
//! 1. **lock down**: no new handle joins; wait for open handles to stop; take the frozen
//!    snapshot (an `Arc` per block: a later change copies) and, in the same step under
//!    the lock, move the transaction from running to the committing list (JBD2's
//!    T_LOCKED, then T_FLUSH). The next transaction may start from then on, and a revoke
//!    in it must see every block this one logs, whatever stage 2 waits for.
//! 2. **reserve** the transaction's log blocks at the head (waiting for the checkpoint
//!    if the log has no room: only this thread and writers ever wait for room; writers
//!    reserve room when they start, but revoke records are not counted there, so a
//!    transaction that revokes many blocks can outgrow it).
//! 3. **dispatch** revoke, descriptor and logged blocks as one epoch. On a device with a
//!    barrier write the last of them is a barrier write and the commit block follows at
//!    once as another (the paper's JD and JC, back to back); the commit thread waits only
//!    until they are dispatched and publishes the dispatched tid. On any other device,
//!    with single-I/O commits (`crate::log::CommitMode`) the commit block goes in the same
//!    batch, one sequential write, and the flush thread's one flush makes it durable;
//!    with classic commits it is left to the flush thread, which writes it after a flush.
//!
//! With byte records on (`crate::log::RecordMode::Bytes`), stage 2 first decides, per
//! logged block, whether it goes whole or as a byte record (`crate::format::records`):
//! a DELTA on the block's *base*, or ZEROED, whichever is smaller, when it takes at most
//! half a block. The base is what recovery will have rebuilt of the block just before
//! this transaction:
//!
//! - the version the newest transaction still in the log (committing, or durable and
//!   not yet checkpointed) logged of it — in memory, whole, in its frozen copy. Once that
//!   transaction is checkpointed the home block holds that same version, so the base is
//!   right whether recovery replays it or not;
//! - for a block the log holds nothing of, its *home contents*: the bytes its buffer
//!   held when this transaction first changed it, if they are what recovery rebuilds
//!   (`JBuf::base_known`: read from home after recovery, or the bytes of a transaction
//!   that logged them, since checkpointed — the checkpoint flushes its home writes
//!   before it lets go of their versions). Recovery applies such a DELTA on the home
//!   block as it finds it (`crate::recovery`). Only with flushes (`barrier`): without,
//!   nothing says the home block holds what the checkpoint wrote.
//!
//! Why a DELTA is right on a home block the checkpoint tore, or on one rewritten by a
//! replay cut short: the home block can only hold, sector by sector, versions of the
//! chain the log still rebuilds (home contents H, then V1, V2, … each logged by a
//! transaction still in the log), since nothing else writes a logged block home (data
//! written in place belongs to files whose blocks the journal does not log: a block goes
//! from one to the other only through a revoke, after which the log holds no base for
//! it, or through a journal-mode switch, which flushes). Each record carries every byte
//! in which its version differs from the one before, so the bytes no record carries are
//! the same in every version of the chain, and applying the records in tid order sets
//! every other byte to its newest value: the result is the newest version, whatever mix
//! of versions the home block held. A delta applied twice gives the same. A block newly
//! allocated (zeroed in memory, garbage at home) or whose version a revoke since
//! cancelled has no base: it goes ZEROED or whole. Records apply to every logged block,
//! metadata and journaled data alike: metadata alone (data=ordered) halves the log bytes
//! of an append + fbarrier (12.0 against 24.0 KiB on the loop device,
//! bench/results/2026-11-25-byte-records), so limiting them to journaled data would give
//! that up.
//!
//! A journal without a log (`crate::home`) dispatches at stage 2 instead: the snapshot's
//! blocks to their home locations, nothing else.
//!
//! Promises: transactions are dispatched in tid order, each into log blocks reserved for
//! it alone; a transaction's commit block is never issued here before its logged blocks,
//! and never here at all on a device that cannot keep a barrier, except in the same
//! write as them (single I/O, which recovery's every-block check makes atomic). Never
//! waits for a flush.

use crate::format::records::{plan_record, RecordKind};
use crate::format::superblock::{INCOMPAT_JEXT_RECORDS, INCOMPAT_JEXT_SINGLE_IO};
use crate::journal::{CommittingTransaction, InLog, Shared, State};
use crate::log::LogPlan;
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::JournalError;
use jext_io::{Fence, IoFlags, IoTicket, WriteRequest};
use parking_lot::MutexGuard;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub(crate) fn commit_thread(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.commit_interval_ms);
    let mut st = shared.state.lock();
    loop {
        if st.aborted.is_some() {
            return;
        }
        if commit_due(&st, interval) {
            if st.commit_busy {
                // An fsync commits on its own thread (`crate::inline_commit`); it wakes
                // this thread when it is done if a commit is still due.
                shared.commit_wake.wait_for(&mut st, interval);
                continue;
            }
            st.commit_busy = true;
            commit_running(&shared, &mut st);
            st.commit_busy = false;
            continue;
        }
        if st.shutting_down {
            return;
        }
        let wait = st.running.as_ref().map_or(interval, |t| {
            interval.saturating_sub(t.started_at.elapsed())
        });
        shared
            .commit_wake
            .wait_for(&mut st, wait.max(Duration::from_millis(1)));
        st.stats.commit_thread_wakeups += 1;
    }
}

/// Whether the running transaction is due for its commit: asked for, `interval` old, or
/// the journal shuts down.
pub(crate) fn commit_due(st: &State, interval: Duration) -> bool {
    st.running.as_ref().is_some_and(|t| {
        st.shutting_down
            || st.commit_requested.is_some_and(|r| tid_geq(r, t.tid))
            || t.started_at.elapsed() >= interval
    })
}

/// Commits the running transaction; returns with the lock held. Only one thread at a time,
/// the one that set `State::commit_busy`.
pub(crate) fn commit_running(shared: &Shared, st: &mut MutexGuard<'_, State>) {
    debug_assert!(st.commit_busy, "one committer at a time");
    let t = st
        .running
        .as_mut()
        .expect("commit_running needs a running transaction");
    t.locked = true;
    while st.running.as_ref().is_some_and(|t| t.updates > 0) {
        shared.commit_wake.wait(st);
    }
    let t = st
        .running
        .take()
        .expect("only the commit thread takes the running transaction");
    let tid = t.tid;
    // A writer waiting for the lock-down may start the next transaction now.
    shared.changed.notify_all();
    if t.is_empty() {
        // Nothing to log. The tid is handed out again, because recovery reads the log as
        // a run of consecutive tids and stops at a gap.
        st.next_tid = tid;
        if st.commit_requested.is_some_and(|r| tid_geq(tid, r)) {
            st.commit_requested = None;
        }
        return;
    }
    // Whoever asked, or the timer, or the size: a commit is made durable unless only
    // an ordering (fbarrier) asked for it; the flush thread decides from this.
    let only_ordering = st.commit_requested.is_some_and(|r| tid_geq(r, tid))
        && st.durable_requested.is_none_or(|r| !tid_geq(r, tid))
        && !st.shutting_down;
    if !only_ordering && st.durable_requested.is_none_or(|r| !tid_geq(r, tid)) {
        st.durable_requested = Some(tid);
    }
    let blocks: Vec<(u64, Arc<[u8]>)> = t
        .buffers
        .values()
        .map(|buf| {
            buf.set_running_tid(None);
            // These bytes go to the log: recovery rebuilds them from now on.
            buf.set_base_known(true);
            (buf.block(), buf.bytes())
        })
        .collect();
    let revokes: Vec<u64> = t.revokes.into_iter().collect();
    // On the committing list before the lock is first let go (JBD2's T_FLUSH): the next
    // transaction may start as soon as it is, and a revoke in it must see these blocks
    // (`Handle::revoke`), or recovery would replay them over a new owner of the block.
    st.committing.push_back(CommittingTransaction::new(
        tid,
        blocks.clone(),
        revokes.clone(),
    ));
    let dispatched = match shared.log {
        Some(_) => {
            let closed = Closed {
                blocks,
                revokes,
                home_bases: t.home_bases,
            };
            reserve_and_dispatch(shared, st, tid, closed, t.ordered_data)
        }
        None => crate::home::dispatch(shared, st, tid, blocks),
    };
    if let Err(err) = dispatched {
        shared.abort(st, err);
    }
    if st.commit_requested.is_some_and(|r| tid_geq(tid, r)) {
        st.commit_requested = None;
    }
}

/// What a transaction leaving running gives the commit path: its frozen snapshot, its
/// revokes, and the home bases it took (`RunningTransaction::home_bases`).
struct Closed {
    blocks: Vec<(u64, Arc<[u8]>)>,
    revokes: Vec<u64>,
    home_bases: HashMap<u64, Arc<[u8]>>,
}

/// What the log holds of a block, as recovery will have it just before a transaction.
enum InLogVersion {
    /// The version the newest transaction still in the log logged.
    Logged(Arc<[u8]>),
    /// A revoke since the newest version cancels it: recovery leaves the home block as it
    /// is then, which nothing here knows.
    Revoked,
    /// Nothing: recovery starts from the home block.
    Nothing,
}

/// Recovery's state of `block` just before transaction `tid`, as far as the log decides
/// it (module comment): the version the newest transaction before `tid` still in the log
/// logged, unless a revoke since then cancels it.
fn logged_version(st: &State, tid: Tid, block: u64) -> InLogVersion {
    for t in st.committing.iter().rev().filter(|t| tid_gt(tid, t.tid)) {
        if let Some(&i) = t.block_index.get(&block) {
            return InLogVersion::Logged(t.blocks[i].1.clone());
        }
        // Sorted: they come from a BTreeSet.
        if t.revokes.binary_search(&block).is_ok() {
            return InLogVersion::Revoked;
        }
    }
    match st.checkpoint.blocks.get(&block) {
        Some((_, data)) => InLogVersion::Logged(data.clone()),
        None => InLogVersion::Nothing,
    }
}

/// Which blocks go whole and which as byte records (module comment) for transaction
/// `tid`. The bases are taken under the lock; the comparing is done without it, which
/// no revoke can miss: `tid` is on the committing list already. A block the log holds
/// nothing of takes its home contents as the base when the transaction kept them
/// (`home_bases`); the home bases are dropped once planned. Also returns how many
/// records rest on home contents.
fn plan_log(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    blocks: &[(u64, Arc<[u8]>)],
    mut home_bases: HashMap<u64, Arc<[u8]>>,
) -> (LogPlan, u64) {
    let layout = shared.layout();
    let mut plan = LogPlan::default();
    if !layout.records() {
        plan.full = blocks.to_vec();
        return (plan, 0);
    }
    let bases: Vec<(Option<Arc<[u8]>>, bool)> = blocks
        .iter()
        .map(|(block, _)| match logged_version(st, tid, *block) {
            InLogVersion::Logged(data) => (Some(data), false),
            InLogVersion::Revoked => (None, false),
            InLogVersion::Nothing => {
                let home = home_bases.remove(block);
                let on_home = home.is_some();
                (home, on_home)
            }
        })
        .collect();
    drop(home_bases);
    let limit = layout.record_limit();
    let mut on_home_records = 0;
    MutexGuard::unlocked(st, || {
        for ((block, data), (base, on_home)) in blocks.iter().zip(bases) {
            match plan_record(*block, base.as_deref(), data, limit) {
                Some(record) => {
                    on_home_records += u64::from(on_home && record.kind == RecordKind::Delta);
                    plan.records.push(record);
                }
                None => plan.full.push((*block, data.clone())),
            }
        }
    });
    (plan, on_home_records)
}

/// Before the first transaction since the log was last empty that needs a live-log bit
/// (`bits`: a single-I/O commit, byte records), the bit must be on disk before the
/// transaction could count, or Linux would replay a torn one or stop its scan at a
/// records block. A log the superblock calls empty gets it with the superblock that goes
/// out in the same batch as the transaction (its first sector: either both reach the disk
/// or the log still says empty). A live log gets a superblock rewrite with FUA first,
/// serialized with the checkpoint's own superblock writes; later superblocks keep it.
fn announce_live_bits(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    bits: u32,
) -> Result<(), JournalError> {
    shared.layout().set_live_bits(bits);
    if st.superblock_says_empty {
        return Ok(());
    }
    MutexGuard::unlocked(st, || {
        // The checkpoint takes `checkpoint_io` before the state lock, so this does too.
        let _io = shared.checkpoint_io.lock();
        let (tail, tail_tid) = {
            let st = shared.state.lock();
            let oldest = st.in_log.front().map_or(tid, |t| t.tid);
            (st.log.tail, oldest)
        };
        let sb = shared.layout().superblock_block(tail, tail_tid);
        crate::checkpoint::write_superblock(shared, sb)
    })
}

/// Stages 2 and 3 for transaction `tid`, the newest on the committing list (`closed` is
/// its own). Returns with its IO issued; on an error before that, takes it off the list
/// again (it never reached the log).
fn reserve_and_dispatch(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    closed: Closed,
    ordered_data: bool,
) -> Result<(), JournalError> {
    debug_assert_eq!(st.committing.back().map(|t| t.tid), Some(tid));
    let layout = shared.layout();
    let Closed {
        blocks,
        revokes,
        home_bases,
    } = closed;
    let (plan, records_on_home) = plan_log(shared, st, tid, &blocks, home_bases);
    st.committing
        .back_mut()
        .expect("the transaction being planned is the newest committing")
        .records_on_home = records_on_home;
    // Single I/O: the commit block joins the logged blocks in the same batch, which the
    // IO layer merges into one write per contiguous range (split where the log wraps);
    // the flush thread's one flush makes the whole transaction durable. Recovery counts
    // it only if every block checks. Not when data was written in place for it: that
    // data must be durable before the commit block (a flush between them), or a crash
    // could keep the commit and lose the data, showing stale blocks (why Linux refuses
    // journal_async_commit with data=ordered).
    let single_io = !shared.barrier_device && layout.single_io() && !ordered_data;
    // A small one goes as a compact commit: its metadata in one block before its copies.
    let compact = single_io && layout.compact_fits(&plan, revokes.len());
    let needed = layout.plan_blocks_needed(&plan, revokes.len(), compact);
    if let Err(err) = make_room(shared, st, tid, needed, single_io, !plan.records.is_empty()) {
        st.committing.pop_back();
        return Err(err);
    }
    let shape = match (single_io, compact) {
        (true, true) => CommitShape::Compact,
        (true, false) => CommitShape::SingleIo,
        (false, _) => CommitShape::Classic,
    };
    dispatch(shared, st, tid, plan, needed, &revokes, shape)
}

/// How a transaction's commit goes to the log.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CommitShape {
    /// Its blocks now; the commit block later, from the flush thread (after a flush), or
    /// at once as a barrier write on a barrier device.
    Classic,
    /// Its blocks and its commit block in one write.
    SingleIo,
    /// One compact commit block, then its copies, in one write.
    Compact,
}

/// Waits until the log has room for `needed` blocks, then makes sure the live-log bits
/// the transaction needs are on disk. The state lock is let go in both (the committing
/// list shows the transaction meanwhile).
fn make_room(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    needed: u32,
    single_io: bool,
    records: bool,
) -> Result<(), JournalError> {
    let layout = shared.layout();
    let capacity = layout.last - layout.first - 1;
    if needed > capacity {
        return Err(JournalError::TransactionTooLarge {
            tid,
            log_blocks: needed,
        });
    }
    if shared.log_free(st) < needed {
        st.stats.commit_room_waits += 1;
    }
    while shared.log_free(st) < needed {
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        st.checkpoint_requested = true;
        st.commit_waits_for_room = true;
        shared.checkpoint_wake.notify_one();
        shared.changed.wait(st);
    }
    st.commit_waits_for_room = false;
    let mut bits = 0;
    if single_io {
        bits |= INCOMPAT_JEXT_SINGLE_IO;
    }
    if records {
        bits |= INCOMPAT_JEXT_RECORDS;
    }
    if bits & !layout.live_bits() != 0 {
        announce_live_bits(shared, st, tid, bits)?;
    }
    // The lock may have been let go (planning, room, announcing): nothing commits after
    // an abort.
    match &st.aborted {
        Some(err) => Err(err.clone()),
        None => Ok(()),
    }
}

/// Stage 3: reserves the transaction's log blocks at the head (the room is there) and
/// issues them.
fn dispatch(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    plan: LogPlan,
    needed: u32,
    revokes: &[u64],
    shape: CommitShape,
) -> Result<(), JournalError> {
    let layout = shared.layout();
    let single_io = shape != CommitShape::Classic;
    let barrier_device = shared.barrier_device;
    let start = st.log.head;
    let mut requests = Vec::with_capacity(needed as usize + 1);
    if st.superblock_says_empty {
        // Recovery starts at the superblock's tail; it must name this transaction before
        // the commit block can count. It goes in the same epoch as the logged blocks.
        debug_assert!(st.in_log.is_empty());
        let sb = layout.superblock_block(start, tid);
        requests.push(WriteRequest::new(
            shared.area().byte_offset(0),
            sb,
            IoFlags::ORDERED,
        ));
        st.superblock_says_empty = false;
        st.log.tail = start;
    }
    // Every transaction up to `committed` was flushed before this write is issued: a
    // single-I/O commit says so, and recovery may then take one of them that does not
    // check for damage, not a tear.
    let now = std::time::SystemTime::now();
    let log_blocks = match shape {
        CommitShape::Compact => layout.build_compact(tid, &plan, now, st.committed),
        _ => layout.build_log_blocks(tid, &plan, revokes),
    };
    let mut position = start;
    for block in log_blocks {
        requests.push(WriteRequest::new(
            shared.area().byte_offset(position),
            block,
            IoFlags::ORDERED,
        ));
        position = layout.next(position);
    }
    // A compact commit block is the transaction's first; any other follows its blocks.
    let commit_position = match shape {
        CommitShape::Compact => start,
        _ => position,
    };
    st.log.head = match shape {
        CommitShape::Compact => position,
        _ => layout.next(position),
    };
    debug_assert_eq!(
        (st.log.head + layout.last - layout.first - start) % (layout.last - layout.first),
        needed % (layout.last - layout.first),
        "transaction {tid} took other than the {needed} log blocks it reserved"
    );
    let entry = st
        .committing
        .back_mut()
        .expect("the transaction being dispatched is the newest committing");
    let blocks = entry.blocks.iter().map(|(block, _)| *block).collect();
    entry.records = plan.records.len() as u64;
    entry.record_bytes = plan.records.iter().map(|r| r.encoded_len() as u64).sum();
    entry.log_blocks = needed;
    entry.commit_position = Some(commit_position);
    st.in_log.push_back(InLog { tid, start, blocks });
    let committing = st.committing.len() as u64;
    st.stats.max_committing = st.stats.max_committing.max(committing);
    if single_io {
        st.stats.single_io_commits += 1;
    }
    if shape == CommitShape::Compact {
        st.stats.compact_commits += 1;
    } else if single_io {
        let commit = layout.commit_block(tid, now, Some(st.committed));
        requests.push(WriteRequest::new(
            shared.area().byte_offset(commit_position),
            commit,
            IoFlags::ORDERED,
        ));
    }
    if barrier_device {
        // The paper's JD and JC: two barrier writes, back to back. The device keeps the
        // epochs, so the commit block cannot persist before the logged blocks.
        let last = requests.last_mut().expect("a transaction logs something");
        last.flags |= IoFlags::BARRIER;
        last.fence = Fence::Caller;
        let commit = layout.commit_block(tid, std::time::SystemTime::now(), None);
        requests.push(WriteRequest::barrier(
            shared.area().byte_offset(commit_position),
            commit,
            IoFlags::empty(),
            Fence::Caller,
        ));
    }
    let ticket = MutexGuard::unlocked(st, || {
        let ticket = shared.io.issue(requests);
        // Wait-on-Dispatch, never on transfer.
        let dispatched = if barrier_device {
            ticket.wait_dispatched()
        } else {
            Ok(())
        };
        (ticket, dispatched)
    });
    let (ticket, dispatched) = ticket;
    hand_to_flush(shared, st, tid, ticket, barrier_device || single_io);
    dispatched?;
    if barrier_device {
        shared.publish_dispatched(st, tid);
    }
    Ok(())
}

/// Gives the flush thread committing transaction `tid`'s `ticket` and wakes it;
/// `commit_issued`: its commit block (if it has one) went out with it.
pub(crate) fn hand_to_flush(
    shared: &Shared,
    st: &mut State,
    tid: Tid,
    ticket: IoTicket,
    commit_issued: bool,
) {
    let entry = st
        .committing
        .iter_mut()
        .find(|t| t.tid == tid)
        .expect("only the flush thread removes committing transactions, once issued");
    entry.log_ticket = Some(ticket);
    entry.commit_issued = commit_issued;
    // A round under way (the flush thread's, or an fsync's on its own thread) looks at
    // the committing list again when it ends: a wake-up now would find nothing to do.
    if !st.round_busy {
        shared.flush_wake.notify_one();
    }
}
