//! Small writes to blocks the log holds no version of ("cold": read from home after a
//! mount, or checkpointed since) go to the log as the bytes they changed on the home
//! block (the journal's home bases, `jext_journal` commit), and recovery rebuilds them
//! exactly: after a crash that keeps the commit, after one that tears the checkpoint's
//! home write at every sector, and never with a newly allocated block's garbage taken
//! for a base. Also the switch to `+j`: data written in place before it must be durable
//! before a record may rest on it.

mod common;

use common::{assert_e2fsck_clean, fresh_sim_fs as fresh, Scratch};
use jext_device::{BlockDevice, Kept, LoggedOp, Selection, SimDevice};
use jext_fs::{fsck, DataMode, FileJournalMode, Fs, MountOptions};
use jext_journal::JournalStats;
use std::sync::Arc;

const BLOCK: usize = 4096;
/// Blocks of the durable file the small writes land in.
const FILE_BLOCKS: usize = 32;
/// A database's row update.
const SMALL: usize = 100;

/// No timer commits: only the test's syncs commit.
fn options(data_mode: DataMode) -> MountOptions {
    MountOptions {
        data_mode,
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    }
}

/// Bytes that differ at every position and between `seed`s, never zero.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(7)
                .wrapping_add(seed.wrapping_mul(31))
                | 1
        })
        .collect()
}

/// How the file comes to journal its data.
#[derive(Clone, Copy, Debug)]
enum Journaled {
    /// `data=journal`: every file, from its first write.
    Mount,
    /// `chattr +j` in an ordered mount, after its data was written in place.
    Chattr,
}

impl Journaled {
    fn options(self) -> MountOptions {
        match self {
            Journaled::Mount => options(DataMode::Journal),
            Journaled::Chattr => options(DataMode::Ordered),
        }
    }
}

/// A durable data-journaled `/db` of [`FILE_BLOCKS`] blocks on a cleanly unmounted image:
/// its blocks are at home, the log is empty. Returns its bytes.
fn durable_file(dev: &Arc<SimDevice>, how: Journaled) -> Vec<u8> {
    let fs = Fs::open(dev.clone(), how.options()).unwrap();
    let f = fs.create_file("/db", 0o644).unwrap();
    let data = pattern(1, FILE_BLOCKS * BLOCK);
    f.write_at(0, &data).unwrap();
    f.fsync().unwrap();
    if let Journaled::Chattr = how {
        f.set_journal_mode(FileJournalMode::Data).unwrap();
    }
    assert!(f.journals_data().unwrap());
    drop(f);
    fs.unmount().unwrap();
    data
}

/// What `/db` holds after recovery on `dev` (checked by jext's fsck, and by e2fsck when
/// `e2fsck_image` names where to write the image).
fn recovered(dev: SimDevice, how: Journaled, e2fsck_image: Option<&std::path::Path>) -> Vec<u8> {
    let dev = Arc::new(dev);
    let fs = Fs::open(dev.clone(), how.options()).expect("recovers and mounts");
    let f = fs.open_file("/db").expect("the file survives");
    let size = f.stat().unwrap().size as usize;
    let data = f.read_at(0, size).unwrap();
    drop(f);
    fs.unmount().unwrap();
    let report = fsck(dev.clone()).unwrap();
    assert!(report.is_clean(), "fsck after recovery: {report:?}");
    if let Some(image) = e2fsck_image {
        dev.write_durable_image(image).unwrap();
        assert_e2fsck_clean(image);
    }
    data
}

/// Where the bytes of a file differ from what they should be, for failure messages.
fn differences(got: &[u8], want: &[u8]) -> String {
    if got.len() != want.len() {
        return format!("{} bytes, want {}", got.len(), want.len());
    }
    let wrong: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    match (wrong.first(), wrong.last()) {
        (Some(first), Some(last)) => format!("{} bytes differ in {first}..={last}", wrong.len()),
        _ => "none differ".into(),
    }
}

