//! The explorer: records each workload in each mode, builds its crash states, recovers
//! each with jext and checks it (oracle, `jext fsck`, and on a sample `e2fsck -fn` and,
//! when asked, Linux's own recovery),
//! across `jobs` threads, until the workloads or the time budget run out.
//!
//! A failing state is reported with a [`Reproducer`] whose selection was shrunk: kept
//! writes are dropped one at a time while the state still fails, so what is left is a
//! small set of writes that matter.

use crate::kernel::KernelCheck;
use crate::mode::Mode;
use crate::oracle::{self, data_unit, NameCounts};
use crate::record::{mount_options, record, Recording};
use crate::repro::Reproducer;
use crate::states::{crash_points, selections, Sampling};
use crate::workload::WorkloadId;
use crate::{ace, fixed, generate};
use jext_device::{DurableCursor, Kept, Selection, SimDevice, SimFault};
use jext_fs::{fsck, DataMode, Fs, IJournal, SmallSyncs};
use jext_journal::CommitMode;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to explore and how hard.
#[derive(Clone, Debug)]
pub struct Config {
    pub modes: Vec<Mode>,
    pub sampling: Sampling,
    /// Run `e2fsck -fn` on every n-th state of each worker (1: every state; 0: never).
    pub e2fsck_every: u64,
    pub jobs: usize,
    /// Stop starting new states after this.
    pub deadline: Option<Instant>,
    /// Loop-mount every n-th state of each worker in Linux and compare (0: never; root).
    pub kernel_check_every: u64,
    /// A test-only device lie, to prove the checks catch it.
    pub fault: Option<SimFault>,
    pub seed: u64,
    /// Failures reported in full (all are counted).
    pub max_reports: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            modes: default_modes(),
            sampling: Sampling::default(),
            e2fsck_every: 50,
            kernel_check_every: 0,
            jobs: 1,
            deadline: None,
            fault: None,
            seed: 0,
            max_reports: 20,
        }
    }
}

/// The three data modes with single-I/O commits (the default), then with classic ones,
/// all with byte records (the default); then data=journal with whole-block records,
/// ordered with small synced appends in place (so they go as fast commits), the same with
/// per-core i-transactions, ordered and data=journal with per-core i-transactions that
/// carry the data, and data=adaptive.
pub fn default_modes() -> Vec<Mode> {
    let mut modes: Vec<Mode> = [CommitMode::SingleIo, CommitMode::Classic]
        .into_iter()
        .flat_map(|commit| {
            [DataMode::Ordered, DataMode::Journal, DataMode::Writeback]
                .into_iter()
                .map(move |data| Mode {
                    commit,
                    ..Mode::from(data)
                })
        })
        .collect();
    modes.push(Mode {
        records: jext_journal::RecordMode::Blocks,
        ..Mode::from(DataMode::Journal)
    });
    // Fast commits for every fsync they can carry: in the default mode a small synced
    // append journals its data and commits in full.
    let in_place = Mode {
        small_syncs: SmallSyncs::InPlace,
        ..Mode::from(DataMode::Ordered)
    };
    modes.push(in_place);
    // The paper's per-core rings: with the data written in place before each
    // i-transaction, and with the data carried in it (small synced appends and
    // data=journal files journal their data).
    modes.push(Mode {
        ijournal: IJournal::PerCore,
        ..in_place
    });
    for data in [DataMode::Ordered, DataMode::Journal] {
        modes.push(Mode {
            ijournal: IJournal::PerCore,
            ..Mode::from(data)
        });
    }
    // `data=adaptive`: every workload that syncs and deletes or truncates a file within
    // seconds switches files between modes.
    modes.push(Mode::adaptive());
    modes
}

/// Which workloads, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Every seq-1 workload, the fixed workloads at CI size, a few seq-2 and seq-3.
    Ci,
    /// Seq-1, the fixed workloads at the papers' sizes, then seq-2 and seq-3 samples
    /// without end (for a time budget).
    Long,
}

