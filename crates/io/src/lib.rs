//! The IO layer: requests with flags, and their dispatch to a [`BlockDevice`].
//!
//! Every write carries [`IoFlags`] from the start, because the barrier-enabled IO stack
//! (BarrierFS, `papers/004_…`) changes what they mean without changing who sets them:
//!
//! - `PREFLUSH`: flush the device cache before this write (JBD2's commit block).
//! - `FUA`: this write is durable when it completes.
//! - `ORDERED`: this write must not be reordered before earlier ordered writes.
//! - `BARRIER`: this write ends an epoch; on a barrier-capable device, nothing of a later
//!   epoch becomes durable before all of this one.
//!
//! Today's scheduler is FIFO and dispatch is synchronous: a batch is issued in order, with
//! adjacent contiguous writes merged into one device request, and a [`IoTicket`] that is
//! already complete when [`IoQueue::submit`] returns. FIFO dispatch already preserves the
//! order `ORDERED` and `BARRIER` ask for; what it cannot give without a flush is durability
//! order, so callers that need it still use `PREFLUSH`/`FUA`. The epoch scheduler and
//! order-preserving dispatch with a queue depth replace this module's internals, not its
//! interface.
//!
//! This layer must never reorder requests within a batch, merge across a `PREFLUSH`, or
//! report a batch complete when any part of it failed.

use bitflags::bitflags;
use jext_device::{BlockDevice, DeviceError};
use std::sync::Arc;

pub use jext_device;

bitflags! {
    /// How a write relates to the writes around it; see the module documentation.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct IoFlags: u8 {
        const ORDERED = 1 << 0;
        const BARRIER = 1 << 1;
        const PREFLUSH = 1 << 2;
        const FUA = 1 << 3;
    }
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
}

impl WriteRequest {
    pub fn new(offset: u64, data: IoBuf, flags: IoFlags) -> WriteRequest {
        WriteRequest {
            offset,
            data,
            flags,
        }
    }
}

/// The completion of a submitted batch.
#[must_use = "a ticket must be waited on to learn whether the IO succeeded"]
pub struct IoTicket {
    result: Result<(), DeviceError>,
}

impl IoTicket {
    /// Blocks until the batch completed, and reports the first failure if any.
    pub fn wait(self) -> Result<(), DeviceError> {
        self.result
    }
}

/// Largest single device write that merging may build.
const MAX_MERGED_BYTES: usize = 8 << 20;

/// The queue between the layers above and one device.
pub struct IoQueue {
    device: Arc<dyn BlockDevice>,
}

impl IoQueue {
    pub fn new(device: Arc<dyn BlockDevice>) -> IoQueue {
        IoQueue { device }
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.device.read_at(offset, buf)
    }

    /// Issues the writes in order. Adjacent contiguous writes are merged when neither
    /// the later one asks for a preflush nor their FUA flags differ.
    pub fn submit(&self, batch: Vec<WriteRequest>) -> IoTicket {
        IoTicket {
            result: self.dispatch(batch),
        }
    }

    /// Writes one request and waits for it.
    pub fn write(&self, offset: u64, data: IoBuf, flags: IoFlags) -> Result<(), DeviceError> {
        self.submit(vec![WriteRequest::new(offset, data, flags)])
            .wait()
    }

    /// Makes every completed write durable.
    pub fn flush(&self) -> Result<(), DeviceError> {
        self.device.flush()
    }

    fn dispatch(&self, batch: Vec<WriteRequest>) -> Result<(), DeviceError> {
        let mut i = 0;
        while i < batch.len() {
            let first = &batch[i];
            if first.flags.contains(IoFlags::PREFLUSH) {
                self.device.flush()?;
            }
            let fua = first.flags.contains(IoFlags::FUA);
            let mut end = first.offset + first.data.len() as u64;
            let mut run_len = first.data.len();
            let mut j = i + 1;
            while j < batch.len() {
                let next = &batch[j];
                let mergeable = next.offset == end
                    && !next.flags.contains(IoFlags::PREFLUSH)
                    && next.flags.contains(IoFlags::FUA) == fua
                    && run_len + next.data.len() <= MAX_MERGED_BYTES;
                if !mergeable {
                    break;
                }
                end += next.data.len() as u64;
                run_len += next.data.len();
                j += 1;
            }
            if j == i + 1 {
                self.device.write_at(first.offset, &first.data, fua)?;
            } else {
                let mut merged = Vec::with_capacity(run_len);
                for req in &batch[i..j] {
                    merged.extend_from_slice(&req.data);
                }
                self.device.write_at(first.offset, &merged, fua)?;
            }
            i = j;
        }
        Ok(())
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
