//! The sync threads: fsync, fdatasync, fsyncdir and syncfs requests run here, not on the
//! request thread that read them. Each waits for a device flush, hundreds of microseconds
//! to milliseconds; a request thread held that long serves nobody meanwhile. With the
//! default two request threads, two fsyncs in flight stopped every other request of the
//! mount, and no more than two fsyncs could ever share a flush (varmail through the mount,
//! 4 threads: 0.66-0.70× ext4 ordered with the fsyncs on the request threads, 0.85-1.05×
//! with four request threads). A request thread hands the request and its reply to a sync
//! thread and goes back to the kernel at once; the sync thread runs it and replies.
//!
//! Promises: every job handed over runs and replies, also one queued when the pool stops
//! (stopping drains the queue before the threads exit). Order between a sync and other
//! requests of the same file stays the kernel's: it holds the file's inode lock until the
//! sync's reply, which a sync thread sends as a request thread would. On the io_uring
//! transport a ring entry's thread still waits for its reply, so nothing is gained there
//! (and nothing lost). Must never take a request that does not wait for the device.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Sync threads of a mount: as many fsyncs as can usefully share one flush (dwsl's eight
/// threads each fsync at once). Idle ones cost a blocked thread each.
const SYNC_THREADS: usize = 8;

/// A sync to run and answer.
pub(crate) type SyncJob = Box<dyn FnOnce() + Send>;

/// The pool; see the module documentation.
pub(crate) struct SyncThreads {
    /// `None` once stopped.
    jobs: Mutex<Option<Sender<SyncJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl SyncThreads {
    pub(crate) fn start() -> SyncThreads {
        let (sender, receiver) = channel::<SyncJob>();
        let receiver = Arc::new(Mutex::new(receiver));
        let threads = (0..SYNC_THREADS)
            .map(|i| {
                let receiver = Arc::clone(&receiver);
                std::thread::Builder::new()
                    .name(format!("jext-sync-{i}"))
                    .spawn(move || run(&receiver))
                    .expect("a sync thread can be started")
            })
            .collect();
        SyncThreads {
            jobs: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
        }
    }

    /// Runs `job` on a sync thread; on the caller's thread if the pool has stopped (the
    /// session is ending: the reply must still go out).
    pub(crate) fn run(&self, job: SyncJob) {
        let sender = self
            .jobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        match sender {
            Some(sender) => {
                if let Err(returned) = sender.send(job) {
                    (returned.0)();
                }
            }
            None => job(),
        }
    }

    /// Lets the queued jobs finish and ends the threads. A second call does nothing.
    pub(crate) fn stop(&self) {
        drop(
            self.jobs
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .take(),
        );
        let threads = std::mem::take(
            &mut *self
                .threads
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for thread in threads {
            // A job that panicked already failed its request (its reply, dropped, answers
            // EIO); the others must still stop.
            let _ = thread.join();
        }
    }
}

impl Drop for SyncThreads {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A sync thread: takes jobs until the pool stops and the queue is empty.
fn run(receiver: &Mutex<Receiver<SyncJob>>) {
    loop {
        let job = receiver
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .recv();
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Barrier;

    #[test]
    fn jobs_wait_side_by_side_and_all_run_before_stop_returns() {
        let pool = SyncThreads::start();
        // Every thread must hold a job at once for the barrier to open: a pool that ran
        // them one after another would hang here.
        let all_waiting = Arc::new(Barrier::new(SYNC_THREADS));
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..SYNC_THREADS {
            let (all_waiting, done) = (Arc::clone(&all_waiting), Arc::clone(&done));
            pool.run(Box::new(move || {
                all_waiting.wait();
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        for _ in 0..100 {
            let done = Arc::clone(&done);
            pool.run(Box::new(move || {
                done.fetch_add(1, Ordering::SeqCst);
            }));
        }
        pool.stop();
        assert_eq!(done.load(Ordering::SeqCst), SYNC_THREADS + 100);
        // Stopped: a late job runs on the caller's thread.
        let late = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&late);
        pool.run(Box::new(move || {
            seen.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(late.load(Ordering::SeqCst), 1);
    }
}
