//! The kernel side of a jext mount: `mount(2)` of a FUSE connection, as `fuseblk` when it
//! can be, and its unmount and remount.
//!
//! A `fuseblk` mount makes the kernel treat jext as a disk file system: `umount` sends
//! DESTROY and waits for the answer (which jext gives only after its checkpoint, so the
//! image is clean when `umount` returns), `sync`/`syncfs` reach the daemon (Linux 6.18+),
//! and the kernel holds the block device exclusively, so nobody mounts it twice. An image
//! file gets a loop device that detaches itself ([`LoopDevice`]); a block device is used
//! as it is. Where no loop device can be had, the mount falls back to a plain `fuse`
//! connection, whose `umount` does not wait: [`KernelMount::waits_for_daemon`] says so,
//! and the `umount.fuse.jext` helper makes `umount` wait instead.
//!
//! Promises: the mount made is exactly the one asked for (flags, options), or an error that
//! says what the kernel refused; never a mount left behind by a failed call. Never mounts
//! with AutoUnmount.

use crate::loop_device::LoopDevice;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The flags and options of one mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountRequest {
    pub read_only: bool,
    pub allow_other: bool,
    pub default_permissions: bool,
    /// VFS flags by name, as `-o` gave them (`nosuid`, `dev`, `noexec`, `sync`, ...).
    pub vfs_flags: Vec<&'static str>,
    /// The file system's block size (a `fuseblk` mount reports it as the device's).
    pub block_size: u32,
    /// Mount as `fuseblk` when a block device can be had (else plain `fuse`).
    pub blkdev: bool,
}

impl MountRequest {
    /// `mount(2)` flags: a disk file system's defaults (`suid`, `dev`, `exec`), which is
    /// what mount(8) assumes when it hands a helper only the flags that differ from them
    /// (`mount -t fuse.jext -o dev,suid` reaches the helper as `-o rw`). Only root mounts
    /// jext, as only root mounts ext4.
    pub fn flags(&self) -> libc::c_ulong {
        let mut flags = 0;
        if self.read_only {
            flags |= libc::MS_RDONLY;
        }
        for flag in &self.vfs_flags {
            match *flag {
                "suid" => flags &= !libc::MS_NOSUID,
                "dev" => flags &= !libc::MS_NODEV,
                "defaults" => flags &= !(libc::MS_NOSUID | libc::MS_NODEV),
                "nosuid" => flags |= libc::MS_NOSUID,
                "nodev" => flags |= libc::MS_NODEV,
                "noexec" => flags |= libc::MS_NOEXEC,
                "exec" => flags &= !libc::MS_NOEXEC,
                "noatime" => flags |= libc::MS_NOATIME,
                "atime" => flags &= !(libc::MS_NOATIME | libc::MS_RELATIME),
                "relatime" => flags |= libc::MS_RELATIME,
                "norelatime" => flags &= !libc::MS_RELATIME,
                "strictatime" => {
                    flags = (flags | libc::MS_STRICTATIME) & !(libc::MS_RELATIME | libc::MS_NOATIME)
                }
                "nodiratime" => flags |= libc::MS_NODIRATIME,
                "diratime" => flags &= !libc::MS_NODIRATIME,
                "lazytime" => flags |= libc::MS_LAZYTIME,
                "sync" => flags |= libc::MS_SYNCHRONOUS,
                "async" => flags &= !libc::MS_SYNCHRONOUS,
                "dirsync" => flags |= libc::MS_DIRSYNC,
                _ => {}
            }
        }
        flags
    }
}

/// How the connection was mounted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountKind {
    /// `fuseblk.jext`: unmount waits for the daemon, syncfs reaches it.
    Fuseblk,
    /// `fuse.jext`: the fallback without a block device.
    Fuse,
}

/// A live kernel mount.
#[derive(Debug)]
pub struct KernelMount {
    mountpoint: PathBuf,
    kind: MountKind,
    /// The block device the kernel mounted (the image's loop device, or the device itself).
    source: PathBuf,
}

