//! Journal buffers: one metadata block (or, with data journaling, one data block) as the
//! journal sees it.
//!
//! A [`JBuf`] holds the newest bytes of its block as an `Arc<[u8]>`. Readers take a cheap
//! snapshot. Writers go through a [`crate::Handle`], which is the only way to change the
//! bytes, so every change is journaled. When a committing transaction or the checkpoint
//! list holds a snapshot of the same bytes, the next change copies them first
//! (`Arc::make_mut`): that copy is JBD2's frozen buffer, made only when it is needed.
//!
//! A buffer also says whether its bytes may serve as a byte record's base
//! ([`JBuf::from_home`], `crate::commit`): outside a running transaction they are then
//! what recovery rebuilds of the block, from its home location (where they are durable)
//! and the log. That holds for bytes read from home or from the journal's committed copy,
//! and for the bytes of a committed transaction; never for a buffer made up in memory (a
//! newly allocated block, zeroed, whose home holds garbage) until a transaction logged it,
//! nor for one whose change a revoke dropped unlogged.
//!
//! A buffer must never be changed outside a handle, and never written to its home block
//! by anyone but the checkpoint (or recovery).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Marks "not on any running transaction" in [`JBuf::running_tid`].
const NO_TID: u64 = u64::MAX;

pub struct JBuf {
    block: u64,
    data: Mutex<Arc<[u8]>>,
    /// The tid of the running transaction whose buffer list holds this buffer, so a second
    /// change in the same transaction needs no journal lock.
    running_tid: AtomicU64,
    /// Outside a running transaction, the bytes are what recovery rebuilds of the block
    /// (module comment).
    base_known: AtomicBool,
}

impl JBuf {
    /// A buffer for file system block `block` holding `data` (one block of bytes) that
    /// its home location does not hold, or not durably: it gets no byte record on its
    /// home until a transaction logged it.
    pub fn new(block: u64, data: Arc<[u8]>) -> JBuf {
        JBuf {
            block,
            data: Mutex::new(data),
            running_tid: AtomicU64::new(NO_TID),
            base_known: AtomicBool::new(false),
        }
    }

    /// A buffer for block `block` holding `data`, which is what recovery would rebuild
    /// of it: its home location holds these bytes durably (read from there after
    /// recovery, nothing written in place since, and no in-place write of it in flight
    /// or unflushed), or they are the journal's committed copy. A change under a handle
    /// may then go to the log as the bytes it changed on them.
    pub fn from_home(block: u64, data: Arc<[u8]>) -> JBuf {
        let buf = JBuf::new(block, data);
        buf.base_known.store(true, Ordering::Release);
        buf
    }

    /// A zero-filled buffer, for a block that was just allocated and need not be read.
    pub fn zeroed(block: u64, block_size: usize) -> JBuf {
        JBuf::new(block, Arc::from(vec![0u8; block_size]))
    }

    pub fn block(&self) -> u64 {
        self.block
    }

    pub fn len(&self) -> usize {
        self.data.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current bytes, shared (no copy).
    pub fn bytes(&self) -> Arc<[u8]> {
        self.data.lock().clone()
    }

    /// Runs `f` over the current bytes without copying them.
    pub fn read<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(&self.data.lock())
    }

    /// True while a transaction, a commit or the checkpoint list still needs these exact
    /// bytes, so the cache must not drop the buffer (a re-read from the home block would
    /// return older bytes).
    pub fn is_pinned(&self) -> bool {
        self.running_tid.load(Ordering::Acquire) != NO_TID
            || Arc::strong_count(&self.data.lock()) > 1
    }

    pub(crate) fn modify<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        let mut data = self.data.lock();
        let len = data.len();
        let result = f(Arc::make_mut(&mut data));
        assert_eq!(data.len(), len, "a journal buffer changed size");
        result
    }

    pub(crate) fn running_tid(&self) -> Option<u32> {
        match self.running_tid.load(Ordering::Acquire) {
            NO_TID => None,
            tid => Some(tid as u32),
        }
    }

    pub(crate) fn set_running_tid(&self, tid: Option<u32>) {
        let value = tid.map_or(NO_TID, u64::from);
        self.running_tid.store(value, Ordering::Release);
    }

    /// Whether the bytes, outside a running transaction, are what recovery rebuilds.
    pub fn base_known(&self) -> bool {
        self.base_known.load(Ordering::Acquire)
    }

    /// Set when a transaction that logs the bytes commits; cleared when a revoke drops
    /// the buffer's change from its transaction unlogged.
    pub(crate) fn set_base_known(&self, known: bool) {
        self.base_known.store(known, Ordering::Release);
    }
}

impl std::fmt::Debug for JBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "JBuf(block {}, tid {:?})",
            self.block,
            self.running_tid()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_copies_only_shared_bytes() {
        let buf = JBuf::zeroed(7, 1024);
        let before = buf.bytes();
        assert!(buf.is_pinned(), "a snapshot pins the bytes");
        buf.modify(|b| b[0] = 1);
        assert_eq!(before[0], 0, "the snapshot is frozen");
        assert_eq!(buf.bytes()[0], 1);
        drop(before);
        assert!(!buf.is_pinned());
        let ptr = Arc::as_ptr(&buf.bytes()) as *const u8;
        buf.modify(|b| b[1] = 2);
        assert_eq!(
            Arc::as_ptr(&buf.bytes()) as *const u8,
            ptr,
            "unshared bytes change in place"
        );
    }

    #[test]
    fn only_bytes_from_home_serve_as_a_base_until_logged() {
        assert!(JBuf::from_home(1, Arc::from(vec![5u8; 64])).base_known());
        assert!(!JBuf::new(1, Arc::from(vec![5u8; 64])).base_known());
        let fresh = JBuf::zeroed(2, 64);
        assert!(!fresh.base_known(), "a new block's home holds garbage");
        fresh.set_base_known(true);
        assert!(fresh.base_known(), "logged by a committed transaction");
    }
}
