//! The format module against images made by `mkfs.ext4` and written by Linux: every
//! structure the kernel wrote decodes, every checksum verifies, structures re-encode to the
//! kernel's bytes where jext lays them out as the kernel does, every htree name hashes into
//! the leaf its index names (for all six hash variants), and a flipped byte in each
//! structure is reported with the structure's name and location.

mod common;

use common::{mkfs_ext4, run, LoopMount, Scratch};
use jext_fs::format::bitmap::{self, BitmapKind};
use jext_fs::format::csum::inode_seed;
use jext_fs::format::extent::{self, Entries, Extent, Node};
use jext_fs::format::group_desc::{GroupDesc, FLAG_BLOCK_UNINIT, FLAG_INODE_UNINIT};
use jext_fs::format::indirect::{self, ResizeLayout};
use jext_fs::format::inode::{flags, Inode};
use jext_fs::format::superblock::{Superblock, FLAG_UNSIGNED_HASH};
use jext_fs::format::{dirent, hash, htree, xattr, FormatError, Location};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const RESIZE_INO: u32 = 7;

/// A whole image in memory with just enough of ext4 to find things.
struct Image {
    bytes: Vec<u8>,
    sb: Superblock,
    bs: usize,
    /// The metadata_csum seed, if the file system has checksums.
    seed: Option<u32>,
}

