//! The JBD2 on-disk format: the journal superblock ([`superblock`]) and the log blocks
//! (descriptor, commit and revoke blocks: [`blocks`]), and ext4 fast commits in the
//! fast-commit area ([`fast_commit`], little-endian), and jext's per-core i-transactions
//! there ([`itransaction`], little-endian, behind a private incompat bit), and jext's
//! byte-granular records in the log ([`records`], behind another) and its compact commit
//! blocks ([`compact`], single-I/O logs only). JBD2 is
//! big-endian throughout.
//!
//! Everything here is pure encoding: no IO. Decoders return a [`crate::JournalError`]
//! naming the structure, the journal block and what is wrong, and never panic on bad
//! bytes; encoders assert their invariants. Nothing here repairs what it reads.

pub mod blocks;
pub mod compact;
pub mod fast_commit;
pub mod itransaction;
pub mod records;
pub mod superblock;

pub use blocks::{BlockKind, CommitBlock, Csum, LogFormat, Tag};
pub use superblock::JournalSuperblock;

/// The first four bytes of every JBD2 metadata block (and of no logged data block: those
/// are escaped).
pub const JBD2_MAGIC: u32 = 0xC03B_3998;

/// CRC32C continued from `seed` without the final inversion, as the kernel's `jbd2_chksum`
/// (`crc32c_le`) computes it. The `crc32c` crate inverts on entry and exit, so undo both.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The kernel's `crc32_be`: CRC32 with the 0x04C11DB7 polynomial, most significant bit
/// first, no inversion. Only the old COMPAT_CHECKSUM (v1) journals use it.
pub fn crc32_be(seed: u32, data: &[u8]) -> u32 {
    data.iter().fold(seed, |crc, &byte| {
        (crc << 8) ^ CRC32_BE_TABLE[((crc >> 24) as u8 ^ byte) as usize]
    })
}

const CRC32_BE_POLY: u32 = 0x04C1_1DB7;

const CRC32_BE_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u32) << 24;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ CRC32_BE_POLY
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Big-endian field access. Callers pass offsets inside the block, whose size the format
/// fixes; an offset past the end is a bug in the caller, not bad data.
pub(crate) mod be {
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_be_bytes([b[off], b[off + 1]])
    }
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
    }
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from(u32_at(b, off)) << 32 | u64::from(u32_at(b, off + 4))
    }
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_be_bytes());
    }
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_raw_is_the_kernel_register_without_inversions() {
        // Standard CRC32C("123456789") = 0xE3069283 = !raw(!0, ..).
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xE306_9283);
        // Continuing is the same as computing in one go.
        let whole = crc32c_raw(7, b"abcdef");
        assert_eq!(crc32c_raw(crc32c_raw(7, b"abc"), b"def"), whole);
    }

    #[test]
    fn crc32_be_matches_crc32_mpeg2() {
        // CRC-32/MPEG-2 is exactly crc32_be seeded with !0.
        assert_eq!(crc32_be(!0, b"123456789"), 0x0376_E6E7);
        assert_eq!(crc32_be(0, b""), 0);
    }
}
