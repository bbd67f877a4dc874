//! `jext bench scale`: how jext's checking and directories grow with size, beside
//! e2fsck and Linux ext4, as curves (several sizes per row), in one run.
//!
//! Rows: `jext fsck` against `e2fsck -fn` on empty jext-made images of growing size and on
//! trees of growing size written by Linux (a loop mount of a mkfs.ext4 image); creating
//! and listing one directory of growing size through the jext library against Linux
//! ext4 (loop device), with the creation rate of the first and of the last tenth of the
//! names (flat means the last tenth is as fast as the first). Every jext image is checked
//! with `e2fsck -fn` afterwards and the verdict reported.
//!
//! Promises: every image is made fresh and removed with the scratch directory; both
//! checkers run on the same image with the same (warm) page cache, best of two. Never
//! writes outside the scratch directory. Without root the Linux rows are SKIPPED, said so.

use super::rig::{LoopDevice, Mount, Scratch};
use jext::{FileDevice, Fs, MkfsOptions, MountOptions};
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
    /// Sizes of the file systems the fragmented file fills (about 45% of each).
    pub frag_image_bytes: Vec<u64>,
    /// The row groups to run (see [`ROWS`]).
    pub rows: Vec<&'static str>,
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
                frag_image_bytes: vec![64 << 20, 256 << 20],
                rows: ROWS.to_vec(),
            }
        } else {
            ScaleOptions {
                dir,
                empty_image_bytes: vec![64 << 30, 256 << 30, 1 << 40, 4 << 40],
                tree_files: vec![10_000, 100_000, 300_000, 1_000_000],
                dir_entries: vec![10_000, 100_000, 300_000, 1_000_000],
                // Larger sizes wait on jext's hole punching, which walks the whole extent
                // tree per punch (4 GiB did not finish in 13 minutes).
                frag_image_bytes: vec![256 << 20, 1 << 30],
                rows: ROWS.to_vec(),
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

/// Runs the chosen rows; returns the report as markdown.
pub fn run(opts: &ScaleOptions, root: bool) -> io::Result<String> {
    let scratch = Scratch::new(&opts.dir)?;
    let mut out = String::new();
    if opts.runs("fsck-empty") {
        empty_rows(opts, &scratch, &mut out)?;
    }
    if opts.runs("linux-trees") && root {
        linux_rows(opts, &scratch, &mut out)?;
    } else if opts.runs("linux-trees") {
        let _ = writeln!(out, "\nSKIPPED: the Linux rows need root (loop devices).");
    }
    if opts.runs("dir-library") {
        library_rows(opts, &scratch, &mut out)?;
    }
    if opts.runs("frag-read") && root {
        frag_rows(opts, &scratch, &mut out)?;
    } else if opts.runs("frag-read") {
        let _ = writeln!(
            out,
            "\nSKIPPED: the fragmented-file rows need root (loop devices)."
        );
    }
    if opts.runs("dir-mount") && root {
        mount_rows(opts, &scratch, &mut out)?;
    } else if opts.runs("dir-mount") {
        let _ = writeln!(out, "\nSKIPPED: the mount rows need root.");
    }
    Ok(out)
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

fn library_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    let _ = writeln!(
        out,
        "\n### One directory of N entries through the jext library\n\n| entries | create first 10% (/s) | create last 10% (/s) | last / first | each tenth (k/s) | list (ms) | e2fsck -fn |\n|---|---|---|---|---|---|---|"
    );
    for &entries in &opts.dir_entries {
        let (rates, verdict) = jext_dir_row(scratch, entries)?;
        let _ = writeln!(out, "| {entries} | {} | {verdict} |", rates.cells());
        eprintln!("jext bench scale: directory, {entries} entries: done");
    }
    Ok(())
}

fn mount_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    {
        let _ = writeln!(
            out,
            "\n### One directory of N entries through the jext mount (FUSE)\n\n| entries | create first 10% (/s) | create last 10% (/s) | last / first | each tenth (k/s) | list (ms) | e2fsck -fn |\n|---|---|---|---|---|---|---|"
        );
        for &entries in &opts.dir_entries {
            let (rates, verdict) = jext_mount_dir_row(scratch, entries)?;
            let _ = writeln!(out, "| {entries} | {} | {verdict} |", rates.cells());
            eprintln!("jext bench scale: directory through the mount, {entries} entries: done");
        }
    }
    Ok(())
}

/// Creates and lists `count` empty files in `dir` through the kernel (any mount).
fn mounted_dir_rates(dir: &Path, count: usize) -> io::Result<DirRates> {
    std::fs::create_dir(dir)?;
    let tenths_per_s = timed_creates(count, |i| {
        std::fs::File::create(dir.join(entry_name(i))).map(drop)
    })?;
    let started = Instant::now();
    let listed = std::fs::read_dir(dir)?.count();
    let list = started.elapsed();
    if listed != count {
        return Err(io::Error::other(format!(
            "{} lists {listed} of {count}",
            dir.display()
        )));
    }
    Ok(DirRates { tenths_per_s, list })
}

fn jext_mount_dir_row(scratch: &Scratch, entries: usize) -> io::Result<(DirRates, String)> {
    let img = scratch.dir.join("mounted-dir.img");
    make_jext_image(&img, dir_image_bytes(entries))?;
    let point = scratch.dir.join("jext-mnt");
    let rates = {
        let mount = Mount::jext(&img.to_string_lossy(), &point, "")?;
        let rates = mounted_dir_rates(&point.join("d"), entries)?;
        drop(mount);
        rates
    };
    let verdict = e2fsck_verdict(&img)?;
    std::fs::remove_file(&img)?;
    Ok((rates, verdict))
}

/// An image size with room for `entries` inodes (mkfs gives one per 16 KiB) twice over.
fn dir_image_bytes(entries: usize) -> u64 {
    ((entries as u64 * 32_768).max(1 << 30)).next_power_of_two()
}

/// `clean` or `exit N` from `e2fsck -fn`.
fn e2fsck_verdict(img: &Path) -> io::Result<String> {
    let (code, _) = e2fsck(img)?;
    Ok(if code == 0 {
        "clean".into()
    } else {
        format!("exit {code}")
    })
}

/// Creation rates at the start and the end, and the time to list.
struct DirRates {
    /// Names per second in each tenth of the creates.
    tenths_per_s: Vec<f64>,
    list: Duration,
}

impl DirRates {
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
            last / first,
            tenths.join(" "),
            self.list.as_secs_f64() * 1e3
        )
    }
}

