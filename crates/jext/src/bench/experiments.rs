//! The experiments: each takes a running system, does its workload, and returns what it
//! measured. Nothing here knows which system it is talking to.
//!
//! Promises: the clock covers exactly the work named (the write calls and the sync that
//! makes them durable) and nothing of setup or teardown. Data is not all zeros, so no
//! layer can skip it. Must never report a figure for a run that failed part-way.

use super::rig::run;
use super::systems::{BenchFile, IoCounts, Running};
use crate::signals::{check_interrupt, interrupted};
use jext_fuse::requests::DaemonStats;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

/// The unit of the small-write experiments: one file-system block.
const BLOCK: usize = 4096;

/// What one run of one experiment on one system measured.
#[derive(Clone, Debug)]
pub enum Measured {
    /// Sequential write then fsync: bytes and the seconds it took.
    Throughput {
        bytes: u64,
        seconds: f64,
        io: Option<IoCounts>,
    },
    /// Per-operation latencies (ns) and the device requests of all of them together; with
    /// a background writer, the rate it achieved meanwhile.
    Latency {
        latencies_ns: Vec<u64>,
        io: Option<IoCounts>,
        background_mib_per_s: Option<f64>,
    },
    /// Operations done in a wall-clock time (by all threads together); on jext's mount,
    /// what its daemon served meanwhile.
    Ops {
        ops: u64,
        seconds: f64,
        io: Option<IoCounts>,
        daemon: Option<DaemonStats>,
    },
    /// Device commands done in a wall-clock time, with the queue depth the IO layer saw
    /// (`io-order`).
    Queue {
        ops: u64,
        seconds: f64,
        io: Option<IoCounts>,
        mean_queue_depth: f64,
        max_queue_depth: usize,
        /// Whether barrier writes kept the order (else flushes did, or nothing did).
        barrier_mode: bool,
    },
    /// A long write with memory sampled along the way: the peaks seen.
    Memory {
        bytes: u64,
        seconds: f64,
        peak_rss_bytes: u64,
        peak_cache_bytes: u64,
        cache_bound_bytes: u64,
    },
}

/// One step of xorshift64: the benchmarks' cheap, repeatable random numbers.
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A non-zero xorshift state from any seed.
fn xorshift_state(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// A recognisable, incompressible-looking pattern (not zeros, not one repeated byte).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = xorshift_state(seed);
    (0..len).map(|_| xorshift(&mut x) as u8).collect()
}

/// `seq`: write `total_bytes` sequentially in `chunk_bytes` pieces, then fsync once.
pub fn sequential_write(
    sys: &Running,
    total_bytes: u64,
    chunk_bytes: usize,
) -> io::Result<Measured> {
    assert!(
        total_bytes.is_multiple_of(chunk_bytes as u64),
        "whole chunks only"
    );
    let chunk = pattern(chunk_bytes, 1);
    let mut file = sys.create("seq", 0)?;
    let (seconds, io) = counted(sys, || {
        let start = Instant::now();
        let mut offset = 0;
        while offset < total_bytes {
            check_interrupt()?;
            file.write_at(offset, &chunk)?;
            offset += chunk_bytes as u64;
        }
        file.sync(false)?;
        Ok(start.elapsed().as_secs_f64())
    })?;
    Ok(Measured::Throughput {
        bytes: total_bytes,
        seconds,
        io,
    })
}

/// `fsync-latency` (BarrierFS Table 1): `count` times, append 4 KiB to a file (a new block
/// each time) and fsync; each sample is the write and the fsync together.
pub fn allocating_write_fsync(
    sys: &Running,
    count: usize,
    data_only: bool,
) -> io::Result<Measured> {
    let mut file = sys.create("fsync", 0)?;
    let block = pattern(BLOCK, 2);
    let (latencies_ns, io) = counted(sys, || {
        let mut latencies_ns = Vec::with_capacity(count);
        for i in 0..count {
            check_interrupt()?;
            let start = Instant::now();
            file.write_at((i * BLOCK) as u64, &block)?;
            file.sync(data_only)?;
            latencies_ns.push(start.elapsed().as_nanos() as u64);
        }
        Ok(latencies_ns)
    })?;
    Ok(Measured::Latency {
        latencies_ns,
        io,
        background_mib_per_s: None,
    })
}

/// Where each raw `dwsl` thread writes: its own region of the device, far enough apart
/// that no thread's appends reach the next one's.
const DWSL_REGION_BYTES: u64 = 64 << 20;

/// How many threads `dwsl` runs with: doubling from one up to `max`, and `max` itself.
pub fn thread_plan(max: usize) -> Vec<usize> {
    let mut plan: Vec<usize> = std::iter::successors(Some(1), |n| Some(n * 2))
        .take_while(|&n| n < max)
        .collect();
    plan.push(max.max(1));
    plan
}

