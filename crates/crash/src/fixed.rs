//! Fixed workloads from the papers, each with a size parameter:
//!
//! - `rename-root-to-sub` and `create-delete`: CrashMonkey's tests used by BarrierFS
//!   (table 2). A file made durable in the root is renamed into a directory; files are
//!   created, written and fsync'd one by one, then deleted with a sync after each.
//! - iJournaling's recovery scenarios (section 6.5): `odd-fsync` (N files created, only
//!   the odd-numbered ones fsync'd), `append-extents` (a file grown by 4 KiB appends,
//!   each fsync'd, interleaved with a second file so that its extents do not merge and
//!   it needs external extent blocks), `dir-grow` (files created in a durable directory,
//!   each written and fsync'd, one of them growing it by a block), `deep-path` (an fsync of a file N directories
//!   down, then of a file in the same directory and of one under two new directories
//!   below the top one), and `threads` (four workers' random mkdir/create/write/truncate/unlink/fsync,
//!   interleaved by a seeded scheduler so that every run is the same).
//! - SQLite's write and sync patterns: `sqlite-rollback` (DELETE journal mode, N
//!   transactions), `sqlite-truncate` (the same in TRUNCATE journal mode: the journal
//!   truncated to 0 and synced instead of deleted), `sqlite-persist` (PERSIST mode: the
//!   journal kept and its header zeroed and synced) and `sqlite-wal` (N commits, a
//!   checkpoint every four). Under `data=adaptive` (mode `adaptive`) the rollback
//!   journal turns journaled: born so from the second transaction, switched at the
//!   first truncate, or switched, data and all, after the first zeroed header.
//! - BarrierFS's ordering-only syncs: `rename-root-to-sub-barrier` and
//!   `create-delete-barrier` (the table 2 tests with every fsync an fbarrier),
//!   `sqlite-rollback-barrier` and `sqlite-wal-barrier` (SQLite's sync pattern with every
//!   sync an ordering-only one, BarrierFS Fig. 15's "ordering" case, then an fsync),
//!   `barrier-bypass` (an in-place overwrite written back, and an fsync that would go as a
//!   fast commit, each after a barrier of another file), and `barrier-chain` (N files, each written then fdatabarrier'd or fbarrier'd in turn, so
//!   every later file's writes must not survive without the earlier files).
//! - Each file its own journal mode (JoJ, `chattr +j`): `joj-overwrite` (the paper's
//!   T1/T2 case: one block written journaled, then in place after `chattr -j`, then
//!   journaled again, beside an ordered file), `joj-reuse` (blocks freed by a journaled
//!   file taken by an ordered one and back), `joj-switch` (SQLite's rollback pattern
//!   whose database switches to journaled data and back in the middle) and `joj-inherit`
//!   (files made in a `chattr +j` directory, written, synced, deleted, renamed out).
//! - Byte records on home blocks: `joj-cold` (a database file's 100-byte row updates at
//!   scattered offsets, each round fsync'd, after the file turned `+j` with data written
//!   in place, and a remount read-only and back half-way that checkpoints everything, so
//!   the first change of a block since then is logged as its bytes changed on the home
//!   block; under `--torn` the checkpoint's home writes are torn).
//! - Files made without a name (`O_TMPFILE`): `tmpfile` (N files, each written and
//!   fsync'd nameless before `linkat` names it, then in turn fsync'd, left unsynced, or
//!   never named and closed, which deletes it; its number then goes at once to a new
//!   file whose fsync would be a fast commit; at the end a named one is unlinked and its
//!   directory fsync'd).

