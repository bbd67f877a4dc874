//! The experiments: each takes a running system, does its workload, and returns what it
//! measured. Nothing here knows which system it is talking to.
//!
//! Promises: the clock covers exactly the work named (the write calls and the sync that
//! makes them durable) and nothing of setup or teardown. Data is not all zeros, so no
//! layer can skip it. Must never report a figure for a run that failed part-way.

use super::systems::{IoCounts, Running};
use crate::signals::check_interrupt;
use std::io;
use std::time::Instant;

/// What one run of one experiment on one system measured.
#[derive(Clone, Debug)]
pub enum Measured {
    /// Sequential write then fsync: bytes and the seconds it took.
    Throughput {
        bytes: u64,
        seconds: f64,
        io: Option<IoCounts>,
    },
    /// Per-operation latencies (ns) and the device requests of all of them together.
    Latency {
        latencies_ns: Vec<u64>,
        io: Option<IoCounts>,
    },
    /// A long write with memory sampled along the way: the peaks seen.
    Memory {
        bytes: u64,
        seconds: f64,
        peak_rss_bytes: u64,
        peak_cache_bytes: u64,
        cache_bound_bytes: u64,
    },
}

/// A recognisable, incompressible-looking pattern (not zeros, not one repeated byte).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `seq`: write `total_bytes` sequentially in `chunk_bytes` pieces, then fsync once.
pub fn sequential_write(
    sys: &Running,
    total_bytes: u64,
    chunk_bytes: usize,
) -> io::Result<Measured> {
    assert!(
        total_bytes.is_multiple_of(chunk_bytes as u64),
        "whole chunks only"
    );
    let chunk = pattern(chunk_bytes, 1);
    let mut file = sys.create("seq", 0)?;
    let before = sys.io()?;
    let start = Instant::now();
    let mut offset = 0;
    while offset < total_bytes {
        check_interrupt()?;
        file.write_at(offset, &chunk)?;
        offset += chunk_bytes as u64;
    }
    file.sync(false)?;
    let seconds = start.elapsed().as_secs_f64();
    let io = delta(sys.io()?, before);
    Ok(Measured::Throughput {
        bytes: total_bytes,
        seconds,
        io,
    })
}

/// `fsync-latency` (BarrierFS Table 1): `count` times, append 4 KiB to a file (a new block
/// each time) and fsync; each sample is the write and the fsync together.
pub fn allocating_write_fsync(
    sys: &Running,
    count: usize,
    data_only: bool,
) -> io::Result<Measured> {
    const BLOCK: usize = 4096;
    let mut file = sys.create("fsync", 0)?;
    let block = pattern(BLOCK, 2);
    let before = sys.io()?;
    let mut latencies_ns = Vec::with_capacity(count);
    for i in 0..count {
        check_interrupt()?;
        let start = Instant::now();
        file.write_at((i * BLOCK) as u64, &block)?;
        file.sync(data_only)?;
        latencies_ns.push(start.elapsed().as_nanos() as u64);
    }
    let io = delta(sys.io()?, before);
    Ok(Measured::Latency { latencies_ns, io })
}

/// `memory`: write `total_bytes` sequentially without any sync (so only writeback and the
/// cache bound keep memory in check), then fsync; the process's resident set and jext's
/// cache are sampled every 64 MiB.
pub fn bounded_memory(sys: &Running, total_bytes: u64) -> io::Result<Measured> {
    const CHUNK: usize = 1 << 20;
    const SAMPLE_EVERY: u64 = 64 << 20;
    let Some(cache_bound_bytes) = sys.cache_bound_bytes() else {
        return Err(io::Error::other("only jext has a cache bound to check"));
    };
    let chunk = pattern(CHUNK, 3);
    let mut file = sys.create("big", 0)?;
    let (mut peak_rss_bytes, mut peak_cache_bytes) = (0, 0);
    let start = Instant::now();
    let mut offset = 0;
    while offset < total_bytes {
        check_interrupt()?;
        file.write_at(offset, &chunk)?;
        offset += CHUNK as u64;
        if offset.is_multiple_of(SAMPLE_EVERY) || offset >= total_bytes {
            peak_rss_bytes = peak_rss_bytes.max(resident_bytes()?);
            peak_cache_bytes = peak_cache_bytes.max(sys.cache_bytes().unwrap_or(0));
        }
    }
    file.sync(false)?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Measured::Memory {
        bytes: total_bytes,
        seconds,
        peak_rss_bytes,
        peak_cache_bytes,
        cache_bound_bytes,
    })
}

/// This process's resident set (VmRSS of /proc/self/status).
pub fn resident_bytes() -> io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| io::Error::other("no VmRSS in /proc/self/status"))
}

fn delta(after: Option<IoCounts>, before: Option<IoCounts>) -> Option<IoCounts> {
    Some(after?.since(&before?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_neither_zero_nor_flat_and_repeat_by_seed() {
        let a = pattern(4096, 1);
        assert_eq!(a, pattern(4096, 1));
        assert_ne!(a, pattern(4096, 2));
        assert!(a.iter().filter(|&&b| b == a[0]).count() < 100);
    }

    #[test]
    fn the_resident_set_grows_with_touched_memory() {
        let before = resident_bytes().unwrap();
        let big = pattern(64 << 20, 4);
        let after = resident_bytes().unwrap();
        assert!(after >= before + (60 << 20), "{before} -> {after}");
        std::hint::black_box(big);
    }
}
