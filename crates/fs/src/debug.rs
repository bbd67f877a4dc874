//! Human-readable dumps of on-disk structures, for `jext debug`.
//!
//! The journal dump reads the log as it is on disk (it never recovers); the other dumps
//! open the file system read-only over a copy-on-write overlay, so they show the state
//! after recovery without changing the image.

use crate::error::FsResult;
use crate::format::superblock::features;
use crate::groups::read_desc;
use crate::inodes::read_record;
use crate::mount::{journal_area, read_superblock};
use crate::types::FileKind;
use crate::{dir, Fs, MountOptions};
use jext_device::{BlockDevice, OverlayDevice};
use jext_io::IoQueue;
use jext_journal::format::superblock::{incompat_names, INCOMPAT_JEXT_PERCORE};
use std::fmt::Write;
use std::sync::Arc;

/// What to dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugWhat {
    Superblock,
    Groups,
    /// An inode by number.
    Inode(u32),
    /// A directory by path.
    Dir(String),
    Journal,
}

/// The dump of `what` for the file system on `device`.
pub fn dump(device: Arc<dyn BlockDevice>, what: &DebugWhat) -> FsResult<String> {
    if *what == DebugWhat::Journal {
        return journal(device);
    }
    let overlay = Arc::new(OverlayDevice::new(device));
    let fs = Fs::open(
        overlay,
        MountOptions {
            read_only: true,
            ..MountOptions::default()
        },
    )?;
    if let DebugWhat::Dir(path) = what {
        return directory(&fs, path);
    }
    fs.with_exclusive(|op| {
        let inner = op.fs;
        let mut out = String::new();
        match what {
            DebugWhat::Superblock => superblock(&inner.sb.lock(), &mut out),
            DebugWhat::Groups => groups(inner, &mut out)?,
            DebugWhat::Inode(ino) => inode(inner, *ino, &mut out)?,
            DebugWhat::Dir(_) | DebugWhat::Journal => unreachable!("handled above"),
        }
        Ok(out)
    })?
}

