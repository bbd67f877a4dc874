//! Block and inode allocation over the group bitmaps.
//!
//! Blocks: a request names a goal (the block after the file's previous one, so files stay
//! contiguous) and a wanted length; the allocator takes the first free run at or after the
//! goal in the goal's group, then in the following groups. Inodes: a new directory under
//! the root goes to the group with the most free blocks among those with free inodes
//! (spreading top-level directories, as Orlov does); everything else goes near its parent.
//! Groups last seen with no free inode are passed over without reading their descriptors
//! (`Allocator::inodes_free_seen`, a hint every change of a group's free inode count
//! updates under the group's lock).
//!
//! Promises: every bitmap change is journaled together with its group descriptor (free
//! counts and checksums); a block freed by a transaction that has not committed yet is
//! never handed out again (a crash would otherwise let old metadata point at new data);
//! freeing a block that is already free is reported as an inconsistency, never ignored.
//! Groups still marked uninitialized get their bitmaps built from the layout first.

use crate::error::{FsError, FsResult};
use crate::format::bitmap;
use crate::format::group_desc::{GroupCsum, GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use crate::groups::{read_desc, write_desc};
use crate::lock_order::{Leaf, LeafGuard, Rank};
use crate::state::FsInner;
use crate::tx::Tx;
use crate::types::ROOT_INO;
use jext_journal::{tid_gt, Tid};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};

/// Group locks, shared by groups with the same number modulo this (a thread holds one
/// group lock at a time, so two groups sharing one never deadlock).
const GROUP_LOCKS: usize = 64;

/// The allocator's locks and what it keeps in memory (see the module documentation).
pub(crate) struct Allocator {
    /// A group's bitmaps and descriptor change only under its lock. Unlike the other leaf
    /// locks, a group lock may be held across reads of the group's bitmap and of the
    /// descriptor table (each read once, then cached).
    groups: Vec<Leaf<()>>,
    /// Free inodes of each group as last seen under its group lock (its descriptor read,
    /// or an inode allocated, marked or freed in it; [`NOT_SEEN`] before the first look),
    /// so that an inode allocation passes over full groups without reading their
    /// descriptors: decoding and checking one per full group made each create cost the
    /// number of full groups (122 at 10^6 files in one directory). A hint, read without
    /// the lock; the descriptor stays the truth. It is 0 only while the group's descriptor
    /// says so: every change of a group's free inode count is made under the group's lock
    /// and stores the new count here before the lock is released, so a group seen full
    /// that gets an inode freed (by another thread's unlink, or fast-commit replay) is
    /// seen with it from then on. An allocator that reads the hint while that free runs
    /// passes the group over, as it would had it looked just before the free.
    inodes_free_seen: Vec<AtomicU32>,
    pub totals: Leaf<Totals>,
    pub pending: Leaf<PendingFrees>,
}

/// `Allocator::inodes_free_seen` of a group not looked at since the mount.
const NOT_SEEN: u32 = u32::MAX;

/// Free and reserved counts of the whole file system.
#[derive(Default)]
pub(crate) struct Totals {
    pub free_blocks: u64,
    pub free_inodes: u64,
    /// Blocks promised to dirty pages not yet allocated (delayed allocation).
    pub reserved_blocks: u64,
}

impl Totals {
    /// Totals from the group descriptors.
    pub fn load(fs: &FsInner) -> FsResult<Totals> {
        let mut totals = Totals::default();
        for group in 0..fs.geo.group_count {
            let desc = read_desc(fs, group)?;
            totals.free_blocks += u64::from(desc.free_blocks);
            totals.free_inodes += u64::from(desc.free_inodes);
        }
        Ok(totals)
    }

    /// Blocks kept back from data so that writeback can always allocate extent and
    /// directory blocks (ext4's reserved clusters: 2 % or 4096 blocks, whichever is less).
    pub fn metadata_reserve(fs: &FsInner) -> u64 {
        (fs.geo.blocks_count / 50).min(4096)
    }

    /// Blocks a new delayed-allocation reservation may still take.
    pub fn available_for_data(&self, fs: &FsInner) -> u64 {
        self.free_blocks
            .saturating_sub(self.reserved_blocks)
            .saturating_sub(Self::metadata_reserve(fs))
    }

    /// Whether `blocks` more blocks of data fit beside the dirty pages' reservations and
    /// the metadata reserve, with `pending` blocks (freed by transactions not yet
    /// committed, `Allocator::pending_blocks`) left out.
    pub fn has_room_for_data(&self, fs: &FsInner, blocks: u64, pending: u64) -> bool {
        self.available_for_data(fs) >= blocks + pending
    }
}

