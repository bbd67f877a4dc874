//! jext: a user-space ext4 whose journal is better than the kernel's.
//!
//! This crate is the front door: it re-exports the library API (mount an image, use files
//! and directories, fsync) and hosts the `jext` command-line tool. The layers below are
//! separate crates: `jext-fs` (ext4 structures and operations), `jext-cache`,
//! `jext-journal` (JBD2), `jext-io` (requests with ordering flags) and `jext-device`.
//!
//! ```no_run
//! use jext::{Fs, MountOptions};
//! let fs = Fs::open_path(std::path::Path::new("disk.img"), MountOptions::default())?;
//! let f = fs.create_file("/hello.txt", 0o644)?;
//! f.write_at(0, b"hello")?;
//! f.fsync()?;
//! fs.unmount()?;
//! # Ok::<(), jext::FsError>(())
//! ```

pub use jext_device::{
    open_path as open_device, open_path_waiting as open_device_waiting, owner_of, BlockDevice,
    CounterSnapshot, FileDevice, Holder, OverlayDevice, SimDevice,
};
pub use jext_fs::debug::{dump, DebugWhat};
pub use jext_fs::{
    fsck, mkfs, CommitMode, DataMode, DirEntry, ErrorBehavior, FallocateMode, FastCommitStats,
    File, FileJournalMode, FileKind, Fs, FsError, FsResult, FsckReport, IJournal, Ino, MkfsOptions,
    MkfsReport, MountOptions, MountReport, RenameFlags, SetAttr, SmallSyncs, Stat, StatFs,
    Timestamp, XattrSetMode, NO_JOURNAL_NOTE, ROOT_INO,
};