fn superblock(sb: &crate::format::superblock::Superblock, out: &mut String) {
    let names = |bits: u32, table: &[(u32, &str)]| features::describe(bits, table);
    let compat: &[(u32, &str)] = &[
        (features::COMPAT_HAS_JOURNAL, "has_journal"),
        (features::COMPAT_EXT_ATTR, "ext_attr"),
        (features::COMPAT_RESIZE_INODE, "resize_inode"),
        (features::COMPAT_DIR_INDEX, "dir_index"),
        (features::COMPAT_SPARSE_SUPER2, "sparse_super2"),
        (features::COMPAT_FAST_COMMIT, "fast_commit"),
        (features::COMPAT_ORPHAN_FILE, "orphan_file"),
    ];
    let _ = writeln!(
        out,
        "volume name        {:?}",
        String::from_utf8_lossy(sb.volume_name())
    );
    let _ = writeln!(out, "uuid               {}", hex(&sb.uuid()));
    let _ = writeln!(out, "block size         {}", sb.block_size());
    let _ = writeln!(
        out,
        "blocks             {} ({} free, {} reserved)",
        sb.blocks_count(),
        sb.free_blocks_count(),
        sb.r_blocks_count()
    );
    let _ = writeln!(
        out,
        "inodes             {} ({} free, {} bytes each)",
        sb.inodes_count(),
        sb.free_inodes_count(),
        sb.inode_size()
    );
    let _ = writeln!(
        out,
        "groups             {} ({} blocks, {} inodes each; flex {})",
        sb.group_count(),
        sb.blocks_per_group(),
        sb.inodes_per_group(),
        1u32 << sb.log_groups_per_flex()
    );
    let _ = writeln!(out, "first data block   {}", sb.first_data_block());
    let _ = writeln!(out, "reserved GDT       {}", sb.reserved_gdt_blocks());
    let _ = writeln!(
        out,
        "compat             {}",
        names(sb.feature_compat(), compat)
    );
    let _ = writeln!(
        out,
        "incompat           {}",
        names(sb.feature_incompat(), features::INCOMPAT_NAMES)
    );
    let _ = writeln!(
        out,
        "ro_compat          {}",
        names(sb.feature_ro_compat(), features::RO_COMPAT_NAMES)
    );
    let _ = writeln!(out, "state              {:#x}", sb.state());
    let _ = writeln!(out, "journal inode      {}", sb.journal_inum());
    let _ = writeln!(out, "last orphan        {}", sb.last_orphan());
    let _ = writeln!(
        out,
        "hash               version {}, seed {:08x?}",
        sb.def_hash_version(),
        sb.hash_seed()
    );
    let _ = writeln!(out, "mount count        {}", sb.mnt_count());
    let _ = writeln!(out, "checksum           {:#010x}", sb.stored_checksum());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn groups(fs: &crate::state::FsInner, out: &mut String) -> FsResult<()> {
    for g in 0..fs.geo.group_count {
        let d = read_desc(fs, g)?;
        let mut flags = Vec::new();
        for (bit, name) in [
            (1u16, "INODE_UNINIT"),
            (2, "BLOCK_UNINIT"),
            (4, "ITABLE_ZEROED"),
        ] {
            if d.flags & bit != 0 {
                flags.push(name);
            }
        }
        let first = fs.geo.group_first_block(g);
        let _ = writeln!(
            out,
            "group {g}: blocks {first}-{} [{}]\n  block bitmap {}, inode bitmap {}, inode table {}\n  {} free blocks, {} free inodes, {} directories, {} unused inodes",
            first + u64::from(fs.geo.blocks_in_group(g)) - 1,
            flags.join(", "),
            d.block_bitmap,
            d.inode_bitmap,
            d.inode_table,
            d.free_blocks,
            d.free_inodes,
            d.used_dirs,
            d.itable_unused
        );
    }
    Ok(())
}

fn inode(fs: &crate::state::FsInner, ino: u32, out: &mut String) -> FsResult<()> {
    let raw = read_record(fs, ino)?;
    let kind = FileKind::from_mode(u32::from(raw.mode()));
    let _ = writeln!(out, "inode {ino}: {:?}, mode {:o}", kind, raw.mode());
    let _ = writeln!(
        out,
        "  uid {} gid {} links {} size {} blocks(512) {}",
        raw.uid(),
        raw.gid(),
        raw.links_count(),
        raw.size(),
        raw.blocks_512(fs.geo.block_size)
    );
    let _ = writeln!(
        out,
        "  flags {:#x} generation {} xattr block {} dtime {}",
        raw.flags(),
        raw.generation(),
        raw.file_acl(),
        raw.dtime()
    );
    for (name, t) in [
        ("atime", raw.atime()),
        ("mtime", raw.mtime()),
        ("ctime", raw.ctime()),
        ("crtime", raw.crtime()),
    ] {
        let _ = writeln!(out, "  {name:6} {}.{:09}", t.seconds, t.nanoseconds);
    }
    if raw.flags() & crate::format::inode::flags::EXTENTS != 0 {
        let (extents, index) = crate::blockmap::extents_and_index(fs, ino, &raw)?;
        let _ = writeln!(
            out,
            "  extents ({}), index blocks {:?}",
            extents.len(),
            index
        );
        for e in extents.iter().take(64) {
            let _ = writeln!(
                out,
                "    logical {:>10} len {:>6} -> {}{}",
                e.logical,
                e.len,
                e.start,
                if e.unwritten { " (unwritten)" } else { "" }
            );
        }
        if extents.len() > 64 {
            let _ = writeln!(out, "    ... {} more", extents.len() - 64);
        }
    }
    Ok(())
}

fn directory(fs: &Fs, path: &str) -> FsResult<String> {
    let ino = fs.resolve(path)?;
    let mut out = String::new();
    let indexed = fs.with_exclusive(|op| -> FsResult<bool> {
        op.lock(ino, crate::op::Reach::First)?;
        Ok(dir::is_indexed(op.fs, &op.inode(ino).raw))
    })??;
    let _ = writeln!(
        out,
        "directory {path} (inode {ino}, {})",
        if indexed { "hashed (htree)" } else { "linear" }
    );
    let mut cookie = 0;
    loop {
        let batch = fs.readdir(ino, cookie)?;
        let Some(last) = batch.last() else { break };
        cookie = last.next_cookie;
        for e in &batch {
            let _ = writeln!(
                out,
                "  {:>10}  {:<9} {}",
                e.ino,
                format!("{:?}", e.kind),
                String::from_utf8_lossy(&e.name)
            );
        }
    }
    Ok(out)
}

/// The journal superblock of the file system on `device`, as it is on disk (read only).
pub fn journal_superblock(
    device: Arc<dyn BlockDevice>,
) -> FsResult<jext_journal::format::JournalSuperblock> {
    let io = IoQueue::new(device);
    let sb = read_superblock(&io)?;
    let area = journal_area(&io, &sb)?;
    Ok(jext_journal::recovery::read_superblock(&io, &area)?)
}

fn journal(device: Arc<dyn BlockDevice>) -> FsResult<String> {
    let io = IoQueue::new(device);
    let sb = read_superblock(&io)?;
    if !sb.has_compat(features::COMPAT_HAS_JOURNAL) {
        return Ok(format!("journal: none; {}\n", crate::NO_JOURNAL_NOTE));
    }
    let area = journal_area(&io, &sb)?;
    let scan = jext_journal::scan(&io, &area)?;
    let jsb = &scan.superblock;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "journal: {} blocks of {} bytes in {} run(s), log {}..{}",
        jsb.maxlen(),
        jsb.block_size(),
        area.runs().len(),
        jsb.first(),
        jsb.log_end()
    );
    let _ = writeln!(
        out,
        "  features incompat {:#x} ({}), start {}, sequence {}, fast-commit blocks {}",
        jsb.feature_incompat(),
        incompat_names(jsb.feature_incompat()),
        jsb.start(),
        jsb.sequence(),
        jsb.fast_commit_blocks()
    );
    for t in &scan.transactions {
        let _ = writeln!(
            out,
            "transaction {} at journal block {}, commit at {} ({} s){}",
            t.tid,
            t.first_block,
            t.commit_block,
            t.commit.commit_sec,
            // Only a compact commit block comes first in its transaction.
            if t.first_block == t.commit_block {
                ", a compact commit"
            } else {
                ""
            }
        );
        for b in &t.blocks {
            let _ = writeln!(
                out,
                "  fs block {:>10} logged at journal block {}{}",
                b.tag.fs_block,
                b.journal_block,
                if b.tag.escaped { " (escaped)" } else { "" }
            );
        }
        for r in &t.records {
            let kind = match r.record.kind {
                jext_journal::format::records::RecordKind::Delta => "delta",
                jext_journal::format::records::RecordKind::Zeroed => "zeroed",
            };
            let _ = writeln!(
                out,
                "  fs block {:>10} as a {kind} byte record at journal block {}: {} range(s), \
                 {} bytes",
                r.record.fs_block,
                r.journal_block,
                r.record.ranges.len(),
                r.record.payload_len()
            );
        }
        if !t.revokes.is_empty() {
            let _ = writeln!(out, "  revoked {:?}", t.revokes);
        }
    }
    let _ = writeln!(out, "end of log: {}", scan.end_reason);
    if !sb.has_compat(features::COMPAT_FAST_COMMIT) {
        let _ = writeln!(
            out,
            "no fast-commit area: every fsync commits the running transaction (jext mkfs \
             makes one unless --no-fast-commit; mkfs.ext4 needs -O fast_commit)"
        );
    }
    if jsb.has_incompat(INCOMPAT_JEXT_PERCORE) {
        rings(&scan, &mut out);
        return Ok(out);
    }
    let fc = &scan.fast_commits;
    let _ = writeln!(
        out,
        "fast commits after the log: {} ({} blocks, {} records){}",
        fc.fast_commits,
        fc.blocks_used,
        fc.records.len(),
        then_why(fc)
    );
    for record in &fc.records {
        let _ = writeln!(out, "  {record:?}");
    }
    Ok(out)
}