impl Allocator {
    pub fn new(totals: Totals, group_count: u32) -> Allocator {
        Allocator {
            groups: (0..GROUP_LOCKS)
                .map(|_| Leaf::new(Rank::Group, ()))
                .collect(),
            inodes_free_seen: (0..group_count).map(|_| AtomicU32::new(NOT_SEEN)).collect(),
            totals: Leaf::new(Rank::Totals, totals),
            pending: Leaf::new(Rank::PendingFrees, PendingFrees::default()),
        }
    }

    fn lock_group(&self, group: u32) -> LeafGuard<'_, ()> {
        self.groups[group as usize % GROUP_LOCKS].lock()
    }

    /// Whether group `group` had no free inode when last seen (no lock needed: a hint).
    fn inode_group_seen_full(&self, group: u32) -> bool {
        // Relaxed: a store made under the group lock before this thread's last look
        // at the group (or a free it synchronized with) is seen by coherence; one racing
        // with this load may be missed either way.
        self.inodes_free_seen
            .get(group as usize)
            .is_some_and(|seen| seen.load(Ordering::Relaxed) == 0)
    }

    /// Notes that group `group`'s descriptor counts `free` free inodes; called with
    /// `_locked`, the group's lock, held (see `inodes_free_seen`).
    fn saw_free_inodes(&self, _locked: &LeafGuard<'_, ()>, group: u32, free: u32) {
        if let Some(seen) = self.inodes_free_seen.get(group as usize) {
            seen.store(free, Ordering::Relaxed);
        }
    }

    /// Blocks freed by transactions that are not durable yet.
    pub fn pending_blocks(&self, durable: Tid) -> u64 {
        self.pending.lock().pending_blocks(durable)
    }
}

/// The older of `tid` and `bound` (if any), in the journal's wrapping order.
fn older(bound: Option<Tid>, tid: Tid) -> Tid {
    match bound {
        Some(b) if tid_gt(tid, b) => b,
        _ => tid,
    }
}

/// Runs freed by transactions that are not durable: never handed out until they are.
#[derive(Default)]
pub(crate) struct PendingFrees {
    /// Freed runs (start -> (length, tid of the freeing transaction)).
    runs: BTreeMap<u64, (u64, Tid)>,
    /// Blocks in `runs`, kept up to date so that asking costs nothing: space checks ask
    /// on every create, write and punch, and a file punched every other block holds
    /// thousands of runs until its transaction commits.
    total: u64,
    /// No run in `runs` was freed by a transaction older than this (a bound: merges move
    /// runs to newer ones), so before it commits a prune has nothing to do.
    oldest_tid: Option<Tid>,
    /// Inode numbers freed by transactions not durable, with the freeing transaction:
    /// until it is, the number's record on disk may still be the old inode's (on the
    /// orphan list, with its link there), and a fast commit of a new file given the
    /// number would replay over it. Linux's `recently_deleted` keeps numbers back too.
    inodes: HashMap<u32, Tid>,
    /// No entry of `inodes` is older than this (`None`: empty).
    oldest_inode_tid: Option<Tid>,
}

impl PendingFrees {
    /// Blocks freed by transactions that have not committed.
    pub fn pending_blocks(&mut self, committed: Tid) -> u64 {
        self.prune(committed);
        self.total
    }

    /// Keeps inode `ino` from being handed out until transaction `tid` has committed.
    pub fn hold_inode(&mut self, ino: u32, tid: Tid) {
        self.inodes.insert(ino, tid);
        self.oldest_inode_tid = Some(older(self.oldest_inode_tid, tid));
    }

    /// Whether inode `ino` was freed by a transaction not yet committed (call after
    /// a prune).
    fn inode_pending(&self, ino: u32) -> bool {
        self.inodes.contains_key(&ino)
    }

    /// Forgets the runs and inodes whose transaction has committed. Walks them only when
    /// the oldest may have committed, so about once per commit.
    fn prune(&mut self, committed: Tid) {
        self.prune_inodes(committed);
        match self.oldest_tid {
            Some(oldest) if !tid_gt(oldest, committed) => {}
            _ => return,
        }
        let (mut total, mut oldest) = (0, None);
        self.runs.retain(|_, &mut (len, tid)| {
            let keep = tid_gt(tid, committed);
            if keep {
                total += len;
                oldest = Some(older(oldest, tid));
            }
            keep
        });
        self.total = total;
        self.oldest_tid = oldest;
    }

