//! Block and inode bitmaps: one bit per block (or inode) of a group, bit `i` of the group
//! at byte `i / 8`, bit `i % 8` (least significant first). Set means in use.
//!
//! ```text
//! byte i/8, bit i%8   1 = block (inode) i of the group is in use
//! bits past the group's last block (inode) up to the end of the block are set to 1
//! ```
//!
//! The bitmap checksum covers only the bits that describe a full group
//! (`blocks_per_group / 8` or `inodes_per_group / 8` bytes), not the whole block, and is
//! `crc32c_raw(fs_seed, those bytes)`; the group descriptor keeps its low 16 bits (and the
//! high 16 with 64-byte descriptors).
//!
//! Promise: the search helpers look only at bits below the `limit` they are given. Bit
//! indexes past the slice are a caller's bug and panic; nothing here reads the disk.

use super::csum::crc32c_raw;
use super::{FormatError, Location};

pub fn test_bit(bitmap: &[u8], bit: u32) -> bool {
    bitmap[(bit / 8) as usize] & (1 << (bit % 8)) != 0
}

pub fn set_bit(bitmap: &mut [u8], bit: u32) {
    bitmap[(bit / 8) as usize] |= 1 << (bit % 8);
}

pub fn clear_bit(bitmap: &mut [u8], bit: u32) {
    bitmap[(bit / 8) as usize] &= !(1 << (bit % 8));
}

/// Sets bits `start..start + count`.
pub fn set_range(bitmap: &mut [u8], start: u32, count: u32) {
    for bit in start..start + count {
        set_bit(bitmap, bit);
    }
}

/// Clears bits `start..start + count`.
pub fn clear_range(bitmap: &mut [u8], start: u32, count: u32) {
    for bit in start..start + count {
        clear_bit(bitmap, bit);
    }
}

/// Counts set bits among the first `bits`.
pub fn count_set(bitmap: &[u8], bits: u32) -> u32 {
    let full = (bits / 8) as usize;
    let mut n: u32 = bitmap[..full].iter().map(|b| b.count_ones()).sum();
    for bit in (full as u32 * 8)..bits {
        n += u32::from(test_bit(bitmap, bit));
    }
    n
}

/// The first clear bit in `from..limit`, if any.
pub fn find_clear(bitmap: &[u8], from: u32, limit: u32) -> Option<u32> {
    let mut bit = from;
    while bit < limit {
        let byte = bitmap[(bit / 8) as usize];
        if bit.is_multiple_of(8) && byte == 0xFF && bit + 8 <= limit {
            bit += 8;
            continue;
        }
        if !test_bit(bitmap, bit) {
            return Some(bit);
        }
        bit += 1;
    }
    None
}

/// The first run of clear bits in `from..limit`, as (start, length), with the length
/// capped at `max_len`.
pub fn find_clear_run(bitmap: &[u8], from: u32, limit: u32, max_len: u32) -> Option<(u32, u32)> {
    let start = find_clear(bitmap, from, limit)?;
    let mut end = start + 1;
    while end < limit && end - start < max_len && !test_bit(bitmap, end) {
        end += 1;
    }
    Some((start, end - start))
}

/// The start of the first run of at least `len` clear bits inside `from..limit`.
pub fn find_clear_run_of(bitmap: &[u8], from: u32, limit: u32, len: u32) -> Option<u32> {
    assert!(len > 0, "a run of zero bits");
    let mut at = from;
    while let Some((start, found)) = find_clear_run(bitmap, at, limit, len) {
        if found == len {
            return Some(start);
        }
        // The run ended at a set bit (or the limit); no run can start inside it.
        at = start + found + 1;
    }
    None
}

/// The bitmap checksum: `crc32c_raw(fs_seed, first bits/8 bytes)`.
pub fn checksum(fs_seed: u32, bitmap: &[u8], bits: u32) -> u32 {
    crc32c_raw(fs_seed, &bitmap[..(bits / 8) as usize])
}

/// Which bitmap a checksum belongs to, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitmapKind {
    Block,
    Inode,
}

/// Checks a bitmap against the checksum its group descriptor holds. `full_width` is
/// false for 32-byte descriptors, which keep only the low 16 bits.
pub fn verify_checksum(
    kind: BitmapKind,
    bitmap: &[u8],
    bits: u32,
    fs_seed: u32,
    stored: u32,
    full_width: bool,
    location: Location,
) -> Result<(), FormatError> {
    let mask = if full_width { u32::MAX } else { 0xFFFF };
    let computed = checksum(fs_seed, bitmap, bits) & mask;
    if stored & mask != computed {
        let structure = match kind {
            BitmapKind::Block => "block bitmap",
            BitmapKind::Inode => "inode bitmap",
        };
        return Err(FormatError::new(
            structure,
            location,
            format!("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn run_finder_agrees_with_a_naive_scan(bits in prop::collection::vec(any::<bool>(), 1..300), from in 0u32..300, max_len in 1u32..40) {
            let limit = bits.len() as u32;
            let from = from % limit;
            let mut map = vec![0u8; bits.len().div_ceil(8)];
            for (i, &b) in bits.iter().enumerate() {
                if b { set_bit(&mut map, i as u32); }
            }
            let naive_start = (from..limit).find(|&i| !bits[i as usize]);
            let found = find_clear_run(&map, from, limit, max_len);
            prop_assert_eq!(found.map(|(s, _)| s), naive_start);
            if let Some((s, len)) = found {
                let naive_len = (s..limit).take_while(|&i| !bits[i as usize]).count() as u32;
                prop_assert_eq!(len, naive_len.min(max_len));
            }
            prop_assert_eq!(count_set(&map, limit), bits.iter().filter(|&&b| b).count() as u32);
        }

        #[test]
        fn run_of_length_agrees_with_a_naive_scan(bits in prop::collection::vec(any::<bool>(), 1..300), from in 0u32..300, len in 1u32..12) {
            let limit = bits.len() as u32;
            let from = from % limit;
            let mut map = vec![0u8; bits.len().div_ceil(8)];
            for (i, &b) in bits.iter().enumerate() {
                if b { set_bit(&mut map, i as u32); }
            }
            let naive = (from..limit).find(|&s| {
                s + len <= limit && (s..s + len).all(|i| !bits[i as usize])
            });
            prop_assert_eq!(find_clear_run_of(&map, from, limit, len), naive);
        }
    }

    #[test]
    fn ranges_set_and_clear_and_checksums_name_the_bitmap() {
        let mut map = vec![0u8; 128];
        set_range(&mut map, 3, 20);
        clear_range(&mut map, 5, 2);
        assert_eq!(count_set(&map, 1024), 18);
        let stored = checksum(9, &map, 1024);
        let loc = Location::Block {
            block: 77,
            ino: None,
        };
        verify_checksum(BitmapKind::Inode, &map, 1024, 9, stored, true, loc).unwrap();
        verify_checksum(
            BitmapKind::Inode,
            &map,
            1024,
            9,
            stored & 0xFFFF,
            false,
            loc,
        )
        .unwrap();
        set_bit(&mut map, 1000);
        let err = verify_checksum(BitmapKind::Block, &map, 1024, 9, stored, true, loc).unwrap_err();
        assert_eq!((err.structure, err.location), ("block bitmap", loc));
    }
}
