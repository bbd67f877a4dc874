//! The journal superblock: journal block 0, 1024 bytes, big-endian. It says where the log
//! is (`s_first`, `s_maxlen`), where its live part starts (`s_start`, 0 = empty) and with
//! which transaction (`s_sequence`), and which features the log uses.
//!
//! ```text
//! off  size field                      off  size field
//! 0x00 4 h_magic (0xC03B3998)          0x30 16 s_uuid
//! 0x04 4 h_blocktype (4 = superblock   0x40 4 s_nr_users
//!          v2, 3 = v1)                 0x44 4 s_dynsuper
//! 0x08 4 h_sequence                    0x48 4 s_max_transaction
//! 0x0C 4 s_blocksize                   0x4C 4 s_max_trans_data
//! 0x10 4 s_maxlen (blocks)             0x50 1 s_checksum_type (4 = crc32c)
//! 0x14 4 s_first (first log block)     0x54 4 s_num_fc_blks (0: 256 if FAST_COMMIT)
//! 0x18 4 s_sequence (first tid)        0x58 4 s_head
//! 0x1C 4 s_start (0 = clean)           0xFC 4 s_checksum = crc32c_raw(!0, sb with it 0)
//! 0x20 4 s_errno                       0x100 768 s_users (16-byte uuids)
//! 0x24 4 s_feature_compat (1 CHECKSUM)
//! 0x28 4 s_feature_incompat (1 REVOKE, 2 64BIT, 4 ASYNC_COMMIT, 8 CSUM_V2,
//!          0x10 CSUM_V3, 0x20 FAST_COMMIT)
//! 0x2C 4 s_feature_ro_compat
//! ```

use super::be::{put_u32, u32_at};
use super::{crc32c_raw, JBD2_MAGIC};
use crate::JournalError;

pub const SUPERBLOCK_SIZE: usize = 1024;
pub const BLOCKTYPE_SUPERBLOCK_V1: u32 = 3;
pub const BLOCKTYPE_SUPERBLOCK_V2: u32 = 4;
const CHECKSUM_OFFSET: usize = 0xFC;

pub const COMPAT_CHECKSUM: u32 = 0x1;
pub const INCOMPAT_REVOKE: u32 = 0x1;
pub const INCOMPAT_64BIT: u32 = 0x2;
pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const INCOMPAT_CSUM_V2: u32 = 0x8;
pub const INCOMPAT_CSUM_V3: u32 = 0x10;
pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
const INCOMPAT_KNOWN: u32 = INCOMPAT_REVOKE
    | INCOMPAT_64BIT
    | INCOMPAT_ASYNC_COMMIT
    | INCOMPAT_CSUM_V2
    | INCOMPAT_CSUM_V3
    | INCOMPAT_FAST_COMMIT;
pub const CHECKSUM_TYPE_CRC32C: u8 = 4;
/// Fast-commit blocks when the feature is on and `s_num_fc_blks` is 0.
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;

/// The journal superblock as raw bytes with typed accessors.
#[derive(Clone, PartialEq, Eq)]
pub struct JournalSuperblock {
    raw: [u8; SUPERBLOCK_SIZE],
}

macro_rules! be_fields {
    ($($get:ident / $set:ident @ $off:expr;)*) => {
        $(
            pub fn $get(&self) -> u32 { u32_at(&self.raw, $off) }
            pub fn $set(&mut self, value: u32) { put_u32(&mut self.raw, $off, value) }
        )*
    };
}

impl JournalSuperblock {
    /// A fresh v2 superblock for a journal of `maxlen` blocks of `block_size` bytes.
    pub fn new(block_size: u32, maxlen: u32, uuid: [u8; 16]) -> JournalSuperblock {
        let mut sb = JournalSuperblock {
            raw: [0; SUPERBLOCK_SIZE],
        };
        put_u32(&mut sb.raw, 0, JBD2_MAGIC);
        put_u32(&mut sb.raw, 4, BLOCKTYPE_SUPERBLOCK_V2);
        sb.set_block_size(block_size);
        sb.set_maxlen(maxlen);
        sb.set_first(1);
        sb.set_sequence(1);
        sb.set_nr_users(1);
        sb.raw[0x30..0x40].copy_from_slice(&uuid);
        sb
    }

