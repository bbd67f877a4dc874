//! jext's byte-granular journal records: a logged block written as the byte ranges that
//! changed, not as a whole copy (JoJ §3.2: nine writes of 2,576 bytes became 45,056 bytes
//! of whole-block records in one commit). Jext-private: a log that may hold such blocks
//! carries `INCOMPAT_JEXT_RECORDS` in its superblock, so Linux refuses it rather than
//! ending its scan at the first records block and losing the transactions after it.
//!
//! A record says what a home block becomes when its transaction is replayed:
//!
//! - **DELTA**: set these ranges in the block as recovery has it so far (its home contents,
//!   then every earlier replayed record of it, in tid order). Idempotent; the journal
//!   writes one only when it knows that state (`crate::commit`).
//! - **ZEROED**: the block is zeros with these ranges set. Needs no base at all, so it
//!   suits a block with no trustworthy home contents (newly allocated, revoked).
//!
//! ```text
//! records block (blocktype 0x6A78_7262 "jxrb"), big-endian like every JBD2 block:
//!   0x00 4  h_magic      0xC03B3998
//!   0x04 4  h_blocktype  0x6A787262
//!   0x08 4  h_sequence   tid of the transaction
//!   0x0C 4  r_used       bytes used, this 16-byte header included
//!   0x10 .. entries, back to back, up to r_used:
//!     0 8  e_block       home block (file system block number)
//!     8 1  e_kind        1 DELTA, 2 ZEROED
//!     9 1  e_reserved    0
//!    10 2  e_count       ranges that follow (ZEROED may have 0: an all-zero block)
//!    12 .. e_count ranges, each:
//!          0 2  offset in the block
//!          2 2  length (1 or more; offset + length <= block size)
//!          4 .. length bytes, as they are in the block (never escaped: they live inside
//!               a block that starts with the magic)
//!   last 4  crc32c_raw(csum_seed, whole block with these 4 bytes zeroed), as the
//!           descriptor tail: records exist only in logs with checksum v2 or v3
//! ```
//!
//! Ranges of one entry are in ascending offset order and do not overlap. An entry never
//! spans two records blocks. Block sizes up to 64 KiB fit the 16-bit fields because an
//! entry is only written when it is at most half a block (`crate::commit`).
//!
//! Promises: the decoder refuses (naming the journal block) an entry that runs past
//! `r_used`, a range outside the block, overlapping or unordered ranges and an unknown
//! kind, and never panics on bytes; the encoder asserts what it is given fits.
//! Nothing here reads or writes a device.

use super::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::blocks::{LogFormat, HEADER_SIZE};
use crate::tid::Tid;
use crate::JournalError;

/// The block type of a records block ("jxrb"), far from JBD2's 1..5.
pub const BLOCKTYPE_JEXT_RECORDS: u32 = 0x6A78_7262;
const USED_OFFSET: usize = HEADER_SIZE;
const RECORDS_HEADER_SIZE: usize = 16;
const TAIL_SIZE: usize = 4;
const ENTRY_HEADER_SIZE: usize = 12;
const RANGE_HEADER_SIZE: usize = 4;
const KIND_DELTA: u8 = 1;
const KIND_ZEROED: u8 = 2;
/// Ranges closer than this are sent as one: the bytes between cost no more than the
/// header a second range would need.
const MERGE_GAP: usize = RANGE_HEADER_SIZE;

/// How a record's ranges apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// On top of the block as recovery has it so far.
    Delta,
    /// On a block of zeros.
    Zeroed,
}

/// One changed run of bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub offset: usize,
    pub bytes: Vec<u8>,
}

/// What one home block becomes when its transaction replays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub fs_block: u64,
    pub kind: RecordKind,
    pub ranges: Vec<Range>,
}

impl Record {
    /// Bytes the entry takes in a records block.
    pub fn encoded_len(&self) -> usize {
        ENTRY_HEADER_SIZE
            + self
                .ranges
                .iter()
                .map(|r| RANGE_HEADER_SIZE + r.bytes.len())
                .sum::<usize>()
    }

