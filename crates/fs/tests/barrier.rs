//! `fbarrier` and `fdatabarrier` (BarrierFS's ordering-only syncs) through the library.
//! A barrier's order is the journal's (`crate::epochs`): it writes nothing to the device
//! and flushes nothing, yet every crash state a device may leave (its volatile cache cut
//! at any point, the order kept) that shows a write made after a barrier shows what the
//! barrier covered. Later writes checked here: a second barrier'd file, an in-place
//! overwrite of another file written back meanwhile, and an fsync of another file, which
//! would otherwise go as a fast commit. On a device with barrier writes and on one
//! without.

use jext_device::SimDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;

const A: &[u8] = b"written first, ordered by fbarrier";
const B: &[u8] = b"written second, ordered by fdatabarrier";
const LATER: &[u8] = b"written after the barriers";
/// An fsync of more than 16 dirty pages, which goes as a fast commit when it can.
const LARGE_SYNC_BYTES: usize = 17 * 4096;
/// Bytes of `/c`, overwritten in place after the barriers: enough to pass the dirty
/// limits of [`small_cache`], so the writer itself writes them back.
const C_BYTES: usize = 3 << 20;

fn fresh(barrier_write: bool) -> Arc<SimDevice> {
    let dev = SimDevice::new(64 << 20);
    let dev = Arc::new(if barrier_write {
        dev.with_barrier_write()
    } else {
        dev
    });
    let opts = MkfsOptions {
        assume_zeroed: true,
        uuid: Some([7; 16]),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    dev
}

/// A page cache small enough that a few MiB of writes are written back by the writer.
fn small_cache() -> MountOptions {
    MountOptions {
        cache_size_bytes: 2 << 20,
        ..MountOptions::default()
    }
}

/// What a recovered file holds: its bytes, or None when it is missing.
fn content(fs: &Fs, path: &str) -> Option<Vec<u8>> {
    let f = fs.open_file(path).ok()?;
    let size = f.stat().unwrap().size as usize;
    Some(f.read_at(0, size).unwrap())
}

struct Seen {
    a: Option<Vec<u8>>,
    b: Option<Vec<u8>>,
    c: Option<Vec<u8>>,
    d: Option<Vec<u8>>,
}

fn recovered(dev: SimDevice) -> Seen {
    let fs = Fs::open(Arc::new(dev), MountOptions::default()).expect("recovery mounts");
    let seen = Seen {
        a: content(&fs, "/a"),
        b: content(&fs, "/b"),
        c: content(&fs, "/c"),
        d: content(&fs, "/d"),
    };
    fs.unmount().unwrap();
    seen
}

/// `/c` (durable, all 1s) overwritten with 2s after the barriers.
fn overwritten(c: &Option<Vec<u8>>) -> bool {
    c.as_deref().is_some_and(|c| c.contains(&2))
}

fn barriers_order_what_they_cover(barrier_write: bool) {
    let dev = fresh(barrier_write);
    let fs = Fs::open(dev.clone(), small_cache()).unwrap();
    let c = fs.create_file("/c", 0o644).unwrap();
    c.write_at(0, &vec![1u8; C_BYTES]).unwrap();
    c.fsync().unwrap();

    let before = fs.counters();
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, A).unwrap();
    a.fbarrier().unwrap();
    let b = fs.create_file("/b", 0o644).unwrap();
    b.write_at(0, B).unwrap();
    // A new file's name and size are metadata: fdatabarrier must order them too, as
    // fdatasync makes them durable.
    b.fdatabarrier().unwrap();
    let after = fs.counters();
    assert_eq!(
        (after.writes, after.flushes),
        (before.writes, before.flushes),
        "a barrier is kept by the journal: no write and no flush on its path"
    );

    // An overwrite in place after the barriers, written back by the writer: it must wait
    // for the barriers' transaction to be durable.
    c.write_at(0, &vec![2u8; C_BYTES]).unwrap();
    let durable_before_c = fs.counters().flushes > after.flushes;
    assert!(
        durable_before_c,
        "the overwrite's writeback waited for the barriers' commit and its flush"
    );
    let cached = dev.pending_writes();
    for kept in 0..=cached {
        let seen = recovered(dev.crash_keeping(|i| i < kept));
        assert!(
            seen.a.as_deref().is_none_or(|d| d == A || d.is_empty()),
            "{kept} cached writes kept: /a holds {:?}",
            seen.a
        );
        if seen.b.as_deref() == Some(B) || overwritten(&seen.c) {
            assert_eq!(
                seen.a.as_deref(),
                Some(A),
                "{kept} kept: a later write without /a"
            );
        }
        if overwritten(&seen.c) {
            assert_eq!(
                seen.b.as_deref(),
                Some(B),
                "{kept} kept: /c's overwrite without /b"
            );
        }
    }
    drop((a, b, c));
    fs.unmount().unwrap();
}

#[test]
fn barriers_order_on_a_device_with_barrier_writes() {
    barriers_order_what_they_cover(true);
}

#[test]
fn barriers_order_on_a_device_that_orders_by_flushing() {
    barriers_order_what_they_cover(false);
}

