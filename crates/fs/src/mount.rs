//! Mounting and unmounting.
//!
//! Mount: read and check the superblock (unknown incompat features refuse the mount by
//! name), find the journal inode's blocks, recover the journal, mark the file system
//! in use (`needs_recovery`), load the journal, then finish every orphan. Unmount: write
//! back everything, commit, checkpoint, empty the journal, and write a superblock that
//! says clean, with exact free counts.
//!
//! A file system without a journal (`mkfs.ext4 -O ^has_journal`, `jext mkfs
//! --no-journal`) mounts as ext4 mounts it: the journal layer runs without a log
//! ([`Journal::without_log`]), so `Tx`, handles and fsync's wait on a tid are the same,
//! but a commit writes its blocks home and flushes. There is nothing to recover, no fast
//! commit, single-I/O commit or byte record (no log for them), and no data journaling:
//! `data=journal` is refused and the `j` flag is kept but ignored, as ext4's
//! `ext4_should_journal_data` ignores it without a journal. No `needs_recovery` flag is
//! set; the state is "not clean" while mounted, and an image found not clean at mount (a
//! crash) stays so at unmount, as ext4 keeps the state it found, until e2fsck checks it.
//! Nothing is promised after a crash beyond what the device kept.

use crate::alloc::{Allocator, Totals};
use crate::error::{FsError, FsResult};
use crate::extent_tree;
use crate::format::extent::Extent;
use crate::format::group_desc::GroupDesc;
use crate::format::inode::{flags, Inode};
use crate::format::superblock::{
    features, Superblock, FLAG_UNSIGNED_HASH, STATE_CLEAN, STATE_ORPHANS, SUPERBLOCK_OFFSET,
    SUPERBLOCK_SIZE,
};
use crate::format::Location;
use crate::geometry::Geometry;
use crate::inode_table::InodeTable;
use crate::lock_order::{Leaf, Rank};
use crate::meta::MetaRead;
use crate::op::{Op, Reach};
use crate::options::{DataMode, IJournal, MountOptions};
use crate::state::FsInner;
use jext_cache::{BufferCache, PageCache, WritebackPolicy};
use jext_io::{IoFlags, IoQueue};
use jext_journal::{
    recover, AreaRun, Journal, JournalArea, JournalConfig, LogFeatures, RecoveryReport,
};
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

/// The journal inode's number when the superblock does not say otherwise.
const JOURNAL_INO: u32 = 8;

/// The whole device sectors that hold the primary superblock: its own 1024 bytes on a
/// device of 512-byte sectors, the 4 KiB sector around it on a 4 KiB-sector device
/// (zram, 4Kn disks), which refuses smaller requests. Returns their byte offset, length,
/// and where the superblock starts in them.
fn superblock_sectors(io: &IoQueue) -> (u64, usize, usize) {
    let sector = u64::from(io.device().sector_size()).max(1);
    let start = SUPERBLOCK_OFFSET / sector * sector;
    let end = (SUPERBLOCK_OFFSET + SUPERBLOCK_SIZE as u64).next_multiple_of(sector);
    (
        start,
        (end - start) as usize,
        (SUPERBLOCK_OFFSET - start) as usize,
    )
}

/// Reads the primary superblock straight from the device.
pub(crate) fn read_superblock(io: &IoQueue) -> FsResult<Superblock> {
    let (start, len, at) = superblock_sectors(io);
    let mut bytes = vec![0u8; len];
    io.read(start, &mut bytes)?;
    Ok(Superblock::decode(
        &bytes[at..],
        Location::Superblock { group: 0 },
    )?)
}

/// Writes the primary superblock straight to the device, durably; on a device whose
/// sectors are larger than the superblock, the rest of its sector is read and written
/// back as it was (as Linux writes the whole block holding it).
pub(crate) fn write_superblock(io: &IoQueue, sb: &Superblock) -> FsResult<()> {
    let (start, len, at) = superblock_sectors(io);
    let mut bytes = vec![0u8; len];
    if len != SUPERBLOCK_SIZE {
        io.read(start, &mut bytes)?;
    }
    bytes[at..at + SUPERBLOCK_SIZE].copy_from_slice(&sb.encode());
    io.write(start, Arc::from(bytes), IoFlags::PREFLUSH | IoFlags::FUA)?;
    Ok(())
}

