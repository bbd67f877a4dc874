//! Freeing a file's blocks, in as many transactions as it takes, and deleting inodes.
//!
//! A large file may own more blocks than one handle's credits can free; the work is then
//! split into chunks of extents freed from the end, with the inode on the orphan list
//! until the last chunk commits, so a crash in between is finished at the next mount.

use crate::blockmap;
use crate::error::FsResult;
use crate::format::inode::flags;
use crate::inodes::inode_time;
use crate::op::Op;
use crate::tx::Tx;
use crate::types::Timestamp;
use crate::{alloc, orphan, xattr_ops};

/// Journal blocks freeing one extent may touch (bitmaps and descriptors of the groups it
/// spans, and its share of leaf and index blocks).
const CREDITS_PER_EXTENT: u32 = 12;
const CREDITS_BASE: u32 = 24;

/// Chunk starts (logical blocks) for unmapping `[from, to)`, last chunk first, so each
/// chunk fits one handle; empty if nothing is mapped there.
fn plan(op: &mut Op, ino: u32, from: u64, to: u64) -> FsResult<Vec<(u64, u32)>> {
    let fs = op.fs;
    let raw = op.inode(ino).raw.clone();
    if raw.flags() & flags::EXTENTS == 0 {
        return Ok(Vec::new());
    }
    let extents = blockmap::extents_in(fs, ino, &raw, from, to)?;
    let cap = (fs.journal.max_transaction_blocks() / 2).max(CREDITS_BASE + CREDITS_PER_EXTENT);
    let per_chunk = ((cap - CREDITS_BASE) / CREDITS_PER_EXTENT).max(1) as usize;
    let mut chunks: Vec<(u64, u32)> = extents
        .chunks(per_chunk)
        .map(|c| {
            (
                u64::from(c[0].logical).max(from),
                CREDITS_BASE + CREDITS_PER_EXTENT * c.len() as u32,
            )
        })
        .collect();
    chunks.reverse();
    Ok(chunks)
}

/// Unmaps `[from, to)` of `ino` (a hole punch), chunk by chunk from the end. Each chunk
/// leaves a consistent file, so no orphan protection is needed.
pub(crate) fn unmap_chunked(op: &mut Op, ino: u32, from: u64, to: u64) -> FsResult<()> {
    op.note_data_change(ino);
    let mut end = to;
    for (start, credits) in plan(op, ino, from, to)? {
        let mut tx = Tx::begin(op, credits)?;
        let r = blockmap::unmap(&mut tx, ino, start as u32, end).and_then(|_| tx.write_inode(ino));
        tx.end(r)?;
        end = start;
    }
    Ok(())
}

/// Sets the on-disk size of `ino` to `new_size` (already its size in memory) and frees
/// its blocks past it. One transaction when that fits; otherwise the inode stays on the
/// orphan list across the chunks.
pub(crate) fn shrink(op: &mut Op, ino: u32, new_size: u64) -> FsResult<()> {
    let fs = op.fs;
    op.note_data_change(ino);
    let first = new_size.div_ceil(u64::from(fs.geo.block_size));
    let chunks = plan(op, ino, first, u64::MAX)?;
    let was_orphan = fs.orphans.lock().contains(&ino);
    let protect = chunks.len() > 1 && !was_orphan;
    let mut tx = Tx::begin(op, chunks.first().map_or(8, |c| c.1) + 8)?;
    let r = (|| {
        tx.inode(ino)?.raw.set_size(new_size);
        tx.mark_datasync(ino);
        if protect {
            orphan::add(&mut tx, ino)?;
        }
        if let [(start, _)] = chunks[..] {
            blockmap::unmap(&mut tx, ino, start as u32, u64::MAX)?;
        }
        tx.write_inode(ino)
    })();
    tx.end(r)?;
    if chunks.len() > 1 {
        unmap_chunked(op, ino, first, u64::MAX)?;
    }
    if protect {
        let mut tx = Tx::begin(op, 8)?;
        let r = orphan::remove(&mut tx, ino).and_then(|_| tx.write_inode(ino));
        tx.end(r)?;
    }
    Ok(())
}

/// Deletes inode `ino`, which has no links left and is on the orphan list: frees its
/// blocks and xattr block, takes it off the list and frees the inode.
pub(crate) fn delete_inode(op: &mut Op, ino: u32) -> FsResult<()> {
    op.inode_mut(ino).size = 0;
    shrink(op, ino, 0)?;
    let mut tx = Tx::begin(op, 24)?;
    let r = finish_delete(&mut tx, ino);
    tx.end(r)
}

fn finish_delete(tx: &mut Tx, ino: u32) -> FsResult<()> {
    xattr_ops::drop_block(tx, ino)?;
    orphan::remove(tx, ino)?;
    let was_dir = tx.inode(ino)?.is_dir();
    let now = Timestamp::now();
    let info = tx.inode(ino)?;
    let reserved = info.reserved_pages.len() as u64;
    info.reserved_pages.clear();
    info.raw.set_links_count(0);
    info.raw
        .set_dtime(now.seconds.clamp(1, i64::from(u32::MAX)) as u32);
    info.raw.set_ctime(inode_time(now));
    tx.fs.alloc.totals.lock().reserved_blocks -= reserved;
    tx.write_inode(ino)?;
    // Forgotten before its number is free: the next new file may get the number. (This
    // operation keeps its lock on the old inode until it ends; whoever waits for it then
    // finds it gone.)
    tx.fs.inodes.remove(ino);
    tx.fs.pages.lock().remove_file(ino);
    tx.fs.fc.lock().forget_inode(ino);
    alloc::free_inode(tx, ino, was_dir)
}
