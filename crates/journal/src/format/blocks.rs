//! Log blocks. Every metadata block of the log starts with a 12-byte header; the blocks
//! that a descriptor describes follow it in the log as raw copies. Layouts (big-endian):
//!
//! ```text
//! header:      0 4 h_magic (0xC03B3998)  4 4 h_blocktype  8 4 h_sequence (tid)
//! descriptor (blocktype 1): header, then one tag per logged block, then (v2/v3) a tail
//!   tag, CSUM_V3:      0 4 t_blocknr  4 4 t_flags  8 4 t_blocknr_high  12 4 t_checksum
//!   tag, otherwise:    0 4 t_blocknr  4 2 t_checksum (v2)  6 2 t_flags
//!                      [8 4 t_blocknr_high, with 64BIT]   (14/12/10/8 bytes in all)
//!   t_flags: 1 ESCAPE (first 4 bytes were the magic, logged as zero)
//!            2 SAME_UUID (else a 16-byte uuid follows the tag)  8 LAST_TAG
//!   tail:  last 4 bytes of the block = crc32c_raw(csum_seed, block with tail 0)
//!   t_checksum = crc32c_raw(crc32c_raw(csum_seed, be32 tid), logged block) (v2: low 16)
//! commit (blocktype 2): header, 0x0C 1 h_chksum_type, 0x0D 1 h_chksum_size,
//!   0x10 32 h_chksum[8] (v2/v3: h_chksum[0] = crc32c_raw(csum_seed, block with it 0)),
//!   0x30 8 h_commit_sec, 0x38 4 h_commit_nsec
//! revoke (blocktype 5): header, 0x0C 4 r_count (bytes used, header included),
//!   then be64 (64BIT) or be32 block numbers, then (v2/v3) the tail as in a descriptor
//! ```
//!
//! `csum_seed` is `crc32c_raw(!0, journal uuid)`.

use super::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::superblock::{JournalSuperblock, INCOMPAT_64BIT, INCOMPAT_CSUM_V2, INCOMPAT_CSUM_V3};
use super::{crc32c_raw, JBD2_MAGIC};
use crate::tid::Tid;
use crate::JournalError;

pub const HEADER_SIZE: usize = 12;
const TAIL_SIZE: usize = 4;
const UUID_SIZE: usize = 16;
const REVOKE_HEADER_SIZE: usize = 16;

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
    /// Any other block type (superblocks, or types jext does not know).
    Other(u32),
}

/// How checksums are kept in this log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Csum {
    None,
    V2,
    V3,
}

/// One descriptor tag: the logged block's home and how it was logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub fs_block: u64,
    pub escaped: bool,
    /// The logged bytes' checksum (low 16 bits only under CSUM_V2; 0 without checksums).
    pub checksum: u32,
}

/// A decoded commit block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommitBlock {
    pub commit_sec: u64,
    pub commit_nsec: u32,
}

/// The parameters of one log's format, from its superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFormat {
    pub block_size: usize,
    pub csum: Csum,
    pub wide_blocks: bool,
    pub csum_seed: u32,
    pub uuid: [u8; 16],
}

