//! The inode cache: every inode in memory behind a lock of its own, so that operations on
//! different files run at once.
//!
//! The table maps inode numbers to `Arc<Mutex<InodeInfo>>`; the table's own lock is a leaf
//! ([`Rank::InodeTable`]) held only to look a slot up, add or drop one. An operation clones
//! a slot's `Arc`, releases the table, and then locks the inode ([`crate::op::Op::lock`]);
//! after locking it checks that the slot is still the table's (a deleted inode's slot is
//! dropped, and a slot nobody holds may be evicted), and starts over if not.
//!
//! Eviction goes oldest first: the table remembers the order in which inodes came in, and
//! once it is full drops the oldest unpinned ones until an eighth of the room is free, so
//! a create costs the same whether the cache holds 10^4 or 10^6 inodes pinned by an
//! uncommitted transaction (a scan of the whole cache, and the frees of everything
//! evictable at once, made the last tenth of a 10^6-name directory slower than the first).
//!
//! A file that journals its data in memory only (`InodeInfo::journals_in_memory`) may
//! leave while the log still holds copies of its blocks; the table remembers its number
//! and last journaled transaction, and loads it journaling again until the checkpoint
//! passed that transaction (then its blocks' buffers are dropped first, since an
//! ordered file's reads must find none).
//!
//! Promises: a record is read from disk with nothing locked; a slot that anyone holds (its
//! `Arc` cloned) or whose inode has anything not yet durable or written back is never
//! evicted, since fsync waits for the tids it remembers and a reloaded record would not
//! know them. Must never block on an inode lock while holding the table (eviction only
//! tries them).

use crate::error::{FsError, FsResult};
use crate::format::inode::Inode;
use crate::lock_order::{Leaf, Rank};
use crate::state::{FsInner, InodeInfo};
use jext_cache::NumberMap;
use jext_journal::{tid_gt, Tid};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Inodes kept in memory before unused ones are dropped.
const INODE_CACHE_LIMIT: usize = 65_536;

/// One cached inode and its lock.
pub(crate) type InodeRef = Arc<Mutex<InodeInfo>>;

pub(crate) struct InodeTable {
    slots: Leaf<Slots>,
    /// Source of [`InodeInfo::data_seq`] and [`InodeInfo::journaled_changes`] values: each
    /// is used once, so a value seen before an inode was evicted never matches after it is
    /// loaded again.
    next_seq: AtomicU64,
}

struct Slots {
    inodes: NumberMap<u32, InodeRef>,
    /// Inode numbers in the order their slots came in, oldest first: where eviction looks.
    /// A number whose slot was dropped (or dropped and loaded again) may stay behind; the
    /// queue is compacted when such leftovers outnumber the slots (see `remember`).
    order: VecDeque<u32>,
    /// The size at which the next eviction is tried (see `make_room`).
    evict_at: usize,
    /// The durable tid when eviction last stopped at an inode of a later transaction:
    /// nothing is tried again until another commit is durable.
    stalled_at: Option<Tid>,
    /// Evicted files that journaled their data in memory: the last transaction that
    /// journaled a block of each.
    journaling_evicted: HashMap<u32, Tid>,
}

impl Slots {
    /// Adds a slot for `ino`, remembered as the newest.
    fn remember(&mut self, ino: u32, slot: InodeRef) {
        self.inodes.insert(ino, slot);
        self.order.push_back(ino);
        if self.order.len() > 2 * self.inodes.len().max(INODE_CACHE_LIMIT) {
            // Creates and deletes under the limit never evict, so nothing else drains the
            // numbers of deleted inodes.
            let mut seen = HashSet::with_capacity(self.inodes.len());
            let inodes = &self.inodes;
            self.order
                .retain(|ino| inodes.contains_key(ino) && seen.insert(*ino));
        }
    }
}

impl InodeTable {
    pub fn new() -> InodeTable {
        InodeTable {
            slots: Leaf::new(
                Rank::InodeTable,
                Slots {
                    inodes: NumberMap::default(),
                    order: VecDeque::new(),
                    evict_at: 0,
                    stalled_at: None,
                    journaling_evicted: HashMap::new(),
                },
            ),
            next_seq: AtomicU64::new(0),
        }
    }

    /// A value never handed out before (see [`InodeTable::next_seq`]).
    pub fn take_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The slot of `ino` if it is cached.
    pub fn cached(&self, ino: u32) -> Option<InodeRef> {
        self.slots.lock().inodes.get(&ino).cloned()
    }

    /// Whether `slot` is still the table's slot for `ino` (not deleted nor evicted since
    /// it was looked up).
    pub fn is_current(&self, ino: u32, slot: &InodeRef) -> bool {
        self.slots
            .lock()
            .inodes
            .get(&ino)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
    }

