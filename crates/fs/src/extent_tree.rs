//! Extent trees: the map from a file's logical blocks to physical blocks.
//!
//! The root is the 60-byte `i_block` of the inode (up to 4 entries); when it fills, its
//! entries move to a new block and the root becomes an index one level higher. Leaves
//! hold extents, index nodes hold (first logical block, child block) pairs, and every
//! index key equals the first logical block of its child, as e2fsck requires.
//!
//! Promises: lookups never read past a node's entries; insertion keeps extents sorted and
//! non-overlapping and merges an extent with a physically contiguous neighbour; removal
//! frees exactly the data blocks it unmaps (through [`MetaIo::free_data_blocks`]) and every
//! node it empties (through [`MetaIo::free_meta_block`]); depth only grows when the root is
//! full and shrinks when a single child fits back into the root.
//! It must never leave a node with zero entries (except an empty root leaf), an index key
//! that differs from its child's first block, or a block mapped twice.

use crate::error::{FsError, FsResult};
use crate::format::extent::{
    capacity, verify_block_checksum, Entries, Extent, Index, Node, MAX_DEPTH, MAX_INIT_LEN,
    MAX_UNWRITTEN_LEN, ROOT_MAX_ENTRIES,
};
use crate::format::Location;
use crate::meta::{MetaIo, MetaRead};
use std::sync::Arc;

/// Which inode a tree belongs to, for checksums, errors and allocation goals.
#[derive(Clone, Copy, Debug)]
pub struct TreeOwner {
    pub ino: u32,
    /// The inode checksum seed, with metadata_csum.
    pub inode_seed: Option<u32>,
    /// Where to put new index blocks.
    pub goal: u64,
}

/// Metadata blocks a change added (positive) or removed (negative): the caller keeps
/// `i_blocks` in step.
pub type MetaBlockDelta = i64;

/// An empty root: a leaf with no extents.
pub fn init_root(root: &mut [u8]) {
    empty_leaf(ROOT_MAX_ENTRIES).encode(root, true, None);
}

fn empty_leaf(max_entries: u16) -> Node {
    Node {
        depth: 0,
        max_entries,
        generation: 0,
        entries: Entries::Leaf(Vec::new()),
    }
}

fn max_len(unwritten: bool) -> u32 {
    if unwritten {
        MAX_UNWRITTEN_LEN
    } else {
        MAX_INIT_LEN
    }
}

/// A node on a path from the root: where it lives and what it holds.
struct PathNode {
    /// `None` for the root in the inode.
    block: Option<u64>,
    node: Node,
}

fn read_root(root: &[u8], owner: &TreeOwner) -> FsResult<Node> {
    Ok(Node::decode(
        root,
        true,
        Location::InodeBlockArea { ino: owner.ino },
    )?)
}

/// The node in `block`, decoded and checked (or found already so in the memo).
fn read_node(
    io: &mut dyn MetaRead,
    block: u64,
    owner: &TreeOwner,
    depth: u16,
) -> FsResult<Arc<Node>> {
    let loc = Location::Block {
        block,
        ino: Some(owner.ino),
    };
    let bytes = io.read_block(block)?;
    let memo = io.node_memo();
    let node = match memo.and_then(|m| m.get(block, owner, &bytes)) {
        Some(node) => {
            debug_assert_eq!(
                Node::decode(&bytes, false, loc).ok().as_ref(),
                Some(&*node),
                "the memo's node for block {block} differs from its bytes"
            );
            node
        }
        None => {
            let node = Arc::new(Node::decode(&bytes, false, loc)?);
            if let Some(seed) = owner.inode_seed {
                verify_block_checksum(&bytes, seed, loc)?;
            }
            if let Some(memo) = memo {
                memo.put(block, owner, &bytes, node.clone());
            }
            node
        }
    };
    if node.depth != depth {
        return Err(FsError::Corrupt(crate::format::FormatError::new(
            "extent node",
            loc,
            format!("depth {} where the tree expects {depth}", node.depth),
        )));
    }
    Ok(node)
}

fn write_node(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    pn: &PathNode,
) -> FsResult<()> {
    match pn.block {
        None => pn.node.encode(root, true, None),
        Some(block) => store_node(io, owner, block, &pn.node)?,
    }
    Ok(())
}

