//! Log blocks: descriptor, commit and revoke blocks, and the checksums that tie them and
//! the logged copies together. Every metadata block of the log starts with a 12-byte
//! header; the blocks a descriptor describes follow it in the log as raw copies.
//!
//! Promises: encoders write exactly what Linux writes for the same input (layout, flags,
//! checksums); decoders accept what Linux's recovery accepts and refuse what it refuses,
//! naming the journal block. Checksum checks are separate calls, so the scan decides what
//! a mismatch means (torn tail or corruption). Nothing here reads or writes a device.
//!
//! ```text
//! header (all metadata blocks):
//!   0x00 4 h_magic      0xC03B3998
//!   0x04 4 h_blocktype  1 descriptor, 2 commit, 3/4 superblock v1/v2, 5 revoke
//!                       (jext's byte records: 0x6A787262, in `super::records`; its
//!                       compact commits: 0x6A786363, in `super::compact`)
//!   0x08 4 h_sequence   tid of the transaction the block belongs to
//!
//! descriptor (blocktype 1): header, then one tag per logged block; the first tag (and any
//! tag without SAME_UUID) is followed by the 16-byte journal uuid; then, with CSUM_V2/V3,
//! a 4-byte tail at the very end of the block.
//!   tag with CSUM_V3 (journal_block_tag3_t, 16 bytes):
//!     0 4 t_blocknr       low 32 bits of the home block
//!     4 4 t_flags         see below
//!     8 4 t_blocknr_high  high 32 bits (only read with 64BIT)
//!    12 4 t_checksum      tag checksum of the logged copy
//!   tag otherwise (journal_block_tag_t):
//!     0 4 t_blocknr
//!     4 2 t_checksum      low 16 bits of the tag checksum (CSUM_V2; else 0)
//!     6 2 t_flags
//!     8 4 t_blocknr_high  present only with 64BIT
//!     size: 8, +4 with 64BIT, +2 (unused) with CSUM_V2: 8 / 12 / 10 / 14 bytes
//!   t_flags: 1 ESCAPE (the copy's first 4 bytes were the magic and are logged as 0)
//!            2 SAME_UUID (no uuid follows)  4 DELETED (obsolete)  8 LAST_TAG
//!   tail: last 4 bytes = crc32c_raw(csum_seed, whole block with the tail zeroed)
//!   tag checksum = crc32c_raw(crc32c_raw(csum_seed, be32 tid), logged copy as logged)
//!
//! commit (blocktype 2, struct commit_header, 60 bytes; the rest of the block is zero):
//!   0x0C 1  h_chksum_type  v1: 1 (crc32); v2/v3 and none: 0
//!   0x0D 1  h_chksum_size  v1: 4; else 0
//!   0x0E 2  h_padding
//!   0x10 32 h_chksum[8]    v1: [0] = crc32_be(!0, descriptor and logged blocks of the
//!                          transaction, in log order); v2/v3: [0] = crc32c_raw(csum_seed,
//!                          whole block with h_chksum[0] zeroed)
//!   0x30 8  h_commit_sec   commit time, seconds
//!   0x38 4  h_commit_nsec
//!   jext's single-I/O commits only (zero in every other commit block, Linux's included):
//!   0x3C 4  jext_magic     0x6A786474 ("jxdt"): the next field is present
//!   0x40 4  jext_durable   every transaction up to this tid was durable (flushed) before
//!                          this commit block was written: one of them that does not check
//!                          is damage, not a torn tail
//!
//! revoke (blocktype 5): header, then
//!   0x0C 4  r_count  bytes used, this 16-byte header included
//!   0x10 ..          be64 (64BIT) or be32 block numbers, then (v2/v3) the tail as above
//! ```
//!
//! `csum_seed` is `crc32c_raw(!0, journal uuid)`.

use super::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::superblock::{
    JournalSuperblock, COMPAT_CHECKSUM, INCOMPAT_64BIT, INCOMPAT_CSUM_V2, INCOMPAT_CSUM_V3,
};
use super::{crc32c_raw, JBD2_MAGIC};
use crate::tid::Tid;
use crate::JournalError;

