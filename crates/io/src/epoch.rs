//! The epoch-based scheduler (BarrierFS §3.4): which issued writes may go to the device
//! next, merged into which commands, and when a flush is needed.
//!
//! An *epoch* is the set of order-preserving writes (`ORDERED`) issued up to and including
//! a barrier write (`BARRIER`). Writes of one epoch are sorted by offset and merged freely;
//! orderless writes belong to no epoch and go whenever they can (with the next epoch, as
//! the paper lets them). An epoch's writes become eligible only once every earlier epoch is
//! *released*:
//!
//! - on a device with a barrier write (and an engine that keeps dispatch order): when the
//!   earlier epoch's last write was dispatched, carrying the device's barrier flag
//!   (epoch-based barrier reassignment: the last of the epoch to leave gets the flag);
//!   the next epoch follows at once (Wait-on-Dispatch);
//! - otherwise, by the fence the barrier write asked for: [`Fence::Caller`] releases when
//!   the epoch is dispatched (no persist order is claimed; the caller keeps it, by in-order
//!   recovery); [`Fence::Flush`] releases when every write of the epoch transferred and a
//!   flush dispatched after that completed (Transfer-and-Flush, done here, not by the
//!   caller).
//!
//! One flush is in flight at a time, as Linux's block layer keeps one per queue
//! (`blk-flush`): a flush wanted meanwhile is dispatched when that one completes, and
//! then covers every write completed by then. Fsyncs whose writes complete during one
//! flush so share the next (a group flush); dispatching each at once would make every
//! device flush cover one or two of them, at the same cost each. A wanted flush also
//! waits for the sync writes (not background writeback) in flight when it was first
//! wanted, at most one write's time, so that fsyncs whose writes are in the device
//! together share it.
//!
//! A `PREFLUSH` write is a full drain: it goes only after everything issued before it has
//! transferred and a flush after that completed, and nothing issued after it goes first.
//! Writes to overlapping bytes go in issue order, a later one only after the earlier one
//! transferred.
//!
//! Promises: a write of a later epoch is never dispatched before the earlier epoch is
//! released; the barrier flag reaches the device only in barrier mode; a failed ordered
//! write fails every ordered write of a later epoch, dispatched or not, and every ordered
//! write issued after the failure. This module holds no locks and runs no threads: the
//! dispatcher drives it, and tests drive it directly.

use crate::ticket::TicketState;
use crate::{Fence, FsyncClock, IoBuf, IoFlags};
use jext_device::{Command, DeviceError, DeviceOp, WriteFlags};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// Largest single device write that merging may build.
pub(crate) const MAX_MERGED_BYTES: usize = 8 << 20;

/// Largest device write merged from `BACKGROUND` writes when the device is theirs alone.
const BACKGROUND_MERGED_BYTES: usize = 1 << 20;

/// Largest device write merged from `BACKGROUND` writes shortly after an fsync started:
/// what its writes find ahead of them in the device, and about what its flush must make
/// durable of them besides its own. Measured on data=journal's fsync tail beside a writer, where the
/// checkpoint's home writes made the slow fsyncs
/// (bench/results/2026-11-27-fsync-tail-quiet).
const BACKGROUND_MERGED_BYTES_FSYNC: usize = 128 << 10;

/// `BACKGROUND` commands in the device at once while other IO is about (a write that is
/// not background, or a flush, issued within [`SYNC_ACTIVE`]); blk-wbt's "normal" limit on
/// a fast device is of this order.
const BACKGROUND_IN_FLIGHT_BUSY: usize = 2;

/// `BACKGROUND` commands in the device at once shortly after an fsync started.
const BACKGROUND_IN_FLIGHT_FSYNC: usize = 1;

/// `BACKGROUND` commands in the device at once when it is theirs alone: enough to keep a
/// device streaming; a sync write arriving then finds at most this many ahead of it once.
const BACKGROUND_IN_FLIGHT_IDLE: usize = 8;