/// Encodes `node` into `block` and remembers it for the bytes it became: the next walk
/// through the block (a punch's next lookup, a write's next page) needs no decode.
fn store_node(io: &mut dyn MetaIo, owner: &TreeOwner, block: u64, node: &Node) -> FsResult<()> {
    let seed = owner.inode_seed;
    io.modify_block(block, &mut |bytes| node.encode(bytes, false, seed))?;
    if io.node_memo().is_some() {
        let bytes = io.read_block(block)?;
        if let Some(memo) = io.node_memo() {
            memo.put(block, owner, &bytes, Arc::new(node.clone()));
        }
    }
    Ok(())
}

/// Index of the child whose subtree covers `logical` (the last key <= logical, or 0).
fn child_slot(list: &[Index], logical: u32) -> usize {
    list.partition_point(|x| x.logical <= logical)
        .saturating_sub(1)
}

/// The child of `node` (at `block`, `None` for the root) whose subtree covers `logical`,
/// read and checked; `None` if `node` is a leaf.
fn child_for(
    io: &mut dyn MetaRead,
    (block, node): (Option<u64>, &Node),
    owner: &TreeOwner,
    logical: u32,
) -> FsResult<Option<(u64, Arc<Node>)>> {
    let Entries::Index(list) = &node.entries else {
        return Ok(None);
    };
    if list.is_empty() {
        return Err(corrupt_empty_index(owner, block));
    }
    let child = list[child_slot(list, logical)].child;
    let read = read_node(io, child, owner, node.depth - 1)?;
    Ok(Some((child, read)))
}

/// The path from the root to the leaf that covers `logical`.
fn find_path(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
    logical: u32,
) -> FsResult<Vec<PathNode>> {
    let mut path = vec![PathNode {
        block: None,
        node: read_root(root, owner)?,
    }];
    loop {
        let last = path.last().expect("a path has a root");
        let Some((block, node)) = child_for(io, (last.block, &last.node), owner, logical)? else {
            return Ok(path);
        };
        path.push(PathNode {
            block: Some(block),
            node: Arc::unwrap_or_clone(node),
        });
    }
}

/// The leaf that covers `logical`: a read needs no path (nor the vector one costs: a
/// directory looks up each of its blocks on every create).
fn find_leaf(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
    logical: u32,
) -> FsResult<Arc<Node>> {
    let (mut block, mut node) = (None, Arc::new(read_root(root, owner)?));
    while let Some((child, read)) = child_for(io, (block, &node), owner, logical)? {
        (block, node) = (Some(child), read);
    }
    Ok(node)
}

/// The last extent of a leaf that starts at or before `logical`, if any (a leaf's extents
/// are sorted and do not overlap: decode checked it).
fn last_at_or_before(leaf: &Node, logical: u32) -> Option<Extent> {
    let Entries::Leaf(list) = &leaf.entries else {
        unreachable!("find_leaf stops at a leaf");
    };
    let after = list.partition_point(|e| e.logical <= logical);
    after.checked_sub(1).map(|i| list[i])
}

fn corrupt_empty_index(owner: &TreeOwner, block: Option<u64>) -> FsError {
    let location = match block {
        Some(block) => Location::Block {
            block,
            ino: Some(owner.ino),
        },
        None => Location::InodeBlockArea { ino: owner.ino },
    };
    FsError::Corrupt(crate::format::FormatError::new(
        "extent node",
        location,
        "index node with no entries",
    ))
}

/// The mapping of `logical`: the extent that contains it, if any.
pub fn lookup(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
    logical: u32,
) -> FsResult<Option<Extent>> {
    let leaf = find_leaf(io, root, owner, logical)?;
    Ok(last_at_or_before(&leaf, logical).filter(|e| u64::from(logical) < e.end()))
}

/// The extent at or before `logical` (to place new blocks after it), if any.
pub fn extent_before(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
    logical: u32,
) -> FsResult<Option<Extent>> {
    let leaf = find_leaf(io, root, owner, logical)?;
    Ok(last_at_or_before(&leaf, logical))
}

/// Every extent, in order, and every index block, after checking every node.
pub fn walk(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
) -> FsResult<(Vec<Extent>, Vec<u64>)> {
    let mut extents = Vec::new();
    let mut blocks = Vec::new();
    let root_node = read_root(root, owner)?;
    walk_node(io, owner, &root_node, ALL_BLOCKS, &mut extents, &mut blocks)?;
    Ok((extents, blocks))
}