pub const HEADER_SIZE: usize = 12;
const TAIL_SIZE: usize = 4;
const UUID_SIZE: usize = 16;
const REVOKE_HEADER_SIZE: usize = 16;
/// `sizeof(struct commit_header)`: what a commit block holds before its zero fill.
const COMMIT_HEADER_SIZE: usize = 0x3C;
/// jext's fields after it (single-I/O commits), still in the first sector.
const COMMIT_JEXT_MAGIC: usize = COMMIT_HEADER_SIZE;
const COMMIT_JEXT_DURABLE: usize = 0x40;
const COMMIT_JEXT_END: usize = 0x44;
const JEXT_COMMIT_MAGIC: u32 = 0x6A78_6474;
const COMMIT_CHKSUM_TYPE: usize = 0x0C;
const COMMIT_CHKSUM_SIZE: usize = 0x0D;
const COMMIT_CHKSUM: usize = 0x10;
const COMMIT_SEC: usize = 0x30;
const COMMIT_NSEC: usize = 0x38;
const REVOKE_COUNT: usize = 0x0C;
/// `JBD2_CRC32_CHKSUM` and its size, the only v1 commit checksum Linux checks.
const V1_CHKSUM_TYPE_CRC32: u8 = 1;
const V1_CHKSUM_SIZE: u8 = 4;

pub const FLAG_ESCAPE: u32 = 1;
pub const FLAG_SAME_UUID: u32 = 2;
pub const FLAG_DELETED: u32 = 4;
pub const FLAG_LAST_TAG: u32 = 8;

const BLOCKTYPE_DESCRIPTOR: u32 = 1;
const BLOCKTYPE_COMMIT: u32 = 2;
const BLOCKTYPE_REVOKE: u32 = 5;

/// What a log block says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Descriptor,
    Commit,
    Revoke,
    /// jext's byte-granular records (`super::records`).
    Records,
    /// jext's compact commit: a small transaction's tags, records and commit
    /// (`super::compact`).
    Compact,
    /// Any other block type (superblocks, or types jext does not know).
    Other(u32),
}

/// Which checksums this log keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Csum {
    /// None at all.
    None,
    /// COMPAT_CHECKSUM: one crc32_be over each transaction's descriptors and copies, in
    /// its commit block. Read for recovery; jext does not write it.
    V1,
    /// CSUM_V2: crc32c tails and commit checksums, 16-bit tag checksums.
    V2,
    /// CSUM_V3: as v2 with full 32-bit tag checksums.
    V3,
}

/// One descriptor tag: the logged block's home and how it was logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    /// File system block the copy belongs to.
    pub fs_block: u64,
    /// The copy's first 4 bytes were the JBD2 magic and are logged as zero.
    pub escaped: bool,
    /// The tag checksum of the copy (low 16 bits only under CSUM_V2; 0 without v2/v3).
    pub checksum: u32,
}

/// A commit block's time, and in a jext single-I/O commit the last tid durable before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    pub commit_sec: u64,
    pub commit_nsec: u32,
    pub jext_durable: Option<Tid>,
}

/// The parameters of one log's format, from its superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFormat {
    pub block_size: usize,
    pub csum: Csum,
    /// 64BIT: tags and revoke records carry 64-bit block numbers.
    pub wide_blocks: bool,
    /// `crc32c_raw(!0, uuid)`, the seed of every v2/v3 checksum.
    pub csum_seed: u32,
    pub uuid: [u8; 16],
}

impl LogFormat {
    pub fn from_superblock(sb: &JournalSuperblock) -> LogFormat {
        let csum = if sb.has_incompat(INCOMPAT_CSUM_V3) {
            Csum::V3
        } else if sb.has_incompat(INCOMPAT_CSUM_V2) {
            Csum::V2
        } else if sb.feature_compat() & COMPAT_CHECKSUM != 0 {
            Csum::V1
        } else {
            Csum::None
        };
        LogFormat {
            block_size: sb.block_size() as usize,
            csum,
            wide_blocks: sb.has_incompat(INCOMPAT_64BIT),
            csum_seed: crc32c_raw(!0, &sb.uuid()),
            uuid: sb.uuid(),
        }
    }

