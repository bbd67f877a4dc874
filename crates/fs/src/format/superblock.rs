//! The ext4 superblock: 1024 bytes at byte 1024 of the device (block 1 with 1 KiB blocks,
//! offset 1024 of block 0 otherwise), with backups at the start of some groups.
//!
//! Promise: the structure keeps its raw 1024 bytes and reads and writes fields in place,
//! so bytes jext does not interpret (reserved space, error records, fields of features it
//! does not use) round-trip exactly: `encode(decode(x)) == x` whenever the checksum was
//! right. Decode refuses a wrong magic, a wrong checksum and impossible geometry; it never
//! repairs. Whether jext may *use* the file system (its feature bits) is a separate
//! question, answered by [`Superblock::check_features`].
//!
//! Layout (little-endian; "lo/hi" pairs combine into one wider value):
//!
//! ```text
//! off   size field                        meaning
//! 0x000 4  s_inodes_count                 inodes in the file system
//! 0x004 4  s_blocks_count_lo              blocks (hi at 0x150 with 64bit)
//! 0x008 4  s_r_blocks_count_lo            blocks reserved for root (hi at 0x154)
//! 0x00C 4  s_free_blocks_count_lo         free blocks (hi at 0x158)
//! 0x010 4  s_free_inodes_count            free inodes
//! 0x014 4  s_first_data_block             1 with 1 KiB blocks, else 0
//! 0x018 4  s_log_block_size               block size is 1024 << this
//! 0x01C 4  s_log_cluster_size             cluster size is 1024 << this (bigalloc)
//! 0x020 4  s_blocks_per_group
//! 0x024 4  s_clusters_per_group
//! 0x028 4  s_inodes_per_group
//! 0x02C 4  s_mtime                        last mount, seconds (hi byte at 0x275)
//! 0x030 4  s_wtime                        last write, seconds (hi byte at 0x274)
//! 0x034 2  s_mnt_count                    mounts since the last check
//! 0x036 2  s_max_mnt_count
//! 0x038 2  s_magic                        0xEF53
//! 0x03A 2  s_state                        1 clean, 2 errors, 4 orphans being recovered
//! 0x03C 2  s_errors                       1 continue, 2 remount-ro, 3 panic
//! 0x03E 2  s_minor_rev_level
//! 0x040 4  s_lastcheck                    last fsck, seconds (hi byte at 0x277)
//! 0x044 4  s_checkinterval
//! 0x048 4  s_creator_os                   0 Linux
//! 0x04C 4  s_rev_level                    1 = dynamic (variable inode size, features)
//! 0x050 2  s_def_resuid                   owner of the reserved blocks
//! 0x052 2  s_def_resgid
//! 0x054 4  s_first_ino                    first non-reserved inode (11)
//! 0x058 2  s_inode_size                   bytes per inode record
//! 0x05A 2  s_block_group_nr               group holding this copy (backups)
//! 0x05C 4  s_feature_compat
//! 0x060 4  s_feature_incompat
//! 0x064 4  s_feature_ro_compat
//! 0x068 16 s_uuid
//! 0x078 16 s_volume_name                  NUL-padded
//! 0x088 64 s_last_mounted                 NUL-padded path
//! 0x0C8 4  s_algorithm_usage_bitmap       (compression, unused)
//! 0x0CC 1  s_prealloc_blocks
//! 0x0CD 1  s_prealloc_dir_blocks
//! 0x0CE 2  s_reserved_gdt_blocks          GDT blocks kept for online growth
//! 0x0D0 16 s_journal_uuid                 uuid of an external journal
//! 0x0E0 4  s_journal_inum                 journal inode (8)
//! 0x0E4 4  s_journal_dev                  external journal device (0: none)
//! 0x0E8 4  s_last_orphan                  head of the orphan inode list
//! 0x0EC 16 s_hash_seed                    4 x le32, directory hash seed
//! 0x0FC 1  s_def_hash_version             hash of new htree directories
//! 0x0FD 1  s_jnl_backup_type              1: s_jnl_blocks holds i_block + size
//! 0x0FE 2  s_desc_size                    group descriptor bytes (64bit)
//! 0x100 4  s_default_mount_opts
//! 0x104 4  s_first_meta_bg
//! 0x108 4  s_mkfs_time                    (hi byte at 0x276)
//! 0x10C 68 s_jnl_blocks                   17 x le32: journal i_block[15], size hi, lo
//! 0x150 4  s_blocks_count_hi
//! 0x154 4  s_r_blocks_count_hi
//! 0x158 4  s_free_blocks_count_hi
//! 0x15C 2  s_min_extra_isize              extra inode bytes every inode has
//! 0x15E 2  s_want_extra_isize             extra inode bytes new inodes get
//! 0x160 4  s_flags                        1 signed dir hash, 2 unsigned, 4 test fs
//! 0x164 2  s_raid_stride
//! 0x166 2  s_mmp_update_interval
//! 0x168 8  s_mmp_block
//! 0x170 4  s_raid_stripe_width
//! 0x174 1  s_log_groups_per_flex          flex group is 1 << this groups
//! 0x175 1  s_checksum_type                1 = crc32c
//! 0x176 1  s_encryption_level
//! 0x177 1  s_reserved_pad
//! 0x178 8  s_kbytes_written               lifetime KiB written
//! 0x180 4  s_snapshot_inum                (snapshots: never used by mainline)
//! 0x184 4  s_snapshot_id
//! 0x188 8  s_snapshot_r_blocks_count
//! 0x190 4  s_snapshot_list
//! 0x194 4  s_error_count                  errors recorded by the kernel
//! 0x198 4  s_first_error_time
//! 0x19C 4  s_first_error_ino
//! 0x1A0 8  s_first_error_block
//! 0x1A8 32 s_first_error_func
//! 0x1C8 4  s_first_error_line
//! 0x1CC 4  s_last_error_time
//! 0x1D0 4  s_last_error_ino
//! 0x1D4 4  s_last_error_line
//! 0x1D8 8  s_last_error_block
//! 0x1E0 32 s_last_error_func
//! 0x200 64 s_mount_opts                   NUL-padded default mount options
//! 0x240 4  s_usr_quota_inum
//! 0x244 4  s_grp_quota_inum
//! 0x248 4  s_overhead_clusters            metadata overhead (0: kernel computes it)
//! 0x24C 8  s_backup_bgs                   2 x le32: backup groups with sparse_super2
//! 0x254 4  s_encrypt_algos
//! 0x258 16 s_encrypt_pw_salt
//! 0x268 4  s_lpf_ino                      lost+found inode
//! 0x26C 4  s_prj_quota_inum
//! 0x270 4  s_checksum_seed                metadata_csum seed with csum_seed feature
//! 0x274 1  s_wtime_hi   0x275 1 s_mtime_hi   0x276 1 s_mkfs_time_hi
//! 0x277 1  s_lastcheck_hi   0x278 1 s_first_error_time_hi   0x279 1 s_last_error_time_hi
//! 0x27A 1  s_first_error_errcode   0x27B 1 s_last_error_errcode
//! 0x27C 2  s_encoding                     filename encoding (casefold)
//! 0x27E 2  s_encoding_flags
//! 0x280 4  s_orphan_file_inum             orphan file (orphan_file feature)
//! 0x284 376 s_reserved                    zero
//! 0x3FC 4  s_checksum                     crc32c_raw(!0, bytes 0..0x3FC), metadata_csum
//! ```

