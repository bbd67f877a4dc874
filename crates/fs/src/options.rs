//! Mount options, named and parsed as ext4 users know them (`data=ordered,commit=5`).
//!
//! Parsing refuses an unknown or malformed option with a message naming it; it never
//! ignores one, because a silently ignored `data=journal` is a durability bug.

use crate::error::{FsError, FsResult};
use std::fmt;
use std::str::FromStr;

/// What the journal carries besides metadata (ext4 `data=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataMode {
    /// New data blocks reach the disk before the commit that makes them reachable.
    #[default]
    Ordered,
    /// Data is written whenever; after a crash a file may show old data in new blocks.
    Writeback,
    /// Data goes through the journal like metadata.
    Journal,
}

impl FromStr for DataMode {
    type Err = FsError;
    fn from_str(s: &str) -> FsResult<DataMode> {
        match s {
            "ordered" => Ok(DataMode::Ordered),
            "writeback" => Ok(DataMode::Writeback),
            "journal" => Ok(DataMode::Journal),
            other => Err(FsError::Invalid(format!(
                "data={other}: expected data=ordered, data=writeback or data=journal"
            ))),
        }
    }
}

impl fmt::Display for DataMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataMode::Ordered => "ordered",
            DataMode::Writeback => "writeback",
            DataMode::Journal => "journal",
        })
    }
}

/// When a read moves a file's access time (the mount's `noatime`, `relatime`, `strictatime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeUpdates {
    /// `noatime`: never.
    Never,
    /// `relatime` (Linux's default): when the access time is not newer than the modify or
    /// change time, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: at every read.
    Always,
}

/// What to do when the file system meets an error on disk (ext4 `errors=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorBehavior {
    /// Stop writing: later changes fail with EROFS.
    #[default]
    RemountReadOnly,
    /// Report the error and go on.
    Continue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountOptions {
    pub data_mode: DataMode,
    /// ext4 `commit=`: the running transaction commits once it is this old.
    pub commit_interval_ms: u64,
    pub read_only: bool,
    pub errors: ErrorBehavior,
    /// Memory for cached blocks and pages together.
    pub cache_size_bytes: usize,
    /// ext4 `barrier` / `nobarrier`.
    pub barrier: bool,
    /// ext4 `acl` (the default) / `noacl`: POSIX ACLs are kept, inherited and in step with
    /// the mode; with `noacl` their xattr names are refused (EOPNOTSUPP).
    pub acl: bool,
    /// `noatime` / `relatime` (default) / `strictatime`.
    pub atime: AtimeUpdates,
    /// `nodiratime`: reading a directory never moves its access time.
    pub no_dir_atime: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            data_mode: DataMode::Ordered,
            commit_interval_ms: 5000,
            read_only: false,
            errors: ErrorBehavior::RemountReadOnly,
            cache_size_bytes: 256 << 20,
            barrier: true,
            acl: true,
            atime: AtimeUpdates::Relative,
            no_dir_atime: false,
        }
    }
}

impl MountOptions {
    /// Parses a comma-separated option string on top of the defaults.
    pub fn parse(options: &str) -> FsResult<MountOptions> {
        let mut parsed = MountOptions::default();
        for option in options.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            parsed.apply(option)?;
        }
        Ok(parsed)
    }

    /// Applies one `name` or `name=value` option.
    pub fn apply(&mut self, option: &str) -> FsResult<()> {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option, None),
        };
        let need_value = || {
            value.ok_or_else(|| {
                FsError::Invalid(format!("option {name} needs a value ({name}=...)"))
            })
        };
        let no_value = || match value {
            Some(v) => Err(FsError::Invalid(format!(
                "option {name} takes no value (got {name}={v})"
            ))),
            None => Ok(()),
        };
        match name {
            "data" => self.data_mode = need_value()?.parse()?,
            "commit" => {
                let secs: u64 = need_value()?.parse().map_err(|_| {
                    FsError::Invalid(format!(
                        "commit={}: expected whole seconds",
                        value.unwrap_or("")
                    ))
                })?;
                // ext4 treats commit=0 as the default.
                self.commit_interval_ms = if secs == 0 { 5000 } else { secs * 1000 };
            }
            "ro" => {
                no_value()?;
                self.read_only = true;
            }
            "rw" => {
                no_value()?;
                self.read_only = false;
            }
            "errors" => {
                self.errors = match need_value()? {
                    "remount-ro" => ErrorBehavior::RemountReadOnly,
                    "continue" => ErrorBehavior::Continue,
                    other => {
                        return Err(FsError::Invalid(format!(
                            "errors={other}: expected errors=remount-ro or errors=continue"
                        )))
                    }
                }
            }
            "barrier" => {
                self.barrier = match value {
                    None | Some("1") => true,
                    Some("0") => false,
                    Some(other) => {
                        return Err(FsError::Invalid(format!(
                            "barrier={other}: expected 0 or 1"
                        )))
                    }
                }
            }
            "nobarrier" => {
                no_value()?;
                self.barrier = false;
            }
            "acl" | "noacl" => {
                no_value()?;
                self.acl = name == "acl";
            }
            "noatime" => {
                no_value()?;
                self.atime = AtimeUpdates::Never;
            }
            "relatime" | "atime" | "norelatime" => {
                // Linux makes plain `atime` relative unless `strictatime` is given.
                no_value()?;
                self.atime = AtimeUpdates::Relative;
            }
            "strictatime" => {
                no_value()?;
                self.atime = AtimeUpdates::Always;
            }
            "nodiratime" | "diratime" => {
                no_value()?;
                self.no_dir_atime = name == "nodiratime";
            }
            "cache_size" => self.cache_size_bytes = parse_size(name, need_value()?)?,
            other => return Err(FsError::Invalid(format!("unknown mount option {other:?}"))),
        }
        Ok(())
    }
}

/// Parses `512M`, `1G`, `65536` (bytes) into bytes.
pub fn parse_size(name: &str, text: &str) -> FsResult<usize> {
    let bad = || FsError::Invalid(format!("{name}={text}: expected a size like 256M or 1G"));
    let (digits, shift) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let n: usize = digits.parse().map_err(|_| bad())?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ext4_options() {
        let o = MountOptions::parse(
            "data=journal,commit=30,ro,errors=continue,nobarrier,cache_size=64M",
        )
        .unwrap();
        assert_eq!(o.data_mode, DataMode::Journal);
        assert_eq!(o.commit_interval_ms, 30_000);
        assert!(o.read_only && !o.barrier);
        assert_eq!(o.errors, ErrorBehavior::Continue);
        assert_eq!(o.cache_size_bytes, 64 << 20);
        assert_eq!(MountOptions::parse("").unwrap(), MountOptions::default());
    }

    #[test]
    fn refuses_unknown_and_malformed_options_by_name() {
        for (text, needle) in [
            ("data=fast", "data=fast"),
            ("commit=soon", "commit=soon"),
            ("bogus", "\"bogus\""),
            ("ro=1", "ro takes no value"),
            ("data", "data needs a value"),
            ("cache_size=lots", "cache_size=lots"),
        ] {
            let err = MountOptions::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