    fn prune_inodes(&mut self, committed: Tid) {
        match self.oldest_inode_tid {
            Some(oldest) if !tid_gt(oldest, committed) => {}
            _ => return,
        }
        let mut oldest = None;
        self.inodes.retain(|_, &mut tid| {
            let keep = tid_gt(tid, committed);
            if keep {
                oldest = Some(older(oldest, tid));
            }
            keep
        });
        self.oldest_inode_tid = oldest;
    }

    /// Keeps blocks `[start, start + count)` from being handed out until transaction `tid`
    /// has committed, as a free in `tid` would (fast-commit replay holds the blocks its
    /// records name, which the bitmaps may still show free). Merges with the pending runs
    /// it overlaps or touches, so the runs stay disjoint.
    pub fn hold(&mut self, start: u64, count: u64, tid: Tid) {
        if count == 0 {
            return;
        }
        let (mut lo, mut hi, mut newest) = (start, start + count, tid);
        // Runs are disjoint and sorted by start, so their ends are sorted too.
        let touching: Vec<u64> = self
            .runs
            .range(..=hi)
            .rev()
            .take_while(|(&s, &(len, _))| s + len >= lo)
            .map(|(&s, _)| s)
            .collect();
        for s in touching {
            let (len, t) = self.runs.remove(&s).expect("listed just above");
            self.total -= len;
            lo = lo.min(s);
            hi = hi.max(s + len);
            if tid_gt(t, newest) {
                newest = t;
            }
        }
        self.runs.insert(lo, (hi - lo, newest));
        self.total += hi - lo;
        self.oldest_tid = Some(older(self.oldest_tid, newest));
    }

    /// If `[start, end)` overlaps pending frees, the first of them as (start, end).
    fn pending_overlap(&self, start: u64, end: u64) -> Option<(u64, u64)> {
        // Pending runs never overlap each other: one starting at or before `start` that
        // reaches past it, else the first starting inside the range.
        if let Some((&s, &(len, _))) = self.runs.range(..=start).next_back() {
            if s + len > start {
                return Some((s, s + len));
            }
        }
        let (&s, &(len, _)) = self.runs.range(start..end).next()?;
        Some((s, s + len))
    }
}

/// Allocates up to `want` contiguous blocks at or after `goal`; returns (first, count).
pub(crate) fn alloc_blocks(tx: &mut Tx, goal: u64, want: u32) -> FsResult<(u64, u32)> {
    assert!(want >= 1);
    let geo = &tx.fs.geo;
    let goal = if goal < geo.first_data_block || goal >= geo.blocks_count {
        geo.first_data_block
    } else {
        goal
    };
    let committed = tx.fs.journal.committed_tid();
    tx.fs.alloc.pending.lock().prune(committed);
    let first_group = geo.group_of_block(goal);
    let groups = geo.group_count;
    for step in 0..=groups {
        let group = (first_group + step) % groups;
        let from_bit = if step == 0 {
            (goal - geo.group_first_block(group)) as u32
        } else {
            0
        };
        if let Some(run) = alloc_in_group(tx, group, from_bit, want)? {
            return Ok(run);
        }
    }
    let pending = tx.fs.alloc.pending_blocks(committed);
    Err(FsError::NoSpace(format!(
        "no free block left ({pending} blocks freed by transactions not yet committed)"
    )))
}

fn alloc_in_group(
    tx: &mut Tx,
    group: u32,
    from_bit: u32,
    want: u32,
) -> FsResult<Option<(u64, u32)>> {
    if read_desc(tx.fs, group)?.free_blocks == 0 {
        return Ok(None);
    }
    let fs = tx.fs;
    let _group = fs.alloc.lock_group(group);
    let mut desc = read_desc(fs, group)?;
    if desc.free_blocks == 0 {
        return Ok(None);
    }
    if desc.has_flag(FLAG_BLOCK_UNINIT) {
        init_block_bitmap(tx, group, &mut desc)?;
    }
    let geo = &fs.geo;
    let group_first = geo.group_first_block(group);
    let bits = geo.blocks_in_group(group);
    let bytes = tx.buffer(desc.block_bitmap)?.bytes();
    // Search from the goal, then wrap to the group's start.
    for (lo, hi) in [(from_bit, bits), (0, from_bit.min(bits))] {
        let mut from = lo;
        while let Some((bit, len)) = bitmap::find_clear_run(&bytes, from, hi, want) {
            let start = group_first + u64::from(bit);
            let overlap = fs
                .alloc
                .pending
                .lock()
                .pending_overlap(start, start + u64::from(len));
            match overlap {
                None => return take_run(tx, group, &mut desc, bit, len).map(Some),
                Some((p_start, _)) if p_start > start => {
                    let len = (p_start - start) as u32;
                    return take_run(tx, group, &mut desc, bit, len).map(Some);
                }
                Some((_, p_end)) => from = (p_end - group_first) as u32,
            }
        }
    }
    Ok(None)
}

