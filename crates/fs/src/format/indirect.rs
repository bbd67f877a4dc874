//! The classic (ext2/ext3) indirect block map, which ext4 still uses for files without
//! the extents flag and for the resize inode (inode 7). Layout (little-endian):
//!
//! ```text
//! i_block (60 bytes) = 15 x le32 block pointers, 0 = hole
//! slot 0..=11  direct: logical blocks 0..=11
//! slot 12      IND:  a block of bs/4 le32 pointers, logical 12 .. 12 + P
//! slot 13      DIND: a block of pointers to IND blocks, next P^2 logical blocks
//! slot 14      TIND: a block of pointers to DIND blocks, next P^3 logical blocks
//!              (P = block_size / 4 pointers per block)
//! ```
//!
//! The resize inode reserves room to grow the group descriptor table. Verified against
//! `mkfs.ext4` 1.47 images (`debugfs -R "stat <7>"`): only slot 13 is set, to a DIND
//! block. The reserved GDT blocks of the primary table are `first_data_block + 1 +
//! gdt_blocks + i` for `i` in `0..s_reserved_gdt_blocks`; primary block `i` sits in DIND
//! slot `(gdt_blocks + i) % P`, and is itself an IND block listing, in order, its copies
//! in the backup groups (`primary + group * blocks_per_group` for each backup group,
//! ascending). So the copy in the k-th backup group of primary `i` is logical block
//! `12 + P + slot * P + k`. `i_size` is `(P^2 + P + 12) * block_size`, and `i_blocks`
//! counts the DIND block, every primary reserved block and every copy.
//!
//! Promise: lookups never follow a pointer outside the file system: such a pointer is
//! reported as a corrupt block map naming the block that holds it. Nothing here allocates
//! or writes; building the resize inode is the caller's job, with [`ResizeLayout`] saying
//! which bytes go where.

use super::le::{put_u32, u32_at};
use super::{FormatError, Location};

pub const DIRECT_SLOTS: usize = 12;
pub const IND_SLOT: usize = 12;
pub const DIND_SLOT: usize = 13;
pub const TIND_SLOT: usize = 14;
pub const SLOTS: usize = 15;

/// The 15 pointers of an `i_block` area.
pub fn decode_slots(i_block: &[u8]) -> [u32; SLOTS] {
    assert_eq!(i_block.len(), SLOTS * 4, "i_block is 60 bytes");
    std::array::from_fn(|slot| u32_at(i_block, slot * 4))
}

/// Writes 15 pointers into an `i_block` area.
pub fn encode_slots(slots: &[u32; SLOTS], i_block: &mut [u8]) {
    assert_eq!(i_block.len(), SLOTS * 4, "i_block is 60 bytes");
    for (slot, &pointer) in slots.iter().enumerate() {
        put_u32(i_block, slot * 4, pointer);
    }
}

/// How to reach a logical block: an `i_block` slot, then one index per level of
/// indirect block below it (none for a direct slot, up to three for TIND).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapPath {
    pub slot: usize,
    pub indexes: Vec<u32>,
}

/// The path to logical block `logical`, or `None` past what a TIND tree can map.
pub fn path(logical: u32, block_size: u32) -> Option<MapPath> {
    let per_block = u64::from(block_size / 4);
    let mut rest = u64::from(logical);
    if rest < DIRECT_SLOTS as u64 {
        return Some(MapPath {
            slot: rest as usize,
            indexes: Vec::new(),
        });
    }
    rest -= DIRECT_SLOTS as u64;
    for (levels, slot) in [(1u32, IND_SLOT), (2, DIND_SLOT), (3, TIND_SLOT)] {
        let span = per_block.pow(levels);
        if rest < span {
            let indexes = (0..levels)
                .rev()
                .map(|level| (rest / per_block.pow(level) % per_block) as u32)
                .collect();
            return Some(MapPath { slot, indexes });
        }
        rest -= span;
    }
    None
}

