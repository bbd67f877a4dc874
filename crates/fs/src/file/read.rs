//! Reading file data: pages come from the page cache, or from disk with readahead along
//! the extent under them, or are zeros over holes and unwritten blocks.
//!
//! Promises: a page read from disk is never staler than a committed journal copy of its
//! block (data=journal reads the journal's copy first). Must never change what is on disk.

use super::{load_regular, MAX_FILE_BLOCKS};
use crate::blockmap;
use crate::error::FsResult;
use crate::options::DataMode;
use crate::state::{FsInner, FsState};
use parking_lot::MutexGuard;
use std::sync::Arc;

/// Pages read ahead from a contiguous extent on a miss.
const READAHEAD_PAGES: u64 = 64;

/// Reads up to `len` bytes at `offset`. A page missing from the cache is read from the
/// device with the lock released (other operations go on meanwhile), except under
/// data=journal, where a block's newest bytes may sit in the journal.
pub(crate) fn read(
    fs: &FsInner,
    st: &mut MutexGuard<'_, FsState>,
    ino: u32,
    offset: u64,
    len: usize,
) -> FsResult<Vec<u8>> {
    load_regular(fs, st, ino)?;
    crate::inodes::note_access(fs, st.inodes.get_mut(&ino).expect("loaded"));
    let size = st.inodes[&ino].size;
    if offset >= size || len == 0 {
        return Ok(Vec::new());
    }
    let end = (offset + len as u64).min(size);
    let bs = u64::from(fs.geo.block_size);
    let mut out = Vec::with_capacity((end - offset) as usize);
    let mut pos = offset;
    let mut unlocked_tries = 0;
    while pos < end {
        let index = pos / bs;
        let page = match st.pages.get(ino, index) {
            Some(page) => page.data().clone(),
            // A read that raced a change to the file is thrown away; after a few, read
            // under the lock rather than race again.
            None if unlocked_tries < UNLOCKED_TRIES
                && fs.options.data_mode != DataMode::Journal =>
            {
                unlocked_tries += 1;
                fill_unlocked(fs, st, ino, index)?;
                continue;
            }
            None => page_data(fs, st, ino, index)?,
        };
        let within = (pos % bs) as usize;
        let n = ((end - pos) as usize).min(bs as usize - within);
        out.extend_from_slice(&page[within..within + n]);
        pos += n as u64;
    }
    st.pages.evict_over_capacity();
    Ok(out)
}

/// Device reads one `read` call may make without the lock before it keeps the lock.
const UNLOCKED_TRIES: u32 = 64;

/// Where the bytes of a page missing from the cache come from.
enum Source {
    /// A hole or an unwritten block: zeros.
    Zeros,
    /// `pages` blocks from `phys` on (readahead along the extent).
    Device { phys: u64, pages: u64 },
}

fn source_of(fs: &FsInner, st: &mut FsState, ino: u32, index: u64) -> FsResult<Source> {
    let raw = st.inodes[&ino].raw.clone();
    let size_pages = st.inodes[&ino].size.div_ceil(u64::from(fs.geo.block_size));
    let extent = if index < MAX_FILE_BLOCKS {
        blockmap::lookup(fs, ino, &raw, index as u32)?
    } else {
        None
    };
    let Some(e) = extent.filter(|e| !e.unwritten) else {
        return Ok(Source::Zeros);
    };
    let pages = (e.end() - index)
        .min(READAHEAD_PAGES)
        .min(size_pages.saturating_sub(index))
        .max(1);
    let phys = e.start + (index - u64::from(e.logical));
    Ok(Source::Device { phys, pages })
}

/// Puts a page missing from the cache there, reading the device with the lock released.
/// If the file's blocks changed meanwhile (`data_seq`), the bytes are dropped and the
/// caller looks again; pages that appeared meanwhile are never overwritten.
fn fill_unlocked(
    fs: &FsInner,
    st: &mut MutexGuard<'_, FsState>,
    ino: u32,
    index: u64,
) -> FsResult<()> {
    // The inode may have been evicted (or deleted) while an earlier read ran unlocked.
    load_regular(fs, st, ino)?;
    let Source::Device { phys, pages } = source_of(fs, st, ino, index)? else {
        st.pages.insert_clean(ino, index, zeros(fs));
        return Ok(());
    };
    let seq = st.inodes[&ino].data_seq;
    let bs = fs.geo.block_size as usize;
    let mut bytes = vec![0u8; pages as usize * bs];
    MutexGuard::unlocked(st, || fs.io.read(phys * bs as u64, &mut bytes))?;
    if st.inodes.get(&ino).map(|i| i.data_seq) == Some(seq) {
        insert_read(fs, st, ino, index, phys, &bytes);
    }
    Ok(())
}

fn zeros(fs: &FsInner) -> Arc<[u8]> {
    Arc::from(vec![0u8; fs.geo.block_size as usize])
}

/// The bytes of page `index`: cached, or read from disk (with readahead), or zeros,
/// all under the lock.
pub(super) fn page_data(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    index: u64,
) -> FsResult<Arc<[u8]>> {
    if let Some(page) = st.pages.get(ino, index) {
        return Ok(page.data().clone());
    }
    let Source::Device { phys, pages } = source_of(fs, st, ino, index)? else {
        let zeros = zeros(fs);
        st.pages.insert_clean(ino, index, zeros.clone());
        return Ok(zeros);
    };
    let bs = fs.geo.block_size as usize;
    let mut bytes = vec![0u8; pages as usize * bs];
    fs.io.read(phys * bs as u64, &mut bytes)?;
    Ok(insert_read(fs, st, ino, index, phys, &bytes))
}

/// Caches the pages read from `phys` on for pages `index..` (where none is cached yet),
/// and returns the first.
fn insert_read(
    fs: &FsInner,
    st: &mut FsState,
    ino: u32,
    index: u64,
    phys: u64,
    bytes: &[u8],
) -> Arc<[u8]> {
    let bs = fs.geo.block_size as usize;
    let mut first = None;
    for (i, chunk) in bytes.chunks(bs).enumerate() {
        let block = phys + i as u64;
        // A journaled copy not yet written home is newer than the home block.
        if fs.options.data_mode != DataMode::Journal {
            let cached = fs.cache.peek(block).is_some();
            let committed = fs.journal.committed_copy(block).is_some();
            assert!(!cached && !committed, "data block {block} of inode {ino} (page {}) has a journal copy: cached {cached} committed {committed}", index + i as u64);
        }
        let data: Arc<[u8]> = match fs.cache.peek(block).or_else(|| {
            fs.journal
                .committed_copy(block)
                .map(|d| Arc::new(jext_journal::JBuf::new(block, d)))
        }) {
            Some(buf) => buf.bytes(),
            None => Arc::from(chunk),
        };
        if i == 0 {
            first = Some(data.clone());
        }
        st.pages.insert_clean(ino, index + i as u64, data);
    }
    first.expect("at least one page was read")
}