    be_fields! {
        block_size / set_block_size @ 0x0C;
        maxlen / set_maxlen @ 0x10;
        first / set_first @ 0x14;
        sequence / set_sequence @ 0x18;
        start / set_start @ 0x1C;
        errno / set_errno @ 0x20;
        feature_compat / set_feature_compat @ 0x24;
        feature_incompat / set_feature_incompat @ 0x28;
        feature_ro_compat / set_feature_ro_compat @ 0x2C;
        nr_users / set_nr_users @ 0x40;
        max_transaction / set_max_transaction @ 0x48;
        num_fc_blocks_field / set_num_fc_blocks_field @ 0x54;
        head / set_head @ 0x58;
    }

    pub fn blocktype(&self) -> u32 {
        u32_at(&self.raw, 4)
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.raw[0x30..0x40].try_into().expect("16 bytes")
    }

    pub fn checksum_type(&self) -> u8 {
        self.raw[0x50]
    }

    pub fn has_incompat(&self, bit: u32) -> bool {
        self.feature_incompat() & bit != 0
    }

    /// True if the log is marked empty (nothing to recover).
    pub fn is_clean(&self) -> bool {
        self.start() == 0
    }

    /// Blocks at the end of the journal reserved for fast commits.
    pub fn fast_commit_blocks(&self) -> u32 {
        if !self.has_incompat(INCOMPAT_FAST_COMMIT) {
            return 0;
        }
        match self.num_fc_blocks_field() {
            0 => DEFAULT_FAST_COMMIT_BLOCKS,
            n => n,
        }
    }

    /// One past the last block the log (not fast commits) may use.
    pub fn log_end(&self) -> u32 {
        self.maxlen() - self.fast_commit_blocks()
    }

    /// Turns on CSUM_V3 (and 64BIT when `wide_blocks`), as ext4 does at mount when the file
    /// system has metadata_csum: mkfs leaves the journal features empty.
    pub fn enable_csum_v3(&mut self, wide_blocks: bool) {
        let mut incompat = self.feature_incompat() & !INCOMPAT_CSUM_V2;
        incompat |= INCOMPAT_CSUM_V3;
        if wide_blocks {
            incompat |= INCOMPAT_64BIT;
        }
        self.set_feature_incompat(incompat);
        self.set_feature_compat(self.feature_compat() & !COMPAT_CHECKSUM);
        self.raw[0x50] = CHECKSUM_TYPE_CRC32C;
    }

    /// Marks the log empty the way the kernel does after recovery: no start, the next
    /// transaction `sequence`, the block after the last replayed commit as `s_head`, and
    /// no FAST_COMMIT (the file system turns it back on at mount).
    pub fn mark_empty(&mut self, sequence: u32, head: u32) {
        self.set_start(0);
        self.set_sequence(sequence);
        self.set_head(head);
        self.set_feature_incompat(self.feature_incompat() & !INCOMPAT_FAST_COMMIT);
    }

    /// Turns on FAST_COMMIT: the last `s_num_fc_blks` blocks (256 if 0) leave the log.
    pub fn enable_fast_commit(&mut self) {
        self.set_feature_incompat(self.feature_incompat() | INCOMPAT_FAST_COMMIT);
    }

    fn has_csum(&self) -> bool {
        self.has_incompat(INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3)
    }

    fn compute_checksum(&self) -> u32 {
        let mut copy = self.raw;
        put_u32(&mut copy, CHECKSUM_OFFSET, 0);
        crc32c_raw(!0, &copy)
    }

