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
//!   writes one only when it knows that state (`crate::commit`): the version an earlier
//!   transaction still in the log logged, or, when the log holds none, the home contents
//!   the block was read with or last checkpointed with. Nothing in the record says which:
//!   recovery rebuilds both the same way, so the format is the same.
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

/// One changed run of bytes: where it goes in the block, and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub offset: usize,
    pub len: usize,
}

/// What one home block becomes when its transaction replays.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub fs_block: u64,
    pub kind: RecordKind,
    pub ranges: Vec<Range>,
    /// The ranges' bytes back to back, in range order: one allocation per record, not
    /// one per range (an inode-table block of new inodes has a hundred ranges, and their
    /// allocations were a sixth of the commit thread's time for 10^6 creates).
    pub bytes: Vec<u8>,
}

impl Record {
    /// Bytes the entry takes in a records block.
    pub fn encoded_len(&self) -> usize {
        ENTRY_HEADER_SIZE + self.ranges.len() * RANGE_HEADER_SIZE + self.bytes.len()
    }

    /// Each range with its bytes.
    pub fn pieces(&self) -> impl Iterator<Item = (usize, &[u8])> {
        let mut at = 0;
        self.ranges.iter().map(move |r| {
            at += r.len;
            (r.offset, &self.bytes[at - r.len..at])
        })
    }

    /// Applies the record to `block` (recovery's state of its home block).
    pub fn apply(&self, block: &mut [u8]) {
        if self.kind == RecordKind::Zeroed {
            block.fill(0);
        }
        for (offset, bytes) in self.pieces() {
            block[offset..offset + bytes.len()].copy_from_slice(bytes);
        }
    }

