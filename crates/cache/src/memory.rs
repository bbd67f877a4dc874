//! How much memory this machine gives jext, for the defaults that the kernel derives from
//! RAM: the cache bound (`cache_size`) and the dirty thresholds of the writeback policy.
//!
//! Promises: the figure is the smaller of physical RAM and the cgroup limit of the
//! process (a container's `memory.max` in cgroup v2, `memory.limit_in_bytes` in v1, where
//! "no limit" is a number larger than RAM), read once per process; when neither can be read
//! it is [`FALLBACK_MEMORY_BYTES`], so a default never depends on a file that is missing.
//! Must never fail or panic: a wrong or unreadable figure only changes a default.

use std::sync::OnceLock;

/// What is assumed when neither RAM nor a cgroup limit can be read.
pub const FALLBACK_MEMORY_BYTES: u64 = 2 << 30;

/// The memory jext may plan with: RAM, or less when a cgroup says so.
pub fn usable_memory_bytes() -> u64 {
    static MEMORY: OnceLock<u64> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        let cgroup = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|text| parse_cgroup_limit(&text))
        };
        let figures = [
            physical_memory_bytes(),
            cgroup("/sys/fs/cgroup/memory.max"),
            cgroup("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        ];
        figures
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(FALLBACK_MEMORY_BYTES)
    })
}

fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysconf reads a configuration value; it takes no pointers and has no
    // preconditions.
    let (pages, page_bytes) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages <= 0 || page_bytes <= 0 {
        return None;
    }
    (pages as u64).checked_mul(page_bytes as u64)
}

/// A cgroup's limit: a byte count, or `max` (v2's "no limit": `None`).
fn parse_cgroup_limit(text: &str) -> Option<u64> {
    text.trim().parse::<u64>().ok().filter(|&bytes| bytes > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroup_limit_is_a_number_or_none() {
        assert_eq!(parse_cgroup_limit("8589934592\n"), Some(8 << 30));
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(
            parse_cgroup_limit("9223372036854771712\n"),
            Some(9223372036854771712)
        );
        assert_eq!(parse_cgroup_limit(""), None);
        assert_eq!(parse_cgroup_limit("0"), None);
    }

    #[test]
    fn usable_memory_is_at_most_ram() {
        let usable = usable_memory_bytes();
        assert!(usable > 0);
        if let Some(ram) = physical_memory_bytes() {
            assert!(usable <= ram, "{usable} above RAM {ram}");
        }
    }
}
