//! `jext mkfs`, `jext fsck`, `jext recover` and `jext debug`.

use super::progress::Progress;
use clap::Subcommand;
use jext::{dump, fsck as check, mkfs as make, DebugWhat, FileDevice, MkfsOptions};
use jext_fs::options::parse_size_in;
use std::path::Path;
use std::sync::Arc;

#[derive(Subcommand)]
pub enum DebugCommand {
    /// The superblock.
    Superblock,
    /// Every group descriptor.
    Groups,
    /// One inode, with its extents.
    Inode { number: u32 },
    /// A directory's entries.
    Dir { path: String },
    /// The journal as it is on disk: transactions, logged blocks, revokes.
    Journal,
}

pub fn mkfs(
    image: &Path,
    size: Option<&str>,
    block_size: Option<&str>,
    journal: bool,
    journal_blocks: Option<u32>,
    fast_commit: bool,
    label: String,
) -> i32 {
    let fail = |what: String| {
        eprintln!("jext mkfs: {what}");
        1
    };
    let block_size = match block_size.map(|t| parse_size_in("--block-size", t, 1024..=65536)) {
        None => None,
        Some(Ok(bytes)) if bytes.is_power_of_two() => Some(bytes as u32),
        Some(Ok(_)) => {
            return fail(format!(
                "--block-size={}: not a power of two; valid: 1024, 2048, 4096, ... 65536",
                block_size.unwrap_or_default()
            ))
        }
        Some(Err(e)) => return fail(e.to_string()),
    };
    let is_device = std::fs::metadata(image).is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_block_device()
    });
    let (device, zeroed): (Arc<dyn jext::BlockDevice>, bool) = match (size, is_device) {
        (Some(_), true) => {
            return fail(format!(
                "{} is a block device; --size is for image files",
                image.display()
            ))
        }
        (Some(text), false) => {
            let bytes = match parse_size_in("--size", text, jext_fs::mkfs::size_range_bytes()) {
                Ok(b) => b,
                Err(e) => return fail(e.to_string()),
            };
            if let Some(holder) = jext::owner_of(image) {
                return fail(format!(
                    "{} is in use by {holder}; will not make a file system on it",
                    image.display()
                ));
            }
            // A fresh sparse file reads as zeros, so nothing needs zeroing.
            if let Err(e) = std::fs::File::create(image).and_then(|f| f.set_len(bytes)) {
                return fail(format!("cannot create {}: {e}", image.display()));
            }
            match FileDevice::open(image, false) {
                Ok(d) => (Arc::new(d), true),
                Err(e) => return fail(e.to_string()),
            }
        }
        (None, _) => match jext::open_device(image, false) {
            Ok(d) => (d, false),
            Err(e) => return fail(format!("{e} (give --size to create an image file)")),
        },
    };
    if !journal && journal_blocks.is_some() {
        return fail("--journal-blocks sizes a journal, and --no-journal makes none".into());
    }
    let opts = MkfsOptions {
        block_size,
        journal,
        journal_blocks,
        fast_commit,
        label,
        assume_zeroed: zeroed,
        ..MkfsOptions::default()
    };
    let progress = Progress::spinner(&format!("making a file system on {}", image.display()));
    let made = make(device, &opts);
    progress.finish();
    match made {
        Ok(r) => {
            let journal = match (journal, r.fast_commit_blocks) {
                (false, _) => jext::NO_JOURNAL_NOTE.to_string(),
                (true, 0) => format!("journal {} blocks", r.journal_blocks),
                (true, fc) => format!(
                    "journal {} blocks + {fc} fast-commit blocks",
                    r.journal_blocks
                ),
            };
            println!(
                "made {}: {} blocks of {} bytes, {} groups, {} inodes, {journal}",
                image.display(),
                r.blocks,
                r.block_size,
                r.groups,
                r.inodes,
            );
            0
        }
        Err(e) => fail(e.to_string()),
    }
}

/// `jext recover`: mounts (recovery replays the journal, fast commits and orphans), then
/// unmounts, which checkpoints and marks the journal empty and the file system clean.
pub fn recover(image: &Path) -> i32 {
    super::note_live_owner(image);
    let recovered = jext::open_device(image, false)
        .map_err(jext::FsError::from)
        .and_then(|device| jext::Fs::open_with_report(device, jext::MountOptions::default()))
        .and_then(|(fs, report)| fs.unmount().map(|()| report));
    match recovered {
        Ok(report) if !report.has_journal => {
            let state = if report.unchecked {
                "it was not cleanly unmounted and stays marked so: run e2fsck -f"
            } else {
                "it is clean"
            };
            println!(
                "{}: nothing to replay, {}; {state}",
                image.display(),
                jext::NO_JOURNAL_NOTE
            );
            0
        }
        Ok(report) if report.recovery.was_clean => {
            println!("{}: the journal was already clean", image.display());
            0
        }
        Ok(report) => {
            println!(
                "{}: replayed {} transactions ({} blocks); the image is clean",
                image.display(),
                report.recovery.transactions,
                report.recovery.blocks_replayed
            );
            0
        }
        Err(e) => {
            eprintln!("jext recover: {}: {e}", image.display());
            8
        }
    }
}

pub fn fsck(image: &Path) -> i32 {
    super::note_live_owner(image);
    let device = match jext::open_device(image, true) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("jext fsck: {e}");
            return 8;
        }
    };
    let progress = Progress::spinner(&format!("checking {}", image.display()));
    let checked = check(device);
    progress.finish();
    match checked {
        Ok(report) => {
            for note in &report.notes {
                println!("note: {note}");
            }
            for problem in &report.problems {
                println!("problem: {problem}");
            }
            println!(
                "{}: {}/{} inodes, {}/{} blocks in use, {} directories: {}",
                image.display(),
                report.inodes_in_use,
                report.inodes_total,
                report.blocks_in_use,
                report.blocks_total,
                report.directories,
                if report.is_clean() {
                    "clean".to_string()
                } else {
                    format!("{} problems", report.problems.len())
                }
            );
            report.exit_code()
        }
        Err(e) => {
            eprintln!("jext fsck: {e}");
            8
        }
    }
}

pub fn debug(image: &Path, what: DebugCommand) -> i32 {
    let what = match what {
        DebugCommand::Superblock => DebugWhat::Superblock,
        DebugCommand::Groups => DebugWhat::Groups,
        DebugCommand::Inode { number } => DebugWhat::Inode(number),
        DebugCommand::Dir { path } => DebugWhat::Dir(path),
        DebugCommand::Journal => DebugWhat::Journal,
    };
    super::note_live_owner(image);
    let result = jext::open_device(image, true)
        .map_err(jext::FsError::from)
        .and_then(|d| dump(d, &what));
    match result {
        Ok(text) => {
            print!("{text}");
            0
        }
        Err(e) => {
            eprintln!("jext debug: {e}");
            1
        }
    }
}