    /// The slot of `ino`, its record read from disk (with nothing locked) if it is not
    /// cached. An inode not in use is an inconsistency: a name or handle pointed at it.
    pub fn load(&self, fs: &FsInner, ino: u32) -> FsResult<InodeRef> {
        if let Some(slot) = self.cached(ino) {
            return Ok(slot);
        }
        let raw = crate::inodes::read_record(fs, ino)?;
        let journaling = self.journaling_after_eviction(fs, ino, &raw)?;
        // A deleted inode keeps its mode on disk: without a link, the bitmap decides
        // (an orphan is still in use; a deleted one must not come back into the cache,
        // where its number's next owner would find it).
        let unused =
            raw.links_count() == 0 && (raw.mode() == 0 || !crate::alloc::inode_in_use(fs, ino)?);
        if unused {
            return Err(FsError::Inconsistent(format!("inode {ino} is not in use")));
        }
        let mut info = InodeInfo::new(raw);
        info.journals_in_memory = journaling.is_some();
        info.journaled_data_tid = journaling;
        Ok(self.insert(fs, ino, info, false))
    }

    /// The last transaction that journaled data of `ino` (record `raw`, not cached) if it
    /// journaled in memory when evicted and the log may still hold copies of its blocks.
    /// Once the checkpoint passed them, drops its blocks' buffers and forgets it. Only
    /// looks at the memory without taking from it, so that two loads racing agree.
    fn journaling_after_eviction(
        &self,
        fs: &FsInner,
        ino: u32,
        raw: &Inode,
    ) -> FsResult<Option<Tid>> {
        let Some(tid) = self.slots.lock().journaling_evicted.get(&ino).copied() else {
            return Ok(None);
        };
        if !fs.journal.checkpointed_through(tid) {
            return Ok(Some(tid));
        }
        crate::journal_mode::forget_cached_blocks(fs, ino, raw)?;
        let mut slots = self.slots.lock();
        if slots.journaling_evicted.get(&ino) == Some(&tid) {
            slots.journaling_evicted.remove(&ino);
        }
        Ok(None)
    }

    /// Adds a new inode (just allocated: nobody else can know its number yet).
    pub fn insert_new(&self, fs: &FsInner, ino: u32, raw: Inode) -> InodeRef {
        self.slots.lock().journaling_evicted.remove(&ino);
        self.insert(fs, ino, InodeInfo::new(raw), true)
    }

    fn insert(&self, fs: &FsInner, ino: u32, mut info: InodeInfo, new: bool) -> InodeRef {
        info.data_seq = self.take_seq();
        let durable = fs.journal.committed_tid();
        let mut slots = self.slots.lock();
        match slots.inodes.get(&ino) {
            // Another thread loaded it meanwhile.
            Some(slot) if !new => return slot.clone(),
            // A new inode's number was free in the bitmap, so what the cache holds under
            // it is a deleted inode a stale lookup loaded back in the moment between its
            // record's last write and its bit's clearing: it goes, and whoever holds it
            // finds it is no longer current.
            _ => {}
        }
        // The page cache's lock only for an inode that is otherwise free to go.
        let mut pages = None;
        make_room(&mut slots, durable, |ino| {
            pages.get_or_insert_with(|| fs.pages.lock()).has_dirty(ino)
        });
        let slot = Arc::new(Mutex::new(info));
        slots.remember(ino, slot.clone());
        slot
    }

    /// Drops `ino` (deleted): whoever still holds its slot finds it is not current.
    pub fn remove(&self, ino: u32) {
        let mut slots = self.slots.lock();
        slots.inodes.remove(&ino);
        slots.journaling_evicted.remove(&ino);
    }

    /// Inodes whose times changed and are in no transaction yet, and every inode locked
    /// right now (its holder may be changing them): the caller locks each and looks.
    pub fn dirty_inodes(&self) -> Vec<u32> {
        let slots = self.slots.lock();
        let mut dirty: Vec<u32> = slots
            .inodes
            .iter()
            .filter(|(_, slot)| slot.try_lock().is_none_or(|info| info.dirty))
            .map(|(ino, _)| *ino)
            .collect();
        dirty.sort_unstable();
        dirty
    }
}

/// Evictions per insert at most: the cache drains a little at each insert instead of
/// freeing a transaction's worth of inodes at once when it commits. A few more than one,
/// so a commit's backlog (a commit interval of creates, held until durable) drains in
/// about a third of the next interval rather than in one burst: at 64, the tenth of a
/// 10^6-name directory that held a durable commit ran at half the rate of the others.
const EVICT_PER_INSERT: usize = 4;

