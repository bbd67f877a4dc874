//! The shape of one file system: block and group arithmetic derived once from the
//! superblock, so that no other module re-derives it.
//!
//! Everything here is pure arithmetic over numbers the superblock fixed at mkfs time. It
//! must agree with e2fsprogs and the kernel on where every group's metadata lives, since
//! the allocator uses it to know which blocks are never free.

/// Immutable geometry of a mounted file system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u32,
    pub blocks_count: u64,
    /// 1 for 1 KiB blocks (block 0 is the boot block), else 0.
    pub first_data_block: u64,
    pub blocks_per_group: u32,
    pub inodes_per_group: u32,
    pub inodes_count: u32,
    pub inode_size: u32,
    /// First inode number not reserved for the file system itself (11).
    pub first_ino: u32,
    pub group_count: u32,
    /// Bytes per group descriptor (32, or 64 with the 64bit feature).
    pub desc_size: u32,
    pub reserved_gdt_blocks: u32,
    /// Backup superblocks only in groups 0, 1 and powers of 3, 5, 7.
    pub sparse_super: bool,
    /// With sparse_super2: the only two groups holding backups (`s_backup_bgs`).
    pub backup_bgs: Option<[u32; 2]>,
    /// Groups per flex group (1 without flex_bg).
    pub flex_group_size: u32,
}

impl Geometry {
    pub fn descs_per_block(&self) -> u32 {
        self.block_size / self.desc_size
    }

    /// Blocks taken by the group descriptor table (without the reserved ones).
    pub fn gdt_blocks(&self) -> u32 {
        self.group_count.div_ceil(self.descs_per_block())
    }

    /// The first block of group `group`.
    pub fn group_first_block(&self, group: u32) -> u64 {
        self.first_data_block + u64::from(group) * u64::from(self.blocks_per_group)
    }

    /// Blocks in group `group` (the last group may be short).
    pub fn blocks_in_group(&self, group: u32) -> u32 {
        let start = self.group_first_block(group);
        (self.blocks_count - start).min(u64::from(self.blocks_per_group)) as u32
    }

    /// The group holding `block`.
    pub fn group_of_block(&self, block: u64) -> u32 {
        debug_assert!(block >= self.first_data_block && block < self.blocks_count);
        ((block - self.first_data_block) / u64::from(self.blocks_per_group)) as u32
    }

    /// The group of inode `ino` and its index within the group.
    pub fn inode_position(&self, ino: u32) -> (u32, u32) {
        debug_assert!(
            ino >= 1 && ino <= self.inodes_count,
            "inode {ino} out of range"
        );
        (
            (ino - 1) / self.inodes_per_group,
            (ino - 1) % self.inodes_per_group,
        )
    }

    /// Inode records per block of the inode table.
    pub fn inodes_per_block(&self) -> u32 {
        self.block_size / self.inode_size
    }

    /// Blocks of one group's inode table.
    pub fn inode_table_blocks(&self) -> u32 {
        (self.inodes_per_group * self.inode_size).div_ceil(self.block_size)
    }

    /// True if group `group` carries a superblock (primary or backup) and a GDT copy.
    pub fn group_has_superblock(&self, group: u32) -> bool {
        crate::format::superblock::group_has_superblock(group, self.sparse_super, self.backup_bgs)
    }

    /// Blocks at the start of `group` used by its superblock copy, GDT copy and reserved
    /// GDT blocks (0 if the group has no superblock copy).
    pub fn superblock_area_blocks(&self, group: u32) -> u32 {
        if self.group_has_superblock(group) {
            1 + self.gdt_blocks() + self.reserved_gdt_blocks
        } else {
            0
        }
    }

    /// The block holding group descriptor `group` in the primary table.
    pub fn desc_location(&self, group: u32) -> (u64, usize) {
        let per_block = self.descs_per_block();
        let block = self.first_data_block + 1 + u64::from(group / per_block);
        let offset = (group % per_block * self.desc_size) as usize;
        (block, offset)
    }

    /// The block holding the primary superblock, and its byte offset in that block.
    pub fn superblock_location(&self) -> (u64, usize) {
        if self.block_size == 1024 {
            (1, 0)
        } else {
            (0, 1024)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 MiB file system as `mkfs.ext4` makes it (1 KiB blocks).
    pub(crate) fn small() -> Geometry {
        Geometry {
            block_size: 1024,
            blocks_count: 65536,
            first_data_block: 1,
            blocks_per_group: 8192,
            inodes_per_group: 2048,
            inodes_count: 16384,
            inode_size: 256,
            first_ino: 11,
            group_count: 8,
            desc_size: 64,
            reserved_gdt_blocks: 256,
            sparse_super: true,
            backup_bgs: None,
            flex_group_size: 16,
        }
    }

    #[test]
    fn group_arithmetic_matches_mkfs() {
        let g = small();
        assert_eq!(g.gdt_blocks(), 1);
        assert_eq!(g.group_first_block(1), 8193);
        assert_eq!(
            g.blocks_in_group(7),
            8191,
            "the last group ends at the device end"
        );
        assert_eq!(g.group_of_block(8192), 0);
        assert_eq!(g.group_of_block(8193), 1);
        assert_eq!(g.inode_position(12), (0, 11));
        assert_eq!(g.inode_position(2049), (1, 0));
        assert_eq!(g.inode_table_blocks(), 512);
        let with_super: Vec<u32> = (0..8).filter(|&n| g.group_has_superblock(n)).collect();
        assert_eq!(with_super, vec![0, 1, 3, 5, 7]);
        assert_eq!(g.superblock_area_blocks(0), 258);
        assert_eq!(g.desc_location(3), (2, 192));
        assert_eq!(g.superblock_location(), (1, 0));
    }

    #[test]
    fn sparse_super_groups_are_powers_of_3_5_7() {
        let g = Geometry {
            group_count: 1000,
            ..small()
        };
        let with_super: Vec<u32> = (0..100).filter(|&n| g.group_has_superblock(n)).collect();
        assert_eq!(with_super, vec![0, 1, 3, 5, 7, 9, 25, 27, 49, 81]);
    }
}
