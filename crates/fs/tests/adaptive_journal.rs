//! `data=adaptive` through the library: SQLite's DELETE, TRUNCATE and PERSIST
//! rollback-journal patterns make the journal's data journaled (born so under a
//! remembered name, switched at a truncate to 0, or after its header was zeroed) while the database and a WAL stay ordered; the choice is
//! the on-disk `j` flag and survives a remount; the user's `chattr ±j` wins; a journaled
//! file that grows big goes back to ordered once. Each image passes fsck afterwards.

use jext_device::SimDevice;
use jext_fs::{fsck, mkfs, AdaptiveJournalStats, FileJournalMode, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;

const PAGE: usize = 4096;
const J_FLAG: u32 = 0x4000;

fn fresh(bytes: u64) -> Arc<SimDevice> {
    let dev = Arc::new(SimDevice::new(bytes));
    let opts = MkfsOptions {
        assume_zeroed: true,
        uuid: Some([7; 16]),
        block_size: Some(PAGE as u32),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    dev
}

fn mount(dev: &Arc<SimDevice>, options: &str) -> Fs {
    Fs::open(dev.clone(), MountOptions::parse(options).unwrap()).expect("mounts")
}

fn unmount_and_check(fs: Fs, dev: &Arc<SimDevice>) {
    fs.unmount().unwrap();
    let report = fsck(dev.clone()).unwrap();
    assert!(report.is_clean(), "fsck: {report:?}");
}

/// Whether the policy chose to journal `f`'s data: its `j` flag. (An ordered file may
/// also journal for a while in memory, after small synced appends; that is not the
/// policy's choice and leaves the flag alone.)
fn j_flag(f: &jext_fs::File) -> bool {
    let on = f.stat().unwrap().flags & J_FLAG != 0;
    assert!(!on || f.journals_data().unwrap(), "the j flag journals");
    on
}

fn journaled(fs: &Fs, path: &str) -> bool {
    j_flag(&fs.open_file(path).unwrap())
}

/// The database: four pages, synced.
fn make_db(fs: &Fs) {
    let db = fs.create_file("/db", 0o644).unwrap();
    db.write_at(0, &[1; 4 * PAGE]).unwrap();
    db.fsync().unwrap();
}

/// One SQLite rollback transaction with `synchronous=FULL`: the journal's header and one
/// page, synced, the header's record count, synced, then the database page, synced.
/// Returns whether the journal journaled its data during the transaction.
fn rollback_transaction(fs: &Fs, t: usize) -> bool {
    let journal = fs.open_file("/db-journal").unwrap();
    journal.write_at(0, &[9; 512]).unwrap();
    journal.write_at(512, &[t as u8; PAGE + 4]).unwrap();
    journal.fsync().unwrap();
    journal.write_at(0, &[8; 28]).unwrap();
    journal.fsync().unwrap();
    let db = fs.open_file("/db").unwrap();
    db.write_at((t % 4 * PAGE) as u64, &[t as u8; PAGE])
        .unwrap();
    db.fsync().unwrap();
    j_flag(&journal)
}

/// The database and four rollback transactions through one kept `/db-journal`, each
/// ended by `end` (TRUNCATE or PERSIST mode); whether the journal journaled its data in
/// each.
fn kept_journal_transactions(fs: &Fs, end: impl Fn(&jext_fs::File)) -> Vec<bool> {
    make_db(fs);
    fs.create_file("/db-journal", 0o644).unwrap();
    (0..4)
        .map(|t| {
            let journaled = rollback_transaction(fs, t);
            end(&fs.open_file("/db-journal").unwrap());
            journaled
        })
        .collect()
}

#[test]
fn delete_mode_journals_are_born_journaled_after_the_first() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=adaptive");
    make_db(&fs);
    let mut seen = Vec::new();
    for t in 0..4 {
        fs.create_file("/db-journal", 0o644).unwrap();
        seen.push(rollback_transaction(&fs, t));
        fs.unlink(fs.root(), b"db-journal").unwrap();
    }
    assert_eq!(
        seen,
        [false, true, true, true],
        "journaled from the second one"
    );
    assert!(!journaled(&fs, "/db"), "the database stays ordered");
    assert_eq!(
        fs.adaptive_journal_stats(),
        AdaptiveJournalStats {
            names_remembered: 4,
            born_journaled: 3,
            ..Default::default()
        }
    );
    // Another directory's file of the same name is another name.
    fs.mkdir_path("/other", 0o755).unwrap();
    fs.create_file("/other/db-journal", 0o644).unwrap();
    assert!(!journaled(&fs, "/other/db-journal"));
    unmount_and_check(fs, &dev);
}

#[test]
fn truncate_mode_journal_switches_at_its_first_truncate_and_stays() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=adaptive");
    let seen = kept_journal_transactions(&fs, |journal| {
        journal.set_len(0).unwrap();
        journal.fsync().unwrap();
    });
    assert_eq!(
        seen,
        [false, true, true, true],
        "switched at the first truncate"
    );
    assert_eq!(fs.adaptive_journal_stats().switched_at_truncate, 1);
    assert!(!journaled(&fs, "/db"));
    unmount_and_check(fs, &dev);
    // The choice is the on-disk flag: it survives a remount, even an ordered one.
    let fs = mount(&dev, "data=ordered");
    assert!(journaled(&fs, "/db-journal"));
    unmount_and_check(fs, &dev);
}

