//! Recovery of journals built block by block with the format encoders on a simulated
//! device: every checksum kind, wrap-around at the end of the log (and before the
//! fast-commit area), revokes, escaping, tid wrap, torn tails that end the log quietly,
//! and damage inside committed transactions that is an error and writes nothing.

use jext_device::{BlockDevice, SimDevice};
use jext_io::IoQueue;
use jext_journal::format::blocks::{escape, needs_escape, CommitBlock, Csum, LogFormat, Tag};
use jext_journal::format::fast_commit::{FastCommitWriter, FcRecord};
use jext_journal::format::superblock::{
    COMPAT_CHECKSUM, INCOMPAT_64BIT, INCOMPAT_ASYNC_COMMIT, INCOMPAT_CSUM_V2, INCOMPAT_FAST_COMMIT,
};
use jext_journal::format::{crc32_be, crc32c_raw, JournalSuperblock, JBD2_MAGIC};
use jext_journal::{recover, scan, JournalArea, JournalError, RecoveryReport};
use std::sync::Arc;

const BS: usize = 1024;
/// File system block where the journal starts.
const JOURNAL_AT: u64 = 2048;
const JOURNAL_BLOCKS: u32 = 1400;
const DEVICE_BLOCKS: u64 = 4096;
const UUID: [u8; 16] = [0x5A; 16];

#[derive(Clone, Copy, Debug)]
struct Setup {
    csum: Csum,
    wide_blocks: bool,
    async_commit: bool,
    fast_commit: bool,
    /// Where the live log starts (`s_start`); `None` = at `s_first`.
    start: Option<u32>,
    sequence: u32,
}

const V3: Setup = Setup {
    csum: Csum::V3,
    wide_blocks: true,
    async_commit: false,
    fast_commit: false,
    start: None,
    sequence: 10,
};

/// Where a transaction's blocks went.
struct Logged {
    tid: u32,
    descriptor: u32,
    copies: Vec<u32>,
    commit: u32,
}

struct Rig {
    dev: Arc<SimDevice>,
    io: IoQueue,
    area: JournalArea,
    format: LogFormat,
    sb: JournalSuperblock,
    position: u32,
    tid: u32,
    commit_sec: u64,
}

fn superblock_for(setup: Setup) -> JournalSuperblock {
    let mut sb = JournalSuperblock::new(BS as u32, JOURNAL_BLOCKS, UUID);
    let wide = if setup.wide_blocks { INCOMPAT_64BIT } else { 0 };
    match setup.csum {
        Csum::V3 => sb.enable_csum_v3(setup.wide_blocks),
        Csum::V2 => sb.set_feature_incompat(INCOMPAT_CSUM_V2 | wide),
        Csum::V1 => {
            sb.set_feature_compat(COMPAT_CHECKSUM);
            sb.set_feature_incompat(wide);
        }
        Csum::None => sb.set_feature_incompat(wide),
    }
    if setup.async_commit {
        sb.set_feature_incompat(sb.feature_incompat() | INCOMPAT_ASYNC_COMMIT);
    }
    if setup.fast_commit {
        sb.enable_fast_commit();
    }
    sb.set_sequence(setup.sequence);
    sb.set_start(setup.start.unwrap_or(1));
    sb
}

/// The superblock's bytes; under CSUM_V2 with `s_checksum_type` = crc32c, which the
/// superblock API only sets for v3.
fn superblock_bytes(sb: &JournalSuperblock) -> Vec<u8> {
    let mut bytes = sb.encode().to_vec();
    if sb.has_incompat(INCOMPAT_CSUM_V2) {
        bytes[0x50] = 4;
        bytes[0xFC..0x100].fill(0);
        let csum = crc32c_raw(!0, &bytes);
        bytes[0xFC..0x100].copy_from_slice(&csum.to_be_bytes());
    }
    bytes
}

