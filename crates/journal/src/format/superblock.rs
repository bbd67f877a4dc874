//! The journal superblock: journal block 0, 1024 bytes, big-endian. It says where the log
//! is (`s_first`, `s_maxlen`, less the fast-commit area), where its live part starts
//! (`s_start`, 0 = empty) and with which transaction (`s_sequence`), and which features
//! the log uses.
//!
//! Promises: [`JournalSuperblock::decode`] accepts only what Linux would load (same
//! checks, same feature rules) and every byte it does not interpret survives a decode and
//! encode unchanged. It never fixes a field it reads.
//!
//! ```text
//! off   size field              meaning
//! 0x000 4    h_magic            0xC03B3998
//! 0x004 4    h_blocktype        4 = superblock v2 (3 = v1: no features, refused here)
//! 0x008 4    h_sequence         unused in a superblock
//! 0x00C 4    s_blocksize        journal block size in bytes (= file system block size)
//! 0x010 4    s_maxlen           journal length in blocks, superblock included
//! 0x014 4    s_first            first block of the log (1 for an inode journal)
//! 0x018 4    s_sequence         tid of the first transaction to replay / to write next
//! 0x01C 4    s_start            journal block of that transaction; 0 = log empty (clean)
//! 0x020 4    s_errno            error the journal was aborted with (negative errno)
//! 0x024 4    s_feature_compat   0x1 CHECKSUM (v1 checksums: crc32_be in commit blocks)
//! 0x028 4    s_feature_incompat 0x1 REVOKE, 0x2 64BIT, 0x4 ASYNC_COMMIT, 0x8 CSUM_V2,
//!                               0x10 CSUM_V3, 0x20 FAST_COMMIT; jext's own:
//!                               0x8000_0000 JEXT_SINGLE_IO (see below),
//!                               0x4000_0000 JEXT_PERCORE (per-core i-transactions
//!                               in the fast-commit region),
//!                               0x2000_0000 JEXT_RECORDS (byte records in the log,
//!                               see `records.rs`)
//! 0x02C 4    s_feature_ro_compat (none defined)
//! 0x030 16   s_uuid             journal uuid; seeds every v2/v3 checksum
//! 0x040 4    s_nr_users         file systems sharing the journal (1 for an inode journal)
//! 0x044 4    s_dynsuper         unused
//! 0x048 4    s_max_transaction  limit on a transaction's blocks (0 = none)
//! 0x04C 4    s_max_trans_data   limit on a transaction's data blocks (0 = none)
//! 0x050 1    s_checksum_type    4 = crc32c (v2/v3); 1/2/3 (crc32/md5/sha1) are v1-era
//! 0x051 3    s_padding2
//! 0x054 4    s_num_fc_blks      fast-commit blocks at the end; 0 means 256 (FAST_COMMIT)
//! 0x058 4    s_head             where the log head was at the last clean unmount
//! 0x05C 160  s_padding
//! 0x0FC 4    s_checksum         crc32c_raw(!0, these 1024 bytes with this field 0)
//! 0x100 768  s_users            16-byte uuids of the sharing file systems
//! ```
//!
//! `JEXT_SINGLE_IO` (jext only, never set by Linux): the log may hold transactions written
//! as one sequential write with their commit block and made durable by one flush after
//! it, so a crash can leave a commit block whose transaction's blocks did not all reach the
//! disk. Recovery must then count a transaction only if every block of it checks (v3 tag,
//! descriptor and revoke tails, commit) and end the log at the first that does not. Linux
//! and e2fsck refuse a journal with an unknown incompat bit instead of replaying such a
//! torn transaction; jext sets the bit only while the log is not empty.
//!
//! The log is journal blocks `[s_first, log_end)`, `log_end = s_maxlen - num_fc_blocks`;
//! the kernel puts the fast-commit blocks at `[log_end + 1, s_maxlen)` and uses block
//! `log_end` for nothing.

use super::be::{put_u32, u32_at};
use super::{crc32c_raw, JBD2_MAGIC};
use crate::JournalError;

pub const SUPERBLOCK_SIZE: usize = 1024;
pub const BLOCKTYPE_SUPERBLOCK_V1: u32 = 3;
pub const BLOCKTYPE_SUPERBLOCK_V2: u32 = 4;
const CHECKSUM_OFFSET: usize = 0xFC;
const CHECKSUM_TYPE_OFFSET: usize = 0x50;
const UUID_OFFSET: usize = 0x30;

