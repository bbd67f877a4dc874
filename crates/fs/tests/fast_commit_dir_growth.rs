//! A new file whose name grows its durable directory by a block (the directory's last
//! block, or the leaf its hash leads to, is full), made durable by an fsync, then a
//! crash before the running transaction commits. Linux's replay of a fast commit's
//! CREAT adds the name itself (`ext4_fc_replay_create` → `__ext4_link` →
//! `ext4_add_entry` → `ext4_append`) and allocates the new block through
//! `ext4_mb_new_blocks_simple`, which charges no `i_blocks`: the directory ends one block
//! short (`linux_replays_the_create_one_block_short` pins it with the records a fast
//! commit would carry). So with ext4 fast commits such an fsync commits in full
//! (`directory_grew`, `fast_commit::grew_parent`); the host kernel replays the crash
//! image and `e2fsck -fn` finds it clean, as after jext's own recovery; and an
//! i-transaction (`ijournal=percore`, replayed by jext only) carries the create.

mod common;

use common::{dentry, e2fsck, logged_inode, mkfs_ext4, pend_fast_commits, LoopMount, Scratch};
use jext_device::{FileDevice, SimDevice};
use jext_fs::{fsck, mkfs, CommitMode, Fs, IJournal, MkfsOptions, MountOptions, SmallSyncs};
use jext_journal::format::fast_commit::FcRecord;
use jext_journal::RecordMode;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

/// How the directory grows when the fsync'd file's name goes in.
#[derive(Clone, Copy, Debug)]
enum Growth {
    /// Its only block is full: it becomes indexed (a root and two leaves).
    ToIndexed,
    /// Indexed, and the leaf the name's hash leads to is full: the leaf splits.
    LeafSplit,
    /// Without `dir_index` (mkfs.ext4 -O ^dir_index): a linear block appended.
    Linear,
}

impl Growth {
    /// Which growth of the directory the fsync'd create must be: the first, or the second
    /// (the first made it indexed).
    fn nth(self) -> usize {
        match self {
            Growth::ToIndexed | Growth::Linear => 1,
            Growth::LeafSplit => 2,
        }
    }
}

const DIR: &str = "/d";

/// The i-th name: long ones, so that a block fills after about 67.
fn name(i: usize) -> String {
    format!("entry-{i:05}-{}", "x".repeat(40))
}

fn options(ijournal: IJournal) -> MountOptions {
    MountOptions {
        // Every synced append as an i-transaction, not journaled (`small_syncs=journal`).
        small_syncs: SmallSyncs::InPlace,
        commit_interval_ms: 3_600_000,
        ijournal,
        // What Linux replays: classic commits of whole blocks.
        journal_commit: CommitMode::Classic,
        journal_records: RecordMode::Blocks,
        ..MountOptions::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37) ^ seed)
        .collect()
}

/// A clean image with the empty directory `DIR`, made once: every run starts from a copy
/// of it, so the names hash (the superblock's seed) and place the same way each time.
fn base_image(path: &Path, growth: Growth) {
    match growth {
        Growth::Linear => mkfs_ext4(path, 64, &["-b", "4096", "-O", "fast_commit,^dir_index"]),
        Growth::ToIndexed | Growth::LeafSplit => {
            let dev = Arc::new(FileDevice::create(path, 64 << 20).unwrap());
            let opts = MkfsOptions {
                fast_commit: true,
                block_size: Some(4096),
                ..MkfsOptions::default()
            };
            mkfs(dev, &opts).unwrap();
        }
    }
    let fs = Fs::open_path(path, MountOptions::default()).unwrap();
    fs.mkdir_path(DIR, 0o755).unwrap();
    fs.unmount().unwrap();
}

fn dir_size(fs: &Fs) -> u64 {
    fs.stat(fs.resolve(DIR).unwrap()).unwrap().size
}

/// The index of the name whose create grows `DIR` for the `nth` time, on a copy of `base`.
fn growing_create(base: &Path, nth: usize) -> usize {
    let dev = Arc::new(SimDevice::from_image_file(base).unwrap());
    let fs = Fs::open(dev, options(IJournal::Single)).unwrap();
    let mut size = dir_size(&fs);
    let mut seen = 0;
    for i in 0.. {
        drop(
            fs.create_file(&format!("{DIR}/{}", name(i)), 0o644)
                .unwrap(),
        );
        let now = dir_size(&fs);
        if now > size {
            seen += 1;
            if seen == nth {
                return i;
            }
        }
        size = now;
    }
    unreachable!()
}

