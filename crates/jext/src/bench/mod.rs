//! `jext bench`: runs the experiments on every system under test, alternating systems
//! within a run (A B A B …), and reports medians and ratios against Linux ext4
//! `data=ordered` and against the raw device, with the device requests each system caused.
//!
//! Promises: every system is set up fresh (new image, new mkfs) for every repetition and
//! torn down after it; a system that fails is reported and the others still run; figures
//! come only from runs that completed. Benchmarks are commands, never timed tests.

pub mod experiments;
pub mod report;
pub mod rig;
pub mod stats;
pub mod systems;

use experiments::Measured;
use jext::DataMode;
use rig::Scratch;
use std::io;
use std::path::PathBuf;
use systems::{Backing, System};

/// The experiments this harness knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Experiment {
    /// Sequential write of a large file and one fsync (throughput).
    Seq,
    /// 4 KiB allocating write + fsync, repeated (latency, requests per fsync).
    FsyncLatency,
    /// A long write through jext with memory sampled: the caches stay within their bound.
    Memory,
}

impl Experiment {
    pub const ALL: [Experiment; 3] = [
        Experiment::Seq,
        Experiment::FsyncLatency,
        Experiment::Memory,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Experiment::Seq => "seq",
            Experiment::FsyncLatency => "fsync-latency",
            Experiment::Memory => "memory",
        }
    }

    /// Whether the experiment means anything for this system.
    pub fn applies_to(self, system: &System) -> bool {
        self != Experiment::Memory || matches!(system, System::Jext { .. })
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

/// How big a run is.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub experiments: Vec<Experiment>,
    pub repetitions: usize,
    /// Bytes the `seq` experiment writes.
    pub seq_bytes: u64,
    /// Bytes the `memory` experiment writes.
    pub memory_bytes: u64,
    /// Operations of each latency experiment.
    pub fsync_count: usize,
    /// Where scratch images live (their disk is the disk under test).
    pub dir: PathBuf,
    /// Only systems whose name contains this.
    pub only: Option<String>,
}

impl BenchOptions {
    pub fn full(experiments: Vec<Experiment>, dir: PathBuf) -> BenchOptions {
        BenchOptions {
            experiments,
            repetitions: 3,
            seq_bytes: 1 << 30,
            memory_bytes: 10 << 30,
            fsync_count: 2000,
            dir,
            only: None,
        }
    }

    pub fn quick(experiments: Vec<Experiment>, dir: PathBuf) -> BenchOptions {
        BenchOptions {
            experiments,
            repetitions: 1,
            seq_bytes: 256 << 20,
            memory_bytes: 2 << 30,
            fsync_count: 300,
            dir,
            only: None,
        }
    }
}

/// One completed run, or the reason it did not complete.
#[derive(Debug)]
pub struct Sample {
    pub experiment: Experiment,
    pub system: System,
    pub repetition: usize,
    pub outcome: Result<Measured, String>,
}

/// Every system, in the order they alternate.
pub fn systems(root: bool) -> Vec<System> {
    let modes = [DataMode::Ordered, DataMode::Journal, DataMode::Writeback];
    let mut all = vec![
        System::RawFile,
        System::Jext {
            mode: DataMode::Ordered,
            backing: Backing::File,
        },
    ];
    if root {
        all.push(System::RawLoop);
        all.extend(modes.map(|mode| System::Jext {
            mode,
            backing: Backing::Loop,
        }));
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
    }
    all
}

/// Runs everything; progress goes to stderr as each run finishes.
pub fn run(opts: &BenchOptions) -> io::Result<Vec<Sample>> {
    crate::signals::catch_interrupts();
    let root = running_as_root();
    if !root {
        eprintln!("jext bench: not root, so no loop devices: only the image-file systems run");
    }
    let chosen: Vec<System> = systems(root)
        .into_iter()
        .filter(|s| {
            opts.only
                .as_ref()
                .is_none_or(|o| s.name().contains(o.as_str()))
        })
        .collect();
    let scratch = Scratch::new(&opts.dir)?;
    let runs_of = |e: Experiment| chosen.iter().filter(|s| e.applies_to(s)).count();
    let total: usize = opts
        .experiments
        .iter()
        .map(|&e| runs_of(e) * opts.repetitions)
        .sum();
    let mut samples = Vec::with_capacity(total);
    for &experiment in &opts.experiments {
        for repetition in 0..opts.repetitions {
            for system in chosen.iter().filter(|s| experiment.applies_to(s)) {
                crate::signals::check_interrupt()?;
                let outcome =
                    run_one(experiment, system, &scratch, opts).map_err(|e| e.to_string());
                crate::signals::check_interrupt()?;
                eprintln!(
                    "[{}/{total}] {} rep {}: {}: {}",
                    samples.len() + 1,
                    experiment.name(),
                    repetition + 1,
                    system.name(),
                    report::one_line(&outcome)
                );
                samples.push(Sample {
                    experiment,
                    system: system.clone(),
                    repetition,
                    outcome,
                });
            }
        }
    }
    Ok(samples)
}

fn run_one(
    experiment: Experiment,
    system: &System,
    scratch: &Scratch,
    opts: &BenchOptions,
) -> io::Result<Measured> {
    let image_bytes = match experiment {
        Experiment::Seq => (opts.seq_bytes * 2).max(1 << 30) + (512 << 20),
        Experiment::FsyncLatency => 1 << 30,
        Experiment::Memory => opts.memory_bytes + (1 << 30),
    };
    let running = system.set_up(scratch, image_bytes)?;
    let measured = match experiment {
        Experiment::Seq => experiments::sequential_write(&running, opts.seq_bytes, 1 << 20)?,
        Experiment::FsyncLatency => {
            experiments::allocating_write_fsync(&running, opts.fsync_count, false)?
        }
        Experiment::Memory => experiments::bounded_memory(&running, opts.memory_bytes)?,
    };
    running.finish()?;
    Ok(measured)
}

fn running_as_root() -> bool {
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