#[test]
fn persist_mode_journal_switches_after_its_first_zeroed_header_and_keeps_its_bytes() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=adaptive");
    let seen = kept_journal_transactions(&fs, |journal| {
        // SQLite's zeroJournalHdr: 28 zero bytes over the header, then a sync.
        journal.write_at(0, &[0; 28]).unwrap();
        journal.fdatasync().unwrap();
    });
    assert_eq!(
        seen,
        [false, true, true, true],
        "switched after the first zeroed header"
    );
    assert_eq!(fs.adaptive_journal_stats().switched_at_zeroed_header, 1);
    assert!(!journaled(&fs, "/db"));
    let mut expected = vec![0u8; 28];
    expected.extend([9; 512 - 28]);
    expected.extend([3; PAGE + 4]);
    let journal = fs.open_file("/db-journal").unwrap();
    assert_eq!(journal.read_at(0, expected.len()).unwrap(), expected);
    drop(journal);
    unmount_and_check(fs, &dev);
    let fs = mount(&dev, "data=ordered");
    assert!(journaled(&fs, "/db-journal"));
    let journal = fs.open_file("/db-journal").unwrap();
    assert_eq!(journal.read_at(0, expected.len()).unwrap(), expected);
    drop(journal);
    unmount_and_check(fs, &dev);
}

#[test]
fn a_wal_and_other_files_stay_ordered() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=adaptive");
    make_db(&fs);
    // WAL: frames appended and synced, then a checkpoint that truncates the log
    // (`wal_checkpoint(TRUNCATE)`) after more than a rollback journal ever holds.
    let wal = fs.create_file("/db-wal", 0o644).unwrap();
    wal.write_at(0, &[3; 32]).unwrap();
    let frame = PAGE + 24;
    for c in 0..300 {
        wal.write_at((32 + c * frame) as u64, &[c as u8; PAGE + 24])
            .unwrap();
        wal.fdatasync().unwrap();
    }
    wal.set_len(0).unwrap();
    wal.fsync().unwrap();
    assert!(!j_flag(&wal), "1.2 MiB of frames is a WAL");
    drop(wal);
    // A temporary file written and deleted without a sync is no rollback journal.
    for _ in 0..2 {
        let tmp = fs.create_file("/tmp-file", 0o644).unwrap();
        tmp.write_at(0, &[5; 100]).unwrap();
        assert!(!j_flag(&tmp));
        drop(tmp);
        fs.unlink(fs.root(), b"tmp-file").unwrap();
    }
    // Nor is a file whose header is zeroed after more than a rollback journal holds.
    let big = fs.create_file("/big", 0o644).unwrap();
    big.write_at(0, &vec![6; 2 << 20]).unwrap();
    big.fsync().unwrap();
    big.write_at(0, &[0; 28]).unwrap();
    assert!(!j_flag(&big));
    drop(big);
    // Nor is an empty file synced and deleted.
    for _ in 0..2 {
        let empty = fs.create_file("/lock", 0o644).unwrap();
        empty.fsync().unwrap();
        assert!(!j_flag(&empty));
        drop(empty);
        fs.unlink(fs.root(), b"lock").unwrap();
    }
    assert_eq!(fs.adaptive_journal_stats(), AdaptiveJournalStats::default());
    unmount_and_check(fs, &dev);
}

