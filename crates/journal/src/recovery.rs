//! Recovery: replays committed transactions after a crash, with JBD2's three passes.
//!
//! 1. **Scan** each journal area from its superblock's `s_start`/`s_sequence`, following
//!    descriptor, revoke and commit blocks with consecutive tids, to find the last
//!    transaction whose commit block is whole. The first block that is not the next
//!    expected one ends the log: that is the torn tail a crash leaves, and is normal.
//! 2. **Revoke**: for every block, the newest tid that revoked it.
//! 3. **Replay**: the newest logged copy of every block not revoked at or after its tid
//!    is written home; then a flush; then the superblock is marked empty.
//!
//! Areas are scanned separately and their transactions merged by tid, so that logs other
//! than the classic journal can take part without changing the passes.
//!
//! Recovery is stricter than the kernel in one place: a committed transaction whose
//! logged block fails its tag checksum is an error and nothing is written (the kernel
//! skips that block, replays the rest and fails the mount). Under ASYNC_COMMIT, where the
//! commit block may legally precede its blocks, such a last transaction is a torn tail.
//! Recovery never guesses: bad bytes inside committed transactions are reported with the
//! journal block, the tid and the home block.

use crate::format::blocks::{unescape, BlockKind, CommitBlock, Csum, LogFormat, Tag};
use crate::format::superblock::{JournalSuperblock, INCOMPAT_ASYNC_COMMIT, INCOMPAT_FAST_COMMIT};
use crate::tid::{tid_geq, Tid};
use crate::{JournalArea, JournalError};
use jext_io::{IoFlags, IoQueue, WriteRequest};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A block a transaction logged: where its copy sits in the log and where it belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoggedBlock {
    pub journal_block: u32,
    pub tag: Tag,
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
    pub revokes: Vec<u64>,
}

/// What the scan of one area found.
#[derive(Clone, Debug)]
pub struct ScanReport {
    pub superblock: JournalSuperblock,
    pub transactions: Vec<ScannedTransaction>,
    /// Journal blocks read while scanning.
    pub blocks_scanned: u32,
    /// Why the scan stopped where it did ("clean journal", "block 40: sequence 7, expected 6").
    pub end_reason: String,
    /// The journal block after the last committed transaction (where the log would go on).
    pub head_block: u32,
}

/// What recovery did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Nothing was there to replay.
    pub was_clean: bool,
    pub first_tid: Option<Tid>,
    pub last_tid: Option<Tid>,
    pub transactions: usize,
    /// Home blocks written (each once, with its newest copy).
    pub blocks_replayed: usize,
    /// Logged copies skipped because a later revoke freed their block.
    pub copies_revoked: usize,
    /// Logged copies superseded by a newer copy of the same block.
    pub copies_superseded: usize,
    pub blocks_scanned: u32,
}

fn read_block(io: &IoQueue, area: &JournalArea, block: u32) -> Result<Vec<u8>, JournalError> {
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

/// The scan pass over one area (read-only).
pub fn scan(io: &IoQueue, area: &JournalArea) -> Result<ScanReport, JournalError> {
    let sb = read_superblock(io, area)?;
    let mut report = ScanReport {
        superblock: sb.clone(),
        transactions: Vec::new(),
        blocks_scanned: 0,
        end_reason: String::new(),
        head_block: sb.start(),
    };
    if sb.is_clean() {
        report.end_reason = "clean journal (s_start = 0)".into();
        return Ok(report);
    }
    Scanner::new(io, area, &sb).run(&mut report)?;
    Ok(report)
}

struct Scanner<'a> {
    io: &'a IoQueue,
    area: &'a JournalArea,
    format: LogFormat,
    first: u32,
    end: u32,
    async_commit: bool,
}

/// A transaction being read, before its commit block is seen.
struct Pending {
    first_block: u32,
    blocks: Vec<LoggedBlock>,
    revokes: Vec<u64>,
    /// A descriptor or revoke block failed its checksum: only a commit block that is
    /// older than the previous one (stale log contents) may end this without an error.
    suspect_block: Option<u32>,
}

