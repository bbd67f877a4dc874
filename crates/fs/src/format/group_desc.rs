//! Group descriptors: one per block group, packed in the group descriptor table (GDT) in
//! the blocks after the superblock. 32 bytes, or 64 with the 64bit feature (the second
//! half holds the high words). Layout (little-endian):
//!
//! ```text
//! off  size field                          off  size field
//! 0x00 4 bg_block_bitmap_lo                0x20 4 bg_block_bitmap_hi
//! 0x04 4 bg_inode_bitmap_lo                0x24 4 bg_inode_bitmap_hi
//! 0x08 4 bg_inode_table_lo                 0x28 4 bg_inode_table_hi
//! 0x0C 2 bg_free_blocks_count_lo           0x2C 2 bg_free_blocks_count_hi
//! 0x0E 2 bg_free_inodes_count_lo           0x2E 2 bg_free_inodes_count_hi
//! 0x10 2 bg_used_dirs_count_lo             0x30 2 bg_used_dirs_count_hi
//! 0x12 2 bg_flags (INODE_UNINIT 1,         0x32 2 bg_itable_unused_hi
//!          BLOCK_UNINIT 2, ITABLE_ZEROED 4) 0x34 4 bg_exclude_bitmap_hi
//! 0x14 4 bg_exclude_bitmap_lo              0x38 2 bg_block_bitmap_csum_hi
//! 0x18 2 bg_block_bitmap_csum_lo           0x3A 2 bg_inode_bitmap_csum_hi
//! 0x1A 2 bg_inode_bitmap_csum_lo           0x3C 4 bg_reserved
//! 0x1C 2 bg_itable_unused_lo
//! 0x1E 2 bg_checksum
//! ```
//!
//! Promise: decode verifies the checksum and combines lo/hi halves (32-byte descriptors
//! have no high halves, so those read as zero); [`GroupDesc::check_against`] checks the
//! locations against the superblock. Encode refuses values the descriptor size cannot
//! hold. Neither ever fixes a count.
//!
//! The checksum with metadata_csum is the low 16 bits of
//! `crc32c_raw(fs_seed, le32 group ‖ descriptor with bg_checksum as zero)`; with the older
//! gdt_csum it is `crc16(crc16(!0, uuid) ‖ le32 group ‖ descriptor without bg_checksum)`.

use super::csum::{crc16, crc32c_raw};
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::superblock::Superblock;
use super::{FormatError, Location};

pub const FLAG_INODE_UNINIT: u16 = 0x1;
pub const FLAG_BLOCK_UNINIT: u16 = 0x2;
pub const FLAG_ITABLE_ZEROED: u16 = 0x4;

const CHECKSUM_OFFSET: usize = 0x1E;

/// How group descriptors are checksummed in this file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupCsum {
    None,
    /// `gdt_csum` (uninit_bg): crc16 seeded with the uuid.
    Crc16 {
        uuid: [u8; 16],
    },
    /// metadata_csum: crc32c from the fs seed.
    Crc32c {
        fs_seed: u32,
    },
}

/// One decoded group descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupDesc {
    pub block_bitmap: u64,
    pub inode_bitmap: u64,
    pub inode_table: u64,
    pub free_blocks: u32,
    pub free_inodes: u32,
    pub used_dirs: u32,
    pub flags: u16,
    pub exclude_bitmap: u64,
    pub block_bitmap_csum: u32,
    pub inode_bitmap_csum: u32,
    pub itable_unused: u32,
    pub checksum: u16,
    pub reserved: u32,
}

impl GroupDesc {
    /// Decodes `bytes` (exactly one descriptor of `desc_size` bytes).
    pub fn decode(bytes: &[u8], group: u32, csum: GroupCsum) -> Result<GroupDesc, FormatError> {
        let size = bytes.len();
        assert!(size == 32 || size >= 64, "descriptor size {size}");
        let hi32 = |off: usize| {
            if size >= 64 {
                u64::from(u32_at(bytes, off)) << 32
            } else {
                0
            }
        };
        let hi16 = |off: usize| {
            if size >= 64 {
                u32::from(u16_at(bytes, off)) << 16
            } else {
                0
            }
        };
        let desc = GroupDesc {
            block_bitmap: u64::from(u32_at(bytes, 0x00)) | hi32(0x20),
            inode_bitmap: u64::from(u32_at(bytes, 0x04)) | hi32(0x24),
            inode_table: u64::from(u32_at(bytes, 0x08)) | hi32(0x28),
            free_blocks: u32::from(u16_at(bytes, 0x0C)) | hi16(0x2C),
            free_inodes: u32::from(u16_at(bytes, 0x0E)) | hi16(0x2E),
            used_dirs: u32::from(u16_at(bytes, 0x10)) | hi16(0x30),
            flags: u16_at(bytes, 0x12),
            exclude_bitmap: u64::from(u32_at(bytes, 0x14)) | hi32(0x34),
            block_bitmap_csum: u32::from(u16_at(bytes, 0x18)) | hi16(0x38),
            inode_bitmap_csum: u32::from(u16_at(bytes, 0x1A)) | hi16(0x3A),
            itable_unused: u32::from(u16_at(bytes, 0x1C)) | hi16(0x32),
            checksum: u16_at(bytes, CHECKSUM_OFFSET),
            reserved: if size >= 64 { u32_at(bytes, 0x3C) } else { 0 },
        };
        if let Some(expected) = checksum(bytes, group, csum) {
            if expected != desc.checksum {
                return Err(FormatError::new(
                    "group descriptor",
                    Location::GroupDesc { group },
                    format!(
                        "checksum mismatch: stored {:#06x}, computed {expected:#06x}",
                        desc.checksum
                    ),
                ));
            }
        }
        Ok(desc)
    }