/// `dwsl` (fxmark DWSL; iJournaling Fig. 9, BarrierFS Fig. 13): `threads` threads, each
/// `ops_per_thread` times appending 4 KiB to its own file and fsyncing it. The clock runs
/// from the moment all threads are released together until the last one is done.
pub fn dwsl(sys: &Running, threads: usize, ops_per_thread: usize) -> io::Result<Measured> {
    let files = (0..threads)
        .map(|t| sys.create(&format!("dwsl{t}"), t as u64 * DWSL_REGION_BYTES))
        .collect::<io::Result<Vec<_>>>()?;
    let start_line = Barrier::new(threads + 1);
    let (seconds, io) = counted(sys, || {
        thread::scope(|scope| {
            let workers: Vec<_> = files
                .into_iter()
                .enumerate()
                .map(|(t, file)| {
                    let start_line = &start_line;
                    scope.spawn(move || append_and_fsync(file, ops_per_thread, t, start_line))
                })
                .collect();
            start_line.wait();
            let start = Instant::now();
            for worker in workers {
                worker.join().expect("a dwsl thread panicked")?;
            }
            Ok(start.elapsed().as_secs_f64())
        })
    })?;
    Ok(Measured::Ops {
        ops: (threads * ops_per_thread) as u64,
        seconds,
        io,
        daemon: None,
    })
}

fn append_and_fsync(
    mut file: BenchFile,
    count: usize,
    seed: usize,
    start_line: &Barrier,
) -> io::Result<()> {
    let block = pattern(BLOCK, 10 + seed as u64);
    start_line.wait();
    for i in 0..count {
        check_interrupt()?;
        file.write_at((i * BLOCK) as u64, &block)?;
        file.sync(false)?;
    }
    Ok(())
}

/// The background writer of `fsync-tail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackgroundWriter {
    /// The tester runs alone.
    None,
    /// Held to this many MiB/s.
    Paced(u64),
    /// As fast as the system under test takes it (the paper's Fig. 7 runs up to the
    /// device's maximum). Its window stays in the cache, so the writer runs at memory speed
    /// and its writeback at the device's.
    Unpaced,
}

/// The background writer's writes: 1 MiB buffered writes, no sync, cycling through a
/// window (so the image need not grow with the run), in a region of its own on raw systems.
const BACKGROUND_CHUNK: usize = 1 << 20;
const BACKGROUND_WINDOW_BYTES: u64 = 768 << 20;
const BACKGROUND_REGION: u64 = 1 << 30;

/// Holds a writer to a rate: bytes are due at the time they take at that rate from the
/// start. A writer ahead of schedule sleeps until it is due; one behind (its writes blocked)
/// writes on without sleeping, so the achieved rate is reported, not assumed.
#[derive(Clone, Copy, Debug)]
pub struct Pacer {
    bytes_per_sec: u64,
}

impl Pacer {
    pub fn new(mib_per_s: u64) -> Pacer {
        assert!(mib_per_s > 0, "a paced writer needs a rate");
        Pacer {
            bytes_per_sec: mib_per_s << 20,
        }
    }

    /// When, after the start, `bytes` written so far are due.
    pub fn due(&self, bytes: u64) -> Duration {
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(self.bytes_per_sec);
        Duration::from_nanos(nanos as u64)
    }

    /// How long to sleep after writing `bytes` in `elapsed`.
    pub fn pause(&self, bytes: u64, elapsed: Duration) -> Duration {
        self.due(bytes).saturating_sub(elapsed)
    }
}

/// The fsync tester's pause between its write and its fsync (iJournaling §6.2: "write 80 KB,
/// sleep 0.1 s, fsync").
const TESTER_PAUSE: Duration = Duration::from_millis(100);

/// `fsync-tail` (iJournaling Fig. 6/7), as the paper ran it: for `seconds`, append 80 KiB to a
/// file, pause 100 ms, fsync it; each sample is the fsync alone. With a background `writer`,
/// another thread meanwhile writes a large file through the cache, and stops when the tester
/// is done. The run must outlast the kernel's dirty expiry (30 s by default):
/// until then Linux keeps the writer's data in its page cache, so a compound transaction has
/// none of it to wait for and ext4's tail does not show what the paper measured.
pub fn fsync_tail(sys: &Running, seconds: u64, writer: BackgroundWriter) -> io::Result<Measured> {
    let tester = sys.create("tail", 0)?;
    let background = match writer {
        BackgroundWriter::None => None,
        BackgroundWriter::Paced(rate) => Some((
            sys.create("background", BACKGROUND_REGION)?,
            Some(Pacer::new(rate)),
        )),
        BackgroundWriter::Unpaced => Some((sys.create("background", BACKGROUND_REGION)?, None)),
    };
    let stop = &AtomicBool::new(false);
    let ((latencies_ns, achieved), io) = counted(sys, || {
        thread::scope(|scope| {
            let writer = background
                .map(|(file, pacer)| scope.spawn(move || background_writer(file, pacer, stop)));
            let latencies_ns = timed_appends(tester, Duration::from_secs(seconds));
            // The writer must stop whether or not the tester succeeded.
            stop.store(true, Ordering::Relaxed);
            let achieved = writer
                .map(|w| w.join().expect("the background writer panicked"))
                .transpose()?;
            Ok((latencies_ns?, achieved))
        })
    })?;
    Ok(Measured::Latency {
        latencies_ns,
        io,
        background_mib_per_s: achieved,
    })
}

