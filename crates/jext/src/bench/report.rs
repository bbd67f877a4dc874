//! Turns samples into tables: the terminal and markdown table (the same text), and JSON
//! with every run's summary for tools.
//!
//! Promises: a ratio is printed only when both sides completed in this run; a failed
//! system shows its error instead of figures. Must never mix figures of different
//! experiments or invent a value for a run that did not complete.

use super::experiments::Measured;
use super::stats::{cdf_us, median, ratio, LatencySummary};
use super::systems::{Backing, IoCounts, System};
use super::{Experiment, Sample, Variant};
use jext_fuse::requests::DaemonStats;
use serde_json::{json, Value};
use std::fmt::Write;

/// A progress line's verdict on one run.
pub fn one_line(outcome: &Result<Measured, String>) -> String {
    match outcome {
        Ok(Measured::Throughput { bytes, seconds, .. }) => {
            format!("{:.0} MiB/s", mib(*bytes) / seconds)
        }
        Ok(Measured::Latency {
            latencies_ns,
            background_mib_per_s,
            ..
        }) => match LatencySummary::of_ns(latencies_ns) {
            Some(s) => {
                let writer = background_mib_per_s
                    .map_or(String::new(), |r| format!(", writer at {r:.0} MiB/s"));
                format!("mean {:.0} µs, p99 {:.0} µs{writer}", s.mean_us, s.p99_us)
            }
            None => "no samples".into(),
        },
        Ok(Measured::Ops { ops, seconds, .. }) => format!("{:.0} ops/s", *ops as f64 / seconds),
        Ok(Measured::Queue {
            ops,
            seconds,
            mean_queue_depth,
            max_queue_depth,
            ..
        }) => format!(
            "{:.0} IOPS, queue depth {mean_queue_depth:.1} (max {max_queue_depth})",
            *ops as f64 / seconds
        ),
        Ok(Measured::Memory {
            bytes,
            seconds,
            peak_rss_bytes,
            ..
        }) => {
            format!(
                "{:.0} MiB/s, peak RSS {:.0} MiB",
                mib(*bytes) / seconds,
                mib(*peak_rss_bytes)
            )
        }
        Err(e) => format!("FAILED: {e}"),
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// What all repetitions of one system in one variant of an experiment add up to.
struct Aggregate<'a> {
    system: &'a System,
    /// Median MiB/s over repetitions (seq).
    mib_per_s: Option<f64>,
    /// Median operations per second over repetitions (dwsl, ordered-write, io-per-fsync).
    ops_per_sec: Option<f64>,
    /// All latency samples of all repetitions together.
    latency: Option<LatencySummary>,
    /// Median rate the background writer achieved (fsync-tail).
    background_mib_per_s: Option<f64>,
    /// Requests summed over repetitions, and the operations they served.
    io: Option<(IoCounts, u64)>,
    /// Median mean queue depth, largest queue depth, and whether barrier writes kept the
    /// order (io-order).
    queue: Option<(f64, usize, bool)>,
    /// What jext's daemon served, summed over repetitions, and the operations it served.
    daemon: Option<(DaemonStats, u64)>,
    errors: Vec<String>,
}

fn aggregate(samples: &[Sample], experiment: Experiment, variant: Variant) -> Vec<Aggregate<'_>> {
    let mut systems: Vec<&System> = Vec::new();
    for s in samples.iter().filter(|s| s.experiment == experiment) {
        if !systems.contains(&&s.system) {
            systems.push(&s.system);
        }
    }
    systems
        .into_iter()
        .map(|system| aggregate_one(samples, experiment, variant, system))
        .collect()
}

/// The variants of an experiment found in the samples, in the order they ran.
pub fn variants_of(samples: &[Sample], experiment: Experiment) -> Vec<Variant> {
    let mut variants = Vec::new();
    for s in samples.iter().filter(|s| s.experiment == experiment) {
        if !variants.contains(&s.variant) {
            variants.push(s.variant);
        }
    }
    variants
}

fn aggregate_one<'a>(
    samples: &'a [Sample],
    experiment: Experiment,
    variant: Variant,
    system: &'a System,
) -> Aggregate<'a> {
    let mut rates = Vec::new();
    let mut op_rates = Vec::new();
    let mut background_rates = Vec::new();
    let mut latencies = Vec::new();
    let mut io_sum: Option<IoCounts> = Some(IoCounts {
        fua_writes: Some(0),
        ..IoCounts::default()
    });
    let mut ops = 0u64;
    let mut errors = Vec::new();
    let mut depths = Vec::new();
    let mut max_depth = 0;
    let mut by_barrier = false;
    let mut daemon: Option<(DaemonStats, u64)> = None;
    for s in samples
        .iter()
        .filter(|s| s.experiment == experiment && s.variant == variant && &s.system == system)
    {
        let io = match &s.outcome {
            Ok(Measured::Throughput { bytes, seconds, io }) => {
                rates.push(mib(*bytes) / seconds);
                ops += 1;
                io
            }
            Ok(Measured::Latency {
                latencies_ns,
                io,
                background_mib_per_s,
            }) => {
                latencies.extend_from_slice(latencies_ns);
                background_rates.extend(*background_mib_per_s);
                ops += latencies_ns.len() as u64;
                io
            }
            Ok(Measured::Ops {
                ops: done,
                seconds,
                io,
                daemon: served,
            }) => {
                op_rates.push(*done as f64 / seconds);
                ops += done;
                if let Some(served) = served {
                    let (sum, sum_ops) = daemon.get_or_insert_with(Default::default);
                    *sum = sum.plus(served);
                    *sum_ops += done;
                }
                io
            }
            Ok(Measured::Queue {
                ops: done,
                seconds,
                io,
                mean_queue_depth,
                max_queue_depth,
                barrier_mode,
            }) => {
                op_rates.push(*done as f64 / seconds);
                ops += done;
                depths.push(*mean_queue_depth);
                max_depth = max_depth.max(*max_queue_depth);
                by_barrier = *barrier_mode;
                io
            }
            // Memory runs have their own table, drawn from the samples directly.
            Ok(Measured::Memory { .. }) => continue,
            Err(e) => {
                errors.push(e.clone());
                continue;
            }
        };
        io_sum = io_sum.zip(*io).map(|(a, b)| IoCounts {
            writes: a.writes + b.writes,
            write_bytes: a.write_bytes + b.write_bytes,
            flushes: a.flushes + b.flushes,
            fua_writes: a.fua_writes.zip(b.fua_writes).map(|(x, y)| x + y),
        });
    }
    Aggregate {
        system,
        mib_per_s: median(&rates),
        ops_per_sec: median(&op_rates),
        latency: LatencySummary::of_ns(&latencies),
        background_mib_per_s: median(&background_rates),
        io: io_sum.filter(|_| ops > 0).map(|io| (io, ops)),
        queue: median(&depths).map(|d| (d, max_depth, by_barrier)),
        daemon,
        errors,
    }
}

