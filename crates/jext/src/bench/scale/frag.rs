//! The fragmented-file rows of `jext bench scale`: one file whose blocks lie one block
//! apart on the device, made the same way on jext and on Linux ext4, read back
//! sequentially and at random, then truncated to zero, at file sizes from tens of MiB to
//! 100 GiB and more (a curve, not one point).
//!
//! Construction, the same on both systems: file `a` takes the whole file system with
//! fallocate (unwritten extents: no data written), every other block of `a` is punched out
//! (one punch per block), and file `b` is written into the holes, so its blocks can only
//! be the holes, one block apart. Each 4 KiB block of `b` holds its own file offset (8
//! bytes, little-endian) and then a fixed byte, so every read is checked, and a
//! compressed RAM disk stores such a block in about 64 bytes.
//!
//! Backing: `/dev/zram0` when it exists and is unused (disksize 0): sized anew for each
//! file system and reset after each system, so jext and ext4 run on the same backing and
//! a 220 GiB file system costs a few GiB of RAM. Otherwise a loop device with direct I/O
//! over an image file in the scratch directory, and a size whose image would not fit
//! there is SKIPPED, said so.
//!
//! Promises: jext's file system is checked with `e2fsck -fn` (and, as root, mounted
//! read-only by Linux) after each step (punched, written, read, truncated); zram is reset
//! when a system's run ends, on success, on an error, after Ctrl-C and on a panic; a run
//! stops with an error naming the figure when
//! zram's RAM use reaches [`ZRAM_ABORT_BYTES`], and zram itself refuses to store more
//! than [`ZRAM_LIMIT_BYTES`]. Must never touch a zram device someone else sized. A run
//! killed outright (SIGKILL) leaves `/dev/zram0` sized: the next run says so and uses loop
//! devices; `echo 1 > /sys/block/zram0/reset` frees it.

use super::{e2fsck_verdict, ScaleOptions};
use crate::bench::rig::{self, LoopDevice, Mount, Scratch};
use crate::signals::check_interrupt;
use jext::{FallocateMode, Fs, MkfsOptions, MountOptions};
use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Bytes of one block (both systems use 4 KiB blocks).
const BLOCK: u64 = 4096;

/// Bytes of one write of `b` and of one sequential read.
const CHUNK: usize = 1 << 20;

/// What fills each block of `b` after its 8-byte offset.
const PATTERN: u8 = 0x5A;

/// Reads sampled for the random rate: enough to average, few enough to stay quick.
const RANDOM_READS: u64 = 20_000;

/// zram stores no more than this (its `mem_limit`): writes beyond it fail.
const ZRAM_LIMIT_BYTES: u64 = 12 << 30;

/// A run stops when zram's RAM use reaches this.
const ZRAM_ABORT_BYTES: u64 = 11 << 30;

/// How often (in steps of a long loop) Ctrl-C and zram's RAM are checked.
const CHECK_EVERY_STEPS: u64 = 4096;

/// How often a long loop says how far it got.
const SAY_EVERY: Duration = Duration::from_secs(60);

/// The file system for a file of `file_bytes`: twice the file (`a`'s holes hold `b`) and a
/// tenth more for what is not holes: inode tables (1.6%), ext4's journal (up to 1 GiB),
/// `a`'s extent tree, which grows into the holes as they are punched, and `b`'s.
pub(super) fn fs_bytes(file_bytes: u64) -> u64 {
    (file_bytes * 2 + file_bytes / 5 + (64 << 20)).next_multiple_of(1 << 20)
}

/// Where the rows keep their file systems.
enum Backing {
    Zram,
    /// Image files in this directory, free bytes in it at the start.
    Loop {
        dir: PathBuf,
        free_bytes: u64,
    },
}

