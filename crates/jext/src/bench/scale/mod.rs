//! `jext bench scale`: how jext's checking and directories grow with size, beside
//! e2fsck and Linux ext4, as curves (several sizes per row), in one run.
//!
//! Rows: `jext fsck` against `e2fsck -fn` on empty jext-made images of growing size and on
//! trees of growing size written by Linux (a loop mount of a mkfs.ext4 image); creating
//! and listing one directory of growing size through the jext library against Linux
//! ext4 (loop device), with the creation rate of the first and of the last tenth of the
//! names (flat means the last tenth is as fast as the first; `dir_library`: each run in a
//! fresh process, the medians of a few), and the same through the
//! jext mount beside Linux ext4 in the same run (the listing rate's ratio, and the READDIR
//! requests a listing took); and a file fragmented every
//! other block, from 1 GiB to 100 GiB, read back on jext and on Linux ext4 (`frag`). Every
//! jext image is checked with `e2fsck -fn` afterwards and the verdict reported.
//!
//! Promises: every image is made fresh and removed with the scratch directory; both
//! checkers run on the same image with the same (warm) page cache, best of two. Never
//! writes outside the scratch directory, except `/dev/zram0` when the fragmented-file
//! rows find it unused (see `frag`), which they reset. Without root the Linux rows are
//! SKIPPED, said so.

mod dir_library;
mod frag;

pub use dir_library::library_runs_json;

use super::rig::{LoopDevice, Mount, Scratch};
use jext::{FileDevice, MkfsOptions};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run: sizes for each curve.
pub struct ScaleOptions {
    pub dir: PathBuf,
    pub empty_image_bytes: Vec<u64>,
    pub tree_files: Vec<usize>,
    pub dir_entries: Vec<usize>,
    /// Sizes of the fragmented file (its file system is a little over twice as large,
    /// see [`frag::fs_bytes`]).
    pub frag_file_bytes: Vec<u64>,
    /// The row groups to run (see [`ROWS`]).
    pub rows: Vec<&'static str>,
    /// Runs of each library directory row (each in a fresh process; the medians are
    /// reported).
    pub repetitions: usize,
}

/// The row groups, by name: empty-image fsck, Linux-written trees (fsck and Linux's own
/// directory rates), directories through the library, directories through the mount.
pub const ROWS: [&str; 5] = [
    "fsck-empty",
    "linux-trees",
    "dir-library",
    "dir-mount",
    "frag-read",
];

impl ScaleOptions {
    pub fn new(dir: PathBuf, quick: bool) -> ScaleOptions {
        if quick {
            ScaleOptions {
                dir,
                empty_image_bytes: vec![16 << 30, 256 << 30, 1 << 40],
                tree_files: vec![10_000, 50_000],
                dir_entries: vec![10_000, 100_000],
                frag_file_bytes: vec![32 << 20, 256 << 20],
                rows: ROWS.to_vec(),
                repetitions: 1,
            }
        } else {
            ScaleOptions {
                dir,
                empty_image_bytes: vec![64 << 30, 256 << 30, 1 << 40, 4 << 40],
                tree_files: vec![10_000, 100_000, 300_000, 1_000_000],
                dir_entries: vec![10_000, 100_000, 300_000, 1_000_000],
                // 100 GiB needs a 220 GiB file system: on zram (see `frag`), a few GiB of RAM.
                frag_file_bytes: vec![1 << 30, 10 << 30, 50 << 30, 100 << 30],
                rows: ROWS.to_vec(),
                repetitions: 3,
            }
        }
    }
}

impl ScaleOptions {
    /// Keeps the row groups whose name contains `pattern` (`--only dir-`).
    pub fn only(&mut self, pattern: &str) {
        self.rows.retain(|r| r.contains(pattern));
    }

    fn runs(&self, row: &str) -> bool {
        self.rows.contains(&row)
    }
}

