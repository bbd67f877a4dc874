//! A simulated device: memory with a volatile write cache, for tests and experiments.
//!
//! A write is readable at once but durable only after a later flush, or at once when it
//! carries FUA. A crash ([`SimDevice::crash`]) keeps what was durable and, optionally, any
//! subset of the writes still in the cache ([`SimDevice::crash_keeping`]), which is what a
//! real disk with a volatile cache may do. With capture on, every request is logged
//! ([`CrashCapture`]), so a crash explorer can rebuild the durable image at any point of a
//! workload. Faults ([`SimFault`]) make writes or flushes fail, or break the durability
//! model on purpose (a dropped flush, a write reordered across a flush) so tests can prove
//! the crash checks notice.
//!
//! A barrier-capable simulator ([`SimDevice::with_barrier_write`]) takes barrier writes: each
//! one logs the capture's epoch marker ([`LoggedOp::Barrier`]) after its write, so crash
//! states keep every earlier epoch before anything of a later one; a FUA write after a
//! barrier first persists the earlier epochs (the device writes back in epoch order). The
//! fault [`SimFault::LateBarriers`] breaks that on purpose. A [`LatencyModel`]
//! ([`SimDevice::with_latency`]) times every command on a device timeline, through the
//! device's own command queue; without one (the default) every command completes at once,
//! so tests stay fast.
//!
//! Storage is sparse (4 KiB chunks, absent = zeros), so a 1 GiB simulated device costs only
//! what was written.

use crate::capture::{CrashCapture, LoggedOp};
use crate::latency::{LatencyModel, TimedQueue};
use crate::{
    check_range, refuse_barrier, BlockDevice, Capabilities, Command, CommandDone, CommandQueue,
    DeviceCounters, DeviceError, DeviceOp, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

const SIM_SECTOR_SIZE: u32 = 512;
const CHUNK: usize = 4096;

/// Faults a test can inject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// Every write after this many more successful writes fails with EIO.
    FailWritesAfter(u64),
    /// Every flush fails with EIO.
    FailFlushes,
    /// Flushes report success but make nothing durable: breaks the model, for tests
    /// that must show a crash check catches a lying device. A capture shows no flush.
    DropFlushes,
    /// At each flush, the last cached write issued before it is kept back and persists
    /// only as if issued after the flush: a write reordered across a flush, the other
    /// lie a crash check must catch. A capture logs that write after the flush.
    ReorderAcrossFlushes,
    /// A barrier-capable device that keeps a barrier's epoch marker back until after the
    /// next write: that write of a later epoch may persist without the earlier epoch, the
    /// lie an epoch-order check must catch.
    LateBarriers,
}

/// Sparse bytes in 4 KiB chunks (an absent chunk reads as zeros): the content of a
/// simulated disk, cheap to clone for the many crash states built from one capture.
#[derive(Clone, Default)]
pub struct SparseImage {
    map: HashMap<u64, Arc<[u8]>>,
}

impl SparseImage {
    /// Copies `data` in at `offset`; chunks shared with a clone are copied first.
    pub fn write(&mut self, mut offset: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let chunk = offset / CHUNK as u64;
            let within = (offset % CHUNK as u64) as usize;
            let n = (CHUNK - within).min(data.len());
            let slot = self
                .map
                .entry(chunk)
                .or_insert_with(|| Arc::from(vec![0u8; CHUNK]));
            let dst = match Arc::get_mut(slot) {
                Some(dst) => dst,
                None => {
                    *slot = Arc::from(&slot[..]);
                    Arc::get_mut(slot).expect("a fresh copy has one owner")
                }
            };
            dst[within..within + n].copy_from_slice(&data[..n]);
            offset += n as u64;
            data = &data[n..];
        }
    }

    /// Fills `buf` from `offset`.
    pub fn read(&self, mut offset: u64, mut buf: &mut [u8]) {
        while !buf.is_empty() {
            let chunk = offset / CHUNK as u64;
            let within = (offset % CHUNK as u64) as usize;
            let n = (CHUNK - within).min(buf.len());
            match self.map.get(&chunk) {
                Some(src) => buf[..n].copy_from_slice(&src[within..within + n]),
                None => buf[..n].fill(0),
            }
            offset += n as u64;
            buf = &mut buf[n..];
        }
    }
}