    /// Applies the record to `block` (recovery's state of its home block).
    pub fn apply(&self, block: &mut [u8]) {
        if self.kind == RecordKind::Zeroed {
            block.fill(0);
        }
        for range in &self.ranges {
            block[range.offset..range.offset + range.bytes.len()].copy_from_slice(&range.bytes);
        }
    }

    /// Bytes of block data the record carries.
    pub fn payload_len(&self) -> usize {
        self.ranges.iter().map(|r| r.bytes.len()).sum()
    }
}

/// Room for entries in one records block of `block_size` bytes.
pub fn records_capacity(block_size: usize) -> usize {
    block_size - RECORDS_HEADER_SIZE - TAIL_SIZE
}

/// The runs where `new` differs from `base` (or, without a base, from zeros), merged when
/// closer than [`MERGE_GAP`], as (start, end). Stops and returns `None` once the entry
/// would take more than `limit` bytes.
fn changed_runs(base: Option<&[u8]>, new: &[u8], limit: usize) -> Option<Vec<(usize, usize)>> {
    // Every changed byte is carried, so their count alone may already be too many: a
    // block of new data (journaled file data, most of it) is then given up after a word-
    // wise count instead of a walk byte by byte to the limit, which on the commit thread
    // cost tens of milliseconds a writeback batch of 2,048 blocks.
    if ENTRY_HEADER_SIZE + changed_bytes(base, new) > limit {
        return None;
    }
    const CHUNK: usize = 64;
    let differs = |i: usize| match base {
        Some(base) => base[i] != new[i],
        None => new[i] != 0,
    };
    let same_chunk = |at: usize, end: usize| match base {
        Some(base) => base[at..end] == new[at..end],
        None => new[at..end].iter().all(|&b| b == 0),
    };
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut size = ENTRY_HEADER_SIZE;
    let mut at = 0;
    while at < new.len() {
        let end = (at + CHUNK).min(new.len());
        if same_chunk(at, end) {
            at = end;
            continue;
        }
        for i in at..end {
            if !differs(i) {
                continue;
            }
            match runs.last_mut() {
                Some(last) if i - last.1 <= MERGE_GAP => {
                    size += i + 1 - last.1;
                    last.1 = i + 1;
                }
                _ => {
                    size += RANGE_HEADER_SIZE + 1;
                    runs.push((i, i + 1));
                }
            }
            if size > limit {
                return None;
            }
        }
        at = end;
    }
    Some(runs)
}

/// How many bytes of `new` differ from `base` (or, without a base, are not zero).
fn changed_bytes(base: Option<&[u8]>, new: &[u8]) -> usize {
    const LOW_BITS: u64 = 0x0101_0101_0101_0101;
    let word = |bytes: &[u8]| {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(w)
    };
    let words = new.chunks(8).enumerate().map(|(i, chunk)| {
        let other = base.map_or(0, |base| word(&base[i * 8..i * 8 + chunk.len()]));
        // Folds each byte of the difference onto its low bit: one bit per changed byte.
        let mut x = word(chunk) ^ other;
        x |= x >> 4;
        x |= x >> 2;
        x |= x >> 1;
        (x & LOW_BITS).count_ones() as usize
    });
    words.sum()
}

/// The smallest record that turns `base` (recovery's state of the block before this
/// transaction, if the journal knows it) into `new`: a DELTA on `base`, or ZEROED; `None`
/// when neither fits in `limit` bytes (the block is then logged whole).
pub fn plan_record(fs_block: u64, base: Option<&[u8]>, new: &[u8], limit: usize) -> Option<Record> {
    let delta = base.and_then(|base| changed_runs(Some(base), new, limit));
    let zeroed = changed_runs(None, new, limit);
    let cost = |runs: &[(usize, usize)]| -> usize {
        runs.iter().map(|(s, e)| RANGE_HEADER_SIZE + e - s).sum()
    };
    let (kind, runs) = match (delta, zeroed) {
        (Some(d), Some(z)) if cost(&z) < cost(&d) => (RecordKind::Zeroed, z),
        (Some(d), _) => (RecordKind::Delta, d),
        (None, Some(z)) => (RecordKind::Zeroed, z),
        (None, None) => return None,
    };
    let ranges = runs
        .into_iter()
        .map(|(start, end)| Range {
            offset: start,
            bytes: new[start..end].to_vec(),
        })
        .collect();
    Some(Record {
        fs_block,
        kind,
        ranges,
    })
}

