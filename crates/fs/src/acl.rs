//! POSIX ACLs as ext4 keeps them with its default `acl` option: stored in the inode's
//! xattrs (ext4's encoding, `format::acl`), shown to programs in the xattr encoding, kept
//! in step with the mode, and inherited from a directory's default ACL.
//!
//! What this module keeps true, as Linux's `fs/posix_acl.c` does: setting an access ACL
//! sets the mode to the permissions it implies, and an ACL that says no more than a mode
//! is dropped for that mode; `chmod` rewrites the owner, group (the mask, when there is
//! one) and other entries; a new inode under a directory with a default ACL gets that ACL,
//! masked by the mode it was created with, instead of the umask (and a new directory
//! inherits the default ACL itself). The kernel checks permissions against these ACLs (the
//! FUSE mount asks it to with `FUSE_POSIX_ACL`); the library itself checks none.
//!
//! Must never store an ACL that does not validate, nor change a mode bit beyond the nine
//! permission bits.

use crate::error::{FsError, FsResult};
use crate::format::acl::{
    Acl, TAG_GROUP, TAG_GROUP_OBJ, TAG_MASK, TAG_OTHER, TAG_USER, TAG_USER_OBJ,
};
use crate::format::inode::Inode;
use crate::format::Location;
use crate::state::FsInner;
use crate::tx::Tx;
use crate::xattr_ops::{self, XattrSetMode};

pub(crate) const ACCESS_NAME: &[u8] = b"system.posix_acl_access";
pub(crate) const DEFAULT_NAME: &[u8] = b"system.posix_acl_default";

const PERMISSION_BITS: u32 = 0o777;

/// Which of an inode's two ACLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AclKind {
    /// Checked when the inode is accessed.
    Access,
    /// A directory's: what new inodes in it start with.
    Default,
}

impl AclKind {
    /// The ACL an xattr name stands for, if it names one.
    pub(crate) fn of_name(name: &[u8]) -> Option<AclKind> {
        match name {
            ACCESS_NAME => Some(AclKind::Access),
            DEFAULT_NAME => Some(AclKind::Default),
            _ => None,
        }
    }

    fn name(self) -> &'static [u8] {
        match self {
            AclKind::Access => ACCESS_NAME,
            AclKind::Default => DEFAULT_NAME,
        }
    }
}

/// The mode permissions an ACL implies, and whether the ACL says no more than they do
/// (`posix_acl_equiv_mode`).
pub(crate) fn equivalent_mode(acl: &Acl, mode: u32) -> (u32, bool) {
    let mut perms = 0;
    let mut equivalent = true;
    for e in &acl.entries {
        let p = u32::from(e.perm);
        match e.tag {
            TAG_USER_OBJ => perms |= p << 6,
            TAG_GROUP_OBJ => perms |= p << 3,
            TAG_OTHER => perms |= p,
            TAG_MASK => {
                perms = (perms & !0o070) | (p << 3);
                equivalent = false;
            }
            _ => equivalent = false,
        }
    }
    ((mode & !PERMISSION_BITS) | perms, equivalent)
}

/// Rewrites the owner, group-class and other entries from `mode` (`__posix_acl_chmod`).
pub(crate) fn apply_chmod(acl: &mut Acl, mode: u32) {
    let has_mask = acl.entries.iter().any(|e| e.tag == TAG_MASK);
    let group_class = if has_mask { TAG_MASK } else { TAG_GROUP_OBJ };
    for e in &mut acl.entries {
        if e.tag == TAG_USER_OBJ {
            e.perm = ((mode >> 6) & 7) as u16;
        } else if e.tag == group_class {
            e.perm = ((mode >> 3) & 7) as u16;
        } else if e.tag == TAG_OTHER {
            e.perm = (mode & 7) as u16;
        }
    }
}