/// What jext showed before the crash.
struct Before {
    /// `DIR`'s size and `i_blocks` (512-byte units) after the growing create.
    dir_size: u64,
    dir_blocks_512: u64,
    /// The growing file's path and contents.
    path: String,
    data: Vec<u8>,
    /// Durable names in `DIR` before it.
    durable_names: usize,
    fast_commits: u64,
    fallbacks: Vec<(&'static str, u64)>,
}

/// Fills `DIR` up to the name that grows it, commits, then creates that one, writes it
/// and fsyncs it; the crash image (what the device holds durably) goes to `crashed`.
fn grow_and_crash(base: &Path, crashed: &Path, growth: Growth, ijournal: IJournal) -> Before {
    let k = growing_create(base, growth.nth());
    let dev = Arc::new(SimDevice::from_image_file(base).unwrap());
    let fs = Fs::open(dev.clone(), options(ijournal)).unwrap();
    for i in 0..k {
        drop(
            fs.create_file(&format!("{DIR}/{}", name(i)), 0o644)
                .unwrap(),
        );
    }
    fs.sync().unwrap();
    let durable_size = dir_size(&fs);
    let path = format!("{DIR}/{}", name(k));
    let data = pattern(10_000, k as u8);
    let file = fs.create_file(&path, 0o644).unwrap();
    let st = fs.stat(fs.resolve(DIR).unwrap()).unwrap();
    assert!(
        st.size > durable_size,
        "{growth:?}: create {k} grows {DIR} ({durable_size} -> {})",
        st.size
    );
    file.write_at(0, &data).unwrap();
    file.fsync().unwrap();
    let stats = fs.fast_commit_stats();
    let before = Before {
        dir_size: st.size,
        dir_blocks_512: st.blocks_512,
        path,
        data,
        durable_names: k,
        fast_commits: stats.fast_commits,
        fallbacks: stats.fallbacks.into_iter().collect(),
    };
    dev.crash().write_durable_image(crashed).unwrap();
    std::mem::forget((file, fs)); // the crash: nothing more reaches the device we kept
    before
}

/// `e2fsck -fn`'s complaints (exit code and the lines that are not its progress).
fn e2fsck_problems(image: &Path) -> (i32, Vec<String>) {
    let (code, text) = e2fsck(image);
    let problems = text
        .lines()
        .filter(|l| !l.starts_with("Pass ") && !l.is_empty())
        .filter(|l| !l.contains("non-contiguous") && !l.starts_with("e2fsck "))
        .map(str::to_string)
        .collect();
    (code, problems)
}

/// jext's recovery replays the crash image: the file is there with its bytes, `DIR` as
/// jext had it and every name in it, and `jext fsck` and `e2fsck -fn` find it clean.
fn jext_replays(image: &Path, before: &Before, ijournal: IJournal, what: &str) {
    let dev = Arc::new(FileDevice::open(image, false).unwrap());
    let (fs, report) = Fs::open_with_report(dev, options(ijournal)).unwrap();
    if before.fast_commits > 0 {
        assert!(
            report.recovery.fast_commits.fast_commits >= 1,
            "{what}: {:?}",
            report.recovery
        );
    }
    let file = fs.open_file(&before.path).unwrap();
    assert_eq!(
        file.read_at(0, before.data.len() + 1).unwrap(),
        before.data,
        "{what}"
    );
    let st = fs.stat(fs.resolve(DIR).unwrap()).unwrap();
    assert_eq!(
        (st.size, st.blocks_512),
        (before.dir_size, before.dir_blocks_512),
        "{what}: {DIR}'s size and i_blocks after jext's replay"
    );
    for i in 0..before.durable_names {
        fs.resolve(&format!("{DIR}/{}", name(i)))
            .unwrap_or_else(|e| panic!("{what}: {} lost: {e}", name(i)));
    }
    fs.unmount().unwrap();
    drop(fs);
    let report = fsck(Arc::new(FileDevice::open(image, true).unwrap())).unwrap();
    assert!(
        report.is_clean(),
        "{what}: jext fsck: {:?}",
        report.problems
    );
    let (code, problems) = e2fsck_problems(image);
    assert_eq!((code, problems), (0, Vec::new()), "{what}: e2fsck -fn");
}

fn linux_can_replay() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let ok = root && Path::new("/dev/loop-control").exists();
    if !ok {
        eprintln!(
            "SKIPPED (LINUX REPLAY): needs root and loop devices to let the host kernel \
             replay the crash image; only jext's replay was checked"
        );
    }
    ok
}

/// The host kernel replays the crash image (a loop mount): the file reads back, and
/// returns `DIR`'s size and `st_blocks` as Linux left them and `e2fsck -fn`'s verdict
/// after the unmount.
fn linux_replays(image: &Path, mnt: &Path, before: &Before) -> (u64, u64, i32, Vec<String>) {
    let mount = LoopMount::new(image, mnt, "");
    let read = std::fs::read(mount.path(before.path.trim_start_matches('/')));
    let meta = std::fs::metadata(mount.path(DIR.trim_start_matches('/')));
    mount.unmount();
    assert_eq!(read.unwrap(), before.data, "the file after Linux's replay");
    let meta = meta.unwrap();
    let (code, problems) = e2fsck_problems(image);
    (meta.size(), meta.blocks(), code, problems)
}