fn reference<'a>(rows: &'a [Aggregate<'a>], wanted: &System) -> Option<&'a Aggregate<'a>> {
    rows.iter().find(|r| r.system == wanted)
}

/// A reference figure from real storage (ext4, the raw loop device), as `row` may be
/// compared with it: never a system on a simulated device.
fn real_reference(row: &System, figure: Option<f64>) -> Option<f64> {
    figure.filter(|_| !row.on_simulator())
}

pub const EXT4_ORDERED: System = System::Ext4 {
    options: "data=ordered",
    features: "",
};

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The figure an experiment's charts compare, and which way is better.
pub struct Metric {
    pub unit: &'static str,
    pub higher_is_better: bool,
}

/// The headline figure of each experiment (none for `memory`, which has no ratio).
pub fn metric(experiment: Experiment) -> Option<Metric> {
    let (unit, higher_is_better) = match experiment {
        // io-order compares ordering modes with each other, not systems with ext4.
        Experiment::Memory | Experiment::IoOrder => return None,
        Experiment::Seq => ("MiB/s", true),
        Experiment::FsyncLatency | Experiment::FsyncTail => ("mean µs per fsync", false),
        Experiment::Sqlite => ("µs per transaction", false),
        Experiment::Untar => ("files/s", true),
        Experiment::Dwsl
        | Experiment::OrderedWrite
        | Experiment::IoPerFsync
        | Experiment::Varmail => ("ops/s", true),
    };
    Some(Metric {
        unit,
        higher_is_better,
    })
}

/// One system's headline figure in one variant (median or pooled over repetitions), and
/// that figure divided by ext4 data=ordered's in the same variant.
pub struct Headline {
    pub system: System,
    pub value: Option<f64>,
    pub vs_ext4: Option<f64>,
}

/// The headline figures of every variant of `experiment`, systems in the order they ran.
pub fn headlines(samples: &[Sample], experiment: Experiment) -> Vec<(Variant, Vec<Headline>)> {
    let figure = |row: &Aggregate| match experiment {
        Experiment::Memory => None,
        Experiment::Seq => row.mib_per_s,
        Experiment::FsyncLatency | Experiment::FsyncTail => row.latency.as_ref().map(|l| l.mean_us),
        Experiment::Sqlite => row.ops_per_sec.map(|rate| 1e6 / rate),
        _ => row.ops_per_sec,
    };
    variants_of(samples, experiment)
        .into_iter()
        .map(|variant| {
            let rows = aggregate(samples, experiment, variant);
            let ext4 = reference(&rows, &EXT4_ORDERED).and_then(figure);
            let lines = rows
                .iter()
                .map(|row| {
                    let value = figure(row);
                    Headline {
                        system: row.system.clone(),
                        value,
                        vs_ext4: value.and_then(|v| ratio(v, real_reference(row.system, ext4))),
                    }
                })
                .collect();
            (variant, lines)
        })
        .collect()
}