    /// True for CSUM_V2 and CSUM_V3, whose metadata blocks check themselves.
    pub fn has_block_checksums(&self) -> bool {
        matches!(self.csum, Csum::V2 | Csum::V3)
    }

    fn tail_size(&self) -> usize {
        if self.has_block_checksums() {
            TAIL_SIZE
        } else {
            0
        }
    }

    /// Bytes per descriptor tag (the kernel's `journal_tag_bytes`).
    pub fn tag_bytes(&self) -> usize {
        let wide = if self.wide_blocks { 4 } else { 0 };
        match self.csum {
            Csum::V3 => 16,
            Csum::V2 => 10 + wide,
            Csum::V1 | Csum::None => 8 + wide,
        }
    }

    /// Tags one descriptor block holds (the first carries the 16-byte uuid).
    pub fn tag_capacity(&self) -> usize {
        (self.block_size - HEADER_SIZE - UUID_SIZE - self.tail_size()) / self.tag_bytes()
    }

    /// Block numbers one revoke block holds.
    pub fn revoke_capacity(&self) -> usize {
        (self.block_size - REVOKE_HEADER_SIZE - self.tail_size()) / self.revoke_record_bytes()
    }

    fn revoke_record_bytes(&self) -> usize {
        if self.wide_blocks {
            8
        } else {
            4
        }
    }

    /// The tag checksum of a copy logged (as `data`, escaped if it was) in transaction `tid`.
    pub fn data_checksum(&self, tid: Tid, data: &[u8]) -> u32 {
        if !self.has_block_checksums() {
            return 0;
        }
        let full = crc32c_raw(crc32c_raw(self.csum_seed, &tid.to_be_bytes()), data);
        if self.csum == Csum::V2 {
            full & 0xFFFF
        } else {
            full
        }
    }

    /// Reads a block's header: its kind and tid, or `None` without the JBD2 magic.
    pub fn header(&self, block: &[u8]) -> Option<(BlockKind, Tid)> {
        if block.len() < HEADER_SIZE || u32_at(block, 0) != JBD2_MAGIC {
            return None;
        }
        let kind = match u32_at(block, 4) {
            BLOCKTYPE_DESCRIPTOR => BlockKind::Descriptor,
            BLOCKTYPE_COMMIT => BlockKind::Commit,
            BLOCKTYPE_REVOKE => BlockKind::Revoke,
            super::records::BLOCKTYPE_JEXT_RECORDS => BlockKind::Records,
            super::compact::BLOCKTYPE_JEXT_COMPACT => BlockKind::Compact,
            other => BlockKind::Other(other),
        };
        Some((kind, u32_at(block, 8)))
    }

    pub(super) fn new_block(&self, blocktype: u32, tid: Tid) -> Vec<u8> {
        let mut block = vec![0u8; self.block_size];
        put_u32(&mut block, 0, JBD2_MAGIC);
        put_u32(&mut block, 4, blocktype);
        put_u32(&mut block, 8, tid);
        block
    }

    /// `crc32c_raw(csum_seed, block)` with the 4 bytes at `at` taken as zero.
    fn checksum_without(&self, block: &[u8], at: usize) -> u32 {
        let seed = crc32c_raw(self.csum_seed, &block[..at]);
        let seed = crc32c_raw(seed, &[0; 4]);
        crc32c_raw(seed, &block[at + 4..])
    }

    pub(super) fn set_tail(&self, block: &mut [u8]) {
        if self.has_block_checksums() {
            let at = self.block_size - TAIL_SIZE;
            let csum = self.checksum_without(block, at);
            put_u32(block, at, csum);
        }
    }

    /// True if a descriptor or revoke block's tail checksum verifies (or it has none).
    pub fn tail_is_valid(&self, block: &[u8]) -> bool {
        if !self.has_block_checksums() {
            return true;
        }
        let at = self.block_size - TAIL_SIZE;
        self.checksum_without(block, at) == u32_at(block, at)
    }

