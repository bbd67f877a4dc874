//! ext4 fast commits: the tag-length-value records an fsync writes to the journal's
//! fast-commit area instead of committing the whole running transaction (iJournaling's
//! i-transactions, in the form Linux replays). Unlike the rest of JBD2 this is
//! little-endian.
//!
//! Promises: [`FastCommitWriter`] lays records out exactly as Linux 6.x does (no record
//! straddles a block, a block that cannot take the next record ends in a PAD, every fast
//! commit ends in a TAIL that fills the rest of its block); [`scan`] accepts what Linux's
//! `ext4_fc_replay_scan` accepts and keeps what it keeps: the records up to the last TAIL
//! whose tid and CRC match. Pure encoding: no IO, no panics on bad bytes.
//!
//! ```text
//! record: 0 2 fc_tag (le16)  2 2 fc_len (le16, value bytes)  4 .. value
//!   0x1 ADD_RANGE  16  le32 ino; struct ext4_extent (le32 ee_block, le16 ee_len
//!                      (> 32768: unwritten, length ee_len - 32768), le16 ee_start_hi,
//!                      le32 ee_start_lo)
//!   0x2 DEL_RANGE  12  le32 ino, le32 lblk, le32 len
//!   0x3 CREAT      8+n le32 parent_ino, le32 ino, name (1..=255 bytes, no NUL)
//!   0x4 LINK       8+n as CREAT
//!   0x5 UNLINK     8+n as CREAT
//!   0x6 INODE      4+m le32 ino, the raw on-disk inode (128 + i_extra_isize bytes)
//!   0x7 PAD        any zero bytes to the end of the block
//!   0x8 TAIL       8+  le32 tid, le32 crc, zeros to the end of the block
//!   0x9 HEAD       8   le32 features (must be 0), le32 tid
//! crc (in TAIL) = crc32c_raw(0, every record of this fast commit from its first byte,
//!                 PADs included, then the TAIL's 4-byte header and its tid)
//! ```
//!
//! Layout rules (the kernel's `ext4_fc_reserve_space`): a record goes in the current block
//! only if 4 bytes stay free after it (room for a PAD header); otherwise the block ends
//! with a PAD whose value runs to the block's end. The first fast commit after a full
//! commit starts with HEAD{0, tid}; later ones of the same tid start on a fresh block
//! without one. A fast commit is valid only while `tid` is the first transaction after
//! the last one committed in the log.

use super::crc32c_raw;
use crate::tid::Tid;

pub const TAG_ADD_RANGE: u16 = 0x1;
pub const TAG_DEL_RANGE: u16 = 0x2;
pub const TAG_CREAT: u16 = 0x3;
pub const TAG_LINK: u16 = 0x4;
pub const TAG_UNLINK: u16 = 0x5;
pub const TAG_INODE: u16 = 0x6;
pub const TAG_PAD: u16 = 0x7;
pub const TAG_TAIL: u16 = 0x8;
pub const TAG_HEAD: u16 = 0x9;

/// Bytes of a record's tag and length.
pub const RECORD_HEADER: usize = 4;
/// The inode bytes every INODE record carries at least (`EXT4_GOOD_OLD_INODE_SIZE`).
pub const OLD_INODE_SIZE: usize = 128;
/// Longest name a dentry record may carry (`EXT4_NAME_LEN`).
pub const MAX_NAME_LEN: usize = 255;
/// Largest initialised (written) extent, as in the extent tree.
pub const MAX_WRITTEN_LEN: u32 = 32768;
/// Largest unwritten extent.
pub const MAX_UNWRITTEN_LEN: u32 = 32767;

/// The most blocks one ADD_RANGE may map: an extent's limit, which an unwritten one
/// lowers by one (its length field keeps a flag in the top value).
pub fn max_range_len(unwritten: bool) -> u32 {
    if unwritten {
        MAX_UNWRITTEN_LEN
    } else {
        MAX_WRITTEN_LEN
    }
}

