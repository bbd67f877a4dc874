//! jext-private i-transactions (`ijournal=percore`, iJournaling's per-core areas): one
//! fsync's fast-commit records in one ring of the fast-commit region, with the paper's
//! sub-transaction id. Linux cannot read these: the journal superblock carries
//! [`crate::format::superblock::INCOMPAT_JEXT_PERCORE`] while any ring may hold live ones,
//! so Linux refuses the journal instead of misreading it. Little-endian, as fast commits.
//!
//! Promises: [`encode`] and [`decode`] are inverses; [`decode`] accepts an i-transaction
//! only if its header is sane and its CRC covers every byte of every block it claims, so
//! a torn write of any of its blocks is refused; [`in_order`] keeps exactly the
//! i-transactions of one tid from its first sub-tid up to the first missing one. Pure
//! encoding: no IO, no panics on bad bytes.
//!
//! ```text
//! header (the start of the i-transaction's first block)
//! off size field
//! 0x00 4   magic          0x5449786A ("jxIT")
//! 0x04 2   version        2 (1: no data blocks, the header ends at 0x28)
//! 0x06 1   ring           ring index, < nr_rings
//! 0x07 1   nr_rings       rings the region was split into (1..=8)
//! 0x08 4   tid            the running transaction the records belong to
//! 0x0C 4   nr_blocks      blocks of this i-transaction, its header block and its data
//!                         blocks included (>= 1 + nr_data)
//! 0x10 8   sub_tid        global counter taken when the fsync planned it
//! 0x18 8   first_sub_tid  the sub_tid of the first fsync planned in this tid
//! 0x20 4   payload_len    bytes of records after the header
//! 0x24 4   crc            crc32c_raw(!0, all nr_blocks blocks with this field zero)
//! 0x28 4   nr_data        data blocks carried (version 2)
//! 0x2C 4   reserved       zero
//! 0x30 ..  payload        the records, each as in a fast commit (le16 tag, le16 len,
//!                         value: see format/fast_commit.rs), back to back, running on
//!                         into the next blocks
//!     ..   data homes     nr_data le64 file system block numbers, right after the
//!                         records; then zeros to the end of the record blocks
//! then     data blocks    nr_data whole blocks, the i-th the contents of the i-th home
//! ```
//!
//! Data blocks are what a file that journals its data (`data=journal`, `chattr +j`, or
//! journaling in memory for its small syncs) changed in the i-transaction's tid: the
//! fsync's one write carries them, so no write in place and no flush for it precede the
//! i-transaction. Recovery writes them home after the full journal's copies, in sub-tid
//! order (a later one wins), before the records replay.
//!
//! A ring is `region_blocks / nr_rings` blocks; ring `r` starts `r` rings into the
//! region. Each ring is a sequence of i-transactions from its first block, restarted at
//! its first block by the first i-transaction of a new tid. An i-transaction counts at
//! recovery only while its tid is the first one not in the log; those of that tid replay
//! in sub-tid order from `first_sub_tid` and stop at the first sub-tid not found.

use super::crc32c_raw;
use super::fast_commit::{FcRecord, RECORD_HEADER};
use crate::tid::Tid;
use std::sync::Arc;

pub const MAGIC: u32 = 0x5449_786A;
pub const VERSION: u16 = 2;
/// The version before data blocks, still read: a crash may leave its i-transactions live.
const VERSION_RECORDS_ONLY: u16 = 1;
pub const HEADER_SIZE: usize = 0x30;
const HEADER_SIZE_RECORDS_ONLY: usize = 0x28;
const CRC_OFFSET: usize = 0x24;
const HOME_SIZE: usize = 8;
/// The most rings the region is split into.
pub const MAX_RINGS: u32 = 8;

/// One i-transaction: one fsync's records, and the data blocks it carries, in one ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ITransaction {
    pub ring: u8,
    pub nr_rings: u8,
    pub tid: Tid,
    pub sub_tid: u64,
    pub first_sub_tid: u64,
    pub records: Vec<FcRecord>,
    pub data: Vec<CarriedBlock>,
}

/// A file system block's contents, carried to be written home at recovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CarriedBlock {
    pub home: u64,
    /// Exactly one block.
    pub bytes: Arc<[u8]>,
}