pub const COMPAT_CHECKSUM: u32 = 0x1;
pub const INCOMPAT_REVOKE: u32 = 0x1;
pub const INCOMPAT_64BIT: u32 = 0x2;
pub const INCOMPAT_ASYNC_COMMIT: u32 = 0x4;
pub const INCOMPAT_CSUM_V2: u32 = 0x8;
pub const INCOMPAT_CSUM_V3: u32 = 0x10;
pub const INCOMPAT_FAST_COMMIT: u32 = 0x20;
/// jext's private bit: single-I/O commits may be live in the log (module comment). The
/// highest bit, far from any Linux will define next.
pub const INCOMPAT_JEXT_SINGLE_IO: u32 = 0x8000_0000;
/// jext-private: the fast-commit region holds per-core rings of i-transactions
/// (`ijournal=percore`, format/itransaction.rs), not ext4 fast commits. Set while the log
/// is not empty in that mode, so that Linux refuses the journal instead of misreading it.
pub const INCOMPAT_JEXT_PERCORE: u32 = 0x4000_0000;
/// jext-private: the log may hold byte-granular records (`super::records`), a block type
/// Linux does not know (its scan would end there and drop every later transaction).
pub const INCOMPAT_JEXT_RECORDS: u32 = 0x2000_0000;
/// The private bits that say what live transactions hold: set before the first such
/// transaction can reach the disk, cleared whenever the log is marked empty.
pub const INCOMPAT_JEXT_LIVE_LOG: u32 = INCOMPAT_JEXT_SINGLE_IO | INCOMPAT_JEXT_RECORDS;

/// The incompat features jext knows, by e2fsprogs' names (1.47.0 prints the last as
/// `FEATURE_I5`).
const INCOMPAT_NAMES: [(u32, &str); 9] = [
    (INCOMPAT_REVOKE, "journal_incompat_revoke"),
    (INCOMPAT_64BIT, "journal_64bit"),
    (INCOMPAT_ASYNC_COMMIT, "journal_async_commit"),
    (INCOMPAT_CSUM_V2, "journal_checksum_v2"),
    (INCOMPAT_CSUM_V3, "journal_checksum_v3"),
    (INCOMPAT_FAST_COMMIT, "journal_fast_commit"),
    (INCOMPAT_JEXT_SINGLE_IO, "jext_single_io_commit"),
    (INCOMPAT_JEXT_PERCORE, "jext_percore_itransactions"),
    (INCOMPAT_JEXT_RECORDS, "jext_byte_records"),
];
const INCOMPAT_KNOWN: u32 = INCOMPAT_REVOKE
    | INCOMPAT_64BIT
    | INCOMPAT_ASYNC_COMMIT
    | INCOMPAT_CSUM_V2
    | INCOMPAT_CSUM_V3
    | INCOMPAT_FAST_COMMIT
    | INCOMPAT_JEXT_SINGLE_IO
    | INCOMPAT_JEXT_PERCORE
    | INCOMPAT_JEXT_RECORDS;

pub const CHECKSUM_TYPE_CRC32C: u8 = 4;
/// Fast-commit blocks when the feature is on and `s_num_fc_blks` is 0 (the kernel's
/// `JBD2_DEFAULT_FAST_COMMIT_BLOCKS`).
pub const DEFAULT_FAST_COMMIT_BLOCKS: u32 = 256;
/// The kernel refuses a log shorter than this (`JBD2_MIN_JOURNAL_BLOCKS`).
pub const MIN_LOG_BLOCKS: u32 = 1024;

/// The journal superblock as its raw bytes with typed accessors, so that fields jext does
/// not interpret round-trip untouched.
#[derive(Clone, PartialEq, Eq)]
pub struct JournalSuperblock {
    raw: [u8; SUPERBLOCK_SIZE],
}