impl Backing {
    fn choose(scratch: &Scratch) -> (Backing, String) {
        let zram = match Zram::disksize() {
            Ok(0) => None,
            Ok(bytes) => Some(format!(
                "/dev/zram0 is in use ({} sized by someone else; `echo 1 > /sys/block/zram0/reset` frees a leftover)",
                human(bytes)
            )),
            Err(e) => Some(format!("no /dev/zram0 ({e})")),
        };
        match zram {
            None => (
                Backing::Zram,
                format!(
                    "Backing: /dev/zram0 ({}), sized anew for each file system and reset after each system; the same for jext and ext4.",
                    // "lzo [lzo-rle] lz4": the one in brackets is in use.
                    std::fs::read_to_string("/sys/block/zram0/comp_algorithm")
                        .ok()
                        .and_then(|s| Some(s.split_once('[')?.1.split_once(']')?.0.to_string()))
                        .unwrap_or_else(|| "?".into())
                ),
            ),
            Some(why) => {
                let free_bytes = free_bytes(&scratch.dir).unwrap_or(0);
                (
                    Backing::Loop {
                        dir: scratch.dir.clone(),
                        free_bytes,
                    },
                    format!(
                        "Backing: loop devices (direct I/O) over image files in {} ({} free), since {why}.",
                        scratch.dir.display(),
                        human(free_bytes)
                    ),
                )
            }
        }
    }

    /// Why a file system of `bytes` cannot be made here, if it cannot.
    fn refuses(&self, bytes: u64) -> Option<String> {
        match self {
            Backing::Zram => None,
            // Sparse, but the holes and `b` are written: most of it reaches the disk.
            Backing::Loop { dir, free_bytes } => (bytes > *free_bytes).then(|| {
                format!(
                    "a {} image does not fit in {} ({} free) and there is no unused /dev/zram0",
                    human(bytes),
                    dir.display(),
                    human(*free_bytes)
                )
            }),
        }
    }

    fn device(&self, name: &str, bytes: u64) -> io::Result<Device> {
        match self {
            Backing::Zram => Zram::claim(bytes).map(Device::Zram),
            Backing::Loop { dir, .. } => {
                let image = dir.join(name);
                let file = std::fs::File::create(&image)?;
                file.set_len(bytes)?;
                Ok(Device::Loop {
                    device: LoopDevice::attach(&image)?,
                    image,
                })
            }
        }
    }
}

fn free_bytes(dir: &Path) -> io::Result<u64> {
    let text = rig::run("df", &["--output=avail", "-B1", &dir.to_string_lossy()])?;
    text.lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| io::Error::other(format!("df printed {text:?}")))
}

/// `/dev/zram0`, sized by this run; reset when dropped.
struct Zram;

impl Zram {
    const SYS: &'static str = "/sys/block/zram0";

    fn disksize() -> io::Result<u64> {
        read_number(&format!("{}/disksize", Zram::SYS))
    }

    /// Sizes the unused `/dev/zram0` to `bytes`, its stored data capped at
    /// [`ZRAM_LIMIT_BYTES`].
    fn claim(bytes: u64) -> io::Result<Zram> {
        let used = Zram::disksize()?;
        if used != 0 {
            return Err(io::Error::other(format!(
                "/dev/zram0 is in use ({} sized); not touching it",
                human(used)
            )));
        }
        // From here on the device is ours: a failure below still resets it.
        let zram = Zram;
        std::fs::write(
            format!("{}/mem_limit", Zram::SYS),
            ZRAM_LIMIT_BYTES.to_string(),
        )?;
        std::fs::write(format!("{}/disksize", Zram::SYS), bytes.to_string())?;
        Ok(zram)
    }

    /// RAM zram uses now and at most since it was sized (`mm_stat` fields 3 and 5).
    fn ram_bytes(&self) -> io::Result<(u64, u64)> {
        let text = std::fs::read_to_string(format!("{}/mm_stat", Zram::SYS))?;
        let fields: Vec<u64> = text
            .split_whitespace()
            .map_while(|f| f.parse().ok())
            .collect();
        match (fields.get(2), fields.get(4)) {
            (Some(&now), Some(&peak)) => Ok((now, peak)),
            _ => Err(io::Error::other(format!(
                "unexpected zram mm_stat {text:?}"
            ))),
        }
    }
}

