//! jext's recovery against journals Linux wrote. An image is copied while the kernel still
//! has it mounted (committed transactions not yet checkpointed); jext recovers one copy
//! and the kernel another (mount, unmount); the two must then agree on every block but
//! the journal's and the superblock and group descriptor copies the kernel rewrites at
//! mount. The scan must also find exactly the transactions `debugfs logdump` lists, and
//! the kernel's checksums must be the ones the format code computes.
//!
//! Needs root, loop devices, mkfs.ext4, dumpe2fs and debugfs; a missing one fails loudly.

use jext_device::{BlockDevice, FileDevice};
use jext_io::IoQueue;
use jext_journal::format::blocks::{Csum, LogFormat};
use jext_journal::format::fast_commit::FcRecord;
use jext_journal::format::superblock::{INCOMPAT_ASYNC_COMMIT, INCOMPAT_FAST_COMMIT};
use jext_journal::recovery::ScanReport;
use jext_journal::{recover, scan, AreaRun, JournalArea};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

/// A scratch directory unique to one test, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "jext-recovery-kernel-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a command; panics with its output if it cannot run or fails.
fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e} (these tests need it installed)"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mkfs(image: &Path, size_mib: u64, args: &[&str]) {
    std::fs::File::create(image)
        .unwrap()
        .set_len(size_mib << 20)
        .unwrap();
    let mut all = vec!["-q", "-F"];
    all.extend_from_slice(args);
    all.push(image.to_str().unwrap());
    run("mkfs.ext4", &all);
}

/// A loop mount, unmounted on drop.
struct Mounted(PathBuf);

impl Mounted {
    fn new(image: &Path, dir: &Path, options: &str) -> Mounted {
        std::fs::create_dir_all(dir).unwrap();
        let options = format!("loop,{options}");
        run(
            "mount",
            &[
                "-o",
                &options,
                image.to_str().unwrap(),
                dir.to_str().unwrap(),
            ],
        );
        Mounted(dir.to_path_buf())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let dir = self.0.to_str().unwrap();
        if std::thread::panicking() {
            // A second panic would abort and hide the first failure.
            if let Err(e) = Command::new("umount").arg(dir).status() {
                eprintln!("cannot unmount {dir}: {e}");
            }
        } else {
            run("umount", &[dir]);
        }
    }
}

/// One round of metadata work: a directory of files, and the previous round's directory
/// removed (its freed blocks are revoked), each step committed by `sync`.
fn write_round(dir: &Path, round: usize) {
    let here = dir.join(format!("round-{round}"));
    std::fs::create_dir_all(&here).unwrap();
    for i in 0..120 {
        let bytes: Vec<u8> = (0..(i * 131 + round) % 5000).map(|b| b as u8).collect();
        std::fs::write(here.join(format!("a-file-with-a-long-name-{i}")), bytes).unwrap();
    }
    run("sync", &[]);
    if round > 0 {
        std::fs::remove_dir_all(dir.join(format!("round-{}", round - 1))).unwrap();
        run("sync", &[]);
    }
}

/// Just enough ext4 to find the journal and the regions the kernel rewrites at mount.
struct Ext4 {
    block_size: u64,
    first_data_block: u64,
    blocks_per_group: u64,
    /// Group descriptor blocks plus the reserved ones after them, per superblock copy.
    gdt_and_reserved_blocks: u64,
    sparse_super: bool,
    journal: JournalArea,
}

fn le16(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn le32(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]))
}

fn read_image(image: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::io::{Seek, SeekFrom};
    let mut file = std::fs::File::open(image).unwrap();
    file.seek(SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len];
    file.read_exact(&mut buf).unwrap();
    buf
}