impl Rig {
    fn new(setup: Setup) -> Rig {
        let dev = Arc::new(SimDevice::new(DEVICE_BLOCKS * BS as u64));
        let io = IoQueue::new(dev.clone());
        let area = JournalArea::contiguous(BS as u32, JOURNAL_AT, JOURNAL_BLOCKS);
        let sb = superblock_for(setup);
        let sb = JournalSuperblock::decode(&superblock_bytes(&sb), JOURNAL_BLOCKS).unwrap();
        let rig = Rig {
            dev,
            io,
            area,
            format: LogFormat::from_superblock(&sb),
            position: sb.start(),
            tid: sb.sequence(),
            sb,
            commit_sec: 1_700_000_000,
        };
        rig.put_at(0, &superblock_bytes(&rig.sb));
        rig
    }

    fn put_at(&self, journal_block: u32, bytes: &[u8]) {
        let mut block = vec![0u8; BS];
        block[..bytes.len()].copy_from_slice(bytes);
        self.dev
            .write_at(self.area.byte_offset(journal_block), &block, false)
            .unwrap();
    }

    fn journal_block(&self, journal_block: u32) -> Vec<u8> {
        let mut block = vec![0u8; BS];
        self.dev
            .read_at(self.area.byte_offset(journal_block), &mut block)
            .unwrap();
        block
    }

    fn home(&self, fs_block: u64) -> Vec<u8> {
        let mut block = vec![0u8; BS];
        self.dev.read_at(fs_block * BS as u64, &mut block).unwrap();
        block
    }

    fn set_home(&self, fs_block: u64, data: &[u8]) {
        self.dev
            .write_at(fs_block * BS as u64, data, false)
            .unwrap();
    }

    /// Appends a block to the log, wrapping at the end of the log.
    fn append(&mut self, block: &[u8]) -> u32 {
        let at = self.position;
        self.put_at(at, block);
        self.position = if at + 1 >= self.sb.log_end() {
            self.sb.first()
        } else {
            at + 1
        };
        at
    }

    /// Logs a committed transaction as Linux lays it out: revoke blocks, then each
    /// descriptor followed by its copies, then the commit block.
    fn commit(&mut self, blocks: &[(u64, Vec<u8>)], revokes: &[u64]) -> Logged {
        let (tid, format) = (self.tid, self.format.clone());
        for chunk in revokes.chunks(format.revoke_capacity()) {
            self.append(&format.encode_revoke(tid, chunk));
        }
        let mut v1_sum = !0u32;
        let mut copies = Vec::new();
        let mut descriptor = self.position;
        for chunk in blocks.chunks(format.tag_capacity()) {
            let logged: Vec<(Tag, Vec<u8>)> = chunk
                .iter()
                .map(|(home, data)| {
                    let mut copy = data.clone();
                    let escaped = needs_escape(&copy);
                    if escaped {
                        escape(&mut copy);
                    }
                    let checksum = format.data_checksum(tid, &copy);
                    let tag = Tag {
                        fs_block: *home,
                        escaped,
                        checksum,
                    };
                    (tag, copy)
                })
                .collect();
            let tags: Vec<Tag> = logged.iter().map(|(tag, _)| *tag).collect();
            let block = format.encode_descriptor(tid, &tags);
            v1_sum = crc32_be(v1_sum, &block);
            descriptor = self.append(&block);
            for (_, copy) in logged {
                v1_sum = crc32_be(v1_sum, &copy);
                copies.push(self.append(&copy));
            }
        }
        let mut block = format.encode_commit(
            tid,
            CommitBlock {
                commit_sec: self.commit_sec,
                commit_nsec: 0,
                jext_durable: None,
            },
        );
        if format.csum == Csum::V1 {
            // h_chksum_type 1 (crc32), h_chksum_size 4, h_chksum[0].
            block[0x0C] = 1;
            block[0x0D] = 4;
            block[0x10..0x14].copy_from_slice(&v1_sum.to_be_bytes());
        }
        let commit = self.append(&block);
        self.commit_sec += 1;
        self.tid = tid.wrapping_add(1);
        Logged {
            tid,
            descriptor,
            copies,
            commit,
        }
    }

