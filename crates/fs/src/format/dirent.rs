//! Linear directory blocks: a chain of `ext4_dir_entry_2` records that exactly fills the
//! block (minus a 12-byte checksum tail with metadata_csum). Layout (little-endian):
//!
//! ```text
//! entry:  0 4 inode (0 = unused)   4 2 rec_len (bytes to the next entry)
//!         6 1 name_len             7 1 file_type (1 reg .. 7 symlink)
//!         8 name_len name bytes, padded so rec_len is a multiple of 4
//! tail:   0 4 zero  4 2 rec_len = 12  6 1 zero  7 1 0xDE
//!         8 4 checksum = crc32c_raw(inode_seed, block[..block_size - 12])
//! ```
//!
//! `rec_len` 65535 (or 0) means 65536 in 64 KiB blocks, and a `rec_len` of 65536 or more
//! keeps bits 16..17 in its low two bits (which are otherwise always zero). A record's
//! slack past `8 + name_len` (rounded up to 4) is free space that an insertion may split
//! off. The first record of a directory's first block is ".", the second "..".
//!
//! Promise: [`parse_block`] accepts a block only if its records chain exactly to the end
//! of the entry area (the tail, if any), each `rec_len` is a multiple of 4, at least 8 and
//! at least what its name needs, and used records have a name; it reports the byte offset
//! of the first bad record. The editing helpers keep those rules and expect a block that
//! already parses (they are given blocks the caller has verified).

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::{FormatError, Location};

pub const ENTRY_HEADER: usize = 8;
pub const TAIL_SIZE: usize = 12;
pub const TAIL_FILE_TYPE: u8 = 0xDE;
pub const MAX_NAME_LEN: usize = 255;

/// `file_type` codes (with the filetype feature; 0 otherwise).
pub const FT_UNKNOWN: u8 = 0;
pub const FT_REG_FILE: u8 = 1;
pub const FT_DIR: u8 = 2;
pub const FT_CHRDEV: u8 = 3;
pub const FT_BLKDEV: u8 = 4;
pub const FT_FIFO: u8 = 5;
pub const FT_SOCK: u8 = 6;
pub const FT_SYMLINK: u8 = 7;

/// Bytes an entry with a name of `name_len` needs.
pub fn entry_size(name_len: usize) -> usize {
    (ENTRY_HEADER + name_len + 3) & !3
}

pub fn rec_len_from_disk(raw: u16, block_size: usize) -> usize {
    if block_size < 65536 {
        usize::from(raw)
    } else if raw == 65535 || raw == 0 {
        block_size
    } else {
        usize::from(raw & 65532) | (usize::from(raw & 3) << 16)
    }
}

pub fn rec_len_to_disk(len: usize, block_size: usize) -> u16 {
    if block_size < 65536 {
        len as u16
    } else if len == block_size {
        65535
    } else {
        ((len & 65532) | ((len >> 16) & 3)) as u16
    }
}

/// One record of a directory block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawEntry {
    /// Byte offset of the record in the block.
    pub offset: usize,
    pub inode: u32,
    pub rec_len: usize,
    pub file_type: u8,
    pub name: Vec<u8>,
}

impl RawEntry {
    /// Space this record's name really needs (0 if unused: it is all slack).
    pub fn used_size(&self) -> usize {
        used_size(self.inode, self.name.len())
    }
}

/// The size of the region entries may occupy: the block minus the tail, if any.
pub fn entries_end(block_size: usize, has_tail: bool) -> usize {
    block_size - if has_tail { TAIL_SIZE } else { 0 }
}

/// One record of a directory block, borrowed from it: what lookups and insertions read
/// without copying every name of the block (a directory of 10^6 names made three parses of
/// a leaf per create, each a few hundred small allocations).
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    pub offset: usize,
    pub inode: u32,
    pub rec_len: usize,
    pub file_type: u8,
    pub name: &'a [u8],
}

impl EntryRef<'_> {
    /// See [`RawEntry::used_size`].
    pub fn used_size(&self) -> usize {
        used_size(self.inode, self.name.len())
    }

    pub fn to_owned(&self) -> RawEntry {
        RawEntry {
            offset: self.offset,
            inode: self.inode,
            rec_len: self.rec_len,
            file_type: self.file_type,
            name: self.name.to_vec(),
        }
    }
}

