//! The transaction context: one open journal handle plus the state it may change.
//!
//! Every change an operation makes goes through a [`Tx`]: metadata blocks are changed
//! only with [`Tx::modify`], inodes are written with [`Tx::write_inode`], blocks come from
//! and return to the allocator in the same transaction. A `Tx` is the file system's
//! [`MetaIo`], so extent trees and directories are journaled without knowing it.
//!
//! An operation that fails after it changed something must not commit half of itself:
//! [`Tx::end`] aborts the journal in that case (the file system goes read-only), while a
//! failure before any change (the usual ENOENT, EEXIST, ENOSPC checks) just stops the
//! handle. A panic (a bug) half-way through a `Tx` aborts the journal too, as the `Tx`
//! unwinds: its handle would otherwise stop and let the half-made change commit.

use crate::error::{FsError, FsResult};
use crate::format::inode::Inode;
use crate::lock_order::held;
use crate::meta::{MetaIo, MetaRead};
use crate::op::{Op, Reach};
use crate::state::{FsInner, InodeInfo};
use jext_journal::{Handle, JBuf, Tid};
use std::sync::Arc;

pub(crate) struct Tx<'a, 'fs> {
    pub fs: &'fs FsInner,
    /// The operation: the inodes this transaction may change are the ones it holds.
    pub op: &'a mut Op<'fs>,
    handle: Option<Handle>,
    /// Something was changed through this handle.
    dirtied: bool,
}

impl<'a, 'fs> Tx<'a, 'fs> {
    /// Opens a handle for up to `credits` changed blocks, once `op` holds every inode it
    /// will change (`crate::lock_order`: no inode is locked under a handle).
    pub fn begin(op: &'a mut Op<'fs>, credits: u32) -> FsResult<Tx<'a, 'fs>> {
        let fs = op.fs;
        check_writable(fs)?;
        let credits = credits.min(fs.journal.max_transaction_blocks() / 2);
        held::enter_handle();
        let handle = match fs.journal.start(credits) {
            Ok(handle) => handle,
            Err(err) => {
                held::leave_handle();
                return Err(err.into());
            }
        };
        Ok(Tx {
            fs,
            op,
            handle: Some(handle),
            dirtied: false,
        })
    }

    fn handle(&mut self) -> &mut Handle {
        self.handle
            .as_mut()
            .expect("a Tx has its handle until it ends")
    }

    pub fn tid(&self) -> Tid {
        self.handle
            .as_ref()
            .expect("a Tx has its handle until it ends")
            .tid()
    }

    /// Blocks this handle may still add to the transaction.
    pub fn credits_left(&self) -> u32 {
        self.handle
            .as_ref()
            .expect("a Tx has its handle until it ends")
            .credits_left()
    }

    /// Ends the operation: on success the handle stops; on failure after changes the
    /// journal is aborted so the partial operation never commits.
    pub fn end<T>(mut self, result: FsResult<T>) -> FsResult<T> {
        if let Err(err) = &result {
            if self.dirtied {
                let reason = format!("an operation failed after changing metadata: {err}");
                self.fs.journal.abort(reason.clone());
                self.fs.set_error(reason);
            }
        }
        self.stop_handle();
        result
    }