/// Refuses what jext cannot handle, naming it.
pub(crate) fn check_features(sb: &Superblock, read_only: bool) -> FsResult<()> {
    sb.check_features(!read_only).map_err(|e| {
        FsError::Unsupported(format!(
            "{}; jext cannot use this file system{}",
            e.problem,
            if read_only {
                ""
            } else {
                " read-write (try -o ro)"
            }
        ))
    })?;
    if sb.has_compat(features::COMPAT_SPARSE_SUPER2) && !read_only {
        return Err(FsError::Unsupported(
            "sparse_super2 (backup superblocks placed by s_backup_bgs); mount read-only (-o ro)"
                .into(),
        ));
    }
    if sb.has_compat(features::COMPAT_HAS_JOURNAL) && sb.journal_dev() != 0 {
        return Err(FsError::Unsupported("an external journal device".into()));
    }
    Ok(())
}

pub(crate) fn geometry(sb: &Superblock) -> Geometry {
    Geometry {
        block_size: sb.block_size(),
        blocks_count: sb.blocks_count(),
        first_data_block: u64::from(sb.first_data_block()),
        blocks_per_group: sb.blocks_per_group(),
        inodes_per_group: sb.inodes_per_group(),
        inodes_count: sb.inodes_count(),
        inode_size: u32::from(sb.inode_size()),
        first_ino: sb.first_ino(),
        group_count: sb.group_count(),
        desc_size: sb.desc_size(),
        reserved_gdt_blocks: u32::from(sb.reserved_gdt_blocks()),
        sparse_super: sb.has_ro_compat(features::RO_COMPAT_SPARSE_SUPER),
        backup_bgs: sb.has_sparse_super2().then(|| sb.backup_bgs()),
        flex_group_size: 1 << sb.log_groups_per_flex(),
    }
}

/// Block reads straight from the device, for the little mount needs before the caches.
struct DeviceReader<'a> {
    io: &'a IoQueue,
    block_size: usize,
}

impl MetaRead for DeviceReader<'_> {
    fn block_size(&self) -> usize {
        self.block_size
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        let mut bytes = vec![0u8; self.block_size];
        self.io.read(block * self.block_size as u64, &mut bytes)?;
        Ok(Arc::from(bytes))
    }
}

/// Reads inode `ino` without caches.
pub(crate) fn read_inode_direct(io: &IoQueue, sb: &Superblock, ino: u32) -> FsResult<Inode> {
    let geo = geometry(sb);
    let (group, index) = geo.inode_position(ino);
    let (desc_block, offset) = geo.desc_location(group);
    let mut reader = DeviceReader {
        io,
        block_size: geo.block_size as usize,
    };
    let gdt = reader.read_block(desc_block)?;
    let desc = GroupDesc::decode(
        &gdt[offset..offset + geo.desc_size as usize],
        group,
        sb.group_csum(),
    )?;
    let byte = u64::from(index) * u64::from(geo.inode_size);
    let block = reader.read_block(desc.inode_table + byte / u64::from(geo.block_size))?;
    let at = (byte % u64::from(geo.block_size)) as usize;
    let csum = sb.has_metadata_csum().then(|| sb.csum_seed());
    Ok(Inode::decode(
        &block[at..at + geo.inode_size as usize],
        ino,
        csum,
    )?)
}

/// The journal inode's blocks as a journal area.
pub(crate) fn journal_area(io: &IoQueue, sb: &Superblock) -> FsResult<JournalArea> {
    let ino = match sb.journal_inum() {
        0 => JOURNAL_INO,
        n => n,
    };
    let inode = read_inode_direct(io, sb, ino)?;
    if inode.flags() & flags::EXTENTS == 0 {
        return Err(FsError::Unsupported(format!(
            "journal inode {ino} without extents"
        )));
    }
    let geo = geometry(sb);
    let owner = extent_tree::TreeOwner {
        ino,
        inode_seed: sb
            .has_metadata_csum()
            .then(|| crate::format::csum::inode_seed(sb.csum_seed(), ino, inode.generation())),
        goal: 0,
    };
    let mut reader = DeviceReader {
        io,
        block_size: geo.block_size as usize,
    };
    let (extents, _) = extent_tree::walk(&mut reader, inode.i_block(), &owner)?;
    let runs: Vec<AreaRun> = extents
        .iter()
        .filter(|e: &&Extent| !e.unwritten)
        .map(|e| AreaRun {
            logical: e.logical,
            physical: e.start,
            len: e.len,
        })
        .collect();
    JournalArea::new(geo.block_size, runs)
        .map_err(|why| FsError::Inconsistent(format!("journal inode {ino}: {why}")))
}

