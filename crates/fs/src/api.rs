//! The library API: a mounted file system ([`Fs`]) and open files ([`File`]).
//!
//! Every call is one operation (`crate::op::Op`): it locks the inodes it reads or changes,
//! in the order `crate::lock_order` prescribes, so calls on different files run at once.
//! `fsync` and `fdatasync` release their inode while their data writes transfer (see
//! `file::writeback`) and before waiting for the commit or fast commit. A few calls need the file
//! system still (a flag change that switches a file's journal mode; remount, unmount) and
//! run alone. `Fs` is cheap to clone and safe to share between threads.
//!
//! Dropping the last `Fs` without [`Fs::unmount`] is a crash as far as the disk is
//! concerned: what committed is recovered at the next mount, nothing more.

use crate::acl::{self, AclKind};
use crate::adaptive_journal::{self, AdaptiveJournalStats, AfterWrite};
use crate::error::{FsError, FsResult};
use crate::fast_commit;
use crate::format::inode::flags as iflags;
use crate::inode_guard;
use crate::inodes::{inode_time, stat};
use crate::journal_mode::FileJournalMode;
use crate::mount::{self, MountReport};
use crate::namei::{self, NewNode};
use crate::op::{Op, Reach};
use crate::options::MountOptions;
use crate::state::FsInner;
use crate::tx::Tx;
use crate::types::{
    DirEntry, FallocateMode, FileKind, Ino, PrivilegeDrop, RenameFlags, SetAttr, Stat, StatFs,
    ROOT_INO,
};
use crate::xattr_ops::{self, XattrSetMode};
use crate::{dir, file};
use jext_cache::{WritebackPolicy, WritebackTarget, WritebackThread};
use jext_device::{BlockDevice, CounterSnapshot};
use jext_io::{IoConfig, IoQueue};
use jext_journal::JournalStats;
use parking_lot::Mutex;
use std::path::Path;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How much of a `copy_file_range` one read and write carry (a FUSE write's maximum).
const COPY_CHUNK_BYTES: u64 = 1 << 20;

/// A mounted file system.
#[derive(Clone)]
pub struct Fs {
    mounted: Arc<Mounted>,
}

struct Mounted {
    inner: Arc<FsInner>,
    writeback: Mutex<Option<WritebackThread>>,
    unmounted: Mutex<bool>,
}

impl Fs {
    /// Mounts the file system on `device` (recovering its journal first).
    pub fn open(device: Arc<dyn BlockDevice>, options: MountOptions) -> FsResult<Fs> {
        Fs::open_with_report(device, options).map(|(fs, _)| fs)
    }

    /// Mounts and says what recovery and orphan cleanup did.
    pub fn open_with_report(
        device: Arc<dyn BlockDevice>,
        options: MountOptions,
    ) -> FsResult<(Fs, MountReport)> {
        let config = IoConfig {
            engine: options.io_engine,
            ..IoConfig::default()
        };
        let io = Arc::new(IoQueue::with_config(device, config)?);
        let (inner, report) = mount::mount(io, options)?;
        let policy = WritebackPolicy::default();
        let weak: Weak<dyn WritebackTarget> = Arc::downgrade(&inner) as Weak<dyn WritebackTarget>;
        // Spawned on read-only mounts too, which a remount may make writable; its ticks do
        // nothing while the file system is read-only.
        let thread = Some(WritebackThread::spawn(
            Duration::from_millis(policy.interval_ms),
            weak,
        ));
        let fs = Fs {
            mounted: Arc::new(Mounted {
                inner,
                writeback: Mutex::new(thread),
                unmounted: Mutex::new(false),
            }),
        };
        Ok((fs, report))
    }

    /// Mounts the image file or block device at `path`.
    pub fn open_path(path: &Path, options: MountOptions) -> FsResult<Fs> {
        let device = jext_device::open_path(path, options.read_only)?;
        Fs::open(device, options)
    }

    /// Runs `f` with the file system to itself (for fsck, debug and tests).
    pub(crate) fn with_exclusive<R>(&self, f: impl FnOnce(&mut Op) -> R) -> FsResult<R> {
        let mut op = self.op(true)?;
        Ok(f(&mut op))
    }

    fn inner(&self) -> &FsInner {
        &self.mounted.inner
    }

    /// One operation: the changes gate shared, or (`exclusive`) the file system to itself.
    /// Refused once the file system is unmounted.
    fn op(&self, exclusive: bool) -> FsResult<Op<'_>> {
        if *self.mounted.unmounted.lock() {
            return Err(FsError::Invalid("the file system is unmounted".into()));
        }
        Ok(match exclusive {
            true => Op::exclusive(self.inner()),
            false => Op::shared(self.inner()),
        })
    }

    /// Runs `f` as one operation. When it finds no room but transactions not yet
    /// committed have freed blocks, commits them with nothing locked (a commit never waits
    /// for an operation) and runs `f` once more. `f` must change nothing before it fails
    /// for room, or change it the same way again.
    fn with_room<R>(&self, exclusive: bool, f: impl Fn(&mut Op) -> FsResult<R>) -> FsResult<R> {
        let fs = self.inner();
        let mut op = self.op(exclusive)?;
        match f(&mut op) {
            Err(FsError::NoSpace(_)) if fs.alloc.pending_blocks(fs.journal.committed_tid()) > 0 => {
                drop(op);
                fs.journal.commit_all()?;
                f(&mut self.op(exclusive)?)
            }
            result => result,
        }
    }

    /// Runs `f` on inode `ino`, locked alone.
    fn on_inode<R>(&self, ino: Ino, f: impl FnOnce(&mut Op) -> FsResult<R>) -> FsResult<R> {
        let mut op = self.op(false)?;
        op.lock(ino, Reach::First)?;
        f(&mut op)
    }

    /// `remount,ro` (`read_only`) or `remount,rw`: going read-only writes everything back,
    /// commits, checkpoints and leaves the image clean, as an unmount would; going back
    /// makes the image dirty (needs_recovery) again and lets changes start a new
    /// transaction. A file system opened on a read-only device cannot become writable.
    pub fn remount(&self, read_only: bool) -> FsResult<()> {
        drop(self.op(false)?);
        mount::remount(self.inner(), read_only)
    }

    /// Writes everything back, checkpoints, and marks the image clean. Later calls fail.
    pub fn unmount(&self) -> FsResult<()> {
        let mut unmounted = self.mounted.unmounted.lock();
        if *unmounted {
            return Ok(());
        }
        if let Some(thread) = self.mounted.writeback.lock().take() {
            thread.stop();
        }
        *unmounted = true;
        mount::unmount(self.inner())
    }

    pub fn root(&self) -> Ino {
        ROOT_INO
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.inner().geo.block_size
    }

    /// What `stat` shows for inode `ino`.
    pub fn stat(&self, ino: Ino) -> FsResult<Stat> {
        self.on_inode(ino, |op| stat(op.fs, ino, op.inode(ino)))
    }

    /// `stat` of an inode known only by its number (a file handle, an NFS client): ENOENT
    /// unless it is in use, that is named somewhere or still open.
    pub fn stat_live(&self, ino: Ino) -> FsResult<Stat> {
        let gone = || FsError::NotFound(format!("inode {ino} is not in use"));
        let inodes = self.inner().geo.inodes_count;
        if ino < ROOT_INO || ino > inodes {
            return Err(gone());
        }
        let mut op = self.op(false)?;
        if op.lock(ino, Reach::First).is_err() {
            return Err(gone());
        }
        let info = op.inode(ino);
        if info.raw.links_count() == 0 && info.open_count == 0 {
            return Err(gone());
        }
        stat(op.fs, ino, info)
    }

    /// Looks `name` up in directory `parent`.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<Stat> {
        self.on_inode(parent, |op| {
            let ino = namei::lookup(op, parent, name)?;
            if ino != parent {
                // ".." is above the directory: it is locked after the directory is let go.
                let reach = match name {
                    b".." => {
                        op.unlock(parent);
                        Reach::First
                    }
                    _ => Reach::EntryOf(parent),
                };
                op.lock(ino, reach)?;
            }
            stat(op.fs, ino, op.inode(ino))
        })
    }

    fn make(&self, parent: Ino, name: &[u8], node: NewNode) -> FsResult<Stat> {
        self.with_room(false, |op| {
            let ino = namei::create(op, parent, name, node.clone())?;
            stat(op.fs, ino, op.inode(ino))
        })
    }

    /// Creates a regular file with permissions `perm`.
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        perm: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Stat> {
        let mode = FileKind::Regular.mode_bits() | (perm & 0o7777);
        self.make(
            parent,
            name,
            NewNode {
                mode,
                uid,
                gid,
                rdev: 0,
                symlink_target: None,
                umask: 0,
            },
        )
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], perm: u32, uid: u32, gid: u32) -> FsResult<Stat> {
        let mode = FileKind::Directory.mode_bits() | (perm & 0o7777);
        self.make(
            parent,
            name,
            NewNode {
                mode,
                uid,
                gid,
                rdev: 0,
                symlink_target: None,
                umask: 0,
            },
        )
    }

    /// Creates a node of any type (`mode` includes the type bits; `rdev` for devices).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Stat> {
        self.make_node(parent, name, mode, rdev, 0, uid, gid)
    }

    /// Creates a node as a kernel request asks for one: `mode` with its type bits (not a
    /// symlink), and `umask` cleared from the permissions unless the parent's default ACL
    /// decides them (with a default ACL the new node inherits it instead, as ext4 does).
    #[allow(clippy::too_many_arguments)]
    pub fn make_node(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Stat> {
        if FileKind::from_mode(mode) == Some(FileKind::Symlink) {
            return Err(FsError::Invalid(
                "use symlink to make a symbolic link".into(),
            ));
        }
        self.make(
            parent,
            name,
            NewNode {
                mode,
                uid,
                gid,
                rdev,
                symlink_target: None,
                umask: umask & 0o7777,
            },
        )
    }

    /// Makes a regular file with no name in directory `parent` (`open(2)` with
    /// `O_TMPFILE`): mode, ACLs and group as if created there, no links, on the orphan list
    /// until [`Fs::link`] names it. It is open once on return; the last
    /// [`Fs::release`] of a file never named deletes it, and so does a crash.
    pub fn create_unnamed(
        &self,
        parent: Ino,
        mode: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> FsResult<Stat> {
        self.with_room(false, |op| {
            let node = NewNode {
                mode,
                uid,
                gid,
                rdev: 0,
                symlink_target: None,
                umask: umask & 0o7777,
            };
            let ino = namei::create_unnamed(op, parent, node)?;
            stat(op.fs, ino, op.inode(ino))
        })
    }

    /// Creates a symbolic link to `target`.
    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> FsResult<Stat> {
        let mode = FileKind::Symlink.mode_bits() | 0o777;
        self.make(
            parent,
            name,
            NewNode {
                mode,
                uid,
                gid,
                rdev: 0,
                symlink_target: Some(target),
                umask: 0,
            },
        )
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.on_inode(ino, |op| namei::readlink(op, ino))
    }

    /// Adds a hard link `name` in `parent` to `ino`.
    pub fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<Stat> {
        self.with_room(false, |op| {
            namei::link(op, ino, parent, name)?;
            stat(op.fs, ino, op.inode(ino))
        })
    }

    pub fn unlink(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        namei::unlink(&mut self.op(false)?, parent, name, false)
    }

    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        namei::unlink(&mut self.op(false)?, parent, name, true)
    }

    pub fn rename(
        &self,
        src_parent: Ino,
        src: &[u8],
        dst_parent: Ino,
        dst: &[u8],
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.with_room(false, |op| {
            namei::rename(op, src_parent, src, dst_parent, dst, flags)
        })
    }

    /// A batch of entries of directory `ino` from `cookie` on (0: from the start); call
    /// again from the last entry's `next_cookie` until a batch is empty.
    pub fn readdir(&self, ino: Ino, cookie: u64) -> FsResult<Vec<DirEntry>> {
        self.on_inode(ino, |op| {
            let fs = op.fs;
            let info = op.inode(ino);
            if !info.is_dir() {
                return Err(FsError::NotDir(format!("inode {ino}")));
            }
            let raw = info.raw.clone();
            let listed = dir::list_batch(fs, ino, &raw, cookie, dir::READDIR_BATCH_ENTRIES)?;
            crate::inodes::note_access(fs, op.inode_mut(ino));
            let mut out = Vec::with_capacity(listed.len());
            for l in listed {
                let kind = match FileKind::from_dirent_type(l.file_type) {
                    Some(kind) => kind,
                    None => namei::kind_of(fs, l.ino)?.ok_or_else(|| {
                        FsError::Inconsistent(format!("inode {} has no file type", l.ino))
                    })?,
                };
                out.push(DirEntry {
                    ino: l.ino,
                    name: l.name,
                    kind,
                    next_cookie: l.next_cookie,
                });
            }
            Ok(out)
        })
    }

    /// Makes `ino`'s data journaled or leaves it to the mount's `data=` (`chattr +j` /
    /// `-j`, at ext4's safe points: see [`FileJournalMode`]); returns the new `stat`.
    pub fn set_journal_mode(&self, ino: Ino, mode: FileJournalMode) -> FsResult<Stat> {
        let now = self.on_inode(ino, |op| Ok(op.inode(ino).raw.flags()))?;
        let now = now & iflags::USER_MODIFIABLE;
        let flags = match mode {
            FileJournalMode::Data => now | iflags::JOURNAL_DATA,
            FileJournalMode::Mount => now & !iflags::JOURNAL_DATA,
        };
        let change = SetAttr {
            flags: Some(flags),
            ..SetAttr::default()
        };
        self.setattr(ino, &change)
    }

    /// Whether `ino`'s data goes through the journal now: the mount's `data=journal`, the
    /// file's `j` flag, or for a while in memory (since a barrier, or after synced small
    /// appends, `crate::sync_journaling`); false for anything but a regular file.
    pub fn journals_data(&self, ino: Ino) -> FsResult<bool> {
        self.on_inode(ino, |op| Ok(op.fs.journals_data(op.inode(ino))))
    }

    /// Changes attributes; returns the new `stat`. A flag change runs alone: switching a
    /// file's journal mode waits for a commit and a checkpoint with every operation held
    /// off, as ext4's does (flag changes are rare).
    pub fn setattr(&self, ino: Ino, attr: &SetAttr) -> FsResult<Stat> {
        // `data=adaptive` may switch the file to journaled at a truncate to 0.
        let switches = self.inner().options.adaptive_journal
            && attr.size == Some(0)
            && self.on_inode(ino, |op| {
                Ok(adaptive_journal::switches_at_truncate(op, ino))
            })?;
        self.with_room(attr.flags.is_some() || switches, |op| {
            set_attributes(op, ino, attr)
        })
    }

    /// Drops `what` from `ino`, as Linux does before a write; says whether anything went
    /// (mode or ctime changed). Nothing to drop: no transaction.
    pub fn drop_privileges(&self, ino: Ino, what: PrivilegeDrop) -> FsResult<bool> {
        self.with_room(false, |op| {
            let fs = op.fs;
            op.lock(ino, Reach::First)?;
            let raw = op.inode(ino).raw.clone();
            if !crate::privileges::any_to_drop(fs, ino, &raw, &what)? {
                return Ok(false);
            }
            namei::ensure_space(fs, 4, false)?;
            let mut tx = Tx::begin(op, 12)?;
            let r = crate::privileges::drop_in(&mut tx, ino, &what);
            tx.end(r).map(|()| true)
        })
    }

    /// Notes that `ino` is open (an unlinked open inode lives until released).
    pub fn open_inode(&self, ino: Ino) -> FsResult<Stat> {
        self.on_inode(ino, |op| {
            let info = op.inode_mut(ino);
            info.open_count += 1;
            stat(op.fs, ino, op.inode(ino))
        })
    }

    /// Notes that one opener of `ino` closed it; deletes it if it has no names left.
    pub fn release(&self, ino: Ino) -> FsResult<()> {
        let fs = self.inner();
        let mut op = self.op(false)?;
        if !op.lock_if_cached(ino, Reach::First) {
            return Ok(());
        }
        let info = op.inode_mut(ino);
        info.open_count = info.open_count.saturating_sub(1);
        if info.open_count == 0 && info.raw.links_count() == 0 && !fs.is_read_only() {
            crate::truncate::delete_inode(&mut op, ino)?;
        }
        Ok(())
    }

    pub fn read(&self, ino: Ino, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        self.on_inode(ino, |op| file::read(op, ino, offset, len))
    }

    pub fn write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.write_with(ino, offset, data, true)
    }

    /// A write of pages a kernel cached earlier (FUSE's writeback cache): that kernel keeps
    /// the file's mtime and ctime itself and sends them with a `setattr`, which may come
    /// before these pages do, so the write changes data and size but not the times.
    ///
    /// The kernel writes back whole pages, so an append to an append-only file arrives as
    /// its page from the page's start: the bytes the file already holds come again, and
    /// only those past the end are new. They are checked, not written: a byte that differs
    /// is a change, and the write is refused (EPERM) as any write before the end is.
    pub fn write_cached(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        // Looked at only once the write was refused: every other cached write goes as is.
        match self.write_with(ino, offset, data, false) {
            Err(FsError::NotPermitted(why)) => {
                let resent = self.bytes_resent_to_append_only(ino, offset, data)?;
                if resent == 0 {
                    return Err(FsError::NotPermitted(why));
                }
                let rest = &data[resent..];
                Ok(resent + self.write_with(ino, offset + resent as u64, rest, false)?)
            }
            written => written,
        }
    }

    /// How many of `data`'s first bytes an append-only file already holds at `offset`, up
    /// to its end (0 for any other file, or if one of them differs).
    fn bytes_resent_to_append_only(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<usize> {
        let st = self.stat(ino)?;
        if st.flags & crate::format::inode::flags::APPEND == 0 || offset >= st.size {
            return Ok(0);
        }
        let overlap = (st.size - offset).min(data.len() as u64) as usize;
        let held = self.read(ino, offset, overlap)?;
        Ok(if held == data[..overlap] { overlap } else { 0 })
    }

    fn write_with(&self, ino: Ino, offset: u64, data: &[u8], touch_times: bool) -> FsResult<usize> {
        let (written, after) = self.with_room(false, |op| {
            op.lock(ino, Reach::First)?;
            let written = file::write(op, ino, offset, data, touch_times)?;
            let after = adaptive_journal::at_write(op, ino, offset, &data[..written]);
            Ok((written, after))
        })?;
        if after != AfterWrite::Nothing {
            self.with_room(true, |op| {
                op.lock(ino, Reach::First)?;
                match after {
                    AfterWrite::SwitchOn => adaptive_journal::switch_on_zeroed_header(op, ino),
                    AfterWrite::SwitchOff => adaptive_journal::switch_off_grown(op, ino),
                    AfterWrite::Nothing => Ok(()),
                }
            })?;
        }
        // With nothing locked: a throttled writer must not hold up others for its writeback.
        file::balance_dirty(self.inner(), ino)?;
        Ok(written)
    }

    /// `copy_file_range`: copies up to `len` bytes of `from` at `from_offset` to `to` at
    /// `to_offset`, stopping at the end of `from`, and returns how many it copied. ext4
    /// shares no blocks between files, so the copy is reads and writes, each write with
    /// every check a `write` makes (an immutable or append-only target refuses it).
    /// Overlapping ranges of one file are refused (EINVAL), as the kernel refuses them.
    pub fn copy_file_range(
        &self,
        from: Ino,
        from_offset: u64,
        to: Ino,
        to_offset: u64,
        len: u64,
    ) -> FsResult<u64> {
        let len = len.min(self.stat(from)?.size.saturating_sub(from_offset));
        let ends = |offset: u64| {
            offset.checked_add(len).ok_or_else(|| {
                FsError::Invalid(format!(
                    "copy_file_range: offset {offset} + {len} overflows"
                ))
            })
        };
        let (from_end, to_end) = (ends(from_offset)?, ends(to_offset)?);
        if from == to && from_offset < to_end && to_offset < from_end {
            return Err(FsError::Invalid(format!(
                "copy_file_range within inode {from}: bytes {from_offset}..{from_end} and \
                 {to_offset}..{to_end} overlap"
            )));
        }
        let mut copied = 0;
        while copied < len {
            let chunk = (len - copied).min(COPY_CHUNK_BYTES) as usize;
            let data = self.read(from, from_offset + copied, chunk)?;
            if data.is_empty() {
                break;
            }
            let written = self.write(to, to_offset + copied, &data)?;
            copied += written as u64;
            if written < data.len() {
                break;
            }
        }
        Ok(copied)
    }

    /// `fsync` (`datasync`: `fdatasync`): returns once the file is durable.
    pub fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        let fs = self.inner();
        drop(self.op(false)?);
        let _under_way = fs.journal.fsync_under_way();
        if !fs.is_read_only() {
            self.on_inode(ino, |op| crate::sync_journaling::choose(op, ino))?;
            // The bulk of the data a batch at a time; what is left (pages dirtied since,
            // the times, the last batch) is planned with the sync.
            file::write_back_unlocked(fs, ino, false, file::Urgency::Sync)?;
        }
        let (tid, flush, fast_commit) = {
            let mut op = self.op(false)?;
            op.lock(ino, Reach::First)?;
            let (tid, flush) = file::prepare_sync(&mut op, ino, datasync)?;
            adaptive_journal::at_sync(&mut op, ino);
            let tid = tid.filter(|&t| !fast_commit::already_durable(&op, ino, t));
            let fast_commit = tid.map(|tid| fast_commit::plan(&mut op, ino, tid));
            (tid, flush, fast_commit)
        };
        let fast_commit = fast_commit.transpose()?;
        if let (Some(tid), Some(plan)) = (tid, fast_commit) {
            let file = plan.as_ref().ok().and_then(|p| p.file);
            if fast_commit::write(fs, plan)? {
                if let Some(file) = file {
                    let mut op = self.op(false)?;
                    op.lock(file.0, Reach::First)?;
                    fast_commit::note_durable(&mut op, tid, file);
                }
                // The fast commit's preflush made the overwritten data durable too.
                return Ok(());
            }
            fs.journal.fsync_commit(tid)?;
        }
        if flush && fs.options.barrier {
            fs.io.flush()?;
        }
        Ok(())
    }

    /// `sync_file_range(SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER)` over the
    /// whole file: writes its dirty data back and waits for the writes, with no commit.
    /// Promises nothing: the data is not durable, and new blocks stay unwritten on disk
    /// until their transaction commits.
    pub fn write_back(&self, ino: Ino) -> FsResult<()> {
        let fs = self.inner();
        drop(self.op(false)?);
        if fs.is_read_only() {
            return Ok(());
        }
        file::write_back_unlocked(fs, ino, false, file::Urgency::Sync)
    }

    /// `fbarrier` (`datasync`: `fdatabarrier`), BarrierFS's ordering-only sync: returns
    /// once what fsync (fdatasync) would make durable is ordered before anything written
    /// after the call, none of it durable yet. A crash may lose it, but never keeps a
    /// later write while losing it. The order is the journal's (`crate::epochs`): the
    /// file's data and metadata wait in the running transaction, and nothing written in
    /// place after the call may overtake it. With nothing of the file to order, the
    /// barrier still ends an epoch. Without a journal nothing orders writes but a flush,
    /// and a barrier is an fsync.
    pub fn fbarrier(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        let fs = self.inner();
        if !fs.journal.has_log() {
            return self.fsync(ino, datasync);
        }
        if fs.is_read_only() {
            drop(self.op(false)?);
            return Ok(());
        }
        self.on_inode(ino, |op| crate::journal_mode::journal_in_memory(op, ino))?;
        file::write_back_unlocked(fs, ino, false, file::Urgency::Sync)?;
        let mut op = self.op(false)?;
        op.lock(ino, Reach::First)?;
        let (_, flush) = file::prepare_sync(&mut op, ino, datasync)?;
        adaptive_journal::at_sync(&mut op, ino);
        if flush && fs.options.barrier {
            // Written in place before the file journaled its data (a directory's never
            // is): only a flush orders that before what follows.
            fs.io.flush()?;
        }
        // Everything so far is in this transaction or an earlier one.
        let barrier = fs.journal.latest_tid();
        fs.fc
            .lock()
            .fence(barrier, fast_commit::Ineligible::Barrier);
        fs.epochs.end_epoch(barrier);
        Ok(())
    }

    pub fn fallocate(&self, ino: Ino, offset: u64, len: u64, mode: FallocateMode) -> FsResult<()> {
        self.with_room(false, |op| {
            op.lock(ino, Reach::First)?;
            file::fallocate(op, ino, offset, len, mode)
        })
    }

    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        let kind = self.acl_kind(name)?;
        self.on_inode(ino, |op| {
            let raw = op.inode(ino).raw.clone();
            match kind {
                Some(kind) => acl::get_xattr(op.fs, ino, &raw, kind),
                None => xattr_ops::get(op.fs, ino, &raw, name),
            }
        })
    }

    /// The ACL an xattr name stands for; EOPNOTSUPP for ACL names under `noacl`.
    fn acl_kind(&self, name: &[u8]) -> FsResult<Option<AclKind>> {
        let kind = AclKind::of_name(name);
        if kind.is_some() && !self.inner().options.acl {
            return Err(FsError::Unsupported(
                "POSIX ACLs on a file system mounted with noacl".into(),
            ));
        }
        Ok(kind)
    }

    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<Vec<u8>>> {
        self.on_inode(ino, |op| {
            let raw = op.inode(ino).raw.clone();
            xattr_ops::list(op.fs, ino, &raw)
        })
    }

    pub fn setxattr(
        &self,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        mode: XattrSetMode,
    ) -> FsResult<()> {
        let kind = self.acl_kind(name)?;
        self.with_room(false, |op| {
            op.lock(ino, Reach::First)?;
            inode_guard::check_xattr_change(ino, op.inode(ino).raw.flags())?;
            namei::ensure_space(op.fs, 4, false)?;
            let mut tx = Tx::begin(op, 12)?;
            let r = match kind {
                Some(kind) => acl::set_xattr(&mut tx, ino, kind, value, mode),
                None => xattr_ops::set(&mut tx, ino, name, value, mode),
            }
            .and_then(|_| touch_ctime(&mut tx, ino));
            tx.end(r)
        })
    }

    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.acl_kind(name)?;
        self.on_inode(ino, |op| {
            inode_guard::check_xattr_change(ino, op.inode(ino).raw.flags())?;
            let mut tx = Tx::begin(op, 12)?;
            let r = xattr_ops::remove(&mut tx, ino, name).and_then(|_| touch_ctime(&mut tx, ino));
            tx.end(r)
        })
    }

    pub fn statfs(&self) -> FsResult<StatFs> {
        drop(self.op(false)?);
        let fs = self.inner();
        let geo = &fs.geo;
        let (free, inodes_free) = {
            let totals = fs.alloc.totals.lock();
            (
                totals.free_blocks.saturating_sub(totals.reserved_blocks),
                totals.free_inodes,
            )
        };
        let sb = fs.sb.lock();
        Ok(StatFs {
            block_size: geo.block_size,
            blocks: geo.blocks_count - u64::from(sb.overhead_clusters()),
            blocks_free: free,
            blocks_available: free.saturating_sub(sb.r_blocks_count()),
            inodes: u64::from(geo.inodes_count),
            inodes_free,
            name_max: 255,
        })
    }

    /// Writes back all dirty data and commits (`sync(2)`, or rather `syncfs(2)`: the
    /// first error is reported, after every other file was written back and the journal
    /// committed, so one file's failed data write holds back nobody else's).
    pub fn sync(&self) -> FsResult<()> {
        let fs = self.inner();
        drop(self.op(false)?);
        let mut first_error = None;
        if !fs.is_read_only() {
            let files = file::files_with_dirty_pages(fs);
            first_error = file::write_back_files(fs, &files, file::Urgency::Sync).err();
            // What is left: times, sizes past the data, pages dirtied meanwhile.
            for ino in files.into_iter().chain(fs.inodes.dirty_inodes()) {
                let mut op = self.op(false)?;
                if op.lock_if_cached(ino, Reach::First) {
                    let written = file::writeback(&mut op, ino, true);
                    first_error = first_error.or(written.err());
                }
            }
        }
        let committed = fs.journal.commit_all();
        match first_error {
            Some(err) => Err(err),
            None => committed.map(|_| ()).map_err(Into::into),
        }
    }

    /// The extents of inode `ino`, in order (for SEEK_DATA / SEEK_HOLE and inspection).
    pub fn extents(&self, ino: Ino) -> FsResult<Vec<crate::format::extent::Extent>> {
        self.on_inode(ino, |op| file::extents(op, ino))
    }

    /// `lseek` with `SEEK_DATA` (`hole == false`) or `SEEK_HOLE` (`hole == true`).
    pub fn seek_data_or_hole(&self, ino: Ino, offset: u64, hole: bool) -> FsResult<u64> {
        self.on_inode(ino, |op| file::seek(op, ino, offset, hole))
    }

    /// Does now what the writeback thread does on its next tick: writes back expired and
    /// excess dirty data and dirty inode times, without waiting for a commit.
    pub fn writeback_now(&self) -> FsResult<()> {
        drop(self.op(false)?);
        crate::writeback_policy::writeback_due(self.inner())
    }

    /// The device's IO counters.
    pub fn counters(&self) -> CounterSnapshot {
        self.inner().io.device().counters().snapshot()
    }

    pub fn journal_stats(&self) -> JournalStats {
        self.inner().journal.stats()
    }

    /// Fsyncs that wrote a fast commit, and those that committed in full, by reason.
    pub fn fast_commit_stats(&self) -> fast_commit::FastCommitStats {
        self.inner().fc_stats.lock().clone()
    }

    /// What `data=adaptive` chose since mount.
    pub fn adaptive_journal_stats(&self) -> AdaptiveJournalStats {
        self.inner().adaptive_journal_stats()
    }

    /// The data mode and other options this mount uses.
    pub fn options(&self) -> MountOptions {
        self.inner().options.clone()
    }

    /// Memory the caches use: (cached pages, dirty pages, cached blocks).
    pub fn cache_usage(&self) -> FsResult<(usize, usize, usize)> {
        drop(self.op(false)?);
        let pages = self.inner().pages.lock().stats();
        Ok((
            pages.cached_pages,
            pages.dirty_pages,
            self.inner().cache.stats().cached_blocks,
        ))
    }

    /// The inode a `/`-separated path names (symlinks are not followed).
    pub fn resolve(&self, path: &str) -> FsResult<Ino> {
        let mut ino = ROOT_INO;
        let mut op = self.op(false)?;
        for part in path.split('/').filter(|p| !p.is_empty()) {
            // One directory at a time: each is let go before the next is locked.
            op.lock(ino, Reach::First)?;
            let next = namei::lookup(&mut op, ino, part.as_bytes());
            op.unlock(ino);
            ino = next?;
        }
        Ok(ino)
    }

    /// The parent directory and last name of a path.
    fn split_path<'p>(&self, path: &'p str) -> FsResult<(Ino, &'p str)> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = trimmed.rsplit_once('/').unwrap_or(("", trimmed));
        if name.is_empty() {
            return Err(FsError::Invalid(format!("{path:?} names no file")));
        }
        Ok((self.resolve(dir)?, name))
    }

    /// Creates a file at `path` and opens it.
    pub fn create_file(&self, path: &str, perm: u32) -> FsResult<File> {
        let (parent, name) = self.split_path(path)?;
        let stat = self.create(parent, name.as_bytes(), perm, 0, 0)?;
        File::open(self, stat.ino)
    }

    /// Opens the file at `path`.
    pub fn open_file(&self, path: &str) -> FsResult<File> {
        let ino = self.resolve(path)?;
        File::open(self, ino)
    }

    /// Creates a directory at `path`.
    pub fn mkdir_path(&self, path: &str, perm: u32) -> FsResult<Stat> {
        let (parent, name) = self.split_path(path)?;
        self.mkdir(parent, name.as_bytes(), perm, 0, 0)
    }
}