    fn stop_handle(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.stop();
            held::leave_handle();
        }
    }

    /// The cached buffer of `block`.
    pub fn buffer(&self, block: u64) -> FsResult<Arc<JBuf>> {
        crate::lock_order::may_do_io("a metadata block read");
        Ok(self.fs.cache.get(block)?)
    }

    /// Changes `block` as part of this transaction.
    pub fn modify<R>(&mut self, block: u64, change: impl FnOnce(&mut [u8]) -> R) -> FsResult<R> {
        let buf = self.buffer(block)?;
        self.modify_buf(&buf, change)
    }

    pub fn modify_buf<R>(
        &mut self,
        buf: &Arc<JBuf>,
        change: impl FnOnce(&mut [u8]) -> R,
    ) -> FsResult<R> {
        self.dirtied = true;
        Ok(self.handle().modify(buf, change)?)
    }

    /// A freshly allocated block: zeroed in the cache (never read) and journaled.
    pub fn new_block(&mut self, block: u64) -> FsResult<()> {
        let buf = self.fs.cache.get_new(block);
        self.modify_buf(&buf, |_| ())
    }

    /// The block no longer holds metadata: older logged copies must not come back.
    pub fn forget_block(&mut self, block: u64) -> FsResult<()> {
        self.handle().revoke(block)?;
        self.fs.cache.forget(block);
        Ok(())
    }

    /// Inode `ino`, which the operation holds (an exclusive operation locks it now).
    pub fn inode(&mut self, ino: u32) -> FsResult<&mut InodeInfo> {
        if !self.op.holds(ino) && self.op.is_exclusive() {
            self.op.lock(ino, Reach::First)?;
        }
        Ok(self.op.inode_mut(ino))
    }

    /// Writes inode `ino`'s record into this transaction. An inode on the orphan list
    /// gets its link from the list (another operation may have changed it: see
    /// `crate::orphan`), read under the list's lock together with the write.
    pub fn write_inode(&mut self, ino: u32) -> FsResult<()> {
        let (block, offset) = crate::inodes::table_location(self.fs, ino)?;
        let buf = self.buffer(block)?;
        let tid = self.tid();
        let fs = self.fs;
        let seq = fs.inodes.take_seq();
        let info = self.inode(ino)?;
        info.dirty = false;
        info.sync_tid = Some(tid);
        info.journaled_changes = seq;
        let mut raw = info.raw.clone();
        let orphans = fs.orphans.lock();
        if let Some(next) = crate::orphan::next_of(&orphans, ino) {
            raw.set_dtime(next);
        }
        let bytes = raw.encode(ino, fs.csum_seed);
        self.modify_buf(&buf, |b| {
            b[offset..offset + bytes.len()].copy_from_slice(&bytes)
        })?;
        drop(orphans);
        Ok(())
    }

    /// This handle marks written blocks whose data was written (and transferred) before
    /// it: the data must be durable before the transaction commits (data=ordered).
    pub fn note_ordered_data(&mut self) {
        self.handle().note_ordered_data();
    }

    /// Records that logical blocks `[from, to)` of `ino` were mapped, unmapped or
    /// converted in this transaction (what its next fast commit must carry).
    pub fn note_mapping(&mut self, ino: u32, from: u32, to: u64) {
        let tid = self.tid();
        let info = self.op.inode_mut(ino);
        info.fc.note_changed(from, to, tid);
        info.datasync_tid = Some(tid);
        self.op.note_journaled(ino);
    }

    /// Records that `ino` went on or off the orphan list, or its orphan-list link changed
    /// (its `i_dtime`): its fast commits would carry a link the durable list disagrees
    /// with, so its fsyncs commit in full until this transaction is durable. (Kept with
    /// the fast-commit state, not the inode: the predecessor whose link a removal changes
    /// is held by nobody here.)
    pub fn note_orphan_change(&mut self, ino: u32) {
        let tid = self.tid();
        self.fs.fc.lock().note_orphan_change(ino, tid);
        if self.op.holds(ino) {
            self.op.note_journaled(ino);
        }
    }

    /// Records that name `name` of inode `ino` left directory `parent`: every fast commit
    /// until this transaction is durable carries it (an UNLINK record), so that replay
    /// removes the name before it creates anything the fast commit names.
    pub fn fc_note_unlink(&mut self, parent: u32, ino: u32, name: &[u8]) {
        let tid = self.tid();
        if !self.fs.fc.lock().note_unlink(tid, parent, ino, name) {
            self.fc_ineligible(crate::fast_commit::Ineligible::Unlink);
        }
    }

    /// Records a change no fast commit can carry: fsyncs commit in full until this
    /// transaction is durable.
    pub fn fc_ineligible(&mut self, reason: crate::fast_commit::Ineligible) {
        let tid = self.tid();
        self.fs.fc.lock().fence(tid, reason);
    }

    /// Records that inode `ino`'s size or block map changed in this transaction.
    pub fn mark_datasync(&mut self, ino: u32) {
        let tid = self.tid();
        self.op.inode_mut(ino).datasync_tid = Some(tid);
        self.op.note_journaled(ino);
    }

    /// Journals the superblock as it is in memory (orphan list head, feature flags).
    pub fn write_superblock(&mut self) -> FsResult<()> {
        let (block, offset) = self.fs.geo.superblock_location();
        let buf = self.buffer(block)?;
        let fs = self.fs;
        let sb = fs.sb.lock();
        let bytes = sb.encode();
        self.modify_buf(&buf, |b| {
            b[offset..offset + bytes.len()].copy_from_slice(&bytes)
        })?;
        drop(sb);
        Ok(())
    }

    /// The raw record of inode `ino` (a copy).
    pub fn raw_inode(&mut self, ino: u32) -> FsResult<Inode> {
        Ok(self.inode(ino)?.raw.clone())
    }
}

