//! Checking a file system, as e2fsck's five passes do, without changing it.
//!
//! The image is opened read-only over a copy-on-write overlay, so a journal that needs
//! recovery is replayed into memory and the recovered state is what gets checked (the
//! image itself is never written, as with `e2fsck -n`). Then:
//!
//! 1. every inode in use: its record and checksum, its extent tree (or its special map),
//!    its blocks (none outside the file system, none claimed twice), `i_blocks`, its
//!    xattrs and xattr block;
//! 2. every directory: blocks, checksums, entries naming inodes in use with the right type;
//! 3. connectivity: every directory reachable from the root once, with the right "..";
//! 4. reference counts: link counts equal the names found;
//! 5. group summaries: bitmaps against what is in use, free counts, bitmap checksums.
//!
//! Every problem is reported with what and where; nothing is repaired.

use crate::blockmap;
use crate::dir;
use crate::error::{FsError, FsResult};
use crate::format::bitmap::{self, BitmapKind};
use crate::format::group_desc::{GroupCsum, GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use crate::format::inode::{flags, Inode};
use crate::format::superblock::features;
use crate::format::xattr;
use crate::format::Location;
use crate::groups::read_desc;
use crate::inodes::read_record;
use crate::state::FsInner;
use crate::types::{FileKind, ROOT_INO};
use crate::{Fs, MountOptions};
use jext_device::{BlockDevice, OverlayDevice};
use std::collections::HashMap;
use std::sync::Arc;

const RESIZE_INO: u32 = 7;
const DIND_SLOT: usize = 13;
/// Inode-table blocks pass 1 reads at once (1 MiB of 4 KiB blocks): few, large,
/// sequential reads, as e2fsck's inode scan makes.
const TABLE_RUN_BLOCKS: u32 = 256;

/// What the check found.
#[derive(Clone, Debug, Default)]
pub struct FsckReport {
    /// Every problem, with what and where. Empty means clean.
    pub problems: Vec<String>,
    /// Things worth knowing that are not errors (journal replayed, orphans pending).
    pub notes: Vec<String>,
    pub inodes_in_use: u64,
    pub directories: u64,
    pub blocks_in_use: u64,
    pub blocks_total: u64,
    pub inodes_total: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }

    /// The exit status `e2fsck -n` would give: 0 clean, 4 errors left uncorrected.
    pub fn exit_code(&self) -> i32 {
        if self.is_clean() {
            0
        } else {
            4
        }
    }
}

/// Checks the file system on `device` without writing to it. Fails only when the device
/// cannot be read; a file system too damaged to open is reported as a problem.
pub fn fsck(device: Arc<dyn BlockDevice>) -> FsResult<FsckReport> {
    let overlay = Arc::new(OverlayDevice::new(device));
    let options = MountOptions {
        read_only: true,
        ..MountOptions::default()
    };
    let mut report = FsckReport::default();
    let (fs, mount) = match Fs::open_with_report(overlay, options) {
        Ok(opened) => opened,
        Err(FsError::Device(e)) => return Err(FsError::Device(e)),
        Err(other) => {
            report
                .problems
                .push(format!("cannot open the file system: {other}"));
            return Ok(report);
        }
    };
    if !mount.recovery.was_clean {
        report.notes.push(format!(
            "the journal held {} committed transactions; they were replayed in memory for the check",
            mount.recovery.transactions
        ));
    }
    fs.with_exclusive(|op| Checker::new(op.fs, &mut report).run())??;
    Ok(report)
}

/// One inode's facts, gathered in pass 1.
struct InodeFacts {
    kind: Option<FileKind>,
    links: u16,
}

struct Checker<'a> {
    fs: &'a FsInner,
    report: &'a mut FsckReport,
    /// Blocks in use, one bit each.
    claimed: Vec<u64>,
    inodes: HashMap<u32, InodeFacts>,
    /// Per group: inodes in use and directories among them, counted in pass 1.
    group_counts: Vec<(u32, u32)>,
    xattr_users: HashMap<u64, u32>,
    xattr_refcounts: HashMap<u64, u32>,
    /// Every group's descriptor, read once (`None`: unreadable, reported by group).
    descs: Vec<Option<GroupDesc>>,
    /// Every group's metadata block ranges `[start, end)`, computed once from `descs`.
    metadata: Vec<Vec<(u64, u64)>>,
}