/// Inodes of transactions not yet durable met in a row at the front of the queue that
/// stop an eviction: the running transaction's own (a single one may be an old inode
/// changed again, such as the directory being filled, which goes to the back).
const PENDING_RUN: usize = 8;

/// What eviction may do with a cached inode.
enum Keep {
    /// Nobody holds it and nothing waits for it.
    No,
    /// Changed in a transaction not yet durable.
    Pending,
    /// Held, locked, open, dirty, or with dirty pages.
    Held,
}

/// Before an inode joins the cache: once it holds [`INODE_CACHE_LIMIT`] inodes, drops the
/// oldest that nobody holds and nothing waits for (at most [`EVICT_PER_INSERT`]), until
/// an eighth of the limit is free; the others go to the back. It stops at a run of
/// [`PENDING_RUN`] inodes of transactions not yet durable: the inodes behind them came in
/// later (files created in the running transaction), so a few looks at the front replace
/// a walk of all of them, and the next look waits for a commit to become durable. When a
/// whole walk found too few to drop, the next try waits until the cache grew by an
/// eighth.
fn make_room(slots: &mut Slots, durable: Tid, mut has_dirty_pages: impl FnMut(u32) -> bool) {
    let limit = INODE_CACHE_LIMIT.max(slots.evict_at);
    if slots.inodes.len() < limit || slots.stalled_at == Some(durable) {
        return;
    }
    let target = INODE_CACHE_LIMIT - INODE_CACHE_LIMIT / 8;
    let pending = |tid: Option<Tid>| tid.is_some_and(|t| tid_gt(t, durable));
    let mut keep = |ino: u32, slot: &InodeRef| {
        // Held by someone (a clone of the slot exists) or locked: keep.
        if Arc::strong_count(slot) > 1 {
            return Keep::Held;
        }
        let busy = {
            let Some(info) = slot.try_lock() else {
                return Keep::Held;
            };
            if info.fc.is_live(durable) || pending(info.sync_tid) || pending(info.datasync_tid) {
                return Keep::Pending;
            }
            info.open_count > 0 || info.dirty || !info.reserved_pages.is_empty()
        };
        match busy || has_dirty_pages(ino) {
            true => Keep::Held,
            false => Keep::No,
        }
    };
    let (mut evicted, mut pending_run, mut at_pending) = (0, 0, false);
    // One walk of the queue at most: what is held now stays held during it.
    for _ in 0..slots.order.len() {
        if slots.inodes.len() <= target || evicted == EVICT_PER_INSERT {
            break;
        }
        let Some(ino) = slots.order.pop_front() else {
            break;
        };
        let Some(slot) = slots.inodes.get(&ino) else {
            continue; // dropped since: a leftover number
        };
        let verdict = keep(ino, slot);
        pending_run = match verdict {
            Keep::Pending => pending_run + 1,
            _ => 0,
        };
        match verdict {
            Keep::No => {
                if let Some(slot) = slots.inodes.remove(&ino) {
                    remember_journaling(&mut slots.journaling_evicted, ino, &slot);
                }
                evicted += 1;
            }
            Keep::Pending | Keep::Held => slots.order.push_back(ino),
        }
        if pending_run == PENDING_RUN {
            at_pending = true;
            break;
        }
    }
    // After a whole walk that freed too little, an eighth of what stayed, not of the
    // limit: with half a million inodes held, a fixed step made every 8,192nd create walk
    // them all. Stopped at the per-insert bound, the next insert goes on; stopped at a
    // run of pending inodes, the first insert after the next durable commit.
    let kept = slots.inodes.len();
    slots.evict_at = match kept >= INODE_CACHE_LIMIT && !at_pending && evicted < EVICT_PER_INSERT {
        true => kept + kept / 8,
        false => 0,
    };
    slots.stalled_at = at_pending.then_some(durable);
}

