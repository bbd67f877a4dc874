//! File systems without a journal (`mkfs.ext4 -O ^has_journal`, `MkfsOptions { journal:
//! false }`): jext mounts them as ext4 does, writing metadata in place. Linux made or
//! jext made, a tree written through jext is clean for `e2fsck -fn` and reads the same
//! through a Linux loop mount; `data=journal` is refused and the `j` flag is ignored; an
//! fsync'd file survives a crash of the simulated disk (all the device promises), and an
//! image a crash left not clean stays marked so until e2fsck.

mod common;

use common::{assert_e2fsck_clean, mkfs_ext4, run, LoopMount, Scratch};
use jext_device::SimDevice;
use jext_fs::{
    mkfs, DataMode, FileJournalMode, FileKind, Fs, MkfsOptions, MountOptions, RenameFlags,
};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn have(program: &str) -> bool {
    Command::new(program).arg("-V").output().is_ok()
}

/// Bytes that differ from file to file and block to block.
fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// The tree `write_tree` leaves: each regular file's path and contents.
fn expected_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut sparse = vec![0u8; (1 << 20) + 5000];
    sparse[1 << 20..].copy_from_slice(&bytes(5000, 9));
    vec![
        ("small", bytes(100, 1)),
        ("d/multi", bytes(300_000, 2)),
        ("d/sub/renamed", bytes(9000, 3)),
        ("d/sub/linked", bytes(9000, 3)),
        ("d/journaled", bytes(20_000, 5)),
        ("sparse", sparse),
    ]
}

/// Writes a tree through jext: directories, files of one and many blocks, a sparse file,
/// a symlink, a hard link, a rename, an unlink, and many files in one directory (so it
/// grows past a block), with some fsyncs along the way.
fn write_tree(fs: &Fs) {
    fs.mkdir_path("/d", 0o755).unwrap();
    fs.mkdir_path("/d/sub", 0o750).unwrap();
    for (path, data) in expected_files() {
        if path.ends_with("linked") {
            continue;
        }
        let name = if path.ends_with("renamed") {
            "/d/sub/original".to_string()
        } else {
            format!("/{path}")
        };
        let f = fs.create_file(&name, 0o644).unwrap();
        if path == "d/journaled" {
            // Kept on the inode, ignored without a journal (ext4_should_journal_data).
            f.set_journal_mode(FileJournalMode::Data).unwrap();
            assert!(
                !f.journals_data().unwrap(),
                "j journals data without a journal"
            );
        }
        if path == "sparse" {
            f.write_at(1 << 20, &data[1 << 20..]).unwrap();
        } else {
            f.write_at(0, &data).unwrap();
        }
        if data.len() > 50_000 {
            f.fsync().unwrap();
        }
    }
    let sub = fs.resolve("/d/sub").unwrap();
    fs.rename(sub, b"original", sub, b"renamed", RenameFlags::default())
        .unwrap();
    fs.link(fs.resolve("/d/sub/renamed").unwrap(), sub, b"linked")
        .unwrap();
    fs.symlink(fs.root(), b"link", b"d/multi", 0, 0).unwrap();
    let many = fs.mkdir_path("/many", 0o755).unwrap().ino;
    for i in 0..300 {
        let f = fs
            .create_file(&format!("/many/entry-{i:04}"), 0o600)
            .unwrap();
        f.write_at(0, format!("{i}").as_bytes()).unwrap();
    }
    fs.create_file("/doomed", 0o644)
        .unwrap()
        .write_at(0, &bytes(7000, 7))
        .unwrap();
    fs.unlink(fs.root(), b"doomed").unwrap();
    for i in (0..300).step_by(3) {
        fs.unlink(many, format!("entry-{i:04}").as_bytes()).unwrap();
    }
    fs.sync().unwrap();
}

