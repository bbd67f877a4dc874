//! What the kernel asked of a mount: FUSE requests counted by opcode, and the daemon's
//! context switches, read together as [`DaemonStats`] (the benchmarks report them per
//! created file; a FUSE round trip costs more than most of the work jext does for it).
//!
//! Promises: every request fuser dispatches is counted once, before it is served, whatever
//! its answer; the counters only grow. Must never block or allocate on the request path.
//!
//! The text form a control socket carries is one line of `name=count` words separated by
//! spaces: the opcodes' names in lower case (`lookup=12 create=3`), then
//! `voluntary_switches=N involuntary_switches=N cpu_us=N`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// FUSE opcodes jext can be sent (`fuse_kernel.h`), by number.
const OPCODE_NAMES: [(u32, &str); 45] = [
    (1, "lookup"),
    (2, "forget"),
    (3, "getattr"),
    (4, "setattr"),
    (5, "readlink"),
    (6, "symlink"),
    (8, "mknod"),
    (9, "mkdir"),
    (10, "unlink"),
    (11, "rmdir"),
    (12, "rename"),
    (13, "link"),
    (14, "open"),
    (15, "read"),
    (16, "write"),
    (17, "statfs"),
    (18, "release"),
    (20, "fsync"),
    (21, "setxattr"),
    (22, "getxattr"),
    (23, "listxattr"),
    (24, "removexattr"),
    (25, "flush"),
    (26, "init"),
    (27, "opendir"),
    (28, "readdir"),
    (29, "releasedir"),
    (30, "fsyncdir"),
    (31, "getlk"),
    (32, "setlk"),
    (33, "setlkw"),
    (34, "access"),
    (35, "create"),
    (36, "interrupt"),
    (37, "bmap"),
    (38, "destroy"),
    (39, "ioctl"),
    (40, "poll"),
    (42, "batch_forget"),
    (43, "fallocate"),
    (44, "readdirplus"),
    (45, "rename2"),
    (46, "lseek"),
    (50, "syncfs"),
    (51, "tmpfile"),
];

/// Counters live in a table indexed by opcode; anything past it (CUSE, a newer kernel's
/// opcode) lands in the last slot.
const SLOTS: usize = 64;
const OTHER: usize = SLOTS - 1;

/// Requests served by one mount, by opcode.
pub struct RequestCounts {
    by_opcode: [AtomicU64; SLOTS],
}

