//! `jext bench`: runs the experiments on every system under test, alternating systems
//! within a run (A B A B …), and reports medians and ratios against Linux ext4
//! `data=ordered` and against the raw device, with the device requests each system caused.
//!
//! Promises: every system is set up fresh (new image, new mkfs) for every repetition of
//! every variant (thread count, background rate, sync kind) and torn down after it; a
//! system that fails is reported and the others still run; figures come only from runs
//! that completed. Benchmarks are commands, never timed tests.

pub mod experiments;
pub mod plot;
pub mod report;
pub mod rig;
pub mod scale;
pub mod stats;
pub mod systems;

use experiments::{
    After, BackgroundWriter, Measured, OrderMode, Placement, SqliteCase, SqliteJournal, SqlitePhase,
};
use jext::{CommitMode, DataMode, SmallSyncs};
use jext_device::Preset;
use jext_io::EngineKind;
use rig::Scratch;
use std::io;
use std::path::PathBuf;
use systems::{Backing, BlockTarget, System};

/// The experiments this harness knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// Sequential write of a large file and one fsync (throughput).
    Seq,
    /// 4 KiB allocating write + fsync, repeated (latency, requests per fsync).
    FsyncLatency,
    /// A long write through jext with memory sampled: the caches stay within their bound.
    Memory,
    /// N threads, each appending 4 KiB + fsync to its own file (aggregate throughput).
    Dwsl,
    /// 80 KiB append + fsync, alone and beside a throttled buffered writer (fsync latency).
    FsyncTail,
    /// 4 KiB random overwrites, orderless vs each followed by fdatasync (IOPS).
    OrderedWrite,
    /// Device requests per fsync and per fdatasync, after appends and after overwrites.
    IoPerFsync,
    /// Unpacking a source tree with tar, then a sync of the file system (files/s); mounted
    /// systems only.
    Untar,
    /// The JoJ paper's SQLite matrix: inserts, updates and deletes in random order, in
    /// one-row and many-row transactions, in WAL, DELETE, TRUNCATE and PERSIST journal
    /// modes, synchronous=FULL (µs per transaction, bytes and flushes per transaction);
    /// mounted systems only.
    Sqlite,
    /// filebench varmail's shape: delete, create+write+fsync, append+fsync, read, over many
    /// small files in a few threads (ops/s); mounted systems only.
    Varmail,
    /// BarrierFS Fig. 9/10 at the block level: 4 KiB random writes orderless, as barrier
    /// writes, with Wait-on-Transfer and with Transfer-and-Flush, through jext's IO layer
    /// on the simulated presets and on real backings (IOPS, queue depth).
    IoOrder,
}

