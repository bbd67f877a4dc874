//! Byte-granular journal records at every crash point. A workload changes a few bytes of
//! blocks at a time, so most logged blocks go as byte records (DELTA on the version an
//! earlier transaction logged, DELTA on the home block for a block "read from home" that
//! the log holds nothing of — first change, or first since its checkpoint — or ZEROED
//! for blocks "newly allocated" over garbage), while
//! commits overlap (fbarrier waits only for dispatch), the small log wraps, the background
//! checkpoint writes versions home under deltas that still replay, and blocks are revoked
//! and reused. At every point of the captured requests, every state is tried: no cached
//! write kept, each prefix in issue order, and each prefix followed by the next write cut
//! after every sector and torn at every sector (every sector but one kept) — the one write
//! of a single-I/O commit included. Recovery must yield exactly the state after a prefix
//! of the transactions that includes every transaction reported durable, byte for byte.
//! The same check fails a journal that never flushes: proof that it can fail.

use jext_device::{BlockDevice, CrashCapture, Kept, LoggedOp, Selection, SimDevice};
use jext_io::IoQueue;
use jext_journal::format::JournalSuperblock;
use jext_journal::{
    recover, tid_geq, CommitMode, JBuf, Journal, JournalArea, JournalConfig, JournalStats,
    LogFeatures, RecordMode, Tid,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

const BS: usize = 1024;
const JOURNAL_START: u64 = 4;
/// The smallest journal; large filler transactions make the log wrap.
const JOURNAL_BLOCKS: u32 = 1024;
const HOME_FIRST: u64 = 1100;
/// Blocks with contents at home when the workload starts.
const OLD_BLOCKS: u64 = 5;
/// Blocks whose home holds garbage: "newly allocated", they start as zeros in memory.
const NEW_BLOCKS: u64 = 3;
/// Whole-block changes that fill the log (not checked: plain copies, tested elsewhere).
const FILLER_FIRST: u64 = 1200;
const FILLER_BLOCKS: u64 = 100;
const DEVICE_BYTES: u64 = 1320 * BS as u64;
const ROUNDS: usize = 80;
/// Writes up to this many sectors are cut and torn at every sector (a records commit of
/// this workload is a few blocks: all of it).
const EVERY_SECTOR_UP_TO: usize = 32;

/// What a block must read as after each tid: `None` once revoked (freed: anything goes).
type Snapshots = Vec<(Tid, u64, Option<Vec<u8>>)>;

/// Each block's expected contents (`None`: freed, anything goes).
type BlockStates = BTreeMap<u64, Option<Vec<u8>>>;

fn home_pattern(block: u64) -> Vec<u8> {
    (0..BS).map(|i| (i as u64 * 31 + block) as u8).collect()
}

fn blocks() -> impl Iterator<Item = u64> {
    HOME_FIRST..HOME_FIRST + OLD_BLOCKS + NEW_BLOCKS
}

fn is_new(block: u64) -> bool {
    block >= HOME_FIRST + OLD_BLOCKS
}

fn fresh_device() -> Arc<SimDevice> {
    let dev = SimDevice::new(DEVICE_BYTES);
    let sb = JournalSuperblock::new(BS as u32, JOURNAL_BLOCKS, [0x42; 16]);
    dev.write_at(JOURNAL_START * BS as u64, &sb.encode(), false)
        .unwrap();
    for block in blocks() {
        let initial = if is_new(block) {
            vec![0xEE; BS]
        } else {
            home_pattern(block)
        };
        dev.write_at(block * BS as u64, &initial, false).unwrap();
    }
    dev.flush().unwrap();
    Arc::new(dev)
}

fn area() -> JournalArea {
    JournalArea::contiguous(BS as u32, JOURNAL_START, JOURNAL_BLOCKS)
}

struct Run {
    capture: CrashCapture,
    snapshots: Snapshots,
    stats: JournalStats,
}

/// Runs the workload with capture on.
fn run_workload(commit_mode: CommitMode, barrier: bool, seed: u64) -> Run {
    let dev = fresh_device();
    let io = Arc::new(IoQueue::new(dev.clone()));
    let config = JournalConfig {
        commit_interval_ms: 3_600_000,
        barrier,
        features: LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: false,
        },
        commit_mode,
        record_mode: RecordMode::Bytes,
        ..JournalConfig::default()
    };
    dev.start_capture();
    let journal = Journal::load(io, area(), config).unwrap();
    let mut bufs: BTreeMap<u64, Arc<JBuf>> = blocks()
        .map(|b| {
            let buf = match is_new(b) {
                true => JBuf::new(b, Arc::from(vec![0u8; BS])),
                // Read from home: a first change may rest on the home block.
                false => JBuf::from_home(b, Arc::from(home_pattern(b))),
            };
            (b, Arc::new(buf))
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut snapshots = Snapshots::new();
    let fillers: Vec<Arc<JBuf>> = (0..FILLER_BLOCKS)
        .map(|i| Arc::new(JBuf::zeroed(FILLER_FIRST + i, BS)))
        .collect();
    for round in 0..ROUNDS {
        if round % 8 == 7 {
            let mut h = journal.start(FILLER_BLOCKS as u32).unwrap();
            for buf in &fillers {
                h.modify(buf, |b| b.fill(round as u8 + 1)).unwrap();
            }
        }
        let mut h = journal.start(4).unwrap();
        let tid = h.tid();
        let changes = rng.gen_range(1..=3);
        for change in 0..changes {
            let block = HOME_FIRST + rng.gen_range(0..OLD_BLOCKS + NEW_BLOCKS);
            // Never a revoke last: a transaction of revokes of blocks no longer in the log
            // is empty, and its tid is handed out again (the durable mark would lie).
            if change + 1 < changes && rng.gen_range(0..6) == 0 {
                // Freed: then reused as a new block, zeros in memory over what is home.
                h.revoke(block).unwrap();
                snapshots.push((tid, block, None));
                bufs.insert(block, Arc::new(JBuf::zeroed(block, BS)));
                continue;
            }
            let buf = &bufs[&block];
            // A few bytes here and there (an inode's times, a bitmap bit, a small write),
            // sometimes a large change that goes whole.
            let after = h
                .modify(buf, |b| {
                    let spans = if rng.gen_range(0..8) == 0 { 40 } else { 2 };
                    for _ in 0..spans {
                        let at = rng.gen_range(0..BS - 24);
                        let len = rng.gen_range(1..24);
                        for byte in &mut b[at..at + len] {
                            *byte = rng.gen();
                        }
                    }
                    b.to_vec()
                })
                .unwrap();
            snapshots.push((tid, block, Some(after)));
        }
        h.stop();
        match rng.gen_range(0..6) {
            0 | 1 => {
                journal.commit_and_wait(tid).unwrap();
                dev.mark(format!("durable {tid}"));
            }
            2 | 3 => journal.commit_and_wait_dispatched(tid).unwrap(),
            4 if round % 3 == 0 => {
                journal.checkpoint().unwrap();
                dev.mark(format!("durable {tid}"));
            }
            _ => {}
        }
    }
    let last = journal.commit_all().unwrap();
    dev.mark(format!("durable {last}"));
    let stats = journal.stats();
    drop(journal);
    Run {
        capture: dev.take_capture().unwrap(),
        snapshots,
        stats,
    }
}

/// What each block must read as after every transaction up to `upto` (`None`: before
/// the first), `None` for a block freed by then.
fn expected_after(snapshots: &Snapshots, upto: Option<Tid>) -> BlockStates {
    let mut state: BlockStates = blocks()
        .map(|b| {
            let initial = if is_new(b) {
                vec![0xEE; BS]
            } else {
                home_pattern(b)
            };
            (b, Some(initial))
        })
        .collect();
    if let Some(upto) = upto {
        for (tid, block, after) in snapshots {
            if tid_geq(upto, *tid) {
                state.insert(*block, after.clone());
            }
        }
    }
    state
}

fn matches(dev: &SimDevice, expected: &BlockStates) -> bool {
    expected.iter().all(|(&block, want)| {
        let Some(want) = want else { return true };
        let mut got = vec![0u8; BS];
        dev.read_at(block * BS as u64, &mut got).unwrap();
        &got == want
    })
}

/// The states at one crash point: none kept, each prefix of the window whole, a few
/// random subsets (the device may persist unflushed writes in any order), and the newest
/// write — at the one point where it is newest, which covers every later point where it
/// is kept torn and what followed it lost — cut after every sector and torn at every
/// sector. Writes longer than [`EVERY_SECTOR_UP_TO`] sectors (the filler transactions)
/// are cut and torn at every sector of a stride that keeps them to about that many.
fn selections(window_len: usize, sectors: &[usize], rng: &mut impl Rng) -> Vec<Selection> {
    let prefix = |n: usize, next: Kept| {
        Selection(
            (0..window_len)
                .map(|i| match i.cmp(&n) {
                    std::cmp::Ordering::Less => Kept::Whole,
                    std::cmp::Ordering::Equal => next.clone(),
                    std::cmp::Ordering::Greater => Kept::Nothing,
                })
                .collect(),
        )
    };
    let mut out = vec![Selection::nothing(window_len)];
    out.extend((0..window_len).map(|n| prefix(n, Kept::Whole)));
    for _ in 0..4 {
        let kept = (0..window_len)
            .map(|_| {
                if rng.gen_bool(0.5) {
                    Kept::Whole
                } else {
                    Kept::Nothing
                }
            })
            .collect();
        out.push(Selection(kept));
    }
    if let Some(newest) = window_len.checked_sub(1) {
        let s = sectors[newest];
        let stride = s.div_ceil(EVERY_SECTOR_UP_TO).max(1);
        for at in (1..s).step_by(stride) {
            out.push(prefix(
                newest,
                Kept::Sectors((0..s).map(|i| i < at).collect()),
            ));
            out.push(prefix(
                newest,
                Kept::Sectors((0..s).map(|i| i != at).collect()),
            ));
        }
        if s > 1 {
            out.push(prefix(
                newest,
                Kept::Sectors((0..s).map(|i| i != 0).collect()),
            ));
        }
    }
    out
}

struct Explored {
    failures: Vec<String>,
    states: usize,
    records_replayed: usize,
}

/// Explores every crash point; stops at the first failure when `first_failure`.
fn explore(run: &Run, seed: u64, first_failure: bool) -> Explored {
    let mut tids: Vec<Tid> = run.snapshots.iter().map(|(t, _, _)| *t).collect();
    tids.dedup();
    let prefixes: Vec<(Option<Tid>, BlockStates)> = std::iter::once(None)
        .chain(tids.iter().map(|t| Some(*t)))
        .map(|t| (t, expected_after(&run.snapshots, t)))
        .collect();
    let capture = &run.capture;
    let mut cursor = capture.cursor();
    let mut out = Explored {
        failures: Vec::new(),
        states: 0,
        records_replayed: 0,
    };
    let mut durable: Option<Tid> = None;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed);
    for upto in 0..=capture.ops().len() {
        if first_failure && !out.failures.is_empty() {
            break;
        }
        if let Some(LoggedOp::Mark(label)) = upto.checked_sub(1).map(|i| &capture.ops()[i]) {
            if let Some(tid) = label.strip_prefix("durable ") {
                let tid: Tid = tid.parse().unwrap();
                if durable.is_none_or(|d| tid_geq(tid, d)) {
                    durable = Some(tid);
                }
            }
        }
        let window = capture.window(upto);
        let sectors: Vec<usize> = window.iter().map(|w| w.sectors()).collect();
        for selection in selections(window.len(), &sectors, &mut rng) {
            out.states += 1;
            let dev = Arc::new(cursor.state(upto, &selection));
            let io = IoQueue::new(dev.clone());
            let scanned = jext_journal::scan(&io, &area()).map(|s| {
                let tids: Vec<Tid> = s.transactions.iter().map(|t| t.tid).collect();
                format!(
                    "scan from {} finds {tids:?}, ends: {}",
                    s.superblock.start(),
                    s.end_reason
                )
            });
            match recover(&io, std::slice::from_ref(&area())) {
                Ok(report) => out.records_replayed += report.records_replayed,
                Err(e) => {
                    out.failures
                        .push(format!("crash at {upto} keeping {selection}: {e}"));
                    continue;
                }
            }
            // The newest prefix the device matches (an older one can match too when a
            // transaction changed nothing that is checked).
            let Some(prefix) = prefixes.iter().rposition(|(_, want)| matches(&dev, want)) else {
                out.failures.push(format!(
                    "crash at {upto} keeping {selection}: the blocks match no prefix of the \
                     transactions"
                ));
                continue;
            };
            let recovered = prefixes[prefix].0;
            if let Some(d) = durable {
                if recovered.is_none_or(|r| !tid_geq(r, d)) {
                    let want = expected_after(&run.snapshots, Some(d));
                    let differ: Vec<String> = want
                        .iter()
                        .filter_map(|(&block, want)| {
                            let want = want.as_ref()?;
                            let mut got = vec![0u8; BS];
                            dev.read_at(block * BS as u64, &mut got).unwrap();
                            let bytes = got.iter().zip(want).filter(|(a, b)| a != b).count();
                            let history: Vec<String> = run
                                .snapshots
                                .iter()
                                .filter(|(_, b, _)| *b == block)
                                .map(|(t, _, s)| {
                                    format!("{t}{}", if s.is_none() { "R" } else { "" })
                                })
                                .collect();
                            (bytes > 0).then(|| {
                                format!("block {block}: {bytes} bytes differ; history {history:?}")
                            })
                        })
                        .collect();
                    out.failures.push(format!(
                        "crash at {upto} keeping {selection}: tid {d} was reported durable, \
                         recovery stopped at {recovered:?}: {differ:?}; {scanned:?}"
                    ));
                }
            }
        }
    }
    out
}

fn check(commit_mode: CommitMode, seeds: u64) {
    for seed in 0..seeds {
        let run = run_workload(commit_mode, true, seed);
        let explored = explore(&run, seed, false);
        let stats = run.stats;
        assert!(
            explored.failures.is_empty(),
            "{commit_mode:?}, seed {seed}: {} of {} crash states fail, first: {}",
            explored.failures.len(),
            explored.states,
            explored.failures[0]
        );
        // What makes the check worth anything: records were written and replayed, the
        // log wrapped and the checkpoint ran.
        let fillers = (ROUNDS as u64 / 8) * FILLER_BLOCKS;
        assert!(
            stats.blocks_as_records * 2 > stats.blocks_logged - fillers,
            "most small changes should go as records: {stats:?}"
        );
        assert!(explored.records_replayed > 0, "no state replayed a record");
        assert!(stats.checkpoints >= 2, "{stats:?}");
        assert!(
            stats.records_on_home >= 2,
            "records on home blocks (first changes, and changes after a checkpoint) are \
             what the torn checkpoint writes test: {stats:?}"
        );
        eprintln!(
            "{commit_mode:?}, seed {seed}: {} crash states over {} requests, all a durable \
             prefix; {} commits, {} of {} blocks as records ({} on home), {} checkpoints, \
             {} records replayed",
            explored.states,
            run.capture.ops().len(),
            stats.commits,
            stats.blocks_as_records,
            stats.blocks_logged,
            stats.records_on_home,
            stats.checkpoints,
            explored.records_replayed
        );
    }
}

#[test]
fn single_io_commits_of_byte_records_recover_a_durable_prefix_torn_at_every_sector() {
    check(CommitMode::SingleIo, 6);
}

#[test]
fn classic_commits_of_byte_records_recover_a_durable_prefix_torn_at_every_sector() {
    check(CommitMode::Classic, 3);
}

#[test]
fn the_check_fails_a_journal_that_never_flushes() {
    let mut found = 0;
    for seed in 0..3 {
        if found > 0 {
            break;
        }
        let run = run_workload(CommitMode::SingleIo, false, seed);
        let explored = explore(&run, seed, true);
        eprintln!(
            "nobarrier, seed {seed}: {} of {} crash states fail",
            explored.failures.len(),
            explored.states
        );
        found += explored.failures.len();
    }
    assert!(
        found > 0,
        "nobarrier passed every crash state: the check cannot fail"
    );
}

/// The paper's case at the journal level: nine small writes to nine blocks of a file,
/// then a commit: the log takes a records block and a commit block, not nine copies —
/// from the first commit on for blocks read from home (their records rest on the home
/// block), from the second for blocks whose home contents are unknown.
#[test]
fn nine_small_writes_take_two_log_blocks_not_eleven() {
    for (mode, from_home, most_bytes) in [
        (RecordMode::Bytes, true, 2 * BS),
        (RecordMode::Bytes, false, 2 * BS),
        (RecordMode::Blocks, true, 11 * BS),
    ] {
        let dev = fresh_device();
        let io = Arc::new(IoQueue::new(dev.clone()));
        let config = JournalConfig {
            features: LogFeatures {
                csum_v3: true,
                wide_blocks: true,
                fast_commit: false,
            },
            record_mode: mode,
            ..JournalConfig::default()
        };
        let journal = Journal::load(io, area(), config).unwrap();
        let bufs: Vec<Arc<JBuf>> = (0..9)
            .map(|i| {
                let bytes = Arc::from(home_pattern(200 + i));
                Arc::new(match from_home {
                    true => JBuf::from_home(200 + i, bytes),
                    false => JBuf::new(200 + i, bytes),
                })
            })
            .collect();
        for round in 0..2u8 {
            let before = journal.stats().log_bytes;
            let mut h = journal.start(9).unwrap();
            for buf in &bufs {
                h.modify(buf, |b| b[100..100 + 32].fill(round + 1)).unwrap();
            }
            let tid = h.tid();
            h.stop();
            journal.commit_and_wait(tid).unwrap();
            let bytes = journal.stats().log_bytes - before;
            // The first commit of blocks whose home contents are unknown goes whole: no
            // version in the log to rest a record on.
            if round == 1 || from_home {
                assert!(
                    bytes <= most_bytes as u64,
                    "{mode:?}, from home {from_home}, commit {round}: {bytes} bytes"
                );
            } else {
                assert!(bytes >= 9 * BS as u64, "{mode:?}: {bytes} bytes");
            }
            eprintln!(
                "{mode:?}, from home {from_home}, commit {round}: nine 32-byte writes took \
                 {bytes} bytes of log"
            );
        }
        journal.shutdown().unwrap();
        let sb =
            jext_journal::recovery::read_superblock(&IoQueue::new(dev.clone()), &area()).unwrap();
        assert!(sb.is_clean());
        assert_eq!(
            sb.feature_incompat() & 0xE000_0000,
            0,
            "a clean log carries no private bit"
        );
    }
}
