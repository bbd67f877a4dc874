//! The running journal: handles, transactions, and the three threads that move them
//! through JBD2's states — running, committing, checkpoint — in *dual-mode journaling*
//! (BarrierFS §4: the commit is split into a control plane and a data plane).
//!
//! A change to metadata happens inside a [`Handle`], which belongs to the *running*
//! transaction. Then:
//!
//! 1. The **commit thread** (`crate::commit`) closes the running transaction when it is old
//!    (`commit_interval_ms`), full (`max_transaction_blocks`) or asked for (fsync,
//!    fbarrier), takes its frozen snapshot, reserves its log blocks and *dispatches*
//!    them (revokes, descriptors, logged blocks; on a barrier-capable device the commit
//!    block too, as a barrier write), and goes on to the next transaction without waiting
//!    for anything to be durable. Several transactions may be *committing* at once.
//! 2. The **flush thread** (`crate::flush`) makes every dispatched transaction durable
//!    with one flush (group commit), publishes the durable tid and wakes fsync waiters.
//!    On a device without a barrier write it also writes the commit blocks, after a flush
//!    that made the logged blocks durable: the order comes from the flush, never from
//!    hoping the device keeps issue order.
//! 3. The **checkpoint thread** (`crate::checkpoint`) writes the newest *durable* version of
//!    each logged block home and moves the log tail, in the background, a chunk at a
//!    time once a quarter of the log is used, or when someone asks. A full log makes a
//!    writer wait in [`Journal::start`] (a large handle waits first, leaving room for a
//!    whole transaction behind it); an fsync whose transaction fits waits only for its
//!    own commit, and nothing on the commit path checkpoints.
//!
//! A block changed by a newer transaction while an older one is committing gets one
//! frozen copy per transaction: each snapshot is an `Arc` the next change copies
//! (`crate::jbuf`). Copies make the paper's conflict-page list unnecessary: no writer ever
//! blocks on a committing buffer.
//!
//! Two waits: [`Journal::commit_and_wait`] (fsync: the commit block is durable) and
//! [`Journal::commit_and_wait_dispatched`] (BarrierFS's fbarrier at the journal: the commit
//! block was dispatched in order after everything it depends on, and nothing later can
//! persist before it). The file system's barriers need neither: their order is the
//! running transaction's place in the log (`jext_fs`'s `epochs`).
//!
//! Promises: a handle's changes reach the disk only as part of a committed transaction;
//! transactions become durable in tid order, and `commit_and_wait` returns only after its
//! commit block is durable; the checkpoint writes home only durable versions, never a
//! block a durable revoke freed, and moves the log tail only past transactions whose
//! blocks are durable at home; after an IO error the journal aborts and no later
//! transaction commits, so what was committed before stays recoverable.
//! It must never let a commit block persist before its transaction's logged blocks, and
//! never reuse log blocks before the superblock that frees them is durable.
//! The commit thread is woken only when a commit is asked for or due, or a lock-down
//! waits for the last handle: never by every handle that stops.
//!
//! [`Journal::without_log`] runs the same machinery for a file system without a journal:
//! a commit writes its blocks home instead of to a log (`crate::home`), so there is
//! nothing to checkpoint or recover, and the promises about the log do not apply.

use crate::fast_commit::FastCommitOutcome;
use crate::format::fast_commit::FcRecord;
use crate::format::itransaction::CarriedBlock;
use crate::format::superblock::INCOMPAT_JEXT_PERCORE;
use crate::jbuf::JBuf;
use crate::log::{CommitMode, LogFeatures, LogLayout, RecordMode};
use crate::tid::{tid_geq, tid_gt, Tid};
use crate::{JournalArea, JournalError};
use jext_io::{IoQueue, IoTicket};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// How the journal behaves; the defaults are ext4's.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Commit the running transaction once it is this old (ext4 `commit=`, default 5 s).
    pub commit_interval_ms: u64,
    /// Largest transaction in log blocks; `None` means a quarter of the log, as JBD2.
    pub max_transaction_blocks: Option<u32>,
    /// Make commits durable with flushes (ext4 `barrier=1`). Without it nothing is
    /// durable until the device decides, as with ext4 `nobarrier`.
    pub barrier: bool,
    /// Features to turn on in the journal superblock at load.
    pub features: LogFeatures,
    /// How a commit reaches the disk (`crate::log`).
    pub commit_mode: CommitMode,
    /// Whether a logged block may go as its changed bytes (`crate::log`).
    pub record_mode: RecordMode,
    /// Write nothing at load (a read-only mount): turned-on features then reach the disk
    /// with the superblock the first commit writes, if a remount ever allows one.
    pub read_only: bool,
    /// Recovery left fast commits for the file system to apply
    /// ([`crate::RecoveryReport::fast_commits`]): the superblock points at an empty log
    /// whose next transaction makes them obsolete, and the journal continues that log.
    pub fast_commits_pending: bool,
    /// 0: fsyncs write ext4 fast commits to the one fast-commit area (Linux replays
    /// them). Otherwise (`ijournal=percore`) the area is split into this many rings of
    /// jext-private i-transactions (`crate::percore`), at most 8.
    pub fast_commit_rings: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            commit_interval_ms: 5000,
            max_transaction_blocks: None,
            barrier: true,
            features: LogFeatures::default(),
            commit_mode: CommitMode::default(),
            record_mode: RecordMode::default(),
            read_only: false,
            fast_commits_pending: false,
            fast_commit_rings: 0,
        }
    }
}

