//! Extent tree nodes. A node is a 12-byte header and 12-byte entries; the root lives in
//! the inode's 60-byte `i_block` (4 entries), other nodes fill a block and end with a
//! 4-byte checksum tail right after `eh_max` entries. Layout (little-endian):
//!
//! ```text
//! header:  0 2 eh_magic (0xF30A)   2 2 eh_entries   4 2 eh_max
//!          6 2 eh_depth (0 = leaf) 8 4 eh_generation
//! leaf:    0 4 ee_block (first logical block)
//!          4 2 ee_len (<= 32768 initialized; 32768 + n means n unwritten blocks)
//!          6 2 ee_start_hi         8 4 ee_start_lo (first physical block)
//! index:   0 4 ei_block (first logical block covered)
//!          4 4 ei_leaf_lo          8 2 ei_leaf_hi (child node block)  10 2 ei_unused
//! tail:    0 4 et_checksum = crc32c_raw(inode_seed, block[..12 + 12 * eh_max])
//! ```
//!
//! Promise: decode accepts only what the kernel's `ext4_ext_check` accepts for a node on
//! its own (magic, `eh_max` within the space, entries within `eh_max`, depth at most 5,
//! no empty index node, extents non-empty, in order, not overlapping and not past logical
//! block 2^32 - 1; index entries strictly increasing). Whether a child's depth and range
//! agree with its parent is the tree walker's check. Encode asserts the same rules.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::{FormatError, Location};

pub const EXTENT_MAGIC: u16 = 0xF30A;
pub const HEADER_SIZE: usize = 12;
pub const ENTRY_SIZE: usize = 12;
/// Longest initialized extent.
pub const MAX_INIT_LEN: u32 = 32768;
/// Longest unwritten extent.
pub const MAX_UNWRITTEN_LEN: u32 = 32767;
/// Deepest tree the kernel accepts.
pub const MAX_DEPTH: u16 = 5;
/// Entries in the 60-byte root.
pub const ROOT_MAX_ENTRIES: u16 = 4;

/// A leaf entry: `len` logical blocks from `logical` map to physical blocks from `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u32,
    pub len: u32,
    pub start: u64,
    /// Allocated but reads as zeros (fallocate).
    pub unwritten: bool,
}

impl Extent {
    pub fn end(&self) -> u64 {
        u64::from(self.logical) + u64::from(self.len)
    }
}

/// An index entry: the subtree at `child` covers logical blocks from `logical`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Index {
    pub logical: u32,
    pub child: u64,
}

/// The entries of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entries {
    Leaf(Vec<Extent>),
    Index(Vec<Index>),
}

/// A decoded node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub depth: u16,
    pub max_entries: u16,
    pub generation: u32,
    pub entries: Entries,
}

/// Entries that fit a node of `node_bytes` (the 60-byte root, or a block minus the tail).
pub fn capacity(node_bytes: usize, is_root: bool) -> u16 {
    let usable = if is_root { node_bytes } else { node_bytes - 4 };
    ((usable - HEADER_SIZE) / ENTRY_SIZE) as u16
}