use crate::workload::{Op, Workload, WorkloadId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Every fixed workload's name, with the size the CI-sized exploration uses.
pub const FIXED: &[(&str, usize)] = &[
    ("rename-root-to-sub", 1),
    ("create-delete", 10),
    ("odd-fsync", 100),
    ("append-extents", 24),
    ("deep-path", 5),
    ("dir-grow", 8),
    ("threads", 1),
    ("sqlite-rollback", 4),
    ("sqlite-truncate", 4),
    ("sqlite-persist", 4),
    ("sqlite-wal", 8),
    ("rename-root-to-sub-barrier", 1),
    ("create-delete-barrier", 10),
    ("barrier-chain", 6),
    ("barrier-bypass", 2),
    ("sqlite-rollback-barrier", 4),
    ("sqlite-wal-barrier", 8),
    ("joj-overwrite", 3),
    ("joj-reuse", 3),
    ("joj-switch", 4),
    ("joj-inherit", 4),
    ("joj-cold", 6),
    ("tmpfile", 6),
];

/// Builds fixed workload `name` with size `size`.
pub fn build(name: &str, size: usize) -> Result<Workload, String> {
    let ops = match name {
        "rename-root-to-sub" => rename_root_to_sub(),
        "create-delete" => create_delete(size),
        "odd-fsync" => odd_fsync(size),
        "append-extents" => append_extents(size),
        "deep-path" => deep_path(size),
        "dir-grow" => dir_grow(size),
        "threads" => threads(size as u64),
        "sqlite-rollback" => sqlite_rollback(size, JournalEnd::Delete),
        "sqlite-truncate" => sqlite_rollback(size, JournalEnd::Truncate),
        "sqlite-persist" => sqlite_rollback(size, JournalEnd::ZeroHeader),
        "sqlite-wal" => sqlite_wal(size),
        "rename-root-to-sub-barrier" => barriers_for_syncs(rename_root_to_sub()),
        "create-delete-barrier" => barriers_for_syncs(create_delete(size)),
        "barrier-chain" => barrier_chain(size),
        "barrier-bypass" => barrier_bypass(size),
        "sqlite-rollback-barrier" => durable_at_end(barriers_for_syncs(sqlite_rollback(
            size,
            JournalEnd::Delete,
        ))),
        "sqlite-wal-barrier" => durable_at_end(barriers_for_syncs(sqlite_wal(size))),
        "joj-overwrite" => joj_overwrite(size),
        "joj-reuse" => joj_reuse(size),
        "joj-switch" => joj_switch(size),
        "joj-inherit" => joj_inherit(size),
        "joj-cold" => joj_cold(size),
        "tmpfile" => tmpfile(size),
        other => {
            let names: Vec<&str> = FIXED.iter().map(|(n, _)| *n).collect();
            return Err(format!(
                "no fixed workload {other:?}; there are: {}",
                names.join(", ")
            ));
        }
    };
    Ok(Workload {
        id: WorkloadId::Fixed {
            name: name.to_string(),
            size,
        },
        setup: Vec::new(),
        ops,
    })
}

fn write(path: &str, offset: u64, len: u32) -> Op {
    Op::Write {
        path: path.into(),
        offset,
        len,
    }
}

/// The same workload with each fsync an fbarrier and each fdatasync an fdatabarrier.
fn barriers_for_syncs(ops: Vec<Op>) -> Vec<Op> {
    ops.into_iter()
        .map(|op| match op {
            Op::Fsync(p) => Op::Fbarrier(p),
            Op::Fdatasync(p) => Op::Fdatabarrier(p),
            other => other,
        })
        .collect()
}

/// `ops` (SQLite's, on `/db`) ended by an fsync of the database, which makes every epoch
/// before it durable: the commit that crash points then fall around.
fn durable_at_end(mut ops: Vec<Op>) -> Vec<Op> {
    ops.push(Op::Fsync("/db".into()));
    ops
}

/// `write A; fdatabarrier A; write B; fbarrier B; ...`, then an fsync of the last file.
fn barrier_chain(files: usize) -> Vec<Op> {
    let mut ops = vec![Op::Mkdir("/chain".into())];
    let name = |i| format!("/chain/f{i}");
    for i in 0..files {
        ops.extend([Op::Creat(name(i)), write(&name(i), 0, 3000)]);
        ops.push(match i % 2 {
            0 => Op::Fdatabarrier(name(i)),
            _ => Op::Fbarrier(name(i)),
        });
        // An overwrite of an earlier file: ordered after its barrier, never before.
        if i > 0 {
            ops.extend([write(&name(i - 1), 0, 512), Op::Fdatabarrier(name(i - 1))]);
        }
    }
    ops.push(Op::Fsync(name(files.saturating_sub(1))));
    ops
}

/// What could overtake a barrier outside the journal, `rounds` times, after each of a
/// barrier of a new file: an append to a durable file `/f` and its fsync (which must not
/// go as a fast commit, replayed without the barrier's transaction), and an overwrite in
/// place of a durable ordered file `/o`, written back (whose writes must wait for the
/// barrier's transaction to be durable).
fn barrier_bypass(rounds: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    for durable in ["/o", "/f"] {
        ops.extend([Op::Creat(durable.into()), write(durable, 0, 8192)]);
        ops.push(Op::Fsync(durable.into()));
    }
    for i in 0..rounds {
        let (b, c) = (format!("/b{i}"), format!("/c{i}"));
        ops.extend([
            Op::Creat(b.clone()),
            write(&b, 0, 3000),
            Op::Fdatabarrier(b),
        ]);
        ops.extend([
            write("/f", 8192 + 4096 * i as u64, 2000),
            Op::Fsync("/f".into()),
        ]);
        ops.extend([Op::Creat(c.clone()), write(&c, 0, 3000), Op::Fbarrier(c)]);
        ops.extend([
            write("/o", 4096 * (i as u64 % 2), 4096),
            Op::WriteBack("/o".into()),
        ]);
    }
    ops
}

fn rename_root_to_sub() -> Vec<Op> {
    vec![
        Op::Mkdir("/test_dir".into()),
        Op::Fsync("/test_dir".into()),
        Op::Creat("/test_file".into()),
        Op::Chmod {
            path: "/test_file".into(),
            perm: 0o777,
        },
        write("/test_file", 0, 2600),
        Op::Fsync("/test_file".into()),
        Op::Rename {
            from: "/test_file".into(),
            to: "/test_dir/test_file".into(),
        },
        Op::Sync,
    ]
}

fn tmpfile(files: usize) -> Vec<Op> {
    let mut ops = vec![Op::Mkdir("/t".into()), Op::Fsync("/t".into())];
    let name = |i| format!("/t/f{i}");
    for i in 0..files {
        let len = 3000 + 4096 * (i as u32 % 3);
        let made = |linked| Op::Tmpfile {
            path: name(i),
            len,
            linked,
        };
        match i % 3 {
            0 => ops.extend([made(true), Op::Fsync(name(i))]),
            1 => ops.push(made(true)),
            _ => {
                let reuse = format!("/t/n{i}");
                ops.extend([made(false), Op::Creat(reuse.clone())]);
                ops.extend([write(&reuse, 0, 5000), Op::Fsync(reuse)]);
            }
        }
    }
    ops.extend([Op::Unlink(name(0)), Op::Fsync("/t".into())]);
    ops
}

fn create_delete(files: usize) -> Vec<Op> {
    let mut ops = vec![Op::Mkdir("/test_dir".into()), Op::Fsync("/test_dir".into())];
    let name = |i| format!("/test_dir/test_file{i}");
    for i in 0..files {
        ops.extend([
            Op::Creat(name(i)),
            Op::Fsync(name(i)),
            write(&name(i), 0, 1024),
            Op::Fsync(name(i)),
        ]);
    }
    for i in 0..files {
        ops.extend([Op::Unlink(name(i)), Op::Sync]);
    }
    ops
}

fn odd_fsync(files: usize) -> Vec<Op> {
    let mut ops = vec![Op::Mkdir("/d".into())];
    for i in 0..files {
        let path = format!("/d/f{i}");
        ops.extend([Op::Creat(path.clone()), write(&path, 0, 64)]);
        if i % 2 == 1 {
            ops.push(Op::Fsync(path));
        }
    }
    ops
}

fn append_extents(appends: usize) -> Vec<Op> {
    let mut ops = vec![Op::Creat("/big".into()), Op::Creat("/spoiler".into())];
    for _ in 0..appends {
        for path in ["/big", "/spoiler"] {
            ops.extend([
                Op::Append {
                    path: path.into(),
                    len: 4096,
                },
                Op::Fsync(path.into()),
            ]);
        }
    }
    ops
}

/// A durable directory whose only 4 KiB block holds 16 of its 19 long names, then
/// `files` more created, written and fsync'd one by one: the 20th name makes it indexed
/// (a root and two leaves). With ext4 fast commits the fsyncs before are fast commits,
/// that one commits in full (`directory_grew`: Linux's replay of its CREAT would leave
/// the directory's `i_blocks` short), and those after go in the grown directory as fast
/// commits again.
fn dir_grow(files: usize) -> Vec<Op> {
    // 200-byte names take 208 bytes of a block: 19 fit beside "." and "..".
    const PREFILLED: usize = 16;
    let name = |i: usize| format!("/grow/{i:03}{}", "n".repeat(197));
    let mut ops = vec![Op::Mkdir("/grow".into())];
    ops.extend((0..PREFILLED).map(|i| Op::Creat(name(i))));
    ops.push(Op::Sync);
    for i in PREFILLED..PREFILLED + files {
        ops.extend([
            Op::Creat(name(i)),
            write(&name(i), 0, 1500),
            Op::Fsync(name(i)),
        ]);
    }
    ops
}

fn deep_path(depth: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    let mut dir = String::new();
    for level in 0..depth.max(1) {
        dir = format!("{dir}/d{level}");
        ops.push(Op::Mkdir(dir.clone()));
    }
    let leaf = format!("{dir}/leaf");
    ops.extend([
        Op::Creat(leaf.clone()),
        write(&leaf, 0, 5000),
        Op::Fsync(leaf.clone()),
        Op::Creat(format!("{dir}/after")),
        write(&leaf, 5000, 3000),
        Op::Fsync(format!("{dir}/after")),
    ]);
    // New directories under one the leaf's fsync created.
    let side = "/d0/side/s2";
    ops.extend([
        Op::Mkdir("/d0/side".to_string()),
        Op::Mkdir(side.to_string()),
        Op::Creat(format!("{side}/f")),
        write(&format!("{side}/f"), 0, 2000),
        Op::Fsync(format!("{side}/f")),
    ]);
    ops
}

/// Four workers, each in its own directory, ten random operations each; a seeded
/// scheduler picks which worker runs next.
fn threads(seed: u64) -> Vec<Op> {
    const WORKERS: usize = 4;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut queues: Vec<Vec<Op>> = (0..WORKERS).map(|w| worker_ops(w, &mut rng)).collect();
    for q in &mut queues {
        q.reverse();
    }
    let mut ops: Vec<Op> = (0..WORKERS).map(|w| Op::Mkdir(format!("/t{w}"))).collect();
    while queues.iter().any(|q| !q.is_empty()) {
        let w = rng.gen_range(0..WORKERS);
        ops.extend(queues[w].pop());
    }
    ops
}

fn worker_ops(worker: usize, rng: &mut StdRng) -> Vec<Op> {
    let file = |i: usize| format!("/t{worker}/f{i}");
    (0..10)
        .map(|_| {
            let f = file(rng.gen_range(0..3));
            match rng.gen_range(0..6) {
                0 => Op::Mkdir(format!("/t{worker}/d{}", rng.gen_range(0..2))),
                1 => Op::Creat(f),
                2 => write(&f, rng.gen_range(0..4) * 2048, rng.gen_range(1..3) * 3000),
                3 => Op::Truncate {
                    path: f,
                    size: rng.gen_range(0..3) * 2500,
                },
                4 => Op::Unlink(f),
                _ => Op::Fsync(f),
            }
        })
        .collect()
}

const PAGE: u32 = 4096;

/// How a rollback journal's transaction ends: SQLite's DELETE, TRUNCATE and PERSIST
/// journal modes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum JournalEnd {
    Delete,
    Truncate,
    ZeroHeader,
}

