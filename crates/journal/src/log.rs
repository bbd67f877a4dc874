//! The log as the commit path sees it: the circular range of journal blocks, and how a
//! transaction's blocks are laid out in it (revoke blocks, then descriptor blocks each
//! followed by the blocks they describe, then the commit block).
//!
//! Nothing here does IO except [`LogLayout::load`]; the commit path decides when to write.
//!
//! [`CommitMode`] says how a transaction reaches the disk. `Classic` is JBD2's: the
//! logged blocks, a flush, then the commit block with FUA (two syncs). `SingleIo` (JoJ's
//! single-I/O commit): revoke, descriptor, logged and commit blocks in one sequential
//! write, split only where the log wraps, then one flush. It is crash-atomic only because
//! jext's recovery counts a transaction only when every block of it checks, which needs
//! checksum v3; from before the first single-I/O commit until the log is next emptied
//! (clean unmount, remount read-only), the journal superblock carries `JEXT_SINGLE_IO`,
//! so Linux refuses such a log instead of replaying a torn transaction. A log that only
//! ever held classic commits (every transaction had ordered data) stays Linux-readable.
//!
//! A single-I/O transaction without revokes whose tags and records fit one block goes as a
//! compact commit instead (`crate::format::compact`): that block, then its copies.
//!
//! [`RecordMode`] says what a logged block is written as. `Blocks` is JBD2's: a whole copy
//! behind a descriptor tag. `Bytes` (the default, on logs with checksum v2/v3): the commit
//! path may write a block as a byte-range record instead (`crate::format::records`), packed
//! into records blocks after the descriptors; the superblock then carries
//! `JEXT_RECORDS` the same way, from before the first such transaction until the log is
//! next emptied.

use crate::format::blocks::{needs_escape, CommitBlock, Csum, LogFormat, Tag};
use crate::format::compact::CompactCommit;
use crate::format::records::{pack, Record};
use crate::format::superblock::{JournalSuperblock, INCOMPAT_JEXT_PERCORE};
use crate::recovery::{read_superblock, write_superblock};
use crate::tid::Tid;
use crate::{JournalArea, JournalError};
use jext_io::{IoFlags, IoQueue};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A commit at `now`, saying `durable` if it is a single-I/O one.
fn commit_time(now: SystemTime, durable: Option<Tid>) -> CommitBlock {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    CommitBlock {
        commit_sec: since.as_secs(),
        commit_nsec: since.subsec_nanos(),
        jext_durable: durable,
    }
}

/// Journal features the file system wants, applied at load as ext4 does at mount.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogFeatures {
    /// Use checksum v3 (the file system has metadata_csum).
    pub csum_v3: bool,
    /// Use 64-bit block numbers in tags (the file system has 64bit).
    pub wide_blocks: bool,
    /// Keep the fast-commit area at the end of the journal out of the log, and say so in
    /// the superblock (the file system has fast_commit), as ext4 does at mount, so that
    /// jext and the kernel wrap the log at the same block.
    pub fast_commit: bool,
}

/// How a commit reaches the disk (module comment); mount option `journal_commit=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CommitMode {
    /// One sequential write (descriptors, logged blocks, commit block) and one flush.
    /// Falls back to `Classic` on a journal without checksum v3.
    #[default]
    SingleIo,
    /// The logged blocks, a flush, then the commit block with FUA (JBD2's way).
    Classic,
}

impl CommitMode {
    /// The mount option's value for this mode.
    pub fn name(self) -> &'static str {
        match self {
            CommitMode::SingleIo => "single_io",
            CommitMode::Classic => "classic",
        }
    }
}

/// What a logged block is written as (module comment); mount option `journal_records=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RecordMode {
    /// The changed byte ranges when they take at most half a block, else the whole block.
    /// Falls back to `Blocks` on a journal without checksum v2/v3.
    #[default]
    Bytes,
    /// Always the whole block (JBD2's way; a log Linux can replay once it is not torn).
    Blocks,
}

impl RecordMode {
    /// The mount option's value for this mode.
    pub fn name(self) -> &'static str {
        match self {
            RecordMode::Bytes => "bytes",
            RecordMode::Blocks => "blocks",
        }
    }
}

/// How a transaction's logged blocks go to the log: whole copies behind descriptors, and
/// byte records.
#[derive(Default)]
pub(crate) struct LogPlan {
    pub full: Vec<(u64, Arc<[u8]>)>,
    pub records: Vec<Record>,
}

pub(crate) struct LogLayout {
    /// First journal block of the circular log.
    pub first: u32,
    /// One past the last log block (fast-commit blocks, if any, come after).
    pub last: u32,
    format: LogFormat,
    superblock: JournalSuperblock,
    /// The bytes of journal block 0 beyond the superblock, kept as they are.
    block0: Vec<u8>,
    /// Commits go out as one write and one flush (`CommitMode::SingleIo` on a v3 log).
    single_io: bool,
    /// Logged blocks may be written as byte records (`RecordMode::Bytes` on a v2/v3 log).
    records: bool,
    /// Bits of `INCOMPAT_JEXT_LIVE_LOG` for what was issued since the log was last empty
    /// (a single-I/O commit, a byte record): every superblock that says the log is live
    /// carries them until the log is emptied.
    live_bits: AtomicU32,
    /// Private incompat bits every superblock saying the log is not empty carries
    /// (`ijournal=percore`); one saying it is empty carries none.
    pub(crate) private_incompat: u32,
}

