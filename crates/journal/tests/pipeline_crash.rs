//! Dual-mode journaling at every crash point: several threads change blocks and fsync
//! (or fbarrier) at once, so transactions commit while earlier ones are still committing,
//! the log wraps and the background checkpoint runs. The device's requests are captured;
//! at every point of the capture, with several subsets of the cached writes kept (each
//! prefix in issue order, each prefix followed by a torn write, all, none, random ones;
//! on a barrier-capable device only those that keep its epochs), recovery must yield exactly the state after a prefix of the
//! transactions, and that prefix must include every transaction reported durable before
//! the crash. A journal without flushes (`barrier: false`, ext4 `nobarrier`) must fail the
//! same check: proof that it can fail.

use jext_device::{BlockDevice, CrashCapture, LoggedOp, Selection, SimDevice};
use jext_io::IoQueue;
use jext_journal::format::JournalSuperblock;
use jext_journal::{
    recover, tid_geq, JBuf, Journal, JournalArea, JournalConfig, JournalStats, LogFeatures, Tid,
};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

const BS: u32 = 1024;
const JOURNAL_START: u64 = 16;
const JOURNAL_BLOCKS: u32 = 1024;
const DEVICE_BYTES: u64 = 2 << 20;
/// Home blocks of the threads' own buffers start here (after the journal).
const OWN_BASE: u64 = 1100;
const THREADS: u64 = 3;
const ROUNDS: u32 = 12;
const SHARED_BLOCK: u64 = 1200;

/// Every change in the order it was made: (tid, block, value written over the block).
type History = Vec<(Tid, u64, u32)>;

fn fresh_device(barrier_device: bool) -> Arc<SimDevice> {
    fresh_timed_device(barrier_device, false)
}

/// A device; `timed`: commands take time as on UFS (a flush costs half a millisecond),
/// so commits overlap and flush rounds group and share flushes as on real disks.
fn fresh_timed_device(barrier_device: bool, timed: bool) -> Arc<SimDevice> {
    let dev = SimDevice::new(DEVICE_BYTES);
    let dev = if barrier_device {
        dev.with_barrier_write()
    } else {
        dev
    };
    // After the barrier mode: the timeline shares the device.
    let dev = if timed {
        dev.with_latency(jext_device::Preset::Ufs.model())
    } else {
        dev
    };
    let sb = JournalSuperblock::new(BS, JOURNAL_BLOCKS, [0x42; 16]);
    let mut block = vec![0u8; BS as usize];
    block[..1024].copy_from_slice(&sb.encode());
    dev.write_at(JOURNAL_START * u64::from(BS), &block, false)
        .unwrap();
    dev.flush().unwrap();
    Arc::new(dev)
}

fn area() -> JournalArea {
    JournalArea::contiguous(BS, JOURNAL_START, JOURNAL_BLOCKS)
}

fn fill(value: u32) -> impl FnOnce(&mut [u8]) {
    move |b: &mut [u8]| {
        for chunk in b.chunks_mut(4) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
    }
}