/// The markdown tables of every experiment in the samples.
pub fn markdown(samples: &[Sample], experiments: &[Experiment]) -> String {
    let mut out = String::new();
    for &experiment in experiments {
        let variants = variants_of(samples, experiment);
        let grid: Vec<(Variant, Vec<Aggregate>)> = variants
            .iter()
            .map(|&v| (v, aggregate(samples, experiment, v)))
            .collect();
        let only = || aggregate(samples, experiment, Variant::Only);
        match experiment {
            Experiment::Seq => seq_table(&mut out, &only()),
            Experiment::FsyncLatency => latency_table(&mut out, &only()),
            Experiment::Memory => memory_table(&mut out, samples),
            Experiment::Dwsl => ops_grid(
                &mut out,
                "dwsl: N threads, each appending 4 KiB + fsync to its own file (fsyncs/s, all threads)",
                &grid,
            ),
            Experiment::FsyncTail => tail_table(&mut out, &grid),
            Experiment::OrderedWrite => ops_grid(
                &mut out,
                "ordered-write: 4 KiB random overwrites in a durable 64 MiB file (IOPS; \"no sync\" ends with one fdatasync)",
                &grid,
            ),
            Experiment::IoPerFsync => io_per_sync_table(&mut out, &grid),
            Experiment::Untar => {
                rate_table(
                    &mut out,
                    "untar: unpacking /usr/include with tar, then a sync of the file system (files/s; \
                     `jext sync` for jext's mount; fuse2fs's figure leaves data not yet durable, as \
                     syncfs never reaches its daemon)",
                    &grid,
                );
                daemon_table(&mut out, "unpacked entry", &grid);
            }
            Experiment::Varmail => {
                rate_table(
                    &mut out,
                    "varmail: 4 threads of delete, create+write+fsync, append+fsync, read over 16 KiB files (ops/s)",
                    &grid,
                );
                daemon_table(&mut out, "operation", &grid);
            }
            Experiment::Sqlite => sqlite_tables(&mut out, &grid),
            Experiment::IoOrder => io_order_table(&mut out, &grid),
        }
        // The SQLite matrix names each failing system once, over all its cases.
        let per_variant_failures = experiment != Experiment::Sqlite;
        for (variant, rows) in grid.iter().filter(|_| per_variant_failures) {
            for row in rows.iter().filter(|r| !r.errors.is_empty()) {
                let label = variant.label();
                let label = if label.is_empty() {
                    label
                } else {
                    format!(" ({label})")
                };
                let _ = writeln!(
                    out,
                    "- {}{label} failed: {}",
                    row.system.name(),
                    row.errors.join("; ")
                );
            }
        }
        out.push('\n');
    }
    out
}

/// One case of the SQLite matrix and every system's figures in it.
type SqliteRows<'a> = (super::experiments::SqliteCase, &'a Vec<Aggregate<'a>>);

