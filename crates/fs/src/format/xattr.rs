//! Extended attributes, in the inode (after the extra fields) or in one external block
//! (`i_file_acl`). Both hold a list of entries growing down from the start and values
//! growing up from the end. Layout (little-endian):
//!
//! ```text
//! in-inode area: 0 4 magic 0xEA020000, then entries; value offsets count from the first
//!                entry (byte 4 of the area)
//! block header:  0 4 h_magic 0xEA020000   4 4 h_refcount   8 4 h_blocks (1)
//!                12 4 h_hash              16 4 h_checksum  20 12 reserved
//!                entries from byte 32; value offsets count from the block start
//! entry:         0 1 e_name_len   1 1 e_name_index   2 2 e_value_offs
//!                4 4 e_value_inum (0: value stored here)  8 4 e_value_size
//!                12 4 e_hash      16 name, padded to a multiple of 4
//! end of list:   4 zero bytes
//! ```
//!
//! Values are padded to 4 bytes with zeros and lie after the list's terminator. `e_hash`
//! mixes the name (each byte: `h = h << 5 ^ h >> 27 ^ byte`) then the padded value (each
//! le32 word: `h = h << 16 ^ h >> 16 ^ word`); Linux before 6.2 read the name bytes as
//! signed chars, so decode accepts that variant too. In-inode entries carry `e_hash` 0
//! (as Linux writes them). `h_hash` mixes the entries' hashes (`h = h << 16 ^ h >> 16 ^
//! e_hash`), or is 0 if any entry's hash is 0. `h_checksum` is
//! `crc32c_raw(fs_seed, le64 block number ‖ block with h_checksum zero)`. Block entries are
//! kept sorted by (index, name length, name), as ext4 does; in-inode entries keep their
//! order, with the first entry's value at the end of the area, as Linux lays them out.
//!
//! Name indexes: 1 "user.", 2 "system.posix_acl_access", 3 "system.posix_acl_default",
//! 4 "trusted.", 6 "security.", 7 "system.", 8 "system.richacl".
//!
//! Promise: decode checks, as the kernel's `ext4_xattr_check_entries` does, that every
//! name lies inside the area, holds no NUL, and that every value lies after the entry
//! list and inside the area; values stored in other inodes (ea_inode) are refused. The
//! encoders return `false` rather than write entries that do not fit.

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::{FormatError, Location};

pub const XATTR_MAGIC: u32 = 0xEA02_0000;
pub const BLOCK_HEADER_SIZE: usize = 32;
pub const ENTRY_HEADER_SIZE: usize = 16;

/// Name prefixes by index, longest first so that exact ACL names win over "system.".
const PREFIXES: &[(u8, &str)] = &[
    (2, "system.posix_acl_access"),
    (3, "system.posix_acl_default"),
    (8, "system.richacl"),
    (1, "user."),
    (4, "trusted."),
    (6, "security."),
    (7, "system."),
];

/// One attribute: the name is stored as an index (its prefix) and the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrEntry {
    pub name_index: u8,
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

impl XattrEntry {
    /// Splits a full name ("user.mime") into an entry name; `None` for unknown namespaces.
    pub fn from_full_name(full: &[u8], value: Vec<u8>) -> Option<XattrEntry> {
        let (index, prefix) = PREFIXES.iter().find(|(_, prefix)| {
            let prefix = prefix.as_bytes();
            let exact_only = !prefix.ends_with(b".");
            if exact_only {
                full == prefix
            } else {
                full.starts_with(prefix)
            }
        })?;
        Some(XattrEntry {
            name_index: *index,
            name: full[prefix.len()..].to_vec(),
            value,
        })
    }

    /// The full name ("user.mime"); unknown indexes get a "unknown<N>." prefix.
    pub fn full_name(&self) -> Vec<u8> {
        let mut full = match PREFIXES.iter().find(|(i, _)| *i == self.name_index) {
            Some((_, prefix)) => prefix.as_bytes().to_vec(),
            None => format!("unknown{}.", self.name_index).into_bytes(),
        };
        full.extend_from_slice(&self.name);
        full
    }

