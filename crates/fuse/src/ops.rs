//! The FUSE operations, each a thin translation to one library call: FUSE node ids to
//! ext4 inode numbers (FUSE's root node is 1, ext4's root inode 2, which is what `stat`
//! shows), requests' uid, gid and umask to new files' owners and modes, library errors to
//! errno values.
//!
//! The connection is set up as the kernel's own file systems behave: DESTROY is answered
//! only after the library's clean unmount (a `fuseblk` `umount` waits for it), SYNCFS
//! commits, POSIX ACLs are the kernel's to enforce (`FUSE_POSIX_ACL`; the library keeps
//! them and the mode in step), and inode numbers stay valid handles (`FUSE_EXPORT_SUPPORT`:
//! `open_by_handle_at` and NFS look inodes up by number with "." and "..").
//!
//! Promises: every reply carries what the library returned, no more (attributes are cached
//! by the kernel for `ATTR_TTL` only, and only this mount changes the image; a change the
//! kernel cannot see, `chattr`, invalidates them). Must never panic on a request: a bad
//! argument is an errno. Holds no per-open state except the open count the library keeps,
//! so that an unlinked file lives until its last release, and the kernel's references to
//! directories (`crate::kernel_holds`), so that a removed directory lives until the kernel
//! forgets it.

use crate::caller;
use crate::dir_streams::DirStreams;
use crate::kernel_holds::KernelHolds;
use crate::requests::RequestCounts;
use crate::sync_threads::SyncThreads;
use crate::{JEXT_IOC_FBARRIER, JEXT_IOC_FDATABARRIER};
use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    RenameFlags as FuseRenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use jext_fs::{
    FallocateMode, FileKind, Fs, FsError, Ino, PrivilegeDrop, RenameFlags, SetAttr, Stat,
    Timestamp, XattrSetMode, ROOT_INO,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may trust an attribute, a name or the absence of a name without
/// asking again. Only this mount changes the image (the daemon holds the image's owner
/// lock, and a second mount point is a bind mount sharing the kernel's caches), the kernel
/// updates or invalidates what its own requests change, and jext invalidates what it
/// changes on its own (`chattr`, privileges a write drops): nothing cached goes stale, so
/// the kernel need not ask again within any time a run lasts.
const ATTR_TTL: Duration = Duration::from_secs(3600);

/// `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` (`_IOR('f', 1, long)`, `_IOW('f', 2, long)`) and
/// their 32-bit forms, which carry the same int.
const FS_IOC_GETFLAGS: [u32; 2] = [0x8008_6601, 0x8004_6601];
const FS_IOC_SETFLAGS: [u32; 2] = [0x4008_6602, 0x4004_6602];
/// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` (`struct fsxattr`, 28 bytes): the kernel asks
/// for these around `chattr`, so they must answer for the flags they share with ext4.
const FS_IOC_FSGETXATTR: u32 = 0x801c_581f;
const FS_IOC_FSSETXATTR: u32 = 0x401c_5820;

/// ext4 inode flags and the `FS_XFLAG_*` bits that mirror them (as ext4's
/// `ext4_iflags_to_xflags`): sync, immutable, append, nodump, noatime, dax, projinherit.
const FLAG_TO_XFLAG: [(u32, u32); 7] = [
    (0x8, 0x20),
    (0x10, 0x8),
    (0x20, 0x10),
    (0x40, 0x80),
    (0x80, 0x40),
    (0x0200_0000, 0x8000),
    (0x2000_0000, 0x200),
];

fn xflags_of(flags: u32) -> u32 {
    FLAG_TO_XFLAG
        .iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, x)| x)
        .sum()
}

fn flags_with_xflags(flags: u32, xflags: u32) -> u32 {
    FLAG_TO_XFLAG.iter().fold(
        flags,
        |acc, (f, x)| if xflags & x != 0 { acc | f } else { acc & !f },
    )
}

/// What runs once the connection ends (see [`JextFuse::new`]).
type OnDestroy = Box<dyn FnOnce() + Send>;

/// The library behind a mount.
pub struct JextFuse {
    pub(crate) fs: Fs,
    pub(crate) writeback_cache: bool,
    /// The kernel leaves dropping setuid, setgid and file capabilities on write, truncate
    /// and chown to jext (`FUSE_HANDLE_KILLPRIV_V2`), and so asks no `getxattr` first.
    drops_privileges: bool,
    on_destroy: Mutex<Option<OnDestroy>>,
    requests: Arc<RequestCounts>,
    /// How to tell the kernel that attributes it cached changed; set once the session
    /// exists (after the handshake).
    notifier: Arc<OnceLock<Notifier>>,
    /// What each open directory listed and has not yet sent.
    dir_streams: DirStreams,
    /// The directories the kernel holds, alive until it forgets them.
    kernel_holds: KernelHolds,
    /// Where fsyncs and syncfs wait for the device, off the request threads.
    sync_threads: SyncThreads,
}