/// The live i-transactions of `ijournal=percore`, ring by ring, and what replays.
fn rings(scan: &jext_journal::ScanReport, out: &mut String) {
    let fc = &scan.fast_commits;
    let _ = writeln!(
        out,
        "per-core i-transactions of tid {} (jext-private; Linux refuses this journal): {} \
         valid, {} replay in sub-tid order ({} blocks, {} records){}",
        scan.end_tid,
        scan.rings.len(),
        fc.fast_commits,
        fc.blocks_used,
        fc.records.len(),
        then_why(fc)
    );
    let mut entries: Vec<_> = scan.rings.iter().collect();
    entries.sort_by_key(|e| {
        (
            e.itransaction.nr_rings,
            e.itransaction.ring,
            e.journal_block,
        )
    });
    let mut ring = None;
    for e in entries {
        let it = &e.itransaction;
        if ring != Some((it.nr_rings, it.ring)) {
            ring = Some((it.nr_rings, it.ring));
            let _ = writeln!(out, "ring {} of {}:", it.ring, it.nr_rings);
        }
        let _ = writeln!(
            out,
            "  sub-tid {} (first of the tid {}) at journal block {}, {} block(s), {} records",
            it.sub_tid,
            it.first_sub_tid,
            e.journal_block,
            e.blocks,
            it.records.len()
        );
        for record in &it.records {
            let _ = writeln!(out, "    {record:?}");
        }
    }
}

/// ", then WHY" when the scan stopped for a reason worth saying.
fn then_why(fc: &jext_journal::format::fast_commit::FastCommitScan) -> String {
    fc.stopped_by
        .as_ref()
        .map_or(String::new(), |why| format!(", then {why}"))
}