/// Runs the concurrent workload with capture on; returns the capture and the history.
fn run_workload(
    barrier_device: bool,
    timed: bool,
    barrier: bool,
    seed: u64,
) -> (CrashCapture, History, JournalStats) {
    let dev = fresh_timed_device(barrier_device, timed);
    let io = Arc::new(IoQueue::new(dev.clone()));
    let config = JournalConfig {
        commit_interval_ms: 3_600_000,
        barrier,
        features: LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: false,
        },
        ..JournalConfig::default()
    };
    dev.start_capture();
    let journal = Journal::load(io, area(), config).unwrap();
    let history = Mutex::new(History::new());
    let shared = Arc::new(JBuf::zeroed(SHARED_BLOCK, BS as usize));
    let counter = Mutex::new(1u32);
    std::thread::scope(|s| {
        for thread in 0..THREADS {
            let (journal, history, shared, counter, dev) =
                (&journal, &history, &shared, &counter, &dev);
            s.spawn(move || {
                let own = Arc::new(JBuf::zeroed(OWN_BASE + thread, BS as usize));
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 31 + thread);
                for _ in 0..ROUNDS {
                    let tid = {
                        // One handle at a time, so the history is in the order the
                        // changes were made (tids never go down along it).
                        let mut history = history.lock();
                        let mut h = journal.start(4).unwrap();
                        let mut next = counter.lock();
                        for buf in [&own, shared] {
                            if buf.block() == SHARED_BLOCK && rng.gen_bool(0.5) {
                                continue;
                            }
                            h.modify(buf, fill(*next)).unwrap();
                            history.push((h.tid(), buf.block(), *next));
                            *next += 1;
                        }
                        let tid = h.tid();
                        h.stop();
                        tid
                    };
                    match rng.gen_range(0..5) {
                        0 => {
                            journal.commit_and_wait(tid).unwrap();
                            dev.mark(format!("durable {tid}"));
                        }
                        // An fsync: alone, it commits on its own thread, beside the
                        // threads' commits and rounds.
                        1 => {
                            let _fsync = journal.fsync_under_way();
                            journal.fsync_commit(tid).unwrap();
                            dev.mark(format!("durable {tid}"));
                        }
                        2 => journal.commit_and_wait_dispatched(tid).unwrap(),
                        // A checkpoint while other transactions commit (it commits
                        // everything first, so it is an fsync too).
                        3 => {
                            journal.checkpoint().unwrap();
                            dev.mark(format!("durable {tid}"));
                        }
                        _ => {}
                    }
                }
            });
        }
    });
    let last = journal.commit_all().unwrap();
    dev.mark(format!("durable {last}"));
    let stats = journal.stats();
    drop(journal);
    (dev.take_capture().unwrap(), history.into_inner(), stats)
}

/// The blocks' values after every transaction up to `upto` (all tids if `None`...).
fn expected_after(history: &History, upto: Option<Tid>) -> BTreeMap<u64, u32> {
    let mut state: BTreeMap<u64, u32> = (0..THREADS)
        .map(|t| (OWN_BASE + t, 0))
        .chain([(SHARED_BLOCK, 0)])
        .collect();
    if let Some(upto) = upto {
        for &(tid, block, value) in history {
            if tid_geq(upto, tid) {
                state.insert(block, value);
            }
        }
    }
    state
}

fn read_state(dev: &Arc<SimDevice>) -> Option<BTreeMap<u64, u32>> {
    let mut state = BTreeMap::new();
    for block in (0..THREADS).map(|t| OWN_BASE + t).chain([SHARED_BLOCK]) {
        let mut buf = vec![0u8; BS as usize];
        dev.read_at(block * u64::from(BS), &mut buf).unwrap();
        let value = u32::from_le_bytes(buf[..4].try_into().unwrap());
        if buf.chunks(4).any(|c| c != value.to_le_bytes()) {
            return None; // a torn or mixed block: no prefix state looks like it
        }
        state.insert(block, value);
    }
    Some(state)
}

