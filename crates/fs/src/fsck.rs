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

use crate::alloc::metadata_in_group;
use crate::blockmap;
use crate::dir;
use crate::error::{FsError, FsResult};
use crate::format::bitmap::{self, BitmapKind};
use crate::format::group_desc::{FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use crate::format::inode::{flags, Inode};
use crate::format::superblock::features;
use crate::format::xattr;
use crate::format::Location;
use crate::groups::read_desc;
use crate::inodes::read_record;
use crate::state::{FsInner, FsState};
use crate::types::{FileKind, ROOT_INO};
use crate::{Fs, MountOptions};
use jext_device::{BlockDevice, OverlayDevice};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

const RESIZE_INO: u32 = 7;
const DIND_SLOT: usize = 13;

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
    fs.with_state(|inner, st| Checker::new(inner, st, &mut report).run())??;
    Ok(report)
}

/// One inode's facts, gathered in pass 1.
struct InodeFacts {
    kind: Option<FileKind>,
    links: u16,
}

struct Checker<'a> {
    fs: &'a FsInner,
    st: &'a mut FsState,
    report: &'a mut FsckReport,
    /// Blocks in use, one bit each.
    claimed: Vec<u64>,
    inodes: BTreeMap<u32, InodeFacts>,
    xattr_users: HashMap<u64, u32>,
    xattr_refcounts: HashMap<u64, u32>,
}

