//! `jext fsck` agrees with `e2fsck -fn`: clean images are clean (jext-made, Linux-made,
//! recovered from a crash), and damage e2fsck reports is reported too, with where it is.

mod common;

use common::{e2fsck, mkfs_ext4, LoopMount, Scratch};
use jext_device::{BlockDevice, FileDevice, SimDevice};
use jext_fs::format::group_desc::{GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use jext_fs::format::superblock::Superblock;
use jext_fs::format::Location;
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

/// A jext-made image of `bytes` with a fixed uuid, so runs are repeatable.
fn make_image(path: &Path, bytes: u64, uuid_byte: u8) {
    mkfs(
        Arc::new(FileDevice::create(path, bytes).unwrap()),
        &MkfsOptions {
            assume_zeroed: true,
            uuid: Some([uuid_byte; 16]),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
}

#[test]
fn damage_found_by_e2fsck_is_found_by_jext_fsck() {
    let scratch = Scratch::new("fsck-damage");
    let base = scratch.path("base.img");
    make_image(&base, 32 << 20, 1);
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

/// Rewrites group `group`'s primary descriptor through `edit`, with a fresh checksum, so
/// that the edit is the only damage.
fn edit_desc(img: &Path, group: u32, edit: impl FnOnce(&mut GroupDesc)) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(img)
        .unwrap();
    let mut raw = [0u8; 1024];
    file.read_exact_at(&mut raw, 1024).unwrap();
    let sb = Superblock::decode(&raw, Location::Superblock { group: 0 }).unwrap();
    let bs = u64::from(sb.block_size());
    let size = sb.desc_size() as usize;
    let at = (u64::from(sb.first_data_block()) + 1) * bs + u64::from(group) * size as u64;
    let mut bytes = vec![0u8; size];
    file.read_exact_at(&mut bytes, at).unwrap();
    let mut desc = GroupDesc::decode(&bytes, group, sb.group_csum()).unwrap();
    edit(&mut desc);
    desc.encode(&mut bytes, group, sb.group_csum());
    file.write_all_at(&bytes, at).unwrap();
}

/// A change to one group descriptor.
type DescEdit = Box<dyn Fn(&mut GroupDesc)>;

fn read_desc_of(img: &Path, group: u32) -> GroupDesc {
    let mut seen = None;
    edit_desc(img, group, |d| seen = Some(*d));
    seen.unwrap()
}

/// Uninitialised groups: a clean image with many of them checks clean, and each flag
/// corrupted in the ways e2fsck's passes 0, 2 and 5 catch gives e2fsck's verdict, with
/// the group named.
#[test]
fn uninitialised_groups_get_e2fsck_verdicts() {
    let scratch = Scratch::new("fsck-uninit");
    let base = scratch.path("base.img");
    make_image(&base, 64 << 20, 2);
    let ipg = {
        let fs = Fs::open_path(&base, MountOptions::default()).unwrap();
        fs.mkdir_path("/d", 0o755).unwrap();
        // More files than group 0 has inodes, so group 1's table is in use too.
        let total = fs.statfs().unwrap().inodes / 8;
        for i in 0..total + 50 {
            drop(fs.create_file(&format!("/d/f{i}"), 0o644).unwrap());
        }
        let big = fs.create_file("/big", 0o644).unwrap();
        big.write_at(0, &vec![9u8; 12 << 20]).unwrap();
        drop(big);
        fs.unmount().unwrap();
        u32::try_from(total).unwrap()
    };
    let (code, text) = e2fsck(&base);
    assert_eq!(code, 0, "the base image is not clean: {text}");
    let report = check(&base);
    assert!(report.is_clean(), "{:?}", report.problems);
    let groups = 8u32;
    let used_group = (1..groups)
        .find(|&g| {
            let d = read_desc_of(&base, g);
            !d.has_flag(FLAG_INODE_UNINIT) && d.itable_unused < ipg && d.free_inodes < ipg
        })
        .expect("a group besides 0 with inodes in use");
    let empty = (1..groups - 1)
        .find(|&g| {
            let d = read_desc_of(&base, g);
            d.has_flag(FLAG_INODE_UNINIT) && d.has_flag(FLAG_BLOCK_UNINIT)
        })
        .expect("a group never used");
    let data_group = (1..groups - 1)
        .find(|&g| {
            let d = read_desc_of(&base, g);
            !d.has_flag(FLAG_BLOCK_UNINIT) && d.free_blocks < 1000
        })
        .expect("a group full of file data");
    let pristine = std::fs::read(&base).unwrap();
    let cases: Vec<(&str, u32, DescEdit)> = vec![
        (
            "INODE_UNINIT on a group with inodes in use",
            used_group,
            Box::new(|d| d.flags |= FLAG_INODE_UNINIT),
        ),
        (
            "itable_unused covering inodes in use",
            used_group,
            Box::new(move |d| d.itable_unused = ipg - 1),
        ),
        (
            "BLOCK_UNINIT on a group full of file data",
            data_group,
            Box::new(|d| d.flags |= FLAG_BLOCK_UNINIT),
        ),
        (
            "BLOCK_UNINIT on the last group",
            groups - 1,
            Box::new(|d| d.flags |= FLAG_BLOCK_UNINIT),
        ),
        (
            "INODE_UNINIT cleared on a never-used group",
            empty,
            Box::new(|d| d.flags &= !FLAG_INODE_UNINIT),
        ),
        (
            "itable_unused larger than the group's inodes",
            empty,
            Box::new(move |d| d.itable_unused = ipg + 1),
        ),
        (
            "itable_unused smaller on a never-used group (zeroed table)",
            empty,
            Box::new(|d| d.itable_unused = 0),
        ),
    ];
    for (what, group, edit) in cases {
        let img = scratch.path("case.img");
        std::fs::write(&img, &pristine).unwrap();
        edit_desc(&img, group, edit);
        let (code, text) = e2fsck(&img);
        let ours = check(&img);
        assert_eq!(
            code != 0,
            !ours.is_clean(),
            "{what} (group {group}): e2fsck exit {code}, jext {:?}\n{text}",
            ours.problems
        );
        if !ours.is_clean() {
            let named = format!("group {group}");
            assert!(
                ours.problems.iter().any(|p| p.contains(&named)),
                "{what}: no problem names {named}: {:?}",
                ours.problems
            );
        }
        eprintln!(
            "{what} (group {group}): e2fsck exit {code}, jext {:?}",
            ours.problems
        );
    }

    // Without a group checksum feature the flags mean nothing (e2fsck's PR_0_GDT_UNINIT).
    let plain = scratch.path("plain.img");
    mkfs_ext4(
        &plain,
        64,
        &["-O", "^metadata_csum,^uninit_bg", "-b", "1024"],
    );
    edit_desc(&plain, 3, |d| {
        d.flags |= FLAG_INODE_UNINIT | FLAG_BLOCK_UNINIT
    });
    let (code, text) = e2fsck(&plain);
    let ours = check(&plain);
    assert_eq!(
        code != 0,
        !ours.is_clean(),
        "flags without gdt_csum: e2fsck exit {code}, jext {:?} {:?}\n{text}",
        ours.problems,
        ours.notes
    );
    eprintln!(
        "flags without gdt_csum: e2fsck exit {code}, jext {:?} {:?}",
        ours.problems, ours.notes
    );
}