/// Runs the chosen rows; returns the report as markdown. After Ctrl-C the report holds
/// the rows that finished (the fragmented-file rows keep their finished sizes), since a
/// long run's first hours are worth keeping.
pub fn run(opts: &ScaleOptions, root: bool) -> io::Result<String> {
    let scratch = Scratch::new(&opts.dir)?;
    let mut out = String::new();
    match run_rows(opts, root, &scratch, &mut out) {
        Err(e) if e.kind() == io::ErrorKind::Interrupted && !out.is_empty() => {
            let _ = writeln!(
                out,
                "\nInterrupted (Ctrl-C): the rows above finished, the rest did not run."
            );
            Ok(out)
        }
        ran => ran.map(|()| out),
    }
}

fn run_rows(
    opts: &ScaleOptions,
    root: bool,
    scratch: &Scratch,
    out: &mut String,
) -> io::Result<()> {
    if opts.runs("fsck-empty") {
        empty_rows(opts, scratch, out)?;
    }
    if opts.runs("linux-trees") && root {
        linux_rows(opts, scratch, out)?;
    } else if opts.runs("linux-trees") {
        let _ = writeln!(
            out,
            "\nSKIPPED: the Linux rows need root (zram or loop devices, kernel mounts)."
        );
    }
    if opts.runs("dir-library") {
        dir_library::rows(opts, out)?;
    }
    if opts.runs("frag-read") && root {
        frag::rows(opts, scratch, out)?;
    } else if opts.runs("frag-read") {
        let _ = writeln!(
            out,
            "\nSKIPPED: the fragmented-file rows need root (zram or loop devices, kernel mounts)."
        );
    }
    if opts.runs("dir-mount") && root {
        mount_rows(opts, scratch, out)?;
    } else if opts.runs("dir-mount") {
        let _ = writeln!(out, "\nSKIPPED: the mount rows need root.");
    }
    Ok(())
}

fn empty_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    let _ = writeln!(
        out,
        "### fsck on empty jext-made images\n\n| size | jext fsck (ms) | e2fsck -fn (ms) | jext / e2fsck | verdicts (jext, e2fsck) |\n|---|---|---|---|---|"
    );
    for &bytes in &opts.empty_image_bytes {
        let img = scratch.dir.join("empty.img");
        make_jext_image(&img, bytes)?;
        let row = fsck_row(&img)?;
        let _ = writeln!(out, "| {} | {row}", jext_fs::options::human_bytes(bytes));
        eprintln!(
            "jext bench scale: fsck, empty {}: done",
            jext_fs::options::human_bytes(bytes)
        );
        std::fs::remove_file(&img)?;
    }
    Ok(())
}

fn linux_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    {
        let _ = writeln!(
            out,
            "\n### fsck on one directory of N empty files written by Linux\n\n| files | jext fsck (ms) | e2fsck -fn (ms) | jext / e2fsck | verdicts (jext, e2fsck) |\n|---|---|---|---|---|"
        );
        let mut linux_dirs = Vec::new();
        for &files in &opts.tree_files {
            let (row, linux) = linux_tree_row(scratch, files)?;
            let _ = writeln!(out, "| {files} | {row}");
            linux_dirs.push((files, linux));
            eprintln!("jext bench scale: fsck, {files} Linux files: done");
        }
        let _ = writeln!(out, "\nLinux ext4 (loop device) on the same trees, one directory:\n\n| files | create first 10% (/s) | create last 10% (/s) | last / first | each tenth (k/s) | list (ms) |\n|---|---|---|---|---|---|");
        for (files, d) in &linux_dirs {
            let _ = writeln!(out, "| {files} | {} |", d.cells());
        }
    }
    Ok(())
}