    fn sort_key(&self) -> (u8, usize, &[u8]) {
        (self.name_index, self.name.len(), &self.name)
    }

    /// Bytes of entry list this attribute takes.
    pub fn entry_size(&self) -> usize {
        (ENTRY_HEADER_SIZE + self.name.len() + 3) & !3
    }

    /// Bytes of value space this attribute takes.
    pub fn value_size(&self) -> usize {
        (self.value.len() + 3) & !3
    }

    /// `e_hash`: the name, then the value's le32 words.
    pub fn hash(&self) -> u32 {
        entry_hash(&self.name, &self.value, false)
    }
}

/// The entry hash, reading name bytes as unsigned (Linux 6.2 on) or signed (before).
fn entry_hash(name: &[u8], value: &[u8], signed_name: bool) -> u32 {
    let mut hash = 0u32;
    for &b in name {
        let byte = if signed_name {
            b as i8 as i32 as u32
        } else {
            u32::from(b)
        };
        hash = (hash << 5) ^ (hash >> 27) ^ byte;
    }
    for word in value.chunks(4) {
        let mut padded = [0u8; 4];
        padded[..word.len()].copy_from_slice(word);
        hash = (hash << 16) ^ (hash >> 16) ^ u32::from_le_bytes(padded);
    }
    hash
}

/// Space `entries` need: the entry list with its 4-byte terminator, and the values.
pub fn space_needed(entries: &[XattrEntry]) -> usize {
    entries
        .iter()
        .map(|e| e.entry_size() + e.value_size())
        .sum::<usize>()
        + 4
}

/// One entry's header fields, before its value is checked.
struct EntryHeader {
    offset: usize,
    name_index: u8,
    name_len: usize,
    value_offs: usize,
    value_inum: u32,
    value_size: usize,
    stored_hash: u32,
}

/// Walks the entry list from `first_entry` to its terminator; returns the entries and
/// the offset just past the terminator.
fn read_entry_list(
    region: &[u8],
    first_entry: usize,
    err: &dyn Fn(usize, String) -> FormatError,
) -> Result<(Vec<EntryHeader>, usize), FormatError> {
    let mut list = Vec::new();
    let mut offset = first_entry;
    loop {
        if offset + 4 > region.len() {
            return Err(err(offset, "entry list is not terminated".into()));
        }
        if u32_at(region, offset) == 0 {
            return Ok((list, offset + 4));
        }
        if offset + ENTRY_HEADER_SIZE > region.len() {
            return Err(err(offset, "entry header runs past the end".into()));
        }
        let name_len = usize::from(region[offset]);
        let next = (offset + ENTRY_HEADER_SIZE + name_len + 3) & !3;
        if next > region.len() {
            return Err(err(
                offset,
                format!("name of {name_len} bytes runs past the end"),
            ));
        }
        let name = &region[offset + ENTRY_HEADER_SIZE..offset + ENTRY_HEADER_SIZE + name_len];
        if name.contains(&0) {
            return Err(err(offset, "name contains a NUL byte".into()));
        }
        list.push(EntryHeader {
            offset,
            name_index: region[offset + 1],
            name_len,
            value_offs: usize::from(u16_at(region, offset + 2)),
            value_inum: u32_at(region, offset + 4),
            value_size: u32_at(region, offset + 8) as usize,
            stored_hash: u32_at(region, offset + 12),
        });
        offset = next;
    }
}