    /// Encodes into `out` (one descriptor of `desc_size` bytes) with a fresh checksum.
    pub fn encode(&self, out: &mut [u8], group: u32, csum: GroupCsum) {
        let size = out.len();
        assert!(size == 32 || size >= 64, "descriptor size {size}");
        if size < 64 {
            for (what, v) in [
                ("block bitmap", self.block_bitmap),
                ("inode bitmap", self.inode_bitmap),
                ("inode table", self.inode_table),
            ] {
                assert!(v >> 32 == 0, "{what} at {v} needs 64-byte descriptors");
            }
            assert!(self.free_blocks >> 16 == 0 && self.free_inodes >> 16 == 0);
        }
        put_u32(out, 0x00, self.block_bitmap as u32);
        put_u32(out, 0x04, self.inode_bitmap as u32);
        put_u32(out, 0x08, self.inode_table as u32);
        put_u16(out, 0x0C, self.free_blocks as u16);
        put_u16(out, 0x0E, self.free_inodes as u16);
        put_u16(out, 0x10, self.used_dirs as u16);
        put_u16(out, 0x12, self.flags);
        put_u32(out, 0x14, self.exclude_bitmap as u32);
        put_u16(out, 0x18, self.block_bitmap_csum as u16);
        put_u16(out, 0x1A, self.inode_bitmap_csum as u16);
        put_u16(out, 0x1C, self.itable_unused as u16);
        if size >= 64 {
            put_u32(out, 0x20, (self.block_bitmap >> 32) as u32);
            put_u32(out, 0x24, (self.inode_bitmap >> 32) as u32);
            put_u32(out, 0x28, (self.inode_table >> 32) as u32);
            put_u16(out, 0x2C, (self.free_blocks >> 16) as u16);
            put_u16(out, 0x2E, (self.free_inodes >> 16) as u16);
            put_u16(out, 0x30, (self.used_dirs >> 16) as u16);
            put_u16(out, 0x32, (self.itable_unused >> 16) as u16);
            put_u32(out, 0x34, (self.exclude_bitmap >> 32) as u32);
            put_u16(out, 0x38, (self.block_bitmap_csum >> 16) as u16);
            put_u16(out, 0x3A, (self.inode_bitmap_csum >> 16) as u16);
            put_u32(out, 0x3C, self.reserved);
        }
        let value = checksum(out, group, csum).unwrap_or(self.checksum);
        put_u16(out, CHECKSUM_OFFSET, value);
    }

    /// Checks that the bitmaps and the inode table lie inside the file system (inside
    /// the group itself without flex_bg), off the primary superblock, and that the counts
    /// fit the group. Decode cannot do this alone: it needs the superblock's geometry.
    pub fn check_against(&self, group: u32, sb: &Superblock) -> Result<(), FormatError> {
        let err = |problem: String| {
            FormatError::new("group descriptor", Location::GroupDesc { group }, problem)
        };
        let first_data_block = u64::from(sb.first_data_block());
        let (low, high) = if sb.has_flex_bg() {
            (first_data_block, sb.blocks_count())
        } else {
            let start = first_data_block + u64::from(group) * u64::from(sb.blocks_per_group());
            (
                start,
                (start + u64::from(sb.blocks_per_group())).min(sb.blocks_count()),
            )
        };
        let table_blocks = (u64::from(sb.inodes_per_group()) * u64::from(sb.inode_size()))
            .div_ceil(u64::from(sb.block_size()));
        let superblock_block = u64::from(sb.block_size() == 1024);
        for (what, start, len) in [
            ("block bitmap", self.block_bitmap, 1),
            ("inode bitmap", self.inode_bitmap, 1),
            ("inode table", self.inode_table, table_blocks),
        ] {
            if start < low || start.saturating_add(len) > high || start == superblock_block {
                return Err(err(format!(
                    "{what} at block {start} ({len} blocks) is outside {low}..{high}"
                )));
            }
        }
        let ipg = sb.inodes_per_group();
        for (what, count, limit) in [
            ("free blocks", self.free_blocks, sb.blocks_per_group()),
            ("free inodes", self.free_inodes, ipg),
            ("used directories", self.used_dirs, ipg),
            ("unused inode table entries", self.itable_unused, ipg),
        ] {
            if count > limit {
                return Err(err(format!("{count} {what} in a group of {limit}")));
            }
        }
        Ok(())
    }