impl<'a> Checker<'a> {
    fn new(fs: &'a FsInner, report: &'a mut FsckReport) -> Checker<'a> {
        let blocks = fs.geo.blocks_count;
        Checker {
            fs,
            report,
            claimed: vec![0; blocks.div_ceil(64) as usize],
            inodes: HashMap::new(),
            group_counts: vec![(0, 0); fs.geo.group_count as usize],
            xattr_users: HashMap::new(),
            xattr_refcounts: HashMap::new(),
            descs: Vec::new(),
            metadata: Vec::new(),
        }
    }

    fn problem(&mut self, text: String) {
        // A badly damaged image could report millions; the first thousand say enough.
        if self.report.problems.len() < 1000 {
            self.report.problems.push(text);
        }
    }

    fn run(mut self) -> FsResult<()> {
        self.report.blocks_total = self.fs.geo.blocks_count;
        self.report.inodes_total = u64::from(self.fs.geo.inodes_count);
        let orphans = self.fs.orphans.lock().len();
        if orphans > 0 {
            self.report.notes.push(format!(
                "{orphans} orphan inodes wait to be finished at the next read-write mount"
            ));
        }
        self.read_descriptors();
        self.pass0_group_flags();
        self.claim_fs_metadata();
        self.pass1_inodes()?;
        let names = self.pass2_directories();
        self.pass3_connectivity(&names);
        self.pass4_counts(&names);
        self.pass5_groups()?;
        self.report.inodes_in_use = self.inodes.len() as u64;
        self.report.directories = self
            .inodes
            .values()
            .filter(|f| f.kind == Some(FileKind::Directory))
            .count() as u64;
        self.report.blocks_in_use = self.claimed.iter().map(|w| u64::from(w.count_ones())).sum();
        Ok(())
    }

    fn is_claimed(&self, block: u64) -> bool {
        self.claimed[(block / 64) as usize] & (1 << (block % 64)) != 0
    }

    /// Marks `[start, start+len)` used by `owner`; reports blocks outside the file system
    /// or already in use.
    fn claim(&mut self, start: u64, len: u64, owner: &str) {
        let geo = &self.fs.geo;
        if start < geo.first_data_block || start.saturating_add(len) > geo.blocks_count {
            self.problem(format!(
                "{owner}: blocks {start}..{} are outside the file system",
                start.saturating_add(len)
            ));
            return;
        }
        let mut twice = Vec::new();
        for b in start..start + len {
            if self.is_claimed(b) {
                twice.push(b);
            }
            self.claimed[(b / 64) as usize] |= 1 << (b % 64);
        }
        if let Some(&first) = twice.first() {
            self.problem(format!(
                "{owner}: {} block(s) already in use elsewhere, first {first}",
                twice.len()
            ));
        }
    }

    /// Reads every group descriptor once; passes below look them up by group.
    fn read_descriptors(&mut self) {
        let count = self.fs.geo.group_count;
        let mut descs = Vec::with_capacity(count as usize);
        for g in 0..count {
            match read_desc(self.fs, g) {
                Ok(d) => descs.push(Some(d)),
                Err(e) => {
                    self.problem(format!("group {g}: {e}"));
                    descs.push(None);
                }
            }
        }
        self.descs = descs;
    }

    /// The uninitialised-group flags' own consistency, as e2fsck's pass 0 checks them:
    /// flags without a group checksum feature (PR_0_GDT_UNINIT, a note: e2fsck -n exits 0
    /// on it alone), the last group's block
    /// bitmap marked uninitialised (PR_0_BB_UNINIT_LAST), and an unused inode count larger
    /// than the group's free inodes or inodes (PR_0_GDT_ITABLE_UNUSED, a note: e2fsck -n
    /// exits 0 on it alone).
    fn pass0_group_flags(&mut self) {
        let geo = self.fs.geo.clone();
        let has_csum = !matches!(self.fs.group_csum, GroupCsum::None);
        for g in 0..geo.group_count {
            let Some(desc) = self.descs[g as usize] else {
                continue;
            };
            let uninit = desc.has_flag(FLAG_BLOCK_UNINIT) || desc.has_flag(FLAG_INODE_UNINIT);
            if !has_csum && (uninit || desc.itable_unused != 0) {
                // e2fsck -n reports this and exits 0: without a group checksum the flags
                // are ignored (by libext2fs and by `uninit` below), so nothing is lost.
                self.report.notes.push(format!(
                    "group {g}: marked uninitialized (flags {:#x}, itable_unused {}) \
                     without a group checksum feature",
                    desc.flags, desc.itable_unused
                ));
            }
            if g + 1 == geo.group_count && self.uninit(&desc, FLAG_BLOCK_UNINIT) {
                self.problem(format!(
                    "group {g}: the last group's block bitmap is marked uninitialized"
                ));
            }
            if has_csum
                && (desc.itable_unused > desc.free_inodes
                    || desc.itable_unused > geo.inodes_per_group)
            {
                // e2fsck -n reports this and still exits 0: its scan reads none of the
                // group's records, as `trusted_inodes` does, and later passes judge that.
                self.report.notes.push(format!(
                    "group {g}: itable_unused {} is more than its free inodes ({}) or \
                     inodes per group ({})",
                    desc.itable_unused, desc.free_inodes, geo.inodes_per_group
                ));
            }
        }
    }

    /// Whether `desc` carries `flag` as libext2fs reads it: the uninit flags count only
    /// with a group checksum feature.
    fn uninit(&self, desc: &GroupDesc, flag: u16) -> bool {
        !matches!(self.fs.group_csum, GroupCsum::None) && desc.has_flag(flag)
    }

    /// The inodes of group `g` whose records can be trusted: none when INODE_UNINIT, else
    /// all but the unused tail (with group checksums; e2fsck skips the same).
    fn trusted_inodes(&self, desc: &GroupDesc) -> u32 {
        let ipg = self.fs.geo.inodes_per_group;
        if matches!(self.fs.group_csum, GroupCsum::None) {
            ipg
        } else if desc.has_flag(FLAG_INODE_UNINIT) {
            0
        } else {
            ipg.saturating_sub(desc.itable_unused)
        }
    }

    /// Claims every group's superblock area, bitmaps and inode table, from one pass over
    /// the descriptors (a range crossing groups is split between them).
    fn claim_fs_metadata(&mut self) {
        let geo = self.fs.geo.clone();
        let mut metadata: Vec<Vec<(u64, u64)>> = (0..geo.group_count)
            .map(|g| {
                let first = geo.group_first_block(g);
                vec![(first, first + u64::from(geo.superblock_area_blocks(g)))]
            })
            .collect();
        let table_blocks = u64::from(geo.inode_table_blocks());
        let mut outside = Vec::new();
        for desc in self.descs.iter().flatten() {
            for (start, len) in [
                (desc.block_bitmap, 1),
                (desc.inode_bitmap, 1),
                (desc.inode_table, table_blocks),
            ] {
                let end = start.saturating_add(len);
                if start < geo.first_data_block || end > geo.blocks_count {
                    // Claimed below, where it is reported as outside the file system.
                    outside.push((start, len));
                    continue;
                }
                let mut at = start;
                while at < end {
                    let g = geo.group_of_block(at);
                    let group_end = geo.group_first_block(g) + u64::from(geo.blocks_in_group(g));
                    let piece_end = end.min(group_end);
                    metadata[g as usize].push((at, piece_end));
                    at = piece_end;
                }
            }
        }
        for (start, len) in outside {
            self.claim(start, len, "group metadata");
        }
        for (g, ranges) in metadata.iter().enumerate() {
            for &(s, e) in ranges {
                self.claim(s, e - s, &format!("group {g} metadata"));
            }
        }
        self.metadata = metadata;
    }

    /// Pass 1 reads each group's trusted inode records in large sequential runs, and
    /// only the runs that hold an inode the bitmap says is in use.
    fn pass1_inodes(&mut self) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let inode_size = geo.inode_size;
        let per_block = geo.block_size / inode_size;
        for g in 0..geo.group_count {
            let Some(desc) = self.descs[g as usize] else {
                continue;
            };
            if self.uninit(&desc, FLAG_INODE_UNINIT) {
                continue;
            }
            let bitmap_bytes = match self.fs.cache.get(desc.inode_bitmap) {
                Ok(buf) => buf.bytes().to_vec(),
                Err(e) => {
                    self.problem(format!(
                        "group {g}: cannot read inode bitmap block {}: {e}",
                        desc.inode_bitmap
                    ));
                    continue;
                }
            };
            let trusted = self.trusted_inodes(&desc);
            for i in (trusted..geo.inodes_per_group).filter(|&i| bitmap::test_bit(&bitmap_bytes, i))
            {
                let ino = g * geo.inodes_per_group + i + 1;
                self.problem(format!(
                    "inode {ino}: in use but in group {g}'s unused inode-table tail \
                     (itable_unused {})",
                    desc.itable_unused
                ));
            }
            let run_inodes = TABLE_RUN_BLOCKS * per_block;
            let mut run_start = 0;
            while run_start < trusted {
                let run_end = (run_start + run_inodes).min(trusted);
                let used: Vec<u32> = (run_start..run_end)
                    .filter(|&i| bitmap::test_bit(&bitmap_bytes, i))
                    .collect();
                if !used.is_empty() {
                    let first_block = desc.inode_table + u64::from(run_start / per_block);
                    let blocks = (run_end - run_start).div_ceil(per_block);
                    let table = match self.read_run(first_block, blocks) {
                        Ok(table) => table,
                        Err(e) => {
                            self.problem(format!(
                                "group {g}: cannot read inode table blocks {first_block}..{}: {e}",
                                first_block + u64::from(blocks)
                            ));
                            run_start = run_end;
                            continue;
                        }
                    };
                    for i in used {
                        let ino = g * geo.inodes_per_group + i + 1;
                        let at = ((i - run_start) * inode_size) as usize;
                        let bytes = &table[at..at + inode_size as usize];
                        match Inode::decode(bytes, ino, self.fs.csum_seed) {
                            Ok(raw) => self.check_inode(ino, &raw),
                            Err(e) => self.problem(format!("inode {ino}: {e}")),
                        }
                    }
                }
                run_start = run_end;
            }
        }
        for (&block, &users) in &self.xattr_users.clone() {
            let refcount = self.xattr_refcounts.get(&block).copied().unwrap_or(0);
            if refcount != users {
                self.problem(format!(
                    "xattr block {block}: refcount {refcount}, but {users} inodes use it"
                ));
            }
        }
        Ok(())
    }

    /// `blocks` blocks from `first` in one device read; a block the cache or the journal
    /// holds newer bytes of is taken from there, as a cached read would.
    fn read_run(&self, first: u64, blocks: u32) -> FsResult<Vec<u8>> {
        let bs = self.fs.geo.block_size as usize;
        if first.saturating_add(u64::from(blocks)) > self.fs.geo.blocks_count {
            return Err(FsError::Inconsistent(format!(
                "blocks {first}..{} run past the end of the file system ({} blocks)",
                first.saturating_add(u64::from(blocks)),
                self.fs.geo.blocks_count
            )));
        }
        let mut bytes = vec![0u8; blocks as usize * bs];
        self.fs.io.read(first * bs as u64, &mut bytes)?;
        for (i, chunk) in bytes.chunks_mut(bs).enumerate() {
            let block = first + i as u64;
            if let Some(buf) = self.fs.cache.peek(block) {
                chunk.copy_from_slice(&buf.bytes());
            } else if let Some(copy) = self.fs.journal.committed_copy(block) {
                chunk.copy_from_slice(&copy);
            }
        }
        Ok(bytes)
    }

    /// Why an entry naming `ino` is wrong when its group says the inode was never used:
    /// e2fsck's PR_2_INOREF_BG_INO_UNINIT and PR_2_INOREF_IN_UNUSED.
    fn never_used(&self, ino: u32) -> Option<String> {
        if ino == 0 || ino > self.fs.geo.inodes_count {
            return None;
        }
        let (g, index) = self.fs.geo.inode_position(ino);
        let desc = self.descs.get(g as usize)?.as_ref()?;
        if matches!(self.fs.group_csum, GroupCsum::None) {
            None
        } else if desc.has_flag(FLAG_INODE_UNINIT) {
            Some(format!(
                "inode {ino} in group {g}, whose inodes are marked uninitialized (INODE_UNINIT)"
            ))
        } else if index >= self.trusted_inodes(desc) {
            Some(format!(
                "inode {ino} in group {g}'s unused inode-table tail (itable_unused {})",
                desc.itable_unused
            ))
        } else {
            None
        }
    }

    fn check_inode(&mut self, ino: u32, raw: &Inode) {
        let kind = FileKind::from_mode(u32::from(raw.mode()));
        let first_ino = self.fs.geo.first_ino;
        let special = ino < first_ino && ino != ROOT_INO;
        let orphan = self.fs.orphans.lock().contains(&ino);
        if !special {
            if kind.is_none() {
                self.problem(format!(
                    "inode {ino}: mode {:o} names no file type",
                    raw.mode()
                ));
            }
            if raw.links_count() == 0 && !orphan {
                self.problem(format!(
                    "inode {ino}: in use with no links and not on the orphan list"
                ));
            }
            if raw.dtime() != 0 && !orphan {
                self.problem(format!("inode {ino}: in use but has a deletion time"));
            }
        }
        let owner = format!("inode {ino}");
        let mut blocks = 0u64;
        let bs = u64::from(self.fs.geo.block_size);
        if raw.flags() & flags::EXTENTS != 0 {
            match blockmap::extents_and_index(self.fs, ino, raw) {
                Ok((extents, index)) => {
                    for e in &extents {
                        self.claim(e.start, u64::from(e.len), &owner);
                        blocks += u64::from(e.len);
                    }
                    for b in index {
                        self.claim(b, 1, &format!("{owner} (extent index)"));
                        blocks += 1;
                    }
                    self.check_extent_bounds(ino, raw, kind, &extents);
                }
                Err(e) => self.problem(format!("{owner}: {e}")),
            }
        } else if ino == RESIZE_INO {
            blocks += self.resize_inode_blocks(raw);
        } else {
            let fast_symlink = kind == Some(FileKind::Symlink) && raw.size() < 60;
            let no_data = matches!(
                kind,
                Some(
                    FileKind::CharDevice
                        | FileKind::BlockDevice
                        | FileKind::Fifo
                        | FileKind::Socket
                )
            );
            if !(fast_symlink || no_data || special || raw.blocks_raw() == 0) {
                self.problem(format!(
                    "{owner}: maps blocks without extents (not supported)"
                ));
            }
        }
        if let Err(e) = xattr::decode_inode_area(raw.xattr_area(), ino) {
            self.problem(format!("{owner}: {e}"));
        }
        let acl = raw.file_acl();
        if acl != 0 {
            blocks += 1;
            self.check_xattr_block(ino, acl);
        }
        let counted = raw.blocks_512(self.fs.geo.block_size) / (bs / 512);
        if counted != blocks {
            self.problem(format!(
                "{owner}: i_blocks says {counted} blocks, counted {blocks}"
            ));
        }
        let (group, _) = self.fs.geo.inode_position(ino);
        let counts = &mut self.group_counts[group as usize];
        counts.0 += 1;
        counts.1 += u32::from(kind == Some(FileKind::Directory));
        self.inodes.insert(
            ino,
            InodeFacts {
                kind,
                links: raw.links_count(),
            },
        );
    }

    fn check_extent_bounds(
        &mut self,
        ino: u32,
        raw: &Inode,
        kind: Option<FileKind>,
        extents: &[crate::format::extent::Extent],
    ) {
        let bs = u64::from(self.fs.geo.block_size);
        let size_blocks = raw.size().div_ceil(bs);
        match kind {
            Some(FileKind::Directory) => {
                if !raw.size().is_multiple_of(bs) {
                    self.problem(format!(
                        "directory {ino}: size {} is not whole blocks",
                        raw.size()
                    ));
                }
                let mapped: u64 = extents
                    .iter()
                    .filter(|e| u64::from(e.logical) < size_blocks)
                    .map(|e| u64::from(e.len))
                    .sum();
                if mapped != size_blocks || extents.iter().any(|e| e.end() > size_blocks) {
                    self.problem(format!(
                        "directory {ino}: blocks do not cover its size {} exactly",
                        raw.size()
                    ));
                }
            }
            Some(FileKind::Regular) | Some(FileKind::Symlink) => {
                if let Some(e) = extents
                    .iter()
                    .find(|e| !e.unwritten && e.end() > size_blocks)
                {
                    self.problem(format!(
                        "inode {ino}: written blocks past its size {} (extent at logical {} of {} blocks)",
                        raw.size(),
                        e.logical,
                        e.len
                    ));
                }
            }
            _ => {}
        }
    }

    /// Blocks the resize inode owns: its double-indirect block, and each reserved GDT
    /// block with its backups (those are counted, already claimed as group metadata).
    fn resize_inode_blocks(&mut self, raw: &Inode) -> u64 {
        let dind = u64::from(u32::from_le_bytes(
            raw.i_block()[DIND_SLOT * 4..DIND_SLOT * 4 + 4]
                .try_into()
                .expect("4 bytes"),
        ));
        if dind == 0 {
            return 0;
        }
        self.claim(dind, 1, "the resize inode");
        let Ok(buf) = self.fs.cache.get(dind) else {
            self.problem(format!("the resize inode: cannot read block {dind}"));
            return 1;
        };
        let mut blocks = 1;
        for primary in buf
            .bytes()
            .chunks(4)
            .map(|w| u64::from(u32::from_le_bytes(w.try_into().expect("4 bytes"))))
            .filter(|&b| b != 0)
        {
            blocks += 1;
            if let Ok(list) = self.fs.cache.get(primary) {
                blocks += list
                    .bytes()
                    .chunks(4)
                    .filter(|w| w.iter().any(|&b| b != 0))
                    .count() as u64;
            }
        }
        blocks
    }

    fn check_xattr_block(&mut self, ino: u32, block: u64) {
        let users = self.xattr_users.entry(block).or_insert(0);
        *users += 1;
        if *users > 1 {
            return;
        }
        self.claim(block, 1, &format!("inode {ino} (xattr block)"));
        match self.fs.cache.get(block).map(|b| b.bytes()) {
            Ok(bytes) => match xattr::decode_block(&bytes, block, self.fs.csum_seed) {
                Ok((header, _)) => {
                    self.xattr_refcounts.insert(block, header.refcount);
                }
                Err(e) => self.problem(format!("inode {ino}: {e}")),
            },
            Err(e) => self.problem(format!("inode {ino}: xattr block {block}: {e}")),
        }
    }

    /// Every directory's entries: (directory, name, inode).
    fn pass2_directories(&mut self) -> Vec<(u32, Vec<u8>, u32)> {
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, f)| f.kind == Some(FileKind::Directory))
            .map(|(i, _)| *i)
            .collect();
        let mut dirs = dirs;
        dirs.sort_unstable();
        let mut names = Vec::new();
        for d in dirs {
            let raw = match read_record(self.fs, d) {
                Ok(raw) => raw,
                Err(_) => continue,
            };
            let listed = match dir::list(self.fs, d, &raw, 0) {
                Ok(l) => l,
                Err(e) => {
                    self.problem(format!("directory {d}: {e}"));
                    continue;
                }
            };
            let mut dot = false;
            for l in listed {
                let shown = || String::from_utf8_lossy(&l.name).into_owned();
                if l.name == b"." {
                    dot = true;
                    if l.ino != d {
                        self.problem(format!("directory {d}: \".\" names inode {}", l.ino));
                    }
                    continue;
                }
                match self.inodes.get(&l.ino) {
                    None => match self.never_used(l.ino) {
                        Some(why) => {
                            self.problem(format!("directory {d}: entry {:?} names {why}", shown()))
                        }
                        None => self.problem(format!(
                            "directory {d}: entry {:?} names inode {}, which is not in use",
                            shown(),
                            l.ino
                        )),
                    },
                    Some(f) => {
                        let expected = f.kind.map(|k| k.dirent_type());
                        if self.fs.filetype && l.file_type != 0 && expected != Some(l.file_type) {
                            self.problem(format!(
                                "directory {d}: entry {:?} has type {} but inode {} is {:?}",
                                shown(),
                                l.file_type,
                                l.ino,
                                f.kind
                            ));
                        }
                    }
                }
                names.push((d, l.name, l.ino));
            }
            if !dot {
                self.problem(format!("directory {d}: no \".\" entry"));
            }
        }
        names
    }

    fn pass3_connectivity(&mut self, names: &[(u32, Vec<u8>, u32)]) {
        let is_dir = |c: &Checker, ino: u32| {
            c.inodes
                .get(&ino)
                .is_some_and(|f| f.kind == Some(FileKind::Directory))
        };
        let mut parents: HashMap<u32, Vec<u32>> = HashMap::new();
        let mut dotdot: HashMap<u32, u32> = HashMap::new();
        for (d, name, ino) in names {
            if name == b".." {
                dotdot.insert(*d, *ino);
            } else if is_dir(self, *ino) {
                parents.entry(*ino).or_default().push(*d);
            }
        }
        let dirs: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(_, f)| f.kind == Some(FileKind::Directory))
            .map(|(i, _)| *i)
            .collect();
        let mut dirs = dirs;
        dirs.sort_unstable();
        for d in dirs {
            let expected_parent = if d == ROOT_INO {
                if parents.contains_key(&d) {
                    self.problem("the root directory has a name in another directory".into());
                }
                ROOT_INO
            } else {
                match parents.get(&d).map(Vec::as_slice) {
                    None | Some([]) => {
                        if !self.fs.orphans.lock().contains(&d) {
                            self.problem(format!("directory {d}: not reachable from the root"));
                        }
                        continue;
                    }
                    Some([p]) => *p,
                    Some(many) => {
                        self.problem(format!(
                            "directory {d}: has {} names (directories may have one)",
                            many.len()
                        ));
                        many[0]
                    }
                }
            };
            match dotdot.get(&d) {
                Some(&p) if p == expected_parent => {}
                Some(&p) => self.problem(format!(
                    "directory {d}: \"..\" names {p}, its parent is {expected_parent}"
                )),
                None => self.problem(format!("directory {d}: no \"..\" entry")),
            }
        }
        // A directory with a parent can still be cut off from the root (a cycle of
        // directories naming each other), so walk down from the root.
        let mut reachable = std::collections::HashSet::from([ROOT_INO]);
        let mut stack = vec![ROOT_INO];
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for (d, name, ino) in names {
            if name != b".." && is_dir(self, *ino) {
                children.entry(*d).or_default().push(*ino);
            }
        }
        while let Some(d) = stack.pop() {
            for &c in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
                if reachable.insert(c) {
                    stack.push(c);
                }
            }
        }
        let unreachable: Vec<u32> = self
            .inodes
            .iter()
            .filter(|(i, f)| {
                f.kind == Some(FileKind::Directory)
                    && !reachable.contains(i)
                    && !self.fs.orphans.lock().contains(i)
            })
            .map(|(i, _)| *i)
            .collect();
        let mut unreachable = unreachable;
        unreachable.sort_unstable();
        for d in unreachable {
            if parents.contains_key(&d) {
                self.problem(format!(
                    "directory {d}: in a directory cycle cut off from the root"
                ));
            }
        }
    }

    fn pass4_counts(&mut self, names: &[(u32, Vec<u8>, u32)]) {
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut subdirs: HashMap<u32, u32> = HashMap::new();
        for (d, name, ino) in names {
            if name == b".." {
                continue;
            }
            *refs.entry(*ino).or_default() += 1;
            if self
                .inodes
                .get(ino)
                .is_some_and(|f| f.kind == Some(FileKind::Directory))
            {
                *subdirs.entry(*d).or_default() += 1;
            }
        }
        let dir_nlink = self
            .fs
            .sb
            .lock()
            .has_ro_compat(features::RO_COMPAT_DIR_NLINK);
        let first_ino = self.fs.geo.first_ino;
        let checks: Vec<(u32, Option<FileKind>, u16)> = self
            .inodes
            .iter()
            .map(|(i, f)| (*i, f.kind, f.links))
            .collect();
        let mut checks = checks;
        checks.sort_unstable_by_key(|c| c.0);
        for (ino, kind, links) in checks {
            if ino < first_ino && ino != ROOT_INO {
                continue;
            }
            let expected = if kind == Some(FileKind::Directory) {
                2 + subdirs.get(&ino).copied().unwrap_or(0)
            } else {
                refs.get(&ino).copied().unwrap_or(0)
            };
            let many_ok =
                dir_nlink && kind == Some(FileKind::Directory) && links == 1 && expected >= 65_000;
            if u32::from(links) != expected
                && !many_ok
                && !(links == 0 && self.fs.orphans.lock().contains(&ino))
            {
                if expected == 0 || (kind != Some(FileKind::Directory) && !refs.contains_key(&ino))
                {
                    self.problem(format!(
                        "inode {ino}: in use with {links} links but in no directory"
                    ));
                } else {
                    self.problem(format!(
                        "inode {ino}: link count {links}, counted {expected}"
                    ));
                }
            }
        }
    }

    /// The claimed bits of `[first, first + bits)` as a bitmap block's bytes (whole
    /// words at a time when the range starts on a word).
    fn claimed_bitmap(&self, first: u64, bits: u32) -> Vec<u8> {
        let mut out = vec![0u8; (bits as usize).div_ceil(8)];
        if first.is_multiple_of(64) {
            let words = &self.claimed[(first / 64) as usize..];
            for (chunk, word) in out.chunks_mut(8).zip(words) {
                chunk.copy_from_slice(&word.to_le_bytes()[..chunk.len()]);
            }
            if !bits.is_multiple_of(8) {
                let last = out.len() - 1;
                out[last] &= (1u8 << (bits % 8)) - 1;
            }
        } else {
            for i in 0..bits {
                if self.is_claimed(first + u64::from(i)) {
                    bitmap::set_bit(&mut out, i);
                }
            }
        }
        out
    }

    fn pass5_groups(&mut self) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let seed = self.fs.csum_seed;
        for g in 0..geo.group_count {
            let Some(desc) = self.descs[g as usize] else {
                continue;
            };
            let first = geo.group_first_block(g);
            let in_group = geo.blocks_in_group(g);
            let claimed = self.claimed_bitmap(first, in_group);
            let used = bitmap::count_set(&claimed, in_group);
            if desc.free_blocks != in_group - used {
                self.problem(format!(
                    "group {g}: free block count {}, counted {}",
                    desc.free_blocks,
                    in_group - used
                ));
            }
            if self.uninit(&desc, FLAG_BLOCK_UNINIT) {
                let layout: u64 = self.metadata[g as usize].iter().map(|(s, e)| e - s).sum();
                if u64::from(used) != layout {
                    self.problem(format!(
                        "group {g}: marked uninitialized but {} blocks beyond its metadata \
                         are in use",
                        u64::from(used) - layout.min(u64::from(used))
                    ));
                }
            } else {
                let bytes = self.fs.cache.get(desc.block_bitmap)?.bytes();
                let mut wrong = 0u64;
                let mut first_wrong = None;
                for (at, (&on_disk, &counted)) in bytes.iter().zip(&claimed).enumerate() {
                    let mut differ = on_disk ^ counted;
                    if (at + 1) * 8 > in_group as usize {
                        differ &= (1u8 << (in_group % 8)) - 1;
                    }
                    if differ != 0 {
                        wrong += u64::from(differ.count_ones());
                        first_wrong.get_or_insert(
                            first + at as u64 * 8 + u64::from(differ.trailing_zeros()),
                        );
                    }
                }
                if let Some(b) = first_wrong {
                    self.problem(format!(
                        "group {g}: block bitmap differs from blocks in use at {wrong} blocks, \
                         first {b}"
                    ));
                }
                if (in_group..geo.block_size * 8).any(|i| !bitmap::test_bit(&bytes, i)) {
                    self.problem(format!(
                        "group {g}: padding at the end of the block bitmap is not set"
                    ));
                }
                if let Some(s) = seed {
                    let checked = bitmap::verify_checksum(
                        BitmapKind::Block,
                        &bytes,
                        geo.blocks_per_group,
                        s,
                        desc.block_bitmap_csum,
                        geo.desc_size >= 64,
                        Location::Block {
                            block: desc.block_bitmap,
                            ino: None,
                        },
                    );
                    if let Err(e) = checked {
                        self.problem(format!("group {g}: {e}"));
                    }
                }
            }
            self.check_inode_group(g, &desc)?;
        }
        Ok(())
    }

    fn check_inode_group(&mut self, g: u32, desc: &GroupDesc) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let ipg = geo.inodes_per_group;
        let (in_use, dirs) = self.group_counts[g as usize];
        if desc.free_inodes != ipg - in_use {
            self.problem(format!(
                "group {g}: free inode count {}, counted {}",
                desc.free_inodes,
                ipg - in_use
            ));
        }
        if desc.used_dirs != dirs {
            self.problem(format!(
                "group {g}: directory count {}, counted {dirs}",
                desc.used_dirs
            ));
        }
        if self.uninit(desc, FLAG_INODE_UNINIT) {
            if in_use != 0 {
                self.problem(format!(
                    "group {g}: inodes marked uninitialized but {in_use} are in use"
                ));
            }
            return Ok(());
        }
        let bytes = self.fs.cache.get(desc.inode_bitmap)?.bytes();
        if let Some(s) = self.fs.csum_seed {
            let checked = bitmap::verify_checksum(
                BitmapKind::Inode,
                &bytes,
                ipg,
                s,
                desc.inode_bitmap_csum,
                geo.desc_size >= 64,
                Location::Block {
                    block: desc.inode_bitmap,
                    ino: None,
                },
            );
            if let Err(e) = checked {
                self.problem(format!("group {g}: {e}"));
            }
        }
        if (ipg..geo.block_size * 8).any(|i| !bitmap::test_bit(&bytes, i)) {
            self.problem(format!(
                "group {g}: padding at the end of the inode bitmap is not set"
            ));
        }
        Ok(())
    }
}