/// Selections to try at one crash point: none, all, each prefix in issue order, and
/// random subsets; on a barrier-capable device only those that keep its epochs.
fn selections(
    capture: &CrashCapture,
    upto: usize,
    barrier_device: bool,
    rng: &mut impl Rng,
) -> Vec<Selection> {
    let window = capture.window(upto);
    let len = window.len();
    let mut out: Vec<Selection> = (0..=len)
        .map(|n| {
            Selection(
                (0..len)
                    .map(|i| {
                        if i < n {
                            jext_device::Kept::Whole
                        } else {
                            jext_device::Kept::Nothing
                        }
                    })
                    .collect(),
            )
        })
        .collect();
    // Each prefix again with the next write torn: only its first sector reached the disk.
    for (n, write) in window.iter().enumerate() {
        let sectors = write.sectors();
        if sectors < 2 {
            continue;
        }
        let torn = Selection(
            (0..len)
                .map(|i| match i.cmp(&n) {
                    std::cmp::Ordering::Less => jext_device::Kept::Whole,
                    std::cmp::Ordering::Equal => {
                        jext_device::Kept::Sectors((0..sectors).map(|s| s == 0).collect())
                    }
                    std::cmp::Ordering::Greater => jext_device::Kept::Nothing,
                })
                .collect(),
        );
        out.push(torn);
    }
    for _ in 0..4 {
        let kept = Selection(
            (0..len)
                .map(|_| {
                    if rng.gen_bool(0.5) {
                        jext_device::Kept::Whole
                    } else {
                        jext_device::Kept::Nothing
                    }
                })
                .collect(),
        );
        out.push(kept);
    }
    if barrier_device {
        out.retain(|s| s.respects_epochs(&window));
    }
    out
}

/// Every crash state of the capture; returns the failures found (empty: all good) and
/// how many states were checked.
fn explore(
    capture: &CrashCapture,
    history: &History,
    barrier_device: bool,
    seed: u64,
) -> (Vec<String>, usize) {
    let mut tids: Vec<Tid> = history.iter().map(|(t, _, _)| *t).collect();
    tids.dedup();
    let prefixes: Vec<(Option<Tid>, BTreeMap<u64, u32>)> = std::iter::once(None)
        .chain(tids.iter().map(|t| Some(*t)))
        .map(|t| (t, expected_after(history, t)))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cursor = capture.cursor();
    let mut failures = Vec::new();
    let mut states = 0;
    let mut durable: Option<Tid> = None;
    for upto in 0..=capture.ops().len() {
        if let Some(LoggedOp::Mark(label)) = upto.checked_sub(1).map(|i| &capture.ops()[i]) {
            if let Some(tid) = label.strip_prefix("durable ") {
                let tid: Tid = tid.parse().unwrap();
                if durable.is_none_or(|d| tid_geq(tid, d)) {
                    durable = Some(tid);
                }
            }
        }
        for selection in selections(capture, upto, barrier_device, &mut rng) {
            states += 1;
            let dev = Arc::new(cursor.state(upto, &selection));
            let io = IoQueue::new(dev.clone());
            if let Err(e) = recover(&io, std::slice::from_ref(&area())) {
                failures.push(format!("crash at {upto} keeping {selection}: {e}"));
                continue;
            }
            let got = read_state(&dev);
            let prefix = prefixes
                .iter()
                .rposition(|(_, expected)| Some(expected) == got.as_ref());
            let Some(prefix) = prefix else {
                failures.push(format!(
                    "crash at {upto} keeping {selection}: {got:?} is no prefix of the transactions"
                ));
                continue;
            };
            let recovered = prefixes[prefix].0;
            if let Some(d) = durable {
                if recovered.is_none_or(|r| !tid_geq(r, d)) {
                    failures.push(format!(
                        "crash at {upto} keeping {selection}: tid {d} was reported durable, recovery stopped at {recovered:?}"
                    ));
                }
            }
        }
    }
    (failures, states)
}

fn check(barrier_device: bool, timed: bool, seeds: u64) {
    for seed in 0..seeds {
        let (capture, history, stats) = run_workload(barrier_device, timed, true, seed);
        let (failures, states) = explore(&capture, &history, barrier_device, seed);
        assert!(
            failures.is_empty(),
            "seed {seed}, barrier device {barrier_device}: {} of {states} crash states fail, first: {}",
            failures.len(),
            failures[0]
        );
        assert!(states > 100, "only {states} crash states explored");
        eprintln!(
            "seed {seed}, barrier device {barrier_device}, timed {timed}: {states} crash states over {} requests, all a durable prefix; {} commits, {} flush rounds, at most {} committing at once",
            capture.ops().len(),
            stats.commits,
            stats.durability_rounds,
            stats.max_committing
        );
    }
}