    pub fn has_flag(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    /// Stores bitmap checksums; only the low 16 bits fit 32-byte descriptors.
    pub fn set_bitmap_csums(
        &mut self,
        block_bitmap_csum: u32,
        inode_bitmap_csum: u32,
        desc_size: u32,
    ) {
        let mask = if desc_size >= 64 { u32::MAX } else { 0xFFFF };
        self.block_bitmap_csum = block_bitmap_csum & mask;
        self.inode_bitmap_csum = inode_bitmap_csum & mask;
    }
}

/// The checksum `bytes` should carry, or `None` without group checksums.
fn checksum(bytes: &[u8], group: u32, csum: GroupCsum) -> Option<u16> {
    let group_le = group.to_le_bytes();
    match csum {
        GroupCsum::None => None,
        GroupCsum::Crc32c { fs_seed } => {
            let mut c = crc32c_raw(fs_seed, &group_le);
            c = crc32c_raw(c, &bytes[..CHECKSUM_OFFSET]);
            c = crc32c_raw(c, &[0, 0]);
            c = crc32c_raw(c, &bytes[CHECKSUM_OFFSET + 2..]);
            Some(c as u16)
        }
        GroupCsum::Crc16 { uuid } => {
            let mut c = crc16(!0, &uuid);
            c = crc16(c, &group_le);
            c = crc16(c, &bytes[..CHECKSUM_OFFSET]);
            if bytes.len() > CHECKSUM_OFFSET + 2 {
                c = crc16(c, &bytes[CHECKSUM_OFFSET + 2..]);
            }
            Some(c)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GroupDesc {
        GroupDesc {
            block_bitmap: 0x1_0000_0103,
            inode_bitmap: 267,
            inode_table: 275,
            free_blocks: 70000,
            free_inodes: 2037,
            used_dirs: 2,
            flags: FLAG_ITABLE_ZEROED,
            block_bitmap_csum: 0x2fa7c9fc,
            inode_bitmap_csum: 0x1a88da32,
            itable_unused: 2037,
            ..Default::default()
        }
    }

    #[test]
    fn locations_are_checked_against_the_superblock() {
        let sb = crate::format::superblock::tests::sample();
        let good = GroupDesc {
            block_bitmap: 259,
            inode_bitmap: 275,
            inode_table: 291,
            free_blocks: 100,
            free_inodes: 2000,
            ..Default::default()
        };
        good.check_against(3, &sb).unwrap();
        let outside = GroupDesc {
            inode_table: 65536 - 10,
            ..good
        };
        let err = outside.check_against(3, &sb).unwrap_err();
        assert!(
            err.problem.contains("inode table at block 65526")
                && err.location == Location::GroupDesc { group: 3 },
            "{err}"
        );
        let too_free = GroupDesc {
            free_inodes: 2049,
            ..good
        };
        assert!(too_free
            .check_against(0, &sb)
            .unwrap_err()
            .problem
            .contains("2049 free inodes"));
    }

    #[test]
    fn round_trips_with_each_checksum_kind() {
        for csum in [
            GroupCsum::None,
            GroupCsum::Crc16 { uuid: [3; 16] },
            GroupCsum::Crc32c {
                fs_seed: 0x1234_5678,
            },
        ] {
            let mut bytes = [0u8; 64];
            sample().encode(&mut bytes, 5, csum);
            let back = GroupDesc::decode(&bytes, 5, csum).unwrap();
            assert_eq!(
                GroupDesc {
                    checksum: 0,
                    ..back
                },
                sample()
            );
            let mut again = [0u8; 64];
            back.encode(&mut again, 5, csum);
            assert_eq!(again, bytes);
            if csum != GroupCsum::None {
                let err = GroupDesc::decode(&bytes, 6, csum).unwrap_err();
                assert!(err.to_string().contains("group descriptor 6"), "{err}");
            }
        }
    }
}
