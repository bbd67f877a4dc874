//! Making a file system: the layout mkfs.ext4 (e2fsprogs 1.47) gives by default, written
//! through the format module.
//!
//! Defaults follow mke2fs.conf: 1 KiB blocks and one inode per 4 KiB below 512 MiB, else
//! 4 KiB blocks and one inode per 16 KiB; 256-byte inodes; flex groups of 16 whose
//! bitmaps and inode tables sit together at the start of the flex group; reserved GDT
//! blocks (the resize inode) for growth to 1024 times the size; a journal sized by the
//! e2fsprogs table, in the middle of the disk; features has_journal ext_attr
//! resize_inode dir_index filetype extent 64bit flex_bg sparse_super large_file
//! huge_file dir_nlink extra_isize metadata_csum fast_commit (unless asked not to). Without
//! a journal (`-O ^has_journal`), neither has_journal nor fast_commit, and inode 8 stays
//! an empty record, as mke2fs leaves it.
//!
//! Inode tables are initialized lazily, as mkfs.ext4 does: only group 0's first inodes are
//! written, and `itable_unused` tells every reader which records to trust. Everything is
//! composed in memory, checked, then written; nothing is written if the layout does not fit.

use crate::error::{FsError, FsResult};
use crate::extent_tree::{self, TreeOwner};
use crate::format::bitmap;
use crate::format::csum::inode_seed;
use crate::format::dirent;
use crate::format::extent::Extent;
use crate::format::group_desc::{
    GroupCsum, GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT, FLAG_ITABLE_ZEROED,
};
use crate::format::indirect::ResizeLayout;
use crate::format::inode::{flags, Inode, InodeTime};
use crate::format::superblock::{
    features as f, Superblock, EXT4_MAGIC, FLAG_SIGNED_HASH, STATE_CLEAN,
};
use crate::geometry::Geometry;
use crate::meta::{MetaIo, MetaRead};
use jext_device::BlockDevice;
use jext_io::{IoFlags, IoQueue, WriteRequest};
use jext_journal::format::JournalSuperblock;
use std::collections::BTreeMap;
use std::sync::Arc;

const INODE_SIZE: u32 = 256;
const FIRST_INO: u32 = 11;
const ROOT_INO: u32 = 2;
const RESIZE_INO: u32 = 7;
const JOURNAL_INO: u32 = 8;
const LOST_FOUND_INO: u32 = 11;
const FLEX_GROUPS: u32 = 16;
/// `EXT2_DIND_BLOCK`: the resize inode keeps its table behind this `i_block` slot.
const DIND_SLOT: usize = 13;

/// What to make.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// 1024, 2048, 4096 (or up to 65536); default by size as mkfs.ext4.
    pub block_size: Option<u32>,
    /// Bytes of space per inode; default by size as mkfs.ext4.
    pub inode_ratio: Option<u32>,
    /// Make a journal (on by default); `false` is `mkfs.ext4 -O ^has_journal`: no journal
    /// inode and no has_journal feature (nor fast_commit, which needs a journal).
    pub journal: bool,
    /// Journal size in blocks; default by size as mkfs.ext4.
    pub journal_blocks: Option<u32>,
    /// Reserve a fast-commit area and set the fast_commit feature (on by default: an
    /// eligible fsync then writes a fast commit instead of a full one). Ignored without a
    /// journal.
    pub fast_commit: bool,
    pub label: String,
    /// The device reads as zeros already (a freshly created sparse image file), so the
    /// journal and inode tables need not be zeroed.
    pub assume_zeroed: bool,
    /// Fixed identifiers, for reproducible images; random otherwise.
    pub uuid: Option<[u8; 16]>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            block_size: None,
            inode_ratio: None,
            journal: true,
            journal_blocks: None,
            fast_commit: true,
            label: String::new(),
            assume_zeroed: false,
            uuid: None,
        }
    }
}

/// What was made.
#[derive(Clone, Debug)]
pub struct MkfsReport {
    pub block_size: u32,
    pub blocks: u64,
    pub groups: u32,
    pub inodes: u32,
    pub journal_blocks: u32,
    pub fast_commit_blocks: u32,
    pub free_blocks: u64,
}

