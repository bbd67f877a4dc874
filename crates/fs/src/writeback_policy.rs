//! The writeback policy: what the writeback thread (`jext_cache::WritebackThread`) does on
//! each tick, and what `Fs::writeback_now` does at once — data dirty longer than the expiry,
//! then the oldest files until dirty data is under the background threshold, then inodes
//! whose only change is their times (`WritebackPolicy` holds the numbers).
//!
//! Promises: a tick does nothing on a read-only or failed file system, and an error it
//! meets is recorded as the file system's error (which then refuses changes) instead of
//! being lost with the thread.

use crate::error::FsResult;
use crate::file;
use crate::state::{FsInner, FsState};
use jext_cache::{WritebackPolicy, WritebackTarget};
use std::time::{Duration, Instant};

impl WritebackTarget for FsInner {
    fn writeback_tick(&self) {
        let mut st = self.state.lock();
        if st.error.is_some() || self.journal.aborted().is_some() || self.is_read_only() {
            return;
        }
        if let Err(err) = writeback_due(self, &mut st) {
            st.error
                .get_or_insert(format!("background writeback failed: {err}"));
        }
    }
}

/// What the writeback thread does each tick: data older than the expiry, then enough to
/// get under the background threshold, then inodes whose only change is their times.
pub(crate) fn writeback_due(fs: &FsInner, st: &mut FsState) -> FsResult<()> {
    let policy = WritebackPolicy::default();
    let expire = Duration::from_millis(policy.expire_ms);
    let now = Instant::now();
    for (ino, since) in st.pages.dirty_files() {
        if now.duration_since(since) >= expire {
            file::writeback(fs, st, ino, true)?;
        }
    }
    let background = st.pages.capacity_bytes() / 100 * policy.background_percent as usize;
    file::write_back_oldest(fs, st, background, true)?;
    for ino in st.dirty_inodes() {
        file::writeback(fs, st, ino, true)?;
    }
    st.pages.evict_over_capacity();
    Ok(())
}
