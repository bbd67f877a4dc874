//! The device layer: where bytes meet storage.
//!
//! A [`BlockDevice`] reads and writes byte ranges aligned to its sector size, flushes its
//! volatile write cache, and writes with the flags of the command ([`WriteFlags`]: FUA,
//! durable when the call returns without flushing anything else; BARRIER, on a device that
//! has a barrier write). Each backend states what it can do ([`Capabilities`]), and may
//! offer the IO layer an asynchronous path: a file descriptor for io_uring
//! ([`BlockDevice::raw_target`]) or a command queue of its own
//! ([`BlockDevice::command_queue`], the simulator's). Every backend counts what it does in
//! [`DeviceCounters`], so that benchmarks and tests can report writes, bytes and flushes per
//! fsync without timing anything.
//!
//! Backends:
//! - [`FileDevice`]: an image file, pread/pwrite, flush = `fdatasync`.
//! - [`BlockDevDevice`]: a block device such as `/dev/loop0`, opened with `O_DIRECT`.
//! - [`SimDevice`]: memory with a volatile write cache, crash capture and fault injection;
//!   the seam through which every crash test runs the real stack. Optionally barrier-capable
//!   and timed by a [`LatencyModel`] (presets for the paper's device classes).
//! - [`OverlayDevice`]: copy-on-write over another device, so a checker can recover a
//!   journal without changing the image.
//!
//! What this layer promises: a write is visible to reads as soon as it returns; it is
//! durable after a later `flush` returns, or at once when written with FUA. It promises no
//! ordering between writes that are not separated by a flush: that is the IO layer's job.
//! On a barrier-capable device, a barrier write's epoch persists before anything written
//! after it. It must never reorder bytes within one write, never report success for an IO
//! that failed, and never accept a barrier write it cannot keep.

mod blockdev;
mod capture;
mod command;
mod counters;
mod error;
mod file;
mod latency;
mod overlay;
mod owner;
mod sim;

pub use blockdev::{AlignedBuf, BlockDevDevice, DIRECT_IO_ALIGN};
pub use capture::{CrashCapture, DurableCursor, Kept, LoggedOp, Selection, WindowWrite};
pub use command::{Capabilities, Command, CommandDone, CommandQueue, RawTarget, WriteFlags};
pub use counters::{CounterSnapshot, DeviceCounters};
pub use error::{DeviceError, DeviceOp};
pub use file::FileDevice;
pub use latency::{LatencyModel, Preset};
pub use overlay::OverlayDevice;
pub use owner::{holder as owner_of, Holder, OwnerLock};
pub use sim::{SimDevice, SimFault, SparseImage};

use std::path::Path;
use std::sync::Arc;

/// Storage that holds bytes at offsets. All offsets and lengths passed in must be multiples
/// of [`BlockDevice::sector_size`]; backends check this and refuse misaligned requests.
pub trait BlockDevice: Send + Sync {
    /// Capacity in bytes.
    fn size_bytes(&self) -> u64;
    /// The alignment unit for offsets and lengths (512 for files and simulations; the
    /// logical block size for a real block device).
    fn sector_size(&self) -> u32;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError>;
    /// Writes `data` at `offset` as one command with `flags`: with FUA the bytes are durable
    /// when this returns; a BARRIER write on a device without a barrier write is refused.
    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError>;
    /// Writes `data` at `offset`, with FUA or without: [`BlockDevice::write`] for callers
    /// that need no other flag (tests, tools).
    fn write_at(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), DeviceError> {
        let flags = if fua {
            WriteFlags::FUA
        } else {
            WriteFlags::empty()
        };
        self.write(offset, data, flags)
    }
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), DeviceError>;
    /// What this device can do.
    fn capabilities(&self) -> Capabilities;
    /// A descriptor io_uring may write to directly, if this backend is one. Writes that go
    /// this way skip the backend's own checks (the owner lock's "still may write"), which
    /// only catch bugs above: nothing writes after the file system on it unmounted.
    fn raw_target(&self) -> Option<RawTarget> {
        None
    }
    /// The device's own asynchronous command queue, if it has one.
    fn command_queue(&self) -> Option<&dyn CommandQueue> {
        None
    }
    /// Writes land in memory and complete before `write` returns (a copy-on-write
    /// overlay): an IO engine's threads would only add hand-offs.
    fn writes_to_memory(&self) -> bool {
        false
    }
    /// The live counters of this device.
    fn counters(&self) -> &DeviceCounters;
    /// A short human description ("image file /tmp/a.img (64 MiB)").
    fn describe(&self) -> String;
    /// Gives up the exclusive right to write this device (see [`OwnerLock`]) once the file
    /// system on it is clean; later writes fail. Backends without an owner do nothing.
    fn release_owner(&self) {}
    /// Whether writes may reach this device: false for a read-only open, and once the
    /// owner lock was released.
    fn writable(&self) -> bool {
        true
    }
}