impl Plan {
    /// The `i`-th workload of the plan, if there is one.
    pub fn workload(self, i: usize) -> Option<WorkloadId> {
        let seq1 = ace::seq1_count();
        if i < seq1 {
            return Some(WorkloadId::AceOne(i));
        }
        let i = i - seq1;
        let fixed: Vec<(&str, usize)> = match self {
            Plan::Ci => fixed::FIXED.to_vec(),
            Plan::Long => fixed::FIXED
                .iter()
                .map(|(name, size)| (*name, long_size(name, *size)))
                .chain((2..12).map(|seed| ("threads", seed)))
                .collect(),
        };
        if let Some((name, size)) = fixed.get(i) {
            return Some(WorkloadId::Fixed {
                name: name.to_string(),
                size: *size,
            });
        }
        let i = i - fixed.len();
        if self == Plan::Ci && i >= 24 {
            return None;
        }
        Some(WorkloadId::AceSampled {
            len: 2 + i % 2,
            seed: (i / 2) as u64,
        })
    }
}

fn long_size(name: &str, ci_size: usize) -> usize {
    match name {
        "odd-fsync" => 1000,
        "append-extents" => 200,
        "deep-path" => 12,
        "sqlite-rollback" | "sqlite-truncate" => 16,
        "sqlite-wal" => 32,
        _ => ci_size,
    }
}

/// Counts for one mode (or for everything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub workloads: usize,
    pub crash_points: usize,
    pub states: usize,
    pub failures: usize,
    pub e2fsck_runs: usize,
    pub kernel_checks: usize,
    /// Fast commits the recordings wrote (fsyncs that committed no transaction).
    pub fast_commits: u64,
}

impl Counts {
    fn add(&mut self, other: &Counts) {
        self.workloads += other.workloads;
        self.crash_points += other.crash_points;
        self.states += other.states;
        self.failures += other.failures;
        self.e2fsck_runs += other.e2fsck_runs;
        self.kernel_checks += other.kernel_checks;
        self.fast_commits += other.fast_commits;
    }
}

