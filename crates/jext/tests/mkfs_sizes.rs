//! `jext mkfs` size arguments as a user types them: every binary unit with and without
//! `iB`, a terabyte image, and refusals that give the valid range.

use std::path::PathBuf;
use std::process::{Command, Output};

const JEXT: &str = env!("CARGO_BIN_EXE_jext");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("jext-mkfs-sizes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn jext(args: &[&str]) -> Output {
    Command::new(JEXT).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_terabyte_image_is_made_from_1t_and_1tib_and_checks_clean() {
    for size in ["1T", "1TiB"] {
        let image = scratch(&format!("tera-{size}.img"));
        let path = image.to_str().unwrap();
        let made = jext(&["mkfs", path, "--size", size]);
        assert!(made.status.success(), "--size {size}: {}", stderr(&made));
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 1 << 40);
        let fsck = jext(&["fsck", path]);
        assert!(
            fsck.status.success(),
            "jext fsck: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        match Command::new("e2fsck").arg("-fn").arg(&image).output() {
            Ok(out) => assert!(
                out.status.success(),
                "e2fsck -fn: {}",
                String::from_utf8_lossy(&out.stdout)
            ),
            Err(_) => eprintln!("SKIPPED: e2fsck is not installed"),
        }
        std::fs::remove_file(&image).unwrap();
    }
}

#[test]
fn every_unit_spelling_makes_the_same_size() {
    for size in [
        "67108864", "65536K", "65536KiB", "64M", "64MiB", "64m", "64mib",
    ] {
        let image = scratch(&format!("unit-{size}.img"));
        let made = jext(&["mkfs", image.to_str().unwrap(), "--size", size]);
        assert!(made.status.success(), "--size {size}: {}", stderr(&made));
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 << 20, "{size}");
        std::fs::remove_file(&image).unwrap();
    }
}

#[test]
fn block_size_takes_units_too() {
    let image = scratch("bs.img");
    let path = image.to_str().unwrap();
    let made = jext(&["mkfs", path, "--size", "64M", "--block-size", "4K"]);
    assert!(made.status.success(), "{}", stderr(&made));
    let out = String::from_utf8_lossy(&made.stdout).into_owned();
    assert!(out.contains("of 4096 bytes"), "{out}");
    std::fs::remove_file(&image).unwrap();
}

#[test]
fn refusals_give_the_valid_range() {
    let image = scratch("refused.img");
    let path = image.to_str().unwrap();
    for (args, needle) in [
        (vec!["--size", "1X"], "2 MiB to 192 TiB"),
        (vec!["--size", "1GB"], "2 MiB to 192 TiB"),
        (vec!["--size", "1M"], "2 MiB to 192 TiB"),
        (vec!["--size", "1P"], "2 MiB to 192 TiB"),
        (
            vec!["--size", "64M", "--block-size", "512"],
            "1 KiB to 64 KiB",
        ),
        (
            vec!["--size", "64M", "--block-size", "3000"],
            "power of two",
        ),
    ] {
        let mut all = vec!["mkfs", path];
        all.extend(&args);
        let out = jext(&all);
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!image.exists(), "{args:?} left an image behind");
    }
}
