//! The types of the library API: what `stat`, `readdir`, `setattr`, `rename` and
//! `fallocate` speak, independent of how ext4 stores them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An inode number.
pub type Ino = u32;

/// The root directory's inode number in every ext4 file system.
pub const ROOT_INO: Ino = 2;

/// The kind of an inode, as in `st_mode & S_IFMT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileKind {
    /// From the `S_IFMT` bits of a mode.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0o100000 => FileKind::Regular,
            0o040000 => FileKind::Directory,
            0o120000 => FileKind::Symlink,
            0o020000 => FileKind::CharDevice,
            0o060000 => FileKind::BlockDevice,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::Regular => 0o100000,
            FileKind::Directory => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::CharDevice => 0o020000,
            FileKind::BlockDevice => 0o060000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
        }
    }

    /// The ext4 directory entry file type code (`EXT4_FT_*`).
    pub fn dirent_type(self) -> u8 {
        match self {
            FileKind::Regular => 1,
            FileKind::Directory => 2,
            FileKind::CharDevice => 3,
            FileKind::BlockDevice => 4,
            FileKind::Fifo => 5,
            FileKind::Socket => 6,
            FileKind::Symlink => 7,
        }
    }

    /// From an ext4 directory entry file type code.
    pub fn from_dirent_type(code: u8) -> Option<FileKind> {
        Some(match code {
            1 => FileKind::Regular,
            2 => FileKind::Directory,
            3 => FileKind::CharDevice,
            4 => FileKind::BlockDevice,
            5 => FileKind::Fifo,
            6 => FileKind::Socket,
            7 => FileKind::Symlink,
            _ => return None,
        })
    }
}

/// A point in time with nanoseconds, as ext4 stores it (seconds may be negative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanoseconds: u32,
}

impl Timestamp {
    /// The time inodes are stamped with: the kernel's coarse clock
    /// (`CLOCK_REALTIME_COARSE`, one scheduler tick: 4 ms on this project's machine), as
    /// ext4 stamps them (`current_time`). Writes within one tick leave a file's times as
    /// they were, so a file overwritten and fsync'd many times a tick commits nothing but
    /// its data, as on Linux. A change after someone read the inode's times takes
    /// [`Timestamp::now_fine`] instead (`inodes::stamp`: Linux 6.13+'s multigrain
    /// timestamps).
    pub fn now() -> Timestamp {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's whole duration, and
        // CLOCK_REALTIME_COARSE exists on every Linux this builds for.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        if rc != 0 {
            return Timestamp::now_fine();
        }
        let nanoseconds = u32::try_from(ts.tv_nsec).expect("tv_nsec is below 10^9");
        let coarse = Timestamp {
            seconds: ts.tv_sec,
            nanoseconds,
        };
        // Never before a fine-grained stamp already handed out: a change after it must
        // not look older (Linux's multigrain floor).
        coarse.max(Timestamp::from_nanos(FINE_FLOOR_NS.load(Ordering::Acquire)))
    }

    /// The exact time, for a change whose old times someone looked at (see
    /// `inodes::stamp`); later coarse stamps are never before it.
    pub fn now_fine() -> Timestamp {
        let t = Timestamp::from(SystemTime::now());
        FINE_FLOOR_NS.fetch_max(t.as_nanos(), Ordering::AcqRel);
        t
    }

    /// Nanoseconds since the epoch (0 for times before it).
    fn as_nanos(self) -> u64 {
        u64::try_from(self.seconds).map_or(0, |s| s * 1_000_000_000 + u64::from(self.nanoseconds))
    }

    fn from_nanos(ns: u64) -> Timestamp {
        Timestamp {
            seconds: (ns / 1_000_000_000) as i64,
            nanoseconds: (ns % 1_000_000_000) as u32,
        }
    }
}

/// The latest fine-grained stamp handed out, in nanoseconds since the epoch.
static FINE_FLOOR_NS: AtomicU64 = AtomicU64::new(0);

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                seconds: d.as_secs() as i64,
                nanoseconds: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let whole = -(d.as_secs() as i64);
                match d.subsec_nanos() {
                    0 => Timestamp {
                        seconds: whole,
                        nanoseconds: 0,
                    },
                    ns => Timestamp {
                        seconds: whole - 1,
                        nanoseconds: 1_000_000_000 - ns,
                    },
                }
            }
        }
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> SystemTime {
        let base = if t.seconds >= 0 {
            UNIX_EPOCH + Duration::from_secs(t.seconds as u64)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.seconds.unsigned_abs())
        };
        base + Duration::from_nanos(u64::from(t.nanoseconds))
    }
}

