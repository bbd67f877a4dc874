//! jext patch: a request thread that served a request polls `/dev/fuse` for a moment
//! before it goes to sleep in `read` (`Config::poll_before_sleep`).
//!
//! Why: a request is a round trip, and each side of it wakes the other. Waking a thread
//! whose CPU went idle is the expensive part on a virtual machine (the idle vCPU halted,
//! and the wake-up is an exit to the host) and on hosts with deep idle states: measured
//! on a 2-vCPU VM unpacking /usr/include through jext, a SETATTR round trip took 40 µs at
//! the median with the server asleep between requests and 7 µs with it polling, for the
//! same work. Requests of one burst (tar's create, write, utimens, chown, chmod) come
//! within tens of microseconds of each other, so a short window catches most of them;
//! between bursts the thread sleeps as before. This is what adaptive polling does in
//! the kernel's own fast paths (cpuidle's haltpoll, NVMe and io_uring polling).
//!
//! Promises: a window of zero never polls; at most one thread of a session polls at a
//! time (the others sleep in `read` at once), so polling never takes more than one CPU;
//! a poller gives its CPU to any runnable thread on every turn and stops once a request
//! is pending or the window has passed.
//!
//! Must never: read a request itself (the blocking read that follows takes it, from
//! whichever thread gets there first), or hold a lock while it polls.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// The polling window and whether some thread is in it, shared by a session's threads.
#[derive(Debug)]
pub(crate) struct PollWait {
    window: Duration,
    polling: AtomicBool,
}

impl PollWait {
    pub(crate) fn new(window: Duration) -> PollWait {
        PollWait {
            window,
            polling: AtomicBool::new(false),
        }
    }

    /// Returns once `fd` has a request pending, the window has passed, or another thread
    /// is polling already. Whether the caller polled.
    pub(crate) fn wait_briefly(&self, fd: BorrowedFd<'_>) -> bool {
        if self.window.is_zero() || self.polling.swap(true, Ordering::Acquire) {
            return false;
        }
        let start = Instant::now();
        while !readable(fd) && start.elapsed() < self.window {
            std::thread::yield_now();
        }
        self.polling.store(false, Ordering::Release);
        true
    }
}

/// Whether a read of `fd` would not block. An error counts as readable: the read that
/// follows reports it.
fn readable(fd: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO) != Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::sync::Arc;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let (read, write) = nix::unistd::pipe().unwrap();
        (read.into(), write.into())
    }

    #[test]
    fn a_zero_window_never_polls() {
        let (read, _write) = pipe();
        assert!(!PollWait::new(Duration::ZERO).wait_briefly(read.as_fd()));
    }

    #[test]
    fn a_pending_request_ends_the_wait_at_once() {
        let (read, mut write) = pipe();
        write.write_all(b"x").unwrap();
        let start = Instant::now();
        assert!(PollWait::new(Duration::from_secs(10)).wait_briefly(read.as_fd()));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn with_nothing_pending_it_polls_for_the_window_and_no_longer() {
        let (read, _write) = pipe();
        let window = Duration::from_millis(20);
        let start = Instant::now();
        assert!(PollWait::new(window).wait_briefly(read.as_fd()));
        let took = start.elapsed();
        assert!(took >= window, "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn only_one_thread_polls_at_a_time() {
        let (read, mut write) = pipe();
        let wait = Arc::new(PollWait::new(Duration::from_secs(10)));
        std::thread::scope(|s| {
            let first = s.spawn(|| wait.wait_briefly(read.as_fd()));
            while !wait.polling.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            // The second comes while the first polls: it goes to sleep at once.
            assert!(!wait.wait_briefly(read.as_fd()));
            write.write_all(b"x").unwrap();
            assert!(first.join().unwrap());
        });
        assert!(!wait.polling.load(Ordering::Acquire));
    }
}
