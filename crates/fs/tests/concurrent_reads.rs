//! Reads that go to the device with the file's inode released, against a writer that
//! truncates the file, lets another file take its freed blocks, and rewrites it. A page
//! (one block) a reader gets must be one the file held at some moment: all one version's
//! bytes (or zeros), never the other file's bytes that a block freed meanwhile came to
//! hold, never a mix. (A read of several blocks may see different versions in different
//! blocks, as on Linux, where reads are not atomic across pages.) The page cache is kept small so reads keep missing it, and the device takes its
//! time over reads so the writer gets to run while one is under way.

mod common;

use common::{DeviceHook, HookedDevice};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const PAGES: u64 = 256;
const PAGE: usize = 4096;
/// The reused blocks of the other file hold bytes from here up.
const OTHER_FILE: u8 = 200;

/// Reads that take a while (writes and flushes as the simulator's).
struct SlowReads;

impl DeviceHook for SlowReads {
    fn before_read(&self, _offset: u64, _len: usize) {
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
    fn name(&self) -> &'static str {
        "slow reads"
    }
}

/// Formats `dev` and returns mount options whose page cache is small enough that reads
/// miss and go to the device.
fn format_small_cache(dev: Arc<dyn jext_device::BlockDevice>) -> MountOptions {
    let opts = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev, &opts).unwrap();
    MountOptions {
        cache_size_bytes: 1 << 20,
        ..MountOptions::default()
    }
}

fn fill(f: &jext_fs::File, value: u8) {
    f.write_at(0, &vec![value; PAGES as usize * PAGE]).unwrap();
}

#[test]
fn unlocked_reads_never_show_freed_blocks_or_torn_pages() {
    let dev = Arc::new(HookedDevice::new(64 << 20, SlowReads));
    let mount = format_small_cache(dev.clone());
    let fs = Fs::open(dev, mount).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    fill(&a, 1);
    a.fsync().unwrap();
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for reader in 0..2u64 {
            let (fs, done) = (&fs, &done);
            scope.spawn(move || {
                let file = fs.open_file("/a").unwrap();
                let block = u64::from(fs.block_size());
                let blocks = PAGES * PAGE as u64 / block;
                let mut page = reader;
                while !done.load(Ordering::Relaxed) {
                    page = (page * 7 + 13) % blocks;
                    let bytes = file.read_at(page * block, block as usize).unwrap();
                    let Some(&first) = bytes.first() else {
                        continue;
                    };
                    assert!(
                        bytes.iter().all(|b| *b == first),
                        "page {page} mixes versions"
                    );
                    assert!(first < OTHER_FILE, "page {page} shows another file's block");
                }
            });
        }
        for round in 0..40u8 {
            a.set_len(0).unwrap();
            fs.sync().unwrap();
            let b = fs.create_file("/b", 0o644).unwrap();
            fill(&b, OTHER_FILE + round % 50);
            b.fsync().unwrap();
            drop(b);
            fs.unlink(fs.root(), b"b").unwrap();
            fs.sync().unwrap();
            fill(&a, 2 + round);
            a.fsync().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    drop(a);
    fs.unmount().unwrap();
}

/// The next read, once armed, waits at the door until let through: the test then changes
/// the file system while a read is between "the mapping was looked up" and "the bytes
/// came back".
#[derive(Default)]
struct GatedReads {
    gate: Mutex<Gate>,
    turn: Condvar,
}

#[derive(Default, PartialEq)]
enum Gate {
    #[default]
    Open,
    Armed,
    Waiting,
    Released,
}

impl GatedReads {
    fn wait_for(&self, wanted: Gate) {
        let mut gate = self.gate.lock();
        while *gate != wanted {
            self.turn.wait(&mut gate);
        }
    }

    fn set(&self, to: Gate) {
        *self.gate.lock() = to;
        self.turn.notify_all();
    }
}

impl DeviceHook for GatedReads {
    fn before_read(&self, _offset: u64, _len: usize) {
        let mut gate = self.gate.lock();
        if *gate == Gate::Armed {
            *gate = Gate::Waiting;
            self.turn.notify_all();
            while *gate != Gate::Released {
                self.turn.wait(&mut gate);
            }
            *gate = Gate::Open;
        }
    }
    fn name(&self) -> &'static str {
        "gated reads"
    }
}

/// A read that found a block's mapping, then waited for the device while the file was
/// truncated and another file wrote the freed block, must not leave those bytes in the
/// file's cache: a later partial write would keep them around its own bytes. Fails when
/// the read's `data_seq` check is removed.
#[test]
fn a_read_that_raced_a_truncate_leaves_no_other_files_bytes_behind() {
    let dev = Arc::new(HookedDevice::new(64 << 20, GatedReads::default()));
    let mount = format_small_cache(dev.clone());
    let fs = Fs::open(dev.clone(), mount.clone()).unwrap();
    let bs = fs.block_size() as usize;
    let a = fs.create_file("/a", 0o644).unwrap();
    a.write_at(0, &vec![1u8; 16 * bs]).unwrap();
    a.fsync().unwrap();
    drop(a);
    fs.unmount().unwrap();
    // Mounted again: nothing of `a` is cached, so its read goes to the device.
    let fs = Fs::open(dev.clone(), mount).unwrap();
    let a = fs.open_file("/a").unwrap();
    std::thread::scope(|scope| {
        dev.hook.set(Gate::Armed);
        let reader = scope.spawn(|| a.read_at(0, bs).unwrap());
        dev.hook.wait_for(Gate::Waiting);
        a.set_len(0).unwrap();
        fs.sync().unwrap();
        let b = fs.create_file("/b", 0o644).unwrap();
        b.write_at(0, &vec![OTHER_FILE; 64 * bs]).unwrap();
        b.fsync().unwrap();
        dev.hook.set(Gate::Released);
        let got = reader.join().unwrap();
        assert!(
            got.iter().all(|&byte| byte == 1),
            "the racing read itself returns the file as it was, or nothing"
        );
    });
    // One byte into the middle of block 0: the rest of the block is a hole's zeros.
    a.write_at(7, &[9]).unwrap();
    let got = a.read_at(0, 8).unwrap();
    assert_eq!(
        got,
        [0, 0, 0, 0, 0, 0, 0, 9],
        "block 0 kept bytes from before"
    );
    drop(a);
    fs.unmount().unwrap();
}