impl Node {
    pub fn len(&self) -> usize {
        match &self.entries {
            Entries::Leaf(e) => e.len(),
            Entries::Index(e) => e.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first logical block this node covers (0 if empty).
    pub fn first_logical(&self) -> u32 {
        match &self.entries {
            Entries::Leaf(e) => e.first().map_or(0, |x| x.logical),
            Entries::Index(e) => e.first().map_or(0, |x| x.logical),
        }
    }

    /// Decodes a node from `bytes` (60 bytes for the root, a block otherwise).
    pub fn decode(bytes: &[u8], is_root: bool, location: Location) -> Result<Node, FormatError> {
        let err = |problem: String| FormatError::new("extent node", location, problem);
        let magic = u16_at(bytes, 0);
        if magic != EXTENT_MAGIC {
            return Err(err(format!(
                "bad magic {magic:#06x} (expected {EXTENT_MAGIC:#06x})"
            )));
        }
        let entries = u16_at(bytes, 2);
        let max = u16_at(bytes, 4);
        let depth = u16_at(bytes, 6);
        let limit = capacity(bytes.len(), is_root);
        if max == 0 || max > limit {
            return Err(err(format!("eh_max {max} does not fit ({limit} at most)")));
        }
        if entries > max {
            return Err(err(format!("eh_entries {entries} exceeds eh_max {max}")));
        }
        if depth > MAX_DEPTH {
            return Err(err(format!("eh_depth {depth} exceeds {MAX_DEPTH}")));
        }
        if depth > 0 && entries == 0 {
            return Err(err(format!("index node of depth {depth} has no entries")));
        }
        let at = |i: usize| HEADER_SIZE + i * ENTRY_SIZE;
        let entries = if depth == 0 {
            let mut list = Vec::with_capacity(usize::from(entries));
            for i in 0..usize::from(entries) {
                let b = &bytes[at(i)..at(i) + ENTRY_SIZE];
                let raw_len = u32::from(u16_at(b, 4));
                let (len, unwritten) = if raw_len > MAX_INIT_LEN {
                    (raw_len - MAX_INIT_LEN, true)
                } else {
                    (raw_len, false)
                };
                if len == 0 {
                    return Err(err(format!("extent {i} has length 0")));
                }
                let e = Extent {
                    logical: u32_at(b, 0),
                    len,
                    start: u64::from(u32_at(b, 8)) | u64::from(u16_at(b, 6)) << 32,
                    unwritten,
                };
                if e.end() > 1 << 32 {
                    return Err(err(format!(
                        "extent {i} (logical {}, length {len}) runs past logical block 2^32",
                        e.logical
                    )));
                }
                if let Some(prev) = list.last() {
                    let prev: &Extent = prev;
                    if u64::from(e.logical) < prev.end() {
                        return Err(err(format!(
                            "extent {i} (logical {}) overlaps or precedes extent {} (ends at {})",
                            e.logical,
                            i - 1,
                            prev.end()
                        )));
                    }
                }
                list.push(e);
            }
            Entries::Leaf(list)
        } else {
            let mut list: Vec<Index> = Vec::with_capacity(usize::from(entries));
            for i in 0..usize::from(entries) {
                let b = &bytes[at(i)..at(i) + ENTRY_SIZE];
                let x = Index {
                    logical: u32_at(b, 0),
                    child: u64::from(u32_at(b, 4)) | u64::from(u16_at(b, 8)) << 32,
                };
                if list.last().is_some_and(|p| x.logical <= p.logical) {
                    return Err(err(format!("index entry {i} is out of order")));
                }
                list.push(x);
            }
            Entries::Index(list)
        };
        Ok(Node {
            depth,
            max_entries: max,
            generation: u32_at(bytes, 8),
            entries,
        })
    }

    /// Encodes into `out` (60 bytes for the root, a block otherwise). Block nodes get
    /// their checksum tail when `inode_seed` is `Some`.
    pub fn encode(&self, out: &mut [u8], is_root: bool, inode_seed: Option<u32>) {
        assert!(
            self.len() <= usize::from(self.max_entries),
            "node over capacity"
        );
        assert!(
            self.max_entries <= capacity(out.len(), is_root),
            "eh_max too large for node"
        );
        out.fill(0);
        put_u16(out, 0, EXTENT_MAGIC);
        put_u16(out, 2, self.len() as u16);
        put_u16(out, 4, self.max_entries);
        put_u16(out, 6, self.depth);
        put_u32(out, 8, self.generation);
        let at = |i: usize| HEADER_SIZE + i * ENTRY_SIZE;
        match &self.entries {
            Entries::Leaf(list) => {
                assert_eq!(self.depth, 0, "leaf entries in an index node");
                for (i, e) in list.iter().enumerate() {
                    let max = if e.unwritten {
                        MAX_UNWRITTEN_LEN
                    } else {
                        MAX_INIT_LEN
                    };
                    assert!(e.len >= 1 && e.len <= max, "extent length {}", e.len);
                    assert!(e.end() <= 1 << 32, "extent past logical block 2^32");
                    assert!(
                        e.start >> 48 == 0,
                        "physical block {} beyond 48 bits",
                        e.start
                    );
                    let b = &mut out[at(i)..at(i) + ENTRY_SIZE];
                    put_u32(b, 0, e.logical);
                    put_u16(
                        b,
                        4,
                        (e.len + if e.unwritten { MAX_INIT_LEN } else { 0 }) as u16,
                    );
                    put_u16(b, 6, (e.start >> 32) as u16);
                    put_u32(b, 8, e.start as u32);
                }
            }
            Entries::Index(list) => {
                assert!(self.depth > 0, "index entries in a leaf");
                for (i, x) in list.iter().enumerate() {
                    let b = &mut out[at(i)..at(i) + ENTRY_SIZE];
                    put_u32(b, 0, x.logical);
                    put_u32(b, 4, x.child as u32);
                    put_u16(b, 8, (x.child >> 32) as u16);
                }
            }
        }
        if let (false, Some(seed)) = (is_root, inode_seed) {
            let tail = tail_offset(self.max_entries);
            let csum = crc32c_raw(seed, &out[..tail]);
            put_u32(out, tail, csum);
        }
    }
}

fn tail_offset(max_entries: u16) -> usize {
    HEADER_SIZE + usize::from(max_entries) * ENTRY_SIZE
}

/// Checks the tail checksum of an extent block (after [`Node::decode`] succeeded).
pub fn verify_block_checksum(
    block: &[u8],
    inode_seed: u32,
    location: Location,
) -> Result<(), FormatError> {
    let tail = tail_offset(u16_at(block, 4));
    let stored = u32_at(block, tail);
    let computed = crc32c_raw(inode_seed, &block[..tail]);
    if stored != computed {
        return Err(FormatError::new(
            "extent block",
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
    fn leaf_and_index_round_trip() {
        let leaf = Node {
            depth: 0,
            max_entries: 4,
            generation: 0,
            entries: Entries::Leaf(vec![
                Extent {
                    logical: 0,
                    len: 32768,
                    start: 0x1_0000_0000,
                    unwritten: false,
                },
                Extent {
                    logical: 40000,
                    len: 5,
                    start: 77,
                    unwritten: true,
                },
            ]),
        };
        let mut root = [0u8; 60];
        leaf.encode(&mut root, true, None);
        assert_eq!(
            Node::decode(&root, true, Location::InodeBlockArea { ino: 12 }).unwrap(),
            leaf
        );

        let index = Node {
            depth: 2,
            max_entries: capacity(1024, false),
            generation: 0,
            entries: Entries::Index(vec![
                Index {
                    logical: 0,
                    child: 9,
                },
                Index {
                    logical: 100,
                    child: 10,
                },
            ]),
        };
        assert_eq!(index.max_entries, 84);
        let mut block = vec![0u8; 1024];
        index.encode(&mut block, false, Some(0xabc));
        let loc = Location::Block {
            block: 500,
            ino: Some(12),
        };
        assert_eq!(Node::decode(&block, false, loc).unwrap(), index);
        verify_block_checksum(&block, 0xabc, loc).unwrap();
        block[20] ^= 1;
        assert!(verify_block_checksum(&block, 0xabc, loc).is_err());
    }

    #[test]
    fn decode_rejects_bad_headers_and_orders() {
        let loc = Location::InodeBlockArea { ino: 7 };
        let mut root = [0u8; 60];
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("bad magic"));
        put_u16(&mut root, 0, EXTENT_MAGIC);
        put_u16(&mut root, 2, 5);
        put_u16(&mut root, 4, 4);
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("exceeds eh_max"));
        let overlapping = Node {
            depth: 0,
            max_entries: 4,
            generation: 0,
            entries: Entries::Leaf(vec![
                Extent {
                    logical: 10,
                    len: 5,
                    start: 1,
                    unwritten: false,
                },
                Extent {
                    logical: 12,
                    len: 1,
                    start: 9,
                    unwritten: false,
                },
            ]),
        };
        overlapping.encode(&mut root, true, None);
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("overlaps"));
        put_u32(&mut root, HEADER_SIZE + ENTRY_SIZE, u32::MAX);
        put_u16(&mut root, HEADER_SIZE + ENTRY_SIZE + 4, 2);
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("past logical block"));
        let empty_index = Node {
            depth: 1,
            max_entries: 4,
            generation: 0,
            entries: Entries::Index(vec![]),
        };
        empty_index.encode(&mut root, true, None);
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("no entries"));
        put_u16(&mut root, 6, 6);
        assert!(Node::decode(&root, true, loc)
            .unwrap_err()
            .problem
            .contains("eh_depth 6"));
    }
}