struct PendingWrite {
    offset: u64,
    data: Arc<[u8]>,
}

struct SimState {
    current: SparseImage,
    durable: SparseImage,
    pending: Vec<PendingWrite>,
    capture: Option<(SparseImage, Vec<LoggedOp>)>,
    faults: Vec<SimFault>,
    writes_seen: u64,
    /// A barrier write is among the pending (cached) writes.
    pending_barrier: bool,
    /// A barrier marker held back by [`SimFault::LateBarriers`].
    late_barrier: bool,
}

/// The device's content and behaviour, shared with the timeline's service thread.
pub(crate) struct SimCore {
    size_bytes: u64,
    barrier_write: bool,
    state: Mutex<SimState>,
    counters: DeviceCounters,
}

pub struct SimDevice {
    core: Arc<SimCore>,
    /// With a latency model: the timeline every command goes through.
    timed: Option<TimedQueue>,
}

impl SimDevice {
    /// A zeroed device of `size_bytes` (a multiple of 512).
    pub fn new(size_bytes: u64) -> SimDevice {
        assert_eq!(size_bytes % u64::from(SIM_SECTOR_SIZE), 0);
        SimDevice::from_image(size_bytes, SparseImage::default())
    }

    /// A device whose durable content is `durable`.
    pub fn from_image(size_bytes: u64, durable: SparseImage) -> SimDevice {
        SimDevice {
            core: Arc::new(SimCore {
                size_bytes,
                barrier_write: false,
                state: Mutex::new(SimState {
                    current: durable.clone(),
                    durable,
                    pending: Vec::new(),
                    capture: None,
                    faults: Vec::new(),
                    writes_seen: 0,
                    pending_barrier: false,
                    late_barrier: false,
                }),
                counters: DeviceCounters::default(),
            }),
            timed: None,
        }
    }

    /// The same device, able to take barrier writes. Call before sharing the device.
    pub fn with_barrier_write(mut self) -> SimDevice {
        Arc::get_mut(&mut self.core)
            .expect("a new device is not shared yet")
            .barrier_write = true;
        self
    }

    /// The same device, timing every command by `model` on a service thread of its own.
    /// Call before sharing the device.
    pub fn with_latency(mut self, model: LatencyModel) -> SimDevice {
        self.timed = Some(TimedQueue::start(self.core.clone(), model));
        self
    }

    /// A device whose durable content is a copy of the image file at `path`.
    pub fn from_image_file(path: &std::path::Path) -> std::io::Result<SimDevice> {
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let size_bytes = file.metadata()?.len();
        let mut chunks = SparseImage::default();
        let mut buf = vec![0u8; CHUNK];
        let mut offset = 0u64;
        while offset < size_bytes {
            let n = (size_bytes - offset).min(CHUNK as u64) as usize;
            file.read_exact(&mut buf[..n])?;
            if buf[..n].iter().any(|&b| b != 0) {
                chunks.write(offset, &buf[..n]);
            }
            offset += n as u64;
        }
        Ok(SimDevice::from_image(size_bytes, chunks))
    }

    /// Writes what is durable now to an image file (sparse), for `e2fsck` or a loop mount.
    pub fn write_durable_image(&self, path: &std::path::Path) -> std::io::Result<()> {
        let state = self.core.state.lock();
        write_image(&state.durable, self.core.size_bytes, path)
    }

    /// Writes what a reader sees now (durable or not) to an image file.
    pub fn write_current_image(&self, path: &std::path::Path) -> std::io::Result<()> {
        let state = self.core.state.lock();
        write_image(&state.current, self.core.size_bytes, path)
    }

    /// A new device holding only what is durable: the crash lost the whole write cache.
    pub fn crash(&self) -> SimDevice {
        self.crash_keeping(|_| false)
    }

