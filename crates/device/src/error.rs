//! Device errors: every failure names the operation, the byte range and the cause, and is
//! `Clone` so that one failed request can be reported to every waiter.

use std::fmt;
use std::io;
use std::path::Path;

/// What the device was asked to do when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    Open,
    Read,
    Write,
    Flush,
}

impl fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceOp::Open => "open",
            DeviceOp::Read => "read",
            DeviceOp::Write => "write",
            DeviceOp::Flush => "flush",
        })
    }
}

/// A failed device operation.
#[derive(Clone, Debug)]
pub struct DeviceError {
    pub op: DeviceOp,
    pub offset: u64,
    pub len: usize,
    pub kind: io::ErrorKind,
    pub raw_os_error: Option<i32>,
    pub detail: String,
}

impl DeviceError {
    pub fn io(op: DeviceOp, offset: u64, len: usize, err: &io::Error) -> Self {
        DeviceError {
            op,
            offset,
            len,
            kind: err.kind(),
            raw_os_error: err.raw_os_error(),
            detail: err.to_string(),
        }
    }

    pub fn open(path: &Path, err: io::Error) -> Self {
        DeviceError {
            op: DeviceOp::Open,
            offset: 0,
            len: 0,
            kind: err.kind(),
            raw_os_error: err.raw_os_error(),
            detail: format!("{}: {err}", path.display()),
        }
    }

    pub fn misaligned(op: DeviceOp, offset: u64, len: usize, sector: u32) -> Self {
        DeviceError {
            op,
            offset,
            len,
            kind: io::ErrorKind::InvalidInput,
            raw_os_error: Some(libc::EINVAL),
            detail: format!("not aligned to the {sector}-byte sector size"),
        }
    }

    pub fn out_of_range(op: DeviceOp, offset: u64, len: usize, size: u64) -> Self {
        DeviceError {
            op,
            offset,
            len,
            kind: io::ErrorKind::InvalidInput,
            raw_os_error: Some(libc::EINVAL),
            detail: format!("beyond the end of the device ({size} bytes)"),
        }
    }

    /// An injected or simulated media error.
    pub fn media(op: DeviceOp, offset: u64, len: usize, detail: &str) -> Self {
        DeviceError {
            op,
            offset,
            len,
            kind: io::ErrorKind::Other,
            raw_os_error: Some(libc::EIO),
            detail: detail.to_string(),
        }
    }

    /// A request the device cannot carry out at all (a barrier write to a device without one).
    pub fn unsupported(op: DeviceOp, offset: u64, len: usize, detail: &str) -> Self {
        DeviceError {
            op,
            offset,
            len,
            kind: io::ErrorKind::Unsupported,
            raw_os_error: Some(libc::EOPNOTSUPP),
            detail: detail.to_string(),
        }
    }

    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        self.raw_os_error.unwrap_or(libc::EIO)
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            DeviceOp::Open => write!(f, "device open failed: {}", self.detail),
            DeviceOp::Flush => write!(f, "device flush failed: {}", self.detail),
            op => write!(
                f,
                "device {op} of {} bytes at offset {} failed: {}",
                self.len, self.offset, self.detail
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

impl From<DeviceError> for io::Error {
    fn from(e: DeviceError) -> io::Error {
        io::Error::new(e.kind, e.to_string())
    }
}
