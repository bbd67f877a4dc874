//! The per-core ring writer over a simulated device: an i-transaction returns only once
//! every lower sub-tid settled, a full ring refuses and makes every later sub-tid of its
//! tid refuse, a new tid restarts the rings, the private bit is on disk while the log is
//! not empty and gone after shutdown, and recovery after a crash finds exactly the
//! i-transactions that returned.

use jext_device::{BlockDevice, SimDevice};
use jext_io::{IoFlags, IoQueue};
use jext_journal::format::fast_commit::FcRecord;
use jext_journal::format::superblock::{INCOMPAT_FAST_COMMIT, INCOMPAT_JEXT_PERCORE};
use jext_journal::format::JournalSuperblock;
use jext_journal::{
    recover, FastCommitOutcome, JBuf, Journal, JournalArea, JournalConfig, LogFeatures,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BS: u32 = 1024;
const JOURNAL_START: u64 = 4096;
const JOURNAL_BLOCKS: u32 = 1100;
/// 9 fast-commit blocks: a region of 8 (the last stays unwritten), two rings of 4.
const FC_BLOCKS: u32 = 9;

struct Rig {
    dev: Arc<SimDevice>,
    io: Arc<IoQueue>,
    area: JournalArea,
}

fn fresh() -> Rig {
    let dev = Arc::new(SimDevice::new(8 << 20));
    let io = Arc::new(IoQueue::new(dev.clone()));
    let area = JournalArea::contiguous(BS, JOURNAL_START, JOURNAL_BLOCKS);
    let mut sb = JournalSuperblock::new(BS, JOURNAL_BLOCKS, [0x42; 16]);
    sb.set_feature_incompat(INCOMPAT_FAST_COMMIT);
    sb.set_num_fc_blocks_field(FC_BLOCKS);
    dev.write_at(area.byte_offset(0), &sb.encode(), false)
        .unwrap();
    dev.flush().unwrap();
    Rig { dev, io, area }
}

fn load(rig: &Rig) -> Journal {
    let config = JournalConfig {
        commit_interval_ms: 3_600_000,
        features: LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: true,
        },
        fast_commit_rings: 2,
        ..JournalConfig::default()
    };
    Journal::load(rig.io.clone(), rig.area.clone(), config).unwrap()
}

fn superblock(dev: &SimDevice, area: &JournalArea) -> JournalSuperblock {
    let mut buf = vec![0u8; BS as usize];
    dev.read_at(area.byte_offset(0), &mut buf).unwrap();
    JournalSuperblock::decode(&buf, JOURNAL_BLOCKS).unwrap()
}

/// A change in the running transaction; returns its tid.
fn change(journal: &Journal, block: u64) -> u32 {
    let buf = Arc::new(JBuf::zeroed(block, BS as usize));
    let mut h = journal.start(4).unwrap();
    h.modify(&buf, |b| b.fill(7)).unwrap();
    let tid = h.tid();
    h.stop();
    tid
}

/// `n` records naming sub-tid `sub` (one block holds about 60).
fn records(sub: u64, n: usize) -> Vec<FcRecord> {
    (0..n)
        .map(|i| FcRecord::DelRange {
            ino: 12 + i as u32,
            lblk: sub as u32,
            len: 1,
        })
        .collect()
}

fn replayed_subs(report: &jext_journal::RecoveryReport) -> Vec<u32> {
    let mut subs: Vec<u32> = report
        .fast_commits
        .records
        .iter()
        .filter_map(|r| match r {
            FcRecord::DelRange { ino: 12, lblk, .. } => Some(*lblk),
            _ => None,
        })
        .collect();
    subs.dedup();
    subs
}