/// e2fsprogs' default journal size for a file system of `blocks` blocks.
fn default_journal_blocks(blocks: u64) -> Option<u32> {
    Some(match blocks {
        b if b < 2048 => return None,
        b if b < 32_768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16_384,
        b if b < 8192 * 1024 => 32_768,
        b if b < 16_384 * 1024 => 65_536,
        b if b < 32_768 * 1024 => 131_072,
        _ => 262_144,
    })
}

/// mke2fs.conf's inode ratio by size class: `small` below 512 MiB, the default below
/// 4 TiB, `big` below 16 TiB, `huge` beyond.
fn default_inode_ratio(size_bytes: u64) -> u32 {
    match size_bytes {
        s if s < 512 << 20 => 4096,
        s if s < 4 << 40 => 16_384,
        s if s < 16 << 40 => 32_768,
        _ => 65_536,
    }
}

/// The smallest device mkfs accepts.
pub const MIN_SIZE_BYTES: u64 = 2 << 20;
/// The largest device the default layout can number (4 KiB blocks, the `huge` inode
/// ratio, no meta_bg): beyond it the group descriptors would take more than 3/4 of a
/// group, where mke2fs turns to meta_bg, which jext does not make. 1,572,864 groups of
/// 128 MiB (24,576 descriptor blocks).
pub const MAX_SIZE_BYTES: u64 = 192 << 40;

/// The sizes `mkfs` accepts, for argument parsers that want to say so up front.
pub fn size_range_bytes() -> std::ops::RangeInclusive<u64> {
    MIN_SIZE_BYTES..=MAX_SIZE_BYTES
}

/// Block ranges already taken, for placing metadata.
struct Space {
    used: BTreeMap<u64, u64>,
    end: u64,
}

impl Space {
    fn mark(&mut self, start: u64, len: u64) {
        if len > 0 {
            self.used.insert(start, len);
        }
    }

    /// The first free run of `len` blocks at or after `goal` (wrapping to the start).
    fn take(&mut self, goal: u64, len: u64, what: &str) -> FsResult<u64> {
        for from in [goal, 0] {
            let mut candidate = from;
            loop {
                if candidate + len > self.end {
                    break;
                }
                let clash = self
                    .used
                    .range(..candidate + len)
                    .next_back()
                    .filter(|(&s, &l)| s + l > candidate);
                match clash {
                    None => {
                        self.mark(candidate, len);
                        return Ok(candidate);
                    }
                    Some((&s, &l)) => candidate = s + l,
                }
            }
        }
        Err(FsError::NoSpace(format!(
            "no room for {what} ({len} blocks)"
        )))
    }

    fn used_in(&self, start: u64, end: u64) -> u64 {
        self.used
            .iter()
            .map(|(&s, &l)| (s.max(start), (s + l).min(end)))
            .filter(|(a, b)| a < b)
            .map(|(a, b)| b - a)
            .sum()
    }
}

/// The image being composed: blocks by number.
struct Image {
    block_size: usize,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl Image {
    fn block(&mut self, n: u64) -> &mut Vec<u8> {
        let bs = self.block_size;
        self.blocks.entry(n).or_insert_with(|| vec![0u8; bs])
    }
}

/// Extent tree blocks of the journal inode come from the layout's free space.
struct ImageMeta<'a> {
    image: &'a mut Image,
    space: &'a mut Space,
}

impl MetaRead for ImageMeta<'_> {
    fn block_size(&self) -> usize {
        self.image.block_size
    }

    fn read_block(&mut self, block: u64) -> FsResult<Arc<[u8]>> {
        Ok(Arc::from(self.image.block(block).clone()))
    }
}

impl MetaIo for ImageMeta<'_> {
    fn modify_block(&mut self, block: u64, change: &mut dyn FnMut(&mut [u8])) -> FsResult<()> {
        change(self.image.block(block));
        Ok(())
    }

    fn alloc_meta_block(&mut self, goal: u64) -> FsResult<u64> {
        self.space.take(goal, 1, "an extent block")
    }

    fn free_meta_block(&mut self, _block: u64) -> FsResult<()> {
        unreachable!("mkfs only adds extents")
    }

    fn free_data_blocks(&mut self, _start: u64, _count: u64) -> FsResult<()> {
        unreachable!("mkfs only adds extents")
    }
}