/// What `stat` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ino: Ino,
    pub kind: FileKind,
    /// Permission bits (`mode & 0o7777`).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Space used, in 512-byte units (`st_blocks`).
    pub blocks_512: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub crtime: Timestamp,
    /// Device number for character and block devices.
    pub rdev: u32,
    /// ext4 inode flags (`FS_IOC_GETFLAGS` view).
    pub flags: u32,
    pub generation: u32,
    /// The preferred IO size (the block size).
    pub block_size: u32,
}

impl Stat {
    /// The full `st_mode`.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// Which attributes `setattr` changes; `None` leaves one as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub perm: Option<u16>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<Timestamp>,
    pub mtime: Option<Timestamp>,
    /// `None` means "now" whenever anything else changes, as POSIX requires.
    pub ctime: Option<Timestamp>,
    pub crtime: Option<Timestamp>,
    pub flags: Option<u32>,
    /// `atime`/`mtime` are "now" because the caller asked for the current time
    /// (`utimes(NULL)`, `UTIME_NOW`, `touch`), or are the times of writes a kernel cached
    /// (FUSE's writeback cache), not a time of the caller's choice: an append-only file
    /// allows the first and refuses the second, as ext4 does.
    pub times_to_now: bool,
    /// Drop privileges from a non-directory as Linux does on a truncate or chown (a front
    /// end whose kernel leaves this to jext says which).
    pub drop_privileges: Option<PrivilegeDrop>,
}

/// What a change to a file takes away (see `privileges.rs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrivilegeDrop {
    /// `security.capability` only: a write or truncate by a caller with CAP_FSETID.
    Capabilities,
    /// That, setuid, and setgid where the group may execute: a write or truncate by a
    /// caller without CAP_FSETID, or a chown. A setgid without group execute goes too
    /// unless the caller may keep it: `caller_groups` are its group ids (primary and
    /// supplementary), `None` for a caller with CAP_FSETID, which always may.
    CapabilitiesAndIds { caller_groups: Option<Vec<u32>> },
}

/// One entry returned by `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    pub name: Vec<u8>,
    pub kind: FileKind,
    /// Pass this to `readdir` to continue after this entry.
    pub next_cookie: u64,
}

/// `renameat2` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// Fail with EEXIST if the target exists.
    pub no_replace: bool,
    /// Swap source and target atomically; both must exist.
    pub exchange: bool,
    /// Leave a whiteout (a character device 0:0, what overlayfs reads as "deleted") at the
    /// source name, owned by this (uid, gid), in the same transaction (`RENAME_WHITEOUT`).
    pub whiteout: Option<(u32, u32)>,
}

/// What `fallocate` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocateMode {
    /// Do not change the file size (`FALLOC_FL_KEEP_SIZE`).
    pub keep_size: bool,
    /// Free the range, leaving a hole (`FALLOC_FL_PUNCH_HOLE`, implies keep_size).
    pub punch_hole: bool,
    /// Make the range read as zeros, its blocks still allocated (`FALLOC_FL_ZERO_RANGE`).
    pub zero_range: bool,
}

/// What `statfs` returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks available to unprivileged users (excludes the root reserve).
    pub blocks_available: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub name_max: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_system_time_both_sides_of_the_epoch() {
        for t in [
            Timestamp {
                seconds: 0,
                nanoseconds: 0,
            },
            Timestamp {
                seconds: 1_700_000_000,
                nanoseconds: 123_456_789,
            },
            Timestamp {
                seconds: -1,
                nanoseconds: 999_999_999,
            },
            Timestamp {
                seconds: -86_400,
                nanoseconds: 5,
            },
        ] {
            assert_eq!(Timestamp::from(SystemTime::from(t)), t);
        }
    }

    #[test]
    fn a_coarse_stamp_is_never_before_a_fine_one_handed_out() {
        for _ in 0..1000 {
            let fine = Timestamp::now_fine();
            assert!(Timestamp::now() >= fine, "a later change looked older");
        }
    }

    #[test]
    fn file_kinds_map_both_ways() {
        for kind in [
            FileKind::Regular,
            FileKind::Directory,
            FileKind::Symlink,
            FileKind::CharDevice,
            FileKind::BlockDevice,
            FileKind::Fifo,
            FileKind::Socket,
        ] {
            assert_eq!(FileKind::from_mode(kind.mode_bits() | 0o644), Some(kind));
            assert_eq!(FileKind::from_dirent_type(kind.dirent_type()), Some(kind));
        }
        assert_eq!(FileKind::from_mode(0o644), None);
    }
}
