//! A journal without a log: ext4's no-journal mode (`mkfs.ext4 -O ^has_journal`) as a mode
//! of the commit pipeline.
//!
//! The seam: everything above the commit stays as it is. Handles, the running
//! transaction, its lock-down and frozen snapshot, tids, `commit_and_wait` (fsync) and
//! `commit_and_wait_dispatched` (fbarrier) work as with a log, so the file system's `Tx`,
//! its fsync waiting on a tid and its pending frees (a freed block is reused only once the
//! freeing transaction is durable) do not know the difference. Only the step that sends a
//! transaction to the disk changes: where the commit thread would reserve log blocks and
//! write revoke, descriptor, logged and commit blocks, [`dispatch`] writes the snapshot's
//! blocks to their home locations, orderless, and the flush thread's round waits until they
//! transferred and flushes once (`crate::flush`); the transaction is then published
//! durable and leaves the committing list, holding nothing for a checkpoint. So a commit
//! is the metadata written in place and one flush, as ext4's fsync without a journal
//! writes the inode and its buffers and flushes (`ext4_fsync_nojournal`).
//!
//! There is no descriptor, no commit block, no revoke (`Handle::revoke` records none:
//! nothing replays), no checkpoint and no recovery; fast commits, single-I/O commits and
//! byte records have no log to go to. A reader that misses in the cache while a commit's
//! home writes are in flight gets the committing copy (`Journal::committed_copy`), and a
//! commit leaves the committing list only once its writes transferred.
//!
//! Promises: what a durable commit wrote is at home and flushed, and writes of one block by
//! successive commits reach the device in commit order (the IO layer keeps the order of
//! writes to the same bytes). Nothing else: a crash in the middle of a commit may leave any
//! subset of its blocks at home, which only `e2fsck` repairs — the promise of ext4
//! without a journal, what the device gives. Must never be used on a file system that has
//! a journal (its log would be left behind, stale, for the next recovery to replay).

use crate::journal::{Shared, State};
use crate::tid::Tid;
use crate::JournalError;
use jext_io::{IoFlags, WriteRequest};
use parking_lot::MutexGuard;
use std::sync::Arc;

/// The largest transaction, in blocks, when the caller does not say: what a journal of
/// 128 MiB in 4 KiB blocks (mkfs.ext4's for a file system of 32 to 64 GiB) allows, a
/// quarter of it. Without a log it only bounds the memory a transaction pins.
pub(crate) const TRANSACTION_BLOCKS: u32 = 8192;

/// Sends transaction `tid`, the newest on the committing list, home: each of its `blocks`
/// to its own location. Returns with the writes issued; the flush thread makes them
/// durable.
pub(crate) fn dispatch(
    shared: &Shared,
    st: &mut MutexGuard<'_, State>,
    tid: Tid,
    blocks: Vec<(u64, Arc<[u8]>)>,
) -> Result<(), JournalError> {
    debug_assert_eq!(st.committing.back().map(|t| t.tid), Some(tid));
    let block_size = u64::from(shared.block_size);
    let requests = blocks
        .into_iter()
        .map(|(block, data)| WriteRequest::new(block * block_size, data, IoFlags::empty()))
        .collect();
    let ticket = MutexGuard::unlocked(st, || shared.io.submit(requests));
    let committing = st.committing.len() as u64;
    st.stats.max_committing = st.stats.max_committing.max(committing);
    // Nothing more to write: the flush thread's round only waits and flushes.
    crate::commit::hand_to_flush(shared, st, tid, ticket, true);
    Ok(())
}