/// Every logical block.
const ALL_BLOCKS: (u64, u64) = (0, u64::MAX);

/// The extents that overlap logical blocks `[from, to)`, in order, reading only the
/// subtrees whose keys can hold them (a punch in a huge file reads one path, not the
/// whole tree).
pub fn extents_in(
    io: &mut dyn MetaRead,
    root: &[u8],
    owner: &TreeOwner,
    from: u64,
    to: u64,
) -> FsResult<Vec<Extent>> {
    let mut extents = Vec::new();
    let root_node = read_root(root, owner)?;
    walk_node(
        io,
        owner,
        &root_node,
        (from, to),
        &mut extents,
        &mut Vec::new(),
    )?;
    extents.retain(|e| e.end() > from && u64::from(e.logical) < to);
    Ok(extents)
}

fn walk_node(
    io: &mut dyn MetaRead,
    owner: &TreeOwner,
    node: &Node,
    range: (u64, u64),
    extents: &mut Vec<Extent>,
    blocks: &mut Vec<u64>,
) -> FsResult<()> {
    match &node.entries {
        Entries::Leaf(list) => extents.extend(list.iter().copied()),
        Entries::Index(list) => {
            for (i, x) in list.iter().enumerate() {
                // Child i holds keys from its own up to the next child's.
                let next = list.get(i + 1).map_or(u64::MAX, |n| u64::from(n.logical));
                if next <= range.0 || u64::from(x.logical) >= range.1 {
                    continue;
                }
                blocks.push(x.child);
                let child = read_node(io, x.child, owner, node.depth - 1)?;
                if child.is_empty() || child.first_logical() != x.logical {
                    return Err(FsError::Corrupt(crate::format::FormatError::new(
                        "extent index",
                        Location::Block {
                            block: x.child,
                            ino: Some(owner.ino),
                        },
                        format!(
                            "index key {} does not match the child's first block {}",
                            x.logical,
                            child.first_logical()
                        ),
                    )));
                }
                walk_node(io, owner, &child, range, extents, blocks)?;
            }
        }
    }
    Ok(())
}

/// Maps the hole `[e.logical, e.end())` to `e`'s blocks.
pub fn insert(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    e: Extent,
) -> FsResult<MetaBlockDelta> {
    assert!(
        e.len >= 1 && e.len <= max_len(e.unwritten),
        "extent length {}",
        e.len
    );
    assert!(
        e.end() <= u64::from(u32::MAX) + 1,
        "extent past the 2^32 block limit"
    );
    let mut path = find_path(&mut *io, root, owner, e.logical)?;
    let leaf = path.last_mut().expect("a path has a leaf");
    let Entries::Leaf(list) = &mut leaf.node.entries else {
        unreachable!()
    };
    let at = list.partition_point(|x| x.logical < e.logical);
    assert!(
        at == 0 || list[at - 1].end() <= u64::from(e.logical),
        "insert over a mapped block at {} (ino {})",
        e.logical,
        owner.ino
    );
    assert!(
        at == list.len() || e.end() <= u64::from(list[at].logical),
        "insert over a mapped block"
    );
    if try_merge(list, at, e) {
        let first = list[0].logical;
        fix_keys(io, root, owner, &mut path, first)?;
        return Ok(0);
    }
    list.insert(at, e);
    let first = list[0].logical;
    if usize::from(leaf.node.max_entries) >= list.len() {
        fix_keys(io, root, owner, &mut path, first)?;
        return Ok(0);
    }
    split_and_write(io, root, owner, path, at)
}

/// Joins `e` to its neighbours in `list` when logically and physically contiguous.
fn try_merge(list: &mut Vec<Extent>, at: usize, e: Extent) -> bool {
    let joins = |a: &Extent, b: &Extent| {
        a.end() == u64::from(b.logical)
            && a.start + u64::from(a.len) == b.start
            && a.unwritten == b.unwritten
            && a.len + b.len <= max_len(a.unwritten)
    };
    if at > 0 && joins(&list[at - 1], &e) {
        list[at - 1].len += e.len;
        if at < list.len() && joins(&list[at - 1], &list[at].clone()) {
            let next = list.remove(at);
            list[at - 1].len += next.len;
        }
        return true;
    }
    if at < list.len() && joins(&e, &list[at]) {
        list[at].logical = e.logical;
        list[at].start = e.start;
        list[at].len += e.len;
        return true;
    }
    false
}

