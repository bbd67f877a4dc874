//! The page cache: file data by (inode, page index), one page per file system block.
//!
//! Pages are `Arc<[u8]>` so that writeback hands the IO layer a page without copying it;
//! a later change copies only if the IO still holds it. Clean pages sit in an LRU list and
//! are evicted oldest first when the cache is over its bound; dirty pages are never
//! evicted, only written back (by the file system) and then become clean.
//!
//! A page being written back ([`PageCache::start_writeback`] to
//! [`PageCache::end_writeback`], the kernel's `PG_writeback`) is clean, so a new change
//! dirties it again, but it is not evictable: until its write reached the device, the
//! device still holds older bytes, and a read that missed the cache would see them.
//!
//! A dirty page may keep its *base*: the bytes it held while last clean, when the caller
//! asks for it ([`PageCache::modify_keeping_base`]: a data-journaled file, whose clean
//! pages hold what its blocks hold at home once the journal's copies are checkpointed).
//! The journal then logs the page's change as the bytes it changed on the base instead
//! of a whole block (`jext_journal`'s home bases). A base costs a page of memory (and a
//! copy, when the change is made in place: it copies the shared bytes; a page replaced
//! whole, [`PageCache::replace`], costs none), so at most an eighth of the cache's pages
//! keep one; it is dropped when the page is cleaned, sent to the device, or dropped.
//!
//! The cache knows nothing of blocks, extents or allocation; it must never drop a dirty
//! page, nor evict one whose write is in flight.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

/// One page of a file.
pub struct Page {
    data: Arc<[u8]>,
    dirty: bool,
    /// Position in the clean LRU (meaningless while dirty or under writeback).
    lru_tick: u64,
    /// Writes of this page in flight; while any is, the page is not on the clean LRU.
    writebacks: u32,
    /// Unique among every page this cache ever held: an `end_writeback` meant for a page
    /// that was dropped (truncate) never ends the writeback of its successor.
    id: u64,
    /// While dirty: the bytes it held while last clean, if kept (module comment).
    base: Option<Arc<[u8]>>,
}

impl Page {
    /// On the clean LRU (evictable).
    fn evictable(&self) -> bool {
        !self.dirty && self.writebacks == 0
    }
}

/// A page whose write is in flight: what to write, and what to hand back to
/// [`PageCache::end_writeback`] once the write completed.
#[derive(Clone, Debug)]
pub struct PageWriteback {
    pub ino: u32,
    pub index: u64,
    pub data: Arc<[u8]>,
    id: u64,
}

impl Page {
    pub fn data(&self) -> &Arc<[u8]> {
        &self.data
    }

    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// A write of this page is in flight: the device may not have its bytes yet.
    pub fn in_writeback(&self) -> bool {
        self.writebacks > 0
    }

    /// While dirty: the bytes the page held while last clean, if they were kept
    /// ([`PageCache::modify_keeping_base`]).
    pub fn base(&self) -> Option<&Arc<[u8]>> {
        self.base.as_ref()
    }
}

#[derive(Default)]
struct FilePages {
    pages: BTreeMap<u64, Page>,
    /// The indices of the dirty pages among `pages`: a file's fsync writes back a few
    /// dirty pages of a file that may have many thousands cached, and finding them by a
    /// walk of every page, under the cache's lock, was half of an fsync's time beside a
    /// busy writer.
    dirty: BTreeSet<u64>,
    /// When the oldest still-dirty page of this file was dirtied (the kernel's
    /// `dirtied_when`, per inode).
    dirtied_at: Option<Instant>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub cached_pages: usize,
    pub dirty_pages: usize,
}

pub struct PageCache {
    page_size: usize,
    capacity_pages: usize,
    files: HashMap<u32, FilePages>,
    /// Clean pages by last use: tick -> (inode, index).
    clean_lru: BTreeMap<u64, (u32, u64)>,
    clock: u64,
    total_pages: usize,
    dirty_pages: usize,
    /// Pages keeping a base; at most `capacity_pages / 8`.
    based_pages: usize,
    stats: PageCacheStats,
}

impl PageCache {
    pub fn new(page_size: usize, capacity_bytes: usize) -> PageCache {
        PageCache {
            page_size,
            capacity_pages: (capacity_bytes / page_size).max(16),
            files: HashMap::new(),
            clean_lru: BTreeMap::new(),
            clock: 0,
            total_pages: 0,
            dirty_pages: 0,
            based_pages: 0,
            stats: PageCacheStats::default(),
        }
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity_pages * self.page_size
    }

