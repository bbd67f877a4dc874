//! Inode records: where they live, loading them into the inode cache, making new ones, and
//! what `stat` shows of them.
//!
//! A record is checked (checksum, extra size) every time it is read from its table block;
//! the inode cache (`crate::inode_table`) then holds the decoded copy, which
//! [`crate::tx::Tx::write_inode`] journals.

use crate::error::{FsError, FsResult};
use crate::extent_tree;
use crate::format::inode::{flags, Inode, InodeTime, GOOD_OLD_INODE_SIZE};
use crate::groups::read_desc;
use crate::state::{FsInner, InodeInfo};
use crate::types::{FileKind, Stat, Timestamp};
use std::sync::atomic::Ordering;

/// Extra inode bytes jext gives new inodes (ext4's `s_want_extra_isize` default).
const WANT_EXTRA_ISIZE: u16 = 32;

/// The table block holding inode `ino` and the record's byte offset in it.
pub(crate) fn table_location(fs: &FsInner, ino: u32) -> FsResult<(u64, usize)> {
    if ino == 0 || ino > fs.geo.inodes_count {
        return Err(FsError::Inconsistent(format!(
            "inode number {ino} is out of range (1..={})",
            fs.geo.inodes_count
        )));
    }
    let (group, index) = fs.geo.inode_position(ino);
    let desc = read_desc(fs, group)?;
    let byte = u64::from(index) * u64::from(fs.geo.inode_size);
    let block = desc.inode_table + byte / u64::from(fs.geo.block_size);
    Ok((block, (byte % u64::from(fs.geo.block_size)) as usize))
}

/// Reads and checks the record of `ino` from disk (through the buffer cache).
pub(crate) fn read_record(fs: &FsInner, ino: u32) -> FsResult<Inode> {
    let (block, offset) = table_location(fs, ino)?;
    let size = fs.geo.inode_size as usize;
    crate::lock_order::may_do_io("an inode record read");
    let buf = fs.cache.get(block)?;
    let inode = buf.read(|b| Inode::decode(&b[offset..offset + size], ino, fs.csum_seed))?;
    Ok(inode)
}

/// A new record: the given type and permissions, owner, times set to `now`, one link
/// (two for directories), the flags it inherits from its directory (`parent_flags`, as
/// ext4's `EXT4_FL_INHERITED`: `chattr +j` or `+x` on a directory reaches what is made in
/// it), and an empty extent tree for files, directories and long symlinks.
pub(crate) fn new_record(
    fs: &FsInner,
    mode: u32,
    uid: u32,
    gid: u32,
    generation: u32,
    now: Timestamp,
    parent_flags: u32,
) -> Inode {
    let extra = WANT_EXTRA_ISIZE.min((fs.geo.inode_size as usize - GOOD_OLD_INODE_SIZE) as u16);
    let mut raw = Inode::new(fs.geo.inode_size as usize, extra);
    raw.set_mode(mode as u16);
    raw.set_uid(uid);
    raw.set_gid(gid);
    raw.set_generation(generation);
    let t = InodeTime {
        seconds: now.seconds,
        nanoseconds: now.nanoseconds,
    };
    raw.set_atime(t);
    raw.set_ctime(t);
    raw.set_mtime(t);
    raw.set_crtime(t);
    let kind = FileKind::from_mode(mode);
    let links = if kind == Some(FileKind::Directory) {
        2
    } else {
        1
    };
    raw.set_links_count(links);
    raw.set_flags(flags::mask_for_mode(mode, parent_flags & flags::INHERITED));
    if matches!(kind, Some(FileKind::Regular | FileKind::Directory)) {
        raw.set_flags(raw.flags() | flags::EXTENTS);
        extent_tree::init_root(raw.i_block_mut());
    }
    raw
}

