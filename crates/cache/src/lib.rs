//! The cache layer: blocks and pages in memory, within a bound.
//!
//! - [`BufferCache`]: metadata blocks (and journaled data blocks) as journal buffers. It
//!   never drops a buffer the journal still needs, since re-reading its home block would
//!   return bytes older than the committed ones.
//! - [`PageCache`]: file data by (inode, page index), with dirty tracking and LRU
//!   eviction of clean pages. The file system decides what a dirty page costs to write
//!   (delayed allocation happens at writeback, above this layer).
//! - [`WritebackThread`]: wakes every few seconds and asks the file system to write back
//!   what is old or too much, with the kernel's defaults (30 s expiry, 10 % of memory
//!   before background writeback, 20 % before writers are throttled, each capped by the
//!   page cache bound).
//! - [`NumberMap`]: the hash table for inode and block numbers, which keeps runs of
//!   numbers together in memory.
//! - [`usable_memory_bytes`]: RAM or the cgroup's limit, from which those defaults and the
//!   default cache bound are taken.
//!
//! This layer must never write a journal buffer to its home block: that is the
//! checkpoint's job.

mod buffer;
mod memory;
mod number_hash;
mod page;
mod writeback;

pub use buffer::{BufferCache, BufferCacheStats};
pub use memory::usable_memory_bytes;
pub use number_hash::{NumberHasher, NumberMap};
pub use page::{Page, PageCache, PageCacheStats, PageWriteback};
pub use writeback::{DirtyLimits, WritebackPolicy, WritebackTarget, WritebackThread};
