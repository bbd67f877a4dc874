//! Bad input and hard conditions: corrupt structures give errors that name the structure
//! and where it is; random corruption never panics; a full file system gives ENOSPC and
//! stays consistent; a device error aborts the journal without losing what committed;
//! many threads at once are safe.

mod common;

use common::{assert_e2fsck_clean, Scratch};
use jext_device::{BlockDevice, SimDevice, SimFault};
use jext_fs::{mkfs, Fs, FsError, MkfsOptions, MountOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn fresh(size: u64) -> Arc<SimDevice> {
    let dev = Arc::new(SimDevice::new(size));
    mkfs(
        dev.clone(),
        &MkfsOptions {
            assume_zeroed: true,
            uuid: Some([9; 16]),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    dev
}

/// A small populated image (1 KiB blocks), cleanly unmounted.
fn populated() -> Arc<SimDevice> {
    let dev = fresh(32 << 20);
    let fs = Fs::open(dev.clone(), MountOptions::default()).unwrap();
    fs.mkdir_path("/dir", 0o755).unwrap();
    for i in 0..40 {
        let f = fs.create_file(&format!("/dir/file-{i}"), 0o644).unwrap();
        f.write_at(0, &vec![i as u8; 3000 + i * 100]).unwrap();
    }
    fs.unmount().unwrap();
    dev
}

fn flip(dev: &SimDevice, byte: u64) {
    let mut b = [0u8; 512];
    let sector = byte / 512 * 512;
    dev.read_at(sector, &mut b).unwrap();
    b[(byte - sector) as usize] ^= 0x5A;
    dev.write_at(sector, &b, true).unwrap();
}

/// The physical block of `ino`'s record and of its first data block.
fn locate(dev: &Arc<SimDevice>, path: &str) -> (u32, u64) {
    let fs = Fs::open(
        dev.clone(),
        MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )
    .unwrap();
    let ino = fs.resolve(path).unwrap();
    let first = fs.extents(ino).map(|e| e[0].start).unwrap_or(0);
    fs.unmount().unwrap();
    (ino, first)
}

fn expect_corrupt(result: Result<impl Sized, FsError>, structure: &str, location: &str) {
    match result {
        Err(FsError::Corrupt(e)) => {
            let text = e.to_string();
            assert!(
                text.contains(structure) && text.contains(location),
                "error {text:?} should name {structure:?} at {location:?}"
            );
        }
        Err(other) => panic!("expected a corruption error naming {structure}, got {other}"),
        Ok(_) => panic!("expected a corruption error naming {structure}, got success"),
    }
}

fn mount(dev: &Arc<SimDevice>) -> Result<Fs, FsError> {
    Fs::open(dev.clone(), MountOptions::default())
}

#[test]
fn a_corrupt_superblock_is_named() {
    let dev = populated();
    flip(&dev, 1024 + 0x20);
    expect_corrupt(mount(&dev), "superblock", "the superblock");
}

#[test]
fn a_corrupt_group_descriptor_is_named() {
    let dev = populated();
    // 1 KiB blocks: the descriptor table is block 2; descriptor 0 is its first 64 bytes.
    flip(&dev, 2 * 1024 + 0x0C);
    expect_corrupt(mount(&dev), "group descriptor", "group descriptor 0");
}

#[test]
fn a_corrupt_inode_is_named() {
    let dev = populated();
    let (ino, _) = locate(&dev, "/dir/file-7");
    flip(&dev, inode_record_byte(&dev, ino) + 0x04);
    let fs = mount(&dev).unwrap();
    expect_corrupt(fs.stat(ino), "inode", &format!("inode {ino}"));
}

/// Byte offset of `ino`'s record (1 KiB blocks; `ino` in group 0): the table address
/// comes from descriptor 0 in block 2.
fn inode_record_byte(dev: &Arc<SimDevice>, ino: u32) -> u64 {
    let mut gdt = [0u8; 1024];
    dev.read_at(2 * 1024, &mut gdt).unwrap();
    let table = u64::from(u32::from_le_bytes(gdt[8..12].try_into().unwrap()));
    table * 1024 + u64::from(ino - 1) * 256
}

#[test]
fn a_corrupt_extent_header_is_named() {
    let dev = populated();
    let (ino, _) = locate(&dev, "/dir/file-3");
    let record = inode_record_byte(&dev, ino);
    // i_block starts at 0x28: the extent header's magic. The inode checksum will then
    // fail too, so rewrite the record's checksum to isolate the extent error.
    let mut b = [0u8; 512];
    let sector = record / 512 * 512;
    dev.read_at(sector, &mut b).unwrap();
    let at = (record - sector) as usize;
    b[at + 0x28] ^= 0xFF;
    let raw = jext_fs::format::inode::Inode::decode(&b[at..at + 256], ino, None).unwrap();
    let sb = read_sb(&dev);
    let fixed = raw.encode(ino, Some(sb.csum_seed()));
    b[at..at + 256].copy_from_slice(&fixed);
    dev.write_at(sector, &b, true).unwrap();
    let fs = mount(&dev).unwrap();
    expect_corrupt(fs.read(ino, 0, 10), "extent node", &format!("inode {ino}"));
}

fn read_sb(dev: &Arc<SimDevice>) -> jext_fs::format::superblock::Superblock {
    let mut b = [0u8; 1024];
    dev.read_at(1024, &mut b).unwrap();
    jext_fs::format::superblock::Superblock::decode(
        &b,
        jext_fs::format::Location::Superblock { group: 0 },
    )
    .unwrap()
}

#[test]
fn a_corrupt_directory_block_is_named() {
    let dev = populated();
    let (dir, first) = locate(&dev, "/dir");
    flip(&dev, first * 1024 + 40);
    let fs = mount(&dev).unwrap();
    match fs.readdir(dir, 0) {
        Err(FsError::Corrupt(e)) => {
            let text = e.to_string();
            assert!(
                text.contains("directory") && text.contains(&format!("block {first}")),
                "{text}"
            );
        }
        other => panic!(
            "expected a directory block error, got {:?}",
            other.map(|v| v.len())
        ),
    }
}

#[test]
fn a_torn_block_in_a_committed_transaction_refuses_the_mount() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev).unwrap();
    let f = fs.create_file("/a", 0o644).unwrap();
    f.write_at(0, b"committed").unwrap();
    // A full commit (an fsync would write a fast commit instead).
    fs.sync().unwrap();
    drop(f);
    let crashed = Arc::new(dev.crash());
    drop(fs);
    // The transaction's first log block, after the journal superblock: a descriptor or a
    // records block (its cold blocks go as byte records on their home blocks), either way
    // a block whose checksum tail a flipped bit breaks. Found from the superblock.
    let sb = read_sb(&crashed);
    let jnl = sb.jnl_blocks();
    // Words 0-2 are the extent header; the first extent is words 3 (logical), 4 (length,
    // then the start's high 16 bits) and 5 (the start's low 32 bits).
    let start = u64::from(jnl[5]) | (u64::from(jnl[4] >> 16) << 32);
    flip(&crashed, (start + 1) * 1024 + 100);
    match mount(&crashed) {
        Err(FsError::Journal(e)) => assert!(e.to_string().contains("checksum mismatch"), "{e}"),
        Err(FsError::Device(e)) => panic!("unexpected device error {e}"),
        Err(other) => assert!(other.to_string().contains("journal"), "{other}"),
        Ok(_) => panic!("a torn committed transaction must not mount"),
    }
}

#[test]
fn random_metadata_corruption_never_panics() {
    let base = populated();
    let mut rng = StdRng::seed_from_u64(77);
    let path = std::env::temp_dir().join(format!("jext-fuzz-{}.img", std::process::id()));
    base.write_current_image(&path).unwrap();
    // Superblock, descriptors, bitmaps and the start of the inode tables.
    let meta_end = 300 * 1024u64;
    for round in 0..150 {
        let dev = Arc::new(SimDevice::from_image_file(&path).unwrap());
        for _ in 0..rng.gen_range(1..4) {
            let byte = if rng.gen_bool(0.5) {
                rng.gen_range(1024..meta_end)
            } else {
                rng.gen_range(1024..(4 << 20))
            };
            flip(&dev, byte);
        }
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| walk_everything(&dev)));
        assert!(
            outcome.is_ok(),
            "round {round}: jext panicked on corrupt input"
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// Mounts and touches everything; errors are fine, panics are not.
fn walk_everything(dev: &Arc<SimDevice>) {
    let Ok(fs) = Fs::open(dev.clone(), MountOptions::default()) else {
        return;
    };
    let mut stack = vec![fs.root()];
    let mut seen = 0;
    while let Some(dir) = stack.pop() {
        seen += 1;
        if seen > 200 {
            break;
        }
        let Ok(entries) = fs.readdir(dir, 0) else {
            continue;
        };
        for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
            if let Ok(st) = fs.stat(e.ino) {
                match st.kind {
                    jext_fs::FileKind::Directory => stack.push(e.ino),
                    jext_fs::FileKind::Regular => {
                        let _ = fs.read(e.ino, 0, 1 << 16);
                        let _ = fs.write(e.ino, 10, b"fuzz");
                        let _ = fs.listxattr(e.ino);
                    }
                    _ => {}
                }
            }
        }
        let _ = fs.create(dir, b"new-file", 0o644, 0, 0);
        let _ = fs.unlink(dir, b"file-1");
    }
    let _ = fs.unmount();
}

#[test]
fn a_full_file_system_gives_enospc_and_stays_consistent() {
    let scratch = Scratch::new("enospc");
    let dev = fresh(16 << 20);
    let fs = mount(&dev).unwrap();
    let f = fs.create_file("/fill", 0o644).unwrap();
    let chunk = vec![0xABu8; 256 * 1024];
    let mut written = 0u64;
    let err = loop {
        match f.write_at(written, &chunk) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(
            written < 64 << 20,
            "a 16 MiB file system took {written} bytes"
        );
    };
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
    f.fsync().unwrap();
    assert_eq!(
        f.read_at(0, written as usize).unwrap().len() as u64,
        written
    );
    // Metadata operations still work or fail cleanly; nothing is left half done.
    let more = fs
        .create_file("/more", 0o644)
        .map(|g| g.write_at(0, &vec![1u8; 1 << 20]));
    if let Ok(Err(e)) | Err(e) = more {
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    }
    drop(f);
    fs.unlink(fs.root(), b"fill").unwrap();
    let g = fs.create_file("/after", 0o644).unwrap();
    g.write_at(0, &vec![2u8; 4 << 20]).unwrap();
    g.fsync().unwrap();
    drop(g);
    fs.unmount().unwrap();
    let path = scratch.path("full.img");
    dev.write_current_image(&path).unwrap();
    assert_e2fsck_clean(&path);
}

#[test]
fn an_io_error_aborts_the_journal_and_keeps_what_committed() {
    let scratch = Scratch::new("ioerr");
    let dev = fresh(32 << 20);
    let fs = mount(&dev).unwrap();
    let kept = fs.create_file("/kept", 0o644).unwrap();
    kept.write_at(0, b"durable before the error").unwrap();
    kept.fsync().unwrap();
    drop(kept);
    dev.inject(SimFault::FailWritesAfter(0));
    // More than a small append, whose fsync would journal it (`sync_journaling`): the
    // data goes in place and its write fails.
    let f = fs.create_file("/lost", 0o644).unwrap();
    f.write_at(0, &vec![5u8; 100_000]).unwrap();
    let err = f.fsync().unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    // A failed data write changes no metadata (its blocks stay unwritten, its pages
    // dirty), as with ext4's default `data_err=ignore`; the next commit fails and aborts.
    let err = fs.sync().unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    // The journal is aborted: later changes fail with EROFS, the file system is read-only.
    let later = fs
        .create_file("/later", 0o644)
        .err()
        .expect("writes after an abort must fail");
    assert_eq!(later.errno(), libc::EROFS, "{later}");
    drop(f);
    assert!(fs.unmount().is_err(), "unmount reports the error");
    dev.clear_faults();
    let after = Arc::new(dev.crash());
    let fs = mount(&after).unwrap();
    let ino = fs.resolve("/kept").unwrap();
    assert_eq!(fs.read(ino, 0, 100).unwrap(), b"durable before the error");
    fs.unmount().unwrap();
    let path = scratch.path("after.img");
    after.write_current_image(&path).unwrap();
    assert_e2fsck_clean(&path);
}

/// A failed overwrite in place (no transaction maps it) changes no metadata: the fsync
/// reports EIO, the file system stays writable, the page stays dirty, and the next fsync
/// writes it again and makes it durable.
#[test]
fn a_failed_overwrite_in_place_stays_dirty_for_the_next_fsync() {
    let dev = fresh(32 << 20);
    let fs = mount(&dev).unwrap();
    // More than a small append, whose fsync would journal the file's data for a while
    // (`sync_journaling`): the file stays ordered.
    let f = fs.create_file("/f", 0o644).unwrap();
    f.write_at(0, &[1u8; 17 * 4096]).unwrap();
    f.fsync().unwrap();
    f.write_at(4096, &[2u8; 4096]).unwrap();
    dev.inject(SimFault::FailWritesAfter(0));
    let err = f.fdatasync().unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    dev.clear_faults();
    fs.create_file("/still-writable", 0o644).unwrap();
    f.fdatasync().unwrap();
    drop(f);
    let after = Arc::new(dev.crash());
    let fs = mount(&after).unwrap();
    let ino = fs.resolve("/f").unwrap();
    let data = fs.read(ino, 0, 8192).unwrap();
    assert!(
        data[..4096].iter().all(|&b| b == 1),
        "the first block as synced"
    );
    assert!(
        data[4096..].iter().all(|&b| b == 2),
        "the retried overwrite is durable"
    );
}

#[test]
fn many_threads_at_once() {
    let scratch = Scratch::new("threads");
    let dev = fresh(128 << 20);
    let fs = mount(&dev).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                fs.mkdir_path(&format!("/t{t}"), 0o755).unwrap();
                for i in 0..150 {
                    let f = fs.create_file(&format!("/t{t}/f{i}"), 0o644).unwrap();
                    f.write_at(0, &vec![(t * 50 + i % 50) as u8; 1000 + i * 37])
                        .unwrap();
                    if i % 10 == 0 {
                        f.fsync().unwrap();
                    }
                    if i % 7 == 0 && i > 0 {
                        fs.unlink(
                            fs.resolve(&format!("/t{t}")).unwrap(),
                            format!("f{}", i - 1).as_bytes(),
                        )
                        .unwrap();
                    }
                    let _ = fs.readdir(fs.root(), 0).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for t in 0..4 {
        for i in 0..150usize {
            let path = format!("/t{t}/f{i}");
            let gone = i % 7 == 6 && i + 1 < 150;
            match fs.resolve(&path) {
                Ok(ino) => {
                    assert!(!gone, "{path} should be gone");
                    assert_eq!(
                        fs.read(ino, 0, 10_000).unwrap(),
                        vec![(t * 50 + i % 50) as u8; 1000 + i * 37]
                    );
                }
                Err(_) => assert!(gone, "{path} is missing"),
            }
        }
    }
    fs.unmount().unwrap();
    let path = scratch.path("threads.img");
    dev.write_current_image(&path).unwrap();
    assert_e2fsck_clean(&path);
}

/// An inode changed in a transaction that is not durable stays cached however many other
/// inodes are read after it: its sync tid is what an fsync waits for. Dropped from the
/// cache (past 65,536 inodes) and read again, it would look durable, and an fsync after a
/// chmod would return with the chmod only in memory.
#[test]
fn a_change_survives_inode_cache_eviction_until_fsync() {
    // 131,072 inodes: room for more than the cache keeps.
    let dev = Arc::new(SimDevice::new(512 << 20));
    let mkfs_options = MkfsOptions {
        assume_zeroed: true,
        inode_ratio: Some(4096),
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &mkfs_options).unwrap();
    let options = MountOptions {
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    const FILES: usize = 70_000;
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    drop(fs.create_file("/kept", 0o644).unwrap());
    fs.mkdir_path("/many", 0o755).unwrap();
    for i in 0..FILES {
        drop(fs.create_file(&format!("/many/{i}"), 0o644).unwrap());
    }
    fs.unmount().unwrap();
    // A fresh cache: the chmod, then more inodes read than the cache keeps, no commit.
    let fs = Fs::open(dev.clone(), options.clone()).unwrap();
    let kept = fs.resolve("/kept").unwrap();
    let chmod = jext_fs::SetAttr {
        perm: Some(0o600),
        ..jext_fs::SetAttr::default()
    };
    fs.setattr(kept, &chmod).unwrap();
    let commits = fs.journal_stats().commits;
    for i in 0..FILES {
        fs.stat(fs.resolve(&format!("/many/{i}")).unwrap()).unwrap();
    }
    assert_eq!(
        fs.journal_stats().commits,
        commits,
        "nothing committed the chmod"
    );
    fs.open_file("/kept").unwrap().fsync().unwrap();
    let crashed = Arc::new(dev.crash());
    std::mem::forget(fs);
    let fs = Fs::open(crashed, options).unwrap();
    let perm = fs.stat(fs.resolve("/kept").unwrap()).unwrap().perm;
    assert_eq!(perm, 0o600, "the chmod before the fsync is durable");
}
