//! Edges `jext bench scale` met. Its fragmented-file rows on a 220 GiB zram device: a
//! device whose sectors are 4 KiB (zram, 4Kn disks) refuses the 1024-byte superblock
//! request at byte 1024, and a file system filled to the last block by fallocate, then
//! punched every other block, must find room for its extent-tree splits (in the metadata
//! reserve fallocate leaves, or among the blocks its punches freed) instead of aborting
//! the journal halfway through a punch; preallocating a huge range finds its holes by
//! walking the extent tree in windows, as SEEK_DATA and SEEK_HOLE do. Its one-directory
//! rows: inode allocation passes
//! over groups it saw full, and must still find an inode freed in one, also while other
//! threads allocate and free.

use jext_device::{
    check_range, BlockDevice, Capabilities, DeviceCounters, DeviceError, DeviceOp, SimDevice,
    WriteFlags,
};
use jext_fs::{fsck, mkfs, FallocateMode, File, Fs, FsError, MkfsOptions, MountOptions};
use std::sync::Arc;

const BLOCK: u64 = 4096;

/// The simulator with 4 KiB sectors: any request not on 4 KiB boundaries is refused, as
/// an `O_DIRECT` zram device refuses it.
struct FourKSectors(SimDevice);

impl BlockDevice for FourKSectors {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn sector_size(&self) -> u32 {
        BLOCK as u32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Read, offset, buf.len())?;
        self.0.read_at(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], flags: WriteFlags) -> Result<(), DeviceError> {
        check_range(self, DeviceOp::Write, offset, data.len())?;
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
        format!("4 KiB sectors over {}", self.0.describe())
    }
}

fn zeroed() -> MkfsOptions {
    MkfsOptions {
        block_size: Some(BLOCK as u32),
        assume_zeroed: true,
        ..MkfsOptions::default()
    }
}

const PUNCH: FallocateMode = FallocateMode {
    punch_hole: true,
    keep_size: true,
    zero_range: false,
};

/// Preallocates file `a` until no block is left, in steps that halve when the next does
/// not fit; returns its length in blocks.
fn fill_by_fallocate(fs: &Fs, a: &File) -> u64 {
    let (mut len, mut step) = (0u64, 16u64 << 20);
    while step >= BLOCK {
        match fs.fallocate(a.ino(), len, step, FallocateMode::default()) {
            Ok(()) => len += step,
            Err(FsError::NoSpace(_)) => step /= 2,
            Err(e) => panic!("fallocate at {len}+{step}: {e}"),
        }
    }
    len / BLOCK
}

/// Punches every other block of the first `blocks` of file `a` (each punch splits an
/// extent), and checks that as many extents as blocks kept are left.
fn punch_every_other_block(fs: &Fs, a: &File, blocks: u64) {
    for block in (1..blocks).step_by(2) {
        fs.fallocate(a.ino(), block * BLOCK, BLOCK, PUNCH)
            .unwrap_or_else(|e| panic!("punching block {block} of {blocks}: {e}"));
    }
    a.fsync().unwrap();
    let extents = fs.extents(a.ino()).unwrap();
    assert_eq!(extents.len() as u64, blocks.div_ceil(2));
}