/// What the journal has done since it was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub commits: u64,
    /// Metadata (or journaled data) blocks written to the log, whole or as byte records.
    pub blocks_logged: u64,
    /// Of those, the blocks written as byte records (`journal_records=bytes`).
    pub blocks_as_records: u64,
    /// Of those, the DELTA records on a block's home contents: the log held no version
    /// of the block, and the bytes it had before came from its home (`crate::commit`).
    pub records_on_home: u64,
    /// Bytes the byte records took in records blocks: entry and range headers and the
    /// changed bytes (the rest of a records block is unused; `log_bytes` counts it).
    pub record_bytes: u64,
    /// Bytes of log blocks commits wrote (revoke, descriptor, copies, records, commit).
    pub log_bytes: u64,
    pub revokes_logged: u64,
    pub checkpoints: u64,
    pub blocks_checkpointed: u64,
    /// Rounds of the flush thread that made at least one transaction durable; each
    /// costs the flushes of one group commit, whatever the number of transactions.
    pub durability_rounds: u64,
    /// The most transactions committing (dispatched, not yet durable) at once.
    pub max_committing: u64,
    /// Times a writer waited in [`Journal::start`] for the checkpoint to free log space.
    pub log_full_waits: u64,
    /// Times the commit thread found no room in the log for a transaction and waited for
    /// the checkpoint (what the background checkpoint is there to avoid).
    pub commit_room_waits: u64,
    /// Times the commit thread woke up (asked, due, or its timer), to show that stopping
    /// a handle does not wake it.
    pub commit_thread_wakeups: u64,
    /// fsyncs that committed and made their transaction durable on their own thread, the
    /// commit and flush threads idle (`crate::inline_commit`).
    pub inline_commits: u64,
    /// Commits written as one write with their commit block (`CommitMode::SingleIo`);
    /// the others had ordered data to make durable first, or single I/O is off.
    pub single_io_commits: u64,
    /// Of those, commits small enough to go as one compact commit block and their copies
    /// (`crate::format::compact`).
    pub compact_commits: u64,
    /// Fast commits written (fsyncs that did not commit the running transaction).
    pub fast_commits: u64,
    /// Blocks those fast commits took in the fast-commit area.
    pub fast_commit_blocks: u64,
    /// Blocks commits wrote to their home locations, with no log
    /// ([`Journal::without_log`]).
    pub blocks_written_home: u64,
}

/// The journal of one mounted file system.
pub struct Journal {
    shared: Arc<Shared>,
    threads: Mutex<Threads>,
}

#[derive(Default)]
struct Threads {
    commit: Option<JoinHandle<()>>,
    flush: Option<JoinHandle<()>>,
    checkpoint: Option<JoinHandle<()>>,
}

/// The on-disk log a journal commits to: where it is, and how transactions are laid out.
pub(crate) struct Log {
    pub(crate) area: JournalArea,
    pub(crate) layout: LogLayout,
}

pub(crate) struct Shared {
    pub(crate) io: Arc<IoQueue>,
    /// `None`: a file system without a journal; commits write home (`crate::home`).
    pub(crate) log: Option<Log>,
    /// The file system's block size (the log's too, where there is one).
    pub(crate) block_size: u32,
    pub(crate) config: JournalConfig,
    pub(crate) max_transaction_blocks: u32,
    /// Commit blocks go out as barrier writes with the logged blocks (the device keeps
    /// epochs); otherwise the flush thread writes them after a flush.
    pub(crate) barrier_device: bool,
    pub(crate) state: Mutex<State>,
    /// Waiters outside the threads (fsync, fbarrier, writers waiting for room or for a
    /// lock-down to end, checkpoint callers) re-check their condition.
    pub(crate) changed: Condvar,
    /// The commit thread's own wake-up: a commit asked for, or the lock-down's last
    /// handle stopped.
    pub(crate) commit_wake: Condvar,
    /// The flush thread's wake-up: a transaction was dispatched or durability asked for.
    pub(crate) flush_wake: Condvar,
    /// The checkpoint thread's wake-up: the log filled or a checkpoint was asked for.
    pub(crate) checkpoint_wake: Condvar,
    /// Held by the checkpoint while its home writes are in flight, and by the flush
    /// thread while it publishes a durable revoke: a home write of a block that a newly
    /// durable revoke freed can then never land after the file system reused the block.
    pub(crate) checkpoint_io: Mutex<()>,
    /// The fast-commit area after the log, and the order fast commits go in.
    pub(crate) fast_commits: crate::fast_commit::FastCommitArea,
    /// The same area as per-core rings, in `ijournal=percore`.
    pub(crate) rings: Option<crate::percore::Rings>,
    /// The rings' writers coming to their flush (`crate::group_flush`).
    pub(crate) group_flush: crate::group_flush::GroupFlush,
    /// A copy of `State::committed` readable without the lock.
    committed_tid: AtomicU32,
    /// A copy of `State::dispatched` readable without the lock.
    dispatched_tid: AtomicU32,
}

pub(crate) struct State {
    pub(crate) running: Option<RunningTransaction>,
    pub(crate) next_tid: Tid,
    /// The last transaction whose commit block was dispatched in order (fbarrier).
    pub(crate) dispatched: Tid,
    /// The last transaction whose commit block is durable (fsync).
    pub(crate) committed: Tid,
    /// Transactions off running and not yet durable, oldest first: dispatched, being
    /// dispatched, or (the newest only) still waiting to go to the log. A transaction
    /// joins in the same step that takes it off running, under the lock, as JBD2 sets
    /// `j_committing_transaction` with `j_running_transaction = NULL` (T_FLUSH): from
    /// then on a handle of the next transaction that revokes one of its blocks sees it
    /// logged (`Handle::revoke`), however long it waits for log room.
    pub(crate) committing: VecDeque<CommittingTransaction>,
    /// Every transaction in the log, committing or durable and not yet checkpointed,
    /// oldest first.
    pub(crate) in_log: VecDeque<InLog>,
    /// The highest tid someone asked to have committed (for the commit thread).
    pub(crate) commit_requested: Option<Tid>,
    /// The highest tid someone needs durable (for the flush thread).
    pub(crate) durable_requested: Option<Tid>,
    /// The highest tid someone needs dispatched (for the flush thread, on a device whose
    /// commit blocks it writes).
    pub(crate) dispatch_requested: Option<Tid>,
    pub(crate) log: LogPosition,
    pub(crate) checkpoint: CheckpointList,
    /// The journal superblock on disk says "empty" (`s_start == 0`), so the first commit
    /// must point it at the log first.
    pub(crate) superblock_says_empty: bool,
    pub(crate) aborted: Option<JournalError>,
    /// No new commit is wanted after the running transaction: the commit thread exits.
    pub(crate) shutting_down: bool,
    /// The commit thread is gone: the flush and checkpoint threads exit once idle.
    pub(crate) helpers_stop: bool,
    /// Someone waits for a checkpoint.
    pub(crate) checkpoint_requested: bool,
    /// The commit thread waits for log room: the checkpoint's home writes then stop
    /// yielding to other IO (everyone waits for them).
    pub(crate) commit_waits_for_room: bool,
    /// Someone is committing the running transaction (`crate::commit::commit_running`):
    /// the commit thread, or an fsync on its own thread (`crate::inline_commit`). One at
    /// a time: transactions go to the log in tid order.
    pub(crate) commit_busy: bool,
    /// Someone is running a round (`crate::flush::round`): the flush thread, or an fsync
    /// on its own thread. One at a time: transactions become durable in tid order.
    pub(crate) round_busy: bool,
    /// fsyncs batching into one full commit (`crate::sync_batch`).
    pub(crate) sync_batch: crate::sync_batch::SyncBatch,
    pub(crate) stats: JournalStats,
}

