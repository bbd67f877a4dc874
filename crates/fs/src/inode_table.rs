//! The inode cache: every inode in memory behind a lock of its own, so that operations on
//! different files run at once.
//!
//! The table maps inode numbers to `Arc<Mutex<InodeInfo>>`; the table's own lock is a leaf
//! ([`Rank::InodeTable`]) held only to look a slot up, add or drop one. An operation clones
//! a slot's `Arc`, releases the table, and then locks the inode ([`crate::op::Op::lock`]);
//! after locking it checks that the slot is still the table's (a deleted inode's slot is
//! dropped, and a slot nobody holds may be evicted), and starts over if not.
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
use jext_journal::{tid_gt, Tid};
use parking_lot::Mutex;
use std::collections::HashMap;
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
    inodes: HashMap<u32, InodeRef>,
    /// The size at which the next eviction is tried (see `make_room`).
    evict_at: usize,
}

impl InodeTable {
    pub fn new() -> InodeTable {
        InodeTable {
            slots: Leaf::new(
                Rank::InodeTable,
                Slots {
                    inodes: HashMap::new(),
                    evict_at: 0,
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
        // A deleted inode keeps its mode on disk: without a link, the bitmap decides
        // (an orphan is still in use; a deleted one must not come back into the cache,
        // where its number's next owner would find it).
        let unused =
            raw.links_count() == 0 && (raw.mode() == 0 || !crate::alloc::inode_in_use(fs, ino)?);
        if unused {
            return Err(FsError::Inconsistent(format!("inode {ino} is not in use")));
        }
        Ok(self.insert(fs, ino, raw, false))
    }

    /// Adds a new inode (just allocated: nobody else can know its number yet).
    pub fn insert_new(&self, fs: &FsInner, ino: u32, raw: Inode) -> InodeRef {
        self.insert(fs, ino, raw, true)
    }

    fn insert(&self, fs: &FsInner, ino: u32, raw: Inode, new: bool) -> InodeRef {
        let mut info = InodeInfo::new(raw);
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
        make_room(fs, &mut slots, durable);
        let slot = Arc::new(Mutex::new(info));
        slots.inodes.insert(ino, slot.clone());
        slot
    }

    /// Drops `ino` (deleted): whoever still holds its slot finds it is not current.
    pub fn remove(&self, ino: u32) {
        self.slots.lock().inodes.remove(&ino);
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

/// Before an inode joins the cache: once it holds [`INODE_CACHE_LIMIT`] inodes, drops
/// those nobody holds and nothing waits for. When too few can go (files created in a
/// transaction not yet durable stay), the next try waits until the cache grew by an
/// eighth, so a million creates do not scan the cache on every one.
fn make_room(fs: &FsInner, slots: &mut Slots, durable: Tid) {
    let limit = INODE_CACHE_LIMIT.max(slots.evict_at);
    if slots.inodes.len() < limit {
        return;
    }
    let pending = |tid: Option<Tid>| tid.is_some_and(|t| tid_gt(t, durable));
    let pages = fs.pages.lock();
    slots.inodes.retain(|ino, slot| {
        // Held by someone (a clone of the slot exists) or locked: keep.
        if Arc::strong_count(slot) > 1 {
            return true;
        }
        let Some(info) = slot.try_lock() else {
            return true;
        };
        info.open_count > 0
            || info.dirty
            || info.fc.is_live(durable)
            || pending(info.sync_tid)
            || pending(info.datasync_tid)
            || !info.reserved_pages.is_empty()
            || pages.has_dirty(*ino)
    });
    // An eighth of what stayed, not of the limit: with half a million inodes pinned by
    // an uncommitted transaction, a fixed step made every 8,192nd create scan them all.
    let kept = slots.inodes.len();
    slots.evict_at = match kept >= INODE_CACHE_LIMIT {
        true => kept + kept / 8,
        false => 0,
    };
}
