//! Workloads: short sequences of file-system operations, named so they can be rebuilt.
//!
//! A [`Workload`] is a setup (run and made durable before recording starts) and the
//! operations whose crash states are explored. Every workload has a [`WorkloadId`] that
//! regenerates exactly the same operations, which is what makes a failure replayable
//! from one line. Written data is a pattern of the operation's position and the sector,
//! so a block that mixes two writes, or a torn sector, can be told apart from either.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// How `fallocate` is called.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Falloc {
    Allocate,
    KeepSize,
    PunchHole,
    /// `FALLOC_FL_ZERO_RANGE`: zeros, the blocks kept allocated, the size grown.
    ZeroRange,
}

/// One file-system call. Paths are absolute, `/`-separated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Creat(String),
    Mkdir(String),
    /// `pwrite` of `len` bytes at `offset` (an append when `offset` is the size).
    Write {
        path: String,
        offset: u64,
        len: u32,
    },
    /// `pwrite` of `len` zero bytes at `offset` (SQLite's PERSIST journal mode ends a
    /// transaction by zeroing the journal's header).
    WriteZeros {
        path: String,
        offset: u64,
        len: u32,
    },
    /// `write` at the end of the file.
    Append {
        path: String,
        len: u32,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Fallocate {
        path: String,
        offset: u64,
        len: u64,
        mode: Falloc,
    },
    Link {
        from: String,
        to: String,
    },
    Unlink(String),
    /// `open(2)` of `path`'s directory with `O_TMPFILE`, `len` bytes written, an fsync
    /// of the nameless file (durable on the orphan list), then with `linked` `linkat` to
    /// `path` (off the list), and close (which deletes a file never linked): a file that
    /// appears with its data, or one that only ever lived nameless.
    Tmpfile {
        path: String,
        len: u32,
        linked: bool,
    },
    Rename {
        from: String,
        to: String,
    },
    Rmdir(String),
    Symlink {
        target: String,
        path: String,
    },
    SetXattr {
        path: String,
        name: String,
        value: String,
    },
    Chmod {
        path: String,
        perm: u16,
    },
    /// A POSIX ACL giving user `uid` read access: the access ACL (which also sets the
    /// mode's group bits to the mask), or with `default` the directory's default ACL.
    SetAcl {
        path: String,
        uid: u32,
        default: bool,
    },
    /// `chattr +j` (`on`) or `chattr -j`: the file's data journaled, or left to the
    /// mount's mode (a directory's flag reaches what is made in it).
    JournalData {
        path: String,
        on: bool,
    },
    Fsync(String),
    Fdatasync(String),
    /// BarrierFS's ordering-only syncs: what fsync (fdatasync) would make durable is
    /// ordered before every later write, not durable.
    Fbarrier(String),
    Fdatabarrier(String),
    /// `sync_file_range` with write and wait: the file's dirty data written back (in
    /// place where it overwrites), no commit, nothing promised.
    WriteBack(String),
    Sync,
    /// `mount -o remount,ro` then `remount,rw`: everything written back, committed and
    /// checkpointed, the image left clean, then writable again (a checkpoint a workload
    /// can place: blocks logged before it are at home, and the log holds nothing).
    RemountCycle,
}

impl Op {
    /// Whether the call promises durability when it returns.
    pub fn is_sync(&self) -> bool {
        matches!(
            self,
            Op::Fsync(_) | Op::Fdatasync(_) | Op::Sync | Op::RemountCycle
        )
    }

    /// Whether the call promises order when it returns (a barrier).
    pub fn is_barrier(&self) -> bool {
        matches!(self, Op::Fbarrier(_) | Op::Fdatabarrier(_))
    }

