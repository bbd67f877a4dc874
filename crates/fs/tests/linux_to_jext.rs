//! Trees written by Linux, read by jext: every file, directory, link and attribute the
//! kernel wrote reads back the same through jext; then jext changes the tree, e2fsck
//! finds it clean, and Linux sees the changes.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, run, LoopMount, Scratch};
use jext_fs::{FileKind, Fs, Ino, MountOptions, RenameFlags};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

fn linux_tree(mount: &LoopMount) {
    let p = |rel: &str| mount.path(rel);
    std::fs::create_dir(p("big")).unwrap();
    for i in 0..3000 {
        std::fs::write(
            p(&format!("big/name-{i:05}-with-some-length")),
            format!("{i}"),
        )
        .unwrap();
    }
    // Every other 4 KiB: one extent each, enough for a two-level tree at 1 KiB blocks.
    let frag = std::fs::File::create(p("fragmented")).unwrap();
    for i in 0..500u64 {
        frag.write_all_at(&vec![(i % 251) as u8; 4096], i * 8192)
            .unwrap();
    }
    drop(frag);
    let sparse = std::fs::File::create(p("sparse")).unwrap();
    sparse.write_all_at(b"start", 0).unwrap();
    sparse.write_all_at(b"far away", 50 << 20).unwrap();
    drop(sparse);
    run(
        "fallocate",
        &["-o", "0", "-l", "1M", p("prealloc").to_str().unwrap()],
    );
    std::fs::write(p("prealloc-written"), b"").unwrap();
    run(
        "fallocate",
        &[
            "-o",
            "0",
            "-l",
            "256K",
            p("prealloc-written").to_str().unwrap(),
        ],
    );
    std::fs::File::options()
        .write(true)
        .open(p("prealloc-written"))
        .unwrap()
        .write_all_at(b"inside", 100_000)
        .unwrap();
    std::os::unix::fs::symlink("big/name-00001-with-some-length", p("short-link")).unwrap();
    std::os::unix::fs::symlink("x/".repeat(90), p("long-link")).unwrap();
    std::fs::hard_link(p("fragmented"), p("hardlink")).unwrap();
    run("mkfifo", &[p("fifo").to_str().unwrap()]);
    let script = format!(
        "import os; os.setxattr('{0}', 'user.a', b'1'); os.setxattr('{0}', 'user.big', b'B' * 900); os.setxattr('{0}', 'trusted.t', b'tt')",
        p("sparse").display()
    );
    run("python3", &["-c", &script]);
    run("sync", &[]);
}

/// Compares the jext view of `ino` at `rel` with the host's view of the same path.
fn compare(fs: &Fs, ino: Ino, host: &Path, rel: &str, checked: &mut usize) {
    let meta = std::fs::symlink_metadata(host).unwrap();
    let st = fs.stat(ino).unwrap();
    assert_eq!(u64::from(st.ino), meta.ino(), "{rel}: inode number");
    assert_eq!(st.mode(), meta.mode(), "{rel}: mode");
    assert_eq!(u64::from(st.nlink), meta.nlink(), "{rel}: links");
    assert_eq!(st.size, meta.size(), "{rel}: size");
    assert_eq!(st.blocks_512, meta.blocks(), "{rel}: blocks");
    assert_eq!(
        (st.mtime.seconds, i64::from(st.mtime.nanoseconds)),
        (meta.mtime(), meta.mtime_nsec()),
        "{rel}: mtime"
    );
    *checked += 1;
    match st.kind {
        FileKind::Regular => {
            let host_data = std::fs::read(host).unwrap();
            let ours = fs.read(ino, 0, host_data.len() + 1).unwrap();
            assert!(ours == host_data, "{rel}: contents differ");
        }
        FileKind::Symlink => {
            let target = std::fs::read_link(host).unwrap();
            assert_eq!(
                fs.readlink(ino).unwrap(),
                target.as_os_str().as_encoded_bytes(),
                "{rel}"
            );
        }
        FileKind::Directory => {
            let mut host_names: Vec<String> = std::fs::read_dir(host)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            host_names.sort();
            let mut ours = Vec::new();
            let mut cookie = 0;
            loop {
                let batch = fs.readdir(ino, cookie).unwrap();
                if batch.is_empty() {
                    break;
                }
                cookie = batch.last().unwrap().next_cookie;
                ours.extend(
                    batch
                        .into_iter()
                        .filter(|e| e.name != b"." && e.name != b".."),
                );
            }
            let mut names: Vec<String> = ours
                .iter()
                .map(|e| String::from_utf8(e.name.clone()).unwrap())
                .collect();
            names.sort();
            assert_eq!(names, host_names, "{rel}: listing");
            for e in ours {
                let name = String::from_utf8(e.name).unwrap();
                compare(
                    fs,
                    e.ino,
                    &host.join(&name),
                    &format!("{rel}/{name}"),
                    checked,
                );
            }
        }
        _ => {}
    }
}

