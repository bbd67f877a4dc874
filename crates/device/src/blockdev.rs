//! A block device node (`/dev/loopN`, `/dev/nvme0n1p2`) opened with `O_DIRECT`, so that
//! jext, not the host page cache, decides when bytes move. `O_DIRECT` needs buffers aligned
//! to the logical block size; this backend bounces through aligned buffers it owns, so
//! callers pass ordinary slices. FUA writes go through a descriptor opened with `O_DSYNC`,
//! which the kernel turns into a FUA write (or write + flush where FUA is not supported).
//! Its capabilities come from sysfs (`queue/write_cache`, `queue/fua`, `queue/nr_requests`);
//! no block device here has a barrier write.

use crate::{
    check_range, refuse_barrier, BlockDevice, Capabilities, DeviceCounters, DeviceError, DeviceOp,
    OwnerLock, Ownership, RawTarget, WriteFlags,
};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Bounce buffers are aligned to this, which satisfies every logical block size Linux has.
pub const DIRECT_IO_ALIGN: usize = 4096;

pub struct BlockDevDevice {
    path: PathBuf,
    file: File,
    dsync_file: Option<File>,
    size_bytes: u64,
    sector_size: u32,
    capabilities: Capabilities,
    counters: DeviceCounters,
    /// Writable opens hold the device's owner lock.
    owner: Ownership,
}

impl BlockDevDevice {
    /// Opens the device; a writable open takes its owner lock (refused while another
    /// process holds it).
    pub fn open(path: &Path, read_only: bool) -> Result<BlockDevDevice, DeviceError> {
        let owner = (!read_only)
            .then(|| OwnerLock::acquire(path, std::time::Duration::ZERO))
            .transpose()?;
        BlockDevDevice::open_owned(path, owner)
    }

    /// Opens the device with an owner lock already taken (`None`: read-only).
    pub(crate) fn open_owned(
        path: &Path,
        owner: Option<OwnerLock>,
    ) -> Result<BlockDevDevice, DeviceError> {
        let read_only = owner.is_none();
        let open = |extra_flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(!read_only)
                .custom_flags(libc::O_DIRECT | extra_flags)
                .open(path)
                .map_err(|e| DeviceError::open(path, e))
        };
        let mut file = open(0)?;
        let dsync_file = if read_only {
            None
        } else {
            Some(open(libc::O_DSYNC)?)
        };
        let size_bytes = file
            .seek(SeekFrom::End(0))
            .map_err(|e| DeviceError::open(path, e))?;
        let rdev = file
            .metadata()
            .map_err(|e| DeviceError::open(path, e))?
            .rdev();
        let sector_size = queue_attribute(rdev, "logical_block_size")
            .and_then(|s| s.parse().ok())
            .unwrap_or(512);
        Ok(BlockDevDevice {
            path: path.to_path_buf(),
            file,
            dsync_file,
            size_bytes,
            sector_size,
            capabilities: capabilities(rdev),
            counters: DeviceCounters::default(),
            owner: Ownership::new(owner),
        })
    }
}

/// One attribute of the device's request queue from sysfs, which needs no ioctl.
fn queue_attribute(rdev: u64, name: &str) -> Option<String> {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let text =
        std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/{name}")).ok()?;
    Some(text.trim().to_string())
}

/// What the kernel says of the device. Where sysfs is silent, assume the worst case for
/// durability (a volatile cache, FUA emulated).
fn capabilities(rdev: u64) -> Capabilities {
    Capabilities {
        volatile_cache: queue_attribute(rdev, "write_cache").is_none_or(|s| s != "write through"),
        native_fua: queue_attribute(rdev, "fua").is_some_and(|s| s == "1"),
        barrier_write: false,
        queue_depth: queue_attribute(rdev, "nr_requests").and_then(|s| s.parse().ok()),
    }
}

/// A heap buffer of `len` bytes whose start is aligned for `O_DIRECT`, built from safe
/// slicing of an over-allocated vector.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn zeroed(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIRECT_IO_ALIGN];
        let start = storage.as_ptr().align_offset(DIRECT_IO_ALIGN);
        assert!(start < DIRECT_IO_ALIGN, "cannot align a u8 buffer");
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl BlockDevice for BlockDevDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn sector_size(&self) -> u32 {
        self.sector_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        let mut bounce = AlignedBuf::zeroed(buf.len());
        self.file
            .read_exact_at(bounce.as_mut_slice(), offset)
            .map_err(|e| DeviceError::io(DeviceOp::Read, offset, buf.len(), &e))?;
        buf.copy_from_slice(bounce.as_slice());
        self.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
        self.owner.check_may_write(offset, data.len())?;
        refuse_barrier(self, offset, data, flags)?;
        let fua = flags.contains(WriteFlags::FUA);
        let mut bounce = AlignedBuf::zeroed(data.len());
        bounce.as_mut_slice().copy_from_slice(data);
        let target = match (&self.dsync_file, fua) {
            (Some(dsync), true) => dsync,
            _ => &self.file,
        };
        target
            .write_all_at(bounce.as_slice(), offset)
            .map_err(|e| DeviceError::io(DeviceOp::Write, offset, data.len(), &e))?;
        self.counters.record_write(data.len(), fua);
        Ok(())
    }

    fn flush(&self) -> Result<(), DeviceError> {
        self.file
            .sync_data()
            .map_err(|e| DeviceError::io(DeviceOp::Flush, 0, 0, &e))?;
        self.counters.record_flush();
        Ok(())
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn raw_target(&self) -> Option<RawTarget> {
        Some(RawTarget {
            fd: self.file.as_raw_fd(),
            buffer_align: DIRECT_IO_ALIGN,
        })
    }

    fn counters(&self) -> &DeviceCounters {
        &self.counters
    }

    fn release_owner(&self) {
        self.owner.release();
    }

    fn writable(&self) -> bool {
        self.owner.writable()
    }

    fn describe(&self) -> String {
        format!(
            "block device {} ({} MiB, {}-byte sectors, O_DIRECT)",
            self.path.display(),
            self.size_bytes >> 20,
            self.sector_size
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned() {
        for len in [512, 4096, 12288] {
            let b = AlignedBuf::zeroed(len);
            assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
            assert_eq!(b.as_slice().len(), len);
        }
    }
}
