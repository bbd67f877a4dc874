//! Recovery: replays the committed transactions a crash left in the journal, with JBD2's
//! three passes, then marks the journal empty.
//!
//! 1. **Scan** each log from its start (`s_start`, `s_sequence`), following descriptor,
//!    revoke and commit blocks of consecutive tids and wrapping at the end of the log, to
//!    the last transaction whose commit block is whole. The first block that is not the
//!    next one expected ends the log: that is the torn tail a crash leaves, and is normal.
//! 2. **Revoke**: for every revoked block, the newest tid that revoked it.
//! 3. **Replay**: every logged copy not revoked at or after its own tid is checked against
//!    its tag checksum, and then the newest copy of each block is written home, then a
//!    flush, then the journal superblock says the log is empty.
//! 4. **Fast commits** (ext4's, in the area after the log): those whose tid is the first
//!    one not in the log are read and returned for the file system to apply, which it
//!    does as its first transaction; until that commits, the superblock points at an
//!    empty log of that tid, so a crash meanwhile finds the same fast commits again.
//!    With jext's private per-core bit the area holds rings of i-transactions instead
//!    (`crate::percore::scan`): those of that tid, in sub-tid order up to the first
//!    missing one, are returned the same way, and the data blocks they carry are written
//!    home with the log's copies, after them (their tid is later than every logged one).
//!
//! A scan yields a list of committed transactions per log; the revoke and replay passes
//! run over all logs' transactions merged in tid order. A log is described by
//! [`LogBounds`], not by a JBD2 superblock, so that logs without one can take part.
//!
//! jext's byte records (`crate::format::records`) replay in the same tid order as the
//! copies: a whole copy or a ZEROED record sets the block, a DELTA record patches what the
//! block is so far (its home contents when no earlier record of it replays). Revokes
//! cancel records as they cancel copies. The journal writes a DELTA only on a base that
//! this order rebuilds (`crate::commit`).
//!
//! A log whose superblock carries JEXT_SINGLE_IO (`crate::log::CommitMode::SingleIo`)
//! wrote each transaction with its commit block in one write: there, a transaction counts
//! only if every block of it checks (descriptor and revoke tails, each tag, the commit
//! block), and the first that does not is the torn tail that ends the log. Only such a
//! log may hold compact commits (`crate::format::compact`): the commit block first, with
//! the transaction's tags and records, then its copies.
//!
//! Promises: nothing is written unless every copy to replay verified and every home block
//! is on the device outside the journal; a committed transaction whose contents do not
//! verify is an error naming the journal block, the tid and the home block, never skipped.
//! Where Linux and jext differ, it is said at the place in the code (`Linux:`).
//! Must never: write before the passes finish, guess past a damaged block, panic on bytes.

use crate::format::blocks::{unescape, BlockKind, CommitBlock, Csum, LogFormat, Tag};
use crate::format::crc32_be;
use crate::format::fast_commit::{self, FastCommitScan};
use crate::format::records::{Record, RecordKind};
use crate::format::superblock::{
    JournalSuperblock, INCOMPAT_ASYNC_COMMIT, INCOMPAT_JEXT_PERCORE, INCOMPAT_JEXT_SINGLE_IO,
};
use crate::tid::{tid_geq, Tid};
use crate::{JournalArea, JournalError};
use jext_io::{IoFlags, IoQueue, WriteRequest};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Where a log lies in its area and where its live part starts: all the scan needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBounds {
    pub format: LogFormat,
    /// First log block.
    pub first: u32,
    /// One past the last log block: the scan wraps from here to `first`.
    pub end: u32,
    /// Journal block of the oldest live transaction.
    pub start: u32,
    /// Its tid.
    pub sequence: Tid,
    /// ASYNC_COMMIT: a commit block may reach the disk before its transaction's blocks.
    pub async_commit: bool,
    /// JEXT_SINGLE_IO: transactions were written with their commit block in one write;
    /// the first whose blocks do not all check is the torn tail and ends the log.
    pub single_io: bool,
}

impl LogBounds {
    /// The bounds a JBD2 superblock gives (the fast-commit area stays out of the log).
    pub fn from_superblock(sb: &JournalSuperblock) -> LogBounds {
        LogBounds {
            format: LogFormat::from_superblock(sb),
            first: sb.first(),
            end: sb.log_end(),
            start: sb.start(),
            sequence: sb.sequence(),
            async_commit: sb.has_incompat(INCOMPAT_ASYNC_COMMIT),
            single_io: sb.has_incompat(INCOMPAT_JEXT_SINGLE_IO),
        }
    }

    fn next(&self, block: u32) -> u32 {
        if block + 1 >= self.end {
            self.first
        } else {
            block + 1
        }
    }
}

/// A block a transaction logged: where its copy sits in the log and where it belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedBlock {
    pub journal_block: u32,
    pub tag: Tag,
}

/// A byte record a transaction logged, and the records block that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedRecord {
    pub journal_block: u32,
    pub record: Record,
}

/// One committed transaction found by the scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedTransaction {
    pub tid: Tid,
    /// Journal block of the transaction's first log block.
    pub first_block: u32,
    pub commit_block: u32,
    pub commit: CommitBlock,
    pub blocks: Vec<LoggedBlock>,
    /// Blocks logged as byte records (checked already: their records block's tail).
    pub records: Vec<LoggedRecord>,
    pub revokes: Vec<u64>,
}

/// What the scan of one log found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScan {
    pub transactions: Vec<ScannedTransaction>,
    /// The first tid not replayed (the kernel's `end_transaction`).
    pub end_tid: Tid,
    /// The journal block after the last replayed commit block (the kernel's `head_block`).
    pub head_block: u32,
    /// Journal blocks walked, logged copies included.
    pub blocks_scanned: u32,
    /// Why the scan stopped where it did ("journal block 40: sequence 7, expected 6").
    pub end_reason: String,
}

/// What the scan of a JBD2 journal area found, with its superblock (for `jext debug`).
#[derive(Clone, Debug)]
pub struct ScanReport {
    pub superblock: JournalSuperblock,
    /// The fast commits recovery would hand to the file system.
    pub fast_commits: FastCommitScan,
    /// With the private per-core bit: every valid i-transaction of the tid after the log
    /// (`fast_commits` then holds those that replay, in sub-tid order).
    pub rings: Vec<crate::percore::RingEntry>,
    pub transactions: Vec<ScannedTransaction>,
    pub end_tid: Tid,
    pub head_block: u32,
    pub blocks_scanned: u32,
    pub end_reason: String,
}