    /// A descriptor block for `tags` (at least one, at most [`LogFormat::tag_capacity`]),
    /// flagged as Linux flags them: SAME_UUID on all but the first, LAST_TAG on the last.
    pub fn encode_descriptor(&self, tid: Tid, tags: &[Tag]) -> Vec<u8> {
        assert!(
            !tags.is_empty() && tags.len() <= self.tag_capacity(),
            "{} tags for a descriptor holding {}",
            tags.len(),
            self.tag_capacity()
        );
        let mut block = self.new_block(BLOCKTYPE_DESCRIPTOR, tid);
        let mut at = HEADER_SIZE;
        for (i, tag) in tags.iter().enumerate() {
            let mut flags = if tag.escaped { FLAG_ESCAPE } else { 0 };
            if i > 0 {
                flags |= FLAG_SAME_UUID;
            }
            if i + 1 == tags.len() {
                flags |= FLAG_LAST_TAG;
            }
            self.put_tag(&mut block, at, tag, flags);
            at += self.tag_bytes();
            if i == 0 {
                block[at..at + UUID_SIZE].copy_from_slice(&self.uuid);
                at += UUID_SIZE;
            }
        }
        self.set_tail(&mut block);
        block
    }

    fn put_tag(&self, block: &mut [u8], at: usize, tag: &Tag, flags: u32) {
        assert!(
            self.wide_blocks || tag.fs_block >> 32 == 0,
            "block {} needs 64BIT",
            tag.fs_block
        );
        debug_assert!(self.csum == Csum::V3 || tag.checksum >> 16 == 0);
        put_u32(block, at, tag.fs_block as u32);
        if self.csum == Csum::V3 {
            put_u32(block, at + 4, flags);
            put_u32(block, at + 8, (tag.fs_block >> 32) as u32);
            put_u32(block, at + 12, tag.checksum);
            return;
        }
        put_u16(block, at + 4, tag.checksum as u16);
        put_u16(block, at + 6, flags as u16);
        if self.wide_blocks {
            put_u32(block, at + 8, (tag.fs_block >> 32) as u32);
        }
    }

    fn get_tag(&self, block: &[u8], at: usize) -> (Tag, u32) {
        let low = u64::from(u32_at(block, at));
        let (flags, checksum, high_at) = if self.csum == Csum::V3 {
            (u32_at(block, at + 4), u32_at(block, at + 12), at + 8)
        } else {
            let flags = u32::from(u16_at(block, at + 6));
            (flags, u32::from(u16_at(block, at + 4)), at + 8)
        };
        // Without 64BIT the high word is absent (or, in v3 tags, ignored as Linux does).
        let high = if self.wide_blocks {
            u64::from(u32_at(block, high_at))
        } else {
            0
        };
        let tag = Tag {
            fs_block: low | high << 32,
            escaped: flags & FLAG_ESCAPE != 0,
            checksum,
        };
        (tag, flags)
    }

    /// The tags of a descriptor block (its tail checksum is checked separately). As in
    /// Linux's recovery, tags run to the one flagged LAST_TAG or to the end of the block,
    /// whichever comes first, so this cannot fail.
    pub fn decode_descriptor(&self, block: &[u8]) -> Vec<Tag> {
        let limit = self.block_size - self.tail_size();
        let mut tags = Vec::new();
        let mut at = HEADER_SIZE;
        while at + self.tag_bytes() <= limit {
            let (tag, flags) = self.get_tag(block, at);
            tags.push(tag);
            at += self.tag_bytes();
            if flags & FLAG_SAME_UUID == 0 {
                at += UUID_SIZE;
            }
            if flags & FLAG_LAST_TAG != 0 {
                break;
            }
        }
        tags
    }