impl Experiment {
    pub const ALL: [Experiment; 11] = [
        Experiment::Seq,
        Experiment::FsyncLatency,
        Experiment::Memory,
        Experiment::Dwsl,
        Experiment::FsyncTail,
        Experiment::OrderedWrite,
        Experiment::IoPerFsync,
        Experiment::Untar,
        Experiment::Sqlite,
        Experiment::Varmail,
        Experiment::IoOrder,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Experiment::Seq => "seq",
            Experiment::FsyncLatency => "fsync-latency",
            Experiment::Memory => "memory",
            Experiment::Dwsl => "dwsl",
            Experiment::FsyncTail => "fsync-tail",
            Experiment::OrderedWrite => "ordered-write",
            Experiment::IoPerFsync => "io-per-fsync",
            Experiment::Untar => "untar",
            Experiment::Sqlite => "sqlite",
            Experiment::Varmail => "varmail",
            Experiment::IoOrder => "io-order",
        }
    }

    /// The settings this experiment runs with, each a run of its own on every system.
    pub fn variants(self, opts: &BenchOptions) -> Vec<Variant> {
        let writes = |placement, afters: &[After]| {
            afters
                .iter()
                .map(|&after| Variant::Writes(placement, after))
                .collect()
        };
        match self {
            Experiment::Seq
            | Experiment::FsyncLatency
            | Experiment::Memory
            | Experiment::Untar
            | Experiment::Varmail => vec![Variant::Only],
            Experiment::Sqlite => SqliteCase::plan(
                &opts.sqlite_journals,
                &opts.sqlite_rows_per_transaction,
                &SqlitePhase::ALL,
            )
            .into_iter()
            .map(Variant::Sqlite)
            .collect(),
            Experiment::Dwsl => experiments::thread_plan(opts.dwsl_max_threads)
                .into_iter()
                .map(Variant::Threads)
                .collect(),
            Experiment::FsyncTail => opts
                .tail_writers
                .iter()
                .map(|&writer| Variant::Background(writer))
                .collect(),
            Experiment::OrderedWrite => {
                let afters = [After::Nothing, After::Fdatasync, After::Fdatabarrier];
                writes(Placement::Overwrite, &afters)
            }
            Experiment::IoPerFsync => {
                let mut variants: Vec<Variant> = [Placement::Append, Placement::Overwrite]
                    .into_iter()
                    .flat_map(|p| {
                        let afters = [
                            After::Fsync,
                            After::Fdatasync,
                            After::Fbarrier,
                            After::Fdatabarrier,
                        ];
                        writes(p, &afters)
                    })
                    .collect();
                variants.push(Variant::Writes(Placement::SmallWrites, After::Fsync));
                variants
            }
            Experiment::IoOrder => OrderMode::ALL.into_iter().map(Variant::Order).collect(),
        }
    }

    /// Whether the experiment means anything for this system.
    pub fn applies_to(self, system: &System) -> bool {
        if matches!(system, System::Block(_)) != (self == Experiment::IoOrder) {
            return false;
        }
        // On a simulated device: what BarrierFS measured at the file system (Table 1,
        // Fig. 9, Fig. 13), where a device's flush and barrier costs decide the figure.
        if system.on_simulator() {
            return matches!(
                self,
                Experiment::FsyncLatency
                    | Experiment::OrderedWrite
                    | Experiment::IoPerFsync
                    | Experiment::Dwsl
                    | Experiment::IoOrder
            );
        }
        match self {
            Experiment::Memory => matches!(system, System::Jext { .. }),
            // Programs need a path: a kernel or FUSE mount.
            // The SQLite matrix's own mounts only where it runs.
            Experiment::Sqlite => matches!(
                system,
                System::Ext4 { .. }
                    | System::JextFuse { .. }
                    | System::JextMount { .. }
                    | System::Fuse2fs
            ),
            Experiment::Untar | Experiment::Varmail => matches!(
                system,
                System::Ext4 { .. }
                    | System::JextFuse { .. }
                    | System::JextMount { .. }
                    | System::Fuse2fs
            ),
            _ => true,
        }
    }

    pub fn parse(text: &str) -> Result<Vec<Experiment>, String> {
        if text == "all" {
            return Ok(Experiment::ALL.to_vec());
        }
        Experiment::ALL
            .iter()
            .find(|e| e.name() == text)
            .map(|e| vec![*e])
            .ok_or_else(|| {
                let known: Vec<_> = Experiment::ALL.iter().map(|e| e.name()).collect();
                format!(
                    "unknown experiment {text:?}; known: {}, all",
                    known.join(", ")
                )
            })
    }
}

/// One setting of an experiment's parameter; figures of different variants never mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The experiment has no parameter.
    Only,
    /// `dwsl`: this many threads.
    Threads(usize),
    /// `fsync-tail`: beside this background writer.
    Background(BackgroundWriter),
    /// `ordered-write`, `io-per-fsync`: 4 KiB writes placed so, each followed by that.
    Writes(Placement, After),
    /// `sqlite`: this journal mode, this kind and size of transaction.
    Sqlite(SqliteCase),
    /// `io-order`: writes kept in order so.
    Order(OrderMode),
}

impl Variant {
    /// A short name for tables ("" when the experiment has no parameter).
    pub fn label(self) -> String {
        match self {
            Variant::Only => String::new(),
            Variant::Threads(1) => "1 thread".into(),
            Variant::Threads(n) => format!("{n} threads"),
            Variant::Background(BackgroundWriter::None) => "alone".into(),
            Variant::Background(BackgroundWriter::Paced(rate)) => format!("{rate} MiB/s writer"),
            Variant::Background(BackgroundWriter::Unpaced) => "unpaced writer".into(),
            Variant::Writes(placement, after) => {
                let placement = match placement {
                    Placement::Append => "append",
                    Placement::Overwrite => "overwrite",
                    Placement::SmallWrites => "9 writes of 2,576 B",
                };
                let after = match after {
                    After::Nothing => "no sync",
                    After::Fsync => "fsync",
                    After::Fdatasync => "fdatasync",
                    After::Fbarrier => "fbarrier",
                    After::Fdatabarrier => "fdatabarrier",
                };
                format!("{placement} + {after}")
            }
            Variant::Sqlite(case) => case.label(),
            Variant::Order(mode) => mode.letter().into(),
        }
    }
}

impl Variant {
    /// Whether this variant can run on `system`: jext's barriers only on jext.
    pub fn applies_to(self, system: &System) -> bool {
        match self {
            Variant::Writes(_, after) if after.is_barrier() => {
                matches!(system, System::Jext { .. } | System::JextFuse { .. })
            }
            // O_DIRECT takes only whole sectors.
            Variant::Writes(Placement::SmallWrites, _) => *system != System::RawLoop,
            _ => true,
        }
    }
}