/// What recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Every journal was marked empty (`s_start` = 0): there was nothing to do.
    pub was_clean: bool,
    pub first_tid: Option<Tid>,
    pub last_tid: Option<Tid>,
    /// Committed transactions replayed.
    pub transactions: usize,
    /// Home blocks written (each once, with its newest copy).
    pub blocks_replayed: usize,
    /// Logged copies skipped because a revoke at or after their tid cancelled them.
    pub copies_revoked: usize,
    /// Logged copies superseded by a newer copy of the same block.
    pub copies_superseded: usize,
    /// Byte records applied (each on top of what its block was so far).
    pub records_replayed: usize,
    pub blocks_scanned: u32,
    /// Fast commits after the last replayed transaction, for the file system to apply
    /// (the journal stays pending until it commits them: see `mark_fast_commits_pending`).
    pub fast_commits: FastCommitScan,
}

pub(crate) fn read_block(
    io: &IoQueue,
    area: &JournalArea,
    block: u32,
) -> Result<Vec<u8>, JournalError> {
    let mut buf = vec![0u8; area.block_size as usize];
    io.read(area.byte_offset(block), &mut buf)?;
    Ok(buf)
}

/// Reads and validates an area's journal superblock.
pub fn read_superblock(
    io: &IoQueue,
    area: &JournalArea,
) -> Result<JournalSuperblock, JournalError> {
    let sb = JournalSuperblock::decode(&read_block(io, area, 0)?, area.len_blocks())?;
    if sb.block_size() != area.block_size {
        return Err(JournalError::Corrupt {
            structure: "journal superblock",
            journal_block: 0,
            problem: format!(
                "s_blocksize {} differs from the file system block size {}",
                sb.block_size(),
                area.block_size
            ),
        });
    }
    Ok(sb)
}

/// Writes `sb` over the first 1024 bytes of journal block 0, keeping the rest of it.
pub fn write_superblock(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
    flags: IoFlags,
) -> Result<(), JournalError> {
    let mut block = read_block(io, area, 0)?;
    let bytes = sb.encode();
    block[..bytes.len()].copy_from_slice(&bytes);
    io.write(area.byte_offset(0), Arc::from(block), flags)?;
    Ok(())
}

/// The scan pass over a JBD2 journal area (read-only).
pub fn scan(io: &IoQueue, area: &JournalArea) -> Result<ScanReport, JournalError> {
    let superblock = read_superblock(io, area)?;
    let log = scan_superblock_log(io, area, &superblock)?;
    let (fast_commits, rings) = scan_after_log(io, area, &superblock, log.end_tid)?;
    Ok(ScanReport {
        superblock,
        fast_commits,
        rings,
        transactions: log.transactions,
        end_tid: log.end_tid,
        head_block: log.head_block,
        blocks_scanned: log.blocks_scanned,
        end_reason: log.end_reason,
    })
}

fn scan_superblock_log(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
) -> Result<LogScan, JournalError> {
    if sb.is_clean() {
        return Ok(LogScan {
            end_tid: sb.sequence(),
            head_block: sb.head(),
            end_reason: "clean journal (s_start = 0)".into(),
            ..LogScan::default()
        });
    }
    scan_log(io, area, &LogBounds::from_superblock(sb))
}

/// The scan pass over one log (read-only): its committed transactions, in log order.
pub fn scan_log(
    io: &IoQueue,
    area: &JournalArea,
    bounds: &LogBounds,
) -> Result<LogScan, JournalError> {
    assert!(
        bounds.first < bounds.end
            && bounds.end <= area.len_blocks()
            && (bounds.first..bounds.end).contains(&bounds.start),
        "log bounds {bounds:?} outside an area of {} blocks",
        area.len_blocks()
    );
    let mut scanner = Scanner {
        io,
        area,
        bounds,
        position: bounds.start,
        tid: bounds.sequence,
        pending: Pending::at(bounds.start),
        last_commit_sec: 0,
        torn_candidate: None,
        single_io_torn: None,
        out: LogScan {
            head_block: bounds.start,
            ..LogScan::default()
        },
    };
    scanner.run()?;
    Ok(scanner.out)
}

/// A transaction being read, before its commit block is seen.
struct Pending {
    first_block: u32,
    blocks: Vec<LoggedBlock>,
    records: Vec<LoggedRecord>,
    revokes: Vec<u64>,
    /// A descriptor or revoke block failed its checksum: only a commit block older than
    /// the previous one (stale contents of an earlier lap) may end this without an error.
    suspect_block: Option<u32>,
    /// v1 only: crc32_be over the descriptors and copies so far.
    v1_sum: u32,
}

impl Pending {
    fn at(first_block: u32) -> Pending {
        Pending {
            first_block,
            blocks: Vec::new(),
            records: Vec::new(),
            revokes: Vec::new(),
            suspect_block: None,
            v1_sum: !0,
        }
    }
}

/// What one metadata block means for the scan.
enum Step {
    Continue,
    End(String),
}

struct Scanner<'a> {
    io: &'a IoQueue,
    area: &'a JournalArea,
    bounds: &'a LogBounds,
    position: u32,
    tid: Tid,
    pending: Pending,
    last_commit_sec: u64,
    /// Under async commit: a committed transaction whose copies do not verify. It is the
    /// torn tail if nothing commits after it, and corruption otherwise.
    torn_candidate: Option<(Tid, JournalError)>,
    /// Under JEXT_SINGLE_IO: the first transaction whose blocks do not all check. The log
    /// ends before it, unless a later whole commit was written after it was durable.
    single_io_torn: Option<(Tid, JournalError)>,
    out: LogScan,
}