fn mount_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    let _ = writeln!(
        out,
        "\n### One directory of N entries through the jext mount (FUSE), and through Linux ext4\n\nList: `readdir` of the whole directory, best of {LISTINGS}, right after the creates (both warm); Linux ext4 on a loop device in the same run, the same names. READDIR requests: what the kernel sent jext for one listing.\n\n| entries | create first 10% (/s) | create last 10% (/s) | last / first | each tenth (k/s) | list (ms) | e2fsck -fn, Linux mount | Linux ext4 list (ms) | list rate, jext / Linux | READDIR requests per listing |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    for &entries in &opts.dir_entries {
        let (rates, verdict, readdirs) = jext_mount_dir_row(scratch, entries)?;
        let (linux_img, linux) = linux_dir_image(scratch, entries)?;
        std::fs::remove_file(&linux_img)?;
        let _ = writeln!(
            out,
            "| {entries} | {} | {verdict} | {:.1} | {:.2} | {readdirs} |",
            rates.cells(),
            linux.list.as_secs_f64() * 1e3,
            linux.list.as_secs_f64() / rates.list.as_secs_f64()
        );
        eprintln!("jext bench scale: directory through the mount, {entries} entries: done");
    }
    Ok(())
}

/// Creates and lists `count` empty files in `dir` through the kernel (any mount).
fn mounted_dir_rates(dir: &Path, count: usize) -> io::Result<DirRates> {
    std::fs::create_dir(dir)?;
    let (tenths_per_s, cpu_us_per_create, creator_cpu_us_per_create) = timed_creates(
        count,
        |i| std::fs::File::create(dir.join(entry_name(i))).map(drop),
        || {},
    )?;
    let list = best_listing(|| {
        let listed = std::fs::read_dir(dir)?.count();
        if listed != count {
            return Err(io::Error::other(format!(
                "{} lists {listed} of {count}",
                dir.display()
            )));
        }
        Ok(())
    })?;
    Ok(DirRates {
        tenths_per_s,
        cpu_us_per_create,
        creator_cpu_us_per_create,
        journal_per_create: Vec::new(),
        list,
    })
}

/// The rates through a jext mount, `e2fsck -fn`'s verdict, and the READDIR requests one
/// listing took.
fn jext_mount_dir_row(scratch: &Scratch, entries: usize) -> io::Result<(DirRates, String, u64)> {
    let img = scratch.dir.join("mounted-dir.img");
    make_jext_image(&img, dir_image_bytes(entries))?;
    let point = scratch.dir.join("jext-mnt");
    let (rates, readdirs) = {
        let mount = Mount::jext(&img.to_string_lossy(), &point, "")?;
        let readdirs_so_far = || -> io::Result<u64> {
            let stats = mount.daemon_stats()?.unwrap_or_default();
            Ok(stats.requests.get("readdir").copied().unwrap_or(0))
        };
        let before = readdirs_so_far()?;
        let rates = mounted_dir_rates(&point.join("d"), entries)?;
        let readdirs = (readdirs_so_far()? - before) / LISTINGS as u64;
        drop(mount);
        (rates, readdirs)
    };
    let verdict = e2fsck_verdict(&img)?;
    std::fs::remove_file(&img)?;
    Ok((rates, verdict, readdirs))
}

/// Listings timed per directory; the best counts (the first warms nothing more than the
/// creates already did, but one listing is at the mercy of whatever else runs).
const LISTINGS: usize = 3;

/// The shortest of [`LISTINGS`] runs of `list`.
fn best_listing(mut list: impl FnMut() -> io::Result<()>) -> io::Result<Duration> {
    let mut best = Duration::MAX;
    for _ in 0..LISTINGS {
        let started = Instant::now();
        list()?;
        best = best.min(started.elapsed());
    }
    Ok(best)
}

/// An image size with room for `entries` inodes (mkfs gives one per 16 KiB) twice over.
fn dir_image_bytes(entries: usize) -> u64 {
    ((entries as u64 * 32_768).max(1 << 30)).next_power_of_two()
}

/// `clean` or `exit N` from `e2fsck -fn`; as root, then whether Linux mounts the image
/// read-only (`clean, Linux mounts`).
fn e2fsck_verdict(img: &Path) -> io::Result<String> {
    let (code, output) = e2fsck(img)?;
    let fsck = match code {
        0 => "clean".to_string(),
        _ => {
            // The image is removed with the run: what e2fsck said goes to the log.
            eprintln!(
                "jext bench scale: e2fsck -fn {} exited {code}:\n{output}",
                img.display()
            );
            format!("exit {code}")
        }
    };
    Ok(match super::running_as_root() {
        true => format!("{fsck}, {}", linux_mount_verdict(img)),
        false => fsck,
    })
}