    /// Bytes of block data the record carries.
    pub fn payload_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Room for entries in one records block of `block_size` bytes.
pub fn records_capacity(block_size: usize) -> usize {
    block_size - RECORDS_HEADER_SIZE - TAIL_SIZE
}

/// The runs where `new` differs from `base` (or, without a base, from zeros), merged when
/// closer than [`MERGE_GAP`], as (start, end). Stops and returns `None` once the entry
/// would take more than `limit` bytes.
///
/// One pass, eight bytes at a time: a word that did not change costs a compare, a word
/// wholly changed extends the run by eight at once, and only the bytes of a partly
/// changed word are visited one by one. Every changed byte is carried, so a block of new
/// data (journaled file data, most of it) is given up after about `limit` bytes, in
/// words; a byte walk of each changed 64-byte chunk was, with a count of the changed
/// bytes before it, most of the commit thread's time for 10^6 creates in one directory.
fn changed_runs(base: Option<&[u8]>, new: &[u8], limit: usize) -> Option<Vec<(usize, usize)>> {
    const LOW_BITS: u64 = 0x0101_0101_0101_0101;
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut size = ENTRY_HEADER_SIZE;
    // Carries bytes `from..to` (all changed, or the last one is) in the runs.
    let mut carry = |runs: &mut Vec<(usize, usize)>, from: usize, to: usize| match runs.last_mut() {
        Some(last) if from - last.1 <= MERGE_GAP => {
            size += to - last.1;
            last.1 = to;
            size
        }
        _ => {
            size += RANGE_HEADER_SIZE + to - from;
            runs.push((from, to));
            size
        }
    };
    for (w, diff) in diff_words(base, new).enumerate() {
        if diff == 0 {
            continue;
        }
        let at = w * 8;
        // One bit per changed byte, at the byte's lowest bit.
        let mut changed = diff | diff >> 4;
        changed |= changed >> 2;
        changed |= changed >> 1;
        changed &= LOW_BITS;
        let size = if changed == LOW_BITS && at + 8 <= new.len() {
            carry(&mut runs, at, at + 8)
        } else {
            let mut size = 0;
            while changed != 0 {
                let i = at + (changed.trailing_zeros() / 8) as usize;
                changed &= changed - 1;
                size = carry(&mut runs, i, i + 1);
                if size > limit {
                    break;
                }
            }
            size
        };
        if size > limit {
            return None;
        }
    }
    Some(runs)
}

/// `new` XOR `base` (or zeros) eight bytes at a time, little-endian, so that byte `k` of
/// word `w` is byte `w * 8 + k` of the block; a last short word is padded with zeros on
/// both sides (it differs nowhere there).
fn diff_words<'a>(base: Option<&'a [u8]>, new: &'a [u8]) -> impl Iterator<Item = u64> + 'a {
    let word = |bytes: &[u8]| match <[u8; 8]>::try_from(bytes) {
        Ok(whole) => u64::from_le_bytes(whole),
        Err(_) => {
            let mut w = [0u8; 8];
            w[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(w)
        }
    };
    new.chunks(8).enumerate().map(move |(i, chunk)| {
        let other = base.map_or(0, |base| word(&base[i * 8..i * 8 + chunk.len()]));
        word(chunk) ^ other
    })
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
    let mut bytes = Vec::with_capacity(runs.iter().map(|(s, e)| e - s).sum());
    let ranges = runs
        .into_iter()
        .map(|(start, end)| {
            bytes.extend_from_slice(&new[start..end]);
            Range {
                offset: start,
                len: end - start,
            }
        })
        .collect();
    Some(Record {
        fs_block,
        kind,
        ranges,
        bytes,
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
        let end = self.block_size - TAIL_SIZE;
        let used = self.put_entries(&mut block, RECORDS_HEADER_SIZE, end, records);
        put_u32(&mut block, USED_OFFSET, used as u32);
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
        read_entries(
            &block[..used],
            RECORDS_HEADER_SIZE,
            self.block_size,
            "r_used",
            bad,
        )
    }
}

impl LogFormat {
    /// Writes `records` as entries into `block` from byte `at` on, asserting they end by
    /// byte `end`; returns the byte after the last.
    pub(super) fn put_entries(
        &self,
        block: &mut [u8],
        mut at: usize,
        end: usize,
        records: &[Record],
    ) -> usize {
        for record in records {
            assert!(
                at + record.encoded_len() <= end,
                "records overflow their block"
            );
            put_u64(block, at, record.fs_block);
            block[at + 8] = match record.kind {
                RecordKind::Delta => KIND_DELTA,
                RecordKind::Zeroed => KIND_ZEROED,
            };
            put_u16(block, at + 10, record.ranges.len() as u16);
            at += ENTRY_HEADER_SIZE;
            for (offset, bytes) in record.pieces() {
                assert!(!bytes.is_empty() && offset + bytes.len() <= self.block_size);
                put_u16(block, at, offset as u16);
                put_u16(block, at + 2, bytes.len() as u16);
                at += RANGE_HEADER_SIZE;
                block[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
        }
        at
    }
}

/// The entries in `used[at..]` (a block cut at its used length, which the header field
/// `used_field` gives), for home blocks of `block_size` bytes; `bad` makes the error.
pub(super) fn read_entries(
    used: &[u8],
    mut at: usize,
    block_size: usize,
    used_field: &str,
    bad: impl Fn(String) -> JournalError,
) -> Result<Vec<Record>, JournalError> {
    let end = used.len();
    let mut records = Vec::new();
    while at < end {
        if at + ENTRY_HEADER_SIZE > end {
            return Err(bad(format!(
                "entry at byte {at} runs past {used_field} {end}"
            )));
        }
        let fs_block = u64_at(used, at);
        let kind = match used[at + 8] {
            KIND_DELTA => RecordKind::Delta,
            KIND_ZEROED => RecordKind::Zeroed,
            other => {
                return Err(bad(format!(
                    "entry at byte {at} (block {fs_block}) has unknown kind {other}"
                )))
            }
        };
        let count = u16_at(used, at + 10);
        at += ENTRY_HEADER_SIZE;
        let mut ranges: Vec<Range> = Vec::with_capacity(usize::from(count));
        let mut bytes = Vec::new();
        for _ in 0..count {
            if at + RANGE_HEADER_SIZE > end {
                return Err(bad(format!(
                    "a range of block {fs_block} runs past {used_field} {end}"
                )));
            }
            let offset = usize::from(u16_at(used, at));
            let len = usize::from(u16_at(used, at + 2));
            at += RANGE_HEADER_SIZE;
            let after_previous = ranges.last().is_none_or(|r| offset >= r.offset + r.len);
            if len == 0 || offset + len > block_size || !after_previous {
                return Err(bad(format!(
                    "range {offset}+{len} of block {fs_block} is empty, outside the \
                     {block_size}-byte block or not after the previous range"
                )));
            }
            if at + len > end {
                return Err(bad(format!(
                    "the bytes of range {offset}+{len} of block {fs_block} run past \
                     {used_field} {end}"
                )));
            }
            ranges.push(Range { offset, len });
            bytes.extend_from_slice(&used[at..at + len]);
            at += len;
        }
        records.push(Record {
            fs_block,
            kind,
            ranges,
            bytes,
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::blocks::{BlockKind, Csum};

    #[test]
    fn changed_runs_match_a_byte_walk() {
        // The byte walk the word-wise version replaced, as the reference.
        let walk = |base: Option<&[u8]>, new: &[u8], limit: usize| {
            let mut runs: Vec<(usize, usize)> = Vec::new();
            let mut size = ENTRY_HEADER_SIZE;
            for i in (0..new.len()).filter(|&i| new[i] != base.map_or(0, |b| b[i])) {
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
            Some(runs)
        };
        let base: Vec<u8> = (0..1003u32).map(|i| (i * 37 % 251) as u8).collect();
        // Changes at word edges, gaps of exactly MERGE_GAP and one more, a change in the
        // short last word, and sparse bytes as an inode-table block has them.
        let patterns: [&dyn Fn(usize) -> bool; 4] = [
            &|i| i % 8 == 7 || i % 8 == 0,
            &|i| i % (MERGE_GAP + 1) == 0 || i % (MERGE_GAP + 2) == 0,
            &|i| i >= 1000,
            &|i| i % 97 < 3,
        ];
        for changed in patterns {
            let mut new = base.clone();
            for (_, byte) in new.iter_mut().enumerate().filter(|(i, _)| changed(*i)) {
                *byte ^= 0x5A;
            }
            for limit in [16, 200, 700, 1003, 4096] {
                assert_eq!(
                    changed_runs(Some(&base), &new, limit),
                    walk(Some(&base), &new, limit)
                );
                assert_eq!(changed_runs(None, &new, limit), walk(None, &new, limit));
            }
        }
        // Wholly changed words next to partly changed ones, and a block of new data
        // past half changed, which goes whole.
        let mut new = base.clone();
        for (_, byte) in new
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| i % 64 < 40 || i % 7 == 0)
        {
            *byte ^= 0xFF;
        }
        for limit in [16, 700, 1003, 4096] {
            assert_eq!(
                changed_runs(Some(&base), &new, limit),
                walk(Some(&base), &new, limit)
            );
        }
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
            ranges: vec![Range { offset: 0, len: n }],
            bytes: vec![1; n],
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
            ranges: vec![Range { offset: 10, len: 4 }, Range { offset: 20, len: 4 }],
            bytes: [[1; 4], [2; 4]].concat(),
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
