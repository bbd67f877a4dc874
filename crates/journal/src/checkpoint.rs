//! The checkpoint, off the commit path: writes the newest durable version of every logged
//! block home, flushes, and moves the log tail in the journal superblock so the space can
//! be reused.
//!
//! The checkpoint thread runs it in the background when the log is half used, or when
//! someone asks (a writer that found the log full, the commit thread that found no room,
//! [`crate::Journal::checkpoint`]). When the log holds only transactions that are not yet
//! durable, it asks the flush thread for durability first.
//!
//! Promises: only durable versions go home (the checkpoint list holds nothing else), the
//! newest of each; the tail moves only past durable transactions and only after their
//! blocks are durable at home; the log space is reused only after the superblock that
//! frees it is durable (the commit thread sees the new tail only then). Never writes a
//! block home that a durable revoke freed: the revoke's publication waits for the
//! checkpoint's writes (`Shared::checkpoint_io`).

use crate::journal::Shared;
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::JournalError;
use jext_io::{IoFlags, WriteRequest};
use parking_lot::MutexGuard;
use std::sync::Arc;

pub(crate) fn checkpoint_thread(shared: Arc<Shared>) {
    let mut st = shared.state.lock();
    loop {
        if st.aborted.is_some() || st.helpers_stop {
            return;
        }
        if st.checkpoint_requested || shared.log_wants_checkpoint(&st) {
            let durable_in_log = st
                .in_log
                .front()
                .is_some_and(|(tid, _)| tid_geq(st.committed, *tid));
            if durable_in_log || !st.checkpoint.blocks.is_empty() {
                st.checkpoint_requested = false;
                // An error aborts the journal inside; the loop then ends.
                let _ = MutexGuard::unlocked(&mut st, || checkpoint(&shared));
                shared.changed.notify_all();
                continue;
            }
            if let Some(newest) = st.in_log.back().map(|(tid, _)| *tid) {
                // Only committing transactions fill the log: they must become durable
                // before anything can go home. Not one still waiting for room (on the
                // committing list, not in the log): its durability frees nothing, and
                // only an ordering may have been asked of it.
                if st.durable_requested.is_none_or(|r| tid_gt(newest, r)) {
                    st.durable_requested = Some(newest);
                }
                shared.flush_wake.notify_one();
            } else {
                // Nothing in the log at all.
                st.checkpoint_requested = false;
                shared.changed.notify_all();
            }
        }
        shared.checkpoint_wake.wait(&mut st);
    }
}

/// Writes every durable block home and moves the tail past every durable transaction.
/// Runs on the checkpoint thread, or after the threads stopped.
pub(crate) fn checkpoint(shared: &Shared) -> Result<(), JournalError> {
    let _io = shared.checkpoint_io.lock();
    let (mut writes, upto, new_tail, new_tail_tid) = {
        let st = shared.state.lock();
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        let upto = st.committed;
        let durable_in_log = st.in_log.front().is_some_and(|(t, _)| tid_geq(upto, *t));
        if !durable_in_log && st.checkpoint.blocks.is_empty() {
            return Ok(());
        }
        let writes: Vec<(u64, Arc<[u8]>)> = st
            .checkpoint
            .blocks
            .iter()
            .map(|(block, (tid, data))| {
                assert!(
                    tid_geq(upto, *tid),
                    "only durable versions are checkpointed"
                );
                (*block, data.clone())
            })
            .collect();
        // The oldest transaction that stays in the log, or the one the commit thread
        // will write at the head next (transactions are logged in tid order).
        let (tail, tail_tid): (u32, Tid) = st
            .in_log
            .iter()
            .find(|(t, _)| tid_gt(*t, upto))
            .map_or((st.log.head, upto.wrapping_add(1)), |&(t, start)| {
                (start, t)
            });
        (writes, upto, tail, tail_tid)
    };
    writes.sort_unstable_by_key(|(block, _)| *block);
    let block_size = u64::from(shared.block_size);
    let count = writes.len() as u64;
    let requests = writes
        .into_iter()
        .map(|(block, data)| WriteRequest::new(block * block_size, data, IoFlags::empty()))
        .collect();
    let result = (|| {
        shared.io.submit(requests).wait()?;
        if shared.config.barrier {
            shared.io.flush()?;
        }
        let sb = shared.layout().superblock_block(new_tail, new_tail_tid);
        write_superblock(shared, sb)
    })();
    let mut st = shared.state.lock();
    if let Err(err) = result {
        shared.abort(&mut st, err.clone());
        return Err(err);
    }
    // Newer durable versions that arrived meanwhile stay for the next checkpoint.
    st.checkpoint
        .blocks
        .retain(|_, (tid, _)| tid_gt(*tid, upto));
    while st.in_log.front().is_some_and(|(t, _)| tid_geq(upto, *t)) {
        st.in_log.pop_front();
    }
    st.log.tail = new_tail;
    st.stats.checkpoints += 1;
    st.stats.blocks_checkpointed += count;
    Ok(())
}

pub(crate) fn write_superblock(shared: &Shared, block: Arc<[u8]>) -> Result<(), JournalError> {
    let mut flags = IoFlags::ORDERED;
    if shared.config.barrier {
        flags |= IoFlags::FUA;
    }
    shared
        .io
        .write(shared.area().byte_offset(0), block, flags)?;
    Ok(())
}