/// Writes the leaf of `path` and corrects index keys upward when its first block changed.
fn fix_keys(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    path: &mut [PathNode],
    mut first: u32,
) -> FsResult<()> {
    let mut level = path.len() - 1;
    write_node(io, root, owner, &path[level])?;
    while level > 0 {
        let child_block = path[level].block.expect("only the root has no block");
        let parent = &mut path[level - 1];
        let Entries::Index(list) = &mut parent.node.entries else {
            unreachable!()
        };
        let slot = list
            .iter()
            .position(|x| x.child == child_block)
            .expect("a child is in its parent");
        if list[slot].logical == first {
            return Ok(());
        }
        list[slot].logical = first;
        first = list[0].logical;
        write_node(io, root, owner, parent)?;
        if slot != 0 {
            return Ok(());
        }
        level -= 1;
    }
    Ok(())
}

/// The leaf at the end of `path` has one entry too many (the new one at `at`): split
/// nodes upward, growing the tree when the root is full. Writes every changed node.
fn split_and_write(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    mut path: Vec<PathNode>,
    at: usize,
) -> FsResult<MetaBlockDelta> {
    let mut delta: MetaBlockDelta = 0;
    let mut level = path.len() - 1;
    // Appending at the end moves only the new entry to the new node, which keeps leaves
    // full for files that grow at their end (as ext4 does).
    let mut append = at + 1 == path[level].node.len();
    loop {
        let node = &path[level].node;
        if node.len() <= usize::from(node.max_entries) {
            let first = node.first_logical();
            fix_keys(io, root, owner, &mut path[..=level], first)?;
            return Ok(delta);
        }
        if path[level].block.is_none() {
            // The root overflows: its entries move into a new block, which it indexes.
            delta += grow_root(io, root, owner, &mut path)?;
            level += 1;
            continue;
        }
        let new_block = io.alloc_meta_block(owner.goal)?;
        delta += 1;
        let node = &mut path[level].node;
        let keep = if append {
            node.len() - 1
        } else {
            node.len() / 2
        };
        let new_entries = match &mut node.entries {
            Entries::Leaf(list) => Entries::Leaf(list.split_off(keep)),
            Entries::Index(list) => Entries::Index(list.split_off(keep)),
        };
        let sibling = PathNode {
            block: Some(new_block),
            node: Node {
                depth: node.depth,
                max_entries: node.max_entries,
                generation: 0,
                entries: new_entries,
            },
        };
        write_node(io, root, owner, &path[level])?;
        write_node(io, root, owner, &sibling)?;
        let key = sibling.node.first_logical();
        let left_first = path[level].node.first_logical();
        let left_block = path[level].block.expect("not the root");
        let parent = &mut path[level - 1];
        let Entries::Index(list) = &mut parent.node.entries else {
            unreachable!()
        };
        let slot = list
            .iter()
            .position(|x| x.child == left_block)
            .expect("a child is in its parent");
        list[slot].logical = left_first;
        append = append && slot + 1 == list.len();
        list.insert(
            slot + 1,
            Index {
                logical: key,
                child: new_block,
            },
        );
        level -= 1;
    }
}

/// Moves the root's entries into a new block; the root becomes an index over it.
fn grow_root(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    path: &mut Vec<PathNode>,
) -> FsResult<MetaBlockDelta> {
    let depth = path[0].node.depth;
    if depth >= MAX_DEPTH {
        return Err(FsError::FileTooBig(format!(
            "inode {}: extent tree at its maximum depth",
            owner.ino
        )));
    }
    let block = io.alloc_meta_block(owner.goal)?;
    let block_size = io.block_size();
    let mut moved = std::mem::replace(
        &mut path[0].node,
        Node {
            depth: depth + 1,
            max_entries: ROOT_MAX_ENTRIES,
            generation: 0,
            entries: Entries::Index(Vec::new()),
        },
    );
    moved.max_entries = capacity(block_size, false);
    let first = moved.first_logical();
    if let Entries::Index(list) = &mut path[0].node.entries {
        list.push(Index {
            logical: first,
            child: block,
        });
    }
    path.insert(
        1,
        PathNode {
            block: Some(block),
            node: moved,
        },
    );
    write_node(io, root, owner, &path[0])?;
    Ok(1)
}

