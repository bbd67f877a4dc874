//! The `jext` command: make, check, inspect and exercise ext4 images with jext.

mod bench;
mod cli;
mod signals;

use clap::Parser;
use std::ffi::c_long;

/// mimalloc rather than glibc's malloc: with glibc, a create in a 10^6-name directory
/// spent 15% of its time in malloc, waiting on the arena lock the commit thread frees
/// into and consolidating, and listing that directory took twice as long.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long freed memory stays with the allocator before going back to the system:
/// twice the default commit interval. Each commit frees a transaction's worth of copies
/// and the next one needs as much again; at mimalloc's default of a second, the commit
/// thread spent half its time zeroing freshly faulted pages (a 10^6-name directory
/// through the library: 156,000 page faults, 35,000 with this).
const FREED_MEMORY_KEPT_MS: c_long = 10_000;

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (the Rust binding does not name
/// it), and the default it has there.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
const MI_DEFAULT_PURGE_DELAY_MS: c_long = 1_000;

/// Sets [`FREED_MEMORY_KEPT_MS`], only where the option still holds mimalloc's default:
/// so neither a user's `MIMALLOC_PURGE_DELAY` nor an option table renumbered by a later
/// mimalloc gets overwritten.
fn keep_freed_memory() {
    // SAFETY: `mi_option_get` and `mi_option_set` read and store one integer of mimalloc's
    // option table (an out-of-range option is ignored by mimalloc), and this runs first in
    // `main`, before any other thread exists.
    unsafe {
        if libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == MI_DEFAULT_PURGE_DELAY_MS {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, FREED_MEMORY_KEPT_MS);
        }
    }
}

/// Turns transparent huge pages off for this process. The first write to a huge page
/// faults in and zeroes 2 MiB at once, on whatever request touched it: through a jext
/// mount, 1,000 appends of 80 KiB into new blocks, each followed by an fsync, had 11–31
/// fsyncs of 3–9 ms (41% of the daemon's CPU was `clear_page_erms` under a huge-page
/// fault while a write request filled new pages) and none with huge pages off, p99 going
/// from 5.4–8.3 ms to 1.0–1.3 ms. Databases that care for latency ask the same of their
/// hosts (Redis, MongoDB). A failure only keeps the system's default.
fn refuse_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE sets a flag of this process's memory map; it takes no
    // pointers, and the unused arguments must be zero.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

fn main() {
    refuse_huge_pages();
    keep_freed_memory();
    let args = cli::Cli::parse();
    std::process::exit(cli::run(args));
}
