//! Each file its own journal mode (`chattr +j`, [`File::set_journal_mode`]) in an ordered
//! mount: inheritance from the directory, data of `+j` files through the journal and of
//! the others in place, the switch's safe points (switching off flushes the journal, so an
//! in-place write is never overwritten at replay by an older journaled copy), and blocks
//! freed from a journaled file revoked, so an ordered file reusing them keeps its data
//! after recovery. Crashes are a simulated device's cache cut at every point.

mod common;

use common::fresh_sim_fs as fresh;
use jext_device::SimDevice;
use jext_fs::{FileJournalMode, Fs, MountOptions, SmallSyncs};
use std::sync::Arc;

const BLOCK: usize = 4096;

/// Only the flags decide: an ordered file's small synced appends go in place, not through
/// the journal for a while (`small_syncs=journal`, the default).
fn mount(dev: Arc<SimDevice>) -> Fs {
    let options = MountOptions {
        small_syncs: SmallSyncs::InPlace,
        ..MountOptions::default()
    };
    Fs::open(dev, options).expect("mounts")
}

/// What `path` holds after recovery on `dev`, and an fsck of the recovered image.
fn recovered(dev: SimDevice, path: &str) -> Vec<u8> {
    common::recovered_content(dev, path, MountOptions::default())
}

fn pattern(byte: u8, blocks: usize) -> Vec<u8> {
    vec![byte; blocks * BLOCK]
}

/// The distinct bytes of `data`, in order of first appearance (a short view of a block
/// pattern for failure messages).
fn bytes_seen(data: &[u8]) -> Vec<u8> {
    let mut seen = Vec::new();
    for &b in data {
        if !seen.contains(&b) {
            seen.push(b);
        }
    }
    seen
}

#[test]
fn j_is_inherited_and_journals_only_that_files_data() {
    let dev = fresh();
    let fs = mount(dev);
    let dir = fs.mkdir_path("/logs", 0o755).unwrap();
    fs.set_journal_mode(dir.ino, FileJournalMode::Data).unwrap();
    let journaled = fs.create_file("/logs/rollback", 0o644).unwrap();
    let ordered = fs.create_file("/db", 0o644).unwrap();
    assert!(journaled.journals_data().unwrap(), "+j is inherited");
    assert_ne!(journaled.stat().unwrap().flags & 0x4000, 0);
    assert!(!ordered.journals_data().unwrap());
    assert!(
        !fs.journals_data(dir.ino).unwrap(),
        "a directory's data is metadata"
    );

    let logged = |f: &jext_fs::File, byte| {
        let before = fs.journal_stats().blocks_logged;
        f.write_at(0, &pattern(byte, 16)).unwrap();
        f.fsync().unwrap();
        fs.journal_stats().blocks_logged - before
    };
    let ordered_cost = logged(&ordered, 1);
    let journaled_cost = logged(&journaled, 2);
    assert!(
        ordered_cost < 16,
        "ordered data is not logged ({ordered_cost})"
    );
    assert!(
        journaled_cost >= 16,
        "16 data blocks logged besides the metadata ({journaled_cost})"
    );
    // Overwrites too: the ordered one goes in place, the journaled one through the log.
    assert!(logged(&ordered, 3) < 16);
    assert!(logged(&journaled, 4) >= 16);
    assert!(journaled.read_at(0, 16 * BLOCK).unwrap() == pattern(4, 16));
    assert!(ordered.read_at(0, 16 * BLOCK).unwrap() == pattern(3, 16));
    drop((journaled, ordered));
    fs.unmount().unwrap();
}