/// How big a run is.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub experiments: Vec<Experiment>,
    pub repetitions: usize,
    /// Bytes the `seq` experiment writes.
    pub seq_bytes: u64,
    /// Bytes the `memory` experiment writes.
    pub memory_bytes: u64,
    /// Operations of each latency experiment, of `ordered-write` and of `io-per-fsync`.
    pub fsync_count: usize,
    /// `dwsl` runs with 1, 2, 4 … up to this many threads.
    pub dwsl_max_threads: usize,
    /// Appends + fsyncs each `dwsl` thread does.
    pub dwsl_ops_per_thread: usize,
    /// Seconds the `fsync-tail` tester runs (beyond the kernel's 30 s dirty expiry, or
    /// Linux never writes the background writer's data back during the run).
    pub tail_seconds: u64,
    /// The `fsync-tail` background writers, each a variant.
    pub tail_writers: Vec<BackgroundWriter>,
    /// Rows each `sqlite` phase inserts, updates or deletes (the paper: 10,000).
    pub sqlite_rows: usize,
    /// Rows per `sqlite` transaction, each a variant (the paper: 1 and 1,000).
    pub sqlite_rows_per_transaction: Vec<usize>,
    /// The SQLite journal modes run.
    pub sqlite_journals: Vec<SqliteJournal>,
    /// Cycles (four operations each) of each `varmail` thread.
    pub varmail_cycles_per_thread: usize,
    /// 4 KiB writes of each `io-order` run (a twentieth for Transfer-and-Flush).
    pub io_order_writes: usize,
    /// Where scratch images live (their disk is the disk under test).
    pub dir: PathBuf,
    /// The systems under test, in the order they alternate.
    pub systems: Vec<System>,
}

impl BenchOptions {
    pub fn full(experiments: Vec<Experiment>, dir: PathBuf) -> BenchOptions {
        BenchOptions {
            repetitions: 3,
            seq_bytes: 1 << 30,
            memory_bytes: 4 << 30,
            fsync_count: 2000,
            dwsl_max_threads: 8,
            dwsl_ops_per_thread: 300,
            tail_seconds: 60,
            tail_writers: vec![
                BackgroundWriter::None,
                BackgroundWriter::Paced(50),
                BackgroundWriter::Paced(100),
                BackgroundWriter::Paced(200),
                BackgroundWriter::Unpaced,
            ],
            sqlite_rows: 10_000,
            sqlite_rows_per_transaction: vec![1, 1000],
            sqlite_journals: SqliteJournal::ALL.to_vec(),
            varmail_cycles_per_thread: 500,
            io_order_writes: 4000,
            dir,
            systems: systems_for(&experiments, systems(running_as_root())),
            experiments,
        }
    }

    pub fn quick(experiments: Vec<Experiment>, dir: PathBuf) -> BenchOptions {
        BenchOptions {
            repetitions: 1,
            seq_bytes: 256 << 20,
            memory_bytes: 2 << 30,
            fsync_count: 300,
            dwsl_max_threads: 8,
            dwsl_ops_per_thread: 50,
            tail_seconds: 40,
            tail_writers: vec![BackgroundWriter::None, BackgroundWriter::Paced(100)],
            sqlite_rows: QUICK_SQLITE_ROWS,
            sqlite_rows_per_transaction: vec![1, QUICK_SQLITE_ROWS / 10],
            sqlite_journals: SqliteJournal::ALL.to_vec(),
            varmail_cycles_per_thread: 50,
            io_order_writes: 1000,
            dir,
            systems: systems_for(&experiments, headline_systems(running_as_root())),
            experiments,
        }
    }

    /// Keeps only the systems whose name contains `pattern`, or one of its
    /// `|`-separated alternatives (`data=ordered (loop)|percore|fast_commit`).
    pub fn only(&mut self, pattern: &str) {
        self.systems
            .retain(|s| pattern.split('|').any(|p| s.name().contains(p)));
    }
}

/// One completed run, or the reason it did not complete.
#[derive(Debug)]
pub struct Sample {
    pub experiment: Experiment,
    pub variant: Variant,
    pub system: System,
    pub repetition: usize,
    pub outcome: Result<Measured, String>,
}

/// Threads of `varmail` (filebench's default for it is 16 on bigger machines).
const VARMAIL_THREADS: usize = 4;

/// Rows of each `sqlite` phase in `--quick`; transactions of a tenth of them stand for the
/// paper's 1,000-row ones (ten per phase, as its 10,000 rows make).
const QUICK_SQLITE_ROWS: usize = 300;