impl State {
    /// Whether the log holds a version of `block`: a committing transaction logs it, or
    /// its newest durable version waits for the checkpoint.
    pub(crate) fn logs(&self, block: u64) -> bool {
        self.checkpoint.blocks.contains_key(&block)
            || self
                .committing
                .iter()
                .any(|t| t.block_index.contains_key(&block))
    }

    /// [`State::logs`], or a committing transaction revokes `block`.
    fn logs_or_revokes(&self, block: u64) -> bool {
        self.logs(block)
            || self
                .committing
                .iter()
                .any(|t| t.revokes.binary_search(&block).is_ok())
    }

    /// The state of a journal that has committed nothing since load: `next_tid` comes
    /// next, the log is empty at `start`.
    fn new(next_tid: Tid, start: u32, superblock_says_empty: bool) -> State {
        State {
            running: None,
            next_tid,
            dispatched: next_tid.wrapping_sub(1),
            committed: next_tid.wrapping_sub(1),
            committing: VecDeque::new(),
            in_log: VecDeque::new(),
            commit_requested: None,
            durable_requested: None,
            dispatch_requested: None,
            log: LogPosition {
                head: start,
                tail: start,
            },
            checkpoint: CheckpointList::default(),
            superblock_says_empty,
            aborted: None,
            shutting_down: false,
            helpers_stop: false,
            checkpoint_requested: false,
            commit_busy: false,
            round_busy: false,
            commit_waits_for_room: false,
            sync_batch: Default::default(),
            stats: JournalStats::default(),
        }
    }
}

/// A transaction in the log, as the checkpoint needs it.
pub(crate) struct InLog {
    pub(crate) tid: Tid,
    /// Its first log block.
    pub(crate) start: u32,
    /// The home blocks it logged: the checkpoint must have each at home, in this
    /// version or a newer durable one, before the tail may move past it.
    pub(crate) blocks: Vec<u64>,
}

/// Where the live part of the circular log is: `[tail, head)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogPosition {
    /// Where the next transaction's blocks go (reserved when it starts committing).
    pub(crate) head: u32,
    /// The first block the on-disk superblock may still need; moves only after the
    /// superblock saying so is durable.
    pub(crate) tail: u32,
}

/// Durable blocks not yet written home: the newest durable version of each.
#[derive(Default)]
pub(crate) struct CheckpointList {
    pub(crate) blocks: HashMap<u64, (Tid, Arc<[u8]>)>,
}

pub(crate) struct RunningTransaction {
    pub(crate) tid: Tid,
    /// No new handle may join: the commit thread is waiting for `updates` to drain.
    pub(crate) locked: bool,
    /// Open handles.
    pub(crate) updates: u32,
    /// Credits reserved by open handles and not yet used.
    pub(crate) reserved_credits: u32,
    pub(crate) buffers: BTreeMap<u64, Arc<JBuf>>,
    pub(crate) revokes: BTreeSet<u64>,
    pub(crate) started_at: Instant,
    /// Data written in place under its handles (data=ordered) must be durable before its
    /// commit block: it commits the classic way, behind a flush.
    pub(crate) ordered_data: bool,
    /// For blocks the log holds no version of, their bytes before this transaction first
    /// changed them, taken from buffers whose bytes recovery rebuilds ([`JBuf::base_known`]):
    /// the home block's contents, the base of a byte record (`crate::commit`). At most
    /// [`HOME_BASES_PER_TRANSACTION`].
    pub(crate) home_bases: HashMap<u64, Arc<[u8]>>,
}

/// Home bases one transaction keeps (each a block's copy, freed once it is planned): a
/// block past them goes whole or ZEROED, as without a base.
pub(crate) const HOME_BASES_PER_TRANSACTION: usize = 1024;

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
            ordered_data: false,
            home_bases: HashMap::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.buffers.is_empty() && self.revokes.is_empty()
    }
}