impl Image {
    fn load(path: &Path) -> Image {
        let bytes = std::fs::read(path).unwrap();
        let raw_sb = &bytes[1024..2048];
        let sb = Superblock::decode(raw_sb, Location::Superblock { group: 0 }).unwrap();
        assert_eq!(
            &sb.encode()[..],
            raw_sb,
            "the superblock re-encodes byte for byte"
        );
        sb.check_features(true)
            .expect("mkfs.ext4 defaults are all supported");
        let bs = sb.block_size() as usize;
        let seed = sb.has_metadata_csum().then(|| sb.csum_seed());
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

    fn desc_bytes(&self, group: u32) -> &[u8] {
        let ds = self.sb.desc_size() as usize;
        let off = (self.sb.first_data_block() as usize + 1) * self.bs + group as usize * ds;
        &self.bytes[off..off + ds]
    }

    fn desc(&self, group: u32) -> GroupDesc {
        GroupDesc::decode(self.desc_bytes(group), group, self.sb.group_csum()).unwrap()
    }

    fn inode_offset(&self, ino: u32) -> usize {
        let ipg = self.sb.inodes_per_group();
        let desc = self.desc((ino - 1) / ipg);
        desc.inode_table as usize * self.bs
            + ((ino - 1) % ipg) as usize * self.sb.inode_size() as usize
    }

    fn inode_bytes(&self, ino: u32) -> &[u8] {
        let off = self.inode_offset(ino);
        &self.bytes[off..off + self.sb.inode_size() as usize]
    }

    /// Decodes inode `ino` and checks that it re-encodes to the kernel's bytes.
    fn inode(&self, ino: u32) -> Inode {
        let raw = self.inode_bytes(ino);
        let inode = Inode::decode(raw, ino, self.seed).unwrap();
        assert_eq!(inode.encode(ino, self.seed), raw, "inode {ino} re-encodes");
        inode
    }

    fn inode_seed(&self, ino: u32) -> Option<u32> {
        self.seed
            .map(|seed| inode_seed(seed, ino, self.inode(ino).generation()))
    }

    /// Every leaf extent of `ino`, in order, checking (and re-encoding) every node.
    fn extents(&self, ino: u32) -> Vec<Extent> {
        let inode = self.inode(ino);
        assert!(
            inode.flags() & flags::EXTENTS != 0,
            "inode {ino} uses extents"
        );
        let root = Node::decode(inode.i_block(), true, Location::InodeBlockArea { ino }).unwrap();
        let mut again = [0u8; 60];
        root.encode(&mut again, true, None);
        let used = used_node_bytes(&root);
        assert_eq!(
            &again[..used],
            &inode.i_block()[..used],
            "extent root of {ino}"
        );
        let mut out = Vec::new();
        self.walk(&root, ino, &mut out);
        out
    }

    fn walk(&self, node: &Node, ino: u32, out: &mut Vec<Extent>) {
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
                    let iseed = self.inode_seed(ino);
                    if let Some(iseed) = iseed {
                        extent::verify_block_checksum(block, iseed, loc).unwrap();
                    }
                    let mut again = vec![0u8; self.bs];
                    child.encode(&mut again, false, iseed);
                    let used = used_node_bytes(&child);
                    assert!(again[..used] == block[..used], "extent block {}", idx.child);
                    assert_eq!(child.depth + 1, node.depth);
                    self.walk(&child, ino, out);
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

    /// True for the blocks of an indexed directory that hold index, not entries.
    fn is_index_block(&self, block: &[u8], logical: u32) -> bool {
        let fake_entry = u32::from_le_bytes(block[..4].try_into().unwrap()) == 0
            && dirent::rec_len_from_disk(u16::from_le_bytes([block[4], block[5]]), self.bs)
                == self.bs;
        logical == 0 || fake_entry
    }

    /// Names in a linear directory (or the leaves of an htree one), checking checksums.
    fn dir_names(&self, ino: u32) -> Vec<(Vec<u8>, u32)> {
        let inode = self.inode(ino);
        let indexed = inode.flags() & flags::INDEX != 0;
        let blocks = inode.size() as usize / self.bs;
        let mut names = Vec::new();
        for logical in 0..blocks as u32 {
            let phys = self.file_block(ino, logical).unwrap();
            let block = self.block(phys);
            if indexed && self.is_index_block(block, logical) {
                continue;
            }
            for e in self.dir_block(ino, phys) {
                if e.inode != 0 {
                    names.push((e.name, e.inode));
                }
            }
        }
        names
    }

    /// The records of one directory block, checksum verified.
    fn dir_block(&self, ino: u32, phys: u64) -> Vec<dirent::RawEntry> {
        let loc = Location::Block {
            block: phys,
            ino: Some(ino),
        };
        let block = self.block(phys);
        if let Some(iseed) = self.inode_seed(ino) {
            dirent::verify_checksum(block, iseed, loc).unwrap();
        }
        dirent::parse_block(block, self.seed.is_some(), loc).unwrap()
    }

    fn lookup(&self, dir: u32, name: &str) -> u32 {
        self.dir_names(dir)
            .into_iter()
            .find(|(n, _)| n == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not found"))
            .1
    }
}

/// The bytes of a node that carry meaning. Linux leaves stale entries past `eh_entries`
/// (when it moves the root's entries down a level, or removes entries), which jext's
/// encoder writes as zeros; only the header and the live entries re-encode exactly.
fn used_node_bytes(node: &Node) -> usize {
    extent::HEADER_SIZE + node.len() * extent::ENTRY_SIZE
}

fn check_groups(img: &Image) {
    let full_width = img.sb.desc_size() >= 64;
    for group in 0..img.sb.group_count() {
        let desc = img.desc(group);
        desc.check_against(group, &img.sb).unwrap();
        let mut again = vec![0u8; img.sb.desc_size() as usize];
        desc.encode(&mut again, group, img.sb.group_csum());
        assert_eq!(
            again,
            img.desc_bytes(group),
            "descriptor {group} re-encodes"
        );
        let Some(seed) = img.seed else { continue };
        for (kind, uninit, at, bits, stored) in [
            (
                BitmapKind::Block,
                FLAG_BLOCK_UNINIT,
                desc.block_bitmap,
                img.sb.blocks_per_group(),
                desc.block_bitmap_csum,
            ),
            (
                BitmapKind::Inode,
                FLAG_INODE_UNINIT,
                desc.inode_bitmap,
                img.sb.inodes_per_group(),
                desc.inode_bitmap_csum,
            ),
        ] {
            if !desc.has_flag(uninit) {
                let loc = Location::Block {
                    block: at,
                    ino: None,
                };
                bitmap::verify_checksum(kind, img.block(at), bits, seed, stored, full_width, loc)
                    .unwrap();
            }
        }
    }
}

/// Backups sit exactly in the groups the superblock says, each naming its own group.
fn check_backup_superblocks(img: &Image) {
    for group in 1..img.sb.group_count() {
        let first = u64::from(img.sb.first_data_block())
            + u64::from(group) * u64::from(img.sb.blocks_per_group());
        let bytes = &img.block(first)[..1024];
        if img.sb.has_superblock_in_group(group) {
            let backup = Superblock::decode(bytes, Location::Superblock { group }).unwrap();
            assert_eq!(u32::from(backup.block_group_nr()), group);
            assert_eq!(backup.uuid(), img.sb.uuid());
        } else {
            assert_ne!(
                &bytes[0x38..0x3A],
                &[0x53, 0xEF],
                "no superblock in group {group}"
            );
        }
    }
}

/// The resize inode maps exactly the layout [`ResizeLayout`] describes.
fn check_resize_inode(img: &Image) {
    assert!(img.sb.has_resize_inode());
    let inode = img.inode(RESIZE_INO);
    let bs = img.bs as u32;
    let gdt_blocks = (img.sb.group_count() * img.sb.desc_size()).div_ceil(bs);
    let layout = ResizeLayout::new(
        bs,
        img.sb.first_data_block(),
        gdt_blocks,
        u32::from(img.sb.reserved_gdt_blocks()),
        img.sb.blocks_per_group(),
        &img.sb.backup_groups(),
    );
    let slots = indirect::decode_slots(inode.i_block());
    let mut expected = [0u32; indirect::SLOTS];
    expected[indirect::DIND_SLOT] = slots[indirect::DIND_SLOT];
    assert_eq!(slots, expected, "only the DIND slot is set");
    let mut block = vec![0u8; img.bs];
    layout.encode_dind(&mut block);
    assert!(
        block == img.block(u64::from(slots[indirect::DIND_SLOT])),
        "DIND block"
    );
    for (i, &(_, primary)) in layout.dind_slots.iter().enumerate() {
        layout.encode_copy_list(i, &mut block);
        assert!(
            block == img.block(u64::from(primary)),
            "copy list in block {primary}"
        );
    }
    let read = |n: u64| -> Result<&[u8], FormatError> { Ok(img.block(n)) };
    for (i, copies) in layout.copies.iter().enumerate() {
        for (k, &copy) in copies.iter().enumerate() {
            let logical = layout.copy_logical(i, k);
            let mapped = indirect::lookup(
                inode.i_block(),
                logical,
                bs,
                img.sb.blocks_count(),
                RESIZE_INO,
                read,
            );
            assert_eq!(mapped, Ok(Some(u64::from(copy))));
        }
    }
    assert_eq!(inode.size(), layout.size_bytes());
    assert_eq!(
        inode.blocks_512(bs),
        layout.owned_blocks() * u64::from(bs / 512)
    );
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
    check_groups(&img);
    check_backup_superblocks(&img);
    check_resize_inode(&img);

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

    check_xattrs(&img, small);
    let many = img.lookup(root, "many");
    assert_eq!(check_htree(&img, many), 2000);
    check_corruption_is_reported(&img, small, frag, many);
}

fn check_xattrs(img: &Image, ino: u32) {
    let inode = img.inode(ino);
    let area = inode.xattr_area();
    let in_inode = xattr::decode_inode_area(area, ino).unwrap();
    let mut again = vec![0u8; area.len()];
    assert!(xattr::encode_inode_area(&mut again, &in_inode));
    assert_eq!(
        again, area,
        "in-inode xattrs re-encode as Linux laid them out"
    );

    let acl = inode.file_acl();
    let (header, in_block) = xattr::decode_block(img.block(acl), acl, img.seed).unwrap();
    assert_eq!(header.refcount, 1);
    assert_eq!(header.hash, xattr::block_hash(&in_block));
    let mut block = vec![0u8; img.bs];
    assert!(xattr::encode_block(&mut block, 1, &in_block, acl, img.seed));
    assert_eq!(
        xattr::decode_block(&block, acl, img.seed).unwrap(),
        (header, in_block.clone())
    );

    let all: Vec<Vec<u8>> = in_inode
        .iter()
        .chain(&in_block)
        .map(|e| e.full_name())
        .collect();
    for name in ["user.small", "user.large", "trusted.t"] {
        assert!(all.contains(&name.as_bytes().to_vec()), "{name} in {all:?}");
    }
}

/// Checks an htree directory's index and that every name hashes into the leaf its index
/// entry names; returns the number of names.
fn check_htree(img: &Image, dir: u32) -> usize {
    let inode = img.inode(dir);
    assert!(
        inode.flags() & flags::INDEX != 0,
        "directory {dir} has an htree index"
    );
    let iseed = img
        .inode_seed(dir)
        .expect("these images have metadata_csum");
    let root_phys = img.file_block(dir, 0).unwrap();
    let root_block = img.block(root_phys);
    let loc = Location::Block {
        block: root_phys,
        ino: Some(dir),
    };
    let (info, entries) = htree::decode_root(root_block, true, loc).unwrap();
    htree::verify_checksum(root_block, htree::ROOT_COUNT_OFFSET, iseed, loc).unwrap();
    let mut again = root_block.to_vec();
    htree::encode_root(&mut again, &info, &entries, true);
    htree::set_checksum(&mut again, htree::ROOT_COUNT_OFFSET, iseed);
    assert_eq!(
        htree::decode_root(&again, true, loc).unwrap(),
        (info, entries.clone())
    );
    htree::verify_checksum(&again, htree::ROOT_COUNT_OFFSET, iseed, loc).unwrap();

    let unsigned = img.sb.flags() & FLAG_UNSIGNED_HASH != 0;
    let version = info.hash_version + if unsigned { 3 } else { 0 };
    let mut leaves = Vec::new();
    let ranges = |list: &[htree::DxEntry], upper: u64, leaves: &mut Vec<(u32, u64, u64)>| {
        for (i, e) in list.iter().enumerate() {
            let hi = list.get(i + 1).map_or(upper, |n| u64::from(n.hash & !1));
            leaves.push((e.block, u64::from(e.hash & !1), hi));
        }
    };
    if info.indirect_levels == 0 {
        ranges(&entries, 1 << 32, &mut leaves);
    } else {
        for (i, e) in entries.iter().enumerate() {
            let hi = entries
                .get(i + 1)
                .map_or(1 << 32, |n| u64::from(n.hash & !1));
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
        for e in img.dir_block(dir, phys) {
            if e.inode == 0 {
                continue;
            }
            let (h, _) = hash::dirhash(&e.name, version, img.sb.hash_seed()).unwrap();
            assert!(
                u64::from(h) >= lo && u64::from(h) < hi,
                "{:?} hash {h:#x} outside [{lo:#x}, {hi:#x}) with hash version {version}",
                String::from_utf8_lossy(&e.name)
            );
            seen += 1;
        }
    }
    seen
}

/// Flips one byte of each structure and checks the decoder (or the checksum verifier)
/// names that structure and where it is.
fn check_corruption_is_reported(img: &Image, file: u32, frag: u32, htree_dir: u32) {
    let seed = img.seed.unwrap();
    let mut sb_bytes = img.bytes[1024..2048].to_vec();
    sb_bytes[0x10] ^= 0x40;
    let err = Superblock::decode(&sb_bytes, Location::Superblock { group: 0 }).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("superblock", Location::Superblock { group: 0 })
    );

    let mut desc = img.desc_bytes(0).to_vec();
    desc[0x0C] ^= 1;
    let err = GroupDesc::decode(&desc, 0, img.sb.group_csum()).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("group descriptor", Location::GroupDesc { group: 0 })
    );

    let d0 = img.desc(0);
    let mut inode_bitmap = img.block(d0.inode_bitmap).to_vec();
    inode_bitmap[3] ^= 0x10;
    let loc = Location::Block {
        block: d0.inode_bitmap,
        ino: None,
    };
    let err = bitmap::verify_checksum(
        BitmapKind::Inode,
        &inode_bitmap,
        img.sb.inodes_per_group(),
        seed,
        d0.inode_bitmap_csum,
        true,
        loc,
    )
    .unwrap_err();
    assert_eq!((err.structure, err.location), ("inode bitmap", loc));

    let mut raw = img.inode_bytes(file).to_vec();
    raw[0x04] ^= 1;
    let err = Inode::decode(&raw, file, Some(seed)).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("inode", Location::Inode { ino: file })
    );

    let frag_inode = img.inode(frag);
    let mut root = frag_inode.i_block().to_vec();
    root[0] = 0;
    let err = Node::decode(&root, true, Location::InodeBlockArea { ino: frag }).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("extent node", Location::InodeBlockArea { ino: frag })
    );
    let root_node = Node::decode(
        frag_inode.i_block(),
        true,
        Location::InodeBlockArea { ino: frag },
    )
    .unwrap();
    let Entries::Index(index) = root_node.entries else {
        panic!("frag.bin has an index root")
    };
    let child = index[0].child;
    let mut leaf = img.block(child).to_vec();
    leaf[20] ^= 1;
    let loc = Location::Block {
        block: child,
        ino: Some(frag),
    };
    let iseed = img.inode_seed(frag).unwrap();
    let err = extent::verify_block_checksum(&leaf, iseed, loc).unwrap_err();
    assert_eq!((err.structure, err.location), ("extent block", loc));