/// The fixed fields of an i-transaction's first block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ring: u8,
    pub nr_rings: u8,
    pub tid: Tid,
    pub nr_blocks: u32,
    pub sub_tid: u64,
    pub first_sub_tid: u64,
    pub payload_len: u32,
    pub crc: u32,
    pub nr_data: u32,
    /// Where the records start (the header's size in its version).
    header_size: usize,
}

impl Header {
    /// Blocks holding the header, the records and the homes: those before the data.
    fn record_blocks(&self) -> u32 {
        self.nr_blocks - self.nr_data
    }
}

/// The blocks of `it`, header first and its data last, ready to write at the ring's head.
pub fn encode(it: &ITransaction, block_size: usize) -> Vec<Arc<[u8]>> {
    assert!(
        it.ring < it.nr_rings && u32::from(it.nr_rings) <= MAX_RINGS,
        "ring {} of {}",
        it.ring,
        it.nr_rings
    );
    assert!(
        it.data.iter().all(|d| d.bytes.len() == block_size),
        "a carried block is one block"
    );
    let mut bytes = vec![0u8; HEADER_SIZE];
    for record in &it.records {
        let value = record.value();
        let len = u16::try_from(value.len()).expect("a record value fits 16 bits");
        bytes.extend_from_slice(&record.tag().to_le_bytes());
        bytes.extend_from_slice(&len.to_le_bytes());
        bytes.extend_from_slice(&value);
    }
    let payload_len = (bytes.len() - HEADER_SIZE) as u32;
    for carried in &it.data {
        bytes.extend_from_slice(&carried.home.to_le_bytes());
    }
    let record_blocks = bytes.len().div_ceil(block_size);
    bytes.resize(record_blocks * block_size, 0);
    let nr_data = it.data.len() as u32;
    put32(&mut bytes, 0x00, MAGIC);
    bytes[0x04..0x06].copy_from_slice(&VERSION.to_le_bytes());
    bytes[0x06] = it.ring;
    bytes[0x07] = it.nr_rings;
    put32(&mut bytes, 0x08, it.tid);
    put32(&mut bytes, 0x0C, record_blocks as u32 + nr_data);
    bytes[0x10..0x18].copy_from_slice(&it.sub_tid.to_le_bytes());
    bytes[0x18..0x20].copy_from_slice(&it.first_sub_tid.to_le_bytes());
    put32(&mut bytes, 0x20, payload_len);
    put32(&mut bytes, 0x28, nr_data);
    let crc = it
        .data
        .iter()
        .fold(crc32c_raw(!0, &bytes), |crc, d| crc32c_raw(crc, &d.bytes));
    put32(&mut bytes, CRC_OFFSET, crc);
    let mut blocks: Vec<Arc<[u8]>> = bytes.chunks(block_size).map(Arc::from).collect();
    blocks.extend(it.data.iter().map(|d| d.bytes.clone()));
    blocks
}

/// The header of a block that may start an i-transaction; `None` if it does not (no
/// magic, an unknown version, impossible sizes for `block_size`). The CRC is checked by
/// [`decode`], once the blocks it covers are read.
pub fn decode_header(block: &[u8], block_size: usize) -> Option<Header> {
    if block.len() < HEADER_SIZE || le32(block, 0x00) != MAGIC {
        return None;
    }
    let (header_size, nr_data) = match u16::from_le_bytes([block[0x04], block[0x05]]) {
        VERSION => (HEADER_SIZE, le32(block, 0x28)),
        VERSION_RECORDS_ONLY => (HEADER_SIZE_RECORDS_ONLY, 0),
        _ => return None,
    };
    let header = Header {
        ring: block[0x06],
        nr_rings: block[0x07],
        tid: le32(block, 0x08),
        nr_blocks: le32(block, 0x0C),
        sub_tid: le64(block, 0x10),
        first_sub_tid: le64(block, 0x18),
        payload_len: le32(block, 0x20),
        crc: le32(block, CRC_OFFSET),
        nr_data,
        header_size,
    };
    if header.nr_blocks <= header.nr_data {
        return None;
    }
    let used = header_size as u64
        + u64::from(header.payload_len)
        + u64::from(header.nr_data) * HOME_SIZE as u64;
    let room = u64::from(header.record_blocks()) * block_size as u64;
    let sane = header.ring < header.nr_rings
        && u32::from(header.nr_rings) <= MAX_RINGS
        && used <= room
        && room - used < block_size as u64
        && header.first_sub_tid <= header.sub_tid;
    sane.then_some(header)
}