impl Ext4 {
    /// Superblock → group descriptor 0 → inode 8 → its extent root (depth 0, as mkfs
    /// makes journals).
    fn read(image: &Path) -> Ext4 {
        let sb = read_image(image, 1024, 1024);
        assert_eq!(le16(&sb, 0x38), 0xEF53, "ext4 magic");
        let block_size = 1024u64 << le32(&sb, 0x18);
        let wide = le32(&sb, 0x60) & 0x80 != 0;
        let blocks = le32(&sb, 0x04) | if wide { le32(&sb, 0x150) << 32 } else { 0 };
        let first_data_block = le32(&sb, 0x14);
        let blocks_per_group = le32(&sb, 0x20);
        let desc_size = if wide { le16(&sb, 0xFE) } else { 32 };
        let groups = (blocks - first_data_block).div_ceil(blocks_per_group);
        let gdt_blocks = (groups * desc_size).div_ceil(block_size);
        let gd = read_image(
            image,
            (first_data_block + 1) * block_size,
            desc_size as usize,
        );
        let high = if desc_size >= 64 {
            le32(&gd, 0x28) << 32
        } else {
            0
        };
        let inode_table = le32(&gd, 0x08) | high;
        let (ino, inode_size) = (le32(&sb, 0xE0), le16(&sb, 0x58));
        assert_eq!(ino, 8, "s_journal_inum");
        let inode = read_image(
            image,
            inode_table * block_size + (ino - 1) * inode_size,
            inode_size as usize,
        );
        assert!(
            le32(&inode, 0x20) & 0x80000 != 0,
            "the journal inode uses extents"
        );
        Ext4 {
            block_size,
            first_data_block,
            blocks_per_group,
            gdt_and_reserved_blocks: gdt_blocks + le16(&sb, 0xCE),
            sparse_super: le32(&sb, 0x64) & 0x1 != 0,
            journal: journal_area(&inode[0x28..0x28 + 60], block_size as u32),
        }
    }

    /// Groups holding a superblock copy (all, or 0, 1 and powers of 3, 5 and 7).
    fn has_superblock_copy(&self, group: u64) -> bool {
        let power_of = |base: u64| {
            let mut n = base;
            while n < group {
                n *= base;
            }
            n == group
        };
        !self.sparse_super || group <= 1 || power_of(3) || power_of(5) || power_of(7)
    }

    /// What a block is, if it is one of those the comparison skips.
    fn skipped(&self, block: u64) -> Option<String> {
        let in_journal = self
            .journal
            .runs()
            .iter()
            .any(|r| (r.physical..r.physical + u64::from(r.len)).contains(&block));
        if in_journal {
            return Some("journal".into());
        }
        let group = block.checked_sub(self.first_data_block)? / self.blocks_per_group;
        let offset = block - self.first_data_block - group * self.blocks_per_group;
        let copy = self.has_superblock_copy(group);
        (copy && offset <= self.gdt_and_reserved_blocks).then(|| {
            let what = if offset == 0 {
                "superblock"
            } else {
                "group descriptors"
            };
            format!("{what} copy of group {group}")
        })
    }
}

/// The journal's blocks from an extent root (`ext4_extent_header` then 12-byte
/// `ext4_extent`s: le32 logical, le16 len, le16 start_hi, le32 start_lo).
fn journal_area(root: &[u8], block_size: u32) -> JournalArea {
    assert_eq!(le16(root, 0), 0xF30A, "extent header magic");
    assert_eq!(le16(root, 6), 0, "mkfs journals have a depth-0 extent tree");
    let runs = (0..le16(root, 2) as usize)
        .map(|i| {
            let e = &root[12 + 12 * i..24 + 12 * i];
            let len = le16(e, 4);
            assert!(len <= 32768, "journal extents are initialized");
            AreaRun {
                logical: le32(e, 0) as u32,
                physical: le16(e, 6) << 32 | le32(e, 8),
                len: len as u32,
            }
        })
        .collect();
    JournalArea::new(block_size, runs).unwrap()
}

fn open(image: &Path, read_only: bool) -> IoQueue {
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(image, read_only).unwrap());
    IoQueue::new(dev)
}

/// Transactions as `debugfs logdump` lists them: commit block, (fs block, journal block)
/// tags and revoked blocks, for every transaction it found a commit block for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listed {
    commit_block: u32,
    tags: Vec<(u64, u32)>,
    revokes: Vec<u64>,
}