/// How long after a sync write or a flush the device counts as busy with sync IO. Longer
/// than the gaps of a program that syncs every so often: at 100 ms, iJournaling's tester
/// (80 KiB, 100 ms pause, fsync) found up to eight 1 MiB background commands ahead of its
/// write each time, whose wait made its slow fsyncs beside a writer
/// (bench/results/2026-11-28-fsync-tail-paper).
const SYNC_ACTIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// One issued write.
pub(crate) struct Request {
    seq: u64,
    offset: u64,
    data: IoBuf,
    flags: IoFlags,
    /// The epoch of an ordered write; `None` for an orderless one.
    epoch: Option<u64>,
    ticket: Arc<TicketState>,
    /// For a `PREFLUSH` write: the flush it waits for, once it was asked for.
    preflush: Option<u64>,
}

impl Request {
    /// Where it sorts among pending writes: by offset, then issue order.
    fn key(&self) -> (u64, u64) {
        (self.offset, self.seq)
    }

    fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }

    fn overlaps(&self, offset: u64, end: u64) -> bool {
        self.offset < end && offset < self.end()
    }

    fn fua(&self) -> bool {
        self.flags.contains(IoFlags::FUA)
    }

    fn background(&self) -> bool {
        self.flags.contains(IoFlags::BACKGROUND)
    }
}

#[derive(Default)]
struct Epoch {
    /// Set when the barrier write that ends the epoch was issued.
    closed: Option<Fence>,
    pending_ordered: usize,
    untransferred_ordered: usize,
    /// The flush a [`Fence::Flush`] waits for, once asked for.
    fence_flush: Option<u64>,
}

enum InFlight {
    Write {
        offset: u64,
        end: u64,
        requests: Vec<Request>,
        background: bool,
    },
    Flush {
        number: u64,
    },
}

/// What the scheduler observed about the device queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueStats {
    /// Write commands dispatched (after merging).
    pub write_commands: u64,
    /// Writes issued that went out inside those commands.
    pub writes: u64,
    pub flushes: u64,
    /// Most commands in the device at once.
    pub max_queue_depth: usize,
    /// Commands in the device, averaged over the time since the stats were reset.
    pub mean_queue_depth: f64,
}

/// Issued writes not yet dispatched, by (offset, issue sequence), in two classes kept
/// apart: a pass that plans one class never walks the other (thousands of queued
/// `BACKGROUND` writeback writes would otherwise be walked on every completion).
#[derive(Default)]
struct Pending {
    sync: BTreeMap<(u64, u64), Request>,
    background: BTreeMap<(u64, u64), Request>,
}

impl Pending {
    fn insert(&mut self, r: Request) {
        let class = self.class_mut(r.background());
        let old = class.insert(r.key(), r);
        assert!(old.is_none(), "issue sequences are unique");
    }

    fn class_mut(&mut self, background: bool) -> &mut BTreeMap<(u64, u64), Request> {
        if background {
            &mut self.background
        } else {
            &mut self.sync
        }
    }

    /// One class, by offset.
    fn class(&self, background: bool) -> &BTreeMap<(u64, u64), Request> {
        if background {
            &self.background
        } else {
            &self.sync
        }
    }

    fn get(&self, key: (u64, u64)) -> Option<&Request> {
        self.sync.get(&key).or_else(|| self.background.get(&key))
    }

    fn get_mut(&mut self, key: (u64, u64)) -> Option<&mut Request> {
        match self.sync.get_mut(&key) {
            Some(r) => Some(r),
            None => self.background.get_mut(&key),
        }
    }

    fn remove(&mut self, key: (u64, u64)) -> Option<Request> {
        self.sync
            .remove(&key)
            .or_else(|| self.background.remove(&key))
    }

    /// Writes of both classes starting in `[from, end)`.
    fn starting_in(&self, from: u64, end: u64) -> impl Iterator<Item = &Request> {
        let range = (from, 0)..(end, 0);
        self.sync
            .range(range.clone())
            .chain(self.background.range(range))
            .map(|(_, r)| r)
    }

    fn all(&self) -> impl Iterator<Item = &Request> {
        self.sync.values().chain(self.background.values())
    }

    fn is_empty(&self) -> bool {
        self.sync.is_empty() && self.background.is_empty()
    }
}

