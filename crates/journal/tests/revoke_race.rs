//! A revoke issued in the next transaction while the commit thread still holds the last
//! one between "taken off running" and "in the log" must cover that transaction's blocks
//! (JBD2: a committing transaction's buffers are visible to the revoke logic from the
//! moment it leaves running). The commit thread lets go of the state lock there twice:
//! to wait for log room, and to write a superblock announcing a live-log feature. Each
//! test holds the commit thread in one of them with a gated device, frees and revokes a
//! block the held transaction logs from a handle of the next transaction, commits it,
//! reuses the block with new contents written home (as the file system does once the
//! freeing transaction committed), crashes, recovers, and checks that recovery did not
//! replay the held transaction's stale copy over the new owner's contents.
//!
//! Both are deterministic: the device holds the commit thread where the test wants it
//! until the test lets it go, and every wait is on a condition, never on time.
//!
//! The same gated device holds the checkpoint for the log-room test at the end: with the
//! log full of durable transactions whose home writes wait at the door, a large handle
//! (a writer's) waits for room, and a small one (an fsync's) still starts and commits.

use jext_device::{BlockDevice, Capabilities, DeviceCounters, DeviceError, SimDevice, WriteFlags};
use jext_io::{EngineKind, IoConfig, IoQueue};
use jext_journal::format::JournalSuperblock;
use jext_journal::{
    recover, tid_geq, CommitMode, JBuf, Journal, JournalArea, JournalConfig, LogFeatures,
    RecordMode, Tid,
};
use parking_lot::{Condvar, Mutex};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u64 = 1024;
const JOURNAL_START: u64 = 16;
/// The smallest journal jext makes: log blocks 1..1024.
const JOURNAL_BLOCKS: u32 = 1024;
/// Home blocks start after the journal, so "every write from here on" is every home write.
const HOME_START: u64 = 1100;
const DEVICE_BYTES: u64 = 4 << 20;
/// The block the held transaction logs, the next one frees, and a new owner reuses
/// (between the journal, which ends at block 1040, and the fillers of the first test).
const FREED: u64 = 1050;
/// A block the next transaction logs, so that it commits something of its own.
const OTHER: u64 = 1060;
/// What the held transaction logged of `FREED`, and what its new owner wrote there.
const STALE: u8 = 0x5A;
const REUSED: u8 = 0xC3;
/// How long a wait on the journal may take before the test gives up (a watchdog, not
/// a timing: every wait ends on a condition long before on a working journal).
const WATCHDOG: Duration = Duration::from_secs(120);

/// A simulated disk that holds writes overlapping `held` at the door until let through,
/// and counts the journal's writes to `FREED`'s home (the new owner writes it on `dev`
/// directly, past this door).
struct GatedDevice {
    dev: SimDevice,
    gate: Mutex<Gate>,
    turn: Condvar,
}

#[derive(Default)]
struct Gate {
    held: Option<Range<u64>>,
    waiting: usize,
    /// The first byte of each write the journal made to `FREED`'s home, before and after
    /// the transaction revoking it was durable.
    freed_home_writes: [Vec<u8>; 2],
    revoke_durable: bool,
}

impl GatedDevice {
    fn new() -> Arc<GatedDevice> {
        let dev = SimDevice::new(DEVICE_BYTES);
        let sb = JournalSuperblock::new(BS as u32, JOURNAL_BLOCKS, [0x42; 16]);
        let mut block = vec![0u8; BS as usize];
        block[..1024].copy_from_slice(&sb.encode());
        dev.write_at(JOURNAL_START * BS, &block, false).unwrap();
        dev.flush().unwrap();
        Arc::new(GatedDevice {
            dev,
            gate: Mutex::new(Gate::default()),
            turn: Condvar::new(),
        })
    }

    fn hold(&self, bytes: Range<u64>) {
        self.gate.lock().held = Some(bytes);
    }

    fn let_go(&self) {
        self.gate.lock().held = None;
        self.turn.notify_all();
    }

    /// Waits until a write waits at the door.
    fn wait_until_held(&self) {
        let deadline = Instant::now() + WATCHDOG;
        let mut gate = self.gate.lock();
        while gate.waiting == 0 {
            assert!(
                !self.turn.wait_until(&mut gate, deadline).timed_out(),
                "no write reached the door"
            );
        }
    }

    /// The transaction that revoked `FREED` is durable.
    fn revoke_is_durable(&self) {
        self.gate.lock().revoke_durable = true;
    }

    fn freed_home_writes(&self) -> [Vec<u8>; 2] {
        self.gate.lock().freed_home_writes.clone()
    }
}