fn timed_appends(mut file: BenchFile, run_for: Duration) -> io::Result<Vec<u64>> {
    const APPEND: usize = 80 << 10;
    let data = pattern(APPEND, 5);
    let mut latencies_ns = Vec::new();
    let start = Instant::now();
    while start.elapsed() < run_for {
        check_interrupt()?;
        let offset = (latencies_ns.len() * APPEND) as u64;
        file.write_at(offset, &data)?;
        thread::sleep(TESTER_PAUSE);
        let fsync_start = Instant::now();
        file.sync(false)?;
        latencies_ns.push(fsync_start.elapsed().as_nanos() as u64);
    }
    Ok(latencies_ns)
}

/// Writes until `stop`, held to the pacer's rate if there is one; returns the MiB/s it
/// achieved.
fn background_writer(
    mut file: BenchFile,
    pacer: Option<Pacer>,
    stop: &AtomicBool,
) -> io::Result<f64> {
    let chunk = pattern(BACKGROUND_CHUNK, 6);
    let start = Instant::now();
    let mut written = 0u64;
    while !stop.load(Ordering::Relaxed) && !interrupted() {
        file.write_at(written % BACKGROUND_WINDOW_BYTES, &chunk)?;
        written += BACKGROUND_CHUNK as u64;
        if let Some(pacer) = pacer {
            thread::sleep(pacer.pause(written, start.elapsed()));
        }
    }
    Ok(written as f64 / f64::from(1 << 20) / start.elapsed().as_secs_f64())
}

/// Where the 4 KiB writes of `ordered-write` and `io-per-fsync` go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Each write a new block at the end of the file (allocating).
    Append,
    /// Random blocks of a preallocated, already durable 64 MiB file (no allocation).
    Overwrite,
    /// JoJ §3's one commit: nine small writes of 2,576 bytes in all, each to its own
    /// random block of the same durable file, then the sync (one operation).
    SmallWrites,
}

/// The sizes of JoJ's nine small writes (2,576 bytes in all).
const SMALL_WRITES: [usize; 9] = [286, 286, 286, 286, 286, 286, 286, 286, 288];

/// What follows each write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing (orderless); one fdatasync at the end makes the run durable.
    Nothing,
    Fsync,
    Fdatasync,
    /// jext's ordering-only syncs (jext systems only); one fdatasync at the end.
    Fbarrier,
    Fdatabarrier,
}

impl After {
    /// Whether only jext can do it.
    pub fn is_barrier(self) -> bool {
        matches!(self, After::Fbarrier | After::Fdatabarrier)
    }
}

const OVERWRITE_FILE_BYTES: u64 = 64 << 20;

/// `ordered-write` (BarrierFS Fig. 9) and `io-per-fsync`: `count` 4 KiB writes (or groups
/// of JoJ's nine small writes) placed by `placement`, each followed by `after`; the clock
/// covers the writes and the syncs.
pub fn synced_writes(
    sys: &Running,
    placement: Placement,
    after: After,
    count: usize,
) -> io::Result<Measured> {
    let mut file = sys.create("writes", 0)?;
    let writes_per_op = match placement {
        Placement::SmallWrites => SMALL_WRITES.len(),
        Placement::Append | Placement::Overwrite => 1,
    };
    let offsets = match placement {
        Placement::Append => (0..count as u64).map(|i| i * BLOCK as u64).collect(),
        Placement::Overwrite | Placement::SmallWrites => {
            preallocate(&mut file, OVERWRITE_FILE_BYTES)?;
            random_blocks(
                count * writes_per_op,
                OVERWRITE_FILE_BYTES / BLOCK as u64,
                7,
            )
        }
    };
    let block = pattern(BLOCK, 8);
    let (seconds, io) = counted(sys, || {
        let start = Instant::now();
        for op in offsets.chunks(writes_per_op) {
            check_interrupt()?;
            if placement == Placement::SmallWrites {
                // Into the middle of each block, as a database page inside it.
                for (&offset, &len) in op.iter().zip(&SMALL_WRITES) {
                    file.write_at(offset + 1000, &block[..len])?;
                }
            } else {
                file.write_at(op[0], &block)?;
            }
            match after {
                After::Nothing => {}
                After::Fsync => file.sync(false)?,
                After::Fdatasync => file.sync(true)?,
                After::Fbarrier => file.barrier(false)?,
                After::Fdatabarrier => file.barrier(true)?,
            }
        }
        if after == After::Nothing || after.is_barrier() {
            file.sync(true)?;
        }
        Ok(start.elapsed().as_secs_f64())
    })?;
    Ok(Measured::Ops {
        ops: count as u64,
        seconds,
        io,
        daemon: None,
    })
}

