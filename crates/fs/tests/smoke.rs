//! A first round trip: Linux makes the image, jext writes a tree, e2fsck finds it clean,
//! and Linux reads back exactly what jext wrote.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, LoopMount, Scratch};
use jext_fs::{Fs, MountOptions};

#[test]
fn jext_writes_a_tree_that_linux_reads_back() {
    let scratch = Scratch::new("smoke");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &[]);
    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    fs.mkdir_path("/docs", 0o755).unwrap();
    let f = fs.create_file("/docs/hello.txt", 0o644).unwrap();
    f.write_at(0, b"hello, ext4\n").unwrap();
    f.fsync().unwrap();
    drop(f);
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let g = fs.create_file("/big.bin", 0o600).unwrap();
    g.write_at(0, &big).unwrap();
    drop(g);
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "ro");
    assert_eq!(
        std::fs::read(mount.path("docs/hello.txt")).unwrap(),
        b"hello, ext4\n"
    );
    assert!(std::fs::read(mount.path("big.bin")).unwrap() == big);
}

/// Times tick with the kernel's coarse clock, except that a change after someone read the
/// times always shows (multigrain timestamps): each stat-then-write moves ctime and mtime.
#[test]
fn a_change_after_a_stat_moves_the_times() {
    let dev = std::sync::Arc::new(jext_device::SimDevice::new(64 << 20));
    jext_fs::mkfs(dev.clone(), &jext_fs::MkfsOptions::default()).unwrap();
    let fs = Fs::open(dev, MountOptions::default()).unwrap();
    let f = fs.create_file("/f", 0o644).unwrap();
    for round in 0..100u8 {
        let before = f.stat().unwrap();
        f.write_at(0, &[round]).unwrap();
        let after = f.stat().unwrap();
        assert!(
            after.mtime > before.mtime,
            "round {round}: mtime did not move"
        );
        assert!(
            after.ctime > before.ctime,
            "round {round}: ctime did not move"
        );
    }
    fs.unmount().unwrap();
}

/// `copy_file_range` copies to the end of its source at most, refuses overlapping ranges
/// of one file but not disjoint ones, and makes each write's checks (immutable target).
#[test]
fn copy_file_range_copies_up_to_the_source_end_with_a_writes_checks() {
    let fs = Fs::open(common::fresh_sim_fs(), MountOptions::default()).unwrap();
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    let src = fs.create_file("/src", 0o644).unwrap();
    src.write_at(0, &data).unwrap();
    let dst = fs.create_file("/dst", 0o644).unwrap();

    let copied = fs.copy_file_range(src.ino(), 5, dst.ino(), 100, u64::MAX / 2);
    assert_eq!(
        copied.unwrap(),
        data.len() as u64 - 5,
        "stops at the source's end"
    );
    let back = fs.read(dst.ino(), 0, data.len() + 200).unwrap();
    assert_eq!(back.len(), 100 + data.len() - 5);
    assert!(
        back[..100].iter().all(|&b| b == 0),
        "the gap before reads as zeros"
    );
    assert_eq!(&back[100..], &data[5..]);
    assert_eq!(
        fs.copy_file_range(src.ino(), 1 << 40, dst.ino(), 0, 10)
            .unwrap(),
        0
    );

    let overlap = fs.copy_file_range(src.ino(), 0, src.ino(), 4096, 8192);
    assert!(
        matches!(overlap, Err(jext_fs::FsError::Invalid(_))),
        "{overlap:?}"
    );
    let tail = data.len() as u64;
    assert_eq!(
        fs.copy_file_range(src.ino(), 0, src.ino(), tail, 4096)
            .unwrap(),
        4096
    );
    assert_eq!(fs.read(src.ino(), tail, 4096).unwrap(), &data[..4096]);

    let immutable = jext_fs::SetAttr {
        flags: Some(jext_fs::format::inode::flags::IMMUTABLE),
        ..jext_fs::SetAttr::default()
    };
    fs.setattr(dst.ino(), &immutable).unwrap();
    let refused = fs.copy_file_range(src.ino(), 0, dst.ino(), 0, 10);
    assert!(
        matches!(refused, Err(jext_fs::FsError::NotPermitted(_))),
        "{refused:?}"
    );
    fs.unmount().unwrap();
}

/// FUSE's writeback cache sends an append to an append-only file as its whole page, from
/// the page's start: the bytes the file already holds come again. They are accepted as
/// long as they are the same, and only the new ones are written; a page that changes an
/// old byte is refused (fstests generic/079 lost such appends to EIO).
#[test]
fn a_cached_append_to_an_append_only_file_resends_what_it_holds() {
    let fs = Fs::open(common::fresh_sim_fs(), MountOptions::default()).unwrap();
    let f = fs.create_file("/log", 0o644).unwrap();
    f.write_at(0, b"original-content\n").unwrap();
    let append_only = jext_fs::SetAttr {
        flags: Some(jext_fs::format::inode::flags::APPEND),
        ..jext_fs::SetAttr::default()
    };
    fs.setattr(f.ino(), &append_only).unwrap();

    let page = b"original-content\nappended\n";
    assert_eq!(fs.write_cached(f.ino(), 0, page).unwrap(), page.len());
    assert_eq!(fs.read(f.ino(), 0, 64).unwrap(), page.to_vec());

    let changed = b"ORIGINAL-content\nappended\nmore\n";
    assert!(matches!(
        fs.write_cached(f.ino(), 0, changed),
        Err(jext_fs::FsError::NotPermitted(_))
    ));
    assert!(
        fs.write(f.ino(), 0, page).is_err(),
        "an uncached write before the end"
    );
    assert_eq!(fs.read(f.ino(), 0, 64).unwrap(), page.to_vec());
    fs.unmount().unwrap();
}

/// A directory and a file removed while still held open (as the FUSE front end holds a
/// directory the kernel keeps, a process's working directory) are deleted by the unmount
/// itself: the image it leaves clean has no orphan list for the next mount to finish.
#[test]
fn unlinked_inodes_still_held_at_unmount_are_deleted_by_it() {
    let scratch = Scratch::new("held-orphans");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &[]);
    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    let root = jext_fs::ROOT_INO;
    let dir = fs.mkdir_path("/d", 0o755).unwrap().ino;
    let file = fs.create_file("/f", 0o644).unwrap();
    file.write_at(0, &[7; 10_000]).unwrap();
    let file_ino = file.stat().unwrap().ino;
    drop(file);
    for ino in [dir, file_ino] {
        fs.open_inode(ino).unwrap();
    }
    fs.rmdir(root, b"d").unwrap();
    fs.unlink(root, b"f").unwrap();
    assert_eq!(fs.stat_live(dir).unwrap().nlink, 0, "held: still alive");
    fs.unmount().unwrap();
    assert_e2fsck_clean(&image);
    let (fs, report) = Fs::open_with_report(
        jext_device::open_path(&image, false).unwrap(),
        MountOptions::default(),
    )
    .unwrap();
    assert_eq!(report.orphans_finished, 0, "the unmount left orphans");
    assert!(fs.stat_live(dir).is_err() && fs.stat_live(file_ino).is_err());
    fs.unmount().unwrap();
}