use super::csum::crc32c_raw;
use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::{FormatError, Location};

pub const SUPERBLOCK_OFFSET: u64 = 1024;
pub const SUPERBLOCK_SIZE: usize = 1024;
pub const EXT4_MAGIC: u16 = 0xEF53;
const CHECKSUM_OFFSET: usize = 0x3FC;

/// `s_state` bits.
pub const STATE_CLEAN: u16 = 0x1;
pub const STATE_ERRORS: u16 = 0x2;
pub const STATE_ORPHANS: u16 = 0x4;

/// `s_flags` bits choosing the directory hash's char signedness.
pub const FLAG_SIGNED_HASH: u32 = 0x1;
pub const FLAG_UNSIGNED_HASH: u32 = 0x2;

/// Feature bits, with the names `mkfs.ext4 -O` and `dumpe2fs` use.
pub mod features {
    pub const COMPAT_DIR_PREALLOC: u32 = 0x1;
    pub const COMPAT_IMAGIC_INODES: u32 = 0x2;
    pub const COMPAT_HAS_JOURNAL: u32 = 0x4;
    pub const COMPAT_EXT_ATTR: u32 = 0x8;
    pub const COMPAT_RESIZE_INODE: u32 = 0x10;
    pub const COMPAT_DIR_INDEX: u32 = 0x20;
    pub const COMPAT_SPARSE_SUPER2: u32 = 0x200;
    pub const COMPAT_FAST_COMMIT: u32 = 0x400;
    pub const COMPAT_STABLE_INODES: u32 = 0x800;
    pub const COMPAT_ORPHAN_FILE: u32 = 0x1000;

