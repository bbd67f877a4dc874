//! The buffer cache: file system blocks as shared [`JBuf`]s, read through the IO queue.
//!
//! A block read through [`BufferCache::get_checked`] is shown to its caller's check
//! (a checksum, a structure) once while it stays cached: its bytes change only through
//! this process's journal handles, whose every change rewrites the checksum, so a copy
//! that passed once passes again. In debug builds every read is checked anyway, so that
//! the test suite catches a change that forgot its checksum. Must never trust a block
//! that re-entered the cache (evicted, forgotten, newly allocated) without a new check.
//!
//! A buffer read on a miss holds what recovery would rebuild of its block (the journal's
//! committed copy, or the home block, which nothing but the checkpoint writes while the
//! journal may log it), so the journal may log a change to it as the bytes changed on
//! them ([`JBuf::from_home`]); a newly allocated block's zeroed buffer may not (its home
//! holds garbage). Whoever writes a cached block in place, outside the journal, must
//! [`BufferCache::forget`] it.

use crate::NumberMap;
use jext_device::DeviceError;
use jext_io::IoQueue;
use jext_journal::{JBuf, Journal};
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub cached_blocks: usize,
}

struct Entry {
    buf: Arc<JBuf>,
    last_used: u64,
    /// What the cached bytes passed (see [`BufferCache::get_checked`]); `None` until the
    /// first check.
    checked_as: Option<u64>,
}

struct Inner {
    map: NumberMap<u64, Entry>,
    clock: u64,
    stats: BufferCacheStats,
    /// After an eviction that pinned buffers kept above capacity, the size the map must
    /// reach before the next try: a cache full of pinned buffers is then scanned once per
    /// capacity/8 misses, not at every miss (which made each miss cost the cache's size).
    retry_at_len: usize,
}

pub struct BufferCache {
    io: Arc<IoQueue>,
    block_size: usize,
    capacity_blocks: usize,
    journal: RwLock<Option<Arc<Journal>>>,
    inner: Mutex<Inner>,
}

impl BufferCache {
    /// A cache of blocks of `block_size` bytes that tries to stay within
    /// `capacity_bytes` (buffers the journal pins may exceed it for a while).
    pub fn new(io: Arc<IoQueue>, block_size: usize, capacity_bytes: usize) -> BufferCache {
        BufferCache {
            io,
            block_size,
            capacity_blocks: (capacity_bytes / block_size).max(64),
            journal: RwLock::new(None),
            inner: Mutex::new(Inner {
                map: NumberMap::default(),
                clock: 0,
                stats: BufferCacheStats::default(),
                retry_at_len: 0,
            }),
        }
    }

