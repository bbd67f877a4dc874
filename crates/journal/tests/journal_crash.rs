//! The journal over a simulated device: what committed survives a crash, what did not
//! commit does not, revokes and checkpoints and wrap-around are honoured, a lone commit on
//! a device without a barrier write costs one flush (before its commit block) and one FUA
//! write (the commit block) when classic, and one write and one flush with single I/O,
//! whose torn tail recovery drops, and an IO error aborts without losing commits.

use jext_device::{BlockDevice, SimDevice, SimFault};
use jext_io::IoQueue;
use jext_journal::format::JournalSuperblock;
use jext_journal::{
    recover, CommitMode, JBuf, Journal, JournalArea, JournalConfig, JournalError, LogFeatures,
};
use std::sync::Arc;

const BS: u32 = 1024;
const JOURNAL_START: u64 = 4096;

struct Rig {
    dev: Arc<SimDevice>,
    io: Arc<IoQueue>,
    area: JournalArea,
}

fn fresh(journal_blocks: u32) -> Rig {
    let dev = Arc::new(SimDevice::new(8 << 20));
    let io = Arc::new(IoQueue::new(dev.clone()));
    let area = JournalArea::contiguous(BS, JOURNAL_START, journal_blocks);
    let sb = JournalSuperblock::new(BS, journal_blocks, [0x42; 16]);
    let mut block = vec![0u8; BS as usize];
    block[..1024].copy_from_slice(&sb.encode());
    dev.write_at(JOURNAL_START * u64::from(BS), &block, false)
        .unwrap();
    dev.flush().unwrap();
    Rig { dev, io, area }
}

fn reopen(dev: SimDevice) -> Rig {
    let dev = Arc::new(dev);
    let io = Arc::new(IoQueue::new(dev.clone()));
    let area = JournalArea::contiguous(BS, JOURNAL_START, 1024);
    Rig { dev, io, area }
}

fn recover_rig(rig: &Rig) -> Result<jext_journal::RecoveryReport, JournalError> {
    recover(&rig.io, std::slice::from_ref(&rig.area))
}

fn config() -> JournalConfig {
    JournalConfig {
        commit_interval_ms: 3_600_000,
        features: LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: false,
        },
        ..JournalConfig::default()
    }
}

fn load(rig: &Rig) -> Journal {
    Journal::load(rig.io.clone(), rig.area.clone(), config()).unwrap()
}

fn load_with(rig: &Rig, commit_mode: CommitMode) -> Journal {
    let config = JournalConfig {
        commit_mode,
        ..config()
    };
    Journal::load(rig.io.clone(), rig.area.clone(), config).unwrap()
}

fn home(rig: &Rig, block: u64) -> Vec<u8> {
    let mut buf = vec![0u8; BS as usize];
    rig.dev.read_at(block * u64::from(BS), &mut buf).unwrap();
    buf
}

fn buffer(block: u64) -> Arc<JBuf> {
    Arc::new(JBuf::zeroed(block, BS as usize))
}

/// Writes `byte` over all of `buf` in one handle; returns the handle's tid.
fn change(journal: &Journal, buf: &Arc<JBuf>, byte: u8) -> u32 {
    let mut h = journal.start(4).unwrap();
    h.modify(buf, |b| b.fill(byte)).unwrap();
    let tid = h.tid();
    h.stop();
    tid
}

#[test]
fn committed_transactions_survive_a_crash_and_uncommitted_ones_do_not() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let (a, b) = (buffer(100), buffer(101));
    let tid = change(&journal, &a, 1);
    change(&journal, &b, 2);
    journal.commit_and_wait(tid).unwrap();
    change(&journal, &a, 3); // running, never committed
    let crashed = rig.dev.crash();
    drop(journal);

    let after = reopen(crashed);
    let report = recover_rig(&after).unwrap();
    assert_eq!((report.transactions, report.blocks_replayed), (1, 2));
    assert_eq!(home(&after, 100), vec![1u8; 1024]);
    assert_eq!(home(&after, 101), vec![2u8; 1024]);
    // Recovery left the journal empty and loadable.
    let again = load(&after);
    again.shutdown().unwrap();
    assert!(recover_rig(&after).unwrap().was_clean);
}

/// The device requests of one commit after the first (which also points the superblock
/// at the log): (writes, flushes, FUA writes).
fn lone_commit_cost(commit_mode: CommitMode) -> (u64, u64, u64) {
    let rig = fresh(1024);
    let journal = load_with(&rig, commit_mode);
    let buf = buffer(200);
    change(&journal, &buf, 9);
    journal.commit_all().unwrap();
    let before = rig.dev.counters().snapshot();
    let tid = change(&journal, &buf, 10);
    journal.commit_and_wait(tid).unwrap();
    let delta = rig.dev.counters().snapshot() - before;
    (delta.writes, delta.flushes, delta.fua_writes)
}

#[test]
fn a_lone_classic_commit_costs_one_flush_and_one_fua_write() {
    assert_eq!(
        lone_commit_cost(CommitMode::Classic),
        (2, 1, 1),
        "descriptor+block in one merged write, a flush, then the commit block with FUA"
    );
}