    pub fn dirty_bytes(&self) -> usize {
        self.dirty_pages * self.page_size
    }

    pub fn cached_bytes(&self) -> usize {
        self.total_pages * self.page_size
    }

    pub fn stats(&self) -> PageCacheStats {
        PageCacheStats {
            cached_pages: self.total_pages,
            dirty_pages: self.dirty_pages,
            ..self.stats
        }
    }

    /// The page, if cached; counts a hit or a miss and refreshes its LRU position.
    pub fn get(&mut self, ino: u32, index: u64) -> Option<&Page> {
        self.clock += 1;
        let clock = self.clock;
        let Some(page) = self
            .files
            .get_mut(&ino)
            .and_then(|f| f.pages.get_mut(&index))
        else {
            self.stats.misses += 1;
            return None;
        };
        self.stats.hits += 1;
        if page.evictable() {
            self.clean_lru.remove(&page.lru_tick);
            page.lru_tick = clock;
            self.clean_lru.insert(clock, (ino, index));
        }
        Some(page)
    }

    /// True if the page is cached (no statistics, no LRU change).
    pub fn contains(&self, ino: u32, index: u64) -> bool {
        self.files
            .get(&ino)
            .is_some_and(|f| f.pages.contains_key(&index))
    }

    /// Caches a page read from disk. An existing page (which may be dirty and newer) wins.
    pub fn insert_clean(&mut self, ino: u32, index: u64, data: Arc<[u8]>) {
        assert_eq!(data.len(), self.page_size, "a page is one block");
        if self.contains(ino, index) {
            return;
        }
        self.clock += 1;
        let tick = self.clock;
        self.files.entry(ino).or_default().pages.insert(
            index,
            Page {
                data,
                dirty: false,
                lru_tick: tick,
                writebacks: 0,
                id: tick,
                base: None,
            },
        );
        self.clean_lru.insert(tick, (ino, index));
        self.total_pages += 1;
    }

    /// Changes a page and marks it dirty; a missing page starts as zeros.
    pub fn modify<R>(&mut self, ino: u32, index: u64, change: impl FnOnce(&mut [u8]) -> R) -> R {
        self.change(ino, index, false, change)
    }

    /// [`PageCache::modify`], and a page that was cached clean keeps the bytes it held as
    /// its base (module comment), unless too many pages keep one already.
    pub fn modify_keeping_base<R>(
        &mut self,
        ino: u32,
        index: u64,
        change: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        self.change(ino, index, true, change)
    }

    fn change<R>(
        &mut self,
        ino: u32,
        index: u64,
        keep_base: bool,
        change: impl FnOnce(&mut [u8]) -> R,
    ) -> R {
        let page_size = self.page_size;
        let page = self.dirtied(ino, index, keep_base, || Arc::from(vec![0u8; page_size]));
        change(Arc::make_mut(&mut page.data))
    }

    /// Puts `data`, a whole page built by the caller, in place of the page and marks it
    /// dirty, as [`PageCache::modify`] (`keep_base`: [`PageCache::modify_keeping_base`])
    /// would with a change that overwrites every byte. The caller allocates and fills the
    /// page before it takes the cache's lock, so the lock is held for the bookkeeping
    /// alone: a writer copying megabytes then never holds up, page after page, an fsync
    /// that needs the cache for a moment.
    pub fn replace(&mut self, ino: u32, index: u64, data: Arc<[u8]>, keep_base: bool) {
        assert_eq!(data.len(), self.page_size, "a page is one block");
        let page = self.dirtied(ino, index, keep_base, || data.clone());
        // The old bytes live on in the base, if kept, without a copy.
        page.data = data;
    }