/// Masks an inherited ACL by the mode a new inode was asked for, and that mode by the ACL
/// (`posix_acl_create_masq`); returns the new mode and whether the ACL can be dropped.
pub(crate) fn mask_inherited(acl: &mut Acl, mode: u32) -> (u32, bool) {
    let mut perms = mode & PERMISSION_BITS;
    let mut equivalent = true;
    let has_mask = acl.entries.iter().any(|e| e.tag == TAG_MASK);
    for e in &mut acl.entries {
        match e.tag {
            TAG_USER_OBJ => {
                e.perm &= ((perms >> 6) & 7) as u16;
                perms &= (u32::from(e.perm) << 6) | !0o700;
            }
            TAG_USER | TAG_GROUP | TAG_MASK => equivalent = false,
            TAG_OTHER => {
                e.perm &= (perms & 7) as u16;
                perms &= u32::from(e.perm) | !0o007;
            }
            _ => {}
        }
    }
    let group_class = if has_mask { TAG_MASK } else { TAG_GROUP_OBJ };
    if let Some(e) = acl.entry_mut(group_class) {
        e.perm &= ((perms >> 3) & 7) as u16;
        perms &= (u32::from(e.perm) << 3) | !0o070;
    }
    (
        (mode & !PERMISSION_BITS) | (perms & PERMISSION_BITS),
        equivalent,
    )
}

