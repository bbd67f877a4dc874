//! One file system operation: the changes gate it holds and the inodes it has locked.
//!
//! Every library call builds an [`Op`], locks the inodes it will read or change in the
//! order `crate::lock_order` prescribes (saying how each is reached: [`Reach`]), opens
//! its journal handle (`crate::tx::Tx`) only after that, and drops the `Op` at the end,
//! which releases the inodes, then the rename lock, then the gate. An inode is read and
//! changed only through the `Op` that holds it ([`Op::inode`], [`Op::inode_mut`]): using
//! one without its lock is a bug and panics, naming it.
//!
//! An exclusive `Op` holds the gate alone: no other operation runs, so it may lock inodes
//! in any order and at any time, also inside a handle (mount-time recovery, fsck, a
//! journal-mode switch, remount, unmount).
//!
//! Promises: every inode acquisition is checked against the order (in release builds too)
//! and panics at the first violation. Must never take the gate twice in one thread (an exclusive waiter would
//! deadlock against the thread's own shared hold).

use crate::error::FsResult;
use crate::format::inode::Inode;
use crate::inode_table::InodeRef;
use crate::lock_order::held;
use crate::state::{FsInner, InodeInfo};
use parking_lot::{ArcMutexGuard, MutexGuard, RawMutex, RwLockReadGuard, RwLockWriteGuard};

/// How the inode an operation locks is reached: what makes the acquisition follow the
/// order (checked on every acquisition).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reach {
    /// The operation holds no other inode.
    First,
    /// An entry of directory `dir`, which the operation holds: a directory before any
    /// non-directory, a non-directory above every one held.
    EntryOf(u32),
    /// A non-directory above every non-directory held (after the directories).
    Ascending,
    /// One of a rename's inodes under the rename lock, in the order the rename chose
    /// (an ancestor before its descendants, unrelated directories by number, then the
    /// entries).
    Renaming,
}

/// The gate, held shared or exclusive.
enum GateGuard<'fs> {
    Shared(#[allow(dead_code)] RwLockReadGuard<'fs, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'fs, ()>),
}

impl Drop for GateGuard<'_> {
    fn drop(&mut self) {
        held::leave_gate();
    }
}

struct Held {
    ino: u32,
    is_dir: bool,
    guard: ArcMutexGuard<RawMutex, InodeInfo>,
}

/// See the module documentation. Fields drop in order: inodes, rename lock, gate.
pub(crate) struct Op<'fs> {
    held: Vec<Held>,
    rename: Option<MutexGuard<'fs, ()>>,
    gate: GateGuard<'fs>,
    pub fs: &'fs FsInner,
}