/// Every file of the tree reads the same through Linux.
fn check_with_linux(image: &Path, dir: &Path) {
    let mount = LoopMount::new(image, dir, "ro");
    for (path, data) in expected_files() {
        let got = std::fs::read(mount.path(path)).unwrap();
        assert!(
            got == data,
            "{path}: Linux reads {} bytes, jext wrote {}",
            got.len(),
            data.len()
        );
    }
    assert_eq!(
        std::fs::read_link(mount.path("link")).unwrap(),
        Path::new("d/multi")
    );
    let mut names: Vec<String> = std::fs::read_dir(mount.path("many"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let kept: Vec<String> = (0..300)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("entry-{i:04}"))
        .collect();
    assert_eq!(names, kept);
    for name in &names {
        let i: usize = name["entry-".len()..].parse().unwrap();
        let text = std::fs::read_to_string(mount.path(&format!("many/{name}"))).unwrap();
        assert_eq!(text, format!("{i}"));
    }
    assert!(!mount.path("doomed").exists());
    mount.unmount();
}

#[test]
fn a_tree_written_without_a_journal_is_clean_and_linux_reads_it() {
    if !have("e2fsck") {
        eprintln!("SKIPPED: e2fsck is missing (scripts/setup installs e2fsprogs)");
        return;
    }
    let linux = have("mkfs.ext4");
    if !linux {
        eprintln!(
            "SKIPPED (Linux-made images): mkfs.ext4 is missing; only jext's own \
             --no-journal image is checked"
        );
    }
    let scratch = Scratch::new("no-journal");
    let mut images = vec![("jext-made", None)];
    if linux {
        images.push(("linux-1k", Some(&["-O", "^has_journal"][..])));
        images.push(("linux-4k", Some(&["-O", "^has_journal", "-b", "4096"][..])));
    }
    for (name, linux_args) in images {
        let image = scratch.path(&format!("{name}.img"));
        match linux_args {
            Some(args) => mkfs_ext4(&image, 64, args),
            None => {
                std::fs::File::create(&image)
                    .unwrap()
                    .set_len(64 << 20)
                    .unwrap();
                let device = jext_device::open_path(&image, false).unwrap();
                let opts = MkfsOptions {
                    journal: false,
                    assume_zeroed: true,
                    ..MkfsOptions::default()
                };
                let made = mkfs(device, &opts).unwrap();
                assert_eq!((made.journal_blocks, made.fast_commit_blocks), (0, 0));
                assert_e2fsck_clean(&image);
            }
        }
        let features = run("dumpe2fs", &["-h", image.to_str().unwrap()]);
        assert!(!features.contains("has_journal"), "{name}: {features}");

        let journaled = MountOptions {
            data_mode: DataMode::Journal,
            ..MountOptions::default()
        };
        let refused = Fs::open_path(&image, journaled).err().unwrap().to_string();
        assert!(
            refused.contains("data=journal needs a journal"),
            "{name}: {refused}"
        );

        let device = jext_device::open_path(&image, false).unwrap();
        let (fs, report) = Fs::open_with_report(device, MountOptions::default()).unwrap();
        assert!(!report.has_journal && !report.unchecked, "{name}");
        write_tree(&fs);
        let stats = fs.journal_stats();
        assert!(stats.commits > 0, "{name}: {stats:?}");
        assert_eq!(
            (stats.blocks_logged, stats.fast_commits),
            (0, 0),
            "{name}: nothing goes to a log"
        );
        assert!(stats.blocks_written_home > 0, "{name}: {stats:?}");
        let journaled_file = fs.resolve("/d/journaled").unwrap();
        assert!(!fs.journals_data(journaled_file).unwrap());
        fs.unmount().unwrap();

        assert_e2fsck_clean(&image);
        // Read back by jext after a remount: the same bytes.
        let fs = Fs::open_path(&image, MountOptions::default()).unwrap();
        for (path, data) in expected_files() {
            let f = fs.open_file(&format!("/{path}")).unwrap();
            assert!(
                f.read_at(0, data.len() + 1).unwrap() == data,
                "{name}: {path}"
            );
        }
        let link = fs.resolve("/link").unwrap();
        assert_eq!(fs.stat(link).unwrap().kind, FileKind::Symlink);
        fs.unmount().unwrap();
        assert_e2fsck_clean(&image);

        if is_root() {
            check_with_linux(&image, &scratch.path(&format!("{name}-mnt")));
        } else {
            eprintln!("SKIPPED ({name}): reading the image through a Linux loop mount needs root");
        }
    }
}

#[test]
fn an_fsynced_file_survives_a_crash_and_the_image_stays_unchecked() {
    let dev = Arc::new(SimDevice::new(64 << 20));
    let opts = MkfsOptions {
        journal: false,
        assume_zeroed: true,
        uuid: Some([7; 16]),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let options = MountOptions {
        // No timer commit: only the fsyncs make anything durable.
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    fs.mkdir_path("/dir", 0o755).unwrap();
    let synced = bytes(123_456, 11);
    let f = fs.create_file("/dir/synced", 0o644).unwrap();
    f.write_at(0, &synced).unwrap();
    f.fsync().unwrap();
    // An fbarrier has no log to order by: it is made durable like an fsync.
    let ordered = bytes(5000, 12);
    let g = fs.create_file("/ordered", 0o644).unwrap();
    g.write_at(0, &ordered).unwrap();
    g.fbarrier().unwrap();
    // Written, never synced: whatever the crash keeps of it is the device's business.
    fs.create_file("/dir/unsynced", 0o644)
        .unwrap()
        .write_at(0, &bytes(40_000, 13))
        .unwrap();
    let crashed = Arc::new(dev.crash());
    drop((f, g));
    drop(fs);

    let read_only = MountOptions {
        read_only: true,
        ..options.clone()
    };
    let (fs, report) = Fs::open_with_report(crashed.clone(), read_only.clone()).unwrap();
    assert!(!report.has_journal);
    assert!(report.unchecked, "a crash left the image in use");
    let got = fs
        .open_file("/dir/synced")
        .unwrap()
        .read_at(0, 200_000)
        .unwrap();
    assert!(got == synced, "the fsync'd file reads {} bytes", got.len());
    let got = fs
        .open_file("/ordered")
        .unwrap()
        .read_at(0, 10_000)
        .unwrap();
    assert!(
        got == ordered,
        "the fbarrier'd file reads {} bytes",
        got.len()
    );
    fs.unmount().unwrap();

    // A writable mount and a clean unmount do not make the crashed image clean: only
    // e2fsck may say so.
    let fs = Fs::open(crashed.clone(), options.clone()).unwrap();
    fs.create_file("/after", 0o644).unwrap();
    fs.unmount().unwrap();
    let (fs, report) = Fs::open_with_report(crashed, read_only).unwrap();
    assert!(report.unchecked, "unmount marked a crashed image clean");
    fs.unmount().unwrap();

    // The same workload unmounted cleanly is clean.
    let dev = Arc::new(SimDevice::new(64 << 20));
    mkfs(dev.clone(), &opts).unwrap();
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    fs.create_file("/x", 0o644)
        .unwrap()
        .write_at(0, &synced)
        .unwrap();
    fs.unmount().unwrap();
    let (fs, report) = Fs::open_with_report(dev, options).unwrap();
    assert!(!report.unchecked);
    fs.unmount().unwrap();
}