    pub const INCOMPAT_COMPRESSION: u32 = 0x1;
    pub const INCOMPAT_FILETYPE: u32 = 0x2;
    pub const INCOMPAT_RECOVER: u32 = 0x4;
    pub const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
    pub const INCOMPAT_META_BG: u32 = 0x10;
    pub const INCOMPAT_EXTENTS: u32 = 0x40;
    pub const INCOMPAT_64BIT: u32 = 0x80;
    pub const INCOMPAT_MMP: u32 = 0x100;
    pub const INCOMPAT_FLEX_BG: u32 = 0x200;
    pub const INCOMPAT_EA_INODE: u32 = 0x400;
    pub const INCOMPAT_DIRDATA: u32 = 0x1000;
    pub const INCOMPAT_CSUM_SEED: u32 = 0x2000;
    pub const INCOMPAT_LARGEDIR: u32 = 0x4000;
    pub const INCOMPAT_INLINE_DATA: u32 = 0x8000;
    pub const INCOMPAT_ENCRYPT: u32 = 0x10000;
    pub const INCOMPAT_CASEFOLD: u32 = 0x20000;

    pub const RO_COMPAT_SPARSE_SUPER: u32 = 0x1;
    pub const RO_COMPAT_LARGE_FILE: u32 = 0x2;
    pub const RO_COMPAT_BTREE_DIR: u32 = 0x4;
    pub const RO_COMPAT_HUGE_FILE: u32 = 0x8;
    pub const RO_COMPAT_GDT_CSUM: u32 = 0x10;
    pub const RO_COMPAT_DIR_NLINK: u32 = 0x20;
    pub const RO_COMPAT_EXTRA_ISIZE: u32 = 0x40;
    pub const RO_COMPAT_HAS_SNAPSHOT: u32 = 0x80;
    pub const RO_COMPAT_QUOTA: u32 = 0x100;
    pub const RO_COMPAT_BIGALLOC: u32 = 0x200;
    pub const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
    pub const RO_COMPAT_REPLICA: u32 = 0x800;
    pub const RO_COMPAT_READONLY: u32 = 0x1000;
    pub const RO_COMPAT_PROJECT: u32 = 0x2000;
    pub const RO_COMPAT_SHARED_BLOCKS: u32 = 0x4000;
    pub const RO_COMPAT_VERITY: u32 = 0x8000;
    pub const RO_COMPAT_ORPHAN_PRESENT: u32 = 0x10000;

    /// Incompat features jext understands; any other set bit refuses the mount.
    pub const INCOMPAT_SUPPORTED: u32 = INCOMPAT_FILETYPE
        | INCOMPAT_RECOVER
        | INCOMPAT_EXTENTS
        | INCOMPAT_64BIT
        | INCOMPAT_FLEX_BG
        | INCOMPAT_CSUM_SEED;
    /// Ro-compat features jext can write; any other set bit allows read-only use only.
    pub const RO_COMPAT_SUPPORTED: u32 = RO_COMPAT_SPARSE_SUPER
        | RO_COMPAT_LARGE_FILE
        | RO_COMPAT_HUGE_FILE
        | RO_COMPAT_GDT_CSUM
        | RO_COMPAT_DIR_NLINK
        | RO_COMPAT_EXTRA_ISIZE
        | RO_COMPAT_METADATA_CSUM;