/// `-j` flushes the journal before the flag clears: the journaled copy of an older
/// version is checkpointed, so an in-place overwrite after the switch is what recovery
/// shows, at every crash point after its fsync.
#[test]
fn switching_off_flushes_the_journal_first() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let f = fs.create_file("/f", 0o644).unwrap();
    f.set_journal_mode(FileJournalMode::Data).unwrap();
    f.write_at(0, &pattern(0xAA, 4)).unwrap();
    f.fsync().unwrap();
    let before = fs.journal_stats();
    f.set_journal_mode(FileJournalMode::Mount).unwrap();
    assert!(!f.journals_data().unwrap());
    assert!(
        fs.journal_stats().checkpoints > before.checkpoints,
        "the switch checkpointed the journal"
    );
    f.write_at(0, &pattern(0xBB, 4)).unwrap();
    f.fsync().unwrap();
    assert!(f.read_at(0, 4 * BLOCK).unwrap() == pattern(0xBB, 4));
    let pending = dev.pending_writes();
    for kept in 0..=pending {
        let got = recovered(dev.crash_keeping(|i| i < kept), "/f");
        assert!(
            got == pattern(0xBB, 4),
            "{kept} of {pending} cached writes kept: bytes {:x?}",
            bytes_seen(&got)
        );
    }
    drop(f);
    fs.unmount().unwrap();
}

/// `+j` writes the ordered pages back first; afterwards each commit is atomic for the
/// file's data: every crash shows the old version or the new, never a mix.
#[test]
fn switching_on_makes_each_commit_atomic_for_the_data() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let f = fs.create_file("/f", 0o644).unwrap();
    f.write_at(0, &pattern(1, 8)).unwrap();
    f.fsync().unwrap();
    f.write_at(0, &pattern(2, 8)).unwrap();
    // Dirty ordered pages at the switch: written back before the flag changes.
    f.set_journal_mode(FileJournalMode::Data).unwrap();
    assert!(f.journals_data().unwrap());
    f.fsync().unwrap();
    f.write_at(0, &pattern(3, 8)).unwrap();
    let durable = recovered(dev.crash(), "/f");
    assert!(durable == pattern(2, 8), "bytes {:?}", bytes_seen(&durable));
    f.fsync().unwrap();
    let pending = dev.pending_writes();
    let mut seen_new = false;
    for kept in 0..=pending {
        let got = recovered(dev.crash_keeping(|i| i < kept), "/f");
        seen_new |= got == pattern(3, 8);
        assert!(
            got == pattern(2, 8) || got == pattern(3, 8),
            "{kept} of {pending} kept: a mix of versions {:?}",
            bytes_seen(&got)
        );
    }
    assert!(seen_new, "the last crash point keeps the fsynced version");
    drop(f);
    fs.unmount().unwrap();
}

/// Blocks freed from a journaled file are revoked: an ordered file that reuses them
/// keeps its own data after recovery, although the log still holds the journaled copies.
#[test]
fn blocks_freed_from_a_journaled_file_are_revoked_before_reuse() {
    let dev = fresh();
    let fs = mount(dev.clone());
    let j = fs.create_file("/j", 0o644).unwrap();
    j.set_journal_mode(FileJournalMode::Data).unwrap();
    j.write_at(0, &pattern(0x11, 8)).unwrap();
    j.fsync().unwrap();
    let freed: Vec<u64> = fs
        .extents(j.ino())
        .unwrap()
        .iter()
        .flat_map(|e| e.start..e.start + u64::from(e.len))
        .collect();
    drop(j);
    let revokes = fs.journal_stats().revokes_logged;
    fs.unlink(fs.root(), b"j").unwrap();
    fs.sync().unwrap();
    assert!(
        fs.journal_stats().revokes_logged >= revokes + freed.len() as u64,
        "every freed block that has a copy in the log is revoked"
    );
    let o = fs.create_file("/o", 0o644).unwrap();
    o.write_at(0, &pattern(0x22, 8)).unwrap();
    o.fsync().unwrap();
    let reused = fs
        .extents(o.ino())
        .unwrap()
        .iter()
        .flat_map(|e| e.start..e.start + u64::from(e.len))
        .filter(|b| freed.contains(b))
        .count();
    assert!(reused > 0, "the ordered file reuses the freed blocks");
    assert_eq!(
        fs.journal_stats().checkpoints,
        0,
        "the journaled copies are still in the log"
    );
    let pending = dev.pending_writes();
    for kept in [0, pending] {
        let got = recovered(dev.crash_keeping(|i| i < kept), "/o");
        assert!(
            got == pattern(0x22, 8),
            "{kept} of {pending} kept: bytes {:x?}, a journaled copy replayed",
            bytes_seen(&got)
        );
    }
    drop(o);
    fs.unmount().unwrap();
}