fn take_run(
    tx: &mut Tx,
    group: u32,
    desc: &mut GroupDesc,
    bit: u32,
    len: u32,
) -> FsResult<(u64, u32)> {
    let bits = tx.fs.geo.blocks_per_group;
    let seed = tx.fs.csum_seed;
    let csum = tx.modify(desc.block_bitmap, |b| {
        debug_assert!(
            (bit..bit + len).all(|i| !bitmap::test_bit(b, i)),
            "allocating a used block"
        );
        bitmap::set_range(b, bit, len);
        seed.map(|s| bitmap::checksum(s, b, bits))
    })?;
    if let Some(csum) = csum {
        desc.set_bitmap_csums(csum, desc.inode_bitmap_csum, tx.fs.geo.desc_size);
    }
    if desc.free_blocks < len {
        return Err(FsError::Inconsistent(format!(
            "group {group}: free block count {} below a free run of {len}",
            desc.free_blocks
        )));
    }
    desc.free_blocks -= len;
    write_desc(tx, group, desc)?;
    tx.fs.alloc.totals.lock().free_blocks -= u64::from(len);
    Ok((tx.fs.geo.group_first_block(group) + u64::from(bit), len))
}

/// Frees `count` blocks from `start` (possibly across groups).
pub(crate) fn free_blocks(tx: &mut Tx, start: u64, count: u64) -> FsResult<()> {
    let geo = tx.fs.geo.clone();
    if start < geo.first_data_block || start + count > geo.blocks_count {
        return Err(FsError::Inconsistent(format!(
            "freeing blocks {start}..{} outside the file system",
            start + count
        )));
    }
    // Held before a bit is cleared: an allocator that finds the bits clear must also find
    // the hold, or another thread's handle could take a block and journal it in this
    // same transaction before `forget_block` below revokes it, dropping that handle's
    // change from the transaction (that block, data or metadata, never reached the log).
    tx.fs.alloc.pending.lock().hold(start, count, tx.tid());
    let mut block = start;
    let end = start + count;
    while block < end {
        let group = geo.group_of_block(block);
        let group_end = geo.group_first_block(group) + u64::from(geo.blocks_in_group(group));
        let n = (end.min(group_end) - block) as u32;
        free_in_group(tx, group, (block - geo.group_first_block(group)) as u32, n)?;
        for b in block..block + u64::from(n) {
            tx.forget_block(b)?;
        }
        block += u64::from(n);
    }
    Ok(())
}

fn free_in_group(tx: &mut Tx, group: u32, bit: u32, n: u32) -> FsResult<()> {
    let fs = tx.fs;
    let _group = fs.alloc.lock_group(group);
    let mut desc = read_desc(fs, group)?;
    if desc.has_flag(FLAG_BLOCK_UNINIT) {
        return Err(FsError::Inconsistent(format!(
            "freeing blocks in group {group}, whose bitmap was never initialized"
        )));
    }
    let bits = tx.fs.geo.blocks_per_group;
    let seed = tx.fs.csum_seed;
    let bitmap_block = desc.block_bitmap;
    let already_free = tx
        .buffer(bitmap_block)?
        .read(|b| (bit..bit + n).find(|&i| !bitmap::test_bit(b, i)));
    if let Some(i) = already_free {
        return Err(FsError::Inconsistent(format!(
            "block {} freed twice",
            tx.fs.geo.group_first_block(group) + u64::from(i)
        )));
    }
    let csum = tx.modify(bitmap_block, |b| {
        for i in bit..bit + n {
            bitmap::clear_bit(b, i);
        }
        seed.map(|s| bitmap::checksum(s, b, bits))
    })?;
    if let Some(csum) = csum {
        desc.set_bitmap_csums(csum, desc.inode_bitmap_csum, tx.fs.geo.desc_size);
    }
    desc.free_blocks += n;
    write_desc(tx, group, &desc)?;
    tx.fs.alloc.totals.lock().free_blocks += u64::from(n);
    Ok(())
}

