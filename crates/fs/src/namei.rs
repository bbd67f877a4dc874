//! Namespace operations: looking names up, creating, linking, unlinking and renaming.
//!
//! Each operation checks everything that can fail for the caller's reasons (missing name,
//! existing target, non-empty directory, no space) before it opens a transaction, then
//! makes all its changes in that one transaction: a crash shows the namespace before or
//! after, never between. Link counts follow ext4's `dir_nlink` rule: a directory with too
//! many subdirectories for its 16-bit count gets a count of 1, meaning "many".

use crate::acl::{self, AclKind};
use crate::dir;
use crate::error::{FsError, FsResult};
use crate::fast_commit::{Ineligible, NewName};
use crate::format::acl::Acl;
use crate::format::inode::{flags, Inode};
use crate::inode_guard;
use crate::inodes::{new_record, set_device_number, stamp};
use crate::op::{Op, Reach};
use crate::state::FsInner;
use crate::truncate::delete_inode;
use crate::tx::Tx;
use crate::types::{FileKind, RenameFlags, Timestamp, ROOT_INO};
use crate::{alloc, blockmap, orphan};
use std::sync::atomic::Ordering;

/// ext4's largest link count (`EXT4_LINK_MAX`).
pub(crate) const LINK_MAX: u16 = 65000;
const S_ISGID: u32 = 0o2000;

/// Credits for one namespace change: inode tables, bitmaps, descriptors, directory
/// blocks and their index and extent blocks on both sides, the superblock (orphans).
const NAMESPACE_CREDITS: u32 = 64;

/// What a new inode is.
#[derive(Clone)]
pub(crate) struct NewNode<'a> {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub symlink_target: Option<&'a [u8]>,
    /// Permission bits to clear, unless the parent's default ACL decides them.
    pub umask: u32,
}

/// A new inode's ACLs, inherited from its parent's default ACL.
struct NewAcls {
    access: Option<Acl>,
    default: Option<Acl>,
}

