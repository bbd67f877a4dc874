//! `ijournal=percore`: fsyncs of different files from several threads write
//! i-transactions to per-core rings; after a crash (the simulated disk keeps only what
//! was durable) jext's recovery brings back every fsync that returned, `e2fsck -fn` finds
//! the result clean, and Linux refuses the crashed image while the private bit is set.
//! The same runs on a device with a latency model, whose commands complete
//! asynchronously: data writes are then truly in flight while other threads plan and
//! commit, and the crash keeps only what was durable at that moment; and with files that
//! journal their data (small synced appends, `data=journal`), whose i-transactions carry
//! the data blocks, which recovery writes home.

mod common;

use common::{assert_e2fsck_clean, LoopMount, Scratch};
use jext_device::{LatencyModel, Preset, SimDevice};
use jext_fs::debug::DebugWhat;
use jext_fs::{mkfs, DataMode, Fs, IJournal, MkfsOptions, MountOptions, SmallSyncs};
use std::process::Command;
use std::sync::{Arc, Mutex};

const THREADS: usize = 4;
const FILES_PER_THREAD: usize = 2;
const ROUNDS: usize = 12;
const CHUNK: usize = 4096;

fn options(ijournal: IJournal) -> MountOptions {
    MountOptions {
        // Every synced append as an i-transaction, not journaled (`small_syncs=journal`).
        small_syncs: SmallSyncs::InPlace,
        commit_interval_ms: 3_600_000,
        ijournal,
        ..MountOptions::default()
    }
}

fn percore() -> MountOptions {
    options(IJournal::PerCore)
}

fn fresh_device(latency: Option<LatencyModel>) -> Arc<SimDevice> {
    let dev = SimDevice::new(512 << 20);
    let dev = Arc::new(match latency {
        Some(model) => dev.with_latency(model),
        None => dev,
    });
    // A 128 MiB journal: 512 fast-commit blocks, so every fsync here fits the rings
    // without a fallback, even those carrying a data block, and the crash finds live
    // i-transactions.
    let opts = MkfsOptions {
        assume_zeroed: true,
        fast_commit: true,
        block_size: Some(4096),
        journal_blocks: Some(32768),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    dev
}

/// The byte at `offset` of file `k`: every append is known from where it lands.
fn byte(k: usize, offset: usize) -> u8 {
    ((offset / 7 + k * 13 + offset % 251) % 256) as u8
}

fn bytes(k: usize, from: usize, len: usize) -> Vec<u8> {
    (from..from + len).map(|o| byte(k, o)).collect()
}

fn path(k: usize) -> String {
    format!("/f{k}")
}

/// `jext debug IMAGE journal` of a device.
fn journal_dump(dev: &Arc<SimDevice>) -> String {
    jext_fs::debug::dump(dev.clone(), &DebugWhat::Journal).unwrap()
}

#[test]
fn concurrent_fsyncs_in_rings_survive_a_crash() {
    concurrent_fsyncs_survive_a_crash(percore(), None, "percore-crash");
}

/// Small synced appends journal their data (`small_syncs=journal`, the default), and
/// so does every file under `data=journal`: each i-transaction carries the blocks.
#[test]
fn concurrent_fsyncs_carrying_their_data_in_rings_survive_a_crash() {
    let small_syncs = MountOptions {
        small_syncs: SmallSyncs::Journal,
        ..percore()
    };
    let data_journal = MountOptions {
        data_mode: DataMode::Journal,
        ..percore()
    };
    for (opts, name) in [
        (small_syncs, "carried-crash"),
        (data_journal, "dj-carried-crash"),
    ] {
        concurrent_fsyncs_survive_a_crash(opts, None, name);
    }
}

/// On a supercapacitor SSD's timing (cheap flushes, so the run stays short), with writes
/// completing on the device's own timeline.
#[test]
fn concurrent_fsyncs_on_an_asynchronous_device_survive_a_crash() {
    for ijournal in [IJournal::Single, IJournal::PerCore] {
        let opts = options(ijournal);
        concurrent_fsyncs_survive_a_crash(opts, Some(Preset::SupercapSsd), "async-crash");
    }
}

/// The same in the one ext4 area, where fsyncs that arrive while a fast commit is being
/// written go out together as the next one (group commit).
#[test]
fn concurrent_fsyncs_in_the_one_area_survive_a_crash() {
    concurrent_fsyncs_survive_a_crash(options(IJournal::Single), None, "single-area-crash");
}

fn concurrent_fsyncs_survive_a_crash(opts: MountOptions, latency: Option<Preset>, name: &str) {
    let scratch = Scratch::new(name);
    let dev = fresh_device(latency.map(Preset::model));
    let fs = Arc::new(Fs::open(dev.clone(), opts.clone()).unwrap());
    // Half the files exist durably before; the other half are created by the threads
    // (their names go in the i-transactions).
    for k in (0..THREADS * FILES_PER_THREAD).step_by(2) {
        fs.create_file(&path(k), 0o644).unwrap();
    }
    fs.sync().unwrap();
    let commits_before = fs.journal_stats().commits;
    // Per file: the length its last returned fsync made durable.
    let durable = Arc::new(Mutex::new(vec![0usize; THREADS * FILES_PER_THREAD]));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (fs, durable) = (fs.clone(), durable.clone());
            std::thread::spawn(move || {
                let mine: Vec<usize> = (0..FILES_PER_THREAD)
                    .map(|i| t * FILES_PER_THREAD + i)
                    .collect();
                let files: Vec<_> = mine
                    .iter()
                    .map(|&k| {
                        fs.open_file(&path(k))
                            .or_else(|_| fs.create_file(&path(k), 0o644))
                            .unwrap()
                    })
                    .collect();
                for round in 0..ROUNDS {
                    for (file, &k) in files.iter().zip(&mine) {
                        let at = round * CHUNK;
                        file.write_at(at as u64, &bytes(k, at, CHUNK)).unwrap();
                        file.fsync().unwrap();
                        durable.lock().unwrap()[k] = at + CHUNK;
                    }
                }
                // One more append nobody syncs.
                let at = ROUNDS * CHUNK;
                files[0]
                    .write_at(at as u64, &bytes(mine[0], at, CHUNK))
                    .unwrap();
            })
        })
        .collect();
    // A crash in the middle: every fsync that had returned before must survive it,
    // whichever rings its i-transaction and the ones below it went to.
    let total: usize = THREADS * FILES_PER_THREAD * ROUNDS * CHUNK;
    while durable.lock().unwrap().iter().sum::<usize>() < total / 2 {
        std::thread::yield_now();
    }
    let returned_mid = durable.lock().unwrap().clone();
    let crashed_mid = Arc::new(dev.crash());
    for w in workers {
        w.join().unwrap();
    }
    let stats = fs.fast_commit_stats();
    assert!(stats.fast_commits > 0, "{stats:?}");
    let journals_data =
        opts.small_syncs == SmallSyncs::Journal || opts.data_mode == DataMode::Journal;
    if opts.ijournal == IJournal::PerCore && journals_data {
        assert!(stats.carried_blocks > 0, "{stats:?}");
    }
    assert!(
        fs.journal_stats().commits - commits_before < stats.fast_commits,
        "most fsyncs wrote i-transactions: {:?} {stats:?}",
        fs.journal_stats()
    );
    let crashed = Arc::new(dev.crash());
    let returned = durable.lock().unwrap().clone();
    std::mem::forget(fs); // the crash: nothing more reaches the device we keep

    let dump = journal_dump(&crashed);
    if opts.ijournal == IJournal::PerCore {
        assert!(dump.contains("jext_percore_itransactions"), "{dump}");
        // Which rings hold the last tid's depends on the turns and on where a full
        // ring made that tid start.
        assert!(
            dump.contains(" of 8:") && dump.contains("sub-tid"),
            "{dump}"
        );
    } else {
        assert!(dump.contains("fast commits after the log: "), "{dump}");
    }
    check_recovered(&scratch, &crashed_mid, &returned_mid, &opts);
    let replayed = check_recovered(&scratch, &crashed, &returned, &opts);
    assert!(replayed > 0, "the crash at the end replays i-transactions");
}

