//! Fast commits written by jext's fsync: an eligible fsync writes one fast commit instead
//! of committing the running transaction, and Linux replays what jext wrote — the
//! decisive check that the format is right. The image is copied while jext still has it
//! open, as a crash would leave it (the running transaction never committed).

mod common;

use common::{assert_e2fsck_clean, run, LoopMount, Scratch};
use jext_device::FileDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions, SmallSyncs};
use jext_journal::RecordMode;
use std::path::Path;
use std::sync::Arc;

fn jext_image(path: &Path, size_bytes: u64) {
    let dev = Arc::new(FileDevice::create(path, size_bytes).unwrap());
    let opts = MkfsOptions {
        fast_commit: true,
        ..MkfsOptions::default()
    };
    mkfs(dev, &opts).unwrap();
}

/// A mount whose running transaction only commits when asked (or at unmount), in commits
/// of whole blocks: Linux and debugfs refuse a log of byte records (the default).
fn mount(image: &Path) -> Fs {
    let options = MountOptions {
        // Every synced append as an i-transaction, not journaled (`small_syncs=journal`).
        small_syncs: SmallSyncs::InPlace,
        commit_interval_ms: 3_600_000,
        journal_records: RecordMode::Blocks,
        ..MountOptions::default()
    };
    Fs::open_path(image, options).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn an_fsync_writes_a_fast_commit_and_linux_replays_it() {
    if !is_root() {
        eprintln!("SKIPPED: loop-mounting the crashed image with Linux needs root");
        return;
    }
    let scratch = Scratch::new("fc-jext-to-linux");
    let image = scratch.path("live.img");
    jext_image(&image, 64 << 20);
    let fs = mount(&image);
    fs.mkdir_path("/old", 0o755).unwrap();
    let old = fs.create_file("/old/appended", 0o644).unwrap();
    old.write_at(0, &pattern(5000, 1)).unwrap();
    drop(old);
    fs.sync().unwrap();

    // A file under two new directories, an append to an old file, a truncated one, and a
    // file nobody syncs.
    fs.mkdir_path("/new", 0o755).unwrap();
    fs.mkdir_path("/new/deeper", 0o700).unwrap();
    let leaf = fs.create_file("/new/deeper/leaf", 0o600).unwrap();
    leaf.write_at(0, &pattern(70_000, 2)).unwrap();
    leaf.fsync().unwrap();
    let old = fs.open_file("/old/appended").unwrap();
    old.write_at(5000, &pattern(9000, 3)).unwrap();
    old.fsync().unwrap();
    let unsynced = fs.create_file("/old/unsynced", 0o644).unwrap();
    unsynced.write_at(0, b"never synced").unwrap();

    // The leaf's directories are new: that fsync commits in full (Linux's replay of a
    // new directory leaves its link counts wrong). Then a new file in a durable
    // directory, and an append, go as fast commits.
    let stats = fs.fast_commit_stats();
    assert_eq!(stats.fallbacks.get("new_directory"), Some(&1), "{stats:?}");
    let commits_before = fs.journal_stats().commits;
    let sibling = fs.create_file("/new/deeper/sibling", 0o600).unwrap();
    sibling.write_at(0, &pattern(300, 4)).unwrap();
    sibling.fsync().unwrap();
    let stats = fs.fast_commit_stats();
    assert_eq!(stats.fast_commits, 2, "{stats:?}");
    assert_eq!(
        fs.journal_stats().commits,
        commits_before,
        "no full commit on the fsync path"
    );
    let crashed = scratch.path("crashed.img");
    std::fs::copy(&image, &crashed).unwrap();
    let for_jext = scratch.path("for-jext.img");
    std::fs::copy(&image, &for_jext).unwrap();
    drop((leaf, old, unsynced, sibling));
    fs.unmount().unwrap();

    let dump = run("debugfs", &["-R", "logdump", crashed.to_str().unwrap()]);
    assert!(
        dump.contains("tag HEAD"),
        "fast commits in the area:\n{dump}"
    );
    let linux = LoopMount::new(&crashed, &scratch.path("mnt"), "");
    let read = |p: &str| std::fs::read(linux.path(p)).unwrap();
    assert_eq!(read("new/deeper/leaf"), pattern(70_000, 2));
    assert_eq!(read("new/deeper/sibling"), pattern(300, 4));
    let mut appended = pattern(5000, 1);
    appended.extend(pattern(9000, 3));
    assert_eq!(read("old/appended"), appended);
    linux.unmount();
    assert_e2fsck_clean(&crashed);

    // jext's own recovery applies the same fast commits.
    let (fs, report) = Fs::open_with_report(
        Arc::new(FileDevice::open(&for_jext, false).unwrap()),
        MountOptions::default(),
    )
    .unwrap();
    assert!(
        report.recovery.fast_commits.fast_commits >= 2,
        "{:?}",
        report.recovery
    );
    let read = |p: &str| {
        let f = fs.open_file(p).unwrap();
        let len = f.stat().unwrap().size as usize;
        f.read_at(0, len).unwrap()
    };
    assert_eq!(read("/new/deeper/leaf"), pattern(70_000, 2));
    assert_eq!(read("/new/deeper/sibling"), pattern(300, 4));
    assert_eq!(read("/old/appended"), appended);
    fs.unmount().unwrap();
    assert_e2fsck_clean(&for_jext);
}
