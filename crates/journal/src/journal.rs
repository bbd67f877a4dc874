//! The running journal: handles, transactions, the commit thread and the checkpoint.
//!
//! A change to metadata happens inside a [`Handle`], which belongs to the *running*
//! transaction. The commit thread (JBD2's kjournald2) closes the running transaction when
//! it is old (`commit_interval_ms`), full (`max_transaction_blocks`), or asked for (fsync),
//! and commits it through a pipeline of stages:
//!
//! 1. **lock down** — no new handle joins; wait for open handles to stop; take a snapshot
//!    of every buffer (a shared `Arc`, so later changes copy: JBD2's frozen data).
//! 2. **dispatch** — make room in the log (checkpoint if needed), then write revoke
//!    blocks, descriptor blocks and the logged blocks at the log head.
//! 3. **make durable** — write the commit block with PREFLUSH|FUA and wait for it.
//! 4. **complete** — the transaction is committed: its blocks join the checkpoint list,
//!    waiters wake.
//!
//! The *checkpoint* writes committed blocks to their home locations, flushes, and moves
//! the log tail in the journal superblock so the space can be reused.
//!
//! Promises: a handle's changes reach the disk only as part of a committed transaction; a
//! transaction is committed (and `commit_and_wait` returns) only after its commit block is
//! durable; the checkpoint never writes a block that a committed revoke has freed; after an
//! IO error the journal aborts and no later transaction commits, so what was committed
//! before stays recoverable.
//! It must never let a transaction's commit block reach the disk before its logged blocks
//! (they are written first and the commit carries PREFLUSH), and never move the log tail
//! past a transaction whose blocks are not durable at home.

use crate::jbuf::JBuf;
use crate::log::{LogFeatures, LogLayout};
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::{JournalArea, JournalError};
use jext_io::{IoFlags, IoQueue, WriteRequest};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the journal behaves; the defaults are ext4's.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Commit the running transaction once it is this old (ext4 `commit=`, default 5 s).
    pub commit_interval_ms: u64,
    /// Largest transaction in log blocks; `None` means a quarter of the log, as JBD2.
    pub max_transaction_blocks: Option<u32>,
    /// Order the commit block with PREFLUSH|FUA (ext4 `barrier=1`). Without it nothing
    /// is durable until the device decides, as with ext4 `nobarrier`.
    pub barrier: bool,
    /// Features to turn on in the journal superblock at load.
    pub features: LogFeatures,
    /// Write nothing at load (a read-only mount): turned-on features then reach the disk
    /// with the superblock the first commit writes, if a remount ever allows one.
    pub read_only: bool,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            commit_interval_ms: 5000,
            max_transaction_blocks: None,
            barrier: true,
            features: LogFeatures::default(),
            read_only: false,
        }
    }
}

/// What the journal has done since it was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub commits: u64,
    /// Metadata (or journaled data) blocks written to the log.
    pub blocks_logged: u64,
    pub revokes_logged: u64,
    pub checkpoints: u64,
    pub blocks_checkpointed: u64,
}

/// The journal of one mounted file system.
pub struct Journal {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    io: Arc<IoQueue>,
    area: JournalArea,
    layout: LogLayout,
    config: JournalConfig,
    max_transaction_blocks: u32,
    state: Mutex<State>,
    /// Signalled whenever a transaction changes state, a handle stops, or a commit is
    /// requested: waiters re-check their condition.
    changed: Condvar,
    /// A copy of `State::committed` readable without the lock.
    committed_tid: AtomicU32,
}

struct State {
    running: Option<RunningTransaction>,
    next_tid: Tid,
    /// The last transaction whose commit block is durable.
    committed: Tid,
    /// Blocks of the transaction being written to the log right now.
    committing: Option<(Tid, HashSet<u64>)>,
    /// The highest tid someone asked to have committed.
    commit_requested: Option<Tid>,
    log: LogPosition,
    checkpoint: CheckpointList,
    /// The journal superblock on disk says "empty" (`s_start == 0`), so the first commit
    /// must point it at the log first.
    superblock_says_empty: bool,
    aborted: Option<JournalError>,
    shutting_down: bool,
    /// Someone waits for a checkpoint; the commit thread runs it, so that every write to
    /// the log and the journal superblock comes from one thread, in order.
    checkpoint_requested: bool,
    stats: JournalStats,
}