impl LogLayout {
    /// Reads the superblock of a journal that recovery already emptied (or left pointing
    /// at an empty log, `fast_commits_pending`), turning on the requested features first
    /// (and writing them at once when `write` allows).
    pub fn load(
        io: &IoQueue,
        area: &JournalArea,
        features: LogFeatures,
        commit_mode: CommitMode,
        record_mode: RecordMode,
        write: bool,
        fast_commits_pending: bool,
    ) -> Result<LogLayout, JournalError> {
        let mut superblock = read_superblock(io, area)?;
        if !superblock.is_clean() && !fast_commits_pending {
            return Err(JournalError::NeedsRecovery);
        }
        let before = superblock.clone();
        if features.csum_v3 {
            superblock.enable_csum_v3(features.wide_blocks);
        }
        if features.fast_commit {
            superblock.enable_fast_commit();
        }
        // An empty log (or one recovery left pointing at no transaction, with fast
        // commits pending) holds no single-I/O transaction and no byte record.
        superblock.set_live_log_bits(0);
        if write && superblock != before {
            write_superblock(io, area, &superblock, IoFlags::PREFLUSH | IoFlags::FUA)?;
        }
        let mut block0 = vec![0u8; area.block_size as usize];
        io.read(area.byte_offset(0), &mut block0)?;
        let format = LogFormat::from_superblock(&superblock);
        Ok(LogLayout {
            first: superblock.first(),
            last: superblock.log_end(),
            single_io: commit_mode == CommitMode::SingleIo && format.csum == Csum::V3,
            records: record_mode == RecordMode::Bytes && format.has_block_checksums(),
            live_bits: AtomicU32::new(0),
            format,
            superblock,
            block0,
            private_incompat: 0,
        })
    }

    /// Whether commits go out as one write and one flush.
    pub fn single_io(&self) -> bool {
        self.single_io
    }

    /// Whether logged blocks may be written as byte records.
    pub fn records(&self) -> bool {
        self.records
    }

    /// The live-log bits superblocks of a live log carry now.
    pub fn live_bits(&self) -> u32 {
        self.live_bits.load(Ordering::Acquire)
    }

    /// From now until the log is emptied, superblocks of a live log carry `bits` (of
    /// `INCOMPAT_JEXT_LIVE_LOG`). The caller must make such a superblock durable before
    /// the first transaction that needs them can reach the disk.
    pub fn set_live_bits(&self, bits: u32) {
        self.live_bits.fetch_or(bits, Ordering::AcqRel);
    }

    /// Byte records are worth it up to this many bytes an entry; past it the whole block
    /// goes (half a block: the descriptor tag a whole copy needs is small, and records
    /// blocks are rarely full, so a record must save much to save anything).
    pub fn record_limit(&self) -> usize {
        self.format.block_size / 2
    }

    /// Where the superblock says the log starts, if it is not marked empty.
    pub fn start(&self) -> Option<u32> {
        (!self.superblock.is_clean()).then(|| self.superblock.start())
    }

    /// The fast-commit area as (first journal block, blocks jext writes), if the feature
    /// is on. The area's last block stays unwritten: Linux's replay scan reads on while
    /// fast commits continue and fails the mount ("corrupted journal superblock") if
    /// they run to the end of the journal, so a full area must end before its last block.
    pub fn fast_commit_area(&self) -> Option<(u32, u32)> {
        let first = self.superblock.fast_commit_first()?;
        let len = self
            .superblock
            .maxlen()
            .checked_sub(first)?
            .checked_sub(1)?;
        (len > 0).then_some((first, len))
    }

    /// The tid the next transaction must carry.
    pub fn sequence(&self) -> Tid {
        self.superblock.sequence()
    }

    /// The log block after `block`, wrapping at the end.
    pub fn next(&self, block: u32) -> u32 {
        if block + 1 >= self.last {
            self.first
        } else {
            block + 1
        }
    }

    /// Free log blocks when the live log is `[tail, head)`. One block stays unused so that
    /// a full log is never mistaken for an empty one.
    pub fn free_between(&self, tail: u32, head: u32) -> u32 {
        let len = self.last - self.first;
        let used = (head + len - tail) % len;
        len - used - 1
    }

    /// Log blocks a transaction of `blocks` logged blocks and `revokes` revoke records
    /// takes, commit block included.
    pub fn log_blocks_needed(&self, blocks: usize, revokes: usize) -> u32 {
        let descriptors = blocks.div_ceil(self.format.tag_capacity());
        let revoke_blocks = revokes.div_ceil(self.format.revoke_capacity());
        (descriptors + blocks + revoke_blocks + 1) as u32
    }

