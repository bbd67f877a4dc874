//! `jext mkfs` makes file systems that e2fsck finds clean, Linux mounts and uses, and jext
//! mounts and uses, across sizes from 64 MiB to 1 TiB (sparse).

mod common;

use common::{assert_e2fsck_clean, run, LoopMount, Scratch};
use jext_device::FileDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::sync::Arc;

fn make(path: &std::path::Path, size: u64, opts: MkfsOptions) -> jext_fs::MkfsReport {
    let dev = Arc::new(FileDevice::create(path, size).unwrap());
    mkfs(
        dev,
        &MkfsOptions {
            assume_zeroed: true,
            ..opts
        },
    )
    .unwrap()
}

fn check_size(size: u64, name: &str, opts: MkfsOptions) {
    let scratch = Scratch::new(name);
    let image = scratch.path("j.img");
    let report = make(&image, size, opts);
    assert!(report.groups >= 1);
    assert_e2fsck_clean(&image);
    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    fs.mkdir_path("/d", 0o755).unwrap();
    let f = fs.create_file("/d/f", 0o644).unwrap();
    f.write_at(0, &vec![7u8; 100_000]).unwrap();
    f.fsync().unwrap();
    drop(f);
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "");
    assert_eq!(
        std::fs::read(mount.path("d/f")).unwrap(),
        vec![7u8; 100_000]
    );
    std::fs::write(mount.path("linux-was-here"), b"ok").unwrap();
    mount.unmount();
    assert_e2fsck_clean(&image);
    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    assert_eq!(
        fs.read(fs.resolve("/linux-was-here").unwrap(), 0, 10)
            .unwrap(),
        b"ok"
    );
    fs.unmount().unwrap();
}

#[test]
fn sixty_four_mib() {
    check_size(64 << 20, "mkfs64m", MkfsOptions::default());
}

#[test]
fn one_gib_with_fast_commit() {
    check_size(
        1 << 30,
        "mkfs1g",
        MkfsOptions {
            fast_commit: true,
            ..MkfsOptions::default()
        },
    );
}

#[test]
fn odd_size_drops_a_tiny_last_group() {
    check_size(
        (200 << 20) + 12345 * 1024,
        "mkfsodd",
        MkfsOptions::default(),
    );
}

#[test]
fn one_tib_sparse() {
    check_size(1 << 40, "mkfs1t", MkfsOptions::default());
}

#[test]
fn layout_matches_mkfs_ext4_counts() {
    let scratch = Scratch::new("mkfscmp");
    let ours = scratch.path("ours.img");
    make(&ours, 64 << 20, MkfsOptions::default());
    let theirs = scratch.path("theirs.img");
    // jext makes a fast-commit area by default; mkfs.ext4 with -O fast_commit.
    common::mkfs_ext4(&theirs, 64, &["-O", "fast_commit"]);
    let field = |img: &std::path::Path, key: &str| {
        let out = run("dumpe2fs", &["-h", img.to_str().unwrap()]);
        out.lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("{key}"))
            .to_string()
    };
    for key in [
        "Filesystem features:",
        "Inode count:",
        "Block count:",
        "Block size:",
        "Reserved GDT blocks:",
        "Inodes per group:",
        "Flex block group size:",
        "Total journal blocks:",
        "Overhead clusters:",
    ] {
        assert_eq!(field(&ours, key), field(&theirs, key));
    }
}