#[test]
fn pipelined_commits_recover_a_prefix_with_every_durable_tid_on_a_plain_device() {
    check(false, false, 8);
}

#[test]
fn overlapping_commits_on_a_timed_plain_device_recover_a_durable_prefix() {
    check(false, true, 3);
}

#[test]
fn overlapping_commits_on_a_timed_barrier_device_recover_a_durable_prefix() {
    check(true, true, 3);
}

#[test]
fn pipelined_commits_recover_a_prefix_with_every_durable_tid_on_a_barrier_device() {
    check(true, false, 8);
}

#[test]
fn the_check_fails_a_journal_that_never_flushes() {
    let mut found = 0;
    for seed in 0..3 {
        let (capture, history, _) = run_workload(false, false, false, seed);
        let (failures, states) = explore(&capture, &history, false, seed);
        eprintln!(
            "nobarrier, seed {seed}: {} of {states} crash states fail",
            failures.len()
        );
        found += failures.len();
    }
    assert!(
        found > 0,
        "nobarrier passed every crash state: the check cannot fail"
    );
}

#[test]
fn commits_overlap_and_group_into_fewer_flush_rounds() {
    // Not a timing test: counts what the journal did for many concurrent fsyncs.
    let dev = fresh_device(false);
    let io = Arc::new(IoQueue::new(dev.clone()));
    let journal = Journal::load(io, area(), JournalConfig::default()).unwrap();
    let fsyncs = Mutex::new(0u64);
    std::thread::scope(|s| {
        for thread in 0..4u64 {
            let (journal, fsyncs) = (&journal, &fsyncs);
            s.spawn(move || {
                let own = Arc::new(JBuf::zeroed(OWN_BASE + thread, BS as usize));
                for round in 0..30u32 {
                    let mut h = journal.start(2).unwrap();
                    h.modify(&own, fill(round)).unwrap();
                    let tid = h.tid();
                    h.stop();
                    journal.commit_and_wait(tid).unwrap();
                    *fsyncs.lock() += 1;
                }
            });
        }
    });
    let stats = journal.stats();
    let fsyncs = *fsyncs.lock();
    assert!(stats.commits <= fsyncs, "{stats:?}");
    assert!(
        stats.durability_rounds <= stats.commits,
        "a round covers at least one commit: {stats:?}"
    );
    let flushes = dev.counters().snapshot().flushes;
    eprintln!("{fsyncs} fsyncs: {stats:?}, {flushes} device flushes");
}

#[test]
fn stopping_handles_does_not_wake_the_commit_thread() {
    let dev = fresh_device(false);
    let io = Arc::new(IoQueue::new(dev.clone()));
    let journal = Journal::load(io, area(), JournalConfig::default()).unwrap();
    let buf = Arc::new(JBuf::zeroed(OWN_BASE, BS as usize));
    let before = journal.stats().commit_thread_wakeups;
    for round in 0..2000u32 {
        let mut h = journal.start(1).unwrap();
        h.modify(&buf, fill(round)).unwrap();
        h.stop();
    }
    let woke = journal.stats().commit_thread_wakeups - before;
    assert!(
        woke <= 2,
        "2000 handle stops woke the commit thread {woke} times"
    );
    // A commit someone waits for is still made.
    journal.commit_all().unwrap();
    assert_eq!(journal.stats().commits, 1);
}

