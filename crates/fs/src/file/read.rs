//! Reading file data: pages come from the page cache, or from disk with readahead along
//! the extent under them, or are zeros over holes and unwritten blocks.
//!
//! Promises: a page read from disk is never staler than a committed journal copy of its
//! block (data=journal reads the journal's copy first). Must never change what is on disk.

use super::{check_regular, MAX_FILE_BLOCKS};
use crate::blockmap;
use crate::error::FsResult;
use crate::op::Op;
use crate::state::FsInner;
use std::sync::Arc;

/// Pages read ahead from a contiguous extent on a miss.
const READAHEAD_PAGES: u64 = 64;

/// Reads up to `len` bytes at `offset` of `ino`, which `op` holds alone. A page missing
/// from the cache is read from the device with the inode released (other operations on
/// it go on meanwhile), except under data=journal, where a block's newest bytes may sit
/// in the journal.
pub(crate) fn read(op: &mut Op, ino: u32, offset: u64, len: usize) -> FsResult<Vec<u8>> {
    let fs = op.fs;
    check_regular(op, ino)?;
    crate::inodes::note_access(fs, op.inode_mut(ino));
    let size = op.inode(ino).size;
    if offset >= size || len == 0 {
        return Ok(Vec::new());
    }
    let mut end = (offset + len as u64).min(size);
    // A data-journaled file's newest bytes may sit in the journal: read with it held.
    let journal_data = fs.journals_data(op.inode(ino));
    let bs = u64::from(fs.geo.block_size);
    let mut out = Vec::with_capacity((end - offset) as usize);
    let mut pos = offset;
    let mut unlocked_tries = 0;
    while pos < end {
        let index = pos / bs;
        let cached = fs.pages.lock().get(ino, index).map(|p| p.data().clone());
        let page = match cached {
            Some(page) => page,
            // A read that raced a change to the file is thrown away; after a few, read
            // with the inode held rather than race again.
            None if unlocked_tries < UNLOCKED_TRIES && !journal_data => {
                unlocked_tries += 1;
                fill_unlocked(op, ino, index)?;
                // The file may have shrunk while it was released: the read ends at its end
                // now, as Linux's does, never with bytes from before a truncate beside
                // zeros from after it.
                end = end.min(op.inode(ino).size);
                continue;
            }
            None => page_data(op, ino, index)?,
        };
        let within = (pos % bs) as usize;
        let n = ((end - pos) as usize).min(bs as usize - within);
        out.extend_from_slice(&page[within..within + n]);
        pos += n as u64;
    }
    fs.pages.lock().evict_over_capacity();
    Ok(out)
}

/// Device reads one `read` call may make without the lock before it keeps the lock.
const UNLOCKED_TRIES: u32 = 64;

/// Where the bytes of a page missing from the cache come from.
enum Source {
    /// A hole or an unwritten block: zeros.
    Zeros,
    /// Device reads that hold the page and the pages after it (readahead).
    Device(Vec<Span>),
}

/// One device read: `blocks` blocks from `phys` on, of which `pages` are wanted, each as
/// (page index, block within the span). Blocks between them are read and dropped.
struct Span {
    phys: u64,
    blocks: u64,
    pages: Vec<(u64, u64)>,
}

/// Blocks a span may read and drop between two wanted ones: a fragmented file's pages
/// (every other block, say) then cost one read, not one per page, as the kernel's
/// readahead gets by sending many requests at once.
const MAX_GAP_BLOCKS: u64 = 8;
/// Longest span, in blocks.
const MAX_SPAN_BLOCKS: u64 = 256;

fn source_of(op: &mut Op, ino: u32, index: u64) -> FsResult<Source> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    let size_pages = op.inode(ino).size.div_ceil(u64::from(fs.geo.block_size));
    let end = (index + READAHEAD_PAGES)
        .min(size_pages.max(index + 1))
        .min(MAX_FILE_BLOCKS);
    if index >= end {
        return Ok(Source::Zeros);
    }
    let mut extents = blockmap::extents_in(fs, ino, &raw, index, end)?;
    // Only a reader going forward gets readahead past the page's own extent: a random
    // reader would pay for pages it never asks for (the kernel keeps the same habit).
    let sequential = op.inode(ino).readahead_next == index;
    if !sequential {
        extents.truncate(1);
    }
    let mut wanted: Vec<(u64, u64)> = Vec::new();
    for e in extents.iter().filter(|e| !e.unwritten) {
        let first = u64::from(e.logical).max(index);
        let last = e.end().min(end);
        wanted.extend((first..last).map(|page| (page, e.start + (page - u64::from(e.logical)))));
    }
    // Readahead covers what follows the page; the page itself must be mapped and written.
    if wanted.first().map(|(page, _)| *page) != Some(index) {
        return Ok(Source::Zeros);
    }
    let last = wanted.last().map_or(index, |(page, _)| *page);
    op.inode_mut(ino).readahead_next = last + 1;
    Ok(Source::Device(spans(wanted)))
}

