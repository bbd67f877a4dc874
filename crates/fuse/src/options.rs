//! Mount options for `jext mount -o …`: the ext4 ones (data=, commit=, ro, errors=,
//! cache_size=, barrier) go to the library; the FUSE ones (allow_other,
//! default_permissions, writeback_cache, threads, fuse_uring, poll_us) configure the session; the generic VFS flags
//! mount(8) passes to helpers (rw, nosuid, nodev, noexec, noatime, …) become mount flags.
//!
//! Promises: an unknown or malformed option is refused with a message naming it; nothing
//! is silently ignored except the options mount(8) adds for its own bookkeeping (`_netdev`,
//! `auto`, `noauto`, `user`, `nouser`, `nofail`, `loop`), which mean nothing to a file
//! system, and the connection options the kernel shows for a FUSE mount (`user_id=`,
//! `group_id=`, `blksize=`, ...), which mount(8) hands back on a remount. `remount` changes a
//! live mount; `owner_wait=SECS` waits for the image's owner.

use jext_fs::{FsError, FsResult, MountOptions};

/// Everything `-o` said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    pub fs: MountOptions,
    /// Let other users (not just the one who mounted) use the mount.
    pub allow_other: bool,
    /// Let the kernel check permissions from the modes (on by default, as most users expect
    /// of a disk file system; `nodefault_permissions` turns it off).
    pub default_permissions: bool,
    /// FUSE's writeback cache: the kernel buffers writes and sends them in large pieces.
    pub writeback_cache: bool,
    /// VFS flags for the mount: nosuid, nodev, noexec, noatime, sync, dirsync.
    pub vfs_flags: Vec<&'static str>,
    /// `remount`: change a live mount (read-only or not, VFS flags) instead of mounting.
    pub remount: bool,
    /// `owner_wait=SECS`: wait this long for another process to let go of the image
    /// (default: refuse at once, naming it).
    pub owner_wait_secs: u64,
    /// `blkdev` (the default) mounts as `fuseblk`; `noblkdev` as plain `fuse` with no
    /// subtype, whose mount shows the image file itself as its source and `fuse` as its type
    /// (what fstests' FSTYP=fuse looks for); `umount` does not wait for such a mount.
    pub blkdev: bool,
    /// `threads=N`: request threads serving the connection (with `fuse_uring`, on each
    /// CPU's io_uring queue).
    pub request_threads: usize,
    /// `fuse_uring`: serve requests through FUSE over io_uring when the kernel's
    /// `enable_uring` switch is on; otherwise the mount says why on stderr and serves
    /// through `/dev/fuse`. jext never turns the switch on itself: it is global, for every
    /// FUSE server on the machine, and off by default; root (or `scripts/setup`) decides.
    pub uring: bool,
    /// `poll_us=N`: how long a request thread that served a request polls for the next
    /// before it sleeps (0: never poll). One thread of the mount polls at a time.
    pub poll_us: u64,
}

/// The polling window unless `poll_us=` says otherwise. Unpacking /usr/include, 90% of the
/// gaps between the end of one of tar's requests and its next were under 45 µs (README,
/// "The mount"); a window a little longer catches those and costs at most that much CPU
/// at the end of each burst.
pub const DEFAULT_POLL_US: u64 = 50;
const MAX_POLL_US: u64 = 10_000;

/// Request threads unless `threads=` says otherwise: one per core, and at least two.
/// Measured on 2 cores unpacking /usr/include (README, "The mount"): one thread was 0.65×
/// the rate of two, because an asynchronous request (a release) then holds up the next
/// one; four were no faster than two.
pub fn default_request_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().max(2))
}
const MAX_REQUEST_THREADS: usize = 64;

impl Default for FuseOptions {
    fn default() -> FuseOptions {
        FuseOptions {
            fs: MountOptions::default(),
            allow_other: false,
            default_permissions: true,
            writeback_cache: false,
            vfs_flags: Vec::new(),
            remount: false,
            owner_wait_secs: 0,
            blkdev: true,
            request_threads: default_request_threads(),
            uring: false,
            poll_us: DEFAULT_POLL_US,
        }
    }
}

const VFS_FLAGS: [&str; 18] = [
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "noatime",
    "atime",
    "sync",
    "async",
    "dirsync",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
    "lazytime",
    "defaults",
];
const MOUNT8_BOOKKEEPING: [&str; 7] = [
    "_netdev", "auto", "noauto", "user", "nouser", "nofail", "loop",
];
/// The VFS flags that say when reads move access times.
const ATIME_FLAGS: [&str; 7] = [
    "noatime",
    "atime",
    "relatime",
    "norelatime",
    "strictatime",
    "nodiratime",
    "diratime",
];

/// Options the kernel shows for a FUSE connection (`/proc/mounts`), which jext sets itself
/// when it mounts and mount(8) hands back on a remount: nothing to change there.
const CONNECTION_OPTIONS: [&str; 6] = [
    "fd", "rootmode", "user_id", "group_id", "blksize", "max_read",
];