/// SQLite's rollback journal with synchronous=FULL: original pages to the journal,
/// journal synced, header rewritten and synced again, database pages written and
/// synced, then the journal ended as `end` says.
fn sqlite_rollback(transactions: usize, end: JournalEnd) -> Vec<Op> {
    let mut ops = vec![
        Op::Creat("/db".into()),
        write("/db", 0, 4 * PAGE),
        Op::Fsync("/db".into()),
    ];
    for t in 0..transactions {
        let page = (t % 4) as u64;
        // TRUNCATE and PERSIST modes keep the journal file between transactions.
        if t == 0 || end == JournalEnd::Delete {
            ops.push(Op::Creat("/db-journal".into()));
        }
        ops.extend([
            write("/db-journal", 0, 512),
            write("/db-journal", 512, PAGE + 4),
            Op::Fsync("/db-journal".into()),
            // SQLite syncs the directory of a journal it just created (UNIXFILE_DIRSYNC).
            Op::Fsync("/".into()),
            write("/db-journal", 0, 28),
            Op::Fsync("/db-journal".into()),
            write("/db", page * u64::from(PAGE), PAGE),
            Op::Fsync("/db".into()),
        ]);
        ops.extend(match end {
            JournalEnd::Truncate => vec![
                Op::Truncate {
                    path: "/db-journal".into(),
                    size: 0,
                },
                Op::Fsync("/db-journal".into()),
            ],
            JournalEnd::ZeroHeader => vec![
                Op::WriteZeros {
                    path: "/db-journal".into(),
                    offset: 0,
                    len: 28,
                },
                Op::Fdatasync("/db-journal".into()),
            ],
            JournalEnd::Delete => vec![Op::Unlink("/db-journal".into())],
        });
    }
    ops
}