impl BlockDevice for GatedDevice {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn sector_size(&self) -> u32 {
        self.dev.sector_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        self.dev.read_at(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        let end = offset + data.len() as u64;
        let mut gate = self.gate.lock();
        let freed = FREED * BS;
        if offset <= freed && freed < end {
            let first = data[(freed - offset) as usize];
            let after = usize::from(gate.revoke_durable);
            gate.freed_home_writes[after].push(first);
        }
        if gate
            .held
            .as_ref()
            .is_some_and(|h| h.start < end && offset < h.end)
        {
            gate.waiting += 1;
            self.turn.notify_all();
            while gate.held.is_some() {
                self.turn.wait(&mut gate);
            }
            gate.waiting -= 1;
        }
        drop(gate);
        self.dev.write(offset, data, flags)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.dev.flush()
    }
    fn capabilities(&self) -> Capabilities {
        self.dev.capabilities()
    }
    fn counters(&self) -> &DeviceCounters {
        self.dev.counters()
    }
    fn describe(&self) -> String {
        format!("gated writes over {}", self.dev.describe())
    }
}

fn area() -> JournalArea {
    JournalArea::contiguous(BS as u32, JOURNAL_START, JOURNAL_BLOCKS)
}

/// A queue whose commands run on a pool of threads, so that a write held at the door
/// holds only its own thread, never the queue (the inline engine would run the next
/// command on the holder's thread).
fn queue(dev: &Arc<GatedDevice>) -> Arc<IoQueue> {
    let config = IoConfig {
        engine: EngineKind::Threads,
        queue_depth: 16,
    };
    Arc::new(IoQueue::with_config(dev.clone(), config).unwrap())
}

fn config(commit_mode: CommitMode, max_transaction_blocks: Option<u32>) -> JournalConfig {
    JournalConfig {
        commit_interval_ms: 3_600_000,
        max_transaction_blocks,
        features: LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: false,
        },
        commit_mode,
        record_mode: RecordMode::Blocks,
        ..JournalConfig::default()
    }
}