fn used_size(inode: u32, name_len: usize) -> usize {
    if inode == 0 {
        0
    } else {
        entry_size(name_len)
    }
}

/// Parses and validates every record of a directory block.
pub fn parse_block(
    block: &[u8],
    has_tail: bool,
    location: Location,
) -> Result<Vec<RawEntry>, FormatError> {
    let mut entries = Vec::new();
    for_each_entry(block, has_tail, location, |e| entries.push(e.to_owned()))?;
    Ok(entries)
}

/// Validates every record of a directory block (and its tail) as [`parse_block`] does and
/// shows each, in order, to `visit`; the first bad record is the error, after `visit` saw
/// the good ones before it.
pub fn for_each_entry<'a>(
    block: &'a [u8],
    has_tail: bool,
    location: Location,
    mut visit: impl FnMut(EntryRef<'a>),
) -> Result<(), FormatError> {
    let bs = block.len();
    let end = entries_end(bs, has_tail);
    let err = |offset: usize, problem: String| {
        FormatError::new(
            "directory entry",
            location,
            format!("at byte {offset}: {problem}"),
        )
    };
    let mut offset = 0;
    while offset < end {
        if offset + ENTRY_HEADER > end {
            return Err(err(
                offset,
                "record header crosses the end of the entries".into(),
            ));
        }
        let inode = u32_at(block, offset);
        let rec_len = rec_len_from_disk(u16_at(block, offset + 4), bs);
        let name_len = usize::from(block[offset + 6]);
        if rec_len < ENTRY_HEADER || !rec_len.is_multiple_of(4) {
            return Err(err(
                offset,
                format!("rec_len {rec_len} is not a multiple of 4 of at least 8"),
            ));
        }
        if offset + rec_len > end {
            return Err(err(
                offset,
                format!("rec_len {rec_len} runs past the end of the entries ({end})"),
            ));
        }
        if inode != 0 && (name_len == 0 || entry_size(name_len) > rec_len) {
            return Err(err(
                offset,
                format!("name_len {name_len} does not fit rec_len {rec_len}"),
            ));
        }
        let name_end = (offset + ENTRY_HEADER + name_len).min(offset + rec_len);
        visit(EntryRef {
            offset,
            inode,
            rec_len,
            file_type: block[offset + 7],
            name: &block[offset + ENTRY_HEADER..name_end],
        });
        offset += rec_len;
    }
    if has_tail {
        check_tail(block, location)?;
    }
    Ok(())
}

fn check_tail(block: &[u8], location: Location) -> Result<(), FormatError> {
    let t = block.len() - TAIL_SIZE;
    let ok = u32_at(block, t) == 0
        && u16_at(block, t + 4) == TAIL_SIZE as u16
        && block[t + 6] == 0
        && block[t + 7] == TAIL_FILE_TYPE;
    if !ok {
        return Err(FormatError::new(
            "directory block tail",
            location,
            "missing or malformed checksum tail",
        ));
    }
    Ok(())
}

/// True if `block` ends with a well-formed checksum tail.
pub fn has_tail(block: &[u8]) -> bool {
    check_tail(
        block,
        Location::Block {
            block: 0,
            ino: None,
        },
    )
    .is_ok()
}

/// Writes one record at `offset`.
pub fn write_entry(
    block: &mut [u8],
    offset: usize,
    inode: u32,
    rec_len: usize,
    file_type: u8,
    name: &[u8],
) {
    let bs = block.len();
    assert!(name.len() <= MAX_NAME_LEN, "name of {} bytes", name.len());
    assert!(
        rec_len >= entry_size(name.len()) && rec_len.is_multiple_of(4),
        "rec_len {rec_len}"
    );
    assert!(offset + rec_len <= bs, "record past the block end");
    put_u32(block, offset, inode);
    put_u16(block, offset + 4, rec_len_to_disk(rec_len, bs));
    block[offset + 6] = name.len() as u8;
    block[offset + 7] = file_type;
    block[offset + ENTRY_HEADER..offset + ENTRY_HEADER + name.len()].copy_from_slice(name);
    // Zero the padding so the bytes on disk do not depend on what was there before.
    let pad_end = offset + entry_size(name.len());
    block[offset + ENTRY_HEADER + name.len()..pad_end].fill(0);
}