/// Unmaps `[from, to)`, freeing the data blocks there. Returns the metadata delta and
/// how many data blocks were freed.
pub fn remove_range(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    from: u32,
    to: u64,
) -> FsResult<(MetaBlockDelta, u64)> {
    let (delta, removed) = unmap_range(io, root, owner, from, to, true)?;
    Ok((delta, removed.iter().map(|e| u64::from(e.len)).sum()))
}

/// Marks `[from, to)` written where it is mapped unwritten (data has reached it).
pub fn mark_written(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    from: u32,
    to: u64,
) -> FsResult<MetaBlockDelta> {
    let (mut delta, removed) = unmap_range(io, root, owner, from, to, false)?;
    for mut e in removed {
        e.unwritten = false;
        delta += insert(io, root, owner, e)?;
    }
    Ok(delta)
}

/// Removes the mappings in `[from, to)`. With `free`, their data blocks are freed and the
/// removed pieces dropped; without, the pieces are returned (for re-insertion).
fn unmap_range(
    io: &mut dyn MetaIo,
    root: &mut [u8],
    owner: &TreeOwner,
    from: u32,
    to: u64,
    free: bool,
) -> FsResult<(MetaBlockDelta, Vec<Extent>)> {
    let mut cut = Cut {
        from,
        to,
        free,
        removed: Vec::new(),
        reinsert: Vec::new(),
        freed_meta: 0,
    };
    let mut top = PathNode {
        block: None,
        node: read_root(root, owner)?,
    };
    cut.node(io, owner, &mut top.node)?;
    if top.node.is_empty() {
        top.node = empty_leaf(ROOT_MAX_ENTRIES);
    }
    shrink_root(io, owner, &mut top.node, &mut cut.freed_meta)?;
    write_node(io, root, owner, &top)?;
    let mut delta = -cut.freed_meta;
    for e in std::mem::take(&mut cut.reinsert) {
        delta += insert(io, root, owner, e)?;
    }
    Ok((delta, cut.removed))
}

struct Cut {
    from: u32,
    to: u64,
    free: bool,
    removed: Vec<Extent>,
    /// Tails split off extents in leaves that had no room for them.
    reinsert: Vec<Extent>,
    freed_meta: i64,
}

impl Cut {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        start < self.to && u64::from(self.from) < end
    }

    fn node(&mut self, io: &mut dyn MetaIo, owner: &TreeOwner, node: &mut Node) -> FsResult<()> {
        let max = usize::from(node.max_entries);
        match &mut node.entries {
            Entries::Leaf(list) => self.leaf(io, list, max),
            Entries::Index(list) => {
                let mut i = 0;
                while i < list.len() {
                    let start = u64::from(list[i].logical);
                    let end = list.get(i + 1).map_or(u64::MAX, |n| u64::from(n.logical));
                    if !self.overlaps(start, end) {
                        i += 1;
                        continue;
                    }
                    let child_block = list[i].child;
                    let mut child = Arc::unwrap_or_clone(read_node(
                        &mut *io,
                        child_block,
                        owner,
                        node.depth - 1,
                    )?);
                    self.node(io, owner, &mut child)?;
                    if child.is_empty() {
                        io.free_meta_block(child_block)?;
                        self.freed_meta += 1;
                        list.remove(i);
                        continue;
                    }
                    list[i].logical = child.first_logical();
                    store_node(io, owner, child_block, &child)?;
                    i += 1;
                }
                Ok(())
            }
        }
    }

    fn leaf(&mut self, io: &mut dyn MetaIo, list: &mut Vec<Extent>, max: usize) -> FsResult<()> {
        let mut kept = Vec::with_capacity(list.len() + 1);
        for e in list.drain(..) {
            if !self.overlaps(u64::from(e.logical), e.end()) {
                kept.push(e);
                continue;
            }
            let cut_start = u64::from(e.logical).max(u64::from(self.from));
            let cut_end = e.end().min(self.to);
            let piece = Extent {
                logical: cut_start as u32,
                len: (cut_end - cut_start) as u32,
                start: e.start + (cut_start - u64::from(e.logical)),
                unwritten: e.unwritten,
            };
            if self.free {
                io.free_data_blocks(piece.start, u64::from(piece.len))?;
            }
            self.removed.push(piece);
            if cut_start > u64::from(e.logical) {
                kept.push(Extent {
                    len: (cut_start - u64::from(e.logical)) as u32,
                    ..e
                });
            }
            if cut_end < e.end() {
                let tail = Extent {
                    logical: cut_end as u32,
                    len: (e.end() - cut_end) as u32,
                    start: e.start + (cut_end - u64::from(e.logical)),
                    unwritten: e.unwritten,
                };
                kept.push(tail);
            }
        }
        if kept.len() > max {
            // Only a cut inside one extent adds an entry; its tail goes back in later.
            self.reinsert
                .push(kept.pop().expect("over capacity means non-empty"));
        }
        *list = kept;
        Ok(())
    }
}

