//! ACE-style workloads (after CrashMonkey's Automatic Crash Explorer): every single
//! operation on a small file set followed by each way of persisting it (seq-1,
//! exhaustive), and seeded samples of two or three such pairs (seq-2, seq-3).
//!
//! All workloads start from the same setup tree, so every seq-1 operation is valid:
//!
//! ```text
//! /foo (5000 B)   /A/foo (8192 B)   /A/bar (100 B)   /A/C/   /B/foo (empty)
//! ```

use crate::workload::{Falloc, Op, Workload, WorkloadId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn s(p: &str) -> String {
    p.to_string()
}

/// The setup tree every ACE workload starts from.
fn setup() -> Vec<Op> {
    let file = |p: &str, len: u32| {
        [
            Op::Creat(s(p)),
            Op::Write {
                path: s(p),
                offset: 0,
                len,
            },
        ]
    };
    let mut ops = vec![Op::Mkdir(s("/A")), Op::Mkdir(s("/B")), Op::Mkdir(s("/A/C"))];
    ops.extend(file("/foo", 5000));
    ops.extend(file("/A/foo", 8192));
    ops.extend(file("/A/bar", 100));
    ops.push(Op::Creat(s("/B/foo")));
    ops
}

/// The core operations, each valid on the setup tree.
fn core_ops() -> Vec<Op> {
    let write = |p: &str, offset, len| Op::Write {
        path: s(p),
        offset,
        len,
    };
    let append = |p: &str, len| Op::Append { path: s(p), len };
    let truncate = |p: &str, size| Op::Truncate { path: s(p), size };
    let falloc = |offset, len, mode| Op::Fallocate {
        path: s("/A/foo"),
        offset,
        len,
        mode,
    };
    let link = |from: &str, to: &str| Op::Link {
        from: s(from),
        to: s(to),
    };
    let rename = |from: &str, to: &str| Op::Rename {
        from: s(from),
        to: s(to),
    };
    vec![
        Op::Creat(s("/bar")),
        Op::Creat(s("/A/baz")),
        Op::Mkdir(s("/B/D")),
        Op::Mkdir(s("/A/C/E")),
        write("/foo", 0, 4096),
        write("/A/foo", 2048, 4096),
        write("/A/bar", 50, 100),
        write("/B/foo", 16384, 4096),
        append("/foo", 4096),
        append("/A/foo", 8192),
        append("/A/bar", 3000),
        truncate("/A/foo", 1000),
        truncate("/foo", 20000),
        truncate("/A/bar", 0),
        falloc(0, 16384, Falloc::Allocate),
        falloc(8192, 8192, Falloc::KeepSize),
        falloc(0, 4096, Falloc::PunchHole),
        link("/A/foo", "/B/bar"),
        link("/foo", "/A/baz"),
        Op::Unlink(s("/A/bar")),
        Op::Unlink(s("/foo")),
        rename("/A/foo", "/B/foo"),
        rename("/A/foo", "/bar"),
        rename("/foo", "/A/C/foo"),
        rename("/A/C", "/B/C"),
        rename("/A", "/B/D"),
        Op::Rmdir(s("/A/C")),
        Op::Symlink {
            target: s("../A/foo"),
            path: s("/B/bar"),
        },
        Op::SetXattr {
            path: s("/A/foo"),
            name: s("user.ace"),
            value: s("1"),
        },
        Op::SetXattr {
            path: s("/A"),
            name: s("user.dir"),
            value: s("2"),
        },
        Op::Chmod {
            path: s("/A/foo"),
            perm: 0o600,
        },
    ]
}

/// Operations added after seeded samples had reproducers: seq-1 covers them (after the
/// core ones, so the older seq-1 numbers stand), samples draw only from `core_ops`, so a
/// sample's seed keeps naming the same workload.
fn later_ops() -> Vec<Op> {
    vec![
        Op::Fallocate {
            path: s("/A/foo"),
            offset: 2048,
            len: 12288,
            mode: Falloc::ZeroRange,
        },
        Op::SetAcl {
            path: s("/A/foo"),
            uid: 1000,
            default: false,
        },
        Op::SetAcl {
            path: s("/A"),
            uid: 1000,
            default: true,
        },
    ]
}

fn parent(p: &str) -> String {
    match p.rsplit_once('/') {
        Some(("", _)) | None => s("/"),
        Some((dir, _)) => s(dir),
    }
}

/// The ways to persist `op`: fsync and fdatasync of what it made or changed and of the
/// directories whose entries it changed, and sync.
fn persistence(op: &Op) -> Vec<Op> {
    let both = |p: String| [Op::Fsync(p.clone()), Op::Fdatasync(p)];
    let mut out = Vec::new();
    match op {
        Op::Unlink(p) | Op::Rmdir(p) => out.extend(both(parent(p))),
        Op::Rename { from, to } | Op::Link { from, to } => {
            out.push(Op::Fsync(s(to)));
            out.extend(both(parent(to)));
            if parent(from) != parent(to) {
                out.extend(both(parent(from)));
            }
        }
        other => {
            let p = other.paths()[0];
            out.extend(both(s(p)));
            out.extend(both(parent(p)));
        }
    }
    out.push(Op::Sync);
    out
}

fn seq1_all() -> Vec<(Op, Op)> {
    core_ops()
        .into_iter()
        .chain(later_ops())
        .flat_map(|op| persistence(&op).into_iter().map(move |p| (op.clone(), p)))
        .collect()
}

/// How many seq-1 workloads there are.
pub fn seq1_count() -> usize {
    seq1_all().len()
}

/// The `index`-th seq-1 workload.
pub fn seq1(index: usize) -> Option<Workload> {
    let (op, persist) = seq1_all().into_iter().nth(index)?;
    Some(Workload {
        id: WorkloadId::AceOne(index),
        setup: setup(),
        ops: vec![op, persist],
    })
}

/// A seeded sequence of `len` core operations, each persisted in a random way (or, with
/// probability 1/4, not at once).
pub fn sampled(len: usize, seed: u64) -> Workload {
    let mut rng = StdRng::seed_from_u64(seed);
    let core = core_ops();
    let mut ops = Vec::new();
    for _ in 0..len {
        let op = core[rng.gen_range(0..core.len())].clone();
        let ways = persistence(&op);
        let persist =
            (rng.gen_range(0..4) != 0).then(|| ways[rng.gen_range(0..ways.len())].clone());
        ops.push(op);
        ops.extend(persist);
    }
    Workload {
        id: WorkloadId::AceSampled { len, seed },
        setup: setup(),
        ops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq1_covers_every_core_op_with_every_persistence() {
        let n = seq1_count();
        assert!(n > 100, "{n} seq-1 workloads");
        assert!(seq1(n).is_none());
        let last = seq1(n - 1).unwrap();
        assert_eq!(last.ops.len(), 2);
        assert!(last.ops[1].is_sync());
    }

    #[test]
    fn sampled_workloads_are_reproducible() {
        assert_eq!(sampled(3, 42).ops, sampled(3, 42).ops);
        assert_ne!(sampled(3, 42).ops, sampled(3, 43).ops);
    }
}
