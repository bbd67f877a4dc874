//! `jext bench`: parses the command's options, runs the harness in `crate::bench` with a
//! progress bar, prints the tables and, with `--out`, saves the markdown report, the JSON of
//! every run and the plots.

use super::progress::Progress;
use crate::bench::{self, plot, report, BenchOptions, Experiment, Observer};
use serde_json::json;
use std::path::PathBuf;

/// The progress bar, with a line above it for every run that ends.
struct Bar(Progress);

impl Observer for Bar {
    fn starting(&self, index: usize, _total: usize, what: &str) {
        self.0.at(index as u64);
        self.0.say(what.to_string());
    }

    fn finished(&self, index: usize, total: usize, what: &str, verdict: &str) {
        self.0.at(index as u64 + 1);
        self.0
            .line(&format!("[{}/{total}] {what}: {verdict}", index + 1));
    }
}

pub struct Args {
    pub experiment: String,
    pub quick: bool,
    pub repetitions: Option<usize>,
    pub dir: PathBuf,
    pub only: Option<String>,
    pub frag_sizes: Option<String>,
    pub dir_entries: Option<String>,
    pub library_runs_json: bool,
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
    if args.experiment == "scale" {
        return scale_command(&args);
    }
    if args.frag_sizes.is_some() || args.dir_entries.is_some() {
        return Err("--frag-sizes and --dir-entries are options of `jext bench scale` only".into());
    }
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
    if let Some(pattern) = &args.only {
        opts.only(pattern);
    }
    if !bench::running_as_root() {
        eprintln!("jext bench: not root, so no loop devices: only the image-file systems run");
    }
    if opts.systems.is_empty() {
        return Err(format!(
            "no system's name contains {:?}",
            args.only.unwrap_or_default()
        )
        .into());
    }
    let header = header(&opts, args.quick);
    let bar = Bar(Progress::steps(
        bench::runs_planned(&opts) as u64,
        "setting up",
    ));
    let samples = bench::run(&opts, &bar);
    bar.0.finish();
    let samples = samples?;
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
        match plot::draw(&samples, &experiments, dir) {
            Ok(files) => eprintln!(
                "jext bench: drew {} plots in {}",
                files.len(),
                dir.display()
            ),
            // The tables and JSON are written; a missing font costs only the pictures.
            Err(e) => eprintln!("jext bench: no plots: {e}"),
        }
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
        "tail_seconds": opts.tail_seconds,
        "memory_bytes": opts.memory_bytes,
        "sqlite_rows": opts.sqlite_rows,
        "sqlite_rows_per_transaction": opts.sqlite_rows_per_transaction,
        "varmail_cycles_per_thread": opts.varmail_cycles_per_thread,
        "io_order_writes": opts.io_order_writes,
        "systems": opts.systems.iter().map(|s| s.name()).collect::<Vec<_>>(),
    })
}

fn header_markdown(h: &serde_json::Value) -> String {
    format!(
        "## jext bench, {}\n\nkernel {}, {} CPUs, scratch images in {} on {}; {} repetition(s), seq {} MiB, {} syncs per run, dwsl {} appends per thread, fsync-tail {} s (80 KiB write, 100 ms pause, fsync), memory {} GiB, sqlite {} rows per phase in transactions of {} rows, varmail {} cycles per thread, io-order {} writes per mode. \
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
        h["tail_seconds"],
        h["memory_bytes"].as_u64().unwrap_or(0) >> 30,
        h["sqlite_rows"],
        h["sqlite_rows_per_transaction"],
        h["varmail_cycles_per_thread"],
        h["io_order_writes"],
    )
}

/// `jext bench scale`: its own curves (see `bench::scale`), written as report.md.
fn scale_command(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut opts = bench::scale::ScaleOptions::new(args.dir.clone(), args.quick);
    if let Some(pattern) = &args.only {
        opts.only(pattern);
        if opts.rows.is_empty() {
            return Err(format!(
                "no row of scale contains {pattern:?}; there are: {}",
                bench::scale::ROWS.join(", ")
            )
            .into());
        }
    }
    if let Some(list) = &args.frag_sizes {
        opts.frag_file_bytes = list
            .split(',')
            .map(|size| {
                jext_fs::options::parse_size_in("--frag-sizes", size.trim(), 1 << 20..=1 << 50)
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(list) = &args.dir_entries {
        opts.dir_entries = list
            .split(',')
            .map(|count| match count.trim().parse::<usize>() {
                Ok(n) if n >= 10 => Ok(n),
                _ => Err(format!(
                    "--dir-entries: {count:?} is not a number of entries of at least 10"
                )),
            })
            .collect::<Result<_, _>>()?;
    }
    match args.repetitions {
        Some(0) => return Err("--repetitions must be at least 1".into()),
        Some(n) => opts.repetitions = n,
        None => {}
    }
    if args.library_runs_json {
        print!("{}", bench::scale::library_runs_json(&opts)?);
        return Ok(());
    }
    let root = bench::running_as_root();
    if !root {
        eprintln!("jext bench scale: not root, so no loop devices: the Linux rows are SKIPPED");
    }
    let tables = bench::scale::run(&opts, root)?;
    let text =
        format!(
        "## jext bench scale, {}\n\nkernel {}, {} CPUs, scratch images in {} on {}{}.\n\n{tables}",
        first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        first_line("uname", &["-r"]),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        args.dir.display(),
        first_line(
            "findmnt",
            &["-n", "-o", "SOURCE,FSTYPE", "--target", &args.dir.to_string_lossy()]
        ),
        if args.quick { ", quick sizes" } else { "" }
    );
    println!("\n{text}");
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("report.md"), &text)?;
        eprintln!("jext bench scale: wrote {}/report.md", dir.display());
    }
    Ok(())
}
