//! `jext mount` and `jext umount`: the FUSE daemon's life.
//!
//! `jext mount IMAGE DIR` starts itself again in the foreground (`-f`) as a daemon in its
//! own session, waits until the mount appears (or the daemon fails, whose message it then
//! prints) and returns, as other FUSE tools do. The daemon takes the image's owner lock (a
//! second mount of a mounted image is refused, naming the daemon that has it: one owner per
//! image, never a second daemon serving a diverging copy), opens it (recovering the
//! journal), and mounts it as `fuseblk` (see `jext_fuse::KernelMount`): a plain `umount`
//! then returns only after the daemon has checkpointed, written a clean superblock and let
//! go of the image, so `umount DIR && jext mount IMAGE DIR` works at once and
//! `umount DIR && e2fsck -fn IMAGE` finds it clean; `sync` and `syncfs` reach it too.
//! SIGTERM/SIGINT unmount the same way. `jext umount DIR` unmounts and also waits for the
//! daemon process to end.
//!
//! `-o remount,ro|rw` (what mount(8) passes for `mount -o remount,...`) changes a live
//! mount: read-only after the kernel stopped writes and the daemon committed and
//! checkpointed (the image is then clean); read-write with a fresh transaction. The daemon
//! answers that, and `jext sync DIR`, on a control socket (see `control`).
//!
//! Must never leave a daemon serving a mount nobody can find: the daemon's pid is recorded
//! under `/run/jext`, named after the mount point.

use super::mounts::{is_jext_mount, jext_mounts};
use jext::{Fs, FsError};
use jext_fuse::requests::{DaemonStats, RequestCounts};
use jext_fuse::{FuseOptions, MountKind, Mounted, Transport};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `jext mount` waits for the daemon's mount to appear (recovery of a long
/// journal can take a while).
const MOUNT_WAIT: Duration = Duration::from_secs(120);
const PID_DIR: &str = "/run/jext";

pub fn mount(image: &Path, mountpoint: &Path, options: Option<&str>, foreground: bool) -> i32 {
    let opts = match FuseOptions::parse(options.unwrap_or("")) {
        Ok(o) => o,
        Err(e) => {
            return fail(
                "mount",
                &format!("{e} (see jext mount --help for the options)"),
            )
        }
    };
    let result = if opts.remount {
        remount(mountpoint, &opts)
    } else if let Some(existing) = super::mounts::mount_of(image) {
        second_mount_point(image, &existing, mountpoint, &opts)
    } else if foreground {
        serve(image, mountpoint, &opts)
    } else {
        start_daemon(image, mountpoint, options)
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail("mount", &e),
    }
}

fn fail(command: &str, what: &str) -> i32 {
    eprintln!("jext {command}: {what}");
    1
}

/// The daemon: own the image, open it, mount, serve until unmounted.
fn serve(image: &Path, mountpoint: &Path, opts: &FuseOptions) -> Result<(), String> {
    let mountpoint = absolute(mountpoint)?;
    let fs = open_owned(image, opts)?;
    let _ = std::fs::create_dir_all(PID_DIR);
    let socket = socket_file(&mountpoint);
    let requests = Arc::new(RequestCounts::default());
    let control = super::control::listen(socket.clone(), fs.clone(), requests.clone())
        .map_err(|e| format!("control socket {}: {e}", socket.display()))?;
    let pid_file = pid_file(&mountpoint);
    let _ = std::fs::write(&pid_file, std::process::id().to_string());
    // Runs when the kernel ends the connection, before a fuseblk `umount` returns: what
    // names this daemon goes before a new daemon for the same mount point can appear.
    let forget_daemon = {
        let pid_file = pid_file.clone();
        Box::new(move || {
            drop(control);
            let _ = std::fs::remove_file(&pid_file);
        })
    };
    // Said before the mount appears, so that `jext mount` (which relays what its daemon
    // said by then) shows it.
    let uring_refused = opts.uring.then(jext_fuse::uring_unavailable).flatten();
    if let Some(why) = &uring_refused {
        say_uring_fallback(why);
    }
    let opts = &FuseOptions {
        uring: opts.uring && uring_refused.is_none(),
        ..opts.clone()
    };
    let mounted =
        Mounted::mount(fs, image, &mountpoint, opts, requests, forget_daemon).map_err(|e| {
            let _ = std::fs::remove_file(&pid_file);
            format!(
                "cannot mount {} on {}: {e}",
                image.display(),
                mountpoint.display()
            )
        })?;
    if mounted.kernel_mount().kind() == MountKind::Fuse && opts.blkdev {
        eprintln!(
            "jext mount: no loop device for {}: mounted as plain fuse, so `umount` returns \
             before the image is clean and `sync` does not reach jext; use `jext umount` and \
             `jext sync` (or the umount.fuse.jext helper that scripts/setup installs)",
            image.display()
        );
    }
    if let Transport::DevFuseFallback(why) = mounted.transport() {
        say_uring_fallback(why);
    }
    crate::signals::catch_interrupts();
    let mut unmounter = mounted.unmounter();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        if crate::signals::interrupted() {
            if let Err(e) = unmounter.unmount() {
                eprintln!("jext mount: cannot unmount after a signal: {e}");
            }
            return;
        }
    });
    let served = mounted.run();
    if served.is_ok() {
        // A clean unmount leaves nothing to read in the background daemon's log.
        let _ = std::fs::remove_file(log_file(&mountpoint));
    }
    served.map_err(|e| format!("serving {}: {e}", mountpoint.display()))
}