/// Writes `bytes` of the file and fsyncs, so later overwrites allocate nothing.
fn preallocate(file: &mut BenchFile, bytes: u64) -> io::Result<()> {
    let chunk = pattern(1 << 20, 9);
    for offset in (0..bytes).step_by(chunk.len()) {
        check_interrupt()?;
        file.write_at(offset, &chunk)?;
    }
    file.sync(false)
}

/// `count` byte offsets of blocks drawn uniformly (and repeatably, by `seed`) from the
/// first `blocks` blocks.
pub fn random_blocks(count: usize, blocks: u64, seed: u64) -> Vec<u64> {
    let mut x = xorshift_state(seed);
    (0..count)
        .map(|_| (xorshift(&mut x) % blocks) * BLOCK as u64)
        .collect()
}

/// `memory`: write `total_bytes` sequentially without any sync (so only writeback and the
/// cache bound keep memory in check), then fsync; the process's resident set and jext's
/// cache are sampled every 64 MiB.
pub fn bounded_memory(sys: &Running, total_bytes: u64) -> io::Result<Measured> {
    const CHUNK: usize = 1 << 20;
    const SAMPLE_EVERY: u64 = 64 << 20;
    let Some(cache_bound_bytes) = sys.cache_bound_bytes() else {
        return Err(io::Error::other("only jext has a cache bound to check"));
    };
    let chunk = pattern(CHUNK, 3);
    let mut file = sys.create("big", 0)?;
    let (mut peak_rss_bytes, mut peak_cache_bytes) = (0, 0);
    let start = Instant::now();
    let mut offset = 0;
    while offset < total_bytes {
        check_interrupt()?;
        file.write_at(offset, &chunk)?;
        offset += CHUNK as u64;
        if offset.is_multiple_of(SAMPLE_EVERY) || offset >= total_bytes {
            peak_rss_bytes = peak_rss_bytes.max(resident_bytes()?);
            peak_cache_bytes = peak_cache_bytes.max(sys.cache_bytes().unwrap_or(0));
        }
    }
    file.sync(false)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Measured::Memory {
        bytes: total_bytes,
        seconds,
        peak_rss_bytes,
        peak_cache_bytes,
        cache_bound_bytes,
    })
}

/// This process's resident set (VmRSS of /proc/self/status).
pub fn resident_bytes() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| io::Error::other("no VmRSS in /proc/self/status"))
}

/// The tree `untar` unpacks (`/usr/include`, as directory and name): the system's C
/// headers, thousands of small files in a deep tree, like a source tree.
const UNTAR_SOURCE: (&str, &str) = ("/usr", "include");

/// `untar`: unpacks a tarball of [`UNTAR_SOURCE`] (made once, in `dir`, outside the
/// clock) onto the mount, then syncs the file system (`Running::sync_mount`), so the figure
/// includes making the tree durable, except on fuse2fs, whose daemon syncfs never reaches.
/// Measures files per second.
pub fn untar(sys: &Running, dir: &Path) -> io::Result<Measured> {
    let point = mounted(sys)?;
    let (tarball, files) = untar_source(dir)?;
    let start = Instant::now();
    let (((), io), daemon) = served(sys, || {
        counted(sys, || {
            run("tar", &["-xf", path_str(&tarball)?, "-C", path_str(point)?])?;
            sys.sync_mount()
        })
    })?;
    Ok(Measured::Ops {
        ops: files,
        seconds: start.elapsed().as_secs_f64(),
        io,
        daemon,
    })
}

/// The tarball and how many entries it holds, made on first use.
fn untar_source(dir: &Path) -> io::Result<(PathBuf, u64)> {
    let tarball = dir.join("jext-bench-untar.tar");
    if !tarball.exists() {
        let partial = dir.join("jext-bench-untar.tar.partial");
        run(
            "tar",
            &[
                "-cf",
                path_str(&partial)?,
                "-C",
                UNTAR_SOURCE.0,
                UNTAR_SOURCE.1,
            ],
        )?;
        std::fs::rename(&partial, &tarball)?;
    }
    let listing = run("tar", &["-tf", path_str(&tarball)?])?;
    Ok((tarball, listing.lines().count() as u64))
}

/// SQLite's journal modes: the write-ahead log, and the three ways of ending a rollback
/// journal (deleting it, truncating it, zeroing its header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqliteJournal {
    Wal,
    Delete,
    Truncate,
    Persist,
}

/// What each transaction of a `sqlite` run does to its rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqlitePhase {
    Insert,
    Update,
    Delete,
}

impl SqliteJournal {
    pub const ALL: [SqliteJournal; 4] = [
        SqliteJournal::Wal,
        SqliteJournal::Delete,
        SqliteJournal::Truncate,
        SqliteJournal::Persist,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SqliteJournal::Wal => "WAL",
            SqliteJournal::Delete => "DELETE",
            SqliteJournal::Truncate => "TRUNCATE",
            SqliteJournal::Persist => "PERSIST",
        }
    }

    /// A rollback journal (a file SQLite writes, syncs and then ends at every commit), as
    /// opposed to the write-ahead log.
    pub fn is_rollback(self) -> bool {
        self != SqliteJournal::Wal
    }
}