/// The SQLite matrix (JoJ §3.3): a table per journal mode and transaction size, with each
/// phase's µs per transaction against jext without a journal (the paper's reference, "no
/// file system journaling") and KiB written and flushes per transaction; then every
/// system against that reference over all cases (the paper's target: within 6%), and
/// each failing system once.
fn sqlite_tables(out: &mut String, grid: &[(Variant, Vec<Aggregate>)]) {
    let cases: Vec<SqliteRows> = grid
        .iter()
        .filter_map(|(v, rows)| match v {
            Variant::Sqlite(case) => Some((*case, rows)),
            _ => None,
        })
        .collect();
    let Some((_, first_rows)) = cases.first() else {
        return;
    };
    let systems: Vec<&System> = first_rows.iter().map(|r| r.system).collect();
    let micros = |rows: &[Aggregate], system: &System| {
        reference(rows, system)
            .and_then(|r| r.ops_per_sec)
            .map(|rate| 1e6 / rate)
    };
    let reference_system = super::JEXT_NO_JOURNAL;
    let _ = writeln!(
        out,
        "### sqlite: µs per transaction (× {}), synchronous=FULL\n\n\
         Each cell: µs per transaction and its ratio to {} in the same case (above 1 is \
         slower); then KiB written and flushes per transaction, counted at the loop device.\n",
        reference_system.name(),
        reference_system.name()
    );
    let mut groups: Vec<(String, Vec<SqliteRows>)> = Vec::new();
    for (case, rows) in &cases {
        let title = format!(
            "{}, {}-row transactions",
            case.journal.name(),
            case.rows_per_transaction
        );
        match groups.last_mut() {
            Some((t, members)) if *t == title => members.push((*case, rows)),
            _ => groups.push((title, vec![(*case, rows)])),
        }
    }
    for (title, members) in &groups {
        let phases: Vec<&str> = members.iter().map(|(c, _)| c.phase.name()).collect();
        let _ = writeln!(out, "#### {title}\n");
        let _ = writeln!(
            out,
            "| system | {} | {} |",
            phases.join(" | "),
            phases
                .iter()
                .map(|p| format!("{p} KiB / flushes"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(out, "|---|{}", "---:|".repeat(phases.len() * 2));
        for system in &systems {
            let times: Vec<String> = members
                .iter()
                .map(|(_, rows)| {
                    let nj = micros(rows, &reference_system);
                    micros(rows, system).map_or("–".into(), |us| {
                        format!("{us:.0} ({})", fmt_ratio(ratio(us, nj)))
                    })
                })
                .collect();
            let io: Vec<String> = members
                .iter()
                .map(|(_, rows)| {
                    let cells = io_per_op_cells(reference(rows, system).and_then(|r| r.io));
                    format!("{} / {}", cells[1], cells[2])
                })
                .collect();
            let _ = writeln!(
                out,
                "| {} | {} | {} |",
                system.name(),
                times.join(" | "),
                io.join(" | ")
            );
        }
        out.push('\n');
    }
    let _ = writeln!(
        out,
        "#### Every case against {} (the paper's target for per-file and adaptive: within 6%)\n\n\
         | system | cases | geometric mean × | worst × (case) | cases within 6% | geometric mean × ext4 ordered |\n\
         |---|---:|---:|---|---:|---:|",
        reference_system.name()
    );
    let geometric_mean = |ratios: &[f64]| {
        (!ratios.is_empty())
            .then(|| (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp())
    };
    for system in &systems {
        let mut against_reference = Vec::new();
        let mut worst: Option<(f64, String)> = None;
        let mut against_ext4 = Vec::new();
        for (case, rows) in &cases {
            let Some(us) = micros(rows, system) else {
                continue;
            };
            if let Some(r) = ratio(us, micros(rows, &reference_system)) {
                against_reference.push(r);
                if worst.as_ref().is_none_or(|(w, _)| r > *w) {
                    worst = Some((r, case.label()));
                }
            }
            against_ext4.extend(ratio(us, micros(rows, &EXT4_ORDERED)));
        }
        let within = against_reference.iter().filter(|r| **r <= 1.06).count();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {within} | {} |",
            system.name(),
            against_reference.len(),
            fmt_ratio(geometric_mean(&against_reference)),
            worst.map_or("–".into(), |(w, case)| format!("{w:.2}× ({case})")),
            fmt_ratio(geometric_mean(&against_ext4)),
        );
    }
    for system in &systems {
        let mut errors: Vec<&String> = Vec::new();
        let mut failed = 0;
        for (_, rows) in &cases {
            if let Some(row) = reference(rows, system).filter(|r| !r.errors.is_empty()) {
                failed += 1;
                for e in &row.errors {
                    if !errors.contains(&e) {
                        errors.push(e);
                    }
                }
            }
        }
        if failed > 0 {
            let errors: Vec<&str> = errors.iter().map(|e| e.as_str()).collect();
            let _ = writeln!(
                out,
                "- {} failed in {failed} of {} cases: {}",
                system.name(),
                cases.len(),
                errors.join("; ")
            );
        }
    }
}

/// Writes, KiB written, flushes and FUA writes per operation, or dashes where the system
/// cannot count them.
fn io_per_op_cells(io: Option<(IoCounts, u64)>) -> [String; 4] {
    let per_op = |n: u64, ops: u64| format!("{:.2}", n as f64 / ops as f64);
    match io {
        Some((io, ops)) => [
            per_op(io.writes, ops),
            format!("{:.1}", io.write_bytes as f64 / 1024.0 / ops as f64),
            per_op(io.flushes, ops),
            io.fua_writes.map_or("–".into(), |f| per_op(f, ops)),
        ],
        None => ["–".into(), "–".into(), "–".into(), "–".into()],
    }
}

/// One column per variant: the rate and its ratio to ext4 data=ordered in the same variant.
fn rate_table(out: &mut String, title: &str, grid: &[(Variant, Vec<Aggregate>)]) {
    let Some((_, first_rows)) = grid.first() else {
        return;
    };
    let labels: Vec<String> = grid
        .iter()
        .map(|(v, _)| match v.label() {
            l if l.is_empty() => "value (× ext4 ordered)".to_string(),
            l => format!("{l} (× ext4)"),
        })
        .collect();
    let _ = writeln!(out, "### {title}\n");
    let _ = writeln!(out, "| system | {} |", labels.join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(labels.len()));
    let rate =
        |rows: &[Aggregate], system: &System| reference(rows, system).and_then(|r| r.ops_per_sec);
    for row in first_rows {
        let cells: Vec<String> = grid
            .iter()
            .map(|(_, rows)| {
                let (Some(mine), ext4) = (rate(rows, row.system), rate(rows, &EXT4_ORDERED)) else {
                    return "–".to_string();
                };
                let ext4 = real_reference(row.system, ext4);
                format!("{mine:.0} ({})", fmt_ratio(ratio(mine, ext4)))
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", row.system.name(), cells.join(" | "));
    }
}

/// What jext's daemon did per operation, where a run counted it: FUSE round trips, the
/// requests that made most of them, context switches and CPU time.
fn daemon_table(out: &mut String, what: &str, grid: &[(Variant, Vec<Aggregate>)]) {
    let rows: Vec<(String, &Aggregate)> = grid
        .iter()
        .flat_map(|(variant, rows)| rows.iter().map(move |r| (variant.label(), r)))
        .filter(|(_, r)| r.daemon.is_some())
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nWhat jext's daemon served per {what} (all repetitions):\n\n\
         | system | FUSE requests | context switches | CPU µs | most frequent requests |\n|---|---:|---:|---:|---|"
    );
    for (label, row) in rows {
        let (d, ops) = row.daemon.as_ref().expect("filtered");
        let per = |n: u64| n as f64 / (*ops).max(1) as f64;
        let mut by_count: Vec<(&String, &u64)> = d.requests.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        let top: Vec<String> = by_count
            .iter()
            .take(6)
            .map(|(name, n)| format!("{name} {:.2}", per(**n)))
            .collect();
        let name = match label.as_str() {
            "" => row.system.name(),
            l => format!("{} ({l})", row.system.name()),
        };
        let _ = writeln!(
            out,
            "| {name} | {:.2} | {:.2} | {:.0} | {} |",
            per(d.total_requests()),
            per(d.context_switches()),
            per(d.cpu_micros),
            top.join(", ")
        );
    }
}

fn ops_grid(out: &mut String, title: &str, grid: &[(Variant, Vec<Aggregate>)]) {
    let (Some((first, _)), Some((last, last_rows))) = (grid.first(), grid.last()) else {
        return;
    };
    let labels: Vec<String> = grid.iter().map(|(v, _)| v.label()).collect();
    let _ = writeln!(out, "### {title}\n");
    let _ = writeln!(
        out,
        "| system | {} | {} ÷ {} | {} × ext4 ordered |",
        labels.join(" | "),
        last.label(),
        first.label(),
        last.label()
    );
    let _ = writeln!(out, "|---|{}---:|---:|", "---:|".repeat(labels.len()));
    let rate =
        |rows: &[Aggregate], system: &System| reference(rows, system).and_then(|r| r.ops_per_sec);
    let ext4 = rate(last_rows, &EXT4_ORDERED);
    for row in &grid[0].1 {
        let rates: Vec<Option<f64>> = grid
            .iter()
            .map(|(_, rows)| rate(rows, row.system))
            .collect();
        if rates.iter().all(Option::is_none) {
            continue;
        }
        let cells: Vec<String> = rates
            .iter()
            .map(|r| r.map_or("–".into(), |r| format!("{r:.0}")))
            .collect();
        let (head, tail) = (rates[0], rates[rates.len() - 1]);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            row.system.name(),
            cells.join(" | "),
            fmt_ratio(tail.and_then(|t| ratio(t, head))),
            fmt_ratio(tail.and_then(|t| ratio(t, real_reference(row.system, ext4)))),
        );
    }
}

fn tail_table(out: &mut String, grid: &[(Variant, Vec<Aggregate>)]) {
    let _ = writeln!(
        out,
        "### fsync-tail: 80 KiB append, 100 ms pause, fsync, beside a buffered writer (fsync alone timed)\n"
    );
    // Device KiB per fsync includes whatever of the writer's data writeback sent meanwhile:
    // it shows whether the writer reached the device or stayed in a cache.
    let _ = writeln!(out, "| system | background | writer MiB/s | device KiB/fsync | mean µs | p50 | p95 | p99 | p99.9 | mean × ext4 ordered | p99 × ext4 ordered |");
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (variant, rows) in grid {
        let ext4 = reference(rows, &EXT4_ORDERED).and_then(|r| r.latency.as_ref());
        for row in rows {
            let Some(l) = &row.latency else { continue };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} |",
                row.system.name(),
                variant.label(),
                row.background_mib_per_s
                    .map_or("–".into(), |r| format!("{r:.0}")),
                io_per_op_cells(row.io)[1],
                l.mean_us,
                l.p50_us,
                l.p95_us,
                l.p99_us,
                l.p999_us,
                fmt_ratio(ratio(l.mean_us, ext4.map(|e| e.mean_us))),
                fmt_ratio(ratio(l.p99_us, ext4.map(|e| e.p99_us))),
            );
        }
    }
}

fn io_per_sync_table(out: &mut String, grid: &[(Variant, Vec<Aggregate>)]) {
    let _ = writeln!(
        out,
        "### io-per-fsync: device requests per 4 KiB write + sync (appends allocate; overwrites hit a durable 64 MiB file)\n"
    );
    let _ = writeln!(
        out,
        "| system | workload | ops/s | writes/sync | KiB/sync | flushes/sync | FUA/sync |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|");
    for (variant, rows) in grid {
        for row in rows {
            let Some(rate) = row.ops_per_sec else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {rate:.0} | {} |",
                row.system.name(),
                variant.label(),
                io_per_op_cells(row.io).join(" | "),
            );
        }
    }
}