fn name_str(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// The record of `ino` (held by `op`), which must be a directory.
fn load_dir(op: &Op, ino: u32) -> FsResult<Inode> {
    let info = op.inode(ino);
    if !info.is_dir() {
        return Err(FsError::NotDir(format!("inode {ino}")));
    }
    Ok(info.raw.clone())
}

/// The inode `name` names in directory `parent` (which `op` holds).
pub(crate) fn lookup(op: &mut Op, parent: u32, name: &[u8]) -> FsResult<u32> {
    let fs = op.fs;
    let raw = load_dir(op, parent)?;
    // As ext4_lookup: a name no entry can hold is too long, not missing.
    if name.len() > crate::format::dirent::MAX_NAME_LEN {
        return Err(FsError::NameTooLong(name_str(name)));
    }
    match name {
        b"." => Ok(parent),
        b".." => dotdot(fs, parent, &raw),
        _ => dir::lookup(fs, parent, &raw, name)?
            .map(|f| f.ino)
            .ok_or_else(|| FsError::NotFound(name_str(name))),
    }
}

/// The parent of directory `ino` (from its ".." entry; the root is its own parent).
fn dotdot(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<u32> {
    let listed = dir::list(fs, ino, raw, 0)?;
    listed
        .into_iter()
        .find(|l| l.name == b"..")
        .map(|l| l.ino)
        .ok_or_else(|| FsError::Inconsistent(format!("directory {ino} has no \"..\" entry")))
}

/// Fails with ENOSPC unless `blocks` blocks (and an inode, with `inode`) can be
/// allocated now; commits first when frees waiting for a commit would make the room.
pub(crate) fn ensure_space(fs: &FsInner, blocks: u64, inode: bool) -> FsResult<()> {
    let pending = fs.alloc.pending_blocks(fs.journal.committed_tid());
    let totals = fs.alloc.totals.lock();
    if inode && totals.free_inodes == 0 {
        return Err(FsError::NoSpace("no free inode left".into()));
    }
    if totals.free_blocks.saturating_sub(pending) >= blocks {
        return Ok(());
    }
    // Blocks freed by transactions not yet committed may be the room: the caller commits
    // with nothing locked and tries again (`Fs::with_room`), never here.
    Err(FsError::NoSpace(format!(
        "{blocks} blocks needed, {} free",
        totals.free_blocks
    )))
}

fn now() -> Timestamp {
    Timestamp::now()
}

fn touch_dir(tx: &mut Tx, ino: u32, t: Timestamp) -> FsResult<()> {
    let info = tx.inode(ino)?;
    let t = stamp(info, t);
    info.raw.set_mtime(t);
    info.raw.set_ctime(t);
    Ok(())
}

/// Creates `name` in `parent`; returns the new inode number, which `op` then holds with
/// the parent.
pub(crate) fn create(op: &mut Op, parent: u32, name: &[u8], node: NewNode) -> FsResult<u32> {
    let fs = op.fs;
    dir::check_name(name)?;
    op.lock(parent, Reach::First)?;
    let parent_raw = load_dir(op, parent)?;
    inode_guard::check_dir_add(parent, parent_raw.flags())?;
    let Err(room) = dir::lookup_for_add(fs, parent, &parent_raw, name)? else {
        return Err(FsError::Exists(name_str(name)));
    };
    let kind = FileKind::from_mode(node.mode)
        .ok_or_else(|| FsError::Invalid(format!("mode {:o} names no file type", node.mode)))?;
    let is_dir = kind == FileKind::Directory;
    if let Some(target) = node.symlink_target {
        if target.is_empty() || target.len() >= fs.geo.block_size as usize {
            return Err(FsError::NameTooLong(format!(
                "symlink target of {} bytes",
                target.len()
            )));
        }
    }
    if is_dir && parent_raw.links_count() >= LINK_MAX && !dir_nlink(fs) {
        return Err(FsError::TooManyLinks(format!("directory {parent}")));
    }
    ensure_space(fs, 16, true)?;
    let (node, acls) = inherited(fs, parent, &parent_raw, node, is_dir)?;
    let mut tx = Tx::begin(op, NAMESPACE_CREDITS)?;
    let r = create_in(&mut tx, (parent, room), name, kind, node, &acls);
    tx.end(r)
}

/// What a new inode in `parent` takes from it: its mode and ACLs from the parent's default
/// ACL (or `node`'s umask), its group (and a directory's set-group-ID) from a set-group-ID
/// parent.
fn inherited<'a>(
    fs: &FsInner,
    parent: u32,
    parent_raw: &Inode,
    node: NewNode<'a>,
    is_dir: bool,
) -> FsResult<(NewNode<'a>, NewAcls)> {
    let (mut mode, acls) = if fs.options.acl {
        let inherited = acl::inherit(fs, parent, parent_raw, node.mode, node.umask)?;
        let acls = NewAcls {
            access: inherited.access,
            default: inherited.default,
        };
        (inherited.mode, acls)
    } else {
        let acls = NewAcls {
            access: None,
            default: None,
        };
        (node.mode & !node.umask, acls)
    };
    let mut gid = node.gid;
    if u32::from(parent_raw.mode()) & S_ISGID != 0 {
        gid = parent_raw.gid();
        if is_dir {
            mode |= S_ISGID;
        }
    }
    Ok((NewNode { mode, gid, ..node }, acls))
}

/// Makes a regular file with no name, as if created in `parent` and unlinked at once
/// (`open(2)` with `O_TMPFILE`, ext4's `ext4_tmpfile`): it takes its mode, ACLs and group
/// from `parent`, waits on the orphan list with no links (a crash deletes it), and
/// `link` may give it a name. The caller holds it open; `op` then holds it.
pub(crate) fn create_unnamed(op: &mut Op, parent: u32, node: NewNode) -> FsResult<u32> {
    let fs = op.fs;
    if FileKind::from_mode(node.mode) != Some(FileKind::Regular) {
        return Err(FsError::Invalid(format!(
            "mode {:o}: only a regular file can be made without a name",
            node.mode
        )));
    }
    op.lock(parent, Reach::First)?;
    let parent_raw = load_dir(op, parent)?;
    inode_guard::check_dir_add(parent, parent_raw.flags())?;
    ensure_space(fs, 16, true)?;
    let (node, acls) = inherited(fs, parent, &parent_raw, node, false)?;
    let mut tx = Tx::begin(op, NAMESPACE_CREDITS)?;
    let r = (|| {
        let ino = alloc::alloc_inode(&mut tx, parent, false)?;
        let generation = tx.fs.next_generation.fetch_add(1, Ordering::Relaxed);
        let parent_flags = tx.inode(parent)?.raw.flags();
        let mut raw = new_record(
            tx.fs,
            node.mode,
            node.uid,
            node.gid,
            generation,
            now(),
            parent_flags,
        );
        raw.set_links_count(0);
        tx.op.lock_new(ino, raw);
        let info = tx.inode(ino)?;
        info.linkable = true;
        info.open_count = 1;
        acl::write(&mut tx, ino, AclKind::Access, acls.access.as_ref())?;
        acl::write(&mut tx, ino, AclKind::Default, acls.default.as_ref())?;
        orphan::add(&mut tx, ino)?;
        Ok(ino)
    })();
    tx.end(r)
}

fn dir_nlink(fs: &FsInner) -> bool {
    fs.sb
        .lock()
        .has_ro_compat(crate::format::superblock::features::RO_COMPAT_DIR_NLINK)
}

/// `room`: where the lookup that showed `name` absent found room for it, if it did.
fn create_in(
    tx: &mut Tx,
    (parent, room): (u32, Option<dir::Room>),
    name: &[u8],
    kind: FileKind,
    node: NewNode,
    acls: &NewAcls,
) -> FsResult<u32> {
    let is_dir = kind == FileKind::Directory;
    let ino = alloc::alloc_inode(tx, parent, is_dir)?;
    let generation = tx.fs.next_generation.fetch_add(1, Ordering::Relaxed);
    let t = now();
    let parent_flags = tx.inode(parent)?.raw.flags();
    let raw = new_record(
        tx.fs,
        node.mode,
        node.uid,
        node.gid,
        generation,
        t,
        parent_flags,
    );
    tx.op.lock_new(ino, raw);
    crate::adaptive_journal::at_create(tx, parent, name, ino)?;
    match kind {
        FileKind::Directory => {
            dir::init(tx, ino, parent)?;
            let dir_nlink = dir_nlink(tx.fs);
            let info = tx.inode(parent)?;
            let links = info.raw.links_count();
            // With dir_nlink, a count that would pass the limit becomes 1 ("many").
            info.raw
                .set_links_count(if links >= LINK_MAX && dir_nlink || links == 1 {
                    1
                } else {
                    links + 1
                });
        }
        FileKind::Symlink => write_symlink(tx, ino, node.symlink_target.unwrap_or_default())?,
        FileKind::CharDevice | FileKind::BlockDevice => {
            set_device_number(&mut tx.inode(ino)?.raw, node.rdev)
        }
        FileKind::Regular | FileKind::Fifo | FileKind::Socket => {}
    }
    tx.write_inode(ino)?;
    acl::write(tx, ino, AclKind::Access, acls.access.as_ref())?;
    acl::write(tx, ino, AclKind::Default, acls.default.as_ref())?;
    let file_type = if tx.fs.filetype {
        kind.dirent_type()
    } else {
        0
    };
    dir::add_at(tx, parent, name, ino, file_type, room)?;
    touch_dir(tx, parent, t)?;
    tx.write_inode(parent)?;
    // Every new name is remembered until durable: a fast commit creates the regular
    // files among them, and a directory's fsync must know of the others to commit in
    // full (an inherited ACL already closed the window for fast commits).
    let new_name = NewName {
        parent,
        name: name.to_vec(),
        tid: tx.tid(),
        regular: kind == FileKind::Regular,
        parent_grown: tx.inode(parent)?.fc.changed.map(|(_, _, t)| t),
    };
    let durable = tx.fs.journal.committed_tid();
    tx.fs.fc.lock().note_created(new_name, ino, durable);
    Ok(ino)
}

/// The whiteout `RENAME_WHITEOUT` leaves where the source was: a character device 0:0
/// with no permissions, as ext4 makes it.
fn leave_whiteout(tx: &mut Tx, parent: u32, name: &[u8], uid: u32, gid: u32) -> FsResult<()> {
    let node = NewNode {
        mode: FileKind::CharDevice.mode_bits(),
        uid,
        gid,
        rdev: 0,
        symlink_target: None,
        umask: 0,
    };
    let none = NewAcls {
        access: None,
        default: None,
    };
    create_in(tx, (parent, None), name, FileKind::CharDevice, node, &none).map(drop)
}

/// A symlink's target: in `i_block` when short ("fast"), else in one data block.
fn write_symlink(tx: &mut Tx, ino: u32, target: &[u8]) -> FsResult<()> {
    let len = target.len();
    if len < 60 {
        let info = tx.inode(ino)?;
        info.raw.i_block_mut()[..len].copy_from_slice(target);
        info.raw.set_size(len as u64);
        info.size = len as u64;
        return Ok(());
    }
    {
        let info = tx.inode(ino)?;
        info.raw.set_flags(info.raw.flags() | flags::EXTENTS);
        crate::extent_tree::init_root(info.raw.i_block_mut());
    }
    let phys = blockmap::allocate(tx, ino, 0, 1, false)?[0].start;
    tx.new_block(phys)?;
    tx.modify(phys, |b| b[..len].copy_from_slice(target))?;
    let info = tx.inode(ino)?;
    info.raw.set_size(len as u64);
    info.size = len as u64;
    Ok(())
}

/// The target of symlink `ino` (held by `op`).
pub(crate) fn readlink(op: &mut Op, ino: u32) -> FsResult<Vec<u8>> {
    let fs = op.fs;
    let info = &op.inode(ino);
    if !info.is_symlink() {
        return Err(FsError::Invalid(format!("inode {ino} is not a symlink")));
    }
    let len = info.raw.size() as usize;
    if len > fs.geo.block_size as usize {
        return Err(FsError::Inconsistent(format!(
            "symlink {ino} claims {len} bytes"
        )));
    }
    if info.raw.flags() & flags::EXTENTS == 0 {
        if len >= 60 {
            return Err(FsError::Inconsistent(format!(
                "fast symlink {ino} claims {len} bytes"
            )));
        }
        return Ok(info.raw.i_block()[..len].to_vec());
    }
    let raw = info.raw.clone();
    let extent = blockmap::lookup(fs, ino, &raw, 0)?
        .ok_or_else(|| FsError::Inconsistent(format!("symlink {ino} has no data block")))?;
    Ok(fs.cache.get(extent.start)?.bytes()[..len].to_vec())
}

/// Adds `name` in `parent` for existing inode `ino`; `op` then holds both.
pub(crate) fn link(op: &mut Op, ino: u32, parent: u32, name: &[u8]) -> FsResult<()> {
    let fs = op.fs;
    dir::check_name(name)?;
    op.lock(parent, Reach::First)?;
    let parent_raw = load_dir(op, parent)?;
    inode_guard::check_dir_add(parent, parent_raw.flags())?;
    if ino == parent || kind_of(fs, ino)? == Some(FileKind::Directory) {
        return Err(FsError::NotPermitted(format!(
            "hard link to directory {ino}"
        )));
    }
    op.lock(ino, Reach::Ascending)?;
    let info = op.inode(ino);
    inode_guard::check_unlink_or_link(ino, info.raw.flags())?;
    let first_name = info.raw.links_count() == 0;
    if first_name && !info.linkable {
        return Err(FsError::NotFound(format!(
            "inode {ino} has no name left to link to"
        )));
    }
    if info.raw.links_count() >= LINK_MAX {
        return Err(FsError::TooManyLinks(format!("inode {ino}")));
    }
    if dir::lookup(fs, parent, &parent_raw, name)?.is_some() {
        return Err(FsError::Exists(name_str(name)));
    }
    let kind = FileKind::from_mode(info.mode());
    ensure_space(fs, 8, false)?;
    let mut tx = Tx::begin(op, NAMESPACE_CREDITS)?;
    tx.fc_ineligible(Ineligible::Link);
    let r = (|| {
        let file_type = match (tx.fs.filetype, kind) {
            (true, Some(k)) => k.dirent_type(),
            _ => 0,
        };
        dir::add(&mut tx, parent, name, ino, file_type)?;
        if first_name {
            orphan::remove(&mut tx, ino)?;
            tx.inode(ino)?.linkable = false;
        }
        let t = now();
        let info = tx.inode(ino)?;
        info.raw.set_links_count(info.raw.links_count() + 1);
        info.raw.set_ctime(stamp(info, t));
        tx.write_inode(ino)?;
        // jext promises that fdatasync makes a file reachable by the name it was called
        // through, so a new name is part of what fdatasync waits for.
        tx.mark_datasync(ino);
        touch_dir(&mut tx, parent, t)?;
        tx.write_inode(parent)
    })();
    tx.end(r)
}

/// The file type of inode `ino`, looked at with its lock taken and released at once:
/// an inode's type never changes while any name leads to it, and which of two inodes is
/// a directory decides the order they are locked in.
pub(crate) fn kind_of(fs: &FsInner, ino: u32) -> FsResult<Option<FileKind>> {
    let slot = fs.inodes.load(fs, ino)?;
    let mode = slot.lock().mode();
    Ok(FileKind::from_mode(mode))
}

/// Removes `name` from `parent` (`rmdir`: it must be an empty directory; otherwise it
/// must not be a directory). An inode left without links is deleted now, or when its
/// last opener closes it.
pub(crate) fn unlink(op: &mut Op, parent: u32, name: &[u8], rmdir: bool) -> FsResult<()> {
    let fs = op.fs;
    match name {
        b"." => return Err(FsError::Invalid("cannot remove \".\"".into())),
        b".." => return Err(FsError::NotEmpty("..".into())),
        _ => {}
    }
    op.lock(parent, Reach::First)?;
    let parent_raw = load_dir(op, parent)?;
    let found = dir::lookup(fs, parent, &parent_raw, name)?
        .ok_or_else(|| FsError::NotFound(name_str(name)))?;
    let target = found.ino;
    op.lock(target, Reach::EntryOf(parent))?;
    let target_raw = op.inode(target).raw.clone();
    inode_guard::check_dir_remove(parent, parent_raw.flags())?;
    inode_guard::check_unlink_or_link(target, target_raw.flags())?;
    let is_dir = op.inode(target).is_dir();
    if rmdir && !is_dir {
        return Err(FsError::NotDir(name_str(name)));
    }
    if !rmdir && is_dir {
        return Err(FsError::IsDir(name_str(name)));
    }
    if is_dir && !dir::is_empty(fs, target, &target_raw)? {
        return Err(FsError::NotEmpty(name_str(name)));
    }
    let mut tx = Tx::begin(op, NAMESPACE_CREDITS)?;
    tx.fc_note_unlink(parent, target, name);
    let r = (|| {
        dir::remove(&mut tx, parent, name)?;
        let t = now();
        touch_dir(&mut tx, parent, t)?;
        if is_dir {
            drop_subdir_link(&mut tx, parent)?;
        }
        tx.write_inode(parent)?;
        drop_link(&mut tx, target, is_dir, t)
    })();
    let orphaned = tx.end(r)?;
    crate::adaptive_journal::at_unlink(op, parent, name, target);
    finish_if_unused(op, target, orphaned)
}

/// One directory fewer under `parent`.
fn drop_subdir_link(tx: &mut Tx, parent: u32) -> FsResult<()> {
    let info = tx.inode(parent)?;
    let links = info.raw.links_count();
    // 1 means "many" (dir_nlink); it stays 1.
    if links > 2 {
        info.raw.set_links_count(links - 1);
    }
    Ok(())
}

/// Drops one name of `ino`; returns true if it has no names left (it is then an orphan).
fn drop_link(tx: &mut Tx, ino: u32, is_dir: bool, t: Timestamp) -> FsResult<bool> {
    let info = tx.inode(ino)?;
    let links = if is_dir {
        0
    } else {
        info.raw.links_count().saturating_sub(1)
    };
    info.raw.set_links_count(links);
    info.raw.set_ctime(stamp(info, t));
    if links == 0 {
        orphan::add(tx, ino)?;
        Ok(true)
    } else {
        tx.write_inode(ino)?;
        Ok(false)
    }
}

/// Deletes an orphaned inode (held by `op`) now unless someone still has it open.
fn finish_if_unused(op: &mut Op, ino: u32, orphaned: bool) -> FsResult<()> {
    if orphaned && op.inode(ino).open_count == 0 {
        delete_inode(op, ino)?;
    }
    Ok(())
}

/// Directory `dir` and every directory above it, up to the root. Called under the
/// rename lock with no inode held: each is locked only while its ".." is read, and the
/// chain cannot change until the rename lock is released.
fn ancestors(op: &mut Op, mut dir: u32) -> FsResult<Vec<u32>> {
    let fs = op.fs;
    let mut chain = vec![dir];
    while dir != ROOT_INO {
        if chain.len() > 65_536 {
            return Err(FsError::Inconsistent(format!(
                "directory {dir}: \"..\" chain does not reach the root"
            )));
        }
        op.lock(dir, Reach::Renaming)?;
        let raw = load_dir(op, dir);
        op.unlock(dir);
        dir = dotdot(fs, dir, &raw?)?;
        chain.push(dir);
    }
    Ok(chain)
}

/// `renameat2`: moves `src_name` in `src_parent` to `dst_name` in `dst_parent`.
///
/// Locking (`crate::lock_order`): a rename within one directory locks it, then its two
/// entries. Between directories it takes the rename lock first, reads which directory
/// is above which (that cannot change while the lock is held), locks an ancestor before
/// its descendant (unrelated ones by number), then the entries: directories before
/// files, each by number.
pub(crate) fn rename(
    op: &mut Op,
    src_parent: u32,
    src_name: &[u8],
    dst_parent: u32,
    dst_name: &[u8],
    flags: RenameFlags,
) -> FsResult<()> {
    let fs = op.fs;
    if flags.exchange && (flags.no_replace || flags.whiteout.is_some()) {
        return Err(FsError::Invalid(
            "RENAME_EXCHANGE with RENAME_NOREPLACE or RENAME_WHITEOUT".into(),
        ));
    }
    for name in [src_name, dst_name] {
        if name == b"." || name == b".." {
            return Err(FsError::Invalid(format!(
                "cannot rename {:?}",
                name_str(name)
            )));
        }
    }
    dir::check_name(dst_name)?;
    let (above_src, above_dst) = lock_parents(op, src_parent, dst_parent)?;
    let sp_raw = load_dir(op, src_parent)?;
    let dp_raw = load_dir(op, dst_parent)?;
    let src = dir::lookup(fs, src_parent, &sp_raw, src_name)?
        .ok_or_else(|| FsError::NotFound(name_str(src_name)))?;
    let dst = dir::lookup(fs, dst_parent, &dp_raw, dst_name)?;
    if flags.exchange && dst.is_none() {
        return Err(FsError::NotFound(name_str(dst_name)));
    }
    if flags.no_replace && dst.is_some() {
        return Err(FsError::Exists(name_str(dst_name)));
    }
    if dst.is_some_and(|d| d.ino == src.ino) {
        return Ok(());
    }
    let src_is_dir = kind_of(fs, src.ino)? == Some(FileKind::Directory);
    let dst_is_dir = match dst {
        Some(d) => kind_of(fs, d.ino)? == Some(FileKind::Directory),
        None => false,
    };
    if src_parent != dst_parent {
        // Checked before the entries are locked: a directory moved below itself would
        // be locked after its own descendant.
        if src_is_dir && above_dst.contains(&src.ino) {
            return Err(FsError::Invalid(
                "cannot move a directory into itself".into(),
            ));
        }
        if flags.exchange && dst_is_dir && dst.is_some_and(|d| above_src.contains(&d.ino)) {
            return Err(FsError::Invalid(
                "cannot move a directory into itself".into(),
            ));
        }
    }
    let mut entries = vec![(!src_is_dir, src.ino)];
    if let Some(d) = dst {
        entries.push((!dst_is_dir, d.ino));
    }
    entries.sort_unstable();
    for (_, ino) in entries {
        let reach = match src_parent == dst_parent {
            true => Reach::EntryOf(src_parent),
            false => Reach::Renaming,
        };
        op.lock(ino, reach)?;
    }
    inode_guard::check_dir_remove(src_parent, sp_raw.flags())?;
    inode_guard::check_unlink_or_link(src.ino, op.inode(src.ino).raw.flags())?;
    inode_guard::check_dir_add(dst_parent, dp_raw.flags())?;
    if let Some(d) = dst {
        inode_guard::check_dir_remove(dst_parent, dp_raw.flags())?;
        inode_guard::check_unlink_or_link(d.ino, op.inode(d.ino).raw.flags())?;
    }
    if let (Some(d), false) = (dst, flags.exchange) {
        match (src_is_dir, dst_is_dir) {
            (true, false) => return Err(FsError::NotDir(name_str(dst_name))),
            (false, true) => return Err(FsError::IsDir(name_str(dst_name))),
            (true, true) => {
                let raw = op.inode(d.ino).raw.clone();
                if !dir::is_empty(fs, d.ino, &raw)? {
                    return Err(FsError::NotEmpty(name_str(dst_name)));
                }
            }
            (false, false) => {}
        }
    }
    if src_parent != dst_parent
        && src_is_dir
        && !flags.exchange
        && dp_raw.links_count() >= LINK_MAX
        && !dir_nlink(fs)
    {
        return Err(FsError::TooManyLinks(format!("directory {dst_parent}")));
    }
    ensure_space(fs, 16, false)?;
    let mut tx = Tx::begin(op, 2 * NAMESPACE_CREDITS)?;
    tx.fc_ineligible(Ineligible::Rename);
    let moves = Moves {
        src_parent,
        src_name,
        dst_parent,
        dst_name,
        src,
        src_is_dir,
        dst_is_dir,
    };
    let r = if flags.exchange {
        exchange(&mut tx, &moves, dst.expect("exchange has a target")).map(|()| None)
    } else {
        move_over(&mut tx, &moves, dst).and_then(|replaced| {
            if let Some((uid, gid)) = flags.whiteout {
                leave_whiteout(&mut tx, src_parent, src_name, uid, gid)?;
            }
            Ok(replaced)
        })
    };
    // The moved inodes' names changed: fdatasync through a new name waits for this
    // transaction (see `link`).
    tx.mark_datasync(src.ino);
    if let (true, Some(d)) = (flags.exchange, dst) {
        tx.mark_datasync(d.ino);
    }
    let replaced = tx.end(r)?;
    if let Some((ino, orphaned)) = replaced {
        finish_if_unused(op, ino, orphaned)?;
    }
    Ok(())
}

/// Locks a rename's parent directories (see [`rename`]); returns, for a rename between
/// directories, the chains above the source and the target parent.
fn lock_parents(op: &mut Op, src_parent: u32, dst_parent: u32) -> FsResult<(Vec<u32>, Vec<u32>)> {
    if src_parent == dst_parent {
        op.lock(src_parent, Reach::First)?;
        load_dir(op, src_parent)?;
        return Ok((Vec::new(), Vec::new()));
    }
    op.lock_renames();
    let above_src = ancestors(op, src_parent)?;
    let above_dst = ancestors(op, dst_parent)?;
    let first = if above_dst.contains(&src_parent) {
        src_parent
    } else if above_src.contains(&dst_parent) {
        dst_parent
    } else {
        src_parent.min(dst_parent)
    };
    let second = if first == src_parent {
        dst_parent
    } else {
        src_parent
    };
    op.lock(first, Reach::Renaming)?;
    op.lock(second, Reach::Renaming)?;
    Ok((above_src, above_dst))
}

struct Moves<'a> {
    src_parent: u32,
    src_name: &'a [u8],
    dst_parent: u32,
    dst_name: &'a [u8],
    src: dir::Found,
    src_is_dir: bool,
    dst_is_dir: bool,
}

