//! The file system's locks and the one order they are taken in.
//!
//! Operations on different files run at once. What keeps them apart, outermost first:
//!
//! 1. **The changes gate** (`FsInner::gate`, a read-write lock). Every operation holds it
//!    shared ([`crate::op::Op`]); what must see the file system still (remount, a
//!    journal-mode switch, fsck, debug, mount-time recovery, unmount) holds it exclusive,
//!    and may then lock inodes in any order, since nothing else runs.
//! 2. **The rename lock** (`FsInner::rename_lock`): a rename between two directories
//!    holds it, so that which directory is an ancestor of which cannot change while it
//!    locks them (Linux's `s_vfs_rename_mutex`).
//! 3. **Inode locks** (one per cached inode, `crate::inode_table`): an operation locks
//!    every inode it changes before it opens its journal handle, and holds them to its
//!    end. Directories come first, each after the directory it is found in (a parent
//!    before its entries); with the rename lock held, two unrelated directories in
//!    inode-number order; then every other inode, in ascending inode number. An inode
//!    made by the operation itself is locked inside its handle: nobody else can reach it.
//! 4. **The journal handle** (`Journal::start`). A thread holding a handle never waits for
//!    an inode lock: the holder might be waiting in `Journal::start` for a commit, which
//!    waits for this handle to stop.
//! 5. **Leaf locks** ([`Leaf`]): short critical sections over shared memory (a group's
//!    bitmaps, the superblock, the page cache, ...), taken in the order of their [`Rank`]
//!    and never held across device IO (group locks excepted: they may read the group's
//!    bitmap and the descriptor table, once, before those stay cached), a handle start,
//!    an inode lock or a commit wait.
//!
//! Inode locks are held across reads of the inode's own metadata and data (as Linux holds
//! `i_rwsem`), never across a wait for data writes or a commit: fsync and writeback
//! release them first (`file::writeback`). Between the gate and the inode locks sits a
//! file's writeback ownership (`file::ownership`, Linux's `I_SYNC`): taken with no inode
//! lock held, kept while the file's data transfers.
//!
//! Every inode acquisition is checked against the order in every build (`Op` knows what
//! it holds); debug builds also check the leaf order and what may happen under a leaf (a
//! thread-local record of what the thread holds). Either panics at the first violation,
//! naming both locks. Must never be bypassed: every lock of the file system is one of
//! these.

use parking_lot::{Mutex, MutexGuard};
use std::ops::{Deref, DerefMut};

/// The leaf locks, innermost last: a thread holding one may take only a later one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    /// A block group's bitmaps and descriptor (several groups: ascending group number).
    Group,
    /// The on-disk orphan list.
    Orphans,
    /// The superblock as it is in memory.
    Superblock,
    /// What fast commits remember between fsyncs.
    FastCommits,
    /// Free and reserved block and inode counts.
    Totals,
    /// Blocks freed by transactions that are not durable.
    PendingFrees,
    /// The map from inode number to cached inode (eviction looks at the page cache).
    InodeTable,
    /// The page cache.
    Pages,
    /// The error that stopped writes.
    Error,
    /// `data=adaptive`'s remembered names (`crate::adaptive_journal`).
    AdaptiveJournal,
    /// Counters for reports.
    Stats,
}

/// A mutex at a fixed place in the leaf order. (The journal's and the caches' own locks,
/// inside their crates, come after all of these.)
pub(crate) struct Leaf<T> {
    rank: Rank,
    inner: Mutex<T>,
}

impl<T> Leaf<T> {
    pub const fn new(rank: Rank, value: T) -> Leaf<T> {
        Leaf {
            rank,
            inner: Mutex::new(value),
        }
    }

    /// Locks it; debug builds check the order (see the module documentation).
    pub fn lock(&self) -> LeafGuard<'_, T> {
        held::enter_leaf(self.rank);
        LeafGuard {
            rank: self.rank,
            guard: self.inner.lock(),
        }
    }
}

pub(crate) struct LeafGuard<'a, T> {
    rank: Rank,
    guard: MutexGuard<'a, T>,
}