fn run_case(growth: Growth) {
    let scratch = Scratch::new(&format!("fc-dir-growth-{growth:?}"));
    let base = scratch.path("base.img");
    base_image(&base, growth);

    let crashed = scratch.path("single.img");
    let before = grow_and_crash(&base, &crashed, growth, IJournal::Single);
    eprintln!(
        "{growth:?}: {} names durable, {DIR} grows to {} bytes, {} sectors; \
         fast commits {}, fallbacks {:?}",
        before.durable_names,
        before.dir_size,
        before.dir_blocks_512,
        before.fast_commits,
        before.fallbacks
    );
    assert_eq!(before.fast_commits, 0, "{growth:?}");
    assert_eq!(before.fallbacks, [("directory_grew", 1)], "{growth:?}");
    let for_jext = scratch.path("single-jext.img");
    std::fs::copy(&crashed, &for_jext).unwrap();
    jext_replays(
        &for_jext,
        &before,
        IJournal::Single,
        &format!("{growth:?} single"),
    );
    let linux = linux_can_replay();
    if linux {
        let (size, blocks, code, problems) = linux_replays(&crashed, &scratch.path("mnt"), &before);
        eprintln!("{growth:?}: after Linux's replay {DIR} is {size} bytes, {blocks} sectors; e2fsck -fn {code}: {problems:?}");
        assert_eq!(
            (size, blocks, code, problems),
            (before.dir_size, before.dir_blocks_512, 0, Vec::new()),
            "{growth:?}: {DIR} after Linux replayed the crash image"
        );
    }

    // An i-transaction carries the same create; only jext replays those.
    let crashed = scratch.path("percore.img");
    let before = grow_and_crash(&base, &crashed, growth, IJournal::PerCore);
    assert_eq!(before.fast_commits, 1, "{:?}", before.fallbacks);
    assert!(before.fallbacks.is_empty(), "{:?}", before.fallbacks);
    jext_replays(
        &crashed,
        &before,
        IJournal::PerCore,
        &format!("{growth:?} percore"),
    );
    if linux {
        linux_replays_the_create_one_block_short(&scratch, &base, before.durable_names);
    }
}

/// Why the fsync commits in full: the records a fast commit would carry for the growing
/// create (the new file's inode, its CREAT, its inode again) pended on the durable
/// image, Linux's replay leaves the directory's `i_blocks` one block short and nothing
/// else wrong. When a kernel counts the block, this fails and the full commit can go.
fn linux_replays_the_create_one_block_short(scratch: &Scratch, base: &Path, k: usize) {
    let filled = scratch.path("filled.img");
    std::fs::copy(base, &filled).unwrap();
    let fs = Fs::open_path(&filled, options(IJournal::Single)).unwrap();
    for i in 0..k {
        drop(
            fs.create_file(&format!("{DIR}/{}", name(i)), 0o644)
                .unwrap(),
        );
    }
    let dir = fs.resolve(DIR).unwrap();
    let durable_blocks = fs.stat(dir).unwrap().blocks_512;
    fs.unmount().unwrap();
    drop(fs);
    let done = scratch.path("done.img");
    std::fs::copy(&filled, &done).unwrap();
    let fs = Fs::open_path(&done, options(IJournal::Single)).unwrap();
    let path = format!("{DIR}/{}", name(k));
    drop(fs.create_file(&path, 0o644).unwrap());
    let file = fs.resolve(&path).unwrap();
    let grown_blocks = fs.stat(dir).unwrap().blocks_512;
    fs.unmount().unwrap();
    drop(fs);
    assert!(grown_blocks > durable_blocks, "create {k} grows {DIR}");
    let records: Vec<FcRecord> = vec![
        logged_inode(&done, file),
        FcRecord::Creat(dentry(dir, file, &name(k))),
        logged_inode(&done, file),
    ];
    pend_fast_commits(&filled, &records);
    let mount = LoopMount::new(&filled, &scratch.path("mnt-pin"), "");
    let replayed = std::fs::metadata(mount.path(path.trim_start_matches('/')));
    mount.unmount();
    assert!(replayed.unwrap().is_file(), "Linux replayed the CREAT");
    let (code, problems) = e2fsck_problems(&filled);
    assert_eq!(code, 4, "{problems:?}");
    assert_eq!(
        problems.first().map(String::as_str),
        Some(
            format!(
                "Inode {dir}, i_blocks is {durable_blocks}, should be {grown_blocks}.  Fix? no"
            )
            .as_str()
        ),
        "{problems:?}"
    );
    assert_eq!(
        problems.len(),
        2,
        "one problem and the summary: {problems:?}"
    );
}

#[test]
fn a_create_that_makes_the_directory_indexed() {
    run_case(Growth::ToIndexed);
}

#[test]
fn a_create_that_splits_a_full_leaf() {
    run_case(Growth::LeafSplit);
}

#[test]
fn a_create_that_appends_a_linear_block() {
    run_case(Growth::Linear);
}