    let dir_phys = img.file_block(2, 0).unwrap();
    let mut block = img.block(dir_phys).to_vec();
    block[4] = 3;
    let loc = Location::Block {
        block: dir_phys,
        ino: Some(2),
    };
    let err = dirent::parse_block(&block, true, loc).unwrap_err();
    assert_eq!((err.structure, err.location), ("directory entry", loc));
    block[4] = img.block(dir_phys)[4];
    block[30] ^= 1;
    let err = dirent::verify_checksum(&block, img.inode_seed(2).unwrap(), loc).unwrap_err();
    assert_eq!((err.structure, err.location), ("directory block", loc));

    let htree_phys = img.file_block(htree_dir, 0).unwrap();
    let mut dx_root = img.block(htree_phys).to_vec();
    dx_root[htree::ROOT_COUNT_OFFSET + 12] ^= 1;
    let loc = Location::Block {
        block: htree_phys,
        ino: Some(htree_dir),
    };
    let iseed = img.inode_seed(htree_dir).unwrap();
    let err = htree::verify_checksum(&dx_root, htree::ROOT_COUNT_OFFSET, iseed, loc).unwrap_err();
    assert_eq!((err.structure, err.location), ("htree index", loc));

    let inode = img.inode(file);
    let mut area = inode.xattr_area().to_vec();
    area[4 + 2] = 2; // e_value_offs now points into the entry list
    let err = xattr::decode_inode_area(&area, file).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        ("in-inode xattr", Location::InodeXattrArea { ino: file })
    );
    let acl = inode.file_acl();
    let mut xblock = img.block(acl).to_vec();
    let last = xblock.len() - 1;
    xblock[last] ^= 1;
    let err = xattr::decode_block(&xblock, acl, Some(seed)).unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        (
            "xattr block",
            Location::Block {
                block: acl,
                ino: None
            }
        )
    );

    let resize = img.inode(RESIZE_INO);
    let dind = u64::from(indirect::decode_slots(resize.i_block())[indirect::DIND_SLOT]);
    let mut bad_dind = img.block(dind).to_vec();
    let slot = bad_dind.iter().position(|&b| b != 0).unwrap() / 4 * 4;
    bad_dind[slot + 3] = 0xFF;
    let read = |n: u64| -> Result<Vec<u8>, FormatError> {
        Ok(if n == dind {
            bad_dind.clone()
        } else {
            img.block(n).to_vec()
        })
    };
    let per_block = img.bs as u32 / 4;
    let logical = 12 + per_block + (slot as u32 / 4) * per_block;
    let err = indirect::lookup(
        resize.i_block(),
        logical,
        img.bs as u32,
        img.sb.blocks_count(),
        RESIZE_INO,
        read,
    )
    .unwrap_err();
    assert_eq!(
        (err.structure, err.location),
        (
            "indirect block map",
            Location::Block {
                block: dind,
                ino: Some(RESIZE_INO)
            }
        )
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

/// One directory per hash variant, made by Linux after switching the default hash and
/// the signedness flag with debugfs; names carry bytes >= 0x80, where signed and unsigned
/// hashing differ.
#[test]
fn htree_names_hash_into_their_leaves_for_every_hash_variant() {
    let scratch = Scratch::new("fmthash");
    let image = scratch.path("linux.img");
    mkfs_ext4(&image, 64, &["-b", "2048", "-N", "8192"]);
    let image_arg = image.to_str().unwrap();
    for alg in ["legacy", "half_md4", "tea"] {
        for (flag, signedness) in [(1, "signed"), (2, "unsigned")] {
            run(
                "debugfs",
                &[
                    "-w",
                    "-R",
                    &format!("ssv def_hash_version {alg}"),
                    image_arg,
                ],
            );
            run(
                "debugfs",
                &["-w", "-R", &format!("ssv flags {flag}"), image_arg],
            );
            let dir_name = format!("{alg}-{signedness}");
            let mount = LoopMount::new(&image, &scratch.path("mnt"), "");
            let dir = mount.path(&dir_name);
            std::fs::create_dir(&dir).unwrap();
            for i in 0..400 {
                let mut name = "été-".as_bytes().to_vec();
                name.extend_from_slice(format!("{i:04}").as_bytes());
                name.extend_from_slice(&[b'-', 0xFF, 0x80 + (i % 64) as u8, b'~']);
                std::fs::write(dir.join(std::ffi::OsStr::from_bytes(&name)), b"").unwrap();
            }
            mount.unmount();
            let img = Image::load(&image);
            let ino = img.lookup(2, &dir_name);
            let root_phys = img.file_block(ino, 0).unwrap();
            let loc = Location::Block {
                block: root_phys,
                ino: Some(ino),
            };
            let (info, _) = htree::decode_root(img.block(root_phys), true, loc).unwrap();
            let expected_version = match alg {
                "legacy" => hash::HASH_LEGACY,
                "half_md4" => hash::HASH_HALF_MD4,
                _ => hash::HASH_TEA,
            };
            assert_eq!(info.hash_version, expected_version);
            assert_eq!(check_htree(&img, ino), 400, "{dir_name}");
        }
    }
}

/// 64 KiB blocks (mkfs makes them; Linux on 4 KiB pages cannot mount them): `rec_len`
/// of a whole empty block is stored as 65535, with and without checksum tails.
#[test]
fn mkfs_images_with_64k_blocks_decode() {
    let scratch = Scratch::new("fmt64k");
    for (args, tail) in [
        (&["-b", "65536", "-O", "^metadata_csum"][..], false),
        (&["-b", "65536"][..], true),
    ] {
        let image = scratch.path("mkfs.img");
        mkfs_ext4(&image, 256, args);
        let img = Image::load(&image);
        assert_eq!((img.bs, img.seed.is_some()), (65536, tail));
        check_groups(&img);
        check_backup_superblocks(&img);
        check_resize_inode(&img);
        let lost_found = img.lookup(2, "lost+found");
        let second = img.file_block(lost_found, 1).unwrap();
        let entries = img.dir_block(lost_found, second);
        let end = dirent::entries_end(65536, tail);
        assert_eq!(entries.len(), 1);
        assert_eq!((entries[0].inode, entries[0].rec_len), (0, end));
        let stored = u16::from_le_bytes([img.block(second)[4], img.block(second)[5]]);
        assert_eq!(stored, if tail { 65524 } else { 65535 });
    }
}

/// 128-byte inodes (no extra fields: checksum low half only) and the older crc16 group
/// descriptor checksum (`uninit_bg` without metadata_csum).
#[test]
fn mkfs_images_with_small_inodes_and_crc16_group_checksums_decode() {
    let scratch = Scratch::new("fmtsmall");
    let image = scratch.path("mkfs.img");
    mkfs_ext4(&image, 32, &["-I", "128"]);
    let img = Image::load(&image);
    assert_eq!(img.sb.inode_size(), 128);
    check_groups(&img);
    let root = img.inode(2);
    assert_eq!(root.extra_isize(), 0);
    assert!(root.xattr_area().is_empty());
    assert!(img.dir_names(2).iter().any(|(n, _)| n == b"lost+found"));
    let mut raw = img.inode_bytes(2).to_vec();
    raw[0x10] ^= 1;
    assert!(Inode::decode(&raw, 2, img.seed).is_err());

    mkfs_ext4(&image, 32, &["-O", "^metadata_csum,uninit_bg"]);
    let img = Image::load(&image);
    assert!(img.sb.has_gdt_csum() && img.seed.is_none());
    check_groups(&img);
    let mut desc = img.desc_bytes(1).to_vec();
    desc[0x0E] ^= 1;
    let err = GroupDesc::decode(&desc, 1, img.sb.group_csum()).unwrap_err();
    assert_eq!(err.location, Location::GroupDesc { group: 1 });
    assert!(img.dir_names(2).iter().any(|(n, _)| n == b"lost+found"));
}
