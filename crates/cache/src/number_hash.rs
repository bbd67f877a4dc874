//! Hash tables keyed by inode or block numbers, hashed so that neighbouring numbers stay
//! neighbours in the table.
//!
//! File systems hand out numbers in runs (the inodes of a directory being filled, the
//! blocks of an inode table), and walk them in runs (eviction oldest first). With the
//! standard library's keyed SipHash every number lands in a random slot, so a table larger
//! than the CPU's caches misses on every lookup: in a 10^6-name directory built through
//! the library, the inode table's and the buffer cache's lookups grew from 0.5 to 1.7 µs
//! per create as their tables outgrew the caches. Here a number keeps its low
//! [`RUN_BITS`] bits as the low bits of its hash, so the 16 numbers of a run share one
//! probe group of the table (a few cache lines), and the run's index is mixed by a folded
//! 128-bit multiply into every other bit (the bucket and the 7-bit tag hashbrown keeps).
//!
//! Promises: equal numbers hash equal; distinct runs spread as the multiply spreads them.
//! The hash is not keyed, as the kernel's inode and buffer hashes are not: the numbers
//! come from the file system's allocator, not from its users. Must never be used for
//! keys a user chooses (names).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Low bits of a number kept as they are: runs of `1 << RUN_BITS` numbers share a probe
/// group (hashbrown probes 16 control bytes at once).
const RUN_BITS: u32 = 4;

/// The 64-bit golden ratio, odd: the multiplier of Fibonacci hashing.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// A `HashMap` keyed by inode or block numbers.
pub type NumberMap<K, V> = HashMap<K, V, BuildHasherDefault<NumberHasher>>;

/// The hasher of [`NumberMap`]: made for `u32`, `u64` and `usize` keys (a tuple of them
/// hashes correctly but only its last number keeps its run's locality).
#[derive(Clone, Copy, Debug, Default)]
pub struct NumberHasher {
    hash: u64,
}

/// The hash of `number`: its run's index mixed into the high bits, its place in the run
/// kept in the low ones.
fn spread(number: u64) -> u64 {
    let product = u128::from(number >> RUN_BITS) * u128::from(GOLDEN);
    let mixed = (product as u64) ^ ((product >> 64) as u64);
    (mixed << RUN_BITS) | (number & ((1 << RUN_BITS) - 1))
}

impl Hasher for NumberHasher {
    /// Other keys, 8 bytes at a time (correct, without the run locality).
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_usize(&mut self, number: usize) {
        self.write_u64(number as u64);
    }

    fn write_u32(&mut self, number: u32) {
        self.write_u64(u64::from(number));
    }

    fn write_u64(&mut self, number: u64) {
        self.hash = spread(number ^ self.hash);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_run_of_numbers_shares_its_high_bits_and_keeps_its_low_ones() {
        let base = spread(0x1230);
        for i in 0..16 {
            assert_eq!(spread(0x1230 + i), base + i, "number {:#x}", 0x1230 + i);
        }
        assert_ne!(spread(0x1240) >> RUN_BITS, base >> RUN_BITS);
    }

    #[test]
    fn strided_numbers_spread_over_buckets_and_tags() {
        // Inodes at the start of each of 4,096 groups of 8,192: one run per group.
        // In a table of 65,536 buckets they have 4,096 probe groups to go to; random
        // places would leave 4,096 × (1 - 1/e) = 2,589 of them distinct.
        let hashes: Vec<u64> = (0..4096u64).map(|g| spread(g * 8192)).collect();
        let groups: HashSet<u64> = hashes.iter().map(|h| (h & 0xffff) >> RUN_BITS).collect();
        let tags: HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(
            groups.len() >= 2589,
            "{} distinct probe groups",
            groups.len()
        );
        assert_eq!(tags.len(), 128, "every 7-bit tag used");
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: NumberMap<u32, u32> = NumberMap::default();
        for ino in (1..200_000u32).step_by(3) {
            map.insert(ino, ino * 2);
        }
        assert_eq!(map.get(&30_001), Some(&60_002));
        assert_eq!(map.get(&30_002), None);
        assert_eq!(map.len(), 66_667);
        let mut pairs: NumberMap<(u32, u64), u8> = NumberMap::default();
        pairs.insert((7, 1 << 40), 1);
        assert_eq!(pairs.get(&(7, 1 << 40)), Some(&1));
        assert_eq!(pairs.get(&(7, 1 << 41)), None);
    }
}
