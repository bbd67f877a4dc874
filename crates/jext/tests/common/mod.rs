//! What the FUSE tests share: root and /dev/fuse detection (a test that cannot mount says
//! it skipped, loudly), running a test on each FUSE transport (`/dev/fuse`, and FUSE over
//! io_uring where root has switched it on), scratch images, the jext command, mounting,
//! unmounting and killing daemons, and `e2fsck -fn`.
#![allow(dead_code)]

use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const JEXT: &str = env!("CARGO_BIN_EXE_jext");

pub fn can_mount() -> bool {
    let root = fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: FUSE mounts need root and /dev/fuse");
        return false;
    }
    true
}

thread_local! {
    /// The `-o` option of the transport the running test mounts with ("" for /dev/fuse).
    static TRANSPORT: Cell<&'static str> = const { Cell::new("") };
}

/// Runs a mount test on each FUSE transport: `/dev/fuse`, then FUSE over io_uring
/// (`-o fuse_uring`, every mount of the test) where root has switched it on, saying
/// SKIPPED loudly where it has not. Nothing runs without root and /dev/fuse.
pub fn on_each_transport(test: impl Fn()) {
    if !can_mount() {
        return;
    }
    test();
    match jext_fuse::uring_unavailable() {
        Some(why) => eprintln!("SKIPPED with -o fuse_uring: {why} (scripts/setup switches it on)"),
        None => {
            TRANSPORT.set("fuse_uring");
            test();
            TRANSPORT.set("");
        }
    }
}

/// The running test's transport, to name in what it prints.
pub fn transport_name() -> &'static str {
    match TRANSPORT.get() {
        "" => "/dev/fuse",
        transport => transport,
    }
}

/// `options` with the running test's transport.
fn with_transport(options: &str) -> String {
    match (options, TRANSPORT.get()) {
        (options, "") => options.to_string(),
        ("", transport) => transport.to_string(),
        (options, transport) => format!("{options},{transport}"),
    }
}

/// On an io_uring test, checks that the daemon of `mnt` serves through its rings (a mount
/// that fell back to /dev/fuse would test the other transport twice).
fn assert_transport(mnt: &Path) {
    if TRANSPORT.get().is_empty() {
        return;
    }
    let pid_file =
        Path::new("/run/jext").join(format!("{}.pid", mnt.to_string_lossy().replace('/', "%")));
    let pid =
        fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
    // The rings start once the mount is up, as the daemon begins to serve.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = fs::read_dir(format!("/proc/{}/task", pid.trim())).unwrap();
        let rings = tasks
            .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("fuser-ring-"))
            .count();
        if rings > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "-o fuse_uring: the daemon of {} has no ring threads",
            mnt.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `CAP_SYS_RESOURCE`, which ext4 (and jext's mount) asks for to change `chattr +j`.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process has capability `cap` in its effective set. Some sandboxes drop
/// CAP_SYS_RESOURCE from every process (the bounding set), root included.
pub fn has_capability(cap: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|mask| mask >> cap & 1 == 1)
}

/// Sets or clears `j` on `path` of the unmounted image through the library (which, being
/// the image's owner, asks for no capability).
pub fn set_journal_flag_offline(image: &Path, path: &str, on: bool) {
    let fs = jext::Fs::open_path(image, jext::MountOptions::default()).unwrap();
    let ino = fs.resolve(path).unwrap();
    let mode = match on {
        true => jext::FileJournalMode::Data,
        false => jext::FileJournalMode::Mount,
    };
    fs.set_journal_mode(ino, mode).unwrap();
    fs.unmount().unwrap();
}

pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("jext-fuse-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("mnt")).unwrap();
        let s = Scratch { dir };
        jext(&["mkfs", s.image().to_str().unwrap(), "--size", "128M"]);
        s
    }
    pub fn image(&self) -> PathBuf {
        self.dir.join("fs.img")
    }
    pub fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Never leave a mount behind, even when a test fails half-way.
        let _ = Command::new("umount").arg("-l").arg(self.mnt()).output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

pub fn jext(args: &[&str]) -> String {
    let out = Command::new(JEXT).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "jext {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `jext mount -o options` (with the running test's transport).
pub fn mount(s: &Scratch, options: &str) {
    jext(&[
        "mount",
        "-o",
        &with_transport(options),
        s.image().to_str().unwrap(),
        s.mnt().to_str().unwrap(),
    ]);
    assert_transport(&s.mnt());
}

/// `jext umount`. Tests run in parallel threads of one process, and a child another test
/// forks holds this process's descriptors until it execs (they close then): an unmount
/// that meets that moment is told the target is busy, so a busy answer is tried again.
pub fn umount(s: &Scratch) {
    let mnt = s.mnt();
    retry_while_busy(&format!("jext umount {}", mnt.display()), || {
        Command::new(JEXT)
            .args(["umount", mnt.to_str().unwrap()])
            .output()
            .unwrap()
    });
}

/// Runs `attempt` until it succeeds, for up to 5 s while it fails with "busy".
pub fn retry_while_busy(what: &str, attempt: impl Fn() -> std::process::Output) {
    for _ in 0..50 {
        let out = attempt();
        if out.status.success() {
            return;
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(why.contains("busy"), "{what}: {why}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("{what}: still busy after 5 s");
}

pub fn e2fsck_clean(image: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A `jext mount -f -o options` daemon (with the running test's transport), once its
/// mount is up (for tests that kill it).
pub fn foreground_daemon(s: &Scratch, options: &str) -> Child {
    spawn_daemon(s, options, Stdio::inherit())
}

/// [`foreground_daemon`] with its stderr kept, for tests that read what it said
/// (`Child::wait_with_output` once it ended).
pub fn foreground_daemon_heard(s: &Scratch, options: &str) -> Child {
    spawn_daemon(s, options, Stdio::piped())
}

fn spawn_daemon(s: &Scratch, options: &str, stderr: Stdio) -> Child {
    let mut daemon = Command::new(JEXT)
        .args(["mount", "-f", "-o", &with_transport(options)])
        .arg(s.image())
        .arg(s.mnt())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    wait_for_mount(&s.mnt(), &mut daemon);
    assert_transport(&s.mnt());
    daemon
}

/// SIGKILL for a daemon: its mount stays, dead, until `unmount_dead`.
pub fn kill_daemon(mut daemon: Child) {
    daemon.kill().unwrap();
    daemon.wait().unwrap();
}

/// Unmounts the mount a killed daemon left behind.
pub fn unmount_dead(s: &Scratch) {
    let out = Command::new("umount").arg(s.mnt()).output().unwrap();
    assert!(
        out.status.success(),
        "umount of the dead mount {}: {}",
        s.mnt().display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn wait_for_mount(mnt: &Path, daemon: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = mnt.to_string_lossy().to_string();
    loop {
        let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
        if info
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        {
            return;
        }
        assert!(
            daemon.try_wait().unwrap().is_none(),
            "the daemon exited before mounting"
        );
        assert!(Instant::now() < deadline, "no mount after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
