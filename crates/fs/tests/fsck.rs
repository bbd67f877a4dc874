//! `jext fsck` agrees with `e2fsck -fn`: clean images are clean (jext-made, Linux-made,
//! recovered from a crash), and damage e2fsck reports is reported too, with where it is.

mod common;

use common::{e2fsck, mkfs_ext4, LoopMount, Scratch};
use jext_device::{BlockDevice, FileDevice, SimDevice};
use jext_fs::{fsck, mkfs, Fs, MkfsOptions, MountOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

fn check(path: &Path) -> jext_fs::FsckReport {
    fsck(Arc::new(FileDevice::open(path, true).unwrap())).unwrap()
}

fn populate_with_jext(path: &Path) {
    let fs = Fs::open_path(path, MountOptions::default()).unwrap();
    fs.mkdir_path("/a", 0o755).unwrap();
    for i in 0..300 {
        let f = fs
            .create_file(&format!("/a/file-number-{i}"), 0o644)
            .unwrap();
        f.write_at(0, &vec![i as u8; 1 + i * 97]).unwrap();
    }
    let frag = fs.create_file("/frag", 0o644).unwrap();
    for i in 0..500u64 {
        frag.write_at(i * 8192, &[1u8; 4096]).unwrap();
        frag.fdatasync().unwrap();
    }
    drop(frag);
    let a = fs.resolve("/a").unwrap();
    fs.link(fs.resolve("/frag").unwrap(), a, b"hard").unwrap();
    fs.symlink(a, b"link", &[b'x'; 200], 0, 0).unwrap();
    fs.setxattr(a, b"user.big", &[7u8; 600], jext_fs::XattrSetMode::Either)
        .unwrap();
    fs.unmount().unwrap();
}

#[test]
fn clean_images_are_clean() {
    let scratch = Scratch::new("fsck-clean");
    let ours = scratch.path("ours.img");
    mkfs(
        Arc::new(FileDevice::create(&ours, 64 << 20).unwrap()),
        &MkfsOptions {
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    populate_with_jext(&ours);
    let report = check(&ours);
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(report.inodes_in_use > 300 && report.directories >= 3);

    let linux = scratch.path("linux.img");
    mkfs_ext4(&linux, 128, &["-b", "4096"]);
    let mount = LoopMount::new(&linux, &scratch.path("mnt"), "");
    for i in 0..2500 {
        std::fs::write(mount.path(&format!("n{i:05}")), vec![3u8; i % 7000]).unwrap();
    }
    mount.unmount();
    let report = check(&linux);
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_crashed_image_is_checked_after_replay_without_being_changed() {
    let scratch = Scratch::new("fsck-crash");
    let dev = Arc::new(SimDevice::new(64 << 20));
    mkfs(
        dev.clone(),
        &MkfsOptions {
            assume_zeroed: true,
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    for i in 0..20 {
        let f = fs.create_file(&format!("/f{i}"), 0o644).unwrap();
        f.write_at(0, &[1u8; 5000]).unwrap();
        f.fsync().unwrap();
    }
    let crashed = dev.crash();
    drop(fs);
    let path = scratch.path("crash.img");
    crashed.write_durable_image(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    let report = check(&path);
    assert!(report.is_clean(), "{:?}", report.problems);
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("replayed in memory")),
        "{:?}",
        report.notes
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "fsck changed the image"
    );
}

#[test]
fn damage_found_by_e2fsck_is_found_by_jext_fsck() {
    let scratch = Scratch::new("fsck-damage");
    let base = scratch.path("base.img");
    mkfs(
        Arc::new(FileDevice::create(&base, 32 << 20).unwrap()),
        &MkfsOptions {
            assume_zeroed: true,
            uuid: Some([1; 16]),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    populate_with_jext(&base);
    let pristine = std::fs::read(&base).unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    let (mut both, mut only_e2fsck, mut only_jext) = (0, 0, Vec::new());
    for round in 0..60 {
        let img = scratch.path("damaged.img");
        std::fs::write(&img, &pristine).unwrap();
        let dev = FileDevice::open(&img, false).unwrap();
        // Metadata lives in the first megabyte or so of this layout.
        let offset = rng.gen_range(1024..(1200 << 10)) / 512 * 512;
        let mut sector = [0u8; 512];
        dev.read_at(offset, &mut sector).unwrap();
        let at = rng.gen_range(0..512);
        sector[at] ^= 1 << rng.gen_range(0..8);
        dev.write_at(offset, &sector, false).unwrap();
        drop(dev);
        let (code, _) = e2fsck(&img);
        let ours = check(&img);
        match (code != 0, !ours.is_clean()) {
            (true, true) => both += 1,
            (true, false) => only_e2fsck += 1,
            (false, true) => only_jext.push(format!(
                "round {round} byte {}: {:?}",
                offset + at as u64,
                ours.problems
            )),
            (false, false) => {}
        }
    }
    assert!(
        only_jext.is_empty(),
        "jext fsck reported problems e2fsck did not: {only_jext:?}"
    );
    assert!(
        both > 10,
        "e2fsck and jext agreed on only {both} damaged images"
    );
    assert!(
        only_e2fsck * 5 <= both,
        "jext missed {only_e2fsck} damaged images e2fsck caught ({both} caught by both)"
    );
}