    /// A commit block for transaction `tid`, with the v2/v3 checksum when the log has one.
    /// (Under v1 the checksum fields stay zero, which Linux reads as "no checksum".)
    pub fn encode_commit(&self, tid: Tid, commit: CommitBlock) -> Vec<u8> {
        assert!(commit.commit_nsec < 1_000_000_000, "{commit:?}");
        let mut block = self.new_block(BLOCKTYPE_COMMIT, tid);
        put_u64(&mut block, COMMIT_SEC, commit.commit_sec);
        put_u32(&mut block, COMMIT_NSEC, commit.commit_nsec);
        if let Some(durable) = commit.jext_durable {
            put_u32(&mut block, COMMIT_JEXT_MAGIC, JEXT_COMMIT_MAGIC);
            put_u32(&mut block, COMMIT_JEXT_DURABLE, durable);
        }
        if self.has_block_checksums() {
            let csum = self.checksum_without(&block, COMMIT_CHKSUM);
            put_u32(&mut block, COMMIT_CHKSUM, csum);
        }
        block
    }

    /// The commit block's time.
    pub fn decode_commit(&self, block: &[u8]) -> CommitBlock {
        CommitBlock {
            commit_sec: u64_at(block, COMMIT_SEC),
            commit_nsec: u32_at(block, COMMIT_NSEC),
            jext_durable: (u32_at(block, COMMIT_JEXT_MAGIC) == JEXT_COMMIT_MAGIC)
                .then(|| u32_at(block, COMMIT_JEXT_DURABLE)),
        }
    }

    /// True if a commit block's v2/v3 checksum verifies (true under v1 and none, which
    /// the block cannot check alone). Like Linux, a block whose checksum covers only its
    /// 60-byte header with zeros after it also passes: that is a commit block whose first
    /// sector reached the disk and whose (all-zero) rest did not.
    pub fn commit_is_valid(&self, block: &[u8]) -> bool {
        if !self.has_block_checksums() {
            return true;
        }
        let stored = u32_at(block, COMMIT_CHKSUM);
        if self.checksum_without(block, COMMIT_CHKSUM) == stored {
            return true;
        }
        // Linux's header alone, or with jext's fields after it (a single-I/O commit).
        [COMMIT_HEADER_SIZE, COMMIT_JEXT_END]
            .into_iter()
            .any(|end| {
                let mut header_only = vec![0u8; self.block_size];
                header_only[..end].copy_from_slice(&block[..end]);
                self.checksum_without(&header_only, COMMIT_CHKSUM) == stored
            })
    }

    /// Under v1, true if the commit block carries `running` (crc32_be over the
    /// transaction's descriptors and copies) or no checksum at all, as Linux accepts.
    pub fn commit_matches_v1(&self, block: &[u8], running: u32) -> bool {
        let (kind, size) = (block[COMMIT_CHKSUM_TYPE], block[COMMIT_CHKSUM_SIZE]);
        let found = u32_at(block, COMMIT_CHKSUM);
        let matches = kind == V1_CHKSUM_TYPE_CRC32 && size == V1_CHKSUM_SIZE && found == running;
        let unused = kind == 0 && size == 0 && found == 0;
        matches || unused
    }

    /// A revoke block listing `blocks` (at least one, at most
    /// [`LogFormat::revoke_capacity`]).
    pub fn encode_revoke(&self, tid: Tid, blocks: &[u64]) -> Vec<u8> {
        assert!(
            !blocks.is_empty() && blocks.len() <= self.revoke_capacity(),
            "{} revoke records for a block holding {}",
            blocks.len(),
            self.revoke_capacity()
        );
        let mut block = self.new_block(BLOCKTYPE_REVOKE, tid);
        let mut at = REVOKE_HEADER_SIZE;
        for &fs_block in blocks {
            if self.wide_blocks {
                put_u64(&mut block, at, fs_block);
            } else {
                assert!(fs_block >> 32 == 0, "block {fs_block} needs 64BIT");
                put_u32(&mut block, at, fs_block as u32);
            }
            at += self.revoke_record_bytes();
        }
        put_u32(&mut block, REVOKE_COUNT, at as u32);
        self.set_tail(&mut block);
        block
    }