/// A mounted 64 MiB file system of 1 KiB blocks: 8 groups of 8 MiB, 128 inodes each.
fn small_groups() -> (Arc<SimDevice>, Fs) {
    let dev = Arc::new(SimDevice::new(64 << 20));
    let opts = MkfsOptions {
        block_size: Some(1024),
        inode_ratio: Some(65536),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

fn unmount_and_fsck(fs: &Fs, dev: Arc<dyn BlockDevice>) {
    fs.unmount().unwrap();
    let report = fsck(dev).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_device_of_4k_sectors_mounts_and_keeps_the_rest_of_the_superblock_sector() {
    let dev = Arc::new(FourKSectors(SimDevice::new(64 << 20)));
    mkfs(dev.clone(), &zeroed()).unwrap();
    // Bytes 0..1024 (boot sector) and 2048..4096 share the superblock's sector: a write
    // of the superblock must carry them over unchanged.
    let boot = [0xB0u8; 1024];
    let mut sector = vec![0u8; 4096];
    dev.0.read_at(0, &mut sector).unwrap();
    sector[..1024].copy_from_slice(&boot);
    sector[2048..].fill(0xE7);
    dev.0.write(0, &sector, WriteFlags::empty()).unwrap();

    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let f = fs.create_file("/f", 0o644).unwrap();
    f.write_at(0, b"four k sectors").unwrap();
    f.fsync().unwrap();
    drop(f);
    fs.unmount().unwrap();

    let mut after = vec![0u8; 4096];
    dev.0.read_at(0, &mut after).unwrap();
    assert_eq!(after[..1024], boot, "the boot sector was overwritten");
    assert!(
        after[2048..].iter().all(|&b| b == 0xE7),
        "the bytes after the superblock were overwritten"
    );
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let f = fs.open_file("/f").unwrap();
    assert_eq!(f.read_at(0, 14).unwrap(), b"four k sectors");
    drop(f);
    unmount_and_fsck(&fs, dev);
}

#[test]
fn punching_every_other_block_of_a_full_file_system_never_aborts() {
    let dev = Arc::new(SimDevice::new(160 << 20));
    mkfs(dev.clone(), &zeroed()).unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    let blocks = fill_by_fallocate(&fs, &a);
    // As ext4's, preallocation stops short of the metadata reserve (2% of the blocks, at
    // most 4096), which the punches' extent-tree splits may take.
    let stat = fs.statfs().unwrap();
    assert!(
        stat.blocks_free >= (stat.blocks / 50).min(4096),
        "fallocate took the metadata reserve: {} of {} blocks free",
        stat.blocks_free,
        stat.blocks
    );
    // Every punch splits an extent; the splits need blocks only the punches freed, and
    // those come back only once their transaction commits.
    punch_every_other_block(&fs, &a, blocks);
    drop(a);
    unmount_and_fsck(&fs, dev);
}

#[test]
fn preallocating_around_scattered_data_maps_every_hole_and_keeps_the_data() {
    let dev = Arc::new(SimDevice::new(256 << 20));
    let opts = MkfsOptions {
        block_size: Some(1024),
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    // Written blocks alone and side by side, near and far apart: holes of one block to
    // tens of thousands, longer than the hole scan's first windows and its largest.
    let written: [u64; 5] = [5, 65_535, 65_536, 70_000, 140_000];
    for &block in &written {
        a.write_at(block * 1024, &[block as u8 | 1; 1024]).unwrap();
    }
    a.fsync().unwrap();
    let total_blocks = 150_000u64;
    fs.fallocate(a.ino(), 0, total_blocks * 1024, FallocateMode::default())
        .unwrap();
    let extents = fs.extents(a.ino()).unwrap();
    let mapped: u64 = extents.iter().map(|e| u64::from(e.len)).sum();
    assert_eq!(
        mapped, total_blocks,
        "every hole of [0, {total_blocks}) mapped"
    );
    for &block in &written {
        let holder = extents
            .iter()
            .find(|e| u64::from(e.logical) <= block && block < e.end())
            .unwrap_or_else(|| panic!("block {block} unmapped"));
        assert!(!holder.unwritten, "written block {block} became unwritten");
        let back = a.read_at(block * 1024, 1024).unwrap();
        assert_eq!(back, [block as u8 | 1; 1024], "block {block}'s data");
    }
    drop(a);
    unmount_and_fsck(&fs, dev);
}

#[test]
fn seek_data_and_hole_in_a_huge_sparse_file_see_extents_and_dirty_pages() {
    let (dev, fs) = small_groups();
    let a = fs.create_file("/a", 0o644).unwrap();
    let keep = FallocateMode {
        keep_size: true,
        ..FallocateMode::default()
    };
    let write = |blocks: std::ops::Range<u64>| {
        for block in blocks {
            a.write_at(block * 1024, &[1u8; 1024]).unwrap();
        }
    };
    write(10..20);
    write(40_000..40_001);
    a.fsync().unwrap();
    fs.fallocate(a.ino(), 30 * 1024, 5 * 1024, keep).unwrap();
    // Left dirty: data whether or not writeback has mapped them by the time of the seek.
    for block in [50, 52, 54, 35] {
        write(block..block + 1);
    }
    let size_blocks = 2_000_000u64;
    a.set_len(size_blocks * 1024).unwrap();
    let data: std::collections::BTreeSet<u64> =
        (10..20).chain(30..36).chain([50, 52, 54, 40_000]).collect();
    let offsets = (0..60 * 1024).step_by(512).chain([
        39_999 * 1024,
        40_000 * 1024 + 7,
        (size_blocks - 1) * 1024,
    ]);
    for offset in offsets {
        let block = offset / 1024;
        let next_data = data.range(block..).next().map(|&d| (d * 1024).max(offset));
        match (fs.seek_data_or_hole(a.ino(), offset, false), next_data) {
            (Ok(at), Some(want)) => assert_eq!(at, want, "SEEK_DATA from {offset}"),
            (Err(FsError::NoSuchOffset(_)), None) => {}
            (got, want) => panic!("SEEK_DATA from {offset}: {got:?}, expected {want:?}"),
        }
        let hole_block = (block..).find(|b| !data.contains(b)).unwrap();
        let want_hole = (hole_block * 1024).max(offset);
        let at = fs.seek_data_or_hole(a.ino(), offset, true).unwrap();
        assert_eq!(at, want_hole, "SEEK_HOLE from {offset}");
    }
    let past_end = fs.seek_data_or_hole(a.ino(), size_blocks * 1024, false);
    assert!(
        matches!(past_end, Err(FsError::NoSuchOffset(_))),
        "{past_end:?}"
    );
    drop(a);
    unmount_and_fsck(&fs, dev);
}

#[test]
fn punching_once_the_metadata_reserve_is_used_up_waits_for_freed_blocks() {
    // The test above leaves the punches the metadata reserve, which holds every split.
    // Here directories take the reserve too, and a punch at the file's end (no split)
    // leaves 32 blocks: the splits need more than that, and every other free block is
    // one a punch freed in the running transaction. Without the room check a split finds
    // no block and aborts the journal; with it, the punch commits first and goes on. A
    // long commit interval keeps the timer from committing them by chance.
    let dev = Arc::new(SimDevice::new(160 << 20));
    mkfs(dev.clone(), &zeroed()).unwrap();
    let options = MountOptions {
        commit_interval_ms: 600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options).unwrap();
    let a = fs.create_file("/a", 0o644).unwrap();
    let blocks = fill_by_fallocate(&fs, &a);
    let root = fs.root();
    for n in 0.. {
        match fs.mkdir(root, format!("d{n}").as_bytes(), 0o755, 0, 0) {
            Ok(_) => {}
            Err(FsError::NoSpace(_)) => break,
            Err(e) => panic!("mkdir d{n}: {e}"),
        }
    }
    let free = fs.statfs().unwrap().blocks_free;
    assert!(free < 16, "directories left {free} blocks free");
    fs.fallocate(a.ino(), (blocks - 32) * BLOCK, 32 * BLOCK, PUNCH)
        .unwrap();
    punch_every_other_block(&fs, &a, blocks - 32);
    drop(a);
    unmount_and_fsck(&fs, dev);
}

#[test]
fn an_inode_freed_in_a_full_group_is_used_again() {
    let (dev, fs) = small_groups();
    let root = fs.root();
    let inos: Vec<u32> = (0..300)
        .map(|i| {
            fs.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino
        })
        .collect();
    // The root's group filled first; the allocator remembers it full.
    let in_first_group = |ino: u32| ino <= 128;
    let freed = inos[50];
    assert!(in_first_group(freed) && !in_first_group(inos[299]));
    fs.unlink(root, b"f50").unwrap();
    // A number is handed out again only once its deletion is durable.
    fs.sync().unwrap();
    let again = fs.create(root, b"again", 0o644, 0, 0).unwrap().ino;
    assert_eq!(
        again, freed,
        "the free inode in the root's group was passed over"
    );
    unmount_and_fsck(&fs, dev);
}

#[test]
fn inodes_freed_while_other_threads_allocate_are_found_again() {
    // 8 groups of 128 inodes, every one of them used before the churn, so the allocator
    // has seen each group full and passes over them on the hint alone.
    const THREADS: usize = 4;
    const ROUNDS: usize = 400;
    let (dev, fs) = small_groups();
    let root = fs.root();
    let homes: Vec<_> = (0..THREADS)
        .map(|t| {
            fs.mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0)
                .unwrap()
        })
        .collect();
    let fs = &fs;
    let create = &|dir, name: &str| fs.create(dir, name.as_bytes(), 0o644, 0, 0);
    // A file for each thread, then every other inode, the threads racing for them (a
    // thread that starts late may get none of those).
    for home in &homes {
        create(home.ino, "f0").unwrap();
    }
    let made: Vec<usize> = std::thread::scope(|scope| {
        let workers: Vec<_> = homes
            .iter()
            .map(|home| {
                scope.spawn(move || {
                    let mut n = 1;
                    loop {
                        match create(home.ino, &format!("f{n}")) {
                            Ok(_) => n += 1,
                            Err(FsError::NoSpace(_)) => return n,
                            Err(e) => panic!("create f{n}: {e}"),
                        }
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    assert_eq!(fs.statfs().unwrap().inodes_free, 0);
    // Each thread frees one of its inodes, then creates: at every moment at least as
    // many inodes are free as creates are under way, so each create must find one, in
    // whichever group another thread's unlink freed it.
    std::thread::scope(|scope| {
        for (t, home) in homes.iter().enumerate() {
            let made = made[t];
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let old = if round < made {
                        format!("f{round}")
                    } else {
                        format!("g{}", round - made)
                    };
                    fs.unlink(home.ino, old.as_bytes()).unwrap();
                    create(home.ino, &format!("g{round}")).unwrap_or_else(|e| {
                        panic!("thread {t}, round {round}: create after an unlink: {e}")
                    });
                }
            });
        }
    });
    assert_eq!(fs.statfs().unwrap().inodes_free, 0);
    unmount_and_fsck(fs, dev);
}
