//! The format module against images made and written by Linux: every structure the
//! kernel wrote decodes, every checksum verifies, every htree name hashes into the leaf its
//! index names, and a flipped byte in each structure is reported with its location.

mod common;

use common::{mkfs_ext4, run, LoopMount, Scratch};
use jext_fs::format::csum::inode_seed;
use jext_fs::format::extent::{self, Entries, Extent, Node};
use jext_fs::format::group_desc::{GroupCsum, GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use jext_fs::format::inode::{flags, Inode};
use jext_fs::format::superblock::{Superblock, FLAG_UNSIGNED_HASH};
use jext_fs::format::{bitmap, dirent, hash, htree, xattr, Location};
use std::path::Path;

/// A whole image in memory with just enough of ext4 to find things.
struct Image {
    bytes: Vec<u8>,
    sb: Superblock,
    bs: usize,
    seed: u32,
}

impl Image {
    fn load(path: &Path) -> Image {
        let bytes = std::fs::read(path).unwrap();
        let sb = Superblock::decode(&bytes[1024..2048], Location::Superblock { group: 0 }).unwrap();
        assert_eq!(
            sb.unsupported_incompat(),
            0,
            "mkfs.ext4 defaults are all supported"
        );
        assert_eq!(sb.unsupported_ro_compat(), 0);
        let bs = sb.block_size() as usize;
        let seed = sb.csum_seed();
        Image {
            bytes,
            sb,
            bs,
            seed,
        }
    }

    fn block(&self, n: u64) -> &[u8] {
        &self.bytes[n as usize * self.bs..(n as usize + 1) * self.bs]
    }

    fn desc(&self, group: u32) -> GroupDesc {
        let ds = self.sb.desc_size() as usize;
        let gdt = self.sb.first_data_block() as usize + 1;
        let off = gdt * self.bs + group as usize * ds;
        GroupDesc::decode(
            &self.bytes[off..off + ds],
            group,
            GroupCsum::Crc32c { fs_seed: self.seed },
        )
        .unwrap()
    }

    fn inode_offset(&self, ino: u32) -> usize {
        let ipg = self.sb.inodes_per_group();
        let desc = self.desc((ino - 1) / ipg);
        desc.inode_table as usize * self.bs
            + ((ino - 1) % ipg) as usize * self.sb.inode_size() as usize
    }

    fn inode(&self, ino: u32) -> Inode {
        let off = self.inode_offset(ino);
        Inode::decode(
            &self.bytes[off..off + self.sb.inode_size() as usize],
            ino,
            Some(self.seed),
        )
        .unwrap()
    }

    /// Every leaf extent of `ino`, in order, checking every node on the way.
    fn extents(&self, ino: u32) -> Vec<Extent> {
        let inode = self.inode(ino);
        assert!(
            inode.flags() & flags::EXTENTS != 0,
            "inode {ino} uses extents"
        );
        let iseed = inode_seed(self.seed, ino, inode.generation());
        let root = Node::decode(inode.i_block(), true, Location::InodeBlockArea { ino }).unwrap();
        let mut out = Vec::new();
        self.walk(&root, iseed, ino, &mut out);
        out
    }

    fn walk(&self, node: &Node, iseed: u32, ino: u32, out: &mut Vec<Extent>) {
        match &node.entries {
            Entries::Leaf(list) => out.extend(list.iter().copied()),
            Entries::Index(list) => {
                for idx in list {
                    let loc = Location::Block {
                        block: idx.child,
                        ino: Some(ino),
                    };
                    let block = self.block(idx.child);
                    let child = Node::decode(block, false, loc).unwrap();
                    extent::verify_block_checksum(block, iseed, loc).unwrap();
                    assert_eq!(child.depth + 1, node.depth);
                    self.walk(&child, iseed, ino, out);
                }
            }
        }
    }

    fn file_block(&self, ino: u32, logical: u32) -> Option<u64> {
        self.extents(ino)
            .into_iter()
            .find(|e| logical >= e.logical && u64::from(logical) < e.end())
            .map(|e| e.start + u64::from(logical - e.logical))
    }

    fn read_file(&self, ino: u32) -> Vec<u8> {
        let size = self.inode(ino).size() as usize;
        let mut data = vec![0u8; size];
        for e in self.extents(ino) {
            for i in 0..e.len {
                let at = (e.logical + i) as usize * self.bs;
                if at >= size || e.unwritten {
                    continue;
                }
                let n = self.bs.min(size - at);
                data[at..at + n].copy_from_slice(&self.block(e.start + u64::from(i))[..n]);
            }
        }
        data
    }

    /// Names in a linear directory (or the leaves of an htree one), checking checksums.
    fn dir_names(&self, ino: u32) -> Vec<(Vec<u8>, u32)> {
        let inode = self.inode(ino);
        let iseed = inode_seed(self.seed, ino, inode.generation());
        let indexed = inode.flags() & flags::INDEX != 0;
        let blocks = inode.size() as usize / self.bs;
        let mut names = Vec::new();
        for logical in 0..blocks as u32 {
            let phys = self.file_block(ino, logical).unwrap();
            let block = self.block(phys);
            let loc = Location::Block {
                block: phys,
                ino: Some(ino),
            };
            if indexed
                && (logical == 0
                    || u32::from_le_bytes(block[..4].try_into().unwrap()) == 0
                        && dirent::rec_len_from_disk(
                            u16::from_le_bytes([block[4], block[5]]),
                            self.bs,
                        ) == self.bs)
            {
                continue;
            }
            dirent::verify_checksum(block, iseed, loc).unwrap();
            for e in dirent::parse_block(block, true, loc).unwrap() {
                if e.inode != 0 {
                    names.push((e.name, e.inode));
                }
            }
        }
        names
    }

    fn lookup(&self, dir: u32, name: &str) -> u32 {
        self.dir_names(dir)
            .into_iter()
            .find(|(n, _)| n == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not found"))
            .1
    }
}

fn populate(mount: &LoopMount) {
    let p = |rel: &str| mount.path(rel);
    std::fs::write(p("small.txt"), b"hello from linux\n").unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(p("big.bin"), &big).unwrap();
    // Many small extents: write every other block, so the tree needs index blocks.
    let frag = std::fs::File::create(p("frag.bin")).unwrap();
    for i in 0..400u64 {
        use std::os::unix::fs::FileExt;
        frag.write_all_at(&[i as u8; 1024], i * 8192).unwrap();
    }
    drop(frag);
    std::os::unix::fs::symlink("small.txt", p("fast-link")).unwrap();
    std::os::unix::fs::symlink("x".repeat(200), p("slow-link")).unwrap();
    std::fs::create_dir(p("many")).unwrap();
    for i in 0..2000 {
        std::fs::write(p(&format!("many/file-with-a-long-name-{i:05}")), b"").unwrap();
    }
    let script = format!(
        "import os; os.setxattr('{0}', 'user.small', b'v'); os.setxattr('{0}', 'user.large', b'L' * 700); os.setxattr('{0}', 'trusted.t', b'tt')",
        p("small.txt").display()
    );
    run("python3", &["-c", &script]);
    run("sync", &[]);
}

fn check_image(mkfs_args: &[&str], size_mib: u64, name: &str) {
    let scratch = Scratch::new(name);
    let image = scratch.path("linux.img");
    mkfs_ext4(&image, size_mib, mkfs_args);
    let mount = LoopMount::new(&image, &scratch.path("mnt"), "");
    populate(&mount);
    mount.unmount();

    let img = Image::load(&image);
    for group in 0..img.sb.group_count() {
        let desc = img.desc(group);
        let ds = img.sb.desc_size();
        if !desc.has_flag(FLAG_BLOCK_UNINIT) {
            let bits = img.sb.blocks_per_group();
            let csum = bitmap::checksum(img.seed, img.block(desc.block_bitmap), bits);
            assert_eq!(
                desc.block_bitmap_csum,
                if ds >= 64 { csum } else { csum & 0xFFFF },
                "group {group} block bitmap"
            );
        }
        if !desc.has_flag(FLAG_INODE_UNINIT) {
            let bits = img.sb.inodes_per_group();
            let csum = bitmap::checksum(img.seed, img.block(desc.inode_bitmap), bits);
            assert_eq!(
                desc.inode_bitmap_csum,
                if ds >= 64 { csum } else { csum & 0xFFFF },
                "group {group} inode bitmap"
            );
        }
    }

    let root = 2;
    let small = img.lookup(root, "small.txt");
    assert_eq!(img.read_file(small), b"hello from linux\n");
    let big = img.lookup(root, "big.bin");
    let expected: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    assert!(
        img.read_file(big) == expected,
        "big.bin reads back byte-exact"
    );
    let frag = img.lookup(root, "frag.bin");
    let frag_root = Node::decode(
        img.inode(frag).i_block(),
        true,
        Location::InodeBlockArea { ino: frag },
    )
    .unwrap();
    assert!(frag_root.depth >= 1, "a fragmented file has index blocks");
    assert_eq!(img.extents(frag).len(), 400);

    let fast = img.inode(img.lookup(root, "fast-link"));
    assert_eq!(&fast.i_block()[..9], b"small.txt");
    assert_eq!(
        fast.flags() & flags::EXTENTS,
        0,
        "fast symlinks store the target in i_block"
    );
    let slow = img.lookup(root, "slow-link");
    assert_eq!(img.read_file(slow), "x".repeat(200).as_bytes());

    let small_inode = img.inode(small);
    let in_inode = xattr::decode_inode_area(small_inode.xattr_area(), small).unwrap();
    let block_attrs = xattr::decode_block(
        img.block(small_inode.file_acl()),
        small_inode.file_acl(),
        Some(img.seed),
    )
    .unwrap()
    .1;
    let all: Vec<Vec<u8>> = in_inode
        .iter()
        .chain(&block_attrs)
        .map(|e| e.full_name())
        .collect();
    for name in ["user.small", "user.large", "trusted.t"] {
        assert!(all.contains(&name.as_bytes().to_vec()), "{name} in {all:?}");
    }

    check_htree(&img, img.lookup(root, "many"));
    check_corruption_is_reported(&img, small, frag);
}

fn check_htree(img: &Image, dir: u32) {
    let inode = img.inode(dir);
    assert!(
        inode.flags() & flags::INDEX != 0,
        "2000 entries make an htree"
    );
    let iseed = inode_seed(img.seed, dir, inode.generation());
    let root_phys = img.file_block(dir, 0).unwrap();
    let loc = Location::Block {
        block: root_phys,
        ino: Some(dir),
    };
    let (info, entries) = htree::decode_root(img.block(root_phys), true, loc).unwrap();
    htree::verify_checksum(img.block(root_phys), htree::ROOT_COUNT_OFFSET, iseed, loc).unwrap();
    let unsigned = img.sb.flags() & FLAG_UNSIGNED_HASH != 0;
    let version = info.hash_version + if unsigned { 3 } else { 0 };
    let mut leaves = Vec::new();
    let ranges = |list: &[htree::DxEntry], upper: u32, leaves: &mut Vec<(u32, u32, u32)>| {
        for (i, e) in list.iter().enumerate() {
            let hi = list.get(i + 1).map_or(upper, |n| n.hash & !1);
            leaves.push((e.block, e.hash & !1, hi));
        }
    };
    if info.indirect_levels == 0 {
        ranges(&entries, u32::MAX, &mut leaves);
    } else {
        for (i, e) in entries.iter().enumerate() {
            let hi = entries.get(i + 1).map_or(u32::MAX, |n| n.hash & !1);
            let phys = img.file_block(dir, e.block).unwrap();
            let nloc = Location::Block {
                block: phys,
                ino: Some(dir),
            };
            let node = htree::decode_node(img.block(phys), true, nloc).unwrap();
            htree::verify_checksum(img.block(phys), htree::NODE_COUNT_OFFSET, iseed, nloc).unwrap();
            ranges(&node, hi, &mut leaves);
        }
    }
    let mut seen = 0;
    for (logical, lo, hi) in leaves {
        let phys = img.file_block(dir, logical).unwrap();
        let lloc = Location::Block {
            block: phys,
            ino: Some(dir),
        };
        dirent::verify_checksum(img.block(phys), iseed, lloc).unwrap();
        for e in dirent::parse_block(img.block(phys), true, lloc).unwrap() {
            if e.inode == 0 {
                continue;
            }
            let (h, _) = hash::dirhash(&e.name, version, img.sb.hash_seed()).unwrap();
            assert!(
                h >= lo && (h < hi || hi == u32::MAX),
                "{:?} hash {h:#x} outside [{lo:#x}, {hi:#x})",
                String::from_utf8_lossy(&e.name)
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 2000);
}

fn check_corruption_is_reported(img: &Image, file: u32, frag: u32) {
    let mut sb_bytes = img.bytes[1024..2048].to_vec();
    sb_bytes[0x10] ^= 0x40;
    let err = Superblock::decode(&sb_bytes, Location::Superblock { group: 0 }).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("superblock", Location::Superblock { group: 0 })
    );

    let ds = img.sb.desc_size() as usize;
    let off = (img.sb.first_data_block() as usize + 1) * img.bs;
    let mut desc = img.bytes[off..off + ds].to_vec();
    desc[0x0C] ^= 1;
    let err = GroupDesc::decode(&desc, 0, GroupCsum::Crc32c { fs_seed: img.seed }).unwrap_err();
    assert_eq!(err.location, Location::GroupDesc { group: 0 });

    let ioff = img.inode_offset(file);
    let mut raw = img.bytes[ioff..ioff + 256].to_vec();
    raw[0x04] ^= 1;
    let err = Inode::decode(&raw, file, Some(img.seed)).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("inode", Location::Inode { ino: file })
    );

    let inode = img.inode(frag);
    let mut root = inode.i_block().to_vec();
    root[0] = 0;
    let err = Node::decode(&root, true, Location::InodeBlockArea { ino: frag }).unwrap_err();
    assert!(
        err.to_string().contains("extent node")
            && err.to_string().contains(&format!("inode {frag}")),
        "{err}"
    );

    let dir_phys = img.file_block(2, 0).unwrap();
    let mut block = img.block(dir_phys).to_vec();
    block[4] = 3;
    let loc = Location::Block {
        block: dir_phys,
        ino: Some(2),
    };
    let err = dirent::parse_block(&block, true, loc).unwrap_err();
    assert!(
        err.to_string().contains(&format!("block {dir_phys}")),
        "{err}"
    );
}

#[test]
fn linux_images_with_1k_blocks_decode() {
    check_image(&[], 64, "fmt1k");
}

#[test]
fn linux_images_with_4k_blocks_and_fast_commit_decode() {
    check_image(&["-b", "4096", "-O", "fast_commit"], 256, "fmt4k");
}