#[test]
fn an_ordered_mount_never_chooses() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=ordered");
    make_db(&fs);
    fs.create_file("/db-journal", 0o644).unwrap();
    for t in 0..3 {
        assert!(!rollback_transaction(&fs, t));
        fs.open_file("/db-journal").unwrap().set_len(0).unwrap();
    }
    fs.unlink(fs.root(), b"db-journal").unwrap();
    fs.create_file("/db-journal", 0o644).unwrap();
    assert!(!journaled(&fs, "/db-journal"));
    assert_eq!(fs.adaptive_journal_stats(), AdaptiveJournalStats::default());
    unmount_and_check(fs, &dev);
}

/// A database and its TRUNCATE-mode journal after one transaction, which switched the
/// journal to journaled; returns the journal.
fn switched_journal(fs: &Fs) -> jext_fs::File {
    make_db(fs);
    fs.create_file("/db-journal", 0o644).unwrap();
    rollback_transaction(fs, 0);
    let journal = fs.open_file("/db-journal").unwrap();
    journal.set_len(0).unwrap();
    assert!(j_flag(&journal), "the policy switched it");
    journal
}

#[test]
fn the_users_chattr_wins() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev, "data=adaptive");
    let journal = switched_journal(&fs);
    journal.set_journal_mode(FileJournalMode::Mount).unwrap();
    for t in 1..3 {
        assert!(!rollback_transaction(&fs, t));
        journal.set_len(0).unwrap();
    }
    assert!(!j_flag(&journal), "chattr -j holds");
    assert_eq!(fs.adaptive_journal_stats().switched_at_truncate, 1);
    // chattr +j on a file the policy never touched: it stays journaled however big.
    let big = fs.create_file("/big", 0o644).unwrap();
    big.set_journal_mode(FileJournalMode::Data).unwrap();
    for i in 0..17u64 {
        big.write_at(i << 20, &[i as u8; 1 << 20]).unwrap();
    }
    assert!(j_flag(&big));
    drop((journal, big));
    unmount_and_check(fs, &dev);
}

#[test]
fn a_policy_journaled_file_that_grows_big_goes_back_to_ordered_once() {
    let dev = fresh(96 << 20);
    let fs = mount(&dev, "data=adaptive");
    let journal = switched_journal(&fs);
    // A huge transaction: its journal passes 16 MiB.
    let chunk = vec![6u8; 1 << 20];
    for i in 0..17u64 {
        journal.write_at(i << 20, &chunk).unwrap();
    }
    journal.fsync().unwrap();
    assert!(!j_flag(&journal), "switched off past 16 MiB");
    assert_eq!(journal.read_at(16 << 20, 1 << 20).unwrap(), chunk);
    // Settled: the rollback pattern does not switch it on again in this mount.
    journal.set_len(0).unwrap();
    assert!(!rollback_transaction(&fs, 1));
    journal.set_len(0).unwrap();
    assert!(!j_flag(&journal));
    let stats = fs.adaptive_journal_stats();
    assert_eq!(
        (stats.switched_at_truncate, stats.switched_off_grown),
        (1, 1)
    );
    drop(journal);
    unmount_and_check(fs, &dev);
}
