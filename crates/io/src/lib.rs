//! The IO layer: the barrier-enabled IO stack of BarrierFS (`papers/004_…`) between the
//! journal and a [`BlockDevice`]. Its parts, one module each:
//!
//! - `epoch`: the epoch-based scheduler (I = D: reorder and merge within an epoch, never
//!   across a barrier; orderless writes go whenever they can);
//! - `dispatch`: order-preserving dispatch (D = X on a device that keeps dispatch order:
//!   the next epoch goes without waiting for the last one's transfer);
//! - `engine`, `uring`, `threads`: how commands reach the device (inline, the device's own
//!   queue, io_uring, a thread pool);
//! - `ticket`: completions in three stages, dispatched, transferred, durable.
//!
//! Every write carries [`IoFlags`]:
//!
//! - `ORDERED`: this write belongs to the current epoch.
//! - `BARRIER`: this write ends the current epoch (implies `ORDERED`). On a barrier-capable
//!   device (the simulator's barrier mode; X = P) the last write of the epoch reaches the
//!   device as a barrier write and nothing of a later epoch persists before the epoch.
//!   On any other device the IO layer never pretends: the request's [`Fence`] says how the
//!   boundary is kept, by a flush the IO layer issues ([`Fence::Flush`]) or by the caller
//!   ([`Fence::Caller`]: dispatch in order, no persist order claimed).
//! - `PREFLUSH`: a full drain before this write: everything issued before it transferred
//!   and flushed, nothing issued after it dispatched first.
//! - `FUA`: this write is durable when it completes.
//! - `BACKGROUND`: writeback nobody waits for yet (the writeback thread, dirty
//!   throttling). It yields to every other write and is metered into the device a little
//!   at a time while other IO is about, as Linux's writeback throttling (blk-wbt) meters
//!   it, so that an fsync's few writes never queue behind megabytes of someone else's
//!   writeback. It changes when a write goes, never what it is ordered against.
//!
//! [`IoQueue::new`] is today's synchronous queue (the inline engine, queue depth 1), which
//! [`IoQueue::submit`], [`IoQueue::write`] and [`IoQueue::flush`] keep meaning what they
//! meant: a batch is written when `wait` returns, `PREFLUSH`/`FUA` give durability order,
//! and `ORDERED`/`BARRIER` cost nothing more (the caller waits anyway).
//! [`IoQueue::with_config`] picks an asynchronous engine and a queue depth; [`IoQueue::issue`]
//! returns at once with a ticket for each stage.
//!
//! io_uring and the thread engine were measured against each other with `jext bench
//! io-order`; the figures and the choice are in `crate::engine`.
//!
//! This layer must never dispatch a write of a later epoch before the earlier epoch is
//! released, send a barrier write to a device that cannot keep it, merge across a
//! `PREFLUSH`, or report a batch complete when any part of it failed.

mod dispatch;
mod engine;
mod epoch;
mod threads;
mod ticket;
mod uring;

pub use engine::EngineKind;
pub use epoch::QueueStats;
pub use ticket::IoTicket;

use bitflags::bitflags;
use dispatch::Dispatcher;
use jext_device::{BlockDevice, Capabilities, DeviceError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use jext_device;

bitflags! {
    /// How a write relates to the writes around it; see the module documentation.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct IoFlags: u8 {
        const ORDERED = 1 << 0;
        const BARRIER = 1 << 1;
        const PREFLUSH = 1 << 2;
        const FUA = 1 << 3;
        const BACKGROUND = 1 << 4;
    }
}

/// How the end of an epoch is kept on a device without a barrier write (on a device with
/// one, the barrier write keeps it and no flush is issued).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fence {
    /// By a flush: nothing of the next epoch is dispatched until every write of this one
    /// has transferred and a flush after that has completed. The caller does not wait.
    #[default]
    Flush,
    /// By the caller: the next epoch is dispatched as soon as this one is, and the IO
    /// layer claims no persist order between them (the journal's in-order recovery keeps
    /// it).
    Caller,
}

/// Bytes to write; shared so that a journal can hand the IO layer a frozen block without
/// copying it.
pub type IoBuf = Arc<[u8]>;

/// One write: `data` at byte `offset` of the device.
#[derive(Clone, Debug)]
pub struct WriteRequest {
    pub offset: u64,
    pub data: IoBuf,
    pub flags: IoFlags,
    /// How a `BARRIER` write's epoch end is kept on a device without a barrier write;
    /// ignored on other writes.
    pub fence: Fence,
}

impl WriteRequest {
    /// A write; a barrier among `flags` is kept by a flush where the device cannot keep it.
    pub fn new(offset: u64, data: IoBuf, flags: IoFlags) -> WriteRequest {
        WriteRequest {
            offset,
            data,
            flags,
            fence: Fence::Flush,
        }
    }

