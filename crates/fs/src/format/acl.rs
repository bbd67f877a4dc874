//! POSIX access control lists in their two encodings: the one programs see through
//! `getxattr`/`setxattr` of `system.posix_acl_access` and `system.posix_acl_default`, and
//! the more compact one ext4 stores in xattr entries of name index 2 and 3 (empty name).
//! Linux converts between them in `fs/ext4/acl.c`; e2fsprogs and fuse2fs do the same, so an
//! ACL jext writes is one Linux reads, and back.
//!
//! The xattr form (`<linux/posix_acl_xattr.h>`), little-endian:
//!
//! ```text
//! offset  size  field
//!      0     4  a_version   2
//!  then, per entry, 8 bytes:
//!      0     2  e_tag       USER_OBJ 0x01, USER 0x02, GROUP_OBJ 0x04, GROUP 0x08,
//!                           MASK 0x10, OTHER 0x20
//!      2     2  e_perm      read 4 | write 2 | execute 1
//!      4     4  e_id        uid (USER) or gid (GROUP); 0xFFFFFFFF for the others
//! ```
//!
//! The ext4 form (`fs/ext4/acl.h`), little-endian:
//!
//! ```text
//! offset  size  field
//!      0     4  a_version   1
//!  then, per entry:
//!      USER and GROUP (8 bytes):  e_tag u16, e_perm u16, e_id u32
//!      the others     (4 bytes):  e_tag u16, e_perm u16
//! ```
//!
//! Both list the entries sorted by tag, then by id. A decoded [`Acl`] is checked as the
//! kernel's `posix_acl_valid` checks it: exactly one USER_OBJ, GROUP_OBJ and OTHER, a MASK
//! whenever there is a named USER or GROUP entry (and at most one), no id twice, no
//! permission bit beyond rwx. Decoders refuse anything else with the problem named.

use super::{FormatError, Location};

pub const TAG_USER_OBJ: u16 = 0x01;
pub const TAG_USER: u16 = 0x02;
pub const TAG_GROUP_OBJ: u16 = 0x04;
pub const TAG_GROUP: u16 = 0x08;
pub const TAG_MASK: u16 = 0x10;
pub const TAG_OTHER: u16 = 0x20;

const XATTR_VERSION: u32 = 2;
const EXT4_VERSION: u32 = 1;
const UNDEFINED_ID: u32 = u32::MAX;
const HEADER_BYTES: usize = 4;
const XATTR_ENTRY_BYTES: usize = 8;
const EXT4_SHORT_ENTRY_BYTES: usize = 4;

/// One entry: whom it is about (`tag`, and `id` for named users and groups) and what it
/// allows (`perm`, rwx bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AclEntry {
    pub tag: u16,
    pub perm: u16,
    /// uid or gid for USER and GROUP entries; 0 (unused) for the others.
    pub id: u32,
}

impl AclEntry {
    fn is_named(&self) -> bool {
        self.tag == TAG_USER || self.tag == TAG_GROUP
    }
}

/// A valid access control list, entries in canonical order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    pub entries: Vec<AclEntry>,
}

