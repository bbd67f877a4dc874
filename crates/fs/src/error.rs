//! File system errors: each says what failed and where, and maps to the errno a POSIX
//! caller (or FUSE) must see.

use crate::format::FormatError;
use jext_device::DeviceError;
use jext_journal::JournalError;
use std::fmt;

#[derive(Clone, Debug)]
pub enum FsError {
    /// ENOENT: the named thing does not exist.
    NotFound(String),
    /// EEXIST
    Exists(String),
    /// ENOTDIR
    NotDir(String),
    /// EISDIR
    IsDir(String),
    /// ENOTEMPTY
    NotEmpty(String),
    /// ENOSPC: no free blocks (or inodes) for the operation.
    NoSpace(String),
    /// ENAMETOOLONG
    NameTooLong(String),
    /// EMLINK
    TooManyLinks(String),
    /// EFBIG
    FileTooBig(String),
    /// EINVAL: a request that makes no sense (bad option, bad argument).
    Invalid(String),
    /// ENODATA: no such extended attribute.
    NoAttribute(String),
    /// ERANGE: a value does not fit (xattr too large, buffer too small).
    Range(String),
    /// EPERM: the operation is not allowed on this kind of file (link to a directory).
    NotPermitted(String),
    /// EACCES
    PermissionDenied(String),
    /// EROFS: mounted read-only, or made read-only by an error.
    ReadOnly(String),
    /// ENXIO: `lseek` past the end, or no data (or hole) after the offset.
    NoSuchOffset(String),
    /// EOPNOTSUPP / unsupported feature.
    Unsupported(String),
    /// EIO: the disk holds something that does not decode.
    Corrupt(FormatError),
    /// EUCLEAN-like structural problems found above the format level (a directory
    /// entry naming a free inode, a block claimed twice, ...).
    Inconsistent(String),
    /// EIO from the device.
    Device(DeviceError),
    /// The journal failed (EIO), or aborted after an earlier failure (EROFS).
    Journal(JournalError),
}

impl FsError {
    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound(_) => libc::ENOENT,
            FsError::Exists(_) => libc::EEXIST,
            FsError::NotDir(_) => libc::ENOTDIR,
            FsError::IsDir(_) => libc::EISDIR,
            FsError::NotEmpty(_) => libc::ENOTEMPTY,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::NameTooLong(_) => libc::ENAMETOOLONG,
            FsError::TooManyLinks(_) => libc::EMLINK,
            FsError::FileTooBig(_) => libc::EFBIG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NoAttribute(_) => libc::ENODATA,
            FsError::Range(_) => libc::ERANGE,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::PermissionDenied(_) => libc::EACCES,
            FsError::ReadOnly(_) => libc::EROFS,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            FsError::NoSuchOffset(_) => libc::ENXIO,
            FsError::Corrupt(_) | FsError::Inconsistent(_) => libc::EIO,
            FsError::Device(e) => e.errno(),
            FsError::Journal(JournalError::Aborted(_)) => libc::EROFS,
            FsError::Journal(_) => libc::EIO,
        }
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsError::NotFound(what) => write!(f, "{what}: no such file or directory"),
            FsError::Exists(what) => write!(f, "{what}: already exists"),
            FsError::NotDir(what) => write!(f, "{what}: not a directory"),
            FsError::IsDir(what) => write!(f, "{what}: is a directory"),
            FsError::NotEmpty(what) => write!(f, "{what}: directory not empty"),
            FsError::NoSpace(what) => write!(f, "no space left on device: {what}"),
            FsError::NameTooLong(what) => {
                write!(f, "{what}: name too long (ext4 allows 255 bytes)")
            }
            FsError::TooManyLinks(what) => write!(f, "{what}: too many links"),
            FsError::FileTooBig(what) => write!(f, "{what}: file too large"),
            FsError::Invalid(what) => write!(f, "invalid argument: {what}"),
            FsError::NoAttribute(what) => write!(f, "{what}: no such attribute"),
            FsError::Range(what) => write!(f, "{what}: out of range"),
            FsError::NotPermitted(what) => write!(f, "operation not permitted: {what}"),
            FsError::PermissionDenied(what) => write!(f, "permission denied: {what}"),
            FsError::ReadOnly(why) => write!(f, "read-only file system: {why}"),
            FsError::Unsupported(what) => write!(f, "not supported: {what}"),
            FsError::NoSuchOffset(what) => write!(f, "no such offset: {what}"),
            FsError::Corrupt(e) => write!(f, "{e}"),
            FsError::Inconsistent(what) => write!(f, "file system inconsistency: {what}"),
            FsError::Device(e) => write!(f, "{e}"),
            FsError::Journal(e) => write!(f, "journal: {e}"),
        }
    }
}

impl std::error::Error for FsError {}

impl From<FormatError> for FsError {
    fn from(e: FormatError) -> Self {
        FsError::Corrupt(e)
    }
}

impl From<DeviceError> for FsError {
    fn from(e: DeviceError) -> Self {
        FsError::Device(e)
    }
}

impl From<JournalError> for FsError {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Device(d) => FsError::Device(d),
            other => FsError::Journal(other),
        }
    }
}

impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> Self {
        std::io::Error::from_raw_os_error(e.errno())
    }
}

pub type FsResult<T> = Result<T, FsError>;
