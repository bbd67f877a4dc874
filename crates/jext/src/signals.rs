//! SIGINT and SIGTERM as a flag: long commands (bench, mount) poll it and wind down
//! through their normal cleanup instead of dying with loop devices or mounts left behind.
//!
//! Promises: the handler only stores to an atomic (async-signal-safe). Must never do real
//! work inside the handler.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn raise_interrupt_flag(_signal: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to the interrupt flag.
pub fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and it
        // is a plain `extern "C" fn` that lives for the whole program.
        unsafe {
            libc::signal(
                signal,
                raise_interrupt_flag as *const () as libc::sighandler_t,
            );
        }
    }
}

/// Whether SIGINT or SIGTERM has arrived.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An error when the user asked to stop; loops call this between operations.
pub fn check_interrupt() -> io::Result<()> {
    if interrupted() {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
    }
    Ok(())
}