impl<'a> Scanner<'a> {
    fn new(io: &'a IoQueue, area: &'a JournalArea, sb: &JournalSuperblock) -> Scanner<'a> {
        Scanner {
            io,
            area,
            format: LogFormat::from_superblock(sb),
            first: sb.first(),
            end: sb.log_end(),
            async_commit: sb.has_incompat(INCOMPAT_ASYNC_COMMIT),
        }
    }

    fn next(&self, block: u32) -> u32 {
        if block + 1 >= self.end {
            self.first
        } else {
            block + 1
        }
    }

    fn run(&self, report: &mut ScanReport) -> Result<(), JournalError> {
        let sb = &report.superblock;
        let mut position = sb.start();
        let mut tid = sb.sequence();
        let mut last_commit_sec = 0u64;
        let mut pending = Pending {
            first_block: position,
            blocks: Vec::new(),
            revokes: Vec::new(),
            suspect_block: None,
        };
        let log_len = self.end - self.first;
        loop {
            if report.blocks_scanned >= log_len {
                report.end_reason = "scanned the whole log".into();
                return Ok(());
            }
            let block = read_block(self.io, self.area, position)?;
            report.blocks_scanned += 1;
            let Some((kind, seq)) = self.format.header(&block) else {
                report.end_reason = format!("journal block {position}: no JBD2 magic");
                return Ok(());
            };
            if seq != tid {
                report.end_reason =
                    format!("journal block {position}: sequence {seq}, expected {tid}");
                return Ok(());
            }
            match kind {
                BlockKind::Descriptor => {
                    let valid = self.format.tail_is_valid(&block);
                    if !valid {
                        pending.suspect_block.get_or_insert(position);
                    }
                    let tags = match self.format.decode_descriptor(&block, position) {
                        Ok(tags) => tags,
                        Err(_) if !valid => {
                            report.end_reason =
                                format!("journal block {position}: stale descriptor");
                            return Ok(());
                        }
                        Err(e) => return Err(e),
                    };
                    for tag in tags {
                        position = self.next(position);
                        report.blocks_scanned += 1;
                        pending.blocks.push(LoggedBlock {
                            journal_block: position,
                            tag,
                        });
                    }
                    position = self.next(position);
                }
                BlockKind::Revoke => {
                    if !self.format.tail_is_valid(&block) {
                        pending.suspect_block.get_or_insert(position);
                    } else {
                        pending
                            .revokes
                            .extend(self.format.decode_revoke(&block, position)?);
                    }
                    position = self.next(position);
                }
                BlockKind::Commit => {
                    if !self.format.commit_is_valid(&block) {
                        report.end_reason = format!("journal block {position}: commit block of {tid} does not verify (torn)");
                        return Ok(());
                    }
                    let commit = self.format.decode_commit(&block);
                    if let Some(bad) = pending.suspect_block {
                        if commit.commit_sec >= last_commit_sec {
                            return Err(JournalError::Corrupt {
                                structure: "descriptor or revoke block",
                                journal_block: bad,
                                problem: format!(
                                    "checksum mismatch inside committed transaction {tid}"
                                ),
                            });
                        }
                        report.end_reason =
                            format!("journal block {position}: stale transaction {tid}");
                        return Ok(());
                    }
                    if let Err(err) = self.verify_blocks(tid, &pending.blocks) {
                        if self.async_commit {
                            report.end_reason =
                                format!("transaction {tid}: torn under async commit ({err})");
                            return Ok(());
                        }
                        return Err(err);
                    }
                    report.transactions.push(ScannedTransaction {
                        tid,
                        first_block: pending.first_block,
                        commit_block: position,
                        commit,
                        blocks: std::mem::take(&mut pending.blocks),
                        revokes: std::mem::take(&mut pending.revokes),
                    });
                    last_commit_sec = commit.commit_sec;
                    tid = tid.wrapping_add(1);
                    position = self.next(position);
                    pending.first_block = position;
                    report.head_block = position;
                }
                BlockKind::Other(t) => {
                    report.end_reason = format!("journal block {position}: block type {t}");
                    return Ok(());
                }
            }
        }
    }

    /// Checks every logged block of a committed transaction against its tag checksum.
    fn verify_blocks(&self, tid: Tid, blocks: &[LoggedBlock]) -> Result<(), JournalError> {
        if self.format.csum == Csum::None {
            return Ok(());
        }
        for logged in blocks {
            let data = read_block(self.io, self.area, logged.journal_block)?;
            let found = self.format.data_checksum(tid, &data);
            if found != logged.tag.checksum {
                return Err(JournalError::BlockChecksum {
                    journal_block: logged.journal_block,
                    tid,
                    fs_block: logged.tag.fs_block,
                    expected: logged.tag.checksum,
                    found,
                });
            }
        }
        Ok(())
    }
}

/// Fails if the fast-commit area holds commits for the transaction after `last_tid`:
/// replaying ext4 fast commits is not implemented, and ignoring them would lose data.
fn refuse_pending_fast_commits(
    io: &IoQueue,
    area: &JournalArea,
    sb: &JournalSuperblock,
    next_tid: Tid,
) -> Result<(), JournalError> {
    const FC_TAG_HEAD: u16 = 9;
    if !sb.has_incompat(INCOMPAT_FAST_COMMIT) || sb.log_end() >= sb.maxlen() {
        return Ok(());
    }
    let block = read_block(io, area, sb.log_end())?;
    let tag = u16::from_le_bytes([block[0], block[1]]);
    let fc_tid = u32::from_le_bytes(block[8..12].try_into().expect("4 bytes"));
    if tag == FC_TAG_HEAD && fc_tid == next_tid {
        return Err(JournalError::Unsupported(format!(
            "the fast-commit area holds commits for transaction {fc_tid}; jext cannot replay \
             ext4 fast commits yet (mount the image once with Linux to replay them)"
        )));
    }
    Ok(())
}