/// Recovers `crashed` and checks that each file holds at least the bytes its returned
/// fsyncs made durable (`returned`), that `e2fsck -fn` is clean and that the private bit
/// is gone after unmount; returns how many i-transactions recovery replayed.
fn check_recovered(
    scratch: &Scratch,
    crashed: &Arc<SimDevice>,
    returned: &[usize],
    opts: &MountOptions,
) -> u32 {
    let (fs, report) = Fs::open_with_report(crashed.clone(), opts.clone()).unwrap();
    for (k, &len) in returned.iter().enumerate() {
        let Ok(file) = fs.open_file(&path(k)) else {
            assert_eq!(len, 0, "f{k} is gone, {len} bytes were fsync'd");
            continue;
        };
        let size = file.stat().unwrap().size as usize;
        assert!(size >= len, "f{k}: {size} bytes, {len} were fsync'd");
        assert!(
            file.read_at(0, size).unwrap() == bytes(k, 0, size),
            "f{k}: wrong bytes"
        );
    }
    fs.unmount().unwrap();
    let after = scratch.path("after.img");
    crashed.write_durable_image(&after).unwrap();
    assert_e2fsck_clean(&after);
    let dump = journal_dump(crashed);
    assert!(
        !dump.contains("jext_percore"),
        "cleared at unmount:\n{dump}"
    );
    report.recovery.fast_commits.fast_commits
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Linux must refuse a journal whose rings may hold live i-transactions (it would
/// misread them as fast commits or ignore them), and take the image again once jext
/// recovered it and the bit is gone.
#[test]
fn linux_refuses_the_journal_while_the_bit_is_set() {
    if !is_root() {
        eprintln!("SKIPPED: loop-mounting the crashed image with Linux needs root");
        return;
    }
    let scratch = Scratch::new("percore-linux");
    let dev = fresh_device(None);
    let fs = Fs::open(dev.clone(), percore()).unwrap();
    fs.create_file("/kept", 0o644).unwrap();
    fs.sync().unwrap();
    let file = fs.open_file("/kept").unwrap();
    file.write_at(0, &bytes(1, 0, 10_000)).unwrap();
    file.fsync().unwrap();
    assert_eq!(fs.fast_commit_stats().fast_commits, 1);
    let crashed = Arc::new(dev.crash());
    drop(file);
    std::mem::forget(fs);

    let image = scratch.path("crashed.img");
    crashed.write_durable_image(&image).unwrap();
    let dir = scratch.path("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new("mount")
        .args(["-t", "ext4", "-o", "loop"])
        .args([&image, &dir])
        .output()
        .unwrap();
    if out.status.success() {
        let _ = Command::new("umount").arg(&dir).status();
        panic!("Linux mounted a journal with live per-core i-transactions");
    }

    let fs = Fs::open(crashed.clone(), MountOptions::default()).unwrap();
    assert_eq!(
        fs.open_file("/kept").unwrap().read_at(0, 20_000).unwrap(),
        bytes(1, 0, 10_000)
    );
    fs.unmount().unwrap();
    crashed.write_durable_image(&image).unwrap();
    let linux = LoopMount::new(&image, &dir, "");
    assert_eq!(
        std::fs::read(linux.path("kept")).unwrap(),
        bytes(1, 0, 10_000)
    );
    linux.unmount();
    assert_e2fsck_clean(&image);
}

/// An i-transaction carries at most 16 data blocks: an fsync with more journaled in the
/// running transaction commits in full, and the next small one is an i-transaction again.
#[test]
fn a_sync_with_too_much_journaled_data_commits_in_full() {
    let dev = fresh_device(None);
    let opts = MountOptions {
        data_mode: DataMode::Journal,
        ..percore()
    };
    let fs = Fs::open(dev.clone(), opts.clone()).unwrap();
    let file = fs.create_file("/big", 0o644).unwrap();
    fs.sync().unwrap();
    file.write_at(0, &bytes(3, 0, 20 * CHUNK)).unwrap();
    file.fsync().unwrap();
    let stats = fs.fast_commit_stats();
    assert_eq!(stats.fallbacks.get("too_much_data"), Some(&1), "{stats:?}");
    assert_eq!(stats.carried_blocks, 0);
    file.write_at((20 * CHUNK) as u64, &bytes(3, 20 * CHUNK, 100))
        .unwrap();
    file.fsync().unwrap();
    let stats = fs.fast_commit_stats();
    assert_eq!(
        (stats.fast_commits, stats.carried_blocks),
        (1, 1),
        "{stats:?}"
    );
    let crashed = Arc::new(dev.crash());
    drop(file);
    std::mem::forget(fs);
    let fs = Fs::open(crashed, opts).unwrap();
    let len = 20 * CHUNK + 100;
    let read = fs.open_file("/big").unwrap().read_at(0, len + 10).unwrap();
    assert!(read == bytes(3, 0, len), "{} bytes back", read.len());
}

/// Two threads each appending and syncing their own file share the device's flushes:
/// a ring writer waits a moment for the other fsync under way to come to its flush
/// (`group_flush`). Without the wait they take turns, one flush per fsync. On a device
/// whose flush takes 8 ms, as a plain SSD's takes milliseconds, so that the other
/// thread's append and ring write fit easily in the wait.
#[test]
fn two_threads_syncing_in_rings_share_their_flushes() {
    const SYNCS_PER_THREAD: usize = 24;
    let dev = fresh_device(Some(LatencyModel {
        dispatch_ns: 2_000,
        transfer_ns_per_kib: 2_500,
        command_ns: 50_000,
        flush_ns: 8_000_000,
        barrier_ns: 0,
        queue_depth: 32,
    }));
    let opts = MountOptions {
        small_syncs: SmallSyncs::Journal,
        ..percore()
    };
    let fs = Arc::new(Fs::open(dev, opts).unwrap());
    let files: Vec<_> = (0..2)
        .map(|k| fs.create_file(&path(k), 0o644).unwrap())
        .collect();
    fs.sync().unwrap();
    let before = fs.counters();
    std::thread::scope(|scope| {
        for (k, file) in files.iter().enumerate() {
            scope.spawn(move || {
                for i in 0..SYNCS_PER_THREAD {
                    let at = i * CHUNK;
                    file.write_at(at as u64, &bytes(k, at, CHUNK)).unwrap();
                    file.fsync().unwrap();
                }
            });
        }
    });
    let flushes = fs.counters().flushes - before.flushes;
    let stats = fs.fast_commit_stats();
    assert_eq!(
        stats.carried_blocks,
        2 * SYNCS_PER_THREAD as u64,
        "{stats:?}"
    );
    let per_fsync = flushes as f64 / (2 * SYNCS_PER_THREAD) as f64;
    assert!(
        per_fsync <= 0.8,
        "{flushes} flushes for {} fsyncs: the rings' writers did not share them",
        2 * SYNCS_PER_THREAD
    );
}