#[test]
fn order_full_rings_and_recovery() {
    let rig = fresh();
    let journal = Arc::new(load(&rig));
    let tid = change(&journal, 300);
    assert_eq!(journal.fast_commit_tid(), tid);
    assert_eq!(journal.fast_commit_rings(), 2);

    let written = |o: FastCommitOutcome| matches!(o, FastCommitOutcome::Written { .. });
    assert!(written(
        journal
            .percore_commit(0, 0, tid, 0, &records(0, 1), &[])
            .unwrap()
    ));
    let sb = superblock(&rig.dev, &rig.area);
    assert!(sb.has_incompat(INCOMPAT_JEXT_PERCORE) && !sb.is_clean());

    // Sub-tid 2 is written first but must not return before sub-tid 1 settled.
    let returned = Arc::new(AtomicBool::new(false));
    let later = {
        let (journal, returned) = (journal.clone(), returned.clone());
        std::thread::spawn(move || {
            let outcome = journal
                .percore_commit(2, 0, tid, 0, &records(2, 1), &[])
                .unwrap();
            returned.store(true, Ordering::SeqCst);
            outcome
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !returned.load(Ordering::SeqCst),
        "sub-tid 2 returned before sub-tid 1"
    );
    assert!(written(
        journal
            .percore_commit(1, 0, tid, 0, &records(1, 1), &[])
            .unwrap()
    ));
    assert!(written(later.join().unwrap()));

    // Too large for any ring: refused, and so is every later sub-tid of the tid.
    assert_eq!(
        journal
            .percore_commit(3, 0, tid, 0, &records(3, 300), &[])
            .unwrap(),
        FastCommitOutcome::NoRoom
    );
    assert_eq!(
        journal
            .percore_commit(4, 0, tid, 0, &records(4, 1), &[])
            .unwrap(),
        FastCommitOutcome::NoRoom
    );

    let crashed = rig.dev.crash();
    let io = IoQueue::new(Arc::new(crashed));
    let report = recover(&io, std::slice::from_ref(&rig.area)).unwrap();
    assert_eq!(replayed_subs(&report), vec![0, 1, 2]);

    // The tid commits in full: the next i-transaction of a new tid restarts the rings,
    // and recovery replays it alone.
    journal.commit_and_wait(tid).unwrap();
    let next = change(&journal, 301);
    assert_ne!(next, tid);
    assert!(written(
        journal
            .percore_commit(5, 5, next, 0, &records(5, 1), &[])
            .unwrap()
    ));
    let crashed = rig.dev.crash();
    let io = IoQueue::new(Arc::new(crashed));
    let report = recover(&io, std::slice::from_ref(&rig.area)).unwrap();
    assert_eq!(report.last_tid, Some(tid));
    assert_eq!(replayed_subs(&report), vec![5]);

    // A clean shutdown leaves an empty log without the bit (Linux may use it again).
    journal.shutdown().unwrap();
    let sb = superblock(&rig.dev, &rig.area);
    assert!(sb.is_clean() && !sb.has_incompat(INCOMPAT_JEXT_PERCORE));
}

/// An i-transaction waits for the flush that covers its file's data (none of its own if
/// someone else's flush did that already), then is written plainly and made durable by a
/// flush that every ring writing at the time may share; no FUA. It is durable when it
/// returns: a crash right after keeps it.
#[test]
fn an_itransaction_is_made_durable_by_a_flush_after_it_not_fua() {
    let rig = fresh();
    let journal = Arc::new(load(&rig));
    let tid = change(&journal, 300);
    // The first i-transaction of a tid also points the superblock at the log.
    journal
        .percore_commit(0, 0, tid, 0, &records(0, 1), &[])
        .unwrap();
    let data_write = |byte: u8| {
        let data: Arc<[u8]> = Arc::from(vec![byte; BS as usize]);
        rig.io.write(2 << 20, data, IoFlags::empty()).unwrap();
        rig.io.covering_flush()
    };

    let data_flush = data_write(1);
    let before = rig.dev.counters().snapshot();
    let outcome = journal
        .percore_commit(1, 0, tid, data_flush, &records(1, 1), &[])
        .unwrap();
    let io = rig.dev.counters().snapshot() - before;
    assert!(matches!(outcome, FastCommitOutcome::Written { blocks: 1 }));
    assert_eq!((io.writes, io.fua_writes, io.flushes), (1, 0, 2), "{io:?}");

    // Someone else's flush came after the data: only the closing flush is left.
    let data_flush = data_write(2);
    rig.io.flush().unwrap();
    let before = rig.dev.counters().snapshot();
    journal
        .percore_commit(2, 0, tid, data_flush, &records(2, 1), &[])
        .unwrap();
    let io = rig.dev.counters().snapshot() - before;
    assert_eq!((io.writes, io.fua_writes, io.flushes), (1, 0, 1), "{io:?}");

    let crashed = rig.dev.crash();
    let mut data = vec![0u8; 512];
    crashed.read_at(2 << 20, &mut data).unwrap();
    assert_eq!(data[0], 2, "the data is durable before what points at it");
    let report = recover(
        &IoQueue::new(Arc::new(crashed)),
        std::slice::from_ref(&rig.area),
    )
    .unwrap();
    assert_eq!(replayed_subs(&report), vec![0, 1, 2]);
}
