//! How an fsync makes an ordered file's new data durable: written in place and flushed
//! before a fast commit, or journaled with the commit (issue 12 item 4, "choose per case").
//!
//! A fast commit of an ordered file costs two device syncs: the data goes home, a flush
//! makes it durable, and only then may the fast-commit block (FUA: a second sync on an
//! image file) vouch for it. Journaling the data instead puts it in the commit's single
//! write (descriptor, blocks, commit block), which one flush makes durable, and lets every
//! thread that fsyncs at once share that flush (a group commit). It writes the data twice
//! (the checkpoint takes it home later, off every caller's path) and commits the whole
//! running transaction rather than the file's changes alone. So jext journals a file's
//! data only while its syncs are small appends, where the flush saved outweighs the copy:
//!
//! - an fsync whose dirty pages are all at or past the on-disk end of the file, and at
//!   most [`SMALL_APPEND_PAGES`] of them, switches the file to journaling its data in
//!   memory ([`crate::journal_mode::journal_in_memory`]; nothing on disk changes);
//! - an fsync with anything else dirty (an overwrite, a large append) takes the file back
//!   to ordered once the checkpoint has passed its last journaled block
//!   ([`crate::journal_mode::stop_journaling_in_memory`]); until then it journals still,
//!   since an in-place write could be overwritten at replay by an older journaled copy.
//!
//! Measured (`bench/results/2026-11-27-small-syncs`, loop device, three repetitions,
//! `small_syncs=in_place` being the other choice, same runs):
//! - 4 KiB append + fsync (`fsync-latency`): 336 µs mean, one write and one flush, against
//!   619 µs with a flush and an FUA write in place (ext4 ordered 785, fast_commit 561);
//! - eight threads of it (`dwsl`): 10,416 fsyncs/s against 5,745 (ext4 ordered 4,489,
//!   fast_commit 7,557), with `jext_journal`'s group commit for full commits;
//! - SQLite through the mount, 24 cases: 0.94× the time of jext without a journal
//!   (geometric mean) against 1.06×; WAL 1-row inserts 591 µs against 948;
//! - varmail, overwrite + fsync, the 80 KiB fsync beside a writer: unchanged (the last
//!   two never choose it).
//!
//! Only `data=ordered` mounts (also under `data=adaptive`) with `small_syncs=journal`
//! (the default; `small_syncs=in_place` syncs every append as ext4 does), and files the
//! user left to the mount: `data=journal` and `chattr +j` journal already, and
//! `data=writeback` promises no order to keep.
//!
//! Must never: switch a file whose writeback another thread owns, or take a file back to
//! ordered while the log may hold a copy of one of its blocks.

use crate::error::FsResult;
use crate::journal_mode::{journal_in_memory, stop_journaling_in_memory};
use crate::op::Op;
use crate::options::{DataMode, SmallSyncs};

/// Most dirty pages an fsync may carry and still count as a small append (64 KiB with
/// 4 KiB blocks): below it one flush saved outweighs writing the data twice.
const SMALL_APPEND_PAGES: usize = 16;

/// Before an fsync of `ino` (held by `op`) writes back its data: chooses how the data
/// will reach the disk (module comment).
pub(crate) fn choose(op: &mut Op, ino: u32) -> FsResult<()> {
    let fs = op.fs;
    let info = op.inode(ino);
    let ordered = fs.options.data_mode == DataMode::Ordered;
    if !ordered || !info.is_reg() || fs.is_read_only() {
        return Ok(());
    }
    let on_disk_pages = info.raw.size() / u64::from(fs.geo.block_size);
    let Some((dirty_pages, first_dirty)) = fs.pages.lock().dirty_span(ino) else {
        return Ok(());
    };
    let small_append = dirty_pages <= SMALL_APPEND_PAGES && first_dirty >= on_disk_pages;
    let small_append = small_append && fs.options.small_syncs == SmallSyncs::Journal;
    match (info.journals_in_memory, small_append) {
        (false, true) => journal_in_memory(op, ino),
        (true, false) => stop_journaling_in_memory(op, ino),
        _ => Ok(()),
    }
}