/// The systems a run alternates: `sqlite` alone runs the JoJ paper's matrix
/// ([`sqlite_systems`]); any other choice runs `others`.
fn systems_for(experiments: &[Experiment], others: Vec<System>) -> Vec<System> {
    if experiments == [Experiment::Sqlite] {
        sqlite_systems(running_as_root())
    } else {
        others
    }
}

/// jext's mount with small synced appends written in place before a fast commit, as ext4
/// does (`small_syncs=in_place`), beside the default that journals them.
pub const JEXT_SMALL_SYNCS_IN_PLACE: System = System::JextMount {
    name: "jext data=ordered,small_syncs=in_place (FUSE)",
    options: "data=ordered,small_syncs=in_place",
    journal: true,
    per_file: false,
    barrier_syncs: false,
};

/// The JoJ paper's reference, "no file system journaling", on jext's front end: jext's
/// mount on an image made without a journal.
pub const JEXT_NO_JOURNAL: System = System::JextMount {
    name: "jext no journal (FUSE)",
    options: "data=ordered",
    journal: false,
    per_file: false,
    barrier_syncs: false,
};

/// The SQLite matrix's systems (issue 14 item 6), all on the same kind of loop device:
/// jext's mount in data=ordered, data=journal with single-I/O and with classic commits,
/// per-file (rollback journals `+j`, the database and a WAL ordered), data=adaptive,
/// data=ordered with SQLite's syncs turned into barriers (BarrierFS Fig. 15's ordering
/// runs; the run ends with `jext sync`), and without a journal; data=ordered over FUSE
/// io_uring, with and without the writeback cache, where the kernel allows it; Linux ext4
/// data=ordered, data=journal and without a journal.
pub fn sqlite_systems(root: bool) -> Vec<System> {
    if !root {
        return Vec::new();
    }
    let fuse = |mode| System::JextFuse {
        mode,
        writeback_cache: false,
        uring: false,
    };
    let mut all = vec![
        fuse(DataMode::Ordered),
        JEXT_SMALL_SYNCS_IN_PLACE,
        // SQLite's small writes are where the kernel's writeback cache pays most.
        System::JextFuse {
            mode: DataMode::Ordered,
            writeback_cache: true,
            uring: false,
        },
        fuse(DataMode::Journal),
        System::JextMount {
            name: "jext data=journal,journal_commit=classic (FUSE)",
            options: "data=journal,journal_commit=classic",
            journal: true,
            per_file: false,
            barrier_syncs: false,
        },
        System::JextMount {
            name: "jext per-file (FUSE)",
            options: "data=ordered",
            journal: true,
            per_file: true,
            barrier_syncs: false,
        },
        System::JextMount {
            name: "jext data=adaptive (FUSE)",
            options: "data=adaptive",
            journal: true,
            per_file: false,
            barrier_syncs: false,
        },
        // BarrierFS Fig. 15's "ordering" runs: SQLite unchanged, its syncs barriers.
        System::JextMount {
            name: "jext data=ordered, syncs as barriers (FUSE)",
            options: "data=ordered",
            journal: true,
            per_file: false,
            barrier_syncs: true,
        },
        JEXT_NO_JOURNAL,
        report::EXT4_ORDERED,
        System::Ext4 {
            options: "data=journal",
            features: "",
        },
        EXT4_NO_JOURNAL,
    ];
    // A transaction is some 20-30 requests, each a round trip: the other transport's
    // are shorter (issue 11).
    for writeback_cache in [false, true] {
        let uring = System::JextFuse {
            mode: DataMode::Ordered,
            writeback_cache,
            uring: true,
        };
        match jext_fuse::uring_unavailable() {
            None => all.push(uring),
            Some(why) => eprintln!("jext bench: {} SKIPPED: {why}", uring.name()),
        }
    }
    all
}

/// Linux ext4 made with `-O ^has_journal`; mounted with its defaults, since ext4 refuses
/// any `data=` option without a journal.
pub const EXT4_NO_JOURNAL: System = System::Ext4 {
    options: "defaults",
    features: "^has_journal",
};

/// The systems of the README's headline table (and of `--quick`): the raw floor, jext's
/// library in its two durable-data modes and its mount, ext4 ordered/journal/fast_commit,
/// and fuse2fs.
pub fn headline_systems(root: bool) -> Vec<System> {
    systems(root)
        .into_iter()
        .filter(|s| match s {
            System::Jext { mode, .. } => *mode != DataMode::Writeback,
            System::JextPercore { .. } | System::JextMount { .. } => false,
            System::Ext4 { options, .. } => matches!(*options, "data=ordered" | "data=journal"),
            System::JextFuse {
                mode,
                writeback_cache,
                uring,
            } => *mode == DataMode::Ordered && !writeback_cache && !uring,
            System::RawFile | System::RawLoop | System::Fuse2fs | System::Block(_) => true,
        })
        .collect()
}

