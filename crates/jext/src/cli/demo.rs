//! `jext demo`: the main job on an embedded default. Makes an image, writes a small tree
//! through the library with fsyncs, stops without unmounting (a crash, as far as the disk
//! knows), mounts again (journal recovery), verifies every byte, unmounts cleanly and
//! checks the image, printing what happened and what it cost in device requests.

use jext::{mkfs, CounterSnapshot, FileDevice, Fs, MkfsOptions, MountOptions};
use std::path::PathBuf;
use std::sync::Arc;

/// The tree the demo writes: (path, contents).
fn tree() -> Vec<(String, Vec<u8>)> {
    let mut files = vec![
        (
            "/README".to_string(),
            b"jext: a user-space ext4 whose journal is better than the kernel's.\n".to_vec(),
        ),
        (
            "/docs/journal.txt".to_string(),
            b"running -> committing -> checkpoint\n".repeat(40),
        ),
    ];
    for i in 0..8 {
        let body = format!("// module {i}\npub fn f{i}() -> u32 {{ {i} }}\n").repeat(20 + i);
        files.push((format!("/src/m{i}.rs"), body.into_bytes()));
    }
    files.push((
        "/data/big.bin".to_string(),
        (0..1 << 20)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect(),
    ));
    files
}

pub fn run(keep: Option<PathBuf>) -> i32 {
    match demo(keep) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("jext demo: {e}");
            1
        }
    }
}

fn demo(keep: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    let temp = std::env::temp_dir().join(format!("jext-demo-{}", std::process::id()));
    let image = keep.clone().unwrap_or_else(|| temp.join("demo.img"));
    if let Some(dir) = image.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let device = Arc::new(FileDevice::create(&image, 64 << 20)?);
    let made = mkfs(
        device,
        &MkfsOptions {
            assume_zeroed: true,
            label: "jext-demo".into(),
            ..MkfsOptions::default()
        },
    )?;
    println!(
        "1. made {} (64 MiB): {} blocks of {} bytes, journal {} blocks",
        image.display(),
        made.blocks,
        made.block_size,
        made.journal_blocks
    );

    let fs = Fs::open_path(&image, MountOptions::default())?;
    for dir in ["/docs", "/src", "/data"] {
        fs.mkdir_path(dir, 0o755)?;
    }
    let mut fsyncs = CounterSnapshot::default();
    for (path, data) in tree() {
        let f = fs.create_file(&path, 0o644)?;
        f.write_at(0, &data)?;
        let before = fs.counters();
        f.fsync()?;
        let cost = fs.counters() - before;
        fsyncs.writes += cost.writes;
        fsyncs.write_bytes += cost.write_bytes;
        fsyncs.flushes += cost.flushes;
        fsyncs.fua_writes += cost.fua_writes;
    }
    let n = tree().len() as u64;
    println!(
        "2. wrote {n} files and fsync'd each: per fsync {:.1} writes, {:.1} KiB, {:.1} flushes, {:.1} FUA writes",
        fsyncs.writes as f64 / n as f64,
        fsyncs.write_bytes as f64 / n as f64 / 1024.0,
        fsyncs.flushes as f64 / n as f64,
        fsyncs.fua_writes as f64 / n as f64
    );
    let stats = fs.journal_stats();
    println!(
        "   journal: {} commits, {} blocks logged, {} checkpoints",
        stats.commits, stats.blocks_logged, stats.checkpoints
    );
    drop(fs);
    println!("3. stopped without unmounting: the journal holds committed transactions not yet written home");

    let (fs, report) =
        Fs::open_with_report(jext::open_device(&image, false)?, MountOptions::default())?;
    println!(
        "4. mounted again: recovery replayed {} transactions ({} blocks)",
        report.recovery.transactions, report.recovery.blocks_replayed
    );
    for (path, data) in tree() {
        let ino = fs.resolve(&path)?;
        let read = fs.read(ino, 0, data.len() + 1)?;
        if read != data {
            return Err(format!(
                "{path}: read {} bytes that differ from the {} written",
                read.len(),
                data.len()
            )
            .into());
        }
    }
    println!("5. every file reads back byte for byte");
    fs.unmount()?;
    let check = jext::fsck(jext::open_device(&image, true)?)?;
    println!(
        "6. unmounted cleanly; jext fsck: {}",
        if check.is_clean() {
            "clean".to_string()
        } else {
            format!("{:?}", check.problems)
        }
    );
    match std::process::Command::new("e2fsck")
        .arg("-fn")
        .arg(&image)
        .output()
    {
        Ok(out) => println!(
            "   e2fsck -fn: exit {} ({})",
            out.status.code().unwrap_or(-1),
            if out.status.success() {
                "clean"
            } else {
                "problems"
            }
        ),
        Err(_) => println!("   e2fsck not installed; skipped"),
    }
    if keep.is_none() {
        std::fs::remove_dir_all(&temp)?;
    } else {
        println!("the image is kept at {}", image.display());
    }
    if !check.is_clean() {
        return Err("the image is not clean".into());
    }
    Ok(())
}