    /// A new device holding what is durable plus the cached writes (numbered in issue
    /// order from 0) for which `keep` says true, applied in issue order.
    pub fn crash_keeping(&self, keep: impl Fn(usize) -> bool) -> SimDevice {
        let state = self.core.state.lock();
        let mut image = state.durable.clone();
        for (i, w) in state.pending.iter().enumerate() {
            if keep(i) {
                image.write(w.offset, &w.data);
            }
        }
        SimDevice::from_image(self.core.size_bytes, image)
    }

    /// How many writes sit in the volatile cache.
    pub fn pending_writes(&self) -> usize {
        self.core.state.lock().pending.len()
    }

    pub fn inject(&self, fault: SimFault) {
        self.core.state.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.core.state.lock().faults.clear();
    }

    /// Starts logging every request. The device first drains its cache into durable
    /// storage (a disk may always do that), so the capture starts from one known image.
    pub fn start_capture(&self) {
        let mut state = self.core.state.lock();
        persist_pending(&mut state);
        state.capture = Some((state.durable.clone(), Vec::new()));
    }

    /// Logs a marker (for example "fsync of /a returned") at this point of the capture.
    pub fn mark(&self, label: impl Into<String>) {
        if let Some((_, log)) = &mut self.core.state.lock().capture {
            log.push(LoggedOp::Mark(label.into()));
        }
    }

    /// How many requests and marks the running capture holds.
    pub fn capture_len(&self) -> usize {
        self.core
            .state
            .lock()
            .capture
            .as_ref()
            .map_or(0, |(_, log)| log.len())
    }

    /// Ends the capture and returns it.
    pub fn take_capture(&self) -> Option<CrashCapture> {
        let (base, ops) = self.core.state.lock().capture.take()?;
        Some(CrashCapture::new(self.core.size_bytes, base, ops))
    }

    /// A copy of what is durable now (for starting many devices from one image).
    pub fn durable_image(&self) -> SparseImage {
        self.core.state.lock().durable.clone()
    }

    fn check_write_fault(state: &mut SimState, offset: u64, len: usize) -> Result<(), DeviceError> {
        for fault in &state.faults {
            if let SimFault::FailWritesAfter(n) = fault {
                if state.writes_seen >= *n {
                    return Err(DeviceError::media(
                        DeviceOp::Write,
                        offset,
                        len,
                        "injected media error (SimFault::FailWritesAfter)",
                    ));
                }
            }
        }
        Ok(())
    }
}

fn write_image(
    chunks: &SparseImage,
    size_bytes: u64,
    path: &std::path::Path,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::create(path)?;
    file.set_len(size_bytes)?;
    for (chunk, data) in &chunks.map {
        let offset = chunk * CHUNK as u64;
        let n = (size_bytes - offset).min(CHUNK as u64) as usize;
        file.write_all_at(&data[..n], offset)?;
    }
    Ok(())
}

