//! A loop device over an image file that detaches itself: the block device a `fuseblk`
//! mount of an image needs.
//!
//! The kernel treats a `fuseblk` connection like a disk file system's: `umount` sends
//! DESTROY and waits for the answer, and `syncfs` reaches the daemon. Such a mount needs a
//! block device as its source; for an image file this module attaches one with
//! `LOOP_CONFIGURE` and `LO_FLAGS_AUTOCLEAR`, so the kernel detaches it by itself once the
//! last user (the mount) lets go: a killed daemon leaves no loop device behind once its
//! mount is gone. jext itself never reads or writes through the loop device; it only names
//! the image to the kernel.
//!
//! Must never configure a device another process attached in the meantime: a device that
//! turns out busy is skipped and the next free one tried.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// `_IO(0x4C, ...)` requests of `<linux/loop.h>`.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// How many times a free device may be taken by someone else before giving up.
const ATTEMPTS: usize = 16;

/// `struct loop_info64` of `<linux/loop.h>` (232 bytes).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of `<linux/loop.h>` (304 bytes).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// An attached loop device. Holding it keeps the device attached; after the last holder
/// (this value, or a mount made on it) lets go, the kernel detaches it.
pub struct LoopDevice {
    path: PathBuf,
    _device: File,
}

impl LoopDevice {
    /// Attaches a free loop device to `image` (read-write), with 512-byte sectors as
    /// `losetup` gives by default.
    pub fn attach(image: &Path) -> io::Result<LoopDevice> {
        let backing = OpenOptions::new().read(true).write(true).open(image)?;
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")?;
        for _ in 0..ATTEMPTS {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
            let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if number < 0 {
                return Err(io::Error::last_os_error());
            }
            let path = PathBuf::from(format!("/dev/loop{number}"));
            let device = OpenOptions::new().read(true).write(true).open(&path)?;
            match configure(&device, &backing, image) {
                Ok(()) => {
                    return Ok(LoopDevice {
                        path,
                        _device: device,
                    })
                }
                // Another process took this device between our two calls.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other(format!(
            "no free loop device for {} after {ATTEMPTS} tries",
            image.display()
        )))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn configure(device: &File, backing: &File, image: &Path) -> io::Result<()> {
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    // What `losetup -l` shows as the backing file (truncated as the kernel does).
    let name = image.as_os_str().as_encoded_bytes();
    let n = name.len().min(info.lo_file_name.len() - 1);
    info.lo_file_name[..n].copy_from_slice(&name[..n]);
    let config = LoopConfig {
        fd: backing.as_raw_fd() as u32,
        block_size: 0,
        info,
        reserved: [0; 8],
    };
    // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `config` is (layout
    // checked by the size assertions above) and which outlives the call.
    let rc = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &config) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