/// An fsync after a barrier cannot go as a fast commit, which recovery would replay
/// without the running transaction holding the barrier's data: it commits in full, and
/// the barrier'd file is durable with it.
#[test]
fn an_fsync_after_a_barrier_commits_in_full() {
    let dev = fresh(false);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    // Syncs larger than a small append, which would journal the data and commit in full
    // whatever the barrier (`sync_journaling`).
    let large = vec![b'd'; LARGE_SYNC_BYTES];
    let d = fs.create_file("/d", 0o644).unwrap();
    d.write_at(0, &large).unwrap();
    d.fsync().unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, A).unwrap();
    a.fbarrier().unwrap();
    // Appended into new blocks: no overwrite in place, which would wait for the
    // barrier's commit and leave the fast commit nothing to overtake.
    d.write_at(large.len() as u64, &large).unwrap();
    d.write_at(2 * large.len() as u64, LATER).unwrap();
    d.fsync().unwrap();
    let stats = fs.fast_commit_stats();
    assert_eq!(
        stats.fallbacks.get("barrier"),
        Some(&1),
        "the fsync fell back for the barrier: {stats:?}"
    );
    let seen = recovered(dev.crash());
    assert!(seen.d.as_deref().is_some_and(|d| d.ends_with(LATER)));
    assert_eq!(
        seen.a.as_deref(),
        Some(A),
        "/d durable without /a before it"
    );
    drop((a, d));
    fs.unmount().unwrap();
}

/// A barrier on a file with nothing to order still ends an epoch: an fsync of another
/// file after it makes what ran before it (here the creation of `/b`) durable with it.
#[test]
fn a_barrier_on_a_clean_file_still_ends_an_epoch() {
    let dev = fresh(true);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, A).unwrap();
    a.fsync().unwrap();
    let d = fs.create_file("/d", 0o644).unwrap();
    d.fsync().unwrap();
    drop(fs.create_file("/b", 0o644).unwrap());
    a.fdatabarrier().unwrap();
    d.write_at(0, LATER).unwrap();
    d.fsync().unwrap();
    let seen = recovered(dev.crash());
    assert_eq!(seen.d.as_deref(), Some(LATER));
    assert_eq!(
        seen.b.as_deref(),
        Some(&[][..]),
        "/b was created before /a's barrier, /d written after it"
    );
    drop((a, d));
    fs.unmount().unwrap();
}

/// Threads that write and barrier their own files and one shared file at once, beside a
/// reader and the small cache's writeback: every file switches to journaling its data at
/// its first barrier while the others run, holding only the file and its writeback. After
/// the threads: what each file reads is its model, before and after a remount, and the
/// image checks clean.
#[test]
fn barriers_from_many_threads_at_once() {
    const THREADS: usize = 4;
    const WRITES: usize = 150;
    const BLOCKS: u64 = 64;
    let dev = fresh(false);
    let fs = Fs::open(dev.clone(), small_cache()).unwrap();
    let shared = fs.create_file("/shared", 0o644).unwrap();
    shared
        .write_at(0, &vec![0u8; (BLOCKS * 4096) as usize])
        .unwrap();
    shared.fsync().unwrap();
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, shared) = (&fs, &shared);
                s.spawn(move || {
                    let own = fs.create_file(&format!("/own{t}"), 0o644).unwrap();
                    let mut model = vec![0u8; (BLOCKS * 4096) as usize];
                    let mut x = 0x9e37_79b9u64 ^ t as u64;
                    for i in 0..WRITES {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let block = x % BLOCKS;
                        let byte = (t * WRITES + i) as u8 | 1;
                        let at = (block * 4096) as usize;
                        model[at..at + 4096].fill(byte);
                        own.write_at(block * 4096, &model[at..at + 4096]).unwrap();
                        match i % 3 {
                            0 => own.fdatabarrier().unwrap(),
                            1 => own.fbarrier().unwrap(),
                            _ => {
                                // Each thread its own block of the shared file.
                                let mine = (BLOCKS - 1 - t as u64) * 4096;
                                shared.write_at(mine, &[byte; 4096]).unwrap();
                                shared.fdatabarrier().unwrap();
                                own.read_at(at as u64, 4096).unwrap();
                            }
                        }
                    }
                    // The file ends at its last block written.
                    let end = model
                        .chunks(4096)
                        .rposition(|b| b[0] != 0)
                        .map_or(0, |b| b + 1);
                    model.truncate(end * 4096);
                    model
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let check = |fs: &Fs, when: &str| {
        for (t, model) in models.iter().enumerate() {
            let got = content(fs, &format!("/own{t}")).unwrap();
            assert!(got == *model, "/own{t} differs from its model {when}");
        }
    };
    check(&fs, "before the remount");
    drop(shared);
    fs.unmount().unwrap();
    let report = jext_fs::fsck::fsck(dev.clone()).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    let fs = Fs::open(dev, MountOptions::default()).unwrap();
    check(&fs, "after the remount");
    fs.unmount().unwrap();
}