    pub const INCOMPAT_NAMES: &[(u32, &str)] = &[
        (INCOMPAT_COMPRESSION, "compression"),
        (INCOMPAT_FILETYPE, "filetype"),
        (INCOMPAT_RECOVER, "needs_recovery"),
        (INCOMPAT_JOURNAL_DEV, "journal_dev"),
        (INCOMPAT_META_BG, "meta_bg"),
        (INCOMPAT_EXTENTS, "extent"),
        (INCOMPAT_64BIT, "64bit"),
        (INCOMPAT_MMP, "mmp"),
        (INCOMPAT_FLEX_BG, "flex_bg"),
        (INCOMPAT_EA_INODE, "ea_inode"),
        (INCOMPAT_DIRDATA, "dirdata"),
        (INCOMPAT_CSUM_SEED, "metadata_csum_seed"),
        (INCOMPAT_LARGEDIR, "large_dir"),
        (INCOMPAT_INLINE_DATA, "inline_data"),
        (INCOMPAT_ENCRYPT, "encrypt"),
        (INCOMPAT_CASEFOLD, "casefold"),
    ];

    pub const RO_COMPAT_NAMES: &[(u32, &str)] = &[
        (RO_COMPAT_SPARSE_SUPER, "sparse_super"),
        (RO_COMPAT_LARGE_FILE, "large_file"),
        (RO_COMPAT_BTREE_DIR, "btree_dir"),
        (RO_COMPAT_HUGE_FILE, "huge_file"),
        (RO_COMPAT_GDT_CSUM, "uninit_bg"),
        (RO_COMPAT_DIR_NLINK, "dir_nlink"),
        (RO_COMPAT_EXTRA_ISIZE, "extra_isize"),
        (RO_COMPAT_HAS_SNAPSHOT, "snapshot"),
        (RO_COMPAT_QUOTA, "quota"),
        (RO_COMPAT_BIGALLOC, "bigalloc"),
        (RO_COMPAT_METADATA_CSUM, "metadata_csum"),
        (RO_COMPAT_REPLICA, "replica"),
        (RO_COMPAT_READONLY, "read-only"),
        (RO_COMPAT_PROJECT, "project"),
        (RO_COMPAT_SHARED_BLOCKS, "shared_blocks"),
        (RO_COMPAT_VERITY, "verity"),
        (RO_COMPAT_ORPHAN_PRESENT, "orphan_present"),
    ];

    /// "0x10 (meta_bg)" for the set bits of `bits`.
    pub fn describe(bits: u32, names: &[(u32, &str)]) -> String {
        let named: Vec<&str> = names
            .iter()
            .filter(|(bit, _)| bits & bit != 0)
            .map(|(_, name)| *name)
            .collect();
        let unnamed = bits & !names.iter().fold(0, |acc, (bit, _)| acc | bit);
        let mut parts = named.join(", ");
        if unnamed != 0 {
            if !parts.is_empty() {
                parts.push_str(", ");
            }
            parts.push_str(&format!("unknown bits {unnamed:#x}"));
        }
        format!("{bits:#x} ({parts})")
    }
}

/// The superblock, as its raw bytes with typed accessors.
#[derive(Clone, PartialEq, Eq)]
pub struct Superblock {
    raw: [u8; SUPERBLOCK_SIZE],
}