/// Everything `open` produced, for the caller to report.
pub struct MountReport {
    pub recovery: RecoveryReport,
    /// What applying the fast commits recovery found did, if there were any.
    pub fast_commit_replay: Option<crate::fast_commit::replay::ReplayReport>,
    /// Orphan inodes finished at mount.
    pub orphans_finished: usize,
    /// `false`: the file system has no journal (made with `-O ^has_journal`). Metadata
    /// is written in place by each commit and an fsync flushes, but a crash may leave it
    /// inconsistent, for `e2fsck` to repair: no promise beyond what the device gives.
    pub has_journal: bool,
    /// A file system without a journal that was not cleanly unmounted: it may be
    /// inconsistent; it stays marked so until `e2fsck` checks it.
    pub unchecked: bool,
}

/// What `jext mount` and `jext recover` say of a file system without a journal.
pub const NO_JOURNAL_NOTE: &str = "no journal (made with -O ^has_journal): metadata is \
    written in place and fsync flushes, but a crash may leave the file system inconsistent \
    until e2fsck repairs it; nothing is promised beyond what the device keeps";

/// Mounts the file system on `io`.
pub(crate) fn mount(
    io: Arc<IoQueue>,
    options: MountOptions,
) -> FsResult<(Arc<FsInner>, MountReport)> {
    let sb = read_superblock(&io)?;
    check_features(&sb, options.read_only)?;
    let geo = geometry(&sb);
    let device_bytes = io.device().size_bytes();
    if geo.blocks_count * u64::from(geo.block_size) > device_bytes {
        return Err(FsError::Inconsistent(format!(
            "the superblock says {} blocks of {} bytes, but the device has only {device_bytes} bytes",
            geo.blocks_count, geo.block_size
        )));
    }
    let has_journal = sb.has_compat(features::COMPAT_HAS_JOURNAL);
    if !has_journal && options.data_mode == DataMode::Journal {
        return Err(FsError::Invalid(
            "data=journal needs a journal, and this file system has none (made with \
             -O ^has_journal); mount it with data=ordered or data=writeback"
                .into(),
        ));
    }
    let area = has_journal.then(|| journal_area(&io, &sb)).transpose()?;
    let recovery = match &area {
        Some(area) => recover(&io, std::slice::from_ref(area))?,
        None => RecoveryReport {
            was_clean: true,
            ..RecoveryReport::default()
        },
    };
    let fast_commits_pending = !recovery.fast_commits.records.is_empty();
    // Fast commits are applied like the log, even by a read-only mount (as Linux does):
    // it starts writable, applies them, and then becomes read-only.
    let starts_read_only = options.read_only && !fast_commits_pending;
    // Replay may have rewritten the superblock.
    let mut sb = read_superblock(&io)?;
    // Without a journal, a crash leaves what only e2fsck repairs: an image found not
    // clean stays so at unmount, as ext4 restores the state it found (`s_mount_state`).
    let unchecked = !has_journal && sb.state() & STATE_CLEAN == 0;
    if !options.read_only {
        mark_in_use(&mut sb);
        sb.set_mnt_count(sb.mnt_count().wrapping_add(1));
        sb.set_mtime(now_seconds());
        write_superblock(&io, &sb)?;
    }
    let journal_config = JournalConfig {
        commit_interval_ms: options.commit_interval_ms,
        barrier: options.barrier,
        // Turned on in memory always, so a remount to rw logs in the right format; written
        // to the journal superblock at load only by a writable mount (a read-only one
        // writes them with its first commit after a remount).
        features: LogFeatures {
            csum_v3: sb.has_metadata_csum(),
            wide_blocks: sb.has_incompat(features::INCOMPAT_64BIT),
            fast_commit: sb.has_compat(features::COMPAT_FAST_COMMIT),
        },
        read_only: starts_read_only,
        commit_mode: options.journal_commit,
        record_mode: options.journal_records,
        fast_commits_pending,
        fast_commit_rings: match options.ijournal {
            IJournal::Single => 0,
            // iJournaling's per-core areas (TECHNIQUES.md §1.4 item 7): as many rings as
            // the format allows, whatever the cores. An fsync spends its time waiting for
            // the device, not on a CPU, so the fsyncs in flight at once outnumber the
            // cores (dwsl, 8 threads on 2 cores: 3,324 fsyncs/s with 2 rings, 7,069
            // with 8).
            IJournal::PerCore => jext_journal::format::itransaction::MAX_RINGS,
        },
        ..JournalConfig::default()
    };
    let journal = Arc::new(match area {
        Some(area) => Journal::load(io.clone(), area, journal_config)?,
        None => Journal::without_log(io.clone(), geo.block_size, journal_config)?,
    });
    let cache = BufferCache::new(
        io.clone(),
        geo.block_size as usize,
        options.cache_size_bytes / 4,
    );
    cache.attach_journal(journal.clone());
    let page_cache_bytes = options.cache_size_bytes - options.cache_size_bytes / 4;
    let pages = PageCache::new(geo.block_size as usize, page_cache_bytes);
    let dirty_limits = WritebackPolicy::default()
        .dirty_limits(page_cache_bytes, jext_cache::usable_memory_bytes());
    let generation = now_seconds();
    let group_count = geo.group_count;
    let inner = Arc::new(FsInner {
        csum_seed: sb.has_metadata_csum().then(|| sb.csum_seed()),
        group_csum: sb.group_csum(),
        default_hash_version: sb.def_hash_version(),
        hash_unsigned: sb.flags() & FLAG_UNSIGNED_HASH != 0,
        hash_seed: sb.hash_seed(),
        dir_index: sb.has_compat(features::COMPAT_DIR_INDEX),
        large_dir: sb.has_large_dir(),
        filetype: sb.has_incompat(features::INCOMPAT_FILETYPE),
        read_only: AtomicBool::new(starts_read_only),
        unchecked,
        geo,
        io,
        cache,
        journal,
        options,
        gate: RwLock::new(()),
        rename_lock: Mutex::new(()),
        inodes: InodeTable::new(),
        alloc: Allocator::new(Totals::default(), group_count),
        sb: Leaf::new(Rank::Superblock, sb),
        orphans: Leaf::new(Rank::Orphans, Vec::new()),
        fc: Leaf::new(Rank::FastCommits, Default::default()),
        pages: Leaf::new(Rank::Pages, pages),
        dirty_limits,
        error: Leaf::new(Rank::Error, None),
        next_generation: AtomicU32::new(generation),
        fc_stats: Leaf::new(Rank::Stats, Default::default()),
        adaptive: Leaf::new(Rank::AdaptiveJournal, Default::default()),
        writeback_owners: Default::default(),
        extent_nodes: Default::default(),
        epochs: Default::default(),
    });
    *inner.alloc.totals.lock() = Totals::load(&inner)?;
    // Before the fast-commit replay: an inode it deletes (or rewrites) may be on the
    // list, which must then lose it (or keep its link), as any operation's would.
    *inner.orphans.lock() = read_orphan_list(&inner)?;
    let mut fast_commit_replay = None;
    if fast_commits_pending {
        let mut op = Op::exclusive(&inner);
        fast_commit_replay = Some(apply_fast_commits(&mut op, &recovery)?);
    }
    if inner.options.read_only && !inner.is_read_only() {
        remount(&inner, true)?;
    }
    let orphans_finished = match inner.is_read_only() {
        true => 0,
        false => finish_orphans(&mut Op::exclusive(&inner))?,
    };
    Ok((
        inner,
        MountReport {
            recovery,
            fast_commit_replay,
            orphans_finished,
            has_journal,
            unchecked,
        },
    ))
}