/// Creates `count` names with `make`; returns the rate (names/s) of each tenth, in order.
fn timed_creates(
    count: usize,
    mut make: impl FnMut(usize) -> io::Result<()>,
) -> io::Result<Vec<f64>> {
    let tenth = (count / 10).max(1);
    let mut rates = Vec::with_capacity(10);
    let mut started = Instant::now();
    for i in 0..count {
        make(i)?;
        if (i + 1) % tenth == 0 {
            rates.push(tenth as f64 / started.elapsed().as_secs_f64().max(1e-9));
            started = Instant::now();
        }
    }
    Ok(rates)
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

fn jext_dir_row(scratch: &Scratch, entries: usize) -> io::Result<(DirRates, String)> {
    let img = scratch.dir.join("dir.img");
    make_jext_image(&img, dir_image_bytes(entries))?;
    let fs = Fs::open_path(&img, MountOptions::default()).map_err(io::Error::other)?;
    let dir = fs.mkdir_path("/d", 0o755).map_err(io::Error::other)?.ino;
    let tenths_per_s = timed_creates(entries, |i| {
        fs.create(dir, entry_name(i).as_bytes(), 0o644, 0, 0)
            .map(drop)
            .map_err(io::Error::other)
    })?;
    let started = Instant::now();
    let mut cookie = 0;
    let mut listed = 0;
    loop {
        let batch = fs.readdir(dir, cookie).map_err(io::Error::other)?;
        let Some(last) = batch.last() else { break };
        cookie = last.next_cookie;
        listed += batch.len();
    }
    let list = started.elapsed();
    if listed != entries + 2 {
        return Err(io::Error::other(format!(
            "listed {listed} entries of {entries} (+2)"
        )));
    }
    fs.unmount().map_err(io::Error::other)?;
    let verdict = e2fsck_verdict(&img)?;
    std::fs::remove_file(&img)?;
    Ok((DirRates { tenths_per_s, list }, verdict))
}

/// Writes `files` empty files into one directory through a Linux loop mount, then
/// checks the image with both checkers.
fn linux_tree_row(scratch: &Scratch, files: usize) -> io::Result<(String, DirRates)> {
    let bytes = ((files as u64 * 16_384).max(4 << 30)).next_power_of_two();
    let img = scratch.image("tree.img", bytes)?;
    let img_text = img.to_string_lossy().to_string();
    let inodes = (files + 1000).to_string();
    super::rig::run("mkfs.ext4", &["-q", "-F", "-N", &inodes, &img_text])?;
    let rates = {
        let device = LoopDevice::attach(&img)?;
        let point = scratch.dir.join("mnt");
        let mount = Mount::kernel("ext4", device.path_str(), &point, "")?;
        let rates = mounted_dir_rates(&point.join("d"), files)?;
        drop(mount);
        drop(device);
        rates
    };
    let row = fsck_row(&img)?;
    std::fs::remove_file(&img)?;
    Ok((row, rates))
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

fn e2fsck(img: &Path) -> io::Result<(i32, String)> {
    let out = Command::new("e2fsck").arg("-fn").arg(img).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Bytes of one block in the fragmented-file rows (both systems use 4 KiB blocks).
const FRAG_BLOCK: u64 = 4096;

/// Read rates of one fragmented file.
struct FragRates {
    file_bytes: u64,
    seq_mib_s: f64,
    random_iops: f64,
    /// How fragmented the file came out, as a tool of the system reports it.
    layout: String,
}

/// A file made fragmented on purpose, the same way on both systems: file `a` fills the
/// file system, every other block of it is punched out, and file `b` is written into
/// what is left, so `b`'s blocks can only be the holes, one block apart. Then `b` is read
/// sequentially (1 MiB reads) and at random (4 KiB reads of a sample of its blocks), each
/// after a fresh mount so no cache holds it.
fn frag_rows(opts: &ScaleOptions, scratch: &Scratch, out: &mut String) -> io::Result<()> {
    let _ = writeln!(
        out,
        "\n### A file fragmented every other block, read back (loop devices, direct I/O)\n\n| file system | file | jext seq (MiB/s) | ext4 seq (MiB/s) | jext / ext4 | jext random (reads/s) | ext4 random (reads/s) | jext / ext4 | jext extent tree levels (debugfs, root included) | ext4's file (filefrag) | e2fsck -fn (jext) |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for &bytes in &opts.frag_image_bytes {
        let (ours, depth, verdict) = jext_frag(scratch, bytes)?;
        let theirs = linux_frag(scratch, bytes)?;
        let (seq, rnd) = (theirs.seq_mib_s, theirs.random_iops);
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {seq:.0} | {:.2} | {:.0} | {rnd:.0} | {:.2} | {depth} | {} | {verdict} |",
            jext_fs::options::human_bytes(bytes),
            jext_fs::options::human_bytes(ours.file_bytes),
            ours.seq_mib_s,
            ours.seq_mib_s / seq,
            ours.random_iops,
            ours.random_iops / rnd,
            theirs.layout,
        );
        eprintln!(
            "jext bench scale: fragmented file on {}: done",
            jext_fs::options::human_bytes(bytes)
        );
    }
    Ok(())
}

/// Reads sampled for the random rate: enough to average, few enough to stay quick.
const RANDOM_READS: u64 = 20_000;

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

fn rate_mib_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / took.as_secs_f64().max(1e-9)
}

fn jext_frag(scratch: &Scratch, bytes: u64) -> io::Result<(FragRates, String, String)> {
    let img = scratch.image("frag-jext.img", bytes)?;
    let device = LoopDevice::attach(&img)?;
    let open = |path: &Path| -> io::Result<Fs> {
        let dev = jext::open_device(path, false).map_err(io::Error::other)?;
        Fs::open(dev, MountOptions::default()).map_err(io::Error::other)
    };
    jext::mkfs(
        jext::open_device(&device.path, false).map_err(io::Error::other)?,
        &MkfsOptions {
            block_size: Some(FRAG_BLOCK as u32),
            ..MkfsOptions::default()
        },
    )
    .map_err(io::Error::other)?;
    let err = io::Error::other;
    let file_bytes = {
        let fs = open(&device.path)?;
        let chunk = vec![0x5Au8; 1 << 20];
        let a = fs.create_file("/a", 0o644).map_err(err)?;
        let mut a_len = 0u64;
        while a.write_at(a_len, &chunk).is_ok() && a.fsync().is_ok() {
            a_len += chunk.len() as u64;
        }
        a.fsync().map_err(err)?;
        let punch = jext::FallocateMode {
            punch_hole: true,
            keep_size: true,
            zero_range: false,
        };
        for block in (1..a_len / FRAG_BLOCK).step_by(2) {
            fs.fallocate(a.ino(), block * FRAG_BLOCK, FRAG_BLOCK, punch)
                .map_err(err)?;
        }
        a.fsync().map_err(err)?;
        let b = fs.create_file("/b", 0o644).map_err(err)?;
        // The holes, less room for b's own extent tree and slack.
        let b_len = (a_len / 2 - a_len / 40) / (1 << 20) * (1 << 20);
        let mut at = 0;
        while at < b_len {
            b.write_at(at, &chunk).map_err(err)?;
            at += chunk.len() as u64;
        }
        b.fsync().map_err(err)?;
        fs.unmount().map_err(err)?;
        b_len
    };
    let fs = open(&device.path)?;
    let b = fs.open_file("/b").map_err(err)?;
    let started = Instant::now();
    let mut at = 0;
    while at < file_bytes {
        b.read_at(at, 1 << 20).map_err(err)?;
        at += 1 << 20;
    }
    let seq_mib_s = rate_mib_s(file_bytes, started.elapsed());
    drop(b);
    fs.unmount().map_err(err)?;
    let fs = open(&device.path)?;
    let b = fs.open_file("/b").map_err(err)?;
    let sample = random_blocks(file_bytes / FRAG_BLOCK);
    let started = Instant::now();
    for &block in &sample {
        b.read_at(block * FRAG_BLOCK, FRAG_BLOCK as usize)
            .map_err(err)?;
    }
    let random_iops = sample.len() as f64 / started.elapsed().as_secs_f64().max(1e-9);
    drop(b);
    fs.unmount().map_err(err)?;
    let depth = extent_depth(&device.path, "/b");
    let verdict = e2fsck_verdict(&device.path)?;
    drop(device);
    std::fs::remove_file(&img)?;
    Ok((
        FragRates {
            file_bytes,
            seq_mib_s,
            random_iops,
            layout: String::new(),
        },
        depth,
        verdict,
    ))
}

/// The depth of `path`'s extent tree as debugfs counts it (levels of its `ex` listing).
fn extent_depth(device: &Path, path: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", &format!("ex {path}")])
        .arg(device)
        .output();
    let Ok(out) = out else {
        return "? (no debugfs)".into();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim_start().split('/').next()?.trim().parse::<u32>().ok())
        .max()
        .map_or("?".into(), |max_level| (max_level + 1).to_string())
}

fn linux_frag(scratch: &Scratch, bytes: u64) -> io::Result<FragRates> {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let img = scratch.image("frag-linux.img", bytes)?;
    let img_text = img.to_string_lossy().to_string();
    super::rig::run("mkfs.ext4", &["-q", "-F", "-b", "4096", &img_text])?;
    let device = LoopDevice::attach(&img)?;
    let point = scratch.dir.join("frag-mnt");
    let (file_bytes, layout) = {
        let _mount = Mount::kernel("ext4", device.path_str(), &point, "")?;
        let chunk = vec![0x5Au8; 1 << 20];
        let a = std::fs::File::create(point.join("a"))?;
        let mut a_len = 0u64;
        while a.write_all_at(&chunk, a_len).is_ok() {
            a_len += chunk.len() as u64;
        }
        a.sync_all()?;
        for block in (1..a_len / FRAG_BLOCK).step_by(2) {
            // SAFETY: fallocate on an open descriptor with plain integer arguments.
            let done = unsafe {
                libc::fallocate(
                    a.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (block * FRAG_BLOCK) as libc::off_t,
                    FRAG_BLOCK as libc::off_t,
                )
            };
            if done != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        a.sync_all()?;
        let b = std::fs::File::create(point.join("b"))?;
        let b_len = (a_len / 2 - a_len / 40) / (1 << 20) * (1 << 20);
        let mut at = 0;
        while at < b_len {
            b.write_all_at(&chunk, at)?;
            at += chunk.len() as u64;
        }
        b.sync_all()?;
        let layout = super::rig::run("filefrag", &[&point.join("b").to_string_lossy()])
            .map(|text| text.trim().rsplit(": ").next().unwrap_or("?").to_string())
            .unwrap_or_else(|e| format!("? ({e})"));
        (b_len, layout)
    };
    let seq_mib_s = {
        let _mount = Mount::kernel("ext4", device.path_str(), &point, "")?;
        let b = std::fs::File::open(point.join("b"))?;
        let mut buf = vec![0u8; 1 << 20];
        let started = Instant::now();
        let mut at = 0;
        while at < file_bytes {
            b.read_exact_at(&mut buf, at)?;
            at += 1 << 20;
        }
        rate_mib_s(file_bytes, started.elapsed())
    };
    let random_iops = {
        let _mount = Mount::kernel("ext4", device.path_str(), &point, "")?;
        let b = std::fs::File::open(point.join("b"))?;
        let mut buf = vec![0u8; FRAG_BLOCK as usize];
        let sample = random_blocks(file_bytes / FRAG_BLOCK);
        let started = Instant::now();
        for &block in &sample {
            b.read_exact_at(&mut buf, block * FRAG_BLOCK)?;
        }
        sample.len() as f64 / started.elapsed().as_secs_f64().max(1e-9)
    };
    drop(device);
    std::fs::remove_file(&img)?;
    Ok(FragRates {
        file_bytes,
        seq_mib_s,
        random_iops,
        layout,
    })
}