/// Every system, in the order they alternate.
pub fn systems(root: bool) -> Vec<System> {
    let modes = [DataMode::Ordered, DataMode::Journal, DataMode::Writeback];
    let mut all = vec![
        System::RawFile,
        System::jext(DataMode::Ordered, Backing::File),
    ];
    if root {
        all.push(System::RawLoop);
        all.extend(modes.map(|mode| System::jext(mode, Backing::Loop)));
        // Small synced appends written in place before a fast commit, as ext4 does,
        // instead of journaled (`small_syncs=in_place`, issue 12 item 4).
        all.push(System::Jext {
            mode: DataMode::Ordered,
            backing: Backing::Loop,
            fast_commit: true,
            commit: CommitMode::SingleIo,
            records: jext_journal::RecordMode::Bytes,
            small_syncs: SmallSyncs::InPlace,
        });
        // The same without fast commits: what iJournaling changes.
        all.push(System::Jext {
            mode: DataMode::Ordered,
            backing: Backing::Loop,
            fast_commit: false,
            commit: CommitMode::SingleIo,
            records: jext_journal::RecordMode::Bytes,
            small_syncs: SmallSyncs::Journal,
        });
        // The commit the mount option `journal_commit=classic` keeps (issue 14).
        all.extend(
            [DataMode::Ordered, DataMode::Journal].map(|mode| System::Jext {
                mode,
                backing: Backing::Loop,
                fast_commit: true,
                commit: CommitMode::Classic,
                records: jext_journal::RecordMode::Bytes,
                small_syncs: SmallSyncs::Journal,
            }),
        );
        // Whole-block journal records (`journal_records=blocks`) beside the byte records
        // of the default (issue 14 item 4): the bytes each fsync writes, both ways.
        all.extend(
            [DataMode::Ordered, DataMode::Journal].map(|mode| System::Jext {
                mode,
                backing: Backing::Loop,
                fast_commit: true,
                commit: CommitMode::SingleIo,
                records: jext_journal::RecordMode::Blocks,
                small_syncs: SmallSyncs::Journal,
            }),
        );
        // The paper's per-core i-transaction areas instead of the one fast-commit area.
        all.push(System::JextPercore {
            backing: Backing::Loop,
        });
        for options in ["data=ordered", "data=journal", "data=writeback"] {
            all.push(System::Ext4 {
                options,
                features: "",
            });
        }
        all.push(System::Ext4 {
            options: "data=ordered",
            features: "fast_commit",
        });
        for options in [
            "data=writeback,journal_async_commit",
            "data=ordered,nobarrier",
        ] {
            all.push(System::Ext4 {
                options,
                features: "",
            });
        }
        all.extend(modes.map(|mode| System::JextFuse {
            mode,
            writeback_cache: false,
            uring: false,
        }));
        // The kernel's writeback cache merges writes and keeps times and sizes itself.
        all.push(System::JextFuse {
            mode: DataMode::Ordered,
            writeback_cache: true,
            uring: false,
        });
        // The other transport: one system call per request instead of two, on a queue
        // per CPU (issue 11). Only where root has switched it on.
        let uring = System::JextFuse {
            mode: DataMode::Ordered,
            writeback_cache: false,
            uring: true,
        };
        match jext_fuse::uring_unavailable() {
            None => all.push(uring),
            Some(why) => eprintln!("jext bench: {} SKIPPED: {why}", uring.name()),
        }
        all.push(JEXT_SMALL_SYNCS_IN_PLACE);
        all.push(System::Fuse2fs);
    }
    // BarrierFS's device classes under the whole file system.
    all.extend(Preset::ALL.map(|preset| System::jext(DataMode::Ordered, Backing::Sim(preset))));
    // The per-core rings where a flush costs milliseconds, as iJournaling's SSDs: the
    // flushes its fsyncs share are what decide there (no ext4 runs on the simulator).
    all.push(System::JextPercore {
        backing: Backing::Sim(Preset::PlainSsd),
    });
    all.extend(block_systems(root));
    all
}

/// How many times fewer operations a file system experiment runs on a simulated device:
/// its commands take [`systems::SIM_SLOWDOWN`] times their class's time, so a plain SSD's
/// flush takes 50 ms, and 2,000 fsyncs would take minutes per run.
const SIM_OPS_DIVISOR: usize = 5;

/// The devices of `io-order`: the simulated presets, and each real backing through both
/// engines the IO layer has for it.
fn block_systems(root: bool) -> Vec<System> {
    let mut all: Vec<System> = Preset::ALL
        .into_iter()
        .map(|p| System::Block(BlockTarget::Sim(p)))
        .collect();
    let engines = [EngineKind::Uring, EngineKind::Threads];
    if root {
        all.extend(engines.map(|e| System::Block(BlockTarget::Loop(e))));
    }
    all.extend(engines.map(|e| System::Block(BlockTarget::File(e))));
    all
}

