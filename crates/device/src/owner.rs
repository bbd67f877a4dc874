//! The owner lock: at most one process has an image (or block device) open for writing.
//!
//! Two writers of one image each believe they own its free blocks and inode numbers, so
//! each hands out the same ones and the second checkpoint silently overwrites the first:
//! a mount of an image that another daemon still serves loses fsync'd files. Every
//! writable open takes this lock first and keeps it for the life of the device.
//!
//! The lock is a BSD `flock(LOCK_EX)` on the path's inode, taken on a descriptor of its
//! own. It belongs to that open file description, so nothing else the process opens or
//! closes on the same file drops it (as `close` drops a POSIX `fcntl` lock), and
//! `/proc/locks` names the process that holds it, which lets a refused opener say who is in
//! the way. It is also the lock udev and systemd honour on block devices. The kernel ignores
//! it: a kernel mount of the same image is not prevented (a `fuseblk` mount makes the
//! kernel hold its block device exclusively instead).
//!
//! Promises: `acquire` returns only when this process holds the lock; a refusal names the
//! path and, when the kernel shows it, the holder's pid and command line. It must never
//! block forever: waiting is bounded by the caller's timeout.

use crate::DeviceError;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often a waiting `acquire` tries again.
const RETRY_INTERVAL: Duration = Duration::from_millis(20);

/// The exclusive right to write one image; released when dropped or by [`OwnerLock::release`].
#[derive(Debug)]
pub struct OwnerLock {
    path: PathBuf,
    file: Option<File>,
}

/// The process that holds an image's owner lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line, space-separated (empty if it could not be read).
    pub command: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.command.is_empty() {
            write!(f, "pid {}", self.pid)
        } else {
            write!(f, "pid {} ({})", self.pid, self.command)
        }
    }
}

/// How long a lock held by a forked copy of a closed descriptor may take to go.
const FORK_GRACE: Duration = Duration::from_millis(500);

impl OwnerLock {
    /// Takes the lock on `path`, trying again for up to `wait` while another process holds
    /// it — and always for a moment: a process forked while the last owner was letting go
    /// (a multi-threaded program spawning a child) holds a copy of its lock until it execs.
    pub fn acquire(path: &Path, wait: Duration) -> Result<OwnerLock, DeviceError> {
        let file = File::open(path).map_err(|e| DeviceError::open(path, e))?;
        let deadline = Instant::now() + wait.max(FORK_GRACE);
        loop {
            // SAFETY: flock only reads the descriptor number, which `file` keeps open for
            // the duration of the call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(OwnerLock {
                    path: path.to_path_buf(),
                    file: Some(file),
                });
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(DeviceError::open(path, err));
            }
            if Instant::now() >= deadline {
                return Err(in_use(path, holder(path), wait));
            }
            std::thread::sleep(RETRY_INTERVAL);
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Gives the lock up now (a daemon does so once its image is clean, before it tells the
    /// kernel the unmount is done, so the next mount never finds it taken).
    pub fn release(&mut self) {
        // Closing the only descriptor of the open file description drops the flock.
        self.file = None;
    }
}

fn in_use(path: &Path, holder: Option<Holder>, waited: Duration) -> DeviceError {
    let who = holder.map_or_else(|| "another process".to_string(), |h| h.to_string());
    let after = if waited.is_zero() {
        String::new()
    } else {
        format!(" (waited {waited:?})")
    };
    DeviceError::open(
        path,
        io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("in use: {who} holds its owner lock{after}; an image has one writer at a time"),
        ),
    )
}

/// Who holds the owner lock of `path`, if anyone does (read from `/proc/locks`).
pub fn holder(path: &Path) -> Option<Holder> {
    let meta = std::fs::metadata(path).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = holder_in(&locks, meta.dev(), meta.ino())?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Some(Holder { pid, command })
}

/// The pid of the exclusive flock on inode `ino` of device `dev` in a `/proc/locks` text.
/// Its lines read `1: FLOCK  ADVISORY  WRITE 6199 fe:00:5324802 0 EOF` (major and minor in
/// hex, inode in decimal).
fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = format!(
        "{:02x}:{:02x}:{ino}",
        libc::major(dev as libc::dev_t),
        libc::minor(dev as libc::dev_t)
    );
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let is_ours = fields.get(1) == Some(&"FLOCK")
            && fields.get(3) == Some(&"WRITE")
            && fields.get(5) == Some(&want.as_str());
        if is_ours {
            fields.get(4)?.parse().ok()
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("jext-owner-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.img");
        std::fs::write(&path, [0u8; 4096]).unwrap();
        path
    }

    #[test]
    fn a_second_owner_is_refused_with_the_holders_pid_until_the_first_lets_go() {
        let path = scratch("second");
        let mut first = OwnerLock::acquire(&path, Duration::ZERO).unwrap();
        let err = OwnerLock::acquire(&path, Duration::from_millis(60)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
        assert!(text.contains("waited"), "{text}");
        assert_eq!(
            holder(&path).map(|h| h.pid),
            Some(std::process::id()),
            "the holder is visible to a reader"
        );
        first.release();
        assert_eq!(holder(&path), None);
        let again = OwnerLock::acquire(&path, Duration::ZERO);
        assert!(again.is_ok(), "released locks can be taken again");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_waiting_owner_gets_the_lock_when_it_is_released() {
        let path = scratch("wait");
        let first = OwnerLock::acquire(&path, Duration::ZERO).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
        });
        OwnerLock::acquire(&path, Duration::from_secs(10)).unwrap();
        releaser.join().unwrap();
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        let text = "1: FLOCK  ADVISORY  WRITE 6199 fe:00:5324802 0 EOF\n\
                    2: FLOCK  ADVISORY  READ 6200 fe:00:77 0 EOF\n\
                    3: OFDLCK ADVISORY  WRITE -1 fe:00:77 0 EOF\n\
                    4: FLOCK  ADVISORY  WRITE 42 08:01:77 0 EOF\n";
        let dev = libc::makedev(0xfe, 0) as u64;
        assert_eq!(holder_in(text, dev, 5324802), Some(6199));
        assert_eq!(
            holder_in(text, dev, 77),
            None,
            "read locks and OFD locks do not count"
        );
        assert_eq!(holder_in(text, libc::makedev(8, 1) as u64, 77), Some(42));
    }
}