    /// The paths the call names (not the paths it changes through a renamed directory).
    pub fn paths(&self) -> Vec<&str> {
        match self {
            Op::Creat(p)
            | Op::Mkdir(p)
            | Op::Unlink(p)
            | Op::Rmdir(p)
            | Op::Fsync(p)
            | Op::Fdatasync(p)
            | Op::Fbarrier(p)
            | Op::Fdatabarrier(p)
            | Op::WriteBack(p)
            | Op::Write { path: p, .. }
            | Op::WriteZeros { path: p, .. }
            | Op::Append { path: p, .. }
            | Op::Truncate { path: p, .. }
            | Op::Fallocate { path: p, .. }
            | Op::Symlink { path: p, .. }
            | Op::SetXattr { path: p, .. }
            | Op::Chmod { path: p, .. }
            | Op::SetAcl { path: p, .. }
            | Op::JournalData { path: p, .. } => vec![p],
            Op::Link { from, to } | Op::Rename { from, to } => vec![from, to],
            Op::Tmpfile { path, linked, .. } => match linked {
                true => vec![path],
                false => vec![],
            },
            Op::Sync | Op::RemountCycle => vec![],
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Creat(p) => write!(f, "creat {p}"),
            Op::Mkdir(p) => write!(f, "mkdir {p}"),
            Op::Write { path, offset, len } => write!(f, "pwrite {path} {len}@{offset}"),
            Op::WriteZeros { path, offset, len } => {
                write!(f, "pwrite {path} {len} zeros@{offset}")
            }
            Op::Append { path, len } => write!(f, "append {path} {len}"),
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Fallocate {
                path,
                offset,
                len,
                mode,
            } => {
                let mode = match mode {
                    Falloc::Allocate => "",
                    Falloc::KeepSize => " keep-size",
                    Falloc::PunchHole => " punch-hole",
                    Falloc::ZeroRange => " zero-range",
                };
                write!(f, "fallocate{mode} {path} {len}@{offset}")
            }
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::Unlink(p) => write!(f, "unlink {p}"),
            Op::Tmpfile { path, len, linked } => match linked {
                true => write!(f, "tmpfile {len} linked {path}"),
                false => write!(f, "tmpfile {len} beside {path}, never linked"),
            },
            Op::Rename { from, to } => write!(f, "rename {from} {to}"),
            Op::Rmdir(p) => write!(f, "rmdir {p}"),
            Op::Symlink { target, path } => write!(f, "symlink {target} {path}"),
            Op::SetXattr { path, name, value } => write!(f, "setxattr {path} {name}={value}"),
            Op::Chmod { path, perm } => write!(f, "chmod {perm:o} {path}"),
            Op::SetAcl { path, uid, default } => {
                let d = if *default { "d:" } else { "" };
                write!(f, "setfacl -m {d}u:{uid}:r {path}")
            }
            Op::JournalData { path, on } => {
                write!(f, "chattr {}j {path}", if *on { '+' } else { '-' })
            }
            Op::Fsync(p) => write!(f, "fsync {p}"),
            Op::Fdatasync(p) => write!(f, "fdatasync {p}"),
            Op::Fbarrier(p) => write!(f, "fbarrier {p}"),
            Op::Fdatabarrier(p) => write!(f, "fdatabarrier {p}"),
            Op::WriteBack(p) => write!(f, "sync_file_range {p}"),
            Op::Sync => write!(f, "sync"),
            Op::RemountCycle => write!(f, "remount ro, rw"),
        }
    }
}

/// The bytes operation number `op_index` writes at file offset `offset`: they differ per
/// operation and per 512-byte sector, and are never zero.
pub fn pattern(op_index: usize, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let at = offset + i;
            let sector = (at / 512) as u8;
            (op_index as u8)
                .wrapping_mul(37)
                .wrapping_add(sector.wrapping_mul(11))
                .wrapping_add((at % 7) as u8)
                | 1
        })
        .collect()
}

/// Names a workload so that it can be generated again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadId {
    /// The `index`-th of the exhaustive one-operation workloads (ACE's seq-1).
    AceOne(usize),
    /// A sampled sequence of `len` operations (2 or 3) drawn from `seed`.
    AceSampled { len: usize, seed: u64 },
    /// A fixed workload from the papers, with its size parameter.
    Fixed { name: String, size: usize },
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadId::AceOne(i) => write!(f, "ace1-{i}"),
            WorkloadId::AceSampled { len, seed } => write!(f, "ace{len}-{seed}"),
            WorkloadId::Fixed { name, size } => write!(f, "{name}-{size}"),
        }
    }
}

