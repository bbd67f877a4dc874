//! Ad-hoc probe for bench/results/2026-11-25-scale/dir-library: one directory of N creates
//! through the library, with CPU, journal and device counters per tenth. Not part of the
//! build: copy to crates/jext/examples/ and run with cargo run --release -p jext --example dirprobe IMAGE N.
use jext::{FileDevice, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;
use std::time::Instant;

fn cpu_us(who: i32) -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(who, &mut u) };
    (u.ru_utime.tv_sec as f64 + u.ru_stime.tv_sec as f64) * 1e6
        + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let img = std::path::PathBuf::from(&args[1]);
    let count: usize = args[2].parse().unwrap();
    let cache_mib: usize = args.get(3).map_or(256, |s| s.parse().unwrap());
    let bytes = ((count as u64 * 32_768).max(1 << 30)).next_power_of_two();
    let _ = std::fs::remove_file(&img);
    jext::mkfs(
        Arc::new(FileDevice::create(&img, bytes).unwrap()),
        &MkfsOptions {
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let opts = MountOptions {
        cache_size_bytes: cache_mib << 20,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&img, opts).unwrap();
    let dir = fs.mkdir_path("/d", 0o755).unwrap().ino;
    let tenth = count / 10;
    let mut j0 = fs.journal_stats();
    let mut c0 = fs.counters();
    let mut t0 = Instant::now();
    let (mut p0, mut th0) = (cpu_us(libc::RUSAGE_SELF), cpu_us(libc::RUSAGE_THREAD));
    println!("tenth thr_us proc_us rate/s commits logged/create ckpts ckpt_blocks/create logfull_waits room_waits dev_reads/create dev_writes/create dev_wMiB cached_blocks");
    for i in 0..count {
        if i % tenth == 0 {
            let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
            eprintln!("T {} {}.{:09}", i / tenth, ts.tv_sec, ts.tv_nsec);
        }
        fs.create(dir, format!("f{i:07}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        if (i + 1) % tenth == 0 {
            let el = t0.elapsed().as_secs_f64();
            let j = fs.journal_stats();
            let c = fs.counters();
            let n = tenth as f64;
            let (_, _, cached) = fs.cache_usage().unwrap();
            let (p, th) = (cpu_us(libc::RUSAGE_SELF), cpu_us(libc::RUSAGE_THREAD));
            print!(
                "{} {:.2} {:.2} ",
                (i + 1) / tenth,
                (th - th0) / n,
                (p - p0) / n
            );
            (p0, th0) = (p, th);
            println!(
                "{:.0} {} {:.3} {} {:.3} {} {} {:.3} {:.3} {:.0} {}",
                n / el,
                j.commits - j0.commits,
                (j.blocks_logged - j0.blocks_logged) as f64 / n,
                j.checkpoints - j0.checkpoints,
                (j.blocks_checkpointed - j0.blocks_checkpointed) as f64 / n,
                j.log_full_waits - j0.log_full_waits,
                j.commit_room_waits - j0.commit_room_waits,
                (c.reads - c0.reads) as f64 / n,
                (c.writes - c0.writes) as f64 / n,
                (c.write_bytes - c0.write_bytes) as f64 / 1048576.0,
                cached,
            );
            j0 = j;
            c0 = c;
            t0 = Instant::now();
        }
    }
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    eprintln!("T 10 {}.{:09}", ts.tv_sec, ts.tv_nsec);
    fs.unmount().unwrap();
}