macro_rules! fields {
    ($($get:ident / $set:ident : $ty:ident @ $off:expr;)*) => {
        $(
            pub fn $get(&self) -> $ty { fields!(@get $ty, &self.raw, $off) }
            pub fn $set(&mut self, value: $ty) { fields!(@put $ty, &mut self.raw, $off, value) }
        )*
    };
    (@get u8, $b:expr, $off:expr) => { $b[$off] };
    (@get u16, $b:expr, $off:expr) => { u16_at($b, $off) };
    (@get u32, $b:expr, $off:expr) => { u32_at($b, $off) };
    (@get u64, $b:expr, $off:expr) => { u64_at($b, $off) };
    (@put u8, $b:expr, $off:expr, $v:expr) => { $b[$off] = $v };
    (@put u16, $b:expr, $off:expr, $v:expr) => { put_u16($b, $off, $v) };
    (@put u32, $b:expr, $off:expr, $v:expr) => { put_u32($b, $off, $v) };
    (@put u64, $b:expr, $off:expr, $v:expr) => { put_u64($b, $off, $v) };
}

impl Superblock {
    /// A zeroed superblock for mkfs to fill in.
    pub fn zeroed() -> Superblock {
        Superblock {
            raw: [0u8; SUPERBLOCK_SIZE],
        }
    }

    fields! {
        inodes_count / set_inodes_count: u32 @ 0x00;
        free_inodes_count / set_free_inodes_count: u32 @ 0x10;
        first_data_block / set_first_data_block: u32 @ 0x14;
        log_block_size / set_log_block_size: u32 @ 0x18;
        log_cluster_size / set_log_cluster_size: u32 @ 0x1C;
        blocks_per_group / set_blocks_per_group: u32 @ 0x20;
        clusters_per_group / set_clusters_per_group: u32 @ 0x24;
        inodes_per_group / set_inodes_per_group: u32 @ 0x28;
        mtime / set_mtime: u32 @ 0x2C;
        wtime / set_wtime: u32 @ 0x30;
        mnt_count / set_mnt_count: u16 @ 0x34;
        max_mnt_count / set_max_mnt_count: u16 @ 0x36;
        magic / set_magic: u16 @ 0x38;
        state / set_state: u16 @ 0x3A;
        errors / set_errors: u16 @ 0x3C;
        lastcheck / set_lastcheck: u32 @ 0x40;
        creator_os / set_creator_os: u32 @ 0x48;
        rev_level / set_rev_level: u32 @ 0x4C;
        first_ino / set_first_ino: u32 @ 0x54;
        inode_size / set_inode_size: u16 @ 0x58;
        block_group_nr / set_block_group_nr: u16 @ 0x5A;
        feature_compat / set_feature_compat: u32 @ 0x5C;
        feature_incompat / set_feature_incompat: u32 @ 0x60;
        feature_ro_compat / set_feature_ro_compat: u32 @ 0x64;
        reserved_gdt_blocks / set_reserved_gdt_blocks: u16 @ 0xCE;
        journal_inum / set_journal_inum: u32 @ 0xE0;
        journal_dev / set_journal_dev: u32 @ 0xE4;
        last_orphan / set_last_orphan: u32 @ 0xE8;
        def_hash_version / set_def_hash_version: u8 @ 0xFC;
        jnl_backup_type / set_jnl_backup_type: u8 @ 0xFD;
        desc_size_raw / set_desc_size_raw: u16 @ 0xFE;
        default_mount_opts / set_default_mount_opts: u32 @ 0x100;
        mkfs_time / set_mkfs_time: u32 @ 0x108;
        min_extra_isize / set_min_extra_isize: u16 @ 0x15C;
        want_extra_isize / set_want_extra_isize: u16 @ 0x15E;
        flags / set_flags: u32 @ 0x160;
        log_groups_per_flex / set_log_groups_per_flex: u8 @ 0x174;
        checksum_type / set_checksum_type: u8 @ 0x175;
        kbytes_written / set_kbytes_written: u64 @ 0x178;
        overhead_clusters / set_overhead_clusters: u32 @ 0x248;
        checksum_seed_field / set_checksum_seed_field: u32 @ 0x270;
        stored_checksum / set_stored_checksum: u32 @ 0x3FC;
    }

