//! A file fragmented into more extents than two index levels hold gets an extent tree of
//! depth 3 (on 1 KiB blocks: 4 entries in the inode, 84 per block, so more than 28,224
//! extents), reads back, and truncates back to zero; e2fsck is clean at each step and
//! debugfs sees the depth.

mod common;

use common::{assert_e2fsck_clean, run, Scratch};
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};

/// Extents wanted: every other 1 KiB page written, so no two merge.
const EXTENTS: u64 = 30_000;
const BS: u64 = 1024;

fn page(i: u64) -> Vec<u8> {
    let mut bytes = vec![(i % 251) as u8 + 1; BS as usize];
    bytes[..8].copy_from_slice(&i.to_le_bytes());
    bytes
}

/// The depth debugfs reports for `path`'s extent tree ("Level Entries" rows read
/// `0/ 3 ...`: level 0 of depth 3).
fn debugfs_depth(image: &std::path::Path, path: &str) -> u32 {
    let out = run(
        "debugfs",
        &["-R", &format!("ex {path}"), image.to_str().unwrap()],
    );
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("0/"))
        .unwrap_or_else(|| panic!("no extent rows from debugfs: {out}"));
    row.trim_start()[2..]
        .split_whitespace()
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the depth in {row:?}"))
}

#[test]
fn a_depth_three_extent_tree_reads_back_and_truncates_to_zero() {
    let scratch = Scratch::new("deep-extents");
    let image = scratch.path("deep.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let device = jext_device::open_path(&image, false).unwrap();
    let opts = MkfsOptions {
        block_size: Some(BS as u32),
        ..MkfsOptions::default()
    };
    mkfs(device.clone(), &opts).unwrap();
    let fs = Fs::open(device, MountOptions::default()).unwrap();
    let f = fs.create_file("/frag", 0o644).unwrap();
    for i in 0..EXTENTS {
        f.write_at(2 * i * BS, &page(i)).unwrap();
    }
    f.fsync().unwrap();
    assert_eq!(fs.extents(f.ino()).unwrap().len() as u64, EXTENTS);
    for i in (0..EXTENTS).step_by(997) {
        assert_eq!(f.read_at(2 * i * BS, BS as usize).unwrap(), page(i));
        assert_eq!(
            f.read_at((2 * i + 1) * BS, 16).unwrap(),
            vec![0; 16],
            "a hole"
        );
    }
    drop(f);
    fs.unmount().unwrap();
    assert_eq!(debugfs_depth(&image, "/frag"), 3);
    assert_e2fsck_clean(&image);

    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    let f = fs.open_file("/frag").unwrap();
    f.set_len(0).unwrap();
    f.fsync().unwrap();
    assert!(fs.extents(f.ino()).unwrap().is_empty());
    assert_eq!(f.stat().unwrap().blocks_512, 0, "every block freed");
    drop(f);
    fs.unmount().unwrap();
    assert_eq!(debugfs_depth_or_none(&image, "/frag"), None);
    assert_e2fsck_clean(&image);
}

/// None when debugfs lists no extent rows (an empty file).
fn debugfs_depth_or_none(image: &std::path::Path, path: &str) -> Option<u32> {
    let out = run(
        "debugfs",
        &["-R", &format!("ex {path}"), image.to_str().unwrap()],
    );
    out.lines()
        .any(|l| l.trim_start().starts_with("0/"))
        .then(|| debugfs_depth(image, path))
}
