//! A big, mostly empty file system mounts and recovers without reading what was never
//! used: uninitialised groups (`BLOCK_UNINIT`, `INODE_UNINIT`) and unused inode-table
//! tails are skipped by the mount and by journal recovery, as by e2fsck. The bound checked
//! is in bytes read from the device, so it holds on any machine.

use jext_device::{BlockDevice, SimDevice};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;

/// 4 TiB: 32,768 groups of 128 MiB, whose bitmaps and inode tables alone are 16 GiB.
const SIZE_BYTES: u64 = 4 << 40;

#[test]
fn mount_and_recovery_of_4_tib_read_little() {
    let dev = Arc::new(SimDevice::new(SIZE_BYTES));
    let opts = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    let f = fs.create_file("/kept", 0o644).unwrap();
    f.write_at(0, b"durable before the crash").unwrap();
    f.fsync().unwrap();
    drop(f);
    let crashed = Arc::new(dev.crash());
    drop(fs);
    let before = crashed.counters().snapshot();
    let fs = Fs::open(crashed.clone(), MountOptions::default()).expect("recovery mounts");
    let read = crashed.counters().snapshot() - before;
    // The group descriptors (2 MiB at 64 bytes each), the journal's used part and a few
    // groups' metadata; reading every group's bitmaps would be 256 MiB.
    assert!(
        read.read_bytes < 16 << 20,
        "mount with recovery read {} MiB of a 4 TiB file system",
        read.read_bytes >> 20
    );
    let kept = fs.open_file("/kept").unwrap();
    assert_eq!(kept.read_at(0, 64).unwrap(), b"durable before the crash");
    drop(kept);
    fs.unmount().unwrap();
}