/// One small overwrite and an fsync; returns what that commit cost the log.
fn small_write(fs: &Fs, f: &jext_fs::File, offset: usize, seed: u8, want: &mut [u8]) -> Cost {
    let before = fs.journal_stats();
    let bytes = pattern(seed, SMALL);
    f.write_at(offset as u64, &bytes).unwrap();
    want[offset..offset + SMALL].copy_from_slice(&bytes);
    f.fsync().unwrap();
    Cost::between(&before, &fs.journal_stats())
}

/// What commits between two stats took.
#[derive(Debug)]
struct Cost {
    commits: u64,
    log_bytes: u64,
    record_bytes: u64,
    records_on_home: u64,
    whole_blocks: u64,
}

impl Cost {
    fn between(before: &JournalStats, after: &JournalStats) -> Cost {
        let records = after.blocks_as_records - before.blocks_as_records;
        Cost {
            commits: after.commits - before.commits,
            log_bytes: after.log_bytes - before.log_bytes,
            record_bytes: after.record_bytes - before.record_bytes,
            records_on_home: after.records_on_home - before.records_on_home,
            whole_blocks: after.blocks_logged - before.blocks_logged - records,
        }
    }
}

/// The brief's case: a 100-byte overwrite of a cold block of a durable data-journaled
/// file commits as byte records (the data block's and its inode's, both on their home
/// blocks), and a crash right after the fsync recovers exactly those bytes.
#[test]
fn a_cold_small_overwrite_commits_as_records_and_survives_a_crash() {
    let scratch = Scratch::new("cold-records");
    for how in [Journaled::Mount, Journaled::Chattr] {
        let dev = fresh();
        let mut want = durable_file(&dev, how);
        // A new mount: nothing of the file is cached or in the log.
        let fs = Fs::open(dev.clone(), how.options()).unwrap();
        let f = fs.open_file("/db").unwrap();
        for (round, block) in [3usize, 17, 29, 3].into_iter().enumerate() {
            let offset = block * BLOCK + 1000 + round * 13;
            let cost = small_write(&fs, &f, offset, 10 + round as u8, &mut want);
            eprintln!("{how:?}, round {round} (block {block}): {cost:?}");
            assert_eq!(cost.commits, 1, "{how:?}: one commit per fsync");
            assert_eq!(
                cost.whole_blocks, 0,
                "{how:?}, round {round}: nothing goes whole ({cost:?})"
            );
            // A records block and the commit block, where whole copies took four blocks
            // (descriptor, data block, inode-table block, commit block).
            assert!(
                cost.log_bytes <= 2 * BLOCK as u64,
                "{how:?}, round {round}: {cost:?}"
            );
            assert!(
                cost.record_bytes < 512,
                "{how:?}, round {round}: {} bytes of records for a {SMALL}-byte write",
                cost.record_bytes
            );
            if round < 3 {
                // The block was never logged in this mount: its record rests on home.
                assert!(
                    cost.records_on_home >= 1,
                    "{how:?}, round {round}: {cost:?}"
                );
            }
        }
        drop(f);
        let image = scratch.path("cold.img");
        let got = recovered(dev.crash(), how, Some(&image));
        assert!(got == want, "{how:?}: {}", differences(&got, &want));
        fs.unmount().unwrap();
    }
}