/// One record a fast commit carries (HEAD, TAIL and PAD are layout, not content).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FcRecord {
    /// Map `len` blocks from `lblk` of inode `ino` to `pblk..` (replacing what was there).
    AddRange {
        ino: u32,
        lblk: u32,
        len: u32,
        pblk: u64,
        unwritten: bool,
    },
    /// Unmap `len` blocks from `lblk` of inode `ino`.
    DelRange { ino: u32, lblk: u32, len: u32 },
    /// A new inode `ino` named `name` in directory `parent` (its INODE record comes first).
    Creat(Dentry),
    /// One more name for an existing inode.
    Link(Dentry),
    /// A name removed.
    Unlink(Dentry),
    /// The inode's on-disk bytes (128 + i_extra_isize).
    Inode { ino: u32, raw: Vec<u8> },
}

/// The value of CREAT, LINK and UNLINK.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dentry {
    pub parent: u32,
    pub ino: u32,
    pub name: Vec<u8>,
}

impl FcRecord {
    pub(crate) fn tag(&self) -> u16 {
        match self {
            FcRecord::AddRange { .. } => TAG_ADD_RANGE,
            FcRecord::DelRange { .. } => TAG_DEL_RANGE,
            FcRecord::Creat(_) => TAG_CREAT,
            FcRecord::Link(_) => TAG_LINK,
            FcRecord::Unlink(_) => TAG_UNLINK,
            FcRecord::Inode { .. } => TAG_INODE,
        }
    }

    pub(crate) fn value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        match self {
            FcRecord::AddRange {
                ino,
                lblk,
                len,
                pblk,
                unwritten,
            } => {
                let max = max_range_len(*unwritten);
                assert!(*len >= 1 && *len <= max, "ADD_RANGE of {len} blocks");
                assert!(*pblk < 1 << 48, "ADD_RANGE to block {pblk}");
                let ee_len = if *unwritten {
                    len + MAX_WRITTEN_LEN
                } else {
                    *len
                };
                v.extend_from_slice(&ino.to_le_bytes());
                v.extend_from_slice(&lblk.to_le_bytes());
                v.extend_from_slice(&(ee_len as u16).to_le_bytes());
                v.extend_from_slice(&((pblk >> 32) as u16).to_le_bytes());
                v.extend_from_slice(&(*pblk as u32).to_le_bytes());
            }
            FcRecord::DelRange { ino, lblk, len } => {
                for x in [ino, lblk, len] {
                    v.extend_from_slice(&x.to_le_bytes());
                }
            }
            FcRecord::Creat(d) | FcRecord::Link(d) | FcRecord::Unlink(d) => {
                assert!(
                    !d.name.is_empty() && d.name.len() <= MAX_NAME_LEN,
                    "dentry name of {} bytes",
                    d.name.len()
                );
                v.extend_from_slice(&d.parent.to_le_bytes());
                v.extend_from_slice(&d.ino.to_le_bytes());
                v.extend_from_slice(&d.name);
            }
            FcRecord::Inode { ino, raw } => {
                assert!(raw.len() >= OLD_INODE_SIZE, "INODE of {} bytes", raw.len());
                v.extend_from_slice(&ino.to_le_bytes());
                v.extend_from_slice(raw);
            }
        }
        v
    }

    /// Decodes the value of a content record; `None` if its length is wrong for its tag
    /// (the kernel's `ext4_fc_value_len_isvalid`).
    pub(crate) fn decode(tag: u16, value: &[u8], inode_size: usize) -> Option<FcRecord> {
        let le32 = |off: usize| u32::from_le_bytes(value[off..off + 4].try_into().unwrap());
        let le16 = |off: usize| u16::from_le_bytes([value[off], value[off + 1]]);
        let dentry = || {
            let n = value.len().checked_sub(8)?;
            (1..=MAX_NAME_LEN).contains(&n).then(|| Dentry {
                parent: le32(0),
                ino: le32(4),
                name: value[8..].to_vec(),
            })
        };
        match tag {
            TAG_ADD_RANGE if value.len() == 16 => {
                let ee_len = u32::from(le16(8));
                let unwritten = ee_len > MAX_WRITTEN_LEN;
                Some(FcRecord::AddRange {
                    ino: le32(0),
                    lblk: le32(4),
                    len: if unwritten {
                        ee_len - MAX_WRITTEN_LEN
                    } else {
                        ee_len
                    },
                    pblk: u64::from(le16(10)) << 32 | u64::from(le32(12)),
                    unwritten,
                })
            }
            TAG_DEL_RANGE if value.len() == 12 => Some(FcRecord::DelRange {
                ino: le32(0),
                lblk: le32(4),
                len: le32(8),
            }),
            TAG_CREAT => dentry().map(FcRecord::Creat),
            TAG_LINK => dentry().map(FcRecord::Link),
            TAG_UNLINK => dentry().map(FcRecord::Unlink),
            TAG_INODE => {
                let n = value.len().checked_sub(4)?;
                (OLD_INODE_SIZE..=inode_size)
                    .contains(&n)
                    .then(|| FcRecord::Inode {
                        ino: le32(0),
                        raw: value[4..].to_vec(),
                    })
            }
            _ => None,
        }
    }
}

