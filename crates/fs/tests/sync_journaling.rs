//! An ordered file's synced small appends go through the journal (`sync_journaling`):
//! each fsync is one commit with one flush and no FUA write, and a crash that loses the
//! device's whole cache, or keeps any prefix of it, still shows every fsync'd byte. An
//! overwrite synced once the checkpoint has passed the file's journaled blocks takes it
//! back to fast commits; one synced before that journals still. Every recovered image
//! passes fsck.

mod common;

use common::fresh_sim_fs as fresh;
use jext_device::SimDevice;
use jext_fs::{fsck, File, Fs, MountOptions};
use std::sync::Arc;

/// A SQLite WAL frame: a page and its 24-byte header, so appends straddle pages.
const FRAME: usize = 4096 + 24;

fn mount(dev: Arc<SimDevice>) -> Fs {
    Fs::open(dev, MountOptions::default()).expect("mounts")
}

/// What `path` holds after recovery on `dev`, and an fsck of the recovered image.
fn recovered(dev: SimDevice, path: &str) -> Vec<u8> {
    common::recovered_content(dev, path, MountOptions::default())
}

/// Appends frame `n` to `f` and to `model`, then fsyncs.
fn append_synced(f: &File, model: &mut Vec<u8>, n: usize) {
    let frame = vec![n as u8 + 1; FRAME];
    f.write_at(model.len() as u64, &frame).unwrap();
    model.extend_from_slice(&frame);
    f.fsync().unwrap();
}

fn fallbacks(fs: &Fs, reason: &str) -> u64 {
    fs.fast_commit_stats()
        .fallbacks
        .get(reason)
        .copied()
        .unwrap_or(0)
}

#[test]
fn synced_small_appends_cost_one_flush_each_and_survive_every_crash() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let f = fs.create_file("/wal", 0o644).unwrap();
    let mut model = Vec::new();
    append_synced(&f, &mut model, 0);
    assert!(f.journals_data().unwrap(), "a synced small append journals");
    let (before, fast_before) = (fs.counters(), fs.fast_commit_stats().fast_commits);
    for n in 1..=20 {
        append_synced(&f, &mut model, n);
    }
    let used = fs.counters() - before;
    assert_eq!((used.flushes, used.fua_writes), (20, 0), "{used:?}");
    assert_eq!(fs.fast_commit_stats().fast_commits, fast_before);
    assert!(fallbacks(&fs, "journals_in_memory") >= 20);
    assert_eq!(recovered(dev.crash(), "/wal"), model);
    // One more, and every cut of the cache it left: the first 20 frames at least.
    let durable = model.clone();
    append_synced(&f, &mut model, 21);
    f.write_at(0, &[0xee; 100]).unwrap();
    for kept in 0..=dev.pending_writes() {
        let got = recovered(dev.crash_keeping(|i| i < kept), "/wal");
        assert!(
            got.len() >= durable.len(),
            "kept {kept}: {} bytes",
            got.len()
        );
        assert_eq!(
            &got[..model.len()],
            &model[..],
            "kept {kept}: the fsync'd frames"
        );
    }
    drop(f);
    fs.unmount().unwrap();
}

#[test]
fn an_overwrite_after_the_checkpoint_goes_back_to_fast_commits() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let f = fs.create_file("/wal", 0o644).unwrap();
    let mut model = Vec::new();
    for n in 0..4 {
        append_synced(&f, &mut model, n);
    }
    // Before the checkpoint: the log holds the frames, so the overwrite journals too.
    model[..FRAME].fill(0x55);
    f.write_at(0, &model[..FRAME]).unwrap();
    f.fsync().unwrap();
    assert!(f.journals_data().unwrap(), "the log still holds its blocks");
    assert_eq!(recovered(dev.crash(), "/wal"), model);
    // A remount to read-only and back checkpoints everything.
    fs.remount(true).unwrap();
    fs.remount(false).unwrap();
    let fast_before = fs.fast_commit_stats().fast_commits;
    // Reading the times makes the overwrite stamp an exact mtime (multigrain timestamps):
    // within the clock tick of the last change the inode would not change, and the fsync
    // would rightly have nothing to commit.
    f.stat().unwrap();
    model[..FRAME].fill(0x66);
    f.write_at(0, &model[..FRAME]).unwrap();
    f.fsync().unwrap();
    assert!(!f.journals_data().unwrap(), "back to ordered");
    assert_eq!(fs.fast_commit_stats().fast_commits, fast_before + 1);
    assert_eq!(f.read_at(0, model.len()).unwrap(), model);
    assert_eq!(recovered(dev.crash(), "/wal"), model);
    // And an append synced after it journals again.
    append_synced(&f, &mut model, 9);
    assert!(f.journals_data().unwrap());
    assert_eq!(recovered(dev.crash(), "/wal"), model);
    drop(f);
    fs.unmount().unwrap();
    assert!(fsck(dev).unwrap().is_clean());
}

