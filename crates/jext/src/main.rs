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

fn main() {
    keep_freed_memory();
    let args = cli::Cli::parse();
    std::process::exit(cli::run(args));
}