/// Decodes entries from `region` (value offsets relative to `region[0]`).
fn decode_entries(
    region: &[u8],
    first_entry: usize,
    structure: &'static str,
    location: Location,
) -> Result<Vec<XattrEntry>, FormatError> {
    let err = |offset: usize, p: String| {
        FormatError::new(structure, location, format!("entry at byte {offset}: {p}"))
    };
    let (list, list_end) = read_entry_list(region, first_entry, &err)?;
    let mut entries = Vec::with_capacity(list.len());
    for raw in list {
        if raw.value_inum != 0 {
            return Err(err(
                raw.offset,
                format!(
                    "value stored in inode {} (ea_inode is not supported)",
                    raw.value_inum
                ),
            ));
        }
        let value = if raw.value_size == 0 {
            &[][..]
        } else {
            let padded_end = raw.value_offs.saturating_add((raw.value_size + 3) & !3);
            if raw.value_offs < list_end || padded_end > region.len() {
                return Err(err(
                    raw.offset,
                    format!(
                        "value at {} of {} bytes is outside the value area ({list_end}..{})",
                        raw.value_offs,
                        raw.value_size,
                        region.len()
                    ),
                ));
            }
            &region[raw.value_offs..raw.value_offs + raw.value_size]
        };
        let name_start = raw.offset + ENTRY_HEADER_SIZE;
        let name = &region[name_start..name_start + raw.name_len];
        let hash = raw.stored_hash;
        if hash != 0
            && hash != entry_hash(name, value, false)
            && hash != entry_hash(name, value, true)
        {
            return Err(err(
                raw.offset,
                format!(
                    "hash {hash:#x} does not match {:#x}",
                    entry_hash(name, value, false)
                ),
            ));
        }
        entries.push(XattrEntry {
            name_index: raw.name_index,
            name: name.to_vec(),
            value: value.to_vec(),
        });
    }
    Ok(entries)
}

/// Lays out `entries` in `region` from `first_entry`; `false` if they do not fit. Entry
/// hashes are written only when `with_hashes` (blocks; in-inode entries carry 0).
fn encode_entries(
    region: &mut [u8],
    first_entry: usize,
    entries: &[XattrEntry],
    with_hashes: bool,
) -> bool {
    if first_entry + space_needed(entries) > region.len() {
        return false;
    }
    region[first_entry..].fill(0);
    let mut offset = first_entry;
    let mut value_end = region.len();
    for e in entries {
        assert!(e.name.len() <= 255 && e.value.len() <= u32::MAX as usize);
        let value_offs = if e.value.is_empty() {
            0
        } else {
            value_end -= e.value_size();
            region[value_end..value_end + e.value.len()].copy_from_slice(&e.value);
            value_end
        };
        region[offset] = e.name.len() as u8;
        region[offset + 1] = e.name_index;
        put_u16(region, offset + 2, value_offs as u16);
        put_u32(region, offset + 4, 0);
        put_u32(region, offset + 8, e.value.len() as u32);
        put_u32(region, offset + 12, if with_hashes { e.hash() } else { 0 });
        region[offset + ENTRY_HEADER_SIZE..offset + ENTRY_HEADER_SIZE + e.name.len()]
            .copy_from_slice(&e.name);
        offset += e.entry_size();
    }
    debug_assert!(offset + 4 <= value_end, "entries ran into values");
    true
}

/// Decodes the in-inode area (bytes after the extra fields). No magic means no attributes.
pub fn decode_inode_area(area: &[u8], ino: u32) -> Result<Vec<XattrEntry>, FormatError> {
    if area.len() < 4 || u32_at(area, 0) != XATTR_MAGIC {
        return Ok(Vec::new());
    }
    decode_entries(
        &area[4..],
        0,
        "in-inode xattr",
        Location::InodeXattrArea { ino },
    )
}

/// Encodes the in-inode area; `false` if the entries do not fit. No entries clears it.
pub fn encode_inode_area(area: &mut [u8], entries: &[XattrEntry]) -> bool {
    if entries.is_empty() {
        area.fill(0);
        return true;
    }
    if area.len() < 4 || !encode_entries(&mut area[4..], 0, entries, false) {
        return false;
    }
    put_u32(area, 0, XATTR_MAGIC);
    true
}

/// True if `entries` fit an in-inode area of `area_len` bytes.
pub fn fits_inode_area(area_len: usize, entries: &[XattrEntry]) -> bool {
    entries.is_empty() || area_len >= 4 + space_needed(entries)
}

