//! Hashed directory (htree, `dir_index`) index blocks. Block 0 of an indexed directory is
//! the *root*; interior *nodes* exist when the tree has two levels. Both look like
//! directory blocks to old code (their fake entries cover the whole block). Layout:
//!
//! ```text
//! root:  0x00 "." entry   (inode, rec_len 12, name_len 1, type 2, ".\0\0\0")
//!        0x0C ".." entry  (inode, rec_len block_size - 12, name_len 2, type 2, "..\0\0")
//!        0x18 dx_root_info: 4 reserved_zero, 1 hash_version, 1 info_length (8),
//!                           1 indirect_levels, 1 unused_flags
//!        0x20 limit (2), count (2), block (4)      <- entry 0: no hash, only a block
//!        0x28 entries: hash (4), block (4) ...     (sorted by hash)
//! node:  0x00 fake entry (inode 0, rec_len block_size, name_len 0, type 0)
//!        0x08 limit (2), count (2), block (4), then entries as in the root
//! tail (metadata_csum), right after `limit` entries:
//!        dt_reserved (4), dt_checksum (4) =
//!        crc32c_raw(inode_seed, block[..count_offset + 8 * count] ‖ dt_reserved ‖ 0u32)
//! ```
//!
//! `indirect_levels` is at most 1 (root, nodes, leaves: depth 2), or 2 with `large_dir`
//! (root, two levels of nodes, leaves: depth 3).
//!
//! Entry `i` says: names whose hash is at least `hash[i]` (and below `hash[i+1]`) live in
//! the subtree at logical directory block `block[i]`. Bit 0 of a hash marks that a
//! collision run continues from the previous leaf.
//!
//! `hash_version` on disk is 0 (legacy), 1 (half-MD4) or 2 (TEA); the unsigned variants
//! (3..5) exist only in memory, chosen by the superblock's `s_flags`, never on disk.
//! `limit` is `(block_size - count_offset - tail) / 8` with an 8-byte tail under
//! metadata_csum: a 1 KiB root holds 124 entries (123 with the tail), a 1 KiB node 127
//! (126), a 4 KiB root 508 (507). The kernel refuses any other `limit`.
//!
//! Promise: decode checks the fake entries, `dx_root_info`, `limit`, `count` and the
//! order of the hashes, and names the block; checksum verification is separate (the
//! caller knows the inode seed). The in-place readers ([`root_in_place`],
//! [`node_in_place`]) check all but the order, which their caller checks once per block
//! read ([`DxEntries::check_order`]). Encode asserts sorted, non-empty entries within
//! `limit`.

use super::csum::crc32c_raw;
use super::hash::HASH_TEA;
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::{FormatError, Location};

pub const ROOT_COUNT_OFFSET: usize = 0x20;
pub const NODE_COUNT_OFFSET: usize = 0x08;
const ENTRY: usize = 8;
const TAIL: usize = 8;
/// Levels of index below the root that ext4 allows without `large_dir`.
pub const MAX_INDIRECT_LEVELS: u8 = 1;
/// Levels of index below the root that ext4 allows with `large_dir` (a tree of depth 3).
pub const MAX_INDIRECT_LEVELS_LARGE_DIR: u8 = 2;

/// One index entry. Entry 0's hash is implicit (0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DxEntry {
    pub hash: u32,
    pub block: u32,
}

/// Root fields besides its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DxRootInfo {
    pub dot_inode: u32,
    pub dotdot_inode: u32,
    pub hash_version: u8,
    pub indirect_levels: u8,
}

/// Entries an index block can hold starting at `count_offset`.
pub fn limit(block_size: usize, count_offset: usize, with_tail: bool) -> usize {
    (block_size - count_offset - if with_tail { TAIL } else { 0 }) / ENTRY
}

/// An index block's entries read in place, without copying them: lookups binary-search
/// the block's bytes (decoding a root and a node into vectors on every lookup was 7% of a
/// create in a directory of 10^6 names). Made only by [`root_in_place`] and
/// [`node_in_place`], which checked `limit` and `count`.
#[derive(Clone, Copy, Debug)]
pub struct DxEntries<'a> {
    block: &'a [u8],
    count_offset: usize,
    count: usize,
}

