//! The crash explorer in the test suite: a CI-sized exploration over every mode and the
//! fixed workloads finds nothing; the same explorer over a lying device finds failures
//! (so the checks can fail); and the reproducers of bugs it found stay fixed.

use jext_crash::{explore, replay, Config, Plan, Reproducer, Sampling, Summary, WorkloadId};
use jext_device::SimFault;

fn config(jobs: usize) -> Config {
    Config {
        jobs,
        e2fsck_every: 10,
        ..Config::default()
    }
}

/// Half the default states per crash point in windows too large to explore exhaustively:
/// the suite keeps every workload and every crash point, and the long runs of the README
/// (`jext crash --budget`) sample at full density. This keeps CI under its 20 minutes.
fn ci_sampling() -> Sampling {
    Sampling {
        samples_per_point: 4,
        ..Sampling::default()
    }
}

/// `e2fsck -fn` on every 40th state of the large explorations (about 600 runs in the CI
/// exploration): each is a process of its own, and every tenth state cost a quarter of
/// the test's time.
const E2FSCK_EVERY_LARGE: u64 = 40;

/// Explores `only` (every workload when empty) and asserts that nothing failed, printing
/// each failure's reproducer first.
fn explore_expecting_no_failure(only: &[WorkloadId], config: &Config) -> Summary {
    let summary = explore(Plan::Ci, only, config, &|_| {});
    for f in &summary.failures {
        eprintln!(
            "FAILED {}\n  {}\n{}",
            f.reproducer,
            f.problems.join("\n  "),
            f.listing
        );
    }
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    let total = summary.total();
    assert_eq!(total.failures, 0, "{total:?}");
    summary
}

#[test]
fn the_ci_exploration_finds_no_failure_in_any_mode() {
    let config = Config {
        sampling: ci_sampling(),
        e2fsck_every: E2FSCK_EVERY_LARGE,
        ..config(2)
    };
    let summary = explore_expecting_no_failure(&[], &config);
    let total = summary.total();
    assert!(
        total.states >= 3000,
        "a CI-sized run checks thousands of states: {total:?}"
    );
    assert!(
        total.e2fsck_runs >= 100,
        "e2fsck ran on a sample: {total:?}"
    );
    for (mode, counts) in &summary.per_mode {
        assert!(counts.workloads >= 150, "{mode}: {counts:?}");
    }
}

#[test]
fn torn_sector_writes_are_survived_too() {
    let only: Vec<WorkloadId> = [
        "create-delete-10",
        "append-extents-24",
        "sqlite-wal-8",
        "ace2-3",
        "joj-overwrite-3",
        "joj-switch-4",
    ]
    .iter()
    .map(|w| w.parse().unwrap())
    .collect();
    let config = Config {
        sampling: Sampling {
            torn_writes: true,
            ..ci_sampling()
        },
        e2fsck_every: E2FSCK_EVERY_LARGE,
        ..config(2)
    };
    let summary = explore(Plan::Ci, &only, &config, &|_| {});
    assert_eq!(summary.total().failures, 0, "{:#?}", summary.failures);
    assert!(summary.total().states > 300);
}

/// A lying device is caught in any mode; these three cover the default commit, the
/// journaled data path and the per-core rings (the honest control runs in the same).
fn lie_modes() -> Vec<jext_crash::Mode> {
    ["ordered", "journal+classic", "ordered+percore"]
        .iter()
        .map(|m| m.parse().unwrap())
        .collect()
}

/// Workloads whose fsyncs make durability promises a lying device breaks.
fn promising_workloads() -> Vec<WorkloadId> {
    [
        "create-delete-10",
        "rename-root-to-sub-1",
        "sqlite-rollback-4",
        "odd-fsync-20",
    ]
    .iter()
    .map(|w| w.parse().unwrap())
    .collect()
}

fn failures_under(fault: SimFault) -> usize {
    let config = Config {
        fault: Some(fault.clone()),
        e2fsck_every: 0,
        modes: lie_modes(),
        ..config(2)
    };
    let summary = explore(Plan::Ci, &promising_workloads(), &config, &|_| {});
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    if let Some(f) = summary.failures.first() {
        eprintln!(
            "{fault:?}: e.g. {}: {}",
            f.reproducer,
            f.problems.join("; ")
        );
    }
    summary.total().failures
}

#[test]
fn a_dropped_flush_is_caught() {
    assert!(failures_under(SimFault::DropFlushes) > 0);
}

#[test]
fn a_write_reordered_across_a_flush_is_caught() {
    assert!(failures_under(SimFault::ReorderAcrossFlushes) > 0);
}

#[test]
fn the_same_workloads_pass_on_an_honest_device() {
    let config = Config {
        modes: lie_modes(),
        ..config(2)
    };
    let summary = explore(Plan::Ci, &promising_workloads(), &config, &|_| {});
    assert_eq!(summary.total().failures, 0, "{:#?}", summary.failures);
}

/// Single-I/O commits (descriptor, logged blocks and commit block in one write, then
/// one flush) cut after every sector and torn at every sector: recovery replays whole
/// transactions only, in the data modes whose commits go out so (journal always; ordered
/// when nothing new is mapped), and the per-file journal modes.
#[test]
fn single_io_commits_survive_every_cut_and_tear() {
    let only: Vec<WorkloadId> = ["sqlite-rollback-4", "joj-overwrite-3"]
        .iter()
        .map(|w| w.parse().unwrap())
        .collect();
    let config = Config {
        modes: ["ordered", "journal"]
            .iter()
            .map(|m| m.parse().unwrap())
            .collect(),
        sampling: Sampling {
            every_cut_of_largest_write: true,
            ..Sampling::default()
        },
        ..config(2)
    };
    let total = explore_expecting_no_failure(&only, &config).total();
    // Byte records make the commits a few sectors long, so fewer cuts than whole
    // blocks gave (2,554 states once byte records became the default; 3,000+ with whole blocks).
    assert!(total.states >= 2000, "every cut of every commit: {total:?}");
}