macro_rules! be_fields {
    ($($(#[$doc:meta])* $get:ident / $set:ident @ $off:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $get(&self) -> u32 { u32_at(&self.raw, $off) }
            pub fn $set(&mut self, value: u32) { put_u32(&mut self.raw, $off, value) }
        )*
    };
}

impl JournalSuperblock {
    /// A fresh, empty v2 superblock for a journal of `maxlen` blocks of `block_size` bytes,
    /// with no features (as `mkfs.ext4` writes it; ext4 adds features at mount).
    pub fn new(block_size: u32, maxlen: u32, uuid: [u8; 16]) -> JournalSuperblock {
        assert!(
            block_size.is_power_of_two() && (1024..=65536).contains(&block_size),
            "journal block size {block_size}"
        );
        assert!(maxlen >= MIN_LOG_BLOCKS, "journal of {maxlen} blocks");
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
        sb.raw[UUID_OFFSET..UUID_OFFSET + 16].copy_from_slice(&uuid);
        sb
    }

    be_fields! {
        /// `s_blocksize`, bytes.
        block_size / set_block_size @ 0x0C;
        /// `s_maxlen`, blocks.
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
        /// `s_num_fc_blks` as stored (0 may mean the default: see
        /// [`JournalSuperblock::fast_commit_blocks`]).
        num_fc_blocks_field / set_num_fc_blocks_field @ 0x54;
        /// `s_head`: where the log head was when the journal was last marked empty.
        head / set_head @ 0x58;
    }

    pub fn blocktype(&self) -> u32 {
        u32_at(&self.raw, 4)
    }

    pub fn uuid(&self) -> [u8; 16] {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&self.raw[UUID_OFFSET..UUID_OFFSET + 16]);
        uuid
    }

    pub fn checksum_type(&self) -> u8 {
        self.raw[CHECKSUM_TYPE_OFFSET]
    }

    /// True if any of the incompat feature `bits` is set.
    pub fn has_incompat(&self, bits: u32) -> bool {
        self.feature_incompat() & bits != 0
    }

    /// True if the log is marked empty (nothing to recover).
    pub fn is_clean(&self) -> bool {
        self.start() == 0
    }

    /// Blocks at the end of the journal reserved for fast commits (0 without the feature).
    pub fn fast_commit_blocks(&self) -> u32 {
        if !self.has_incompat(INCOMPAT_FAST_COMMIT) {
            return 0;
        }
        match self.num_fc_blocks_field() {
            0 => DEFAULT_FAST_COMMIT_BLOCKS,
            n => n,
        }
    }

    /// One past the last block the log (not fast commits) may use: the kernel's `j_last`.
    pub fn log_end(&self) -> u32 {
        self.maxlen().saturating_sub(self.fast_commit_blocks())
    }

    /// The first fast-commit block, if the feature is on (the kernel's `j_fc_first`).
    pub fn fast_commit_first(&self) -> Option<u32> {
        self.has_incompat(INCOMPAT_FAST_COMMIT)
            .then(|| self.log_end() + 1)
    }

    /// Turns on CSUM_V3 (and 64BIT when `wide_blocks`), as ext4 does at mount when the file
    /// system has metadata_csum: mkfs leaves the journal features empty. v1 and v2
    /// checksums are turned off, as ext4 does, since at most one kind may be on.
    pub fn enable_csum_v3(&mut self, wide_blocks: bool) {
        let mut incompat = self.feature_incompat() & !INCOMPAT_CSUM_V2;
        incompat |= INCOMPAT_CSUM_V3;
        if wide_blocks {
            incompat |= INCOMPAT_64BIT;
        }
        self.set_feature_incompat(incompat);
        self.set_feature_compat(self.feature_compat() & !COMPAT_CHECKSUM);
        self.raw[CHECKSUM_TYPE_OFFSET] = CHECKSUM_TYPE_CRC32C;
    }

    /// Marks the log empty the way the kernel does after recovery: no start, the next
    /// transaction `sequence`, the block after the last replayed commit as `s_head`, and
    /// no FAST_COMMIT (the file system turns it back on at mount), and none of
    /// [`INCOMPAT_JEXT_LIVE_LOG`] (an empty log holds no single-I/O transaction and no
    /// byte record).
    pub fn mark_empty(&mut self, sequence: u32, head: u32) {
        self.set_start(0);
        self.set_sequence(sequence);
        self.set_head(head);
        let cleared = INCOMPAT_FAST_COMMIT | INCOMPAT_JEXT_LIVE_LOG;
        self.set_feature_incompat(self.feature_incompat() & !cleared);
    }

    /// Sets exactly `bits` (a subset of [`INCOMPAT_JEXT_LIVE_LOG`]) of the live-log bits.
    pub fn set_live_log_bits(&mut self, bits: u32) {
        debug_assert_eq!(bits & !INCOMPAT_JEXT_LIVE_LOG, 0);
        let incompat = self.feature_incompat() & !INCOMPAT_JEXT_LIVE_LOG;
        self.set_feature_incompat(incompat | bits);
    }

    /// Turns on FAST_COMMIT: the last `s_num_fc_blks` blocks (256 if 0) leave the log.
    pub fn enable_fast_commit(&mut self) {
        self.set_feature_incompat(self.feature_incompat() | INCOMPAT_FAST_COMMIT);
    }

    fn has_csum_v2_or_v3(&self) -> bool {
        self.has_incompat(INCOMPAT_CSUM_V2 | INCOMPAT_CSUM_V3)
    }

    fn stored_checksum(&self) -> u32 {
        u32_at(&self.raw, CHECKSUM_OFFSET)
    }

    fn compute_checksum(&self) -> u32 {
        let mut copy = self.raw;
        put_u32(&mut copy, CHECKSUM_OFFSET, 0);
        crc32c_raw(!0, &copy)
    }

    /// The 1024 bytes, with a fresh checksum when the journal has v2/v3 checksums.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        debug_assert_eq!(u32_at(&self.raw, 0), JBD2_MAGIC);
        assert!(
            !(self.has_incompat(INCOMPAT_CSUM_V2) && self.has_incompat(INCOMPAT_CSUM_V3)),
            "checksum v2 and v3 together"
        );
        assert!(
            self.log_end() > self.first(),
            "s_first {} leaves no log before block {}",
            self.first(),
            self.log_end()
        );
        let mut raw = self.raw;
        if self.has_csum_v2_or_v3() {
            put_u32(&mut raw, CHECKSUM_OFFSET, self.compute_checksum());
        }
        raw
    }

    /// Decodes and validates the superblock of a journal area of `area_blocks` blocks,
    /// with the checks Linux makes before it loads a journal.
    pub fn decode(bytes: &[u8], area_blocks: u32) -> Result<JournalSuperblock, JournalError> {
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(corrupt(format!("only {} bytes", bytes.len())));
        }
        let mut raw = [0u8; SUPERBLOCK_SIZE];
        raw.copy_from_slice(&bytes[..SUPERBLOCK_SIZE]);
        let sb = JournalSuperblock { raw };
        sb.check_identity()?;
        sb.check_features()?;
        sb.check_checksum()?;
        sb.check_geometry(area_blocks)?;
        Ok(sb)
    }

    fn check_identity(&self) -> Result<(), JournalError> {
        let magic = u32_at(&self.raw, 0);
        if magic != JBD2_MAGIC {
            return Err(corrupt(format!(
                "h_magic {magic:#010x} (expected {JBD2_MAGIC:#010x})"
            )));
        }
        match self.blocktype() {
            BLOCKTYPE_SUPERBLOCK_V2 => {}
            BLOCKTYPE_SUPERBLOCK_V1 => {
                return Err(JournalError::Unsupported(
                    "a version 1 journal superblock (h_blocktype 3)".into(),
                ))
            }
            other => {
                return Err(corrupt(format!(
                    "h_blocktype {other} (expected 4, superblock v2)"
                )))
            }
        }
        let block_size = self.block_size();
        if !block_size.is_power_of_two() || !(1024..=65536).contains(&block_size) {
            return Err(corrupt(format!(
                "s_blocksize {block_size} is not a power of two in 1024..=65536"
            )));
        }
        Ok(())
    }

    fn check_features(&self) -> Result<(), JournalError> {
        let unknown_incompat = self.feature_incompat() & !INCOMPAT_KNOWN;
        let unknown_ro_compat = self.feature_ro_compat();
        if unknown_incompat != 0 || unknown_ro_compat != 0 {
            return Err(JournalError::Unsupported(format!(
                "unknown journal features: incompat {unknown_incompat:#x}, ro_compat \
                 {unknown_ro_compat:#x} (known incompat: {})",
                incompat_names(INCOMPAT_KNOWN)
            )));
        }
        if self.has_incompat(INCOMPAT_CSUM_V2) && self.has_incompat(INCOMPAT_CSUM_V3) {
            return Err(corrupt(format!(
                "s_feature_incompat {:#x} has both journal_checksum_v2 and _v3",
                self.feature_incompat()
            )));
        }
        if self.has_csum_v2_or_v3() && self.feature_compat() & COMPAT_CHECKSUM != 0 {
            return Err(corrupt(format!(
                "v1 checksums (s_feature_compat {:#x}) together with {}",
                self.feature_compat(),
                incompat_names(self.feature_incompat())
            )));
        }
        Ok(())
    }

    fn check_checksum(&self) -> Result<(), JournalError> {
        if !self.has_csum_v2_or_v3() {
            return Ok(());
        }
        if self.checksum_type() != CHECKSUM_TYPE_CRC32C {
            return Err(corrupt(format!(
                "s_checksum_type {} (expected 4, crc32c, with {})",
                self.checksum_type(),
                incompat_names(self.feature_incompat())
            )));
        }
        let (stored, computed) = (self.stored_checksum(), self.compute_checksum());
        if stored != computed {
            return Err(corrupt(format!(
                "s_checksum {stored:#010x}, computed {computed:#010x}"
            )));
        }
        Ok(())
    }

    fn check_geometry(&self, area_blocks: u32) -> Result<(), JournalError> {
        let (maxlen, fc) = (self.maxlen(), self.fast_commit_blocks());
        if maxlen > area_blocks {
            return Err(corrupt(format!(
                "s_maxlen {maxlen} is beyond the journal area of {area_blocks} blocks"
            )));
        }
        if u64::from(maxlen) < u64::from(MIN_LOG_BLOCKS) + u64::from(fc) {
            return Err(corrupt(format!(
                "s_maxlen {maxlen} with {fc} fast-commit blocks leaves less than \
                 {MIN_LOG_BLOCKS} log blocks"
            )));
        }
        let (first, end) = (self.first(), self.log_end());
        if first == 0 || first >= end {
            return Err(corrupt(format!(
                "s_first {first} is outside the log [1, {end})"
            )));
        }
        let start = self.start();
        if start != 0 && !(first..end).contains(&start) {
            return Err(corrupt(format!(
                "s_start {start} is outside the log [{first}, {end})"
            )));
        }
        Ok(())
    }
}

