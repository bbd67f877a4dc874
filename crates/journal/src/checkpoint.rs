//! The checkpoint, off the commit path: writes the newest durable version of every logged
//! block home, flushes, and moves the log tail in the journal superblock so the space can
//! be reused.
//!
//! The checkpoint thread runs it in the background once a quarter of the log is in use
//! (JBD2 checkpoints only when a handle finds the log full, on that handle's path; here
//! nobody's path), or when someone asks (a writer that found no room, the commit thread
//! that found none, [`crate::Journal::checkpoint`]). It goes a chunk at a time, the oldest
//! durable transactions first, about an eighth of the log each: each chunk's home writes,
//! its flush and its superblock free that much log at once, instead of the whole log
//! waiting for one checkpoint of everything. Its home writes are `IoFlags::BACKGROUND`
//! (they yield to commits and fsyncs, metered into the device a little at a time), except
//! while the commit thread itself waits for room. When the log holds only transactions
//! that are not yet durable, it asks the flush thread for durability first.
//!
//! Promises: only durable versions go home (the checkpoint list holds nothing else), the
//! newest of each; the tail moves only past durable transactions, and only after the
//! blocks they logged are durable at home (in their version or a newer durable one); the
//! log space is reused only after the superblock that frees it is durable (the commit
//! thread sees the new tail only then). Never writes a block home that a durable revoke
//! freed: the revoke's publication waits for the checkpoint's writes
//! (`Shared::checkpoint_io`), and takes the block off the checkpoint list.

use crate::journal::{InLog, Shared};
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::JournalError;
use jext_io::{IoFlags, WriteRequest};
use parking_lot::MutexGuard;
use std::collections::HashSet;
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
                .is_some_and(|t| tid_geq(st.committed, t.tid));
            if durable_in_log {
                st.checkpoint_requested = false;
                let chunk = shared.checkpoint_chunk_blocks();
                // An error aborts the journal inside; the loop then ends.
                let _ = MutexGuard::unlocked(&mut st, || checkpoint_chunk(&shared, chunk));
                shared.changed.notify_all();
                continue;
            }
            if let Some(newest) = st.in_log.back().map(|t| t.tid) {
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

/// Checkpoints every durable transaction in the log, a chunk at a time. Runs after the
/// threads stopped (shutdown).
pub(crate) fn checkpoint(shared: &Shared) -> Result<(), JournalError> {
    while checkpoint_chunk(shared, usize::MAX)? {}
    Ok(())
}

/// One chunk: the oldest durable transactions in the log, as many as log at most
/// `chunk_blocks` blocks between them (at least one). Writes home the newest durable
/// version of every block they logged, flushes, and moves the tail past them. Returns
/// whether there was anything to do.
pub(crate) fn checkpoint_chunk(shared: &Shared, chunk_blocks: usize) -> Result<bool, JournalError> {
    let _io = shared.checkpoint_io.lock();
    let (mut writes, last, new_tail, new_tail_tid, background) = {
        let st = shared.state.lock();
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        let durable = st.committed;
        let mut chunk: Vec<&InLog> = Vec::new();
        let mut logged = 0;
        for t in st.in_log.iter().take_while(|t| tid_geq(durable, t.tid)) {
            if !chunk.is_empty() && logged + t.blocks.len() > chunk_blocks {
                break;
            }
            logged += t.blocks.len();
            chunk.push(t);
        }
        let Some(last) = chunk.last().map(|t| t.tid) else {
            return Ok(false);
        };
        // A block revoked since, or already written home in a newer version by an earlier
        // chunk, is off the list: nothing of it needs to go home.
        let blocks: HashSet<u64> = chunk
            .iter()
            .flat_map(|t| t.blocks.iter().copied())
            .collect();
        let writes: Vec<(u64, Tid, Arc<[u8]>)> = blocks
            .into_iter()
            .filter_map(|block| {
                let (tid, data) = st.checkpoint.blocks.get(&block)?;
                assert!(
                    tid_geq(durable, *tid),
                    "only durable versions are checkpointed"
                );
                Some((block, *tid, data.clone()))
            })
            .collect();
        // The oldest transaction that stays in the log, or the one the commit thread
        // will write at the head next (transactions are logged in tid order).
        let (tail, tail_tid) = st
            .in_log
            .get(chunk.len())
            .map_or((st.log.head, last.wrapping_add(1)), |t| (t.start, t.tid));
        (writes, last, tail, tail_tid, !st.commit_waits_for_room)
    };
    writes.sort_unstable_by_key(|(block, _, _)| *block);
    let block_size = u64::from(shared.block_size);
    let count = writes.len() as u64;
    let flags = if background {
        IoFlags::BACKGROUND
    } else {
        IoFlags::empty()
    };
    let requests = writes
        .iter()
        .map(|(block, _, data)| WriteRequest::new(block * block_size, data.clone(), flags))
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
    // A newer durable version that arrived meanwhile stays for its own transaction's chunk.
    for (block, tid, _) in &writes {
        if st
            .checkpoint
            .blocks
            .get(block)
            .is_some_and(|(t, _)| t == tid)
        {
            st.checkpoint.blocks.remove(block);
        }
    }
    while st.in_log.front().is_some_and(|t| tid_geq(last, t.tid)) {
        st.in_log.pop_front();
    }
    st.log.tail = new_tail;
    st.stats.checkpoints += 1;
    st.stats.blocks_checkpointed += count;
    Ok(true)
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