impl Scanner<'_> {
    fn run(&mut self) -> Result<(), JournalError> {
        let log_len = self.bounds.end - self.bounds.first;
        loop {
            let step = if self.out.blocks_scanned >= log_len {
                Step::End("scanned the whole log".into())
            } else {
                self.step()?
            };
            if let Step::End(reason) = step {
                self.finish(reason);
                return Ok(());
            }
        }
    }

    fn step(&mut self) -> Result<Step, JournalError> {
        let at = self.position;
        let block = read_block(self.io, self.area, at)?;
        self.out.blocks_scanned += 1;
        let Some((kind, seq)) = self.bounds.format.header(&block) else {
            return Ok(Step::End(format!("journal block {at}: no JBD2 magic")));
        };
        if seq != self.tid {
            return Ok(Step::End(format!(
                "journal block {at}: sequence {seq}, expected {}",
                self.tid
            )));
        }
        match kind {
            BlockKind::Descriptor => self.descriptor(&block),
            BlockKind::Revoke => self.revoke(&block),
            BlockKind::Records => self.records(&block),
            BlockKind::Commit => self.commit(&block),
            BlockKind::Compact => self.compact(&block),
            BlockKind::Other(t) => Ok(Step::End(format!(
                "journal block {at}: block type {t} in transaction {seq}"
            ))),
        }
    }

    fn descriptor(&mut self, block: &[u8]) -> Result<Step, JournalError> {
        let format = &self.bounds.format;
        if !format.tail_is_valid(block) {
            self.pending.suspect_block.get_or_insert(self.position);
        }
        let v1 = format.csum == Csum::V1;
        if v1 {
            self.pending.v1_sum = crc32_be(self.pending.v1_sum, block);
        }
        for tag in format.decode_descriptor(block) {
            self.position = self.bounds.next(self.position);
            self.out.blocks_scanned += 1;
            if v1 {
                let copy = read_block(self.io, self.area, self.position)?;
                self.pending.v1_sum = crc32_be(self.pending.v1_sum, &copy);
            }
            self.pending.blocks.push(LoggedBlock {
                journal_block: self.position,
                tag,
            });
        }
        self.position = self.bounds.next(self.position);
        Ok(Step::Continue)
    }

    fn revoke(&mut self, block: &[u8]) -> Result<Step, JournalError> {
        let format = &self.bounds.format;
        if format.tail_is_valid(block) {
            let records = format.decode_revoke(block, self.position)?;
            self.pending.revokes.extend(records);
        } else {
            self.pending.suspect_block.get_or_insert(self.position);
        }
        self.position = self.bounds.next(self.position);
        Ok(Step::Continue)
    }

    fn records(&mut self, block: &[u8]) -> Result<Step, JournalError> {
        let format = &self.bounds.format;
        if format.has_block_checksums() && !format.tail_is_valid(block) {
            self.pending.suspect_block.get_or_insert(self.position);
        } else {
            let journal_block = self.position;
            let records = format.decode_records(block, journal_block)?;
            self.pending
                .records
                .extend(records.into_iter().map(|record| LoggedRecord {
                    journal_block,
                    record,
                }));
        }
        self.position = self.bounds.next(self.position);
        Ok(Step::Continue)
    }

    fn commit(&mut self, block: &[u8]) -> Result<Step, JournalError> {
        let (at, tid) = (self.position, self.tid);
        let format = &self.bounds.format;
        let commit = format.decode_commit(block);
        let stale = commit.commit_sec < self.last_commit_sec;
        if let Some(bad) = self.pending.suspect_block {
            if stale {
                return Ok(Step::End(format!(
                    "journal block {at}: transaction {tid} is stale (committed at {}s, before \
                     the previous commit at {}s)",
                    commit.commit_sec, self.last_commit_sec
                )));
            }
            if self.bounds.single_io {
                return Ok(Step::End(format!(
                    "journal block {bad}: a descriptor or revoke block of transaction {tid} \
                     does not check: the torn tail of a single-I/O commit"
                )));
            }
            return Err(JournalError::Corrupt {
                structure: "descriptor or revoke block",
                journal_block: bad,
                problem: format!(
                    "checksum mismatch inside transaction {tid}, committed at journal block {at}"
                ),
            });
        }
        let intact = if format.csum == Csum::V1 {
            format.commit_matches_v1(block, self.pending.v1_sum)
        } else {
            format.commit_is_valid(block)
        };
        if !intact {
            return self.damaged_commit(at, tid, stale);
        }
        let after = self.bounds.next(at);
        self.close(at, commit, after)
    }

    /// A compact commit (`crate::format::compact`): the transaction's tags, records and
    /// commit in its first block, its copies after it. Only single-I/O logs hold them,
    /// so the transaction counts only if this block and every copy check.
    fn compact(&mut self, block: &[u8]) -> Result<Step, JournalError> {
        let (at, tid) = (self.position, self.tid);
        let format = &self.bounds.format;
        if !self.bounds.single_io {
            return Ok(Step::End(format!(
                "journal block {at}: a compact commit of transaction {tid} in a log without \
                 JEXT_SINGLE_IO"
            )));
        }
        let pending = &self.pending;
        if !(pending.blocks.is_empty() && pending.records.is_empty() && pending.revokes.is_empty())
            || pending.suspect_block.is_some()
        {
            return Ok(Step::End(format!(
                "journal block {at}: a compact commit after other blocks of transaction {tid}"
            )));
        }
        if !format.tail_is_valid(block) {
            return Ok(Step::End(format!(
                "journal block {at}: the compact commit of transaction {tid} does not check \
                 (the torn tail of a single-I/O commit)"
            )));
        }
        let compact = format.decode_compact(block, at)?;
        for tag in compact.tags {
            self.position = self.bounds.next(self.position);
            self.out.blocks_scanned += 1;
            self.pending.blocks.push(LoggedBlock {
                journal_block: self.position,
                tag,
            });
        }
        self.pending
            .records
            .extend(compact.records.into_iter().map(|record| LoggedRecord {
                journal_block: at,
                record,
            }));
        let after = self.bounds.next(self.position);
        self.close(at, compact.commit, after)
    }

    /// Ends the pending transaction, whose commit (at `commit_block`) verified; the next
    /// transaction starts at `after`.
    fn close(
        &mut self,
        commit_block: u32,
        commit: CommitBlock,
        after: u32,
    ) -> Result<Step, JournalError> {
        let (at, tid, format) = (commit_block, self.tid, &self.bounds.format);
        if let Some((_, err)) = self.torn_candidate.take() {
            return Err(err);
        }
        let pending = std::mem::replace(&mut self.pending, Pending::at(0));
        let transaction = ScannedTransaction {
            tid,
            first_block: pending.first_block,
            commit_block: at,
            commit,
            blocks: pending.blocks,
            records: pending.records,
            revokes: pending.revokes,
        };
        if self.bounds.single_io {
            // Written in one write with its commit block, flushed once after: torn unless
            // every block checks. Only writes after the last completed flush can be torn,
            // and nothing written with or after them was acknowledged, so the log ends at
            // the first torn one; a later commit that says it was written after that one
            // was durable proves damage instead.
            let verified = verify_copies(self.io, self.area, format, &transaction, |_| true);
            if let Some((torn, _)) = &self.single_io_torn {
                let durable_after = commit.jext_durable.is_some_and(|d| tid_geq(d, *torn));
                if verified.is_ok() && durable_after {
                    let (_, err) = self.single_io_torn.take().expect("checked above");
                    return Err(err);
                }
            } else if let Err(err) = verified {
                self.single_io_torn = Some((tid, err));
            }
        } else if self.bounds.async_commit {
            if let Err(err) = verify_copies(self.io, self.area, format, &transaction, |_| true) {
                self.torn_candidate = Some((tid, err));
            }
        }
        self.last_commit_sec = commit.commit_sec;
        self.tid = tid.wrapping_add(1);
        self.position = after;
        if self.torn_candidate.is_none() && self.single_io_torn.is_none() {
            self.out.transactions.push(transaction);
            self.out.head_block = self.position;
        }
        self.pending = Pending::at(self.position);
        Ok(Step::Continue)
    }

    /// A commit block of the expected tid that does not verify.
    fn damaged_commit(&self, at: u32, tid: Tid, stale: bool) -> Result<Step, JournalError> {
        if stale {
            return Ok(Step::End(format!(
                "journal block {at}: stale commit block of transaction {tid}"
            )));
        }
        // v1 checksums cover the transaction's blocks: without async commit those were
        // on disk before the commit block was written, so this is damage, not a tear.
        if self.bounds.format.csum == Csum::V1 && !self.bounds.async_commit {
            return Err(JournalError::Corrupt {
                structure: "commit block",
                journal_block: at,
                problem: format!(
                    "the v1 checksum of transaction {tid} does not match its blocks \
                     (computed {:#010x})",
                    self.pending.v1_sum
                ),
            });
        }
        // Linux: the same, but it then fails the mount ("journal transaction N is
        // corrupt") after replaying the transactions before it. A commit block torn by
        // the crash that wrote it is the tail of the log, so jext ends the log here.
        Ok(Step::End(format!(
            "journal block {at}: the commit block of transaction {tid} does not verify \
             (torn tail)"
        )))
    }

    fn finish(&mut self, reason: String) {
        if let Some((tid, err)) = self.single_io_torn.take() {
            self.out.end_tid = tid;
            self.out.end_reason =
                format!("transaction {tid} is the torn tail of a single-I/O commit: {err}");
            return;
        }
        match self.torn_candidate.take() {
            Some((tid, err)) => {
                self.out.end_tid = tid;
                self.out.end_reason =
                    format!("transaction {tid} is the torn tail of an async-commit log: {err}");
            }
            None => {
                self.out.end_tid = self.tid;
                self.out.end_reason = reason;
            }
        }
    }
}