/// Lays out fast commits in blocks of the fast-commit area, carrying the running CRC.
pub struct FastCommitWriter {
    block_size: usize,
    tid: Tid,
    blocks: Vec<Vec<u8>>,
    /// Bytes used in the last block.
    offset: usize,
    crc: u32,
}

impl FastCommitWriter {
    /// A fast commit for transaction `tid`; `first_since_full_commit` adds the HEAD.
    pub fn new(block_size: usize, tid: Tid, first_since_full_commit: bool) -> FastCommitWriter {
        assert!(
            block_size >= 1024,
            "fast-commit block of {block_size} bytes"
        );
        let mut w = FastCommitWriter {
            block_size,
            tid,
            blocks: vec![vec![0; block_size]],
            offset: 0,
            crc: 0,
        };
        if first_since_full_commit {
            let mut head = Vec::with_capacity(8);
            head.extend_from_slice(&0u32.to_le_bytes());
            head.extend_from_slice(&tid.to_le_bytes());
            w.put(TAG_HEAD, &head);
        }
        w
    }

    /// Whether a record with `value_len` value bytes can ever fit a block.
    pub fn fits(&self, value_len: usize) -> bool {
        RECORD_HEADER + value_len + RECORD_HEADER <= self.block_size
    }

    /// Appends one record.
    pub fn push(&mut self, record: &FcRecord) {
        let value = record.value();
        assert!(self.fits(value.len()), "fast-commit record too large");
        self.put(record.tag(), &value);
    }

    /// Ends the fast commit with its TAIL and returns its blocks.
    pub fn finish(mut self) -> Vec<Vec<u8>> {
        self.reserve(RECORD_HEADER + 8);
        let start = self.offset;
        let fill = self.block_size - start - RECORD_HEADER;
        let block = self.blocks.last_mut().expect("a writer always has a block");
        block[start..start + 2].copy_from_slice(&TAG_TAIL.to_le_bytes());
        block[start + 2..start + 4].copy_from_slice(&(fill as u16).to_le_bytes());
        block[start + 4..start + 8].copy_from_slice(&self.tid.to_le_bytes());
        let crc = crc32c_raw(self.crc, &block[start..start + 8]);
        block[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
        self.blocks
    }

    /// Blocks used so far (the TAIL may add one).
    pub fn blocks_so_far(&self) -> usize {
        self.blocks.len()
    }

    fn put(&mut self, tag: u16, value: &[u8]) {
        self.reserve(RECORD_HEADER + value.len());
        let start = self.offset;
        let block = self.blocks.last_mut().expect("a writer always has a block");
        block[start..start + 2].copy_from_slice(&tag.to_le_bytes());
        block[start + 2..start + 4].copy_from_slice(&(value.len() as u16).to_le_bytes());
        block[start + 4..start + 4 + value.len()].copy_from_slice(value);
        let end = start + RECORD_HEADER + value.len();
        self.crc = crc32c_raw(self.crc, &block[start..end]);
        self.offset = end;
    }

    /// Makes room for `len` bytes, keeping 4 bytes free after them; else pads the block
    /// to its end and starts a new one.
    fn reserve(&mut self, len: usize) {
        if self.offset + len + RECORD_HEADER <= self.block_size {
            return;
        }
        let start = self.offset;
        let fill = self.block_size - start - RECORD_HEADER;
        let block = self.blocks.last_mut().expect("a writer always has a block");
        block[start..start + 2].copy_from_slice(&TAG_PAD.to_le_bytes());
        block[start + 2..start + 4].copy_from_slice(&(fill as u16).to_le_bytes());
        self.crc = crc32c_raw(self.crc, &block[start..]);
        self.blocks.push(vec![0; self.block_size]);
        self.offset = 0;
    }
}

/// What [`scan`] found in a fast-commit area.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FastCommitScan {
    /// The records of every valid fast commit, in log order.
    pub records: Vec<FcRecord>,
    /// Fast commits whose TAIL matched.
    pub fast_commits: u32,
    /// Blocks those fast commits occupy from the area's start.
    pub blocks_used: u32,
    /// Why the scan stopped where it did, when it was not the end of the valid commits
    /// that ends every healthy area (a HEAD of another tid, or zeros).
    pub stopped_by: Option<String>,
    /// Data blocks the i-transactions carried (`ijournal=percore`; never in an ext4 fast
    /// commit), in sub-tid order: recovery writes them home after the log's copies.
    pub carried: Vec<crate::format::itransaction::CarriedBlock>,
}

