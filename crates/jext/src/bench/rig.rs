//! The bench rig: scratch images, loop devices with direct I/O, kernel mounts, and an
//! interrupt flag, each owned by a guard that undoes it.
//!
//! Promises: whatever a guard set up is torn down when the guard drops — on success, on
//! error and after Ctrl-C (the handler only raises a flag; the experiment loops check it
//! and unwind). Teardown failures are printed, never ignored silently. Must never leave a
//! loop device or a mount behind, and never touch a device it did not attach itself.

use jext_fuse::requests::DaemonStats;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs a command; an error names the command and carries its stderr.
pub fn run(program: &str, args: &[&str]) -> io::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("cannot run {program}: {e}")))?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A scratch directory for one bench run; removed with everything in it on drop.
pub struct Scratch {
    pub dir: PathBuf,
}

impl Scratch {
    pub fn new(parent: &Path) -> io::Result<Scratch> {
        let dir = parent.join(format!("jext-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch { dir })
    }

    /// A fresh sparse image file of `size_bytes` (any old one is replaced).
    pub fn image(&self, name: &str, size_bytes: u64) -> io::Result<PathBuf> {
        let path = self.dir.join(name);
        let file = std::fs::File::create(&path)?;
        file.set_len(size_bytes)?;
        Ok(path)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("jext bench: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// A loop device over an image file, with direct I/O so the host page cache is not a
/// second cache between the system under test and the disk.
pub struct LoopDevice {
    pub path: PathBuf,
}

impl LoopDevice {
    pub fn attach(image: &Path) -> io::Result<LoopDevice> {
        let image = image
            .to_str()
            .ok_or_else(|| io::Error::other("image path not UTF-8"))?;
        let path = run("losetup", &["--find", "--show", "--direct-io=on", image])?;
        Ok(LoopDevice {
            path: PathBuf::from(path),
        })
    }

    /// The kernel's block-layer statistics for this device (`/sys/block/loopN/stat`).
    pub fn stats(&self) -> io::Result<BlockStats> {
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let text = std::fs::read_to_string(format!("/sys/block/{name}/stat"))?;
        BlockStats::parse(&text)
            .ok_or_else(|| io::Error::other(format!("unexpected /sys/block/{name}/stat: {text:?}")))
    }

    pub fn path_str(&self) -> &str {
        self.path.to_str().expect("losetup prints UTF-8 paths")
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Err(e) = run("losetup", &["-d", self.path_str()]) {
            eprintln!("jext bench: {e}");
        }
    }
}

/// Counters of `/sys/block/<dev>/stat` (Documentation/block/stat.rst): field 5 is write
/// requests, field 7 sectors written (512 bytes each), field 16 flush requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
}

impl BlockStats {
    pub fn parse(text: &str) -> Option<BlockStats> {
        let fields: Vec<u64> = text
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        Some(BlockStats {
            writes: *fields.get(4)?,
            write_bytes: fields.get(6)? * 512,
            flushes: fields.get(15).copied().unwrap_or(0),
        })
    }
}

/// A mounted file system, unmounted on drop: by the kernel (`umount`), or for jext's FUSE
/// mount by `jext umount`, which waits for the daemon's checkpoint.
pub struct Mount {
    pub point: PathBuf,
    unmount: Unmount,
}

enum Unmount {
    /// `umount`, then wait for a user-space daemon serving `device` (if any) to exit.
    Kernel { daemon_device: Option<String> },
    /// `jext umount`, through this binary.
    Jext(PathBuf),
}

impl Mount {
    /// `mount -t fstype -o options device point`.
    pub fn kernel(fstype: &str, device: &str, point: &Path, options: &str) -> io::Result<Mount> {
        let point_text = prepare(point)?;
        run("mount", &["-t", fstype, "-o", options, device, point_text])?;
        Ok(Mount {
            point: point.to_path_buf(),
            unmount: Unmount::Kernel {
                daemon_device: None,
            },
        })
    }

    /// `fuse2fs device point` (read-write; it daemonises once mounted).
    pub fn fuse2fs(device: &str, point: &Path) -> io::Result<Mount> {
        let point_text = prepare(point)?;
        run("fuse2fs", &[device, point_text])?;
        Ok(Mount {
            point: point.to_path_buf(),
            unmount: Unmount::Kernel {
                daemon_device: Some(device.to_string()),
            },
        })
    }

    /// `jext mount -o options device point`, through this binary.
    pub fn jext(device: &str, point: &Path, options: &str) -> io::Result<Mount> {
        let point_text = prepare(point)?;
        let exe = std::env::current_exe()?;
        let exe_text = exe.to_string_lossy().to_string();
        run(&exe_text, &["mount", "-o", options, device, point_text])?;
        Ok(Mount {
            point: point.to_path_buf(),
            unmount: Unmount::Jext(exe),
        })
    }

    /// `sync -f POINT`, or for jext `jext sync POINT`: the kernel passes syncfs on to no
    /// FUSE daemon, and jext's answers the request on its control socket instead.
    pub fn sync(&self) -> io::Result<()> {
        let point = self.point.to_string_lossy();
        match &self.unmount {
            Unmount::Kernel { .. } => run("sync", &["-f", &point]),
            Unmount::Jext(exe) => run(&exe.to_string_lossy(), &["sync", &point]),
        }
        .map(drop)
    }
}

impl Mount {
    /// What jext's daemon has served so far; `None` for any other file system.
    pub fn daemon_stats(&self) -> io::Result<Option<DaemonStats>> {
        match &self.unmount {
            Unmount::Jext(_) => crate::cli::daemon_stats(&self.point)
                .map(Some)
                .map_err(io::Error::other),
            Unmount::Kernel { .. } => Ok(None),
        }
    }
}

fn prepare(point: &Path) -> io::Result<&str> {
    std::fs::create_dir_all(point)?;
    point
        .to_str()
        .ok_or_else(|| io::Error::other("mount point not UTF-8"))
}

impl Drop for Mount {
    fn drop(&mut self) {
        let point = self.point.to_string_lossy().to_string();
        let unmounted = match &self.unmount {
            Unmount::Kernel { daemon_device } => run("umount", &[&point]).map(|_| {
                if let Some(device) = daemon_device {
                    wait_for_daemon_exit(device);
                }
            }),
            Unmount::Jext(exe) => run(&exe.to_string_lossy(), &["umount", &point]).map(drop),
        };
        if let Err(e) = unmounted {
            eprintln!("jext bench: {e}");
        }
    }
}

/// Waits (up to 30 s) until no process has `device` on its command line: a FUSE daemon
/// finishes writing after `umount` returns, and its loop device must be idle before it
/// is detached.
fn wait_for_daemon_exit(device: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let serving = || {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                std::fs::read(entry.path().join("cmdline"))
                    .is_ok_and(|cmd| cmd.split(|&b| b == 0).any(|arg| arg == device.as_bytes()))
            })
    };
    while serving() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_stats_parse_the_kernel_layout() {
        let text = "  478904   119643  4906700   166410     1627     8586    92538     4404        0    14940   172187        0        0        0        0      311     1372\n";
        let s = BlockStats::parse(text).unwrap();
        assert_eq!(
            s,
            BlockStats {
                writes: 1627,
                write_bytes: 92538 * 512,
                flushes: 311
            }
        );
        // Kernels before 5.5 have no flush fields.
        let old = "1 2 3 4 5 6 7 8 9 10 11";
        assert_eq!(BlockStats::parse(old).unwrap().flushes, 0);
        assert_eq!(BlockStats::parse("1 2 x"), None);
    }

    #[test]
    fn a_scratch_directory_is_removed_with_its_images() {
        let scratch = Scratch::new(&std::env::temp_dir().join("jext-rig-test")).unwrap();
        let image = scratch.image("a.img", 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 1 << 20);
        let dir = scratch.dir.clone();
        drop(scratch);
        assert!(!dir.exists());
    }
}