#[test]
fn a_lone_fsync_commits_on_its_own_thread() {
    for barrier_device in [false, true] {
        let dev = fresh_device(barrier_device);
        let io = Arc::new(IoQueue::new(dev.clone()));
        let journal = Journal::load(io, area(), JournalConfig::default()).unwrap();
        let buf = Arc::new(JBuf::zeroed(OWN_BASE, BS as usize));
        let before = journal.stats();
        for round in 0..20u32 {
            let mut h = journal.start(1).unwrap();
            h.modify(&buf, fill(round)).unwrap();
            let tid = h.tid();
            h.stop();
            let _fsync = journal.fsync_under_way();
            journal.fsync_commit(tid).unwrap();
            assert!(tid_geq(journal.committed_tid(), tid));
        }
        let stats = journal.stats();
        assert_eq!(stats.commits - before.commits, 20);
        assert_eq!(stats.inline_commits - before.inline_commits, 20);
        // Neither thread was needed: the commit thread's own wake-ups are its timer's.
        assert!(
            stats.commit_thread_wakeups - before.commit_thread_wakeups <= 2,
            "{stats:?}"
        );
        // A crash now keeps every fsync'd change.
        let crashed = Arc::new(dev.crash());
        drop(journal);
        let io = IoQueue::new(crashed.clone());
        recover(&io, std::slice::from_ref(&area())).unwrap();
        let state = read_state(&crashed).expect("no torn block after recovery");
        assert_eq!(state[&OWN_BASE], 19, "barrier device: {barrier_device}");
    }
}

#[test]
fn on_a_barrier_device_a_commit_costs_one_flush_and_no_fua() {
    let dev = fresh_device(true);
    let io = Arc::new(IoQueue::new(dev.clone()));
    assert!(
        io.barrier_mode(),
        "the simulator with a barrier write keeps epochs"
    );
    let journal = Journal::load(io, area(), JournalConfig::default()).unwrap();
    let buf = Arc::new(JBuf::zeroed(OWN_BASE, BS as usize));
    let mut h = journal.start(1).unwrap();
    h.modify(&buf, fill(1)).unwrap();
    h.stop();
    journal.commit_all().unwrap(); // the first commit also points the superblock at the log
    let before = dev.counters().snapshot();
    let mut h = journal.start(1).unwrap();
    h.modify(&buf, fill(2)).unwrap();
    let tid = h.tid();
    h.stop();
    journal.commit_and_wait_dispatched(tid).unwrap();
    assert_eq!(journal.dispatched_tid(), tid);
    journal.commit_and_wait(tid).unwrap();
    let delta = dev.counters().snapshot() - before;
    assert_eq!((delta.flushes, delta.fua_writes), (1, 0), "{delta:?}");
}

#[test]
fn the_checkpoint_runs_beside_the_commits_as_the_log_wraps() {
    let dev = fresh_device(false);
    let io = Arc::new(IoQueue::new(dev.clone()));
    let journal = Journal::load(io, area(), JournalConfig::default()).unwrap();
    let bufs: Vec<_> = (0..40)
        .map(|i| Arc::new(JBuf::zeroed(OWN_BASE + i, BS as usize)))
        .collect();
    // 100 fsync'd transactions of 40 blocks: four times what the 1024-block log holds.
    for round in 0..100u32 {
        let mut h = journal.start(40).unwrap();
        for buf in &bufs {
            h.modify(buf, fill(round)).unwrap();
        }
        let tid = h.tid();
        h.stop();
        journal.commit_and_wait(tid).unwrap();
    }
    let stats = journal.stats();
    assert!(stats.checkpoints >= 3, "{stats:?}");
    // Writers reserve log room when they start (and wait there if the checkpoint lags,
    // which a loaded machine can make happen), so the commit thread never waits for it.
    assert_eq!(
        stats.commit_room_waits, 0,
        "the commit thread waited for log room: {stats:?}"
    );
    journal.shutdown().unwrap();
    for i in 0..40 {
        let mut buf = vec![0u8; BS as usize];
        dev.crash()
            .read_at((OWN_BASE + i) * u64::from(BS), &mut buf)
            .unwrap();
        assert!(buf.chunks(4).all(|c| c == 99u32.to_le_bytes()), "block {i}");
    }
}
