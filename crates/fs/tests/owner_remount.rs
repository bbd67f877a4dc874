//! One owner per image, and remount: a second writer of an image is refused with the
//! holder named (two writers would hand out the same blocks and inode numbers and lose
//! each other's fsync'd files); an unmount lets the next one in at once; `remount,ro`
//! leaves an image that e2fsck calls clean while the file system stays mounted, and
//! `remount,rw` lets changes go on.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, Scratch};
use jext_device::open_path_waiting;
use jext_fs::{Fs, FsError, MountOptions};
use std::time::Duration;

#[test]
fn a_second_writer_is_refused_and_nothing_is_lost() {
    let scratch = Scratch::new("owner");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &[]);
    let first = Fs::open_path(&image, MountOptions::default()).unwrap();
    let err = match Fs::open_path(&image, MountOptions::default()) {
        Ok(_) => panic!("a second writable open of a mounted image succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains(&format!("pid {}", std::process::id())) && err.contains("in use"),
        "the refusal names the holder: {err}"
    );
    let readonly = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let reader = Fs::open_path(&image, readonly).expect("a reader is not a writer");
    reader.unmount().unwrap();
    let f = first.create_file("/kept", 0o644).unwrap();
    f.write_at(0, &[7u8; 100_000]).unwrap();
    f.fsync().unwrap();
    drop(f);
    // A clone of the Fs outlives the unmount, as request threads of a daemon do: the
    // image must still be free for the next owner.
    let clone = first.clone();
    first.unmount().unwrap();
    let second = Fs::open_path(&image, MountOptions::default()).expect("free after unmount");
    let f = second.open_file("/kept").unwrap();
    assert_eq!(f.read_at(0, 100_000).unwrap(), vec![7u8; 100_000]);
    drop(f);
    second.unmount().unwrap();
    drop(clone);
    assert_e2fsck_clean(&image);
}

#[test]
fn a_waiting_opener_gets_the_image_when_the_owner_unmounts() {
    let scratch = Scratch::new("owner-wait");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &[]);
    let first = Fs::open_path(&image, MountOptions::default()).unwrap();
    let unmounter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        first.unmount().unwrap();
    });
    let device = open_path_waiting(&image, false, Duration::from_secs(20)).unwrap();
    let second = Fs::open(device, MountOptions::default()).unwrap();
    unmounter.join().unwrap();
    second.unmount().unwrap();
}

#[test]
fn remount_read_only_leaves_a_clean_image_and_read_write_goes_on() {
    let scratch = Scratch::new("remount");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &[]);
    let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
    fs.mkdir_path("/d", 0o755).unwrap();
    let f = fs.create_file("/d/unsynced", 0o644).unwrap();
    f.write_at(0, &[1u8; 50_000]).unwrap();
    fs.remount(true).unwrap();
    // No sync was asked for: remounting read-only made it durable, and the image is as
    // clean as after an unmount while the file system stays mounted.
    assert_e2fsck_clean(&image);
    assert!(matches!(f.write_at(0, b"x"), Err(FsError::ReadOnly(_))));
    assert!(matches!(
        fs.mkdir_path("/e", 0o755),
        Err(FsError::ReadOnly(_))
    ));
    assert_eq!(f.read_at(0, 50_000).unwrap(), vec![1u8; 50_000]);
    fs.remount(false).unwrap();
    f.write_at(50_000, &[2u8; 10_000]).unwrap();
    f.fsync().unwrap();
    fs.mkdir_path("/e", 0o755).unwrap();
    drop(f);
    // A crash now (no unmount) must recover what the rw remount committed.
    drop(fs);
    let again = Fs::open_path(&image, MountOptions::default()).unwrap();
    let f = again.open_file("/d/unsynced").unwrap();
    assert_eq!(f.stat().unwrap().size, 60_000);
    assert_eq!(f.read_at(50_000, 10_000).unwrap(), vec![2u8; 10_000]);
    drop(f);
    again.unmount().unwrap();
    assert_e2fsck_clean(&image);
}

#[test]
fn a_read_only_mount_on_a_writable_device_can_become_writable() {
    let scratch = Scratch::new("remount-ro-start");
    let image = scratch.path("a.img");
    mkfs_ext4(&image, 64, &["-O", "metadata_csum"]);
    let readonly = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let fs = Fs::open_path(&image, readonly.clone()).unwrap();
    let err = fs.remount(false).unwrap_err().to_string();
    assert!(err.contains("opened read-only"), "{err}");
    fs.unmount().unwrap();

    let device = open_path_waiting(&image, false, Duration::ZERO).unwrap();
    let fs = Fs::open(device, readonly).unwrap();
    fs.remount(false).unwrap();
    let f = fs.create_file("/late", 0o644).unwrap();
    f.write_at(0, b"written after remount,rw").unwrap();
    f.fsync().unwrap();
    drop(f);
    drop(fs); // a crash: recovery must read the log the first commit started
    let again = Fs::open_path(&image, MountOptions::default()).unwrap();
    let f = again.open_file("/late").unwrap();
    assert_eq!(f.read_at(0, 100).unwrap(), b"written after remount,rw");
    drop(f);
    again.unmount().unwrap();
    assert_e2fsck_clean(&image);
}