/// Checks the logged copies of `transaction` that `wanted` selects against their tags.
fn verify_copies(
    io: &IoQueue,
    area: &JournalArea,
    format: &LogFormat,
    transaction: &ScannedTransaction,
    wanted: impl Fn(&LoggedBlock) -> bool,
) -> Result<(), JournalError> {
    if !format.has_block_checksums() {
        return Ok(());
    }
    for logged in transaction.blocks.iter().filter(|b| wanted(b)) {
        let data = read_block(io, area, logged.journal_block)?;
        let found = format.data_checksum(transaction.tid, &data);
        if found != logged.tag.checksum {
            return Err(JournalError::BlockChecksum {
                journal_block: logged.journal_block,
                tid: transaction.tid,
                fs_block: logged.tag.fs_block,
                expected: logged.tag.checksum,
                found,
            });
        }
    }
    Ok(())
}

/// One journal area and what its scan found.
struct AreaScan<'a> {
    area: &'a JournalArea,
    superblock: JournalSuperblock,
    format: LogFormat,
    log: LogScan,
    fast_commits: FastCommitScan,
}

/// A committed transaction and the area whose log holds its copies.
struct Committed<'a> {
    transaction: &'a ScannedTransaction,
    area: &'a JournalArea,
    format: &'a LogFormat,
}

/// Where the copy to replay for a home block is.
struct Copy<'a> {
    area: &'a JournalArea,
    journal_block: u32,
    escaped: bool,
}

/// What a home block starts from before its records apply.
enum Base<'a> {
    /// The newest whole copy that replays.
    Copy(Copy<'a>),
    /// A block an i-transaction carried: newer than every copy in the log.
    Carried(&'a [u8]),
    /// Its home contents: only DELTA records replay.
    Home,
}

/// How to rebuild one home block: a base, then records in tid order.
struct Rebuild<'a> {
    base: Base<'a>,
    records: Vec<&'a Record>,
}

/// Recovers the journal areas (area 0 is the file system's journal) and marks them empty.
/// Setting the file system's `needs_recovery` flag is the caller's business.
pub fn recover(io: &IoQueue, areas: &[JournalArea]) -> Result<RecoveryReport, JournalError> {
    assert!(
        !areas.is_empty(),
        "recovery needs at least the main journal area"
    );
    let scans = areas
        .iter()
        .map(|area| scan_area(io, area))
        .collect::<Result<Vec<_>, _>>()?;
    let committed = merged_in_tid_order(&scans);
    let mut report = RecoveryReport {
        was_clean: scans.iter().all(|s| s.superblock.is_clean()),
        first_tid: committed.first().map(|c| c.transaction.tid),
        last_tid: committed.last().map(|c| c.transaction.tid),
        transactions: committed.len(),
        blocks_scanned: scans.iter().map(|s| s.log.blocks_scanned).sum(),
        ..RecoveryReport::default()
    };
    let revoked = revoke_pass(&committed);
    let mut rebuilds = replay_plan(io, areas, &committed, &revoked, &mut report)?;
    plan_carried(io, areas, &scans[0], &mut rebuilds)?;
    replay(io, areas[0].block_size, &rebuilds)?;
    report.blocks_replayed = rebuilds.len();
    report.fast_commits = scans[0].fast_commits.clone();
    for scan in scans.iter().filter(|s| !s.superblock.is_clean()) {
        if scan.fast_commits.records.is_empty() {
            mark_empty(io, scan)?;
        } else {
            mark_fast_commits_pending(io, scan)?;
        }
    }
    Ok(report)
}