    pub fn blocks_count(&self) -> u64 {
        self.lo_hi(0x04, 0x150)
    }
    pub fn set_blocks_count(&mut self, v: u64) {
        self.set_lo_hi(0x04, 0x150, v)
    }
    pub fn r_blocks_count(&self) -> u64 {
        self.lo_hi(0x08, 0x154)
    }
    pub fn set_r_blocks_count(&mut self, v: u64) {
        self.set_lo_hi(0x08, 0x154, v)
    }
    pub fn free_blocks_count(&self) -> u64 {
        self.lo_hi(0x0C, 0x158)
    }
    pub fn set_free_blocks_count(&mut self, v: u64) {
        self.set_lo_hi(0x0C, 0x158, v)
    }

    fn lo_hi(&self, lo: usize, hi: usize) -> u64 {
        let high = if self.has_incompat(features::INCOMPAT_64BIT) {
            u64::from(u32_at(&self.raw, hi))
        } else {
            0
        };
        u64::from(u32_at(&self.raw, lo)) | high << 32
    }

    fn set_lo_hi(&mut self, lo: usize, hi: usize, v: u64) {
        assert!(
            v >> 32 == 0 || self.has_incompat(features::INCOMPAT_64BIT),
            "a block count of {v} needs the 64bit feature"
        );
        put_u32(&mut self.raw, lo, v as u32);
        if self.has_incompat(features::INCOMPAT_64BIT) {
            put_u32(&mut self.raw, hi, (v >> 32) as u32);
        }
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.raw[0x68..0x78].try_into().expect("16 bytes")
    }
    pub fn set_uuid(&mut self, uuid: [u8; 16]) {
        self.raw[0x68..0x78].copy_from_slice(&uuid);
    }
    pub fn volume_name(&self) -> &[u8] {
        let name = &self.raw[0x78..0x88];
        &name[..name.iter().position(|&b| b == 0).unwrap_or(16)]
    }
    pub fn set_volume_name(&mut self, name: &[u8]) {
        assert!(name.len() <= 16, "a volume name has at most 16 bytes");
        self.raw[0x78..0x88].fill(0);
        self.raw[0x78..0x78 + name.len()].copy_from_slice(name);
    }
    pub fn hash_seed(&self) -> [u32; 4] {
        [0, 1, 2, 3].map(|i| u32_at(&self.raw, 0xEC + 4 * i))
    }
    pub fn set_hash_seed(&mut self, seed: [u32; 4]) {
        for (i, word) in seed.iter().enumerate() {
            put_u32(&mut self.raw, 0xEC + 4 * i, *word);
        }
    }
    /// The journal inode's `i_block` and size, backed up in the superblock (17 words).
    pub fn jnl_blocks(&self) -> [u32; 17] {
        std::array::from_fn(|i| u32_at(&self.raw, 0x10C + 4 * i))
    }
    pub fn set_jnl_blocks(&mut self, words: [u32; 17]) {
        for (i, word) in words.iter().enumerate() {
            put_u32(&mut self.raw, 0x10C + 4 * i, *word);
        }
    }

    pub fn has_compat(&self, bit: u32) -> bool {
        self.feature_compat() & bit != 0
    }
    pub fn has_incompat(&self, bit: u32) -> bool {
        self.feature_incompat() & bit != 0
    }
    pub fn has_ro_compat(&self, bit: u32) -> bool {
        self.feature_ro_compat() & bit != 0
    }
    pub fn has_metadata_csum(&self) -> bool {
        self.has_ro_compat(features::RO_COMPAT_METADATA_CSUM)
    }

    pub fn block_size(&self) -> u32 {
        1024 << self.log_block_size()
    }

    /// Bytes per group descriptor: 32, or `s_desc_size` with the 64bit feature.
    pub fn desc_size(&self) -> u32 {
        if self.has_incompat(features::INCOMPAT_64BIT) {
            u32::from(self.desc_size_raw())
        } else {
            32
        }
    }

