//! A journal without a log (`Journal::without_log`, a file system made without one):
//! handles and the waits are those of a journal with a log, but a commit writes its
//! blocks home and flushes. Checked on the simulated disk: after `commit_and_wait` the
//! blocks are durable at home and nothing else was written; an fbarrier's wait
//! (`commit_and_wait_dispatched`) returns with them durable too, since nothing can be
//! ordered without a log; a revoke records nothing; a durable commit leaves nothing for a
//! checkpoint, and home reads back what it wrote.

use jext_device::{BlockDevice, SimDevice};
use jext_io::IoQueue;
use jext_journal::{JBuf, Journal, JournalConfig};
use std::sync::Arc;

const BS: u64 = 4096;

fn block_of(dev: &SimDevice, block: u64) -> Vec<u8> {
    let image = dev.durable_image();
    let mut bytes = vec![0u8; BS as usize];
    image.read(block * BS, &mut bytes);
    bytes
}

fn journal(dev: &Arc<SimDevice>) -> Journal {
    let io = Arc::new(IoQueue::new(dev.clone()));
    let config = JournalConfig {
        // Only the waits commit.
        commit_interval_ms: 3_600_000,
        ..JournalConfig::default()
    };
    Journal::without_log(io, BS as u32, config).unwrap()
}

#[test]
fn a_commit_writes_its_blocks_home_and_flushes() {
    let dev = Arc::new(SimDevice::new(4 << 20));
    let journal = journal(&dev);
    assert!(!journal.has_log());
    let bufs: Vec<Arc<JBuf>> = (10..14)
        .map(|b| Arc::new(JBuf::zeroed(b, BS as usize)))
        .collect();
    let mut handle = journal.start(8).unwrap();
    let tid = handle.tid();
    for (i, buf) in bufs.iter().enumerate() {
        handle
            .modify(buf, |bytes| bytes.fill(0xA0 + i as u8))
            .unwrap();
    }
    // A revoke has nothing to protect: no log replays an older copy.
    handle.revoke(99).unwrap();
    handle.stop();
    let before = dev.counters().snapshot();
    journal.commit_and_wait(tid).unwrap();
    let after = dev.counters().snapshot();
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(
            block_of(&dev, buf.block()),
            vec![0xA0 + i as u8; BS as usize],
            "block {} is durable at home",
            buf.block()
        );
    }
    assert_eq!(
        after.write_bytes - before.write_bytes,
        4 * BS,
        "nothing but the blocks"
    );
    assert_eq!(after.flushes - before.flushes, 1, "one flush");
    let stats = journal.stats();
    assert_eq!(
        (
            stats.commits,
            stats.blocks_written_home,
            stats.blocks_logged
        ),
        (1, 4, 0)
    );
    assert_eq!((stats.revokes_logged, stats.log_bytes), (0, 0));
    assert_eq!(journal.committed_tid(), tid);
    assert_eq!(
        journal.committed_copy(10),
        None,
        "home holds it, not the journal"
    );

    // A later change to a block goes home over the earlier one.
    let mut handle = journal.start(1).unwrap();
    let tid = handle.tid();
    handle
        .modify(&bufs[0], |bytes| bytes[..4].copy_from_slice(b"new!"))
        .unwrap();
    handle.stop();
    journal.commit_and_wait_dispatched(tid).unwrap();
    assert!(
        journal.committed_tid() == tid,
        "an fbarrier's commit is durable"
    );
    assert_eq!(&block_of(&dev, 10)[..5], b"new!\xA0");

    journal.checkpoint().unwrap();
    journal.empty_log().unwrap();
    journal.shutdown().unwrap();
    assert_eq!(dev.pending_writes(), 0, "nothing left in the cache");
}

#[test]
fn a_durable_commit_leaves_nothing_for_a_checkpoint() {
    let dev = Arc::new(SimDevice::new(4 << 20));
    let journal = journal(&dev);
    let buf = Arc::new(JBuf::zeroed(20, BS as usize));
    let mut handle = journal.start(1).unwrap();
    let tid = handle.tid();
    handle.modify(&buf, |bytes| bytes.fill(7)).unwrap();
    handle.stop();
    journal.commit_and_wait(tid).unwrap();
    // Once durable, home has it and the journal keeps nothing for a checkpoint.
    assert_eq!(journal.committed_copy(20), None);
    let mut bytes = vec![0u8; BS as usize];
    dev.read_at(20 * BS, &mut bytes).unwrap();
    assert_eq!(bytes, vec![7u8; BS as usize]);
    journal.shutdown().unwrap();
}
