//! jext's recovery against journals Linux wrote: copy an image while the kernel still has it
//! mounted (committed transactions not yet checkpointed), recover one copy with jext and
//! let the kernel recover another; the two must agree on every block outside the journal
//! and the superblock/descriptor areas the kernel rewrites at mount.

mod common;

use common::{area_runs, mkfs_ext4, run, LoopMount, Scratch};
use jext_device::{BlockDevice, FileDevice};
use jext_fs::format::extent::{Entries, Node};
use jext_fs::format::group_desc::{GroupCsum, GroupDesc};
use jext_fs::format::inode::Inode;
use jext_fs::format::superblock::Superblock;
use jext_fs::format::Location;
use jext_io::IoQueue;
use jext_journal::{recover, scan, JournalArea};
use std::path::Path;
use std::sync::Arc;

/// The journal inode's blocks, read with the format module.
fn journal_area(image: &Path) -> (JournalArea, Superblock) {
    let bytes = std::fs::read(image).unwrap();
    let sb = Superblock::decode(&bytes[1024..2048], Location::Superblock { group: 0 }).unwrap();
    let bs = sb.block_size() as usize;
    let ds = sb.desc_size() as usize;
    let gdt = (sb.first_data_block() as usize + 1) * bs;
    let desc = GroupDesc::decode(
        &bytes[gdt..gdt + ds],
        0,
        GroupCsum::Crc32c {
            fs_seed: sb.csum_seed(),
        },
    )
    .unwrap();
    let ino = sb.journal_inum();
    let off = desc.inode_table as usize * bs + (ino as usize - 1) * sb.inode_size() as usize;
    let inode = Inode::decode(
        &bytes[off..off + sb.inode_size() as usize],
        ino,
        Some(sb.csum_seed()),
    )
    .unwrap();
    let root = Node::decode(inode.i_block(), true, Location::InodeBlockArea { ino }).unwrap();
    let Entries::Leaf(extents) = root.entries else {
        panic!("mkfs journals fit the inode")
    };
    (
        JournalArea::new(bs as u32, area_runs(&extents)).unwrap(),
        sb,
    )
}

fn write_tree(mount: &LoopMount, round: usize) {
    for d in 0..5 {
        let dir = mount.path(&format!("d{round}-{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..40 {
            let data: Vec<u8> = (0..(f * 997 + round)).map(|i| (i + d) as u8).collect();
            std::fs::write(dir.join(format!("f{f}")), data).unwrap();
        }
    }
    let _ = std::fs::remove_dir_all(mount.path(&format!("d{}-0", round.saturating_sub(1))));
}

fn compare(mkfs_args: &[&str], size_mib: u64, name: &str) {
    let scratch = Scratch::new(name);
    let image = scratch.path("live.img");
    mkfs_ext4(&image, size_mib, mkfs_args);
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "commit=600");
    for round in 0..3 {
        write_tree(&mount, round);
        run("sync", &[]);
    }
    let (a, b) = (scratch.path("jext.img"), scratch.path("kernel.img"));
    std::fs::copy(&image, &a).unwrap();
    std::fs::copy(&image, &b).unwrap();
    mount.unmount();

    let (area, sb) = journal_area(&a);
    let dev = Arc::new(FileDevice::open(&a, false).unwrap());
    let io = IoQueue::new(dev.clone());
    let before = scan(&io, &area).unwrap();
    assert!(
        !before.transactions.is_empty(),
        "the copy holds committed transactions ({})",
        before.end_reason
    );
    let report = recover(&io, std::slice::from_ref(&area)).unwrap();
    assert_eq!(report.transactions, before.transactions.len());
    assert!(report.blocks_replayed > 0);
    drop(io);
    drop(dev);

    // The kernel replays its own copy at mount.
    LoopMount::new(&b, &scratch.path("mnt2"), "").unmount();

    let (ja, jb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let bs = sb.block_size() as usize;
    let skip = |block: u64| {
        let in_journal = area
            .runs()
            .iter()
            .any(|r| block >= r.physical && block < r.physical + u64::from(r.len));
        let meta_head = block <= u64::from(sb.first_data_block()) + 1;
        in_journal || meta_head
    };
    let mut differing = Vec::new();
    for block in 0..(ja.len() / bs) as u64 {
        let range = block as usize * bs..(block as usize + 1) * bs;
        if !skip(block) && ja[range.clone()] != jb[range] {
            differing.push(block);
        }
    }
    assert!(
        differing.is_empty(),
        "blocks differ after recovery: {:?}",
        &differing[..differing.len().min(20)]
    );
}

#[test]
fn recovery_of_a_kernel_journal_matches_the_kernel_with_1k_blocks() {
    compare(&[], 64, "kj1k");
}

#[test]
fn recovery_of_a_kernel_journal_matches_the_kernel_with_4k_blocks() {
    compare(&["-b", "4096"], 256, "kj4k");
}

#[test]
fn recovery_reports_what_the_kernel_logged() {
    let scratch = Scratch::new("kjscan");
    let image = scratch.path("live.img");
    mkfs_ext4(&image, 64, &[]);
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "commit=600");
    write_tree(&mount, 0);
    run("sync", &[]);
    let copy = scratch.path("copy.img");
    std::fs::copy(&image, &copy).unwrap();
    mount.unmount();
    let logdump = run("debugfs", &["-R", "logdump -a", copy.to_str().unwrap()]);
    let (area, _) = journal_area(&copy);
    let dev: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&copy, true).unwrap());
    let report = scan(&IoQueue::new(dev), &area).unwrap();
    for t in &report.transactions {
        assert!(
            logdump.contains(&format!(
                "Found expected sequence {}, type 1 (descriptor block)",
                t.tid
            )),
            "tid {} in:\n{logdump}",
            t.tid
        );
        for logged in &t.blocks {
            assert!(
                logdump.contains(&format!(
                    "FS block {} logged at journal block {}",
                    logged.tag.fs_block, logged.journal_block
                )),
                "block {} of tid {}",
                logged.tag.fs_block,
                t.tid
            );
        }
    }
}