/// Who hears about each run as it starts and ends (the command's progress bar).
pub trait Observer {
    /// Run `index` (from 0) of `total`, described as `what`, is about to start.
    fn starting(&self, index: usize, total: usize, what: &str);
    /// It ended so (`verdict` is a figure or the error).
    fn finished(&self, index: usize, total: usize, what: &str, verdict: &str);
}

/// Every (experiment, variant, repetition, system) run, in the order they happen: systems
/// alternate innermost, so a slow drift of the machine touches every system alike.
fn plan(opts: &BenchOptions) -> Vec<(Experiment, Variant, usize, &System)> {
    let mut runs = Vec::new();
    for &experiment in &opts.experiments {
        for variant in experiment.variants(opts) {
            for repetition in 0..opts.repetitions {
                let runs_on = |s: &&System| experiment.applies_to(s) && variant.applies_to(s);
                for system in opts.systems.iter().filter(runs_on) {
                    runs.push((experiment, variant, repetition, system));
                }
            }
        }
    }
    runs
}

/// How many runs `run` will make.
pub fn runs_planned(opts: &BenchOptions) -> usize {
    plan(opts).len()
}

/// Runs everything in `opts`; a run that fails is recorded with its error and the others
/// still run. Only an interrupt (Ctrl-C) stops early, after tearing the current run down.
pub fn run(opts: &BenchOptions, observer: &dyn Observer) -> io::Result<Vec<Sample>> {
    crate::signals::catch_interrupts();
    let scratch = Scratch::new(&opts.dir)?;
    let runs = plan(opts);
    let total = runs.len();
    let mut samples = Vec::with_capacity(total);
    for (index, (experiment, variant, repetition, system)) in runs.into_iter().enumerate() {
        let what = match variant.label() {
            l if l.is_empty() => experiment.name().to_string(),
            l => format!("{} {l}", experiment.name()),
        };
        let what = format!("{what} rep {}: {}", repetition + 1, system.name());
        crate::signals::check_interrupt()?;
        observer.starting(index, total, &what);
        let outcome =
            run_one(experiment, variant, system, &scratch, opts).map_err(|e| e.to_string());
        crate::signals::check_interrupt()?;
        observer.finished(index, total, &what, &report::one_line(&outcome));
        samples.push(Sample {
            experiment,
            variant,
            system: system.clone(),
            repetition,
            outcome,
        });
    }
    Ok(samples)
}

fn run_one(
    experiment: Experiment,
    variant: Variant,
    system: &System,
    scratch: &Scratch,
    opts: &BenchOptions,
) -> io::Result<Measured> {
    let image_bytes = match experiment {
        Experiment::Seq => (opts.seq_bytes * 2).max(1 << 30) + (512 << 20),
        Experiment::Memory => opts.memory_bytes + (1 << 30),
        // The background writer's region starts at 1 GiB on raw systems.
        Experiment::FsyncTail => 2 << 30,
        Experiment::FsyncLatency
        | Experiment::Dwsl
        | Experiment::OrderedWrite
        | Experiment::IoPerFsync
        | Experiment::Untar
        | Experiment::Sqlite
        | Experiment::Varmail
        | Experiment::IoOrder => 1 << 30,
    };
    let running = system.set_up(scratch, image_bytes)?;
    // A simulated flush takes tens of milliseconds (the class's time, slowed down).
    let ops = |count: usize| match system.on_simulator() {
        true => (count / SIM_OPS_DIVISOR).max(1),
        false => count,
    };
    let measured = match (experiment, variant) {
        (Experiment::Seq, _) => experiments::sequential_write(&running, opts.seq_bytes, 1 << 20)?,
        (Experiment::FsyncLatency, _) => {
            experiments::allocating_write_fsync(&running, ops(opts.fsync_count), false)?
        }
        (Experiment::Memory, _) => experiments::bounded_memory(&running, opts.memory_bytes)?,
        (Experiment::Dwsl, Variant::Threads(n)) => {
            experiments::dwsl(&running, n, ops(opts.dwsl_ops_per_thread))?
        }
        (Experiment::FsyncTail, Variant::Background(writer)) => {
            experiments::fsync_tail(&running, opts.tail_seconds, writer)?
        }
        (Experiment::OrderedWrite | Experiment::IoPerFsync, Variant::Writes(placement, after)) => {
            experiments::synced_writes(&running, placement, after, ops(opts.fsync_count))?
        }
        (Experiment::Untar, _) => experiments::untar(&running, &opts.dir)?,
        (Experiment::Varmail, _) => {
            experiments::varmail(&running, VARMAIL_THREADS, opts.varmail_cycles_per_thread)?
        }
        (Experiment::Sqlite, Variant::Sqlite(case)) => {
            experiments::sqlite(&running, case, opts.sqlite_rows)?
        }
        (Experiment::IoOrder, Variant::Order(mode)) => {
            experiments::io_order(&running, mode, opts.io_order_writes)?
        }
        _ => unreachable!("{experiment:?} has no variant {variant:?}"),
    };
    running.finish()?;
    Ok(measured)
}