fn random_bytes<const N: usize>() -> [u8; N] {
    use std::io::Read;
    let mut out = [0u8; N];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut out));
    if ok.is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for (i, b) in out.iter_mut().enumerate() {
            *b = (nanos >> ((i % 16) * 8)) as u8 ^ (i as u8).wrapping_mul(151);
        }
    }
    out
}

/// Everything decided before any block is written.
struct Plan {
    geo: Geometry,
    reserved_gdt: u32,
    journal_blocks: u32,
    fc_blocks: u32,
    block_bitmaps: Vec<u64>,
    inode_bitmaps: Vec<u64>,
    inode_tables: Vec<u64>,
}

fn plan(size_bytes: u64, opts: &MkfsOptions) -> FsResult<(Plan, Space)> {
    let small = size_bytes < 512 << 20;
    let bs = opts.block_size.unwrap_or(if small { 1024 } else { 4096 });
    if !bs.is_power_of_two() || !(1024..=65536).contains(&bs) {
        return Err(FsError::Invalid(format!(
            "block size {bs} (1024 to 65536, a power of two)"
        )));
    }
    let first_data = u64::from(bs == 1024);
    let mut blocks = size_bytes / u64::from(bs);
    let bpg = bs * 8;
    let mut groups = (blocks - first_data).div_ceil(u64::from(bpg));
    let dpb = bs / 64;
    let gdt_blocks = |groups: u64| groups.div_ceil(u64::from(dpb));
    // Growth room for 1024x (capped at 2^32 blocks), as e2fsprogs reserves.
    let max_blocks = (blocks * 1024).min(u64::from(u32::MAX));
    let growth_gdt = (max_blocks - first_data)
        .div_ceil(u64::from(bpg))
        .div_ceil(u64::from(dpb));
    let reserved_gdt = growth_gdt
        .saturating_sub(gdt_blocks(groups))
        .min(u64::from(bs / 4)) as u32;
    if gdt_blocks(groups) + u64::from(reserved_gdt) > u64::from(bpg) * 3 / 4 {
        return Err(FsError::Invalid(format!(
            "{groups} groups need {} descriptor blocks, more than 3/4 of a group \
             (mke2fs would use meta_bg, which jext does not make); at most {} with \
             {bs}-byte blocks",
            gdt_blocks(groups),
            crate::options::human_bytes(
                u64::from(bpg) * 3 / 4 * u64::from(dpb) * u64::from(bpg) * u64::from(bs)
            )
        )));
    }
    // A last group too small for its own metadata is dropped, as mke2fs does.
    let last = blocks - first_data - (groups - 1) * u64::from(bpg);
    if groups > 1 && last < 1 + gdt_blocks(groups) + u64::from(reserved_gdt) + 64 {
        blocks -= last;
        groups -= 1;
    }
    let ratio = u64::from(opts.inode_ratio.unwrap_or(default_inode_ratio(size_bytes)));
    let ipb = bs / INODE_SIZE;
    let wanted = (blocks * u64::from(bs) / ratio).max(u64::from(FIRST_INO) + 5);
    let mut ipg = wanted.div_ceil(groups).max(16) as u32;
    ipg = ipg.div_ceil(ipb.max(8)) * ipb.max(8);
    ipg = ipg.min(bpg);
    let journal_blocks = match opts.journal_blocks {
        _ if !opts.journal => 0,
        Some(n) => n,
        None => default_journal_blocks(blocks).ok_or_else(|| {
            FsError::Invalid(format!(
                "{blocks} blocks are too few for a journal (2048 at least)"
            ))
        })?,
    };
    let fc_blocks = if opts.journal && opts.fast_commit {
        journal_blocks / 64
    } else {
        0
    };
    if groups > u64::from(u32::MAX) / u64::from(ipg) {
        return Err(FsError::Invalid("too many inodes for this size".into()));
    }
    let groups = groups as u32;
    let geo = Geometry {
        block_size: bs,
        blocks_count: blocks,
        first_data_block: first_data,
        blocks_per_group: bpg,
        inodes_per_group: ipg,
        inodes_count: ipg * groups,
        inode_size: INODE_SIZE,
        first_ino: FIRST_INO,
        group_count: groups,
        desc_size: 64,
        reserved_gdt_blocks: reserved_gdt,
        sparse_super: true,
        backup_bgs: None,
        flex_group_size: FLEX_GROUPS,
    };
    let mut space = Space {
        used: BTreeMap::new(),
        end: blocks,
    };
    if first_data == 1 {
        space.mark(0, 1);
    }
    for g in 0..groups {
        space.mark(
            geo.group_first_block(g),
            u64::from(geo.superblock_area_blocks(g)),
        );
    }
    let mut p = Plan {
        geo,
        reserved_gdt,
        journal_blocks,
        fc_blocks,
        block_bitmaps: vec![0; groups as usize],
        inode_bitmaps: vec![0; groups as usize],
        inode_tables: vec![0; groups as usize],
    };
    let itb = u64::from(p.geo.inode_table_blocks());
    for flex in (0..groups).step_by(FLEX_GROUPS as usize) {
        let members = flex..(flex + FLEX_GROUPS).min(groups);
        let goal = p.geo.group_first_block(flex);
        for g in members.clone() {
            p.block_bitmaps[g as usize] = space.take(goal, 1, "a block bitmap")?;
        }
        for g in members.clone() {
            p.inode_bitmaps[g as usize] = space.take(goal, 1, "an inode bitmap")?;
        }
        for g in members {
            p.inode_tables[g as usize] = space.take(goal, itb, "an inode table")?;
        }
    }
    Ok((p, space))
}