fn problem(location: Location, what: impl Into<String>) -> FormatError {
    FormatError::new("POSIX ACL", location, what)
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl Acl {
    /// Decodes the xattr form; `Ok(None)` for a list with no entries (which, set, means
    /// "no ACL").
    pub fn from_xattr(bytes: &[u8], location: Location) -> Result<Option<Acl>, FormatError> {
        if bytes.len() < HEADER_BYTES
            || !(bytes.len() - HEADER_BYTES).is_multiple_of(XATTR_ENTRY_BYTES)
        {
            return Err(problem(
                location,
                format!("{} bytes is not a header and whole entries", bytes.len()),
            ));
        }
        let version = le32(bytes, 0);
        if version != XATTR_VERSION {
            return Err(problem(
                location,
                format!("version {version} (expected {XATTR_VERSION})"),
            ));
        }
        let entries: Vec<AclEntry> = bytes[HEADER_BYTES..]
            .chunks(XATTR_ENTRY_BYTES)
            .map(|e| {
                let tag = le16(e, 0);
                let named = tag == TAG_USER || tag == TAG_GROUP;
                AclEntry {
                    tag,
                    perm: le16(e, 2),
                    id: if named { le32(e, 4) } else { 0 },
                }
            })
            .collect();
        Acl::checked(entries, location)
    }

    /// Encodes the xattr form.
    pub fn to_xattr(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + XATTR_ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&XATTR_VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            let id = if e.is_named() { e.id } else { UNDEFINED_ID };
            out.extend_from_slice(&id.to_le_bytes());
        }
        out
    }

    /// Decodes the ext4 form; `Ok(None)` for a header with no entries.
    pub fn from_disk(bytes: &[u8], location: Location) -> Result<Option<Acl>, FormatError> {
        if bytes.len() < HEADER_BYTES {
            return Err(problem(
                location,
                format!("{} bytes, no header", bytes.len()),
            ));
        }
        let version = le32(bytes, 0);
        if version != EXT4_VERSION {
            return Err(problem(
                location,
                format!("on-disk version {version} (expected {EXT4_VERSION})"),
            ));
        }
        let mut entries = Vec::new();
        let mut at = HEADER_BYTES;
        while at < bytes.len() {
            if at + EXT4_SHORT_ENTRY_BYTES > bytes.len() {
                return Err(problem(location, format!("entry cut short at byte {at}")));
            }
            let (tag, perm) = (le16(bytes, at), le16(bytes, at + 2));
            let named = tag == TAG_USER || tag == TAG_GROUP;
            let id = if named {
                if at + XATTR_ENTRY_BYTES > bytes.len() {
                    return Err(problem(location, format!("entry cut short at byte {at}")));
                }
                le32(bytes, at + 4)
            } else {
                0
            };
            entries.push(AclEntry { tag, perm, id });
            at += if named {
                XATTR_ENTRY_BYTES
            } else {
                EXT4_SHORT_ENTRY_BYTES
            };
        }
        Acl::checked(entries, location)
    }

    /// Encodes the ext4 form.
    pub fn to_disk(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_BYTES + XATTR_ENTRY_BYTES * self.entries.len());
        out.extend_from_slice(&EXT4_VERSION.to_le_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            if e.is_named() {
                out.extend_from_slice(&e.id.to_le_bytes());
            }
        }
        out
    }

    /// `None` for no entries; the entries if they make a valid ACL; else what is wrong.
    fn checked(entries: Vec<AclEntry>, location: Location) -> Result<Option<Acl>, FormatError> {
        if entries.is_empty() {
            return Ok(None);
        }
        let acl = Acl { entries };
        acl.validate().map_err(|why| problem(location, why))?;
        Ok(Some(acl))
    }

    /// The kernel's `posix_acl_valid`.
    pub fn validate(&self) -> Result<(), String> {
        let mut previous: Option<(u16, u32)> = None;
        let (mut has_named, mut mask) = (false, 0);
        for e in &self.entries {
            if e.perm & !7 != 0 {
                return Err(format!("permission bits {:#o} beyond rwx", e.perm));
            }
            if ![
                TAG_USER_OBJ,
                TAG_USER,
                TAG_GROUP_OBJ,
                TAG_GROUP,
                TAG_MASK,
                TAG_OTHER,
            ]
            .contains(&e.tag)
            {
                return Err(format!("unknown tag {:#x}", e.tag));
            }
            let key = (e.tag, e.id);
            if previous.is_some_and(|p| p >= key) {
                return Err(format!(
                    "entries out of order or repeated at tag {:#x} id {}",
                    e.tag, e.id
                ));
            }
            previous = Some(key);
            has_named |= e.is_named();
            mask += usize::from(e.tag == TAG_MASK);
        }
        for (tag, name) in [
            (TAG_USER_OBJ, "owner"),
            (TAG_GROUP_OBJ, "owning group"),
            (TAG_OTHER, "other"),
        ] {
            if !self.entries.iter().any(|e| e.tag == tag) {
                return Err(format!("no {name} entry"));
            }
        }
        if has_named && mask == 0 {
            return Err("named entries without a mask entry".into());
        }
        Ok(())
    }

    /// The entry with `tag` (for the single-instance tags).
    pub fn entry_mut(&mut self, tag: u16) -> Option<&mut AclEntry> {
        self.entries.iter_mut().find(|e| e.tag == tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HERE: Location = Location::Inode { ino: 12 };

    fn entry(tag: u16, perm: u16, id: u32) -> AclEntry {
        AclEntry { tag, perm, id }
    }

    fn sample() -> Acl {
        Acl {
            entries: vec![
                entry(TAG_USER_OBJ, 6, 0),
                entry(TAG_USER, 4, 1000),
                entry(TAG_GROUP_OBJ, 4, 0),
                entry(TAG_GROUP, 5, 100),
                entry(TAG_MASK, 5, 0),
                entry(TAG_OTHER, 0, 0),
            ],
        }
    }

    #[test]
    fn both_encodings_round_trip_with_the_kernels_layout() {
        let acl = sample();
        let xattr = acl.to_xattr();
        assert_eq!(xattr.len(), 4 + 6 * 8);
        assert_eq!(&xattr[..4], &2u32.to_le_bytes());
        assert_eq!(&xattr[4..12], &[1, 0, 6, 0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(&xattr[12..20], &[2, 0, 4, 0, 0xe8, 0x03, 0, 0]);
        let disk = acl.to_disk();
        // Four short entries and two long ones.
        assert_eq!(disk.len(), 4 + 4 * 4 + 2 * 8);
        assert_eq!(&disk[..4], &1u32.to_le_bytes());
        assert_eq!(&disk[4..8], &[1, 0, 6, 0]);
        assert_eq!(&disk[8..16], &[2, 0, 4, 0, 0xe8, 0x03, 0, 0]);
        assert_eq!(Acl::from_xattr(&xattr, HERE).unwrap(), Some(acl.clone()));
        assert_eq!(Acl::from_disk(&disk, HERE).unwrap(), Some(acl));
        assert_eq!(Acl::from_disk(&1u32.to_le_bytes(), HERE).unwrap(), None);
        assert_eq!(Acl::from_xattr(&2u32.to_le_bytes(), HERE).unwrap(), None);
    }

    #[test]
    fn invalid_lists_are_refused_with_the_reason() {
        let mut unsorted = sample();
        unsorted.entries.swap(0, 1);
        let mut no_mask = sample();
        no_mask.entries.retain(|e| e.tag != TAG_MASK);
        let mut no_other = sample();
        no_other.entries.retain(|e| e.tag != TAG_OTHER);
        let mut big_perm = sample();
        big_perm.entries[0].perm = 8;
        for (acl, why) in [
            (unsorted, "out of order"),
            (no_mask, "without a mask"),
            (no_other, "no other entry"),
            (big_perm, "beyond rwx"),
        ] {
            let err = Acl::from_xattr(&acl.to_xattr(), HERE).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        let mut wrong_version = sample().to_xattr();
        wrong_version[0] = 1;
        assert!(Acl::from_xattr(&wrong_version, HERE)
            .unwrap_err()
            .to_string()
            .contains("version 1"));
        let torn = &sample().to_disk()[..9];
        assert!(Acl::from_disk(torn, HERE)
            .unwrap_err()
            .to_string()
            .contains("cut short"));
    }
}
