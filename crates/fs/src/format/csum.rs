//! Checksums as ext4 computes them.
//!
//! ext4's `ext4_chksum(seed, data)` is CRC32C (Castagnoli) continued from `seed`, with no
//! final inversion. The `crc32c` crate computes the standard form (initial and final
//! inversion), so `raw(seed, data) = !crc32c_append(!seed, data)`.
//!
//! The metadata_csum seed of a file system is `raw(!0, uuid)`, or the superblock's
//! `s_checksum_seed` when the `csum_seed` feature is set. Structures owned by an inode
//! (extent blocks, directory blocks, the inode itself) continue from the *inode seed*:
//! `raw(raw(fs_seed, le32 ino), le32 generation)`.
//!
//! Promise: pure functions, bit-exact with the kernel (checked against Linux-written
//! images in `tests/format_real_image.rs`). They compute checksums; deciding whether a
//! structure has one (metadata_csum, gdt_csum, neither) is the caller's job.

/// CRC32C of `data` continued from `seed`, without final inversion (`ext4_chksum`).
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// The per-inode seed for metadata owned by inode `ino` of generation `generation`.
pub fn inode_seed(fs_seed: u32, ino: u32, generation: u32) -> u32 {
    let seed = crc32c_raw(fs_seed, &ino.to_le_bytes());
    crc32c_raw(seed, &generation.to_le_bytes())
}

/// CRC16 (ANSI, reflected polynomial 0xA001) as used by the older `gdt_csum` feature.
pub fn crc16(mut crc: u16, data: &[u8]) -> u16 {
    for &byte in data {
        crc ^= u16::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xA001
            } else {
                crc >> 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_crc_continues_across_splits() {
        let data = b"jext checksums continue across calls";
        let whole = crc32c_raw(!0, data);
        let split = crc32c_raw(crc32c_raw(!0, &data[..10]), &data[10..]);
        assert_eq!(whole, split);
        // Standard CRC32C check value for "123456789" is 0xE3069283; the raw form from !0
        // is its inversion.
        assert_eq!(crc32c_raw(!0, b"123456789"), !0xE306_9283);
    }

    #[test]
    fn crc16_matches_the_arc_check_value() {
        assert_eq!(crc16(0, b"123456789"), 0xBB3D);
    }
}