/// A transaction off running, not yet durable: its log blocks were (or are being)
/// dispatched, or, while `commit_position` is `None`, the commit thread is still getting
/// it room in the log (or announcing a live-log feature first).
pub(crate) struct CommittingTransaction {
    pub(crate) tid: Tid,
    /// Its frozen snapshot: one copy per transaction of every block it logs (whole, even
    /// where the log holds a byte record: that record rebuilds exactly these bytes).
    pub(crate) blocks: Vec<(u64, Arc<[u8]>)>,
    /// Where each block is in `blocks`.
    pub(crate) block_index: HashMap<u64, usize>,
    /// Blocks written as byte records (for the stats; set with `commit_position`).
    pub(crate) records: u64,
    /// Of those, DELTAs on home contents (for the stats; set with `commit_position`).
    pub(crate) records_on_home: u64,
    /// Bytes the records take in records blocks (for the stats; set with
    /// `commit_position`).
    pub(crate) record_bytes: u64,
    /// Log blocks it takes, commit block included (for the stats; set with
    /// `commit_position`).
    pub(crate) log_blocks: u32,
    pub(crate) revokes: Vec<u64>,
    /// The log block its commit block goes to, once its log blocks are reserved.
    pub(crate) commit_position: Option<u32>,
    /// The log blocks (and, on a barrier device, the commit block), once issued.
    pub(crate) log_ticket: Option<IoTicket>,
    /// Whether the commit block was issued (with the log blocks on a barrier device, by
    /// the flush thread otherwise).
    pub(crate) commit_issued: bool,
    /// Its logged blocks had transferred before a flush the flush thread issued for an
    /// earlier round: they are durable, and its own round needs no flush before its
    /// commit block (the flushes of consecutive rounds overlap).
    pub(crate) log_durable: bool,
}

impl CommittingTransaction {
    /// Transaction `tid`, just off running, with its frozen snapshot and revokes; no log
    /// blocks yet.
    pub(crate) fn new(tid: Tid, blocks: Vec<(u64, Arc<[u8]>)>, revokes: Vec<u64>) -> Self {
        let block_index = blocks
            .iter()
            .enumerate()
            .map(|(i, (block, _))| (*block, i))
            .collect();
        CommittingTransaction {
            tid,
            blocks,
            block_index,
            records: 0,
            records_on_home: 0,
            record_bytes: 0,
            log_blocks: 0,
            revokes,
            commit_position: None,
            log_ticket: None,
            commit_issued: false,
            log_durable: false,
        }
    }
}

impl Journal {
    /// Starts the journal in `area`, whose superblock must say the log is empty (run
    /// [`crate::recovery::recover`] first), or, with `fast_commits_pending`, point at
    /// the empty log recovery left.
    pub fn load(
        io: Arc<IoQueue>,
        area: JournalArea,
        config: JournalConfig,
    ) -> Result<Journal, JournalError> {
        let mut layout = LogLayout::load(
            &io,
            &area,
            config.features,
            config.commit_mode,
            config.record_mode,
            !config.read_only,
            config.fast_commits_pending,
        )?;
        // A log recovery left pending stays where it is: its first transaction goes at
        // `s_start`, and the superblock already names it.
        let start = layout.start().unwrap_or(layout.first);
        let log_len = layout.last - layout.first;
        let max_transaction_blocks = config
            .max_transaction_blocks
            .unwrap_or(log_len / 4)
            .clamp(8, log_len / 2);
        let next_tid = layout.sequence();
        let state = State::new(next_tid, start, layout.start().is_none());
        let barrier_device = io.barrier_mode();
        let fast_commits = match layout.fast_commit_area() {
            Some((first, len)) => crate::fast_commit::FastCommitArea::new(first, len),
            None => crate::fast_commit::FastCommitArea::new(0, 0),
        };
        let rings = match layout.fast_commit_area() {
            Some((first, len)) if config.fast_commit_rings > 0 => {
                layout.private_incompat = INCOMPAT_JEXT_PERCORE;
                Some(crate::percore::Rings::new(
                    first,
                    len,
                    config.fast_commit_rings,
                ))
            }
            _ => None,
        };
        let block_size = area.block_size;
        let log = Some(Log { area, layout });
        let mut shared = Shared::new(io, log, block_size, config, max_transaction_blocks, state);
        shared.barrier_device = barrier_device;
        shared.fast_commits = fast_commits;
        shared.rings = rings;
        let shared = Arc::new(shared);
        if let (Some(_), Some(start), false) = (
            &shared.rings,
            shared.layout().start(),
            shared.config.read_only,
        ) {
            // Recovery left a log pending (fast commits to apply): its superblock must
            // carry the private bit before the first i-transaction, as every later one
            // saying the log is not empty will.
            let sb = shared
                .layout()
                .superblock_block(start, shared.layout().sequence());
            crate::checkpoint::write_superblock(&shared, sb)?;
        }
        Journal::run(shared)
    }

    /// Starts a journal without a log, for a file system made without one (ext4's
    /// no-journal mode): handles, transactions and the waits work as with a log, but a
    /// commit writes its blocks home and flushes (`crate::home`). Nothing is recovered
    /// after a crash: what is durable is what the device kept. Of `config`, the commit
    /// interval, the transaction size and `barrier` count; the log's features, commit and
    /// record modes and fast-commit rings have nothing to apply to.
    pub fn without_log(
        io: Arc<IoQueue>,
        block_size: u32,
        config: JournalConfig,
    ) -> Result<Journal, JournalError> {
        let max_transaction_blocks = config
            .max_transaction_blocks
            .unwrap_or(crate::home::TRANSACTION_BLOCKS)
            .max(8);
        // Tids live only in memory: any start will do.
        let next_tid: Tid = 1;
        // `superblock_says_empty`: there is no log superblock to point anywhere, so
        // `empty_log` and `shutdown` have nothing to write.
        let state = State::new(next_tid, 0, true);
        // Not a barrier device even on one: nothing is ordered behind anything (there is no
        // commit block), and the flush thread's one flush makes a commit durable.
        let shared = Shared::new(io, None, block_size, config, max_transaction_blocks, state);
        Journal::run(Arc::new(shared))
    }

    /// Starts the commit, flush and checkpoint threads of a journal.
    fn run(shared: Arc<Shared>) -> Result<Journal, JournalError> {
        let journal = Journal {
            shared: shared.clone(),
            threads: Mutex::new(Threads::default()),
        };
        {
            let mut threads = journal.threads.lock();
            threads.commit = Some(spawn("jext-commit", &shared, crate::commit::commit_thread)?);
            threads.flush = Some(spawn("jext-flush", &shared, crate::flush::flush_thread)?);
            threads.checkpoint = Some(spawn(
                "jext-checkpoint",
                &shared,
                crate::checkpoint::checkpoint_thread,
            )?);
        }
        Ok(journal)
    }

