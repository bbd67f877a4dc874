//! Each file its own journal mode (JoJ's file-adaptive journaling, ext4's per-inode
//! `EXT4_JOURNAL_DATA_FL`): which files journal their data, and switching a file between
//! data journaling and ordered mode at ext4's safe points.
//!
//! A regular file journals its data when the mount says `data=journal` or the file carries
//! the `j` flag (`chattr +j`, `FS_JOURNAL_DATA_FL` 0x4000, inherited from its directory at
//! create as every ext4 `EXT4_FL_INHERITED` flag is). [`journals_data`] is the one
//! predicate every path asks (writeback, reads, fast commits). Under `data=adaptive` the
//! mount gives and takes the same flag itself (`crate::adaptive_journal`), through
//! [`prepare_flags_change`] like a `chattr`.
//!
//! Switching (`ext4_change_inode_journal_flag`):
//! - **on**: the file's dirty pages are written back in ordered mode first, so no page
//!   written before the switch can land in place after a journaled copy of its block;
//!   then a cache flush (ext4 has none here), so that the file's blocks hold durably
//!   what its clean pages and a read of them show: the journal may log a later small
//!   change as the bytes changed on them (`file::writeback::journal_pages`), which a
//!   crash must not find on older bytes. Its blocks leave the buffer cache, so that
//!   from then on the only buffers of them are the journal's copies of its data;
//! - **off**: the same, then the journal is committed and checkpointed (JBD2's
//!   `jbd2_journal_flush`) with the file system lock held, so no operation runs meanwhile,
//!   as ext4 locks out every handle: when the flag clears, no journaled copy of any block
//!   is left in the log, and an in-place write can never be overwritten at replay by an
//!   older journaled copy (the paper's T1/T2 reordering). The file's blocks then leave the
//!   buffer cache, where journaled data lives, because ordered data lives in pages.
//!
//! - **in memory**: an ordered file that gets an fbarrier or fdatabarrier, or is fsync'd
//!   after small appends, journals its data for a while, in memory only
//!   (`InodeInfo::journals_in_memory`, [`journal_in_memory`]), so its barriers are
//!   ordered by the journal (`crate::epochs`) and its small syncs cost one flush
//!   (`crate::sync_journaling`); whatever its flags say, it journals until
//!   [`stop_journaling_in_memory`] finds the checkpoint past its last journaled block.
//!
//! Blocks freed from a data-journaled file are revoked (`Tx::forget_block`, on every block
//! the allocator frees: the journal records a revoke whenever a copy of the block is in
//! the log), and a freed block is reused only once the freeing transaction committed, so
//! a block journaled for one file is never replayed over another file's data.
//!
//! Must never: change the mode of a file whose dirty pages were not written back in the
//! old mode, or clear the flag while the log may hold a copy of one of its blocks.

use crate::blockmap;
use crate::error::FsResult;
use crate::format::inode::{flags, Inode};
use crate::op::Op;
use crate::options::{DataMode, MountOptions};
use crate::state::{FsInner, InodeInfo};

/// What carries a file's data ([`crate::File::set_journal_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileJournalMode {
    /// The data goes through the journal (`chattr +j`): each commit is atomic for it.
    Data,
    /// The mount's `data=` decides (`chattr -j`): ordered unless the mount says otherwise.
    Mount,
}

/// Whether a regular file with record `raw` journals its data under a mount with
/// `options` (the mount's `data=journal`, or the file's `j` flag). Directories and
/// symlinks are metadata and always journaled; this answers `false` for them.
pub(crate) fn journals_data(options: &MountOptions, raw: &Inode) -> bool {
    let regular = u32::from(raw.mode()) & 0o170000 == 0o100000;
    regular && (options.data_mode == DataMode::Journal || raw.flags() & flags::JOURNAL_DATA != 0)
}

impl FsInner {
    /// Whether the file `info` describes journals its data: by its flags and the mount
    /// ([`journals_data`]), or for now in memory ([`journal_in_memory`]); never without a
    /// journal, whose `j` flags are kept but ignored (ext4's `ext4_should_journal_data`).
    pub(crate) fn journals_data(&self, info: &InodeInfo) -> bool {
        self.journal.has_log()
            && (info.journals_in_memory || journals_data(&self.options, &info.raw))
    }

    /// [`journals_data`] by the flags of `raw` alone, with a journal.
    pub(crate) fn flags_journal_data(&self, raw: &Inode) -> bool {
        self.journal.has_log() && journals_data(&self.options, raw)
    }
}

/// Before `ino`'s flags become `new_flags`: if that changes whether the file journals its
/// data, reaches the safe point of the switch (see the module comment). `op` holds the
/// file system alone (exclusive) and may wait for a commit and a checkpoint, as ext4
/// waits with every handle locked out; mode switches are rare.
pub(crate) fn prepare_flags_change(op: &mut Op, ino: u32, new_flags: u32) -> FsResult<()> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    let mut after = raw.clone();
    after.set_flags(new_flags);
    // A file journaling in memory journals whatever its flags say.
    let in_memory = op.inode(ino).journals_in_memory;
    let before_on = in_memory || fs.flags_journal_data(&raw);
    let after_on = in_memory || fs.flags_journal_data(&after);
    if before_on == after_on || fs.is_read_only() {
        return Ok(());
    }
    if after_on {
        return switch_on(op, ino);
    }
    start_switch(op, ino);
    crate::file::writeback(op, ino, false)?;
    fs.journal.checkpoint()?;
    forget_cached_blocks(fs, ino, &raw)
}

