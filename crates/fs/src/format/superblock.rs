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
use super::group_desc::GroupCsum;
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
        | INCOMPAT_CSUM_SEED
        | INCOMPAT_LARGEDIR;
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

macro_rules! byte_fields {
    ($($get:ident / $set:ident : $len:literal @ $off:expr;)*) => {
        $(
            pub fn $get(&self) -> [u8; $len] {
                self.raw[$off..$off + $len].try_into().expect("field length")
            }
            pub fn $set(&mut self, value: [u8; $len]) {
                self.raw[$off..$off + $len].copy_from_slice(&value)
            }
        )*
    };
}

macro_rules! feature_predicates {
    ($($name:ident: $test:ident($bit:path);)*) => {
        $( pub fn $name(&self) -> bool { self.$test($bit) } )*
    };
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
        minor_rev_level / set_minor_rev_level: u16 @ 0x3E;
        lastcheck / set_lastcheck: u32 @ 0x40;
        checkinterval / set_checkinterval: u32 @ 0x44;
        creator_os / set_creator_os: u32 @ 0x48;
        rev_level / set_rev_level: u32 @ 0x4C;
        def_resuid / set_def_resuid: u16 @ 0x50;
        def_resgid / set_def_resgid: u16 @ 0x52;
        first_ino / set_first_ino: u32 @ 0x54;
        inode_size / set_inode_size: u16 @ 0x58;
        block_group_nr / set_block_group_nr: u16 @ 0x5A;
        feature_compat / set_feature_compat: u32 @ 0x5C;
        feature_incompat / set_feature_incompat: u32 @ 0x60;
        feature_ro_compat / set_feature_ro_compat: u32 @ 0x64;
        algorithm_usage_bitmap / set_algorithm_usage_bitmap: u32 @ 0xC8;
        prealloc_blocks / set_prealloc_blocks: u8 @ 0xCC;
        prealloc_dir_blocks / set_prealloc_dir_blocks: u8 @ 0xCD;
        reserved_gdt_blocks / set_reserved_gdt_blocks: u16 @ 0xCE;
        journal_inum / set_journal_inum: u32 @ 0xE0;
        journal_dev / set_journal_dev: u32 @ 0xE4;
        last_orphan / set_last_orphan: u32 @ 0xE8;
        def_hash_version / set_def_hash_version: u8 @ 0xFC;
        jnl_backup_type / set_jnl_backup_type: u8 @ 0xFD;
        desc_size_raw / set_desc_size_raw: u16 @ 0xFE;
        default_mount_opts / set_default_mount_opts: u32 @ 0x100;
        first_meta_bg / set_first_meta_bg: u32 @ 0x104;
        mkfs_time / set_mkfs_time: u32 @ 0x108;
        min_extra_isize / set_min_extra_isize: u16 @ 0x15C;
        want_extra_isize / set_want_extra_isize: u16 @ 0x15E;
        flags / set_flags: u32 @ 0x160;
        raid_stride / set_raid_stride: u16 @ 0x164;
        mmp_update_interval / set_mmp_update_interval: u16 @ 0x166;
        mmp_block / set_mmp_block: u64 @ 0x168;
        raid_stripe_width / set_raid_stripe_width: u32 @ 0x170;
        log_groups_per_flex / set_log_groups_per_flex: u8 @ 0x174;
        checksum_type / set_checksum_type: u8 @ 0x175;
        encryption_level / set_encryption_level: u8 @ 0x176;
        kbytes_written / set_kbytes_written: u64 @ 0x178;
        snapshot_inum / set_snapshot_inum: u32 @ 0x180;
        snapshot_id / set_snapshot_id: u32 @ 0x184;
        snapshot_r_blocks_count / set_snapshot_r_blocks_count: u64 @ 0x188;
        snapshot_list / set_snapshot_list: u32 @ 0x190;
        error_count / set_error_count: u32 @ 0x194;
        first_error_time / set_first_error_time: u32 @ 0x198;
        first_error_ino / set_first_error_ino: u32 @ 0x19C;
        first_error_block / set_first_error_block: u64 @ 0x1A0;
        first_error_line / set_first_error_line: u32 @ 0x1C8;
        last_error_time / set_last_error_time: u32 @ 0x1CC;
        last_error_ino / set_last_error_ino: u32 @ 0x1D0;
        last_error_line / set_last_error_line: u32 @ 0x1D4;
        last_error_block / set_last_error_block: u64 @ 0x1D8;
        usr_quota_inum / set_usr_quota_inum: u32 @ 0x240;
        grp_quota_inum / set_grp_quota_inum: u32 @ 0x244;
        overhead_clusters / set_overhead_clusters: u32 @ 0x248;
        lpf_ino / set_lpf_ino: u32 @ 0x268;
        prj_quota_inum / set_prj_quota_inum: u32 @ 0x26C;
        checksum_seed_field / set_checksum_seed_field: u32 @ 0x270;
        wtime_hi / set_wtime_hi: u8 @ 0x274;
        mtime_hi / set_mtime_hi: u8 @ 0x275;
        mkfs_time_hi / set_mkfs_time_hi: u8 @ 0x276;
        lastcheck_hi / set_lastcheck_hi: u8 @ 0x277;
        first_error_time_hi / set_first_error_time_hi: u8 @ 0x278;
        last_error_time_hi / set_last_error_time_hi: u8 @ 0x279;
        first_error_errcode / set_first_error_errcode: u8 @ 0x27A;
        last_error_errcode / set_last_error_errcode: u8 @ 0x27B;
        encoding / set_encoding: u16 @ 0x27C;
        encoding_flags / set_encoding_flags: u16 @ 0x27E;
        orphan_file_inum / set_orphan_file_inum: u32 @ 0x280;
        stored_checksum / set_stored_checksum: u32 @ 0x3FC;
    }

    byte_fields! {
        last_mounted / set_last_mounted: 64 @ 0x88;
        journal_uuid / set_journal_uuid: 16 @ 0xD0;
        first_error_func / set_first_error_func: 32 @ 0x1A8;
        last_error_func / set_last_error_func: 32 @ 0x1E0;
        mount_opts / set_mount_opts: 64 @ 0x200;
        encrypt_algos / set_encrypt_algos: 4 @ 0x254;
        encrypt_pw_salt / set_encrypt_pw_salt: 16 @ 0x258;
    }

    /// `s_backup_bgs`: the only groups with backup superblocks under sparse_super2.
    pub fn backup_bgs(&self) -> [u32; 2] {
        [u32_at(&self.raw, 0x24C), u32_at(&self.raw, 0x250)]
    }
    pub fn set_backup_bgs(&mut self, groups: [u32; 2]) {
        put_u32(&mut self.raw, 0x24C, groups[0]);
        put_u32(&mut self.raw, 0x250, groups[1]);
    }

    /// Seconds since the epoch from a le32 field and its high byte (40 bits, unsigned).
    fn seconds_at(&self, lo: usize, hi: usize) -> i64 {
        i64::from(u32_at(&self.raw, lo)) | i64::from(self.raw[hi]) << 32
    }
    fn set_seconds_at(&mut self, lo: usize, hi: usize, seconds: i64) {
        assert!(
            (0..1 << 40).contains(&seconds),
            "superblock time {seconds} does not fit 40 bits"
        );
        put_u32(&mut self.raw, lo, seconds as u32);
        self.raw[hi] = (seconds >> 32) as u8;
    }
    pub fn mount_time_seconds(&self) -> i64 {
        self.seconds_at(0x2C, 0x275)
    }
    pub fn set_mount_time_seconds(&mut self, seconds: i64) {
        self.set_seconds_at(0x2C, 0x275, seconds)
    }
    pub fn write_time_seconds(&self) -> i64 {
        self.seconds_at(0x30, 0x274)
    }
    pub fn set_write_time_seconds(&mut self, seconds: i64) {
        self.set_seconds_at(0x30, 0x274, seconds)
    }
    pub fn mkfs_time_seconds(&self) -> i64 {
        self.seconds_at(0x108, 0x276)
    }
    pub fn set_mkfs_time_seconds(&mut self, seconds: i64) {
        self.set_seconds_at(0x108, 0x276, seconds)
    }
    pub fn lastcheck_seconds(&self) -> i64 {
        self.seconds_at(0x40, 0x277)
    }
    pub fn set_lastcheck_seconds(&mut self, seconds: i64) {
        self.set_seconds_at(0x40, 0x277, seconds)
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
    feature_predicates! {
        has_journal: has_compat(features::COMPAT_HAS_JOURNAL);
        has_ext_attr: has_compat(features::COMPAT_EXT_ATTR);
        has_resize_inode: has_compat(features::COMPAT_RESIZE_INODE);
        has_dir_index: has_compat(features::COMPAT_DIR_INDEX);
        has_sparse_super2: has_compat(features::COMPAT_SPARSE_SUPER2);
        has_fast_commit: has_compat(features::COMPAT_FAST_COMMIT);
        has_orphan_file: has_compat(features::COMPAT_ORPHAN_FILE);
        has_filetype: has_incompat(features::INCOMPAT_FILETYPE);
        needs_recovery: has_incompat(features::INCOMPAT_RECOVER);
        has_meta_bg: has_incompat(features::INCOMPAT_META_BG);
        has_extents: has_incompat(features::INCOMPAT_EXTENTS);
        has_64bit: has_incompat(features::INCOMPAT_64BIT);
        has_flex_bg: has_incompat(features::INCOMPAT_FLEX_BG);
        has_csum_seed: has_incompat(features::INCOMPAT_CSUM_SEED);
        has_large_dir: has_incompat(features::INCOMPAT_LARGEDIR);
        has_inline_data: has_incompat(features::INCOMPAT_INLINE_DATA);
        has_sparse_super: has_ro_compat(features::RO_COMPAT_SPARSE_SUPER);
        has_large_file: has_ro_compat(features::RO_COMPAT_LARGE_FILE);
        has_huge_file: has_ro_compat(features::RO_COMPAT_HUGE_FILE);
        has_gdt_csum: has_ro_compat(features::RO_COMPAT_GDT_CSUM);
        has_dir_nlink: has_ro_compat(features::RO_COMPAT_DIR_NLINK);
        has_extra_isize: has_ro_compat(features::RO_COMPAT_EXTRA_ISIZE);
        has_bigalloc: has_ro_compat(features::RO_COMPAT_BIGALLOC);
        has_metadata_csum: has_ro_compat(features::RO_COMPAT_METADATA_CSUM);
    }

    /// True if group `group` starts with a superblock copy and a descriptor table copy:
    /// group 0 always; with sparse_super2 only the (at most two) `s_backup_bgs`; with
    /// sparse_super group 1 and the powers of 3, 5 and 7; otherwise every group.
    pub fn has_superblock_in_group(&self, group: u32) -> bool {
        let sparse2 = self.has_sparse_super2().then(|| self.backup_bgs());
        group_has_superblock(group, self.has_sparse_super(), sparse2)
    }

    /// The groups holding backup superblocks, ascending (the order e2fsprogs lists them
    /// in, which is also the order of the resize inode's per-block backup lists).
    pub fn backup_groups(&self) -> Vec<u32> {
        let count = self.group_count();
        if self.has_sparse_super2() {
            let mut groups: Vec<u32> = self
                .backup_bgs()
                .into_iter()
                .filter(|&g| g != 0 && g < count)
                .collect();
            groups.sort_unstable();
            groups.dedup();
            return groups;
        }
        if !self.has_sparse_super() {
            return (1..count).collect();
        }
        let mut groups: Vec<u32> = (count > 1).then_some(1).into_iter().collect();
        for base in [3u32, 5, 7] {
            let mut power = u64::from(base);
            while power < u64::from(count) {
                groups.push(power as u32);
                power *= u64::from(base);
            }
        }
        groups.sort_unstable();
        groups
    }

    /// How this file system's group descriptors are checksummed.
    pub fn group_csum(&self) -> GroupCsum {
        if self.has_metadata_csum() {
            GroupCsum::Crc32c {
                fs_seed: self.csum_seed(),
            }
        } else if self.has_gdt_csum() {
            GroupCsum::Crc16 { uuid: self.uuid() }
        } else {
            GroupCsum::None
        }
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
        if self.rev_level() != 1 {
            return Err(format!(
                "revision {} (jext needs the dynamic revision 1)",
                self.rev_level()
            ));
        }
        if self.log_block_size() > 6 {
            return Err(format!(
                "s_log_block_size {} gives a block size over 64 KiB",
                self.log_block_size()
            ));
        }
        self.validate_groups()?;
        self.validate_inodes()?;
        self.validate_metadata_sizes()?;
        if self.free_blocks_count() > self.blocks_count() {
            return Err(format!(
                "s_free_blocks_count {} exceeds s_blocks_count {}",
                self.free_blocks_count(),
                self.blocks_count()
            ));
        }
        if self.free_inodes_count() > self.inodes_count() {
            return Err(format!(
                "s_free_inodes_count {} exceeds s_inodes_count {}",
                self.free_inodes_count(),
                self.inodes_count()
            ));
        }
        Ok(())
    }

    fn validate_groups(&self) -> Result<(), String> {
        let bs = self.block_size();
        let expected_first = u32::from(bs == 1024 && !self.has_bigalloc());
        if self.first_data_block() != expected_first {
            return Err(format!(
                "s_first_data_block {} (expected {expected_first} for {bs}-byte blocks)",
                self.first_data_block()
            ));
        }
        // Without bigalloc a cluster is a block; the kernel refuses anything else.
        if !self.has_bigalloc()
            && (self.log_cluster_size() != self.log_block_size()
                || self.clusters_per_group() != self.blocks_per_group())
        {
            return Err(format!(
                "s_log_cluster_size {} / s_clusters_per_group {} differ from the block \
                 size ({}) / blocks per group ({}) without bigalloc",
                self.log_cluster_size(),
                self.clusters_per_group(),
                self.log_block_size(),
                self.blocks_per_group()
            ));
        }
        if self.clusters_per_group() == 0 || self.clusters_per_group() > bs * 8 {
            return Err(format!(
                "s_clusters_per_group {} (must be 1..={})",
                self.clusters_per_group(),
                bs * 8
            ));
        }
        if self.blocks_per_group() == 0 {
            return Err("s_blocks_per_group is 0".into());
        }
        if self.blocks_count() <= u64::from(self.first_data_block()) {
            return Err(format!(
                "s_blocks_count {} is too small",
                self.blocks_count()
            ));
        }
        let groups = (self.blocks_count() - u64::from(self.first_data_block()))
            .div_ceil(u64::from(self.blocks_per_group()));
        if groups > u64::from(u32::MAX) {
            return Err(format!("{groups} block groups do not fit 32 bits"));
        }
        if self.has_flex_bg() && self.log_groups_per_flex() > 31 {
            return Err(format!(
                "s_log_groups_per_flex {} (at most 31)",
                self.log_groups_per_flex()
            ));
        }
        Ok(())
    }

    fn validate_inodes(&self) -> Result<(), String> {
        let bs = self.block_size();
        let inode_size = u32::from(self.inode_size());
        if inode_size < 128 || inode_size > bs || !inode_size.is_power_of_two() {
            return Err(format!(
                "s_inode_size {inode_size} is not a power of two in 128..={bs}"
            ));
        }
        let per_block = bs / inode_size;
        if self.inodes_per_group() < per_block || self.inodes_per_group() > bs * 8 {
            return Err(format!(
                "s_inodes_per_group {} (must be {per_block}..={})",
                self.inodes_per_group(),
                bs * 8
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
        // Inodes 1..=10 are reserved for the file system's own use.
        if self.first_ino() < 11 || self.first_ino() > self.inodes_count() {
            return Err(format!(
                "s_first_ino {} (must be 11..={})",
                self.first_ino(),
                self.inodes_count()
            ));
        }
        Ok(())
    }

    fn validate_metadata_sizes(&self) -> Result<(), String> {
        let bs = self.block_size();
        let desc = self.desc_size();
        if desc < 32 || desc > bs || !desc.is_power_of_two() {
            return Err(format!("group descriptor size {desc} is invalid"));
        }
        if self.has_64bit() && desc < 64 {
            return Err(format!(
                "64bit file system with {desc}-byte group descriptors"
            ));
        }
        // The resize inode's double-indirect block has bs / 4 slots.
        if u32::from(self.reserved_gdt_blocks()) > bs / 4 {
            return Err(format!(
                "s_reserved_gdt_blocks {} exceeds {}",
                self.reserved_gdt_blocks(),
                bs / 4
            ));
        }
        Ok(())
    }

    /// Incompat feature bits jext does not understand (0 if none).
    pub fn unsupported_incompat(&self) -> u32 {
        self.feature_incompat() & !features::INCOMPAT_SUPPORTED
    }

    /// Ro-compat feature bits jext cannot keep correct when writing (0 if none).
    pub fn unsupported_ro_compat(&self) -> u32 {
        self.feature_ro_compat() & !features::RO_COMPAT_SUPPORTED
    }

    /// Refuses a file system jext must not use: any unknown incompat feature, and for
    /// read-write use any unknown ro_compat feature. The error names every bit.
    pub fn check_features(&self, read_write: bool) -> Result<(), FormatError> {
        let location = Location::Superblock {
            group: u32::from(self.block_group_nr()),
        };
        let incompat = self.unsupported_incompat();
        if incompat != 0 {
            return Err(FormatError::new(
                "superblock",
                location,
                format!(
                    "unsupported incompat feature(s): {}",
                    features::describe(incompat, features::INCOMPAT_NAMES)
                ),
            ));
        }
        let ro_compat = self.unsupported_ro_compat();
        if read_write && ro_compat != 0 {
            return Err(FormatError::new(
                "superblock",
                location,
                format!(
                    "unsupported ro_compat feature(s) for read-write use: {}",
                    features::describe(ro_compat, features::RO_COMPAT_NAMES)
                ),
            ));
        }
        Ok(())
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

/// True if group `group` starts with a superblock and descriptor table copy: group 0
/// always; with sparse_super2 only the groups in `backup_bgs`; with sparse_super group 1
/// and the powers of 3, 5 and 7; otherwise every group.
pub fn group_has_superblock(group: u32, sparse_super: bool, backup_bgs: Option<[u32; 2]>) -> bool {
    if group == 0 {
        return true;
    }
    if let Some(bgs) = backup_bgs {
        return bgs.contains(&group);
    }
    if group == 1 || !sparse_super {
        return true;
    }
    [3, 5, 7].iter().any(|&base| is_power_of(group, base))
}

fn is_power_of(mut n: u32, base: u32) -> bool {
    while n > 1 && n.is_multiple_of(base) {
        n /= base;
    }
    n == 1
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
        sb.set_clusters_per_group(8192);
        sb.set_first_ino(11);
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
    fn bytes_jext_does_not_interpret_round_trip() {
        let mut bytes = sample().encode();
        // Error records, mount options, reserved padding: whatever is there stays.
        for (i, b) in bytes[0x194..0x240].iter_mut().enumerate() {
            *b = i as u8;
        }
        bytes[0x300] = 0xA5;
        let fresh = Superblock { raw: bytes }.encode();
        let back = Superblock::decode(&fresh, Location::Superblock { group: 0 }).unwrap();
        assert_eq!(back.encode(), fresh);
        assert_eq!(back.first_error_func()[0], (0x1A8 - 0x194) as u8);
        assert_eq!(back.raw()[0x300], 0xA5);
    }

    #[test]
    fn times_use_their_high_bytes() {
        let mut sb = sample();
        let year_2100 = 4_102_444_800;
        sb.set_write_time_seconds(year_2100);
        sb.set_mount_time_seconds(7);
        assert_eq!(sb.write_time_seconds(), year_2100);
        assert_eq!(sb.wtime_hi(), 0);
        sb.set_write_time_seconds(1 << 33 | 5);
        assert_eq!((sb.wtime(), sb.wtime_hi()), (5, 2));
        assert_eq!(sb.mount_time_seconds(), 7);
    }

    #[test]
    fn backup_superblocks_follow_sparse_super_and_sparse_super2() {
        let mut sb = sample();
        sb.set_blocks_count(8192 * 400 + 1);
        sb.set_inodes_count(400 * 2048);
        let groups = sb.backup_groups();
        assert_eq!(groups, vec![1, 3, 5, 7, 9, 25, 27, 49, 81, 125, 243, 343]);
        let by_predicate: Vec<u32> = (1..400)
            .filter(|&g| sb.has_superblock_in_group(g))
            .collect();
        assert_eq!(by_predicate, groups);

        sb.set_feature_ro_compat(sb.feature_ro_compat() & !features::RO_COMPAT_SPARSE_SUPER);
        assert_eq!(sb.backup_groups().len(), 399);

        sb.set_feature_compat(features::COMPAT_SPARSE_SUPER2);
        sb.set_backup_bgs([399, 1]);
        assert_eq!(sb.backup_groups(), vec![1, 399]);
        assert!(sb.has_superblock_in_group(0) && !sb.has_superblock_in_group(3));
    }

    #[test]
    fn feature_check_names_what_it_refuses() {
        let mut sb = sample();
        sb.check_features(true).unwrap();
        sb.set_feature_ro_compat(sb.feature_ro_compat() | features::RO_COMPAT_QUOTA);
        sb.check_features(false).unwrap();
        let err = sb.check_features(true).unwrap_err();
        assert_eq!(
            err.problem,
            "unsupported ro_compat feature(s) for read-write use: 0x100 (quota)"
        );
        sb.set_feature_incompat(sb.feature_incompat() | features::INCOMPAT_INLINE_DATA);
        let err = sb.check_features(false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "corrupt superblock at the superblock: unsupported incompat feature(s): 0x8000 (inline_data)"
        );
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
        type Spoil = fn(&mut Superblock);
        let cases: [(Spoil, &str); 6] = [
            (|sb| sb.set_inodes_count(5), "s_inodes_count 5"),
            (|sb| sb.set_log_cluster_size(2), "s_log_cluster_size 2"),
            (|sb| sb.set_first_ino(3), "s_first_ino 3"),
            (
                |sb| sb.set_reserved_gdt_blocks(257),
                "s_reserved_gdt_blocks 257",
            ),
            (|sb| sb.set_inode_size(200), "s_inode_size 200"),
            (|sb| sb.set_magic(0xEF52), "bad magic 0xef52"),
        ];
        for (spoil, expected) in cases {
            let mut sb = sample();
            spoil(&mut sb);
            let err =
                Superblock::decode(&sb.encode(), Location::Superblock { group: 3 }).unwrap_err();
            assert!(
                err.to_string().contains(expected)
                    && err.location == Location::Superblock { group: 3 },
                "{err}"
            );
        }
    }
}