    /// A barrier write (`ORDERED|BARRIER` and `extra`) ending the current epoch, kept by
    /// `fence` where the device has no barrier write.
    pub fn barrier(offset: u64, data: IoBuf, extra: IoFlags, fence: Fence) -> WriteRequest {
        WriteRequest {
            offset,
            data,
            flags: extra | IoFlags::ORDERED | IoFlags::BARRIER,
            fence,
        }
    }
}

/// How a queue reaches its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoConfig {
    pub engine: EngineKind,
    /// Most commands in the device at once (the device's own limit, if lower, wins).
    pub queue_depth: usize,
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            engine: EngineKind::Auto,
            queue_depth: 32,
        }
    }
}

/// The queue between the layers above and one device.
pub struct IoQueue {
    device: Arc<dyn BlockDevice>,
    dispatcher: Arc<Dispatcher>,
}

impl IoQueue {
    /// Today's synchronous queue: each command runs on the calling thread.
    pub fn new(device: Arc<dyn BlockDevice>) -> IoQueue {
        let config = IoConfig {
            engine: EngineKind::Inline,
            queue_depth: 1,
        };
        IoQueue::with_config(device, config).expect("the inline engine works on every device")
    }

    /// A queue with the engine and depth of `config`.
    pub fn with_config(
        device: Arc<dyn BlockDevice>,
        config: IoConfig,
    ) -> Result<IoQueue, DeviceError> {
        let sink = engine::Sink::default();
        let engine = engine::build(config.engine, &device, config.queue_depth, sink.clone())?;
        let caps = device.capabilities();
        let depth = engine
            .depth()
            .min(config.queue_depth.max(1))
            .min(caps.queue_depth.unwrap_or(usize::MAX));
        let barrier_mode = caps.barrier_write && engine.keeps_dispatch_order();
        let dispatcher = Arc::new(Dispatcher::new(
            engine,
            depth,
            barrier_mode,
            caps.volatile_cache,
        ));
        sink.connect(&dispatcher);
        Ok(IoQueue { device, dispatcher })
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// What the device can do.
    pub fn capabilities(&self) -> Capabilities {
        self.device.capabilities()
    }

    /// Whether epochs are kept by the device's barrier write (else by fences).
    pub fn barrier_mode(&self) -> bool {
        self.dispatcher.barrier_mode()
    }

    /// The engine in use ("io_uring", "threads", "native", "inline").
    pub fn engine_name(&self) -> &'static str {
        self.dispatcher.engine_name()
    }

    /// Most commands in the device at once.
    pub fn queue_depth(&self) -> usize {
        self.dispatcher.depth()
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.device.read_at(offset, buf)
    }

    /// Issues a batch and returns at once; the ticket waits for each stage.
    pub fn issue(&self, batch: Vec<WriteRequest>) -> IoTicket {
        self.dispatcher.issue(batch, None)
    }

    /// Today's meaning: issues the writes, and the ticket's `wait` returns once they are
    /// written (FUA ones durable). Adjacent contiguous writes are merged when the later one
    /// asks for no preflush and their FUA flags agree. A barrier here never costs a flush:
    /// the caller orders by waiting and by `PREFLUSH`/`FUA`.
    pub fn submit(&self, batch: Vec<WriteRequest>) -> IoTicket {
        self.dispatcher.issue(batch, Some(Fence::Caller))
    }

    /// Writes one request and waits for it.
    pub fn write(&self, offset: u64, data: IoBuf, flags: IoFlags) -> Result<(), DeviceError> {
        self.submit(vec![WriteRequest::new(offset, data, flags)])
            .wait()
    }

    /// Makes every write that completed before this call durable (one flush, shared with
    /// any other caller that asks before it is dispatched).
    pub fn flush(&self) -> Result<(), DeviceError> {
        self.dispatcher.wait_for_flush(self.next_flush())
    }

    /// The number the next dispatched flush will get: it will cover every write completed
    /// before this call, whoever dispatches it ([`IoQueue::wait_for_flush`]).
    pub fn next_flush(&self) -> u64 {
        self.dispatcher.next_flush()
    }

    /// The number of the flush after which every write completed before this call is
    /// durable, for [`IoQueue::wait_for_flush`] later: that flush may be dispatched or
    /// done by then for someone else, and nothing completed since then counts. 0: no
    /// completed write needs a flush.
    pub fn covering_flush(&self) -> u64 {
        self.dispatcher.covering_flush()
    }

    /// Waits until flush `number` of [`IoQueue::covering_flush`] (or a later one) is
    /// done, dispatching it if nobody did yet; at once for 0.
    pub fn wait_for_flush(&self, number: u64) -> Result<(), DeviceError> {
        if number == 0 {
            return Ok(());
        }
        self.dispatcher.wait_for_flush(number)
    }

    /// Notes that an fsync starts: for a while background writes go to the device one
    /// short command at a time, so that the writes of this fsync and of those that follow
    /// it closely find little ahead of them, and their flushes little of theirs to make
    /// durable.
    pub fn note_fsync(&self) {
        self.dispatcher.fsyncs.note_start();
    }

    /// What the queue saw since the last call (queue depth over time, commands, flushes).
    pub fn take_stats(&self) -> QueueStats {
        self.dispatcher.take_stats()
    }
}