impl FromStr for WorkloadId {
    type Err = String;
    fn from_str(s: &str) -> Result<WorkloadId, String> {
        let (head, number) = s
            .rsplit_once('-')
            .ok_or_else(|| format!("workload {s:?}: expected NAME-NUMBER (e.g. ace1-4)"))?;
        let number: u64 = number
            .parse()
            .map_err(|_| format!("workload {s:?}: {number:?} is not a number"))?;
        Ok(match head {
            "ace1" => WorkloadId::AceOne(number as usize),
            "ace2" | "ace3" => WorkloadId::AceSampled {
                len: if head == "ace2" { 2 } else { 3 },
                seed: number,
            },
            name => WorkloadId::Fixed {
                name: name.to_string(),
                size: number as usize,
            },
        })
    }
}

/// Operations to run before recording (then made durable), and the recorded ones.
#[derive(Clone, Debug)]
pub struct Workload {
    pub id: WorkloadId,
    pub setup: Vec<Op>,
    pub ops: Vec<Op>,
}

impl Workload {
    /// Every path the workload can make exist: the named ones, their ancestors, and
    /// where renames of directories carry named paths.
    pub fn paths(&self) -> Vec<String> {
        let mut paths: BTreeSet<String> = BTreeSet::new();
        for op in self.setup.iter().chain(&self.ops) {
            for p in op.paths() {
                let mut at = p;
                while let Some((parent, _)) = at.rsplit_once('/') {
                    paths.insert(at.to_string());
                    at = parent;
                }
            }
        }
        for op in &self.ops {
            if let Op::Rename { from, to } = op {
                let moved: Vec<String> = paths
                    .iter()
                    .filter_map(|p| p.strip_prefix(from.as_str()))
                    .filter(|rest| rest.starts_with('/'))
                    .map(|rest| format!("{to}{rest}"))
                    .collect();
                paths.extend(moved);
            }
        }
        paths.into_iter().collect()
    }

    /// The operation list, one per line, for a failure report.
    pub fn listing(&self) -> String {
        let mut out = String::new();
        for (i, op) in self.setup.iter().enumerate() {
            out.push_str(&format!("  setup {i:>3}: {op}\n"));
        }
        for (i, op) in self.ops.iter().enumerate() {
            out.push_str(&format!("  op    {i:>3}: {op}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_ids_round_trip() {
        for id in [
            WorkloadId::AceOne(17),
            WorkloadId::AceSampled { len: 3, seed: 99 },
            WorkloadId::Fixed {
                name: "odd-fsync".into(),
                size: 1000,
            },
        ] {
            assert_eq!(id.to_string().parse::<WorkloadId>().unwrap(), id);
        }
        assert!("nonsense".parse::<WorkloadId>().is_err());
        assert!("ace1-x".parse::<WorkloadId>().is_err());
    }

    #[test]
    fn renamed_directories_carry_their_paths() {
        let w = Workload {
            id: WorkloadId::AceOne(0),
            setup: vec![Op::Mkdir("/A".into()), Op::Creat("/A/foo".into())],
            ops: vec![Op::Rename {
                from: "/A".into(),
                to: "/B".into(),
            }],
        };
        assert_eq!(w.paths(), vec!["/A", "/A/foo", "/B", "/B/foo"]);
    }

    #[test]
    fn patterns_differ_per_op_and_sector_and_are_never_zero() {
        let a = pattern(1, 0, 1024);
        let b = pattern(2, 0, 1024);
        assert_ne!(a[..512], b[..512]);
        assert_ne!(a[..512], a[512..]);
        assert!(a.iter().chain(&b).all(|&x| x != 0));
    }
}