impl LogFormat {
    pub fn from_superblock(sb: &JournalSuperblock) -> LogFormat {
        let csum = if sb.has_incompat(INCOMPAT_CSUM_V3) {
            Csum::V3
        } else if sb.has_incompat(INCOMPAT_CSUM_V2) {
            Csum::V2
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

    fn tail_size(&self) -> usize {
        if self.csum == Csum::None {
            0
        } else {
            TAIL_SIZE
        }
    }

    /// Bytes per descriptor tag.
    pub fn tag_bytes(&self) -> usize {
        match self.csum {
            Csum::V3 => 16,
            Csum::V2 => 10 + if self.wide_blocks { 4 } else { 0 },
            Csum::None => 8 + if self.wide_blocks { 4 } else { 0 },
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

    /// The checksum a tag carries for `data` logged in transaction `tid`.
    pub fn data_checksum(&self, tid: Tid, data: &[u8]) -> u32 {
        let full = crc32c_raw(crc32c_raw(self.csum_seed, &tid.to_be_bytes()), data);
        match self.csum {
            Csum::V3 => full,
            Csum::V2 => full & 0xFFFF,
            Csum::None => 0,
        }
    }

    /// Reads a block's header: its kind and tid, or `None` without the JBD2 magic.
    pub fn header(&self, block: &[u8]) -> Option<(BlockKind, Tid)> {
        if u32_at(block, 0) != JBD2_MAGIC {
            return None;
        }
        let kind = match u32_at(block, 4) {
            BLOCKTYPE_DESCRIPTOR => BlockKind::Descriptor,
            BLOCKTYPE_COMMIT => BlockKind::Commit,
            BLOCKTYPE_REVOKE => BlockKind::Revoke,
            other => BlockKind::Other(other),
        };
        Some((kind, u32_at(block, 8)))
    }

    fn new_block(&self, blocktype: u32, tid: Tid) -> Vec<u8> {
        let mut block = vec![0u8; self.block_size];
        put_u32(&mut block, 0, JBD2_MAGIC);
        put_u32(&mut block, 4, blocktype);
        put_u32(&mut block, 8, tid);
        block
    }

    fn set_tail(&self, block: &mut [u8]) {
        if self.csum != Csum::None {
            let at = self.block_size - TAIL_SIZE;
            put_u32(block, at, 0);
            let csum = crc32c_raw(self.csum_seed, block);
            put_u32(block, at, csum);
        }
    }

    /// True if a descriptor or revoke block's tail checksum verifies (or there is none).
    pub fn tail_is_valid(&self, block: &[u8]) -> bool {
        if self.csum == Csum::None {
            return true;
        }
        let at = self.block_size - TAIL_SIZE;
        let mut copy = block.to_vec();
        put_u32(&mut copy, at, 0);
        crc32c_raw(self.csum_seed, &copy) == u32_at(block, at)
    }

    /// A descriptor block for `tags` (at most [`LogFormat::tag_capacity`]).
    pub fn encode_descriptor(&self, tid: Tid, tags: &[Tag]) -> Vec<u8> {
        assert!(
            !tags.is_empty() && tags.len() <= self.tag_capacity(),
            "{} tags",
            tags.len()
        );
        let mut block = self.new_block(BLOCKTYPE_DESCRIPTOR, tid);
        let mut at = HEADER_SIZE;
        for (i, tag) in tags.iter().enumerate() {
            assert!(
                self.wide_blocks || tag.fs_block >> 32 == 0,
                "block {} needs 64BIT",
                tag.fs_block
            );
            let mut flags = if tag.escaped { FLAG_ESCAPE } else { 0 };
            if i > 0 {
                flags |= FLAG_SAME_UUID;
            }
            if i + 1 == tags.len() {
                flags |= FLAG_LAST_TAG;
            }
            put_u32(&mut block, at, tag.fs_block as u32);
            match self.csum {
                Csum::V3 => {
                    put_u32(&mut block, at + 4, flags);
                    put_u32(&mut block, at + 8, (tag.fs_block >> 32) as u32);
                    put_u32(&mut block, at + 12, tag.checksum);
                }
                Csum::V2 | Csum::None => {
                    put_u16(&mut block, at + 4, tag.checksum as u16);
                    put_u16(&mut block, at + 6, flags as u16);
                    if self.wide_blocks {
                        put_u32(&mut block, at + 8, (tag.fs_block >> 32) as u32);
                    }
                }
            }
            at += self.tag_bytes();
            if i == 0 {
                block[at..at + UUID_SIZE].copy_from_slice(&self.uuid);
                at += UUID_SIZE;
            }
        }
        self.set_tail(&mut block);
        block
    }

    /// The tags of a descriptor block (its tail checksum is checked separately).
    pub fn decode_descriptor(
        &self,
        block: &[u8],
        journal_block: u32,
    ) -> Result<Vec<Tag>, JournalError> {
        let limit = self.block_size - self.tail_size();
        let mut tags = Vec::new();
        let mut at = HEADER_SIZE;
        while at + self.tag_bytes() <= limit {
            let low = u64::from(u32_at(block, at));
            let (flags, high, checksum) = match self.csum {
                Csum::V3 => (
                    u32_at(block, at + 4),
                    u32_at(block, at + 8),
                    u32_at(block, at + 12),
                ),
                Csum::V2 | Csum::None => (
                    u32::from(u16_at(block, at + 6)),
                    if self.wide_blocks {
                        u32_at(block, at + 8)
                    } else {
                        0
                    },
                    u32::from(u16_at(block, at + 4)),
                ),
            };
            tags.push(Tag {
                fs_block: low | u64::from(high) << 32,
                escaped: flags & FLAG_ESCAPE != 0,
                checksum,
            });
            at += self.tag_bytes();
            if flags & FLAG_SAME_UUID == 0 {
                at += UUID_SIZE;
            }
            if flags & FLAG_LAST_TAG != 0 {
                return Ok(tags);
            }
        }
        Err(JournalError::Corrupt {
            structure: "descriptor block",
            journal_block,
            problem: format!("{} tags and no LAST_TAG flag", tags.len()),
        })
    }

    /// A commit block for transaction `tid`.
    pub fn encode_commit(&self, tid: Tid, commit: CommitBlock) -> Vec<u8> {
        let mut block = self.new_block(BLOCKTYPE_COMMIT, tid);
        put_u64(&mut block, 0x30, commit.commit_sec);
        put_u32(&mut block, 0x38, commit.commit_nsec);
        if self.csum != Csum::None {
            let csum = crc32c_raw(self.csum_seed, &block);
            put_u32(&mut block, 0x10, csum);
        }
        block
    }

    /// The commit block's time.
    pub fn decode_commit(&self, block: &[u8]) -> CommitBlock {
        CommitBlock {
            commit_sec: u64_at(block, 0x30),
            commit_nsec: u32_at(block, 0x38),
        }
    }

    /// True if a commit block's checksum verifies (or the log has none).
    pub fn commit_is_valid(&self, block: &[u8]) -> bool {
        if self.csum == Csum::None {
            return true;
        }
        let mut copy = block.to_vec();
        put_u32(&mut copy, 0x10, 0);
        crc32c_raw(self.csum_seed, &copy) == u32_at(block, 0x10)
    }

    /// A revoke block listing `blocks` (at most [`LogFormat::revoke_capacity`]).
    pub fn encode_revoke(&self, tid: Tid, blocks: &[u64]) -> Vec<u8> {
        assert!(!blocks.is_empty() && blocks.len() <= self.revoke_capacity());
        let mut block = self.new_block(BLOCKTYPE_REVOKE, tid);
        let mut at = REVOKE_HEADER_SIZE;
        for &b in blocks {
            if self.wide_blocks {
                put_u64(&mut block, at, b);
            } else {
                assert!(b >> 32 == 0, "block {b} needs 64BIT");
                put_u32(&mut block, at, b as u32);
            }
            at += self.revoke_record_bytes();
        }
        put_u32(&mut block, 0x0C, at as u32);
        self.set_tail(&mut block);
        block
    }

    /// The block numbers a revoke block lists.
    pub fn decode_revoke(
        &self,
        block: &[u8],
        journal_block: u32,
    ) -> Result<Vec<u64>, JournalError> {
        let used = u32_at(block, 0x0C) as usize;
        let limit = self.block_size - self.tail_size();
        let rec = self.revoke_record_bytes();
        if used < REVOKE_HEADER_SIZE
            || used > limit
            || !(used - REVOKE_HEADER_SIZE).is_multiple_of(rec)
        {
            return Err(JournalError::Corrupt {
                structure: "revoke block",
                journal_block,
                problem: format!(
                    "r_count {used} is not a whole number of records within {limit} bytes"
                ),
            });
        }
        Ok((REVOKE_HEADER_SIZE..used)
            .step_by(rec)
            .map(|at| {
                if self.wide_blocks {
                    u64_at(block, at)
                } else {
                    u64::from(u32_at(block, at))
                }
            })
            .collect())
    }
}

/// True if `data` begins with the JBD2 magic and must be escaped when logged.
pub fn needs_escape(data: &[u8]) -> bool {
    u32_at(data, 0) == JBD2_MAGIC
}

/// Restores the magic in a block logged escaped.
pub fn unescape(data: &mut [u8]) {
    put_u32(data, 0, JBD2_MAGIC);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn formats() -> Vec<LogFormat> {
        let mut out = Vec::new();
        for (csum, wide) in [
            (Csum::V3, true),
            (Csum::V3, false),
            (Csum::V2, true),
            (Csum::None, false),
        ] {
            out.push(LogFormat {
                block_size: 1024,
                csum,
                wide_blocks: wide,
                csum_seed: 77,
                uuid: [5; 16],
            });
        }
        out
    }

    #[test]
    fn descriptors_round_trip_at_full_capacity() {
        for f in formats() {
            let tags: Vec<Tag> = (0..f.tag_capacity() as u64)
                .map(|i| Tag {
                    fs_block: if f.wide_blocks { i << 33 | i } else { i * 3 },
                    escaped: i % 7 == 0,
                    checksum: if f.csum == Csum::V3 {
                        0xdead_0000 + i as u32
                    } else if f.csum == Csum::V2 {
                        i as u32
                    } else {
                        0
                    },
                })
                .collect();
            let block = f.encode_descriptor(9, &tags);
            assert_eq!(f.header(&block), Some((BlockKind::Descriptor, 9)));
            assert!(f.tail_is_valid(&block));
            assert_eq!(f.decode_descriptor(&block, 3).unwrap(), tags, "{f:?}");
        }
    }

    #[test]
    fn commit_and_revoke_round_trip_with_checksums() {
        for f in formats() {
            let commit = CommitBlock {
                commit_sec: 1_700_000_000,
                commit_nsec: 5,
            };
            let mut block = f.encode_commit(4, commit);
            assert!(f.commit_is_valid(&block));
            assert_eq!(f.decode_commit(&block), commit);
            if f.csum != Csum::None {
                block[0x31] ^= 1;
                assert!(!f.commit_is_valid(&block));
            }
            let revoked: Vec<u64> = (0..f.revoke_capacity() as u64).map(|i| i + 100).collect();
            let block = f.encode_revoke(4, &revoked);
            assert!(f.tail_is_valid(&block));
            assert_eq!(f.decode_revoke(&block, 8).unwrap(), revoked);
        }
    }

    #[test]
    fn escaping_hides_the_magic() {
        let mut data = vec![0u8; 1024];
        data[..4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        assert!(needs_escape(&data));
        data[..4].fill(0);
        unescape(&mut data);
        assert!(needs_escape(&data));
    }
}