impl Drop for Zram {
    fn drop(&mut self) {
        // Busy while a closing file system still holds the device: try for 30 s.
        let mut last = None;
        for _ in 0..150 {
            match std::fs::write(format!("{}/reset", Zram::SYS), "1") {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!(
            "jext bench scale: CANNOT RESET /dev/zram0 ({}): its RAM stays used until `echo 1 > /sys/block/zram0/reset`",
            last.map_or_else(String::new, |e| e.to_string())
        );
    }
}

fn read_number(path: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string(path)?;
    text.trim()
        .parse()
        .map_err(|_| io::Error::other(format!("{path}: not a number: {text:?}")))
}

/// One system's block device for one size, torn down on drop.
enum Device {
    Zram(Zram),
    Loop { device: LoopDevice, image: PathBuf },
}

impl Device {
    fn path(&self) -> &Path {
        match self {
            Device::Zram(_) => Path::new("/dev/zram0"),
            Device::Loop { device, .. } => &device.path,
        }
    }

    /// Fails after Ctrl-C, or when zram's RAM use reached [`ZRAM_ABORT_BYTES`].
    fn check(&self) -> io::Result<()> {
        check_interrupt()?;
        if let Device::Zram(zram) = self {
            let (now, _) = zram.ram_bytes()?;
            if now >= ZRAM_ABORT_BYTES {
                return Err(io::Error::other(format!(
                    "zram uses {} of RAM, the limit is {}: stopped",
                    human(now),
                    human(ZRAM_ABORT_BYTES)
                )));
            }
        }
        Ok(())
    }

    fn ram_peak_bytes(&self) -> Option<u64> {
        match self {
            Device::Zram(zram) => zram.ram_bytes().ok().map(|(_, peak)| peak),
            Device::Loop { .. } => None,
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // The loop device is detached after this (its field drops next), which frees the
        // unlinked image's space.
        if let Device::Loop { image, .. } = self {
            if let Err(e) = std::fs::remove_file(&*image) {
                eprintln!("jext bench scale: cannot remove {}: {e}", image.display());
            }
        }
    }
}

/// A long loop's counter: every [`CHECK_EVERY_STEPS`] steps it checks for Ctrl-C and
/// zram's RAM, and every [`SAY_EVERY`] it says how far it got.
struct Steps<'a> {
    what: String,
    device: &'a Device,
    total: u64,
    done: u64,
    started: Instant,
    said: Instant,
}

impl<'a> Steps<'a> {
    fn new(what: String, device: &'a Device, total: u64) -> Steps<'a> {
        Steps {
            what,
            device,
            total,
            done: 0,
            started: Instant::now(),
            said: Instant::now(),
        }
    }

    fn step(&mut self) -> io::Result<()> {
        self.done += 1;
        if self.done.is_multiple_of(CHECK_EVERY_STEPS) {
            self.device.check()?;
            if self.said.elapsed() >= SAY_EVERY {
                self.said = Instant::now();
                let ram = match self.device {
                    Device::Zram(z) => z
                        .ram_bytes()
                        .map(|(now, _)| format!(", zram {}", human(now)))
                        .unwrap_or_default(),
                    Device::Loop { .. } => String::new(),
                };
                eprintln!(
                    "jext bench scale: {}: {} of {} ({:.0}/s{ram})",
                    self.what,
                    self.done,
                    self.total,
                    self.done as f64 / self.started.elapsed().as_secs_f64()
                );
            }
        }
        Ok(())
    }

    fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// What the rows need of a file system, so jext and Linux ext4 run the same loops.
trait System {
    type File;
    fn create(&self, name: &str) -> io::Result<Self::File>;
    fn open(&self, name: &str) -> io::Result<Self::File>;
    /// Allocates `[offset, offset + len)` (unwritten, the size following); `false` when
    /// there is no room for all of it.
    fn allocate(&self, file: &Self::File, offset: u64, len: u64) -> io::Result<bool>;
    fn punch(&self, file: &Self::File, offset: u64, len: u64) -> io::Result<()>;
    fn write(&self, file: &Self::File, offset: u64, data: &[u8]) -> io::Result<()>;
    fn read(&self, file: &Self::File, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn sync(&self, file: &Self::File) -> io::Result<()>;
    fn size(&self, file: &Self::File) -> io::Result<u64>;
    fn set_len(&self, file: &Self::File, len: u64) -> io::Result<()>;
    /// How many extents the file has, as the system itself reports it.
    fn extents(&self, file: &Self::File) -> io::Result<u64>;
    /// Unmounts, writing everything back.
    fn finish(self) -> io::Result<()>;
}

struct Jext(Fs);

fn jext_err(e: jext::FsError) -> io::Error {
    io::Error::other(e)
}

impl System for Jext {
    type File = jext::File;

    fn create(&self, name: &str) -> io::Result<jext::File> {
        self.0
            .create_file(&format!("/{name}"), 0o644)
            .map_err(jext_err)
    }

    fn open(&self, name: &str) -> io::Result<jext::File> {
        self.0.open_file(&format!("/{name}")).map_err(jext_err)
    }

    fn allocate(&self, file: &jext::File, offset: u64, len: u64) -> io::Result<bool> {
        match self
            .0
            .fallocate(file.ino(), offset, len, FallocateMode::default())
        {
            Ok(()) => Ok(true),
            Err(jext::FsError::NoSpace(_)) => Ok(false),
            Err(e) => Err(jext_err(e)),
        }
    }

    fn punch(&self, file: &jext::File, offset: u64, len: u64) -> io::Result<()> {
        let punch = FallocateMode {
            punch_hole: true,
            keep_size: true,
            zero_range: false,
        };
        self.0
            .fallocate(file.ino(), offset, len, punch)
            .map_err(jext_err)
    }

    fn write(&self, file: &jext::File, offset: u64, data: &[u8]) -> io::Result<()> {
        let written = file.write_at(offset, data).map_err(jext_err)?;
        if written != data.len() {
            return Err(io::Error::other(format!(
                "wrote {written} of {} bytes at {offset}",
                data.len()
            )));
        }
        Ok(())
    }

    fn read(&self, file: &jext::File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let got = file.read_at(offset, buf.len()).map_err(jext_err)?;
        if got.len() != buf.len() {
            return Err(io::Error::other(format!(
                "read {} of {} bytes at {offset}",
                got.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&got);
        Ok(())
    }

    fn sync(&self, file: &jext::File) -> io::Result<()> {
        file.fsync().map_err(jext_err)
    }

    fn size(&self, file: &jext::File) -> io::Result<u64> {
        file.stat().map(|s| s.size).map_err(jext_err)
    }

    fn set_len(&self, file: &jext::File, len: u64) -> io::Result<()> {
        file.set_len(len).map_err(jext_err)
    }

    fn extents(&self, file: &jext::File) -> io::Result<u64> {
        Ok(self.0.extents(file.ino()).map_err(jext_err)?.len() as u64)
    }

    fn finish(self) -> io::Result<()> {
        self.0.unmount().map_err(jext_err)
    }
}

/// Linux ext4 through a kernel mount.
struct Linux(Mount);

/// `fallocate(2)` on `file`.
fn fallocate(file: &std::fs::File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on an open descriptor with plain integer arguments.
    let done = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl System for Linux {
    type File = std::fs::File;

    fn create(&self, name: &str) -> io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.0.point.join(name))
    }

    fn open(&self, name: &str) -> io::Result<std::fs::File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.0.point.join(name))
    }

    fn allocate(&self, file: &std::fs::File, offset: u64, len: u64) -> io::Result<bool> {
        match fallocate(file, 0, offset, len) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn punch(&self, file: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
        fallocate(
            file,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    fn write(&self, file: &std::fs::File, offset: u64, data: &[u8]) -> io::Result<()> {
        file.write_all_at(data, offset)
    }

    fn read(&self, file: &std::fs::File, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        file.read_exact_at(buf, offset)
    }

    fn sync(&self, file: &std::fs::File) -> io::Result<()> {
        file.sync_all()
    }

    fn size(&self, file: &std::fs::File) -> io::Result<u64> {
        Ok(file.metadata()?.len())
    }

    fn set_len(&self, file: &std::fs::File, len: u64) -> io::Result<()> {
        file.set_len(len)
    }

    fn extents(&self, _file: &std::fs::File) -> io::Result<u64> {
        let path = self.0.point.join("b");
        let text = rig::run("filefrag", &[&path.to_string_lossy()])?;
        // "PATH: N extents found"
        text.rsplit(": ")
            .next()
            .and_then(|t| t.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| io::Error::other(format!("filefrag printed {text:?}")))
    }

    fn finish(self) -> io::Result<()> {
        self.0.sync()?;
        drop(self.0);
        Ok(())
    }
}

/// Figures of one system for one size.
#[derive(Default)]
struct Figures {
    /// Blocks of `a` before the punching, punches made, and the seconds each phase took.
    a_blocks: u64,
    fill_s: f64,
    punches: u64,
    punch_s: f64,
    write_s: f64,
    seq_s: f64,
    random_s: f64,
    random_reads: u64,
    truncate_s: f64,
    extents: u64,
    /// `b`'s extent tree depth (the root's `eh_depth`) by debugfs, after it was written
    /// and after it was truncated.
    depth: String,
    depth_truncated: String,
    /// `e2fsck -fn` after each step (jext only).
    verdicts: Vec<(&'static str, String)>,
    zram_peak_bytes: Option<u64>,
}

/// The block at `offset` of `b`: its offset, then the pattern.
fn stamp(chunk: &mut [u8], offset: u64) {
    for (i, block) in chunk.chunks_mut(BLOCK as usize).enumerate() {
        block[..8].copy_from_slice(&(offset + i as u64 * BLOCK).to_le_bytes());
    }
}

/// Fails unless `data`, read at `offset` of `b`, is what [`stamp`] wrote there.
fn check_stamps(data: &[u8], offset: u64, pattern: &[u8]) -> io::Result<()> {
    for (i, block) in data.chunks(BLOCK as usize).enumerate() {
        let at = offset + i as u64 * BLOCK;
        if block[..8] != at.to_le_bytes() || block[8..] != pattern[8..block.len()] {
            return Err(io::Error::other(format!(
                "b's block at byte {at} does not hold what was written there"
            )));
        }
    }
    Ok(())
}

/// Block indexes of a file of `blocks` blocks in a fixed pseudo-random order (a sample).
fn random_blocks(blocks: u64) -> Vec<u64> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..RANDOM_READS.min(blocks))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % blocks
        })
        .collect()
}

/// The depth of `path`'s extent tree on `device` (the root's `eh_depth`), by debugfs:
/// the first line of `ex -n` (interior nodes only, so a tree of millions of extents
/// prints thousands of lines) starts "level/ depth"; an inline root alone prints none.
fn extent_depth(device: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-c", "-R", &format!("ex -n {path}")])
        .arg(device)
        .output();
    let Ok(out) = out else {
        return "? (no debugfs)".into();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let depth = text.lines().find_map(|l| {
        let (_, depth) = l.trim_start().split_once('/')?;
        depth.split_whitespace().next()?.parse::<u32>().ok()
    });
    depth.map_or("0".into(), |d| d.to_string())
}

/// Runs the steps on one system: fill and punch `a`, write `b`, read `b` sequentially and
/// at random, truncate `b` to zero, each step on a fresh mount; `after(step)` runs with
/// the file system unmounted after each.
fn run_system<S: System>(
    name: &str,
    device: &Device,
    file_bytes: u64,
    mount: impl Fn() -> io::Result<S>,
    mut after: impl FnMut(&'static str) -> io::Result<()>,
) -> io::Result<Figures> {
    let mut fig = Figures::default();
    let size = human(file_bytes);
    let say = |step: &str, seconds: f64| {
        eprintln!("jext bench scale: frag {size}, {name}: {step} in {seconds:.1} s");
    };

    // `a` takes all the room, in steps that halve when the next would not fit.
    let sys = mount()?;
    let a = sys.create("a")?;
    let started = Instant::now();
    let mut a_len = 0u64;
    let mut step_bytes = 1u64 << 30;
    while step_bytes >= BLOCK {
        device.check()?;
        if sys.allocate(&a, a_len, step_bytes)? {
            a_len += step_bytes;
        } else {
            // ext4 may keep what it allocated before running out.
            a_len = sys.size(&a)?.max(a_len);
            step_bytes /= 2;
        }
    }
    sys.sync(&a)?;
    fig.fill_s = started.elapsed().as_secs_f64();
    fig.a_blocks = a_len / BLOCK;
    say(
        &format!("fallocate a ({} blocks)", fig.a_blocks),
        fig.fill_s,
    );
    let mut steps = Steps::new(
        format!("frag {size}, {name}: punch"),
        device,
        fig.a_blocks / 2,
    );
    for block in (1..fig.a_blocks).step_by(2) {
        sys.punch(&a, block * BLOCK, BLOCK)?;
        steps.step()?;
    }
    sys.sync(&a)?;
    fig.punches = steps.done;
    fig.punch_s = steps.seconds();
    say(&format!("{} punches", fig.punches), fig.punch_s);
    drop(a);
    sys.finish()?;
    after("punched")?;

    let sys = mount()?;
    let b = sys.create("b")?;
    let mut chunk = vec![PATTERN; CHUNK];
    let mut steps = Steps::new(
        format!("frag {size}, {name}: write b (MiB)"),
        device,
        file_bytes / CHUNK as u64,
    );
    let mut at = 0;
    while at < file_bytes {
        stamp(&mut chunk, at);
        sys.write(&b, at, &chunk)?;
        at += CHUNK as u64;
        steps.step()?;
    }
    sys.sync(&b)?;
    fig.write_s = steps.seconds();
    say("write b", fig.write_s);
    fig.extents = sys.extents(&b)?;
    drop(b);
    sys.finish()?;
    fig.depth = extent_depth(device.path(), "/b");
    after("written")?;

    let pattern = vec![PATTERN; CHUNK];
    let sys = mount()?;
    let b = sys.open("b")?;
    let mut steps = Steps::new(
        format!("frag {size}, {name}: sequential read (MiB)"),
        device,
        file_bytes / CHUNK as u64,
    );
    let mut at = 0;
    while at < file_bytes {
        sys.read(&b, at, &mut chunk)?;
        check_stamps(&chunk, at, &pattern)?;
        at += CHUNK as u64;
        steps.step()?;
    }
    fig.seq_s = steps.seconds();
    say("sequential read", fig.seq_s);
    drop(b);
    sys.finish()?;

    let sys = mount()?;
    let b = sys.open("b")?;
    let sample = random_blocks(file_bytes / BLOCK);
    let mut block = vec![0u8; BLOCK as usize];
    let started = Instant::now();
    for &index in &sample {
        sys.read(&b, index * BLOCK, &mut block)?;
        check_stamps(&block, index * BLOCK, &pattern)?;
    }
    fig.random_s = started.elapsed().as_secs_f64();
    fig.random_reads = sample.len() as u64;
    say("random reads", fig.random_s);
    drop(b);
    sys.finish()?;
    after("read")?;

    let sys = mount()?;
    let b = sys.open("b")?;
    let started = Instant::now();
    sys.set_len(&b, 0)?;
    sys.sync(&b)?;
    fig.truncate_s = started.elapsed().as_secs_f64();
    say("truncate b to zero", fig.truncate_s);
    drop(b);
    sys.finish()?;
    fig.depth_truncated = extent_depth(device.path(), "/b");
    after("truncated")?;
    fig.zram_peak_bytes = device.ram_peak_bytes();
    Ok(fig)
}

fn jext_figures(backing: &Backing, file_bytes: u64) -> io::Result<Figures> {
    let device = backing.device("frag-jext.img", fs_bytes(file_bytes))?;
    let path = device.path().to_path_buf();
    jext::mkfs(
        jext::open_device(&path, false).map_err(io::Error::other)?,
        &MkfsOptions {
            block_size: Some(BLOCK as u32),
            // A fresh zram device and a fresh sparse image read as zeros.
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .map_err(io::Error::other)?;
    let mut verdicts = Vec::new();
    let mut fig = run_system(
        "jext",
        &device,
        file_bytes,
        || {
            Fs::open_path(&path, MountOptions::default())
                .map(Jext)
                .map_err(jext_err)
        },
        |step| {
            let started = Instant::now();
            let verdict = e2fsck_verdict(&path)?;
            eprintln!(
                "jext bench scale: frag {}, jext: e2fsck -fn after {step}: {verdict} ({:.1} s)",
                human(file_bytes),
                started.elapsed().as_secs_f64()
            );
            verdicts.push((step, verdict));
            Ok(())
        },
    )?;
    fig.verdicts = verdicts;
    Ok(fig)
}

fn linux_figures(backing: &Backing, scratch: &Scratch, file_bytes: u64) -> io::Result<Figures> {
    let device = backing.device("frag-linux.img", fs_bytes(file_bytes))?;
    let path = device.path().to_string_lossy().to_string();
    // Inode tables and journal zeroed now, so no lazy-init thread writes during the run.
    rig::run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            &path,
        ],
    )?;
    let point = scratch.dir.join("frag-mnt");
    run_system(
        "ext4",
        &device,
        file_bytes,
        || Mount::kernel("ext4", &path, &point, "").map(Linux),
        |_| Ok(()),
    )
}

/// `bytes` rounded for a table: GiB with one decimal from 1 GiB on, else MiB.
fn human(bytes: u64) -> String {
    let gib = bytes as f64 / f64::from(1 << 30);
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    }
}

fn per_s(count: u64, seconds: f64) -> f64 {
    count as f64 / seconds.max(1e-9)
}

fn mib_s(bytes: u64, seconds: f64) -> f64 {
    per_s(bytes, seconds) / f64::from(1 << 20)
}

/// The rows, one per file size, in two tables (reads; construction, tree and checks).
pub(super) fn rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    crate::signals::catch_interrupts();
    let (backing, said) = Backing::choose(scratch);
    eprintln!("jext bench scale: {said}");
    let mut reads = String::from(
        "| file | file system | jext seq (MiB/s) | ext4 seq (MiB/s) | jext / ext4 | jext random (reads/s) | ext4 random (reads/s) | jext / ext4 |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut making = String::from(
        "| file | extents (jext / ext4) | tree depth after write (jext / ext4) | punch every other block of a (jext / ext4, punches/s) | write b (jext / ext4, MiB/s) | truncate b to 0 (jext / ext4, s) | depth after truncate (jext / ext4) | e2fsck -fn (and, as root, a Linux read-only mount) of jext's after punch, write, read, truncate | zram RAM peak (jext / ext4) |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut stopped = None;
    let mut interrupted = None;
    for &file_bytes in &opts.frag_file_bytes {
        let fs = fs_bytes(file_bytes);
        if let Some(why) = backing.refuses(fs) {
            let _ = writeln!(
                reads,
                "| {} | {} | SKIPPED: {why} |||||",
                human(file_bytes),
                human(fs)
            );
            continue;
        }
        let both = jext_figures(&backing, file_bytes)
            .and_then(|ours| Ok((ours, linux_figures(&backing, scratch, file_bytes)?)));
        let (ours, theirs) = match both {
            Ok(both) => both,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                interrupted = Some(e);
                stopped = Some(format!(
                    "Interrupted (Ctrl-C) during the {} file: the rows above are complete.",
                    human(file_bytes)
                ));
                break;
            }
            Err(e) => {
                stopped = Some(format!(
                    "The {} file failed, so larger ones were not tried: {e}",
                    human(file_bytes)
                ));
                break;
            }
        };
        let seq = |f: &Figures| mib_s(file_bytes, f.seq_s);
        let rnd = |f: &Figures| per_s(f.random_reads, f.random_s);
        let _ = writeln!(
            reads,
            "| {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} | {:.2} |",
            human(file_bytes),
            human(fs),
            seq(&ours),
            seq(&theirs),
            seq(&ours) / seq(&theirs),
            rnd(&ours),
            rnd(&theirs),
            rnd(&ours) / rnd(&theirs),
        );
        let verdicts: Vec<&str> = ours.verdicts.iter().map(|(_, v)| v.as_str()).collect();
        let peak = |f: &Figures| f.zram_peak_bytes.map_or("-".to_string(), human);
        let _ = writeln!(
            making,
            "| {} | {} / {} | {} / {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} / {:.2} | {} / {} | {} | {} / {} |",
            human(file_bytes),
            ours.extents,
            theirs.extents,
            ours.depth,
            theirs.depth,
            per_s(ours.punches, ours.punch_s),
            per_s(theirs.punches, theirs.punch_s),
            mib_s(file_bytes, ours.write_s),
            mib_s(file_bytes, theirs.write_s),
            ours.truncate_s,
            theirs.truncate_s,
            ours.depth_truncated,
            theirs.depth_truncated,
            verdicts.join("; "),
            peak(&ours),
            peak(&theirs),
        );
        eprintln!(
            "jext bench scale: fragmented file of {}: done",
            human(file_bytes)
        );
    }
    let _ = writeln!(
        out,
        "\n### A file fragmented every other block, read back\n\n{said} File `a` takes the file system by fallocate, every other block of it is punched out, file `b` is written into the holes (each 4 KiB block stamped with its offset, every read checked); each step on a fresh mount.\n\n{reads}\n{making}"
    );
    if let Some(stopped) = stopped {
        let _ = writeln!(out, "\n{stopped}");
    }
    // The finished sizes are in the report; the caller stops the other rows.
    interrupted.map_or(Ok(()), Err)
}
