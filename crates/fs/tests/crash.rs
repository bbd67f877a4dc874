//! Crash tests over the simulated device: a workload runs with every request captured;
//! then, for a crash after every flush (with none, and with random subsets, of the writes
//! the disk had not been asked to flush), jext recovers the image, every file fsync'd
//! before the crash has exactly its fsync'd contents, and `e2fsck -fn` finds the image
//! clean. All three data modes.

mod common;

use common::{assert_e2fsck_clean, Scratch};
use jext_device::{CrashCapture, SimDevice};
use jext_fs::{mkfs, CommitMode, DataMode, Fs, MkfsOptions, MountOptions, RenameFlags, SetAttr};
use jext_journal::RecordMode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// A file fsync'd at some point of the workload, never changed afterwards.
struct Promise {
    /// Index into the capture's ops: the promise holds for crashes at or after it.
    after_op: usize,
    path: String,
    data: Vec<u8>,
}

fn image(size: u64) -> Arc<SimDevice> {
    let dev = Arc::new(SimDevice::new(size));
    mkfs(
        dev.clone(),
        &MkfsOptions {
            assume_zeroed: true,
            uuid: Some([3; 16]),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    dev
}

/// Files written and fsync'd (never touched again), mixed with unsynced churn: writes,
/// truncates, renames, unlinks, directories.
fn workload(fs: &Fs, dev: &SimDevice, seed: u64) -> Vec<Promise> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut promises = Vec::new();
    fs.mkdir_path("/keep", 0o755).unwrap();
    fs.mkdir_path("/churn", 0o755).unwrap();
    let ops_done = |dev: &SimDevice| dev.take_capture_len();
    for i in 0..48 {
        let len = match rng.gen_range(0..4) {
            0 => rng.gen_range(1..100),
            1 => rng.gen_range(1000..6000),
            2 => rng.gen_range(20_000..80_000),
            _ => 0,
        };
        let data: Vec<u8> = (0..len)
            .map(|j| (j as u8).wrapping_mul(7).wrapping_add(i))
            .collect();
        let path = format!("/keep/f{i}");
        let f = fs.create_file(&path, 0o644).unwrap();
        f.write_at(0, &data).unwrap();
        if rng.gen_bool(0.7) {
            if rng.gen_bool(0.5) {
                f.fsync().unwrap()
            } else {
                f.fdatasync().unwrap()
            }
            promises.push(Promise {
                after_op: ops_done(dev),
                path,
                data,
            });
        }
        drop(f);
        churn(fs, &mut rng, i);
    }
    promises
}

fn churn(fs: &Fs, rng: &mut StdRng, i: u8) {
    let churn = fs.resolve("/churn").unwrap();
    let name = format!("c{i}");
    let f = fs.create(churn, name.as_bytes(), 0o600, 0, 0).unwrap().ino;
    fs.write(
        f,
        rng.gen_range(0..9000),
        &vec![i; rng.gen_range(1..20_000)],
    )
    .unwrap();
    match rng.gen_range(0..5) {
        0 => fs.unlink(churn, name.as_bytes()).unwrap(),
        1 => fs
            .rename(
                churn,
                name.as_bytes(),
                churn,
                format!("r{i}").as_bytes(),
                RenameFlags::default(),
            )
            .unwrap(),
        2 => {
            fs.setattr(
                f,
                &SetAttr {
                    size: Some(rng.gen_range(0..5000)),
                    ..SetAttr::default()
                },
            )
            .unwrap();
        }
        3 => {
            fs.mkdir(churn, format!("d{i}").as_bytes(), 0o755, 0, 0)
                .unwrap();
        }
        _ => fs.fsync(f, false).unwrap(),
    }
}

trait CaptureLen {
    fn take_capture_len(&self) -> usize;
}

impl CaptureLen for SimDevice {
    /// How many requests the capture holds so far (marks the point a promise starts).
    fn take_capture_len(&self) -> usize {
        self.mark("sync returned");
        self.capture_len()
    }
}

fn check_state(
    state: SimDevice,
    options: &MountOptions,
    promises: &[Promise],
    upto: usize,
    scratch: &Scratch,
    label: &str,
) {
    let dev = Arc::new(state);
    let fs = Fs::open(dev.clone(), options.clone())
        .unwrap_or_else(|e| panic!("{label}: recovery failed: {e}"));
    for p in promises.iter().filter(|p| p.after_op <= upto) {
        let ino = fs
            .resolve(&p.path)
            .unwrap_or_else(|e| panic!("{label}: fsync'd {} missing: {e}", p.path));
        let got = fs.read(ino, 0, p.data.len() + 1).unwrap();
        assert!(
            got == p.data,
            "{label}: fsync'd {} has {} bytes, expected {}",
            p.path,
            got.len(),
            p.data.len()
        );
    }
    fs.unmount().unwrap();
    let path = scratch.path("state.img");
    dev.write_current_image(&path).unwrap();
    let (code, text) = common::e2fsck(&path);
    assert_eq!(code, 0, "{label}: e2fsck after recovery:\n{text}");
}

fn explore(mode: DataMode, seed: u64, name: &str) -> usize {
    let scratch = Scratch::new(name);
    let dev = image(64 << 20);
    let options = MountOptions {
        data_mode: mode,
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    dev.start_capture();
    let promises = workload(&fs, &dev, seed);
    let capture: CrashCapture = dev.take_capture().unwrap();
    drop(fs);
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC0FFEE);
    let mut states = 0;
    // Just before and just after every flush, the end, and sampled points between.
    let mut points: Vec<usize> = capture
        .flush_points()
        .into_iter()
        .flat_map(|i| [i, i + 1])
        .collect();
    points.push(capture.ops().len());
    points.extend((0..capture.ops().len()).filter(|_| rng.gen_bool(0.03)));
    points.sort_unstable();
    points.dedup();
    for upto in points {
        let window = capture.window_len(upto);
        check_state(
            capture.crash_state(upto, |_| false),
            &options,
            &promises,
            upto,
            &scratch,
            &format!("{mode} crash at op {upto}"),
        );
        states += 1;
        if window > 0 {
            for _ in 0..2 {
                let keep: Vec<bool> = (0..window).map(|_| rng.gen_bool(0.5)).collect();
                let label = format!("{mode} crash at op {upto} keeping {keep:?}");
                check_state(
                    capture.crash_state(upto, |i| keep[i]),
                    &options,
                    &promises,
                    upto,
                    &scratch,
                    &label,
                );
                states += 1;
            }
        }
    }
    states
}

#[test]
fn ordered_mode_survives_every_flush_boundary() {
    let states = explore(DataMode::Ordered, 1, "crash-o");
    assert!(states > 100, "only {states} crash states were explored");
}

#[test]
fn journal_mode_survives_every_flush_boundary() {
    explore(DataMode::Journal, 2, "crash-j");
}

#[test]
fn writeback_mode_survives_every_flush_boundary() {
    explore(DataMode::Writeback, 3, "crash-w");
}

#[test]
fn a_clean_image_stays_clean() {
    let scratch = Scratch::new("crash-clean");
    let dev = image(64 << 20);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    fs.create_file("/x", 0o644)
        .unwrap()
        .write_at(0, b"x")
        .unwrap();
    fs.unmount().unwrap();
    let path = scratch.path("clean.img");
    dev.crash().write_durable_image(&path).unwrap();
    assert_e2fsck_clean(&path);
}

/// Linux recovers crash images jext wrote to the same result as jext's own recovery: the
/// log (including wrapped logs, and the shorter log of a fast_commit file system) is
/// readable by the kernel.
#[test]
fn the_kernel_recovers_jext_crash_images() {
    let expected = |i: u32| vec![(i % 251) as u8; 6000 + i as usize * 50];
    for (fast_commit, name) in [(false, "kernel-replay"), (true, "kernel-replay-fc")] {
        let scratch = Scratch::new(name);
        let dev = Arc::new(SimDevice::new(64 << 20));
        let opts = MkfsOptions {
            assume_zeroed: true,
            fast_commit,
            journal_blocks: Some(1024),
            ..MkfsOptions::default()
        };
        mkfs(dev.clone(), &opts).unwrap();
        // The log as Linux reads it: classic commits of whole blocks (jext's single-I/O
        // commits and byte records carry private bits Linux refuses).
        let options = MountOptions {
            commit_interval_ms: 3_600_000,
            journal_commit: CommitMode::Classic,
            journal_records: RecordMode::Blocks,
            ..MountOptions::default()
        };
        let fs = Fs::open(dev.clone(), options.clone()).unwrap();
        // Enough transactions (about 8 log blocks each) to wrap the 1024-block log: every
        // other file is synced in full, the others fsync'd (fast commits where the image
        // has them, so the kernel also replays fast commits after a wrapped log).
        for i in 0..400u32 {
            let f = fs.create_file(&format!("/f{i}"), 0o644).unwrap();
            f.write_at(0, &expected(i)).unwrap();
            if i % 2 == 0 {
                f.fsync().unwrap();
            } else {
                fs.sync().unwrap();
            }
        }
        assert!(
            fs.journal_stats().checkpoints >= 2,
            "the log wrapped: {:?}",
            fs.journal_stats()
        );
        let crashed = dev.crash();
        drop(fs);
        let image = scratch.path("crash.img");
        crashed.write_durable_image(&image).unwrap();
        let mount = common::LoopMount::new(&image, &scratch.path("mnt"), "");
        for i in 0..400u32 {
            let data = std::fs::read(mount.path(&format!("f{i}"))).unwrap();
            assert!(
                data == expected(i),
                "kernel view of f{i}: {} bytes",
                data.len()
            );
        }
        mount.unmount();
        assert_e2fsck_clean(&image);
        let ours = Arc::new(crashed);
        let fs = Fs::open(ours.clone(), options).unwrap();
        for i in 0..400u32 {
            let ino = fs.resolve(&format!("/f{i}")).unwrap();
            let data = fs.read(ino, 0, 30_000).unwrap();
            assert!(
                data == expected(i),
                "jext view of f{i}: {} bytes",
                data.len()
            );
        }
        fs.unmount().unwrap();
    }
}

/// An inode number freed by a transaction that is not durable is not handed out again
/// until it is: the number's record on disk may still be the old inode on the orphan
/// list, and a new file's fast commit would replay over it (Linux takes `i_dtime`, the
/// list's next link, from the fast commit and loses the orphans after it). Once the
/// deletion is durable the number goes to a new file, which a fast commit creates and a
/// directory fsync's fast commit unlinks (SQLite's rollback journal, under `kill -9` of
/// the daemon); replay deletes it and the orphan list is left right.
#[test]
fn an_inode_number_is_reused_only_once_its_deletion_is_durable() {
    let scratch = Scratch::new("replay-orphan");
    let dev = image(64 << 20);
    let options = MountOptions {
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    let root = fs.root();
    let first = fs.create_file("/journal", 0o644).unwrap();
    first.write_at(0, &[1; 3000]).unwrap();
    fs.unlink(root, b"journal").unwrap();
    fs.sync().unwrap();
    let freed = first.ino();
    drop(first);
    let early = fs.create_file("/early", 0o644).unwrap();
    assert_ne!(
        early.ino(),
        freed,
        "a number freed by a transaction not yet durable was handed out"
    );
    fs.sync().unwrap();
    let second = fs.create_file("/journal", 0o644).unwrap();
    assert_eq!(second.ino(), freed, "the durable free is handed out again");
    // More than a small append, which would journal its data and commit in full
    // (`sync_journaling`): this fsync must go as a fast commit.
    second.write_at(0, &vec![2; 17 * 4096]).unwrap();
    second.fsync().unwrap();
    drop(second);
    fs.unlink(root, b"journal").unwrap();
    fs.fsync(root, false).unwrap();
    assert!(
        fs.fast_commit_stats().fast_commits >= 2,
        "{:?}",
        fs.fast_commit_stats()
    );
    let crashed = Arc::new(dev.crash());
    drop(early);
    drop(fs);
    let fs =
        Fs::open(crashed.clone(), options).unwrap_or_else(|e| panic!("mount after the crash: {e}"));
    assert!(fs.resolve("/journal").is_err(), "the unlink was fsync'd");
    fs.unmount().unwrap();
    let path = scratch.path("state.img");
    crashed.write_current_image(&path).unwrap();
    let (code, text) = common::e2fsck(&path);
    assert_eq!(code, 0, "e2fsck after recovery:\n{text}");
}

/// Files made without a name (`O_TMPFILE`): one linked and fsync'd survives a crash with
/// its data under its name; one never linked is on the orphan list and the mount after the
/// crash deletes it, as ext4's orphan pass does. Only an unnamed file may be given its
/// first name: an unlinked file still open may not, as `linkat` refuses it on ext4.
#[test]
fn an_unnamed_file_lives_by_its_link_or_goes_with_the_crash() {
    for data_mode in [DataMode::Ordered, DataMode::Writeback, DataMode::Journal] {
        unnamed_file_crash(data_mode);
    }
}

fn unnamed_file_crash(data_mode: DataMode) {
    let scratch = Scratch::new("unnamed");
    let dev = image(64 << 20);
    let options = MountOptions {
        data_mode,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    let root = fs.root();
    let kept = fs.create_unnamed(root, 0o100_640, 0o022, 0, 0).unwrap();
    assert_eq!((kept.nlink, kept.perm), (0, 0o640));
    fs.write(kept.ino, 0, &[7; 10_000]).unwrap();
    fs.link(kept.ino, root, b"kept").unwrap();
    fs.fsync(kept.ino, false).unwrap();
    let lost = fs.create_unnamed(root, 0o100_600, 0, 0, 0).unwrap();
    fs.write(lost.ino, 0, &[9; 50_000]).unwrap();
    fs.fsync(lost.ino, false).unwrap();
    let open = fs.create_file("/open", 0o644).unwrap();
    fs.unlink(root, b"open").unwrap();
    assert!(
        fs.link(open.ino(), root, b"again").is_err(),
        "an unlinked file got a name back"
    );
    fs.sync().unwrap();
    let crashed = Arc::new(dev.crash());
    drop(open);
    drop(fs);
    let (fs, report) = Fs::open_with_report(crashed.clone(), options).unwrap();
    assert_eq!(
        report.orphans_finished, 2,
        "the unnamed and the unlinked file"
    );
    let ino = fs.resolve("/kept").unwrap();
    assert!(fs.read(ino, 0, 20_000).unwrap() == vec![7; 10_000]);
    assert!(
        fs.stat_live(lost.ino).is_err(),
        "the unnamed file outlived the crash"
    );
    assert!(fs.resolve("/open").is_err() && fs.resolve("/again").is_err());
    fs.unmount().unwrap();
    let path = scratch.path("state.img");
    crashed.write_current_image(&path).unwrap();
    let (code, text) = common::e2fsck(&path);
    assert_eq!(code, 0, "e2fsck after recovery:\n{text}");
}