/// Groups `records` into records blocks, in order, each group filling one block.
pub fn pack(records: &[Record], block_size: usize) -> Vec<&[Record]> {
    let capacity = records_capacity(block_size);
    let mut groups = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, record) in records.iter().enumerate() {
        let len = record.encoded_len();
        assert!(
            len <= capacity,
            "a record of {len} bytes in a block of {block_size}"
        );
        if used + len > capacity {
            groups.push(&records[start..i]);
            (start, used) = (i, 0);
        }
        used += len;
    }
    if start < records.len() {
        groups.push(&records[start..]);
    }
    groups
}

impl LogFormat {
    /// A records block of transaction `tid` holding `records` (from [`pack`]).
    pub fn encode_records(&self, tid: Tid, records: &[Record]) -> Vec<u8> {
        assert!(
            self.has_block_checksums(),
            "byte records need checksum v2/v3"
        );
        let mut block = self.new_block(BLOCKTYPE_JEXT_RECORDS, tid);
        let mut at = RECORDS_HEADER_SIZE;
        for record in records {
            assert!(
                at + record.encoded_len()
                    <= records_capacity(self.block_size) + RECORDS_HEADER_SIZE,
                "records overflow their block"
            );
            put_u64(&mut block, at, record.fs_block);
            block[at + 8] = match record.kind {
                RecordKind::Delta => KIND_DELTA,
                RecordKind::Zeroed => KIND_ZEROED,
            };
            put_u16(&mut block, at + 10, record.ranges.len() as u16);
            at += ENTRY_HEADER_SIZE;
            for range in &record.ranges {
                let end = range.offset + range.bytes.len();
                assert!(!range.bytes.is_empty() && end <= self.block_size);
                put_u16(&mut block, at, range.offset as u16);
                put_u16(&mut block, at + 2, range.bytes.len() as u16);
                at += RANGE_HEADER_SIZE;
                block[at..at + range.bytes.len()].copy_from_slice(&range.bytes);
                at += range.bytes.len();
            }
        }
        put_u32(&mut block, USED_OFFSET, at as u32);
        self.set_tail(&mut block);
        block
    }