/// `setattr` of `ino`: a size first (truncate or extend), then the rest in one
/// transaction. A flag change comes with `op` exclusive (see [`Fs::setattr`]).
fn set_attributes(op: &mut Op, ino: Ino, attr: &SetAttr) -> FsResult<Stat> {
    op.lock(ino, Reach::First)?;
    inode_guard::check_setattr(ino, op.inode(ino).raw.flags(), attr)?;
    if let Some(f) = attr.flags {
        let keep = op.inode(ino).raw.flags() & !iflags::USER_MODIFIABLE;
        let wanted = f & iflags::USER_MODIFIABLE;
        check_flags_fit(ino, op.inode(ino).mode(), wanted)?;
        let old = op.inode(ino).raw.flags();
        adaptive_journal::at_user_flags(op, ino, old, keep | wanted);
        crate::journal_mode::prepare_flags_change(op, ino, keep | wanted)?;
    }
    if let Some(size) = attr.size {
        if op.inode(ino).size != size {
            file::set_size(op, ino, size)?;
            adaptive_journal::at_truncate(op, ino, size)?;
        }
    }
    // Dropping `security.capability` may rewrite and free an xattr block.
    let credits = if attr.drop_privileges.is_some() {
        12
    } else {
        4
    };
    let mut tx = Tx::begin(op, credits)?;
    let r = apply_attrs(&mut tx, ino, attr);
    tx.end(r)?;
    stat(op.fs, ino, op.inode(ino))
}