/// Applies the fast commits recovery found as the first transaction, and waits for it to
/// be durable: until then the journal's superblock keeps them valid, so a crash here
/// replays them again from the same state.
fn apply_fast_commits(
    op: &mut Op,
    recovery: &RecoveryReport,
) -> FsResult<crate::fast_commit::replay::ReplayReport> {
    let fs = op.fs;
    let report = crate::fast_commit::replay::apply(op, &recovery.fast_commits.records)?;
    let tid = fs.journal.commit_all()?;
    fs.journal.commit_and_wait(tid)?;
    Ok(report)
}

fn now_seconds() -> u32 {
    crate::types::Timestamp::now()
        .seconds
        .clamp(0, i64::from(u32::MAX)) as u32
}

/// The on-disk orphan list, head first.
fn read_orphan_list(fs: &FsInner) -> FsResult<Vec<u32>> {
    let mut list = Vec::new();
    let mut next = fs.sb.lock().last_orphan();
    while next != 0 {
        if list.contains(&next) || list.len() as u32 > fs.geo.inodes_count {
            return Err(FsError::Inconsistent(format!(
                "the orphan list loops at inode {next}"
            )));
        }
        if next > fs.geo.inodes_count {
            return Err(FsError::Inconsistent(format!(
                "the orphan list names inode {next}, which does not exist"
            )));
        }
        list.push(next);
        let raw = crate::inodes::read_record(fs, next)?;
        next = raw.dtime();
    }
    Ok(list)
}

