//! `jext bench`: parses the command's options, runs the harness in `crate::bench`, prints
//! the tables and, with `--out`, saves the markdown report and the JSON of every run.

use crate::bench::{self, report, BenchOptions, Experiment};
use serde_json::json;
use std::path::PathBuf;

pub struct Args {
    pub experiment: String,
    pub quick: bool,
    pub repetitions: Option<usize>,
    pub dir: PathBuf,
    pub only: Option<String>,
    pub out: Option<PathBuf>,
}

pub fn run(args: Args) -> i32 {
    match bench_command(args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("jext bench: {e}");
            1
        }
    }
}

fn bench_command(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let experiments = Experiment::parse(&args.experiment)?;
    let mut opts = if args.quick {
        BenchOptions::quick(experiments.clone(), args.dir.clone())
    } else {
        BenchOptions::full(experiments.clone(), args.dir.clone())
    };
    if let Some(n) = args.repetitions {
        if n == 0 {
            return Err("--repetitions must be at least 1".into());
        }
        opts.repetitions = n;
    }
    opts.only = args.only.clone();
    let header = header(&opts, args.quick);
    let samples = bench::run(&opts)?;
    let tables = report::markdown(&samples, &experiments);
    let text = format!("{}\n{tables}", header_markdown(&header));
    println!("\n{text}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), &text)?;
        let all = report::json(&samples, &header);
        std::fs::write(
            dir.join("results.json"),
            serde_json::to_string_pretty(&all)?,
        )?;
        eprintln!(
            "jext bench: wrote {}/report.md and results.json",
            dir.display()
        );
    }
    Ok(())
}

fn first_line(program: &str, args: &[&str]) -> String {
    bench::rig::run(program, args)
        .map(|s| s.lines().next().unwrap_or("").to_string())
        .unwrap_or_else(|e| format!("unknown ({e})"))
}

fn header(opts: &BenchOptions, quick: bool) -> serde_json::Value {
    let dir = opts.dir.to_string_lossy().to_string();
    json!({
        "date": first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "kernel": first_line("uname", &["-r"]),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "backing": first_line("findmnt", &["-n", "-o", "SOURCE,FSTYPE", "--target", &dir]),
        "scratch_dir": dir,
        "quick": quick,
        "repetitions": opts.repetitions,
        "seq_bytes": opts.seq_bytes,
        "fsync_count": opts.fsync_count,
        "dwsl_ops_per_thread": opts.dwsl_ops_per_thread,
        "tail_count": opts.tail_count,
    })
}

fn header_markdown(h: &serde_json::Value) -> String {
    format!(
        "## jext bench, {}\n\nkernel {}, {} CPUs, scratch images in {} on {}; {} repetition(s), seq {} MiB, {} syncs per run, dwsl {} appends per thread, fsync-tail {} fsyncs. \
         Loop devices use direct I/O; jext counts its own requests, the kernel's are read from /sys/block/loopN/stat.\n",
        h["date"].as_str().unwrap_or("?"),
        h["kernel"].as_str().unwrap_or("?"),
        h["cpus"],
        h["scratch_dir"].as_str().unwrap_or("?"),
        h["backing"].as_str().unwrap_or("?"),
        h["repetitions"],
        h["seq_bytes"].as_u64().unwrap_or(0) >> 20,
        h["fsync_count"],
        h["dwsl_ops_per_thread"],
        h["tail_count"],
    )
}