/// SQLite's WAL mode: each commit appends a frame (24-byte header + page) and syncs
/// the log; every fourth commit checkpoints (pages to the database, database synced,
/// log reset by rewriting its header).
fn sqlite_wal(commits: usize) -> Vec<Op> {
    let mut ops = vec![
        Op::Creat("/db".into()),
        write("/db", 0, 4 * PAGE),
        Op::Fsync("/db".into()),
        Op::Creat("/db-wal".into()),
        write("/db-wal", 0, 32),
        Op::Fsync("/db-wal".into()),
    ];
    let frame = u64::from(PAGE) + 24;
    for c in 0..commits {
        let slot = (c % 4) as u64;
        ops.extend([
            write("/db-wal", 32 + slot * frame, PAGE + 24),
            Op::Fsync("/db-wal".into()),
        ]);
        if slot == 3 {
            ops.extend([
                write("/db", 0, 4 * PAGE),
                Op::Fsync("/db".into()),
                write("/db-wal", 0, 32),
                Op::Fsync("/db-wal".into()),
            ]);
        }
    }
    ops
}

fn chattr(path: &str, on: bool) -> Op {
    Op::JournalData {
        path: path.into(),
        on,
    }
}

/// The paper's T1/T2 reordering, made impossible by the switch's journal flush: block 0
/// of `/t` written journaled (T1), then in place after `chattr -j` (T2), then journaled
/// again; an ordered file `/o` is overwritten in the same commits.
fn joj_overwrite(rounds: usize) -> Vec<Op> {
    let mut ops = vec![
        Op::Creat("/t".into()),
        Op::Creat("/o".into()),
        write("/o", 0, 2 * PAGE),
        chattr("/t", true),
        write("/t", 0, 2 * PAGE),
        Op::Fsync("/t".into()),
    ];
    for r in 0..rounds {
        let on = r % 2 == 1;
        ops.extend([
            write("/t", 0, PAGE),
            write("/o", 0, PAGE),
            Op::Fdatasync("/t".into()),
            chattr("/t", on),
            write("/t", 0, PAGE),
            write("/o", u64::from(PAGE), PAGE),
            Op::Fsync("/o".into()),
            write("/t", 512, 1024),
        ]);
    }
    ops.push(Op::Fsync("/t".into()));
    ops
}