    fn recover(&self) -> Result<RecoveryReport, JournalError> {
        recover(&self.io, std::slice::from_ref(&self.area))
    }

    fn superblock_now(&self) -> JournalSuperblock {
        JournalSuperblock::decode(&self.journal_block(0), JOURNAL_BLOCKS).unwrap()
    }

    fn writes(&self) -> u64 {
        self.dev.counters().snapshot().writes
    }

    /// Flips one byte of a journal block.
    fn damage(&self, journal_block: u32, offset: usize) {
        let mut block = self.journal_block(journal_block);
        block[offset] ^= 0x55;
        self.put_at(journal_block, &block);
    }
}

fn data(fill: u8) -> Vec<u8> {
    vec![fill; BS]
}

/// Recovery must fail with nothing written.
fn fails_without_writing(rig: &Rig) -> JournalError {
    let before = rig.writes();
    let err = rig.recover().unwrap_err();
    assert_eq!(rig.writes(), before, "recovery wrote despite {err}");
    err
}

#[test]
fn replays_committed_transactions_with_every_checksum_kind() {
    for (csum, wide_blocks) in [
        (Csum::V3, true),
        (Csum::V3, false),
        (Csum::V2, true),
        (Csum::V2, false),
        (Csum::V1, false),
        (Csum::None, true),
        (Csum::None, false),
    ] {
        let mut rig = Rig::new(Setup {
            csum,
            wide_blocks,
            ..V3
        });
        let many: Vec<(u64, Vec<u8>)> = (0..300).map(|i| (100 + i, data(i as u8))).collect();
        let first = rig.commit(&many, &[]);
        let second = rig.commit(&[(100, data(0xA1)), (500, data(0xA2))], &[]);
        let report = rig.recover().unwrap();
        assert_eq!(
            (report.first_tid, report.last_tid, report.transactions),
            (Some(first.tid), Some(second.tid), 2),
            "{csum:?}"
        );
        assert_eq!(report.blocks_replayed, 301);
        assert_eq!(report.copies_superseded, 1);
        assert_eq!(rig.home(100), data(0xA1), "the newest copy wins");
        assert_eq!(rig.home(399), data(43));
        assert_eq!(rig.home(500), data(0xA2));
        // Empty now, and the next tid skips the first one never committed, as Linux does.
        let sb = rig.superblock_now();
        assert_eq!((sb.start(), sb.sequence()), (0, second.tid + 2));
        assert_eq!(sb.head(), second.commit + 1);
        let again = rig.recover().unwrap();
        assert!(again.was_clean && again.transactions == 0);
    }
}

#[test]
fn the_log_wraps_at_its_end_which_excludes_the_fast_commit_area() {
    let setup = Setup {
        fast_commit: true,
        start: Some(JOURNAL_BLOCKS - 256 - 3),
        ..V3
    };
    let mut rig = Rig::new(setup);
    assert_eq!(rig.sb.log_end(), JOURNAL_BLOCKS - 256);
    let blocks: Vec<(u64, Vec<u8>)> = (0..5).map(|i| (200 + i, data(0x30 + i as u8))).collect();
    let first = rig.commit(&blocks, &[]);
    assert_eq!(first.descriptor, JOURNAL_BLOCKS - 259);
    assert_eq!(first.copies[2], 1, "the third copy wrapped to s_first");
    let second = rig.commit(&[(300, data(7))], &[]);
    let report = rig.recover().unwrap();
    assert_eq!(report.last_tid, Some(second.tid));
    for i in 0..5 {
        assert_eq!(rig.home(200 + i), data(0x30 + i as u8));
    }
    assert_eq!(rig.home(300), data(7));
    let sb = rig.superblock_now();
    assert!(
        !sb.has_incompat(INCOMPAT_FAST_COMMIT),
        "cleared as Linux clears it"
    );
}