/// The scheduler's state; see the module documentation.
pub(crate) struct Scheduler {
    barrier_mode: bool,
    volatile_cache: bool,
    /// Issued, not yet dispatched.
    pending: Pending,
    /// The longest request ever issued, to bound overlap searches.
    max_len: u64,
    next_seq: u64,
    /// Issue sequence of every write not yet completed (pending or in flight).
    untransferred: BTreeSet<u64>,
    /// Pending `PREFLUSH` writes: issue sequence → offset.
    preflush_pending: BTreeMap<u64, u64>,
    epochs: BTreeMap<u64, Epoch>,
    open_epoch: u64,
    first_unreleased: u64,
    in_flight: HashMap<u64, InFlight>,
    /// Commands in flight made of `BACKGROUND` writes.
    background_in_flight: usize,
    /// When the last write that is not `BACKGROUND`, or a flush, was issued.
    last_sync_io: Option<Instant>,
    /// When the last fsync started ([`crate::IoQueue::note_fsync`]).
    fsyncs: Arc<FsyncClock>,
    next_tag: u64,
    flushes_dispatched: u64,
    /// A flush is in flight: the next one waits for it.
    flush_in_flight: bool,
    /// The wanted flush waits for the sync write commands that were in flight when it
    /// was first wanted: those with tags up to this one.
    flush_company: Option<u64>,
    /// The flush after which every write completed so far is durable: the first one
    /// dispatched after the last completion that needed one (0: none did).
    covering_flush: u64,
    /// The highest-numbered flush that completed successfully.
    max_ok_flush: u64,
    failed_flush: Option<(u64, DeviceError)>,
    /// The highest flush number someone waits for.
    flush_wanted: u64,
    /// The first ordered write that failed, and its epoch: nothing ordered after it goes.
    order_failure: Option<(u64, DeviceError)>,
    stats: StatsClock,
}

struct StatsClock {
    stats: QueueStats,
    since: Instant,
    last_change: Instant,
    depth_area_ns: f64,
}

impl Scheduler {
    pub(crate) fn new(
        barrier_mode: bool,
        volatile_cache: bool,
        fsyncs: Arc<FsyncClock>,
    ) -> Scheduler {
        let now = Instant::now();
        Scheduler {
            barrier_mode,
            volatile_cache,
            pending: Pending::default(),
            max_len: 0,
            next_seq: 0,
            untransferred: BTreeSet::new(),
            preflush_pending: BTreeMap::new(),
            epochs: BTreeMap::new(),
            open_epoch: 0,
            first_unreleased: 0,
            in_flight: HashMap::new(),
            background_in_flight: 0,
            last_sync_io: None,
            fsyncs,
            next_tag: 0,
            flushes_dispatched: 0,
            flush_in_flight: false,
            flush_company: None,
            covering_flush: 0,
            max_ok_flush: 0,
            failed_flush: None,
            flush_wanted: 0,
            order_failure: None,
            stats: StatsClock {
                stats: QueueStats::default(),
                since: now,
                last_change: now,
                depth_area_ns: 0.0,
            },
        }
    }

    /// Takes one write into the queue.
    pub(crate) fn issue(
        &mut self,
        offset: u64,
        data: IoBuf,
        flags: IoFlags,
        fence: Fence,
        ticket: Arc<TicketState>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if !flags.contains(IoFlags::BACKGROUND) {
            self.last_sync_io = Some(Instant::now());
        }
        let ordered = flags.intersects(IoFlags::ORDERED | IoFlags::BARRIER);
        if ordered {
            if let Some((_, err)) = &self.order_failure {
                ticket.failed_undispatched(not_ordered(err, offset, data.len()));
                return;
            }
        }
        let epoch = ordered.then_some(self.open_epoch);
        if let Some(e) = epoch {
            let epoch = self.epochs.entry(e).or_default();
            epoch.pending_ordered += 1;
            epoch.untransferred_ordered += 1;
            if flags.contains(IoFlags::BARRIER) {
                epoch.closed = Some(fence);
                self.open_epoch += 1;
            }
        }
        if flags.contains(IoFlags::PREFLUSH) {
            self.preflush_pending.insert(seq, offset);
        }
        self.max_len = self.max_len.max(data.len() as u64);
        self.untransferred.insert(seq);
        self.pending.insert(Request {
            seq,
            offset,
            data,
            flags,
            epoch,
            ticket,
            preflush: None,
        });
    }

