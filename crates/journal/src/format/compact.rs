//! jext's compact commit block: a whole small transaction's log metadata in one block —
//! the tags of its whole copies, its byte records and its commit — written before the
//! copies in the one write of a single-I/O commit. A 4 KiB append + fsync then logs two
//! blocks (this one and the data) where descriptor, copy, records block and commit block
//! took four.
//!
//! Why the commit may come first: in a single-I/O log no block vouches for another by its
//! place in the write. Recovery counts a transaction only when every block of it checks
//! (`crate::recovery`), this block by its tail and each copy by its tag's checksum, which
//! is seeded with the tid, so neither a torn copy nor an older lap's block at its place
//! passes. Written only into logs whose superblock carries `JEXT_SINGLE_IO` (and, when it
//! holds records, `JEXT_RECORDS`), so Linux refuses such a log rather than stopping its
//! scan here; recovery refuses the block type in any other log.
//!
//! ```text
//! compact commit block (blocktype 0x6A78_6363 "jxcc"), big-endian, checksum v3 logs only:
//!   0x00 4  h_magic        0xC03B3998
//!   0x04 4  h_blocktype    0x6A786363
//!   0x08 4  h_sequence     tid of the transaction
//!   0x0C 4  c_durable      every transaction up to this tid was durable (flushed) before
//!                          this block was written (the single-I/O commit block's field)
//!   0x10 8  c_commit_sec   commit time, seconds
//!   0x18 4  c_commit_nsec
//!   0x1C 2  c_copies       whole copies that follow this block in the log, in tag order
//!   0x1E 2  c_reserved     0
//!   0x20 4  c_used         bytes used, this 36-byte header, the tags and the records
//!   0x24 .. c_copies tags, 16 bytes each:
//!     0 8  t_block         home block (file system block number)
//!     8 4  t_flags         1 ESCAPE (the copy's first 4 bytes were the magic, logged as 0)
//!    12 4  t_checksum      crc32c_raw(crc32c_raw(csum_seed, be32 tid), copy as logged),
//!                          the descriptor tag's checksum under CSUM_V3
//!   then byte-record entries (`super::records`' entry format), up to c_used
//!   last 4  crc32c_raw(csum_seed, whole block with these 4 bytes zeroed)
//! ```
//!
//! Promises: the decoder refuses (naming the journal block) a count or length that runs
//! past the block and anything the records decoder refuses, and never panics on bytes;
//! the encoder asserts that what it is given fits ([`LogFormat::compact_fits`] says so
//! first). Nothing here reads or writes a device.

use super::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::blocks::{CommitBlock, Csum, LogFormat, Tag, FLAG_ESCAPE};
use super::records::{read_entries, Record};
use crate::tid::Tid;
use crate::JournalError;

/// The block type of a compact commit block ("jxcc").
pub const BLOCKTYPE_JEXT_COMPACT: u32 = 0x6A78_6363;
const DURABLE: usize = 0x0C;
const COMMIT_SEC: usize = 0x10;
const COMMIT_NSEC: usize = 0x18;
const COPIES: usize = 0x1C;
const USED: usize = 0x20;
const HEADER_SIZE: usize = 0x24;
const TAG_SIZE: usize = 16;
const TAIL_SIZE: usize = 4;

/// What a compact commit block says: the transaction's commit, the tags of the copies
/// after it, and its byte records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactCommit {
    pub commit: CommitBlock,
    pub tags: Vec<Tag>,
    pub records: Vec<Record>,
}

impl LogFormat {
    /// Whether `copies` whole copies and `records` fit one compact commit block of this
    /// log (which must keep checksum v3: the tags' checksums are what vouch for the copies).
    pub fn compact_fits(&self, copies: usize, records: &[Record]) -> bool {
        let used = HEADER_SIZE
            + copies * TAG_SIZE
            + records.iter().map(Record::encoded_len).sum::<usize>();
        self.csum == Csum::V3
            && copies <= usize::from(u16::MAX)
            && used + TAIL_SIZE <= self.block_size
    }

    /// The compact commit block of transaction `tid`. `compact.commit.jext_durable` must be
    /// given: a single-I/O commit always says what was durable before it.
    pub fn encode_compact(&self, tid: Tid, compact: &CompactCommit) -> Vec<u8> {
        assert!(
            self.compact_fits(compact.tags.len(), &compact.records),
            "a compact commit of {} copies and {} records does not fit a {}-byte block of \
             this log",
            compact.tags.len(),
            compact.records.len(),
            self.block_size
        );
        let durable = compact
            .commit
            .jext_durable
            .expect("a compact commit says what was durable before it");
        let mut block = self.new_block(BLOCKTYPE_JEXT_COMPACT, tid);
        put_u32(&mut block, DURABLE, durable);
        put_u64(&mut block, COMMIT_SEC, compact.commit.commit_sec);
        put_u32(&mut block, COMMIT_NSEC, compact.commit.commit_nsec);
        put_u16(&mut block, COPIES, compact.tags.len() as u16);
        let mut at = HEADER_SIZE;
        for tag in &compact.tags {
            put_u64(&mut block, at, tag.fs_block);
            put_u32(
                &mut block,
                at + 8,
                if tag.escaped { FLAG_ESCAPE } else { 0 },
            );
            put_u32(&mut block, at + 12, tag.checksum);
            at += TAG_SIZE;
        }
        let end = self.block_size - TAIL_SIZE;
        let used = self.put_entries(&mut block, at, end, &compact.records);
        put_u32(&mut block, USED, used as u32);
        self.set_tail(&mut block);
        block
    }