/// Sets (`used`) or clears the bits of blocks `[start, start + count)` whatever their
/// state, keeping the group descriptors' and the in-memory free counts exact: ext4's
/// `ext4_mb_mark_bb`, which fast-commit replay needs because its records say what the
/// block map is, not which bits changed. Cleared blocks are held until this transaction
/// commits. Returns how many bits changed.
pub(crate) fn mark_blocks(tx: &mut Tx, start: u64, count: u64, used: bool) -> FsResult<u64> {
    let geo = tx.fs.geo.clone();
    if start < geo.first_data_block || start.saturating_add(count) > geo.blocks_count {
        return Err(FsError::Inconsistent(format!(
            "marking blocks {start}..{} outside the file system",
            start.saturating_add(count)
        )));
    }
    if !used {
        // Before the bits clear, as in `free_blocks`.
        tx.fs.alloc.pending.lock().hold(start, count, tx.tid());
    }
    let mut changed_total = 0;
    let mut block = start;
    let end = start + count;
    while block < end {
        let group = geo.group_of_block(block);
        let first = geo.group_first_block(group);
        let n = (end.min(first + u64::from(geo.blocks_in_group(group))) - block) as u32;
        let bit = (block - first) as u32;
        let fs = tx.fs;
        let _group = fs.alloc.lock_group(group);
        let mut desc = read_desc(fs, group)?;
        if desc.has_flag(FLAG_BLOCK_UNINIT) {
            init_block_bitmap(tx, group, &mut desc)?;
        }
        let seed = tx.fs.csum_seed;
        let (changed, csum) = tx.modify(desc.block_bitmap, |b| {
            let changed = (bit..bit + n)
                .filter(|&i| bitmap::test_bit(b, i) != used)
                .count() as u32;
            if used {
                bitmap::set_range(b, bit, n);
            } else {
                bitmap::clear_range(b, bit, n);
            }
            (
                changed,
                seed.map(|s| bitmap::checksum(s, b, geo.blocks_per_group)),
            )
        })?;
        if let Some(csum) = csum {
            desc.set_bitmap_csums(csum, desc.inode_bitmap_csum, geo.desc_size);
        }
        desc.free_blocks = if used {
            desc.free_blocks.checked_sub(changed)
        } else {
            desc.free_blocks.checked_add(changed)
        }
        .ok_or_else(|| {
            FsError::Inconsistent(format!(
                "group {group}: free block count {} cannot change by {changed}",
                desc.free_blocks
            ))
        })?;
        write_desc(tx, group, &desc)?;
        let mut totals = fs.alloc.totals.lock();
        if used {
            totals.free_blocks = totals.free_blocks.saturating_sub(u64::from(changed));
        } else {
            totals.free_blocks += u64::from(changed);
        }
        changed_total += u64::from(changed);
        block += u64::from(n);
    }
    Ok(changed_total)
}

/// Marks inode `ino` in use in its group's bitmap, whatever its state (fast-commit
/// replay's `ext4_mark_inode_used`); `is_dir` is what it is now, `was_dir` what it was if
/// it was already in use, for the group's directory count. Returns whether the bit was
/// clear.
pub(crate) fn mark_inode_used(
    tx: &mut Tx,
    ino: u32,
    is_dir: bool,
    was_dir: bool,
) -> FsResult<bool> {
    let (group, bit) = tx.fs.geo.inode_position(ino);
    let ipg = tx.fs.geo.inodes_per_group;
    let fs = tx.fs;
    let locked = fs.alloc.lock_group(group);
    let mut desc = read_desc(fs, group)?;
    if desc.has_flag(FLAG_INODE_UNINIT) {
        init_inode_bitmap(tx, group, &mut desc)?;
    }
    if desc.has_flag(FLAG_BLOCK_UNINIT) {
        init_block_bitmap(tx, group, &mut desc)?;
    }
    let seed = tx.fs.csum_seed;
    let (was_free, csum) = tx.modify(desc.inode_bitmap, |b| {
        let was_free = !bitmap::test_bit(b, bit);
        bitmap::set_bit(b, bit);
        (was_free, seed.map(|s| bitmap::checksum(s, b, ipg)))
    })?;
    if let Some(csum) = csum {
        desc.set_bitmap_csums(desc.block_bitmap_csum, csum, tx.fs.geo.desc_size);
    }
    if was_free {
        desc.free_inodes = desc.free_inodes.checked_sub(1).ok_or_else(|| {
            FsError::Inconsistent(format!(
                "group {group} counts no free inode but inode {ino} was free"
            ))
        })?;
        fs.alloc.saw_free_inodes(&locked, group, desc.free_inodes);
        let mut totals = fs.alloc.totals.lock();
        totals.free_inodes = totals.free_inodes.saturating_sub(1);
    }
    let dirs_before = u32::from(!was_free && was_dir);
    desc.used_dirs = (desc.used_dirs + u32::from(is_dir)).saturating_sub(dirs_before);
    desc.itable_unused = desc.itable_unused.min(ipg - bit - 1);
    write_desc(tx, group, &desc)?;
    Ok(was_free)
}