fn to_ext4(ino: INodeNo) -> Result<Ino, Errno> {
    match ino.0 {
        1 => Ok(ROOT_INO),
        n => Ino::try_from(n).map_err(|_| Errno::EINVAL),
    }
}

fn to_fuse(ino: Ino) -> INodeNo {
    INodeNo(if ino == ROOT_INO { 1 } else { u64::from(ino) })
}

/// The errno a caller sees. An EIO or EROFS goes to stderr with its cause, as ext4's
/// `ext4_error` goes to the kernel log: the caller sees only the number.
fn errno(e: FsError) -> Errno {
    let n = e.errno();
    if n == libc::EIO || n == libc::EROFS {
        let name = if n == libc::EIO { "EIO" } else { "EROFS" };
        eprintln!("jext: {name} returned to a caller: {e}");
    }
    Errno::from_i32(n)
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Regular => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
    }
}

/// What an attribute reply says: `stat`'s inode number is ext4's, the root's included.
fn attr(s: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(u64::from(s.ino)),
        ..entry_attr(s)
    }
}

/// What an entry reply says: fuser makes the node id of an entry from its attributes'
/// inode number, so the root must be 1 there.
fn entry_attr(s: &Stat) -> FileAttr {
    FileAttr {
        ino: to_fuse(s.ino),
        size: s.size,
        blocks: s.blocks_512,
        atime: s.atime.into(),
        mtime: s.mtime.into(),
        ctime: s.ctime.into(),
        crtime: s.crtime.into(),
        kind: kind(s.kind),
        perm: s.perm,
        nlink: s.nlink,
        uid: s.uid,
        gid: s.gid,
        rdev: s.rdev,
        blksize: s.block_size,
        flags: 0,
    }
}