    /// The block numbers a revoke block lists. Like Linux, an `r_count` past the space
    /// for records is an error, and records run while whole ones fit below `r_count`.
    pub fn decode_revoke(
        &self,
        block: &[u8],
        journal_block: u32,
    ) -> Result<Vec<u64>, JournalError> {
        let used = u32_at(block, REVOKE_COUNT) as usize;
        let limit = self.block_size - self.tail_size();
        if used > limit {
            return Err(JournalError::Corrupt {
                structure: "revoke block",
                journal_block,
                problem: format!("r_count {used} is beyond the {limit} bytes for records"),
            });
        }
        let rec = self.revoke_record_bytes();
        let mut records = Vec::new();
        let mut at = REVOKE_HEADER_SIZE;
        while at + rec <= used {
            records.push(if self.wide_blocks {
                u64_at(block, at)
            } else {
                u64::from(u32_at(block, at))
            });
            at += rec;
        }
        Ok(records)
    }
}

/// True if `data` begins with the JBD2 magic and must be escaped when logged.
pub fn needs_escape(data: &[u8]) -> bool {
    data.len() >= 4 && u32_at(data, 0) == JBD2_MAGIC
}

/// The copy of `data` as logged: its first 4 bytes zeroed (call only if it
/// [`needs_escape`]).
pub fn escape(data: &mut [u8]) {
    debug_assert!(needs_escape(data));
    data[..4].fill(0);
}