    /// Log blocks `plan` takes with `revokes` revoke records, commit block included; never
    /// more than [`LogLayout::log_blocks_needed`] for the same blocks whole (a record is
    /// at most half a block, so one records block is the most any record costs). A
    /// `compact` transaction takes its compact commit block and its copies.
    pub fn plan_blocks_needed(&self, plan: &LogPlan, revokes: usize, compact: bool) -> u32 {
        if compact {
            return 1 + plan.full.len() as u32;
        }
        let records = pack(&plan.records, self.format.block_size).len() as u32;
        self.log_blocks_needed(plan.full.len(), revokes) + records
    }

    /// Whether a single-I/O transaction of `plan` with `revokes` revoke records can go out
    /// as a compact commit (`crate::format::compact`): no revokes, and its tags and
    /// records fit one block.
    pub fn compact_fits(&self, plan: &LogPlan, revokes: usize) -> bool {
        self.single_io && revokes == 0 && self.format.compact_fits(plan.full.len(), &plan.records)
    }

    /// The log blocks of transaction `tid`, in log order, without the commit block:
    /// revoke blocks, descriptors each followed by its copies, records blocks.
    pub fn build_log_blocks(&self, tid: Tid, plan: &LogPlan, revokes: &[u64]) -> Vec<Arc<[u8]>> {
        let blocks = &plan.full;
        let needed = self.plan_blocks_needed(plan, revokes.len(), false);
        let mut out = Vec::with_capacity(needed as usize);
        for chunk in revokes.chunks(self.format.revoke_capacity()) {
            out.push(Arc::from(self.format.encode_revoke(tid, chunk)));
        }
        for chunk in blocks.chunks(self.format.tag_capacity()) {
            let (tags, logged): (Vec<Tag>, Vec<Arc<[u8]>>) = chunk
                .iter()
                .map(|(home, data)| self.logged_copy(tid, *home, data))
                .unzip();
            out.push(Arc::from(self.format.encode_descriptor(tid, &tags)));
            out.extend(logged);
        }
        for group in pack(&plan.records, self.format.block_size) {
            out.push(Arc::from(self.format.encode_records(tid, group)));
        }
        out
    }

    /// The log blocks of transaction `tid` as a compact commit ([`LogLayout::compact_fits`]
    /// said it fits): the compact commit block, then the copies. `durable`: every
    /// transaction up to it was durable before this write is issued.
    pub fn build_compact(
        &self,
        tid: Tid,
        plan: &LogPlan,
        now: SystemTime,
        durable: Tid,
    ) -> Vec<Arc<[u8]>> {
        let (tags, logged): (Vec<Tag>, Vec<Arc<[u8]>>) = plan
            .full
            .iter()
            .map(|(home, data)| self.logged_copy(tid, *home, data))
            .unzip();
        let compact = CompactCommit {
            commit: commit_time(now, Some(durable)),
            tags,
            records: plan.records.clone(),
        };
        let mut out = Vec::with_capacity(1 + logged.len());
        out.push(Arc::from(self.format.encode_compact(tid, &compact)));
        out.extend(logged);
        out
    }

    /// The copy of home block `home` (`data`) as transaction `tid` logs it, escaped if it
    /// starts with the magic, and the tag that describes it.
    fn logged_copy(&self, tid: Tid, home: u64, data: &Arc<[u8]>) -> (Tag, Arc<[u8]>) {
        assert_eq!(
            data.len(),
            self.format.block_size,
            "logged block {home} has the wrong size"
        );
        let escaped = needs_escape(data);
        let copy: Arc<[u8]> = if escaped {
            let mut bytes = data.to_vec();
            bytes[..4].fill(0);
            Arc::from(bytes)
        } else {
            data.clone()
        };
        let tag = Tag {
            fs_block: home,
            escaped,
            checksum: self.format.data_checksum(tid, &copy),
        };
        (tag, copy)
    }

    /// The commit block of transaction `tid`; a single-I/O commit also says which
    /// transactions were durable before it was written (`durable`).
    pub fn commit_block(&self, tid: Tid, now: SystemTime, durable: Option<Tid>) -> Arc<[u8]> {
        Arc::from(self.format.encode_commit(tid, commit_time(now, durable)))
    }

    /// Journal block 0 with the superblock saying the live log starts at `start` with
    /// transaction `sequence` (`start` 0: the log is empty, and the caller writes this
    /// at once with nothing committing: the live-log bits are cleared and stay so until
    /// the next transaction that needs them).
    pub fn superblock_block(&self, start: u32, sequence: Tid) -> Arc<[u8]> {
        let mut sb = self.superblock.clone();
        sb.set_start(start);
        sb.set_sequence(sequence);
        if start == 0 {
            self.live_bits.store(0, Ordering::Release);
        }
        sb.set_live_log_bits(self.live_bits());
        // The per-core bit only while the log is not empty: an empty log replays nothing,
        // rings included, and Linux may then use the journal.
        let incompat = sb.feature_incompat() | self.private_incompat;
        sb.set_feature_incompat(match start {
            0 => incompat & !INCOMPAT_JEXT_PERCORE,
            _ => incompat,
        });
        let mut block = self.block0.clone();
        let bytes = sb.encode();
        block[..bytes.len()].copy_from_slice(&bytes);
        Arc::from(block)
    }
}