/// Writes the checksum tail's fixed fields (the checksum itself comes from [`set_checksum`]).
pub fn write_tail(block: &mut [u8]) {
    let t = block.len() - TAIL_SIZE;
    block[t..].fill(0);
    put_u16(block, t + 4, TAIL_SIZE as u16);
    block[t + 7] = TAIL_FILE_TYPE;
}

/// An empty directory block: one unused record spanning the entries, plus the tail.
pub fn init_empty_block(block: &mut [u8], with_tail: bool) {
    block.fill(0);
    let end = entries_end(block.len(), with_tail);
    write_entry(block, 0, 0, end, 0, &[]);
    if with_tail {
        write_tail(block);
    }
}

/// A directory's first block: "." (`self_ino`), then ".." (`parent_ino`) holding the
/// rest of the entry area. `file_type` is [`FT_DIR`] with the filetype feature, else 0.
pub fn init_dot_block(
    block: &mut [u8],
    self_ino: u32,
    parent_ino: u32,
    file_type: u8,
    with_tail: bool,
) {
    block.fill(0);
    let end = entries_end(block.len(), with_tail);
    let dot_len = entry_size(1);
    write_entry(block, 0, self_ino, dot_len, file_type, b".");
    write_entry(block, dot_len, parent_ino, end - dot_len, file_type, b"..");
    if with_tail {
        write_tail(block);
    }
}

/// A block holding exactly `entries` (their inode, type and name; offsets and `rec_len`s
/// are chosen here), packed from the start in order, the last record taking the slack:
/// one pass, where inserting them one by one walks the block once per name. Panics if
/// they do not fit (the caller split a block that held them).
pub fn pack_block<'a>(
    block: &mut [u8],
    has_tail: bool,
    entries: impl ExactSizeIterator<Item = EntryRef<'a>>,
) {
    init_empty_block(block, has_tail);
    let end = entries_end(block.len(), has_tail);
    let count = entries.len();
    let mut offset = 0;
    for (i, e) in entries.enumerate() {
        let rec_len = if i + 1 == count {
            end - offset
        } else {
            entry_size(e.name.len())
        };
        write_entry(block, offset, e.inode, rec_len, e.file_type, e.name);
        offset += rec_len;
    }
}

/// The checksum a block with a tail should carry.
pub fn compute_checksum(block: &[u8], inode_seed: u32) -> u32 {
    crc32c_raw(inode_seed, &block[..block.len() - TAIL_SIZE])
}

pub fn set_checksum(block: &mut [u8], inode_seed: u32) {
    let csum = compute_checksum(block, inode_seed);
    let at = block.len() - 4;
    put_u32(block, at, csum);
}