/// io-order: per device, P's IOPS, every mode as a ratio to P, the queue depth of each, and
/// flushes per write of the barrier mode (0 where barrier writes kept the order).
fn io_order_table(out: &mut String, grid: &[(Variant, Vec<Aggregate>)]) {
    let _ = writeln!(
        out,
        "### io-order: 4 KiB random writes through jext's IO layer, ordered four ways (BarrierFS Fig. 9/10)\n\n\
         P orderless, B barrier write per write (a flush fence where the device has no barrier write), \
         X Wait-on-Transfer, XnF Transfer-and-Flush; ratios to P of the same device in this run; \
         QD = mean commands in the device (max). Simulated devices run {}× slower than their class.\n",
        super::systems::SIM_SLOWDOWN
    );
    let modes: Vec<Variant> = grid.iter().map(|(v, _)| *v).collect();
    let _ = writeln!(
        out,
        "| device | B kept by | P IOPS | {} | {} | B flushes/write |",
        modes
            .iter()
            .skip(1)
            .map(|v| format!("{} × P", v.label()))
            .collect::<Vec<_>>()
            .join(" | "),
        modes
            .iter()
            .map(|v| format!("QD {}", v.label()))
            .collect::<Vec<_>>()
            .join(" | "),
    );
    let _ = writeln!(out, "|---|---|{}", "---:|".repeat(2 * modes.len() + 1));
    let Some((_, first_rows)) = grid.first() else {
        return;
    };
    let row_of = |variant: Variant, system: &System| {
        grid.iter()
            .find(|(v, _)| *v == variant)
            .and_then(|(_, rows)| reference(rows, system))
    };
    for row in first_rows {
        let p = row.ops_per_sec;
        let ratios: Vec<String> = modes
            .iter()
            .skip(1)
            .map(|&v| {
                let rate = row_of(v, row.system).and_then(|r| r.ops_per_sec);
                match rate.and_then(|r| ratio(r, p)) {
                    // Transfer-and-Flush on a plain SSD is a fraction of a percent of P.
                    Some(r) if r < 0.1 => format!("{r:.3}×"),
                    r => fmt_ratio(r),
                }
            })
            .collect();
        let depths: Vec<String> = modes
            .iter()
            .map(|&v| match row_of(v, row.system).and_then(|r| r.queue) {
                Some((mean, max, _)) => format!("{mean:.1} ({max})"),
                None => "–".into(),
            })
            .collect();
        let barrier = modes.get(1).and_then(|&v| row_of(v, row.system));
        let kept_by = match barrier.and_then(|r| r.queue) {
            Some((_, _, true)) => "barrier write",
            Some((_, _, false)) => "flush fence",
            None => "–",
        };
        let _ = writeln!(
            out,
            "| {} | {kept_by} | {} | {} | {} | {} |",
            row.system.name(),
            p.map_or("–".into(), |p| format!("{p:.0}")),
            ratios.join(" | "),
            depths.join(" | "),
            io_per_op_cells(barrier.and_then(|r| r.io))[2],
        );
    }
}