fn buffer(block: u64) -> Arc<JBuf> {
    Arc::new(JBuf::zeroed(block, BS as usize))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !done() {
        assert!(Instant::now() < deadline, "gave up waiting: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The rest of the story, once the held transaction `held` (which logged `FREED` as
/// `STALE`) was let go on its way to the log: the next transaction `next` (whose handle
/// revoked `FREED` while `held` was held) commits, the new owner writes `FREED` home,
/// the machine crashes; recovery must leave the new owner's bytes.
fn reuse_crash_and_check(dev: &GatedDevice, journal: &Journal, held: Tid, next: Tid) {
    journal.commit_and_wait(next).unwrap();
    dev.revoke_is_durable();
    assert!(tid_geq(journal.committed_tid(), held));
    // Once the freeing transaction is durable the block may be reused: its new owner
    // writes it in place (ordered data, say), past the journal.
    dev.dev
        .write_at(FREED * BS, &vec![REUSED; BS as usize], true)
        .unwrap();
    let crashed = dev.dev.crash();
    let [before, after] = dev.freed_home_writes();
    // Nothing may write the held transaction's copy home once the revoke is durable: the
    // block is someone else's.
    assert_eq!(
        after,
        Vec::<u8>::new(),
        "the journal wrote its copy of block {FREED} home after transaction {next}, which \
         revoked it, was durable"
    );
    // Before that, a checkpoint that wrote it home and moved the tail past the held
    // transaction would leave nothing for recovery to get wrong (the scenario holds the
    // held transaction's durability back until the next one's).
    assert_eq!(
        before,
        Vec::<u8>::new(),
        "the scenario did not run as planned: block {FREED} went home before transaction \
         {next} was durable ({:?})",
        journal.stats()
    );
    let after = Arc::new(crashed);
    let io = IoQueue::new(after.clone());
    let report = recover(&io, &[area()]).unwrap();
    let mut home = vec![0u8; BS as usize];
    after.read_at(OTHER * BS, &mut home).unwrap();
    assert_eq!(
        home,
        vec![2u8; BS as usize],
        "transaction {next} was replayed"
    );
    after.read_at(FREED * BS, &mut home).unwrap();
    assert!(
        home.iter().all(|&b| b == REUSED),
        "recovery replayed transaction {held}'s copy of block {FREED} (first byte {:#x}) over \
         its new owner's contents ({REUSED:#x}): the revoke issued in transaction {next} \
         while {held} was held did not cover it ({report:?})",
        home[0]
    );
}

/// The next transaction's handle frees `FREED` (revokes it) and logs `OTHER`; returns its
/// tid.
fn free_in_next_transaction(journal: &Journal) -> Tid {
    let mut h = journal.start(1).unwrap();
    h.revoke(FREED).unwrap();
    h.modify(&buffer(OTHER), |b| b.fill(2)).unwrap();
    let tid = h.tid();
    h.stop();
    tid
}

/// Transaction T logs `FREED`, and enough revoke records that it needs more log than
/// is free (the log full of durable transactions whose checkpoint the device holds):
/// the commit thread waits for room. Meanwhile a handle of T+1 revokes `FREED`.
#[test]
fn a_revoke_while_the_commit_waits_for_log_room_covers_its_blocks() {
    let dev = GatedDevice::new();
    // No checkpoint can finish: its home writes wait at the door.
    dev.hold(HOME_START * BS..DEVICE_BYTES);
    let journal = Journal::load(queue(&dev), area(), config(CommitMode::Classic, Some(8))).unwrap();
    // Log accounting (1 KiB blocks, checksum v3, 64-bit tags: 62 tags a descriptor, 125
    // records a revoke block): 1023 log blocks, one always unused. A transaction of 8 log
    // blocks at most, so a handle may ask for 4 credits and a writer starts only while 8
    // are free. Each filler is one handle of 4 blocks (descriptor + 4 + commit = 6 log
    // blocks; the next handle would not fit, so it commits the filler first): 169
    // fillers take 1014 blocks and leave 8 free.
    const FILLERS: u64 = 169;
    let filler_blocks: Vec<u64> = (0..FILLERS * 4).map(|i| HOME_START + i).collect();
    let mut last_filler = 0;
    for chunk in filler_blocks.chunks(4) {
        let mut h = journal.start(4).unwrap();
        for &block in chunk {
            h.modify(&buffer(block), |b| b.fill(1)).unwrap();
        }
        last_filler = h.tid();
        h.stop();
    }
    // T: 4 blocks and 676 revoke records, 1 + 4 + 6 + 1 = 12 log blocks: more than the 8
    // free. Its start commits the last filler.
    let mut h = journal.start(4).unwrap();
    let t = h.tid();
    assert!(tid_geq(t, last_filler.wrapping_add(1)));
    h.modify(&buffer(FREED), |b| b.fill(STALE)).unwrap();
    for block in FREED + 1..FREED + 4 {
        h.modify(&buffer(block), |b| b.fill(3)).unwrap();
    }
    for &block in &filler_blocks {
        h.revoke(block).unwrap();
    }
    h.stop();
    std::thread::scope(|scope| {
        // An ordering only (fbarrier): T must not become durable before T+1 (below).
        let commit_t = scope.spawn(|| journal.commit_and_wait_dispatched(t));
        wait_for("the commit thread to wait for log room", || {
            journal.stats().commit_room_waits == 1
        });
        // T left running: T+1 starts (8 blocks are free, enough for a writer).
        let next = free_in_next_transaction(&journal);
        assert_eq!(next, t.wrapping_add(1));
        assert!(
            !tid_geq(journal.dispatched_tid(), t),
            "T went out without room"
        );
        // Every filler durable before the checkpoint may finish: the checkpoints that make
        // room then find durable fillers left to write, never only T (which would ask for
        // T to be made durable, and write T home before T+1 commits).
        wait_for("every filler to be durable", || {
            tid_geq(journal.committed_tid(), last_filler)
        });
        dev.let_go();
        commit_t.join().unwrap().unwrap();
        // T+1 must find room without T going home first (which the checkpoint would do,
        // asking for T's durability, if the fillers left too little room when T went in).
        // The background checkpoint goes on until a quarter of the log or less is in use:
        // the fillers that fit under that mark (6 log blocks each) may stay.
        let fillers_kept = u64::from(JOURNAL_BLOCKS / 4 / 6);
        wait_for(
            "the fillers above a quarter of the log to be checkpointed",
            || journal.stats().blocks_checkpointed >= (FILLERS - fillers_kept) * 4,
        );
        // T+1 dispatched too before anyone asks for durability: T and T+1 then become
        // durable in one round, and T's copy of FREED never waits for the checkpoint
        // alone (it would be written home before T+1's revoke: harmless, but the crash
        // would then have nothing left to show).
        journal.commit_and_wait_dispatched(next).unwrap();
        assert_eq!(journal.stats().commit_room_waits, 1);
        reuse_crash_and_check(&dev, &journal, t, next);
    });
    journal.shutdown().unwrap();
}

/// T is the first single-I/O commit of a live log: before it, the commit thread writes a
/// superblock announcing the feature, without the state lock; the device holds that
/// write. Meanwhile a handle of T+1 revokes `FREED`, which T logs.
#[test]
fn a_revoke_while_the_commit_announces_a_log_feature_covers_its_blocks() {
    let dev = GatedDevice::new();
    let journal = Journal::load(queue(&dev), area(), config(CommitMode::SingleIo, None)).unwrap();
    // T0 wrote data in place (data=ordered): it commits the classic way, and the log is
    // live without the single-I/O bit.
    let mut h = journal.start(1).unwrap();
    h.note_ordered_data();
    h.modify(&buffer(HOME_START), |b| b.fill(1)).unwrap();
    let t0 = h.tid();
    h.stop();
    journal.commit_and_wait(t0).unwrap();
    let mut h = journal.start(1).unwrap();
    let t = h.tid();
    h.modify(&buffer(FREED), |b| b.fill(STALE)).unwrap();
    h.stop();
    dev.hold(JOURNAL_START * BS..(JOURNAL_START + 1) * BS);
    std::thread::scope(|scope| {
        let commit_t = scope.spawn(|| journal.commit_and_wait(t));
        dev.wait_until_held();
        let next = free_in_next_transaction(&journal);
        assert_eq!(next, t.wrapping_add(1));
        dev.let_go();
        commit_t.join().unwrap().unwrap();
        assert!(journal.stats().single_io_commits >= 1);
        reuse_crash_and_check(&dev, &journal, t, next);
    });
    journal.shutdown().unwrap();
}

/// The log fills with durable transactions while every home write waits at the door, so
/// no checkpoint can free anything: a large handle must wait for room, and a small handle
/// whose transaction fits must start and commit meanwhile (a full log makes the writer
/// wait, never an fsync whose log has room).
#[test]
fn a_small_handle_starts_and_commits_while_a_large_one_waits_for_log_room() {
    let dev = GatedDevice::new();
    dev.hold(HOME_START * BS..DEVICE_BYTES);
    let journal = Journal::load(queue(&dev), area(), config(CommitMode::Classic, None)).unwrap();
    // Log accounting (1 KiB blocks, checksum v3, 64-bit tags: 62 tags a descriptor): 1023
    // usable log blocks; transactions of 256 blocks at most, so a handle of 100 credits is
    // large (from 64), and starts only while the running transaction with it (2
    // descriptors + 100 + commit = 103) and a whole transaction more (256) fit. Seven such
    // transactions leave 1023 - 7 * 103 = 302 free: the eighth must wait.
    const LARGE: u32 = 100;
    let mut next_block = HOME_START;
    let mut fill = |journal: &Journal| {
        let mut h = journal.start(LARGE).unwrap();
        for _ in 0..LARGE {
            h.modify(&buffer(next_block), |b| b.fill(7)).unwrap();
            next_block += 1;
        }
        let tid = h.tid();
        h.stop();
        journal.commit_and_wait(tid).unwrap();
    };
    for _ in 0..7 {
        fill(&journal);
    }
    assert_eq!(journal.stats().log_full_waits, 0, "{:?}", journal.stats());
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| fill(&journal));
        wait_for("the large handle to wait for log room", || {
            journal.stats().log_full_waits == 1
        });
        // fsyncs of a few blocks each (1 descriptor + 4 + commit = 6 log blocks), 30 of
        // them: the last ones start with fewer than a whole transaction's 256 blocks free
        // (the rule before, which made every handle wait there), but with room for them.
        let fsyncs = scope.spawn(|| {
            for round in 0..30u64 {
                let mut h = journal.start(4).unwrap();
                for block in 0..4 {
                    let home = OTHER + 1000 + round * 4 + block;
                    h.modify(&buffer(home), |b| b.fill(9)).unwrap();
                }
                let tid = h.tid();
                h.stop();
                journal.commit_and_wait(tid).unwrap();
            }
        });
        let deadline = Instant::now() + WATCHDOG;
        while !fsyncs.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let fsyncs_done = fsyncs.is_finished();
        let writer_waited = !writer.is_finished();
        let stats = journal.stats();
        // Let everything finish before any assertion, or the scope would never end.
        dev.let_go();
        writer.join().unwrap();
        fsyncs.join().unwrap();
        assert!(
            fsyncs_done,
            "a small handle waited for log room it had: {stats:?}"
        );
        assert!(
            writer_waited,
            "the large handle started without room: {stats:?}"
        );
        assert_eq!(stats.log_full_waits, 1, "{stats:?}");
        assert_eq!(stats.checkpoints, 0, "{stats:?}");
    });
    journal.shutdown().unwrap();
}