/// Makes an ext4 file system on `device`.
pub fn mkfs(device: Arc<dyn BlockDevice>, opts: &MkfsOptions) -> FsResult<MkfsReport> {
    let size = device.size_bytes();
    if !size_range_bytes().contains(&size) {
        return Err(FsError::Invalid(format!(
            "a device of {} is outside what mkfs makes ({} to {})",
            crate::options::human_bytes(size),
            crate::options::human_bytes(MIN_SIZE_BYTES),
            crate::options::human_bytes(MAX_SIZE_BYTES)
        )));
    }
    let (p, mut space) = plan(size, opts)?;
    let geo = p.geo.clone();
    let bs = geo.block_size as usize;
    let uuid = opts.uuid.unwrap_or_else(random_bytes::<16>);
    let mut sb = superblock(&p, opts, uuid)?;
    let seed = sb.csum_seed();
    let now = InodeTime {
        seconds: crate::types::Timestamp::now().seconds,
        nanoseconds: 0,
    };
    let mut image = Image {
        block_size: bs,
        blocks: BTreeMap::new(),
    };

    let mut inodes: BTreeMap<u32, Inode> = BTreeMap::new();
    let new_inode = |mode: u16, links: u16| {
        let mut i = Inode::new(INODE_SIZE as usize, 32);
        i.set_mode(mode);
        i.set_links_count(links);
        for set in [
            Inode::set_atime,
            Inode::set_ctime,
            Inode::set_mtime,
            Inode::set_crtime,
        ] {
            set(&mut i, now);
        }
        i
    };
    // Journal: one contiguous run starting in the middle group.
    let total_journal = p.journal_blocks + p.fc_blocks;
    let journal_start = if opts.journal {
        let middle = geo.group_first_block(geo.group_count / 2);
        let journal_start = space.take(middle, u64::from(total_journal), "the journal")?;
        let mut jsb = JournalSuperblock::new(geo.block_size, total_journal, uuid);
        jsb.set_num_fc_blocks_field(p.fc_blocks);
        image.block(journal_start)[..1024].copy_from_slice(&jsb.encode());

        let mut journal_inode = new_inode(0o100600, 1);
        journal_inode.set_flags(flags::EXTENTS);
        extent_tree::init_root(journal_inode.i_block_mut());
        journal_inode.set_size(u64::from(total_journal) * bs as u64);
        let mut root = [0u8; 60];
        root.copy_from_slice(journal_inode.i_block());
        let owner = TreeOwner {
            ino: JOURNAL_INO,
            inode_seed: Some(inode_seed(seed, JOURNAL_INO, 0)),
            goal: journal_start,
        };
        let mut meta_blocks = 0i64;
        {
            let mut meta = ImageMeta {
                image: &mut image,
                space: &mut space,
            };
            let mut logical = 0u32;
            while logical < total_journal {
                let len = (total_journal - logical).min(32_768);
                let e = Extent {
                    logical,
                    len,
                    start: journal_start + u64::from(logical),
                    unwritten: false,
                };
                meta_blocks += extent_tree::insert(&mut meta, &mut root, &owner, e)?;
                logical += len;
            }
        }
        journal_inode.i_block_mut().copy_from_slice(&root);
        journal_inode.set_blocks_512(
            (u64::from(total_journal) + meta_blocks as u64) * (bs as u64 / 512),
            geo.block_size,
        );
        let mut jnl_backup = [0u32; 17];
        for (i, word) in jnl_backup.iter_mut().take(15).enumerate() {
            *word = u32::from_le_bytes(root[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        }
        jnl_backup[15] = (journal_inode.size() >> 32) as u32;
        jnl_backup[16] = journal_inode.size() as u32;
        sb.set_jnl_blocks(jnl_backup);
        inodes.insert(JOURNAL_INO, journal_inode);
        Some(journal_start)
    } else {
        None
    };

    // Root and lost+found, near the start.
    let after_tables = p.inode_tables[0] + u64::from(geo.inode_table_blocks());
    let root_block = space.take(after_tables, 1, "the root directory")?;
    let lpf_len = (16_384 / bs as u64).max(2);
    let lpf_start = space.take(root_block, lpf_len, "lost+found")?;
    let mut root_inode = new_inode(0o040755, 3);
    let mut lpf_inode = new_inode(0o040700, 2);
    for (inode, start, len) in [
        (&mut root_inode, root_block, 1u64),
        (&mut lpf_inode, lpf_start, lpf_len),
    ] {
        inode.set_flags(flags::EXTENTS);
        extent_tree::init_root(inode.i_block_mut());
        let node = crate::format::extent::Node {
            depth: 0,
            max_entries: 4,
            generation: 0,
            entries: crate::format::extent::Entries::Leaf(vec![Extent {
                logical: 0,
                len: len as u32,
                start,
                unwritten: false,
            }]),
        };
        node.encode(inode.i_block_mut(), true, None);
        inode.set_size(len * bs as u64);
        inode.set_blocks_512(len * (bs as u64 / 512), geo.block_size);
    }
    write_dir_block(
        &mut image,
        root_block,
        seed,
        ROOT_INO,
        ROOT_INO,
        Some(LOST_FOUND_INO),
    );
    write_dir_block(&mut image, lpf_start, seed, LOST_FOUND_INO, ROOT_INO, None);
    for b in 1..lpf_len {
        let block = image.block(lpf_start + b);
        dirent::init_empty_block(block, true);
        dirent::set_checksum(block, inode_seed(seed, LOST_FOUND_INO, 0));
    }
    inodes.insert(ROOT_INO, root_inode);
    inodes.insert(LOST_FOUND_INO, lpf_inode);

    if p.reserved_gdt > 0 {
        let resize = resize_inode(&p, &mut image, &mut space, new_inode(0o100600, 1))?;
        inodes.insert(RESIZE_INO, resize);
    }

    // Group descriptors, bitmaps, counts.
    let (descs, free_blocks) = groups(&p, &space, &mut image, seed, opts.assume_zeroed);
    sb.set_free_blocks_count(free_blocks);
    sb.set_free_inodes_count(geo.inodes_count - FIRST_INO);
    let overhead =
        space.used_in(0, geo.blocks_count) - lpf_len - 1 - if p.reserved_gdt > 0 { 1 } else { 0 };
    sb.set_overhead_clusters(overhead as u32);

    // Inode table of group 0: the reserved inodes, root, lost+found.
    for ino in 1..=FIRST_INO {
        let inode = inodes
            .remove(&ino)
            .unwrap_or_else(|| Inode::new(INODE_SIZE as usize, 32));
        let bytes = inode.encode(ino, Some(seed));
        let byte = u64::from(ino - 1) * u64::from(INODE_SIZE);
        let block = p.inode_tables[0] + byte / bs as u64;
        let at = (byte % bs as u64) as usize;
        image.block(block)[at..at + INODE_SIZE as usize].copy_from_slice(&bytes);
    }

    write_superblocks_and_gdt(&p, &sb, &descs, &mut image);
    let io = IoQueue::new(device);
    if let (Some(start), false) = (journal_start, opts.assume_zeroed) {
        zero_journal(&io, &geo, start, total_journal)?;
    }
    let requests = image
        .blocks
        .into_iter()
        .map(|(n, data)| WriteRequest::new(n * bs as u64, Arc::from(data), IoFlags::empty()))
        .collect();
    io.submit(requests).wait()?;
    io.flush()?;
    Ok(MkfsReport {
        block_size: geo.block_size,
        blocks: geo.blocks_count,
        groups: geo.group_count,
        inodes: geo.inodes_count,
        journal_blocks: p.journal_blocks,
        fast_commit_blocks: p.fc_blocks,
        free_blocks,
    })
}

fn superblock(p: &Plan, opts: &MkfsOptions, uuid: [u8; 16]) -> FsResult<Superblock> {
    let geo = &p.geo;
    let mut sb = Superblock::zeroed();
    let mut compat = f::COMPAT_EXT_ATTR | f::COMPAT_DIR_INDEX;
    if opts.journal {
        compat |= f::COMPAT_HAS_JOURNAL;
    }
    if p.reserved_gdt > 0 {
        compat |= f::COMPAT_RESIZE_INODE;
    }
    if opts.journal && opts.fast_commit {
        compat |= f::COMPAT_FAST_COMMIT;
    }
    sb.set_feature_compat(compat);
    sb.set_feature_incompat(
        f::INCOMPAT_FILETYPE | f::INCOMPAT_EXTENTS | f::INCOMPAT_64BIT | f::INCOMPAT_FLEX_BG,
    );
    sb.set_feature_ro_compat(
        f::RO_COMPAT_SPARSE_SUPER
            | f::RO_COMPAT_LARGE_FILE
            | f::RO_COMPAT_HUGE_FILE
            | f::RO_COMPAT_DIR_NLINK
            | f::RO_COMPAT_EXTRA_ISIZE
            | f::RO_COMPAT_METADATA_CSUM,
    );
    sb.set_magic(EXT4_MAGIC);
    sb.set_rev_level(1);
    sb.set_inodes_count(geo.inodes_count);
    sb.set_blocks_count(geo.blocks_count);
    sb.set_r_blocks_count(geo.blocks_count / 20);
    sb.set_first_data_block(geo.first_data_block as u32);
    sb.set_log_block_size(geo.block_size.trailing_zeros() - 10);
    sb.set_log_cluster_size(geo.block_size.trailing_zeros() - 10);
    sb.set_blocks_per_group(geo.blocks_per_group);
    sb.set_clusters_per_group(geo.blocks_per_group);
    sb.set_inodes_per_group(geo.inodes_per_group);
    let now = crate::types::Timestamp::now()
        .seconds
        .clamp(0, i64::from(u32::MAX)) as u32;
    sb.set_wtime(now);
    sb.set_mkfs_time(now);
    sb.set_lastcheck(now);
    sb.set_max_mnt_count(0xFFFF);
    sb.set_state(STATE_CLEAN);
    sb.set_errors(1);
    sb.set_first_ino(FIRST_INO);
    sb.set_inode_size(INODE_SIZE as u16);
    sb.set_uuid(uuid);
    if opts.label.len() > 16 {
        return Err(FsError::Invalid(format!(
            "label {:?} is longer than 16 bytes",
            opts.label
        )));
    }
    sb.set_volume_name(opts.label.as_bytes());
    sb.set_reserved_gdt_blocks(p.reserved_gdt as u16);
    if opts.journal {
        sb.set_journal_inum(JOURNAL_INO);
        sb.set_jnl_backup_type(1);
    }
    let seed_bytes = random_bytes::<16>();
    sb.set_hash_seed(std::array::from_fn(|i| {
        u32::from_le_bytes(seed_bytes[i * 4..i * 4 + 4].try_into().expect("4 bytes"))
    }));
    sb.set_def_hash_version(crate::format::hash::HASH_HALF_MD4);
    sb.set_desc_size_raw(64);
    sb.set_default_mount_opts(0x000C);
    sb.set_min_extra_isize(32);
    sb.set_want_extra_isize(32);
    sb.set_flags(FLAG_SIGNED_HASH);
    sb.set_log_groups_per_flex(FLEX_GROUPS.trailing_zeros() as u8);
    sb.set_checksum_type(1);
    Ok(sb)
}

/// A directory's first block: "." and "..", and "lost+found" in the root's.
fn write_dir_block(
    image: &mut Image,
    block: u64,
    seed: u32,
    ino: u32,
    parent: u32,
    child: Option<u32>,
) {
    let b = image.block(block);
    dirent::init_dot_block(b, ino, parent, 2, true);
    if let Some(lpf) = child {
        dirent::insert(b, true, lpf, 2, b"lost+found").expect("an empty block holds one name");
    }
    dirent::set_checksum(b, inode_seed(seed, ino, 0));
}

/// The resize inode: a double-indirect block listing the primary reserved GDT blocks,
/// each of which lists its copies in the backup groups (layout from `format::indirect`).
fn resize_inode(
    p: &Plan,
    image: &mut Image,
    space: &mut Space,
    mut inode: Inode,
) -> FsResult<Inode> {
    let geo = &p.geo;
    let dind = space.take(
        p.inode_tables[0] + u64::from(geo.inode_table_blocks()),
        1,
        "the resize inode",
    )?;
    let backups: Vec<u32> = (1..geo.group_count)
        .filter(|&g| geo.group_has_superblock(g))
        .collect();
    let layout = ResizeLayout::new(
        geo.block_size,
        geo.first_data_block as u32,
        geo.gdt_blocks(),
        p.reserved_gdt,
        geo.blocks_per_group,
        &backups,
    );
    layout.encode_dind(image.block(dind));
    for (index, &(_, primary)) in layout.dind_slots.iter().enumerate() {
        layout.encode_copy_list(index, image.block(u64::from(primary)));
    }
    inode.i_block_mut()[DIND_SLOT * 4..DIND_SLOT * 4 + 4]
        .copy_from_slice(&(dind as u32).to_le_bytes());
    inode.set_size(layout.size_bytes());
    inode.set_blocks_512(
        layout.owned_blocks() * u64::from(geo.block_size / 512),
        geo.block_size,
    );
    Ok(inode)
}

/// Group descriptors and the bitmaps of groups that are not left uninitialized; returns
/// the descriptors and the free block total.
fn groups(
    p: &Plan,
    space: &Space,
    image: &mut Image,
    seed: u32,
    zeroed: bool,
) -> (Vec<GroupDesc>, u64) {
    let geo = &p.geo;
    let mut descs = Vec::with_capacity(geo.group_count as usize);
    let mut free_total = 0;
    for g in 0..geo.group_count {
        let first = geo.group_first_block(g);
        let in_group = geo.blocks_in_group(g);
        let end = first + u64::from(in_group);
        let used = space.used_in(first, end);
        let own_area = u64::from(geo.superblock_area_blocks(g));
        let free = u64::from(in_group) - used;
        free_total += free;
        let mut desc = GroupDesc {
            block_bitmap: p.block_bitmaps[g as usize],
            inode_bitmap: p.inode_bitmaps[g as usize],
            inode_table: p.inode_tables[g as usize],
            free_blocks: free as u32,
            free_inodes: geo.inodes_per_group,
            itable_unused: geo.inodes_per_group,
            flags: if zeroed { FLAG_ITABLE_ZEROED } else { 0 },
            ..GroupDesc::default()
        };
        if g == 0 {
            desc.free_inodes -= FIRST_INO;
            desc.itable_unused -= FIRST_INO;
            desc.used_dirs = 2;
            let ib = image.block(desc.inode_bitmap);
            bitmap::set_range(ib, 0, FIRST_INO);
            bitmap::set_range(
                ib,
                geo.inodes_per_group,
                geo.block_size * 8 - geo.inodes_per_group,
            );
            desc.inode_bitmap_csum = bitmap::checksum(seed, ib, geo.inodes_per_group);
        } else {
            desc.flags |= FLAG_INODE_UNINIT;
        }
        // e2fsck wants the last group's bitmap written: its padding bits matter.
        let last = g + 1 == geo.group_count;
        if used == own_area && g != 0 && !last {
            desc.flags |= FLAG_BLOCK_UNINIT;
        } else {
            let bb = image.block(desc.block_bitmap);
            for (&s, &l) in space.used.range(..end) {
                let (a, b) = (s.max(first), (s + l).min(end));
                if a < b {
                    bitmap::set_range(bb, (a - first) as u32, (b - a) as u32);
                }
            }
            bitmap::set_range(bb, in_group, geo.block_size * 8 - in_group);
            desc.block_bitmap_csum = bitmap::checksum(seed, bb, geo.blocks_per_group);
        }
        descs.push(desc);
    }
    (descs, free_total)
}

/// The primary superblock and group descriptor table, and their backups.
fn write_superblocks_and_gdt(p: &Plan, sb: &Superblock, descs: &[GroupDesc], image: &mut Image) {
    let geo = &p.geo;
    let bs = geo.block_size as usize;
    let csum = GroupCsum::Crc32c {
        fs_seed: sb.csum_seed(),
    };
    let mut gdt = vec![0u8; geo.gdt_blocks() as usize * bs];
    for (g, desc) in descs.iter().enumerate() {
        desc.encode(&mut gdt[g * 64..(g + 1) * 64], g as u32, csum);
    }
    for g in (0..geo.group_count).filter(|&g| geo.group_has_superblock(g)) {
        let mut copy = sb.clone();
        copy.set_block_group_nr(g as u16);
        let bytes = copy.encode();
        let first = geo.group_first_block(g);
        let (block, at) = if g == 0 {
            geo.superblock_location()
        } else {
            (first, 0)
        };
        image.block(block)[at..at + 1024].copy_from_slice(&bytes);
        for (i, chunk) in gdt.chunks(bs).enumerate() {
            image.block(first + 1 + i as u64).copy_from_slice(chunk);
        }
    }
}

fn zero_journal(io: &IoQueue, geo: &Geometry, start: u64, blocks: u32) -> FsResult<()> {
    let bs = u64::from(geo.block_size);
    let chunk_blocks = (1 << 20) / bs;
    let zeros: Arc<[u8]> = Arc::from(vec![0u8; (chunk_blocks * bs) as usize]);
    let mut block = start + 1;
    let end = start + u64::from(blocks);
    while block < end {
        let n = (end - block).min(chunk_blocks);
        io.write(
            block * bs,
            zeros[..(n * bs) as usize].into(),
            IoFlags::empty(),
        )?;
        block += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_range_is_exactly_what_the_layout_can_number() {
        let opts = MkfsOptions::default();
        let (p, _) = plan(MAX_SIZE_BYTES, &opts).expect("the largest size plans");
        assert_eq!(p.geo.block_size, 4096);
        assert!(u64::from(p.geo.gdt_blocks()) <= u64::from(p.geo.blocks_per_group) * 3 / 4);
        let over = match plan(MAX_SIZE_BYTES + (128 << 20), &opts) {
            Ok(_) => panic!("one group more than the maximum was planned"),
            Err(e) => e.to_string(),
        };
        assert!(over.contains("meta_bg"), "{over}");
        plan(MIN_SIZE_BYTES, &opts).expect("the smallest size plans");
    }

    #[test]
    fn inode_ratio_follows_mke2fs_size_classes() {
        assert_eq!(default_inode_ratio(64 << 20), 4096);
        assert_eq!(default_inode_ratio(1 << 40), 16_384);
        assert_eq!(default_inode_ratio(4 << 40), 32_768);
        assert_eq!(default_inode_ratio(16 << 40), 65_536);
    }
}