/// Blocks freed from a journaled file reused by an ordered one, and the reverse; the
/// freed file's copies are still in the log when the other file writes the blocks.
fn joj_reuse(rounds: usize) -> Vec<Op> {
    let mut ops = Vec::new();
    for r in 0..rounds {
        let (first, second) = (format!("/a{r}"), format!("/b{r}"));
        let journaled_first = r % 2 == 0;
        ops.extend([Op::Creat(first.clone()), chattr(&first, journaled_first)]);
        ops.extend([write(&first, 0, 4 * PAGE), Op::Fsync(first.clone())]);
        ops.extend([Op::Unlink(first.clone()), Op::Sync]);
        ops.extend([Op::Creat(second.clone()), chattr(&second, !journaled_first)]);
        ops.extend([write(&second, 0, 4 * PAGE), Op::Fdatasync(second.clone())]);
        ops.push(write(&second, u64::from(PAGE), 100));
    }
    ops.push(Op::Sync);
    ops
}

/// SQLite's rollback pattern (journal in a `+j` directory) whose database switches to
/// journaled data half-way through and back to ordered at the end.
fn joj_switch(transactions: usize) -> Vec<Op> {
    let mut ops = vec![
        Op::Mkdir("/j".into()),
        chattr("/j", true),
        Op::Creat("/db".into()),
        write("/db", 0, 4 * PAGE),
        Op::Fsync("/db".into()),
    ];
    for t in 0..transactions {
        if t == transactions / 2 {
            ops.push(chattr("/db", true));
        }
        let page = u64::from(PAGE) * (t % 4) as u64;
        ops.extend([
            Op::Creat("/j/db-journal".into()),
            write("/j/db-journal", 0, PAGE + 512),
            Op::Fsync("/j/db-journal".into()),
            write("/db", page, PAGE),
            Op::Fsync("/db".into()),
            Op::Unlink("/j/db-journal".into()),
        ]);
    }
    ops.extend([
        chattr("/db", false),
        write("/db", 0, PAGE),
        Op::Fdatasync("/db".into()),
    ]);
    ops
}