    /// Decodes and validates the superblock of a journal of `area_blocks` blocks.
    pub fn decode(bytes: &[u8], area_blocks: u32) -> Result<JournalSuperblock, JournalError> {
        let err = |problem: String| JournalError::Corrupt {
            structure: "journal superblock",
            journal_block: 0,
            problem,
        };
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(err(format!("only {} bytes", bytes.len())));
        }
        let sb = JournalSuperblock {
            raw: bytes[..SUPERBLOCK_SIZE].try_into().expect("1024 bytes"),
        };
        let magic = u32_at(&sb.raw, 0);
        if magic != JBD2_MAGIC {
            return Err(err(format!(
                "bad magic {magic:#010x} (expected {JBD2_MAGIC:#010x})"
            )));
        }
        match sb.blocktype() {
            BLOCKTYPE_SUPERBLOCK_V2 => {}
            BLOCKTYPE_SUPERBLOCK_V1 => {
                return Err(JournalError::Unsupported(
                    "a version 1 journal superblock".into(),
                ))
            }
            other => return Err(err(format!("block type {other} is not a superblock"))),
        }
        let unknown = sb.feature_incompat() & !INCOMPAT_KNOWN;
        if unknown != 0 {
            return Err(JournalError::Unsupported(format!(
                "unknown journal incompat features {unknown:#x}"
            )));
        }
        if sb.has_csum() {
            if sb.checksum_type() != CHECKSUM_TYPE_CRC32C {
                return Err(err(format!(
                    "checksum type {} (expected 4, crc32c)",
                    sb.checksum_type()
                )));
            }
            let (stored, computed) = (sb.stored_checksum(), sb.compute_checksum());
            if stored != computed {
                return Err(err(format!(
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )));
            }
        }
        if sb.maxlen() > area_blocks || sb.maxlen() < 1024 {
            return Err(err(format!(
                "s_maxlen {} (the journal area has {area_blocks} blocks; at least 1024 needed)",
                sb.maxlen()
            )));
        }
        if sb.first() == 0 || sb.first() >= sb.log_end() {
            return Err(err(format!("s_first {} is outside the log", sb.first())));
        }
        if sb.start() != 0 && (sb.start() < sb.first() || sb.start() >= sb.log_end()) {
            return Err(err(format!(
                "s_start {} is outside the log [{}, {})",
                sb.start(),
                sb.first(),
                sb.log_end()
            )));
        }
        Ok(sb)
    }

    fn stored_checksum(&self) -> u32 {
        u32_at(&self.raw, CHECKSUM_OFFSET)
    }

    /// The 1024 bytes with a fresh checksum (when the journal has checksums).
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut raw = self.raw;
        if self.has_csum() {
            put_u32(&mut raw, CHECKSUM_OFFSET, self.compute_checksum());
        }
        raw
    }
}

impl std::fmt::Debug for JournalSuperblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalSuperblock")
            .field("block_size", &self.block_size())
            .field("maxlen", &self.maxlen())
            .field("first", &self.first())
            .field("sequence", &self.sequence())
            .field("start", &self.start())
            .field("incompat", &format_args!("{:#x}", self.feature_incompat()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_its_checksum() {
        let mut sb = JournalSuperblock::new(4096, 16384, [9; 16]);
        sb.enable_csum_v3(true);
        sb.set_start(7);
        sb.set_sequence(42);
        let bytes = sb.encode();
        let back = JournalSuperblock::decode(&bytes, 16384).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!((back.start(), back.sequence()), (7, 42));
        assert!(back.has_incompat(INCOMPAT_CSUM_V3 | INCOMPAT_64BIT));
        let mut corrupt = bytes;
        corrupt[0x18] ^= 1;
        let err = JournalSuperblock::decode(&corrupt, 16384)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("journal superblock") && err.contains("checksum mismatch"),
            "{err}"
        );
        assert!(JournalSuperblock::decode(&bytes, 100).is_err());
    }

    #[test]
    fn fast_commit_blocks_shorten_the_log() {
        let mut sb = JournalSuperblock::new(1024, 4096, [1; 16]);
        assert_eq!(sb.log_end(), 4096);
        sb.set_feature_incompat(INCOMPAT_FAST_COMMIT);
        assert_eq!(sb.log_end(), 4096 - 256);
        sb.set_num_fc_blocks_field(64);
        assert_eq!(sb.log_end(), 4032);
    }
}