/// When the last fsync started ([`IoQueue::note_fsync`]).
#[derive(Default)]
pub(crate) struct FsyncClock {
    /// Nanoseconds from `base` to the last fsync's start.
    last_start_ns: AtomicU64,
    base: OnceLock<Instant>,
}

/// How long after an fsync starts the queue keeps background writes short. A stream of
/// fsyncs keeps them short throughout; a single long fsync (its own bulk writeback, a
/// checkpoint it needs) would only be slowed down by them after this.
const FSYNC_SHORT_WRITES_FOR: Duration = Duration::from_millis(5);

impl FsyncClock {
    fn note_start(&self) {
        let now_ns = self.base.get_or_init(Instant::now).elapsed().as_nanos() as u64;
        self.last_start_ns.fetch_max(now_ns, Ordering::Relaxed);
    }

    /// Whether an fsync started within [`FSYNC_SHORT_WRITES_FOR`].
    pub(crate) fn fsync_lately(&self) -> bool {
        let Some(base) = self.base.get() else {
            return false;
        };
        let now_ns = base.elapsed().as_nanos() as u64;
        let since_start = now_ns.saturating_sub(self.last_start_ns.load(Ordering::Relaxed));
        since_start < FSYNC_SHORT_WRITES_FOR.as_nanos() as u64
    }
}

impl Drop for IoQueue {
    /// Writes issued and not yet completed still go to the device before the queue goes.
    fn drop(&mut self) {
        self.dispatcher.drain();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_device::SimDevice;

    fn buf(byte: u8, len: usize) -> IoBuf {
        Arc::from(vec![byte; len])
    }

    #[test]
    fn contiguous_writes_merge_and_flags_split_runs() {
        let dev = Arc::new(SimDevice::new(1 << 20));
        let q = IoQueue::new(dev.clone());
        let batch = vec![
            WriteRequest::new(0, buf(1, 4096), IoFlags::empty()),
            WriteRequest::new(4096, buf(2, 4096), IoFlags::ORDERED),
            WriteRequest::new(8192, buf(3, 4096), IoFlags::empty()),
            WriteRequest::new(12288, buf(4, 4096), IoFlags::PREFLUSH | IoFlags::FUA),
            WriteRequest::new(65536, buf(5, 512), IoFlags::empty()),
        ];
        q.submit(batch).wait().unwrap();
        let c = dev.counters().snapshot();
        assert_eq!((c.writes, c.flushes, c.fua_writes), (3, 1, 1));
        let mut b = vec![0u8; 16384];
        q.read(0, &mut b).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 1) && b[12288..].iter().all(|&x| x == 4));
        let crashed = dev.crash();
        let mut b = vec![0u8; 512];
        crashed.read_at(12288, &mut b).unwrap();
        assert_eq!(b[0], 4, "the FUA write survives the crash");
        crashed.read_at(0, &mut b).unwrap();
        assert_eq!(b[0], 1, "the preflush made the earlier writes durable");
        crashed.read_at(65536, &mut b).unwrap();
        assert_eq!(b[0], 0, "the write after the FUA was only cached");
    }

    #[test]
    fn a_covering_flush_done_for_someone_else_is_not_done_again() {
        let dev = Arc::new(SimDevice::new(1 << 20));
        let q = IoQueue::new(dev.clone());
        assert_eq!(q.covering_flush(), 0, "nothing written, nothing to flush");
        q.write(0, buf(1, 4096), IoFlags::empty()).unwrap();
        let mine = q.covering_flush();
        // Someone else's flush goes first, then another write completes.
        q.flush().unwrap();
        q.write(8192, buf(2, 4096), IoFlags::empty()).unwrap();
        assert!(
            q.covering_flush() > mine,
            "the later write needs a later flush"
        );
        let before = dev.counters().snapshot();
        q.wait_for_flush(mine).unwrap();
        assert_eq!((dev.counters().snapshot() - before).flushes, 0);
        let mut b = vec![0u8; 512];
        let crashed = dev.crash();
        crashed.read_at(0, &mut b).unwrap();
        assert_eq!(b[0], 1, "the covered write is durable");
        crashed.read_at(8192, &mut b).unwrap();
        assert_eq!(b[0], 0, "the write after the flush is not");
        // Waiting for the later write's flush dispatches it.
        q.wait_for_flush(q.covering_flush()).unwrap();
        assert_eq!((dev.counters().snapshot() - before).flushes, 1);
    }

    #[test]
    fn a_failed_write_fails_the_batch() {
        let dev = Arc::new(SimDevice::new(1 << 20));
        dev.inject(jext_device::SimFault::FailWritesAfter(1));
        let q = IoQueue::new(dev);
        let batch = vec![
            WriteRequest::new(0, buf(1, 512), IoFlags::empty()),
            WriteRequest::new(4096, buf(1, 512), IoFlags::empty()),
        ];
        assert!(q.submit(batch).wait().is_err());
    }
}
