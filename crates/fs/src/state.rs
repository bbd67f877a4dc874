//! What a mounted file system holds: fixed facts and the shared state operations change,
//! each part behind the lock `crate::lock_order` places it under ([`FsInner`]), and what
//! one inode holds in memory ([`InodeInfo`], behind its own lock in `crate::inode_table`).

use crate::alloc::Allocator;
use crate::fast_commit::{FastCommitStats, FcState};
use crate::format::group_desc::GroupCsum;
use crate::format::inode::Inode;
use crate::format::superblock::Superblock;
use crate::geometry::Geometry;
use crate::inode_table::InodeTable;
use crate::lock_order::Leaf;
use crate::options::MountOptions;
use jext_cache::{BufferCache, PageCache};
use jext_io::IoQueue;
use jext_journal::{Journal, Tid};
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// A mounted file system: facts fixed at mount, then the shared state, each part under
/// its own lock (see `crate::lock_order` for the order they are taken in).
pub(crate) struct FsInner {
    pub geo: Geometry,
    /// The metadata_csum seed, when the file system has checksums.
    pub csum_seed: Option<u32>,
    pub group_csum: GroupCsum,
    pub io: Arc<IoQueue>,
    pub cache: BufferCache,
    pub journal: Arc<Journal>,
    pub options: MountOptions,
    /// The hash new indexed directories use (`s_def_hash_version`).
    pub default_hash_version: u8,
    /// Name bytes hash as unsigned chars (superblock flag).
    pub hash_unsigned: bool,
    pub hash_seed: [u32; 4],
    pub dir_index: bool,
    /// `large_dir`: htrees may have a third index level (and directories pass 2 GiB).
    pub large_dir: bool,
    /// Directory entries carry the file type (`filetype` feature).
    pub filetype: bool,
    /// Changes are refused (`ro`, or a remount to `ro`); starts as `options.read_only`.
    pub read_only: AtomicBool,
    /// A file system without a journal found not clean at mount: unmount leaves it not
    /// clean, for e2fsck (`crate::mount`).
    pub unchecked: bool,
    /// Held shared by every operation, exclusive by what needs the file system still.
    pub gate: RwLock<()>,
    /// Held by a rename between directories while it locks them.
    pub rename_lock: Mutex<()>,
    /// Every inode in memory, each behind its own lock.
    pub inodes: InodeTable,
    /// Bitmaps (per group), free counts, frees waiting for their commit.
    pub alloc: Allocator,
    pub sb: Leaf<Superblock>,
    /// Inodes on the on-disk orphan list, head first.
    pub orphans: Leaf<Vec<u32>>,
    /// What fast commits need to know across fsyncs.
    pub fc: Leaf<FcState>,
    pub pages: Leaf<PageCache>,
    /// When dirty pages are written back in the background, and when writers are held
    /// back (the writeback policy's thresholds for this page cache).
    pub dirty_limits: jext_cache::DirtyLimits,
    /// Set when an error made the file system read-only.
    pub error: Leaf<Option<String>>,
    /// The generation number for the next new inode.
    pub next_generation: AtomicU32,
    /// Fast commits and fallbacks since mount (the journal's answer arrives after every
    /// inode is released).
    pub fc_stats: Leaf<FastCommitStats>,
    /// `data=adaptive`'s remembered names and counters.
    pub adaptive: Leaf<crate::adaptive_journal::AdaptiveJournal>,
    /// Which files a writeback is under way for (one at a time per file).
    pub writeback_owners: crate::file::WritebackOwners,
    /// Extent-tree nodes already decoded and checked.
    pub extent_nodes: crate::node_memo::NodeMemo,
    /// The newest barrier's transaction, which in-place writes and fast commits must not
    /// overtake.
    pub epochs: crate::epochs::Epochs,
}

impl FsInner {
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    /// Records the error that stops writes (the first one is kept).
    pub fn set_error(&self, why: String) {
        self.error.lock().get_or_insert(why);
    }