#[test]
fn linux_trees_read_back_and_take_changes() {
    for (args, size, name) in [
        (&[][..], 128u64, "l2j-1k"),
        (&["-b", "4096"][..], 256, "l2j-4k"),
    ] {
        let scratch = Scratch::new(name);
        let image = scratch.path("linux.img");
        mkfs_ext4(&image, size, args);
        let mount = LoopMount::new(&image, &scratch.path("mnt"), "");
        linux_tree(&mount);
        mount.unmount();

        // Read-only first: jext must see exactly what the kernel wrote.
        let fs = Fs::open_path(
            &image,
            MountOptions {
                read_only: true,
                ..MountOptions::default()
            },
        )
        .unwrap();
        let view = LoopMount::new(&image, &scratch.path("view"), "ro");
        let mut checked = 0;
        compare(&fs, fs.root(), &view.dir, "", &mut checked);
        assert!(checked > 3000, "{checked} inodes compared");
        let frag = fs.resolve("/fragmented").unwrap();
        assert!(fs.extents(frag).unwrap().len() >= 500);
        let xattr = fs
            .getxattr(fs.resolve("/sparse").unwrap(), b"user.big")
            .unwrap();
        assert_eq!(xattr, vec![b'B'; 900]);
        fs.unmount().unwrap();
        view.unmount();

        // Then jext changes it.
        let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
        let big = fs.resolve("/big").unwrap();
        for i in (0..3000).step_by(2) {
            fs.unlink(big, format!("name-{i:05}-with-some-length").as_bytes())
                .unwrap();
        }
        let frag = fs.open_file("/fragmented").unwrap();
        let old = frag.stat().unwrap().size;
        frag.write_at(old, &vec![0xEE; 70_000]).unwrap();
        frag.write_at(5, b"overwritten").unwrap();
        drop(frag);
        fs.rename(
            fs.root(),
            b"sparse",
            big,
            b"moved-sparse",
            RenameFlags::default(),
        )
        .unwrap();
        let pre = fs.open_file("/prealloc").unwrap();
        pre.write_at(4096, b"now written").unwrap();
        drop(pre);
        fs.unmount().unwrap();
        assert_e2fsck_clean(&image);

        let mount = LoopMount::new(&image, &scratch.path("mnt2"), "ro");
        assert_eq!(std::fs::read_dir(mount.path("big")).unwrap().count(), 1501);
        let data = std::fs::read(mount.path("fragmented")).unwrap();
        assert_eq!(&data[5..16], b"overwritten");
        assert_eq!(data[data.len() - 1], 0xEE);
        assert_eq!(std::fs::read(mount.path("hardlink")).unwrap(), data);
        let pre = std::fs::read(mount.path("prealloc")).unwrap();
        assert_eq!(&pre[4096..4107], b"now written");
        assert!(pre[..4096].iter().all(|&b| b == 0));
        let moved = std::fs::read(mount.path("big/moved-sparse")).unwrap();
        assert_eq!(&moved[..5], b"start");
        assert_eq!(&moved[50 << 20..], b"far away");
    }
}