/// Decodes the i-transaction whose `header` came from the first of `blocks` (exactly
/// `header.nr_blocks` blocks); `Err` says why it does not count (CRC, a bad record).
/// `inode_size` bounds INODE records.
pub fn decode<B: AsRef<[u8]>>(
    header: &Header,
    blocks: &[B],
    inode_size: usize,
) -> Result<ITransaction, String> {
    if blocks.len() != header.nr_blocks as usize {
        return Err(format!(
            "{} blocks, the header says {}",
            blocks.len(),
            header.nr_blocks
        ));
    }
    let (record_blocks, data_blocks) = blocks.split_at(header.record_blocks() as usize);
    let mut bytes: Vec<u8> = record_blocks
        .iter()
        .flat_map(|b| b.as_ref().to_vec())
        .collect();
    put32(&mut bytes, CRC_OFFSET, 0);
    let crc = data_blocks
        .iter()
        .fold(crc32c_raw(!0, &bytes), |crc, b| crc32c_raw(crc, b.as_ref()));
    if crc != header.crc {
        return Err(format!(
            "CRC {crc:#010x}, the header says {:#010x} (torn or stale)",
            header.crc
        ));
    }
    let records_end = header.header_size + header.payload_len as usize;
    let homes = bytes[records_end..]
        .chunks_exact(HOME_SIZE)
        .map(|h| u64::from_le_bytes(h.try_into().expect("eight bytes")));
    let data = homes
        .zip(data_blocks)
        .map(|(home, b)| CarriedBlock {
            home,
            bytes: Arc::from(b.as_ref()),
        })
        .collect();
    Ok(ITransaction {
        ring: header.ring,
        nr_rings: header.nr_rings,
        tid: header.tid,
        sub_tid: header.sub_tid,
        first_sub_tid: header.first_sub_tid,
        records: decode_records(&bytes[header.header_size..records_end], inode_size)?,
        data,
    })
}

fn decode_records(payload: &[u8], inode_size: usize) -> Result<Vec<FcRecord>, String> {
    let mut records = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        if at + RECORD_HEADER > payload.len() {
            return Err(format!(
                "record header at payload byte {at} runs past the end"
            ));
        }
        let tag = u16::from_le_bytes([payload[at], payload[at + 1]]);
        let len = usize::from(u16::from_le_bytes([payload[at + 2], payload[at + 3]]));
        let value_at = at + RECORD_HEADER;
        let value = payload
            .get(value_at..value_at + len)
            .ok_or_else(|| format!("record at payload byte {at} runs past the end"))?;
        let record = FcRecord::decode(tag, value, inode_size)
            .ok_or_else(|| format!("tag {tag:#x} of {len} bytes at payload byte {at}"))?;
        records.push(record);
        at = value_at + len;
    }
    Ok(records)
}

/// What [`in_order`] kept of one tid's i-transactions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InOrder {
    /// The i-transactions to replay, in sub-tid order.
    pub kept: Vec<ITransaction>,
    /// Why later ones were left (the first missing sub-tid), if any were.
    pub stopped_by: Option<String>,
}

/// Sorts the valid i-transactions of one tid by sub-tid and keeps them from the tid's
/// first sub-tid up to the first one missing (an fsync that had not returned: every
/// later one waited for it, so none of them returned either). `Err` if they disagree
/// on the first sub-tid or one sub-tid appears twice: that no crash can produce.
pub fn in_order(mut found: Vec<ITransaction>) -> Result<InOrder, String> {
    found.sort_by_key(|it| it.sub_tid);
    let Some(first) = found.first().map(|it| it.first_sub_tid) else {
        return Ok(InOrder::default());
    };
    if let Some(odd) = found.iter().find(|it| it.first_sub_tid != first) {
        return Err(format!(
            "sub-tid {} of tid {} says the tid's first sub-tid is {}, another says {first}",
            odd.sub_tid, odd.tid, odd.first_sub_tid
        ));
    }
    if let Some(pair) = found.windows(2).find(|w| w[0].sub_tid == w[1].sub_tid) {
        return Err(format!(
            "sub-tid {} of tid {} is in ring {} and ring {}",
            pair[0].sub_tid, pair[0].tid, pair[0].ring, pair[1].ring
        ));
    }
    let mut out = InOrder::default();
    for (expected, it) in (first..).zip(found) {
        if it.sub_tid != expected {
            out.stopped_by = Some(format!(
                "sub-tid {expected} is missing: sub-tid {} and later are not replayed",
                it.sub_tid
            ));
            break;
        }
        out.kept.push(it);
    }
    Ok(out)
}