/// Inode `ino`'s ACL of `kind`, if it has one.
pub(crate) fn read(fs: &FsInner, ino: u32, raw: &Inode, kind: AclKind) -> FsResult<Option<Acl>> {
    if !xattr_ops::may_have_any(raw) {
        return Ok(None);
    }
    match xattr_ops::get(fs, ino, raw, kind.name()) {
        Ok(bytes) => Ok(Acl::from_disk(&bytes, Location::Inode { ino })?),
        Err(FsError::NoAttribute(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Stores (or, with `None`, removes) inode `ino`'s ACL of `kind`, in ext4's encoding.
pub(crate) fn write(tx: &mut Tx, ino: u32, kind: AclKind, acl: Option<&Acl>) -> FsResult<()> {
    match acl {
        Some(acl) => {
            debug_assert!(acl.validate().is_ok(), "only valid ACLs are stored");
            xattr_ops::set(tx, ino, kind.name(), &acl.to_disk(), XattrSetMode::Either)
        }
        None => match xattr_ops::remove(tx, ino, kind.name()) {
            Ok(()) | Err(FsError::NoAttribute(_)) => Ok(()),
            Err(e) => Err(e),
        },
    }
}

/// `getxattr` of an ACL name: the xattr encoding.
pub(crate) fn get_xattr(fs: &FsInner, ino: u32, raw: &Inode, kind: AclKind) -> FsResult<Vec<u8>> {
    read(fs, ino, raw, kind)?
        .map(|acl| acl.to_xattr())
        .ok_or_else(|| FsError::NoAttribute(String::from_utf8_lossy(kind.name()).into_owned()))
}

/// `setxattr` of an ACL name (`value` in the xattr encoding): stores it, and for the
/// access ACL sets the mode it implies, dropping an ACL the mode says in full.
pub(crate) fn set_xattr(
    tx: &mut Tx,
    ino: u32,
    kind: AclKind,
    value: &[u8],
    mode: XattrSetMode,
) -> FsResult<()> {
    let acl = Acl::from_xattr(value, Location::Inode { ino })
        .map_err(|e| FsError::Invalid(e.to_string()))?;
    let raw = tx.raw_inode(ino)?;
    let exists = read(tx.fs, ino, &raw, kind)?.is_some();
    match (mode, exists) {
        (XattrSetMode::Create, true) => {
            return Err(FsError::Exists(String::from_utf8_lossy(kind.name()).into()))
        }
        (XattrSetMode::Replace, false) => {
            return Err(FsError::NoAttribute(
                String::from_utf8_lossy(kind.name()).into(),
            ))
        }
        _ => {}
    }
    let is_dir = u32::from(raw.mode()) & 0o170000 == 0o040000;
    let stored = match kind {
        AclKind::Default if !is_dir => {
            return match acl {
                Some(_) => Err(FsError::PermissionDenied(format!(
                    "inode {ino}: only a directory has a default ACL"
                ))),
                None => Ok(()),
            };
        }
        AclKind::Default => acl,
        AclKind::Access => match acl {
            None => None,
            Some(acl) => {
                let (new_mode, equivalent) = equivalent_mode(&acl, u32::from(raw.mode()));
                tx.inode(ino)?.raw.set_mode(new_mode as u16);
                (!equivalent).then_some(acl)
            }
        },
    };
    write(tx, ino, kind, stored.as_ref())
}

/// After a `chmod` of `ino` to `mode`: its access ACL, if any, says the same.
pub(crate) fn follow_chmod(tx: &mut Tx, ino: u32, mode: u32) -> FsResult<()> {
    let raw = tx.raw_inode(ino)?;
    if let Some(mut acl) = read(tx.fs, ino, &raw, AclKind::Access)? {
        apply_chmod(&mut acl, mode);
        write(tx, ino, AclKind::Access, Some(&acl))?;
    }
    Ok(())
}

/// What a new inode in `parent` starts with: its mode (the requested one, masked by the
/// parent's default ACL if it has one, else by `umask`), its access ACL, and (for a
/// directory) its default ACL.
pub(crate) struct Inherited {
    pub mode: u32,
    pub access: Option<Acl>,
    pub default: Option<Acl>,
}

pub(crate) fn inherit(
    fs: &FsInner,
    parent: u32,
    parent_raw: &Inode,
    mode: u32,
    umask: u32,
) -> FsResult<Inherited> {
    let is_symlink = mode & 0o170000 == 0o120000;
    let default = if is_symlink {
        None
    } else {
        read(fs, parent, parent_raw, AclKind::Default)?
    };
    let Some(default) = default else {
        let mode = if is_symlink { mode } else { mode & !umask };
        return Ok(Inherited {
            mode,
            access: None,
            default: None,
        });
    };
    let mut access = default.clone();
    let (mode, equivalent) = mask_inherited(&mut access, mode);
    let is_dir = mode & 0o170000 == 0o040000;
    Ok(Inherited {
        mode,
        access: (!equivalent).then_some(access),
        default: is_dir.then_some(default),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::acl::AclEntry;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl {
            entries: entries
                .iter()
                .map(|&(tag, perm, id)| AclEntry { tag, perm, id })
                .collect(),
        }
    }

    #[test]
    fn an_acl_with_only_the_three_classes_is_a_mode() {
        let plain = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_OTHER, 4, 0),
        ]);
        assert_eq!(equivalent_mode(&plain, 0o100_000), (0o100_754, true));
        let named = acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_MASK, 7, 0),
            (TAG_OTHER, 0, 0),
        ]);
        // The group bits of the mode show the mask, as `ls -l` shows for ACL files.
        assert_eq!(equivalent_mode(&named, 0o104_777), (0o104_670, false));
    }

    #[test]
    fn chmod_moves_the_group_bits_to_the_mask_when_there_is_one() {
        let mut named = acl(&[
            (TAG_USER_OBJ, 6, 0),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 4, 0),
            (TAG_MASK, 7, 0),
            (TAG_OTHER, 0, 0),
        ]);
        apply_chmod(&mut named, 0o750);
        let perms: Vec<u16> = named.entries.iter().map(|e| e.perm).collect();
        assert_eq!(
            perms,
            vec![7, 7, 4, 5, 0],
            "named user and group_obj untouched"
        );
    }

    #[test]
    fn inheritance_masks_the_default_acl_by_the_requested_mode() {
        let default = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_USER, 7, 1000),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_MASK, 7, 0),
            (TAG_OTHER, 5, 0),
        ]);
        let mut file = default.clone();
        let (mode, equivalent) = mask_inherited(&mut file, 0o100_666);
        assert!(!equivalent);
        assert_eq!(mode, 0o100_664);
        let perms: Vec<u16> = file.entries.iter().map(|e| e.perm).collect();
        // Named entries keep their bits; the mask and the classes lose what 0666 lacks.
        assert_eq!(perms, vec![6, 7, 5, 6, 4]);
        let mut plain = acl(&[
            (TAG_USER_OBJ, 7, 0),
            (TAG_GROUP_OBJ, 5, 0),
            (TAG_OTHER, 0, 0),
        ]);
        assert_eq!(mask_inherited(&mut plain, 0o040_777), (0o040_750, true));
    }
}