/// Where the live part of the circular log is: `[tail, head)`.
#[derive(Clone, Copy, Debug)]
struct LogPosition {
    head: u32,
    tail: u32,
    /// The tid of the oldest transaction still in the log (or the next one, if empty).
    tail_tid: Tid,
}

/// Committed blocks not yet written home: the newest committed version of each.
#[derive(Default)]
struct CheckpointList {
    blocks: HashMap<u64, (Tid, Arc<[u8]>)>,
}

struct RunningTransaction {
    tid: Tid,
    /// No new handle may join: the commit thread is waiting for `updates` to drain.
    locked: bool,
    /// Open handles.
    updates: u32,
    /// Credits reserved by open handles and not yet used.
    reserved_credits: u32,
    buffers: BTreeMap<u64, Arc<JBuf>>,
    revokes: BTreeSet<u64>,
    started_at: Instant,
}

impl RunningTransaction {
    fn new(tid: Tid) -> RunningTransaction {
        RunningTransaction {
            tid,
            locked: false,
            updates: 0,
            reserved_credits: 0,
            buffers: BTreeMap::new(),
            revokes: BTreeSet::new(),
            started_at: Instant::now(),
        }
    }

    fn is_empty(&self) -> bool {
        self.buffers.is_empty() && self.revokes.is_empty()
    }
}