impl SqlitePhase {
    pub const ALL: [SqlitePhase; 3] = [
        SqlitePhase::Insert,
        SqlitePhase::Update,
        SqlitePhase::Delete,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SqlitePhase::Insert => "insert",
            SqlitePhase::Update => "update",
            SqlitePhase::Delete => "delete",
        }
    }
}

/// One case of the JoJ paper's SQLite matrix (§3.3): a journal mode, a kind of
/// transaction, and how many rows each transaction touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SqliteCase {
    pub journal: SqliteJournal,
    pub phase: SqlitePhase,
    pub rows_per_transaction: usize,
}

impl SqliteCase {
    /// Every case of `journals` × `transaction sizes` × `phases`, in that nesting (a
    /// journal mode's cases together, each size's three phases in the paper's order).
    pub fn plan(
        journals: &[SqliteJournal],
        rows_per_transaction: &[usize],
        phases: &[SqlitePhase],
    ) -> Vec<SqliteCase> {
        let mut cases = Vec::new();
        for &journal in journals {
            for &rows in rows_per_transaction {
                for &phase in phases {
                    cases.push(SqliteCase {
                        journal,
                        phase,
                        rows_per_transaction: rows,
                    });
                }
            }
        }
        cases
    }

    /// "WAL insert, 1-row txns".
    pub fn label(self) -> String {
        format!(
            "{} {}, {}-row txns",
            self.journal.name(),
            self.phase.name(),
            self.rows_per_transaction
        )
    }
}

/// `sqlite` (JoJ §3.3 and Fig. 2/3, BarrierFS Fig. 15): on `(k INTEGER PRIMARY KEY, v
/// TEXT)` with 100-character values, synchronous=FULL, by one sqlite3 process, `rows`
/// rows are inserted in key order, updated in a random order, or deleted in a random order,
/// `case.rows_per_transaction` to a transaction. The rows an update or a delete needs are
/// inserted first, outside the clock, in one transaction. Measures transactions (the
/// paper's response time per transaction) and the device requests they caused.
pub fn sqlite(sys: &Running, case: SqliteCase, rows: usize) -> io::Result<Measured> {
    let db = sys.sqlite_dir(case.journal.is_rollback())?.join("bench.db");
    let db = path_str(&db)?;
    let settings = format!(
        "PRAGMA journal_mode={}; PRAGMA synchronous=FULL;\n",
        case.journal.name()
    );
    let mut setup = format!("{settings}CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);\n");
    if case.phase != SqlitePhase::Insert {
        setup.push_str(&sqlite_statements(SqlitePhase::Insert, rows, rows));
    }
    sqlite_script(db, &setup, None)?;
    let script = format!(
        "{settings}{}",
        sqlite_statements(case.phase, rows, case.rows_per_transaction)
    );
    let transactions = rows.div_ceil(case.rows_per_transaction.max(1));
    let shim = sys.sync_shim();
    let start = Instant::now();
    let (((), io), daemon) = served(sys, || {
        counted(sys, || {
            sqlite_script(db, &script, shim)?;
            // Syncs turned barriers made nothing durable: the run ends durable, inside the
            // clock, as the others do.
            match shim {
                Some(_) => sys.sync_mount(),
                None => Ok(()),
            }
        })
    })?;
    Ok(Measured::Ops {
        ops: transactions as u64,
        seconds: start.elapsed().as_secs_f64(),
        io,
        daemon,
    })
}

/// The statements of one phase over keys `0..rows`, `per_transaction` rows to a
/// transaction: one statement alone is its own transaction; more go between BEGIN and
/// COMMIT. Inserts go in key order; updates and deletes in a random order, the same in
/// every run (a seeded shuffle), as the paper's.
pub fn sqlite_statements(phase: SqlitePhase, rows: usize, per_transaction: usize) -> String {
    let mut keys: Vec<usize> = (0..rows).collect();
    if phase != SqlitePhase::Insert {
        let mut x = xorshift_state(rows as u64);
        for i in (1..keys.len()).rev() {
            keys.swap(i, (xorshift(&mut x) % (i as u64 + 1)) as usize);
        }
    }
    let statement = |k: usize| match phase {
        SqlitePhase::Insert => format!("INSERT INTO t VALUES({k}, printf('%.100c', 'a'));\n"),
        SqlitePhase::Update => format!("UPDATE t SET v = printf('%.100c', 'b') WHERE k = {k};\n"),
        SqlitePhase::Delete => format!("DELETE FROM t WHERE k = {k};\n"),
    };
    let per_transaction = per_transaction.max(1);
    keys.chunks(per_transaction)
        .map(|chunk| {
            let body: String = chunk.iter().map(|&k| statement(k)).collect();
            if per_transaction == 1 {
                body
            } else {
                format!("BEGIN;\n{body}COMMIT;\n")
            }
        })
        .collect()
}