/// The block ranges of group `group` that file system metadata occupies: its superblock
/// and descriptor copies, and any group's bitmaps or inode table placed in it.
pub(crate) fn metadata_in_group(fs: &FsInner, group: u32) -> FsResult<Vec<(u64, u64)>> {
    let geo = &fs.geo;
    let first = geo.group_first_block(group);
    let end = first + u64::from(geo.blocks_in_group(group));
    let mut ranges = vec![(first, first + u64::from(geo.superblock_area_blocks(group)))];
    for other in 0..geo.group_count {
        let d = read_desc(fs, other)?;
        for (s, len) in [
            (d.block_bitmap, 1),
            (d.inode_bitmap, 1),
            (d.inode_table, u64::from(geo.inode_table_blocks())),
        ] {
            if s < end && s + len > first {
                ranges.push((s.max(first), (s + len).min(end)));
            }
        }
    }
    Ok(ranges)
}

/// Builds the block bitmap of a group that was never used (BLOCK_UNINIT).
fn init_block_bitmap(tx: &mut Tx, group: u32, desc: &mut GroupDesc) -> FsResult<()> {
    let geo = tx.fs.geo.clone();
    let first = geo.group_first_block(group);
    let in_group = geo.blocks_in_group(group);
    let ranges = metadata_in_group(tx.fs, group)?;
    let seed = tx.fs.csum_seed;
    tx.new_block(desc.block_bitmap)?;
    let (used, csum) = tx.modify(desc.block_bitmap, |b| {
        for (s, e) in &ranges {
            bitmap::set_range(b, (s - first) as u32, (e - s) as u32);
        }
        let used = bitmap::count_set(b, in_group);
        bitmap::set_range(b, in_group, geo.block_size * 8 - in_group);
        (
            used,
            seed.map(|s| bitmap::checksum(s, b, geo.blocks_per_group)),
        )
    })?;
    if u64::from(in_group - used) != u64::from(desc.free_blocks) {
        return Err(FsError::Inconsistent(format!(
            "group {group}: uninitialized with {} free blocks, but its layout leaves {}",
            desc.free_blocks,
            in_group - used
        )));
    }
    if let Some(csum) = csum {
        desc.set_bitmap_csums(csum, desc.inode_bitmap_csum, geo.desc_size);
    }
    desc.flags &= !FLAG_BLOCK_UNINIT;
    write_desc(tx, group, desc)
}

/// Builds the inode bitmap of a group that was never used (INODE_UNINIT).
fn init_inode_bitmap(tx: &mut Tx, group: u32, desc: &mut GroupDesc) -> FsResult<()> {
    let geo = tx.fs.geo.clone();
    let seed = tx.fs.csum_seed;
    tx.new_block(desc.inode_bitmap)?;
    let csum = tx.modify(desc.inode_bitmap, |b| {
        bitmap::set_range(
            b,
            geo.inodes_per_group,
            geo.block_size * 8 - geo.inodes_per_group,
        );
        seed.map(|s| bitmap::checksum(s, b, geo.inodes_per_group))
    })?;
    if let Some(csum) = csum {
        desc.set_bitmap_csums(desc.block_bitmap_csum, csum, geo.desc_size);
    }
    desc.flags &= !FLAG_INODE_UNINIT;
    write_desc(tx, group, desc)
}

/// The groups to try for a new inode, best first.
fn inode_groups(tx: &Tx, parent: u32, is_dir: bool) -> FsResult<Vec<u32>> {
    let geo = &tx.fs.geo;
    let groups = geo.group_count;
    let parent_group = geo.inode_position(parent).0;
    let mut order: Vec<u32> = (0..groups).map(|i| (parent_group + i) % groups).collect();
    if is_dir && parent == ROOT_INO {
        let mut scored = Vec::with_capacity(groups as usize);
        for g in 0..groups {
            let d = read_desc(tx.fs, g)?;
            if d.free_inodes > 0 {
                scored.push((std::cmp::Reverse(d.free_blocks), d.used_dirs, g));
            }
        }
        scored.sort_unstable();
        order = scored.into_iter().map(|(_, _, g)| g).collect();
    }
    Ok(order)
}