    /// What a compact commit block at `journal_block` says. Its tail checksum is checked
    /// separately ([`LogFormat::tail_is_valid`]), as for every other block of the log.
    pub fn decode_compact(
        &self,
        block: &[u8],
        journal_block: u32,
    ) -> Result<CompactCommit, JournalError> {
        let bad = |problem: String| JournalError::Corrupt {
            structure: "compact commit block",
            journal_block,
            problem,
        };
        if self.csum != Csum::V3 {
            return Err(bad("a compact commit in a log without checksum v3".into()));
        }
        let copies = usize::from(u16_at(block, COPIES));
        let used = u32_at(block, USED) as usize;
        let tags_end = HEADER_SIZE + copies * TAG_SIZE;
        let limit = self.block_size - TAIL_SIZE;
        if !(tags_end..=limit).contains(&used) {
            return Err(bad(format!(
                "c_used {used} is outside {tags_end}..={limit} ({copies} copies)"
            )));
        }
        let tags = (0..copies)
            .map(|i| {
                let at = HEADER_SIZE + i * TAG_SIZE;
                Tag {
                    fs_block: u64_at(block, at),
                    escaped: u32_at(block, at + 8) & FLAG_ESCAPE != 0,
                    checksum: u32_at(block, at + 12),
                }
            })
            .collect();
        let records = read_entries(&block[..used], tags_end, self.block_size, "c_used", bad)?;
        let commit = CommitBlock {
            commit_sec: u64_at(block, COMMIT_SEC),
            commit_nsec: u32_at(block, COMMIT_NSEC),
            jext_durable: Some(u32_at(block, DURABLE)),
        };
        Ok(CompactCommit {
            commit,
            tags,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::blocks::BlockKind;
    use crate::format::records::{Range, RecordKind};

    fn v3() -> LogFormat {
        LogFormat {
            block_size: 4096,
            csum: Csum::V3,
            wide_blocks: true,
            csum_seed: 0x1234_5678,
            uuid: [7; 16],
        }
    }

    fn record(fs_block: u64, offset: usize, bytes: &[u8]) -> Record {
        Record {
            fs_block,
            kind: RecordKind::Delta,
            ranges: vec![Range {
                offset,
                len: bytes.len(),
            }],
            bytes: bytes.to_vec(),
        }
    }

    fn sample() -> CompactCommit {
        CompactCommit {
            commit: CommitBlock {
                commit_sec: 1_764_000_000,
                commit_nsec: 123_456_789,
                jext_durable: Some(41),
            },
            tags: vec![
                Tag {
                    fs_block: 1 << 33 | 5,
                    escaped: true,
                    checksum: 0xDEAD_BEEF,
                },
                Tag {
                    fs_block: 9000,
                    escaped: false,
                    checksum: 7,
                },
            ],
            records: vec![record(300, 128, &[1, 2, 3]), record(301, 4090, &[9; 6])],
        }
    }

    #[test]
    fn compact_commits_round_trip_and_check_themselves() {
        let f = v3();
        let compact = sample();
        let block = f.encode_compact(42, &compact);
        assert_eq!(f.header(&block), Some((BlockKind::Compact, 42)));
        assert!(f.tail_is_valid(&block));
        assert_eq!(f.decode_compact(&block, 10).unwrap(), compact);
        let mut torn = block.clone();
        torn[4000] ^= 1;
        assert!(!f.tail_is_valid(&torn), "a flipped byte must fail the tail");
        // No records, no copies: a transaction of nothing but byte records is the common
        // case the other way round; both ends must decode.
        for (tags, records) in [(vec![], sample().records), (sample().tags, vec![])] {
            let c = CompactCommit {
                tags,
                records,
                ..sample()
            };
            assert_eq!(f.decode_compact(&f.encode_compact(9, &c), 3).unwrap(), c);
        }
    }

    #[test]
    fn compact_fits_exactly_what_the_block_holds() {
        let f = v3();
        let room = f.block_size - HEADER_SIZE - TAIL_SIZE;
        let most = room / TAG_SIZE;
        assert!(f.compact_fits(most, &[]));
        assert!(!f.compact_fits(most + 1, &[]));
        let tags = (0..most as u64)
            .map(|fs_block| Tag {
                fs_block,
                escaped: false,
                checksum: fs_block as u32,
            })
            .collect();
        let full = CompactCommit {
            tags,
            records: vec![],
            ..sample()
        };
        assert_eq!(
            f.decode_compact(&f.encode_compact(1, &full), 0).unwrap(),
            full
        );
        let v2 = LogFormat {
            csum: Csum::V2,
            ..v3()
        };
        assert!(!v2.compact_fits(1, &[]), "only v3 tags vouch for a copy");
    }

    #[test]
    fn decoding_refuses_what_runs_past_the_block() {
        let f = v3();
        let block = f.encode_compact(42, &sample());
        let mut cases = Vec::new();
        let mut many = block.clone();
        put_u16(&mut many, COPIES, 300);
        cases.push((many, "300 copies"));
        let mut long = block.clone();
        put_u32(&mut long, USED, 4093);
        cases.push((long, "c_used 4093"));
        let mut short = block.clone();
        put_u32(
            &mut short,
            USED,
            HEADER_SIZE as u32 + 2 * TAG_SIZE as u32 + 5,
        );
        cases.push((short, "past c_used"));
        for (bytes, expected) in cases {
            let err = f.decode_compact(&bytes, 77).unwrap_err().to_string();
            assert!(
                err.contains(expected) && err.contains("77"),
                "{expected:?} not in {err:?}"
            );
        }
        let v2 = LogFormat {
            csum: Csum::V2,
            ..v3()
        };
        assert!(v2.decode_compact(&block, 1).is_err());
    }
}