fn seq_table(out: &mut String, rows: &[Aggregate]) {
    let _ = writeln!(out, "### seq: sequential write, then one fsync\n");
    let _ = writeln!(out, "| system | MiB/s | × raw (same backing) | × ext4 ordered | writes | MiB written | flushes |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    let ext4 = reference(rows, &EXT4_ORDERED).and_then(|r| r.mib_per_s);
    for row in rows {
        let Some(rate) = row.mib_per_s else { continue };
        let raw = match row.system {
            System::RawFile
            | System::Jext {
                backing: Backing::File,
                ..
            } => &System::RawFile,
            _ => &System::RawLoop,
        };
        let raw_rate = reference(rows, raw).and_then(|r| r.mib_per_s);
        let (writes, written, flushes) = match row.io {
            Some((io, runs)) => (
                format!("{:.0}", io.writes as f64 / runs as f64),
                format!("{:.0}", mib(io.write_bytes) / runs as f64),
                format!("{:.1}", io.flushes as f64 / runs as f64),
            ),
            None => ("–".into(), "–".into(), "–".into()),
        };
        let _ = writeln!(
            out,
            "| {} | {rate:.0} | {} | {} | {writes} | {written} | {flushes} |",
            row.system.name(),
            fmt_ratio(ratio(rate, raw_rate)),
            fmt_ratio(ratio(rate, ext4)),
        );
    }
}

fn latency_table(out: &mut String, rows: &[Aggregate]) {
    let _ = writeln!(out, "### fsync-latency: 4 KiB allocating write + fsync\n");
    let _ = writeln!(out, "| system | mean µs | p50 | p99 | p99.9 | p99.99 | mean × ext4 ordered | mean × raw loop | writes/fsync | KiB/fsync | flushes/fsync | FUA/fsync |");
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mean_of = |s: &System| {
        reference(rows, s)
            .and_then(|r| r.latency.as_ref())
            .map(|l| l.mean_us)
    };
    let (ext4, raw) = (mean_of(&EXT4_ORDERED), mean_of(&System::RawLoop));
    for row in rows {
        let Some(l) = &row.latency else { continue };
        let io_cells = io_per_op_cells(row.io);
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            row.system.name(),
            l.mean_us,
            l.p50_us,
            l.p99_us,
            l.p999_us,
            l.p9999_us,
            fmt_ratio(ratio(l.mean_us, real_reference(row.system, ext4))),
            fmt_ratio(ratio(l.mean_us, real_reference(row.system, raw))),
            io_cells.join(" | "),
        );
    }
}