    /// Whether commits go to a log (`false`: [`Journal::without_log`]).
    pub fn has_log(&self) -> bool {
        self.shared.log.is_some()
    }

    /// Opens a handle that may dirty up to `credits` buffers not yet in the transaction.
    /// Blocks while the running transaction is being locked down or is too full, and
    /// while the log has no room for it (`Shared::log_admits`; the checkpoint runs).
    pub fn start(&self, credits: u32) -> Result<Handle, JournalError> {
        let shared = &self.shared;
        if credits > shared.max_transaction_blocks / 2 {
            return Err(JournalError::TooManyCredits {
                asked: credits,
                max: shared.max_transaction_blocks / 2,
            });
        }
        let mut st = shared.state.lock();
        let mut counted_wait = false;
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            if st.shutting_down {
                return Err(JournalError::ShutDown);
            }
            if !shared.log_admits(&st, credits) {
                // No room: this writer waits for the checkpoint, never a commit.
                if !counted_wait {
                    st.stats.log_full_waits += 1;
                    counted_wait = true;
                }
                st.checkpoint_requested = true;
                shared.checkpoint_wake.notify_one();
                shared.changed.wait(&mut st);
                continue;
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
            let would_need = shared.blocks_needed(
                t.buffers.len() + (t.reserved_credits + credits) as usize,
                t.revokes.len(),
            );
            let has_work = t.updates > 0 || !t.is_empty();
            if would_need > shared.max_transaction_blocks && has_work {
                // Full: a commit is due (size).
                let tid = t.tid;
                request_commit(shared, &mut st, tid, true);
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
        self.shared.wait_for(tid, true)
    }

    /// fsync's full commit: [`Journal::commit_and_wait`], after waiting briefly for other
    /// fsyncs under way to join the transaction (`crate::sync_batch`). The caller holds
    /// an [`Journal::fsync_under_way`].
    pub fn fsync_commit(&self, tid: Tid) -> Result<(), JournalError> {
        self.shared.fsync_commit(tid)
    }

    /// fbarrier / fdatabarrier: commits transaction `tid` and waits only until its commit
    /// block was dispatched in order: everything of it (and of every earlier transaction)
    /// persists before anything written after this returns, but none of it need be
    /// durable yet.
    pub fn commit_and_wait_dispatched(&self, tid: Tid) -> Result<(), JournalError> {
        self.shared.wait_for(tid, false)
    }

    /// Commits whatever is running and waits until it is durable; returns the tid that is
    /// now committed.
    pub fn commit_all(&self) -> Result<Tid, JournalError> {
        let tid = self.latest_tid();
        self.commit_and_wait(tid)?;
        Ok(tid)
    }

    /// The running transaction, or the last one started if none runs: committing it
    /// covers every change made so far.
    pub fn latest_tid(&self) -> Tid {
        let st = self.shared.state.lock();
        match st.running.as_ref() {
            Some(t) => t.tid,
            None => st.next_tid.wrapping_sub(1),
        }
    }

    /// The tid a fast commit written now must carry: the running transaction's, or the
    /// next one's when none runs (every change made so far is in it or before it).
    pub fn fast_commit_tid(&self) -> Tid {
        let st = self.shared.state.lock();
        st.running.as_ref().map_or(st.next_tid, |t| t.tid)
    }

    /// Blocks of the fast-commit area (0: the journal has none, every fsync commits).
    pub fn fast_commit_area_blocks(&self) -> u32 {
        self.shared.fast_commits.len
    }

    /// Writes one fast commit of `tid` (from [`Journal::fast_commit_tid`]) holding
    /// `records`, in the order of `ticket` (0, 1, 2, ... handed out where the records
    /// were built; every ticket must come here once, with no records if there is nothing
    /// to write). `data_flush` is the flush after which the file data it points at is
    /// durable: [`jext_io::IoQueue::covering_flush`], taken once that data's writes
    /// completed. Returns once it is durable, or says why nothing was written.
    pub fn fast_commit(
        &self,
        ticket: u64,
        tid: Tid,
        data_flush: u64,
        records: Vec<FcRecord>,
    ) -> Result<FastCommitOutcome, JournalError> {
        if let Some(err) = self.aborted() {
            // Keep the tickets moving for the others, who will see the abort too.
            let _ = crate::fast_commit::write(&self.shared, ticket, tid, 0, Vec::new());
            return Err(err);
        }
        crate::fast_commit::write(&self.shared, ticket, tid, data_flush, records)
    }

    /// Marks an fsync under way until the returned guard drops: a fast commit whose turn
    /// it is waits a moment for those not yet handed in (group commit). The IO queue
    /// keeps background writes short for a while ([`jext_io::IoQueue::note_fsync`]).
    pub fn fsync_under_way(&self) -> crate::fast_commit::FsyncUnderWay<'_> {
        self.shared.io.note_fsync();
        crate::fast_commit::FsyncUnderWay::new(&self.shared.fast_commits)
    }

    /// Rings of per-core i-transactions (`ijournal=percore`); 0 in the default mode,
    /// where [`Journal::fast_commit`] writes ext4 fast commits.
    pub fn fast_commit_rings(&self) -> u32 {
        self.shared.rings.as_ref().map_or(0, |r| r.count())
    }

    /// `ijournal=percore`: writes i-transaction `sub_tid` of `tid` (from
    /// [`Journal::fast_commit_tid`]) holding `records` to a free ring, in parallel with
    /// other fsyncs; `first_sub_tid` is the first sub-tid handed out in `tid`. Sub-tids
    /// are handed out 0, 1, 2, ... where the records were built, and every one must come
    /// here once; `data_flush` as for [`Journal::fast_commit`], for the data the records
    /// point at that `data` does not carry. `data` is blocks of files that journal their
    /// data, as changed in `tid`, which recovery writes home. Returns once it and every
    /// lower sub-tid are durable (or says why nothing that counts was written).
    pub fn percore_commit(
        &self,
        sub_tid: u64,
        first_sub_tid: u64,
        tid: Tid,
        data_flush: u64,
        records: &[FcRecord],
        data: &[CarriedBlock],
    ) -> Result<FastCommitOutcome, JournalError> {
        let Some(rings) = &self.shared.rings else {
            return Ok(FastCommitOutcome::NoRoom);
        };
        let plan = crate::percore::Planned {
            sub_tid,
            first_sub_tid,
            tid,
            data_flush,
            records,
            data,
        };
        crate::percore::write(&self.shared, rings, plan)
    }

    /// The last transaction whose commit is durable.
    pub fn committed_tid(&self) -> Tid {
        self.shared.committed_tid.load(Ordering::Acquire)
    }

    /// Whether transaction `tid` and every earlier one are durable and checkpointed: the
    /// log holds no copy of a block that only they logged, and every block they logged is
    /// at home (a later transaction may log one of them again).
    pub fn checkpointed_through(&self, tid: Tid) -> bool {
        let st = self.shared.state.lock();
        tid_geq(st.committed, tid) && st.in_log.front().is_none_or(|t| tid_gt(t.tid, tid))
    }

    /// The last transaction whose commit block was dispatched in order (it may not be
    /// durable yet).
    pub fn dispatched_tid(&self) -> Tid {
        self.shared.dispatched_tid.load(Ordering::Acquire)
    }

    /// Stops the journal: the running transaction never commits, nothing later does, and
    /// what committed before stays in the log for recovery. The file system calls this when
    /// an operation failed halfway, so that its partial changes cannot reach the disk.
    pub fn abort(&self, reason: String) {
        let mut st = self.shared.state.lock();
        self.shared.abort(&mut st, JournalError::Halted(reason));
    }

    /// The journal's error, once it has aborted.
    pub fn aborted(&self) -> Option<JournalError> {
        self.shared.state.lock().aborted.clone()
    }

    /// The newest committing or committed bytes of `block` that are not yet at home, if
    /// any: a reader that missed in its cache must use these instead of the home block.
    pub fn committed_copy(&self, block: u64) -> Option<Arc<[u8]>> {
        let st = self.shared.state.lock();
        let committing = st
            .committing
            .iter()
            .rev()
            .find_map(|t| t.block_index.get(&block).map(|&i| t.blocks[i].1.clone()));
        committing.or_else(|| {
            st.checkpoint
                .blocks
                .get(&block)
                .map(|(_, data)| data.clone())
        })
    }

    pub fn stats(&self) -> JournalStats {
        self.shared.state.lock().stats
    }

    pub fn block_size(&self) -> u32 {
        self.shared.block_size
    }

    pub fn max_transaction_blocks(&self) -> u32 {
        self.shared.max_transaction_blocks
    }

    /// Commits what is running, then writes every committed block home and moves the log
    /// tail (the checkpoint thread does the work).
    pub fn checkpoint(&self) -> Result<(), JournalError> {
        let upto = self.commit_all()?;
        let shared = &self.shared;
        let mut st = shared.state.lock();
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            if st.in_log.front().is_none_or(|t| tid_gt(t.tid, upto)) {
                return Ok(());
            }
            // Asked again after every chunk: the thread goes on while someone waits.
            st.checkpoint_requested = true;
            shared.checkpoint_wake.notify_one();
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
        let _io = self.shared.checkpoint_io.lock();
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
        if !st.in_log.is_empty() || !st.checkpoint.blocks.is_empty() {
            // A timer commit slipped in after the checkpoint: checkpoint it too.
            drop(st);
            drop(_io);
            return self.empty_log();
        }
        let sb = self.shared.layout().superblock_block(0, st.next_tid);
        // Under the lock, so no commit can start between the write and the flag.
        crate::checkpoint::write_superblock(&self.shared, sb)?;
        st.superblock_says_empty = true;
        st.log.head = self.shared.layout().first;
        st.log.tail = self.shared.layout().first;
        Ok(())
    }

    /// Clean shutdown: commit what is running, stop the threads, checkpoint, and mark the
    /// journal empty on disk. After an abort, only stops the threads and returns the abort
    /// error (the committed log stays for recovery).
    pub fn shutdown(&self) -> Result<(), JournalError> {
        let committed = self.commit_all();
        self.stop_threads()?;
        committed?;
        crate::checkpoint::checkpoint(&self.shared)?;
        let st = self.shared.state.lock();
        if st.superblock_says_empty {
            // Nothing was logged since load (a read-only mount, or an idle one): the
            // superblock on disk already says empty, and a read-only device must not be
            // written.
            return Ok(());
        }
        let sb = self.shared.layout().superblock_block(0, st.next_tid);
        drop(st);
        crate::checkpoint::write_superblock(&self.shared, sb)
    }

    /// Stops the commit thread (it commits what is running first), then the flush thread
    /// (it makes what was dispatched durable first) and the checkpoint thread.
    fn stop_threads(&self) -> Result<(), JournalError> {
        let mut threads = self.threads.lock();
        {
            let mut st = self.shared.state.lock();
            st.shutting_down = true;
            self.shared.commit_wake.notify_all();
            self.shared.changed.notify_all();
        }
        let mut result = Ok(());
        if let Some(thread) = threads.commit.take() {
            result = result.and(join(thread, "commit"));
        }
        {
            let mut st = self.shared.state.lock();
            st.helpers_stop = true;
            self.shared.flush_wake.notify_all();
            self.shared.checkpoint_wake.notify_all();
        }
        if let Some(thread) = threads.flush.take() {
            result = result.and(join(thread, "flush"));
        }
        if let Some(thread) = threads.checkpoint.take() {
            result = result.and(join(thread, "checkpoint"));
        }
        result
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.stop_threads();
    }
}

fn spawn(
    name: &str,
    shared: &Arc<Shared>,
    body: fn(Arc<Shared>),
) -> Result<JoinHandle<()>, JournalError> {
    let shared = shared.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || body(shared))
        .map_err(|e| JournalError::Thread(e.to_string()))
}

