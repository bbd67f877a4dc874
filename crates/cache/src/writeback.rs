//! The writeback thread: a timer that asks the file system to write back dirty data.
//!
//! The policy is the kernel's default (`dirty_writeback_centisecs` 500,
//! `dirty_expire_centisecs` 3000, `dirty_background_ratio` 10, `dirty_ratio` 20), with the
//! ratios taken of the page cache bound rather than of RAM. Deciding *what* to write is the
//! file system's job ([`WritebackTarget`]); this thread only keeps time.

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
    /// Above this share of the cache bound, write back in the background.
    pub background_percent: u32,
    /// Above this share, writers write back themselves before dirtying more.
    pub throttle_percent: u32,
}

impl Default for WritebackPolicy {
    fn default() -> Self {
        WritebackPolicy {
            interval_ms: 5000,
            expire_ms: 30_000,
            background_percent: 10,
            throttle_percent: 20,
        }
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
}
