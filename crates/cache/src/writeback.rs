//! The writeback thread: a timer that asks the file system to write back dirty data, and
//! the policy that says how much dirty data may wait.
//!
//! The policy is the kernel's default (`dirty_writeback_centisecs` 500,
//! `dirty_expire_centisecs` 3000, `dirty_background_ratio` 10, `dirty_ratio` 20), with the
//! ratios taken of the memory jext may use, as the kernel takes them of RAM, and capped by
//! the page cache bound, which must also keep room for clean pages. Deciding *what* to
//! write is the file system's job ([`WritebackTarget`]); this thread only keeps time.

use parking_lot::{Condvar, Mutex};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritebackPolicy {
    /// How often the thread wakes.
    pub interval_ms: u64,
    /// Dirty data older than this is written back at the next wake-up.
    pub expire_ms: u64,
    /// Above this share of memory, write back in the background (`dirty_background_ratio`).
    pub background_percent_of_memory: u64,
    /// Above this share of memory, writers write back themselves before dirtying more
    /// (`dirty_ratio`).
    pub throttle_percent_of_memory: u64,
    /// The background threshold never passes this share of the page cache bound.
    pub background_max_percent_of_cache: u64,
    /// The throttle threshold never passes this share of the page cache bound: the rest
    /// stays for clean pages and for writers that overshoot before they are throttled.
    pub throttle_max_percent_of_cache: u64,
}

impl Default for WritebackPolicy {
    fn default() -> Self {
        WritebackPolicy {
            interval_ms: 5000,
            expire_ms: 30_000,
            background_percent_of_memory: 10,
            throttle_percent_of_memory: 20,
            background_max_percent_of_cache: 50,
            throttle_max_percent_of_cache: 75,
        }
    }
}

/// The dirty-data thresholds of one page cache, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyLimits {
    /// Above this, the writeback thread writes the oldest files back.
    pub background_bytes: usize,
    /// Above this, a writer writes back before it goes on.
    pub throttle_bytes: usize,
}

impl WritebackPolicy {
    /// The thresholds of a page cache of `cache_bytes` on a machine whose usable memory
    /// is `memory_bytes`.
    pub fn dirty_limits(&self, cache_bytes: usize, memory_bytes: u64) -> DirtyLimits {
        let share = |percent_of_memory: u64, max_percent_of_cache: u64| {
            let of_memory = memory_bytes / 100 * percent_of_memory;
            let of_cache = cache_bytes as u64 / 100 * max_percent_of_cache;
            of_memory.min(of_cache) as usize
        };
        let limits = DirtyLimits {
            background_bytes: share(
                self.background_percent_of_memory,
                self.background_max_percent_of_cache,
            ),
            throttle_bytes: share(
                self.throttle_percent_of_memory,
                self.throttle_max_percent_of_cache,
            ),
        };
        debug_assert!(limits.background_bytes <= limits.throttle_bytes);
        limits
    }
}

/// What the writeback thread calls.
pub trait WritebackTarget: Send + Sync {
    /// Write back what the policy says is due.
    fn writeback_tick(&self);
}

pub struct WritebackThread {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl WritebackThread {
    /// Starts the thread; it ends when stopped or when `target` is dropped.
    pub fn spawn(interval: Duration, target: Weak<dyn WritebackTarget>) -> WritebackThread {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("jext-writeback".into())
            .spawn(move || loop {
                {
                    let (lock, cond) = &*thread_stop;
                    let mut stopped = lock.lock();
                    if !*stopped {
                        cond.wait_for(&mut stopped, interval);
                    }
                    if *stopped {
                        return;
                    }
                }
                match target.upgrade() {
                    Some(target) => target.writeback_tick(),
                    None => return,
                }
            })
            .expect("spawning the writeback thread");
        WritebackThread {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        let (lock, cond) = &*self.stop;
        *lock.lock() = true;
        cond.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for WritebackThread {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Counter(AtomicU32);
    impl WritebackTarget for Counter {
        fn writeback_tick(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn ticks_until_stopped() {
        let target = Arc::new(Counter(AtomicU32::new(0)));
        let weak: Weak<dyn WritebackTarget> = Arc::downgrade(&target) as Weak<dyn WritebackTarget>;
        let thread = WritebackThread::spawn(Duration::from_millis(1), weak);
        while target.0.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        thread.stop();
        let after = target.0.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(target.0.load(Ordering::SeqCst), after, "no tick after stop");
    }

    #[test]
    fn dirty_limits_follow_memory_until_the_cache_caps_them() {
        let policy = WritebackPolicy::default();
        let gib = 1usize << 30;
        // A large cache on a small machine: the kernel's ratios of memory.
        let small_machine = policy.dirty_limits(8 * gib, 4 << 30);
        assert_eq!(
            small_machine.background_bytes,
            (4u64 << 30) as usize / 100 * 10
        );
        assert_eq!(
            small_machine.throttle_bytes,
            (4u64 << 30) as usize / 100 * 20
        );
        // A small cache on a large machine: capped by the cache.
        let small_cache = policy.dirty_limits(gib, 64 << 30);
        assert_eq!(small_cache.background_bytes, gib / 100 * 50);
        assert_eq!(small_cache.throttle_bytes, gib / 100 * 75);
    }
}