/// Whether the Linux kernel mounts `img` (an image file or a block device) read-only.
fn linux_mount_verdict(img: &Path) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let point = img.with_extension("linux-mount");
    let block = std::fs::metadata(img).is_ok_and(|m| m.file_type().is_block_device());
    let options = if block { "ro" } else { "loop,ro" };
    let verdict = match Mount::kernel("ext4", &img.to_string_lossy(), &point, options) {
        Ok(mount) => {
            drop(mount);
            "Linux mounts"
        }
        Err(e) => {
            eprintln!(
                "jext bench scale: Linux does not mount {}: {e}",
                img.display()
            );
            "Linux refuses it"
        }
    };
    let _ = std::fs::remove_dir(&point);
    verdict
}

/// Creation rates at the start and the end, and the time to list.
struct DirRates {
    /// Names per second in each tenth of the creates.
    tenths_per_s: Vec<f64>,
    /// CPU time of this process per create in each tenth (microseconds).
    cpu_us_per_create: Vec<f64>,
    /// CPU time of the creating thread alone per create in each tenth (microseconds):
    /// against the rate, it tells work that grows from time lost to other threads.
    creator_cpu_us_per_create: Vec<f64>,
    /// jext's journal in each tenth: blocks logged and blocks checkpointed per create
    /// (empty where jext's journal is not in this process).
    journal_per_create: Vec<(f64, f64)>,
    list: Duration,
}

impl DirRates {
    /// The last tenth's rate over the first's (flat is 1).
    fn last_over_first(&self) -> f64 {
        let first = self.tenths_per_s.first().copied().unwrap_or(0.0);
        let last = self.tenths_per_s.last().copied().unwrap_or(0.0);
        last / first
    }

    fn cells(&self) -> String {
        let first = self.tenths_per_s.first().copied().unwrap_or(0.0);
        let last = self.tenths_per_s.last().copied().unwrap_or(0.0);
        let tenths: Vec<String> = self
            .tenths_per_s
            .iter()
            .map(|r| format!("{:.0}", r / 1000.0))
            .collect();
        format!(
            "{first:.0} | {last:.0} | {:.2} | {} | {:.1}",
            self.last_over_first(),
            tenths.join(" "),
            self.list.as_secs_f64() * 1e3
        )
    }

    /// The journal cells: blocks logged, then blocks checkpointed, per create, each tenth.
    fn journal_cells(&self) -> String {
        let each = |pick: fn(&(f64, f64)) -> f64| {
            let cells: Vec<String> = self
                .journal_per_create
                .iter()
                .map(|t| format!("{:.2}", pick(t)))
                .collect();
            cells.join(" ")
        };
        format!("{} | {}", each(|t| t.0), each(|t| t.1))
    }

    /// The CPU cells: the process's first and last tenth and their ratio, then the
    /// creating thread's in each tenth.
    fn cpu_cells(&self) -> String {
        let first = self.cpu_us_per_create.first().copied().unwrap_or(0.0);
        let last = self.cpu_us_per_create.last().copied().unwrap_or(0.0);
        let creator: Vec<String> = self
            .creator_cpu_us_per_create
            .iter()
            .map(|us| format!("{us:.1}"))
            .collect();
        format!(
            "{first:.1} / {last:.1} | {:.2} | {}",
            last / first,
            creator.join(" ")
        )
    }
}