impl FuseOptions {
    pub fn parse(text: &str) -> FsResult<FuseOptions> {
        let mut parsed = FuseOptions::default();
        for option in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            parsed.apply(option)?;
        }
        // The kernel keeps regular files' times from its coarse clock under the writeback
        // cache; jext's stamps must not run ahead of it (`MountOptions::fine_timestamps`).
        parsed.fs.fine_timestamps = !parsed.writeback_cache;
        Ok(parsed)
    }

    fn apply(&mut self, option: &str) -> FsResult<()> {
        match option {
            "allow_other" => self.allow_other = true,
            "default_permissions" => self.default_permissions = true,
            "nodefault_permissions" => self.default_permissions = false,
            "writeback_cache" => self.writeback_cache = true,
            "nowriteback_cache" => self.writeback_cache = false,
            "remount" => self.remount = true,
            "blkdev" => self.blkdev = true,
            "noblkdev" => self.blkdev = false,
            "fuse_uring" => self.uring = true,
            "nofuse_uring" => self.uring = false,
            o if o.starts_with("owner_wait=") => {
                let secs = &o["owner_wait=".len()..];
                self.owner_wait_secs = secs.parse().map_err(|_| {
                    FsError::Invalid(format!("owner_wait={secs}: expected whole seconds"))
                })?;
            }
            o if o.starts_with("threads=") => {
                let n = &o["threads=".len()..];
                self.request_threads = n
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_REQUEST_THREADS).contains(n))
                    .ok_or_else(|| {
                        FsError::Invalid(format!(
                            "threads={n}: expected request threads from 1 to {MAX_REQUEST_THREADS}"
                        ))
                    })?;
            }
            o if o.starts_with("poll_us=") => {
                let n = &o["poll_us=".len()..];
                self.poll_us = n
                    .parse()
                    .ok()
                    .filter(|n| *n <= MAX_POLL_US)
                    .ok_or_else(|| {
                        FsError::Invalid(format!(
                            "poll_us={n}: expected microseconds from 0 to {MAX_POLL_US}"
                        ))
                    })?;
            }
            o if MOUNT8_BOOKKEEPING.contains(&o) => {}
            o if o
                .split_once('=')
                .is_some_and(|(name, _)| CONNECTION_OPTIONS.contains(&name)) => {}
            o if VFS_FLAGS.contains(&o) => {
                let known = VFS_FLAGS.iter().find(|f| **f == o).expect("checked above");
                self.vfs_flags.push(known);
                // FUSE leaves access times to the file system: the atime flags are jext's
                // to apply too.
                if ATIME_FLAGS.contains(&o) {
                    self.fs.apply(o)?;
                }
            }
            o if o.starts_with("allow_other=")
                || o.starts_with("writeback_cache=")
                || o.starts_with("fuse_uring=") =>
            {
                return Err(FsError::Invalid(format!("option {o:?} takes no value")));
            }
            o => self.fs.apply(o)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_fs::DataMode;

    #[test]
    fn ext4_fuse_and_vfs_options_each_land_where_they_belong() {
        let o = FuseOptions::parse(
            "data=journal,commit=10,allow_other,writeback_cache,nosuid,defaults,cache_size=64M",
        )
        .unwrap();
        assert_eq!(o.fs.data_mode, DataMode::Journal);
        assert_eq!(o.fs.commit_interval_ms, 10_000);
        assert_eq!(o.fs.cache_size_bytes, 64 << 20);
        assert!(o.allow_other && o.writeback_cache && o.default_permissions);
        assert!(
            !o.fs.fine_timestamps,
            "the kernel's coarse clock stamps cached files"
        );
        assert!(FuseOptions::parse("").unwrap().fs.fine_timestamps);
        assert_eq!(o.vfs_flags, vec!["nosuid", "defaults"]);
        assert_eq!(o.request_threads, default_request_threads());
        assert_eq!(FuseOptions::parse("threads=2").unwrap().request_threads, 2);
        assert!(!o.uring);
        assert_eq!(o.poll_us, DEFAULT_POLL_US);
        assert_eq!(FuseOptions::parse("poll_us=0").unwrap().poll_us, 0);
        assert!(FuseOptions::parse("fuse_uring").unwrap().uring);
        assert!(!FuseOptions::parse("fuse_uring,nofuse_uring").unwrap().uring);
        let r = FuseOptions::parse("remount,ro,owner_wait=10").unwrap();
        assert!(r.remount && r.fs.read_only);
        assert_eq!(r.owner_wait_secs, 10);
        assert!(
            !FuseOptions::parse("nodefault_permissions")
                .unwrap()
                .default_permissions
        );
    }

    #[test]
    fn unknown_and_malformed_options_are_named() {
        for (text, named) in [
            ("data=fast", "fast"),
            ("colour=red", "colour"),
            ("commit=soon", "soon"),
            ("allow_other=1", "allow_other"),
            ("fuse_uring=yes", "fuse_uring"),
            ("owner_wait=soon", "owner_wait=soon"),
            ("threads=0", "threads=0"),
            ("threads=many", "threads=many"),
            ("poll_us=-1", "poll_us=-1"),
            ("poll_us=10001", "poll_us=10001"),
        ] {
            let err = FuseOptions::parse(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }
}