impl<'a> Checker<'a> {
    fn new(fs: &'a FsInner, st: &'a mut FsState, report: &'a mut FsckReport) -> Checker<'a> {
        let blocks = fs.geo.blocks_count;
        Checker {
            fs,
            st,
            report,
            claimed: vec![0; blocks.div_ceil(64) as usize],
            inodes: BTreeMap::new(),
            xattr_users: HashMap::new(),
            xattr_refcounts: HashMap::new(),
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
        if !self.st.orphans.is_empty() {
            self.report.notes.push(format!(
                "{} orphan inodes wait to be finished at the next read-write mount",
                self.st.orphans.len()
            ));
        }
        self.claim_fs_metadata()?;
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

    fn claim_fs_metadata(&mut self) -> FsResult<()> {
        for g in 0..self.fs.geo.group_count {
            for (s, e) in metadata_in_group(self.fs, g)? {
                self.claim(s, e - s, &format!("group {g} metadata"));
            }
        }
        Ok(())
    }

    fn pass1_inodes(&mut self) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let csum = self.fs.csum_seed.is_some();
        for g in 0..geo.group_count {
            let desc = match read_desc(self.fs, g) {
                Ok(d) => d,
                Err(e) => {
                    self.problem(format!("group {g}: {e}"));
                    continue;
                }
            };
            let bitmap_bytes = if desc.has_flag(FLAG_INODE_UNINIT) {
                vec![0u8; geo.block_size as usize]
            } else {
                self.fs.cache.get(desc.inode_bitmap)?.bytes().to_vec()
            };
            let trusted = if csum {
                geo.inodes_per_group - desc.itable_unused
            } else {
                geo.inodes_per_group
            };
            for i in 0..geo.inodes_per_group {
                if !bitmap::test_bit(&bitmap_bytes, i) {
                    continue;
                }
                let ino = g * geo.inodes_per_group + i + 1;
                if i >= trusted {
                    self.problem(format!("inode {ino}: in use but past the group's used inode table (itable_unused {})", desc.itable_unused));
                    continue;
                }
                match read_record(self.fs, self.st, ino) {
                    Ok(raw) => self.check_inode(ino, &raw),
                    Err(e) => self.problem(format!("inode {ino}: {e}")),
                }
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

    fn check_inode(&mut self, ino: u32, raw: &Inode) {
        let kind = FileKind::from_mode(u32::from(raw.mode()));
        let first_ino = self.fs.geo.first_ino;
        let special = ino < first_ino && ino != ROOT_INO;
        let orphan = self.st.orphans.contains(&ino);
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
        let mut names = Vec::new();
        for d in dirs {
            let raw = match read_record(self.fs, self.st, d) {
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
                let shown = String::from_utf8_lossy(&l.name).into_owned();
                if l.name == b"." {
                    dot = true;
                    if l.ino != d {
                        self.problem(format!("directory {d}: \".\" names inode {}", l.ino));
                    }
                    continue;
                }
                match self.inodes.get(&l.ino) {
                    None => self.problem(format!(
                        "directory {d}: entry {shown:?} names inode {}, which is not in use",
                        l.ino
                    )),
                    Some(f) => {
                        let expected = f.kind.map(|k| k.dirent_type());
                        if self.fs.filetype && l.file_type != 0 && expected != Some(l.file_type) {
                            self.problem(format!(
                                "directory {d}: entry {shown:?} has type {} but inode {} is {:?}",
                                l.file_type, l.ino, f.kind
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
        for d in dirs {
            let expected_parent = if d == ROOT_INO {
                if parents.contains_key(&d) {
                    self.problem("the root directory has a name in another directory".into());
                }
                ROOT_INO
            } else {
                match parents.get(&d).map(Vec::as_slice) {
                    None | Some([]) => {
                        if !self.st.orphans.contains(&d) {
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
                    && !self.st.orphans.contains(i)
            })
            .map(|(i, _)| *i)
            .collect();
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
        let dir_nlink = self.st.sb.has_ro_compat(features::RO_COMPAT_DIR_NLINK);
        let first_ino = self.fs.geo.first_ino;
        let checks: Vec<(u32, Option<FileKind>, u16)> = self
            .inodes
            .iter()
            .map(|(i, f)| (*i, f.kind, f.links))
            .collect();
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
                && !(links == 0 && self.st.orphans.contains(&ino))
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

    fn pass5_groups(&mut self) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let seed = self.fs.csum_seed;
        for g in 0..geo.group_count {
            let desc = match read_desc(self.fs, g) {
                Ok(d) => d,
                Err(_) => continue,
            };
            let first = geo.group_first_block(g);
            let in_group = geo.blocks_in_group(g);
            let used = (first..first + u64::from(in_group))
                .filter(|&b| self.is_claimed(b))
                .count() as u32;
            if desc.free_blocks != in_group - used {
                self.problem(format!(
                    "group {g}: free block count {}, counted {}",
                    desc.free_blocks,
                    in_group - used
                ));
            }
            if desc.has_flag(FLAG_BLOCK_UNINIT) {
                let layout: u64 = metadata_in_group(self.fs, g)?
                    .iter()
                    .map(|(s, e)| e - s)
                    .sum();
                if u64::from(used) != layout {
                    self.problem(format!("group {g}: marked uninitialized but {} blocks beyond its metadata are in use", u64::from(used) - layout.min(u64::from(used))));
                }
            } else {
                let bytes = self.fs.cache.get(desc.block_bitmap)?.bytes();
                let wrong: Vec<u64> = (0..in_group)
                    .filter(|&i| {
                        bitmap::test_bit(&bytes, i) != self.is_claimed(first + u64::from(i))
                    })
                    .map(|i| first + u64::from(i))
                    .collect();
                if let Some(&b) = wrong.first() {
                    self.problem(format!("group {g}: block bitmap differs from blocks in use at {} blocks, first {b}", wrong.len()));
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

    fn check_inode_group(
        &mut self,
        g: u32,
        desc: &crate::format::group_desc::GroupDesc,
    ) -> FsResult<()> {
        let geo = self.fs.geo.clone();
        let ipg = geo.inodes_per_group;
        let range = g * ipg + 1..=(g + 1) * ipg;
        let in_use = self.inodes.range(range.clone()).count() as u32;
        let dirs = self
            .inodes
            .range(range)
            .filter(|(_, f)| f.kind == Some(FileKind::Directory))
            .count() as u32;
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
        if desc.has_flag(FLAG_INODE_UNINIT) {
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