/// Maps logical block `logical` of inode `ino` to its physical block, `None` for a hole.
/// `read_block` fetches an indirect block; every pointer must be below `blocks_count`.
pub fn lookup<B, E>(
    i_block: &[u8],
    logical: u32,
    block_size: u32,
    blocks_count: u64,
    ino: u32,
    mut read_block: impl FnMut(u64) -> Result<B, E>,
) -> Result<Option<u64>, E>
where
    B: AsRef<[u8]>,
    E: From<FormatError>,
{
    let Some(path) = path(logical, block_size) else {
        return Ok(None);
    };
    let check = |pointer: u32, location: Location| -> Result<Option<u64>, E> {
        match u64::from(pointer) {
            0 => Ok(None),
            block if block < blocks_count => Ok(Some(block)),
            block => Err(E::from(FormatError::new(
                "indirect block map",
                location,
                format!("pointer to block {block} is past the end ({blocks_count} blocks)"),
            ))),
        }
    };
    let mut current = check(
        decode_slots(i_block)[path.slot],
        Location::InodeBlockArea { ino },
    )?;
    for &index in &path.indexes {
        let Some(holder) = current else {
            return Ok(None);
        };
        let bytes = read_block(holder)?;
        let pointer = u32_at(bytes.as_ref(), index as usize * 4);
        current = check(
            pointer,
            Location::Block {
                block: holder,
                ino: Some(ino),
            },
        )?;
    }
    Ok(current)
}

/// Where the resize inode keeps the reserved GDT blocks and their backup copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResizeLayout {
    pub block_size: u32,
    /// `(DIND slot, primary reserved GDT block)`, one per reserved block, in order.
    pub dind_slots: Vec<(u32, u32)>,
    /// For each primary reserved GDT block (same order), its copies in the backup groups.
    pub copies: Vec<Vec<u32>>,
}

impl ResizeLayout {
    /// The layout mkfs.ext4 gives a file system with these numbers; `backup_groups` are
    /// the groups with backup superblocks, ascending.
    pub fn new(
        block_size: u32,
        first_data_block: u32,
        gdt_blocks: u32,
        reserved_gdt_blocks: u32,
        blocks_per_group: u32,
        backup_groups: &[u32],
    ) -> ResizeLayout {
        let per_block = block_size / 4;
        assert!(
            reserved_gdt_blocks <= per_block,
            "{reserved_gdt_blocks} reserved GDT blocks do not fit one DIND block"
        );
        let mut dind_slots = Vec::new();
        let mut copies = Vec::new();
        for i in 0..reserved_gdt_blocks {
            let primary = u64::from(first_data_block) + 1 + u64::from(gdt_blocks + i);
            let slot = (gdt_blocks + i) % per_block;
            let list: Vec<u32> = backup_groups
                .iter()
                .map(|&g| primary + u64::from(g) * u64::from(blocks_per_group))
                .map(|block| u32::try_from(block).expect("the resize inode maps 32-bit blocks"))
                .collect();
            assert!(list.len() <= per_block as usize, "too many backup groups");
            dind_slots.push((slot, primary as u32));
            copies.push(list);
        }
        ResizeLayout {
            block_size,
            dind_slots,
            copies,
        }
    }

    /// The DIND block's contents.
    pub fn encode_dind(&self, block: &mut [u8]) {
        assert_eq!(block.len(), self.block_size as usize);
        block.fill(0);
        for &(slot, primary) in &self.dind_slots {
            put_u32(block, slot as usize * 4, primary);
        }
    }

    /// The contents of primary reserved GDT block number `index` (its list of copies).
    pub fn encode_copy_list(&self, index: usize, block: &mut [u8]) {
        assert_eq!(block.len(), self.block_size as usize);
        block.fill(0);
        for (k, &copy) in self.copies[index].iter().enumerate() {
            put_u32(block, k * 4, copy);
        }
    }

    /// The logical block at which the inode maps copy `k` of primary block `index`.
    pub fn copy_logical(&self, index: usize, k: usize) -> u32 {
        let per_block = self.block_size / 4;
        DIRECT_SLOTS as u32 + per_block + self.dind_slots[index].0 * per_block + k as u32
    }

    /// `i_size` of the resize inode.
    pub fn size_bytes(&self) -> u64 {
        let per_block = u64::from(self.block_size / 4);
        (per_block * per_block + per_block + DIRECT_SLOTS as u64) * u64::from(self.block_size)
    }