fn corrupt(problem: String) -> JournalError {
    JournalError::Corrupt {
        structure: "journal superblock",
        journal_block: 0,
        problem,
    }
}

/// The names of the known incompat features in `bits` ("none" if there are none).
pub fn incompat_names(bits: u32) -> String {
    let names: Vec<&str> = INCOMPAT_NAMES
        .iter()
        .filter(|(bit, _)| bits & bit != 0)
        .map(|(_, name)| *name)
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(" ")
    }
}

impl std::fmt::Debug for JournalSuperblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalSuperblock")
            .field("block_size", &self.block_size())
            .field("maxlen", &self.maxlen())
            .field("first", &self.first())
            .field("log_end", &self.log_end())
            .field("sequence", &self.sequence())
            .field("start", &self.start())
            .field("errno", &(self.errno() as i32))
            .field("compat", &format_args!("{:#x}", self.feature_compat()))
            .field("incompat", &incompat_names(self.feature_incompat()))
            .field("head", &self.head())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_err(bytes: &[u8], area_blocks: u32) -> String {
        JournalSuperblock::decode(bytes, area_blocks)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn the_live_log_bits_are_known_named_and_gone_when_the_log_is_empty() {
        let mut sb = JournalSuperblock::new(4096, 16384, [9; 16]);
        sb.enable_csum_v3(true);
        sb.set_start(3);
        sb.set_live_log_bits(INCOMPAT_JEXT_LIVE_LOG);
        let bytes = sb.encode();
        assert_eq!(
            u32_at(&bytes, 0x28) & 0xA000_0000,
            0xA000_0000,
            "s_feature_incompat"
        );
        let back = JournalSuperblock::decode(&bytes, 16384).unwrap();
        assert!(back.has_incompat(INCOMPAT_JEXT_SINGLE_IO | INCOMPAT_JEXT_RECORDS));
        let names = incompat_names(back.feature_incompat());
        assert!(names.contains("jext_single_io_commit"), "{names}");
        assert!(names.contains("jext_byte_records"), "{names}");
        let mut emptied = back.clone();
        emptied.mark_empty(9, 3);
        assert!(!emptied.has_incompat(INCOMPAT_JEXT_SINGLE_IO));
        assert!(!emptied.has_incompat(INCOMPAT_JEXT_RECORDS));
        assert!(
            emptied.has_incompat(INCOMPAT_CSUM_V3),
            "other features stay"
        );
        sb.set_live_log_bits(INCOMPAT_JEXT_RECORDS);
        assert!(!sb.has_incompat(INCOMPAT_JEXT_SINGLE_IO));
        assert!(sb.has_incompat(INCOMPAT_JEXT_RECORDS));
        sb.set_live_log_bits(0);
        assert!(!sb.has_incompat(INCOMPAT_JEXT_LIVE_LOG));
    }

    #[test]
    fn round_trips_every_byte_and_checks_its_checksum() {
        let mut sb = JournalSuperblock::new(4096, 16384, [9; 16]);
        sb.enable_csum_v3(true);
        sb.set_start(7);
        sb.set_sequence(42);
        sb.set_max_transaction(77);
        // Bytes jext does not interpret (padding, users) must survive.
        sb.raw[0x60] = 0xAB;
        sb.raw[0x3FF] = 0xCD;
        let bytes = sb.encode();
        let back = JournalSuperblock::decode(&bytes, 16384).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!((back.raw[0x60], back.raw[0x3FF]), (0xAB, 0xCD));
        assert_eq!(
            (back.start(), back.sequence(), back.max_transaction()),
            (7, 42, 77)
        );
        assert!(back.has_incompat(INCOMPAT_CSUM_V3) && back.has_incompat(INCOMPAT_64BIT));
        let mut flipped = bytes;
        flipped[0x18] ^= 1;
        let err = decode_err(&flipped, 16384);
        assert!(
            err.contains("journal superblock") && err.contains("s_checksum"),
            "{err}"
        );
        let err = decode_err(&bytes, 100);
        assert!(err.contains("s_maxlen 16384"), "{err}");
    }

    #[test]
    fn refuses_what_linux_refuses_naming_the_field() {
        let good = JournalSuperblock::new(1024, 4096, [3; 16]);
        let mut bytes = good.encode();
        bytes[0x2B] |= 0x40;
        let err = decode_err(&bytes, 4096);
        assert!(err.contains("incompat 0x40"), "{err}");

        let mut both = good.clone();
        both.set_feature_incompat(INCOMPAT_CSUM_V2);
        both.raw[0x2B] |= INCOMPAT_CSUM_V3 as u8;
        let err = decode_err(&both.raw, 4096);
        assert!(err.contains("both journal_checksum_v2 and _v3"), "{err}");

        let mut v1_and_v3 = good.clone();
        v1_and_v3.enable_csum_v3(false);
        v1_and_v3.set_feature_compat(COMPAT_CHECKSUM);
        let err = decode_err(&v1_and_v3.encode(), 4096);
        assert!(err.contains("v1 checksums"), "{err}");

        let mut started = good.clone();
        started.set_start(4096);
        let err = decode_err(&started.raw, 4096);
        assert!(err.contains("s_start 4096"), "{err}");

        let mut v1 = good.raw;
        v1[7] = 3;
        assert!(matches!(
            JournalSuperblock::decode(&v1, 4096),
            Err(JournalError::Unsupported(_))
        ));
        let mut bad_magic = good.raw;
        bad_magic[0] = 0;
        assert!(decode_err(&bad_magic, 4096).contains("h_magic 0x003b3998"));
    }

    #[test]
    fn fast_commit_blocks_leave_the_log_as_the_kernel_computes() {
        let mut sb = JournalSuperblock::new(1024, 4096, [1; 16]);
        assert_eq!((sb.log_end(), sb.fast_commit_first()), (4096, None));
        sb.enable_fast_commit();
        assert_eq!(sb.log_end(), 4096 - 256, "0 means 256");
        assert_eq!(sb.fast_commit_first(), Some(4096 - 256 + 1));
        sb.set_num_fc_blocks_field(64);
        assert_eq!(sb.log_end(), 4032);
        JournalSuperblock::decode(&sb.encode(), 4096).unwrap();
        // The log must keep its 1024 blocks.
        sb.set_num_fc_blocks_field(3100);
        let err = decode_err(&sb.raw, 4096);
        assert!(err.contains("3100 fast-commit blocks"), "{err}");
    }
}