impl SimCore {
    /// Carries out one write at once (the timeline, if any, decides when it is called).
    pub(crate) fn write(
        &self,
        offset: u64,
        data: &[u8],
        flags: WriteFlags,
    ) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        SimDevice::check_write_fault(&mut state, offset, data.len())?;
        state.writes_seen += 1;
        let len = data.len();
        let fua = flags.contains(WriteFlags::FUA);
        let barrier = flags.contains(WriteFlags::BARRIER);
        let data: Arc<[u8]> = Arc::from(data);
        state.current.write(offset, &data);
        if fua && state.pending_barrier {
            // A FUA write of a later epoch may not persist before the cached writes of the
            // earlier ones: the device writes them back first, as a flush would.
            persist_pending(&mut state);
            if let Some((_, log)) = &mut state.capture {
                log.push(LoggedOp::Flush);
            }
        }
        if fua {
            // A FUA write is durable at once. Cached writes to the same sectors are older;
            // a disk may persist them first (it may persist any cached write at any time),
            // which keeps the newest bytes on top.
            let end = offset + data.len() as u64;
            let (overlapping, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut state.pending)
                .into_iter()
                .partition(|w| w.offset < end && offset < w.offset + w.data.len() as u64);
            state.pending = rest;
            for w in overlapping {
                state.durable.write(w.offset, &w.data);
            }
            state.durable.write(offset, &data);
        } else {
            state.pending.push(PendingWrite {
                offset,
                data: data.clone(),
            });
            state.pending_barrier |= barrier;
        }
        let late = state.faults.contains(&SimFault::LateBarriers);
        let held_barrier = std::mem::replace(&mut state.late_barrier, barrier && late);
        if let Some((_, log)) = &mut state.capture {
            log.push(LoggedOp::Write { offset, data, fua });
            if held_barrier || (barrier && !late) {
                log.push(LoggedOp::Barrier);
            }
        }
        drop(state);
        self.counters.record_write(len, fua);
        Ok(())
    }

    /// Carries out one flush at once.
    pub(crate) fn flush(&self) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        if state.faults.contains(&SimFault::FailFlushes) {
            return Err(DeviceError::media(
                DeviceOp::Flush,
                0,
                0,
                "injected flush failure (SimFault::FailFlushes)",
            ));
        }
        if state.faults.contains(&SimFault::DropFlushes) {
            drop(state);
            self.counters.record_flush();
            return Ok(());
        }
        let held_back = if state.faults.contains(&SimFault::ReorderAcrossFlushes) {
            state.pending.pop()
        } else {
            None
        };
        persist_pending(&mut state);
        if let Some((_, log)) = &mut state.capture {
            let moved = held_back.as_ref().and_then(|w| {
                let at = log.iter().rposition(|op| {
                    matches!(op, LoggedOp::Write { offset, fua: false, .. } if *offset == w.offset)
                })?;
                Some(log.remove(at))
            });
            log.push(LoggedOp::Flush);
            log.extend(moved);
        }
        state.pending.extend(held_back);
        drop(state);
        self.counters.record_flush();
        Ok(())
    }

    /// Carries out one command at once.
    pub(crate) fn execute(&self, command: &Command) -> Result<(), DeviceError> {
        match command {
            Command::Write {
                offset,
                data,
                flags,
            } => self.write(*offset, data, *flags),
            Command::Flush => self.flush(),
        }
    }
}

/// Every cached write becomes durable, in issue order.
fn persist_pending(state: &mut SimState) {
    let pending = std::mem::take(&mut state.pending);
    for w in pending {
        state.durable.write(w.offset, &w.data);
    }
    state.pending_barrier = false;
}

impl BlockDevice for SimDevice {
    fn size_bytes(&self) -> u64 {
        self.core.size_bytes
    }

    fn sector_size(&self) -> u32 {
        SIM_SECTOR_SIZE
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        self.core.state.lock().current.read(offset, buf);
        self.core.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
        refuse_barrier(self, offset, data, flags)?;
        match &self.timed {
            Some(timed) => timed.run(Command::Write {
                offset,
                data: Arc::from(data),
                flags,
            }),
            None => self.core.write(offset, data, flags),
        }
    }

    fn flush(&self) -> Result<(), DeviceError> {
        match &self.timed {
            Some(timed) => timed.run(Command::Flush),
            None => self.core.flush(),
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: true,
            native_fua: true,
            barrier_write: self.core.barrier_write,
            queue_depth: self.timed.as_ref().map(|t| t.model().queue_depth),
        }
    }

    fn command_queue(&self) -> Option<&dyn CommandQueue> {
        Some(self)
    }

    fn counters(&self) -> &DeviceCounters {
        &self.core.counters
    }

    fn describe(&self) -> String {
        let barrier = if self.core.barrier_write {
            ", barrier write"
        } else {
            ""
        };
        let timing = self
            .timed
            .as_ref()
            .map_or(String::new(), |t| format!(", {}", t.model().describe()));
        format!(
            "simulated device ({} MiB, volatile cache{barrier}{timing})",
            self.core.size_bytes >> 20
        )
    }
}