/// Allocates an inode number for a new inode whose parent directory is `parent`.
///
/// A number freed by a transaction not yet durable is taken only when no other is free
/// (`PendingFrees::inodes`): a new file with the number could not go as a fast commit
/// until then (`FcState::orphan_changes`), and the file system must not run out of inodes
/// a commit away from having them.
pub(crate) fn alloc_inode(tx: &mut Tx, parent: u32, is_dir: bool) -> FsResult<u32> {
    match alloc_inode_from(tx, parent, is_dir, true) {
        Err(FsError::NoSpace(_)) => alloc_inode_from(tx, parent, is_dir, false),
        found => found,
    }
}

/// [`alloc_inode`]'s search; with `settled_only`, passing over pending numbers.
fn alloc_inode_from(tx: &mut Tx, parent: u32, is_dir: bool, settled_only: bool) -> FsResult<u32> {
    let fs = tx.fs;
    for group in inode_groups(tx, parent, is_dir)? {
        if fs.alloc.inode_group_seen_full(group) {
            continue;
        }
        let locked = fs.alloc.lock_group(group);
        let mut desc = read_desc(fs, group)?;
        fs.alloc.saw_free_inodes(&locked, group, desc.free_inodes);
        if desc.free_inodes == 0 {
            continue;
        }
        if desc.has_flag(FLAG_INODE_UNINIT) {
            init_inode_bitmap(tx, group, &mut desc)?;
        }
        if desc.has_flag(FLAG_BLOCK_UNINIT) {
            // ext4 initializes the block bitmap of a group as soon as it holds an inode.
            init_block_bitmap(tx, group, &mut desc)?;
        }
        let ipg = tx.fs.geo.inodes_per_group;
        let Some(bit) = free_inode_bit(tx, group, &desc, settled_only)? else {
            continue;
        };
        let seed = tx.fs.csum_seed;
        let csum = tx.modify(desc.inode_bitmap, |b| {
            bitmap::set_bit(b, bit);
            seed.map(|s| bitmap::checksum(s, b, ipg))
        })?;
        if let Some(csum) = csum {
            desc.set_bitmap_csums(desc.block_bitmap_csum, csum, tx.fs.geo.desc_size);
        }
        let ino = group * ipg + bit + 1;
        if in_never_used_table_block(fs, &desc, bit) {
            // Zeroed in the cache, not read: a large directory's creates read one table
            // block per 16 names otherwise (ext4 skips the read when the block's other
            // inodes are free). The group lock keeps every other inode of the block
            // unallocated until the block is in the cache.
            tx.new_block(crate::inodes::table_location(fs, ino)?.0)?;
        }
        desc.free_inodes -= 1;
        fs.alloc.saw_free_inodes(&locked, group, desc.free_inodes);
        if is_dir {
            desc.used_dirs += 1;
        }
        desc.itable_unused = desc.itable_unused.min(ipg - bit - 1);
        write_desc(tx, group, &desc)?;
        fs.alloc.totals.lock().free_inodes -= 1;
        return Ok(ino);
    }
    Err(FsError::NoSpace("no free inode left".into()))
}

/// Whether every record in the inode-table block holding index `bit` of the group lies in
/// the table's never-used tail (`itable_unused`, trusted only with group checksums, as
/// e2fsck and the kernel trust it): such a block's bytes mean nothing and need no read.
fn in_never_used_table_block(fs: &FsInner, desc: &GroupDesc, bit: u32) -> bool {
    if matches!(fs.group_csum, GroupCsum::None) {
        return false;
    }
    let per_block = fs.geo.inodes_per_block();
    let never_used_from = fs.geo.inodes_per_group.saturating_sub(desc.itable_unused);
    bit - bit % per_block >= never_used_from
}

/// Whether inode number `ino` is marked in use in its group's bitmap.
pub(crate) fn inode_in_use(fs: &FsInner, ino: u32) -> FsResult<bool> {
    let (group, bit) = fs.geo.inode_position(ino);
    let desc = read_desc(fs, group)?;
    if desc.has_flag(FLAG_INODE_UNINIT) {
        return Ok(false);
    }
    crate::lock_order::may_do_io("an inode bitmap read");
    Ok(fs
        .cache
        .get(desc.inode_bitmap)?
        .read(|b| bitmap::test_bit(b, bit)))
}