#[test]
fn revokes_cancel_copies_of_their_own_and_earlier_transactions_only() {
    let mut rig = Rig::new(V3);
    rig.set_home(10, &data(0xEE));
    rig.set_home(11, &data(0xEE));
    rig.commit(&[(10, data(1)), (11, data(1)), (12, data(1))], &[]);
    // Revokes 11 in the same transaction that logs it again: the copy is cancelled too.
    rig.commit(&[(11, data(2))], &[10, 11]);
    // A later transaction logs 12 after a revoke: only the older copy is cancelled.
    rig.commit(&[], &[12]);
    rig.commit(&[(12, data(4))], &[]);
    let report = rig.recover().unwrap();
    assert_eq!(rig.home(10), data(0xEE));
    assert_eq!(rig.home(11), data(0xEE));
    assert_eq!(rig.home(12), data(4));
    assert_eq!((report.copies_revoked, report.blocks_replayed), (4, 1));
}

#[test]
fn escaped_blocks_get_their_magic_back() {
    let mut rig = Rig::new(V3);
    let mut magic = data(9);
    magic[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
    let logged = rig.commit(&[(40, magic.clone()), (41, data(9))], &[]);
    assert_eq!(rig.journal_block(logged.copies[0])[..4], [0; 4]);
    let found = scan(&rig.io, &rig.area).unwrap();
    assert!(found.transactions[0].blocks[0].tag.escaped);
    rig.recover().unwrap();
    assert_eq!(rig.home(40), magic);
}

#[test]
fn a_missing_or_torn_commit_block_ends_the_log_quietly() {
    for tear in ["missing", "damaged", "first sector only"] {
        let mut rig = Rig::new(V3);
        let first = rig.commit(&[(60, data(1))], &[]);
        let torn = rig.commit(&[(61, data(2))], &[]);
        let commit = rig.journal_block(torn.commit);
        match tear {
            "missing" => rig.put_at(torn.commit, &[]),
            "damaged" => rig.damage(torn.commit, 0x31),
            _ => {
                // Linux's commit blocks are zero after their 60-byte header: stale bytes
                // there mean only the first sector reached the disk, which still counts.
                let mut partial = commit.clone();
                partial[512..].fill(0xAB);
                rig.put_at(torn.commit, &partial);
            }
        }
        let found = scan(&rig.io, &rig.area).unwrap();
        let report = rig.recover().unwrap();
        if tear == "first sector only" {
            assert_eq!(report.last_tid, Some(torn.tid));
            assert_eq!(rig.home(61), data(2));
            continue;
        }
        assert_eq!(
            report.last_tid,
            Some(first.tid),
            "{tear}: {}",
            found.end_reason
        );
        assert_eq!(rig.home(60), data(1));
        assert_eq!(
            rig.home(61),
            data(0),
            "{tear}: the torn transaction stays out"
        );
        assert!(
            found.end_reason.contains(&format!("{}", torn.commit)),
            "{tear}"
        );
        assert_eq!(rig.superblock_now().sequence(), torn.tid + 1);
    }
}

#[test]
fn a_damaged_copy_in_a_committed_transaction_is_an_error_naming_it() {
    let mut rig = Rig::new(V3);
    rig.commit(&[(70, data(1))], &[]);
    let bad = rig.commit(&[(71, data(2)), (72, data(3))], &[]);
    rig.damage(bad.copies[1], 100);
    let err = fails_without_writing(&rig);
    let text = err.to_string();
    let expected = format!(
        "journal block {} of committed transaction {} (logged fs block 72): checksum mismatch",
        bad.copies[1], bad.tid
    );
    assert!(text.contains(&expected), "{text}");
    assert!(matches!(
        err,
        JournalError::BlockChecksum { fs_block: 72, .. }
    ));
}

#[test]
fn a_damaged_copy_that_a_revoke_cancels_is_ignored_as_linux_ignores_it() {
    let mut rig = Rig::new(V3);
    let logged = rig.commit(&[(80, data(1)), (81, data(2))], &[]);
    rig.commit(&[], &[80]);
    rig.damage(logged.copies[0], 5);
    let report = rig.recover().unwrap();
    assert_eq!((report.copies_revoked, report.blocks_replayed), (1, 1));
    assert_eq!(rig.home(81), data(2));
}

#[test]
fn a_damaged_descriptor_is_an_error_unless_an_older_commit_shows_stale_log() {
    let mut rig = Rig::new(V3);
    rig.commit(&[(90, data(1))], &[]);
    let bad = rig.commit(&[(91, data(2))], &[]);
    rig.damage(bad.descriptor, 30);
    let err = fails_without_writing(&rig).to_string();
    assert!(
        err.contains(&format!("journal block {}", bad.descriptor)) && err.contains("transaction"),
        "{err}"
    );

    // The same block sequence left over from an earlier lap: its commit is older.
    let mut rig = Rig::new(V3);
    let good = rig.commit(&[(90, data(1))], &[]);
    rig.commit_sec -= 100;
    let stale = rig.commit(&[(91, data(2))], &[]);
    rig.damage(stale.descriptor, 30);
    let report = rig.recover().unwrap();
    assert_eq!(report.last_tid, Some(good.tid));
    assert_eq!(rig.home(91), data(0));
}

#[test]
fn under_async_commit_only_the_last_transaction_may_be_torn() {
    let setup = Setup {
        async_commit: true,
        ..V3
    };
    let mut rig = Rig::new(setup);
    let good = rig.commit(&[(110, data(1))], &[]);
    let torn = rig.commit(&[(111, data(2))], &[]);
    rig.damage(torn.copies[0], 0);
    let report = rig.recover().unwrap();
    assert_eq!(report.last_tid, Some(good.tid));
    assert_eq!(rig.home(111), data(0));
    assert_eq!(rig.superblock_now().sequence(), torn.tid + 1);

    let mut rig = Rig::new(setup);
    let bad = rig.commit(&[(112, data(1))], &[]);
    rig.commit(&[(113, data(2))], &[]);
    rig.damage(bad.copies[0], 0);
    let err = fails_without_writing(&rig);
    assert!(
        matches!(err, JournalError::BlockChecksum { tid, .. } if tid == bad.tid),
        "{err}"
    );
}

#[test]
fn v1_checksums_cover_the_copies() {
    let setup = Setup {
        csum: Csum::V1,
        wide_blocks: false,
        ..V3
    };
    let mut rig = Rig::new(setup);
    rig.commit(&[(120, data(1))], &[]);
    let bad = rig.commit(&[(121, data(2))], &[]);
    rig.damage(bad.copies[0], 9);
    let err = fails_without_writing(&rig).to_string();
    assert!(
        err.contains(&format!("commit block at journal block {}", bad.commit))
            && err.contains(&format!("transaction {}", bad.tid)),
        "{err}"
    );

    // With async commit the same damage is the torn tail.
    let mut rig = Rig::new(Setup {
        async_commit: true,
        ..setup
    });
    let good = rig.commit(&[(120, data(1))], &[]);
    let torn = rig.commit(&[(121, data(2))], &[]);
    rig.damage(torn.copies[0], 9);
    assert_eq!(rig.recover().unwrap().last_tid, Some(good.tid));
}

#[test]
fn tids_wrap_around_32_bits() {
    let mut rig = Rig::new(Setup {
        sequence: u32::MAX - 1,
        ..V3
    });
    rig.commit(&[(130, data(1))], &[131]);
    rig.commit(&[(131, data(2))], &[]);
    let last = rig.commit(&[(130, data(3))], &[]);
    assert_eq!(last.tid, 0);
    let report = rig.recover().unwrap();
    assert_eq!(
        (report.first_tid, report.last_tid),
        (Some(u32::MAX - 1), Some(0))
    );
    assert_eq!(rig.home(130), data(3));
    assert_eq!(
        rig.home(131),
        data(2),
        "the revoke at MAX-1 is older than tid MAX"
    );
    assert_eq!(rig.superblock_now().sequence(), 2);
}

#[test]
fn fast_commits_after_the_last_full_commit_are_returned_and_kept_pending() {
    let mut rig = Rig::new(Setup {
        fast_commit: true,
        ..V3
    });
    let last = rig.commit(&[(140, data(1))], &[]);
    let fc_first = rig.sb.fast_commit_first().unwrap();
    let record = FcRecord::DelRange {
        ino: 12,
        lblk: 3,
        len: 9,
    };
    let mut writer = FastCommitWriter::new(rig.sb.block_size() as usize, last.tid + 1, true);
    writer.push(&record);
    for (i, block) in writer.finish().iter().enumerate() {
        rig.put_at(fc_first + i as u32, block);
    }
    let report = rig.recover().unwrap();
    assert_eq!(report.fast_commits.records, vec![record.clone()]);
    // The journal now points at an empty log of the fast commit's tid, so a second
    // recovery (a crash before the file system applied them) finds them again.
    let again = rig.recover().unwrap();
    assert_eq!(
        (again.transactions, again.fast_commits.records),
        (0, vec![record])
    );

    // A fast commit whose tail never reached the disk is no fast commit.
    let mut rig = Rig::new(Setup {
        fast_commit: true,
        ..V3
    });
    let last = rig.commit(&[(140, data(1))], &[]);
    let mut head = vec![9, 0, 8, 0, 0, 0, 0, 0];
    head.extend_from_slice(&(last.tid + 1).to_le_bytes());
    rig.put_at(fc_first, &head);
    let report = rig.recover().unwrap();
    assert!(report.fast_commits.records.is_empty());
    assert!(rig.recover().unwrap().was_clean, "marked empty");
}

#[test]
fn a_home_block_inside_the_journal_is_refused() {
    let mut rig = Rig::new(V3);
    rig.commit(&[(JOURNAL_AT + 5, data(1))], &[]);
    let err = fails_without_writing(&rig).to_string();
    assert!(err.contains("inside the journal"), "{err}");
    let mut rig = Rig::new(V3);
    rig.commit(&[(DEVICE_BLOCKS, data(1))], &[]);
    let err = fails_without_writing(&rig).to_string();
    assert!(err.contains("beyond the device"), "{err}");
}

#[test]
fn a_clean_journal_is_left_alone_and_a_dirty_empty_one_is_reset() {
    let rig = Rig::new(V3);
    let mut sb = rig.sb.clone();
    sb.set_start(0);
    rig.put_at(0, &sb.encode());
    let before = rig.writes();
    let report = rig.recover().unwrap();
    assert!(report.was_clean);
    assert_eq!(rig.writes(), before);

    // s_start set but nothing committed (a crash right after Linux loaded the journal).
    let rig = Rig::new(V3);
    let report = rig.recover().unwrap();
    assert!(!report.was_clean && report.transactions == 0);
    let sb = rig.superblock_now();
    assert_eq!((sb.start(), sb.sequence()), (0, V3.sequence + 1));
}

#[test]
fn scan_lists_transactions_with_their_tags_and_revokes_without_writing() {
    let mut rig = Rig::new(V3);
    let first = rig.commit(&[(150, data(1)), (151, data(2))], &[]);
    rig.commit(&[], &[150]);
    let before = rig.writes();
    let found = scan(&rig.io, &rig.area).unwrap();
    assert_eq!(rig.writes(), before);
    assert_eq!(found.transactions.len(), 2);
    let t = &found.transactions[0];
    assert_eq!((t.tid, t.commit_block), (first.tid, first.commit));
    let homes: Vec<u64> = t.blocks.iter().map(|b| b.tag.fs_block).collect();
    assert_eq!(homes, [150, 151]);
    assert_eq!(t.blocks[1].journal_block, first.copies[1]);
    assert_eq!(found.transactions[1].revokes, [150]);
    assert_eq!(found.end_tid, first.tid + 2);
    assert!(
        found.end_reason.contains("no JBD2 magic"),
        "{}",
        found.end_reason
    );
}
