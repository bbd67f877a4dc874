//! Turns samples into tables: the terminal and markdown table (the same text), and JSON
//! with every run's summary for tools.
//!
//! Promises: a ratio is printed only when both sides completed in this run; a failed
//! system shows its error instead of figures. Must never mix figures of different
//! experiments or invent a value for a run that did not complete.

use super::experiments::Measured;
use super::stats::{median, ratio, LatencySummary};
use super::systems::{Backing, IoCounts, System};
use super::{Experiment, Sample};
use serde_json::{json, Value};
use std::fmt::Write;

/// A progress line's verdict on one run.
pub fn one_line(outcome: &Result<Measured, String>) -> String {
    match outcome {
        Ok(Measured::Throughput { bytes, seconds, .. }) => {
            format!("{:.0} MiB/s", mib(*bytes) / seconds)
        }
        Ok(Measured::Latency { latencies_ns, .. }) => match LatencySummary::of_ns(latencies_ns) {
            Some(s) => format!("mean {:.0} µs, p99 {:.0} µs", s.mean_us, s.p99_us),
            None => "no samples".into(),
        },
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

/// What all repetitions of one system in one experiment add up to.
struct Aggregate<'a> {
    system: &'a System,
    /// Median MiB/s over repetitions (seq).
    mib_per_s: Option<f64>,
    /// All latency samples of all repetitions together.
    latency: Option<LatencySummary>,
    /// Requests summed over repetitions, and the operations they served.
    io: Option<(IoCounts, u64)>,
    errors: Vec<String>,
}

fn aggregate<'a>(samples: &'a [Sample], experiment: Experiment) -> Vec<Aggregate<'a>> {
    let mut systems: Vec<&System> = Vec::new();
    for s in samples.iter().filter(|s| s.experiment == experiment) {
        if !systems.contains(&&s.system) {
            systems.push(&s.system);
        }
    }
    systems
        .into_iter()
        .map(|system| aggregate_one(samples, experiment, system))
        .collect()
}

fn aggregate_one<'a>(
    samples: &'a [Sample],
    experiment: Experiment,
    system: &'a System,
) -> Aggregate<'a> {
    let mut rates = Vec::new();
    let mut latencies = Vec::new();
    let mut io_sum: Option<IoCounts> = Some(IoCounts {
        fua_writes: Some(0),
        ..IoCounts::default()
    });
    let mut ops = 0u64;
    let mut errors = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.experiment == experiment && &s.system == system)
    {
        let io = match &s.outcome {
            Ok(Measured::Throughput { bytes, seconds, io }) => {
                rates.push(mib(*bytes) / seconds);
                ops += 1;
                io
            }
            Ok(Measured::Latency { latencies_ns, io }) => {
                latencies.extend_from_slice(latencies_ns);
                ops += latencies_ns.len() as u64;
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
        latency: LatencySummary::of_ns(&latencies),
        io: io_sum.filter(|_| ops > 0).map(|io| (io, ops)),
        errors,
    }
}

fn reference<'a>(rows: &'a [Aggregate<'a>], wanted: &System) -> Option<&'a Aggregate<'a>> {
    rows.iter().find(|r| r.system == wanted)
}

const EXT4_ORDERED: System = System::Ext4 {
    options: "data=ordered",
    features: "",
};

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}×"))
}

/// The markdown tables of every experiment in the samples.
pub fn markdown(samples: &[Sample], experiments: &[Experiment]) -> String {
    let mut out = String::new();
    for &experiment in experiments {
        let rows = aggregate(samples, experiment);
        match experiment {
            Experiment::Seq => seq_table(&mut out, &rows),
            Experiment::FsyncLatency => latency_table(&mut out, &rows),
            Experiment::Memory => memory_table(&mut out, samples),
        }
        for row in rows.iter().filter(|r| !r.errors.is_empty()) {
            let _ = writeln!(
                out,
                "- {} failed: {}",
                row.system.name(),
                row.errors.join("; ")
            );
        }
        out.push('\n');
    }
    out
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
        let per_op = |n: u64, ops: u64| format!("{:.2}", n as f64 / ops as f64);
        let io_cells = match row.io {
            Some((io, ops)) => [
                per_op(io.writes, ops),
                format!("{:.1}", io.write_bytes as f64 / 1024.0 / ops as f64),
                per_op(io.flushes, ops),
                io.fua_writes.map_or("–".into(), |f| per_op(f, ops)),
            ],
            None => ["–".into(), "–".into(), "–".into(), "–".into()],
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            row.system.name(),
            l.mean_us,
            l.p50_us,
            l.p99_us,
            l.p999_us,
            l.p9999_us,
            fmt_ratio(ratio(l.mean_us, ext4)),
            fmt_ratio(ratio(l.mean_us, raw)),
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
        "| system | GiB written | MiB/s | peak RSS MiB | peak cache MiB | cache bound MiB |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|");
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
                "| {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} |",
                s.system.name(),
                mib(*bytes) / 1024.0,
                mib(*bytes) / seconds,
                mib(*peak_rss_bytes),
                mib(*peak_cache_bytes),
                mib(*cache_bound_bytes),
            );
        }
    }
}

/// Every run's summary, for tools.
pub fn json(samples: &[Sample], header: &Value) -> Value {
    let runs: Vec<Value> = samples
        .iter()
        .map(|s| {
            let mut v = json!({
                "experiment": s.experiment.name(),
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
                Ok(Measured::Latency { latencies_ns, io }) => {
                    v["latency"] = LatencySummary::of_ns(latencies_ns).map_or(Value::Null, |l| {
                        json!({"samples": l.samples, "mean_us": l.mean_us, "p50_us": l.p50_us, "p95_us": l.p95_us,
                               "p99_us": l.p99_us, "p999_us": l.p999_us, "p9999_us": l.p9999_us, "max_us": l.max_us})
                    });
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

fn io_json(io: &Option<IoCounts>) -> Value {
    io.map_or(Value::Null, |io| {
        json!({"writes": io.writes, "write_bytes": io.write_bytes, "flushes": io.flushes, "fua_writes": io.fua_writes})
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext::DataMode;

    fn latency(system: System, ns: u64, writes: u64) -> Sample {
        Sample {
            experiment: Experiment::FsyncLatency,
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
            }),
        }
    }

    #[test]
    fn ratios_are_against_ext4_ordered_and_failures_are_named() {
        let jext = System::Jext {
            mode: DataMode::Ordered,
            backing: Backing::Loop,
        };
        let samples = vec![
            latency(EXT4_ORDERED, 2_000_000, 40),
            latency(jext.clone(), 1_000_000, 30),
            Sample {
                experiment: Experiment::FsyncLatency,
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
    fn seq_medians_over_repetitions() {
        let runs = [4.0, 1.0, 2.0].map(|seconds| Sample {
            experiment: Experiment::Seq,
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
}