/// The simulator's own queue: timed by the latency model if there is one, otherwise every
/// command completes inside `dispatch`, in dispatch order.
impl CommandQueue for SimDevice {
    fn dispatch(&self, command: Command, done: CommandDone) {
        let checked = match &command {
            Command::Write {
                offset,
                data,
                flags,
            } => check_range(self, DeviceOp::Write, *offset, data.len())
                .and_then(|()| refuse_barrier(self, *offset, data, *flags)),
            Command::Flush => Ok(()),
        };
        if let Err(e) = checked {
            return done(Err(e));
        }
        match &self.timed {
            Some(timed) => timed.dispatch(command, done),
            None => done(self.core.execute(&command)),
        }
    }

    fn keeps_dispatch_order(&self) -> bool {
        true
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The first byte of the sector at `offset`.
    pub(crate) fn read(dev: &SimDevice, offset: u64) -> u8 {
        let mut b = [0u8; 512];
        dev.read_at(offset, &mut b).unwrap();
        b[0]
    }

    #[test]
    fn unflushed_writes_are_lost_in_a_crash() {
        let dev = SimDevice::new(1 << 20);
        dev.write_at(0, &[1u8; 512], false).unwrap();
        dev.flush().unwrap();
        dev.write_at(512, &[2u8; 512], false).unwrap();
        dev.write_at(1024, &[3u8; 512], true).unwrap();
        assert_eq!(read(&dev, 512), 2, "a write is readable at once");
        let after = dev.crash();
        assert_eq!(
            (read(&after, 0), read(&after, 512), read(&after, 1024)),
            (1, 0, 3)
        );
        let kept = dev.crash_keeping(|i| i == 0);
        assert_eq!(read(&kept, 512), 2);
    }

    #[test]
    fn fua_over_a_cached_write_keeps_the_newest_bytes() {
        let dev = SimDevice::new(1 << 20);
        dev.write_at(0, &[1u8; 1024], false).unwrap();
        dev.write_at(512, &[2u8; 512], true).unwrap();
        let after = dev.crash();
        assert_eq!((read(&after, 0), read(&after, 512)), (1, 2));
    }

    #[test]
    fn faults_fail_requests_or_break_durability() {
        let dev = SimDevice::new(1 << 20);
        dev.inject(SimFault::FailWritesAfter(1));
        dev.write_at(0, &[1u8; 512], false).unwrap();
        let err = dev.write_at(512, &[1u8; 512], false).unwrap_err();
        assert_eq!(err.errno(), libc::EIO);
        dev.clear_faults();
        dev.inject(SimFault::DropFlushes);
        dev.flush().unwrap();
        assert_eq!(
            read(&dev.crash(), 0),
            0,
            "a dropped flush made nothing durable"
        );
        dev.clear_faults();
        dev.inject(SimFault::FailFlushes);
        assert!(dev.flush().is_err());
    }

    #[test]
    fn barrier_writes_are_refused_without_barrier_support_and_logged_with_it() {
        let plain = SimDevice::new(1 << 20);
        let err = plain
            .write(0, &[1u8; 512], WriteFlags::BARRIER)
            .unwrap_err();
        assert_eq!(err.errno(), libc::EOPNOTSUPP, "{err}");
        assert!(!plain.capabilities().barrier_write);

        let dev = SimDevice::new(1 << 20).with_barrier_write();
        assert!(dev.capabilities().barrier_write);
        dev.start_capture();
        dev.write(0, &[1u8; 512], WriteFlags::BARRIER).unwrap();
        dev.write(512, &[2u8; 512], WriteFlags::FUA).unwrap();
        let cap = dev.take_capture().unwrap();
        let kinds: Vec<&str> = cap
            .ops()
            .iter()
            .map(|op| match op {
                LoggedOp::Write { fua: false, .. } => "write",
                LoggedOp::Write { fua: true, .. } => "fua",
                LoggedOp::Barrier => "barrier",
                LoggedOp::Flush => "flush",
                LoggedOp::Mark(_) => "mark",
            })
            .collect();
        assert_eq!(
            kinds,
            ["write", "barrier", "flush", "fua"],
            "a FUA write of a later epoch first persists the earlier one"
        );
        assert_eq!(read(&dev.crash(), 0), 1);
    }
}
