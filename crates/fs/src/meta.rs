//! The seam between structure code and the journal.
//!
//! Extent trees, directories and xattr blocks change metadata blocks; they do it through
//! [`MetaIo`], never through the cache or the journal directly. In the file system a
//! `MetaIo` is one open journal handle (every change is journaled, every new block comes
//! from the allocator in the same transaction, every freed block is revoked); in tests it
//! is [`MemMeta`], a map of blocks with a trivial allocator, so the structure code can be
//! tested against a model without a disk.

use crate::error::{FsError, FsResult};
use crate::node_memo::NodeMemo;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// Read access to metadata blocks (what lookups need; no handle required).
pub trait MetaRead {
    /// Bytes per block.
    fn block_size(&self) -> usize;
    /// The current bytes of `block`.
    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>>;
    /// Where extent nodes already decoded from these blocks' bytes are remembered.
    fn node_memo(&self) -> Option<&NodeMemo> {
        None
    }
}

/// Journaled access to metadata blocks, plus block allocation, within one transaction.
pub trait MetaIo: MetaRead {
    /// Changes `block` as part of the transaction.
    fn modify_block(&mut self, block: u64, change: &mut dyn FnMut(&mut [u8])) -> FsResult<()>;
    /// Allocates a metadata block near `goal`; its bytes start as zeros.
    fn alloc_meta_block(&mut self, goal: u64) -> FsResult<u64>;
    /// Frees a metadata block (its logged copies are revoked).
    fn free_meta_block(&mut self, block: u64) -> FsResult<()>;
    /// Frees `count` data blocks from `start` (a file shrank or was deleted).
    fn free_data_blocks(&mut self, start: u64, count: u64) -> FsResult<()>;
}

/// An in-memory [`MetaIo`] for tests: blocks in a map, allocation from a counter, and a
/// record of what was freed so tests can check that nothing leaks or is freed twice.
pub struct MemMeta {
    block_size: usize,
    blocks: HashMap<u64, Arc<[u8]>>,
    next_free: u64,
    end: u64,
    pub allocated_meta: BTreeSet<u64>,
    pub freed_data: Vec<(u64, u64)>,
    /// Blocks read so far (tests check that a lookup reads only what it must).
    pub reads: u64,
}

impl MemMeta {
    /// Blocks `first_free..end` are allocatable.
    pub fn new(block_size: usize, first_free: u64, end: u64) -> MemMeta {
        MemMeta {
            block_size,
            blocks: HashMap::new(),
            next_free: first_free,
            end,
            allocated_meta: BTreeSet::new(),
            freed_data: Vec::new(),
            reads: 0,
        }
    }
}

impl MetaRead for MemMeta {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        self.reads += 1;
        Ok(self
            .blocks
            .get(&block)
            .cloned()
            .unwrap_or_else(|| Arc::from(vec![0u8; self.block_size])))
    }
}

impl MetaIo for MemMeta {
    fn modify_block(&mut self, block: u64, change: &mut dyn FnMut(&mut [u8])) -> FsResult<()> {
        let size = self.block_size;
        let data = self
            .blocks
            .entry(block)
            .or_insert_with(|| Arc::from(vec![0u8; size]));
        change(Arc::make_mut(data));
        Ok(())
    }

    fn alloc_meta_block(&mut self, _goal: u64) -> FsResult<u64> {
        if self.next_free >= self.end {
            return Err(FsError::NoSpace("MemMeta is full".into()));
        }
        let block = self.next_free;
        self.next_free += 1;
        self.blocks
            .insert(block, Arc::from(vec![0u8; self.block_size]));
        self.allocated_meta.insert(block);
        Ok(block)
    }

    fn free_meta_block(&mut self, block: u64) -> FsResult<()> {
        assert!(
            self.allocated_meta.remove(&block),
            "metadata block {block} freed but not allocated"
        );
        self.blocks.remove(&block);
        Ok(())
    }

    fn free_data_blocks(&mut self, start: u64, count: u64) -> FsResult<()> {
        self.freed_data.push((start, count));
        Ok(())
    }
}