/// True if `entries` fit an xattr block of `block_size` bytes.
pub fn fits_block(block_size: usize, entries: &[XattrEntry]) -> bool {
    BLOCK_HEADER_SIZE + space_needed(entries) <= block_size
}

/// The external block's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XattrBlockHeader {
    pub refcount: u32,
    pub hash: u32,
}

/// Decodes an xattr block (and verifies its checksum when `fs_seed` is `Some`).
pub fn decode_block(
    block: &[u8],
    block_nr: u64,
    fs_seed: Option<u32>,
) -> Result<(XattrBlockHeader, Vec<XattrEntry>), FormatError> {
    let location = Location::Block {
        block: block_nr,
        ino: None,
    };
    let err = |p: String| FormatError::new("xattr block", location, p);
    let magic = u32_at(block, 0);
    if magic != XATTR_MAGIC {
        return Err(err(format!(
            "bad magic {magic:#x} (expected {XATTR_MAGIC:#x})"
        )));
    }
    if u32_at(block, 8) != 1 {
        return Err(err(format!("h_blocks {} (expected 1)", u32_at(block, 8))));
    }
    if let Some(seed) = fs_seed {
        let (stored, computed) = (u32_at(block, 16), block_checksum(block, block_nr, seed));
        if stored != computed {
            return Err(err(format!(
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            )));
        }
    }
    let entries = decode_entries(block, BLOCK_HEADER_SIZE, "xattr block", location)?;
    let header = XattrBlockHeader {
        refcount: u32_at(block, 4),
        hash: u32_at(block, 12),
    };
    Ok((header, entries))
}

/// Encodes an xattr block; entries are sorted first. `false` if they do not fit.
pub fn encode_block(
    block: &mut [u8],
    refcount: u32,
    entries: &[XattrEntry],
    block_nr: u64,
    fs_seed: Option<u32>,
) -> bool {
    let mut sorted = entries.to_vec();
    sorted.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    if !fits_block(block.len(), &sorted) {
        return false;
    }
    block.fill(0);
    assert!(encode_entries(block, BLOCK_HEADER_SIZE, &sorted, true));
    put_u32(block, 0, XATTR_MAGIC);
    put_u32(block, 4, refcount);
    put_u32(block, 8, 1);
    put_u32(block, 12, block_hash(&sorted));
    if let Some(seed) = fs_seed {
        let csum = block_checksum(block, block_nr, seed);
        put_u32(block, 16, csum);
    }
    true
}

/// `h_hash`: the entries' hashes folded together; 0 if any entry hashes to 0 (ext4 then
/// never shares the block).
pub fn block_hash(entries: &[XattrEntry]) -> u32 {
    let mut hash = 0u32;
    for e in entries {
        let entry = e.hash();
        if entry == 0 {
            return 0;
        }
        hash = (hash << 16) ^ (hash >> 16) ^ entry;
    }
    hash
}

