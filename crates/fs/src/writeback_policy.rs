//! The writeback policy: what the writeback thread (`jext_cache::WritebackThread`) does on
//! each tick, and what `Fs::writeback_now` does at once — data dirty longer than the expiry,
//! then the oldest files until dirty data is under the background threshold, then inodes
//! whose only change is their times (`WritebackPolicy` holds the numbers).
//!
//! Each file's data goes out a batch per hold of the file system lock, waited for with it
//! released (`file::write_back_unlocked`), so an fsync or a write of another file is not
//! held up for the tick's IO, only for the planning of a batch.
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
        if let Err(err) = writeback_due(self) {
            self.state
                .lock()
                .error
                .get_or_insert(format!("background writeback failed: {err}"));
        }
    }
}

/// Why a file is written back on this tick.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Its oldest dirty page passed the expiry.
    Expired,
    /// Dirty data is over the background threshold; oldest dirtied first.
    OverBackground,
    /// Only its inode (times) is dirty.
    Times,
}

/// What the writeback thread does each tick: data older than the expiry, then enough to
/// get under the background threshold, then inodes whose only change is their times.
/// Nothing on a read-only or failed file system.
pub(crate) fn writeback_due(fs: &FsInner) -> FsResult<()> {
    let policy = WritebackPolicy::default();
    let expire = Duration::from_millis(policy.expire_ms);
    let now = Instant::now();
    let candidates: Vec<(u32, Due)> = {
        let st = fs.state.lock();
        if !may_write_back(fs, &st) {
            return Ok(());
        }
        let files = st.pages.dirty_files();
        let expired = files
            .iter()
            .filter(|(_, since)| now.duration_since(*since) >= expire)
            .map(|(ino, _)| (*ino, Due::Expired));
        let oldest = files.iter().map(|(ino, _)| (*ino, Due::OverBackground));
        let times = st.dirty_inodes().into_iter().map(|ino| (ino, Due::Times));
        expired.chain(oldest).chain(times).collect()
    };
    for (ino, due) in candidates {
        {
            let st = fs.state.lock();
            if !may_write_back(fs, &st) {
                return Ok(());
            }
            let background = st.pages.capacity_bytes() / 100 * policy.background_percent as usize;
            let wanted = match due {
                Due::Expired => st.pages.has_dirty(ino),
                Due::OverBackground => st.pages.dirty_bytes() > background,
                Due::Times => st.inodes.get(&ino).is_some_and(|i| i.dirty),
            };
            if !wanted {
                continue;
            }
        }
        file::write_back_unlocked(fs, ino, true)?;
    }
    fs.state.lock().pages.evict_over_capacity();
    Ok(())
}

fn may_write_back(fs: &FsInner, st: &FsState) -> bool {
    st.error.is_none() && fs.journal.aborted().is_none() && !fs.is_read_only()
}
