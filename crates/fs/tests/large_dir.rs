//! A directory of tens of thousands of names through the library: the htree grows to two
//! index levels, every name is found, readdir streams in batches whose cookies stay valid
//! while names are added between batches, e2fsck finds it clean and Linux lists the same
//! names. (Sizes here are CI-sized; `jext bench` carries the large ones.)

mod common;

use common::{assert_e2fsck_clean, LoopMount, Scratch};
use jext_device::FileDevice;
use jext_fs::{mkfs, Fs, MkfsOptions, MountOptions};
use std::collections::BTreeSet;
use std::process::Command;
use std::sync::Arc;

/// With 1 KiB blocks the root indexes about 120 leaves, so this many names need a second
/// index level.
const NAMES: usize = 20_000;

fn name(i: usize) -> String {
    format!("entry-{i:06}-{}", i * 7919 % 1000)
}

#[test]
fn a_two_level_htree_lists_streams_and_checks_clean() {
    let scratch = Scratch::new("large-dir");
    let img = scratch.path("dir.img");
    mkfs(
        Arc::new(FileDevice::create(&img, 128 << 20).unwrap()),
        &MkfsOptions {
            assume_zeroed: true,
            block_size: Some(1024),
            ..MkfsOptions::default()
        },
    )
    .unwrap();
    let fs = Fs::open_path(&img, MountOptions::default()).unwrap();
    let dir = fs.mkdir_path("/big", 0o755).unwrap().ino;
    for i in 0..NAMES {
        fs.create(dir, name(i).as_bytes(), 0o644, 0, 0).unwrap();
    }
    for i in (0..NAMES).step_by(97) {
        assert!(
            fs.lookup(dir, name(i).as_bytes()).is_ok(),
            "{} lost",
            name(i)
        );
    }
    assert!(fs.lookup(dir, b"entry-never").is_err());

    // Stream the listing; between batches add names (which may split leaves).
    let mut seen = BTreeSet::new();
    let mut cookie = 0;
    let mut batches = 0;
    let mut added = 0;
    loop {
        let batch = fs.readdir(dir, cookie).unwrap();
        let Some(last) = batch.last() else { break };
        assert!(batch.len() < NAMES, "one batch held the whole directory");
        cookie = last.next_cookie;
        batches += 1;
        for e in batch {
            let shown = String::from_utf8(e.name).unwrap();
            assert!(seen.insert(shown.clone()), "{shown} listed twice");
        }
        if batches % 10 == 0 {
            fs.create(dir, format!("late-{added}").as_bytes(), 0o644, 0, 0)
                .unwrap();
            added += 1;
        }
    }
    for i in 0..NAMES {
        assert!(seen.contains(&name(i)), "{} not listed", name(i));
    }
    assert!(batches > 10, "only {batches} batches");
    fs.unmount().unwrap();

    let dump = Command::new("debugfs")
        .args(["-R", "htree_dump /big", img.to_str().unwrap()])
        .output();
    match dump {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("Indirect levels: 1"),
                "not a two-level htree: {}",
                text.lines().take(5).collect::<Vec<_>>().join("\n")
            );
        }
        Err(_) => eprintln!("SKIPPED the depth check: debugfs is not installed"),
    }
    assert_e2fsck_clean(&img);

    // Linux lists exactly the names made: the originals and those added mid-listing.
    let mount = LoopMount::new(&img, &scratch.path("mnt"), "ro");
    let linux: BTreeSet<String> = std::fs::read_dir(mount.path("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    mount.unmount();
    let made: BTreeSet<String> = (0..NAMES)
        .map(name)
        .chain((0..added).map(|i| format!("late-{i}")))
        .collect();
    assert_eq!(linux.len(), made.len(), "Linux lists a different count");
    assert!(linux == made, "Linux lists other names");
}