fn logdump(image: &Path) -> BTreeMap<u32, Listed> {
    let text = run("debugfs", &["-R", "logdump -a", image.to_str().unwrap()]);
    let mut all: BTreeMap<u32, Listed> = BTreeMap::new();
    let mut tid = 0u32;
    let numbers = |line: &str| -> Vec<u64> {
        line.split(|c: char| !c.is_ascii_digit())
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    for line in text.lines() {
        let n = numbers(line);
        if line.starts_with("Found expected sequence") {
            tid = n[0] as u32;
            if line.contains("(commit block)") {
                all.entry(tid).or_default().commit_block = n[2] as u32;
            }
        } else if line.trim_start().starts_with("FS block") {
            all.entry(tid).or_default().tags.push((n[0], n[1] as u32));
        } else if line.trim_start().starts_with("Revoke FS block") {
            all.entry(tid).or_default().revokes.push(n[0]);
        }
    }
    all.retain(|_, t| t.commit_block != 0);
    all
}

/// The scan lists what debugfs lists, and every kernel checksum is the one jext computes.
fn check_scan_against_kernel_tools(image: &Path, fs: &Ext4, found: &ScanReport) {
    let listed: BTreeMap<u32, Listed> = found
        .transactions
        .iter()
        .map(|t| {
            let tags = t
                .blocks
                .iter()
                .map(|b| (b.tag.fs_block, b.journal_block))
                .collect();
            let listed = Listed {
                commit_block: t.commit_block,
                tags,
                revokes: t.revokes.clone(),
            };
            (t.tid, listed)
        })
        .collect();
    assert_eq!(
        listed,
        logdump(image),
        "jext's scan against debugfs logdump"
    );
    let io = open(image, true);
    let format = LogFormat::from_superblock(&found.superblock);
    for t in &found.transactions {
        let mut commit = vec![0u8; fs.block_size as usize];
        io.read(fs.journal.byte_offset(t.commit_block), &mut commit)
            .unwrap();
        assert!(format.commit_is_valid(&commit), "commit of {}", t.tid);
        for b in &t.blocks {
            let mut copy = vec![0u8; fs.block_size as usize];
            io.read(fs.journal.byte_offset(b.journal_block), &mut copy)
                .unwrap();
            let computed = format.data_checksum(t.tid, &copy);
            assert_eq!(computed, b.tag.checksum, "tag of block {}", b.tag.fs_block);
        }
    }
}

/// Runs rounds of work on a fresh image until `enough(round, live image)`, then copies
/// the image while the kernel still has it mounted, with transactions committed and not
/// checkpointed; the copy must say so.
fn crash_copy(
    scratch: &Scratch,
    mkfs_args: &[&str],
    size_mib: u64,
    options: &str,
    enough: impl Fn(usize, &Path) -> bool,
) -> PathBuf {
    const MAX_ROUNDS: usize = 60;
    let live = scratch.path("live.img");
    mkfs(&live, size_mib, mkfs_args);
    let copy = scratch.path("crashed.img");
    {
        let mount = Mounted::new(&live, &scratch.path("mnt"), options);
        for round in 0.. {
            assert!(
                round < MAX_ROUNDS,
                "no wanted journal after {MAX_ROUNDS} rounds"
            );
            write_round(&mount.0, round);
            if enough(round, &live) {
                break;
            }
        }
        std::fs::copy(&live, &copy).unwrap();
    }
    let header = run("dumpe2fs", &["-h", copy.to_str().unwrap()]);
    assert!(header.contains("needs_recovery"), "{header}");
    let start = header
        .lines()
        .find(|l| l.starts_with("Journal start:"))
        .unwrap_or_else(|| panic!("no journal start in:\n{header}"));
    assert!(
        !start.trim_end().ends_with(" 0"),
        "{start}: nothing to recover"
    );
    copy
}

/// Recovers one copy with jext and one with the kernel and compares them; returns the
/// skipped regions that differed (they are printed too).
fn compare_with_kernel(
    scratch: &Scratch,
    crashed: &Path,
    expect: Csum,
    async_commit: bool,
) -> Vec<String> {
    let (ours, theirs) = (scratch.path("jext.img"), scratch.path("kernel.img"));
    std::fs::copy(crashed, &ours).unwrap();
    std::fs::copy(crashed, &theirs).unwrap();
    let fs = Ext4::read(&ours);
    let found = scan(&open(&ours, true), &fs.journal).unwrap();
    assert_eq!(LogFormat::from_superblock(&found.superblock).csum, expect);
    assert_eq!(
        found.superblock.has_incompat(INCOMPAT_ASYNC_COMMIT),
        async_commit
    );
    assert!(!found.transactions.is_empty(), "{}", found.end_reason);
    check_scan_against_kernel_tools(&ours, &fs, &found);

    let report = recover(&open(&ours, false), std::slice::from_ref(&fs.journal)).unwrap();
    assert_eq!(report.transactions, found.transactions.len());
    assert!(report.blocks_replayed > 0 && !report.was_clean);
    drop(Mounted::new(&theirs, &scratch.path("mnt-kernel"), "rw"));

    let differing = differing_blocks(&ours, &theirs, fs.block_size as usize);
    let mut regions: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut unexplained = Vec::new();
    for block in differing {
        match fs.skipped(block) {
            Some(region) => regions.entry(region).or_default().push(block),
            None => unexplained.push(block),
        }
    }
    assert!(
        unexplained.is_empty(),
        "jext's and the kernel's recovery differ in {} blocks, first {:?}",
        unexplained.len(),
        &unexplained[..unexplained.len().min(20)]
    );
    let regions: Vec<String> = regions
        .into_iter()
        .map(|(what, blocks)| format!("{what}: {} blocks from {}", blocks.len(), blocks[0]))
        .collect();
    eprintln!(
        "{}: {} transactions, {} blocks replayed; skipped regions that differ: {regions:?}",
        crashed.display(),
        report.transactions,
        report.blocks_replayed
    );
    regions
}

fn differing_blocks(a: &Path, b: &Path, block_size: usize) -> Vec<u64> {
    const CHUNK_BLOCKS: usize = 256;
    let (mut fa, mut fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let (mut ba, mut bb) = (
        vec![0u8; CHUNK_BLOCKS * block_size],
        vec![0u8; CHUNK_BLOCKS * block_size],
    );
    let mut differing = Vec::new();
    let mut first_block = 0u64;
    loop {
        let n = fa.read(&mut ba).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        if n == 0 {
            return differing;
        }
        for (i, (x, y)) in ba[..n]
            .chunks(block_size)
            .zip(bb[..n].chunks(block_size))
            .enumerate()
        {
            if x != y {
                differing.push(first_block + i as u64);
            }
        }
        first_block += (n / block_size) as u64;
    }
}

fn three_rounds(round: usize, _: &Path) -> bool {
    round == 2
}

/// The live log runs past the end of the journal back to its start, and revokes blocks.
fn wraps_with_revokes(found: &ScanReport) -> bool {
    let positions: Vec<u32> = found
        .transactions
        .iter()
        .flat_map(|t| [t.first_block, t.commit_block])
        .collect();
    let wraps = positions.windows(2).any(|w| w[1] < w[0]);
    wraps && found.transactions.iter().any(|t| !t.revokes.is_empty())
}

#[test]
fn a_kernel_journal_with_1k_blocks_replays_as_the_kernel_replays_it() {
    let scratch = Scratch::new("1k");
    let crashed = crash_copy(&scratch, &["-b", "1024"], 64, "commit=600", three_rounds);
    compare_with_kernel(&scratch, &crashed, Csum::V3, false);
}

#[test]
fn a_kernel_journal_with_4k_blocks_replays_as_the_kernel_replays_it() {
    let scratch = Scratch::new("4k");
    let crashed = crash_copy(&scratch, &["-b", "4096"], 256, "commit=600", three_rounds);
    compare_with_kernel(&scratch, &crashed, Csum::V3, false);
}

#[test]
fn a_kernel_journal_that_wraps_with_revokes_replays_as_the_kernel_replays_it() {
    let scratch = Scratch::new("wrap");
    // The smallest journal (1024 blocks) wraps after a few rounds.
    let args = ["-b", "1024", "-J", "size=1"];
    let crashed = crash_copy(&scratch, &args, 64, "commit=600", |_, live| {
        let fs = Ext4::read(live);
        scan(&open(live, true), &fs.journal).is_ok_and(|found| wraps_with_revokes(&found))
    });
    let fs = Ext4::read(&crashed);
    let found = scan(&open(&crashed, true), &fs.journal).unwrap();
    assert!(wraps_with_revokes(&found), "{found:?}");
    compare_with_kernel(&scratch, &crashed, Csum::V3, false);
}

#[test]
fn kernel_journals_with_v1_checksums_and_async_commit_replay_as_the_kernel_replays_them() {
    let cases = [
        (
            "v1",
            "^metadata_csum",
            "commit=600,journal_checksum",
            Csum::V1,
            false,
        ),
        (
            "v1-async",
            "^metadata_csum",
            "commit=600,data=writeback,journal_async_commit",
            Csum::V1,
            true,
        ),
        (
            "v3-async",
            "metadata_csum",
            "commit=600,data=writeback,journal_async_commit",
            Csum::V3,
            true,
        ),
    ];
    for (name, feature, options, csum, async_commit) in cases {
        let scratch = Scratch::new(name);
        let args = ["-b", "1024", "-O", feature];
        let crashed = crash_copy(&scratch, &args, 64, options, three_rounds);
        compare_with_kernel(&scratch, &crashed, csum, async_commit);
    }
}

#[test]
fn kernel_fast_commits_are_read_back_for_the_file_system() {
    let scratch = Scratch::new("fc");
    let live = scratch.path("live.img");
    mkfs(&live, 64, &["-b", "1024", "-O", "fast_commit"]);
    let copy = scratch.path("crashed.img");
    {
        let mount = Mounted::new(&live, &scratch.path("mnt"), "commit=600");
        let file = mount.0.join("file");
        std::fs::write(&file, b"full commit").unwrap();
        run("sync", &[]);
        // An append and fsync: the kernel logs it as a fast commit.
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&file)
            .unwrap();
        f.write_all(&[7u8; 3000]).unwrap();
        f.sync_all().unwrap();
        std::fs::copy(&live, &copy).unwrap();
    }
    let dump = run("debugfs", &["-R", "logdump", copy.to_str().unwrap()]);
    assert!(
        dump.contains("tag HEAD"),
        "a fast commit is pending:\n{dump}"
    );
    let fs = Ext4::read(&copy);
    let found = scan(&open(&copy, true), &fs.journal).unwrap();
    let sb = &found.superblock;
    assert!(sb.has_incompat(INCOMPAT_FAST_COMMIT));
    assert!(dump.contains(&format!("tag HEAD, features 0x0, tid {}", found.end_tid)));
    let report = recover(&open(&copy, false), std::slice::from_ref(&fs.journal)).unwrap();
    let fc = &report.fast_commits;
    assert!(fc.fast_commits >= 1, "{fc:?}");
    // The appended file (inode 12, the first after lost+found): its inode, and a range
    // that maps its last block.
    let inode = fc.records.iter().find_map(|r| match r {
        FcRecord::Inode { ino: 12, raw } => Some(raw.clone()),
        _ => None,
    });
    let raw = inode.unwrap_or_else(|| panic!("no INODE record of inode 12: {fc:?}"));
    let size = u32::from_le_bytes(raw[4..8].try_into().unwrap());
    assert_eq!(size, 11 + 3000, "i_size_lo of the logged inode");
    let last_block = (11 + 3000 - 1) / 1024;
    assert!(
        fc.records.iter().any(
            |r| matches!(r, FcRecord::AddRange { ino: 12, lblk, len, .. }
            if (*lblk..*lblk + *len).contains(&last_block))
        ),
        "an ADD_RANGE maps block {last_block}: {fc:?}"
    );
    // Until the file system applies them, the journal points at an empty log of the tid
    // the fast commits carry, so they stay valid (Linux reads them the same way).
    let after = scan(&open(&copy, true), &fs.journal).unwrap();
    assert!(!after.superblock.is_clean());
    assert_eq!(after.superblock.sequence(), found.end_tid);
    assert!(after.transactions.is_empty());
    let again = recover(&open(&copy, false), std::slice::from_ref(&fs.journal)).unwrap();
    assert_eq!(again.fast_commits, report.fast_commits);
}