fn join(thread: JoinHandle<()>, name: &str) -> Result<(), JournalError> {
    thread
        .join()
        .map_err(|_| JournalError::Thread(format!("the {name} thread panicked")))
}

/// Asks for transaction `tid` to be committed, and to be made durable (`durable`) or only
/// dispatched in order; wakes the thread that has work because of it, and only that one.
pub(crate) fn request_commit(shared: &Shared, st: &mut State, tid: Tid, durable: bool) {
    if tid_gt(tid, st.dispatched) && st.commit_requested.is_none_or(|r| tid_gt(tid, r)) {
        st.commit_requested = Some(tid);
        shared.commit_wake.notify_one();
    }
    let wanted = if durable {
        &mut st.durable_requested
    } else {
        &mut st.dispatch_requested
    };
    if wanted.is_none_or(|r| tid_gt(tid, r)) {
        *wanted = Some(tid);
        // A running transaction's commit wakes the flush thread once it is dispatched; a
        // wake-up now would find nothing to do (a context switch on the fsync's path).
        if st.running.as_ref().is_none_or(|t| tid_gt(t.tid, tid)) {
            shared.flush_wake.notify_one();
        }
    }
}

impl Shared {
    /// The shared part of a journal that has committed nothing since load (`state`), on
    /// a device without a barrier write and with no fast-commit area until said otherwise.
    fn new(
        io: Arc<IoQueue>,
        log: Option<Log>,
        block_size: u32,
        config: JournalConfig,
        max_transaction_blocks: u32,
        state: State,
    ) -> Shared {
        let committed = state.committed;
        Shared {
            io,
            log,
            block_size,
            config,
            max_transaction_blocks,
            barrier_device: false,
            state: Mutex::new(state),
            changed: Condvar::new(),
            commit_wake: Condvar::new(),
            flush_wake: Condvar::new(),
            checkpoint_wake: Condvar::new(),
            checkpoint_io: Mutex::new(()),
            fast_commits: crate::fast_commit::FastCommitArea::new(0, 0),
            rings: None,
            group_flush: Default::default(),
            committed_tid: AtomicU32::new(committed),
            dispatched_tid: AtomicU32::new(committed),
        }
    }