/// A plain rename; returns the replaced inode and whether it lost its last name.
fn move_over(tx: &mut Tx, m: &Moves, dst: Option<dir::Found>) -> FsResult<Option<(u32, bool)>> {
    let t = now();
    let mut replaced = None;
    match dst {
        Some(d) => {
            dir::retarget(tx, m.dst_parent, m.dst_name, m.src.ino, m.src.file_type)?;
            if m.dst_is_dir {
                drop_subdir_link(tx, m.dst_parent)?;
            }
            replaced = Some((d.ino, drop_link(tx, d.ino, m.dst_is_dir, t)?));
        }
        None => dir::add(tx, m.dst_parent, m.dst_name, m.src.ino, m.src.file_type)?,
    }
    dir::remove(tx, m.src_parent, m.src_name)?;
    if m.src_is_dir && m.src_parent != m.dst_parent {
        dir::set_dotdot(tx, m.src.ino, m.dst_parent)?;
        drop_subdir_link(tx, m.src_parent)?;
        add_subdir_link(tx, m.dst_parent)?;
    }
    finish_times(tx, m, t)?;
    Ok(replaced)
}

/// One directory more under `parent` (1 stays 1: "many").
fn add_subdir_link(tx: &mut Tx, parent: u32) -> FsResult<()> {
    let dir_nlink = dir_nlink(tx.fs);
    let info = tx.inode(parent)?;
    let links = info.raw.links_count();
    if links != 1 {
        info.raw.set_links_count(if links >= LINK_MAX && dir_nlink {
            1
        } else {
            links + 1
        });
    }
    Ok(())
}