impl Default for RequestCounts {
    fn default() -> Self {
        RequestCounts {
            by_opcode: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl RequestCounts {
    pub fn received(&self, opcode: u32) {
        let slot = usize::try_from(opcode).map_or(OTHER, |o| o.min(OTHER));
        self.by_opcode[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts so far, by name (opcodes never sent are left out).
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for (slot, counter) in self.by_opcode.iter().enumerate() {
            let count = counter.load(Ordering::Relaxed);
            if count > 0 {
                out.insert(opcode_name(slot), count);
            }
        }
        out
    }
}

fn opcode_name(slot: usize) -> String {
    OPCODE_NAMES
        .iter()
        .find(|(op, _)| *op as usize == slot)
        .map_or_else(|| format!("opcode_{slot}"), |(_, name)| name.to_string())
}

/// What a daemon reports about itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DaemonStats {
    pub requests: BTreeMap<String, u64>,
    /// Context switches of all the daemon's threads: waits (voluntary) and preemptions.
    pub voluntary_switches: u64,
    pub involuntary_switches: u64,
    /// CPU time of all the daemon's threads, user and system, in microseconds: what its
    /// requests cost it, and what polling for them costs (`poll_us=`).
    pub cpu_micros: u64,
    /// How the file system made fsyncs durable: `fast_commit`, `obsolete` (its full
    /// commit got there first) or `full_<reason>` (a full commit instead, and why).
    pub fsyncs: BTreeMap<String, u64>,
}

const VOLUNTARY: &str = "voluntary_switches";
const INVOLUNTARY: &str = "involuntary_switches";
const CPU: &str = "cpu_us";
/// Marks an fsync count in the text form (`fsync.fast_commit=12`).
const FSYNC_PREFIX: &str = "fsync.";

impl DaemonStats {
    /// This process's figures, with `counts` as its requests.
    pub fn of_this_process(counts: &RequestCounts) -> DaemonStats {
        // SAFETY: getrusage writes one rusage into the zeroed struct it is given.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            usage
        };
        DaemonStats {
            requests: counts.snapshot(),
            voluntary_switches: u64::try_from(usage.ru_nvcsw).unwrap_or(0),
            involuntary_switches: u64::try_from(usage.ru_nivcsw).unwrap_or(0),
            cpu_micros: micros(usage.ru_utime) + micros(usage.ru_stime),
            fsyncs: BTreeMap::new(),
        }
    }

    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }

    pub fn context_switches(&self) -> u64 {
        self.voluntary_switches + self.involuntary_switches
    }

    /// Both together (repetitions of one run).
    pub fn plus(&self, other: &DaemonStats) -> DaemonStats {
        DaemonStats {
            requests: add_counts(&self.requests, &other.requests),
            voluntary_switches: self.voluntary_switches + other.voluntary_switches,
            involuntary_switches: self.involuntary_switches + other.involuntary_switches,
            cpu_micros: self.cpu_micros + other.cpu_micros,
            fsyncs: add_counts(&self.fsyncs, &other.fsyncs),
        }
    }

    /// What happened between `earlier` and this.
    pub fn since(&self, earlier: &DaemonStats) -> DaemonStats {
        DaemonStats {
            requests: counts_since(&self.requests, &earlier.requests),
            voluntary_switches: self.voluntary_switches - earlier.voluntary_switches,
            involuntary_switches: self.involuntary_switches - earlier.involuntary_switches,
            cpu_micros: self.cpu_micros - earlier.cpu_micros,
            fsyncs: counts_since(&self.fsyncs, &earlier.fsyncs),
        }
    }

    pub fn encode(&self) -> String {
        let mut words: Vec<String> = self
            .requests
            .iter()
            .map(|(name, n)| format!("{name}={n}"))
            .collect();
        words.extend(
            self.fsyncs
                .iter()
                .map(|(name, n)| format!("{FSYNC_PREFIX}{name}={n}")),
        );
        words.push(format!("{VOLUNTARY}={}", self.voluntary_switches));
        words.push(format!("{INVOLUNTARY}={}", self.involuntary_switches));
        words.push(format!("{CPU}={}", self.cpu_micros));
        words.join(" ")
    }

    pub fn decode(line: &str) -> Result<DaemonStats, String> {
        let mut stats = DaemonStats::default();
        for word in line.split_whitespace() {
            let (name, count) = word
                .split_once('=')
                .ok_or_else(|| format!("daemon stats: {word:?} is not name=count"))?;
            let count: u64 = count
                .parse()
                .map_err(|_| format!("daemon stats: {word:?} has no whole count"))?;
            match name {
                VOLUNTARY => stats.voluntary_switches = count,
                INVOLUNTARY => stats.involuntary_switches = count,
                CPU => stats.cpu_micros = count,
                _ => match name.strip_prefix(FSYNC_PREFIX) {
                    Some(how) => {
                        stats.fsyncs.insert(how.to_string(), count);
                    }
                    None => {
                        stats.requests.insert(name.to_string(), count);
                    }
                },
            }
        }
        Ok(stats)
    }
}

fn micros(t: libc::timeval) -> u64 {
    let micros = t.tv_sec * 1_000_000 + t.tv_usec;
    u64::try_from(micros).unwrap_or(0)
}

fn add_counts(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut sum = a.clone();
    for (name, n) in b {
        *sum.entry(name.clone()).or_default() += n;
    }
    sum
}

/// Counts that grew since `earlier` (a count never shrinks).
fn counts_since(
    now: &BTreeMap<String, u64>,
    earlier: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    now.iter()
        .map(|(name, n)| (name.clone(), n - earlier.get(name).unwrap_or(&0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_opcode_and_round_trip_as_text() {
        let counts = RequestCounts::default();
        for opcode in [1, 1, 35, 16, 4096] {
            counts.received(opcode);
        }
        let stats = DaemonStats {
            requests: counts.snapshot(),
            voluntary_switches: 7,
            involuntary_switches: 2,
            cpu_micros: 1_234,
            fsyncs: [
                ("fast_commit".to_string(), 3),
                ("full_rename".to_string(), 1),
            ]
            .into(),
        };
        assert_eq!(stats.requests["lookup"], 2);
        assert_eq!(stats.requests["create"], 1);
        assert_eq!(stats.requests["opcode_63"], 1);
        assert_eq!(stats.total_requests(), 5);
        assert_eq!(DaemonStats::decode(&stats.encode()), Ok(stats.clone()));
        let later = DaemonStats {
            voluntary_switches: 10,
            cpu_micros: 1_500,
            ..stats.clone()
        };
        let delta = later.since(&stats);
        assert_eq!((delta.total_requests(), delta.context_switches()), (0, 3));
        assert_eq!(delta.cpu_micros, 266);
        let both = stats.plus(&later);
        assert_eq!((both.requests["lookup"], both.voluntary_switches), (4, 17));
        assert_eq!(both.cpu_micros, 2_734);
        assert!(DaemonStats::decode("lookup=x").is_err());
        assert!(DaemonStats::decode("lookup").is_err());
    }

    #[test]
    fn this_process_has_switched_context_and_used_cpu() {
        std::thread::sleep(std::time::Duration::from_millis(2));
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let stats = DaemonStats::of_this_process(&RequestCounts::default());
        assert!(
            stats.voluntary_switches > 0,
            "a sleep is a voluntary switch"
        );
        assert!(stats.cpu_micros >= 10_000, "{} µs", stats.cpu_micros);
    }
}