fn scan_area<'a>(io: &IoQueue, area: &'a JournalArea) -> Result<AreaScan<'a>, JournalError> {
    let superblock = read_superblock(io, area)?;
    let log = scan_superblock_log(io, area, &superblock)?;
    let (fast_commits, _) = scan_after_log(io, area, &superblock, log.end_tid)?;
    Ok(AreaScan {
        area,
        format: LogFormat::from_superblock(&superblock),
        superblock,
        log,
        fast_commits,
    })
}

/// What follows the log: the fast commits to replay, and with the private per-core bit
/// the rings' i-transactions (replayed in their stead when there are any: one mount
/// writes only one kind, and tids are never reused across mounts). A clean journal
/// replays nothing, fast commits included (as Linux).
fn scan_after_log(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
    end_tid: Tid,
) -> Result<(FastCommitScan, Vec<crate::percore::RingEntry>), JournalError> {
    if sb.is_clean() {
        return Ok((FastCommitScan::default(), Vec::new()));
    }
    if sb.has_incompat(INCOMPAT_JEXT_PERCORE) {
        let rings = crate::percore::scan(io, area, sb, end_tid)?;
        if !rings.entries.is_empty() {
            return Ok((rings.replay, rings.entries));
        }
    }
    Ok((scan_fast_commits(io, area, sb, end_tid)?, Vec::new()))
}

/// The fast commits that follow the last full commit, as the kernel's replay scan reads
/// them: block by block from the area's first block, valid while their tid is `end_tid`
/// (the first transaction not in the log). Empty without the feature.
fn scan_fast_commits(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
    end_tid: Tid,
) -> Result<FastCommitScan, JournalError> {
    let Some(fc_first) = sb.fast_commit_first().filter(|&b| b < sb.maxlen()) else {
        return Ok(FastCommitScan::default());
    };
    // Read block by block as the scan goes, as Linux does: it stops at the first block
    // that does not continue the fast commits, usually the first or second.
    let mut read_error = None;
    let blocks = (fc_first..sb.maxlen()).map_while(|b| match read_block(io, area, b) {
        Ok(block) => Some(block),
        Err(err) => {
            read_error = Some(err);
            None
        }
    });
    // INODE records are bounded by the inode size, which only the file system knows; a
    // block is the most any inode can be, and the file system checks the rest.
    let found = fast_commit::scan(blocks, end_tid, area.block_size as usize);
    match read_error {
        Some(err) => Err(err),
        None => Ok(found),
    }
}

/// All committed transactions of all areas, oldest first. Tids are consecutive within an
/// area and unique across areas; order them by distance from the main journal's first
/// tid, which stays right across a wrap of the 32-bit tid.
fn merged_in_tid_order<'a>(scans: &'a [AreaScan<'a>]) -> Vec<Committed<'a>> {
    let base = scans[0].superblock.sequence();
    let mut committed: Vec<Committed<'a>> = scans
        .iter()
        .flat_map(|scan| {
            scan.log
                .transactions
                .iter()
                .map(move |transaction| Committed {
                    transaction,
                    area: scan.area,
                    format: &scan.format,
                })
        })
        .collect();
    committed.sort_by_key(|c| c.transaction.tid.wrapping_sub(base));
    committed
}

/// For each revoked block, the newest tid that revoked it.
fn revoke_pass(committed: &[Committed<'_>]) -> HashMap<u64, Tid> {
    let mut revoked: HashMap<u64, Tid> = HashMap::new();
    for c in committed {
        for &block in &c.transaction.revokes {
            let newest = revoked.entry(block).or_insert(c.transaction.tid);
            if tid_geq(c.transaction.tid, *newest) {
                *newest = c.transaction.tid;
            }
        }
    }
    revoked
}

/// How to rebuild each home block, after checking every copy that would be replayed.
/// Linux checks the same copies (those not revoked) but one by one as it writes them: on
/// a mismatch it skips that copy, replays the rest and then fails the mount. jext fails
/// before writing anything.
fn replay_plan<'a>(
    io: &IoQueue,
    areas: &[JournalArea],
    committed: &[Committed<'a>],
    revoked: &HashMap<u64, Tid>,
    report: &mut RecoveryReport,
) -> Result<BTreeMap<u64, Rebuild<'a>>, JournalError> {
    let device_blocks = io.device().size_bytes() / u64::from(areas[0].block_size);
    let mut plan: BTreeMap<u64, Rebuild<'a>> = BTreeMap::new();
    for c in committed {
        let tid = c.transaction.tid;
        // Linux's test: a revoke record cancels copies from its own tid and older ones.
        let is_revoked = |home: u64| revoked.get(&home).is_some_and(|&r| tid_geq(r, tid));
        verify_copies(io, c.area, c.format, c.transaction, |b| {
            !is_revoked(b.tag.fs_block)
        })?;
        for logged in &c.transaction.blocks {
            let home = logged.tag.fs_block;
            if is_revoked(home) {
                report.copies_revoked += 1;
                continue;
            }
            check_home(areas, device_blocks, tid, home, logged.journal_block)?;
            let copy = Copy {
                area: c.area,
                journal_block: logged.journal_block,
                escaped: logged.tag.escaped,
            };
            let rebuild = Rebuild {
                base: Base::Copy(copy),
                records: Vec::new(),
            };
            if plan.insert(home, rebuild).is_some() {
                report.copies_superseded += 1;
            }
        }
        for logged in &c.transaction.records {
            let home = logged.record.fs_block;
            if is_revoked(home) {
                report.copies_revoked += 1;
                continue;
            }
            check_home(areas, device_blocks, tid, home, logged.journal_block)?;
            report.records_replayed += 1;
            let rebuild = plan.entry(home).or_insert(Rebuild {
                base: Base::Home,
                records: Vec::new(),
            });
            if logged.record.kind == RecordKind::Zeroed {
                // Sets every byte: what came before no longer matters.
                rebuild.records.clear();
                if !matches!(rebuild.base, Base::Home) {
                    report.copies_superseded += 1;
                }
                rebuild.base = Base::Home;
            }
            rebuild.records.push(&logged.record);
        }
    }
    Ok(plan)
}

/// The data blocks the i-transactions to replay carried (`ijournal=percore`), on top of
/// the log's copies: their tid is the one after the log's last, and within it a later
/// sub-tid's copy wins (`fast_commits.carried` is in sub-tid order).
fn plan_carried<'a>(
    io: &IoQueue,
    areas: &[JournalArea],
    scan: &'a AreaScan<'_>,
    plan: &mut BTreeMap<u64, Rebuild<'a>>,
) -> Result<(), JournalError> {
    let device_blocks = io.device().size_bytes() / u64::from(areas[0].block_size);
    for carried in &scan.fast_commits.carried {
        if let Some(place) = misplaced_home(areas, device_blocks, carried.home) {
            return Err(JournalError::Corrupt {
                structure: "per-core i-transaction",
                journal_block: scan.superblock.fast_commit_first().unwrap_or(0),
                problem: format!(
                    "a data block it carries is for block {}, {place}",
                    carried.home
                ),
            });
        }
        let rebuild = Rebuild {
            base: Base::Carried(&carried.bytes),
            records: Vec::new(),
        };
        plan.insert(carried.home, rebuild);
    }
    Ok(())
}

