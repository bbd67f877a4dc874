//! The journal layer: JBD2, compatible with Linux in both directions.
//!
//! - [`format`]: the on-disk journal superblock and log blocks.
//! - [`journal`]: handles, transactions (running → committing → checkpoint) and the
//!   waits; `commit`, `flush` and `checkpoint`: the three threads of dual-mode journaling.
//! - `fast_commit`: the fast-commit area's writer (an fsync's records, after the log).
//! - [`percore`]: the same region as per-core rings of jext-private i-transactions.
//! - [`recovery`]: scan, revoke and replay at mount, and the fast commits it finds.
//! - `home`: the same pipeline without a log, for a file system made without a journal
//!   (commits write home and flush; no crash promise beyond the device's).
//! - [`area`]: where a journal lives on the device.

pub mod area;
mod checkpoint;
mod commit;
pub mod error;
mod fast_commit;
mod flush;
pub mod format;
mod group_flush;
mod home;
mod inline_commit;
pub mod jbuf;
pub mod journal;
mod log;
pub mod percore;
pub mod recovery;
mod sync_batch;
pub mod tid;

pub use area::{AreaRun, JournalArea};
pub use error::JournalError;
pub use fast_commit::{FastCommitOutcome, FsyncUnderWay};
pub use jbuf::JBuf;
pub use journal::{Handle, Journal, JournalConfig, JournalStats};
pub use log::{CommitMode, LogFeatures, RecordMode};
pub use recovery::{recover, scan, RecoveryReport, ScanReport};
pub use tid::{tid_geq, tid_gt, Tid};
