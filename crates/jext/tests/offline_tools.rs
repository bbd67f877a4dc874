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