#[test]
fn a_lone_single_io_commit_is_one_write_and_one_flush() {
    assert_eq!(
        lone_commit_cost(CommitMode::SingleIo),
        (1, 1, 0),
        "descriptor, block and commit block in one write, then one flush"
    );
}

/// A single-I/O transaction whose logged block did not all reach the disk (the crash
/// came before its flush) is the torn tail: recovery drops it and keeps what came before;
/// and the journal superblock said so to Linux meanwhile (the private incompat bit).
#[test]
fn a_torn_single_io_transaction_ends_the_log() {
    let rig = fresh(1024);
    let journal = load_with(&rig, CommitMode::SingleIo);
    let tid = change(&journal, &buffer(610), 1);
    journal.commit_and_wait(tid).unwrap();
    let tid2 = change(&journal, &buffer(611), 2);
    journal.commit_and_wait(tid2).unwrap();
    let crashed = rig.dev.crash();
    let mut sb = vec![0u8; 1024];
    crashed
        .read_at(JOURNAL_START * u64::from(BS), &mut sb)
        .unwrap();
    let incompat = u32::from_be_bytes([sb[0x28], sb[0x29], sb[0x2A], sb[0x2B]]);
    assert_ne!(
        incompat & 0x8000_0000,
        0,
        "JEXT_SINGLE_IO while the log is live"
    );
    // Each is a compact commit (its commit block, then its copy): t1 at 1..=2, and
    // transaction 2's logged copy at 4, of which one sector was never written.
    let logged = (JOURNAL_START + 4) * u64::from(BS);
    crashed.write_at(logged + 512, &[0u8; 512], false).unwrap();
    let after = reopen(crashed);
    let report = recover_rig(&after).unwrap();
    assert_eq!(report.last_tid, Some(tid));
    assert_eq!(home(&after, 610)[0], 1);
    assert_eq!(
        home(&after, 611)[0],
        0,
        "the torn transaction is not replayed"
    );
    // The log is empty again, without the bit, and loads.
    let again = load(&after);
    again.shutdown().unwrap();
    let mut sb = vec![0u8; 1024];
    after
        .dev
        .read_at(JOURNAL_START * u64::from(BS), &mut sb)
        .unwrap();
    assert_eq!(sb[0x28] & 0x80, 0, "a clean log carries no private bit");
}

#[test]
fn frozen_copies_keep_what_the_commit_promised() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let buf = buffer(300);
    let tid = change(&journal, &buf, 5);
    journal.commit_and_wait(tid).unwrap();
    let snapshot_before = buf.bytes();
    change(&journal, &buf, 6); // copies: the checkpoint list still holds the committed 5s
    assert_eq!(snapshot_before[0], 5);
    assert_eq!(journal.committed_copy(300).unwrap()[0], 5);
    assert_eq!(buf.bytes()[0], 6);
    let crashed = rig.dev.crash();
    let after = reopen(crashed);
    recover_rig(&after).unwrap();
    assert_eq!(home(&after, 300)[0], 5);
}

#[test]
fn a_committed_revoke_cancels_older_copies() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let (a, b) = (buffer(400), buffer(401));
    change(&journal, &a, 7);
    let tid = change(&journal, &b, 8);
    journal.commit_and_wait(tid).unwrap();
    let mut h = journal.start(4).unwrap();
    h.revoke(400).unwrap();
    let tid = h.tid();
    h.stop();
    journal.commit_and_wait(tid).unwrap();
    assert!(
        journal.committed_copy(400).is_none(),
        "the checkpoint forgets a revoked block"
    );
    let after = reopen(rig.dev.crash());
    let report = recover_rig(&after).unwrap();
    assert_eq!((report.copies_revoked, report.blocks_replayed), (1, 1));
    assert_eq!(
        home(&after, 400),
        vec![0u8; 1024],
        "the revoked copy was not replayed"
    );
    assert_eq!(home(&after, 401), vec![8u8; 1024]);
}

#[test]
fn the_log_wraps_and_checkpoints_without_losing_anything() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let bufs: Vec<_> = (0..40).map(|i| buffer(1000 + i)).collect();
    // 60 transactions of 40 blocks = far more than the 1024-block log holds.
    for round in 0..60u8 {
        let mut h = journal.start(40).unwrap();
        for buf in &bufs {
            h.modify(buf, |b| b.fill(round)).unwrap();
        }
        let tid = h.tid();
        h.stop();
        journal.commit_and_wait(tid).unwrap();
    }
    assert!(journal.stats().checkpoints >= 2, "{:?}", journal.stats());
    let after = reopen(rig.dev.crash());
    recover_rig(&after).unwrap();
    for i in 0..40 {
        assert_eq!(
            home(&after, 1000 + i),
            vec![59u8; 1024],
            "block {}",
            1000 + i
        );
    }
}