    /// Asks for a flush numbered at least `number` (see [`Scheduler::next_flush`]).
    pub(crate) fn want_flush(&mut self, number: u64) {
        self.last_sync_io = Some(Instant::now());
        if number > self.flushes_dispatched && self.flush_wanted <= self.flushes_dispatched {
            self.flush_company = self.sync_writes_in_flight().max();
        }
        self.flush_wanted = self.flush_wanted.max(number);
    }

    /// Tags of the write commands in flight that are not background writeback.
    fn sync_writes_in_flight(&self) -> impl Iterator<Item = u64> + '_ {
        self.in_flight.iter().filter_map(|(&tag, c)| {
            matches!(
                c,
                InFlight::Write {
                    background: false,
                    ..
                }
            )
            .then_some(tag)
        })
    }

    /// Whether the wanted flush may go now: none in flight, and the company it waits for
    /// transferred.
    fn flush_may_go(&self) -> bool {
        let waiting_for_company = self
            .flush_company
            .is_some_and(|last| self.sync_writes_in_flight().any(|tag| tag <= last));
        self.flush_wanted > self.flushes_dispatched && !self.flush_in_flight && !waiting_for_company
    }

    /// The number the next dispatched flush will get: it will cover every write that
    /// completed before it.
    pub(crate) fn next_flush(&self) -> u64 {
        self.flushes_dispatched + 1
    }

    /// The flush that makes every write completed so far durable; it may be dispatched
    /// or done already (0: no completed write needs one).
    pub(crate) fn covering_flush(&self) -> u64 {
        self.covering_flush
    }

    /// Whether flush `number` (or a later one) completed; an error if the flush that was
    /// to cover it failed and no later one succeeded.
    pub(crate) fn flush_outcome(&self, number: u64) -> Option<Result<(), DeviceError>> {
        if self.max_ok_flush >= number {
            return Some(Ok(()));
        }
        match &self.failed_flush {
            Some((failed, err)) if *failed >= number => Some(Err(err.clone())),
            _ => None,
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Nothing waits to be planned.
    pub(crate) fn pending_is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Nothing pending, nothing in flight.
    pub(crate) fn is_idle(&self) -> bool {
        self.pending.is_empty() && self.in_flight.is_empty()
    }

    /// Plans up to `slots` commands, in the order they must be dispatched. Each is
    /// recorded in flight under its tag, and its writes' tickets say dispatched.
    pub(crate) fn plan(&mut self, slots: usize) -> Vec<(u64, Command)> {
        let mut out = Vec::new();
        while out.len() < slots {
            self.advance();
            if self.flush_may_go() {
                out.push(self.plan_flush());
                continue;
            }
            let planned = self.plan_writes(slots - out.len());
            if planned.is_empty() {
                break;
            }
            out.extend(planned);
        }
        out
    }

    fn plan_flush(&mut self) -> (u64, Command) {
        self.flushes_dispatched += 1;
        self.flush_in_flight = true;
        self.flush_company = None;
        let number = self.flushes_dispatched;
        self.stats.stats.flushes += 1;
        (self.start(InFlight::Flush { number }), Command::Flush)
    }

    fn start(&mut self, command: InFlight) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.stats.depth_changes(self.in_flight.len());
        self.in_flight.insert(tag, command);
        let depth = self.in_flight.len();
        let s = &mut self.stats.stats;
        s.max_queue_depth = s.max_queue_depth.max(depth);
        tag
    }

    /// Releases every epoch whose condition holds, and asks for the flushes that fences
    /// and preflushes need.
    fn advance(&mut self) {
        while let Some(epoch) = self.epochs.get_mut(&self.first_unreleased) {
            let Some(fence) = epoch.closed else { break };
            if epoch.pending_ordered > 0 {
                break;
            }
            let released = if self.barrier_mode || fence == Fence::Caller {
                true
            } else if epoch.untransferred_ordered > 0 {
                false
            } else {
                let number = *epoch.fence_flush.get_or_insert(self.flushes_dispatched + 1);
                self.flush_wanted = self.flush_wanted.max(number);
                self.max_ok_flush >= number
            };
            if !released {
                break;
            }
            self.epochs.remove(&self.first_unreleased);
            self.first_unreleased += 1;
        }
        if let Some((&seq, &offset)) = self.preflush_pending.first_key_value() {
            let drained = self.untransferred.range(..seq).next().is_none();
            let next = self.flushes_dispatched + 1;
            let request = self
                .pending
                .get_mut((offset, seq))
                .expect("a pending preflush write is pending");
            if drained && request.preflush.is_none() {
                request.preflush = Some(next);
                self.flush_wanted = self.flush_wanted.max(next);
            }
        }
    }

    /// Whether `r` may be dispatched now.
    fn eligible(&self, r: &Request) -> bool {
        if r.epoch.is_some_and(|e| e != self.first_unreleased) {
            return false;
        }
        if let Some((&gate, _)) = self.preflush_pending.first_key_value() {
            if r.seq > gate {
                return false;
            }
            if r.seq == gate && r.preflush.is_none_or(|f| self.max_ok_flush < f) {
                return false;
            }
        }
        let (offset, end) = (r.offset, r.end());
        let in_flight_overlap = self.in_flight.values().any(
            |c| matches!(c, InFlight::Write { offset: o, end: e, .. } if *o < end && offset < *e),
        );
        if in_flight_overlap {
            return false;
        }
        let from = offset.saturating_sub(self.max_len);
        !self
            .pending
            .starting_in(from, end)
            .any(|p| p.seq < r.seq && p.overlaps(offset, end))
    }

    /// Plans up to `slots` write commands from the eligible writes, by offset, merging
    /// contiguous ones: first every write that is not `BACKGROUND`, then background ones
    /// as far as [`Scheduler::background_slots`] lets them.
    fn plan_writes(&mut self, slots: usize) -> Vec<(u64, Command)> {
        let mut runs = self.plan_runs(slots, false);
        let background = slots
            .saturating_sub(runs.len())
            .min(self.background_slots());
        runs.extend(self.plan_runs(background, true));
        let runs: Vec<Vec<Request>> = runs
            .into_iter()
            .map(|keys| {
                keys.iter()
                    .map(|&k| self.pending.remove(k).expect("planned from pending"))
                    .collect()
            })
            .collect();
        let barrier_run = self.barrier_run(&runs);
        runs.into_iter()
            .enumerate()
            .map(|(i, run)| self.start_write(run, barrier_run == Some(i)))
            .collect()
    }

    /// Up to `slots` runs of eligible pending writes, by offset: the keys of each run's
    /// writes, every one of them `BACKGROUND` or none.
    fn plan_runs(&self, slots: usize, background: bool) -> Vec<Vec<(u64, u64)>> {
        let merge_limit = if background && self.fsync_lately() {
            BACKGROUND_MERGED_BYTES_FSYNC
        } else if background {
            BACKGROUND_MERGED_BYTES
        } else {
            MAX_MERGED_BYTES
        };
        let mut runs: Vec<Vec<(u64, u64)>> = Vec::new();
        if slots == 0 {
            return runs;
        }
        let mut run_end = 0u64;
        let mut run_bytes = 0usize;
        let mut run_fua = false;
        for (key, r) in self.pending.class(background) {
            if !self.eligible(r) {
                continue;
            }
            let joins = runs.last().is_some()
                && r.offset == run_end
                && r.fua() == run_fua
                && !r.flags.contains(IoFlags::PREFLUSH)
                && run_bytes + r.data.len() <= merge_limit;
            if joins {
                runs.last_mut().expect("checked").push(*key);
                run_bytes += r.data.len();
            } else {
                if runs.len() == slots {
                    break;
                }
                runs.push(vec![*key]);
                run_bytes = r.data.len();
                run_fua = r.fua();
            }
            run_end = r.end();
        }
        runs
    }

    /// Whether an fsync started lately (see [`crate::IoQueue::note_fsync`]).
    fn fsync_lately(&self) -> bool {
        self.fsyncs.fsync_lately()
    }

    /// Whether sync IO is about: in the device, or issued lately.
    fn sync_busy(&self) -> bool {
        let sync_in_device = self.in_flight.len() > self.background_in_flight;
        sync_in_device
            || self
                .last_sync_io
                .is_some_and(|at| at.elapsed() < SYNC_ACTIVE)
    }

    /// How many more `BACKGROUND` commands may go to the device now: one shortly after an
    /// fsync started, a few while sync IO is about (in the device, or issued
    /// lately), more when the device is theirs alone.
    fn background_slots(&self) -> usize {
        let limit = if self.fsync_lately() {
            BACKGROUND_IN_FLIGHT_FSYNC
        } else if self.sync_busy() {
            BACKGROUND_IN_FLIGHT_BUSY
        } else {
            BACKGROUND_IN_FLIGHT_IDLE
        };
        limit.saturating_sub(self.background_in_flight)
    }

    /// In barrier mode, the run that takes the last ordered write of a closed epoch gets
    /// the barrier flag.
    fn barrier_run(&self, runs: &[Vec<Request>]) -> Option<usize> {
        if !self.barrier_mode {
            return None;
        }
        let epoch = self.epochs.get(&self.first_unreleased)?;
        epoch.closed?;
        let taken = runs.iter().flatten().filter(|r| r.epoch.is_some()).count();
        if taken < epoch.pending_ordered {
            return None;
        }
        runs.iter()
            .rposition(|run| run.iter().any(|r| r.epoch.is_some()))
    }

    fn start_write(&mut self, run: Vec<Request>, barrier: bool) -> (u64, Command) {
        let offset = run[0].offset;
        let end = run[run.len() - 1].end();
        let data: IoBuf = if run.len() == 1 {
            run[0].data.clone()
        } else {
            let mut merged = Vec::with_capacity((end - offset) as usize);
            for r in &run {
                merged.extend_from_slice(&r.data);
            }
            merged.into()
        };
        debug_assert_eq!(data.len() as u64, end - offset, "a run is contiguous");
        let mut flags = WriteFlags::empty();
        flags.set(WriteFlags::FUA, run[0].fua());
        flags.set(WriteFlags::BARRIER, barrier);
        for r in &run {
            if let Some(e) = r.epoch {
                self.epochs
                    .get_mut(&e)
                    .expect("an epoch with pending writes is known")
                    .pending_ordered -= 1;
            }
            if r.flags.contains(IoFlags::PREFLUSH) {
                self.preflush_pending.remove(&r.seq);
            }
            r.ticket.dispatched();
        }
        self.stats.stats.write_commands += 1;
        self.stats.stats.writes += run.len() as u64;
        let background = run[0].background();
        debug_assert!(
            run.iter().all(|r| r.background() == background),
            "a command is all background writes or none"
        );
        self.background_in_flight += usize::from(background);
        let tag = self.start(InFlight::Write {
            offset,
            end,
            requests: run,
            background,
        });
        (
            tag,
            Command::Write {
                offset,
                data,
                flags,
            },
        )
    }

    /// A command completed.
    /// Returns whether the command was a flush.
    pub(crate) fn complete(&mut self, tag: u64, result: Result<(), DeviceError>) -> bool {
        self.stats.depth_changes(self.in_flight.len());
        match self
            .in_flight
            .remove(&tag)
            .expect("a completion of a command in flight")
        {
            InFlight::Flush { number } => {
                self.flush_in_flight = false;
                self.flush_completed(number, result);
                true
            }
            InFlight::Write {
                requests,
                background,
                ..
            } => {
                self.background_in_flight -= usize::from(background);
                for r in requests {
                    self.write_completed(r, result.clone());
                }
                false
            }
        }
    }

    fn write_completed(&mut self, r: Request, result: Result<(), DeviceError>) {
        self.untransferred.remove(&r.seq);
        if let Some(epoch) = r.epoch.and_then(|e| self.epochs.get_mut(&e)) {
            epoch.untransferred_ordered -= 1;
        }
        let durable_after = if r.fua() || !self.volatile_cache {
            0
        } else {
            self.flushes_dispatched + 1
        };
        self.covering_flush = self.covering_flush.max(durable_after);
        if let (Some(e), Err(err)) = (r.epoch, &result) {
            self.fail_order(e, err.clone());
        }
        if let (Some(e), Some((failed, err))) = (r.epoch, &self.order_failure) {
            if e > *failed {
                r.ticket.poison(not_ordered(err, r.offset, r.data.len()));
            }
        }
        r.ticket.transferred(result, durable_after);
    }

    fn flush_completed(&mut self, number: u64, result: Result<(), DeviceError>) {
        match result {
            Ok(()) => self.max_ok_flush = self.max_ok_flush.max(number),
            Err(err) => {
                if self.failed_flush.as_ref().is_none_or(|(n, _)| *n < number) {
                    self.failed_flush = Some((number, err.clone()));
                }
                self.flush_failed(number, err);
            }
        }
    }

    /// A flush failed: the fence and the preflush writes that waited for it fail.
    fn flush_failed(&mut self, number: u64, err: DeviceError) {
        if self.max_ok_flush >= number {
            return;
        }
        let fenced = self
            .epochs
            .get(&self.first_unreleased)
            .and_then(|e| e.fence_flush)
            .is_some_and(|f| f <= number);
        if fenced {
            self.fail_order(self.first_unreleased, err.clone());
        }
        let waiting: Vec<(u64, u64)> = self
            .preflush_pending
            .iter()
            .map(|(&seq, &offset)| (offset, seq))
            .filter(|&k| {
                self.pending
                    .get(k)
                    .is_some_and(|r| r.preflush.is_some_and(|f| f <= number))
            })
            .collect();
        for key in waiting {
            let r = self.pending.remove(key).expect("listed as pending");
            self.preflush_pending.remove(&r.seq);
            self.drop_unsent(r, err.clone());
        }
    }

    /// An ordered write of `epoch` failed: every ordered write of a later epoch fails,
    /// and so does every ordered write issued from now on.
    fn fail_order(&mut self, epoch: u64, err: DeviceError) {
        if self.order_failure.is_none() {
            self.order_failure = Some((epoch, err.clone()));
        }
        let later: Vec<(u64, u64)> = self
            .pending
            .all()
            .filter(|r| r.epoch.is_some_and(|e| e > epoch))
            .map(Request::key)
            .collect();
        for key in later {
            let r = self.pending.remove(key).expect("listed as pending");
            self.preflush_pending.remove(&r.seq);
            let failure = not_ordered(&err, r.offset, r.data.len());
            self.drop_unsent(r, failure);
        }
    }

    /// A pending write that will never be dispatched.
    fn drop_unsent(&mut self, r: Request, err: DeviceError) {
        self.untransferred.remove(&r.seq);
        if let Some(epoch) = r.epoch.and_then(|e| self.epochs.get_mut(&e)) {
            epoch.pending_ordered -= 1;
            epoch.untransferred_ordered -= 1;
        }
        r.ticket.failed_undispatched(err);
    }

    /// The stats since the last call, and a fresh start.
    pub(crate) fn take_stats(&mut self) -> QueueStats {
        self.stats.depth_changes(self.in_flight.len());
        let elapsed_ns = self.stats.since.elapsed().as_nanos() as f64;
        let mut stats = self.stats.stats;
        stats.mean_queue_depth = if elapsed_ns > 0.0 {
            self.stats.depth_area_ns / elapsed_ns
        } else {
            0.0
        };
        let now = Instant::now();
        self.stats = StatsClock {
            stats: QueueStats {
                max_queue_depth: self.in_flight.len(),
                ..QueueStats::default()
            },
            since: now,
            last_change: now,
            depth_area_ns: 0.0,
        };
        stats
    }
}

impl StatsClock {
    /// The depth was `depth` from the last change until now.
    fn depth_changes(&mut self, depth: usize) {
        let now = Instant::now();
        self.depth_area_ns += depth as f64 * (now - self.last_change).as_nanos() as f64;
        self.last_change = now;
    }
}

/// The error of a write that was not (or not validly) written because an earlier ordered
/// write failed.
fn not_ordered(cause: &DeviceError, offset: u64, len: usize) -> DeviceError {
    DeviceError::media(
        DeviceOp::Write,
        offset,
        len,
        &format!("not written in order: an earlier ordered write failed ({cause})"),
    )
}