/// Ring `ring` of `nr_rings` in a region of `region_blocks` blocks starting at journal
/// block `region_first`: (first journal block, blocks). Rings are equal; what is left
/// over at the region's end stays unused.
pub fn ring_bounds(region_first: u32, region_blocks: u32, nr_rings: u32, ring: u32) -> (u32, u32) {
    assert!(
        ring < nr_rings && nr_rings >= 1,
        "ring {ring} of {nr_rings}"
    );
    let len = region_blocks / nr_rings;
    (region_first + ring * len, len)
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn le32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn le64(b: &[u8], off: usize) -> u64 {
    u64::from(le32(b, off)) | u64::from(le32(b, off + 4)) << 32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::fast_commit::Dentry;

    fn records(n: usize) -> Vec<FcRecord> {
        (0..n)
            .map(|i| match i % 3 {
                0 => FcRecord::Inode {
                    ino: 12 + i as u32,
                    raw: (0..160).map(|b| (b + i) as u8).collect(),
                },
                1 => FcRecord::AddRange {
                    ino: 12,
                    lblk: i as u32,
                    len: 3,
                    pblk: 0x1_0000_0000 + i as u64,
                    unwritten: i % 2 == 0,
                },
                _ => FcRecord::Unlink(Dentry {
                    parent: 2,
                    ino: 40 + i as u32,
                    name: vec![b'n'; 1 + i % 255],
                }),
            })
            .collect()
    }

    fn it(sub_tid: u64, n: usize) -> ITransaction {
        ITransaction {
            ring: 1,
            nr_rings: 3,
            tid: 77,
            sub_tid,
            first_sub_tid: 5,
            records: records(n),
            data: Vec::new(),
        }
    }

    fn with_data(mut it: ITransaction, n: usize) -> ITransaction {
        it.data = (0..n)
            .map(|i| CarriedBlock {
                home: 9000 + i as u64 * 7,
                bytes: (0..1024).map(|b| (b * 3 + i) as u8).collect(),
            })
            .collect();
        it
    }

    fn round_trip(it: &ITransaction) -> Result<ITransaction, String> {
        let blocks = encode(it, 1024);
        let header = decode_header(&blocks[0], 1024).ok_or("no header")?;
        assert_eq!(header.nr_blocks as usize, blocks.len());
        decode(&header, &blocks, 256)
    }

    #[test]
    fn round_trips_in_one_block_and_across_many() {
        let small = it(5, 1);
        assert_eq!(encode(&small, 1024).len(), 1);
        assert_eq!(round_trip(&small).unwrap(), small);
        let large = it(9, 40);
        assert!(encode(&large, 1024).len() > 3);
        assert_eq!(round_trip(&large).unwrap(), large);
        let empty = it(6, 0);
        assert_eq!(round_trip(&empty).unwrap(), empty);
    }

    #[test]
    fn data_blocks_follow_the_records_and_round_trip() {
        let small = with_data(it(5, 1), 2);
        let blocks = encode(&small, 1024);
        assert_eq!(
            blocks.len(),
            3,
            "one record block, then the two data blocks"
        );
        assert_eq!(&blocks[1][..], &small.data[0].bytes[..]);
        assert_eq!(round_trip(&small).unwrap(), small);
        // Homes that spill the records into another block.
        let many = with_data(it(9, 40), 130);
        assert_eq!(round_trip(&many).unwrap(), many);
        let only_data = with_data(it(6, 0), 1);
        assert_eq!(round_trip(&only_data).unwrap(), only_data);
    }

    #[test]
    fn a_torn_data_block_is_refused() {
        let blocks = encode(&with_data(it(7, 2), 3), 1024);
        let header = decode_header(&blocks[0], 1024).unwrap();
        assert_eq!(header.nr_data, 3);
        for torn in 1..blocks.len() {
            let mut bad = blocks.clone();
            let mut block = bad[torn].to_vec();
            block[1000] ^= 1;
            bad[torn] = Arc::from(block);
            let err = decode(&header, &bad, 256).unwrap_err();
            assert!(err.contains("CRC"), "{err}");
        }
        // A header claiming no room for its records and homes.
        let mut short = blocks[0].to_vec();
        short[0x0C] = 3;
        assert_eq!(decode_header(&short, 1024), None);
    }

    #[test]
    fn a_version_1_i_transaction_still_decodes() {
        // Version 1 as the writer before data blocks laid it out: records from 0x28.
        let want = it(8, 2);
        let mut bytes = vec![0u8; HEADER_SIZE_RECORDS_ONLY];
        for record in &want.records {
            let value = record.value();
            bytes.extend_from_slice(&record.tag().to_le_bytes());
            bytes.extend_from_slice(&(value.len() as u16).to_le_bytes());
            bytes.extend_from_slice(&value);
        }
        let payload_len = (bytes.len() - HEADER_SIZE_RECORDS_ONLY) as u32;
        bytes.resize(bytes.len().div_ceil(1024) * 1024, 0);
        put32(&mut bytes, 0x00, MAGIC);
        bytes[0x04..0x06].copy_from_slice(&VERSION_RECORDS_ONLY.to_le_bytes());
        bytes[0x06] = want.ring;
        bytes[0x07] = want.nr_rings;
        put32(&mut bytes, 0x08, want.tid);
        let nr_blocks = (bytes.len() / 1024) as u32;
        put32(&mut bytes, 0x0C, nr_blocks);
        bytes[0x10..0x18].copy_from_slice(&want.sub_tid.to_le_bytes());
        bytes[0x18..0x20].copy_from_slice(&want.first_sub_tid.to_le_bytes());
        put32(&mut bytes, 0x20, payload_len);
        let crc = crc32c_raw(!0, &bytes);
        put32(&mut bytes, CRC_OFFSET, crc);
        let blocks: Vec<&[u8]> = bytes.chunks(1024).collect();
        let header = decode_header(blocks[0], 1024).unwrap();
        assert_eq!(decode(&header, &blocks, 256).unwrap(), want);
    }

    #[test]
    fn a_torn_block_or_header_is_refused() {
        let blocks = encode(&it(7, 40), 1024);
        let header = decode_header(&blocks[0], 1024).unwrap();
        for torn in 0..blocks.len() {
            let mut bad: Vec<Vec<u8>> = blocks.iter().map(|b| b.to_vec()).collect();
            bad[torn][700] ^= 0x40;
            let err = decode(&header, &bad, 256).unwrap_err();
            assert!(err.contains("CRC"), "{err}");
        }
        let mut stale_header = blocks[0].to_vec();
        stale_header[0x0C] = 200; // nr_blocks beyond what the payload needs
        assert_eq!(decode_header(&stale_header, 1024), None);
        assert_eq!(decode_header(&vec![0u8; 1024], 1024), None);
        assert!(decode(&header, &blocks[..1], 256).is_err());
    }

    #[test]
    fn in_order_stops_at_the_first_missing_sub_tid() {
        let got = in_order(vec![it(7, 1), it(5, 1), it(6, 1), it(9, 1)]).unwrap();
        let subs: Vec<u64> = got.kept.iter().map(|i| i.sub_tid).collect();
        assert_eq!(subs, vec![5, 6, 7]);
        assert!(got.stopped_by.unwrap().contains("sub-tid 8 is missing"));
        let none = in_order(vec![it(6, 1), it(7, 1)]).unwrap();
        assert!(none.kept.is_empty() && none.stopped_by.is_some());
        assert_eq!(in_order(Vec::new()).unwrap(), InOrder::default());
        assert!(in_order(vec![it(5, 1), it(5, 2)]).is_err());
        let mut odd = it(6, 1);
        odd.first_sub_tid = 6;
        assert!(in_order(vec![it(5, 1), odd]).is_err());
    }

    #[test]
    fn rings_split_the_region_evenly() {
        assert_eq!(ring_bounds(100, 255, 2, 0), (100, 127));
        assert_eq!(ring_bounds(100, 255, 2, 1), (227, 127));
        assert_eq!(ring_bounds(100, 255, 1, 0), (100, 255));
    }
}