/// Attributes of no file: node `ino`, no link, times (mtime, ctime), and nothing else. A
/// negative entry has them, and so does the answer to a setattr of a freed inode.
fn no_file_attr(ino: INodeNo, (mtime, ctime): (SystemTime, Option<SystemTime>)) -> FileAttr {
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: mtime,
        mtime,
        ctime: ctime.unwrap_or(mtime),
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

fn time(t: TimeOrNow) -> Timestamp {
    match t {
        TimeOrNow::SpecificTime(t) => Timestamp::from(t),
        TimeOrNow::Now => Timestamp::now(),
    }
}

fn is_now(t: Option<TimeOrNow>) -> bool {
    matches!(t, Some(TimeOrNow::Now))
}

/// Answers a create (named or not) with the new file, open.
fn created(reply: ReplyCreate, made: Result<Stat, Errno>) {
    match made {
        Ok(s) => reply.created(
            &ATTR_TTL,
            &entry_attr(&s),
            Generation(u64::from(s.generation)),
            FileHandle(0),
            NO_FLUSH,
        ),
        Err(e) => reply.error(e),
    }
}

fn negative_attr() -> FileAttr {
    no_file_attr(INodeNo(0), (UNIX_EPOCH, None))
}

fn empty(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn xattr_reply(reply: ReplyXattr, size: u32, bytes: Vec<u8>) {
    if size == 0 {
        reply.size(bytes.len() as u32);
    } else if bytes.len() > size as usize {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(&bytes);
    }
}

impl JextFuse {
    /// Serves `fs`, counting requests in `requests`; `on_destroy` runs once, after the
    /// library's clean unmount, when the kernel ends the connection.
    pub fn new(
        fs: Fs,
        writeback_cache: bool,
        requests: Arc<RequestCounts>,
        on_destroy: OnDestroy,
    ) -> JextFuse {
        JextFuse {
            fs,
            writeback_cache,
            drops_privileges: false,
            requests,
            on_destroy: Mutex::new(Some(on_destroy)),
            notifier: Arc::new(OnceLock::new()),
            dir_streams: DirStreams::default(),
            kernel_holds: KernelHolds::default(),
            sync_threads: SyncThreads::start(),
        }
    }

    /// Where the session's notifier goes once the session exists.
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// The library's clean unmount, then `on_destroy`; a second call does nothing.
    fn finish(&self) {
        let on_destroy = self
            .on_destroy
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        let Some(on_destroy) = on_destroy else {
            return;
        };
        self.sync_threads.stop();
        if let Err(e) = self.fs.unmount() {
            eprintln!("jext mount: unmount failed, the next mount will recover the journal: {e}");
        }
        on_destroy();
    }

    /// fsync or fdatasync of a file or directory, answered by a sync thread.
    fn fsync_on_sync_thread(&self, ino: INodeNo, datasync: bool, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        self.sync_threads.run(Box::new(move || {
            empty(
                reply,
                to_ext4(ino).and_then(|i| fs.fsync(i, datasync).map_err(errno)),
            );
        }));
    }

    /// Makes the kernel forget the attributes it cached for `ino` (a change it did not
    /// make itself, such as `chattr`, moved ctime).
    fn invalidate_attributes(&self, ino: Ino) {
        if let Some(notifier) = self.notifier.get() {
            // A negative offset invalidates the attributes only, not the cached pages.
            let _ = notifier.inval_inode(to_fuse(ino), -1, 0);
        }
    }

    /// A new inode: the caller's uid, the caller's gid unless the directory is setgid,
    /// and the mode less the caller's umask unless the directory's default ACL decides it
    /// (the library applies those rules).
    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        what: New<'_>,
    ) -> Result<Stat, Errno> {
        let parent = to_ext4(parent)?;
        let name = name.as_bytes();
        let (uid, gid) = (req.uid(), req.gid());
        match what {
            New::Node { mode, rdev, umask } => {
                self.fs.make_node(parent, name, mode, rdev, umask, uid, gid)
            }
            New::Symlink(target) => self.fs.symlink(parent, name, target, uid, gid),
        }
        .map_err(|e| self.node_errno(&[parent], e))
    }

    /// Runs a library call whose answer is an inode's attributes, as an entry: the kernel
    /// holds the node from then on (`crate::kernel_holds`).
    fn entry(&self, reply: ReplyEntry, result: Result<Stat, Errno>) {
        let held = result.and_then(|s| {
            let held = self.referenced(&s);
            let ino = s.ino;
            held.map(|()| s).map_err(|e| self.node_errno(&[ino], e))
        });
        match held {
            Ok(s) => reply.entry(
                &ATTR_TTL,
                &entry_attr(&s),
                Generation(u64::from(s.generation)),
            ),
            Err(e) => reply.error(e),
        }
    }

    /// The kernel got `node` in a reply: counted, and held open from its first reference
    /// if it is one the kernel holds alive (`crate::kernel_holds`).
    fn referenced(&self, node: &Stat) -> Result<(), FsError> {
        let hold = |ino| self.fs.open_inode(ino).map(drop);
        self.kernel_holds.referenced(node, hold)
    }

    /// The kernel dropped `references` of node `ino`. Letting go of the last deletes a
    /// directory removed while the kernel held it; an error then has no caller to go to
    /// (it is logged), and the orphan list keeps the directory for the next mount.
    fn forget_node(&self, ino: Ino, references: u64) {
        if self.kernel_holds.forgotten(ino, references) {
            let _ = self.fs.release(ino).map_err(errno);
        }
    }

    /// Answers a lookup of a name that does not exist with a negative entry (node id 0),
    /// which the kernel keeps for `ATTR_TTL`: a program that probes for a file (SQLite's
    /// hot-journal check, a PATH search) costs one round trip, not one per probe.
    fn lookup_reply(&self, reply: ReplyEntry, result: Result<Stat, Errno>) {
        match result {
            Err(Errno::ENOENT) => reply.entry(&ATTR_TTL, &negative_attr(), Generation(0)),
            other => self.entry(reply, other),
        }
    }

    /// The errno for `e`, an error of an operation on `nodes`, inodes the kernel named by
    /// number. The kernel may still hold a node whose inode jext freed (a file removed or
    /// renamed over while the kernel kept its node; a directory only in the moment between
    /// a lookup's reply and its hold, `crate::kernel_holds`): the library then finds the
    /// inode not in use and calls that an inconsistency, but for a number the kernel kept it
    /// is a file that is gone (ENOENT), as for any handle to a deleted inode. fstests
    /// generic/011's dirstress, whose processes create in and leave directories the others
    /// remove, met EIO here before directories were held.
    fn node_errno(&self, nodes: &[Ino], e: FsError) -> Errno {
        let gone = |&ino: &Ino| matches!(self.fs.stat_live(ino), Err(FsError::NotFound(_)));
        if matches!(e, FsError::Inconsistent(_)) && nodes.iter().any(gone) {
            return Errno::ENOENT;
        }
        errno(e)
    }

    /// `.` and `..` come only from the kernel's export operations (a file handle being
    /// turned back into an inode, `FUSE_EXPORT_SUPPORT`): `parent` is then any inode
    /// number, which must still name a live inode.
    fn lookup_dot(&self, parent: Ino, name: &[u8]) -> Result<Stat, Errno> {
        if name == b"." {
            return self.fs.stat_live(parent).map_err(errno);
        }
        self.fs.lookup(parent, name).map_err(errno)
    }

    fn setattr_inner(
        &self,
        ino: INodeNo,
        change: SetAttr,
        size: Option<u64>,
    ) -> Result<Stat, Errno> {
        let ino = to_ext4(ino)?;
        if size.is_some() {
            let st = self.fs.stat(ino).map_err(errno)?;
            if st.kind == FileKind::Directory {
                return Err(Errno::EISDIR);
            }
        }
        self.fs
            .setattr(ino, &SetAttr { size, ..change })
            .map_err(errno)
    }

    fn list(&self, ino: INodeNo, offset: u64) -> Result<Vec<jext_fs::DirEntry>, Errno> {
        self.fs.readdir(to_ext4(ino)?, offset).map_err(errno)
    }

    fn ioctl_inner(
        &self,
        req: &Request,
        ino: INodeNo,
        cmd: u32,
        in_data: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        let ino = to_ext4(ino)?;
        if FS_IOC_GETFLAGS.contains(&cmd) {
            let flags = self.fs.stat(ino).map_err(errno)?.flags;
            return Ok(flags.to_le_bytes().to_vec());
        }
        if FS_IOC_SETFLAGS.contains(&cmd) {
            let bytes: [u8; 4] = in_data
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or(Errno::EINVAL)?;
            self.set_flags(req, ino, |_| u32::from_le_bytes(bytes))?;
            return Ok(Vec::new());
        }
        if cmd == JEXT_IOC_FBARRIER || cmd == JEXT_IOC_FDATABARRIER {
            let datasync = cmd == JEXT_IOC_FDATABARRIER;
            self.fs.fbarrier(ino, datasync).map_err(errno)?;
            return Ok(Vec::new());
        }
        if cmd == FS_IOC_FSGETXATTR {
            let flags = self.fs.stat(ino).map_err(errno)?.flags;
            let mut fsxattr = vec![0u8; 28];
            fsxattr[..4].copy_from_slice(&xflags_of(flags).to_le_bytes());
            return Ok(fsxattr);
        }
        if cmd == FS_IOC_FSSETXATTR {
            let bytes: [u8; 4] = in_data
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or(Errno::EINVAL)?;
            self.set_flags(req, ino, |flags| {
                flags_with_xflags(flags, u32::from_le_bytes(bytes))
            })?;
            return Ok(Vec::new());
        }
        Err(Errno::ENOTTY)
    }

    /// `FS_IOC_SETFLAGS` and `FS_IOC_FSSETXATTR`: the flags `new_flags` makes of the
    /// current ones, after the checks the kernel leaves to the server
    /// ([`caller::check_flag_change`]).
    fn set_flags(
        &self,
        req: &Request,
        ino: Ino,
        new_flags: impl FnOnce(u32) -> u32,
    ) -> Result<(), Errno> {
        let now = self.fs.stat(ino).map_err(errno)?;
        let flags = new_flags(now.flags);
        caller::check_flag_change(req, now.uid, now.flags, flags)?;
        let change = SetAttr {
            flags: Some(flags),
            ..SetAttr::default()
        };
        self.fs.setattr(ino, &change).map_err(errno)?;
        self.invalidate_attributes(ino);
        Ok(())
    }

    /// What a change drops, when the kernel leaves that to jext: setuid and setgid where
    /// it says so (`kill_ids`: a write or truncate by a caller without CAP_FSETID, or a
    /// chown), file capabilities on any write or truncate (`writes`) too, as Linux does.
    fn privileges_dropped(
        &self,
        req: &Request,
        ino: Ino,
        kill_ids: bool,
        writes: bool,
    ) -> Option<PrivilegeDrop> {
        match (self.drops_privileges, kill_ids, writes) {
            (false, _, _) | (true, false, false) => None,
            (true, true, _) => Some(ids_dropped_by(&self.fs, req, ino)),
            (true, false, true) => Some(PrivilegeDrop::Capabilities),
        }
    }

    /// After an ACL change by a caller neither in the file's group nor holding
    /// CAP_FSETID, the kernel's `posix_acl_update_mode` clears set-group-ID; over FUSE it
    /// says so with `FUSE_SETXATTR_ACL_KILL_SGID`, and jext does it.
    fn drop_setgid(&self, ino: Ino) -> Result<(), Errno> {
        let perm = self.fs.stat(ino).map_err(errno)?.perm;
        if perm & 0o2000 == 0 {
            return Ok(());
        }
        let change = SetAttr {
            perm: Some(perm & !0o2000),
            ..SetAttr::default()
        };
        self.fs.setattr(ino, &change).map_err(errno)?;
        self.invalidate_attributes(ino);
        Ok(())
    }

    /// What the kernel would do before a write; the mode and ctime it cached are then out
    /// of date.
    fn drop_privileges(&self, ino: Ino, what: PrivilegeDrop) -> Result<(), Errno> {
        if self.fs.drop_privileges(ino, what).map_err(errno)? {
            self.invalidate_attributes(ino);
        }
        Ok(())
    }

    /// `may_open`'s rule for immutable and append-only files, which the kernel cannot
    /// apply itself (FUSE never gives it the inode flags): no writing open of an immutable
    /// file, and only appending, non-truncating ones of an append-only file. Every later
    /// change is checked again by the library, so a descriptor opened earlier gains nothing.
    fn check_open(&self, ino: Ino, open_flags: i32) -> Result<(), Errno> {
        let writes =
            open_flags & libc::O_ACCMODE != libc::O_RDONLY || open_flags & libc::O_TRUNC != 0;
        if !writes {
            return Ok(());
        }
        let flags = self
            .fs
            .stat(ino)
            .map_err(|e| self.node_errno(&[ino], e))?
            .flags;
        let appends_only = open_flags & libc::O_APPEND != 0 && open_flags & libc::O_TRUNC == 0;
        if flags & IMMUTABLE_FL != 0 || (flags & APPEND_FL != 0 && !appends_only) {
            return Err(Errno::EPERM);
        }
        Ok(())
    }
}

/// Setuid and setgid dropped by a change `req` makes to `ino`: root stands for a caller
/// with CAP_FSETID (FUSE passes no capabilities), anyone else keeps a setgid without group
/// execute only in the file's group, so the library then needs the caller's groups: the
/// request's gid and the supplementary ones `/proc` shows for its process. Every write
/// by a user comes this way, so `/proc` is read only for a file whose mode makes the
/// groups matter.
fn ids_dropped_by(fs: &Fs, req: &Request, ino: Ino) -> PrivilegeDrop {
    if req.uid() == 0 {
        return PrivilegeDrop::CapabilitiesAndIds {
            caller_groups: None,
        };
    }
    let mut groups = vec![req.gid()];
    let plain_setgid = fs.stat(ino).is_ok_and(|st| st.perm & 0o2010 == 0o2000);
    if !plain_setgid {
        return PrivilegeDrop::CapabilitiesAndIds {
            caller_groups: Some(groups),
        };
    }
    if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", req.pid())) {
        let listed = status
            .lines()
            .find_map(|l| l.strip_prefix("Groups:"))
            .unwrap_or("");
        groups.extend(
            listed
                .split_whitespace()
                .filter_map(|g| g.parse::<u32>().ok()),
        );
    }
    PrivilegeDrop::CapabilitiesAndIds {
        caller_groups: Some(groups),
    }
}

