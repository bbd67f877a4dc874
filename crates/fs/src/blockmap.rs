//! A file's block map: its extent tree, tied to its inode.
//!
//! This module keeps `i_blocks` equal to the blocks a file owns (data, extent index
//! blocks), places new blocks right after the file's previous ones, and refuses files
//! that do not use extents (old block-mapped files) rather than misreading them.

use crate::alloc::alloc_blocks;
use crate::error::{FsError, FsResult};
use crate::extent_tree::{self, TreeOwner};
use crate::format::csum::inode_seed;
use crate::format::extent::{Extent, MAX_INIT_LEN, MAX_UNWRITTEN_LEN};
use crate::format::inode::{flags, Inode};
use crate::meta::MetaRead;
use crate::node_memo::NodeMemo;
use crate::state::FsInner;
use crate::tx::Tx;
use std::sync::Arc;

impl MetaRead for &FsInner {
    fn block_size(&self) -> usize {
        self.geo.block_size as usize
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        Ok(self.cache.get(block)?.bytes())
    }

    fn node_memo(&self) -> Option<&NodeMemo> {
        Some(&self.extent_nodes)
    }
}

/// The tree's owner record for inode `ino`.
pub(crate) fn owner(fs: &FsInner, ino: u32, raw: &Inode) -> TreeOwner {
    let (group, _) = fs.geo.inode_position(ino);
    TreeOwner {
        ino,
        inode_seed: fs
            .csum_seed
            .map(|seed| inode_seed(seed, ino, raw.generation())),
        goal: fs.geo.group_first_block(group),
    }
}

/// Fails unless the inode maps its blocks with an extent tree.
pub(crate) fn require_extents(ino: u32, raw: &Inode) -> FsResult<()> {
    if raw.flags() & flags::EXTENTS == 0 {
        return Err(FsError::Unsupported(format!(
            "inode {ino} maps its blocks without extents (an ext2/ext3 file); jext reads and writes only extent-mapped files"
        )));
    }
    Ok(())
}

/// The extent holding logical block `logical` of inode `ino`, if mapped.
pub(crate) fn lookup(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    logical: u32,
) -> FsResult<Option<Extent>> {
    require_extents(ino, raw)?;
    let mut reader = fs;
    extent_tree::lookup(&mut reader, raw.i_block(), &owner(fs, ino, raw), logical)
}

