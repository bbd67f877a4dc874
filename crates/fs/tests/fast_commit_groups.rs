//! Fast commits of several threads' fsyncs written as groups: threads append to files of
//! their own and fsync after each append, the image is copied while jext still has it
//! open (as a crash would leave it: the running transaction never committed), and jext's
//! recovery must give back every byte each fsync promised. Fewer fast commits than
//! fsyncs reach the journal, or the threads were never grouped.

mod common;

use common::{assert_e2fsck_clean, Scratch};
use jext_device::FileDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions, SmallSyncs};
use std::sync::Arc;

const THREADS: usize = 2;
const APPENDS: usize = 40;
const APPEND_BYTES: usize = 3_000;

fn contents(thread: usize) -> Vec<u8> {
    (0..APPENDS * APPEND_BYTES)
        .map(|i| (i as u8).wrapping_mul(13) ^ (thread as u8 * 41))
        .collect()
}

#[test]
fn grouped_fast_commits_recover_every_fsynced_append() {
    let scratch = Scratch::new("fast-commit-groups");
    let image = scratch.path("a.img");
    let dev = Arc::new(FileDevice::create(&image, 256 << 20).unwrap());
    let mkfs_options = MkfsOptions {
        fast_commit: true,
        ..MkfsOptions::default()
    };
    mkfs(dev, &mkfs_options).unwrap();
    let options = MountOptions {
        // Every synced append as an i-transaction, not journaled (`small_syncs=journal`).
        small_syncs: SmallSyncs::InPlace,
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&image, options).unwrap();
    // The files exist durably before the threads start: only appends are left to group.
    for t in 0..THREADS {
        fs.create_file(&format!("/f{t}"), 0o644).unwrap();
    }
    fs.sync().unwrap();
    let fsyncs_before = fs.fast_commit_stats().fast_commits;
    let groups_before = fs.journal_stats().fast_commits;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = &fs;
            s.spawn(move || {
                let file = fs.open_file(&format!("/f{t}")).unwrap();
                let data = contents(t);
                for (i, chunk) in data.chunks(APPEND_BYTES).enumerate() {
                    file.write_at((i * APPEND_BYTES) as u64, chunk).unwrap();
                    file.fsync().unwrap();
                }
            });
        }
    });
    let fsyncs = fs.fast_commit_stats().fast_commits - fsyncs_before;
    let groups = fs.journal_stats().fast_commits - groups_before;
    eprintln!("{fsyncs} fsyncs as fast commits, written in {groups} groups");
    assert_eq!(
        fsyncs,
        (THREADS * APPENDS) as u64,
        "every fsync a fast commit"
    );
    assert!(
        groups * 10 <= fsyncs * 9,
        "{THREADS} threads' {fsyncs} fsyncs went out in {groups} fast commits: hardly grouped"
    );

    let crashed = scratch.path("crashed.img");
    std::fs::copy(&image, &crashed).unwrap();
    drop(fs);
    let recovered = Fs::open_path(&crashed, MountOptions::default()).unwrap();
    for t in 0..THREADS {
        let file = recovered.open_file(&format!("/f{t}")).unwrap();
        let len = file.stat().unwrap().size as usize;
        assert_eq!(len, APPENDS * APPEND_BYTES, "/f{t}: every fsynced append");
        assert!(
            file.read_at(0, len).unwrap() == contents(t),
            "/f{t}: its bytes"
        );
    }
    recovered.unmount().unwrap();
    assert_e2fsck_clean(&crashed);
}