    /// Blocks the inode owns: the DIND block, the primaries and their copies.
    pub fn owned_blocks(&self) -> u64 {
        1 + self
            .copies
            .iter()
            .map(|list| 1 + list.len() as u64)
            .sum::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn paths_cover_each_level() {
        let bs = 1024;
        let p = |n| path(n, bs).unwrap();
        assert_eq!(
            p(11),
            MapPath {
                slot: 11,
                indexes: vec![]
            }
        );
        assert_eq!(
            p(12),
            MapPath {
                slot: IND_SLOT,
                indexes: vec![0]
            }
        );
        assert_eq!(
            p(12 + 255),
            MapPath {
                slot: IND_SLOT,
                indexes: vec![255]
            }
        );
        assert_eq!(
            p(12 + 256),
            MapPath {
                slot: DIND_SLOT,
                indexes: vec![0, 0]
            }
        );
        assert_eq!(
            p(12 + 256 + 256 * 3 + 7),
            MapPath {
                slot: DIND_SLOT,
                indexes: vec![3, 7]
            }
        );
        let tind_start = 12 + 256 + 256 * 256;
        assert_eq!(
            p(tind_start + 65536 + 257),
            MapPath {
                slot: TIND_SLOT,
                indexes: vec![1, 1, 1]
            }
        );
        assert!(path(tind_start + 256 * 256 * 256, bs).is_none());
    }

    /// A tiny in-memory disk for lookups.
    fn disk(blocks: &[(u64, Vec<(usize, u32)>)]) -> HashMap<u64, Vec<u8>> {
        blocks
            .iter()
            .map(|(n, pointers)| {
                let mut b = vec![0u8; 1024];
                for &(i, v) in pointers {
                    put_u32(&mut b, i * 4, v);
                }
                (*n, b)
            })
            .collect()
    }

    #[test]
    fn lookup_follows_pointers_and_reports_bad_ones() {
        let mut slots = [0u32; SLOTS];
        slots[3] = 500;
        slots[DIND_SLOT] = 600;
        let mut i_block = [0u8; 60];
        encode_slots(&slots, &mut i_block);
        assert_eq!(decode_slots(&i_block), slots);
        let blocks = disk(&[(600, vec![(2, 601)]), (601, vec![(5, 777), (6, 99_999)])]);
        let read = |n: u64| -> Result<Vec<u8>, FormatError> { Ok(blocks[&n].clone()) };
        let logical = 12 + 256 + 2 * 256;
        assert_eq!(lookup(&i_block, 3, 1024, 1000, 12, read), Ok(Some(500)));
        assert_eq!(lookup(&i_block, 4, 1024, 1000, 12, read), Ok(None));
        assert_eq!(
            lookup(&i_block, logical + 5, 1024, 1000, 12, read),
            Ok(Some(777))
        );
        assert_eq!(lookup(&i_block, 12, 1024, 1000, 12, read), Ok(None));
        let err = lookup(&i_block, logical + 6, 1024, 1000, 12, read).unwrap_err();
        assert_eq!(
            (err.structure, err.location),
            (
                "indirect block map",
                Location::Block {
                    block: 601,
                    ino: Some(12)
                }
            )
        );
    }

    #[test]
    fn resize_layout_matches_the_mkfs_example() {
        // 64 MiB, 1 KiB blocks: 8 groups, 1 GDT block, 256 reserved, backups in 1 3 5 7.
        let layout = ResizeLayout::new(1024, 1, 1, 256, 8192, &[1, 3, 5, 7]);
        assert_eq!(layout.dind_slots[0], (1, 3));
        assert_eq!(layout.dind_slots[255], (0, 258));
        assert_eq!(layout.copies[0], vec![8195, 24579, 40963, 57347]);
        assert_eq!(layout.copy_logical(0, 0), 524);
        assert_eq!(layout.copy_logical(255, 3), 271);
        assert_eq!(layout.owned_blocks(), 1281);
        assert_eq!(layout.size_bytes(), 67_383_296);
        let mut dind = vec![0u8; 1024];
        layout.encode_dind(&mut dind);
        let mut list = vec![0u8; 1024];
        layout.encode_copy_list(0, &mut list);
        let mut i_block = [0u8; 60];
        put_u32(&mut i_block, DIND_SLOT * 4, 4384);
        let read = |n: u64| -> Result<Vec<u8>, FormatError> {
            Ok(match n {
                4384 => dind.clone(),
                3 => list.clone(),
                _ => vec![0; 1024],
            })
        };
        assert_eq!(lookup(&i_block, 525, 1024, 65536, 7, read), Ok(Some(24579)));
    }
}
