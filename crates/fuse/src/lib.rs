//! jext's FUSE front end: mounts a jext file system as `fuseblk` (see `kernel_mount`) and
//! serves it with fuser (a patched copy, `vendor/fuser`), dispatching requests on several
//! threads, read from `/dev/fuse` or (`-o fuse_uring`) taken from FUSE over io_uring.
//!
//! Promises: the session ends with a clean unmount of the library (checkpoint, clear
//! needs_recovery, owner lock released) whether it ended by `umount`, `jext umount` or
//! `Mounted::unmount`; on a `fuseblk` mount that happens before `umount` returns. Never
//! uses AutoUnmount (a dead daemon's mount stays until unmounted explicitly, as the
//! machine's rules require). Must never mount over a mount point it cannot stat.

mod caller;
mod dir_streams;
mod kernel_holds;
mod kernel_mount;
mod loop_device;
mod ops;
pub mod options;
pub mod requests;
mod sync_threads;

pub use kernel_mount::{bind, remount, unmount, KernelMount, MountKind, MountRequest};
pub use ops::JextFuse;
pub use options::FuseOptions;

/// jext's ordering-only syncs as ioctls on a file of a jext mount (`include/jext.h`:
/// `_IO('j', 0x40)` fbarrier, `_IO('j', 0x41)` fdatabarrier).
pub const JEXT_IOC_FBARRIER: u32 = 0x6a40;
pub const JEXT_IOC_FDATABARRIER: u32 = 0x6a41;

pub use fuser::Transport;
use fuser::{Config, SessionACL};
use jext_fs::Fs;
use requests::RequestCounts;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn config(opts: &FuseOptions) -> Config {
    let mut config = Config::default();
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.request_threads);
    config.clone_fd = true;
    config.uring = opts.uring;
    config.poll_before_sleep = std::time::Duration::from_micros(opts.poll_us);
    config
}

/// Why `-o fuse_uring` cannot be had on a new mount (the kernel's switch is off, or the
/// kernel has no such transport), or `None` when it can.
pub fn uring_unavailable() -> Option<String> {
    fuser::uring_unavailable()
}

/// What the mount request asks of the kernel, from the `-o` options.
pub fn mount_request(opts: &FuseOptions, block_size: u32) -> MountRequest {
    MountRequest {
        read_only: opts.fs.read_only,
        allow_other: opts.allow_other,
        default_permissions: opts.default_permissions,
        vfs_flags: opts.vfs_flags.clone(),
        block_size,
        blkdev: opts.blkdev,
    }
}

/// A live mount. `run` serves it until it is unmounted.
pub struct Mounted {
    session: fuser::Session<JextFuse>,
    kernel: KernelMount,
}

/// Unmounts a `Mounted` from another thread (a signal watcher).
pub struct Unmounter(PathBuf);

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        unmount(&self.0)
    }
}

impl Mounted {
    /// Mounts `fs` (already opened from `image`) at `mountpoint`, counting the requests it
    /// serves in `requests`. `on_destroy` runs when
    /// the kernel ends the connection, after the library's clean unmount and before
    /// `umount` returns (on `fuseblk`): the place to remove what names this daemon.
    pub fn mount(
        fs: Fs,
        image: &Path,
        mountpoint: &Path,
        opts: &FuseOptions,
        requests: Arc<RequestCounts>,
        on_destroy: Box<dyn FnOnce() + Send>,
    ) -> io::Result<Mounted> {
        std::fs::metadata(mountpoint).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mount point {}: {e}", mountpoint.display()),
            )
        })?;
        let request = mount_request(opts, fs.block_size());
        let (fuse, kernel) = KernelMount::mount(image, mountpoint, &request)?;
        let config = config(opts);
        let acl = config.acl;
        let served = JextFuse::new(fs, opts.writeback_cache, requests, on_destroy);
        let notifier = served.notifier_slot();
        let session = match fuser::Session::from_fd(served, fuse, acl, config) {
            Ok(session) => session,
            Err(e) => {
                let _ = unmount(mountpoint);
                return Err(e);
            }
        };
        let _ = notifier.set(session.notifier());
        Ok(Mounted { session, kernel })
    }

    pub fn kernel_mount(&self) -> &KernelMount {
        &self.kernel
    }

    /// How the kernel's requests reach this mount, as agreed at INIT.
    pub fn transport(&self) -> &Transport {
        self.session.transport()
    }

    pub fn unmounter(&self) -> Unmounter {
        Unmounter(self.kernel.mountpoint().to_path_buf())
    }

    /// Serves requests until the file system is unmounted; the library is unmounted
    /// cleanly on the way out.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}
