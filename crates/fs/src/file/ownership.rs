//! Writeback ownership: one writeback of a file at a time (Linux's `I_SYNC`).
//!
//! A writeback batch releases the file's inode while its data transfers, so the inode lock
//! alone does not keep two writebacks of one file apart. Ownership does: a writeback
//! (and fsync, which must wait for writes another thread has in flight for the file, as
//! Linux's fsync waits on `PG_writeback`) owns the file from before it looks at the dirty
//! pages until its last batch marked its blocks written. While one owns a file, nobody
//! else allocates blocks for its pages, and a writeback that ended has its data on the
//! device and its mapping in a transaction.
//!
//! Order (`crate::lock_order`): ownership is taken with the changes gate held shared and no
//! inode lock (an owner needs the inode's lock to finish); the set's own mutex is held
//! only to look and to change it, never across anything else. An exclusive operation
//! never waits here: owners hold the gate shared, so while it runs nobody owns a file.
//!
//! Must never: be held by a thread that waits for the gate (an owner finishes under the
//! gate it already holds), or be waited for with an inode lock held.

use parking_lot::{Condvar, Mutex};
use std::collections::HashSet;

#[derive(Default)]
pub(crate) struct WritebackOwners {
    owned: Mutex<HashSet<u32>>,
    released: Condvar,
}

/// The ownership of one file's writeback, given back on drop.
#[must_use = "ownership ends when this is dropped"]
pub(crate) struct Owned<'fs> {
    owners: &'fs WritebackOwners,
    ino: u32,
}

impl WritebackOwners {
    /// Owns `ino`'s writeback if nobody does.
    pub fn try_own(&self, ino: u32) -> Option<Owned<'_>> {
        let inserted = self.owned.lock().insert(ino);
        // Lazily: an `Owned` made and dropped would give back the current owner's claim.
        inserted.then(|| Owned { owners: self, ino })
    }

    /// Owns `ino`'s writeback, waiting for the current owner. The caller holds no inode.
    pub fn own(&self, ino: u32) -> Owned<'_> {
        crate::lock_order::held::check_no_leaf("waiting for a file's writeback");
        let mut owned = self.owned.lock();
        while !owned.insert(ino) {
            self.released.wait(&mut owned);
        }
        Owned { owners: self, ino }
    }
}

impl Drop for Owned<'_> {
    fn drop(&mut self) {
        let removed = self.owners.owned.lock().remove(&self.ino);
        debug_assert!(removed, "writeback of inode {} owned twice", self.ino);
        self.owners.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_second_owner_waits_for_the_first() {
        let owners = WritebackOwners::default();
        let first = owners.own(7);
        assert!(owners.try_own(7).is_none());
        assert!(owners.try_own(8).is_some(), "another file is free");
        let released = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                let _second = owners.own(7);
                released.load(Ordering::SeqCst)
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            released.store(true, Ordering::SeqCst);
            drop(first);
            assert!(waiter.join().unwrap(), "the second owner went first");
        });
        assert!(owners.try_own(7).is_some(), "given back on drop");
    }
}