pub fn running_as_root() -> bool {
    // The effective uid from /proc, so no libc call (and no unsafe) is needed.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Remembers every verdict the harness announced.
    #[derive(Default)]
    struct Heard(RefCell<Vec<String>>);

    impl Observer for Heard {
        fn starting(&self, _: usize, _: usize, _: &str) {}
        fn finished(&self, index: usize, total: usize, what: &str, verdict: &str) {
            self.0
                .borrow_mut()
                .push(format!("{}/{total} {what}: {verdict}", index + 1));
        }
    }

    /// Lines of `text` that mention `path`.
    fn mentions(text: &str, path: &std::path::Path) -> Vec<String> {
        let path = path.to_string_lossy();
        text.lines()
            .filter(|l| l.contains(path.as_ref()))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn a_failing_system_is_reported_the_others_run_and_nothing_is_left_behind() {
        if !running_as_root() {
            eprintln!("skipping: loop devices and mounts need root");
            return;
        }
        let parent = std::env::temp_dir().join(format!("jext-harness-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        let mut opts = BenchOptions::quick(vec![Experiment::FsyncLatency], parent.clone());
        opts.fsync_count = 20;
        // A mount option the kernel refuses: set-up fails after its loop device exists.
        let broken = System::Ext4 {
            options: "data=bogus",
            features: "",
        };
        opts.systems = vec![
            System::RawLoop,
            broken.clone(),
            System::Jext {
                mode: DataMode::Ordered,
                backing: Backing::Loop,
                fast_commit: true,
                commit: CommitMode::SingleIo,
                records: jext_journal::RecordMode::Bytes,
                small_syncs: SmallSyncs::Journal,
            },
            report::EXT4_ORDERED,
            System::Fuse2fs,
        ];
        let heard = Heard::default();
        let samples = run(&opts, &heard).unwrap();

        assert_eq!(samples.len(), 5, "{:?}", heard.0.borrow());
        for s in &samples {
            assert_eq!(
                s.outcome.is_err(),
                s.system == broken,
                "{}: {:?}",
                s.system.name(),
                s.outcome
            );
        }
        let heard = heard.0.borrow();
        assert!(
            heard[1].contains("ext4 data=bogus") && heard[1].contains("FAILED"),
            "{heard:?}"
        );
        assert!(
            report::markdown(&samples, &opts.experiments).contains("- ext4 data=bogus failed: ")
        );

        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        assert_eq!(mentions(&mounts, &parent), Vec::<String>::new());
        let loops = rig::run("losetup", &["-a"]).unwrap();
        assert_eq!(mentions(&loops, &parent), Vec::<String>::new());
        let left: Vec<_> = std::fs::read_dir(&parent).unwrap().collect();
        assert!(left.is_empty(), "scratch left behind: {left:?}");
        std::fs::remove_dir(&parent).unwrap();
    }

    #[test]
    fn the_fsync_tester_pauses_between_fsyncs_beside_an_unpaced_writer() {
        let parent = std::env::temp_dir().join(format!("jext-tail-{}", std::process::id()));
        std::fs::create_dir_all(&parent).unwrap();
        let mut opts = BenchOptions::quick(vec![Experiment::FsyncTail], parent.clone());
        opts.tail_seconds = 1;
        opts.tail_writers = vec![BackgroundWriter::Unpaced];
        opts.systems = vec![System::jext(DataMode::Ordered, Backing::File)];
        let samples = run(&opts, &Heard::default()).unwrap();
        std::fs::remove_dir_all(&parent).unwrap();

        assert_eq!(samples.len(), 1);
        let Ok(Measured::Latency {
            latencies_ns,
            background_mib_per_s,
            ..
        }) = &samples[0].outcome
        else {
            panic!("{:?}", samples[0].outcome);
        };
        // A write, 100 ms asleep, an fsync: at most ten rounds fit in a second.
        assert!(
            (1..=10).contains(&latencies_ns.len()),
            "{} fsyncs in one second",
            latencies_ns.len()
        );
        assert!(background_mib_per_s.is_some_and(|rate| rate > 0.0));
    }

    #[test]
    fn sqlite_alone_runs_the_papers_matrix_on_its_own_systems() {
        let dir = PathBuf::from("/tmp");
        let opts = BenchOptions::full(vec![Experiment::Sqlite], dir.clone());
        if running_as_root() {
            let names: Vec<String> = opts.systems.iter().map(System::name).collect();
            for wanted in [
                "jext data=ordered (FUSE)",
                "jext data=ordered,writeback_cache (FUSE)",
                "jext data=journal (FUSE)",
                "jext data=journal,journal_commit=classic (FUSE)",
                "jext per-file (FUSE)",
                "jext data=adaptive (FUSE)",
                "jext no journal (FUSE)",
                "ext4 data=ordered",
                "ext4 data=journal",
                "ext4 defaults -O ^has_journal",
            ] {
                assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
            }
            assert!(opts
                .systems
                .iter()
                .all(|s| Experiment::Sqlite.applies_to(s)));
        }
        let all = BenchOptions::full(vec![Experiment::Seq, Experiment::Sqlite], dir);
        assert!(!all.systems.contains(&JEXT_NO_JOURNAL));
        // Every jext mount runs the programs; the SQLite matrix's own stay in it.
        assert!(Experiment::Varmail.applies_to(&JEXT_SMALL_SYNCS_IN_PLACE));
    }

    #[test]
    fn programs_run_only_where_there_is_a_mount() {
        for e in [Experiment::Untar, Experiment::Sqlite, Experiment::Varmail] {
            assert!(!e.applies_to(&System::RawLoop));
            assert!(e.applies_to(&System::Fuse2fs));
            assert!(e.applies_to(&System::JextFuse {
                mode: DataMode::Ordered,
                writeback_cache: false,
                uring: false,
            }));
        }
    }

    #[test]
    fn all_names_every_experiment_once() {
        let all = Experiment::parse("all").unwrap();
        assert_eq!(all.len(), 11);
        for e in all {
            assert_eq!(Experiment::parse(e.name()).unwrap(), vec![e]);
        }
        assert!(Experiment::parse("dwls")
            .unwrap_err()
            .contains("fsync-tail"));
    }

    #[test]
    fn variants_of_the_quick_and_full_runs() {
        let dir = PathBuf::from("/tmp");
        let quick = BenchOptions::quick(Vec::new(), dir.clone());
        let full = BenchOptions::full(Vec::new(), dir);
        let labels = |e: Experiment, o: &BenchOptions| -> Vec<String> {
            e.variants(o).into_iter().map(Variant::label).collect()
        };
        assert_eq!(
            labels(Experiment::Dwsl, &quick),
            ["1 thread", "2 threads", "4 threads", "8 threads"]
        );
        assert_eq!(
            labels(Experiment::FsyncTail, &quick),
            ["alone", "100 MiB/s writer"]
        );
        assert_eq!(
            labels(Experiment::FsyncTail, &full),
            [
                "alone",
                "50 MiB/s writer",
                "100 MiB/s writer",
                "200 MiB/s writer",
                "unpaced writer"
            ]
        );
        assert_eq!(
            labels(Experiment::OrderedWrite, &full),
            [
                "overwrite + no sync",
                "overwrite + fdatasync",
                "overwrite + fdatabarrier"
            ]
        );
        let barrier = Variant::Writes(Placement::Overwrite, After::Fdatabarrier);
        let ext4 = System::Ext4 {
            options: "data=ordered",
            features: "",
        };
        assert!(!barrier.applies_to(&ext4));
        assert!(barrier.applies_to(&System::JextFuse {
            mode: DataMode::Ordered,
            writeback_cache: false,
            uring: false,
        }));
        assert_eq!(
            labels(Experiment::IoPerFsync, &quick),
            [
                "append + fsync",
                "append + fdatasync",
                "append + fbarrier",
                "append + fdatabarrier",
                "overwrite + fsync",
                "overwrite + fdatasync",
                "overwrite + fbarrier",
                "overwrite + fdatabarrier",
                "9 writes of 2,576 B + fsync"
            ]
        );
        assert_eq!(labels(Experiment::Seq, &quick), [""]);
        let sqlite = labels(Experiment::Sqlite, &quick);
        assert_eq!(sqlite.len(), 24, "{sqlite:?}");
        assert_eq!(
            sqlite[..6],
            [
                "WAL insert, 1-row txns",
                "WAL update, 1-row txns",
                "WAL delete, 1-row txns",
                "WAL insert, 30-row txns",
                "WAL update, 30-row txns",
                "WAL delete, 30-row txns",
            ]
        );
        assert_eq!(sqlite[23], "PERSIST delete, 30-row txns");
        assert_eq!(labels(Experiment::Sqlite, &full).len(), 24);
        assert_eq!(full.sqlite_rows, 10_000);
    }
}