fn block_checksum(block: &[u8], block_nr: u64, fs_seed: u32) -> u32 {
    let mut copy = block.to_vec();
    put_u32(&mut copy, 16, 0);
    crc32c_raw(crc32c_raw(fs_seed, &block_nr.to_le_bytes()), &copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<XattrEntry> {
        vec![
            XattrEntry::from_full_name(b"user.mime", b"text/plain".to_vec()).unwrap(),
            XattrEntry::from_full_name(b"trusted.x", vec![1, 2, 3]).unwrap(),
            XattrEntry::from_full_name(b"system.posix_acl_access", vec![2, 0, 0, 0]).unwrap(),
            XattrEntry::from_full_name(b"user.empty", vec![]).unwrap(),
        ]
    }

    #[test]
    fn names_split_by_prefix() {
        let e = XattrEntry::from_full_name(b"system.posix_acl_access", vec![]).unwrap();
        assert_eq!((e.name_index, e.name.as_slice()), (2, &b""[..]));
        let e = XattrEntry::from_full_name(b"system.data", vec![]).unwrap();
        assert_eq!((e.name_index, e.name.as_slice()), (7, &b"data"[..]));
        assert!(XattrEntry::from_full_name(b"bogus.x", vec![]).is_none());
        assert_eq!(entries()[0].full_name(), b"user.mime");
    }

    #[test]
    fn inode_area_round_trips() {
        let mut area = vec![0u8; 160];
        assert!(encode_inode_area(&mut area, &entries()));
        assert_eq!(decode_inode_area(&area, 12).unwrap(), entries());
        let big = vec![XattrEntry::from_full_name(b"user.big", vec![7; 300]).unwrap()];
        assert!(!fits_inode_area(area.len(), &big) && !encode_inode_area(&mut area, &big));
    }

    #[test]
    fn inode_area_is_laid_out_as_linux_does() {
        let mut area = vec![0u8; 100];
        let two = vec![
            XattrEntry::from_full_name(b"user.small", b"v".to_vec()).unwrap(),
            XattrEntry::from_full_name(b"user.abc", b"xyz".to_vec()).unwrap(),
        ];
        assert!(encode_inode_area(&mut area, &two));
        // Entries in order with e_hash 0; the first value sits at the very end.
        assert_eq!(u32_at(&area, 4 + 12), 0);
        assert_eq!(u16_at(&area, 4 + 2), 100 - 4 - 4);
        assert_eq!(area[96], b'v');
        assert_eq!(decode_inode_area(&area, 12).unwrap(), two);
    }

    #[test]
    fn decode_refuses_values_over_the_list_and_bad_names() {
        let mut area = vec![0u8; 100];
        assert!(encode_inode_area(&mut area, &entries()[..1]));
        let mut overlapping = area.clone();
        put_u16(&mut overlapping, 4 + 2, 8);
        let err = decode_inode_area(&overlapping, 12).unwrap_err();
        assert_eq!(err.location, Location::InodeXattrArea { ino: 12 });
        assert!(err.problem.contains("outside the value area"), "{err}");
        let mut past_end = area.clone();
        put_u32(&mut past_end, 4 + 8, 200);
        assert!(decode_inode_area(&past_end, 12).is_err());
        let mut nul = area.clone();
        nul[4 + ENTRY_HEADER_SIZE + 1] = 0;
        assert!(decode_inode_area(&nul, 12)
            .unwrap_err()
            .problem
            .contains("NUL"));
    }

    #[test]
    fn hashes_of_high_byte_names_accept_both_signedness() {
        let e = XattrEntry::from_full_name("user.été".as_bytes(), b"high".to_vec()).unwrap();
        let signed = entry_hash(&e.name, &e.value, true);
        assert_ne!(signed, e.hash());
        let mut block = vec![0u8; 1024];
        assert!(encode_block(&mut block, 1, &[e], 9, None));
        put_u32(&mut block, BLOCK_HEADER_SIZE + 12, signed);
        decode_block(&block, 9, None).unwrap();
        put_u32(&mut block, BLOCK_HEADER_SIZE + 12, signed ^ 1);
        assert!(decode_block(&block, 9, None)
            .unwrap_err()
            .problem
            .contains("hash"));
    }

    #[test]
    fn block_round_trips_sorted_with_checksum() {
        let mut block = vec![0u8; 1024];
        assert!(encode_block(&mut block, 1, &entries(), 5000, Some(42)));
        let (header, back) = decode_block(&block, 5000, Some(42)).unwrap();
        assert_eq!(header.refcount, 1);
        let mut sorted = entries();
        sorted.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        assert_eq!(back, sorted);
        assert_eq!(header.hash, block_hash(&sorted));
        let err = decode_block(&block, 5001, Some(42)).unwrap_err();
        assert!(
            err.to_string().contains("block 5001") && err.problem.contains("checksum"),
            "{err}"
        );
        block[40] = 0xFF;
        assert!(decode_block(&block, 5000, None).is_err());
    }
}