    pub fn group_count(&self) -> u32 {
        let data_blocks = self.blocks_count() - u64::from(self.first_data_block());
        data_blocks.div_ceil(u64::from(self.blocks_per_group())) as u32
    }

    /// The metadata_csum seed.
    pub fn csum_seed(&self) -> u32 {
        if self.has_incompat(features::INCOMPAT_CSUM_SEED) {
            self.checksum_seed_field()
        } else {
            crc32c_raw(!0, &self.uuid())
        }
    }

    /// The checksum the superblock should carry.
    pub fn compute_checksum(&self) -> u32 {
        crc32c_raw(!0, &self.raw[..CHECKSUM_OFFSET])
    }

    /// Decodes and validates a superblock read from `location`.
    pub fn decode(bytes: &[u8], location: Location) -> Result<Superblock, FormatError> {
        let err = |problem: String| FormatError::new("superblock", location, problem);
        if bytes.len() < SUPERBLOCK_SIZE {
            return Err(err(format!("only {} bytes", bytes.len())));
        }
        let sb = Superblock {
            raw: bytes[..SUPERBLOCK_SIZE].try_into().expect("1024 bytes"),
        };
        if sb.magic() != EXT4_MAGIC {
            return Err(err(format!(
                "bad magic {:#06x} (expected {EXT4_MAGIC:#06x}): not an ext4 file system",
                sb.magic()
            )));
        }
        if sb.has_metadata_csum() {
            if sb.checksum_type() != 1 {
                return Err(err(format!(
                    "unknown checksum type {} (expected 1, crc32c)",
                    sb.checksum_type()
                )));
            }
            let (stored, computed) = (sb.stored_checksum(), sb.compute_checksum());
            if stored != computed {
                return Err(err(format!(
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )));
            }
        }
        sb.validate_geometry().map_err(err)?;
        Ok(sb)
    }

    fn validate_geometry(&self) -> Result<(), String> {
        if self.log_block_size() > 6 {
            return Err(format!(
                "s_log_block_size {} gives a block size over 64 KiB",
                self.log_block_size()
            ));
        }
        let bs = self.block_size();
        if self.rev_level() != 1 {
            return Err(format!(
                "revision {} (jext needs the dynamic revision 1)",
                self.rev_level()
            ));
        }
        let expected_first = u32::from(bs == 1024);
        if self.first_data_block() != expected_first {
            return Err(format!(
                "s_first_data_block {} (expected {expected_first} for {bs}-byte blocks)",
                self.first_data_block()
            ));
        }
        if self.blocks_per_group() == 0 || self.blocks_per_group() > bs * 8 {
            return Err(format!(
                "s_blocks_per_group {} (must be 1..={})",
                self.blocks_per_group(),
                bs * 8
            ));
        }
        if self.inodes_per_group() == 0 || self.inodes_per_group() > bs * 8 {
            return Err(format!(
                "s_inodes_per_group {} (must be 1..={})",
                self.inodes_per_group(),
                bs * 8
            ));
        }
        let inode_size = u32::from(self.inode_size());
        if inode_size < 128 || inode_size > bs || !inode_size.is_power_of_two() {
            return Err(format!(
                "s_inode_size {inode_size} is not a power of two in 128..={bs}"
            ));
        }
        if self.blocks_count() <= u64::from(self.first_data_block()) {
            return Err(format!(
                "s_blocks_count {} is too small",
                self.blocks_count()
            ));
        }
        let groups = u64::from(self.group_count());
        if u64::from(self.inodes_count()) != groups * u64::from(self.inodes_per_group()) {
            return Err(format!(
                "s_inodes_count {} is not {groups} groups x {} inodes",
                self.inodes_count(),
                self.inodes_per_group()
            ));
        }
        let desc = self.desc_size();
        if desc < 32 || desc > bs || !desc.is_power_of_two() {
            return Err(format!("group descriptor size {desc} is invalid"));
        }
        if self.has_incompat(features::INCOMPAT_64BIT) && desc < 64 {
            return Err(format!(
                "64bit file system with {desc}-byte group descriptors"
            ));
        }
        if self.free_blocks_count() > self.blocks_count() {
            return Err(format!(
                "s_free_blocks_count {} exceeds s_blocks_count {}",
                self.free_blocks_count(),
                self.blocks_count()
            ));
        }
        Ok(())
    }

