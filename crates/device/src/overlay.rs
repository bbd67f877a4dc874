//! A copy-on-write overlay: reads come from a base device unless the overlay holds a newer
//! copy; writes stay in memory. It lets a checker recover a journal and look at the result
//! without changing the image it was given (what `e2fsck -n` promises).
//!
//! The base is never written; flushes are no-ops on it. Writes land in memory in the
//! order they are made and nothing is cached, so every write is as durable as the overlay
//! itself: barrier writes are trivially kept.

use crate::{
    check_range, BlockDevice, Capabilities, DeviceCounters, DeviceError, DeviceOp, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

const SECTOR: u64 = 512;

pub struct OverlayDevice {
    base: Arc<dyn BlockDevice>,
    /// Written sectors by sector number.
    sectors: Mutex<HashMap<u64, Box<[u8; SECTOR as usize]>>>,
    counters: DeviceCounters,
}

impl OverlayDevice {
    pub fn new(base: Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice {
            base,
            sectors: Mutex::new(HashMap::new()),
            counters: DeviceCounters::default(),
        }
    }

    /// Bytes written to the overlay so far.
    pub fn overlay_bytes(&self) -> u64 {
        self.sectors.lock().len() as u64 * SECTOR
    }
}

impl BlockDevice for OverlayDevice {
    fn size_bytes(&self) -> u64 {
        self.base.size_bytes()
    }

    fn sector_size(&self) -> u32 {
        self.base.sector_size().max(SECTOR as u32)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        self.base.read_at(offset, buf)?;
        let sectors = self.sectors.lock();
        for (i, chunk) in buf.chunks_mut(SECTOR as usize).enumerate() {
            if let Some(newer) = sectors.get(&(offset / SECTOR + i as u64)) {
                chunk.copy_from_slice(&newer[..chunk.len()]);
            }
        }
        self.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
        let fua = flags.contains(WriteFlags::FUA);
        let mut sectors = self.sectors.lock();
        for (i, chunk) in data.chunks(SECTOR as usize).enumerate() {
            let mut sector = Box::new([0u8; SECTOR as usize]);
            sector.copy_from_slice(chunk);
            sectors.insert(offset / SECTOR + i as u64, sector);
        }
        self.counters.record_write(data.len(), fua);
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.counters.record_flush();
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            volatile_cache: false,
            native_fua: true,
            barrier_write: true,
            queue_depth: None,
        }
    }

    fn writes_to_memory(&self) -> bool {
        true
    }

    fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!("copy-on-write overlay over {}", self.base.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimDevice;

    #[test]
    fn writes_stay_in_the_overlay() {
        let base = Arc::new(SimDevice::new(1 << 20));
        base.write_at(0, &[1u8; 1024], false).unwrap();
        let over = OverlayDevice::new(base.clone());
        over.write_at(512, &[2u8; 512], false).unwrap();
        let mut b = [0u8; 1024];
        over.read_at(0, &mut b).unwrap();
        assert!(b[..512].iter().all(|&x| x == 1) && b[512..].iter().all(|&x| x == 2));
        base.read_at(0, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 1), "the base is untouched");
        assert_eq!(over.overlay_bytes(), 512);
    }
}