impl KernelMount {
    /// Mounts a new FUSE connection for `image` on `mountpoint`; returns the connection's
    /// `/dev/fuse` descriptor, on which the kernel is about to send INIT.
    pub fn mount(
        image: &Path,
        mountpoint: &Path,
        request: &MountRequest,
    ) -> io::Result<(OwnedFd, KernelMount)> {
        let fuse = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/fuse")
            .map_err(|e| io::Error::new(e.kind(), format!("/dev/fuse: {e}")))?;
        let is_block_device = std::fs::metadata(image)?.file_type().is_block_device();
        // Held until the kernel has the device; dropping it then leaves the mount as its
        // only user, so the device detaches when the mount goes.
        let attached = if is_block_device || !request.blkdev {
            None
        } else {
            LoopDevice::attach(image).ok()
        };
        let (kind, source) = match (&attached, is_block_device && request.blkdev) {
            (_, true) => (MountKind::Fuseblk, image.to_path_buf()),
            (Some(device), false) => (MountKind::Fuseblk, device.path().to_path_buf()),
            (None, false) => (MountKind::Fuse, image.to_path_buf()),
        };
        let data = connection_options(&fuse, mountpoint, request, kind)?;
        let fstype = match (kind, request.blkdev) {
            (MountKind::Fuseblk, _) => "fuseblk.jext",
            (MountKind::Fuse, true) => "fuse.jext",
            // `noblkdev`: the form a libfuse program mounts without a subtype, which is
            // what fstests' FSTYP=fuse recognizes (its source is the image file itself).
            (MountKind::Fuse, false) => "fuse",
        };
        sys_mount(&source, mountpoint, fstype, request.flags(), &data).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "mount -t {fstype} {} {}: {e}",
                    source.display(),
                    mountpoint.display()
                ),
            )
        })?;
        drop(attached);
        let mount = KernelMount {
            mountpoint: mountpoint.to_path_buf(),
            kind,
            source,
        };
        Ok((OwnedFd::from(fuse), mount))
    }

    pub fn kind(&self) -> MountKind {
        self.kind
    }

    /// Whether a plain `umount` waits until jext has checkpointed.
    pub fn waits_for_daemon(&self) -> bool {
        self.kind == MountKind::Fuseblk
    }

    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }
}

/// The options a FUSE connection is mounted with: its descriptor, the root's mode, who
/// mounted it, and the access options.
fn connection_options(
    fuse: &File,
    mountpoint: &Path,
    request: &MountRequest,
    kind: MountKind,
) -> io::Result<String> {
    let root_mode = std::fs::metadata(mountpoint)
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("mount point {}: {e}", mountpoint.display()),
            )
        })?
        .permissions()
        .mode();
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={uid},group_id={gid}",
        fuse.as_raw_fd()
    );
    if request.allow_other {
        data.push_str(",allow_other");
    }
    if request.default_permissions {
        data.push_str(",default_permissions");
    }
    if kind == MountKind::Fuseblk {
        data.push_str(&format!(",blksize={}", request.block_size.max(512)));
    }
    Ok(data)
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))
}

fn sys_mount(
    source: &Path,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (source, target) = (c_path(source)?, c_path(target)?);
    let fstype = CString::new(fstype).expect("a literal");
    let data = CString::new(data)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an option with a NUL byte"))?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `mountpoint` (on a `fuseblk` mount this returns once jext answered DESTROY).
pub fn unmount(mountpoint: &Path) -> io::Result<()> {
    let target = c_path(mountpoint)?;
    // SAFETY: `target` is a NUL-terminated string that outlives the call.
    let rc = unsafe { libc::umount2(target.as_ptr(), 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("umount {}: {e}", mountpoint.display()),
        ));
    }
    Ok(())
}

/// Makes `mountpoint` show the file system mounted at `existing` (a bind mount), with the
/// VFS flags of `request` as its own: a second mount of an image its daemon already serves.
pub fn bind(existing: &Path, mountpoint: &Path, request: &MountRequest) -> io::Result<()> {
    let (source, target) = (c_path(existing)?, c_path(mountpoint)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call; a bind mount
    // needs no type or data.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "bind mount of {} on {}: {e}",
                existing.display(),
                mountpoint.display()
            ),
        ));
    }
    if request.flags() != 0 {
        // A bind mount takes its own flags only from a remount of the bind.
        let flags = request.flags() | libc::MS_REMOUNT | libc::MS_BIND;
        // SAFETY: as above.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            let _ = unmount(mountpoint);
            return Err(io::Error::new(
                e.kind(),
                format!("flags of the bind mount {}: {e}", mountpoint.display()),
            ));
        }
    }
    Ok(())
}

/// Changes a live mount's flags (`mount -o remount,...`): read-only or not, and the VFS
/// flags of `request`.
pub fn remount(mountpoint: &Path, request: &MountRequest) -> io::Result<()> {
    let target = c_path(mountpoint)?;
    let flags = request.flags() | libc::MS_REMOUNT;
    // SAFETY: `target` is a NUL-terminated string that outlives the call; a remount needs
    // no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("remount {}: {e}", mountpoint.display()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_defaults_and_named_flags_change_them() {
        let flags = |names: &[&'static str], ro| {
            MountRequest {
                read_only: ro,
                vfs_flags: names.to_vec(),
                ..MountRequest::default()
            }
            .flags()
        };
        assert_eq!(flags(&[], false), 0);
        assert_eq!(
            flags(&["nosuid", "nodev"], false),
            libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_eq!(flags(&["nosuid", "defaults"], true), libc::MS_RDONLY);
        assert_eq!(
            flags(&["noexec", "noatime"], false),
            libc::MS_NOEXEC | libc::MS_NOATIME
        );
    }
}