impl<'fs> Op<'fs> {
    /// An ordinary operation: the gate shared.
    pub fn shared(fs: &'fs FsInner) -> Op<'fs> {
        held::enter_gate(false);
        Op {
            held: Vec::new(),
            rename: None,
            gate: GateGuard::Shared(fs.gate.read()),
            fs,
        }
    }

    /// An operation with the file system to itself: the gate exclusive.
    pub fn exclusive(fs: &'fs FsInner) -> Op<'fs> {
        held::enter_gate(true);
        Op {
            held: Vec::new(),
            rename: None,
            gate: GateGuard::Exclusive(fs.gate.write()),
            fs,
        }
    }

    pub fn is_exclusive(&self) -> bool {
        matches!(self.gate, GateGuard::Exclusive(_))
    }

    /// Takes the rename lock (before any inode).
    pub fn lock_renames(&mut self) {
        assert!(
            self.held.is_empty() || self.is_exclusive(),
            "lock order: the rename lock taken while holding inodes"
        );
        self.rename = Some(self.fs.rename_lock.lock());
    }

    /// Locks inode `ino` (loading it if it is not cached), reached as `reach` says.
    /// Locking an inode the operation holds already does nothing.
    pub fn lock(&mut self, ino: u32, reach: Reach) -> FsResult<()> {
        loop {
            if self.holds(ino) {
                return Ok(());
            }
            let slot = self.fs.inodes.load(self.fs, ino)?;
            // Deleted while this thread waited: look again (the record says "not in use").
            self.lock_slot(ino, slot, reach);
        }
    }

    /// Locks inode `ino` if it is in memory; false if it is not (or was deleted while this
    /// thread waited). An inode not in memory has nothing a writeback or a release could
    /// want: no dirty pages, times or openers.
    pub fn lock_if_cached(&mut self, ino: u32, reach: Reach) -> bool {
        if self.holds(ino) {
            return true;
        }
        match self.fs.inodes.cached(ino) {
            Some(slot) => self.lock_slot(ino, slot, reach),
            None => false,
        }
    }

    /// Locks `slot`, the inode cache's slot for `ino` when it was looked up; false if it
    /// is no longer (the inode was deleted while this thread waited).
    fn lock_slot(&mut self, ino: u32, slot: InodeRef, reach: Reach) -> bool {
        if !self.is_exclusive() {
            held::check_inode_lock(ino);
        }
        let guard = slot.lock_arc();
        if !self.fs.inodes.is_current(ino, &slot) {
            return false;
        }
        let is_dir = guard.is_dir();
        self.check_order(ino, is_dir, reach);
        self.held.push(Held { ino, is_dir, guard });
        true
    }

    /// Locks a new inode, just allocated in this operation's transaction: nobody else can
    /// reach it, so this may happen inside the handle.
    pub fn lock_new(&mut self, ino: u32, raw: Inode) {
        let slot = self.fs.inodes.insert_new(self.fs, ino, raw);
        let guard = slot
            .try_lock_arc()
            .expect("nobody else knows a new inode's number");
        let is_dir = guard.is_dir();
        self.held.push(Held { ino, is_dir, guard });
    }

    /// Sets inode `ino`'s record outright, as fast-commit replay does: the inode (cached or
    /// not) starts afresh from `raw`, held by this operation. Only with the file system to
    /// itself.
    pub fn put_inode(&mut self, ino: u32, raw: Inode) -> FsResult<()> {
        assert!(
            self.is_exclusive(),
            "only an exclusive operation sets records outright"
        );
        if !self.holds(ino) && self.fs.inodes.cached(ino).is_none() {
            self.lock_new(ino, raw);
            return Ok(());
        }
        self.lock(ino, Reach::First)?;
        let seq = self.fs.inodes.take_seq();
        let info = self.inode_mut(ino);
        *info = InodeInfo::new(raw);
        info.data_seq = seq;
        Ok(())
    }

    /// Releases inode `ino` before the operation ends (a path walk moving on).
    pub fn unlock(&mut self, ino: u32) {
        self.held.retain(|h| h.ino != ino);
    }

    pub fn holds(&self, ino: u32) -> bool {
        self.held.iter().any(|h| h.ino == ino)
    }

    /// Whether `ino` is the only inode this operation holds (so it may release it for a
    /// while: [`Op::unlocked`]).
    pub fn holds_only(&self, ino: u32) -> bool {
        self.held.len() == 1 && self.held[0].ino == ino
    }

    /// Whether held inode `ino` is still the inode cache's (it was not deleted while this
    /// operation had it released).
    pub fn is_current(&self, ino: u32) -> bool {
        let held = self.held.iter().find(|h| h.ino == ino);
        let held = held.unwrap_or_else(|| panic!("inode {ino} used without its lock"));
        self.fs
            .inodes
            .is_current(ino, ArcMutexGuard::mutex(&held.guard))
    }

    /// Inode `ino`, which this operation must hold.
    pub fn inode(&self, ino: u32) -> &InodeInfo {
        match self.held.iter().find(|h| h.ino == ino) {
            Some(h) => &h.guard,
            None => panic!("inode {ino} used without its lock"),
        }
    }

    /// Inode `ino`, which this operation must hold, to change.
    pub fn inode_mut(&mut self, ino: u32) -> &mut InodeInfo {
        match self.held.iter_mut().find(|h| h.ino == ino) {
            Some(h) => &mut h.guard,
            None => panic!("inode {ino} used without its lock"),
        }
    }

    /// Runs `f` with inode `ino` unlocked (a device read others should not wait for),
    /// which must be the only inode held; it is locked again afterwards. The caller
    /// checks what may have changed meanwhile (`InodeInfo::data_seq`).
    pub fn unlocked<R>(&mut self, ino: u32, f: impl FnOnce() -> R) -> R {
        assert!(
            self.held.len() == 1 && self.held[0].ino == ino,
            "an inode is released for a while only when it is the only one held"
        );
        ArcMutexGuard::unlocked(&mut self.held[0].guard, f)
    }

    /// Checked in release builds too: the held list is a handful of entries, and a
    /// wrong order is a deadlock waiting for its second thread.
    fn check_order(&self, ino: u32, is_dir: bool, reach: Reach) {
        if self.is_exclusive() {
            return;
        }
        let others = || self.held.iter().map(|h| h.ino).collect::<Vec<_>>();
        let top_file = self.held.iter().filter(|h| !h.is_dir).map(|h| h.ino).max();
        let after_files = |ino: u32| top_file.is_none_or(|top| ino > top);
        let ok = match reach {
            Reach::First => self.held.is_empty(),
            Reach::EntryOf(dir) => {
                let parent_held = self.held.iter().any(|h| h.ino == dir && h.is_dir);
                parent_held
                    && if is_dir {
                        top_file.is_none()
                    } else {
                        after_files(ino)
                    }
            }
            Reach::Ascending => !is_dir && after_files(ino),
            Reach::Renaming => self.rename.is_some(),
        };
        assert!(
            ok,
            "lock order: inode {ino} (directory: {is_dir}) locked as {reach:?} while holding {:?}",
            others()
        );
    }
}

impl Op<'_> {
    /// Notes that what reading `ino`'s blocks gives may have changed (data written to
    /// them, blocks unmapped or preallocated): a read that went to the device with the
    /// inode unlocked and sees a new value throws its bytes away.
    pub fn note_data_change(&mut self, ino: u32) {
        let seq = self.fs.inodes.take_seq();
        self.inode_mut(ino).data_seq = seq;
    }

    /// Notes that a transaction changed `ino` (its record, block map, size or orphan
    /// link): a new [`InodeInfo::journaled_changes`], never used before, so that a value
    /// seen before the inode was evicted never matches after it is loaded again.
    pub fn note_journaled(&mut self, ino: u32) {
        let seq = self.fs.inodes.take_seq();
        self.inode_mut(ino).journaled_changes = seq;
    }
}
