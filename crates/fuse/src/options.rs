//! Mount options for `jext mount -o …`: the ext4 ones (data=, commit=, ro, errors=,
//! cache_size=, barrier) go to the library; the FUSE ones (allow_other,
//! default_permissions, writeback_cache) configure the session; the generic VFS flags
//! mount(8) passes to helpers (rw, nosuid, nodev, noexec, noatime, …) become mount flags.
//!
//! Promises: an unknown or malformed option is refused with a message naming it; nothing
//! is silently ignored except the options mount(8) adds for its own bookkeeping (`_netdev`,
//! `defaults`, `auto`, `noauto`, `user`, `nofail`), which mean nothing to a file system.

use jext_fs::{FsError, FsResult, MountOptions};

/// Everything `-o` said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuseOptions {
    pub fs: MountOptions,
    /// Let other users (not just the one who mounted) use the mount.
    pub allow_other: bool,
    /// Let the kernel check permissions from the modes (on by default, as most users expect
    /// of a disk file system; `nodefault_permissions` turns it off).
    pub default_permissions: bool,
    /// FUSE's writeback cache: the kernel buffers writes and sends them in large pieces.
    pub writeback_cache: bool,
    /// VFS flags for the mount: nosuid, nodev, noexec, noatime, sync, dirsync.
    pub vfs_flags: Vec<&'static str>,
}

impl Default for FuseOptions {
    fn default() -> FuseOptions {
        FuseOptions {
            fs: MountOptions::default(),
            allow_other: false,
            default_permissions: true,
            writeback_cache: false,
            vfs_flags: Vec::new(),
        }
    }
}

const VFS_FLAGS: [&str; 12] = [
    "nosuid", "suid", "nodev", "dev", "noexec", "exec", "noatime", "atime", "sync", "async",
    "dirsync", "relatime",
];
const MOUNT8_BOOKKEEPING: [&str; 6] = ["_netdev", "defaults", "auto", "noauto", "user", "nofail"];

impl FuseOptions {
    pub fn parse(text: &str) -> FsResult<FuseOptions> {
        let mut parsed = FuseOptions::default();
        for option in text.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            parsed.apply(option)?;
        }
        Ok(parsed)
    }

    fn apply(&mut self, option: &str) -> FsResult<()> {
        match option {
            "allow_other" => self.allow_other = true,
            "default_permissions" => self.default_permissions = true,
            "nodefault_permissions" => self.default_permissions = false,
            "writeback_cache" => self.writeback_cache = true,
            "nowriteback_cache" => self.writeback_cache = false,
            o if MOUNT8_BOOKKEEPING.contains(&o) => {}
            o if VFS_FLAGS.contains(&o) => {
                let known = VFS_FLAGS.iter().find(|f| **f == o).expect("checked above");
                self.vfs_flags.push(known);
            }
            o if o.starts_with("allow_other=") || o.starts_with("writeback_cache=") => {
                return Err(FsError::Invalid(format!("option {o:?} takes no value")));
            }
            o => self.fs.apply(o)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_fs::DataMode;

    #[test]
    fn ext4_fuse_and_vfs_options_each_land_where_they_belong() {
        let o = FuseOptions::parse(
            "data=journal,commit=10,allow_other,writeback_cache,nosuid,defaults,cache_size=64M",
        )
        .unwrap();
        assert_eq!(o.fs.data_mode, DataMode::Journal);
        assert_eq!(o.fs.commit_interval_ms, 10_000);
        assert_eq!(o.fs.cache_size_bytes, 64 << 20);
        assert!(o.allow_other && o.writeback_cache && o.default_permissions);
        assert_eq!(o.vfs_flags, vec!["nosuid"]);
        assert!(
            !FuseOptions::parse("nodefault_permissions")
                .unwrap()
                .default_permissions
        );
    }

    #[test]
    fn unknown_and_malformed_options_are_named() {
        for (text, named) in [
            ("data=fast", "fast"),
            ("colour=red", "colour"),
            ("commit=soon", "soon"),
            ("allow_other=1", "allow_other"),
        ] {
            let err = FuseOptions::parse(text).unwrap_err().to_string();
            assert!(err.contains(named), "{text}: {err}");
        }
    }
}
