//! The directories the kernel holds: FUSE's lookup count of each directory node, so that a
//! removed directory lives while the kernel still has it, as an unlinked inode lives under
//! ext4 until its last reference goes. A shell standing in a directory another process
//! removed can then `stat .` (nlink 0) and `cd ..` out of it, as on ext4; before, the
//! daemon had freed the inode and answered the kernel's permission check with ENOENT.
//!
//! Every reply that hands the kernel a node (an entry: lookup, mkdir, mknod, symlink, link,
//! a readdirplus entry other than `.` and `..`) gives it one reference; FORGET takes away
//! as many as it names. When a directory's count rises from 0, the library holds the
//! directory open (`Fs::open_inode`); when it falls back to 0, it lets go (`Fs::release`).
//! A directory removed meanwhile stays on the orphan list, answers for its attributes, and
//! is deleted at that release, or at unmount if the kernel never said (FUSE ends with
//! DESTROY before the kernel drops its inodes), or by the next mount's orphan pass after a
//! crash.
//!
//! Directories, and files made without a name (`O_TMPFILE`, which come with no links):
//! such a file closed while an `O_PATH` descriptor still has it can be named by `linkat`
//! as on ext4, and its number cannot go to another file meanwhile (the kernel would link
//! that one). A removed regular file that had a name, held by the kernel without being
//! open (an `O_PATH` descriptor, an inotify watch), is still deleted at once: `rm` must
//! free a file's blocks before it returns, not at the FORGET that follows on another
//! request thread, which a `df` or a write sent right after could overtake.
//!
//! Promises: the library holds a directory exactly while its count is above 0, and each
//! hold is let go once; a count never goes below 0 (a FORGET for a node this table never
//! counted, such as a file, is ignored). Must never: delete under its lock (`Fs::release`
//! may free a directory's blocks); holding a directory, which only raises a count, is done
//! under it, so a forget and a lookup of the same directory cannot cross.

use jext_fs::{FileKind, Ino, Stat, ROOT_INO};
use std::collections::HashMap;
use std::sync::Mutex;

/// Lookup counts of the directories the kernel holds, by inode number.
#[derive(Default)]
pub(crate) struct KernelHolds {
    counts: Mutex<HashMap<Ino, u64>>,
}

impl KernelHolds {
    /// The kernel got `node` in a reply: one more reference if it is a directory (the
    /// root is held by the mount itself) or a file without links (made by `O_TMPFILE`).
    /// `hold` runs, under the table's lock, when this is the kernel's first reference; if
    /// it fails, the reference is not counted.
    pub(crate) fn referenced<E>(
        &self,
        node: &Stat,
        hold: impl FnOnce(Ino) -> Result<(), E>,
    ) -> Result<(), E> {
        let held = match node.kind {
            FileKind::Directory => node.ino != ROOT_INO,
            FileKind::Regular => node.nlink == 0,
            _ => false,
        };
        if !held {
            return Ok(());
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(node.ino).or_insert(0);
        if *count == 0 {
            if let Err(e) = hold(node.ino) {
                counts.remove(&node.ino);
                return Err(e);
            }
        }
        *counts.get_mut(&node.ino).expect("counted above") += 1;
        Ok(())
    }

    /// The kernel forgot `references` of node `ino`: whether that was the last of a
    /// directory's, so the caller lets it go.
    pub(crate) fn forgotten(&self, ino: Ino, references: u64) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let Some(count) = counts.get_mut(&ino) else {
            return false;
        };
        *count = count.saturating_sub(references);
        if *count > 0 {
            return false;
        }
        counts.remove(&ino);
        true
    }

    #[cfg(test)]
    fn count(&self, ino: Ino) -> u64 {
        let counts = self.counts.lock().unwrap();
        counts.get(&ino).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_fs::Timestamp;

    fn node(ino: Ino, kind: FileKind) -> Stat {
        Stat {
            ino,
            kind,
            perm: 0o755,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 4096,
            blocks_512: 8,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            crtime: Timestamp::default(),
            rdev: 0,
            flags: 0,
            generation: 0,
            block_size: 4096,
        }
    }

    #[test]
    fn a_directory_is_held_from_its_first_reference_to_its_last_forget() {
        let holds = KernelHolds::default();
        let dir = node(12, FileKind::Directory);
        let mut held = 0;
        for _ in 0..3 {
            holds
                .referenced(&dir, |_| {
                    held += 1;
                    Ok::<(), ()>(())
                })
                .unwrap();
        }
        assert_eq!(held, 1, "held once, at the first reference");
        assert_eq!(holds.count(12), 3);
        assert!(!holds.forgotten(12, 2));
        assert!(holds.forgotten(12, 1), "the last forget lets it go");
        assert!(!holds.forgotten(12, 1), "and only once");
    }

    #[test]
    fn files_and_the_root_are_not_counted() {
        let holds = KernelHolds::default();
        let never = |_| -> Result<(), ()> { panic!("held") };
        holds
            .referenced(&node(13, FileKind::Regular), never)
            .unwrap();
        holds
            .referenced(&node(ROOT_INO, FileKind::Directory), never)
            .unwrap();
        assert_eq!(holds.count(13), 0);
        assert!(!holds.forgotten(13, 1), "a file's forget is ignored");
    }

    #[test]
    fn a_file_without_links_is_counted() {
        let holds = KernelHolds::default();
        let unnamed = Stat {
            nlink: 0,
            ..node(16, FileKind::Regular)
        };
        holds.referenced(&unnamed, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(holds.count(16), 1);
        assert!(holds.forgotten(16, 1));
    }

    #[test]
    fn a_failed_hold_is_not_counted() {
        let holds = KernelHolds::default();
        let dir = node(14, FileKind::Directory);
        assert_eq!(holds.referenced(&dir, |_| Err("gone")), Err("gone"));
        assert_eq!(holds.count(14), 0);
        holds.referenced(&dir, |_| Ok::<(), ()>(())).unwrap();
        assert_eq!(holds.count(14), 1, "the next reference holds it");
    }

    #[test]
    fn a_forget_of_more_than_was_counted_lets_go_once() {
        let holds = KernelHolds::default();
        holds
            .referenced(&node(15, FileKind::Directory), |_| Ok::<(), ()>(()))
            .unwrap();
        assert!(holds.forgotten(15, 5));
        assert!(!holds.forgotten(15, 5));
    }
}