    /// From now on a miss first asks `journal` for committed bytes not yet at home.
    pub fn attach_journal(&self, journal: Arc<Journal>) {
        *self.journal.write() = Some(journal);
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The buffer for `block`, read from the device on a miss.
    pub fn get(&self, block: u64) -> Result<Arc<JBuf>, DeviceError> {
        if let Some((buf, _)) = self.lookup(block) {
            return Ok(buf);
        }
        let committed = self
            .journal
            .read()
            .as_ref()
            .and_then(|j| j.committed_copy(block));
        let data: Arc<[u8]> = match committed {
            Some(data) => data,
            None => {
                let mut bytes = vec![0u8; self.block_size];
                self.io.read(block * self.block_size as u64, &mut bytes)?;
                Arc::from(bytes)
            }
        };
        let mut inner = self.inner.lock();
        inner.stats.misses += 1;
        // Another thread may have read it meanwhile; the first one in wins, so that every
        // user shares one buffer per block.
        let clock = inner.clock;
        let entry = inner.map.entry(block).or_insert_with(|| Entry {
            buf: Arc::new(JBuf::from_home(block, data)),
            last_used: clock,
            checked_as: None,
        });
        let buf = entry.buf.clone();
        self.evict_if_full(&mut inner);
        Ok(buf)
    }

    /// The cached buffer for `block`, or, on a miss, one holding `home`: bytes the caller
    /// knows the home block holds durably, with nothing of the block in the journal (a
    /// clean page of a data-journaled file, read from home or checkpointed). No read.
    pub fn get_with_home(&self, block: u64, home: Arc<[u8]>) -> Arc<JBuf> {
        assert_eq!(
            home.len(),
            self.block_size,
            "block {block}: a home copy is one block"
        );
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let entry = inner.map.entry(block).or_insert_with(|| Entry {
            buf: Arc::new(JBuf::from_home(block, home)),
            last_used: clock,
            checked_as: None,
        });
        entry.last_used = clock;
        let buf = entry.buf.clone();
        self.evict_if_full(&mut inner);
        buf
    }

    /// The buffer for `block` (read on a miss), its bytes shown to `check` unless they
    /// passed a check of the same `kind` since they came into the cache. `kind` is the
    /// caller's name for what `check` checks (a block type and checksum seed, say): a
    /// block checked as one kind is checked again when read as another.
    pub fn get_checked<E: From<DeviceError>>(
        &self,
        block: u64,
        kind: u64,
        check: impl FnOnce(&[u8]) -> Result<(), E>,
    ) -> Result<Arc<JBuf>, E> {
        let buf = match self.lookup(block) {
            Some((buf, Some(checked))) if checked == kind && !cfg!(debug_assertions) => {
                return Ok(buf)
            }
            Some((buf, _)) => buf,
            None => self.get(block)?,
        };
        buf.read(check)?;
        let mut inner = self.inner.lock();
        // Only the copy that was checked: the block may have been forgotten or replaced
        // by a newly allocated one meanwhile.
        if let Some(entry) = inner.map.get_mut(&block) {
            if Arc::ptr_eq(&entry.buf, &buf) {
                entry.checked_as = Some(kind);
            }
        }
        Ok(buf)
    }

    /// A zeroed buffer for a block just allocated: no read, and any stale cached copy is
    /// replaced.
    pub fn get_new(&self, block: u64) -> Arc<JBuf> {
        let buf = Arc::new(JBuf::zeroed(block, self.block_size));
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let last_used = inner.clock;
        inner.map.insert(
            block,
            Entry {
                buf: buf.clone(),
                last_used,
                checked_as: None,
            },
        );
        self.evict_if_full(&mut inner);
        buf
    }

    /// The cached buffer for `block`, without reading.
    pub fn peek(&self, block: u64) -> Option<Arc<JBuf>> {
        self.inner.lock().map.get(&block).map(|e| e.buf.clone())
    }

    /// Drops `block` from the cache (it was freed, or written in place outside the
    /// journal: a later use must not see old bytes, nor take them for its home's).
    pub fn forget(&self, block: u64) {
        self.inner.lock().map.remove(&block);
    }

    pub fn stats(&self) -> BufferCacheStats {
        let inner = self.inner.lock();
        BufferCacheStats {
            cached_blocks: inner.map.len(),
            ..inner.stats
        }
    }

    /// Drops unpinned buffers, least recently used first, until at most `keep_blocks`
    /// remain or nothing more can go.
    pub fn shrink_to(&self, keep_blocks: usize) {
        let mut inner = self.inner.lock();
        Self::evict_down_to(&mut inner, keep_blocks);
    }

    /// A hit's buffer and what its bytes were checked as.
    fn lookup(&self, block: u64) -> Option<(Arc<JBuf>, Option<u64>)> {
        let mut inner = self.inner.lock();
        inner.clock += 1;
        let clock = inner.clock;
        let entry = inner.map.get_mut(&block)?;
        entry.last_used = clock;
        let found = (entry.buf.clone(), entry.checked_as);
        inner.stats.hits += 1;
        Some(found)
    }

    fn evict_if_full(&self, inner: &mut Inner) {
        if inner.map.len() > self.capacity_blocks && inner.map.len() > inner.retry_at_len {
            // Evict down to 7/8 so that eviction runs once per many misses.
            Self::evict_down_to(inner, self.capacity_blocks - self.capacity_blocks / 8);
            inner.retry_at_len = if inner.map.len() > self.capacity_blocks {
                inner.map.len() + self.capacity_blocks / 8
            } else {
                0
            };
        }
    }

    fn evict_down_to(inner: &mut Inner, keep_blocks: usize) {
        if inner.map.len() <= keep_blocks {
            return;
        }
        let mut candidates: Vec<(u64, u64)> = inner
            .map
            .iter()
            // Held elsewhere (a handle, a directory walk) or needed by the journal.
            .filter(|(_, e)| Arc::strong_count(&e.buf) == 1 && !e.buf.is_pinned())
            .map(|(block, e)| (e.last_used, *block))
            .collect();
        candidates.sort_unstable();
        let excess = inner.map.len() - keep_blocks;
        for (_, block) in candidates.into_iter().take(excess) {
            inner.map.remove(&block);
            inner.stats.evictions += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_device::{BlockDevice, DeviceOp, SimDevice};

    fn cache(capacity_blocks: usize) -> (Arc<SimDevice>, BufferCache) {
        let dev = Arc::new(SimDevice::new(1 << 20));
        let io = Arc::new(IoQueue::new(dev.clone()));
        (dev, BufferCache::new(io, 1024, capacity_blocks * 1024))
    }

    #[test]
    fn reads_once_and_shares_the_buffer() {
        let (dev, cache) = cache(64);
        dev.write_at(5 * 1024, &[7u8; 1024], false).unwrap();
        let a = cache.get(5).unwrap();
        let b = cache.get(5).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.bytes()[0], 7);
        assert_eq!(dev.counters().snapshot().reads, 1);
        let s = cache.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
    }

    #[test]
    fn evicts_least_recently_used_but_never_held_or_pinned_buffers() {
        let (_dev, cache) = cache(64);
        let held = cache.get(0).unwrap();
        let pinned_snapshot = cache.get(1).unwrap().bytes();
        for block in 2..200 {
            cache.get(block).unwrap();
        }
        assert!(cache.stats().cached_blocks <= 64);
        assert!(cache.peek(0).is_some(), "a buffer in use stays");
        assert!(
            cache.peek(1).is_some(),
            "a buffer whose bytes the journal holds stays"
        );
        assert!(cache.peek(2).is_none(), "the oldest idle buffer went first");
        drop((held, pinned_snapshot));
        cache.shrink_to(0);
        assert_eq!(cache.stats().cached_blocks, 0);
    }

    #[test]
    fn read_buffers_may_rest_records_on_home_and_new_ones_may_not() {
        let (dev, cache) = cache(64);
        dev.write_at(4 * 1024, &[3u8; 1024], false).unwrap();
        assert!(cache.get(4).unwrap().base_known(), "read from home");
        assert!(!cache.get_new(5).base_known(), "zeroed over garbage");
        // A home copy the caller knows (a clean page) makes a buffer only on a miss.
        let page: Arc<[u8]> = Arc::from(vec![8u8; 1024]);
        let buf = cache.get_with_home(6, page.clone());
        assert!(buf.base_known() && buf.bytes()[0] == 8);
        assert_eq!(dev.counters().snapshot().reads, 1, "no read for it");
        let cached = cache.get_with_home(4, page);
        assert_eq!(cached.bytes()[0], 3, "the cached buffer wins");
    }

    #[test]
    fn new_blocks_are_zeroed_and_replace_stale_copies() {
        let (dev, cache) = cache(64);
        dev.write_at(3 * 1024, &[9u8; 1024], false).unwrap();
        assert_eq!(cache.get(3).unwrap().bytes()[0], 9);
        let fresh = cache.get_new(3);
        assert_eq!(fresh.bytes()[0], 0);
        assert!(Arc::ptr_eq(&fresh, &cache.get(3).unwrap()));
        cache.forget(3);
        assert!(cache.peek(3).is_none());
    }

    /// Counts the checks `get_checked` runs for one kind of block.
    fn checked(cache: &BufferCache, block: u64, kind: u64, checks: &mut u32) {
        cache
            .get_checked(block, kind, |_| {
                *checks += 1;
                Ok::<(), DeviceError>(())
            })
            .unwrap();
    }

    #[test]
    fn a_cached_block_is_checked_once_per_kind_until_it_leaves_the_cache() {
        let (_dev, cache) = cache(64);
        let mut checks = 0;
        checked(&cache, 5, 1, &mut checks);
        checked(&cache, 5, 1, &mut checks);
        // Debug builds check every read (see the module comment).
        let per_read = u32::from(cfg!(debug_assertions));
        assert_eq!(checks, 1 + per_read, "trusted after one check");
        checked(&cache, 5, 2, &mut checks);
        assert_eq!(checks, 2 + per_read, "another kind is checked anew");
        cache.forget(5);
        checked(&cache, 5, 2, &mut checks);
        assert_eq!(checks, 3 + per_read, "a block read again is checked again");
        cache.get_new(5);
        checked(&cache, 5, 2, &mut checks);
        assert_eq!(checks, 4 + per_read, "a newly allocated block is checked");
        let failed = cache.get_checked(6, 1, |_| {
            Err(DeviceError::media(
                DeviceOp::Read,
                6 * 1024,
                1024,
                "bad checksum",
            ))
        });
        assert!(failed.is_err());
        let mut after_failure = 0;
        checked(&cache, 6, 1, &mut after_failure);
        assert_eq!(
            after_failure, 1,
            "a failed check leaves the block unchecked"
        );
    }
}
