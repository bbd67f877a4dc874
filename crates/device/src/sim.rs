//! A simulated device: memory with a volatile write cache, for tests and experiments.
//!
//! A write is readable at once but durable only after a later flush, or at once when it
//! carries FUA. A crash ([`SimDevice::crash`]) keeps what was durable and, optionally, any
//! subset of the writes still in the cache ([`SimDevice::crash_keeping`]), which is what a
//! real disk with a volatile cache may do. With capture on, every request is logged
//! ([`CrashCapture`]), so a crash explorer can rebuild the durable image at any point of a
//! workload. Faults ([`SimFault`]) make writes or flushes fail, or break the durability
//! model on purpose so tests can prove the crash checks notice.
//!
//! Storage is sparse (4 KiB chunks, absent = zeros), so a 1 GiB simulated device costs only
//! what was written.

use crate::{check_range, BlockDevice, DeviceCounters, DeviceError, DeviceOp};
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
    /// that must show a crash check catches a lying device.
    DropFlushes,
}

/// One request as the device received it, for crash exploration.
#[derive(Clone, Debug)]
pub enum LoggedOp {
    Write {
        offset: u64,
        data: Arc<[u8]>,
        fua: bool,
    },
    Flush,
    /// A point the workload marked (a sync call returned, say).
    Mark(String),
}

/// Sparse byte storage in 4 KiB chunks.
#[derive(Clone, Default)]
struct Chunks {
    map: HashMap<u64, Box<[u8]>>,
}

impl Chunks {
    fn write(&mut self, mut offset: u64, mut data: &[u8]) {
        while !data.is_empty() {
            let chunk = offset / CHUNK as u64;
            let within = (offset % CHUNK as u64) as usize;
            let n = (CHUNK - within).min(data.len());
            let dst = self
                .map
                .entry(chunk)
                .or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            dst[within..within + n].copy_from_slice(&data[..n]);
            offset += n as u64;
            data = &data[n..];
        }
    }

    fn read(&self, mut offset: u64, mut buf: &mut [u8]) {
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
    current: Chunks,
    durable: Chunks,
    pending: Vec<PendingWrite>,
    capture: Option<(Chunks, Vec<LoggedOp>)>,
    faults: Vec<SimFault>,
    writes_seen: u64,
}

pub struct SimDevice {
    size_bytes: u64,
    state: Mutex<SimState>,
    counters: DeviceCounters,
}

impl SimDevice {
    /// A zeroed device of `size_bytes` (a multiple of 512).
    pub fn new(size_bytes: u64) -> SimDevice {
        assert_eq!(size_bytes % u64::from(SIM_SECTOR_SIZE), 0);
        SimDevice::from_chunks(size_bytes, Chunks::default())
    }

    fn from_chunks(size_bytes: u64, durable: Chunks) -> SimDevice {
        SimDevice {
            size_bytes,
            state: Mutex::new(SimState {
                current: durable.clone(),
                durable,
                pending: Vec::new(),
                capture: None,
                faults: Vec::new(),
                writes_seen: 0,
            }),
            counters: DeviceCounters::default(),
        }
    }

    /// A device whose durable content is a copy of the image file at `path`.
    pub fn from_image_file(path: &std::path::Path) -> std::io::Result<SimDevice> {
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let size_bytes = file.metadata()?.len();
        let mut chunks = Chunks::default();
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
        Ok(SimDevice::from_chunks(size_bytes, chunks))
    }

    /// Writes what is durable now to an image file (sparse), for `e2fsck` or a loop mount.
    pub fn write_durable_image(&self, path: &std::path::Path) -> std::io::Result<()> {
        let state = self.state.lock();
        write_image(&state.durable, self.size_bytes, path)
    }

    /// Writes what a reader sees now (durable or not) to an image file.
    pub fn write_current_image(&self, path: &std::path::Path) -> std::io::Result<()> {
        let state = self.state.lock();
        write_image(&state.current, self.size_bytes, path)
    }

    /// A new device holding only what is durable: the crash lost the whole write cache.
    pub fn crash(&self) -> SimDevice {
        self.crash_keeping(|_| false)
    }

    /// A new device holding what is durable plus the cached writes (numbered in issue
    /// order from 0) for which `keep` says true, applied in issue order.
    pub fn crash_keeping(&self, keep: impl Fn(usize) -> bool) -> SimDevice {
        let state = self.state.lock();
        let mut image = state.durable.clone();
        for (i, w) in state.pending.iter().enumerate() {
            if keep(i) {
                image.write(w.offset, &w.data);
            }
        }
        SimDevice::from_chunks(self.size_bytes, image)
    }

    /// How many writes sit in the volatile cache.
    pub fn pending_writes(&self) -> usize {
        self.state.lock().pending.len()
    }

    pub fn inject(&self, fault: SimFault) {
        self.state.lock().faults.push(fault);
    }

    pub fn clear_faults(&self) {
        self.state.lock().faults.clear();
    }

    /// Starts logging every request. The device first drains its cache into durable
    /// storage (a disk may always do that), so the capture starts from one known image.
    pub fn start_capture(&self) {
        let mut state = self.state.lock();
        let pending = std::mem::take(&mut state.pending);
        for w in pending {
            state.durable.write(w.offset, &w.data);
        }
        state.capture = Some((state.durable.clone(), Vec::new()));
    }

