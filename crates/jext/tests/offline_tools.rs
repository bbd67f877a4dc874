//! `jext put`, `ls`, `cat` and `get` on an image without mounting it: a tree goes in and
//! comes back out with the same bytes, modes, symlinks and xattrs; the reading tools leave
//! the image byte-for-byte unchanged; e2fsck finds the image clean after `put`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const JEXT: &str = env!("CARGO_BIN_EXE_jext");

fn jext(args: &[&str]) -> String {
    let out = Command::new(JEXT).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "jext {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_tree_goes_in_and_comes_out_the_same() {
    let dir = std::env::temp_dir().join(format!("jext-offline-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (src, out, image) = (dir.join("src"), dir.join("out"), dir.join("fs.img"));
    fs::create_dir_all(src.join("sub")).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(src.join("sub/big"), &big).unwrap();
    fs::write(src.join("small"), b"small\n").unwrap();
    fs::set_permissions(src.join("small"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("sub/big", src.join("link")).unwrap();
    let have_attr = Command::new("setfattr")
        .args(["-n", "user.colour", "-v", "blue"])
        .arg(src.join("small"))
        .status()
        .is_ok_and(|s| s.success());
    let image_text = image.to_str().unwrap();
    jext(&["mkfs", image_text, "--size", "64M"]);
    jext(&["put", src.to_str().unwrap(), image_text, "/tree"]);
    let check = Command::new("e2fsck")
        .arg("-fn")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let before = fs::read(&image).unwrap();
    let listing = jext(&["ls", image_text, "/tree"]);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("-0600") && l.ends_with(" small")),
        "{listing}"
    );
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with('l') && l.ends_with(" link")),
        "{listing}"
    );
    assert_eq!(jext(&["cat", image_text, "/tree/small"]), "small\n");
    jext(&["get", image_text, "/tree", out.to_str().unwrap()]);
    assert!(
        fs::read(&image).unwrap() == before,
        "reading tools changed the image"
    );

    assert!(fs::read(out.join("sub/big")).unwrap() == big);
    assert_eq!(
        fs::read_link(out.join("link")).unwrap(),
        Path::new("sub/big")
    );
    assert_eq!(
        fs::metadata(out.join("small"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o600
    );
    if have_attr {
        let got = Command::new("getfattr")
            .args(["-n", "user.colour", "--only-values"])
            .arg(out.join("small"))
            .output()
            .unwrap();
        assert_eq!(got.stdout, b"blue");
    }
    let missing = Command::new(JEXT)
        .args(["cat", image_text, "/tree/nope"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/tree/nope"));
    fs::remove_dir_all(&dir).unwrap();
}

/// A crash leaves single-I/O commits in the log: Linux must refuse the image (the journal's
/// private incompat bit) and `jext recover` replays it and leaves it clean, after which
/// e2fsck agrees and the fsynced data is there.
#[test]
fn jext_recover_hands_a_single_io_log_to_linux() {
    use jext::{mkfs, FileJournalMode, Fs, MkfsOptions, MountOptions, SimDevice};
    use std::sync::Arc;
    let dir = std::env::temp_dir().join(format!("jext-recover-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let image = dir.join("crashed.img");
    let dev = Arc::new(SimDevice::new(64 << 20));
    let opts = MkfsOptions {
        assume_zeroed: true,
        ..MkfsOptions::default()
    };
    mkfs(dev.clone(), &opts).unwrap();
    let options = MountOptions {
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    };
    let fs = Fs::open(dev.clone(), options).unwrap();
    let f = fs.create_file("/journaled", 0o644).unwrap();
    f.set_journal_mode(FileJournalMode::Data).unwrap();
    f.write_at(0, &[0x5a; 10_000]).unwrap();
    f.fsync().unwrap();
    assert!(fs.journal_stats().single_io_commits > 0);
    // Three blocks of data and a few small metadata changes: one compact commit block.
    assert!(fs.journal_stats().compact_commits > 0);
    dev.crash().write_durable_image(&image).unwrap();
    drop(f);
    drop(fs);
    let image_text = image.to_str().unwrap();
    let journal = jext(&["debug", image_text, "journal"]);
    assert!(journal.contains("a compact commit"), "{journal}");
    let incompat = journal
        .split("features incompat ")
        .nth(1)
        .and_then(|rest| rest.split([',', ' ']).next())
        .and_then(|hex| u32::from_str_radix(hex.trim_start_matches("0x"), 16).ok())
        .expect("jext debug journal names the incompat features");
    assert_ne!(
        incompat & 0x8000_0000,
        0,
        "the private bit is set: {journal}"
    );
    let refused = Command::new("e2fsck")
        .arg("-fn")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "e2fsck must refuse the private bit"
    );
    let said = jext(&["recover", image_text]);
    assert!(said.contains("replayed"), "{said}");
    let checked = Command::new("e2fsck")
        .arg("-fn")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "e2fsck after jext recover: {}",
        String::from_utf8_lossy(&checked.stdout)
    );
    let cat = Command::new(JEXT)
        .args(["cat", image_text, "/journaled"])
        .output()
        .unwrap();
    assert_eq!(cat.stdout, vec![0x5a; 10_000]);
    let _ = fs::remove_dir_all(&dir);
}
