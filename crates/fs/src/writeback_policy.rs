//! The writeback policy: what the writeback thread (`jext_cache::WritebackThread`) does on
//! each tick, and what `Fs::writeback_now` does at once — data dirty longer than the expiry,
//! then the oldest files until dirty data is under the background threshold, then inodes
//! whose only change is their times (`WritebackPolicy` holds the numbers).
//!
//! Each file's data goes out a batch per hold of its inode, waited for with nothing locked
//! (`file::write_back_unlocked`), so an fsync or a write of the file is not held up for
//! the tick's IO, only for the planning of a batch.
//!
//! Promises: a tick does nothing on a read-only or failed file system, and an error it
//! meets is recorded as the file system's error (which then refuses changes) instead of
//! being lost with the thread.

use crate::error::FsResult;
use crate::file;
use crate::state::FsInner;
use jext_cache::{WritebackPolicy, WritebackTarget};
use std::time::{Duration, Instant};

impl WritebackTarget for FsInner {
    fn writeback_tick(&self) {
        if let Err(err) = writeback_due(self) {
            self.set_error(format!("background writeback failed: {err}"));
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
    if !may_write_back(fs) {
        return Ok(());
    }
    let candidates: Vec<(u32, Due)> = {
        let files = fs.pages.lock().dirty_files();
        let expired = files
            .iter()
            .filter(|(_, since)| now.duration_since(*since) >= expire)
            .map(|(ino, _)| (*ino, Due::Expired));
        let oldest = files.iter().map(|(ino, _)| (*ino, Due::OverBackground));
        let times = fs
            .inodes
            .dirty_inodes()
            .into_iter()
            .map(|ino| (ino, Due::Times));
        expired.chain(oldest).chain(times).collect()
    };
    for (ino, due) in candidates {
        if !may_write_back(fs) {
            return Ok(());
        }
        let wanted = {
            let pages = fs.pages.lock();
            match due {
                Due::Expired => pages.has_dirty(ino),
                Due::OverBackground => pages.dirty_bytes() > fs.dirty_limits.background_bytes,
                // Only an inode without dirty data: one with data goes out, times and
                // all, when its data is due. Writing a busy writer's data because its
                // times moved sent it to the device on every tick (an fsync beside a
                // 100 MiB/s writer then flushed 600 KiB of the writer's data with its own
                // 80 KiB). The writeback looks at the times with the inode locked.
                Due::Times => !pages.has_dirty(ino),
            }
        };
        if wanted {
            file::write_back_unlocked(fs, ino, true, file::Urgency::Background)?;
        }
    }
    fs.pages.lock().evict_over_capacity();
    Ok(())
}

fn may_write_back(fs: &FsInner) -> bool {
    fs.error().is_none() && fs.journal.aborted().is_none() && !fs.is_read_only()
}