#[test]
fn escaped_blocks_come_back_with_their_magic() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let buf = buffer(500);
    let mut h = journal.start(1).unwrap();
    h.modify(&buf, |b| {
        b[..4].copy_from_slice(&0xC03B_3998u32.to_be_bytes());
        b[4] = 0x77;
    })
    .unwrap();
    let tid = h.tid();
    h.stop();
    journal.commit_and_wait(tid).unwrap();
    let after = reopen(rig.dev.crash());
    recover_rig(&after).unwrap();
    let bytes = home(&after, 500);
    assert_eq!(&bytes[..5], &[0xC0, 0x3B, 0x39, 0x98, 0x77]);
}

#[test]
fn a_corrupt_block_inside_a_committed_transaction_is_an_error_not_a_skip() {
    let rig = fresh(1024);
    // Classic: the logged blocks were durable before the commit block was written.
    let journal = load_with(&rig, CommitMode::Classic);
    let tid = change(&journal, &buffer(600), 1);
    journal.commit_and_wait(tid).unwrap();
    let crashed = rig.dev.crash();
    // The logged copy of block 600 sits after the descriptor at the log's first block.
    let first = 1u64;
    let logged = (JOURNAL_START + first + 1) * u64::from(BS);
    crashed.write_at(logged, &[0xEE; 512], false).unwrap();
    crashed.flush().unwrap();
    let after = reopen(crashed);
    let before = after.dev.counters().snapshot();
    match recover_rig(&after) {
        Err(JournalError::BlockChecksum {
            tid: t, fs_block, ..
        }) => assert_eq!((t, fs_block), (tid, 600)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
    assert_eq!(
        (after.dev.counters().snapshot() - before).writes,
        0,
        "nothing was replayed"
    );
}

#[test]
fn a_torn_commit_block_ends_the_log() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let tid = change(&journal, &buffer(700), 1);
    journal.commit_and_wait(tid).unwrap();
    let tid2 = change(&journal, &buffer(701), 2);
    journal.commit_and_wait(tid2).unwrap();
    let crashed = rig.dev.crash();
    // Transaction 2's commit block: superblock-pointed start 1, each transaction a compact
    // commit block and its copy (t1 at 1..=2), so t2's commit block is at 3.
    let commit2 = (JOURNAL_START + 3) * u64::from(BS);
    // Torn: the first sector of the commit block never reached the disk.
    crashed.write_at(commit2, &[0u8; 512], false).unwrap();
    let after = reopen(crashed);
    let report = recover_rig(&after).unwrap();
    assert_eq!(report.last_tid, Some(tid));
    assert_eq!(home(&after, 700)[0], 1);
    assert_eq!(home(&after, 701)[0], 0);
}

#[test]
fn an_io_error_aborts_the_journal_and_keeps_earlier_commits() {
    let rig = fresh(1024);
    let journal = load(&rig);
    let tid = change(&journal, &buffer(800), 1);
    journal.commit_and_wait(tid).unwrap();
    rig.dev.inject(SimFault::FailWritesAfter(0));
    let tid2 = change(&journal, &buffer(801), 2);
    let err = journal.commit_and_wait(tid2).unwrap_err();
    assert!(matches!(err, JournalError::Aborted(_)), "{err}");
    assert!(matches!(journal.start(1), Err(JournalError::Aborted(_))));
    rig.dev.clear_faults();
    let after = reopen(rig.dev.crash());
    recover_rig(&after).unwrap();
    assert_eq!(home(&after, 800)[0], 1);
}

#[test]
fn clean_shutdown_checkpoints_and_empties_the_log() {
    let rig = fresh(1024);
    let journal = load(&rig);
    change(&journal, &buffer(900), 4);
    journal.shutdown().unwrap();
    assert_eq!(home(&rig, 900)[0], 4, "checkpointed home");
    let after = reopen(rig.dev.crash());
    assert!(recover_rig(&after).unwrap().was_clean);
}

/// A single-I/O transaction that was durable before a later commit was written, and
/// then lost a block (a bit flip, not a tear): recovery fails naming it, instead of
/// silently ending the log there and dropping the later, acknowledged commit.
#[test]
fn damage_in_a_durable_single_io_transaction_is_an_error() {
    let rig = fresh(1024);
    let journal = load_with(&rig, CommitMode::SingleIo);
    let tid = change(&journal, &buffer(620), 1);
    journal.commit_and_wait(tid).unwrap();
    let tid2 = change(&journal, &buffer(621), 2);
    journal.commit_and_wait(tid2).unwrap();
    let crashed = rig.dev.crash();
    // Transaction 1's logged block: desc 1, block 2, commit 3.
    let logged = (JOURNAL_START + 2) * u64::from(BS);
    crashed.write_at(logged, &[0xEE; 512], false).unwrap();
    let after = reopen(crashed);
    match recover_rig(&after) {
        Err(JournalError::BlockChecksum {
            tid: t, fs_block, ..
        }) => assert_eq!((t, fs_block), (tid, 620)),
        other => panic!("expected a checksum error, got {other:?}"),
    }
}