/// While the root indexes a single child whose entries fit the root, pull them up.
fn shrink_root(
    io: &mut dyn MetaIo,
    owner: &TreeOwner,
    root: &mut Node,
    freed: &mut i64,
) -> FsResult<()> {
    loop {
        let Entries::Index(list) = &root.entries else {
            return Ok(());
        };
        if list.is_empty() {
            *root = empty_leaf(ROOT_MAX_ENTRIES);
            return Ok(());
        }
        if list.len() != 1 {
            return Ok(());
        }
        let child_block = list[0].child;
        let child = Arc::unwrap_or_clone(read_node(&mut *io, child_block, owner, root.depth - 1)?);
        if child.len() > usize::from(ROOT_MAX_ENTRIES) {
            return Ok(());
        }
        io.free_meta_block(child_block)?;
        *freed += 1;
        *root = Node {
            max_entries: ROOT_MAX_ENTRIES,
            ..child
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::MemMeta;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const OWNER: TreeOwner = TreeOwner {
        ino: 12,
        inode_seed: Some(0x5eed),
        goal: 0,
    };

    fn fresh() -> (MemMeta, [u8; 60]) {
        let mut root = [0u8; 60];
        init_root(&mut root);
        (MemMeta::new(1024, 1_000_000, 2_000_000), root)
    }

    /// The tree's mapping, block by block, after checking its structure.
    fn mapping(io: &mut MemMeta, root: &[u8]) -> BTreeMap<u32, (u64, bool)> {
        let (extents, index_blocks) = walk(io, root, &OWNER).unwrap();
        let mut map = BTreeMap::new();
        for w in extents.windows(2) {
            assert!(w[0].end() <= u64::from(w[1].logical), "sorted and disjoint");
        }
        for e in extents {
            for i in 0..e.len {
                map.insert(e.logical + i, (e.start + u64::from(i), e.unwritten));
            }
        }
        let mut live: Vec<u64> = index_blocks;
        live.sort_unstable();
        assert_eq!(
            live,
            io.allocated_meta.iter().copied().collect::<Vec<_>>(),
            "no leaked or stray index blocks"
        );
        map
    }

    #[test]
    fn sequential_appends_merge_into_one_extent() {
        let (mut io, mut root) = fresh();
        for i in 0..100 {
            insert(
                &mut io,
                &mut root,
                &OWNER,
                Extent {
                    logical: i,
                    len: 1,
                    start: 5000 + u64::from(i),
                    unwritten: false,
                },
            )
            .unwrap();
        }
        let (extents, _) = walk(&mut io, &root, &OWNER).unwrap();
        assert_eq!(
            extents,
            vec![Extent {
                logical: 0,
                len: 100,
                start: 5000,
                unwritten: false
            }]
        );
        assert_eq!(
            lookup(&mut io, &root, &OWNER, 42).unwrap().unwrap().start,
            5000
        );
        assert_eq!(lookup(&mut io, &root, &OWNER, 100).unwrap(), None);
    }

    #[test]
    fn a_range_query_reads_only_what_overlaps_and_agrees_with_the_full_walk() {
        let (mut io, mut root) = fresh();
        for i in 0..5_000u32 {
            let e = Extent {
                logical: i * 2,
                len: 1,
                start: 10 + u64::from(i) * 3,
                unwritten: false,
            };
            insert(&mut io, &mut root, &OWNER, e).unwrap();
        }
        let (all, _) = walk(&mut io, &root, &OWNER).unwrap();
        for (from, to) in [
            (0, 1),
            (3, 4),
            (4_001, 4_400),
            (9_990, u64::MAX),
            (20_000, 30_000),
        ] {
            let expected: Vec<Extent> = all
                .iter()
                .filter(|e| e.end() > from && u64::from(e.logical) < to)
                .copied()
                .collect();
            let reads_before = io.reads;
            assert_eq!(
                extents_in(&mut io, &root, &OWNER, from, to).unwrap(),
                expected
            );
            // One index block, then the leaves that hold the range (at least half full).
            let leaves = expected.len() / 42 + 2;
            assert!(
                io.reads - reads_before <= 1 + leaves as u64,
                "[{from}, {to}) read {} blocks for {} extents",
                io.reads - reads_before,
                expected.len()
            );
        }
    }

    #[test]
    fn many_extents_grow_two_levels_and_shrink_back() {
        let (mut io, mut root) = fresh();
        let n = 20_000u32;
        for i in 0..n {
            insert(
                &mut io,
                &mut root,
                &OWNER,
                Extent {
                    logical: i * 2,
                    len: 1,
                    start: 10 + u64::from(i) * 3,
                    unwritten: false,
                },
            )
            .unwrap();
        }
        let depth = Node::decode(&root, true, Location::InodeBlockArea { ino: 12 })
            .unwrap()
            .depth;
        assert_eq!(depth, 2, "84 per 1 KiB leaf, 84 per index, 4 in the root");
        assert_eq!(mapping(&mut io, &root).len(), n as usize);
        let (_, freed) = remove_range(&mut io, &mut root, &OWNER, 4, u64::MAX).unwrap();
        assert_eq!(freed, u64::from(n) - 2);
        assert_eq!(mapping(&mut io, &root).len(), 2);
        assert!(
            io.allocated_meta.is_empty(),
            "everything fit back in the root"
        );
        assert_eq!(
            io.freed_data.iter().map(|(_, n)| n).sum::<u64>(),
            u64::from(n) - 2
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Map {
            logical: u32,
            len: u32,
            unwritten: bool,
        },
        Unmap {
            from: u32,
            len: u32,
        },
        Written {
            from: u32,
            len: u32,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..3000, 1u32..40, any::<bool>()).prop_map(|(logical, len, unwritten)| Op::Map { logical, len, unwritten }),
            2 => (0u32..3000, 1u32..600).prop_map(|(from, len)| Op::Unmap { from, len }),
            1 => (0u32..3000, 1u32..200).prop_map(|(from, len)| Op::Written { from, len }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any sequence of maps, unmaps and conversions agrees with a block-by-block model,
        /// keeps the tree valid, and frees each unmapped block exactly once.
        #[test]
        fn agrees_with_a_model(ops in prop::collection::vec(op(), 1..150)) {
            let (mut io, mut root) = fresh();
            let mut model: BTreeMap<u32, (u64, bool)> = BTreeMap::new();
            let mut next_phys = 100u64;
            for op in ops {
                match op {
                    Op::Map { logical, len, unwritten } => {
                        // Map only the part of the range that is a hole, run by run.
                        let mut i = logical;
                        while i < logical + len {
                            if model.contains_key(&i) { i += 1; continue; }
                            let run_start = i;
                            while i < logical + len && !model.contains_key(&i) { i += 1; }
                            let run = i - run_start;
                            insert(&mut io, &mut root, &OWNER, Extent { logical: run_start, len: run, start: next_phys, unwritten }).unwrap();
                            for k in 0..run { model.insert(run_start + k, (next_phys + u64::from(k), unwritten)); }
                            next_phys += u64::from(run) + 1;
                        }
                    }
                    Op::Unmap { from, len } => {
                        io.freed_data.clear();
                        remove_range(&mut io, &mut root, &OWNER, from, u64::from(from + len)).unwrap();
                        let mut expected: Vec<u64> = model.range(from..from + len).map(|(_, (p, _))| *p).collect();
                        model.retain(|k, _| *k < from || *k >= from + len);
                        let mut freed: Vec<u64> = io.freed_data.iter().flat_map(|(s, n)| *s..*s + *n).collect();
                        expected.sort_unstable();
                        freed.sort_unstable();
                        prop_assert_eq!(freed, expected);
                    }
                    Op::Written { from, len } => {
                        mark_written(&mut io, &mut root, &OWNER, from, u64::from(from + len)).unwrap();
                        for (_, v) in model.range_mut(from..from + len) { v.1 = false; }
                    }
                }
                prop_assert_eq!(&mapping(&mut io, &root), &model);
            }
        }
    }
}