fn touch_ctime(tx: &mut Tx, ino: u32) -> FsResult<()> {
    let info = tx.inode(ino)?;
    info.raw
        .set_ctime(crate::inodes::stamp(info, crate::types::Timestamp::now()));
    tx.write_inode(ino)
}

/// What ext4's `FS_IOC_SETFLAGS` refuses (EOPNOTSUPP): a flag this kind of inode cannot
/// carry (`ext4_mask_flags`), or DAX with data journaling (`EXT4_DAX_MUT_EXCL`). DAX itself
/// is kept, as Linux ext4 keeps it on a device without DAX (it takes effect nowhere).
fn check_flags_fit(ino: u32, mode: u32, flags: u32) -> FsResult<()> {
    let allowed = match mode & 0o170000 {
        0o040000 => u32::MAX,
        0o100000 => iflags::REGULAR_FILE_MASK,
        _ => iflags::OTHER_MASK,
    };
    let both = iflags::DAX | iflags::JOURNAL_DATA;
    // The extents flag describes the inode's block map, whatever its kind.
    if flags & !allowed & !iflags::EXTENTS != 0 || flags & both == both {
        return Err(FsError::Unsupported(format!(
            "inode {ino} cannot carry flags {:#x}",
            flags & (!allowed | both)
        )));
    }
    Ok(())
}