    /// Waits until `tid` is durable (`durable`) or dispatched in order, asking for its
    /// commit.
    pub(crate) fn wait_for(&self, tid: Tid, durable: bool) -> Result<(), JournalError> {
        let shared = self;
        let mut st = shared.state.lock();
        let mut asked = false;
        loop {
            if let Some(err) = &st.aborted {
                return Err(err.clone());
            }
            let reached = if durable { st.committed } else { st.dispatched };
            if tid_geq(reached, tid) {
                return Ok(());
            }
            if tid_geq(tid, st.next_tid) {
                // Never started: nothing of it can need committing.
                return Ok(());
            }
            if !asked {
                request_commit(shared, &mut st, tid, durable);
                asked = true;
            }
            shared.changed.wait(&mut st);
        }
    }

    /// Whether a byte record may take a block's home contents as its base (`crate::commit`):
    /// only with a log that takes records, and with flushes, which make the checkpoint's
    /// home writes durable before the log lets go of their versions.
    pub(crate) fn takes_home_bases(&self) -> bool {
        self.config.barrier && self.log.as_ref().is_some_and(|log| log.layout.records())
    }

    /// The last durable transaction.
    pub(crate) fn committed(&self) -> Tid {
        self.committed_tid.load(Ordering::Acquire)
    }

    /// Before the first fast commit after load (or after the log was marked empty): the
    /// superblock must point at the log, with `tid` as its first transaction, or
    /// recovery (Linux's too) would not look at the fast-commit area at all.
    pub(crate) fn point_superblock_at_log(&self, tid: Tid) -> Result<(), JournalError> {
        let mut st = self.state.lock();
        if !st.superblock_says_empty {
            return Ok(());
        }
        debug_assert_eq!(
            st.committed.wrapping_add(1),
            tid,
            "fast commit of a later tid"
        );
        debug_assert!(st.in_log.is_empty());
        let head = st.log.head;
        let sb = self.layout().superblock_block(head, tid);
        crate::checkpoint::write_superblock(self, sb)?;
        st.superblock_says_empty = false;
        st.log.tail = head;
        Ok(())
    }

    pub(crate) fn note_fast_commit(&self, blocks: u32) {
        let mut st = self.state.lock();
        st.stats.fast_commits += 1;
        st.stats.fast_commit_blocks += u64::from(blocks);
    }

    /// The log, which every path that writes to it may take as there: a journal without
    /// one never starts them (no log superblock to point, no room to wait for, no
    /// fast-commit area, commits written home by `crate::home`).
    pub(crate) fn log(&self) -> &Log {
        self.log
            .as_ref()
            .expect("only a journal with a log writes to it")
    }

    pub(crate) fn layout(&self) -> &LogLayout {
        &self.log().layout
    }

    pub(crate) fn area(&self) -> &JournalArea {
        &self.log().area
    }

    /// Free log blocks, counting every block reserved by a committing transaction;
    /// without a log, never short.
    pub(crate) fn log_free(&self, st: &State) -> u32 {
        match &self.log {
            Some(log) => log.layout.free_between(st.log.tail, st.log.head),
            None => u32::MAX,
        }
    }

    /// What a transaction of `buffers` blocks and `revokes` revokes takes: log blocks, or
    /// without a log the blocks it writes home (revokes are not kept: nothing replays).
    pub(crate) fn blocks_needed(&self, buffers: usize, revokes: usize) -> u32 {
        match &self.log {
            Some(log) => log.layout.log_blocks_needed(buffers, revokes),
            None => buffers.try_into().unwrap_or(u32::MAX),
        }
    }