    /// The records of a records block (its tail checksum is checked separately, with
    /// [`LogFormat::tail_is_valid`]).
    pub fn decode_records(
        &self,
        block: &[u8],
        journal_block: u32,
    ) -> Result<Vec<Record>, JournalError> {
        let bad = |problem: String| JournalError::Corrupt {
            structure: "records block",
            journal_block,
            problem,
        };
        if !self.has_block_checksums() {
            return Err(bad("byte records in a log without checksum v2/v3".into()));
        }
        let used = u32_at(block, USED_OFFSET) as usize;
        let limit = self.block_size - TAIL_SIZE;
        if !(RECORDS_HEADER_SIZE..=limit).contains(&used) {
            return Err(bad(format!(
                "r_used {used} is outside {RECORDS_HEADER_SIZE}..={limit}"
            )));
        }
        let mut records = Vec::new();
        let mut at = RECORDS_HEADER_SIZE;
        while at < used {
            if at + ENTRY_HEADER_SIZE > used {
                return Err(bad(format!("entry at byte {at} runs past r_used {used}")));
            }
            let fs_block = u64_at(block, at);
            let kind = match block[at + 8] {
                KIND_DELTA => RecordKind::Delta,
                KIND_ZEROED => RecordKind::Zeroed,
                other => {
                    return Err(bad(format!(
                        "entry at byte {at} (block {fs_block}) has unknown kind {other}"
                    )))
                }
            };
            let count = u16_at(block, at + 10);
            at += ENTRY_HEADER_SIZE;
            let mut ranges: Vec<Range> = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                if at + RANGE_HEADER_SIZE > used {
                    return Err(bad(format!(
                        "a range of block {fs_block} runs past r_used {used}"
                    )));
                }
                let offset = usize::from(u16_at(block, at));
                let len = usize::from(u16_at(block, at + 2));
                at += RANGE_HEADER_SIZE;
                let after_previous = ranges
                    .last()
                    .is_none_or(|r| offset >= r.offset + r.bytes.len());
                if len == 0 || offset + len > self.block_size || !after_previous {
                    return Err(bad(format!(
                        "range {offset}+{len} of block {fs_block} is empty, outside the \
                         {}-byte block or not after the previous range",
                        self.block_size
                    )));
                }
                if at + len > used {
                    return Err(bad(format!(
                        "the bytes of range {offset}+{len} of block {fs_block} run past \
                         r_used {used}"
                    )));
                }
                ranges.push(Range {
                    offset,
                    bytes: block[at..at + len].to_vec(),
                });
                at += len;
            }
            records.push(Record {
                fs_block,
                kind,
                ranges,
            });
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::blocks::{BlockKind, Csum};

    #[test]
    fn changed_bytes_counts_each_differing_byte_once() {
        // Bytes that differ in one bit, in all bits, next to each other across word
        // boundaries, and a length that is not a whole number of words.
        let base: Vec<u8> = (0..1003u32).map(|i| (i * 37 % 251) as u8).collect();
        let mut new = base.clone();
        for i in (0..new.len()).filter(|i| i % 3 == 0 || (i % 64) > 60) {
            new[i] ^= if i % 2 == 0 { 0x80 } else { 0xFF };
        }
        let naive = |base: Option<&[u8]>| {
            let other = |i: usize| base.map_or(0, |b| b[i]);
            (0..new.len()).filter(|&i| new[i] != other(i)).count()
        };
        assert_eq!(changed_bytes(Some(&base), &new), naive(Some(&base)));
        assert_eq!(changed_bytes(None, &new), naive(None));
        assert_eq!(changed_bytes(Some(&new), &new), 0);
        // A block of new data past half changed goes whole, as the byte walk decided.
        assert_eq!(plan_record(1, Some(&base), &new, base.len() / 2), None);
    }

    fn format(block_size: usize) -> LogFormat {
        LogFormat {
            block_size,
            csum: Csum::V3,
            wide_blocks: true,
            csum_seed: 77,
            uuid: [5; 16],
        }
    }

    /// What a 256-byte inode update looks like: a few scattered bytes in a 4 KiB block.
    fn inode_update(base: &[u8]) -> Vec<u8> {
        let mut new = base.to_vec();
        new[256 + 8..256 + 12].copy_from_slice(&[1, 2, 3, 4]);
        new[256 + 16] ^= 0xFF;
        new[256 + 124..256 + 128].copy_from_slice(&[9, 9, 9, 9]);
        new
    }

    #[test]
    fn records_blocks_round_trip_with_their_layout() {
        for block_size in [1024, 4096, 65536] {
            let f = format(block_size);
            let base: Vec<u8> = (0..block_size).map(|i| (i * 7) as u8).collect();
            let new = inode_update(&base);
            let delta = plan_record(1 << 40, Some(&base), &new, block_size / 2).unwrap();
            assert_eq!(delta.kind, RecordKind::Delta);
            // The two runs 4 bytes apart merge (264..268 and 272..273), the third stays.
            assert_eq!(delta.ranges.len(), 2, "{:?}", delta.ranges);
            let mut sparse = vec![0u8; block_size];
            sparse[block_size - 3..].copy_from_slice(&[1, 2, 3]);
            let zeroed = plan_record(9, None, &sparse, block_size / 2).unwrap();
            let empty = plan_record(10, None, &vec![0u8; block_size], block_size / 2).unwrap();
            let records = vec![delta, zeroed, empty];
            let block = f.encode_records(42, &records);
            assert_eq!(f.header(&block), Some((BlockKind::Records, 42)));
            assert!(f.tail_is_valid(&block));
            assert_eq!(f.decode_records(&block, 3).unwrap(), records);
            // Byte by byte: the first entry's header and its first range's header.
            assert_eq!(u32_at(&block, 4), 0x6A78_7262);
            assert_eq!(u64_at(&block, 16), 1 << 40);
            assert_eq!((block[24], block[25], u16_at(&block, 26)), (1, 0, 2));
            assert_eq!((u16_at(&block, 28), u16_at(&block, 30)), (264, 9));
            let used = u32_at(&block, 12) as usize;
            assert_eq!(
                used,
                16 + records.iter().map(Record::encoded_len).sum::<usize>()
            );
            let mut flipped = block.clone();
            flipped[20] ^= 1;
            assert!(!f.tail_is_valid(&flipped));
        }
    }

    #[test]
    fn applying_a_record_rebuilds_the_block_and_is_idempotent() {
        let base: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
        let new = inode_update(&base);
        let delta = plan_record(1, Some(&base), &new, 2048).unwrap();
        let mut block = base.clone();
        delta.apply(&mut block);
        assert_eq!(block, new);
        delta.apply(&mut block);
        assert_eq!(block, new, "applied twice (recovery run again)");
        let zeroed = plan_record(1, None, &[&[0u8; 4000][..], &[5u8; 96]].concat(), 2048).unwrap();
        assert_eq!(zeroed.kind, RecordKind::Zeroed);
        let mut garbage = vec![0xEEu8; 4096];
        zeroed.apply(&mut garbage);
        assert_eq!(&garbage[..4000], &[0u8; 4000][..]);
        assert_eq!(&garbage[4000..], &[5u8; 96][..]);
    }

    #[test]
    fn a_block_that_changed_too_much_gets_no_record() {
        let base = vec![0u8; 4096];
        let new: Vec<u8> = (0..4096).map(|i| (i % 13 + 1) as u8).collect();
        assert_eq!(plan_record(1, Some(&base), &new, 2048), None);
        // Mostly zeros but changed everywhere from the base: ZEROED wins.
        let base = vec![7u8; 4096];
        let mut new = vec![0u8; 4096];
        new[100] = 1;
        let record = plan_record(1, Some(&base), &new, 2048).unwrap();
        assert_eq!((record.kind, record.payload_len()), (RecordKind::Zeroed, 1));
    }

    #[test]
    fn packing_fills_blocks_in_order_without_splitting_an_entry() {
        let record = |n: usize| Record {
            fs_block: n as u64,
            kind: RecordKind::Delta,
            ranges: vec![Range {
                offset: 0,
                bytes: vec![1; n],
            }],
        };
        let records: Vec<Record> = [400, 500, 100, 900, 8].into_iter().map(record).collect();
        let groups = pack(&records, 1024);
        let sizes: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        assert_eq!(sizes, [2, 1, 2]);
        assert!(groups
            .iter()
            .all(|g| g.iter().map(Record::encoded_len).sum::<usize>() <= records_capacity(1024)));
    }

    #[test]
    fn malformed_entries_are_refused_by_journal_block() {
        let f = format(1024);
        let good = Record {
            fs_block: 5,
            kind: RecordKind::Delta,
            ranges: vec![
                Range {
                    offset: 10,
                    bytes: vec![1; 4],
                },
                Range {
                    offset: 20,
                    bytes: vec![2; 4],
                },
            ],
        };
        let block = f.encode_records(1, std::slice::from_ref(&good));
        let mut cases: Vec<(Vec<u8>, &str)> = Vec::new();
        let mut past = block.clone();
        put_u32(&mut past, USED_OFFSET, 1021);
        cases.push((past, "r_used 1021"));
        let mut short = block.clone();
        put_u32(&mut short, USED_OFFSET, 30);
        cases.push((short, "past r_used 30"));
        let mut kind = block.clone();
        kind[16 + 8] = 9;
        cases.push((kind, "unknown kind 9"));
        let mut outside = block.clone();
        put_u16(&mut outside, 28, 1022);
        cases.push((outside, "outside the 1024-byte block"));
        let mut unordered = block.clone();
        put_u16(&mut unordered, 28 + 8, 11);
        cases.push((unordered, "not after the previous range"));
        for (bytes, needle) in cases {
            let err = f.decode_records(&bytes, 77).unwrap_err().to_string();
            assert!(err.contains("records block at journal block 77"), "{err}");
            assert!(err.contains(needle), "{needle}: {err}");
        }
        let v1 = LogFormat {
            csum: Csum::V1,
            ..f.clone()
        };
        assert!(v1.decode_records(&block, 2).is_err());
    }
}