/// Files made in a `chattr +j` directory inherit the flag: written and synced, every
/// other one deleted (its blocks revoked), one renamed out and overwritten.
fn joj_inherit(files: usize) -> Vec<Op> {
    let mut ops = vec![
        Op::Mkdir("/logs".into()),
        chattr("/logs", true),
        Op::Fsync("/logs".into()),
    ];
    let name = |i| format!("/logs/f{i}");
    for i in 0..files {
        ops.extend([
            Op::Creat(name(i)),
            write(&name(i), 0, 2 * PAGE + 100),
            Op::Fdatasync(name(i)),
        ]);
        if i % 2 == 1 {
            ops.extend([Op::Unlink(name(i - 1)), Op::Fsync("/logs".into())]);
        }
    }
    let last = name(files.saturating_sub(1));
    ops.extend([
        Op::Rename {
            from: last.clone(),
            to: "/moved".into(),
        },
        write("/moved", 0, PAGE),
        Op::Fsync("/moved".into()),
    ]);
    ops
}

/// A database file's row updates (100 bytes at scattered offsets, two per transaction,
/// each fsync'd) on blocks the log holds nothing of: written in place and made durable,
/// then `chattr +j` (with dirty data the switch writes in place and flushes), and a
/// remount read-only and back half-way, which checkpoints every logged block home. In
/// `data=journal` the file is journaled from the start and the switch changes nothing.
fn joj_cold(rounds: usize) -> Vec<Op> {
    const PAGES: u64 = 8;
    let mut ops = vec![
        Op::Creat("/db".into()),
        write("/db", 0, PAGES as u32 * PAGE),
        Op::Fsync("/db".into()),
        write("/db", 2 * u64::from(PAGE), PAGE),
        chattr("/db", true),
    ];
    let mut rng = StdRng::seed_from_u64(rounds as u64);
    for r in 0..rounds {
        if r == rounds / 2 {
            ops.push(Op::RemountCycle);
        }
        for _ in 0..2 {
            let page = rng.gen_range(0..PAGES);
            let within = rng.gen_range(0..u64::from(PAGE) - 100);
            ops.push(write("/db", page * u64::from(PAGE) + within, 100));
        }
        ops.push(Op::Fsync("/db".into()));
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_workload_builds_and_unknown_names_are_refused() {
        for (name, size) in FIXED {
            let w = build(name, *size).unwrap();
            assert!(w.ops.iter().any(Op::is_sync), "{name} syncs somewhere");
        }
        let err = build("nope", 1).unwrap_err();
        assert!(err.contains("odd-fsync"), "{err}");
    }

    #[test]
    fn odd_fsync_syncs_only_odd_files() {
        let ops = odd_fsync(4);
        let synced: Vec<&Op> = ops.iter().filter(|o| o.is_sync()).collect();
        assert_eq!(
            synced,
            vec![&Op::Fsync("/d/f1".into()), &Op::Fsync("/d/f3".into())]
        );
    }
}