impl Journal {
    /// Starts the journal in `area`, whose superblock must say the log is empty (run
    /// [`crate::recovery::recover`] first).
    pub fn load(
        io: Arc<IoQueue>,
        area: JournalArea,
        config: JournalConfig,
    ) -> Result<Journal, JournalError> {
        let layout = LogLayout::load(&io, &area, config.features, !config.read_only)?;
        let log_len = layout.last - layout.first;
        let max_transaction_blocks = config
            .max_transaction_blocks
            .unwrap_or(log_len / 4)
            .clamp(8, log_len / 2);
        let next_tid = layout.sequence();
        let state = State {
            running: None,
            next_tid,
            committed: next_tid.wrapping_sub(1),
            committing: None,
            commit_requested: None,
            log: LogPosition {
                head: layout.first,
                tail: layout.first,
                tail_tid: next_tid,
            },
            checkpoint: CheckpointList::default(),
            superblock_says_empty: true,
            aborted: None,
            shutting_down: false,
            checkpoint_requested: false,
            stats: JournalStats::default(),
        };
        let shared = Arc::new(Shared {
            io,
            area,
            layout,
            config,
            max_transaction_blocks,
            state: Mutex::new(state),
            changed: Condvar::new(),
            committed_tid: AtomicU32::new(next_tid.wrapping_sub(1)),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("jext-commit".into())
            .spawn(move || commit_thread(thread_shared))
            .map_err(|e| JournalError::Thread(e.to_string()))?;
        Ok(Journal {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Opens a handle that may dirty up to `credits` buffers not yet in the transaction.
    /// Blocks while the running transaction is being locked down or is too full.
    pub fn start(&self, credits: u32) -> Result<Handle, JournalError> {
        let shared = &self.shared;
        if credits > shared.max_transaction_blocks / 2 {
            return Err(JournalError::TooManyCredits {
                asked: credits,
                max: shared.max_transaction_blocks / 2,
            });
        }
        let mut st = shared.state.lock();
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            if st.shutting_down {
                return Err(JournalError::ShutDown);
            }
            let Some(t) = st.running.as_mut() else {
                let tid = st.next_tid;
                st.next_tid = tid.wrapping_add(1);
                st.running = Some(RunningTransaction::new(tid));
                continue;
            };
            if t.locked {
                shared.changed.wait(&mut st);
                continue;
            }
            let would_need = shared.layout.log_blocks_needed(
                t.buffers.len() + (t.reserved_credits + credits) as usize,
                t.revokes.len(),
            );
            let has_work = t.updates > 0 || !t.is_empty();
            if would_need > shared.max_transaction_blocks && has_work {
                let tid = t.tid;
                request_commit(&mut st, tid);
                shared.changed.notify_all();
                shared.changed.wait(&mut st);
                continue;
            }
            t.updates += 1;
            t.reserved_credits += credits;
            return Ok(Handle {
                shared: shared.clone(),
                tid: t.tid,
                credits_left: credits,
                stopped: false,
            });
        }
    }

    /// Commits transaction `tid` (if it is not committed yet) and waits until its commit
    /// block is durable.
    pub fn commit_and_wait(&self, tid: Tid) -> Result<(), JournalError> {
        let shared = &self.shared;
        let mut st = shared.state.lock();
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            if tid_geq(st.committed, tid) {
                return Ok(());
            }
            if tid_geq(tid, st.next_tid) {
                // Never started: nothing of it can need committing.
                return Ok(());
            }
            request_commit(&mut st, tid);
            shared.changed.notify_all();
            shared.changed.wait(&mut st);
        }
    }

    /// Commits whatever is running and waits; returns the tid that is now committed.
    pub fn commit_all(&self) -> Result<Tid, JournalError> {
        let tid = {
            let st = self.shared.state.lock();
            st.running.as_ref().map_or(st.committed, |t| t.tid)
        };
        self.commit_and_wait(tid)?;
        Ok(tid)
    }

    /// The last transaction whose commit is durable.
    pub fn committed_tid(&self) -> Tid {
        self.shared.committed_tid.load(Ordering::Acquire)
    }

    /// Stops the journal: the running transaction never commits, nothing later does, and
    /// what committed before stays in the log for recovery. The file system calls this when
    /// an operation failed halfway, so that its partial changes cannot reach the disk.
    pub fn abort(&self, reason: String) {
        let mut st = self.shared.state.lock();
        abort(&self.shared, &mut st, JournalError::Halted(reason));
    }

    /// The journal's error, once it has aborted.
    pub fn aborted(&self) -> Option<JournalError> {
        self.shared.state.lock().aborted.clone()
    }

    /// The newest committed bytes of `block` that are not yet at home, if any: a reader
    /// that missed in its cache must use these instead of the home block.
    pub fn committed_copy(&self, block: u64) -> Option<Arc<[u8]>> {
        let st = self.shared.state.lock();
        st.checkpoint
            .blocks
            .get(&block)
            .map(|(_, data)| data.clone())
    }

    pub fn stats(&self) -> JournalStats {
        self.shared.state.lock().stats
    }

    pub fn block_size(&self) -> u32 {
        self.shared.area.block_size
    }

    pub fn max_transaction_blocks(&self) -> u32 {
        self.shared.max_transaction_blocks
    }

    /// Commits what is running, then writes every committed block home and empties the
    /// log (the commit thread does the work).
    pub fn checkpoint(&self) -> Result<(), JournalError> {
        self.commit_all()?;
        let shared = &self.shared;
        let mut st = shared.state.lock();
        let done_before = st.stats.checkpoints;
        st.checkpoint_requested = true;
        shared.changed.notify_all();
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            if st.stats.checkpoints != done_before || st.checkpoint.blocks.is_empty() {
                return Ok(());
            }
            shared.changed.wait(&mut st);
        }
    }

    /// Commits what is running, checkpoints, and marks the log empty on disk
    /// (`s_start = 0`), leaving the journal loaded: a remount to read-only, after which
    /// the image is as clean as after an unmount. The caller must have stopped every
    /// change first (no handle may start meanwhile); the next commit, if a remount to
    /// read-write allows one, points the superblock at the log again.
    pub fn empty_log(&self) -> Result<(), JournalError> {
        self.checkpoint()?;
        let mut st = self.shared.state.lock();
        assert!(
            st.running
                .as_ref()
                .is_none_or(|t| t.is_empty() && t.updates == 0),
            "empty_log while changes are still being made"
        );
        if st.superblock_says_empty {
            return Ok(());
        }
        let sb = self.shared.layout.superblock_block(0, st.next_tid);
        // Under the lock, so no commit can start between the write and the flag.
        write_superblock(&self.shared, sb)?;
        st.superblock_says_empty = true;
        st.log.head = self.shared.layout.first;
        st.log.tail = self.shared.layout.first;
        st.log.tail_tid = st.next_tid;
        Ok(())
    }

    /// Clean shutdown: commit what is running, stop the commit thread, checkpoint, and
    /// mark the journal empty on disk. After an abort, only stops the thread and returns
    /// the abort error (the committed log stays for recovery).
    pub fn shutdown(&self) -> Result<(), JournalError> {
        let committed = self.commit_all();
        {
            let mut st = self.shared.state.lock();
            st.shutting_down = true;
            self.shared.changed.notify_all();
        }
        if let Some(thread) = self.thread.lock().take() {
            thread
                .join()
                .map_err(|_| JournalError::Thread("the commit thread panicked".into()))?;
        }
        committed?;
        checkpoint(&self.shared)?;
        let st = self.shared.state.lock();
        if st.superblock_says_empty {
            // Nothing was logged since load (a read-only mount, or an idle one): the
            // superblock on disk already says empty, and a read-only device must not be
            // written.
            return Ok(());
        }
        let sb = self.shared.layout.superblock_block(0, st.next_tid);
        drop(st);
        write_superblock(&self.shared, sb)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock();
            st.shutting_down = true;
            self.shared.changed.notify_all();
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

fn request_commit(st: &mut State, tid: Tid) {
    if st.commit_requested.is_none_or(|r| tid_gt(tid, r)) {
        st.commit_requested = Some(tid);
    }
}

/// A unit of change inside the running transaction (JBD2's `handle_t`).
pub struct Handle {
    shared: Arc<Shared>,
    tid: Tid,
    credits_left: u32,
    stopped: bool,
}

impl Handle {
    /// The transaction this handle's changes will commit in.
    pub fn tid(&self) -> Tid {
        self.tid
    }

    /// Credits not yet used.
    pub fn credits_left(&self) -> u32 {
        self.credits_left
    }

    /// Changes `buf` as part of this transaction (get write access, change, mark dirty).
    pub fn modify<R>(
        &mut self,
        buf: &Arc<JBuf>,
        change: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, JournalError> {
        assert!(!self.stopped, "a stopped handle was used");
        if buf.running_tid() != Some(self.tid) {
            self.join_buffer(buf)?;
        }
        Ok(buf.modify(change))
    }

    fn join_buffer(&mut self, buf: &Arc<JBuf>) -> Result<(), JournalError> {
        let mut st = self.shared.state.lock();
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        let t = st
            .running
            .as_mut()
            .expect("a handle's transaction runs until the handle stops");
        assert_eq!(t.tid, self.tid, "a handle outlived its transaction");
        // The block is in use again: a revoke of it earlier in this transaction no longer
        // applies (JBD2's cancel_revoke).
        t.revokes.remove(&buf.block());
        if t.buffers.insert(buf.block(), buf.clone()).is_none() {
            buf.set_running_tid(Some(self.tid));
            if self.credits_left > 0 {
                self.credits_left -= 1;
                t.reserved_credits -= 1;
            } else {
                // The caller under-estimated; the transaction grows past its reservation,
                // which the size check at the next handle start absorbs.
                debug_assert!(false, "handle ran out of credits at block {}", buf.block());
            }
        }
        Ok(())
    }

    /// Declares that `block` (a metadata block, or a journaled data block) was freed in
    /// this transaction: older logged copies must not be replayed over it, and the
    /// checkpoint must not write them home once this transaction commits.
    pub fn revoke(&mut self, block: u64) -> Result<(), JournalError> {
        assert!(!self.stopped, "a stopped handle was used");
        let mut st = self.shared.state.lock();
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        let in_log = st.checkpoint.blocks.contains_key(&block)
            || st
                .committing
                .as_ref()
                .is_some_and(|(_, blocks)| blocks.contains(&block));
        let t = st
            .running
            .as_mut()
            .expect("a handle's transaction runs until the handle stops");
        if let Some(buf) = t.buffers.remove(&block) {
            // Freed before it ever reached the log: it need not be logged at all.
            buf.set_running_tid(None);
            self.credits_left += 1;
            t.reserved_credits += 1;
        }
        if in_log {
            t.revokes.insert(block);
        }
        Ok(())
    }

    /// Ends the handle (also done on drop).
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let mut st = self.shared.state.lock();
        let t = st
            .running
            .as_mut()
            .expect("a handle's transaction runs until the handle stops");
        assert_eq!(t.tid, self.tid);
        t.updates -= 1;
        t.reserved_credits -= self.credits_left;
        self.shared.changed.notify_all();
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn commit_thread(shared: Arc<Shared>) {
    let interval = Duration::from_millis(shared.config.commit_interval_ms);
    let mut st = shared.state.lock();
    loop {
        if st.aborted.is_some() {
            return;
        }
        let due = st.running.as_ref().map(|t| {
            st.shutting_down
                || st.commit_requested.is_some_and(|r| tid_geq(r, t.tid))
                || t.started_at.elapsed() >= interval
        });
        if due == Some(true) {
            st = commit_running(&shared, st);
            continue;
        }
        if st.checkpoint_requested {
            st.checkpoint_requested = false;
            if let Err(err) = MutexGuard::unlocked(&mut st, || checkpoint(&shared)) {
                abort(&shared, &mut st, err);
            }
            shared.changed.notify_all();
            continue;
        }
        if st.shutting_down {
            return;
        }
        let wait = st.running.as_ref().map_or(interval, |t| {
            interval.saturating_sub(t.started_at.elapsed())
        });
        shared
            .changed
            .wait_for(&mut st, wait.max(Duration::from_millis(1)));
    }
}

/// Stage 1 (lock down) and the hand-off to the later stages; returns with the lock held.
fn commit_running<'a>(shared: &'a Shared, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    let t = st
        .running
        .as_mut()
        .expect("commit_running needs a running transaction");
    t.locked = true;
    while st.running.as_ref().is_some_and(|t| t.updates > 0) {
        shared.changed.wait(&mut st);
    }
    let t = st
        .running
        .take()
        .expect("only the commit thread takes the running transaction");
    let tid = t.tid;
    if t.is_empty() {
        // Nothing to log. The tid is handed out again, because recovery reads the log as
        // a run of consecutive tids and stops at a gap.
        st.next_tid = tid;
        if st.commit_requested.is_some_and(|r| tid_geq(tid, r)) {
            st.commit_requested = None;
        }
        shared.changed.notify_all();
        return st;
    }
    let blocks: Vec<(u64, Arc<[u8]>)> = t
        .buffers
        .values()
        .map(|buf| {
            buf.set_running_tid(None);
            (buf.block(), buf.bytes())
        })
        .collect();
    let revokes: Vec<u64> = t.revokes.into_iter().collect();
    st.committing = Some((tid, blocks.iter().map(|(b, _)| *b).collect()));
    shared.changed.notify_all();

    let written = MutexGuard::unlocked(&mut st, || {
        write_transaction(shared, tid, &blocks, &revokes)
    });
    match written {
        Ok(new_head) => complete_commit(shared, &mut st, tid, blocks, revokes, new_head),
        Err(err) => abort(shared, &mut st, err),
    }
    st.committing = None;
    shared.changed.notify_all();
    st
}

/// Stages 2 and 3: room, logged blocks, then the durable commit block. Returns the new head.
fn write_transaction(
    shared: &Shared,
    tid: Tid,
    blocks: &[(u64, Arc<[u8]>)],
    revokes: &[u64],
) -> Result<u32, JournalError> {
    let layout = &shared.layout;
    let needed = layout.log_blocks_needed(blocks.len(), revokes.len());
    // Keep room for one more full transaction beyond this one, so that a checkpoint is
    // rarely on the path of a commit someone waits for.
    if log_free(shared) < needed + shared.max_transaction_blocks {
        checkpoint(shared)?;
    }
    let (head, superblock_says_empty) = {
        let st = shared.state.lock();
        (st.log.head, st.superblock_says_empty)
    };
    if log_free(shared) < needed {
        return Err(JournalError::TransactionTooLarge {
            tid,
            log_blocks: needed,
        });
    }
    let mut requests = Vec::with_capacity(needed as usize + 1);
    if superblock_says_empty {
        // Recovery starts at the superblock's tail; it must name this transaction before
        // the commit block can count. The commit's PREFLUSH orders it.
        let sb = layout.superblock_block(head, tid);
        requests.push(WriteRequest::new(
            shared.area.byte_offset(0),
            sb,
            IoFlags::ORDERED,
        ));
    }
    let mut position = head;
    for block in layout.build_log_blocks(tid, blocks, revokes) {
        requests.push(WriteRequest::new(
            shared.area.byte_offset(position),
            block,
            IoFlags::ORDERED,
        ));
        position = layout.next(position);
    }
    shared.io.submit(requests).wait()?;
    let mut commit_flags = IoFlags::ORDERED | IoFlags::BARRIER;
    if shared.config.barrier {
        commit_flags |= IoFlags::PREFLUSH | IoFlags::FUA;
    }
    let commit = layout.commit_block(tid, std::time::SystemTime::now());
    shared
        .io
        .write(shared.area.byte_offset(position), commit, commit_flags)?;
    Ok(layout.next(position))
}

/// Stage 4: the transaction is durable.
fn complete_commit(
    shared: &Shared,
    st: &mut State,
    tid: Tid,
    blocks: Vec<(u64, Arc<[u8]>)>,
    revokes: Vec<u64>,
    new_head: u32,
) {
    if st.superblock_says_empty {
        st.superblock_says_empty = false;
        st.log.tail = st.log.head;
        st.log.tail_tid = tid;
    }
    st.log.head = new_head;
    for block in &revokes {
        st.checkpoint.blocks.remove(block);
    }
    st.stats.commits += 1;
    st.stats.blocks_logged += blocks.len() as u64;
    st.stats.revokes_logged += revokes.len() as u64;
    for (block, data) in blocks {
        st.checkpoint.blocks.insert(block, (tid, data));
    }
    st.committed = tid;
    shared.committed_tid.store(tid, Ordering::Release);
    if st.commit_requested.is_some_and(|r| tid_geq(tid, r)) {
        st.commit_requested = None;
    }
}

fn abort(shared: &Shared, st: &mut State, err: JournalError) {
    let err = JournalError::Aborted(Box::new(err));
    if st.aborted.is_none() {
        st.aborted = Some(err);
    }
    shared.changed.notify_all();
}

fn log_free(shared: &Shared) -> u32 {
    let st = shared.state.lock();
    shared.layout.free_between(st.log.tail, st.log.head)
}

/// Writes every committed block home, flushes, and moves the log tail to the head.
/// Runs only on the commit thread, or after it stopped: log writes stay in one order.
fn checkpoint(shared: &Shared) -> Result<(), JournalError> {
    let (mut writes, new_tail, new_tail_tid) = {
        let st = shared.state.lock();
        if let Some(err) = &st.aborted {
            return Err(err.clone());
        }
        let writes: Vec<(u64, Arc<[u8]>)> = st
            .checkpoint
            .blocks
            .iter()
            .map(|(block, (_, data))| (*block, data.clone()))
            .collect();
        (writes, st.log.head, st.committed.wrapping_add(1))
    };
    if writes.is_empty() && shared.state.lock().superblock_says_empty {
        return Ok(());
    }
    writes.sort_unstable_by_key(|(block, _)| *block);
    let block_size = u64::from(shared.area.block_size);
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
        let sb = shared.layout.superblock_block(new_tail, new_tail_tid);
        write_superblock(shared, sb)
    })();
    let mut st = shared.state.lock();
    if let Err(err) = result {
        abort(shared, &mut st, err.clone());
        return Err(err);
    }
    // Commits complete on the thread running this checkpoint, so no block joined the
    // list meanwhile.
    st.checkpoint.blocks.clear();
    st.log.tail = new_tail;
    st.log.tail_tid = new_tail_tid;
    st.superblock_says_empty = false;
    st.stats.checkpoints += 1;
    st.stats.blocks_checkpointed += count;
    Ok(())
}

fn write_superblock(shared: &Shared, block: Arc<[u8]>) -> Result<(), JournalError> {
    let mut flags = IoFlags::ORDERED;
    if shared.config.barrier {
        flags |= IoFlags::FUA;
    }
    shared.io.write(shared.area.byte_offset(0), block, flags)?;
    Ok(())
}