/// A failing state, ready to replay.
#[derive(Clone, Debug)]
pub struct Failure {
    pub reproducer: Reproducer,
    pub problems: Vec<String>,
    /// The workload's operations, one per line.
    pub listing: String,
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Summary {
    pub per_mode: Vec<(Mode, Counts)>,
    pub failures: Vec<Failure>,
    /// Workloads that could not even be recorded (a setup failure is an explorer bug).
    pub errors: Vec<String>,
    pub elapsed: Duration,
}

impl Summary {
    pub fn total(&self) -> Counts {
        let mut total = Counts::default();
        for (_, c) in &self.per_mode {
            total.add(c);
        }
        total
    }
}

struct TaskResult {
    counts: Counts,
    failures: Vec<Failure>,
}

/// Explores the workloads of `plan` (or of `only`, when given) in every configured mode.
/// `progress` is called after each workload with the running totals.
pub fn explore(
    plan: Plan,
    only: &[WorkloadId],
    config: &Config,
    progress: &(dyn Fn(&Counts) + Sync),
) -> Summary {
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let summary = Mutex::new(Summary {
        per_mode: config
            .modes
            .iter()
            .map(|m| (*m, Counts::default()))
            .collect(),
        ..Summary::default()
    });
    let modes = config.modes.len().max(1);
    let task = |i: usize| -> Option<(WorkloadId, Mode)> {
        let id = if only.is_empty() {
            plan.workload(i / modes)?
        } else {
            only.get(i / modes)?.clone()
        };
        Some((id, *config.modes.get(i % modes)?))
    };
    let out_of_time = || config.deadline.is_some_and(|d| Instant::now() >= d);
    std::thread::scope(|scope| {
        for _ in 0..config.jobs.max(1) {
            let (next, summary, task) = (&next, &summary, &task);
            scope.spawn(move || {
                let sample = |n| EveryNth { n, seen: 0 };
                let mut checks = Extra {
                    e2fsck: E2fsck::new(),
                    e2fsck_sample: sample(config.e2fsck_every),
                    kernel: None,
                    kernel_sample: sample(config.kernel_check_every),
                };
                if config.kernel_check_every > 0 {
                    match KernelCheck::new() {
                        Ok(k) => checks.kernel = Some(k),
                        Err(e) => summary.lock().expect("a worker panicked").errors.push(e),
                    }
                }
                while !out_of_time() {
                    let Some((id, mode)) = task(next.fetch_add(1, Ordering::SeqCst)) else {
                        break;
                    };
                    let result = explore_one(&id, mode, config, &mut checks, &out_of_time);
                    let mut s = summary.lock().expect("a worker panicked");
                    match result {
                        Ok(r) => {
                            let slot = s.per_mode.iter_mut().find(|(m, _)| *m == mode);
                            slot.expect("mode is configured").1.add(&r.counts);
                            let room = config.max_reports.saturating_sub(s.failures.len());
                            s.failures.extend(r.failures.into_iter().take(room));
                        }
                        Err(e) => s.errors.push(format!("{id} ({mode}): {e}")),
                    }
                    progress(&s.total());
                }
            });
        }
    });
    let mut summary = summary.into_inner().expect("a worker panicked");
    summary.elapsed = started.elapsed();
    summary
}

fn explore_one(
    id: &WorkloadId,
    mode: Mode,
    config: &Config,
    checks: &mut Extra,
    out_of_time: &dyn Fn() -> bool,
) -> Result<TaskResult, String> {
    let workload = generate(id)?;
    let rec = record(&workload, mode, config.fault.clone())
        .map_err(|e| format!("recording failed: {e}"))?;
    let names = NameCounts::of(&rec.timeline);
    let mut rng = StdRng::seed_from_u64(config.seed ^ seed_of(&id.to_string(), mode));
    let torn = config.sampling.torn_writes || config.sampling.every_cut_of_largest_write;
    let unit = data_unit(mode.data, torn);
    let mut cursor = rec.capture.cursor();
    let mut counts = Counts {
        workloads: 1,
        fast_commits: rec.fast_commits,
        ..Counts::default()
    };
    let mut failures = Vec::new();
    for point in crash_points(&rec.capture, &config.sampling, &mut rng) {
        if out_of_time() {
            break;
        }
        counts.crash_points += 1;
        let window = rec.capture.window(point);
        for selection in selections(&window, &config.sampling, &mut rng) {
            let run_e2fsck = checks.e2fsck_sample.due();
            counts.e2fsck_runs += usize::from(run_e2fsck);
            let kernel_due = checks.kernel_sample.due();
            let kernel = checks.kernel.as_ref().filter(|_| kernel_due);
            counts.kernel_checks += usize::from(kernel.is_some());
            let check = Checker {
                rec: &rec,
                names: &names,
                unit,
            };
            let extra = (run_e2fsck.then_some(&mut checks.e2fsck), kernel);
            let problems = check.state(&mut cursor, point, &selection, extra);
            counts.states += 1;
            if problems.is_empty() {
                continue;
            }
            counts.failures += 1;
            if failures.len() < config.max_reports {
                let (selection, problems) = check.shrink(&mut cursor, point, selection, problems);
                failures.push(Failure {
                    reproducer: Reproducer {
                        workload: id.clone(),
                        mode,
                        point,
                        selection: selection.to_string(),
                    },
                    problems,
                    listing: workload.listing(),
                });
            }
        }
    }
    Ok(TaskResult { counts, failures })
}

fn seed_of(text: &str, mode: Mode) -> u64 {
    // FNV-1a: a stable seed per workload and mode, the same on every run and machine.
    format!("{text}/{mode}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
}

/// Checks crash states of one recording.
pub struct Checker<'a> {
    pub rec: &'a Recording,
    pub names: &'a NameCounts,
    pub unit: Option<usize>,
}

impl Checker<'_> {
    /// Recovers the state and runs every check, and those of `extra` (e2fsck, Linux)
    /// when given; returns the problems found.
    pub fn state(
        &self,
        cursor: &mut DurableCursor<'_>,
        point: usize,
        selection: &Selection,
        extra: (Option<&mut E2fsck>, Option<&KernelCheck>),
    ) -> Vec<String> {
        let (e2fsck, kernel) = extra;
        let pristine = kernel.map(|_| cursor.state(point, selection));
        let dev = Arc::new(cursor.state(point, selection));
        let fs = match Fs::open(dev.clone(), mount_options(self.rec.mode)) {
            Ok(fs) => fs,
            Err(e) => return vec![format!("recovery failed: {e}")],
        };
        let (mut problems, ours) = oracle::check(self.rec, self.names, point, &fs, self.unit);
        if let (Some(kernel), Some(pristine)) = (kernel, &pristine) {
            problems.extend(kernel.compare(pristine, self.rec, &ours));
        }
        if let Err(e) = fs.unmount() {
            problems.push(format!("unmount after recovery failed: {e}"));
        }
        drop(fs);
        match fsck(dev.clone()) {
            Ok(report) => {
                problems.extend(report.problems.iter().map(|p| format!("jext fsck: {p}")))
            }
            Err(e) => problems.push(format!("jext fsck could not run: {e}")),
        }
        if let Some(e2fsck) = e2fsck {
            problems.extend(e2fsck.check(&dev));
        }
        problems
    }

