//! Setuid, setgid and file capabilities that a change to a file takes away, as Linux does
//! (`file_remove_privs`, `setattr_should_drop_suidgid`, `cap_inode_killpriv`): every write
//! and truncate drops the `security.capability` attribute, whoever makes it; one by a caller
//! without CAP_FSETID, and any chown of a non-directory, also drop setuid, and setgid where
//! the group may execute, or where the caller is neither in the file's group nor holds
//! CAP_FSETID (`setattr_should_drop_sgid`).
//!
//! The kernel does this itself for its own file systems; over FUSE with
//! `FUSE_HANDLE_KILLPRIV_V2` it leaves it to jext, which then saves the kernel a
//! `getxattr` round trip before every write.
//!
//! Must never touch a directory (setgid on a directory is inheritance, not a privilege) and
//! never start a transaction when there is nothing to drop.

use crate::error::{FsError, FsResult};
use crate::format::inode::Inode;
use crate::inodes::stamp;
use crate::state::FsInner;
use crate::tx::Tx;
use crate::types::{PrivilegeDrop, Timestamp};
use crate::xattr_ops;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;
const S_IFMT: u16 = 0o170000;
const S_IFDIR: u16 = 0o040000;

/// The attribute holding file capabilities.
pub(crate) const CAPABILITY_XATTR: &[u8] = b"security.capability";

/// The mode without the bits a change drops, for a file of group `gid`.
fn mode_without_privileges(mode: u16, gid: u32, what: &PrivilegeDrop) -> u16 {
    let PrivilegeDrop::CapabilitiesAndIds { caller_groups } = what else {
        return mode;
    };
    let mut kept = mode & !S_ISUID;
    let caller_may_keep = caller_groups
        .as_ref()
        .is_none_or(|groups| groups.contains(&gid));
    if mode & S_ISGID != 0 && (mode & S_IXGRP != 0 || !caller_may_keep) {
        kept &= !S_ISGID;
    }
    kept
}

/// What a change to inode `ino` would drop: the mode it leaves and whether a file
/// capability goes; `None` when nothing would. Reads the attributes at most once.
fn to_drop(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    what: &PrivilegeDrop,
) -> FsResult<Option<(u16, bool)>> {
    let mode = raw.mode();
    if mode & S_IFMT == S_IFDIR {
        return Ok(None);
    }
    let kept = mode_without_privileges(mode, raw.gid(), what);
    let capability = has_capability(fs, ino, raw)?;
    Ok((kept != mode || capability).then_some((kept, capability)))
}

/// Whether a change to inode `ino` would drop anything.
pub(crate) fn any_to_drop(
    fs: &FsInner,
    ino: u32,
    raw: &Inode,
    what: &PrivilegeDrop,
) -> FsResult<bool> {
    Ok(to_drop(fs, ino, raw, what)?.is_some())
}

fn has_capability(fs: &FsInner, ino: u32, raw: &Inode) -> FsResult<bool> {
    if !xattr_ops::may_have_any(raw) {
        return Ok(false);
    }
    match xattr_ops::get(fs, ino, raw, CAPABILITY_XATTR) {
        Ok(_) => Ok(true),
        Err(FsError::NoAttribute(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Drops what a change takes away, in `tx`, and moves ctime if anything went.
pub(crate) fn drop_in(tx: &mut Tx, ino: u32, what: &PrivilegeDrop) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    let Some((kept, capability)) = to_drop(tx.fs, ino, &raw, what)? else {
        return Ok(());
    };
    if capability {
        xattr_ops::remove(tx, ino, CAPABILITY_XATTR)?;
    }
    let info = tx.inode(ino)?;
    info.raw.set_mode(kept);
    info.raw.set_ctime(stamp(info, Timestamp::now()));
    tx.write_inode(ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setuid_always_goes_setgid_by_group_execute_and_the_callers_groups() {
        let capable = PrivilegeDrop::CapabilitiesAndIds {
            caller_groups: None,
        };
        let outsider = PrivilegeDrop::CapabilitiesAndIds {
            caller_groups: Some(vec![1000]),
        };
        let member = PrivilegeDrop::CapabilitiesAndIds {
            caller_groups: Some(vec![1000, 50]),
        };
        for what in [&capable, &outsider, &member] {
            assert_eq!(mode_without_privileges(0o104755, 50, what), 0o100755);
            assert_eq!(mode_without_privileges(0o106755, 50, what), 0o100755);
            assert_eq!(mode_without_privileges(0o100644, 50, what), 0o100644);
        }
        // Setgid without group execute stays for a member of the group or a capable caller.
        assert_eq!(mode_without_privileges(0o102745, 50, &capable), 0o102745);
        assert_eq!(mode_without_privileges(0o102745, 50, &member), 0o102745);
        assert_eq!(mode_without_privileges(0o102745, 50, &outsider), 0o100745);
        let caps = PrivilegeDrop::Capabilities;
        assert_eq!(mode_without_privileges(0o106755, 50, &caps), 0o106755);
    }
}