/// `data=adaptive`: SQLite's rollback journal in DELETE mode (born journaled from the
/// second transaction) and TRUNCATE mode (switched at its first truncate), and a WAL,
/// with sector-torn writes and every cut of the largest write.
#[test]
fn adaptive_journal_switches_survive_every_crash() {
    let only: Vec<WorkloadId> = ["sqlite-rollback-4", "sqlite-truncate-4", "sqlite-wal-8"]
        .iter()
        .map(|w| w.parse().unwrap())
        .collect();
    let config = Config {
        modes: ["adaptive", "adaptive+classic"]
            .iter()
            .map(|m| m.parse().unwrap())
            .collect(),
        sampling: Sampling {
            torn_writes: true,
            every_cut_of_largest_write: true,
            ..Sampling::default()
        },
        ..config(2)
    };
    let total = explore_expecting_no_failure(&only, &config).total();
    assert!(total.states >= 500, "{total:?}");
}

/// Bugs the explorer found, kept as regression tests by their reproducers.
#[test]
fn found_bugs_stay_fixed() {
    for line in [
        // data=journal: fdatasync after an overwrite in place committed nothing, so the
        // overwrite was lost (the journaled data block did not mark the inode's
        // datasync transaction).
        "ace1-21/journal/1/none",
        "ace1-26/journal/1/none",
        // fdatasync of a directory committed nothing when only its entries had changed,
        // so a new file or directory in it was lost (SQLite's synchronous=EXTRA relies
        // on it after deleting a rollback journal).
        "ace1-8/ordered/1/none",
        "ace1-13/journal/1/none",
        // (After the second fdatasync's flush: point 4 with single-I/O commits, whose
        // log has one write and one flush per commit; it was point 5 with classic ones.)
        "ace3-73/ordered/4/none",
        // fdatasync through a new hard link (or a rename's new name) did not wait for the
        // name: the file was unreachable by the path fdatasync was called through.
        "ace2-967/ordered/1/none",
        "ace3-967/journal/1/none",
    ] {
        let repro: Reproducer = line.parse().unwrap();
        let r = replay(&repro, false, false, None).unwrap();
        assert!(r.problems.is_empty(), "{line}: {:?}", r.problems);
        assert!(r.log_len > 1, "{line}: the fdatasync now commits");
    }
}

/// Linux, loop-mounting a sample of the crash images and replaying their journals
/// itself, shows every path exactly as jext's recovery does in the modes whose log it
/// can read (classic commits of whole blocks), and refuses every image whose log holds
/// single-I/O commits or byte records (the private incompat bits, set by default).
#[test]
fn linux_recovers_a_sample_of_states_as_jext_does() {
    let only: Vec<WorkloadId> = [
        "ace1-40",
        "ace1-100",
        "rename-root-to-sub-1",
        "sqlite-wal-8",
    ]
    .iter()
    .map(|w| w.parse().unwrap())
    .collect();
    let config = Config {
        kernel_check_every: 4,
        modes: [
            "ordered+classic+blocks",
            "journal+classic+blocks",
            "writeback+classic+blocks",
            "ordered",
            "journal+classic",
        ]
        .iter()
        .map(|m| m.parse().unwrap())
        .collect(),
        ..config(1)
    };
    let summary = explore(Plan::Ci, &only, &config, &|_| {});
    assert!(summary.errors.is_empty(), "{:?}", summary.errors);
    assert_eq!(summary.total().failures, 0, "{:#?}", summary.failures);
    for (mode, counts) in &summary.per_mode {
        eprintln!("{mode}: {counts:?}");
        assert!(counts.kernel_checks >= 10, "{mode}: {counts:?}");
    }
}

/// iJournaling's second scenario must really reach external extent blocks: the appends
/// of `/big` interleave with `/spoiler`'s, so no two of its blocks are adjacent and its
/// extents outgrow the four the inode holds.
#[test]
fn append_extents_needs_an_external_extent_block() {
    use jext_fs::{mkfs, DataMode, Fs, MkfsOptions};
    use std::sync::Arc;
    let workload = jext_crash::generate(&"append-extents-24".parse().unwrap()).unwrap();
    let dev = Arc::new(jext_device::SimDevice::new(jext_crash::record::IMAGE_BYTES));
    let opts = MkfsOptions {
        block_size: Some(4096),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::open(
        dev,
        jext_crash::record::mount_options(DataMode::Ordered.into()),
    )
    .unwrap();
    for (i, op) in workload.ops.iter().enumerate() {
        jext_crash::record::apply(&fs, op, i).unwrap();
    }
    let big = fs.stat(fs.resolve("/big").unwrap()).unwrap();
    let extents = fs.extents(big.ino).unwrap();
    assert!(extents.len() > 4, "{} extents", extents.len());
    assert!(
        big.blocks_512 * 512 > big.size,
        "an extent block beyond the data: {} bytes allocated for {}",
        big.blocks_512 * 512,
        big.size
    );
}