/// Remembers `ino`, evicted, if it journals its data in memory and journaled some: the
/// log may hold copies of its blocks, which a reload as an ordered file would not read.
fn remember_journaling(memory: &mut HashMap<u32, Tid>, ino: u32, slot: &InodeRef) {
    let info = slot.try_lock().expect("an evicted inode is not locked");
    match (info.journals_in_memory, info.journaled_data_tid) {
        (true, Some(tid)) => memory.insert(ino, tid),
        _ => memory.remove(&ino),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots() -> Slots {
        Slots {
            inodes: NumberMap::default(),
            order: VecDeque::new(),
            evict_at: 0,
            stalled_at: None,
            journaling_evicted: HashMap::new(),
        }
    }

    /// Adds `ino` as an insert does, changed in transaction `tid` if any.
    fn add(slots: &mut Slots, ino: u32, tid: Option<Tid>, durable: Tid) -> InodeRef {
        make_room(slots, durable, |_| false);
        let mut info = InodeInfo::new(Inode::new(256, 32));
        info.sync_tid = tid;
        let slot = Arc::new(Mutex::new(info));
        slots.remember(ino, slot.clone());
        slot
    }

    #[test]
    fn eviction_drops_the_oldest_and_keeps_the_cache_bounded() {
        let mut s = slots();
        let total = 3 * INODE_CACHE_LIMIT as u32;
        for ino in 1..=total {
            add(&mut s, ino, None, 0);
            assert!(s.inodes.len() <= INODE_CACHE_LIMIT, "at {ino}");
        }
        assert!(s.inodes.contains_key(&total) && !s.inodes.contains_key(&1));
        // Every number still queued is cached: evicted ones left the queue.
        assert_eq!(s.order.len(), s.inodes.len());
    }

    #[test]
    fn an_old_inode_changed_again_does_not_stop_eviction_and_is_kept() {
        // The directory being filled: first in, changed by every create.
        let mut s = slots();
        add(&mut s, 1, Some(5), 4);
        for ino in 2..=2 * INODE_CACHE_LIMIT as u32 {
            add(&mut s, ino, None, 4);
        }
        assert!(s.inodes.len() <= INODE_CACHE_LIMIT);
        assert!(s.inodes.contains_key(&1), "a change not yet durable stays");
    }

    #[test]
    fn a_transaction_not_yet_durable_stays_until_it_is() {
        let mut s = slots();
        let limit = INODE_CACHE_LIMIT as u32;
        for ino in 1..=limit {
            add(&mut s, ino, Some(2), 1);
        }
        // More of the running transaction: nothing can go, and each insert looks at a
        // few inodes only (the stall), so the cache grows past the limit.
        for ino in limit + 1..=limit + 1000 {
            add(&mut s, ino, Some(2), 1);
        }
        assert_eq!(s.inodes.len(), INODE_CACHE_LIMIT + 1000);
        assert_eq!(s.stalled_at, Some(1));
        // Durable now: the oldest go, a bounded number per insert.
        for ino in limit + 1001..=limit + 3000 {
            add(&mut s, ino, None, 2);
        }
        assert!(s.inodes.len() <= INODE_CACHE_LIMIT);
        // (The few the stall looked at went to the back of the queue.)
        assert!(!s.inodes.contains_key(&100) && s.inodes.contains_key(&(limit + 3000)));
    }

    #[test]
    fn held_open_dirty_or_paged_inodes_are_never_evicted() {
        let mut s = slots();
        let held = add(&mut s, 1, None, 0);
        add(&mut s, 2, None, 0).lock().open_count = 1;
        add(&mut s, 3, None, 0).lock().dirty = true;
        add(&mut s, 4, None, 0);
        for ino in 5..=2 * INODE_CACHE_LIMIT as u32 {
            make_room(&mut s, 0, |ino| ino == 4);
            let slot = Arc::new(Mutex::new(InodeInfo::new(Inode::new(256, 32))));
            s.remember(ino, slot);
        }
        assert!(s.inodes.len() <= INODE_CACHE_LIMIT);
        for ino in 1..=4 {
            assert!(s.inodes.contains_key(&ino), "inode {ino} was evicted");
        }
        drop(held);
    }

    #[test]
    fn an_evicted_file_journaling_in_memory_is_remembered_with_its_last_tid() {
        let mut s = slots();
        let journaled = add(&mut s, 1, None, 0);
        {
            let mut info = journaled.lock();
            info.journals_in_memory = true;
            info.journaled_data_tid = Some(7);
        }
        drop(journaled);
        // Switched on, but nothing journaled yet: the log holds none of its blocks.
        add(&mut s, 2, None, 0).lock().journals_in_memory = true;
        for ino in 3..=2 * INODE_CACHE_LIMIT as u32 {
            add(&mut s, ino, None, 0);
        }
        assert!(!s.inodes.contains_key(&1) && !s.inodes.contains_key(&2));
        assert_eq!(s.journaling_evicted, HashMap::from([(1, 7)]));
    }

    #[test]
    fn numbers_of_dropped_inodes_do_not_pile_up_in_the_queue() {
        let mut s = slots();
        for ino in 1..=10 * INODE_CACHE_LIMIT as u32 {
            add(&mut s, ino, None, 0);
            s.inodes.remove(&ino); // deleted: `InodeTable::remove`
        }
        assert!(s.order.len() <= 2 * INODE_CACHE_LIMIT + 1);
    }
}
