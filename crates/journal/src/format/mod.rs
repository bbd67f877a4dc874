//! The JBD2 on-disk format: the journal superblock ([`superblock`]) and the log blocks
//! (descriptor, commit and revoke blocks: [`blocks`]). JBD2 is big-endian throughout.
//!
//! Everything here is pure encoding: no IO. Decoders return a [`crate::JournalError`]
//! naming the journal block and what is wrong; encoders assert their invariants.

pub mod blocks;
pub mod superblock;

pub use blocks::{BlockKind, CommitBlock, LogFormat, Tag};
pub use superblock::JournalSuperblock;

/// The first four bytes of every JBD2 metadata block (and of no escaped data block).
pub const JBD2_MAGIC: u32 = 0xC03B_3998;

/// `crc32c` continued from `seed` without final inversion, as `jbd2_chksum` computes it.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// Big-endian field access.
pub(crate) mod be {
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_be_bytes([b[off], b[off + 1]])
    }
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_be_bytes(b[off..off + 4].try_into().expect("4 bytes"))
    }
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_be_bytes(b[off..off + 8].try_into().expect("8 bytes"))
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