/// Runs `script` on database `db` with the sqlite3 shell, preloading `shim` if given.
fn sqlite_script(db: &str, script: &str, shim: Option<&Path>) -> io::Result<()> {
    use std::io::Write;
    let mut command = std::process::Command::new("sqlite3");
    if let Some(shim) = shim {
        command.env("LD_PRELOAD", shim);
    }
    let mut child = command
        .arg("-batch")
        .arg(db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| {
            io::Error::other(format!(
                "cannot run sqlite3 (scripts/setup installs it): {e}"
            ))
        })?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(script.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        return Err(io::Error::other(format!("sqlite3 {db} failed: {status}")));
    }
    Ok(())
}

/// Mailboxes each `varmail` thread owns.
const MAILBOXES_PER_THREAD: usize = 100;
/// The size of a message, and of each append.
const MAIL_BYTES: usize = 16 << 10;

/// `varmail` (filebench varmail's shape): `threads` threads, each over its own
/// [`MAILBOXES_PER_THREAD`] files of 16 KiB made beforehand, repeat `cycles` times: delete
/// a file; create it, write a message and fsync; append to another and fsync; read a
/// third whole. Each of the four is an operation; measures operations per second.
pub fn varmail(sys: &Running, threads: usize, cycles: usize) -> io::Result<Measured> {
    let dir = mounted(sys)?.join("mail");
    std::fs::create_dir_all(&dir)?;
    for t in 0..threads {
        for i in 0..MAILBOXES_PER_THREAD {
            std::fs::write(mailbox(&dir, t, i), pattern(MAIL_BYTES, i as u64))?;
        }
    }
    sys.sync_mount()?;
    let start_line = Barrier::new(threads + 1);
    let start = Instant::now();
    let (((), io), daemon) = served(sys, || {
        counted(sys, || {
            thread::scope(|scope| {
                let workers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (dir, start_line) = (&dir, &start_line);
                        scope.spawn(move || {
                            start_line.wait();
                            let mut seed = t as u64 + 1;
                            (0..cycles).try_for_each(|_| mail_cycle(dir, t, &mut seed))
                        })
                    })
                    .collect();
                start_line.wait();
                workers
                    .into_iter()
                    .try_for_each(|w| w.join().expect("a varmail thread panicked"))
            })
        })
    })?;
    Ok(Measured::Ops {
        ops: (4 * threads * cycles) as u64,
        seconds: start.elapsed().as_secs_f64(),
        io,
        daemon,
    })
}

fn mailbox(dir: &Path, thread: usize, index: usize) -> PathBuf {
    dir.join(format!("t{thread}-{index}"))
}

/// One varmail cycle on thread `t`'s mailboxes, picked by the xorshift state `seed`.
pub fn mail_cycle(dir: &Path, t: usize, seed: &mut u64) -> io::Result<()> {
    use std::io::{Read, Write};
    let mut pick = || (xorshift(seed) % MAILBOXES_PER_THREAD as u64) as usize;
    let (fresh, appended, read) = (pick(), pick(), pick());
    let message = pattern(MAIL_BYTES, *seed);
    std::fs::remove_file(mailbox(dir, t, fresh))?;
    let mut f = std::fs::File::create(mailbox(dir, t, fresh))?;
    f.write_all(&message)?;
    f.sync_all()?;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(mailbox(dir, t, appended))?;
    f.write_all(&message)?;
    f.sync_all()?;
    let mut whole = Vec::new();
    std::fs::File::open(mailbox(dir, t, read))?.read_to_end(&mut whole)?;
    Ok(())
}

fn mounted(sys: &Running) -> io::Result<&Path> {
    sys.mount_point()
        .ok_or_else(|| io::Error::other("this experiment needs a mounted file system"))
}

pub fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", path.display())))
}

/// Runs `work` and returns its result with the device requests the system made meanwhile
/// (where they can be counted): the one way every experiment counts requests.
/// How `io-order` keeps 4 KiB random writes in order (BarrierFS Fig. 9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderMode {
    /// P: orderless writes, as many in flight as the queue takes.
    Orderless,
    /// B: every write a barrier write ending its own epoch; on a device without a barrier
    /// write the IO layer keeps each epoch by a flush fence instead (the caller never waits).
    Barrier,
    /// X: Wait-on-Transfer, each write waited for before the next is issued.
    WaitOnTransfer,
    /// XnF: Transfer-and-Flush, each write waited for and then flushed.
    TransferAndFlush,
}

impl OrderMode {
    pub const ALL: [OrderMode; 4] = [
        OrderMode::Orderless,
        OrderMode::Barrier,
        OrderMode::WaitOnTransfer,
        OrderMode::TransferAndFlush,
    ];

    /// The paper's letter.
    pub fn letter(self) -> &'static str {
        match self {
            OrderMode::Orderless => "P",
            OrderMode::Barrier => "B",
            OrderMode::WaitOnTransfer => "X",
            OrderMode::TransferAndFlush => "XnF",
        }
    }

    /// Writes of a run of this mode: Transfer-and-Flush gets a twentieth (a flush per write
    /// makes it slow), never fewer than 20.
    pub fn writes(self, count: usize) -> usize {
        match self {
            OrderMode::TransferAndFlush => (count / 20).max(20),
            _ => count,
        }
    }
}

