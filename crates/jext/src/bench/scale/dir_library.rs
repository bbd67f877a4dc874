//! The library directory rows of `jext bench scale`: one directory of N names created
//! and listed through the jext library, each run in a fresh `jext` process, the medians of
//! the runs reported with every run's last / first ratio beside them.
//!
//! Why fresh processes: run after the smaller rows in the same process, a row started on
//! memory they had faulted in and freed, and on new memory only later; and one run's
//! first tenth (100,000 creates at 10^6 names, about a second) varied from 127k to 210k
//! creates/s between runs of one build on this machine, the last tenths much less. A
//! fresh process is what a new mount is, and the median of a few runs is how every other
//! `jext bench` figure is taken.
//!
//! Promises: each run makes its image fresh, checks it with `e2fsck -fn` and removes it;
//! a run that fails fails the row, with the child's report. Must never report a median
//! without the runs it came from.

use super::{
    best_listing, dir_image_bytes, e2fsck_verdict, entry_name, make_jext_image, timed_creates,
    DirRates, ScaleOptions,
};
use crate::bench::rig::Scratch;
use crate::bench::stats::median;
use jext::{Fs, MountOptions};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Appends the library rows to `out`, each size run `opts.repetitions` times.
pub(super) fn rows(opts: &ScaleOptions, out: &mut String) -> io::Result<()> {
    let _ = writeln!(
        out,
        "\n### One directory of N entries through the jext library\n\nMedians of {} runs, each in a fresh process (every tenth's median; the listing: the best run); the last / first ratio of each run beside them. CPU: of the process (the creating thread and jext's journal threads) per create, first and last tenth; on a loaded machine it is flatter than the rates, which also count time spent waiting for a CPU.\n\n| entries | create first 10% (/s) | create last 10% (/s) | last / first | each tenth (k/s) | list (ms) | last / first, each run | CPU first / last tenth (us per create) | CPU last / first | creating thread's CPU each tenth (us per create) | journal blocks logged per create, each tenth | blocks checkpointed per create, each tenth | e2fsck -fn, Linux mount |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        opts.repetitions
    );
    for &entries in &opts.dir_entries {
        let runs: Vec<(DirRates, String)> = (0..opts.repetitions.max(1))
            .map(|_| run_in_fresh_process(opts, entries))
            .collect::<io::Result<_>>()?;
        let each_run: Vec<String> = runs
            .iter()
            .map(|(rates, _)| format!("{:.2}", rates.last_over_first()))
            .collect();
        let verdicts: Vec<&str> = runs.iter().map(|(_, v)| v.as_str()).collect();
        let verdict = match verdicts.iter().all(|v| *v == verdicts[0]) {
            true => verdicts[0].to_string(),
            false => verdicts.join("; "),
        };
        let rates: Vec<DirRates> = runs.into_iter().map(|(rates, _)| rates).collect();
        let medians = medians_of(&rates);
        let _ = writeln!(
            out,
            "| {entries} | {} | {} | {} | {} | {verdict} |",
            medians.cells(),
            each_run.join(" "),
            medians.cpu_cells(),
            medians.journal_cells()
        );
        eprintln!("jext bench scale: directory, {entries} entries: done");
    }
    Ok(())
}

/// What a fresh process runs (`jext bench scale --library-runs-json`): one run of each
/// size in `opts`, one JSON line each.
pub fn library_runs_json(opts: &ScaleOptions) -> io::Result<String> {
    let scratch = Scratch::new(&opts.dir)?;
    let mut lines = String::new();
    for &entries in &opts.dir_entries {
        let (rates, verdict) = run_here(&scratch, entries)?;
        let _ = writeln!(lines, "{}", to_json(&rates, &verdict));
    }
    Ok(lines)
}

fn run_in_fresh_process(opts: &ScaleOptions, entries: usize) -> io::Result<(DirRates, String)> {
    let output = Command::new(std::env::current_exe()?)
        .args(["bench", "scale", "--library-runs-json", "--dir-entries"])
        .arg(entries.to_string())
        .arg("--dir")
        .arg(&opts.dir)
        .stderr(Stdio::inherit())
        .output()?;
    let report = String::from_utf8_lossy(&output.stdout);
    let parsed = report
        .lines()
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .and_then(|value| from_json(&value));
    match parsed {
        Some(run) if output.status.success() => Ok(run),
        _ => Err(io::Error::other(format!(
            "the library run of {entries} entries failed ({}):\n{report}",
            output.status
        ))),
    }
}