/// `RENAME_EXCHANGE`: the two names swap inodes.
fn exchange(tx: &mut Tx, m: &Moves, dst: dir::Found) -> FsResult<()> {
    let t = now();
    dir::retarget(tx, m.src_parent, m.src_name, dst.ino, dst.file_type)?;
    dir::retarget(tx, m.dst_parent, m.dst_name, m.src.ino, m.src.file_type)?;
    if m.src_parent != m.dst_parent {
        if m.src_is_dir {
            dir::set_dotdot(tx, m.src.ino, m.dst_parent)?;
            drop_subdir_link(tx, m.src_parent)?;
            add_subdir_link(tx, m.dst_parent)?;
        }
        if m.dst_is_dir {
            dir::set_dotdot(tx, dst.ino, m.src_parent)?;
            drop_subdir_link(tx, m.dst_parent)?;
            add_subdir_link(tx, m.src_parent)?;
        }
    }
    let info = tx.inode(dst.ino)?;
    info.raw.set_ctime(stamp(info, t));
    tx.write_inode(dst.ino)?;
    finish_times(tx, m, t)
}

fn finish_times(tx: &mut Tx, m: &Moves, t: Timestamp) -> FsResult<()> {
    touch_dir(tx, m.src_parent, t)?;
    tx.write_inode(m.src_parent)?;
    if m.dst_parent != m.src_parent {
        touch_dir(tx, m.dst_parent, t)?;
        tx.write_inode(m.dst_parent)?;
    }
    let info = tx.inode(m.src.ino)?;
    info.raw.set_ctime(stamp(info, t));
    tx.write_inode(m.src.ino)
}
