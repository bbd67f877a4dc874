//! Reads that go to the device without the file system lock, against a writer that
//! truncates the file, lets another file take its freed blocks, and rewrites it. A page a
//! reader gets must be one the file held at some moment: all one version's bytes (or
//! zeros), never the other file's bytes that a block freed meanwhile came to hold, never
//! a mix. The page cache is kept small so reads keep missing it, and the device takes its
//! time over reads so the writer gets to run while one is under way.

use jext_device::{BlockDevice, Capabilities, DeviceCounters, DeviceError, SimDevice, WriteFlags};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const PAGES: u64 = 256;
const PAGE: usize = 4096;
/// The reused blocks of the other file hold bytes from here up.
const OTHER_FILE: u8 = 200;

/// A simulated disk whose reads take a while (writes and flushes as the simulator's).
struct SlowReads(SimDevice);

impl BlockDevice for SlowReads {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn sector_size(&self) -> u32 {
        self.0.sector_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        std::thread::sleep(std::time::Duration::from_micros(300));
        self.0.read_at(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        self.0.write(offset, data, flags)
    }
    fn flush(&self) -> Result<(), DeviceError> {
        self.0.flush()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn counters(&self) -> &DeviceCounters {
        self.0.counters()
    }
    fn describe(&self) -> String {
        format!("slow reads over {}", self.0.describe())
    }
}

fn fill(f: &jext_fs::File, value: u8) {
    f.write_at(0, &vec![value; PAGES as usize * PAGE]).unwrap();
}

#[test]
fn unlocked_reads_never_show_freed_blocks_or_torn_pages() {
    let dev = Arc::new(SlowReads(SimDevice::new(64 << 20)));
    let opts = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let mount = MountOptions {
        cache_size_bytes: 1 << 20,
        ..MountOptions::default()
    };
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
                let mut page = reader;
                while !done.load(Ordering::Relaxed) {
                    page = (page * 7 + 13) % PAGES;
                    let bytes = file.read_at(page * PAGE as u64, PAGE).unwrap();
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