/// Opens `path` as a device: a block device node gets [`BlockDevDevice`], anything else is
/// treated as an image file. A writable open takes the image's [`OwnerLock`] and is refused
/// while another process holds it.
pub fn open_path(path: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>, DeviceError> {
    open_path_waiting(path, read_only, std::time::Duration::ZERO)
}

/// [`open_path`], waiting up to `owner_wait` for another writer to let go of the image.
pub fn open_path_waiting(
    path: &Path,
    read_only: bool,
    owner_wait: std::time::Duration,
) -> Result<Arc<dyn BlockDevice>, DeviceError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|e| DeviceError::open(path, e))?;
    let owner = (!read_only)
        .then(|| OwnerLock::acquire(path, owner_wait))
        .transpose()?;
    if meta.file_type().is_block_device() {
        Ok(Arc::new(BlockDevDevice::open_owned(path, owner)?))
    } else {
        Ok(Arc::new(FileDevice::open_owned(path, owner)?))
    }
}

/// What a backend may do with its device: read only, write as the owner, or nothing more
/// once the owner let go.
pub(crate) struct Ownership(parking_lot::Mutex<OwnerState>);

enum OwnerState {
    ReadOnly,
    Owned(OwnerLock),
    Released,
}

impl Ownership {
    /// `None`: a read-only open.
    pub(crate) fn new(lock: Option<OwnerLock>) -> Ownership {
        Ownership(parking_lot::Mutex::new(match lock {
            Some(lock) => OwnerState::Owned(lock),
            None => OwnerState::ReadOnly,
        }))
    }

    pub(crate) fn release(&self) {
        let mut state = self.0.lock();
        if let OwnerState::Owned(lock) = &mut *state {
            lock.release();
            *state = OwnerState::Released;
        }
    }

    pub(crate) fn writable(&self) -> bool {
        matches!(*self.0.lock(), OwnerState::Owned(_))
    }

    /// A write after the owner let go is a bug above: nothing may change an image whose
    /// file system was declared clean.
    pub(crate) fn check_may_write(&self, offset: u64, len: usize) -> Result<(), DeviceError> {
        let why = match &*self.0.lock() {
            OwnerState::Owned(_) => return Ok(()),
            OwnerState::ReadOnly => "the device was opened read-only",
            OwnerState::Released => {
                "the device's owner lock was released (its file system is unmounted)"
            }
        };
        Err(DeviceError::media(DeviceOp::Write, offset, len, why))
    }
}

/// Refuses a barrier write on a device whose capabilities do not include one.
pub(crate) fn refuse_barrier(
    dev: &dyn BlockDevice,
    offset: u64,
    data: &[u8],
    flags: WriteFlags,
) -> Result<(), DeviceError> {
    if flags.contains(WriteFlags::BARRIER) && !dev.capabilities().barrier_write {
        return Err(DeviceError::unsupported(
            DeviceOp::Write,
            offset,
            data.len(),
            &format!("{} has no barrier write", dev.describe()),
        ));
    }
    Ok(())
}

/// Checks that a request is aligned and inside the device; shared by every backend (and the
/// IO layer's io_uring path) so the error message is the same wherever the mistake is made.
pub fn check_range(
    dev: &dyn BlockDevice,
    op: DeviceOp,
    offset: u64,
    len: usize,
) -> Result<(), DeviceError> {
    let sector = u64::from(dev.sector_size());
    if !offset.is_multiple_of(sector) || !(len as u64).is_multiple_of(sector) {
        return Err(DeviceError::misaligned(op, offset, len, dev.sector_size()));
    }
    let end = offset.checked_add(len as u64);
    if end.is_none_or(|end| end > dev.size_bytes()) {
        return Err(DeviceError::out_of_range(op, offset, len, dev.size_bytes()));
    }
    Ok(())
}