fn say_uring_fallback(why: &str) {
    eprintln!("jext mount: -o fuse_uring: {why}; serving through /dev/fuse");
}

fn open_error(image: &Path, e: FsError) -> String {
    format!("cannot open {}: {e}", image.display())
}

/// A second mount of a mounted image: the new mount point shows the same file system, as a
/// second kernel mount of one ext4 device would (see `mounts`).
fn second_mount_point(
    image: &Path,
    existing: &super::mounts::JextMount,
    mountpoint: &Path,
    opts: &FuseOptions,
) -> Result<(), String> {
    let mountpoint = absolute(mountpoint)?;
    // What the user asked of the file system; `fine_timestamps` follows the writeback
    // cache, a FUSE option, and says nothing of the file system's options.
    let fs_options = jext::MountOptions {
        read_only: false,
        fine_timestamps: true,
        ..opts.fs.clone()
    };
    if fs_options != jext::MountOptions::default() {
        eprintln!(
            "jext mount: {} is already mounted on {}; {} shows that file system, whose \
             options are those of its first mount",
            image.display(),
            existing.mountpoint.display(),
            mountpoint.display()
        );
    }
    let request = jext_fuse::mount_request(opts, 0);
    jext_fuse::bind(&existing.mountpoint, &mountpoint, &request).map_err(|e| e.to_string())
}

/// Opens the image as its owner. A read-only mount of a writable image owns it too (as a
/// kernel mount holds its device), so that `remount,rw` can follow; an image this process
/// may not write is opened read-only when read-only was asked for.
fn open_owned(image: &Path, opts: &FuseOptions) -> Result<Fs, String> {
    let wait = Duration::from_secs(opts.owner_wait_secs).max(unmounting_daemon_wait(image));
    let device = match jext::open_device_waiting(image, false, wait) {
        Ok(device) => device,
        Err(e) if opts.fs.read_only && is_not_writable(e.raw_os_error) => {
            jext::open_device(image, true).map_err(|e| open_error(image, e.into()))?
        }
        Err(e) => return Err(open_error(image, e.into())),
    };
    let (fs, report) =
        Fs::open_with_report(device, opts.fs.clone()).map_err(|e| open_error(image, e))?;
    // Said before the mount appears, so that `jext mount` relays it.
    if !report.has_journal {
        eprintln!("jext mount: {}: {}", image.display(), jext::NO_JOURNAL_NOTE);
    }
    if report.unchecked {
        eprintln!(
            "jext mount: {} has no journal and was not cleanly unmounted: it may be \
             inconsistent; run e2fsck -f on it (it stays marked unchecked until then)",
            image.display()
        );
    }
    Ok(fs)
}

/// How long to wait for the image's owner when it is a jext daemon whose mount is already
/// gone: an unmount still checkpointing, as a mount racing `umount` meets (fstests
/// generic/604). The kernel makes such a mount wait for the unmount of a block device
/// too. Any other owner is refused at once (unless `owner_wait=` says otherwise).
fn unmounting_daemon_wait(image: &Path) -> Duration {
    let Some(holder) = jext::owner_of(image) else {
        return Duration::ZERO;
    };
    let mut words = holder.command.split_whitespace();
    let is_jext_daemon =
        words.next().is_some_and(|exe| exe.ends_with("jext")) && words.next() == Some("mount");
    if is_jext_daemon && super::mounts::mount_of(image).is_none() {
        UNMOUNT_FINISH_WAIT
    } else {
        Duration::ZERO
    }
}

/// Longest wait for an unmounting daemon to let go (a checkpoint of a full journal).
const UNMOUNT_FINISH_WAIT: Duration = Duration::from_secs(60);

fn is_not_writable(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EACCES | libc::EROFS | libc::EPERM))
}