fn memory_table(out: &mut String, samples: &[Sample]) {
    let _ = writeln!(
        out,
        "### memory: a long write with no sync until the end, memory sampled every 64 MiB\n"
    );
    let _ = writeln!(
        out,
        "| system | rep | GiB written | MiB/s | peak RSS MiB | peak cache MiB | cache bound MiB |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for s in samples
        .iter()
        .filter(|s| s.experiment == Experiment::Memory)
    {
        if let Ok(Measured::Memory {
            bytes,
            seconds,
            peak_rss_bytes,
            peak_cache_bytes,
            cache_bound_bytes,
        }) = &s.outcome
        {
            let _ = writeln!(
                out,
                "| {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
                s.system.name(),
                s.repetition + 1,
                mib(*bytes) / 1024.0,
                mib(*bytes) / seconds,
                mib(*peak_rss_bytes),
                mib(*peak_cache_bytes),
                mib(*cache_bound_bytes),
            );
        }
    }
}

/// Quantiles of each latency run kept in the JSON.
const CDF_POINTS: usize = 100;

/// Every run's summary, for tools.
pub fn json(samples: &[Sample], header: &Value) -> Value {
    let runs: Vec<Value> = samples
        .iter()
        .map(|s| {
            let mut v = json!({
                "experiment": s.experiment.name(),
                "variant": s.variant.label(),
                "system": s.system.name(),
                "repetition": s.repetition,
            });
            match &s.outcome {
                Ok(Measured::Throughput { bytes, seconds, io }) => {
                    v["bytes"] = json!(bytes);
                    v["seconds"] = json!(seconds);
                    v["mib_per_s"] = json!(mib(*bytes) / seconds);
                    v["io"] = io_json(io);
                }
                Ok(Measured::Latency { latencies_ns, io, background_mib_per_s }) => {
                    v["latency"] = LatencySummary::of_ns(latencies_ns).map_or(Value::Null, |l| {
                        json!({"samples": l.samples, "mean_us": l.mean_us, "p50_us": l.p50_us, "p95_us": l.p95_us,
                               "p99_us": l.p99_us, "p999_us": l.p999_us, "p9999_us": l.p9999_us, "max_us": l.max_us})
                    });
                    // Entry i is the latency at quantile (i + 1) / 100: enough to redraw the CDF.
                    v["cdf_us"] = json!(cdf_us(latencies_ns, CDF_POINTS));
                    v["background_mib_per_s"] = json!(background_mib_per_s);
                    v["io"] = io_json(io);
                }
                Ok(Measured::Ops { ops, seconds, io, daemon }) => {
                    v["ops"] = json!(ops);
                    v["seconds"] = json!(seconds);
                    v["ops_per_sec"] = json!(*ops as f64 / seconds);
                    v["io"] = io_json(io);
                    v["daemon"] = daemon_json(daemon, *ops);
                }
                Ok(Measured::Queue { ops, seconds, io, mean_queue_depth, max_queue_depth, barrier_mode }) => {
                    v["ops"] = json!(ops);
                    v["seconds"] = json!(seconds);
                    v["ops_per_sec"] = json!(*ops as f64 / seconds);
                    v["mean_queue_depth"] = json!(mean_queue_depth);
                    v["max_queue_depth"] = json!(max_queue_depth);
                    v["barrier_mode"] = json!(barrier_mode);
                    v["io"] = io_json(io);
                }
                Ok(Measured::Memory { bytes, seconds, peak_rss_bytes, peak_cache_bytes, cache_bound_bytes }) => {
                    v["bytes"] = json!(bytes);
                    v["seconds"] = json!(seconds);
                    v["peak_rss_bytes"] = json!(peak_rss_bytes);
                    v["peak_cache_bytes"] = json!(peak_cache_bytes);
                    v["cache_bound_bytes"] = json!(cache_bound_bytes);
                }
                Err(e) => v["error"] = json!(e),
            }
            v
        })
        .collect();
    json!({ "header": header, "runs": runs })
}

fn daemon_json(daemon: &Option<DaemonStats>, ops: u64) -> Value {
    daemon.as_ref().map_or(Value::Null, |d| {
        let per_op = |n: u64| n as f64 / ops.max(1) as f64;
        json!({"fuse_requests": d.requests, "fuse_requests_per_op": per_op(d.total_requests()),
               "voluntary_switches": d.voluntary_switches, "involuntary_switches": d.involuntary_switches,
               "context_switches_per_op": per_op(d.context_switches()),
               "cpu_us": d.cpu_micros, "cpu_us_per_op": per_op(d.cpu_micros),
               "fsyncs": d.fsyncs})
    })
}

fn io_json(io: &Option<IoCounts>) -> Value {
    io.map_or(Value::Null, |io| {
        json!({"writes": io.writes, "write_bytes": io.write_bytes, "flushes": io.flushes, "fua_writes": io.fua_writes})
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::experiments::BackgroundWriter;
    use jext::DataMode;

    fn latency(system: System, ns: u64, writes: u64) -> Sample {
        Sample {
            experiment: Experiment::FsyncLatency,
            variant: Variant::Only,
            system,
            repetition: 0,
            outcome: Ok(Measured::Latency {
                latencies_ns: vec![ns; 10],
                io: Some(IoCounts {
                    writes,
                    write_bytes: writes * 4096,
                    flushes: 10,
                    fua_writes: None,
                }),
                background_mib_per_s: None,
            }),
        }
    }

    fn ops(experiment: Experiment, variant: Variant, system: System, ops_per_sec: f64) -> Sample {
        Sample {
            experiment,
            variant,
            system,
            repetition: 0,
            outcome: Ok(Measured::Ops {
                ops: 100,
                seconds: 100.0 / ops_per_sec,
                io: None,
                daemon: None,
            }),
        }
    }

    #[test]
    fn ratios_are_against_ext4_ordered_and_failures_are_named() {
        let jext = System::jext(DataMode::Ordered, Backing::Loop);
        let samples = vec![
            latency(EXT4_ORDERED, 2_000_000, 40),
            latency(jext.clone(), 1_000_000, 30),
            Sample {
                experiment: Experiment::FsyncLatency,
                variant: Variant::Only,
                system: System::RawLoop,
                repetition: 0,
                outcome: Err("losetup failed".into()),
            },
        ];
        let text = markdown(&samples, &[Experiment::FsyncLatency]);
        let jext_row = text.lines().find(|l| l.starts_with("| jext")).unwrap();
        assert!(jext_row.contains("| 1000 | 1000 |"), "{jext_row}");
        assert!(jext_row.contains("| 0.50× | – |"), "{jext_row}");
        assert!(jext_row.contains("| 3.00 | 12.0 | 1.00 |"), "{jext_row}");
        assert!(text.contains("raw loop (O_DIRECT) failed: losetup failed"));
    }

    #[test]
    fn a_system_on_the_simulator_is_never_compared_with_real_storage() {
        let on_sim = System::jext(
            DataMode::Ordered,
            Backing::Sim(jext_device::Preset::PlainSsd),
        );
        let samples = vec![
            latency(EXT4_ORDERED, 2_000_000, 40),
            latency(System::RawLoop, 500_000, 40),
            latency(on_sim.clone(), 1_000_000, 30),
        ];
        let text = markdown(&samples, &[Experiment::FsyncLatency]);
        let row = text.lines().find(|l| l.contains("sim plain-ssd")).unwrap();
        assert!(row.contains("| 1000 | – | – |"), "{row}");
        let ext4_row = text.lines().find(|l| l.starts_with("| ext4")).unwrap();
        assert!(ext4_row.contains("| 1.00× | 4.00× |"), "{ext4_row}");
        let headlines = headlines(&samples, Experiment::FsyncLatency);
        let sim = headlines[0].1.iter().find(|h| h.system == on_sim).unwrap();
        assert_eq!((sim.value, sim.vs_ext4), (Some(1000.0), None));
    }

    #[test]
    fn the_sqlite_matrix_compares_with_jext_without_a_journal_and_names_failures_once() {
        use crate::bench::experiments::{SqliteCase, SqliteJournal, SqlitePhase};
        let cases = SqliteCase::plan(&[SqliteJournal::Delete], &[1], &SqlitePhase::ALL);
        let per_file = System::JextMount {
            name: "jext per-file (FUSE)",
            options: "data=ordered",
            journal: true,
            per_file: true,
            barrier_syncs: false,
        };
        let adaptive = System::JextMount {
            name: "jext data=adaptive (FUSE)",
            options: "data=adaptive",
            journal: true,
            per_file: false,
            barrier_syncs: false,
        };
        let mut samples = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let variant = Variant::Sqlite(*case);
            // 1000 µs without a journal; per-file 1.05× then 1.20× then 1.00×.
            let slower = [1.05, 1.20, 1.00][i];
            let mut run = |system: System, us: f64, flushes: u64| {
                let mut s = ops(Experiment::Sqlite, variant, system, 1e6 / us);
                if let Ok(Measured::Ops { io, .. }) = &mut s.outcome {
                    *io = Some(IoCounts {
                        writes: 300,
                        write_bytes: 100 * 8192,
                        flushes,
                        fua_writes: None,
                    });
                }
                samples.push(s);
            };
            run(crate::bench::JEXT_NO_JOURNAL, 1000.0, 100);
            run(per_file.clone(), 1000.0 * slower, 200);
            run(EXT4_ORDERED, 2000.0, 300);
            samples.push(Sample {
                experiment: Experiment::Sqlite,
                variant,
                system: adaptive.clone(),
                repetition: 0,
                outcome: Err("unknown mount option".into()),
            });
        }
        let text = markdown(&samples, &[Experiment::Sqlite]);
        assert!(text.contains("#### DELETE, 1-row transactions"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("| jext per-file (FUSE) | 1050"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            row.contains("| 1050 (1.05×) | 1200 (1.20×) | 1000 (1.00×) |"),
            "{row}"
        );
        assert!(row.contains("| 8.0 / 2.00 |"), "{row}");
        let summary = text
            .lines()
            .rfind(|l| l.starts_with("| jext per-file (FUSE) | 3 |"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            summary.contains("| 1.20× (DELETE update, 1-row txns) | 2 |"),
            "{summary}"
        );
        assert_eq!(
            text.matches("jext data=adaptive (FUSE) failed in 3 of 3 cases: unknown mount option")
                .count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn seq_medians_over_repetitions() {
        let runs = [4.0, 1.0, 2.0].map(|seconds| Sample {
            experiment: Experiment::Seq,
            variant: Variant::Only,
            system: System::RawFile,
            repetition: 0,
            outcome: Ok(Measured::Throughput {
                bytes: 1 << 30,
                seconds,
                io: None,
            }),
        });
        let text = markdown(&runs, &[Experiment::Seq]);
        assert!(
            text.contains("| raw file (pwrite) | 512 | 1.00× | – |"),
            "{text}"
        );
    }

    #[test]
    fn dwsl_has_a_column_per_thread_count_and_scales_against_one_thread() {
        let jext = System::jext(DataMode::Ordered, Backing::Loop);
        let mut samples = Vec::new();
        for (n, jext_rate, ext4_rate) in [(1, 1000.0, 500.0), (8, 4000.0, 1000.0)] {
            samples.push(ops(
                Experiment::Dwsl,
                Variant::Threads(n),
                EXT4_ORDERED,
                ext4_rate,
            ));
            samples.push(ops(
                Experiment::Dwsl,
                Variant::Threads(n),
                jext.clone(),
                jext_rate,
            ));
        }
        samples.push(Sample {
            experiment: Experiment::Dwsl,
            variant: Variant::Threads(8),
            system: System::RawLoop,
            repetition: 0,
            outcome: Err("interrupted".into()),
        });
        let text = markdown(&samples, &[Experiment::Dwsl]);
        assert!(
            text.contains("| system | 1 thread | 8 threads | 8 threads ÷ 1 thread | 8 threads × ext4 ordered |"),
            "{text}"
        );
        assert!(
            text.contains("| ext4 data=ordered | 500 | 1000 | 2.00× | 1.00× |"),
            "{text}"
        );
        assert!(
            text.contains("| jext data=ordered (loop) | 1000 | 4000 | 4.00× | 4.00× |"),
            "{text}"
        );
        assert!(
            text.contains("raw loop (O_DIRECT) (8 threads) failed: interrupted"),
            "{text}"
        );
    }

    #[test]
    fn fsync_tail_rows_compare_within_one_background_rate() {
        let tail = |system: System, background: Option<u64>, us: u64| Sample {
            experiment: Experiment::FsyncTail,
            variant: Variant::Background(
                background.map_or(BackgroundWriter::None, BackgroundWriter::Paced),
            ),
            system,
            repetition: 0,
            outcome: Ok(Measured::Latency {
                latencies_ns: (1..=1000).map(|i| i * us * 1000).collect(),
                io: None,
                background_mib_per_s: background.map(|r| r as f64 * 0.9),
            }),
        };
        let samples = vec![
            tail(EXT4_ORDERED, None, 1),
            tail(System::RawLoop, None, 1),
            tail(EXT4_ORDERED, Some(100), 4),
            tail(System::RawLoop, Some(100), 2),
        ];
        let text = markdown(&samples, &[Experiment::FsyncTail]);
        let row = text
            .lines()
            .find(|l| l.starts_with("| raw loop (O_DIRECT) | 100 MiB/s writer"))
            .unwrap();
        assert_eq!(
            row,
            "| raw loop (O_DIRECT) | 100 MiB/s writer | 90 | – | 1001 | 1000 | 1900 | 1980 | 1998 | 0.50× | 0.50× |"
        );
        let json = json(&samples, &json!({}));
        let cdf = json["runs"][0]["cdf_us"].as_array().unwrap();
        assert_eq!(cdf.len(), CDF_POINTS);
        assert_eq!(
            (cdf[0].as_f64(), cdf[99].as_f64()),
            (Some(10.0), Some(1000.0))
        );
        assert_eq!(json["runs"][2]["variant"], "100 MiB/s writer");
    }
}