fn apply_attrs(tx: &mut Tx, ino: u32, attr: &SetAttr) -> FsResult<()> {
    if let Some(what) = &attr.drop_privileges {
        crate::privileges::drop_in(tx, ino, what)?;
    }
    if let Some(perm) = attr.perm {
        let raw = &mut tx.inode(ino)?.raw;
        let mode = (raw.mode() & 0o170000) | (perm & 0o7777);
        raw.set_mode(mode);
        if tx.fs.options.acl {
            acl::follow_chmod(tx, ino, u32::from(mode))?;
        }
    }
    let info = tx.inode(ino)?;
    let raw = &mut info.raw;
    if let Some(uid) = attr.uid {
        raw.set_uid(uid);
    }
    if let Some(gid) = attr.gid {
        raw.set_gid(gid);
    }
    if let Some(t) = attr.atime {
        raw.set_atime(inode_time(t));
    }
    if let Some(t) = attr.mtime {
        raw.set_mtime(inode_time(t));
    }
    if let Some(t) = attr.crtime {
        raw.set_crtime(inode_time(t));
    }
    if let Some(f) = attr.flags {
        let wanted = f & iflags::USER_MODIFIABLE;
        check_flags_fit(ino, u32::from(raw.mode()), wanted)?;
        let keep = raw.flags() & !iflags::USER_MODIFIABLE;
        raw.set_flags(keep | wanted);
    }
    let ctime = match attr.ctime {
        Some(t) => inode_time(t),
        None => crate::inodes::stamp(info, crate::types::Timestamp::now()),
    };
    info.raw.set_ctime(ctime);
    tx.write_inode(ino)
}

