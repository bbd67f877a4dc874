//! An image file as a device: pread/pwrite through the host page cache, flush by
//! `fdatasync`, FUA by a second descriptor opened with `O_DSYNC`. No barrier write: the
//! host page cache writes back in any order.

use crate::{
    check_range, refuse_barrier, BlockDevice, Capabilities, DeviceCounters, DeviceError, DeviceOp,
    OwnerLock, Ownership, RawTarget, WriteFlags,
};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Image files pretend to have 512-byte sectors, as a loop device does by default.
const FILE_SECTOR_SIZE: u32 = 512;

pub struct FileDevice {
    path: PathBuf,
    file: File,
    /// The same file opened with `O_DSYNC`: a write through it is durable when it returns,
    /// which is what FUA means, without flushing other data the way `fdatasync` would.
    dsync_file: Option<File>,
    size_bytes: u64,
    counters: DeviceCounters,
    /// Writable opens hold the image's owner lock (`None` inside: read-only, or released).
    owner: Ownership,
}

impl FileDevice {
    /// Opens the image; a writable open takes its owner lock (refused while another
    /// process holds it).
    pub fn open(path: &Path, read_only: bool) -> Result<FileDevice, DeviceError> {
        let owner = (!read_only)
            .then(|| OwnerLock::acquire(path, std::time::Duration::ZERO))
            .transpose()?;
        FileDevice::open_owned(path, owner)
    }

    /// Opens the image with an owner lock already taken (`None`: read-only).
    pub(crate) fn open_owned(
        path: &Path,
        owner: Option<OwnerLock>,
    ) -> Result<FileDevice, DeviceError> {
        let read_only = owner.is_none();
        let open = |extra_flags: i32| {
            OpenOptions::new()
                .read(true)
                .write(!read_only)
                .custom_flags(extra_flags)
                .open(path)
                .map_err(|e| DeviceError::open(path, e))
        };
        let file = open(0)?;
        let dsync_file = if read_only {
            None
        } else {
            Some(open(libc::O_DSYNC)?)
        };
        let size_bytes = file
            .metadata()
            .map_err(|e| DeviceError::open(path, e))?
            .len();
        Ok(FileDevice {
            path: path.to_path_buf(),
            file,
            dsync_file,
            size_bytes,
            counters: DeviceCounters::default(),
            owner: Ownership::new(owner),
        })
    }

    /// Creates (or truncates) a sparse image file of `size_bytes` and opens it.
    pub fn create(path: &Path, size_bytes: u64) -> Result<FileDevice, DeviceError> {
        let file = File::create(path).map_err(|e| DeviceError::open(path, e))?;
        file.set_len(size_bytes)
            .map_err(|e| DeviceError::open(path, e))?;
        drop(file);
        FileDevice::open(path, false)
    }
}

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn sector_size(&self) -> u32 {
        FILE_SECTOR_SIZE
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| DeviceError::io(DeviceOp::Read, offset, buf.len(), &e))?;
        self.counters.record_read(buf.len());
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
        self.owner.check_may_write(offset, data.len())?;
        refuse_barrier(self, offset, data, flags)?;
        let fua = flags.contains(WriteFlags::FUA);
        let target = match (&self.dsync_file, fua) {
            (Some(dsync), true) => dsync,
            _ => &self.file,
        };
        target
            .write_all_at(data, offset)
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
        Capabilities::IMAGE_FILE
    }

    fn raw_target(&self) -> Option<RawTarget> {
        Some(RawTarget {
            fd: self.file.as_raw_fd(),
            buffer_align: 1,
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
            "image file {} ({} MiB)",
            self.path.display(),
            self.size_bytes >> 20
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_read_back_and_are_counted() {
        let dir = std::env::temp_dir().join(format!("jext-filedev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.img");
        let dev = FileDevice::create(&path, 1 << 20).unwrap();
        dev.write_at(4096, &[7u8; 1024], false).unwrap();
        dev.write_at(8192, &[9u8; 512], true).unwrap();
        dev.flush().unwrap();
        let mut buf = [0u8; 1024];
        dev.read_at(4096, &mut buf).unwrap();
        assert_eq!(buf, [7u8; 1024]);
        let c = dev.counters().snapshot();
        assert_eq!((c.writes, c.fua_writes, c.flushes, c.reads), (2, 1, 1, 1));
        let err = dev.write_at(100, &[0u8; 512], false).unwrap_err();
        assert!(err.to_string().contains("not aligned"), "{err}");
        let err = dev.read_at(1 << 20, &mut buf).unwrap_err();
        assert!(err.to_string().contains("beyond the end"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
