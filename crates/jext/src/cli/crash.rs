//! `jext crash`: runs the crash explorer and reports counts per mode, the rate, and each
//! failure with the one line that replays it; `jext crash --replay LINE` replays one.

use super::progress::Progress;
use jext_crash::{
    default_modes, explore, replay, Config, Counts, Mode, Plan, Reproducer, Sampling, Summary,
    WorkloadId,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Args {
    pub budget: Option<String>,
    pub jobs: Option<usize>,
    pub modes: Vec<String>,
    pub workloads: Vec<String>,
    pub torn: bool,
    /// Cut and tear the largest write of each window at every sector.
    pub every_cut: bool,
    pub e2fsck_every: Option<u64>,
    pub kernel_check: Option<u64>,
    pub seed: u64,
    pub replay: Option<String>,
    pub keep_image: Option<PathBuf>,
}

pub fn run(args: Args) -> i32 {
    let fail = |what: String| {
        eprintln!("jext crash: {what}");
        2
    };
    if let Some(line) = &args.replay {
        return match line.parse::<Reproducer>() {
            Ok(repro) => replay_one(
                &repro,
                args.torn,
                args.kernel_check.is_some(),
                args.keep_image.as_deref(),
            ),
            Err(e) => fail(e),
        };
    }
    let config = match config(&args) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let only: Vec<WorkloadId> = match args.workloads.iter().map(|w| w.parse()).collect() {
        Ok(ids) => ids,
        Err(e) => return fail(e),
    };
    if let Some(bad) = only.iter().find_map(|id| jext_crash::generate(id).err()) {
        return fail(bad);
    }
    let plan = if args.budget.is_some() {
        Plan::Long
    } else {
        Plan::Ci
    };
    let bar = Progress::spinner("exploring");
    let started = Instant::now();
    let report = |c: &Counts| {
        let rate = c.states as f64 / started.elapsed().as_secs_f64().max(1e-3);
        bar.say(format!(
            "{} workloads, {} crash points, {} states ({rate:.0}/s), {} failures",
            c.workloads, c.crash_points, c.states, c.failures
        ));
    };
    let summary = explore(plan, &only, &config, &report);
    bar.finish();
    print_summary(&summary, &config);
    if summary.total().failures == 0 && summary.errors.is_empty() {
        0
    } else {
        1
    }
}

fn config(args: &Args) -> Result<Config, String> {
    let modes: Vec<Mode> = if args.modes.is_empty() {
        default_modes()
    } else {
        args.modes
            .iter()
            .map(|m| m.parse::<Mode>())
            .collect::<Result<_, _>>()?
    };
    let deadline = match &args.budget {
        Some(text) => Some(Instant::now() + parse_duration(text)?),
        None => None,
    };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if jobs == 0 {
        return Err("--jobs must be at least 1".into());
    }
    Ok(Config {
        modes,
        sampling: Sampling {
            torn_writes: args.torn,
            every_cut_of_largest_write: args.every_cut,
            ..Sampling::default()
        },
        kernel_check_every: args.kernel_check.unwrap_or(0),
        e2fsck_every: args
            .e2fsck_every
            .unwrap_or(if args.budget.is_some() { 1 } else { 50 }),
        jobs,
        deadline,
        seed: args.seed,
        ..Config::default()
    })
}

/// `90`, `90s`, `10m`, `1h`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("--budget {text:?}: expected a number with s, m or h (e.g. 10m)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        other => {
            return Err(format!(
                "--budget {text:?}: unknown unit {other:?} (use s, m or h)"
            ))
        }
    };
    Ok(Duration::from_secs(secs))
}

fn print_summary(summary: &Summary, config: &Config) {
    let secs = summary.elapsed.as_secs_f64().max(1e-3);
    println!(
        "mode                    workloads  fast commits  crash points     states   e2fsck   kernel   failures"
    );
    let row = |name: &str, c: &Counts| {
        println!(
            "{name:<23} {:>9} {:>13} {:>13} {:>10} {:>8} {:>8} {:>10}",
            c.workloads,
            c.fast_commits,
            c.crash_points,
            c.states,
            c.e2fsck_runs,
            c.kernel_checks,
            c.failures
        )
    };
    for (mode, c) in &summary.per_mode {
        row(&mode.to_string(), c);
    }
    let t = summary.total();
    row("total", &t);
    println!(
        "{:.1} s, {:.0} states/s with {} jobs ({:.0} per job){}",
        secs,
        t.states as f64 / secs,
        config.jobs,
        t.states as f64 / secs / config.jobs as f64,
        match (
            config.sampling.torn_writes,
            config.sampling.every_cut_of_largest_write
        ) {
            (true, true) => ", torn writes and every cut on",
            (true, false) => ", torn writes on",
            (false, true) => ", every cut on",
            (false, false) => "",
        }
    );
    for e in &summary.errors {
        println!("error: {e}");
    }
    for f in &summary.failures {
        println!("\nFAILED {}", f.reproducer);
        for p in &f.problems {
            println!("  {p}");
        }
        print!("{}", f.listing);
        println!("  replay: jext crash --replay '{}'", f.reproducer);
    }
}

fn replay_one(
    repro: &Reproducer,
    torn: bool,
    kernel_check: bool,
    keep_image: Option<&std::path::Path>,
) -> i32 {
    match replay(repro, torn, kernel_check, keep_image) {
        Err(e) => {
            eprintln!("jext crash --replay: {e}");
            2
        }
        Ok(r) => {
            print!("{}", r.listing);
            println!(
                "crash after {} of {} logged requests, {} cached writes in the window",
                repro.point, r.log_len, r.window_len
            );
            if let Some(path) = keep_image {
                println!("crash image (before recovery) saved to {}", path.display());
            }
            if r.problems.is_empty() {
                println!("recovered state is correct");
                0
            } else {
                for p in &r.problems {
                    println!("  {p}");
                }
                1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_with_units_and_bad_ones_are_named() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("1d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("m")
            .unwrap_err()
            .contains("expected a number"));
    }
}