/// What every open answers: jext's flush has nothing to do (close makes nothing durable
/// on ext4 either), so the kernel need not send one on every close. With the writeback
/// cache the kernel still flushes its dirty pages at close, as it must.
const NO_FLUSH: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

/// `fuse_setxattr_in.setxattr_flags`: clear set-group-ID (fuse_kernel.h 7.33).
const FUSE_SETXATTR_ACL_KILL_SGID: u32 = 1;

/// ext4's immutable and append-only inode flags.
const IMMUTABLE_FL: u32 = 0x10;
const APPEND_FL: u32 = 0x20;

enum New<'a> {
    /// A file, directory or special node: `mode` with its type bits.
    Node {
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    Symlink(&'a [u8]),
}

impl New<'_> {
    /// A file or directory (`file_type`: `S_IFREG`, `S_IFDIR`) with the requested
    /// permissions, which the kernel sends without type bits.
    fn plain(file_type: u32, perm: u32, umask: u32) -> New<'static> {
        New::Node {
            mode: file_type | (perm & 0o7777),
            rdev: 0,
            umask,
        }
    }
}

impl Filesystem for JextFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.writeback_cache {
            config
                .add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE)
                .map_err(|_| std::io::Error::other("the kernel's FUSE has no writeback cache"))?;
        }
        config
            .add_capabilities(InitFlags::FUSE_EXPORT_SUPPORT)
            .map_err(|_| std::io::Error::other("the kernel's FUSE cannot export inodes"))?;
        // The kernel passes new inodes' umask along instead of applying it: jext applies it,
        // unless the parent's default ACL decides the permissions.
        config
            .add_capabilities(InitFlags::FUSE_DONT_MASK)
            .map_err(|_| std::io::Error::other("the kernel's FUSE cannot pass the umask"))?;
        if self.fs.options().acl {
            // The kernel then checks permissions against the ACLs, passes umask to us
            // instead of applying it, and asks us to keep mode and ACL in step.
            config
                .add_capabilities(InitFlags::FUSE_POSIX_ACL)
                .map_err(|_| std::io::Error::other("the kernel's FUSE has no POSIX ACLs"))?;
        }
        // SETXATTR then says when an ACL change must clear set-group-ID.
        let _ = config.add_capabilities(InitFlags::FUSE_SETXATTR_EXT);
        self.drops_privileges = config
            .add_capabilities(InitFlags::FUSE_HANDLE_KILLPRIV_V2)
            .is_ok();
        // Nanosecond times, as ext4 keeps them.
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn destroy_before_reply(&self) {
        self.finish();
    }

    fn request_received(&self, req: &Request) {
        self.requests.received(req.opcode());
    }

    fn destroy(&mut self) {
        // A plain `fuse` connection ends without DESTROY: this is its clean unmount.
        self.finish();
    }

    fn syncfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyEmpty) {
        let fs = self.fs.clone();
        self.sync_threads
            .run(Box::new(move || empty(reply, fs.sync().map_err(errno))));
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name.as_bytes();
        let parent = to_ext4(parent);
        match name {
            // Export lookups: a dead inode is a stale handle, never a cached absence.
            b"." | b".." => self.entry(reply, parent.and_then(|p| self.lookup_dot(p, name))),
            _ => self.lookup_reply(
                reply,
                parent.and_then(|p| {
                    self.fs
                        .lookup(p, name)
                        .map_err(|e| self.node_errno(&[p], e))
                }),
            ),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if let Ok(ino) = to_ext4(ino) {
            self.forget_node(ino, nlookup);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel may still hold a node whose inode jext freed: a regular file removed
        // while an `O_PATH` descriptor had it (`crate::kernel_holds` keeps only directories).
        // The file is gone, as for a handle to a deleted inode (ENOENT), not an
        // inconsistency (EIO).
        match to_ext4(ino).and_then(|i| self.fs.stat_live(i).map_err(errno)) {
            Ok(s) => reply.attr(&ATTR_TTL, &attr(&s)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let Ok(ext4_ino) = to_ext4(ino) else {
            return reply.error(Errno::EINVAL);
        };
        // With the writeback cache the kernel keeps the times of the writes it cached and
        // sends them later, with a ctime, which no program can set: times of writes, so an
        // append-only file takes them as it takes its appends (fstests generic/079).
        let times_of_cached_writes = self.writeback_cache && ctime.is_some() && atime.is_none();
        // It also sends them when it writes the inode back, which for a file deleted and
        // closed may come after jext freed it (the kernel forgets a node only after): the
        // times have nowhere to go, and nothing is lost. Success, with attributes nobody
        // caches: an error here is the kernel's writeback error, which the next
        // `syncfs` of the whole mount reported (GNU tar deletes the placeholders of its
        // delayed links, and `tar -x; sync -f` failed with ENOENT).
        if times_of_cached_writes && self.fs.stat_live(ext4_ino).is_err() {
            let times = (mtime.map_or(UNIX_EPOCH, |t| time(t).into()), ctime);
            return reply.attr(&Duration::ZERO, &no_file_attr(ino, times));
        }
        let drop_privileges = self.privileges_dropped(
            req,
            ext4_ino,
            kill_suidgid || uid.is_some() || gid.is_some(),
            size.is_some(),
        );
        let change = SetAttr {
            perm: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size: None,
            times_to_now: is_now(atime) || is_now(mtime) || times_of_cached_writes,
            drop_privileges,
            atime: atime.map(time),
            mtime: mtime.map(time),
            ctime: ctime.map(Timestamp::from),
            crtime: crtime.map(Timestamp::from),
            flags: None,
        };
        match self.setattr_inner(ino, change, size) {
            Ok(s) => reply.attr(&ATTR_TTL, &attr(&s)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target =
            to_ext4(ino).and_then(|i| self.fs.readlink(i).map_err(|e| self.node_errno(&[i], e)));
        match target {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.make(req, parent, name, New::Node { mode, rdev, umask }),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let dir = New::plain(libc::S_IFDIR, mode, umask);
        self.entry(reply, self.make(req, parent, name, dir));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = to_ext4(parent).and_then(|p| {
            self.fs
                .unlink(p, name.as_bytes())
                .map_err(|e| self.node_errno(&[p], e))
        });
        empty(reply, result);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let result = to_ext4(parent).and_then(|p| {
            self.fs
                .rmdir(p, name.as_bytes())
                .map_err(|e| self.node_errno(&[p], e))
        });
        empty(reply, result);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.entry(
            reply,
            self.make(
                req,
                parent,
                link_name,
                New::Symlink(target.as_os_str().as_bytes()),
            ),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: FuseRenameFlags,
        reply: ReplyEmpty,
    ) {
        let known = FuseRenameFlags::RENAME_NOREPLACE
            | FuseRenameFlags::RENAME_EXCHANGE
            | FuseRenameFlags::RENAME_WHITEOUT;
        if !known.contains(flags) {
            return reply.error(Errno::EINVAL);
        }
        let how = RenameFlags {
            no_replace: flags.contains(FuseRenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(FuseRenameFlags::RENAME_EXCHANGE),
            whiteout: flags
                .contains(FuseRenameFlags::RENAME_WHITEOUT)
                .then(|| (req.uid(), req.gid())),
        };
        let result = to_ext4(parent).and_then(|p| {
            let np = to_ext4(newparent)?;
            self.fs
                .rename(p, name.as_bytes(), np, newname.as_bytes(), how)
                .map_err(|e| self.node_errno(&[p, np], e))
        });
        empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let result = to_ext4(ino).and_then(|i| {
            let np = to_ext4(newparent)?;
            self.fs
                .link(i, np, newname.as_bytes())
                .map_err(|e| self.node_errno(&[i, np], e))
        });
        self.entry(reply, result);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let opened = to_ext4(ino).and_then(|i| {
            self.check_open(i, flags.0)?;
            self.fs.open_inode(i).map_err(|e| self.node_errno(&[i], e))
        });
        match opened {
            Ok(_) => reply.opened(FileHandle(0), NO_FLUSH),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match to_ext4(ino).and_then(|i| self.fs.read(i, offset, size as usize).map_err(errno)) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Only with the writeback cache does the kernel keep the times of what it cached
        // (without it, mmap'd pages also arrive as cached writes, and jext keeps the times).
        let kernel_keeps_times =
            self.writeback_cache && write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let kill_suidgid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let written = to_ext4(ino).and_then(|i| {
            if let Some(what) = self.privileges_dropped(req, i, kill_suidgid, true) {
                self.drop_privileges(i, what)?;
            }
            if kernel_keeps_times {
                self.fs.write_cached(i, offset, data)
            } else {
                self.fs.write(i, offset, data)
            }
            .map_err(errno)
        });
        match written {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() makes nothing durable on ext4 either; fsync does. Opens answer
        // FOPEN_NOFLUSH, but with the writeback cache the kernel flushes anyway (after
        // writing its dirty pages back): ENOSYS tells it jext has no flush at all, so it
        // stops asking. jext keeps no POSIX locks (the kernel does), so nothing is lost.
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        empty(
            reply,
            to_ext4(ino).and_then(|i| self.fs.release(i).map_err(errno)),
        );
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_on_sync_thread(ino, datasync, reply);
    }

    /// An open directory counts as open in the library, as an open file does: a
    /// directory renamed over or removed while open stays until its last close
    /// (fstests generic/035: `fstat` on it then shows nlink 0, not EIO).
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let opened =
            to_ext4(ino).and_then(|i| self.fs.open_inode(i).map_err(|e| self.node_errno(&[i], e)));
        match opened {
            Ok(_) => reply.opened(FileHandle(self.dir_streams.open()), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dir_streams.release(fh.0);
        empty(
            reply,
            to_ext4(ino).and_then(|i| self.fs.release(i).map_err(errno)),
        );
    }

    /// Fills the reply from what the last READDIR of this open directory listed and did
    /// not send, then from new batches, until it is full or the directory ends.
    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut pending = self.dir_streams.take(fh.0, offset);
        let mut at = offset;
        loop {
            if pending.is_empty() {
                match self.list(ino, at) {
                    Ok(batch) if batch.is_empty() => break,
                    Ok(batch) => pending = batch.into(),
                    Err(e) => return reply.error(e),
                }
            }
            let e = pending.pop_front().expect("refilled above");
            let full = reply.add(
                to_fuse(e.ino),
                e.next_cookie,
                kind(e.kind),
                OsStr::from_bytes(&e.name),
            );
            if full {
                pending.push_front(e);
                self.dir_streams.keep(fh.0, at, pending);
                break;
            }
            at = e.next_cookie;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.list(ino, offset) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        // The kernel takes a reference for every entry but `.` and `..`, and none for a
        // reply that fails: those counted are given back then.
        let mut counted = Vec::new();
        let fail = |counted: Vec<Ino>, reply: ReplyDirectoryPlus, node: Ino, err: FsError| {
            for given in counted {
                self.forget_node(given, 1);
            }
            reply.error(self.node_errno(&[node], err));
        };
        for e in entries {
            let st = match self.fs.stat(e.ino) {
                Ok(st) => st,
                Err(err) => return fail(counted, reply, e.ino, err),
            };
            let counts = !matches!(&e.name[..], b"." | b"..");
            if counts {
                if let Err(err) = self.referenced(&st) {
                    return fail(counted, reply, e.ino, err);
                }
                counted.push(e.ino);
            }
            let name = OsStr::from_bytes(&e.name);
            let generation = Generation(u64::from(st.generation));
            if reply.add(
                to_fuse(e.ino),
                e.next_cookie,
                name,
                &ATTR_TTL,
                &entry_attr(&st),
                generation,
            ) {
                if counts {
                    self.forget_node(e.ino, 1);
                }
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync_on_sync_thread(ino, datasync, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks,
                s.blocks_free,
                s.blocks_available,
                s.inodes,
                s.inodes_free,
                s.block_size,
                s.name_max,
                s.block_size,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        setxattr_flags: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrSetMode::Either,
            libc::XATTR_CREATE => XattrSetMode::Create,
            libc::XATTR_REPLACE => XattrSetMode::Replace,
            _ => return reply.error(Errno::EINVAL),
        };
        let kill_sgid = setxattr_flags & FUSE_SETXATTR_ACL_KILL_SGID != 0;
        empty(
            reply,
            to_ext4(ino).and_then(|i| {
                self.fs
                    .setxattr(i, name.as_bytes(), value, mode)
                    .map_err(errno)?;
                if kill_sgid {
                    self.drop_setgid(i)?;
                }
                Ok(())
            }),
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match to_ext4(ino).and_then(|i| self.fs.getxattr(i, name.as_bytes()).map_err(errno)) {
            Ok(value) => xattr_reply(reply, size, value),
            Err(e) => reply.error(e),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match to_ext4(ino).and_then(|i| self.fs.listxattr(i).map_err(errno)) {
            Ok(names) => {
                let mut list = Vec::new();
                for n in names {
                    list.extend_from_slice(&n);
                    list.push(0);
                }
                xattr_reply(reply, size, list);
            }
            Err(e) => reply.error(e),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(
            reply,
            to_ext4(ino).and_then(|i| self.fs.removexattr(i, name.as_bytes()).map_err(errno)),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let file = New::plain(libc::S_IFREG, mode, umask);
        let made = self
            .make(req, parent, name, file)
            .and_then(|s| self.fs.open_inode(s.ino).map_err(errno));
        created(reply, made);
    }

    fn tmpfile(
        &self,
        req: &Request,
        parent: INodeNo,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let made = to_ext4(parent).and_then(|p| {
            let mode = libc::S_IFREG | (mode & 0o7777);
            self.fs
                .create_unnamed(p, mode, umask, req.uid(), req.gid())
                .map_err(|e| self.node_errno(&[p], e))
        });
        // Held until the kernel forgets it, not only while open (`crate::kernel_holds`).
        let held = made.and_then(|s| match self.referenced(&s) {
            Ok(()) => Ok(s),
            Err(e) => {
                let _ = self.fs.release(s.ino);
                Err(errno(e))
            }
        });
        created(reply, held);
    }

    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        match self.ioctl_inner(req, ino, cmd, in_data) {
            Ok(out) => reply.ioctl(0, &out),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let known =
            libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !known != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let how = FallocateMode {
            keep_size: mode & libc::FALLOC_FL_KEEP_SIZE != 0,
            punch_hole: mode & libc::FALLOC_FL_PUNCH_HOLE != 0,
            zero_range: mode & libc::FALLOC_FL_ZERO_RANGE != 0,
        };
        // A punched hole never grows the file, and is no zero range.
        if how.punch_hole && (!how.keep_size || how.zero_range) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        // ext4's fallocate drops privileges as a write does (`file_modified`); the kernel
        // asks no FUSE server to, so jext does, taking uid 0 for CAP_FSETID.
        empty(
            reply,
            to_ext4(ino).and_then(|i| {
                let what = if req.uid() == 0 {
                    PrivilegeDrop::Capabilities
                } else {
                    ids_dropped_by(&self.fs, req, i)
                };
                self.drop_privileges(i, what)?;
                self.fs.fallocate(i, offset, length, how).map_err(errno)
            }),
        );
    }

    /// Without a handler the kernel copies through its own page cache, where, with the
    /// writeback cache, jext never sees the writes in time to refuse one (an immutable
    /// target) and each chunk costs a read and a write round trip.
    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        // The reply counts bytes in 32 bits; the caller asks again for the rest.
        let len = len.min(u64::from(u32::MAX) & !0xfff);
        let copied = to_ext4(ino_in).and_then(|from| {
            let to = to_ext4(ino_out)?;
            if let Some(what) = self.privileges_dropped(req, to, false, true) {
                self.drop_privileges(to, what)?;
            }
            self.fs
                .copy_file_range(from, offset_in, to, offset_out, len)
                .map_err(errno)
        });
        match copied {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            // The kernel answers SEEK_SET, SEEK_CUR and SEEK_END itself.
            _ => return reply.error(Errno::EINVAL),
        };
        // With the writeback cache, data just written may still be only in the kernel's
        // pages (it sends no writeback before an LSEEK), where jext sees a hole: a copy
        // that trusted the answer would skip that data. ENOSYS makes the kernel answer
        // from its own size from then on, as for a file system without holes: data up
        // to the end, the one hole there.
        if self.writeback_cache {
            return reply.error(Errno::ENOSYS);
        }
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        match to_ext4(ino).and_then(|i| self.fs.seek_data_or_hole(i, offset, hole).map_err(errno)) {
            Ok(at) => reply.offset(at as i64),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_one_to_fuse_and_two_to_ext4() {
        assert_eq!(to_ext4(INodeNo(1)), Ok(ROOT_INO));
        assert_eq!(to_fuse(ROOT_INO), INodeNo(1));
        assert_eq!(to_ext4(to_fuse(12)), Ok(12));
        assert_eq!(to_ext4(INodeNo(u64::MAX)), Err(Errno::EINVAL));
    }

    #[test]
    fn xflags_mirror_the_shared_inode_flags() {
        let immutable_append = 0x10 | 0x20;
        assert_eq!(xflags_of(immutable_append | 0x80000), 0x8 | 0x10);
        assert_eq!(flags_with_xflags(0x80000 | 0x10, 0x40), 0x80000 | 0x80);
    }
}