    /// The error that stopped writes, if one did.
    pub fn error(&self) -> Option<String> {
        self.error.lock().clone()
    }
}

/// An inode in memory.
pub(crate) struct InodeInfo {
    /// The record as it should be on disk (times may be newer than what was journaled).
    pub raw: Inode,
    /// The file size including data still in the page cache (`raw.size()` is what the
    /// disk may show: it only covers data that has been written).
    pub size: u64,
    /// `raw` has changes (timestamps from writes) not yet in any transaction.
    pub dirty: bool,
    pub open_count: u32,
    /// Made without a name (`O_TMPFILE`) and not linked since: the one inode without links
    /// that `link` may name (Linux's `I_LINKABLE`).
    pub linkable: bool,
    /// The last transaction that changed this inode (fsync waits for it).
    pub sync_tid: Option<Tid>,
    /// The last transaction that changed what reading the data needs: size, block map
    /// (fdatasync waits for it).
    pub datasync_tid: Option<Tid>,
    /// Page indices that have a delayed-allocation block reservation.
    pub reserved_pages: BTreeSet<u64>,
    /// Data was overwritten in place with no transaction after it: a sync needs a flush.
    pub unflushed_data: bool,
    /// Changes whenever what reading the inode's blocks gives may change (see
    /// [`crate::op::Op::note_data_change`]).
    pub data_seq: u64,
    /// The page after the last one read ahead: a miss there is a reader going forward.
    pub readahead_next: u64,
    /// What its next fast commit must carry.
    pub fc: crate::fast_commit::FcInode,
    /// Changes whenever a transaction changes it (record, block map, size, orphan link;
    /// see [`crate::op::Op::note_journaled`]): a fast commit that carried it as of one value
    /// leaves nothing to commit while the value stays (`FcInode::fast_committed`).
    pub journaled_changes: u64,
    /// Its times were read (stat) since they last changed: the next change is stamped
    /// with the exact time, not the clock tick's (`inodes::stamp`).
    pub times_queried: AtomicBool,
    /// What it did since it was last empty, for `data=adaptive`.
    pub adaptive: crate::adaptive_journal::FileHistory,
    /// An ordered file that journals its data for now, in memory only
    /// (`journal_mode::journal_in_memory`): since a barrier (`crate::epochs`) or a synced
    /// small append (`crate::sync_journaling`). If the inode leaves the cache before the
    /// checkpoint passed [`InodeInfo::journaled_data_tid`], the cache remembers it.
    pub journals_in_memory: bool,
    /// The last transaction that journaled a block of its data.
    pub journaled_data_tid: Option<Tid>,
    /// While it journals in memory: the flush after which every write of its data in
    /// place is durable (all came before it began to journal), from
    /// `IoQueue::covering_flush`; `None` if not known (journaling since before the inode
    /// was loaded).
    pub in_place_flush: Option<u64>,
}

impl InodeInfo {
    pub fn new(raw: Inode) -> InodeInfo {
        let size = raw.size();
        InodeInfo {
            raw,
            size,
            dirty: false,
            open_count: 0,
            linkable: false,
            sync_tid: None,
            datasync_tid: None,
            reserved_pages: BTreeSet::new(),
            unflushed_data: false,
            data_seq: 0,
            readahead_next: 0,
            fc: Default::default(),
            journaled_changes: 0,
            times_queried: AtomicBool::new(false),
            adaptive: Default::default(),
            journals_in_memory: false,
            journaled_data_tid: None,
            in_place_flush: None,
        }
    }

    pub fn mode(&self) -> u32 {
        u32::from(self.raw.mode())
    }

    pub fn is_dir(&self) -> bool {
        self.mode() & 0o170000 == 0o040000
    }

    pub fn is_reg(&self) -> bool {
        self.mode() & 0o170000 == 0o100000
    }

    pub fn is_symlink(&self) -> bool {
        self.mode() & 0o170000 == 0o120000
    }
}