/// A read of the inode `info` (file data, or a directory's entries): moves its access
/// time as the mount's policy says (`noatime`, `relatime`, `strictatime`, `nodiratime`), in
/// memory only, as Linux keeps atime lazily: the writeback thread (or the next sync of the
/// inode) journals it.
pub(crate) fn note_access(fs: &FsInner, info: &mut InodeInfo) {
    use crate::options::AtimeUpdates;
    if fs.is_read_only() || (info.is_dir() && fs.options.no_dir_atime) {
        return;
    }
    let now = inode_time(Timestamp::now());
    let atime = info.raw.atime();
    let due = match fs.options.atime {
        AtimeUpdates::Never => false,
        AtimeUpdates::Always => true,
        AtimeUpdates::Relative => {
            const DAY_SECONDS: i64 = 24 * 60 * 60;
            atime <= info.raw.mtime()
                || atime <= info.raw.ctime()
                || now.seconds - atime.seconds >= DAY_SECONDS
        }
    };
    if due && atime != now {
        info.raw.set_atime(now);
        info.dirty = true;
    }
}

pub(crate) fn time(t: InodeTime) -> Timestamp {
    Timestamp {
        seconds: t.seconds,
        nanoseconds: t.nanoseconds,
    }
}

pub(crate) fn inode_time(t: Timestamp) -> InodeTime {
    InodeTime {
        seconds: t.seconds,
        nanoseconds: t.nanoseconds,
    }
}

/// The time to stamp a change of `info` with (its ctime, and mtime where the change moves
/// it): `coarse` (the operation's clock-tick time, [`Timestamp::now`]) unless someone read
/// the inode's times since they last changed, in which case the exact time, so that the
/// change shows (Linux's multigrain timestamps, 6.13 on).
pub(crate) fn stamp(info: &InodeInfo, coarse: Timestamp) -> InodeTime {
    if info.times_queried.swap(false, Ordering::Relaxed) {
        inode_time(Timestamp::now_fine().max(coarse))
    } else {
        inode_time(coarse)
    }
}

/// What `stat` shows of a cached inode (which marks its times as read, see [`stamp`],
/// unless the mount stamps from the coarse clock alone).
pub(crate) fn stat(fs: &FsInner, ino: u32, info: &InodeInfo) -> FsResult<Stat> {
    if fs.options.fine_timestamps {
        info.times_queried.store(true, Ordering::Relaxed);
    }
    let raw = &info.raw;
    let kind = FileKind::from_mode(info.mode()).ok_or_else(|| {
        FsError::Inconsistent(format!(
            "inode {ino} has an unknown file type (mode {:o})",
            info.mode()
        ))
    })?;
    let rdev = if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) {
        device_number(raw)
    } else {
        0
    };
    // Reserved delayed-allocation blocks count as used, as in ext4.
    let reserved_512 = info.reserved_pages.len() as u64 * u64::from(fs.geo.block_size / 512);
    Ok(Stat {
        ino,
        kind,
        perm: (info.mode() & 0o7777) as u16,
        nlink: u32::from(raw.links_count()),
        uid: raw.uid(),
        gid: raw.gid(),
        size: info.size,
        blocks_512: raw.blocks_512(fs.geo.block_size) + reserved_512,
        atime: time(raw.atime()),
        mtime: time(raw.mtime()),
        ctime: time(raw.ctime()),
        crtime: time(raw.crtime()),
        rdev,
        flags: raw.flags() & flags::USER_VISIBLE,
        generation: raw.generation(),
        block_size: fs.geo.block_size,
    })
}

/// Device numbers live in `i_block`: the old 16-bit form in word 0, or the new form in
/// word 1 (as ext4's `new_encode_dev`).
pub(crate) fn device_number(raw: &Inode) -> u32 {
    let b = raw.i_block();
    let old = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
    if old != 0 {
        return old;
    }
    u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"))
}

/// Stores a device number (in the kernel's `new_encode_dev` form, which is also the old
/// form for major and minor below 256): small ones in word 0, others in word 1.
pub(crate) fn set_device_number(raw: &mut Inode, rdev: u32) {
    let b = raw.i_block_mut();
    b.fill(0);
    let word = if rdev >> 16 == 0 { 0 } else { 4 };
    b[word..word + 4].copy_from_slice(&rdev.to_le_bytes());
}