    /// The page at `index`, made if missing (`fresh` gives its bytes) and marked dirty,
    /// its base kept if asked and room allows (module comment).
    fn dirtied(
        &mut self,
        ino: u32,
        index: u64,
        keep_base: bool,
        fresh: impl FnOnce() -> Arc<[u8]>,
    ) -> &mut Page {
        let room_for_base = self.based_pages < self.capacity_pages / 8;
        self.clock += 1;
        let id = self.clock;
        let file = self.files.entry(ino).or_default();
        let (page, fresh) = match file.pages.entry(index) {
            Entry::Vacant(slot) => {
                self.total_pages += 1;
                let page = slot.insert(Page {
                    data: fresh(),
                    // Counted as dirty just below.
                    dirty: false,
                    lru_tick: 0,
                    writebacks: 0,
                    id,
                    base: None,
                });
                (page, true)
            }
            Entry::Occupied(slot) => {
                let page = slot.into_mut();
                if page.evictable() {
                    self.clean_lru.remove(&page.lru_tick);
                }
                (page, false)
            }
        };
        if !page.dirty {
            // A page just made is zeros, not what its block holds; one in flight is being
            // written in place, so its block holds neither version for sure.
            if keep_base && room_for_base && !fresh && page.writebacks == 0 {
                page.base = Some(page.data.clone());
                self.based_pages += 1;
            }
            page.dirty = true;
            self.dirty_pages += 1;
            file.dirty.insert(index);
            file.dirtied_at.get_or_insert_with(Instant::now);
        }
        page
    }

    /// Marks a written-back page clean (if it is still cached and dirty).
    pub fn mark_clean(&mut self, ino: u32, index: u64) {
        if let Some(page) = self.files.get(&ino).and_then(|f| f.pages.get(&index)) {
            if page.dirty {
                self.clean(ino, index);
                self.put_on_lru_if_evictable(ino, index);
            }
        }
    }

    /// Marks a dirty page clean and in flight: it stays cached (not evictable) until
    /// [`PageCache::end_writeback`]; a change meanwhile dirties it again. `None` if the
    /// page is not cached and dirty.
    pub fn start_writeback(&mut self, ino: u32, index: u64) -> Option<PageWriteback> {
        let page = self.files.get(&ino)?.pages.get(&index)?;
        if !page.dirty {
            return None;
        }
        self.clean(ino, index);
        let page = self.page_mut(ino, index).expect("just cleaned");
        page.writebacks += 1;
        Some(PageWriteback {
            ino,
            index,
            data: page.data.clone(),
            id: page.id,
        })
    }

    /// Whether the page `wb` was taken from is still cached (not dropped by a truncate,
    /// a punched hole or the file's deletion since), whatever it holds now.
    pub fn is_current(&self, wb: &PageWriteback) -> bool {
        self.files
            .get(&wb.ino)
            .and_then(|f| f.pages.get(&wb.index))
            .is_some_and(|page| page.id == wb.id)
    }

    /// The write of `wb` completed (`failed`: it did not reach the device, and the page
    /// is dirty again unless it was dropped or replaced meanwhile).
    pub fn end_writeback(&mut self, wb: &PageWriteback, failed: bool) {
        let Some(page) = self.page_mut(wb.ino, wb.index) else {
            return;
        };
        if page.id != wb.id {
            return;
        }
        assert!(
            page.writebacks > 0,
            "writeback of page {} ended twice",
            wb.index
        );
        page.writebacks -= 1;
        if failed && !page.dirty {
            self.make_dirty(wb.ino, wb.index);
        } else {
            self.put_on_lru_if_evictable(wb.ino, wb.index);
        }
    }

    fn page_mut(&mut self, ino: u32, index: u64) -> Option<&mut Page> {
        self.files.get_mut(&ino)?.pages.get_mut(&index)
    }

    /// Clears a dirty page's dirty bit and counts (not onto the LRU).
    fn clean(&mut self, ino: u32, index: u64) {
        let file = self.files.get_mut(&ino).expect("a cached page's file");
        let page = file.pages.get_mut(&index).expect("a cached page");
        debug_assert!(page.dirty);
        page.dirty = false;
        if page.base.take().is_some() {
            self.based_pages -= 1;
        }
        self.dirty_pages -= 1;
        let was_dirty = file.dirty.remove(&index);
        debug_assert!(
            was_dirty,
            "page {index} of {ino} dirty but not in its file's set"
        );
        if file.dirty.is_empty() {
            file.dirtied_at = None;
        }
    }

    /// Sets a clean page's dirty bit and counts (it is off the LRU).
    fn make_dirty(&mut self, ino: u32, index: u64) {
        let file = self.files.get_mut(&ino).expect("a cached page's file");
        let page = file.pages.get_mut(&index).expect("a cached page");
        debug_assert!(!page.dirty);
        page.dirty = true;
        self.dirty_pages += 1;
        file.dirty.insert(index);
        file.dirtied_at.get_or_insert_with(Instant::now);
    }

