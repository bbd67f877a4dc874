#!/usr/bin/env python3
"""Before/after tables from two `jext bench --out` directories (main and journal).

Usage: summarize.py BEFORE_DIR AFTER_DIR EXPERIMENT

Per system and variant: the median over repetitions of ops/s (dwsl; with N threads each
waiting for its own fsync, the mean fsync latency is N / ops/s) or of the latency figures
(fsync-latency), and device flushes and FUA writes per fsync summed over the repetitions
(counted by jext itself)."""
import json, re, statistics, sys


def load(path):
    runs = {}
    for run in json.load(open(path))["runs"]:
        key = (run["system"], run["variant"])
        r = runs.setdefault(key, {"ops_s": [], "ops": 0, "flushes": 0, "fua": 0, "mean": [], "p99": [], "p999": []})
        io = run.get("io") or {}
        r["flushes"] += io.get("flushes") or 0
        r["fua"] += io.get("fua_writes") or 0
        if "ops_per_sec" in run:
            r["ops_s"].append(run["ops_per_sec"])
            r["ops"] += run["ops"]
        lat = run.get("latency")
        if lat:
            r["mean"].append(lat["mean_us"])
            r["p99"].append(lat["p99_us"])
            r["p999"].append(lat["p999_us"])
            r["ops"] += lat["samples"]
    return runs


def med(xs):
    return statistics.median(xs)


before_dir, after_dir, experiment = sys.argv[1:4]
before = load(f"{before_dir}/{experiment}/results.json")
after = load(f"{after_dir}/{experiment}/results.json")
print(f"### {experiment}: main (before) vs journal branch (after); medians of the repetitions")
print()
if experiment == "dwsl":
    print("| system | threads | fsyncs/s before | after | after ÷ before | mean fsync µs before | after | flushes/fsync before | after | FUA/fsync before | after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
else:
    print("| system | mean µs before | after | p99 before | after | p99.9 before | after | flushes/fsync before | after | FUA/fsync before | after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for key in sorted(before):
    if key not in after:
        continue
    b, a = before[key], after[key]
    io = (f"{b['flushes'] / b['ops']:.2f} | {a['flushes'] / a['ops']:.2f} | "
          f"{b['fua'] / b['ops']:.2f} | {a['fua'] / a['ops']:.2f} |")
    if experiment == "dwsl":
        threads = int(re.match(r"\d+", key[1]).group())
        mb, ma = med(b["ops_s"]), med(a["ops_s"])
        print(f"| {key[0]} | {threads} | {mb:.0f} | {ma:.0f} | {ma / mb:.2f}× | "
              f"{threads / mb * 1e6:.0f} | {threads / ma * 1e6:.0f} | {io}")
    else:
        print(f"| {key[0]} | {med(b['mean']):.0f} | {med(a['mean']):.0f} | {med(b['p99']):.0f} | "
              f"{med(a['p99']):.0f} | {med(b['p999']):.0f} | {med(a['p999']):.0f} | {io}")