/// Deletes orphans without links and truncates the others to their size (the mount's
/// own operation, with the file system to itself).
fn finish_orphans(op: &mut Op) -> FsResult<usize> {
    let fs = op.fs;
    let orphans = fs.orphans.lock().clone();
    for &ino in &orphans {
        op.lock(ino, Reach::First)?;
        if op.inode(ino).raw.links_count() == 0 {
            crate::truncate::delete_inode(op, ino)?;
        } else {
            let size = op.inode(ino).raw.size();
            crate::truncate::shrink(op, ino, size)?;
            let mut tx = crate::tx::Tx::begin(op, 8)?;
            let r = crate::orphan::remove(&mut tx, ino).and_then(|_| tx.write_inode(ino));
            tx.end(r)?;
        }
        op.unlock(ino);
    }
    if !orphans.is_empty() {
        let mut sb = fs.sb.lock();
        let state = sb.state();
        sb.set_state(state & !STATE_ORPHANS);
    }
    Ok(orphans.len())
}

/// Deletes the unlinked inodes someone still held open: nobody holds one past the unmount.
/// A FUSE mount ends with DESTROY before the kernel drops its inodes, so a removed
/// directory whose FORGET never came would otherwise stay on the orphan list of a clean
/// image, for the next mount to finish.
fn delete_orphans_still_held(op: &mut Op) -> FsResult<()> {
    if op.fs.error().is_some() {
        return Ok(());
    }
    let orphans = op.fs.orphans.lock().clone();
    for ino in orphans {
        if op.lock_if_cached(ino, Reach::First) {
            if op.inode(ino).raw.links_count() == 0 {
                crate::truncate::delete_inode(op, ino)?;
            }
            op.unlock(ino);
        }
    }
    Ok(())
}

/// Writes everything back, empties the journal, and marks the file system clean.
/// The image is then as `umount` leaves it, and the device's owner lock is released.
pub(crate) fn unmount(fs: &FsInner) -> FsResult<()> {
    if fs.is_read_only() {
        fs.journal.shutdown()?;
    } else {
        write_back_data_at_once(fs);
        let error = {
            let mut op = Op::exclusive(fs);
            // The orphan list keeps what this could not delete, for the next mount: the
            // unmount itself goes on.
            if let Err(e) = delete_orphans_still_held(&mut op) {
                eprintln!("jext: unmount left unlinked inodes on the orphan list: {e}");
            }
            write_back_everything(&mut op)?
        };
        fs.journal.shutdown()?;
        if let Some(why) = error {
            return Err(FsError::ReadOnly(format!(
                "unmounted after an error; the journal keeps what committed ({why})"
            )));
        }
        mark_clean(fs)?;
    }
    fs.io.device().release_owner();
    Ok(())
}