    fn put_on_lru_if_evictable(&mut self, ino: u32, index: u64) {
        self.clock += 1;
        let tick = self.clock;
        let page = self.page_mut(ino, index).expect("a cached page");
        if page.evictable() {
            page.lru_tick = tick;
            self.clean_lru.insert(tick, (ino, index));
        }
    }

    /// Indices of the dirty pages of `ino`, ascending.
    pub fn dirty_indices(&self, ino: u32) -> Vec<u64> {
        self.files
            .get(&ino)
            .map_or_else(Vec::new, |f| f.dirty.iter().copied().collect())
    }

    /// True if page `index` of `ino` is cached and dirty.
    pub fn is_dirty(&self, ino: u32, index: u64) -> bool {
        self.files
            .get(&ino)
            .and_then(|f| f.pages.get(&index))
            .is_some_and(|p| p.dirty)
    }

    /// True if `ino` has dirty pages.
    pub fn has_dirty(&self, ino: u32) -> bool {
        self.files.get(&ino).is_some_and(|f| !f.dirty.is_empty())
    }

    /// How many pages of `ino` are dirty and the lowest index among them, without listing
    /// them; `None` when none is.
    pub fn dirty_span(&self, ino: u32) -> Option<(usize, u64)> {
        let dirty = &self.files.get(&ino)?.dirty;
        Some((dirty.len(), *dirty.first()?))
    }

    /// Inodes with dirty pages, oldest dirtied first, with when they were dirtied.
    pub fn dirty_files(&self) -> Vec<(u32, Instant)> {
        let mut files: Vec<(u32, Instant)> = self
            .files
            .iter()
            .filter_map(|(ino, f)| f.dirtied_at.map(|t| (*ino, t)))
            .collect();
        files.sort_unstable_by_key(|(_, t)| *t);
        files
    }

    /// Drops every page of `ino` at or after `from_index` (truncate), dirty or not.
    pub fn truncate(&mut self, ino: u32, from_index: u64) {
        self.discard(ino, from_index, u64::MAX);
    }

    /// Drops the pages of `ino` in `[from_index, to_index)`, dirty or not.
    pub fn discard(&mut self, ino: u32, from_index: u64, to_index: u64) {
        let Some(file) = self.files.get_mut(&ino) else {
            return;
        };
        let mut removed = file.pages.split_off(&from_index);
        let mut kept_after = removed.split_off(&to_index);
        file.pages.append(&mut kept_after);
        for (index, page) in &removed {
            self.total_pages -= 1;
            if page.base.is_some() {
                self.based_pages -= 1;
            }
            if page.dirty {
                self.dirty_pages -= 1;
                file.dirty.remove(index);
            } else if page.evictable() {
                self.clean_lru.remove(&page.lru_tick);
            }
        }
        if file.dirty.is_empty() {
            file.dirtied_at = None;
        }
        if file.pages.is_empty() {
            self.files.remove(&ino);
        }
    }

    /// Drops every page of `ino` (the inode is gone).
    pub fn remove_file(&mut self, ino: u32) {
        self.truncate(ino, 0);
    }

