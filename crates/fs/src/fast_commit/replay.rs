//! Replay of ext4 fast commits at mount.

use crate::error::{FsError, FsResult};
use crate::state::{FsInner, FsState};
use jext_journal::format::fast_commit::FcRecord;

/// What applying the fast commits did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayReport {
    pub records: usize,
}

/// Applies recovered fast commits, in log order, as changes of the running transaction.
pub(crate) fn apply(
    _fs: &FsInner,
    _st: &mut FsState,
    records: &[FcRecord],
) -> FsResult<ReplayReport> {
    Err(FsError::Unsupported(format!(
        "the journal holds {} fast-commit records; jext cannot replay ext4 fast commits yet \
         (mount the image once with Linux)",
        records.len()
    )))
}