/// The first bit of `group`'s inode bitmap that is clear and, with `settled_only`, whose
/// number no transaction not yet committed freed (`PendingFrees::inodes`); `None` if every
/// free one is pending.
fn free_inode_bit(
    tx: &mut Tx,
    group: u32,
    desc: &GroupDesc,
    settled_only: bool,
) -> FsResult<Option<u32>> {
    let ipg = tx.fs.geo.inodes_per_group;
    let committed = tx.fs.journal.committed_tid();
    let bitmap = tx.buffer(desc.inode_bitmap)?;
    let mut pending = tx.fs.alloc.pending.lock();
    pending.prune(committed);
    let mut from = 0;
    while let Some(bit) = bitmap.read(|b| bitmap::find_clear(b, from, ipg)) {
        if !settled_only || !pending.inode_pending(group * ipg + bit + 1) {
            return Ok(Some(bit));
        }
        from = bit + 1;
    }
    if !settled_only || pending.inodes.is_empty() {
        return Err(FsError::Inconsistent(format!(
            "group {group} counts {} free inodes but its bitmap has none",
            desc.free_inodes
        )));
    }
    Ok(None)
}

/// Frees inode number `ino`; the number is handed out again last until the transaction
/// is durable (`PendingFrees::inodes`).
pub(crate) fn free_inode(tx: &mut Tx, ino: u32, was_dir: bool) -> FsResult<()> {
    let (group, bit) = tx.fs.geo.inode_position(ino);
    let fs = tx.fs;
    let locked = fs.alloc.lock_group(group);
    let mut desc = read_desc(fs, group)?;
    let ipg = tx.fs.geo.inodes_per_group;
    let seed = tx.fs.csum_seed;
    if !tx
        .buffer(desc.inode_bitmap)?
        .read(|b| bitmap::test_bit(b, bit))
    {
        return Err(FsError::Inconsistent(format!(
            "inode {ino} freed but not in use"
        )));
    }
    let csum = tx.modify(desc.inode_bitmap, |b| {
        bitmap::clear_bit(b, bit);
        seed.map(|s| bitmap::checksum(s, b, ipg))
    })?;
    if let Some(csum) = csum {
        desc.set_bitmap_csums(desc.block_bitmap_csum, csum, tx.fs.geo.desc_size);
    }
    desc.free_inodes += 1;
    fs.alloc.saw_free_inodes(&locked, group, desc.free_inodes);
    fs.alloc.pending.lock().hold_inode(ino, tx.tid());
    if was_dir {
        desc.used_dirs = desc.used_dirs.saturating_sub(1);
    }
    write_desc(tx, group, &desc)?;
    fs.alloc.totals.lock().free_inodes += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_overlapping_pending_free_is_found() {
        let mut st = PendingFrees::default();
        st.hold(7417, 1, 9);
        st.hold(7419, 81, 9);
        st.hold(7600, 10, 9);
        // A run over both of the first two: the earliest must come back, or the run up to
        // the second would swallow the first.
        assert_eq!(st.pending_overlap(7410, 7430), Some((7417, 7418)));
        assert_eq!(st.pending_overlap(7417, 7418), Some((7417, 7418)));
        assert_eq!(st.pending_overlap(7450, 7460), Some((7419, 7500)));
        assert_eq!(st.pending_overlap(7500, 7600), None);
        assert_eq!(st.pending_overlap(7418, 7419), None);
        assert_eq!(st.pending_blocks(8), 92);
        assert_eq!(st.pending_blocks(9), 0, "committed frees are released");
    }

    #[test]
    fn held_runs_merge_with_the_runs_they_overlap_or_touch() {
        let mut st = PendingFrees::default();
        st.hold(100, 10, 5);
        st.hold(120, 10, 6);
        st.hold(300, 5, 5);
        // Overlaps the first, touches the second: one run 95..130 held until tid 7.
        st.hold(95, 15, 7);
        st.hold(110, 10, 4);
        assert_eq!(st.pending_overlap(96, 97), Some((95, 130)));
        assert_eq!(st.pending_overlap(130, 300), None);
        assert_eq!(
            st.pending_blocks(6),
            35,
            "the merged run keeps the newest tid"
        );
        assert_eq!(st.pending_blocks(7), 0);
        st.hold(50, 0, 9);
        assert_eq!(st.pending_blocks(7), 0);
        assert_eq!(
            st.pending_overlap(0, 1000),
            None,
            "an empty hold holds nothing"
        );
    }
}