/// The checkpoint writes a cold block's new version home over its old one; a crash that
/// tears that write at any sector (or loses it, or keeps it) while the log still holds
/// the record finds a home block mixing the two versions sector by sector, and the
/// record, applied on it, must give the new version exactly. At each crash point the
/// newest write, if it goes to one of the blocks, is cut after and torn at every sector
/// (the states where an older one is torn are those of the point where it was newest).
#[test]
fn a_checkpoint_torn_at_every_sector_still_replays_records_on_home() {
    let dev = fresh();
    let how = Journaled::Mount;
    let mut want = durable_file(&dev, how);
    let fs = Fs::open(dev.clone(), how.options()).unwrap();
    let f = fs.open_file("/db").unwrap();
    let ino = f.ino();
    // Each block gets small writes at both ends, so its two versions differ in its first
    // and last sectors and nowhere between.
    let blocks = [5usize, 6, 20];
    for (i, &block) in blocks.iter().enumerate() {
        for (j, at) in [40, BLOCK - SMALL - 40].into_iter().enumerate() {
            let seed = 50 + (i * 2 + j) as u8;
            let bytes = pattern(seed, SMALL);
            let offset = block * BLOCK + at;
            f.write_at(offset as u64, &bytes).unwrap();
            want[offset..offset + SMALL].copy_from_slice(&bytes);
        }
    }
    let before = fs.journal_stats();
    f.fsync().unwrap();
    let cost = Cost::between(&before, &fs.journal_stats());
    assert_eq!(cost.whole_blocks, 0, "{cost:?}");
    assert!(cost.records_on_home >= blocks.len() as u64, "{cost:?}");
    let homes: Vec<u64> = {
        let extents = fs.extents(ino).unwrap();
        blocks
            .iter()
            .map(|&b| {
                let e = extents
                    .iter()
                    .find(|e| (e.logical as usize..e.end() as usize).contains(&b))
                    .expect("the block is mapped");
                e.start + (b as u64 - u64::from(e.logical))
            })
            .collect()
    };
    // The checkpoint: a remount read-only writes every logged block home, flushes, and
    // only then marks the log empty.
    dev.start_capture();
    fs.remount(true).unwrap();
    let capture = dev.take_capture().unwrap();
    drop(f);
    let touches_home = |offset: u64, len: usize| {
        homes.iter().any(|&h| {
            let start = h * BLOCK as u64;
            offset < start + BLOCK as u64 && start < offset + len as u64
        })
    };
    let home_writes = capture
        .ops()
        .iter()
        .filter(|op| matches!(op, LoggedOp::Write { offset, data, .. } if touches_home(*offset, data.len())))
        .count();
    assert!(home_writes >= 1, "the checkpoint wrote the blocks home");
    let mut cursor = capture.cursor();
    let (mut states, mut torn_home) = (0, 0);
    for upto in 0..=capture.ops().len() {
        let window = capture.window(upto);
        let mut selections = vec![Selection::nothing(window.len())];
        selections.push(Selection(vec![Kept::Whole; window.len()]));
        let newest = window.len().checked_sub(1).map(|i| (i, &window[i]));
        if let Some((i, w)) = newest.filter(|(_, w)| touches_home(w.offset, w.len_bytes)) {
            for at in 0..w.sectors() {
                for keep_before in [true, false] {
                    let mut kept = vec![Kept::Whole; window.len()];
                    kept[i] = Kept::Sectors(
                        (0..w.sectors())
                            .map(|s| if keep_before { s < at } else { s != at })
                            .collect(),
                    );
                    selections.push(Selection(kept));
                }
            }
            torn_home += 1;
        }
        for selection in selections {
            states += 1;
            let state = cursor.state(upto, &selection);
            let got = recovered(state, how, None);
            assert!(
                got == want,
                "crash after {upto} of {} requests keeping {selection}: {}",
                capture.ops().len(),
                differences(&got, &want)
            );
        }
    }
    assert!(torn_home > 0, "no crash point found a home write to tear");
    eprintln!(
        "{states} crash states of the checkpoint ({home_writes} home writes of the blocks, \
         torn at every sector at {torn_home} points) recover the records exactly"
    );
    fs.unmount().unwrap();
}