/// Groups (page, block) pairs, in page order, into device reads of nearby blocks.
fn spans(mut wanted: Vec<(u64, u64)>) -> Vec<Span> {
    wanted.sort_by_key(|(_, block)| *block);
    let mut spans: Vec<Span> = Vec::new();
    for (page, block) in wanted {
        match spans.last_mut() {
            Some(span)
                if block >= span.phys + span.blocks
                    && block - (span.phys + span.blocks) <= MAX_GAP_BLOCKS
                    && block + 1 - span.phys <= MAX_SPAN_BLOCKS =>
            {
                span.blocks = block + 1 - span.phys;
                span.pages.push((page, block - span.phys));
            }
            _ => spans.push(Span {
                phys: block,
                blocks: 1,
                pages: vec![(page, 0)],
            }),
        }
    }
    spans
}

/// Reads every span from the device.
fn read_spans(fs: &FsInner, spans: &[Span]) -> FsResult<Vec<Vec<u8>>> {
    let bs = fs.geo.block_size as usize;
    spans
        .iter()
        .map(|span| {
            let mut bytes = vec![0u8; span.blocks as usize * bs];
            fs.io.read(span.phys * bs as u64, &mut bytes)?;
            Ok(bytes)
        })
        .collect()
}

/// Puts a page missing from the cache there, reading the device with the inode released.
/// If the file's blocks changed meanwhile (`data_seq`), the bytes are dropped and the
/// caller looks again; pages that appeared meanwhile are never overwritten.
fn fill_unlocked(op: &mut Op, ino: u32, index: u64) -> FsResult<()> {
    let fs = op.fs;
    let Source::Device(spans) = source_of(op, ino, index)? else {
        fs.pages.lock().insert_clean(ino, index, zeros(fs));
        return Ok(());
    };
    let seq = op.inode(ino).data_seq;
    let read = op.unlocked(ino, || read_spans(fs, &spans))?;
    if op.inode(ino).data_seq == seq {
        insert_read(op, ino, &spans, &read);
    }
    Ok(())
}

fn zeros(fs: &FsInner) -> Arc<[u8]> {
    Arc::from(vec![0u8; fs.geo.block_size as usize])
}

/// The bytes of page `index`: cached, or read from disk (with readahead), or zeros,
/// all under the lock.
pub(super) fn page_data(op: &mut Op, ino: u32, index: u64) -> FsResult<Arc<[u8]>> {
    let fs = op.fs;
    if let Some(data) = fs.pages.lock().get(ino, index).map(|p| p.data().clone()) {
        return Ok(data);
    }
    let Source::Device(spans) = source_of(op, ino, index)? else {
        let zeros = zeros(fs);
        fs.pages.lock().insert_clean(ino, index, zeros.clone());
        return Ok(zeros);
    };
    let read = read_spans(fs, &spans)?;
    insert_read(op, ino, &spans, &read);
    Ok(fs
        .pages
        .lock()
        .get(ino, index)
        .expect("the page was just read")
        .data()
        .clone())
}

/// Caches the pages the spans read (where none is cached yet).
fn insert_read(op: &mut Op, ino: u32, spans: &[Span], read: &[Vec<u8>]) {
    let fs = op.fs;
    let bs = fs.geo.block_size as usize;
    let journal_data = fs.journals_data(op.inode(ino));
    for (span, bytes) in spans.iter().zip(read) {
        for &(page, at) in &span.pages {
            let block = span.phys + at;
            let chunk = &bytes[at as usize * bs..(at as usize + 1) * bs];
            let data = block_data(fs, ino, journal_data, page, block, chunk);
            fs.pages.lock().insert_clean(ino, page, data);
        }
    }
}

/// What page `page` holds when block `block` read as `chunk`: a journaled copy not yet
/// written home is newer than the home block.
fn block_data(
    fs: &FsInner,
    ino: u32,
    journal_data: bool,
    page: u64,
    block: u64,
    chunk: &[u8],
) -> Arc<[u8]> {
    if !journal_data {
        let cached = fs.cache.peek(block).is_some();
        let committed = fs.journal.committed_copy(block).is_some();
        assert!(!cached && !committed, "data block {block} of inode {ino} (page {page}) has a journal copy: cached {cached} committed {committed}");
    }
    match fs.cache.peek(block).or_else(|| {
        fs.journal
            .committed_copy(block)
            .map(|d| Arc::new(jext_journal::JBuf::new(block, d)))
    }) {
        Some(buf) => buf.bytes(),
        None => Arc::from(chunk),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scattered_pages_are_read_in_few_spans() {
        // Every other page moved far away, as a file fragmented on purpose is.
        let wanted: Vec<(u64, u64)> = (0..8)
            .map(|page| match page % 2 {
                0 => (page, 1000 + page),
                _ => (page, 9000 + page / 2),
            })
            .collect();
        let got = spans(wanted);
        assert_eq!(got.len(), 2, "one read per neighbourhood");
        assert_eq!((got[0].phys, got[0].blocks), (1000, 7));
        assert_eq!(got[0].pages, vec![(0, 0), (2, 2), (4, 4), (6, 6)]);
        assert_eq!((got[1].phys, got[1].blocks), (9000, 4));
        // Too far apart to read the gap: separate reads.
        let apart = spans(vec![(0, 10), (1, 10 + MAX_GAP_BLOCKS + 2)]);
        assert_eq!(apart.len(), 2);
        // A span never grows past its limit.
        let long: Vec<(u64, u64)> = (0..600).map(|p| (p, 5000 + p)).collect();
        assert!(spans(long).iter().all(|s| s.blocks <= MAX_SPAN_BLOCKS));
    }
}
