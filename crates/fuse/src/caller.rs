//! Who made a FUSE request, for the permission checks the kernel leaves to the server: the
//! request carries the caller's uid and pid, and the caller's effective capabilities are
//! read from `/proc/PID/status` (the `CapEff` mask), as the kernel's `capable()` would
//! test them.
//!
//! Promises: a caller whose capabilities cannot be read (it exited, or `/proc` is not
//! there) has none: a check fails closed. Must never grant a change the kernel's ext4
//! would refuse to the same caller.

use fuser::{Errno, Request};
use jext_fs::format::inode::flags;

/// `CAP_FOWNER`: act as the owner of any file.
pub(crate) const CAP_FOWNER: u32 = 3;
/// `CAP_LINUX_IMMUTABLE`: set or clear the immutable and append-only flags.
pub(crate) const CAP_LINUX_IMMUTABLE: u32 = 9;
/// `CAP_SYS_RESOURCE`: ext4 asks for it to switch a file's data journaling.
pub(crate) const CAP_SYS_RESOURCE: u32 = 24;

/// The effective capability set of the process that sent `req` (none if unreadable).
fn capabilities(req: &Request) -> u64 {
    std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .ok()
        .and_then(|status| effective_capabilities(&status))
        .unwrap_or(0)
}

/// The `CapEff:` mask of a `/proc/PID/status` text.
fn effective_capabilities(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// What `FS_IOC_SETFLAGS` checks before a change from `old` to `new` flags of a file owned
/// by `owner` (ext4's `ext4_fileattr_set` with the VFS's `vfs_fileattr_set`): the owner
/// or CAP_FOWNER; CAP_LINUX_IMMUTABLE to change immutable or append-only; CAP_SYS_RESOURCE
/// to change data journaling (`j`). EPERM otherwise, as Linux answers.
pub(crate) fn check_flag_change(
    req: &Request,
    owner: u32,
    old: u32,
    new: u32,
) -> Result<(), Errno> {
    let needs = required_capabilities(req.uid() == owner, old, new);
    if needs.is_empty() {
        return Ok(());
    }
    let has = capabilities(req);
    match needs.iter().all(|&cap| has >> cap & 1 == 1) {
        true => Ok(()),
        false => Err(Errno::EPERM),
    }
}

/// The capabilities a change from `old` to `new` flags needs (`is_owner`: the caller owns
/// the file).
fn required_capabilities(is_owner: bool, old: u32, new: u32) -> Vec<u32> {
    let changed = old ^ new;
    let mut needs = Vec::new();
    if !is_owner {
        needs.push(CAP_FOWNER);
    }
    if changed & (flags::IMMUTABLE | flags::APPEND) != 0 {
        needs.push(CAP_LINUX_IMMUTABLE);
    }
    if changed & flags::JOURNAL_DATA != 0 {
        needs.push(CAP_SYS_RESOURCE);
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_mask() {
        let status = "Name:\tchattr\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                      CapEff:\t0000000001000000\nCapBnd:\t000001ffffffffff\n";
        let mask = effective_capabilities(status).unwrap();
        assert_eq!(mask >> CAP_SYS_RESOURCE & 1, 1);
        assert_eq!(mask >> CAP_FOWNER & 1, 0);
        assert_eq!(effective_capabilities("Name:\tx\n"), None);
    }

    #[test]
    fn each_flag_asks_for_its_capability() {
        let j = flags::JOURNAL_DATA;
        assert!(required_capabilities(true, 0, 0).is_empty());
        assert_eq!(required_capabilities(true, 0, j), vec![CAP_SYS_RESOURCE]);
        assert_eq!(required_capabilities(true, j, 0), vec![CAP_SYS_RESOURCE]);
        assert_eq!(
            required_capabilities(false, flags::APPEND, flags::IMMUTABLE),
            vec![CAP_FOWNER, CAP_LINUX_IMMUTABLE]
        );
        assert_eq!(required_capabilities(true, j, j), Vec::<u32>::new());
    }
}