/// A home block must be on the device and outside every journal area (replaying over the
/// log would destroy copies not yet replayed). Linux checks neither.
fn check_home(
    areas: &[JournalArea],
    device_blocks: u64,
    tid: Tid,
    home: u64,
    journal_block: u32,
) -> Result<(), JournalError> {
    match misplaced_home(areas, device_blocks, home) {
        None => Ok(()),
        Some(place) => Err(JournalError::Corrupt {
            structure: "descriptor tag or byte record",
            journal_block,
            problem: format!("transaction {tid} logs file system block {home}, {place}"),
        }),
    }
}

/// Where `home` is if no replay may write it: inside a journal or beyond the device.
fn misplaced_home(areas: &[JournalArea], device_blocks: u64, home: u64) -> Option<String> {
    let in_journal = areas
        .iter()
        .flat_map(|a| a.runs())
        .any(|run| (run.physical..run.physical + u64::from(run.len)).contains(&home));
    if in_journal {
        Some("inside the journal".to_string())
    } else if home >= device_blocks {
        Some(format!("beyond the device's {device_blocks} blocks"))
    } else {
        None
    }
}

/// Rebuilds the planned blocks (copies unescaped, then records applied) and writes them
/// home, then flushes.
fn replay(
    io: &IoQueue,
    block_size: u32,
    plan: &BTreeMap<u64, Rebuild<'_>>,
) -> Result<(), JournalError> {
    const BATCH_BLOCKS: usize = 1024;
    let mut batch = Vec::with_capacity(BATCH_BLOCKS);
    for (&home, rebuild) in plan {
        let offset = home * u64::from(block_size);
        let mut data = match &rebuild.base {
            Base::Copy(copy) => {
                let mut data = read_block(io, copy.area, copy.journal_block)?;
                if copy.escaped {
                    unescape(&mut data);
                }
                data
            }
            Base::Carried(bytes) => bytes.to_vec(),
            Base::Home => {
                let mut data = vec![0u8; block_size as usize];
                // A ZEROED record first sets every byte: no need to read.
                if rebuild.records.first().map(|r| r.kind) != Some(RecordKind::Zeroed) {
                    io.read(offset, &mut data)?;
                }
                data
            }
        };
        for record in &rebuild.records {
            record.apply(&mut data);
        }
        batch.push(WriteRequest::new(offset, Arc::from(data), IoFlags::empty()));
        if batch.len() == BATCH_BLOCKS {
            io.submit(std::mem::replace(
                &mut batch,
                Vec::with_capacity(BATCH_BLOCKS),
            ))
            .wait()?;
        }
    }
    io.submit(batch).wait()?;
    io.flush()?;
    Ok(())
}

/// Marks an area's log empty, after the replayed blocks are durable. As Linux does, the
/// next tid skips the first unreplayed one (`end_tid`), so that no block of a torn
/// transaction can ever pass for part of a new one.
/// After the log's replay, when fast commits wait for the file system to apply them: the
/// superblock points at an empty log whose next transaction is `end_tid`, the tid the
/// fast commits carry. Recovery run again finds no transaction and the same fast commits
/// (Linux too), until the journal commits `end_tid` (the file system's replay of them),
/// which makes them obsolete. [`crate::Journal::load`] continues such a log.
fn mark_fast_commits_pending(io: &IoQueue, scan: &AreaScan<'_>) -> Result<(), JournalError> {
    let mut sb = scan.superblock.clone();
    sb.set_start(scan.log.head_block);
    sb.set_sequence(scan.log.end_tid);
    write_superblock(io, scan.area, &sb, IoFlags::PREFLUSH | IoFlags::FUA)
}

