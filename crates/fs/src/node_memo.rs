//! Decoded extent-tree nodes, remembered by the exact bytes they were decoded and checked
//! from: a walk that meets the same node again (a write looks up every page it covers, a
//! read every readahead window, an insert its whole path) costs a pointer comparison, not
//! a decode of up to 340 entries and a checksum of the block. The kernel keeps the same
//! habit with its `buffer_verified` bit.
//!
//! Promises: a node is handed out only for the very allocation of bytes it was decoded
//! and checked from (or that the tree itself encoded it into), and only to a walk of the
//! same inode and generation (the checksum depends on both); debug builds decode the
//! bytes again on every hit and assert they say the same. Must never hand out a node for
//! bytes it did not check, and never pin a buffer: it
//! holds no strong reference to any block's bytes, so the buffer cache drops and journal
//! buffers change them exactly as without it.
//!
//! Why a pointer comparison is enough: the memo holds a `Weak` to the bytes. While a
//! `Weak` exists the allocation is never freed, so its address cannot be reused; and
//! `Arc::make_mut` (how a journal buffer changes, `JBuf::modify`) moves the bytes to a new
//! allocation instead of writing in place whenever a `Weak` or another `Arc` points at
//! them (the test below holds std to that). Bytes at an address the memo still watches
//! are the bytes it checked.

use crate::extent_tree::TreeOwner;
use crate::format::extent::Node;
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Nodes remembered at once. Direct-mapped by block number: a tree's hot path (root's
/// children down to one leaf) and a few neighbours stay; the memory they keep alive is
/// about 12 KiB per slot at most (a 4 KiB block and its decoded entries).
const SLOTS: usize = 512;

struct Slot {
    block: u64,
    /// The inode and its checksum seed (which covers its generation).
    owner: (u32, Option<u32>),
    bytes: Weak<[u8]>,
    node: Arc<Node>,
}

/// See the module documentation.
pub struct NodeMemo {
    slots: Vec<Mutex<Option<Slot>>>,
}

impl Default for NodeMemo {
    fn default() -> NodeMemo {
        NodeMemo {
            slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
        }
    }
}

impl NodeMemo {
    fn slot(&self, block: u64) -> &Mutex<Option<Slot>> {
        &self.slots[(block % SLOTS as u64) as usize]
    }

    /// The node decoded from exactly `bytes` of `block`, for `owner`, if remembered.
    pub fn get(&self, block: u64, owner: &TreeOwner, bytes: &Arc<[u8]>) -> Option<Arc<Node>> {
        let slot = self.slot(block).lock();
        let s = slot.as_ref()?;
        let same_bytes = std::ptr::addr_eq(s.bytes.as_ptr(), Arc::as_ptr(bytes));
        (s.block == block && s.owner == key(owner) && same_bytes).then(|| s.node.clone())
    }

    /// Remembers `node`, which was decoded from `bytes` of `block` and checked for `owner`.
    pub fn put(&self, block: u64, owner: &TreeOwner, bytes: &Arc<[u8]>, node: Arc<Node>) {
        *self.slot(block).lock() = Some(Slot {
            block,
            owner: key(owner),
            bytes: Arc::downgrade(bytes),
            node,
        });
    }
}

fn key(owner: &TreeOwner) -> (u32, Option<u32>) {
    (owner.ino, owner.inode_seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::extent::Entries;

    fn owner(ino: u32) -> TreeOwner {
        TreeOwner {
            ino,
            inode_seed: Some(ino * 3),
            goal: 0,
        }
    }

    fn leaf() -> Arc<Node> {
        Arc::new(Node {
            depth: 0,
            max_entries: 4,
            generation: 0,
            entries: Entries::Leaf(Vec::new()),
        })
    }

    #[test]
    fn changing_watched_bytes_moves_them() {
        // The memo's soundness rests on this: bytes a Weak watches are never changed in
        // place, even when the changer holds the only Arc.
        let mut bytes: Arc<[u8]> = Arc::from(vec![0u8; 64]);
        let watched = Arc::downgrade(&bytes);
        let before = Arc::as_ptr(&bytes);
        Arc::make_mut(&mut bytes)[0] = 1;
        assert!(!std::ptr::addr_eq(before, Arc::as_ptr(&bytes)));
        assert!(!std::ptr::addr_eq(watched.as_ptr(), Arc::as_ptr(&bytes)));
    }

    #[test]
    fn a_node_is_found_only_for_its_own_bytes_block_and_inode() {
        let memo = NodeMemo::default();
        let bytes: Arc<[u8]> = Arc::from(vec![7u8; 64]);
        memo.put(100, &owner(12), &bytes, leaf());
        assert!(memo.get(100, &owner(12), &bytes).is_some());
        assert!(
            memo.get(100, &owner(13), &bytes).is_none(),
            "another inode's walk"
        );
        let reused = TreeOwner {
            inode_seed: Some(1),
            ..owner(12)
        };
        assert!(
            memo.get(100, &reused, &bytes).is_none(),
            "another generation"
        );
        let equal_copy: Arc<[u8]> = Arc::from(vec![7u8; 64]);
        assert!(
            memo.get(100, &owner(12), &equal_copy).is_none(),
            "other bytes"
        );
        // Another block in the same slot replaces it.
        memo.put(100 + SLOTS as u64, &owner(12), &bytes, leaf());
        assert!(memo.get(100, &owner(12), &bytes).is_none());
    }

    #[test]
    fn changed_bytes_are_not_recognised() {
        let memo = NodeMemo::default();
        let mut bytes: Arc<[u8]> = Arc::from(vec![0u8; 64]);
        memo.put(5, &owner(12), &bytes, leaf());
        Arc::make_mut(&mut bytes)[3] = 9;
        assert!(memo.get(5, &owner(12), &bytes).is_none());
    }
}