pub fn verify_checksum(
    block: &[u8],
    inode_seed: u32,
    location: Location,
) -> Result<(), FormatError> {
    let stored = u32_at(block, block.len() - 4);
    let computed = compute_checksum(block, inode_seed);
    if stored != computed {
        return Err(FormatError::new(
            "directory block",
            location,
            format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    Ok(())
}

/// Inserts a record into free space if some record has enough slack; returns its offset.
pub fn insert(
    block: &mut [u8],
    has_tail: bool,
    inode: u32,
    file_type: u8,
    name: &[u8],
) -> Option<usize> {
    let needed = entry_size(name.len());
    let location = Location::Block {
        block: 0,
        ino: None,
    };
    let mut fit = None;
    for_each_entry(block, has_tail, location, |e| {
        if fit.is_none() && e.rec_len - e.used_size() >= needed {
            fit = Some(e.offset);
        }
    })
    .expect("insert into a block that does not parse");
    Some(insert_at(block, fit?, inode, file_type, name))
}

/// Inserts a record into the slack of the record at `offset`, which the caller found
/// with room for it (a walk of the block, as [`insert`] does); returns its offset.
pub fn insert_at(block: &mut [u8], offset: usize, inode: u32, file_type: u8, name: &[u8]) -> usize {
    let bs = block.len();
    let old_inode = u32_at(block, offset);
    let rec_len = rec_len_from_disk(u16_at(block, offset + 4), bs);
    let used = used_size(old_inode, usize::from(block[offset + 6]));
    assert!(
        rec_len - used >= entry_size(name.len()),
        "no room at byte {offset} for a name of {} bytes",
        name.len()
    );
    if used == 0 {
        write_entry(block, offset, inode, rec_len, file_type, name);
        return offset;
    }
    // The old record keeps its name and gives up its slack.
    put_u16(block, offset + 4, rec_len_to_disk(used, bs));
    let new_offset = offset + used;
    write_entry(block, new_offset, inode, rec_len - used, file_type, name);
    new_offset
}

/// The slack of the record at `offset` (what [`insert_at`] can use there), or `None` if
/// no well-formed record starts there.
pub fn room_at(block: &[u8], offset: usize) -> Option<usize> {
    let bs = block.len();
    if offset + ENTRY_HEADER > bs {
        return None;
    }
    let rec_len = rec_len_from_disk(u16_at(block, offset + 4), bs);
    let used = used_size(u32_at(block, offset), usize::from(block[offset + 6]));
    (offset + rec_len <= bs)
        .then(|| rec_len.checked_sub(used))
        .flatten()
}

/// Removes the record at `offset`: merged into the previous record, or marked unused if
/// it is the first of the block.
pub fn remove(block: &mut [u8], has_tail: bool, offset: usize) {
    let entries = parse_block(
        block,
        has_tail,
        Location::Block {
            block: 0,
            ino: None,
        },
    )
    .expect("remove from a block that does not parse");
    let i = entries
        .iter()
        .position(|e| e.offset == offset)
        .expect("remove names a record of the block");
    if i == 0 {
        put_u32(block, offset, 0);
    } else {
        let prev = &entries[i - 1];
        let bs = block.len();
        put_u16(
            block,
            prev.offset + 4,
            rec_len_to_disk(prev.rec_len + entries[i].rec_len, bs),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn rec_len_encodes_64k_blocks() {
        assert_eq!(
            rec_len_from_disk(rec_len_to_disk(65536, 65536), 65536),
            65536
        );
        assert_eq!(
            rec_len_from_disk(rec_len_to_disk(65532, 65536), 65536),
            65532
        );
        assert_eq!(rec_len_to_disk(1012, 1024), 1012);
    }

    #[test]
    fn dot_block_has_dot_and_dotdot() {
        let loc = Location::Block {
            block: 9,
            ino: Some(12),
        };
        for (bs, tail) in [(1024, true), (65536, false), (65536, true)] {
            let mut block = vec![0xFFu8; bs];
            init_dot_block(&mut block, 12, 2, FT_DIR, tail);
            let entries = parse_block(&block, tail, loc).unwrap();
            let names: Vec<(&[u8], u32, usize)> = entries
                .iter()
                .map(|e| (e.name.as_slice(), e.inode, e.rec_len))
                .collect();
            let rest = entries_end(bs, tail) - 12;
            assert_eq!(names, vec![(&b"."[..], 12, 12), (&b".."[..], 2, rest)]);
        }
    }

    #[test]
    fn an_empty_64k_block_stores_rec_len_65535() {
        let mut block = vec![0u8; 65536];
        init_empty_block(&mut block, false);
        assert_eq!(u16_at(&block, 4), 65535);
        let e = &parse_block(
            &block,
            false,
            Location::Block {
                block: 1,
                ino: None,
            },
        )
        .unwrap()[0];
        assert_eq!((e.inode, e.rec_len), (0, 65536));
    }

    #[test]
    fn tail_checksum_round_trips() {
        let mut block = vec![0u8; 1024];
        init_empty_block(&mut block, true);
        insert(&mut block, true, 11, 1, b"hello").unwrap();
        set_checksum(&mut block, 99);
        let loc = Location::Block {
            block: 40,
            ino: Some(2),
        };
        verify_checksum(&block, 99, loc).unwrap();
        let names: Vec<_> = parse_block(&block, true, loc)
            .unwrap()
            .into_iter()
            .filter(|e| e.inode != 0)
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![b"hello".to_vec()]);
        block[9] ^= 1;
        assert!(verify_checksum(&block, 99, loc).is_err());
    }

    #[test]
    fn parse_names_the_bad_record() {
        let mut block = vec![0u8; 1024];
        init_empty_block(&mut block, false);
        put_u16(&mut block, 4, 1030);
        let err = parse_block(
            &block,
            false,
            Location::Block {
                block: 77,
                ino: Some(2),
            },
        )
        .unwrap_err();
        assert_eq!(err.structure, "directory entry");
        assert!(
            err.to_string().contains("block 77") && err.problem.contains("rec_len 1030"),
            "{err}"
        );
    }

    proptest! {
        /// Inserting and removing names keeps the block parseable and equal to a model.
        #[test]
        fn insert_and_remove_keep_the_block_valid(ops in prop::collection::vec((any::<bool>(), 1usize..40, 0u32..1000), 1..120)) {
            let mut block = vec![0u8; 1024];
            init_empty_block(&mut block, true);
            let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
            for (add, len, seed) in ops {
                let name: Vec<u8> = (0..len).map(|i| b'a' + ((seed as usize + i) % 26) as u8).collect();
                let loc = Location::Block { block: 0, ino: None };
                let entries = parse_block(&block, true, loc).unwrap();
                let found = entries.iter().find(|e| e.inode != 0 && e.name == name).cloned();
                if add && found.is_none() {
                    if insert(&mut block, true, seed + 1, 1, &name).is_some() {
                        model.insert(name, seed + 1);
                    }
                } else if let (false, Some(e)) = (add, found) {
                    remove(&mut block, true, e.offset);
                    model.remove(&name);
                }
                let now: BTreeMap<Vec<u8>, u32> = parse_block(&block, true, loc).unwrap()
                    .into_iter().filter(|e| e.inode != 0).map(|e| (e.name, e.inode)).collect();
                prop_assert_eq!(&now, &model);
            }
        }
    }

    #[test]
    fn pack_block_lays_entries_out_in_order_and_insert_at_splits_slack() {
        let loc = Location::Block {
            block: 3,
            ino: Some(12),
        };
        let named = |inode: u32, name: &'static [u8]| EntryRef {
            offset: 0,
            inode,
            rec_len: 0,
            file_type: FT_REG_FILE,
            name,
        };
        let entries = [named(20, b"a"), named(21, b"bbbbb"), named(22, b"cc")];
        let mut block = vec![0u8; 1024];
        pack_block(&mut block, true, entries.into_iter());
        let parsed = parse_block(&block, true, loc).unwrap();
        let shape: Vec<(usize, u32, usize, &[u8])> = parsed
            .iter()
            .map(|e| (e.offset, e.inode, e.rec_len, &e.name[..]))
            .collect();
        assert_eq!(
            shape,
            [
                (0, 20, 12, &b"a"[..]),
                (12, 21, 16, b"bbbbb"),
                (28, 22, 1024 - TAIL_SIZE - 28, b"cc"),
            ]
        );
        // The last record's slack takes a new name; the first record has none.
        assert_eq!(insert_at(&mut block, 28, 23, FT_DIR, b"dd"), 40);
        let parsed = parse_block(&block, true, loc).unwrap();
        assert_eq!(parsed.len(), 4);
        assert_eq!((parsed[2].rec_len, &parsed[2].name[..]), (12, &b"cc"[..]));
        assert_eq!(
            (parsed[3].inode, parsed[3].file_type, &parsed[3].name[..]),
            (23, FT_DIR, &b"dd"[..])
        );
        assert_eq!(parsed[3].rec_len, 1024 - TAIL_SIZE - 40);
        let mut empty = vec![0u8; 1024];
        pack_block(&mut empty, false, std::iter::empty());
        assert_eq!(insert_at(&mut empty, 0, 30, FT_REG_FILE, b"x"), 0);
        assert_eq!(parse_block(&empty, false, loc).unwrap()[0].rec_len, 1024);
    }
}