    /// Drops kept writes one at a time while the state still fails.
    fn shrink(
        &self,
        cursor: &mut DurableCursor<'_>,
        point: usize,
        mut selection: Selection,
        mut problems: Vec<String>,
    ) -> (Selection, Vec<String>) {
        for i in 0..selection.0.len() {
            if selection.0[i] == Kept::Nothing {
                continue;
            }
            let mut smaller = selection.clone();
            smaller.0[i] = Kept::Nothing;
            if !smaller.respects_epochs(&self.rec.capture.window(point)) {
                continue;
            }
            let still = self.state(cursor, point, &smaller, (None, None));
            if !still.is_empty() {
                selection = smaller;
                problems = still;
            }
        }
        (selection, problems)
    }
}

/// The checks that cost a process, run on a sample of states.
struct Extra {
    e2fsck: E2fsck,
    e2fsck_sample: EveryNth,
    kernel: Option<KernelCheck>,
    kernel_sample: EveryNth,
}

/// Says yes to the first of every `n` calls (never when `n` is 0).
struct EveryNth {
    n: u64,
    seen: u64,
}

impl EveryNth {
    fn due(&mut self) -> bool {
        self.seen += 1;
        self.n > 0 && self.seen % self.n == 1 % self.n
    }
}

/// Runs `e2fsck -fn` through an image file in memory-backed storage when there is some.
pub struct E2fsck {
    image: PathBuf,
}

impl Default for E2fsck {
    fn default() -> Self {
        E2fsck::new()
    }
}

impl E2fsck {
    pub fn new() -> E2fsck {
        // Each checker gets its own image file, even with several explorations in one
        // process (the test harness runs tests on threads).
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = ["/dev/shm", "/tmp"]
            .iter()
            .map(PathBuf::from)
            .find(|d| d.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        E2fsck {
            image: dir.join(format!("jext-crash-{}-{n}.img", std::process::id())),
        }
    }

    /// Problems e2fsck reports on the device's current content.
    pub fn check(&mut self, dev: &SimDevice) -> Vec<String> {
        if let Err(e) = dev.write_current_image(&self.image) {
            return vec![format!(
                "cannot write {} for e2fsck: {e}",
                self.image.display()
            )];
        }
        let problems = e2fsck_image(&self.image);
        let _ = std::fs::remove_file(&self.image);
        problems
    }
}

/// Problems `e2fsck -fn` reports on the image file `image`.
pub(crate) fn e2fsck_image(image: &Path) -> Vec<String> {
    match Command::new("e2fsck").arg("-fn").arg(image).output() {
        Err(e) => vec![format!("cannot run e2fsck (install e2fsprogs): {e}")],
        Ok(out) if out.status.success() => Vec::new(),
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = text.lines().skip(1).take(12).collect();
            vec![format!(
                "e2fsck -fn exit {}: {}",
                out.status.code().unwrap_or(-1),
                lines.join(" | ")
            )]
        }
    }
}