/// Stops changes and makes the image clean (`remount,ro`), or lets changes start again
/// (`remount,rw`), the file system staying mounted.
pub(crate) fn remount(fs: &FsInner, read_only: bool) -> FsResult<()> {
    if read_only == fs.is_read_only() {
        return Ok(());
    }
    if read_only {
        write_back_data_at_once(fs);
        {
            let mut op = Op::exclusive(fs);
            if let Some(why) = write_back_everything(&mut op)? {
                return Err(FsError::ReadOnly(format!(
                    "an earlier error stopped writes ({why}); unmount to keep what committed"
                )));
            }
            // Still with every operation held off: nothing written after the write-back
            // can slip in before changes are refused.
            fs.read_only.store(true, Ordering::Release);
        }
        fs.journal.empty_log()?;
        return mark_clean(fs);
    }
    if !fs.io.device().writable() {
        return Err(FsError::ReadOnly(format!(
            "{} was opened read-only; unmount and mount it read-write",
            fs.io.device().describe()
        )));
    }
    let _alone = Op::exclusive(fs);
    let dirty = {
        let mut guard = fs.sb.lock();
        let sb = &mut *guard;
        check_features(sb, false)?;
        mark_in_use(sb);
        sb.set_mtime(now_seconds());
        sb.clone()
    };
    write_superblock_in_place(fs, &dirty)?;
    fs.read_only.store(false, Ordering::Release);
    Ok(())
}

/// Writes back every dirty page and inode into the journal (with the file system to
/// itself: `op` is exclusive); returns the error that stopped writes earlier, if one did
/// (then nothing was written back).
fn write_back_everything(op: &mut Op) -> FsResult<Option<String>> {
    let fs = op.fs;
    if let Some(why) = fs.error() {
        return Ok(Some(why));
    }
    let dirty = fs.inodes.dirty_inodes();
    let with_pages = crate::file::files_with_dirty_pages(fs);
    for ino in with_pages.into_iter().chain(dirty) {
        if op.lock_if_cached(ino, Reach::First) {
            crate::file::writeback(op, ino, true)?;
            op.unlock(ino);
        }
    }
    Ok(None)
}

/// Before the exclusive pass of [`write_back_everything`], which writes one file at a
/// time: the dirty files' data, many files at once (`file::write_back_files`), with
/// operations still allowed. A failure here leaves its pages dirty, and the exclusive pass
/// writes them again and reports it.
fn write_back_data_at_once(fs: &FsInner) {
    if fs.error().is_some() || fs.is_read_only() {
        return;
    }
    let files = crate::file::files_with_dirty_pages(fs);
    let _ = crate::file::write_back_files(fs, &files, crate::file::Urgency::Sync);
}

/// Marks `sb` in use by a writable mount: not clean, and with a journal,
/// `needs_recovery` (a file system without one has nothing to recover; e2fsck would call
/// the flag an error).
fn mark_in_use(sb: &mut Superblock) {
    if sb.has_compat(features::COMPAT_HAS_JOURNAL) {
        sb.set_feature_incompat(sb.feature_incompat() | features::INCOMPAT_RECOVER);
    }
    sb.set_state(sb.state() & !STATE_CLEAN);
}

/// Writes the superblock that says clean, with exact free counts (the journal is empty).
fn mark_clean(fs: &FsInner) -> FsResult<()> {
    let (free_blocks, free_inodes) = {
        let totals = fs.alloc.totals.lock();
        (totals.free_blocks, totals.free_inodes)
    };
    let clean = {
        let mut guard = fs.sb.lock();
        let sb = &mut *guard;
        sb.set_free_blocks_count(free_blocks);
        sb.set_free_inodes_count(free_inodes as u32);
        sb.set_feature_incompat(sb.feature_incompat() & !features::INCOMPAT_RECOVER);
        if !fs.unchecked {
            sb.set_state(sb.state() | STATE_CLEAN);
        }
        sb.set_wtime(now_seconds());
        sb.clone()
    };
    write_superblock_in_place(fs, &clean)
}

/// [`write_superblock`] on a mounted file system: the cached buffer of the block that
/// holds the superblock no longer matches its home, so it leaves the cache (the journal
/// must not take its bytes for the home block's, `jext_cache::buffer`).
fn write_superblock_in_place(fs: &FsInner, sb: &Superblock) -> FsResult<()> {
    write_superblock(&fs.io, sb)?;
    fs.cache.forget(fs.geo.superblock_location().0);
    Ok(())
}