/// One run in this process: create `entries` names in a fresh image's `/d`, list them,
/// unmount, check the image.
fn run_here(scratch: &Scratch, entries: usize) -> io::Result<(DirRates, String)> {
    let img = scratch.dir.join("dir.img");
    make_jext_image(&img, dir_image_bytes(entries))?;
    let fs = Fs::open_path(&img, MountOptions::default()).map_err(io::Error::other)?;
    let dir = fs.mkdir_path("/d", 0o755).map_err(io::Error::other)?.ino;
    let mut journal_per_create = Vec::new();
    let mut journal_before = fs.journal_stats();
    let per_tenth = (entries / 10).max(1) as f64;
    let (tenths_per_s, cpu_us_per_create, creator_cpu_us_per_create) = timed_creates(
        entries,
        |i| {
            fs.create(dir, entry_name(i).as_bytes(), 0o644, 0, 0)
                .map(drop)
                .map_err(io::Error::other)
        },
        || {
            let now = fs.journal_stats();
            journal_per_create.push((
                (now.blocks_logged - journal_before.blocks_logged) as f64 / per_tenth,
                (now.blocks_checkpointed - journal_before.blocks_checkpointed) as f64 / per_tenth,
            ));
            journal_before = now;
        },
    )?;
    let list = best_listing(|| {
        let mut cookie = 0;
        let mut listed = 0;
        loop {
            let batch = fs.readdir(dir, cookie).map_err(io::Error::other)?;
            let Some(last) = batch.last() else { break };
            cookie = last.next_cookie;
            listed += batch.len();
        }
        if listed != entries + 2 {
            return Err(io::Error::other(format!(
                "listed {listed} entries of {entries} (+2)"
            )));
        }
        Ok(())
    })?;
    fs.unmount().map_err(io::Error::other)?;
    let verdict = e2fsck_verdict(&img)?;
    std::fs::remove_file(&img)?;
    Ok((
        DirRates {
            tenths_per_s,
            cpu_us_per_create,
            creator_cpu_us_per_create,
            journal_per_create,
            list,
        },
        verdict,
    ))
}

fn to_json(rates: &DirRates, verdict: &str) -> Value {
    json!({
        "tenths_per_s": rates.tenths_per_s,
        "cpu_us_per_create": rates.cpu_us_per_create,
        "creator_cpu_us_per_create": rates.creator_cpu_us_per_create,
        "journal_per_create": rates.journal_per_create,
        "list_s": rates.list.as_secs_f64(),
        "e2fsck": verdict,
    })
}

fn from_json(value: &Value) -> Option<(DirRates, String)> {
    let numbers = |key: &str| -> Option<Vec<f64>> {
        value[key].as_array()?.iter().map(Value::as_f64).collect()
    };
    let journal = value["journal_per_create"]
        .as_array()?
        .iter()
        .map(|pair| Some((pair[0].as_f64()?, pair[1].as_f64()?)))
        .collect::<Option<Vec<_>>>()?;
    let rates = DirRates {
        tenths_per_s: numbers("tenths_per_s")?,
        cpu_us_per_create: numbers("cpu_us_per_create")?,
        creator_cpu_us_per_create: numbers("creator_cpu_us_per_create")?,
        journal_per_create: journal,
        list: Duration::try_from_secs_f64(value["list_s"].as_f64()?).ok()?,
    };
    Some((rates, value["e2fsck"].as_str()?.to_string()))
}

/// Every tenth's median over the runs; the best listing.
fn medians_of(runs: &[DirRates]) -> DirRates {
    let each = |pick: fn(&DirRates) -> &Vec<f64>| -> Vec<f64> {
        let tenths = runs.iter().map(|r| pick(r).len()).min().unwrap_or(0);
        (0..tenths)
            .map(|i| median(&runs.iter().map(|r| pick(r)[i]).collect::<Vec<_>>()).unwrap_or(0.0))
            .collect()
    };
    let tenths = runs
        .iter()
        .map(|r| r.journal_per_create.len())
        .min()
        .unwrap_or(0);
    let journal = (0..tenths)
        .map(|i| {
            let of = |pick: fn(&(f64, f64)) -> f64| {
                median(
                    &runs
                        .iter()
                        .map(|r| pick(&r.journal_per_create[i]))
                        .collect::<Vec<_>>(),
                )
                .unwrap_or(0.0)
            };
            (of(|t| t.0), of(|t| t.1))
        })
        .collect();
    DirRates {
        tenths_per_s: each(|r| &r.tenths_per_s),
        cpu_us_per_create: each(|r| &r.cpu_us_per_create),
        creator_cpu_us_per_create: each(|r| &r.creator_cpu_us_per_create),
        journal_per_create: journal,
        list: runs.iter().map(|r| r.list).min().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(first: f64, list_ms: u64) -> DirRates {
        DirRates {
            tenths_per_s: vec![first, 100.0],
            cpu_us_per_create: vec![5.0, 6.0],
            creator_cpu_us_per_create: vec![4.0, 5.0],
            journal_per_create: vec![(0.0, 0.0), (0.25, 0.5)],
            list: Duration::from_millis(list_ms),
        }
    }

    #[test]
    fn a_run_survives_its_trip_through_json() {
        let (back, verdict) = from_json(&to_json(&rates(150.0, 12), "clean")).unwrap();
        assert_eq!(verdict, "clean");
        assert_eq!(back.tenths_per_s, vec![150.0, 100.0]);
        assert_eq!(back.journal_per_create, vec![(0.0, 0.0), (0.25, 0.5)]);
        assert_eq!(back.list, Duration::from_millis(12));
        assert!(
            from_json(&json!({"tenths_per_s": [1.0]})).is_none(),
            "fields missing"
        );
    }

    #[test]
    fn medians_are_taken_tenth_by_tenth_and_the_best_listing_kept() {
        let runs = [rates(150.0, 12), rates(210.0, 9), rates(120.0, 15)];
        let medians = medians_of(&runs);
        assert_eq!(medians.tenths_per_s, vec![150.0, 100.0]);
        assert_eq!(medians.journal_per_create[1], (0.25, 0.5));
        assert_eq!(medians.list, Duration::from_millis(9));
    }
}
