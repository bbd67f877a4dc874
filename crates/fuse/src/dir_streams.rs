//! Open directories' read-ahead: the entries of a listed batch that did not fit the
//! kernel's READDIR reply, kept per open directory (its FUSE file handle), so that the
//! next READDIR, which resumes right after the last entry sent, takes them instead of
//! listing (and parsing) the same directory blocks again. Without it, a batch of 256
//! entries served through replies of about 128 listed every block of a large directory
//! two or three times.
//!
//! Promises: kept entries go only to the handle they were listed for, and only when the
//! kernel asks for exactly the position after the last entry sent; a seek or a
//! rewinddir drops them. A name added or removed after its batch was listed may be missed
//! or shown, as POSIX allows for changes after opendir or rewinddir. Must never keep
//! more than one batch per open directory, or keep anything after releasedir.

use jext_fs::DirEntry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The read-ahead of every open directory, by file handle.
#[derive(Default)]
pub(crate) struct DirStreams {
    last_handle: AtomicU64,
    kept: Mutex<HashMap<u64, Kept>>,
}

/// What one open directory has listed and not yet sent.
#[derive(Default)]
struct Kept {
    /// The READDIR offset the entries continue at.
    resume_at: u64,
    entries: VecDeque<DirEntry>,
}

impl DirStreams {
    /// A handle for a newly opened directory (never 0, the handle of no stream).
    pub(crate) fn open(&self) -> u64 {
        let handle = self.last_handle.fetch_add(1, Ordering::Relaxed) + 1;
        let mut kept = self.kept.lock().expect("dir streams lock");
        let previous = kept.insert(handle, Kept::default());
        assert!(
            previous.is_none(),
            "directory handle {handle} handed out twice"
        );
        handle
    }

    pub(crate) fn release(&self, handle: u64) {
        self.kept.lock().expect("dir streams lock").remove(&handle);
    }

    /// The entries kept for `handle` if they continue at `offset`; none otherwise (and
    /// what was kept is dropped: the reader moved elsewhere).
    pub(crate) fn take(&self, handle: u64, offset: u64) -> VecDeque<DirEntry> {
        let mut kept = self.kept.lock().expect("dir streams lock");
        match kept.get_mut(&handle) {
            Some(k) if k.resume_at == offset => std::mem::take(&mut k.entries),
            Some(k) => {
                k.entries.clear();
                VecDeque::new()
            }
            None => VecDeque::new(),
        }
    }

    /// Keeps `entries`, the rest of a batch after the entry whose next offset is
    /// `resume_at`, for `handle`'s next READDIR; nothing for a handle not open.
    pub(crate) fn keep(&self, handle: u64, resume_at: u64, entries: VecDeque<DirEntry>) {
        if let Some(k) = self.kept.lock().expect("dir streams lock").get_mut(&handle) {
            *k = Kept { resume_at, entries };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jext_fs::FileKind;

    fn entry(n: u64) -> DirEntry {
        DirEntry {
            ino: n as u32,
            name: format!("f{n}").into_bytes(),
            kind: FileKind::Regular,
            next_cookie: n + 1,
        }
    }

    #[test]
    fn kept_entries_go_only_to_their_handle_at_their_offset() {
        let streams = DirStreams::default();
        let (a, b) = (streams.open(), streams.open());
        assert_ne!(a, b);
        assert_ne!(a, 0);
        streams.keep(a, 10, (10..20).map(entry).collect());
        assert!(streams.take(b, 10).is_empty(), "another handle");
        assert_eq!(streams.take(a, 10).len(), 10);
        assert!(streams.take(a, 10).is_empty(), "taken once");
        streams.keep(a, 10, (10..20).map(entry).collect());
        assert!(streams.take(a, 0).is_empty(), "a rewind drops them");
        assert!(streams.take(a, 10).is_empty(), "dropped for good");
        streams.release(a);
        streams.keep(a, 10, (10..20).map(entry).collect());
        assert!(
            streams.take(a, 10).is_empty(),
            "nothing kept for a released handle"
        );
        streams.keep(0, 10, (10..20).map(entry).collect());
        assert!(streams.take(0, 10).is_empty(), "nor for handle 0");
    }
}