/// CPU time used (user and system), in microseconds, by this process (every thread,
/// `libc::RUSAGE_SELF`) or by the calling thread (`libc::RUSAGE_THREAD`).
fn cpu_us(who: libc::c_int) -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only into the struct it is given, which lives on this stack.
    unsafe { libc::getrusage(who, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

/// Creates `count` names with `make`; returns the rate (names/s), this process's CPU
/// time per name and the calling thread's (microseconds) of each tenth, in order.
/// `at_tenth` runs after each tenth, outside the timing.
fn timed_creates(
    count: usize,
    mut make: impl FnMut(usize) -> io::Result<()>,
    mut at_tenth: impl FnMut(),
) -> io::Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let tenth = (count / 10).max(1);
    let (mut rates, mut cpu, mut creator_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let mut started = Instant::now();
    let cpu_process_and_thread = || (cpu_us(libc::RUSAGE_SELF), cpu_us(libc::RUSAGE_THREAD));
    let mut cpu_started = cpu_process_and_thread();
    for i in 0..count {
        make(i)?;
        if (i + 1) % tenth == 0 {
            rates.push(tenth as f64 / started.elapsed().as_secs_f64().max(1e-9));
            let cpu_now = cpu_process_and_thread();
            cpu.push((cpu_now.0 - cpu_started.0) / tenth as f64);
            creator_cpu.push((cpu_now.1 - cpu_started.1) / tenth as f64);
            at_tenth();
            started = Instant::now();
            cpu_started = cpu_process_and_thread();
        }
    }
    Ok((rates, cpu, creator_cpu))
}

/// A fresh sparse image of `bytes` with jext's mkfs defaults.
fn make_jext_image(img: &Path, bytes: u64) -> io::Result<()> {
    jext::mkfs(
        Arc::new(FileDevice::create(img, bytes).map_err(io::Error::other)?),
        &MkfsOptions {
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .map(drop)
    .map_err(io::Error::other)
}

fn entry_name(i: usize) -> String {
    format!("f{i:07}")
}

/// Writes `files` empty files into one directory through a Linux loop mount, then
/// checks the image with both checkers.
fn linux_tree_row(scratch: &Scratch, files: usize) -> io::Result<(String, DirRates)> {
    let (img, rates) = linux_dir_image(scratch, files)?;
    let row = fsck_row(&img)?;
    std::fs::remove_file(&img)?;
    Ok((row, rates))
}

/// Creates and lists `files` empty files in one directory of a fresh Linux ext4 (loop
/// device); returns the image (unmounted, detached) and the rates.
fn linux_dir_image(scratch: &Scratch, files: usize) -> io::Result<(PathBuf, DirRates)> {
    let bytes = ((files as u64 * 16_384).max(4 << 30)).next_power_of_two();
    let img = scratch.image("tree.img", bytes)?;
    let img_text = img.to_string_lossy().to_string();
    let inodes = (files + 1000).to_string();
    super::rig::run("mkfs.ext4", &["-q", "-F", "-N", &inodes, &img_text])?;
    let device = LoopDevice::attach(&img)?;
    let point = scratch.dir.join("mnt");
    let mount = Mount::kernel("ext4", device.path_str(), &point, "")?;
    let rates = mounted_dir_rates(&point.join("d"), files)?;
    drop(mount);
    drop(device);
    Ok((img, rates))
}

/// `jext fsck` and `e2fsck -fn` on `img`, best of two each: the table cells.
fn fsck_row(img: &Path) -> io::Result<String> {
    let mut ours = Duration::MAX;
    let mut theirs = Duration::MAX;
    let mut verdicts = (String::new(), 0);
    for _ in 0..2 {
        let started = Instant::now();
        let device = jext::open_device(img, true).map_err(io::Error::other)?;
        let report = jext::fsck(device).map_err(io::Error::other)?;
        ours = ours.min(started.elapsed());
        let started = Instant::now();
        let (code, _) = e2fsck(img)?;
        theirs = theirs.min(started.elapsed());
        verdicts = (
            if report.is_clean() {
                "clean".to_string()
            } else {
                format!("{} problems", report.problems.len())
            },
            code,
        );
    }
    Ok(format!(
        "{:.0} | {:.0} | {:.2} | {}, exit {} |",
        ours.as_secs_f64() * 1e3,
        theirs.as_secs_f64() * 1e3,
        ours.as_secs_f64() / theirs.as_secs_f64(),
        verdicts.0,
        verdicts.1
    ))
}

/// `e2fsck -fn`'s exit code and what it printed (stdout, then stderr).
fn e2fsck(img: &Path) -> io::Result<(i32, String)> {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}