impl Drop for Tx<'_, '_> {
    fn drop(&mut self) {
        if self.handle.is_some() {
            if self.dirtied && std::thread::panicking() {
                let reason = "a bug (a panic) interrupted an operation that had changed metadata";
                self.fs.journal.abort(reason.into());
                self.fs.set_error(reason.into());
            }
            held::leave_handle();
        }
    }
}

/// Fails if the file system must not change.
pub(crate) fn check_writable(fs: &FsInner) -> FsResult<()> {
    if fs.is_read_only() {
        return Err(FsError::ReadOnly("mounted read-only".into()));
    }
    if let Some(why) = fs.error() {
        return Err(FsError::ReadOnly(format!(
            "an earlier error stopped writes ({why})"
        )));
    }
    if let Some(err) = fs.journal.aborted() {
        return Err(FsError::Journal(err));
    }
    Ok(())
}

impl MetaRead for Tx<'_, '_> {
    fn block_size(&self) -> usize {
        self.fs.geo.block_size as usize
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        Ok(self.buffer(block)?.bytes())
    }

    fn node_memo(&self) -> Option<&crate::node_memo::NodeMemo> {
        Some(&self.fs.extent_nodes)
    }
}

impl MetaIo for Tx<'_, '_> {
    fn modify_block(&mut self, block: u64, change: &mut dyn FnMut(&mut [u8])) -> FsResult<()> {
        self.modify(block, change)
    }

    fn alloc_meta_block(&mut self, goal: u64) -> FsResult<u64> {
        let (block, _) = crate::alloc::alloc_blocks(self, goal, 1)?;
        self.new_block(block)?;
        Ok(block)
    }

    fn free_meta_block(&mut self, block: u64) -> FsResult<()> {
        crate::alloc::free_blocks(self, block, 1)
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> FsResult<()> {
        crate::alloc::free_blocks(self, start, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{mkfs, Fs, MkfsOptions, MountOptions};
    use jext_device::SimDevice;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn a_panic_inside_a_transaction_aborts_the_journal() {
        let dev = Arc::new(SimDevice::new(64 << 20));
        mkfs(dev.clone(), &MkfsOptions::default()).unwrap();
        let fs = Fs::open(dev, MountOptions::default()).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            fs.with_exclusive(|op| {
                let mut tx = Tx::begin(op, 4).unwrap();
                tx.write_superblock().unwrap();
                panic!("a bug half-way through an operation");
            })
        }));
        assert!(outcome.is_err());
        let err = fs.create_file("/after", 0o644).err().expect("writes stop");
        assert_eq!(err.errno(), libc::EROFS, "{err}");
    }
}
