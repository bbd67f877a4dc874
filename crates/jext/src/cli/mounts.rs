//! The jext mounts the kernel shows (`/proc/self/mountinfo`), and which image each serves.
//!
//! A second `jext mount` of an image that is already mounted does what a second kernel
//! mount of one ext4 device does: the new mount point shows the same file system, served
//! by the one daemon that owns the image (a bind mount of the first), so a file made
//! through one mount point is there through the other, and nobody else writes the image.
//! The file system's own options stay those of its first mount; the VFS flags (`ro`,
//! `nosuid`, ...) are the new mount point's own.
//!
//! Must never take one image for another: images are matched by device and inode number,
//! never by the path a user typed.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// One jext mount point as the kernel lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JextMount {
    pub mountpoint: PathBuf,
    /// The block device (a `fuseblk` mount: the image's loop device, or the device
    /// itself), or the image file (a plain `fuse` mount).
    pub source: PathBuf,
}

/// Every jext mount of this mount namespace.
pub fn jext_mounts() -> Vec<JextMount> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines().filter_map(parse_mountinfo_line).collect()
}

/// A jext mount from a mountinfo line: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS ... - TYPE
/// SOURCE SUPER_OPTS`, with spaces and the like in paths written as octal escapes.
fn parse_mountinfo_line(line: &str) -> Option<JextMount> {
    let (before, after) = line.split_once(" - ")?;
    let mountpoint = before.split(' ').nth(4)?;
    let mut rest = after.split(' ');
    let fstype = rest.next()?;
    let source = rest.next()?;
    let mount = JextMount {
        mountpoint: PathBuf::from(unescape(mountpoint)),
        source: PathBuf::from(unescape(source)),
    };
    match fstype {
        "fuseblk.jext" | "fuse.jext" => Some(mount),
        // A `noblkdev` mount has no subtype: it is jext's if its image's owner runs this
        // very program (a jext daemon).
        "fuse" => jext::owner_of(&mount.source)
            .is_some_and(|holder| runs_this_program(holder.pid))
            .then_some(mount),
        _ => None,
    }
}

fn runs_this_program(pid: u32) -> bool {
    let theirs = std::fs::read_link(format!("/proc/{pid}/exe"));
    matches!((theirs, std::env::current_exe()), (Ok(a), Ok(b)) if a == b)
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a jext mount sits on `mountpoint`.
pub fn is_jext_mount(mountpoint: &Path) -> bool {
    jext_mounts().iter().any(|m| m.mountpoint == mountpoint)
}

/// What identifies an image: a block device by its device number, a file by its device
/// and inode numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Identity {
    Device(u64),
    File(u64, u64),
}

fn identity(path: &Path) -> Option<Identity> {
    let meta = std::fs::metadata(path).ok()?;
    Some(if meta.file_type().is_block_device() {
        Identity::Device(meta.rdev())
    } else {
        Identity::File(meta.dev(), meta.ino())
    })
}

/// The image a mount's source stands for: a loop device stands for its backing file.
fn source_identity(source: &Path) -> Option<Identity> {
    let id = identity(source)?;
    let Identity::Device(rdev) = id else {
        return Some(id);
    };
    let backing = format!(
        "/sys/dev/block/{}:{}/loop/backing_file",
        libc::major(rdev),
        libc::minor(rdev)
    );
    match std::fs::read_to_string(backing) {
        Ok(file) => identity(Path::new(file.trim_end())),
        Err(_) => Some(id),
    }
}

/// The jext mount serving `image`, if it is mounted.
pub fn mount_of(image: &Path) -> Option<JextMount> {
    let want = identity(image)?;
    jext_mounts()
        .into_iter()
        .find(|m| source_identity(&m.source) == Some(want))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_jext_mounts_only() {
        let jext = "36 25 0:45 / /mnt/my\\040disk rw,relatime shared:1 - fuseblk.jext /dev/loop3 \
                    rw,user_id=0,group_id=0,default_permissions,blksize=4096";
        assert_eq!(
            parse_mountinfo_line(jext),
            Some(JextMount {
                mountpoint: PathBuf::from("/mnt/my disk"),
                source: PathBuf::from("/dev/loop3"),
            })
        );
        let ext4 = "37 25 7:3 / /mnt/b rw - ext4 /dev/loop4 rw";
        assert_eq!(parse_mountinfo_line(ext4), None);
        assert_eq!(unescape("a\\134b\\011c"), "a\\b\tc");
    }
}