/// Restores the magic in a block logged escaped.
pub fn unescape(data: &mut [u8]) {
    put_u32(data, 0, JBD2_MAGIC);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::crc32_be;

    fn formats() -> Vec<LogFormat> {
        [
            (Csum::V3, true),
            (Csum::V3, false),
            (Csum::V2, true),
            (Csum::V2, false),
            (Csum::V1, true),
            (Csum::None, false),
        ]
        .into_iter()
        .flat_map(|(csum, wide_blocks)| {
            [1024, 4096].map(|block_size| LogFormat {
                block_size,
                csum,
                wide_blocks,
                csum_seed: 77,
                uuid: [5; 16],
            })
        })
        .collect()
    }

    fn tag_checksum(f: &LogFormat, i: u64) -> u32 {
        match f.csum {
            Csum::V3 => 0xdead_0000 + i as u32,
            Csum::V2 => i as u32 & 0xFFFF,
            Csum::V1 | Csum::None => 0,
        }
    }

    #[test]
    fn tag_sizes_and_capacities_are_the_kernels() {
        let f = |csum, wide_blocks, block_size| LogFormat {
            block_size,
            csum,
            wide_blocks,
            csum_seed: 0,
            uuid: [0; 16],
        };
        assert_eq!(f(Csum::V3, true, 4096).tag_bytes(), 16);
        assert_eq!(f(Csum::V2, true, 4096).tag_bytes(), 14);
        assert_eq!(f(Csum::V2, false, 4096).tag_bytes(), 10);
        assert_eq!(f(Csum::None, true, 4096).tag_bytes(), 12);
        assert_eq!(f(Csum::None, false, 1024).tag_bytes(), 8);
        // (4096 - 12 header - 16 uuid - 4 tail) / 16.
        assert_eq!(f(Csum::V3, true, 4096).tag_capacity(), 254);
        // (1024 - 16 header - 4 tail) / 8.
        assert_eq!(f(Csum::V3, true, 1024).revoke_capacity(), 125);
        assert_eq!(f(Csum::None, false, 1024).revoke_capacity(), 252);
    }

    #[test]
    fn descriptors_round_trip_at_full_capacity() {
        for f in formats() {
            let tags: Vec<Tag> = (0..f.tag_capacity() as u64)
                .map(|i| Tag {
                    fs_block: if f.wide_blocks { i << 33 | i } else { i * 3 },
                    escaped: i % 7 == 0,
                    checksum: tag_checksum(&f, i),
                })
                .collect();
            let block = f.encode_descriptor(9, &tags);
            assert_eq!(f.header(&block), Some((BlockKind::Descriptor, 9)));
            assert!(f.tail_is_valid(&block));
            assert_eq!(f.decode_descriptor(&block), tags, "{f:?}");
            let one = f.encode_descriptor(9, &tags[..1]);
            assert_eq!(f.decode_descriptor(&one), &tags[..1], "{f:?}");
            let mut flipped = block.clone();
            flipped[HEADER_SIZE] ^= 1;
            assert_eq!(!f.tail_is_valid(&flipped), f.has_block_checksums());
        }
    }

    #[test]
    fn commit_blocks_round_trip_and_check_themselves() {
        for f in formats() {
            let commit = CommitBlock {
                commit_sec: 1_700_000_000,
                commit_nsec: 5,
                jext_durable: None,
            };
            let block = f.encode_commit(4, commit);
            assert_eq!(f.header(&block), Some((BlockKind::Commit, 4)));
            assert!(f.commit_is_valid(&block));
            assert_eq!(f.decode_commit(&block), commit);
            assert!(
                block[COMMIT_HEADER_SIZE..].iter().all(|&b| b == 0),
                "as Linux's"
            );
            let single_io = CommitBlock {
                jext_durable: Some(3),
                ..commit
            };
            let jext = f.encode_commit(4, single_io);
            assert_eq!(f.decode_commit(&jext), single_io);
            assert_eq!(
                &jext[COMMIT_JEXT_MAGIC..COMMIT_JEXT_END],
                &[0x6A, 0x78, 0x64, 0x74, 0, 0, 0, 3]
            );
            let mut torn = jext.clone();
            torn[COMMIT_JEXT_END..].fill(0xEE);
            assert!(f.commit_is_valid(&torn), "{f:?}");
            if !f.has_block_checksums() {
                assert!(
                    f.commit_matches_v1(&block, 1234),
                    "a zero v1 sum means none"
                );
            }
            let mut flipped = block.clone();
            flipped[COMMIT_SEC + 1] ^= 1;
            assert_eq!(!f.commit_is_valid(&flipped), f.has_block_checksums());
            // Stale bytes after the header: only the first sector reached the disk.
            let mut torn = block.clone();
            torn[COMMIT_HEADER_SIZE..].fill(0xEE);
            assert!(f.commit_is_valid(&torn), "{f:?}");
        }
    }

    #[test]
    fn v1_commit_checksums_are_crc32_be_of_the_transaction() {
        let f = &formats()[8];
        assert_eq!(f.csum, Csum::V1);
        let mut block = f.encode_commit(
            4,
            CommitBlock {
                commit_sec: 1,
                commit_nsec: 0,
                jext_durable: None,
            },
        );
        let running = crc32_be(crc32_be(!0, &[1; 1024]), &[2; 1024]);
        block[COMMIT_CHKSUM_TYPE] = V1_CHKSUM_TYPE_CRC32;
        block[COMMIT_CHKSUM_SIZE] = V1_CHKSUM_SIZE;
        put_u32(&mut block, COMMIT_CHKSUM, running);
        assert!(f.commit_matches_v1(&block, running));
        assert!(!f.commit_matches_v1(&block, running ^ 1));
    }

    #[test]
    fn revoke_blocks_round_trip_and_refuse_an_overlong_count() {
        for f in formats() {
            let revoked: Vec<u64> = (0..f.revoke_capacity() as u64).map(|i| i + 100).collect();
            let block = f.encode_revoke(4, &revoked);
            assert_eq!(f.header(&block), Some((BlockKind::Revoke, 4)));
            assert!(f.tail_is_valid(&block));
            assert_eq!(f.decode_revoke(&block, 8).unwrap(), revoked);
            let mut overlong = block.clone();
            put_u32(&mut overlong, REVOKE_COUNT, f.block_size as u32 + 4);
            let err = f.decode_revoke(&overlong, 8).unwrap_err().to_string();
            assert!(err.contains("revoke block at journal block 8"), "{err}");
        }
    }

    #[test]
    fn escaping_hides_the_magic_and_unescaping_restores_it() {
        let mut data = vec![7u8; 1024];
        data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        let original = data.clone();
        assert!(needs_escape(&data));
        escape(&mut data);
        assert!(!needs_escape(&data));
        assert_eq!(data[..4], [0; 4]);
        unescape(&mut data);
        assert_eq!(data, original);
    }
}