/// Reads the fast-commit area block by block, as the kernel's replay scan does, and keeps
/// the records of every fast commit up to the last TAIL whose tid is `expected_tid` and
/// whose CRC matches. `inode_size` bounds INODE records. Blocks are taken from `blocks`
/// only until the scan stops, so a lazy iterator reads no more than the kernel does.
pub fn scan<B: AsRef<[u8]>>(
    blocks: impl IntoIterator<Item = B>,
    expected_tid: Tid,
    inode_size: usize,
) -> FastCommitScan {
    let mut out = FastCommitScan::default();
    let mut pending: Vec<FcRecord> = Vec::new();
    let mut crc = 0u32;
    for (index, block) in blocks.into_iter().enumerate() {
        let block = block.as_ref();
        if index == 0 && le16(block, 0) != TAG_HEAD {
            return out;
        }
        let mut cur = 0;
        while cur + RECORD_HEADER <= block.len() {
            let (tag, len) = (le16(block, cur), usize::from(le16(block, cur + 2)));
            let value_at = cur + RECORD_HEADER;
            let stop = |why: String| Some(format!("fast-commit block {index}: {why}"));
            if len > block.len() - value_at {
                out.stopped_by = stop(format!("record at {cur} runs past the block"));
                return out;
            }
            let value = &block[value_at..value_at + len];
            match tag {
                TAG_HEAD => {
                    if len != 8 || le32(value, 0) != 0 {
                        out.stopped_by = stop(format!("HEAD at {cur} is not a v0 HEAD"));
                        return out;
                    }
                    if le32(value, 4) != expected_tid {
                        return out;
                    }
                    crc = crc32c_raw(crc, &block[cur..value_at + len]);
                }
                TAG_PAD => crc = crc32c_raw(crc, &block[cur..value_at + len]),
                TAG_TAIL => {
                    if len < 8 {
                        out.stopped_by = stop(format!("TAIL at {cur} is {len} bytes"));
                        return out;
                    }
                    crc = crc32c_raw(crc, &block[cur..value_at + 4]);
                    if le32(value, 0) != expected_tid || le32(value, 4) != crc {
                        if le32(value, 0) == expected_tid {
                            out.stopped_by = stop(format!("TAIL at {cur}: CRC mismatch"));
                        }
                        return out;
                    }
                    out.records.append(&mut pending);
                    out.fast_commits += 1;
                    out.blocks_used = index as u32 + 1;
                    crc = 0;
                }
                _ => match FcRecord::decode(tag, value, inode_size) {
                    Some(record) => {
                        crc = crc32c_raw(crc, &block[cur..value_at + len]);
                        pending.push(record);
                    }
                    None => {
                        out.stopped_by = stop(format!("tag {tag:#x} of {len} bytes at {cur}"));
                        return out;
                    }
                },
            }
            cur = value_at + len;
        }
    }
    out
}

