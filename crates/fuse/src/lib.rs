//! jext's FUSE front end: mounts a jext file system with fuser's pure-Rust mount (the
//! `mount(2)` system call as root, no libfuse), dispatching requests on several threads.
//!
//! Promises: the session ends with a clean unmount of the library (checkpoint, clear
//! needs_recovery) whether it ended by `umount`, `fusermount3 -u` or `Mounted::unmount`;
//! never uses AutoUnmount (a dead daemon's mount stays until unmounted explicitly, as the
//! machine's rules require). Must never mount over a mount point it cannot stat.

mod ops;
pub mod options;

pub use ops::JextFuse;
pub use options::FuseOptions;

use fuser::{Config, MountOption, SessionACL};
use jext_fs::Fs;
use std::io;
use std::path::Path;

/// Request threads: enough to overlap an fsync that waits for a commit with other work.
const REQUEST_THREADS: usize = 4;

fn config(image: &Path, opts: &FuseOptions) -> Config {
    let mut mount_options = vec![
        MountOption::FSName(image.display().to_string()),
        MountOption::Subtype("jext".into()),
    ];
    if opts.default_permissions {
        mount_options.push(MountOption::DefaultPermissions);
    }
    mount_options.push(if opts.fs.read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    for flag in &opts.vfs_flags {
        mount_options.push(match *flag {
            "nosuid" => MountOption::NoSuid,
            "suid" => MountOption::Suid,
            "nodev" => MountOption::NoDev,
            "dev" => MountOption::Dev,
            "noexec" => MountOption::NoExec,
            "exec" => MountOption::Exec,
            "noatime" => MountOption::NoAtime,
            "atime" => MountOption::Atime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        });
    }
    let mut config = Config::default();
    config.mount_options = mount_options;
    config.acl = if opts.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(REQUEST_THREADS);
    config.clone_fd = true;
    config
}

/// A live mount. `run` serves it until it is unmounted.
pub struct Mounted {
    session: fuser::Session<JextFuse>,
}

/// Unmounts a `Mounted` from another thread (a signal watcher).
pub struct Unmounter(fuser::SessionUnmounter);

impl Unmounter {
    pub fn unmount(&mut self) -> io::Result<()> {
        self.0.unmount()
    }
}

impl Mounted {
    /// Mounts `fs` (already opened from `image`) at `mountpoint`.
    pub fn mount(
        fs: Fs,
        image: &Path,
        mountpoint: &Path,
        opts: &FuseOptions,
    ) -> io::Result<Mounted> {
        std::fs::metadata(mountpoint).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mount point {}: {e}", mountpoint.display()),
            )
        })?;
        let session = fuser::Session::new(
            JextFuse::new(fs, opts.writeback_cache),
            mountpoint,
            &config(image, opts),
        )?;
        Ok(Mounted { session })
    }

    pub fn unmounter(&mut self) -> Unmounter {
        Unmounter(self.session.unmount_callable())
    }

    /// Serves requests until the file system is unmounted; the library is unmounted
    /// cleanly on the way out.
    pub fn run(self) -> io::Result<()> {
        self.session.run()
    }
}