/// From a barrier (`crate::epochs`) or a synced small append (`crate::sync_journaling`)
/// on, an ordered regular file journals its data, as if it had the `j` flag, until
/// [`stop_journaling_in_memory`] (if its inode leaves the cache meanwhile, the cache
/// remembers this while the log may hold a copy of one of its blocks, `InodeTable`).
/// Nothing on disk changes: Linux and a later mount see an ordered file, and a clean
/// unmount leaves no copy in the log. `op` holds `ino` alone; does nothing if the file
/// journals already.
///
/// Lighter than [`switch_on`], since jext, not the user's flag, asks for it, and nothing
/// changes on disk that a concurrent operation could see half-done:
/// - the file system is not held alone, only the file and its writeback: while this owns
///   the writeback, no write of the file's pages is in flight or starts, and every other
///   path to its data (reads, writes, truncates, fast commits) holds its inode;
/// - the dirty pages are not written back first but journaled whole (written in ordered
///   mode they kept no clean bytes, so no byte record can be taken against their home);
/// - the flush is needed only if data was written in place since the last one: a page
///   dirtied from now on keeps its clean bytes as the base of byte records, which its home
///   must hold durably.
pub(crate) fn journal_in_memory(op: &mut Op, ino: u32) -> FsResult<()> {
    let fs = op.fs;
    if !switches_in_memory(fs, op.inode(ino)) {
        return Ok(());
    }
    let _owned = crate::file::own_writeback(op, ino);
    // The inode may have been released while the owner finished.
    if !op.is_current(ino) || !switches_in_memory(fs, op.inode(ino)) {
        return Ok(());
    }
    // Reads that went to the device with the inode released must not keep what they read.
    op.note_data_change(ino);
    if op.inode(ino).unflushed_data && fs.options.barrier {
        op.unlocked(ino, || fs.io.flush())?;
        if !op.is_current(ino) {
            return Ok(());
        }
    }
    let raw = op.inode(ino).raw.clone();
    forget_cached_blocks(fs, ino, &raw)?;
    let info = op.inode_mut(ino);
    // The flush made every write in place durable, and none started since: this owns the
    // writeback.
    info.unflushed_data = false;
    info.journals_in_memory = true;
    info.in_place_flush = Some(fs.io.covering_flush());
    Ok(())
}

/// Takes `ino` (held by `op`) back to the mode its flags and the mount give, if it journals
/// in memory and the checkpoint has passed every transaction that journaled its data: the
/// log then holds no copy of its blocks that a replay could put over a later write in
/// place; otherwise leaves it journaling.
pub(crate) fn stop_journaling_in_memory(op: &mut Op, ino: u32) -> FsResult<()> {
    let fs = op.fs;
    let passed = |info: &InodeInfo| {
        info.journaled_data_tid
            .is_none_or(|tid| fs.journal.checkpointed_through(tid))
    };
    if !op.inode(ino).journals_in_memory || !passed(op.inode(ino)) {
        return Ok(());
    }
    let _owned = crate::file::own_writeback(op, ino);
    // Released while the owner finished: a writeback may have journaled since.
    if !op.is_current(ino) || !op.inode(ino).journals_in_memory || !passed(op.inode(ino)) {
        return Ok(());
    }
    op.note_data_change(ino);
    let raw = op.inode(ino).raw.clone();
    if !fs.flags_journal_data(&raw) {
        // What the buffer cache holds of its blocks is what their homes hold now, but an
        // ordered file's data lives in pages, and its reads must not find buffers.
        forget_cached_blocks(fs, ino, &raw)?;
    }
    let info = op.inode_mut(ino);
    info.journals_in_memory = false;
    info.in_place_flush = None;
    Ok(())
}

/// Whether a barrier or a synced small append switches the file `info` describes to
/// journaling its data.
fn switches_in_memory(fs: &FsInner, info: &InodeInfo) -> bool {
    info.is_reg() && !fs.journals_data(info) && fs.journal.has_log() && !fs.is_read_only()
}

/// The safe point before `ino` starts journaling its data (module comment), reached with
/// every other operation held off; the caller then makes the file journal.
fn switch_on(op: &mut Op, ino: u32) -> FsResult<()> {
    let fs = op.fs;
    start_switch(op, ino);
    // Every dirty page goes out in the mode it was written in.
    crate::file::writeback(op, ino, false)?;
    fs.io.flush()?;
    let raw = op.inode(ino).raw.clone();
    forget_cached_blocks(fs, ino, &raw)
}

/// Every switch runs with every other operation held off (as ext4 locks out every
/// handle), and reads that went to the device with the inode released must not keep
/// what they read.
fn start_switch(op: &mut Op, ino: u32) {
    assert!(
        op.is_exclusive(),
        "a journal-mode switch runs with every other operation held off"
    );
    op.note_data_change(ino);
}

/// Drops the file's blocks from the buffer cache: switching off, once checkpointed, the
/// journaled copies there are the same bytes as at home, and an ordered file's reads must
/// not find them; switching on, a buffer of one of them (there should be none) would hold
/// bytes from before the data written in place, which the journal must not take for the
/// home block's.
pub(crate) fn forget_cached_blocks(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<()> {
    if raw.flags() & flags::EXTENTS == 0 {
        return Ok(());
    }
    for extent in blockmap::extents(fs, ino, raw)? {
        for block in extent.start..extent.start + u64::from(extent.len) {
            debug_assert!(
                fs.journal.committed_copy(block).is_none(),
                "block {block} of inode {ino} still has a journal copy after the flush"
            );
            fs.cache.forget(block);
        }
    }
    Ok(())
}