fn le16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<FcRecord> {
        vec![
            FcRecord::Inode {
                ino: 12,
                raw: (0..160).map(|i| i as u8).collect(),
            },
            FcRecord::AddRange {
                ino: 12,
                lblk: 0,
                len: 5,
                pblk: 0x1_0000_1234,
                unwritten: false,
            },
            FcRecord::AddRange {
                ino: 12,
                lblk: 9,
                len: 7,
                pblk: 300,
                unwritten: true,
            },
            FcRecord::DelRange {
                ino: 12,
                lblk: 5,
                len: 4,
            },
            FcRecord::Creat(Dentry {
                parent: 2,
                ino: 12,
                name: b"file".to_vec(),
            }),
            FcRecord::Link(Dentry {
                parent: 11,
                ino: 12,
                name: vec![b'x'; 255],
            }),
            FcRecord::Unlink(Dentry {
                parent: 2,
                ino: 13,
                name: b"gone".to_vec(),
            }),
        ]
    }

    fn write(tid: Tid, head: bool, records: &[FcRecord]) -> Vec<Vec<u8>> {
        let mut w = FastCommitWriter::new(1024, tid, head);
        for r in records {
            w.push(r);
        }
        w.finish()
    }

    fn scan_all(blocks: &[Vec<u8>], tid: Tid) -> FastCommitScan {
        scan(blocks.iter().map(|b| b.as_slice()), tid, 256)
    }

    #[test]
    fn records_round_trip_across_padded_blocks() {
        let records: Vec<FcRecord> = sample().into_iter().cycle().take(40).collect();
        let blocks = write(7, true, &records);
        assert!(
            blocks.len() > 2,
            "40 records must span several 1 KiB blocks"
        );
        let found = scan_all(&blocks, 7);
        assert_eq!(found.records, records);
        assert_eq!(
            (found.fast_commits, found.blocks_used),
            (1, blocks.len() as u32)
        );
        assert_eq!(found.stopped_by, None);
    }

    #[test]
    fn later_fast_commits_of_a_tid_follow_without_a_head() {
        let mut blocks = write(7, true, &sample()[..2]);
        blocks.extend(write(7, false, &sample()[2..]));
        let found = scan_all(&blocks, 7);
        assert_eq!(found.records, sample());
        assert_eq!(found.fast_commits, 2);
    }

    #[test]
    fn a_torn_fast_commit_keeps_the_ones_before_it() {
        let first = write(7, true, &sample()[..3]);
        let mut blocks = first.clone();
        blocks.extend(write(7, false, &sample()[3..]));
        let last = blocks.len() - 1;
        blocks[last][20] ^= 1;
        let found = scan_all(&blocks, 7);
        assert_eq!(found.records, sample()[..3].to_vec());
        assert_eq!(found.blocks_used, first.len() as u32);
        assert!(found.stopped_by.is_some_and(|s| s.contains("CRC")));
    }

    #[test]
    fn fast_commits_of_another_tid_are_not_replayed() {
        let blocks = write(7, true, &sample());
        assert_eq!(scan_all(&blocks, 8).records, vec![]);
        let zeros = vec![vec![0u8; 1024]; 2];
        assert_eq!(scan_all(&zeros, 8), FastCommitScan::default());
    }

    #[test]
    fn tail_fills_its_block_and_pads_leave_four_bytes() {
        let blocks = write(1, true, &sample()[..1]);
        assert_eq!(blocks.len(), 1);
        // HEAD (12 bytes), INODE (4 + 4 + 160), then the TAIL runs to the block's end.
        let tail_at = 12 + 168;
        assert_eq!(le16(&blocks[0], tail_at), TAG_TAIL);
        assert_eq!(
            tail_at + 4 + usize::from(le16(&blocks[0], tail_at + 2)),
            1024
        );
    }
}