/// `jext mount -o remount,...`: read-only once the kernel stopped writes (it writes back
/// what it still holds first) and the daemon has checkpointed; read-write the other way
/// round, so the kernel lets writes through only to a daemon that takes them.
fn remount(mountpoint: &Path, opts: &FuseOptions) -> Result<(), String> {
    let mountpoint = absolute(mountpoint)?;
    if !is_jext_mount(&mountpoint) {
        return Err(format!("{} is not a jext mount", mountpoint.display()));
    }
    let socket = socket_file(&mountpoint);
    let request = jext_fuse::mount_request(opts, 0);
    let kernel = |r| jext_fuse::remount(&mountpoint, r).map_err(|e| e.to_string());
    if opts.fs.read_only {
        kernel(&request)?;
        super::control::remount(&mountpoint, &socket, true)
    } else {
        super::control::remount(&mountpoint, &socket, false)?;
        kernel(&request)
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::fs::canonicalize(path).map_err(|e| format!("mount point {}: {e}", path.display()))
}

/// Where the daemon of `mountpoint` notes its process id (read by `jext umount`).
fn pid_file(mountpoint: &Path) -> PathBuf {
    run_file(mountpoint, "pid")
}

/// Where the daemon of `mountpoint` listens for `jext sync`.
fn socket_file(mountpoint: &Path) -> PathBuf {
    let named = run_file(mountpoint, "sock");
    // A Unix socket's path must fit sockaddr_un's 108 bytes; a long mount point gets a
    // name made from a hash of it instead.
    if named.as_os_str().len() < 108 {
        return named;
    }
    let fnv1a = mountpoint
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    Path::new(PID_DIR).join(format!("{fnv1a:016x}.sock"))
}

/// `jext sync DIR`: everything written under the jext mount at DIR made durable.
/// What the daemon of the jext mount at `mountpoint` has served so far (the benchmarks
/// read it before and after a run).
pub(crate) fn daemon_stats(mountpoint: &Path) -> Result<DaemonStats, String> {
    let mountpoint = absolute(mountpoint)?;
    super::control::stats(&mountpoint, &socket_file(&mountpoint))
}

pub fn sync(mountpoint: &Path) -> i32 {
    let result = absolute(mountpoint).and_then(|m| super::control::sync(&m, &socket_file(&m)));
    match result {
        Ok(()) => 0,
        Err(e) => fail("sync", &e),
    }
}

/// Where a background daemon's messages go; kept only when it ends with an error.
fn log_file(mountpoint: &Path) -> PathBuf {
    run_file(mountpoint, "log")
}

fn run_file(mountpoint: &Path, extension: &str) -> PathBuf {
    let name = mountpoint.to_string_lossy().replace('/', "%");
    Path::new(PID_DIR).join(format!("{name}.{extension}"))
}

/// Starts the daemon and waits for its mount (or its failure).
fn start_daemon(image: &Path, mountpoint: &Path, options: Option<&str>) -> Result<(), String> {
    let mountpoint = absolute(mountpoint)?;
    let log = log_file(&mountpoint);
    let _ = std::fs::create_dir_all(PID_DIR);
    let log_out =
        std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the jext binary: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount").arg("-f");
    if let Some(o) = options {
        cmd.arg("-o").arg(o);
    }
    cmd.arg(image).arg(&mountpoint);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_out);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the daemon: {e}"))?;
    let deadline = Instant::now() + MOUNT_WAIT;
    loop {
        if is_jext_mount(&mountpoint) {
            // What the daemon warned of on its way (a fallback it made) is the caller's
            // to read too.
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if !said.trim().is_empty() {
                eprint!("{said}");
            }
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            return Err(format!(
                "the daemon exited ({status}): {}",
                said.trim().trim_start_matches("jext mount: ")
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no mount on {} after {MOUNT_WAIT:?}; see {}",
                mountpoint.display(),
                log.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` still runs: a zombie (ended, not yet reaped by its parent, as a
/// `-f` daemon whose parent shell has not waited) does not.
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) STATE ...`; comm may hold spaces and parentheses, so read after the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// `jext umount DIR`: unmount, then wait for the daemon's clean shutdown.
pub fn umount(mountpoint: &Path) -> i32 {
    let mountpoint = match absolute(mountpoint) {
        Ok(m) => m,
        Err(e) => return fail("umount", &e),
    };
    let daemon = std::fs::read_to_string(pid_file(&mountpoint))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok());
    let source = jext_mounts()
        .into_iter()
        .find(|m| m.mountpoint == mountpoint)
        .map(|m| m.source);
    // `-i`: never the umount.fuse.jext helper, which is this command.
    let out = Command::new("umount").arg("-i").arg(&mountpoint).output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => return fail("umount", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => return fail("umount", &format!("cannot run umount: {e}")),
    }
    let still_served = source.is_some_and(|s| jext_mounts().iter().any(|m| m.source == s));
    if still_served {
        // Another mount point shows the same file system: its daemon serves on.
        return 0;
    }
    if let Some(pid) = daemon {
        let alive = || process_alive(pid);
        let deadline = Instant::now() + MOUNT_WAIT;
        while alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive() {
            return fail(
                "umount",
                &format!("the daemon (pid {pid}) is still checkpointing after {MOUNT_WAIT:?}"),
            );
        }
    }
    0
}