impl<'a> DxEntries<'a> {
    /// The entries of a block that already passed [`root_in_place`] or [`node_in_place`]
    /// (at `count_offset`): a caller keeping such a block's bytes reads them again without
    /// checking `limit` and `count` again.
    pub(crate) fn of_checked(block: &'a [u8], count_offset: usize) -> DxEntries<'a> {
        let count = usize::from(u16_at(block, count_offset + 2));
        debug_assert!(count >= 1 && count_offset + count * ENTRY <= block.len());
        DxEntries {
            block,
            count_offset,
            count,
        }
    }

    /// Entries in use (at least 1).
    pub fn len(&self) -> usize {
        self.count
    }

    /// Never true: a checked index block holds at least one entry.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Entry `i` (< [`Self::len`]); entry 0's hash is 0.
    pub fn get(&self, i: usize) -> DxEntry {
        assert!(i < self.count, "index entry {i} of {}", self.count);
        let at = self.count_offset + i * ENTRY;
        DxEntry {
            hash: if i == 0 { 0 } else { u32_at(self.block, at) },
            block: u32_at(self.block, at + 4),
        }
    }

    /// The slot whose subtree holds `hash`: the last entry whose hash is at most `hash`
    /// (entry 0 covers everything below entry 1's hash). Binary search, so it expects the
    /// order [`Self::check_order`] checks.
    pub fn slot_for(&self, hash: u32) -> usize {
        let (mut low, mut high) = (1, self.count);
        while low < high {
            let mid = low + (high - low) / 2;
            if u32_at(self.block, self.count_offset + mid * ENTRY) <= hash {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low - 1
    }

    /// Fails unless the hashes of entries 1.. never decrease.
    pub fn check_order(&self, location: Location) -> Result<(), FormatError> {
        for i in 2..self.count {
            let (before, hash) = (self.get(i - 1).hash, self.get(i).hash);
            if hash < before {
                return Err(FormatError::new(
                    "htree index",
                    location,
                    format!("entry {i} hash {hash:#x} is out of order"),
                ));
            }
        }
        Ok(())
    }

    pub fn to_vec(&self) -> Vec<DxEntry> {
        (0..self.count).map(|i| self.get(i)).collect()
    }
}

/// The entries of an index block after checking its `limit` and `count` (not their order).
fn entries_in_place(
    block: &[u8],
    count_offset: usize,
    location: Location,
    with_tail: bool,
) -> Result<DxEntries<'_>, FormatError> {
    let err = |p: String| FormatError::new("htree index", location, p);
    let lim = usize::from(u16_at(block, count_offset));
    let count = usize::from(u16_at(block, count_offset + 2));
    let expected = limit(block.len(), count_offset, with_tail);
    if lim != expected {
        return Err(err(format!("limit {lim} (expected {expected})")));
    }
    if count == 0 || count > lim {
        return Err(err(format!("count {count} is not within 1..={lim}")));
    }
    Ok(DxEntries {
        block,
        count_offset,
        count,
    })
}

fn write_entries(block: &mut [u8], count_offset: usize, entries: &[DxEntry], with_tail: bool) {
    let lim = limit(block.len(), count_offset, with_tail);
    assert!(
        !entries.is_empty() && entries.len() <= lim,
        "{} entries, limit {lim}",
        entries.len()
    );
    assert!(
        entries.windows(2).skip(1).all(|w| w[0].hash <= w[1].hash),
        "index entries unsorted"
    );
    put_u16(block, count_offset, lim as u16);
    put_u16(block, count_offset + 2, entries.len() as u16);
    for (i, e) in entries.iter().enumerate() {
        let at = count_offset + i * ENTRY;
        if i > 0 {
            put_u32(block, at, e.hash);
        }
        put_u32(block, at + 4, e.block);
    }
    let used_end = count_offset + entries.len() * ENTRY;
    let tail_at = count_offset + lim * ENTRY;
    block[used_end..tail_at].fill(0);
    if with_tail {
        block[tail_at..tail_at + TAIL].fill(0);
    }
}

/// Decodes a root block of a file system without `large_dir`.
pub fn decode_root(
    block: &[u8],
    with_tail: bool,
    location: Location,
) -> Result<(DxRootInfo, Vec<DxEntry>), FormatError> {
    decode_root_with_levels(block, with_tail, MAX_INDIRECT_LEVELS, location)
}

/// Decodes a root block whose tree may have up to `max_indirect_levels` levels of nodes
/// below it ([`MAX_INDIRECT_LEVELS_LARGE_DIR`] with `large_dir`).
pub fn decode_root_with_levels(
    block: &[u8],
    with_tail: bool,
    max_indirect_levels: u8,
    location: Location,
) -> Result<(DxRootInfo, Vec<DxEntry>), FormatError> {
    let (info, entries) = root_in_place(block, with_tail, max_indirect_levels, location)?;
    entries.check_order(location)?;
    Ok((info, entries.to_vec()))
}

/// A root block's fields and its entries in place: every check of
/// [`decode_root_with_levels`] but the order of the hashes, which costs a pass over the
/// entries (the caller checks it once, see [`DxEntries::check_order`]).
pub fn root_in_place(
    block: &[u8],
    with_tail: bool,
    max_indirect_levels: u8,
    location: Location,
) -> Result<(DxRootInfo, DxEntries<'_>), FormatError> {
    let err = |p: String| FormatError::new("htree root", location, p);
    let bs = block.len();
    if block[0x06] != 1 || &block[0x08..0x09] != b"." || u16_at(block, 0x04) != 12 {
        return Err(err("first entry is not \".\" with rec_len 12".into()));
    }
    if block[0x12] != 2
        || &block[0x14..0x16] != b".."
        || usize::from(u16_at(block, 0x10)) != bs - 12
    {
        return Err(err(format!(
            "second entry is not \"..\" with rec_len {}",
            bs - 12
        )));
    }
    if u32_at(block, 0x18) != 0 || block[0x1D] != 8 {
        return Err(err(format!(
            "dx_root_info reserved {:#x} / info_length {} (expected 0 / 8)",
            u32_at(block, 0x18),
            block[0x1D]
        )));
    }
    if block[0x1C] > HASH_TEA {
        return Err(err(format!(
            "hash_version {} (on disk only 0 legacy, 1 half_md4, 2 tea)",
            block[0x1C]
        )));
    }
    let info = DxRootInfo {
        dot_inode: u32_at(block, 0),
        dotdot_inode: u32_at(block, 0x0C),
        hash_version: block[0x1C],
        indirect_levels: block[0x1E],
    };
    if info.indirect_levels > max_indirect_levels {
        return Err(err(format!(
            "{} indirect levels (at most {max_indirect_levels}{})",
            info.indirect_levels,
            if max_indirect_levels < MAX_INDIRECT_LEVELS_LARGE_DIR {
                " without large_dir"
            } else {
                ""
            }
        )));
    }
    Ok((
        info,
        entries_in_place(block, ROOT_COUNT_OFFSET, location, with_tail)?,
    ))
}

/// Encodes a root block.
pub fn encode_root(block: &mut [u8], info: &DxRootInfo, entries: &[DxEntry], with_tail: bool) {
    assert!(
        info.hash_version <= HASH_TEA,
        "hash_version {} is not an on-disk value",
        info.hash_version
    );
    let bs = block.len();
    block[..ROOT_COUNT_OFFSET].fill(0);
    put_u32(block, 0, info.dot_inode);
    put_u16(block, 4, 12);
    block[6] = 1;
    block[7] = 2;
    block[8] = b'.';
    put_u32(block, 0x0C, info.dotdot_inode);
    put_u16(block, 0x10, super::dirent::rec_len_to_disk(bs - 12, bs));
    block[0x12] = 2;
    block[0x13] = 2;
    block[0x14..0x16].copy_from_slice(b"..");
    block[0x1C] = info.hash_version;
    block[0x1D] = 8;
    block[0x1E] = info.indirect_levels;
    write_entries(block, ROOT_COUNT_OFFSET, entries, with_tail);
}

/// Decodes an interior node.
pub fn decode_node(
    block: &[u8],
    with_tail: bool,
    location: Location,
) -> Result<Vec<DxEntry>, FormatError> {
    let entries = node_in_place(block, with_tail, location)?;
    entries.check_order(location)?;
    Ok(entries.to_vec())
}

/// An interior node's entries in place: every check of [`decode_node`] but the order of
/// the hashes (see [`root_in_place`]).
pub fn node_in_place(
    block: &[u8],
    with_tail: bool,
    location: Location,
) -> Result<DxEntries<'_>, FormatError> {
    let bs = block.len();
    if u32_at(block, 0) != 0 || super::dirent::rec_len_from_disk(u16_at(block, 4), bs) != bs {
        return Err(FormatError::new(
            "htree node",
            location,
            "fake entry does not span the block",
        ));
    }
    entries_in_place(block, NODE_COUNT_OFFSET, location, with_tail)
}

/// Encodes an interior node.
pub fn encode_node(block: &mut [u8], entries: &[DxEntry], with_tail: bool) {
    let bs = block.len();
    block[..NODE_COUNT_OFFSET].fill(0);
    put_u16(block, 4, super::dirent::rec_len_to_disk(bs, bs));
    write_entries(block, NODE_COUNT_OFFSET, entries, with_tail);
}

fn checksum_parts(block: &[u8], count_offset: usize) -> (usize, usize) {
    let lim = usize::from(u16_at(block, count_offset));
    let count = usize::from(u16_at(block, count_offset + 2));
    (count_offset + count * ENTRY, count_offset + lim * ENTRY)
}

/// The dx_tail checksum of an index block (root or node).
pub fn compute_checksum(block: &[u8], count_offset: usize, inode_seed: u32) -> u32 {
    let (used_end, tail_at) = checksum_parts(block, count_offset);
    let c = crc32c_raw(inode_seed, &block[..used_end]);
    let c = crc32c_raw(c, &block[tail_at..tail_at + 4]);
    crc32c_raw(c, &[0; 4])
}

pub fn set_checksum(block: &mut [u8], count_offset: usize, inode_seed: u32) {
    let csum = compute_checksum(block, count_offset, inode_seed);
    let (_, tail_at) = checksum_parts(block, count_offset);
    put_u32(block, tail_at + 4, csum);
}

pub fn verify_checksum(
    block: &[u8],
    count_offset: usize,
    inode_seed: u32,
    location: Location,
) -> Result<(), FormatError> {
    let (_, tail_at) = checksum_parts(block, count_offset);
    if tail_at + TAIL > block.len() {
        return Err(FormatError::new(
            "htree index",
            location,
            "limit leaves no room for the tail",
        ));
    }
    let stored = u32_at(block, tail_at + 4);
    let computed = compute_checksum(block, count_offset, inode_seed);
    if stored != computed {
        return Err(FormatError::new(
            "htree index",
            location,
            format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_node_round_trip_with_checksums() {
        let info = DxRootInfo {
            dot_inode: 12,
            dotdot_inode: 2,
            hash_version: 1,
            indirect_levels: 1,
        };
        let entries = vec![
            DxEntry { hash: 0, block: 1 },
            DxEntry {
                hash: 0x4000_0000,
                block: 3,
            },
            DxEntry {
                hash: 0x8000_0001,
                block: 2,
            },
        ];
        let mut block = vec![0u8; 4096];
        encode_root(&mut block, &info, &entries, true);
        set_checksum(&mut block, ROOT_COUNT_OFFSET, 7);
        let loc = Location::Block {
            block: 900,
            ino: Some(12),
        };
        assert_eq!(
            decode_root(&block, true, loc).unwrap(),
            (info, entries.clone())
        );
        verify_checksum(&block, ROOT_COUNT_OFFSET, 7, loc).unwrap();
        assert_eq!(limit(4096, ROOT_COUNT_OFFSET, true), 507);
        assert_eq!(limit(1024, ROOT_COUNT_OFFSET, false), 124);
        assert_eq!(limit(1024, NODE_COUNT_OFFSET, true), 126);
        let mut bad = block.clone();
        bad[0x1C] = 4;
        assert!(decode_root(&bad, true, loc)
            .unwrap_err()
            .problem
            .contains("hash_version 4"));

        assert!(
            node_in_place(&block, true, loc).is_err(),
            "a root is not a node"
        );

        let mut node = vec![0u8; 1024];
        encode_node(&mut node, &entries, false);
        let in_place = node_in_place(&node, false, loc).unwrap();
        assert_eq!(in_place.to_vec(), entries);
        let slots: Vec<usize> = [
            0,
            0x3fff_ffff,
            0x4000_0000,
            0x8000_0000,
            0x8000_0001,
            u32::MAX,
        ]
        .iter()
        .map(|&h| in_place.slot_for(h))
        .collect();
        assert_eq!(slots, [0, 0, 1, 1, 2, 2]);
        let mut unsorted = node.clone();
        put_u32(&mut unsorted, NODE_COUNT_OFFSET + 2 * ENTRY, 1);
        assert!(decode_node(&unsorted, false, loc)
            .unwrap_err()
            .problem
            .contains("out of order"));
        assert_eq!(decode_node(&node, false, loc).unwrap(), entries);
        assert!(decode_node(&node, true, loc)
            .unwrap_err()
            .problem
            .contains("limit"));
    }
}