/// An open file; closing (dropping) it releases the inode.
pub struct File {
    fs: Fs,
    ino: Ino,
}

impl File {
    fn open(fs: &Fs, ino: Ino) -> FsResult<File> {
        fs.open_inode(ino)?;
        Ok(File {
            fs: fs.clone(),
            ino,
        })
    }

    pub fn ino(&self) -> Ino {
        self.ino
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> FsResult<usize> {
        self.fs.write(self.ino, offset, data)
    }

    pub fn read_at(&self, offset: u64, len: usize) -> FsResult<Vec<u8>> {
        self.fs.read(self.ino, offset, len)
    }

    pub fn fsync(&self) -> FsResult<()> {
        self.fs.fsync(self.ino, false)
    }

    pub fn fdatasync(&self) -> FsResult<()> {
        self.fs.fsync(self.ino, true)
    }

    /// See [`Fs::write_back`].
    pub fn write_back(&self) -> FsResult<()> {
        self.fs.write_back(self.ino)
    }

    /// See [`Fs::fbarrier`].
    pub fn fbarrier(&self) -> FsResult<()> {
        self.fs.fbarrier(self.ino, false)
    }

    /// See [`Fs::fbarrier`].
    pub fn fdatabarrier(&self) -> FsResult<()> {
        self.fs.fbarrier(self.ino, true)
    }

    pub fn set_len(&self, size: u64) -> FsResult<()> {
        self.fs
            .setattr(
                self.ino,
                &SetAttr {
                    size: Some(size),
                    ..SetAttr::default()
                },
            )
            .map(|_| ())
    }

    pub fn stat(&self) -> FsResult<Stat> {
        self.fs.stat(self.ino)
    }

    /// See [`Fs::set_journal_mode`].
    pub fn set_journal_mode(&self, mode: FileJournalMode) -> FsResult<()> {
        self.fs.set_journal_mode(self.ino, mode).map(|_| ())
    }

    /// See [`Fs::journals_data`].
    pub fn journals_data(&self) -> FsResult<bool> {
        self.fs.journals_data(self.ino)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = self.fs.release(self.ino);
    }
}