impl<T> Deref for LeafGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for LeafGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for LeafGuard<'_, T> {
    fn drop(&mut self) {
        held::leave_leaf(self.rank);
    }
}

/// Checks that nothing forbids device IO here: no leaf lock is held but a group's.
pub(crate) fn may_do_io(what: &str) {
    held::check_no_leaf(what);
}

/// The checks themselves: a thread-local record in debug builds, nothing in release.
#[cfg(debug_assertions)]
pub(crate) mod held {
    use super::Rank;
    use std::cell::RefCell;

    #[derive(Default)]
    struct Held {
        leaves: Vec<Rank>,
        gate: bool,
        exclusive: bool,
        handles: u32,
    }

    thread_local! {
        static HELD: RefCell<Held> = RefCell::new(Held::default());
    }

    pub fn enter_leaf(rank: Rank) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(&last) = h.leaves.last() {
                // Strictly later: groups share locks, so one thread holds one group's.
                assert!(
                    rank > last,
                    "lock order: {rank:?} taken while holding {last:?}"
                );
            }
            h.leaves.push(rank);
        });
    }

    pub fn leave_leaf(rank: Rank) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let at = h
                .leaves
                .iter()
                .rposition(|&r| r == rank)
                .expect("a leaf lock released that was not held");
            h.leaves.remove(at);
        });
    }

    pub fn check_no_leaf(what: &str) {
        HELD.with(|h| {
            let h = h.borrow();
            assert!(
                h.leaves.iter().all(|&r| r == Rank::Group),
                "lock order: {what} while holding {:?}",
                h.leaves
            );
        });
    }

    /// Before an inode lock: no leaf lock, and no handle unless the gate is exclusive.
    pub fn check_inode_lock(ino: u32) {
        HELD.with(|h| {
            let h = h.borrow();
            assert!(
                h.leaves.is_empty(),
                "lock order: inode {ino} locked while holding {:?}",
                h.leaves
            );
            assert!(
                h.handles == 0 || h.exclusive,
                "lock order: inode {ino} locked while this thread holds a journal handle"
            );
        });
    }

    pub fn enter_gate(exclusive: bool) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            assert!(!h.gate, "the changes gate taken twice by one thread");
            assert!(
                h.leaves.is_empty(),
                "the changes gate taken under {:?}",
                h.leaves
            );
            h.gate = true;
            h.exclusive = exclusive;
        });
    }

    pub fn leave_gate() {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            h.gate = false;
            h.exclusive = false;
        });
    }

    pub fn enter_handle() {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            assert!(
                h.leaves.is_empty(),
                "lock order: a journal handle started while holding {:?}",
                h.leaves
            );
            h.handles += 1;
        });
    }

    pub fn leave_handle() {
        HELD.with(|h| h.borrow_mut().handles -= 1);
    }
}

#[cfg(not(debug_assertions))]
pub(crate) mod held {
    use super::Rank;

    #[inline(always)]
    pub fn enter_leaf(_: Rank) {}
    #[inline(always)]
    pub fn leave_leaf(_: Rank) {}
    #[inline(always)]
    pub fn check_no_leaf(_: &str) {}
    #[inline(always)]
    pub fn check_inode_lock(_: u32) {}
    #[inline(always)]
    pub fn enter_gate(_: bool) {}
    #[inline(always)]
    pub fn leave_gate() {}
    #[inline(always)]
    pub fn enter_handle() {}
    #[inline(always)]
    pub fn leave_handle() {}
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn leaves_nest_in_rank_order_only() {
        let pages = Leaf::new(Rank::Pages, ());
        let sb = Leaf::new(Rank::Superblock, ());
        {
            let _a = sb.lock();
            let _b = pages.lock();
        }
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _a = pages.lock();
            let _b = sb.lock();
        }));
        let err = caught.expect_err("a leaf taken out of order panics");
        let text = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            text.contains("Superblock taken while holding Pages"),
            "{text}"
        );
    }

    #[test]
    fn io_under_a_leaf_lock_panics() {
        let pages = Leaf::new(Rank::Pages, ());
        may_do_io("a read with nothing held");
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _a = pages.lock();
            may_do_io("a read");
        }));
        assert!(caught.is_err());
    }
}