#[test]
fn large_syncs_and_other_modes_stay_as_they_are() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let big = fs.create_file("/big", 0o644).unwrap();
    big.write_at(0, &vec![7; 17 * 4096]).unwrap();
    big.fsync().unwrap();
    assert!(!big.journals_data().unwrap(), "17 pages is no small append");
    drop(big);
    fs.unmount().unwrap();
    let writeback = Fs::open(dev.clone(), MountOptions::parse("data=writeback").unwrap()).unwrap();
    let f = writeback.create_file("/small", 0o644).unwrap();
    append_synced(&f, &mut Vec::new(), 0);
    assert!(!f.journals_data().unwrap(), "data=writeback keeps no order");
    drop(f);
    writeback.unmount().unwrap();
}

/// Inodes the cache keeps before it evicts unused ones (`inode_table::INODE_CACHE_LIMIT`),
/// and a few more.
const PAST_THE_INODE_CACHE: usize = 65_536 + 4_096;

/// A file that journals in memory may leave the inode cache while the log holds copies of
/// its blocks: it comes back journaling, so a later overwrite cannot land in place under
/// an older journaled copy; once the checkpoint passed them it comes back ordered.
#[test]
fn an_evicted_file_comes_back_journaling_until_the_checkpoint() {
    let dev = Arc::new(SimDevice::new(640 << 20));
    jext_fs::mkfs(
        dev.clone(),
        &jext_fs::MkfsOptions {
            assume_zeroed: true,
            uuid: Some([9; 16]),
            block_size: Some(4096),
            // Room for two rounds of evictions, and a log the first does not fill (a
            // checkpoint would pass the file's blocks).
            inode_ratio: Some(4096),
            journal_blocks: Some(30_000),
            ..jext_fs::MkfsOptions::default()
        },
    )
    .unwrap();
    let options = MountOptions {
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options).unwrap();
    let mut model = Vec::new();
    let f = fs.create_file("/wal", 0o644).unwrap();
    append_synced(&f, &mut model, 0);
    let ino = f.ino();
    drop(f);
    let dir = fs.mkdir_path("/many", 0o755).unwrap();
    let evict = |from: usize| {
        for i in from..from + PAST_THE_INODE_CACHE {
            fs.create(dir.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap();
        }
        fs.sync().unwrap();
    };
    evict(0);
    assert!(
        fs.journals_data(ino).unwrap(),
        "back from eviction journaling"
    );
    model[..FRAME].fill(0x77);
    let f = fs.open_file("/wal").unwrap();
    f.write_at(0, &model[..FRAME]).unwrap();
    f.fsync().unwrap();
    assert!(f.journals_data().unwrap(), "the log still holds its blocks");
    assert_eq!(recovered(dev.crash(), "/wal"), model);
    drop(f);
    fs.remount(true).unwrap();
    fs.remount(false).unwrap();
    evict(PAST_THE_INODE_CACHE);
    assert!(
        !fs.journals_data(ino).unwrap(),
        "checkpointed: back ordered"
    );
    let f = fs.open_file("/wal").unwrap();
    assert_eq!(f.read_at(0, model.len()).unwrap(), model);
    drop(f);
    fs.unmount().unwrap();
    assert!(fsck(dev).unwrap().is_clean());
}