    /// Features that forbid any use by jext, by name; empty if none.
    pub fn unsupported_incompat(&self) -> u32 {
        self.feature_incompat() & !features::INCOMPAT_SUPPORTED
    }

    /// Features that forbid writing, by bit; empty if none.
    pub fn unsupported_ro_compat(&self) -> u32 {
        self.feature_ro_compat() & !features::RO_COMPAT_SUPPORTED
    }

    /// The 1024 bytes with a fresh checksum (when metadata_csum is on).
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        let mut raw = self.raw;
        if self.has_metadata_csum() {
            put_u32(&mut raw, CHECKSUM_OFFSET, self.compute_checksum());
        }
        raw
    }

    /// The raw bytes as last decoded or set (checksum not refreshed).
    pub fn raw(&self) -> &[u8; SUPERBLOCK_SIZE] {
        &self.raw
    }
}

impl std::fmt::Debug for Superblock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superblock")
            .field("blocks_count", &self.blocks_count())
            .field("block_size", &self.block_size())
            .field("inodes_count", &self.inodes_count())
            .field("groups", &self.group_count())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A valid superblock like mkfs.ext4 makes for 64 MiB (1 KiB blocks).
    pub(crate) fn sample() -> Superblock {
        let mut sb = Superblock::zeroed();
        sb.set_feature_incompat(
            features::INCOMPAT_FILETYPE
                | features::INCOMPAT_EXTENTS
                | features::INCOMPAT_64BIT
                | features::INCOMPAT_FLEX_BG,
        );
        sb.set_feature_ro_compat(
            features::RO_COMPAT_METADATA_CSUM | features::RO_COMPAT_SPARSE_SUPER,
        );
        sb.set_magic(EXT4_MAGIC);
        sb.set_rev_level(1);
        sb.set_log_block_size(0);
        sb.set_first_data_block(1);
        sb.set_blocks_count(65536);
        sb.set_blocks_per_group(8192);
        sb.set_inodes_per_group(2048);
        sb.set_inodes_count(16384);
        sb.set_inode_size(256);
        sb.set_desc_size_raw(64);
        sb.set_checksum_type(1);
        sb.set_uuid([7; 16]);
        sb
    }

    #[test]
    fn round_trips_every_byte_and_checks_its_checksum() {
        let mut sb = sample();
        sb.set_volume_name(b"jext");
        sb.set_hash_seed([1, 2, 3, 4]);
        let bytes = sb.encode();
        let back = Superblock::decode(&bytes, Location::Superblock { group: 0 }).unwrap();
        assert_eq!(back.encode(), bytes);
        assert_eq!(back.volume_name(), b"jext");
        assert_eq!(back.hash_seed(), [1, 2, 3, 4]);
        assert_eq!(back.group_count(), 8);
        let mut corrupt = bytes;
        corrupt[0x20] ^= 1;
        let err = Superblock::decode(&corrupt, Location::Superblock { group: 0 }).unwrap_err();
        assert!(err.to_string().contains("checksum mismatch"), "{err}");
    }

    #[test]
    fn names_unknown_features() {
        let mut sb = sample();
        sb.set_feature_incompat(
            sb.feature_incompat() | features::INCOMPAT_INLINE_DATA | 0x8000_0000,
        );
        let text = features::describe(sb.unsupported_incompat(), features::INCOMPAT_NAMES);
        assert_eq!(text, "0x80008000 (inline_data, unknown bits 0x80000000)");
    }

    #[test]
    fn rejects_nonsense_geometry() {
        let mut sb = sample();
        sb.set_inodes_count(5);
        let err = Superblock::decode(&sb.encode(), Location::Superblock { group: 0 }).unwrap_err();
        assert!(err.to_string().contains("s_inodes_count 5"), "{err}");
    }
}
