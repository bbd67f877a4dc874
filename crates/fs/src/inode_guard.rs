//! Immutable (`chattr +i`) and append-only (`chattr +a`) inodes: which changes ext4 refuses
//! them, with EPERM, as the kernel's VFS and ext4 do (`may_delete`, `notify_change`,
//! `vfs_fallocate`, `xattr_permission`, `ext4_write_checks`, `vfs_link`).
//!
//! The library checks every change here, at the moment it is made, so a descriptor opened
//! before `chattr +i` cannot write afterwards and no front end has to remember the rules.
//! What stays with the front end: refusing to *open* such a file for writing (the library
//! has no open modes).
//!
//! Must never refuse what ext4 allows (reads, `touch` of an append-only file, appends).

use crate::error::{FsError, FsResult};
use crate::format::inode::flags;
use crate::types::SetAttr;

fn refused(ino: u32, flags_now: u32, what: &str) -> FsError {
    let why = if flags_now & flags::IMMUTABLE != 0 {
        "immutable"
    } else {
        "append-only"
    };
    FsError::NotPermitted(format!("inode {ino} is {why}: {what}"))
}

fn immutable(f: u32) -> bool {
    f & flags::IMMUTABLE != 0
}

fn pinned(f: u32) -> bool {
    f & (flags::IMMUTABLE | flags::APPEND) != 0
}

/// A data write at `offset` to a file of `size` bytes: never into an immutable file, and
/// only at or past the end of an append-only one.
pub(crate) fn check_write(ino: u32, f: u32, offset: u64, size: u64) -> FsResult<()> {
    if immutable(f) || (f & flags::APPEND != 0 && offset < size) {
        return Err(refused(ino, f, "data may not be changed"));
    }
    Ok(())
}

/// `setattr`: nothing on an immutable inode; on an append-only one only times set to now
/// (`touch`), which `attr.times_to_now` says.
pub(crate) fn check_setattr(ino: u32, f: u32, attr: &SetAttr) -> FsResult<()> {
    if !pinned(f) {
        return Ok(());
    }
    let changes_owner_mode_or_size = attr.perm.is_some()
        || attr.uid.is_some()
        || attr.gid.is_some()
        || attr.size.is_some()
        || attr.crtime.is_some();
    let explicit_times = (attr.atime.is_some() || attr.mtime.is_some()) && !attr.times_to_now;
    let touches = attr.atime.is_some() || attr.mtime.is_some() || attr.ctime.is_some();
    if changes_owner_mode_or_size || explicit_times || (immutable(f) && touches) {
        return Err(refused(ino, f, "attributes may not be changed"));
    }
    Ok(())
}

/// `fallocate`: nothing on an immutable file; on an append-only one only allocation, with
/// or without `FALLOC_FL_KEEP_SIZE` (`vfs_fallocate` refuses every other mode flag).
pub(crate) fn check_fallocate(ino: u32, f: u32, only_allocates: bool) -> FsResult<()> {
    if immutable(f) || (f & flags::APPEND != 0 && !only_allocates) {
        return Err(refused(ino, f, "space may not be changed"));
    }
    Ok(())
}

/// Setting or removing an extended attribute (ACLs included).
pub(crate) fn check_xattr_change(ino: u32, f: u32) -> FsResult<()> {
    if pinned(f) {
        return Err(refused(ino, f, "extended attributes may not be changed"));
    }
    Ok(())
}

/// Adding an entry to directory `dir` (create, link target directory, rename target).
pub(crate) fn check_dir_add(dir: u32, f: u32) -> FsResult<()> {
    if immutable(f) {
        return Err(refused(dir, f, "no entry may be added"));
    }
    Ok(())
}

/// Removing an entry from directory `dir` (unlink, rmdir, rename source or victim).
pub(crate) fn check_dir_remove(dir: u32, f: u32) -> FsResult<()> {
    if pinned(f) {
        return Err(refused(dir, f, "no entry may be removed"));
    }
    Ok(())
}

/// The inode an entry names, when that entry is removed or renamed, or a hard link to it
/// is made.
pub(crate) fn check_unlink_or_link(ino: u32, f: u32) -> FsResult<()> {
    if pinned(f) {
        return Err(refused(ino, f, "its names may not change"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Timestamp;

    const APPEND: u32 = flags::APPEND;
    const IMMUTABLE: u32 = flags::IMMUTABLE;

    #[test]
    fn appends_and_touch_pass_an_append_only_file_but_nothing_else_does() {
        assert!(check_write(12, APPEND, 100, 100).is_ok());
        assert!(check_write(12, APPEND, 99, 100).is_err());
        assert!(check_write(12, IMMUTABLE, 100, 100).is_err());
        let touch = SetAttr {
            atime: Some(Timestamp::now()),
            mtime: Some(Timestamp::now()),
            times_to_now: true,
            ..SetAttr::default()
        };
        assert!(check_setattr(12, APPEND, &touch).is_ok());
        assert!(check_setattr(12, IMMUTABLE, &touch).is_err());
        let set_times = SetAttr {
            times_to_now: false,
            ..touch.clone()
        };
        assert!(check_setattr(12, APPEND, &set_times).is_err());
        let chmod = SetAttr {
            perm: Some(0o600),
            ..SetAttr::default()
        };
        assert!(check_setattr(12, APPEND, &chmod).is_err());
        assert!(check_setattr(12, 0, &chmod).is_ok());
        assert!(check_fallocate(12, APPEND, true).is_ok());
        assert!(check_fallocate(12, APPEND, false).is_err());
        assert!(check_xattr_change(12, APPEND).is_err());
        assert!(
            check_dir_add(2, APPEND).is_ok(),
            "append-only dirs take new entries"
        );
        assert!(check_dir_remove(2, APPEND).is_err());
        let err = check_dir_add(2, IMMUTABLE).unwrap_err();
        assert_eq!(err.errno(), libc::EPERM);
        assert!(err.to_string().contains("immutable"), "{err}");
    }
}