/// Recovers the journal areas (area 0 is the file system's journal) and marks them empty.
pub fn recover(io: &IoQueue, areas: &[JournalArea]) -> Result<RecoveryReport, JournalError> {
    assert!(
        !areas.is_empty(),
        "recovery needs at least the main journal area"
    );
    let mut report = RecoveryReport::default();
    let mut scans = Vec::with_capacity(areas.len());
    for area in areas {
        let scan = scan(io, area)?;
        report.blocks_scanned += scan.blocks_scanned;
        let next_tid = scan
            .transactions
            .last()
            .map_or(scan.superblock.sequence(), |t| t.tid.wrapping_add(1));
        refuse_pending_fast_commits(io, area, &scan.superblock, next_tid)?;
        scans.push(scan);
    }
    let mut transactions: Vec<(&ScannedTransaction, &JournalArea)> = scans
        .iter()
        .zip(areas)
        .flat_map(|(scan, area)| scan.transactions.iter().map(move |t| (t, area)))
        .collect();
    // Tids are consecutive within an area and unique across areas; order them by distance
    // from the main journal's first tid, which is right across a wrap of the u32.
    let base = scans[0].superblock.sequence();
    transactions.sort_by_key(|(t, _)| t.tid.wrapping_sub(base));
    report.was_clean = transactions.is_empty();
    report.transactions = transactions.len();
    report.first_tid = transactions.first().map(|(t, _)| t.tid);
    report.last_tid = transactions.last().map(|(t, _)| t.tid);

    let revoked = revoke_pass(&transactions);
    let newest = newest_copies(&transactions, &revoked, &mut report);
    replay(io, areas[0].block_size, newest, &mut report)?;

    for (scan, area) in scans.iter().zip(areas) {
        let mut sb = scan.superblock.clone();
        if !sb.is_clean() || !scan.transactions.is_empty() {
            let next = scan
                .transactions
                .last()
                .map_or(sb.sequence(), |t| t.tid.wrapping_add(1));
            // The kernel starts one tid further, so that a torn commit block of `next`
            // left in the log can never be read as the next transaction's.
            sb.mark_empty(next.wrapping_add(1), scan.head_block);
            write_superblock(io, area, &sb, IoFlags::PREFLUSH | IoFlags::FUA)?;
        }
    }
    Ok(report)
}

/// For each block, the newest tid that revoked it.
fn revoke_pass(transactions: &[(&ScannedTransaction, &JournalArea)]) -> HashMap<u64, Tid> {
    let mut revoked: HashMap<u64, Tid> = HashMap::new();
    for (t, _) in transactions {
        for &block in &t.revokes {
            let entry = revoked.entry(block).or_insert(t.tid);
            if tid_geq(t.tid, *entry) {
                *entry = t.tid;
            }
        }
    }
    revoked
}

/// Where the copy to replay for each home block is: (area, journal block, escaped).
type Copy<'a> = (&'a JournalArea, u32, bool);

fn newest_copies<'a>(
    transactions: &[(&'a ScannedTransaction, &'a JournalArea)],
    revoked: &HashMap<u64, Tid>,
    report: &mut RecoveryReport,
) -> BTreeMap<u64, Copy<'a>> {
    let mut newest = BTreeMap::new();
    for (t, area) in transactions {
        for logged in &t.blocks {
            let home = logged.tag.fs_block;
            // A revoke record with a tid at or after this copy's cancels it.
            if revoked.get(&home).is_some_and(|&r| tid_geq(r, t.tid)) {
                report.copies_revoked += 1;
                continue;
            }
            if newest
                .insert(home, (*area, logged.journal_block, logged.tag.escaped))
                .is_some()
            {
                report.copies_superseded += 1;
            }
        }
    }
    newest
}

fn replay(
    io: &IoQueue,
    block_size: u32,
    newest: BTreeMap<u64, Copy<'_>>,
    report: &mut RecoveryReport,
) -> Result<(), JournalError> {
    let device_blocks = io.device().size_bytes() / u64::from(block_size);
    let mut batch = Vec::new();
    for (home, (area, journal_block, escaped)) in newest {
        if home >= device_blocks {
            return Err(JournalError::Corrupt {
                structure: "descriptor tag",
                journal_block,
                problem: format!("home block {home} is beyond the device ({device_blocks} blocks)"),
            });
        }
        let mut data = read_block(io, area, journal_block)?;
        if escaped {
            unescape(&mut data);
        }
        batch.push(WriteRequest::new(
            home * u64::from(block_size),
            Arc::from(data),
            IoFlags::empty(),
        ));
        report.blocks_replayed += 1;
        if batch.len() >= 1024 {
            io.submit(std::mem::take(&mut batch)).wait()?;
        }
    }
    io.submit(batch).wait()?;
    io.flush()?;
    Ok(())
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
