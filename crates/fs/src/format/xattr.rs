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
//! Values are padded to 4 bytes with zeros. `h_checksum` is
//! `crc32c_raw(fs_seed, le64 block number ‖ block with h_checksum zero)`. Block entries are
//! kept sorted by (index, name length, name), as ext4 does.

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
        let mut hash = 0u32;
        for &b in &self.name {
            hash = (hash << 5) ^ (hash >> 27) ^ u32::from(b);
        }
        let mut padded = self.value.clone();
        padded.resize(self.value_size(), 0);
        for word in padded.chunks(4) {
            hash = (hash << 16) ^ (hash >> 16) ^ u32_at(word, 0);
        }
        hash
    }
}

/// Space `entries` need: the entry list with its 4-byte terminator, and the values.
pub fn space_needed(entries: &[XattrEntry]) -> usize {
    entries
        .iter()
        .map(|e| e.entry_size() + e.value_size())
        .sum::<usize>()
        + 4
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
    let mut entries = Vec::new();
    let mut offset = first_entry;
    loop {
        if offset + 4 > region.len() {
            return Err(err(offset, "entry list is not terminated".into()));
        }
        if u32_at(region, offset) == 0 {
            break;
        }
        if offset + ENTRY_HEADER_SIZE > region.len() {
            return Err(err(offset, "entry header runs past the end".into()));
        }
        let name_len = usize::from(region[offset]);
        let name_index = region[offset + 1];
        let value_offs = usize::from(u16_at(region, offset + 2));
        let value_inum = u32_at(region, offset + 4);
        let value_size = u32_at(region, offset + 8) as usize;
        let name_end = offset + ENTRY_HEADER_SIZE + name_len;
        if name_end > region.len() {
            return Err(err(
                offset,
                format!("name of {name_len} bytes runs past the end"),
            ));
        }
        if value_inum != 0 {
            return Err(err(
                offset,
                format!("value stored in inode {value_inum} (ea_inode is not supported)"),
            ));
        }
        let entries_end = (name_end + 3) & !3;
        if value_size > 0 && (value_offs < entries_end || value_offs + value_size > region.len()) {
            return Err(err(offset, format!(
                "value at {value_offs} of {value_size} bytes is outside the value area ({entries_end}..{})",
                region.len()
            )));
        }
        let entry = XattrEntry {
            name_index,
            name: region[offset + ENTRY_HEADER_SIZE..name_end].to_vec(),
            value: region[value_offs..value_offs + value_size].to_vec(),
        };
        let stored_hash = u32_at(region, offset + 12);
        if stored_hash != 0 && stored_hash != entry.hash() {
            return Err(err(
                offset,
                format!("hash {stored_hash:#x} does not match {:#x}", entry.hash()),
            ));
        }
        entries.push(entry);
        offset = entries_end;
    }
    Ok(entries)
}

/// Lays out `entries` in `region` from `first_entry`; `false` if they do not fit.
fn encode_entries(region: &mut [u8], first_entry: usize, entries: &[XattrEntry]) -> bool {
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
        put_u32(region, offset + 12, e.hash());
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
    if area.len() < 4 || !encode_entries(&mut area[4..], 0, entries) {
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
    assert!(encode_entries(block, BLOCK_HEADER_SIZE, &sorted));
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

/// `h_hash`: the entries' hashes folded together.
pub fn block_hash(entries: &[XattrEntry]) -> u32 {
    entries
        .iter()
        .fold(0u32, |hash, e| (hash << 16) ^ (hash >> 16) ^ e.hash())
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