/// A block just allocated holds garbage at home, and its page starts as zeros: its first
/// commit must not rest a record on its home (it goes ZEROED), or recovery would show the
/// garbage around the written bytes.
#[test]
fn a_newly_allocated_block_never_takes_its_home_for_a_base() {
    let dev = fresh();
    // Garbage on free blocks: a file of 0xEE written in place, made durable, deleted.
    {
        let fs = Fs::open(dev.clone(), options(DataMode::Ordered)).unwrap();
        let g = fs.create_file("/garbage", 0o644).unwrap();
        g.write_at(0, &vec![0xEE; 256 * BLOCK]).unwrap();
        g.fsync().unwrap();
        drop(g);
        fs.unlink(fs.root(), b"garbage").unwrap();
        fs.unmount().unwrap();
    }
    let fs = Fs::open(dev.clone(), options(DataMode::Journal)).unwrap();
    let f = fs.create_file("/db", 0o644).unwrap();
    let bytes = pattern(3, SMALL);
    f.write_at(1000, &bytes).unwrap();
    let before = fs.journal_stats();
    f.fsync().unwrap();
    let cost = Cost::between(&before, &fs.journal_stats());
    let extents = fs.extents(f.ino()).unwrap();
    let home = extents[0].start;
    let mut at_home = vec![0u8; BLOCK];
    dev.read_at(home * BLOCK as u64, &mut at_home).unwrap();
    assert!(
        at_home.iter().all(|&b| b == 0xEE),
        "the new block {home} should hold the deleted file's garbage at home"
    );
    eprintln!("new block {home} over garbage: {cost:?}");
    assert_eq!(cost.whole_blocks, 0, "a ZEROED record, not a whole block");
    drop(f);
    let mut want = vec![0u8; 1000 + SMALL];
    want[1000..].copy_from_slice(&bytes);
    let got = recovered(dev.crash(), Journaled::Mount, None);
    assert!(got == want, "{}", differences(&got, &want));
    fs.unmount().unwrap();
}

/// `chattr +j` writes the file's dirty pages in place and then flushes: a later small
/// write's record rests on those bytes, so they must be durable before it can commit.
/// Every crash state from the switch on (each prefix of the cached writes, and each with
/// one write lost) shows block 1 as it was before the switch (pattern 1, or the overwrite
/// it wrote in place) or with the small write on the overwrite, never the small write on
/// pattern 1 (what a commit replayed over a lost in-place write gives without the flush).
#[test]
fn switching_on_flushes_what_it_wrote_in_place() {
    let dev = fresh();
    {
        let fs = Fs::open(dev.clone(), options(DataMode::Ordered)).unwrap();
        let f = fs.create_file("/db", 0o644).unwrap();
        f.write_at(0, &pattern(1, 4 * BLOCK)).unwrap();
        f.fsync().unwrap();
        drop(f);
        fs.unmount().unwrap();
    }
    let fs = Fs::open(dev.clone(), options(DataMode::Ordered)).unwrap();
    let f = fs.open_file("/db").unwrap();
    let mut want = pattern(1, 4 * BLOCK);
    let old = want.clone();
    // Overwritten in place by the switch's writeback, never synced by the test.
    let overwrite = pattern(2, BLOCK);
    f.write_at(BLOCK as u64, &overwrite).unwrap();
    want[BLOCK..2 * BLOCK].copy_from_slice(&overwrite);
    let switched = want.clone();
    dev.start_capture();
    f.set_journal_mode(FileJournalMode::Data).unwrap();
    let cost = small_write(&fs, &f, BLOCK + 500, 3, &mut want);
    let capture = dev.take_capture().unwrap();
    assert!(cost.records_on_home >= 1, "{cost:?}");
    assert_eq!(cost.whole_blocks, 0, "{cost:?}");
    drop(f);
    let mut cursor = capture.cursor();
    let mut states = 0;
    for upto in 0..=capture.ops().len() {
        let n = capture.window(upto).len();
        let mut selections: Vec<Selection> = (0..=n)
            .map(|kept| {
                Selection(
                    (0..n)
                        .map(|i| if i < kept { Kept::Whole } else { Kept::Nothing })
                        .collect(),
                )
            })
            .collect();
        selections.extend((0..n).map(|lost| {
            Selection(
                (0..n)
                    .map(|i| {
                        if i == lost {
                            Kept::Nothing
                        } else {
                            Kept::Whole
                        }
                    })
                    .collect(),
            )
        }));
        for selection in selections {
            states += 1;
            let got = recovered(cursor.state(upto, &selection), Journaled::Chattr, None);
            assert!(
                got == old || got == switched || got == want,
                "crash after {upto} of {} requests keeping {selection}: block 1 is neither \
                 before nor after the small write ({} against the version with it)",
                capture.ops().len(),
                differences(&got, &want)
            );
        }
    }
    eprintln!("{states} crash states around the switch and the small write");
    let got = recovered(dev.crash(), Journaled::Chattr, None);
    assert!(got == want, "{}", differences(&got, &want));
    fs.unmount().unwrap();
}