/// Where `io-order` writes: random 4 KiB blocks in the first 256 MiB of the device.
const IO_ORDER_REGION_BYTES: u64 = 256 << 20;
/// The IO layer's queue depth for `io-order` (the paper's SATA devices; the device's own
/// limit wins where lower).
const IO_ORDER_QUEUE_DEPTH: usize = 32;

/// `io-order` (BarrierFS Fig. 9 and 10): `count` 4 KiB random writes through jext's IO
/// layer in `mode`; IOPS and the queue depth the device saw. Like fio's iodepth, at most
/// twice the queue depth of writes are outstanding at once.
pub fn io_order(sys: &Running, mode: OrderMode, count: usize) -> io::Result<Measured> {
    use jext_io::{Fence, IoConfig, IoFlags, IoQueue, WriteRequest};
    let (device, engine) = sys.block_device()?;
    let config = IoConfig {
        engine,
        queue_depth: IO_ORDER_QUEUE_DEPTH,
    };
    let queue = IoQueue::with_config(device, config).map_err(io::Error::other)?;
    let window = 2 * queue.queue_depth();
    let writes = mode.writes(count);
    let mut x = xorshift_state(11);
    let blocks = IO_ORDER_REGION_BYTES / BLOCK as u64;
    let offsets: Vec<u64> = (0..writes)
        .map(|_| (xorshift(&mut x) % blocks) * BLOCK as u64)
        .collect();
    let data: jext_io::IoBuf = pattern(BLOCK, 12).into();
    let (seconds, io) = counted(sys, || {
        queue.take_stats();
        let start = Instant::now();
        let mut outstanding = std::collections::VecDeque::new();
        for &offset in &offsets {
            check_interrupt()?;
            let request = match mode {
                OrderMode::Barrier => {
                    WriteRequest::barrier(offset, data.clone(), IoFlags::empty(), Fence::Flush)
                }
                _ => WriteRequest::new(offset, data.clone(), IoFlags::empty()),
            };
            let ticket = queue.issue(vec![request]);
            match mode {
                OrderMode::Orderless | OrderMode::Barrier => {
                    outstanding.push_back(ticket);
                    if outstanding.len() >= window {
                        let oldest: jext_io::IoTicket =
                            outstanding.pop_front().expect("the window is full");
                        oldest.wait_transferred().map_err(io::Error::other)?;
                    }
                }
                OrderMode::WaitOnTransfer => ticket.wait_transferred().map_err(io::Error::other)?,
                OrderMode::TransferAndFlush => {
                    ticket.wait_transferred().map_err(io::Error::other)?;
                    queue.flush().map_err(io::Error::other)?;
                }
            }
        }
        for ticket in outstanding {
            ticket.wait_transferred().map_err(io::Error::other)?;
        }
        Ok(start.elapsed().as_secs_f64())
    })?;
    let stats = queue.take_stats();
    Ok(Measured::Queue {
        ops: writes as u64,
        seconds,
        io,
        mean_queue_depth: stats.mean_queue_depth,
        max_queue_depth: stats.max_queue_depth,
        barrier_mode: queue.barrier_mode(),
    })
}

/// Runs `work` and says what jext's daemon served meanwhile, when `sys` is jext's mount.
fn served<T>(
    sys: &Running,
    work: impl FnOnce() -> io::Result<T>,
) -> io::Result<(T, Option<DaemonStats>)> {
    let before = sys.daemon_stats()?;
    let value = work()?;
    let after = sys.daemon_stats()?;
    let daemon = after.zip(before).map(|(a, b)| a.since(&b));
    Ok((value, daemon))
}

