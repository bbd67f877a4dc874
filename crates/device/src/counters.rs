//! IO counters kept by every backend. They count requests as the device received them,
//! so "flushes per fsync" is a fact about the stack above, not about timing.

use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};

/// Live, lock-free counters owned by a device.
#[derive(Debug, Default)]
pub struct DeviceCounters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
}

/// A copy of the counters at one moment; subtract two snapshots to get a delta.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub reads: u64,
    pub read_bytes: u64,
    /// Write requests, FUA ones included.
    pub writes: u64,
    pub write_bytes: u64,
    /// Write requests that carried FUA.
    pub fua_writes: u64,
    /// Cache flush requests.
    pub flushes: u64,
}

impl DeviceCounters {
    pub fn record_read(&self, bytes: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn record_write(&self, bytes: usize, fua: bool) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn record_flush(&self) {
        self.flushes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            write_bytes: self.write_bytes.load(Ordering::Relaxed),
            fua_writes: self.fua_writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
        }
    }
}

impl Sub for CounterSnapshot {
    type Output = CounterSnapshot;
    fn sub(self, earlier: CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            reads: self.reads - earlier.reads,
            read_bytes: self.read_bytes - earlier.read_bytes,
            writes: self.writes - earlier.writes,
            write_bytes: self.write_bytes - earlier.write_bytes,
            fua_writes: self.fua_writes - earlier.fua_writes,
            flushes: self.flushes - earlier.flushes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_subtract_to_deltas() {
        let c = DeviceCounters::default();
        c.record_write(4096, false);
        let before = c.snapshot();
        c.record_write(512, true);
        c.record_flush();
        c.record_read(1024);
        let d = c.snapshot() - before;
        assert_eq!(
            d,
            CounterSnapshot {
                reads: 1,
                read_bytes: 1024,
                writes: 1,
                write_bytes: 512,
                fua_writes: 1,
                flushes: 1
            }
        );
    }
}