    /// Evicts clean pages, least recently used first, until the cache is within its
    /// bound; returns how many went.
    pub fn evict_over_capacity(&mut self) -> usize {
        let mut evicted = 0;
        while self.total_pages > self.capacity_pages {
            let Some((_, (ino, index))) = self.clean_lru.pop_first() else {
                break;
            };
            let file = self
                .files
                .get_mut(&ino)
                .expect("LRU entries name cached files");
            let page = file
                .pages
                .remove(&index)
                .expect("LRU entries name cached pages");
            debug_assert!(!page.dirty, "a dirty page was on the clean LRU");
            if file.pages.is_empty() {
                self.files.remove(&ino);
            }
            self.total_pages -= 1;
            evicted += 1;
        }
        self.stats.evictions += evicted as u64;
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dirty_pages_survive_eviction_and_clean_ones_go_oldest_first() {
        let mut pc = PageCache::new(512, 16 * 512);
        for i in 0..20 {
            pc.insert_clean(1, i, Arc::from(vec![i as u8; 512]));
        }
        pc.modify(2, 0, |p| p[0] = 9);
        pc.get(1, 0);
        assert_eq!(pc.evict_over_capacity(), 5);
        assert!(pc.contains(1, 0), "recently used");
        assert!(!pc.contains(1, 1) && !pc.contains(1, 5) && pc.contains(1, 6));
        assert!(pc.contains(2, 0), "dirty pages are never evicted");
        assert_eq!(pc.dirty_indices(2), vec![0]);
        pc.modify(2, 7, |p| p[0] = 9);
        assert_eq!(pc.dirty_span(2), Some((2, 0)));
        pc.mark_clean(2, 0);
        assert_eq!(pc.dirty_span(2), Some((1, 7)));
        pc.mark_clean(2, 7);
        assert_eq!(pc.dirty_span(2), None);
        assert!(!pc.has_dirty(2));
        assert!(pc.dirty_files().is_empty());
    }

    #[test]
    fn a_page_in_flight_is_not_evicted_and_a_failed_write_dirties_it_again() {
        let mut pc = PageCache::new(512, 16 * 512);
        pc.modify(1, 0, |p| p[0] = 7);
        let wb = pc.start_writeback(1, 0).expect("dirty");
        assert!(!pc.has_dirty(1), "clean while in flight");
        for i in 0..40 {
            pc.insert_clean(2, i, Arc::from(vec![0u8; 512]));
        }
        pc.get(1, 0);
        pc.evict_over_capacity();
        assert!(
            pc.contains(1, 0),
            "in flight: the device may still hold older bytes"
        );
        pc.end_writeback(&wb, true);
        assert_eq!(
            pc.dirty_indices(1),
            vec![0],
            "a failed write leaves the page dirty"
        );
        let wb = pc.start_writeback(1, 0).expect("dirty again");
        pc.truncate(1, 0);
        pc.modify(1, 0, |p| p[0] = 8);
        let successor = pc.start_writeback(1, 0).expect("the new page");
        pc.end_writeback(&wb, false);
        for i in 40..80 {
            pc.insert_clean(2, i, Arc::from(vec![0u8; 512]));
        }
        pc.evict_over_capacity();
        assert!(
            pc.contains(1, 0),
            "the dropped page's end did not unpin its successor"
        );
        pc.end_writeback(&successor, false);
        for i in 80..120 {
            pc.insert_clean(2, i, Arc::from(vec![0u8; 512]));
        }
        pc.evict_over_capacity();
        assert!(!pc.contains(1, 0), "written and clean: evictable");
    }

    #[test]
    fn a_clean_page_keeps_its_bytes_as_base_until_it_is_clean_again() {
        let mut pc = PageCache::new(512, 64 * 512);
        pc.insert_clean(1, 0, Arc::from(vec![4u8; 512]));
        pc.modify_keeping_base(1, 0, |p| p[0] = 9);
        pc.modify_keeping_base(1, 0, |p| p[1] = 9);
        let page = pc.get(1, 0).unwrap();
        assert_eq!(page.base().map(|b| b[0]), Some(4), "the bytes while clean");
        assert_eq!((page.data()[0], page.data()[1]), (9, 9));
        pc.modify_keeping_base(1, 1, |p| p[0] = 9);
        assert!(
            pc.get(1, 1).unwrap().base().is_none(),
            "a page made by the change is zeros, not what its block holds"
        );
        pc.modify(1, 2, |_| ());
        pc.mark_clean(1, 2);
        pc.modify(1, 2, |p| p[0] = 1);
        assert!(pc.get(1, 2).unwrap().base().is_none(), "not asked for");
        pc.mark_clean(1, 0);
        pc.modify_keeping_base(1, 0, |p| p[0] = 7);
        assert_eq!(pc.get(1, 0).unwrap().base().map(|b| b[0]), Some(9));
        assert!(pc.start_writeback(1, 0).is_some());
        assert!(pc.get(1, 0).unwrap().base().is_none(), "written: no base");
        assert_eq!(pc.based_pages, 0);
        // At most an eighth of the cache's pages keep one.
        for i in 10..30 {
            pc.insert_clean(2, i, Arc::from(vec![1u8; 512]));
            pc.modify_keeping_base(2, i, |p| p[0] = 2);
        }
        assert_eq!(pc.based_pages, 64 / 8);
        pc.truncate(2, 0);
        assert_eq!(pc.based_pages, 0);
    }

    #[test]
    fn a_replaced_page_is_dirty_with_the_new_bytes_and_keeps_the_old_as_base() {
        let mut pc = PageCache::new(512, 64 * 512);
        pc.insert_clean(1, 0, Arc::from(vec![4u8; 512]));
        pc.replace(1, 0, Arc::from(vec![5u8; 512]), true);
        let page = pc.get(1, 0).unwrap();
        assert_eq!(page.data()[..], [5u8; 512][..]);
        assert_eq!(page.base().map(|b| b[0]), Some(4), "the bytes while clean");
        pc.replace(1, 0, Arc::from(vec![6u8; 512]), true);
        assert_eq!(
            pc.get(1, 0).unwrap().base().map(|b| b[0]),
            Some(4),
            "a dirty page's base stays what it held while clean"
        );
        pc.replace(1, 3, Arc::from(vec![1u8; 512]), true);
        assert!(
            pc.get(1, 3).unwrap().base().is_none(),
            "a new page has no base"
        );
        assert_eq!(pc.dirty_indices(1), vec![0, 3]);
        assert_eq!(pc.stats().dirty_pages, 2);
    }

    #[test]
    fn truncate_drops_pages_and_dirty_counts() {
        let mut pc = PageCache::new(512, 1 << 20);
        for i in 0..8 {
            pc.modify(3, i, |p| p[0] = 1);
        }
        pc.truncate(3, 4);
        assert_eq!(pc.dirty_indices(3), vec![0, 1, 2, 3]);
        assert_eq!(pc.stats().dirty_pages, 4);
        pc.remove_file(3);
        assert_eq!(
            pc.stats(),
            PageCacheStats {
                misses: 0,
                ..PageCacheStats::default()
            }
        );
    }

    proptest! {
        /// Counters and the LRU agree with the pages after any sequence of operations.
        #[test]
        fn bookkeeping_matches_the_pages(ops in prop::collection::vec((0u8..12, 0u32..3, 0u64..12), 1..200)) {
            let mut pc = PageCache::new(64, 10 * 64);
            let mut in_flight: Vec<PageWriteback> = Vec::new();
            for (op, ino, index) in ops {
                match op {
                    6 => in_flight.extend(pc.start_writeback(ino, index)),
                    7 | 8 if !in_flight.is_empty() => {
                        let wb = in_flight.remove(index as usize % in_flight.len());
                        pc.end_writeback(&wb, op == 8);
                    }
                    7 | 8 => {}
                    0 => pc.insert_clean(ino, index, Arc::from(vec![0u8; 64])),
                    1 => pc.modify(ino, index, |p| p[0] ^= 1),
                    9 => pc.modify_keeping_base(ino, index, |p| p[0] ^= 1),
                    10 | 11 => pc.replace(ino, index, Arc::from(vec![7u8; 64]), op == 11),
                    2 => pc.mark_clean(ino, index),
                    3 => pc.truncate(ino, index),
                    5 => pc.discard(ino, index, index + 3),
                    4 => { pc.evict_over_capacity(); }
                    _ => unreachable!(),
                }
                let pages: usize = pc.files.values().map(|f| f.pages.len()).sum();
                let dirty: usize = pc.files.values().flat_map(|f| f.pages.values()).filter(|p| p.dirty).count();
                prop_assert_eq!(pages, pc.total_pages);
                prop_assert_eq!(dirty, pc.dirty_pages);
                let based: Vec<&Page> = pc.files.values().flat_map(|f| f.pages.values()).filter(|p| p.base.is_some()).collect();
                prop_assert_eq!(based.len(), pc.based_pages);
                prop_assert!(based.len() <= pc.capacity_pages / 8);
                prop_assert!(based.iter().all(|p| p.dirty && p.writebacks == 0), "only dirty pages not in flight keep a base");
                let pinned = pc.files.values().flat_map(|f| f.pages.values()).filter(|p| !p.dirty && p.writebacks > 0).count();
                prop_assert_eq!(pages - dirty - pinned, pc.clean_lru.len());
                for wb in &in_flight {
                    let live = pc.files.get(&wb.ino).and_then(|f| f.pages.get(&wb.index)).filter(|p| p.id == wb.id);
                    if let Some(page) = live {
                        prop_assert!(page.writebacks > 0, "a page whose write is in flight is pinned");
                    }
                }
                for f in pc.files.values() {
                    let dirty: BTreeSet<u64> = f.pages.iter().filter(|(_, p)| p.dirty).map(|(i, _)| *i).collect();
                    prop_assert_eq!(&dirty, &f.dirty);
                    prop_assert_eq!(!f.dirty.is_empty(), f.dirtied_at.is_some());
                }
            }
        }
    }
}