fn counted<T>(
    sys: &Running,
    work: impl FnOnce() -> io::Result<T>,
) -> io::Result<(T, Option<IoCounts>)> {
    let before = sys.io()?;
    let value = work()?;
    let io = sys
        .io()?
        .zip(before)
        .map(|(after, before)| after.since(&before));
    Ok((value, io))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mail_cycle_keeps_every_mailbox_and_grows_one() {
        let dir = std::env::temp_dir().join(format!("jext-varmail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..MAILBOXES_PER_THREAD {
            std::fs::write(mailbox(&dir, 0, i), [1u8; 10]).unwrap();
        }
        let mut seed = 7;
        for _ in 0..20 {
            mail_cycle(&dir, 0, &mut seed).unwrap();
        }
        let sizes: Vec<u64> = (0..MAILBOXES_PER_THREAD)
            .map(|i| std::fs::metadata(mailbox(&dir, 0, i)).unwrap().len())
            .collect();
        assert!(
            sizes.iter().any(|&s| s >= 2 * MAIL_BYTES as u64),
            "appends happened"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_sqlite_matrix_runs_every_case_once_in_the_papers_order() {
        let cases = SqliteCase::plan(&SqliteJournal::ALL, &[1, 1000], &SqlitePhase::ALL);
        assert_eq!(cases.len(), 24, "the paper's 24 cases per platform");
        for (i, a) in cases.iter().enumerate() {
            assert!(!cases[i + 1..].contains(a), "{a:?} twice");
        }
        assert_eq!(cases[0].label(), "WAL insert, 1-row txns");
        assert_eq!(cases[5].label(), "WAL delete, 1000-row txns");
        assert!(SqliteJournal::Truncate.is_rollback() && !SqliteJournal::Wal.is_rollback());
    }

    #[test]
    fn sqlite_statements_touch_every_row_once_in_transactions_of_the_asked_size() {
        let keys = |script: &str| -> Vec<usize> {
            script
                .lines()
                .filter(|l| !matches!(*l, "BEGIN;" | "COMMIT;"))
                .map(|l| {
                    let (_, rest) = l
                        .split_once("WHERE k = ")
                        .or_else(|| l.split_once("VALUES("))
                        .unwrap();
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().unwrap()
                })
                .collect()
        };
        let one = sqlite_statements(SqlitePhase::Update, 50, 1);
        assert_eq!(one.lines().count(), 50, "one statement, one transaction");
        assert!(!one.contains("BEGIN"));
        assert!(one
            .lines()
            .all(|l| l.starts_with("UPDATE") && l.ends_with(';')));
        let mut shuffled = keys(&one);
        assert_ne!(
            shuffled,
            (0..50).collect::<Vec<_>>(),
            "updates go in a random order"
        );
        assert_eq!(
            shuffled,
            keys(&sqlite_statements(SqlitePhase::Update, 50, 1))
        );
        shuffled.sort_unstable();
        assert_eq!(shuffled, (0..50).collect::<Vec<_>>());

        let batched = sqlite_statements(SqlitePhase::Delete, 25, 10);
        assert_eq!(batched.matches("BEGIN;").count(), 3);
        assert_eq!(batched.matches("COMMIT;").count(), 3);
        let mut deleted = keys(&batched);
        deleted.sort_unstable();
        assert_eq!(deleted, (0..25).collect::<Vec<_>>());
        let inserts = sqlite_statements(SqlitePhase::Insert, 5, 1);
        assert_eq!(
            keys(&inserts),
            vec![0, 1, 2, 3, 4],
            "inserts go in key order"
        );
        assert!(inserts.contains("'%.100c'"));
    }

    #[test]
    fn patterns_are_neither_zero_nor_flat_and_repeat_by_seed() {
        let a = pattern(4096, 1);
        assert_eq!(a, pattern(4096, 1));
        assert_ne!(a, pattern(4096, 2));
        assert!(a.iter().filter(|&&b| b == a[0]).count() < 100);
    }

    #[test]
    fn dwsl_doubles_its_threads_up_to_the_maximum() {
        assert_eq!(thread_plan(8), vec![1, 2, 4, 8]);
        assert_eq!(thread_plan(6), vec![1, 2, 4, 6]);
        assert_eq!(thread_plan(1), vec![1]);
        assert_eq!(thread_plan(0), vec![1]);
    }

    #[test]
    fn the_pacer_holds_a_writer_to_its_rate() {
        let pacer = Pacer::new(100);
        assert_eq!(pacer.due(0), Duration::ZERO);
        assert_eq!(pacer.due(50 << 20), Duration::from_millis(500));
        assert_eq!(pacer.due(1 << 20), Duration::from_millis(10));
        // Ahead of schedule: sleep the difference; behind: no sleep at all.
        assert_eq!(
            pacer.pause(50 << 20, Duration::from_millis(200)),
            Duration::from_millis(300)
        );
        assert_eq!(
            pacer.pause(50 << 20, Duration::from_secs(2)),
            Duration::ZERO
        );
        // 1 MiB writes at 50 MiB/s: one every 20 ms, 3 GiB due after a minute.
        assert_eq!(Pacer::new(50).due(1 << 20), Duration::from_millis(20));
        assert_eq!(Pacer::new(50).due(3000 << 20), Duration::from_secs(60));
    }

    #[test]
    fn random_blocks_are_aligned_in_range_and_repeatable() {
        let offsets = random_blocks(10_000, 16_384, 7);
        assert_eq!(offsets, random_blocks(10_000, 16_384, 7));
        assert!(offsets
            .iter()
            .all(|&o| o % BLOCK as u64 == 0 && o < 16_384 * BLOCK as u64));
        let mut distinct = offsets.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // 10,000 draws from 16,384 blocks: about 7,400 distinct, far from a short cycle.
        assert!(distinct.len() > 6_000, "{} distinct", distinct.len());
    }

    #[test]
    fn the_resident_set_grows_with_touched_memory() {
        let before = resident_bytes().unwrap();
        let big = pattern(64 << 20, 4);
        let after = resident_bytes().unwrap();
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        std::hint::black_box(big);
    }
}