    pub(crate) fn abort(&self, st: &mut State, err: JournalError) {
        if st.aborted.is_none() {
            st.aborted = Some(JournalError::Aborted(Box::new(err)));
        }
        self.changed.notify_all();
        self.commit_wake.notify_all();
        self.flush_wake.notify_all();
        self.checkpoint_wake.notify_all();
    }

    /// Publishes that every transaction up to `tid` was dispatched in order.
    pub(crate) fn publish_dispatched(&self, st: &mut State, tid: Tid) {
        if tid_gt(tid, st.dispatched) {
            st.dispatched = tid;
            self.dispatched_tid.store(tid, Ordering::Release);
            self.changed.notify_all();
        }
    }

    /// Publishes that every transaction up to `tid` is durable.
    pub(crate) fn publish_committed(&self, st: &mut State, tid: Tid) {
        debug_assert!(tid_geq(st.dispatched, tid), "durable before dispatched");
        st.committed = tid;
        self.committed_tid.store(tid, Ordering::Release);
        self.changed.notify_all();
    }

    /// Whether the log is used enough that the checkpoint should run in the background:
    /// a quarter of it, so that the space is usually free again before a writer needs it.
    pub(crate) fn log_wants_checkpoint(&self, st: &State) -> bool {
        let Some(log) = &self.log else {
            return false;
        };
        let len = log.layout.last - log.layout.first;
        self.log_free(st) < len - len / 4
    }

    /// Blocks of logged home blocks one checkpoint chunk covers: an eighth of the log.
    pub(crate) fn checkpoint_chunk_blocks(&self) -> usize {
        self.log.as_ref().map_or(usize::MAX, |log| {
            ((log.layout.last - log.layout.first) / 8).max(1) as usize
        })
    }

    /// Whether a handle of `credits` may join the running transaction as far as log room
    /// goes. Every handle needs the running transaction, with its own credits, to fit in
    /// the free log. A large one (a writeback batch, the producer of journaled megabytes)
    /// also leaves room behind it for the transactions committing ahead of the running
    /// one and for a whole transaction more: when the log fills, the writer waits, and a
    /// small handle — an fsync's — still starts as long as its transaction fits.
    pub(crate) fn log_admits(&self, st: &State, credits: u32) -> bool {
        if self.log.is_none() {
            return true;
        }
        let (buffers, revokes, reserved) = st.running.as_ref().map_or((0, 0, 0), |t| {
            (t.buffers.len(), t.revokes.len(), t.reserved_credits)
        });
        let running = self.blocks_needed(buffers + (reserved + credits) as usize, revokes);
        let free = self.log_free(st);
        if credits < self.large_handle_credits() {
            return free >= running;
        }
        let waiting_for_room: u32 = st
            .committing
            .iter()
            .filter(|t| t.commit_position.is_none())
            .map(|t| self.blocks_needed(t.blocks.len(), t.revokes.len()))
            .sum();
        free >= running + waiting_for_room + self.max_transaction_blocks
    }

    /// Credits from which a handle counts as large (`Shared::log_admits`): a sixteenth of
    /// a transaction, and never fewer than 64 (a metadata operation's, a small fsync's).
    fn large_handle_credits(&self) -> u32 {
        (self.max_transaction_blocks / 16).max(64)
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
        let block = buf.block();
        // The block is in use again: a revoke of it earlier in this transaction no longer
        // applies (JBD2's cancel_revoke).
        let was_revoked = t.revokes.remove(&block);
        let replaced = t.buffers.insert(block, buf.clone());
        // When the log holds nothing of the block, a buffer whose bytes recovery rebuilds
        // holds, before its first change here, what its home block holds: the base of its
        // byte record (`crate::commit`). Kept whole: the change about to be made copies the
        // bytes, as they are shared now.
        t.home_bases.remove(&block);
        let base = replaced.is_none()
            && !was_revoked
            && buf.base_known()
            && t.home_bases.len() < HOME_BASES_PER_TRANSACTION
            && self.shared.takes_home_bases();
        if base && !st.logs_or_revokes(block) {
            let t = st.running.as_mut().expect("checked above");
            t.home_bases.insert(block, buf.bytes());
        }
        let t = st.running.as_mut().expect("checked above");
        if replaced.is_none() {
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
        // The committing list includes a transaction still waiting for log room: it left
        // running (this handle's transaction started after that) and will log its blocks
        // before this transaction's revoke records.
        // Without a log nothing is replayed, so nothing needs revoking.
        let in_log = self.shared.log.is_some() && st.logs(block);
        let t = st
            .running
            .as_mut()
            .expect("a handle's transaction runs until the handle stops");
        t.home_bases.remove(&block);
        if let Some(buf) = t.buffers.remove(&block) {
            // Freed before it ever reached the log: it need not be logged at all. Its
            // change stays in memory, in no transaction: no longer what recovery rebuilds.
            buf.set_running_tid(None);
            buf.set_base_known(false);
            self.credits_left += 1;
            t.reserved_credits += 1;
        }
        if in_log {
            t.revokes.insert(block);
        }
        Ok(())
    }

    /// Says that data was written in place under this handle (data=ordered) and must be
    /// durable before the transaction's commit block: the transaction then commits the
    /// classic way (flush, then commit block), whatever `CommitMode` says.
    pub fn note_ordered_data(&mut self) {
        assert!(!self.stopped, "a stopped handle was used");
        let mut st = self.shared.state.lock();
        if let Some(t) = st.running.as_mut() {
            debug_assert_eq!(t.tid, self.tid);
            t.ordered_data = true;
        }
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
        // Only a lock-down waits for handles to stop (issue 11: a wake-up per stop cost
        // most of the daemon's time in the scheduler).
        if t.locked && t.updates == 0 {
            // The committer may be an fsync on its own thread, beside the idle commit
            // thread on the same condvar.
            self.shared.commit_wake.notify_all();
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop_inner();
    }
}