/// Every extent of inode `ino`, in order.
pub(crate) fn extents(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<Vec<Extent>> {
    require_extents(ino, raw)?;
    let mut reader = fs;
    Ok(extent_tree::walk(&mut reader, raw.i_block(), &owner(fs, ino, raw))?.0)
}

/// The extents of inode `ino` that overlap logical blocks `[from, to)`, in order.
pub(crate) fn extents_in(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    from: u64,
    to: u64,
) -> FsResult<Vec<Extent>> {
    require_extents(ino, raw)?;
    let mut reader = fs;
    extent_tree::extents_in(&mut reader, raw.i_block(), &owner(fs, ino, raw), from, to)
}

/// Logical blocks looked at by the first extent-tree walk of a search for the next hole
/// or mapped block; each further walk looks at twice as many, up to the most below. A
/// file fragmented every other block answers from the first walk; a huge, fully mapped
/// or empty range costs a few dozen walks, never a list of millions of extents.
const FIRST_SCAN_WINDOW_BLOCKS: u64 = 64;
const MAX_SCAN_WINDOW_BLOCKS: u64 = 1 << 16;

/// The first logical block in `[from, to)` of inode `ino` that is a hole (`hole`) or
/// mapped (`!hole`, unwritten blocks included), if any.
pub(crate) fn next_hole_or_mapped(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    (from, to): (u64, u64),
    hole: bool,
) -> FsResult<Option<u64>> {
    let mut pos = from;
    let mut window = FIRST_SCAN_WINDOW_BLOCKS;
    while pos < to {
        let window_end = (pos + window).min(to);
        for e in extents_in(fs, ino, raw, pos, window_end)? {
            let start = u64::from(e.logical).max(pos);
            match hole {
                false => return Ok(Some(start)),
                true if start > pos => return Ok(Some(pos)),
                true => pos = e.end(),
            }
        }
        if hole && pos < window_end {
            return Ok(Some(pos));
        }
        pos = pos.max(window_end);
        window = (window * 2).min(MAX_SCAN_WINDOW_BLOCKS);
    }
    Ok(None)
}

/// The holes of inode `ino` in logical blocks `[from, to)`, as (first block, blocks), in
/// order: a 100 GiB hole is a few walks down the tree, not one lookup per block.
pub(crate) fn holes_in(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    from: u64,
    to: u64,
) -> FsResult<Vec<(u64, u64)>> {
    let mut holes = Vec::new();
    let mut pos = from;
    while let Some(start) = next_hole_or_mapped(fs, ino, raw, (pos, to), true)? {
        let end = next_hole_or_mapped(fs, ino, raw, (start, to), false)?.unwrap_or(to);
        holes.push((start, end - start));
        pos = end;
    }
    Ok(holes)
}

/// Every extent and every extent-tree block of inode `ino`, after checking every node.
pub(crate) fn extents_and_index(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
) -> FsResult<(Vec<Extent>, Vec<u64>)> {
    require_extents(ino, raw)?;
    let mut reader = fs;
    extent_tree::walk(&mut reader, raw.i_block(), &owner(fs, ino, raw))
}

/// Runs `change` on a copy of the inode's extent root and stores the root back.
pub(crate) fn with_root<R>(
    tx: &mut Tx,
    ino: u32,
    change: impl FnOnce(&mut Tx, &mut [u8], &TreeOwner) -> FsResult<R>,
) -> FsResult<R> {
    let raw = tx.raw_inode(ino)?;
    require_extents(ino, &raw)?;
    let owner = owner(tx.fs, ino, &raw);
    let mut root = [0u8; 60];
    root.copy_from_slice(raw.i_block());
    let result = change(tx, &mut root, &owner);
    tx.inode(ino)?.raw.i_block_mut().copy_from_slice(&root);
    result
}

/// Adds `blocks` file system blocks (negative: removes) to the inode's `i_blocks`.
pub(crate) fn add_blocks(tx: &mut Tx, ino: u32, blocks: i64) -> FsResult<()> {
    let per_block = i64::from(tx.fs.geo.block_size / 512);
    let bs = tx.fs.geo.block_size;
    let info = tx.inode(ino)?;
    let now = info.raw.blocks_512(bs) as i64 + blocks * per_block;
    if now < 0 {
        return Err(FsError::Inconsistent(format!(
            "inode {ino}: i_blocks would go negative"
        )));
    }
    info.raw.set_blocks_512(now as u64, bs);
    Ok(())
}

/// Where new blocks for logical block `logical` should go: right after the block mapped
/// before it, or at the start of the inode's group.
pub(crate) fn goal(tx: &mut Tx, ino: u32, logical: u32) -> FsResult<u64> {
    let raw = tx.raw_inode(ino)?;
    let owner = owner(tx.fs, ino, &raw);
    let mut reader = tx.fs;
    let before = if logical == 0 {
        None
    } else {
        extent_tree::extent_before(&mut reader, raw.i_block(), &owner, logical - 1)?
    };
    Ok(match before {
        Some(e) => e.start + u64::from(logical - e.logical),
        None => owner.goal,
    })
}

/// Allocates and maps `count` blocks for the hole at `logical`; returns the new extents.
pub(crate) fn allocate(
    tx: &mut Tx,
    ino: u32,
    logical: u32,
    count: u32,
    unwritten: bool,
) -> FsResult<Vec<Extent>> {
    let mut placed = Vec::new();
    let mut next = logical;
    let end = u64::from(logical) + u64::from(count);
    let mut goal = goal(tx, ino, logical)?;
    let longest = if unwritten {
        MAX_UNWRITTEN_LEN
    } else {
        MAX_INIT_LEN
    };
    while u64::from(next) < end {
        let want = ((end - u64::from(next)) as u32).min(longest);
        let (start, len) = alloc_blocks(tx, goal, want)?;
        let e = Extent {
            logical: next,
            len,
            start,
            unwritten,
        };
        let meta = with_root(tx, ino, |tx, root, owner| {
            extent_tree::insert(tx, root, owner, e)
        })?;
        add_blocks(tx, ino, i64::from(len) + meta)?;
        placed.push(e);
        next += len;
        goal = start + u64::from(len);
    }
    tx.note_mapping(ino, logical, end);
    Ok(placed)
}

/// Unmaps logical blocks `[from, to)`, freeing them; returns how many data blocks went.
pub(crate) fn unmap(tx: &mut Tx, ino: u32, from: u32, to: u64) -> FsResult<u64> {
    let (meta, data) = with_root(tx, ino, |tx, root, owner| {
        extent_tree::remove_range(tx, root, owner, from, to)
    })?;
    add_blocks(tx, ino, meta - data as i64)?;
    tx.note_mapping(ino, from, to);
    Ok(data)
}

/// Marks `[from, to)` as written where it is mapped unwritten.
pub(crate) fn mark_written(tx: &mut Tx, ino: u32, from: u32, to: u64) -> FsResult<()> {
    let meta = with_root(tx, ino, |tx, root, owner| {
        extent_tree::mark_written(tx, root, owner, from, to)
    })?;
    add_blocks(tx, ino, meta)?;
    tx.note_mapping(ino, from, to);
    Ok(())
}
