//! What a mounted file system holds: fixed facts ([`FsInner`]) and the state every
//! operation changes under one lock ([`FsState`]).
//!
//! Lock order: the `state` mutex, then (inside the journal) the journal's own lock. No code
//! waits for a commit while holding `state`, and the commit thread never takes it, so a
//! commit can always finish. fsync and the background writeback wait for their data
//! writes with `state` released (`file::DataInFlight`); other paths that write data back
//! (dirty throttling, a journal-mode switch, unmount) still wait under it.

use crate::alloc::AllocState;
use crate::format::group_desc::GroupCsum;
use crate::format::inode::Inode;
use crate::format::superblock::Superblock;
use crate::geometry::Geometry;
use crate::options::MountOptions;
use jext_cache::{BufferCache, PageCache};
use jext_io::IoQueue;
use jext_journal::{Journal, Tid};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Facts fixed at mount.
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
    pub state: Mutex<FsState>,
    /// Fast commits and fallbacks since mount (kept outside `state`: the journal's
    /// answer arrives after `state` is released).
    pub fc_stats: Mutex<crate::fast_commit::FastCommitStats>,
}

impl FsInner {
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }
}

/// Everything operations change.
pub(crate) struct FsState {
    pub sb: Superblock,
    pub alloc: AllocState,
    pub inodes: HashMap<u32, InodeInfo>,
    pub pages: PageCache,
    /// Inodes on the on-disk orphan list, head first.
    pub orphans: Vec<u32>,
    /// Set when an error made the file system read-only.
    pub error: Option<String>,
    /// The generation number for the next new inode.
    pub next_generation: u32,
    /// Source of [`InodeInfo::data_seq`] values: each is used once, so a value seen
    /// before an inode was evicted never matches after it is loaded again.
    pub next_data_seq: u64,
    /// What fast commits need to know across fsyncs.
    pub fc: crate::fast_commit::FcState,
    /// The inode cache's size at which the next eviction is tried (`inodes::make_room`).
    pub inode_evict_at: usize,
}

impl FsState {
    /// Keeps `raw` as inode `ino` in memory.
    pub fn insert_inode(&mut self, ino: u32, raw: Inode) {
        let mut info = InodeInfo::new(raw);
        info.data_seq = self.take_data_seq();
        self.inodes.insert(ino, info);
    }

    /// Notes that what reading `ino`'s blocks gives may have changed (data written to
    /// them, blocks unmapped or preallocated): a read that went to the device without
    /// the lock and sees a new value throws its bytes away.
    pub fn note_data_change(&mut self, ino: u32) {
        let seq = self.take_data_seq();
        if let Some(info) = self.inodes.get_mut(&ino) {
            info.data_seq = seq;
        }
    }

    /// Notes that a transaction changed `ino` (its record, block map, size or orphan
    /// link): a new [`InodeInfo::journaled_changes`], never used before, so that a count
    /// seen before the inode was evicted never matches after it is loaded again.
    pub fn note_journaled(&mut self, ino: u32) {
        let seq = self.take_data_seq();
        if let Some(info) = self.inodes.get_mut(&ino) {
            info.journaled_changes = seq;
        }
    }

    fn take_data_seq(&mut self) -> u64 {
        self.next_data_seq += 1;
        self.next_data_seq
    }

    /// Inodes whose record has changes (times) not yet in any transaction.
    pub fn dirty_inodes(&self) -> Vec<u32> {
        self.inodes
            .iter()
            .filter(|(_, i)| i.dirty)
            .map(|(ino, _)| *ino)
            .collect()
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
    /// [`FsState::note_data_change`]).
    pub data_seq: u64,
    /// The page after the last one read ahead: a miss there is a reader going forward.
    pub readahead_next: u64,
    /// What its next fast commit must carry.
    pub fc: crate::fast_commit::FcInode,
    /// Changes whenever a transaction changes it (record, block map, size, orphan link;
    /// see [`FsState::note_journaled`]): a fast commit that carried it as of one value
    /// leaves nothing to commit while the value stays (`FcInode::fast_committed`).
    pub journaled_changes: u64,
    /// Its times were read (stat) since they last changed: the next change is stamped
    /// with the exact time, not the clock tick's (`inodes::stamp`).
    pub times_queried: AtomicBool,
}

impl InodeInfo {
    pub fn new(raw: Inode) -> InodeInfo {
        let size = raw.size();
        InodeInfo {
            raw,
            size,
            dirty: false,
            open_count: 0,
            sync_tid: None,
            datasync_tid: None,
            reserved_pages: BTreeSet::new(),
            unflushed_data: false,
            data_seq: 0,
            readahead_next: 0,
            fc: Default::default(),
            journaled_changes: 0,
            times_queried: AtomicBool::new(false),
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
