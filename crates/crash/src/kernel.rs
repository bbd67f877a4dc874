//! `--kernel-check`: Linux as a second opinion. A sample of crash images is loop-mounted
//! by the kernel (whose ext4 replays the journal itself), and every path of the workload
//! must read the same through Linux as through jext's recovery: kind, inode, bytes,
//! attributes, xattrs, symlink target; and `e2fsck -fn` must find the image Linux
//! replayed clean. Needs root and loop devices.

use crate::record::Recording;
use crate::snapshot::{Meta, Node};
use jext_device::SimDevice;
use jext_fs::Timestamp;
use jext_journal::format::superblock::{
    INCOMPAT_JEXT_PERCORE, INCOMPAT_JEXT_RECORDS, INCOMPAT_JEXT_SINGLE_IO,
};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Loop-mounts crash images and compares.
pub struct KernelCheck {
    image: PathBuf,
    mountpoint: PathBuf,
}

impl KernelCheck {
    /// A checker with its own image file and mount point; refuses without root.
    pub fn new() -> Result<KernelCheck, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("--kernel-check loop-mounts images and needs root".into());
        }
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let base = std::env::temp_dir().join(format!("jext-kcheck-{}-{n}", std::process::id()));
        let mountpoint = base.join("mnt");
        std::fs::create_dir_all(&mountpoint)
            .map_err(|e| format!("cannot create {}: {e}", mountpoint.display()))?;
        Ok(KernelCheck {
            image: base.join("crash.img"),
            mountpoint,
        })
    }

    /// Mounts `crash` (the image before any recovery) with Linux and compares each path
    /// with `jext_view` (what jext's recovery shows, in the recording's path order). A
    /// log holding single-I/O commits (the journal's private JEXT_SINGLE_IO bit), byte
    /// records (JEXT_RECORDS) or per-core i-transactions (JEXT_PERCORE) must be refused
    /// by Linux instead: it cannot tell a torn transaction from a whole one, patch a
    /// block from its changed bytes, nor read the rings.
    pub fn compare(&self, crash: &SimDevice, rec: &Recording, jext_view: &[Node]) -> Vec<String> {
        if let Err(e) = crash.write_current_image(&self.image) {
            return vec![format!(
                "kernel check: cannot write {}: {e}",
                self.image.display()
            )];
        }
        let image = jext_device::open_path(&self.image, true).map_err(|e| e.to_string());
        let journal =
            image.and_then(|d| jext_fs::debug::journal_superblock(d).map_err(|e| e.to_string()));
        let private = match journal {
            Ok(jsb) => {
                !jsb.is_clean()
                    && jsb.has_incompat(
                        INCOMPAT_JEXT_SINGLE_IO | INCOMPAT_JEXT_RECORDS | INCOMPAT_JEXT_PERCORE,
                    )
            }
            Err(e) => return vec![format!("kernel check: cannot read the journal: {e}")],
        };
        let problems = match (private, self.mount_image()) {
            (_, Err(e)) => vec![format!("kernel check: cannot run mount: {e}")],
            // Refused, as it must be: Linux cannot tell a torn transaction from a whole one.
            (true, Ok(Err(_))) => Vec::new(),
            (true, Ok(Ok(()))) => {
                let mut problems = vec![
                    "kernel check: Linux mounted a journal that carries one of jext's \
                     private incompat bits"
                        .to_string(),
                ];
                problems.extend(self.unmount());
                problems
            }
            (false, Ok(Err(refusal))) => vec![format!(
                "kernel check: Linux refuses to mount the crash image: {refusal}"
            )],
            (false, Ok(Ok(()))) => {
                let mut problems = self.differences(rec, jext_view);
                match self.unmount() {
                    Some(busy) => problems.push(busy),
                    // What Linux's replay left must be consistent too: a replay can put
                    // every name and byte right and still miscount (a directory's blocks
                    // after a fast commit grew it, for one).
                    None => problems.extend(
                        crate::explore::e2fsck_image(&self.image)
                            .into_iter()
                            .map(|p| format!("kernel check: after Linux's replay, {p}")),
                    ),
                }
                problems
            }
        };
        let _ = std::fs::remove_file(&self.image);
        problems
    }

    /// Loop-mounts the image: `Ok(Err(what Linux said))` when it refuses.
    fn mount_image(&self) -> std::io::Result<Result<(), String>> {
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&self.image)
            .arg(&self.mountpoint)
            .output()?;
        if out.status.success() {
            return Ok(Ok(()));
        }
        Ok(Err(String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }

    /// Unmounts (the loop device goes with it), retrying while something briefly holds
    /// the mount; as a last resort detaches it lazily, so no mount outlives the check.
    fn unmount(&self) -> Option<String> {
        for _ in 0..20 {
            let status = Command::new("umount").arg(&self.mountpoint).status();
            if status.is_ok_and(|s| s.success()) {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .status();
        Some(format!(
            "kernel check: {} stayed busy; detached lazily",
            self.mountpoint.display()
        ))
    }

    fn differences(&self, rec: &Recording, jext_view: &[Node]) -> Vec<String> {
        let mut problems = Vec::new();
        for (path, ours) in rec.timeline.paths.iter().zip(jext_view) {
            let theirs = match kernel_node(&self.mountpoint, path) {
                Ok(node) => node,
                Err(e) => {
                    problems.push(format!("kernel check: Linux cannot read {path}: {e}"));
                    continue;
                }
            };
            if theirs != *ours {
                problems.push(format!(
                    "kernel check: {path} is {} ({:?}) through Linux but {} ({:?}) through jext",
                    theirs.describe(),
                    theirs.meta(),
                    ours.describe(),
                    ours.meta()
                ));
            }
        }
        problems
    }
}

impl Drop for KernelCheck {
    fn drop(&mut self) {
        if let Some(base) = self.mountpoint.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// What `path` names under the kernel's mount, in the terms of [`Node`].
fn kernel_node(root: &Path, path: &str) -> std::io::Result<Node> {
    let full = root.join(path.trim_start_matches('/'));
    let meta = match std::fs::symlink_metadata(&full) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Node::Absent),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(Node::Absent),
        Err(e) => return Err(e),
    };
    let ino = meta.ino() as u32;
    let is_dir = meta.is_dir();
    let attrs = Meta {
        perm: (meta.mode() & 0o7777) as u16,
        uid: meta.uid(),
        gid: meta.gid(),
        nlink: if is_dir { 0 } else { meta.nlink() as u32 },
        mtime: if is_dir {
            Timestamp::default()
        } else {
            Timestamp {
                seconds: meta.mtime(),
                nanoseconds: meta.mtime_nsec() as u32,
            }
        },
        xattrs: xattrs(&full)?,
    };
    Ok(if is_dir {
        Node::Dir { ino, meta: attrs }
    } else if meta.file_type().is_symlink() {
        Node::Symlink {
            ino,
            target: std::fs::read_link(&full)?.as_os_str().as_bytes().to_vec(),
            meta: attrs,
        }
    } else {
        Node::File {
            ino,
            data: std::fs::read(&full)?.into(),
            meta: attrs,
        }
    })
}

/// Every extended attribute of `path` (not following a symlink), sorted by name.
fn xattrs(path: &Path) -> std::io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut names = vec![0u8; 4096];
    // SAFETY: c_path is a valid C string; names is a writable buffer of the given length.
    let len = unsafe { libc::llistxattr(c_path.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    for name in names[..len as usize]
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
    {
        let c_name = CString::new(name)?;
        let mut value = vec![0u8; 65536];
        // SAFETY: both strings are valid C strings; value is writable for its length.
        let n = unsafe {
            libc::lgetxattr(
                c_path.as_ptr(),
                c_name.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        value.truncate(n as usize);
        out.push((name.to_vec(), value));
    }
    out.sort();
    Ok(out)
}