fn mark_empty(io: &IoQueue, scan: &AreaScan<'_>) -> Result<(), JournalError> {
    let mut sb = scan.superblock.clone();
    sb.mark_empty(scan.log.end_tid.wrapping_add(1), scan.log.head_block);
    // Nothing in the rings is live any more: Linux may use the journal again.
    sb.set_feature_incompat(sb.feature_incompat() & !INCOMPAT_JEXT_PERCORE);
    write_superblock(io, scan.area, &sb, IoFlags::PREFLUSH | IoFlags::FUA)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::records::plan_record;
    use crate::format::superblock::INCOMPAT_JEXT_RECORDS;
    use crate::format::JBD2_MAGIC;
    use crate::log::{CommitMode, LogFeatures, LogLayout, LogPlan, RecordMode};
    use jext_device::{BlockDevice, SimDevice};
    use std::time::SystemTime;

    const BLOCK_SIZE: usize = 1024;

    /// A 1100-block v3 journal at block 2048 of a simulated disk, loaded for `mode`.
    fn rig(mode: CommitMode) -> (Arc<SimDevice>, IoQueue, JournalArea, LogLayout) {
        let dev = Arc::new(SimDevice::new(4096 * BLOCK_SIZE as u64));
        let io = IoQueue::new(dev.clone());
        let area = JournalArea::contiguous(BLOCK_SIZE as u32, 2048, 1100);
        let sb = JournalSuperblock::new(BLOCK_SIZE as u32, 1100, [3; 16]);
        dev.write_at(area.byte_offset(0), &sb.encode(), false)
            .unwrap();
        let features = LogFeatures {
            csum_v3: true,
            wide_blocks: true,
            fast_commit: false,
        };
        let layout =
            LogLayout::load(&io, &area, features, mode, RecordMode::Bytes, true, false).unwrap();
        (dev, io, area, layout)
    }

    /// What the commit path's log writer lays out, recovery replays: escaping, revokes,
    /// descriptor chains longer than one block, tag checksums and the commit block.
    #[test]
    fn recovers_what_the_log_writer_writes() {
        let block_size = BLOCK_SIZE;
        let (dev, io, area, layout) = rig(CommitMode::Classic);
        let tid = layout.sequence();
        let mut escaped = vec![1u8; block_size];
        escaped[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let mut blocks: Vec<(u64, Arc<[u8]>)> = (0..300u64)
            .map(|i| (100 + i, Arc::from(vec![i as u8; block_size])))
            .collect();
        blocks.push((99, Arc::from(escaped.clone())));
        let plan = LogPlan {
            full: blocks,
            records: Vec::new(),
        };
        let mut log = layout.build_log_blocks(tid, &plan, &[100, 7]);
        log.push(layout.commit_block(tid, SystemTime::now(), None));
        assert_eq!(log.len() as u32, layout.log_blocks_needed(301, 2));
        let mut at = layout.first;
        for block in &log {
            dev.write_at(area.byte_offset(at), block, false).unwrap();
            at = layout.next(at);
        }
        let sb_block = layout.superblock_block(layout.first, tid);
        dev.write_at(area.byte_offset(0), &sb_block, false).unwrap();

        let report = recover(&io, std::slice::from_ref(&area)).unwrap();
        assert_eq!((report.transactions, report.last_tid), (1, Some(tid)));
        assert_eq!((report.blocks_replayed, report.copies_revoked), (300, 1));
        let home = |block: u64| {
            let mut buf = vec![0u8; block_size];
            dev.read_at(block * block_size as u64, &mut buf).unwrap();
            buf
        };
        assert_eq!(home(99), escaped);
        assert_eq!(
            home(100),
            vec![0u8; block_size],
            "revoked in its own transaction"
        );
        assert_eq!(home(399), vec![43u8; block_size]);
    }

    /// Under JEXT_SINGLE_IO, a transaction whose block does not check followed by a whole
    /// one: the end of the log when the later one was written before the first was
    /// durable (both after the last flush: a tear), an error when it says it was written
    /// after (damage in a durable transaction).
    #[test]
    fn a_single_io_tear_ends_the_log_and_damage_before_a_later_commit_fails() {
        for durable_after in [false, true] {
            let block_size = BLOCK_SIZE;
            let (dev, io, area, layout) = rig(CommitMode::SingleIo);
            let t1 = layout.sequence();
            let t2 = t1.wrapping_add(1);
            let t2_durable = if durable_after {
                t1
            } else {
                t1.wrapping_sub(1)
            };
            let mut at = layout.first;
            let mut first_copy = None;
            for (tid, durable, home) in [(t1, t1.wrapping_sub(1), 50u64), (t2, t2_durable, 51)] {
                let plan = LogPlan {
                    full: vec![(home, Arc::from(vec![7u8; block_size]))],
                    records: Vec::new(),
                };
                let mut log = layout.build_log_blocks(tid, &plan, &[]);
                log.push(layout.commit_block(tid, SystemTime::now(), Some(durable)));
                for block in &log {
                    dev.write_at(area.byte_offset(at), block, false).unwrap();
                    first_copy.get_or_insert(layout.next(at));
                    at = layout.next(at);
                }
            }
            // A sector of t1's logged copy never reached the disk.
            let copy = area.byte_offset(first_copy.unwrap());
            dev.write_at(copy + 512, &[0u8; 512], false).unwrap();
            layout.set_live_bits(INCOMPAT_JEXT_SINGLE_IO);
            let sb_block = layout.superblock_block(layout.first, t1);
            dev.write_at(area.byte_offset(0), &sb_block, false).unwrap();

            let result = recover(&io, std::slice::from_ref(&area));
            if durable_after {
                match result {
                    Err(JournalError::BlockChecksum { tid, fs_block, .. }) => {
                        assert_eq!((tid, fs_block), (t1, 50))
                    }
                    other => panic!("expected damage in transaction {t1}, got {other:?}"),
                }
            } else {
                let report = result.unwrap();
                assert_eq!(report.transactions, 0, "the log ends at the torn {t1}");
                let mut home = vec![0u8; block_size];
                dev.read_at(51 * block_size as u64, &mut home).unwrap();
                assert_eq!(home, vec![0u8; block_size], "{t2} is not replayed");
            }
        }
    }

    /// Compact commits (`crate::format::compact`) replay in tid order with the other
    /// shapes; one torn anywhere (its compact block or a copy) ends the log before it,
    /// unless a later commit says it was written after that one was durable: damage.
    #[test]
    fn compact_commits_replay_and_a_torn_one_ends_the_log() {
        let bs = BLOCK_SIZE;
        let patterned = |seed: u8| -> Vec<u8> { (0..bs).map(|i| (i as u8) ^ seed).collect() };
        let v50_1 = patterned(50);
        let mut v50_2 = v50_1.clone();
        v50_2[100..104].fill(9);
        let home70 = patterned(70);
        let mut v70 = home70.clone();
        v70[7] ^= 1;
        // (tear in t3: none, its compact block, its copy) x (t4 says t3 was durable)
        for (tear, durable_after) in [(0, false), (1, false), (2, false), (2, true)] {
            let (dev, io, area, layout) = rig(CommitMode::SingleIo);
            dev.write_at(70 * bs as u64, &home70, false).unwrap();
            let home = |block: u64| {
                let mut buf = vec![0u8; bs];
                dev.read_at(block * bs as u64, &mut buf).unwrap();
                buf
            };
            let limit = layout.record_limit();
            let t1 = layout.sequence();
            let tid = |i: u32| t1.wrapping_add(i);
            let plans = [
                LogPlan {
                    full: vec![(50, Arc::from(v50_1.clone()))],
                    records: vec![plan_record(70, Some(&home70), &v70, limit).unwrap()],
                },
                LogPlan {
                    full: vec![(52, Arc::from(patterned(52)))],
                    records: vec![],
                },
                LogPlan {
                    full: vec![(51, Arc::from(patterned(51)))],
                    records: vec![plan_record(50, Some(&v50_1), &v50_2, limit).unwrap()],
                },
                LogPlan {
                    full: vec![(53, Arc::from(patterned(53)))],
                    records: vec![],
                },
            ];
            let mut at = layout.first;
            let mut t3_blocks = Vec::new();
            for (i, plan) in plans.iter().enumerate() {
                let i = i as u32;
                let durable = match (i, durable_after) {
                    (3, true) => tid(2),
                    _ => tid(i).wrapping_sub(2),
                };
                // t2 revokes a block: the classic single-I/O shape, between compact ones.
                let revokes = if i == 1 { vec![90] } else { vec![] };
                assert_eq!(layout.compact_fits(plan, revokes.len()), i != 1);
                let log = if i == 1 {
                    let mut log = layout.build_log_blocks(tid(i), plan, &revokes);
                    log.push(layout.commit_block(tid(i), SystemTime::now(), Some(durable)));
                    log
                } else {
                    layout.build_compact(tid(i), plan, SystemTime::now(), durable)
                };
                let compact = i != 1;
                assert_eq!(
                    log.len() as u32,
                    layout.plan_blocks_needed(plan, revokes.len(), compact)
                );
                for block in &log {
                    dev.write_at(area.byte_offset(at), block, false).unwrap();
                    if i == 2 {
                        t3_blocks.push(at);
                    }
                    at = layout.next(at);
                }
            }
            if tear > 0 {
                let torn = area.byte_offset(t3_blocks[tear - 1]);
                dev.write_at(torn + 512, &[0u8; 512], false).unwrap();
            }
            layout.set_live_bits(INCOMPAT_JEXT_RECORDS | INCOMPAT_JEXT_SINGLE_IO);
            let sb_block = layout.superblock_block(layout.first, t1);
            dev.write_at(area.byte_offset(0), &sb_block, false).unwrap();

            let result = recover(&io, std::slice::from_ref(&area));
            if durable_after {
                match result {
                    Err(JournalError::BlockChecksum {
                        tid: t, fs_block, ..
                    }) => {
                        assert_eq!((t, fs_block), (tid(2), 51))
                    }
                    other => panic!("expected damage in transaction {}, got {other:?}", tid(2)),
                }
                continue;
            }
            let report = result.unwrap();
            assert_eq!(
                home(70),
                v70,
                "a delta on the home block, from a compact commit"
            );
            assert_eq!(home(52), patterned(52));
            if tear == 0 {
                assert_eq!(report.transactions, 4);
                assert_eq!(
                    home(50),
                    v50_2,
                    "a compact delta on an earlier compact copy"
                );
                assert_eq!((home(51), home(53)), (patterned(51), patterned(53)));
            } else {
                assert_eq!(report.transactions, 2, "tear {tear}: the log ends at t3");
                assert_eq!(home(50), v50_1);
                assert_eq!((home(51), home(53)), (vec![0; bs], vec![0; bs]));
            }
        }
    }

    /// Byte records replay in tid order with the copies: a DELTA on a whole copy of an
    /// earlier transaction, a DELTA on the home block, a ZEROED record over garbage, and a
    /// DELTA a later revoke cancels.
    #[test]
    fn byte_records_replay_on_copies_home_blocks_and_zeros() {
        let bs = BLOCK_SIZE;
        let (dev, io, area, layout) = rig(CommitMode::SingleIo);
        let home = |block: u64| {
            let mut buf = vec![0u8; bs];
            dev.read_at(block * bs as u64, &mut buf).unwrap();
            buf
        };
        let patterned = |seed: u8| -> Vec<u8> { (0..bs).map(|i| (i as u8) ^ seed).collect() };
        let changed = |base: &[u8], at: usize, byte: u8| {
            let mut new = base.to_vec();
            new[at..at + 3].fill(byte);
            new
        };
        // Home contents before the crash.
        let home70 = patterned(70);
        dev.write_at(70 * bs as u64, &home70, false).unwrap();
        dev.write_at(60 * bs as u64, &vec![0xEE; bs], false)
            .unwrap();
        dev.write_at(80 * bs as u64, &patterned(80), false).unwrap();
        let v50_1 = patterned(50);
        let v50_2 = changed(&v50_1, 10, 1);
        let v50_3 = changed(&v50_2, 900, 2);
        let v70 = changed(&home70, 500, 3);
        let mut v60 = vec![0u8; bs];
        v60[bs - 8..].fill(6);
        let limit = layout.record_limit();
        let delta = |block, base: &[u8], new: &[u8]| plan_record(block, Some(base), new, limit);
        let t1 = layout.sequence();
        let transactions: Vec<(LogPlan, Vec<u64>)> = vec![
            (
                LogPlan {
                    full: vec![(50, Arc::from(v50_1.clone()))],
                    records: vec![
                        delta(70, &home70, &v70).unwrap(),
                        delta(80, &patterned(80), &changed(&patterned(80), 0, 9)).unwrap(),
                    ],
                },
                vec![],
            ),
            (
                LogPlan {
                    full: vec![],
                    records: vec![
                        delta(50, &v50_1, &v50_2).unwrap(),
                        plan_record(60, None, &v60, limit).unwrap(),
                    ],
                },
                vec![80],
            ),
            (
                LogPlan {
                    full: vec![],
                    records: vec![delta(50, &v50_2, &v50_3).unwrap()],
                },
                vec![],
            ),
        ];
        let mut at = layout.first;
        for (i, (plan, revokes)) in transactions.iter().enumerate() {
            let tid = t1.wrapping_add(i as u32);
            let mut log = layout.build_log_blocks(tid, plan, revokes);
            log.push(layout.commit_block(tid, SystemTime::now(), Some(tid.wrapping_sub(1))));
            assert_eq!(
                log.len() as u32,
                layout.plan_blocks_needed(plan, revokes.len(), false)
            );
            for block in &log {
                dev.write_at(area.byte_offset(at), block, false).unwrap();
                at = layout.next(at);
            }
        }
        layout.set_live_bits(INCOMPAT_JEXT_RECORDS | INCOMPAT_JEXT_SINGLE_IO);
        let sb_block = layout.superblock_block(layout.first, t1);
        dev.write_at(area.byte_offset(0), &sb_block, false).unwrap();

        let report = recover(&io, std::slice::from_ref(&area)).unwrap();
        assert_eq!(report.transactions, 3);
        assert_eq!((report.records_replayed, report.copies_revoked), (4, 1));
        assert_eq!(home(50), v50_3, "a whole copy, then two deltas");
        assert_eq!(home(70), v70, "a delta on the home block");
        assert_eq!(home(60), v60, "zeroed over garbage");
        assert_eq!(home(80), patterned(80), "revoked: left as it was");
        let sb = read_superblock(&io, &area).unwrap();
        assert!(sb.is_clean() && !sb.has_incompat(INCOMPAT_JEXT_RECORDS));
        // Run again (a crash during the first replay): the same result.
        dev.write_at(area.byte_offset(0), &sb_block, false).unwrap();
        recover(&io, std::slice::from_ref(&area)).unwrap();
        assert_eq!(home(50), v50_3);
        assert_eq!(home(70), v70);
    }
}