    /// Logs a marker (for example "fsync of /a returned") at this point of the capture.
    pub fn mark(&self, label: impl Into<String>) {
        if let Some((_, log)) = &mut self.state.lock().capture {
            log.push(LoggedOp::Mark(label.into()));
        }
    }

    /// How many requests and marks the running capture holds.
    pub fn capture_len(&self) -> usize {
        self.state
            .lock()
            .capture
            .as_ref()
            .map_or(0, |(_, log)| log.len())
    }

    /// Ends the capture and returns it.
    pub fn take_capture(&self) -> Option<CrashCapture> {
        let (base, ops) = self.state.lock().capture.take()?;
        Some(CrashCapture {
            size_bytes: self.size_bytes,
            base,
            ops,
        })
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

fn write_image(chunks: &Chunks, size_bytes: u64, path: &std::path::Path) -> std::io::Result<()> {
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

impl BlockDevice for SimDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn sector_size(&self) -> u32 {
        SIM_SECTOR_SIZE
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        self.state.lock().current.read(offset, buf);
        self.counters.record_read(buf.len());
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
        let mut state = self.state.lock();
        SimDevice::check_write_fault(&mut state, offset, data.len())?;
        state.writes_seen += 1;
        let len = data.len();
        let data: Arc<[u8]> = Arc::from(data);
        state.current.write(offset, &data);
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
        }
        if let Some((_, log)) = &mut state.capture {
            log.push(LoggedOp::Write { offset, data, fua });
        }
        drop(state);
        self.counters.record_write(len, fua);
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        let mut state = self.state.lock();
        if state.faults.contains(&SimFault::FailFlushes) {
            return Err(DeviceError::media(
                DeviceOp::Flush,
                0,
                0,
                "injected flush failure (SimFault::FailFlushes)",
            ));
        }
        if !state.faults.contains(&SimFault::DropFlushes) {
            let pending = std::mem::take(&mut state.pending);
            for w in pending {
                state.durable.write(w.offset, &w.data);
            }
        }
        if let Some((_, log)) = &mut state.capture {
            log.push(LoggedOp::Flush);
        }
        drop(state);
        self.counters.record_flush();
        Ok(())
    }

    fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!(
            "simulated device ({} MiB, volatile cache)",
            self.size_bytes >> 20
        )
    }
}

/// A logged run of requests from a known starting image: enough to rebuild the durable
/// image at any crash point of the workload.
pub struct CrashCapture {
    size_bytes: u64,
    base: Chunks,
    ops: Vec<LoggedOp>,
}

impl CrashCapture {
    pub fn ops(&self) -> &[LoggedOp] {
        &self.ops
    }

    /// Indices (into [`CrashCapture::ops`]) of every completed flush.
    pub fn flush_points(&self) -> Vec<usize> {
        self.ops
            .iter()
            .enumerate()
            .filter(|(_, op)| matches!(op, LoggedOp::Flush))
            .map(|(i, _)| i)
            .collect()
    }

    /// The device after a crash just after op `upto` (exclusive end: ops `..upto` were
    /// issued). Everything before the last flush in that prefix, and every FUA write, is
    /// durable; of the writes after that flush, those whose position in the unflushed
    /// window makes `keep` true are kept, in issue order.
    pub fn crash_state(&self, upto: usize, keep: impl Fn(usize) -> bool) -> SimDevice {
        let prefix = &self.ops[..upto];
        let last_flush = prefix.iter().rposition(|op| matches!(op, LoggedOp::Flush));
        let mut image = self.base.clone();
        let window_start = last_flush.map_or(0, |i| i + 1);
        for op in &prefix[..window_start] {
            if let LoggedOp::Write { offset, data, .. } = op {
                image.write(*offset, data);
            }
        }
        let mut window_index = 0;
        for op in &prefix[window_start..] {
            if let LoggedOp::Write { offset, data, fua } = op {
                if *fua || keep(window_index) {
                    image.write(*offset, data);
                }
                if !*fua {
                    window_index += 1;
                }
            }
        }
        SimDevice::from_chunks(self.size_bytes, image)
    }

    /// How many non-FUA writes are unflushed at the end of the prefix `..upto`.
    pub fn window_len(&self, upto: usize) -> usize {
        let prefix = &self.ops[..upto];
        let start = prefix
            .iter()
            .rposition(|op| matches!(op, LoggedOp::Flush))
            .map_or(0, |i| i + 1);
        prefix[start..]
            .iter()
            .filter(|op| matches!(op, LoggedOp::Write { fua: false, .. }))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dev: &SimDevice, offset: u64) -> u8 {
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
    fn capture_rebuilds_each_crash_point() {
        let dev = SimDevice::new(1 << 20);
        dev.write_at(0, &[9u8; 512], false).unwrap();
        dev.start_capture();
        dev.write_at(512, &[1u8; 512], false).unwrap();
        dev.flush().unwrap();
        dev.mark("synced");
        dev.write_at(1024, &[2u8; 512], false).unwrap();
        dev.write_at(1536, &[3u8; 512], false).unwrap();
        let cap = dev.take_capture().unwrap();
        assert_eq!(cap.flush_points(), vec![1]);
        assert_eq!(cap.window_len(cap.ops().len()), 2);
        let before_flush = cap.crash_state(1, |_| false);
        assert_eq!((read(&before_flush, 0), read(&before_flush, 512)), (9, 0));
        let end = cap.crash_state(cap.ops().len(), |i| i == 1);
        assert_eq!(
            (read(&end, 512), read(&end, 1024), read(&end, 1536)),
            (1, 0, 3)
        );
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
}
