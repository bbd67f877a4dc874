//! What the writeback policy sends to the device, and what it leaves in memory.
//!
//! A busy writer's data stays in the page cache while dirty data is under the background
//! threshold, as the kernel keeps it under `dirty_background_ratio`: writing it early puts
//! it under every other file's fsync (the fsync-tail bench). The policy once wrote a file's
//! data whenever only its times were due, which is on every tick for a file being written.
//! A sync of many small files keeps several files' data in flight at once, and all of it
//! is durable when the sync returns.

mod common;

use common::{DeviceHook, HookedDevice};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The first bytes of every block of the busy writer's file.
const MAGIC: [u8; 8] = *b"jextBUSY";
const BLOCK: usize = 4096;

/// Counts blocks of the busy writer's file that reach the device.
#[derive(Default)]
struct BusyBlocks(AtomicU64);

impl DeviceHook for BusyBlocks {
    fn before_write(&self, _offset: u64, data: &[u8]) {
        let busy = data.chunks(BLOCK).filter(|b| b.starts_with(&MAGIC)).count();
        self.0.fetch_add(busy as u64, Ordering::Relaxed);
    }
    fn name(&self) -> &'static str {
        "counts the busy writer's blocks"
    }
}

fn busy_data(bytes: usize) -> Vec<u8> {
    let mut data = vec![0x42; bytes];
    for block in data.chunks_mut(BLOCK) {
        block[..MAGIC.len()].copy_from_slice(&MAGIC);
    }
    data
}

/// Writes `busy_mib` MiB to one file while another is appended to and fsync'd, then runs a
/// writeback tick; returns how many of the busy file's blocks reached the device.
fn busy_blocks_written_by_a_tick(busy_mib: usize) -> u64 {
    let dev = Arc::new(HookedDevice::new(256 << 20, BusyBlocks::default()));
    let mkfs_options = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &mkfs_options).unwrap();
    // 48 MiB of pages: background writeback from 24 MiB of dirty data (half the pages;
    // any machine this runs on has more than ten times that in RAM).
    let options = MountOptions {
        cache_size_bytes: 64 << 20,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options).unwrap();
    let busy = fs.create_file("/busy", 0o644).unwrap();
    let synced = fs.create_file("/synced", 0o644).unwrap();
    let chunk = busy_data(1 << 20);
    for mib in 0..busy_mib {
        busy.write_at((mib << 20) as u64, &chunk).unwrap();
        synced.write_at((mib * 8192) as u64, &[7; 8192]).unwrap();
        synced.fsync().unwrap();
    }
    fs.writeback_now().unwrap();
    let written = dev.hook.0.load(Ordering::Relaxed);
    assert_eq!(busy.read_at(0, 1 << 20).unwrap(), chunk);
    drop((busy, synced));
    fs.unmount().unwrap();
    written
}

#[test]
fn a_writer_under_the_background_threshold_stays_in_memory() {
    assert_eq!(
        busy_blocks_written_by_a_tick(8),
        0,
        "8 MiB of dirty data, under the 24 MiB background threshold, reached the device"
    );
}

#[test]
fn a_writer_over_the_background_threshold_is_written_back() {
    let written = busy_blocks_written_by_a_tick(32);
    assert!(
        written >= (8 << 20) / BLOCK as u64,
        "32 MiB of dirty data, over the 24 MiB background threshold: {written} blocks went out"
    );
}

/// Counts the data writes of small files in flight at once, each taking 2 ms.
#[derive(Default)]
struct DataInFlight {
    now: AtomicU64,
    most: AtomicU64,
}

impl DeviceHook for DataInFlight {
    fn before_write(&self, _offset: u64, data: &[u8]) {
        if !data.starts_with(&MAGIC) {
            return;
        }
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(2));
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
    fn name(&self) -> &'static str {
        "counts small files' data writes in flight"
    }
}

/// An unpacked tarball's shape: a sync once wrote one file, waited for its data, then the
/// next, one device round trip per file (2 to 5 s for /usr/include on a loop device).
#[test]
fn a_sync_of_many_small_files_writes_several_at_once() {
    let dev = Arc::new(HookedDevice::new(64 << 20, DataInFlight::default()));
    let mkfs_options = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &mkfs_options).unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let content = |n: usize| {
        let mut data = busy_data(2 * BLOCK);
        data[MAGIC.len()] = n as u8;
        data
    };
    for n in 0..64 {
        let f = fs.create_file(&format!("/f{n}"), 0o644).unwrap();
        f.write_at(0, &content(n)).unwrap();
    }
    assert_eq!(
        dev.hook.most.load(Ordering::SeqCst),
        0,
        "all still in memory"
    );
    fs.sync().unwrap();
    let most = dev.hook.most.load(Ordering::SeqCst);
    assert!(most >= 4, "at most {most} files' data in flight at once");
    let crashed = Arc::new(dev.sim.crash());
    let fs = Fs::open(crashed, MountOptions::default()).expect("recovery mounts");
    for n in 0..64 {
        let f = fs.open_file(&format!("/f{n}")).unwrap();
        assert_eq!(f.read_at(0, 2 * BLOCK).unwrap(), content(n), "/f{n}");
    }
}
