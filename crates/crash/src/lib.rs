//! jext crash: a crash explorer that proves every recovery, and can fail.
//!
//! In the spirit of CrashMonkey/ACE and SQLite's crash VFS, built on jext's simulated
//! device. A workload runs on a fresh image with every device request recorded
//! ([`record`]); for chosen crash points, every state a disk with a volatile cache could
//! hold is rebuilt (a subset of the unflushed writes, possibly torn; [`states`]); each is
//! recovered by mounting it with jext and checked by the [`oracle`] (fsync'd content,
//! names and attributes; rename atomicity; no mixed or stale blocks), by `jext fsck`, and
//! on a sample by `e2fsck -fn` (and, with [`kernel`], by Linux's own recovery). Failures come with a one-line [`repro::Reproducer`].
//!
//! Layout: [`workload`] (operations and ids), [`ace`] and [`fixed`] (the workloads),
//! [`snapshot`] (what a path holds), [`record`], [`states`], [`oracle`], [`explore`]
//! (the driver), [`repro`] (reproducers and replay), [`mode`] (data mode and
//! `ijournal=`).
//!
//! What it promises: a failure it reports is a real state the device model allows and
//! the oracle refuses; it never changes an image it was not given.

pub mod ace;
pub mod explore;
pub mod fixed;
pub mod kernel;
pub mod mode;
pub mod oracle;
pub mod record;
pub mod repro;
pub mod snapshot;
pub mod states;
pub mod workload;

pub use explore::{default_modes, explore, Config, Counts, Failure, Plan, Summary};
pub use mode::Mode;
pub use repro::{replay, Replay, Reproducer};
pub use states::Sampling;
pub use workload::{Workload, WorkloadId};

/// Builds the workload an id names.
pub fn generate(id: &WorkloadId) -> Result<Workload, String> {
    match id {
        WorkloadId::AceOne(i) => ace::seq1(*i).ok_or_else(|| {
            format!(
                "there are {} seq-1 workloads (ace1-0 to ace1-{})",
                ace::seq1_count(),
                ace::seq1_count() - 1
            )
        }),
        WorkloadId::AceSampled { len, seed } => Ok(ace::sampled(*len, *seed)),
        WorkloadId::Fixed { name, size } => fixed::build(name, *size),
    }
}
