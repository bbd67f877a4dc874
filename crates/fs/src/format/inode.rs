//! The inode record: `s_inode_size` bytes (256 by default) in a group's inode table. The
//! first 128 bytes are the classic inode; `i_extra_isize` more bytes of extra fields
//! follow; the rest holds in-inode extended attributes. Layout (little-endian):
//!
//! ```text
//! off  size field                        off  size field
//! 0x00 2 i_mode                          0x64 4 i_generation
//! 0x02 2 i_uid (low 16)                  0x68 4 i_file_acl_lo (xattr block)
//! 0x04 4 i_size_lo                       0x6C 4 i_size_high
//! 0x08 4 i_atime                         0x70 4 i_obso_faddr
//! 0x0C 4 i_ctime                         0x74 2 l_i_blocks_high
//! 0x10 4 i_mtime                         0x76 2 l_i_file_acl_high
//! 0x14 4 i_dtime (or next orphan)        0x78 2 l_i_uid_high
//! 0x18 2 i_gid (low 16)                  0x7A 2 l_i_gid_high
//! 0x1A 2 i_links_count                   0x7C 2 l_i_checksum_lo
//! 0x1C 4 i_blocks_lo                     0x7E 2 l_i_reserved
//! 0x20 4 i_flags                         0x80 2 i_extra_isize
//! 0x24 4 l_i_version                     0x82 2 i_checksum_hi
//! 0x28 60 i_block (extent root, inline   0x84 4 i_ctime_extra
//!          symlink, or block map)        0x88 4 i_mtime_extra
//!                                        0x8C 4 i_atime_extra
//!                                        0x90 4 i_crtime
//!                                        0x94 4 i_crtime_extra
//!                                        0x98 4 i_version_hi
//!                                        0x9C 4 i_projid
//! ```
//!
//! Promise: an [`Inode`] is the raw record with typed accessors, so every byte (the
//! extra fields jext does not use, the in-inode xattr area) round-trips exactly. Decode
//! checks the record size, `i_extra_isize` and the checksum; it does not judge the mode,
//! flags or block map (those belong to the code that uses them). Fields beyond
//! `i_extra_isize` read as zero and are not written.
//!
//! Times are a signed 32-bit seconds field plus an `_extra` word: bits 2..31 are
//! nanoseconds, bits 0..1 extend the seconds by multiples of 2^32 (to year 2446).
//!
//! The checksum is `crc32c_raw(inode_seed(fs_seed, ino, generation), inode bytes)` with
//! both checksum fields read as zero; its low half goes in `l_i_checksum_lo`, its high half
//! in `i_checksum_hi` when the extra fields reach that far.

use super::csum::{crc32c_raw, inode_seed};
use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::{FormatError, Location};

pub const GOOD_OLD_INODE_SIZE: usize = 128;
pub const I_BLOCK_SIZE: usize = 60;
const I_BLOCK_OFFSET: usize = 0x28;
const CHECKSUM_LO: usize = 0x7C;
const CHECKSUM_HI: usize = 0x82;

/// `i_flags` bits.
pub mod flags {
    pub const SECRM: u32 = 0x1;
    pub const UNRM: u32 = 0x2;
    pub const COMPR: u32 = 0x4;
    pub const SYNC: u32 = 0x8;
    pub const IMMUTABLE: u32 = 0x10;
    pub const APPEND: u32 = 0x20;
    pub const NODUMP: u32 = 0x40;
    pub const NOATIME: u32 = 0x80;
    pub const DIRTY: u32 = 0x100;
    pub const COMPRBLK: u32 = 0x200;
    pub const NOCOMPR: u32 = 0x400;
    pub const ENCRYPT: u32 = 0x800;
    /// Directory with an htree index.
    pub const INDEX: u32 = 0x1000;
    pub const IMAGIC: u32 = 0x2000;
    pub const JOURNAL_DATA: u32 = 0x4000;
    pub const NOTAIL: u32 = 0x8000;
    pub const DIRSYNC: u32 = 0x10000;
    pub const TOPDIR: u32 = 0x20000;
    pub const HUGE_FILE: u32 = 0x40000;
    pub const EXTENTS: u32 = 0x80000;
    pub const VERITY: u32 = 0x100000;
    pub const EA_INODE: u32 = 0x200000;
    pub const EOFBLOCKS: u32 = 0x400000;
    pub const DAX: u32 = 0x2000000;
    pub const INLINE_DATA: u32 = 0x10000000;
    pub const PROJINHERIT: u32 = 0x20000000;
    pub const CASEFOLD: u32 = 0x40000000;
    /// Flags a user may change with `FS_IOC_SETFLAGS` (as ext4's EXT4_FL_USER_MODIFIABLE).
    pub const USER_MODIFIABLE: u32 = SECRM
        | UNRM
        | COMPR
        | SYNC
        | IMMUTABLE
        | APPEND
        | NODUMP
        | NOATIME
        | JOURNAL_DATA
        | NOTAIL
        | DIRSYNC
        | TOPDIR
        | DAX
        | PROJINHERIT;
    /// Flags a user may see with `FS_IOC_GETFLAGS`.
    pub const USER_VISIBLE: u32 = 0x725BDFFF;
    /// What a regular file may carry of them (ext4's `EXT4_REG_FLMASK`), and what an inode
    /// that is neither a file nor a directory may (`EXT4_OTHER_FLMASK`).
    pub const REGULAR_FILE_MASK: u32 = !(DIRSYNC | TOPDIR | CASEFOLD | PROJINHERIT);
    pub const OTHER_MASK: u32 = NODUMP | NOATIME;
    /// Flags a new inode takes from its directory (ext4's `EXT4_FL_INHERITED`).
    pub const INHERITED: u32 = SECRM
        | UNRM
        | COMPR
        | SYNC
        | NODUMP
        | NOATIME
        | NOCOMPR
        | JOURNAL_DATA
        | NOTAIL
        | DIRSYNC
        | PROJINHERIT
        | CASEFOLD
        | DAX;

    /// What an inode of `mode` may carry of `flags` (ext4's `ext4_mask_flags`).
    pub fn mask_for_mode(mode: u32, flags: u32) -> u32 {
        match mode & 0o170000 {
            0o040000 => flags,
            0o100000 => flags & REGULAR_FILE_MASK,
            _ => flags & OTHER_MASK,
        }
    }
}

/// A time as ext4 stores it (ordered by seconds, then nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct InodeTime {
    pub seconds: i64,
    pub nanoseconds: u32,
}

impl InodeTime {
    /// From the 32-bit seconds field and the `_extra` word.
    pub fn decode(seconds_field: u32, extra: u32) -> InodeTime {
        let epoch = i64::from(extra & 3);
        InodeTime {
            seconds: i64::from(seconds_field as i32) + (epoch << 32),
            nanoseconds: extra >> 2,
        }
    }

    /// To the 32-bit seconds field and the `_extra` word.
    pub fn encode(self) -> (u32, u32) {
        let low = self.seconds as i32;
        let epoch = ((self.seconds - i64::from(low)) >> 32) as u32 & 3;
        debug_assert!(self.nanoseconds < 1_000_000_000);
        (low as u32, (self.nanoseconds << 2) | epoch)
    }
}

/// An inode record, as raw bytes with typed accessors.
#[derive(Clone, PartialEq, Eq)]
pub struct Inode {
    raw: Vec<u8>,
}

macro_rules! fields {
    ($($get:ident / $set:ident : $ty:ident @ $off:expr;)*) => {
        $(
            pub fn $get(&self) -> $ty { fields!(@get $ty, &self.raw, $off) }
            pub fn $set(&mut self, value: $ty) { fields!(@put $ty, &mut self.raw, $off, value) }
        )*
    };
    (@get u16, $b:expr, $off:expr) => { u16_at($b, $off) };
    (@get u32, $b:expr, $off:expr) => { u32_at($b, $off) };
    (@put u16, $b:expr, $off:expr, $v:expr) => { put_u16($b, $off, $v) };
    (@put u32, $b:expr, $off:expr, $v:expr) => { put_u32($b, $off, $v) };
}

impl Inode {
    /// A zeroed record of `inode_size` bytes whose extra fields cover `extra_isize` bytes.
    pub fn new(inode_size: usize, extra_isize: u16) -> Inode {
        assert!(inode_size >= GOOD_OLD_INODE_SIZE);
        assert!(GOOD_OLD_INODE_SIZE + usize::from(extra_isize) <= inode_size);
        let mut inode = Inode {
            raw: vec![0u8; inode_size],
        };
        if inode_size > GOOD_OLD_INODE_SIZE {
            inode.set_extra_isize(extra_isize);
        }
        inode
    }

    fields! {
        mode / set_mode: u16 @ 0x00;
        dtime / set_dtime: u32 @ 0x14;
        links_count / set_links_count: u16 @ 0x1A;
        flags / set_flags: u32 @ 0x20;
        generation / set_generation: u32 @ 0x64;
        version_lo / set_version_lo: u32 @ 0x24;
    }

    pub fn size(&self) -> u64 {
        u64::from(u32_at(&self.raw, 0x04)) | u64::from(u32_at(&self.raw, 0x6C)) << 32
    }
    pub fn set_size(&mut self, size: u64) {
        put_u32(&mut self.raw, 0x04, size as u32);
        put_u32(&mut self.raw, 0x6C, (size >> 32) as u32);
    }
    pub fn uid(&self) -> u32 {
        u32::from(u16_at(&self.raw, 0x02)) | u32::from(u16_at(&self.raw, 0x78)) << 16
    }
    pub fn set_uid(&mut self, uid: u32) {
        put_u16(&mut self.raw, 0x02, uid as u16);
        put_u16(&mut self.raw, 0x78, (uid >> 16) as u16);
    }
    pub fn gid(&self) -> u32 {
        u32::from(u16_at(&self.raw, 0x18)) | u32::from(u16_at(&self.raw, 0x7A)) << 16
    }
    pub fn set_gid(&mut self, gid: u32) {
        put_u16(&mut self.raw, 0x18, gid as u16);
        put_u16(&mut self.raw, 0x7A, (gid >> 16) as u16);
    }
    /// The raw 48-bit `i_blocks` (units: 512 bytes, or fs blocks with HUGE_FILE).
    pub fn blocks_raw(&self) -> u64 {
        u64::from(u32_at(&self.raw, 0x1C)) | u64::from(u16_at(&self.raw, 0x74)) << 32
    }
    pub fn set_blocks_raw(&mut self, v: u64) {
        assert!(v >> 48 == 0, "i_blocks {v} does not fit 48 bits");
        put_u32(&mut self.raw, 0x1C, v as u32);
        put_u16(&mut self.raw, 0x74, (v >> 32) as u16);
    }
    /// Space used in 512-byte sectors, whatever the unit on disk.
    pub fn blocks_512(&self, block_size: u32) -> u64 {
        if self.flags() & flags::HUGE_FILE != 0 {
            self.blocks_raw() * u64::from(block_size / 512)
        } else {
            self.blocks_raw()
        }
    }
    /// Stores a sector count; needs HUGE_FILE units (set here) past 48 bits of sectors.
    pub fn set_blocks_512(&mut self, sectors: u64, block_size: u32) {
        if sectors >> 48 == 0 {
            self.set_flags(self.flags() & !flags::HUGE_FILE);
            self.set_blocks_raw(sectors);
        } else {
            self.set_flags(self.flags() | flags::HUGE_FILE);
            self.set_blocks_raw(sectors / u64::from(block_size / 512));
        }
    }
    pub fn file_acl(&self) -> u64 {
        u64::from(u32_at(&self.raw, 0x68)) | u64::from(u16_at(&self.raw, 0x76)) << 32
    }
    pub fn set_file_acl(&mut self, block: u64) {
        put_u32(&mut self.raw, 0x68, block as u32);
        put_u16(&mut self.raw, 0x76, (block >> 32) as u16);
    }
    pub fn i_block(&self) -> &[u8] {
        &self.raw[I_BLOCK_OFFSET..I_BLOCK_OFFSET + I_BLOCK_SIZE]
    }
    pub fn i_block_mut(&mut self) -> &mut [u8] {
        &mut self.raw[I_BLOCK_OFFSET..I_BLOCK_OFFSET + I_BLOCK_SIZE]
    }

    /// Bytes of extra fields (0 for 128-byte inodes).
    pub fn extra_isize(&self) -> u16 {
        if self.raw.len() > GOOD_OLD_INODE_SIZE {
            u16_at(&self.raw, 0x80)
        } else {
            0
        }
    }
    pub fn set_extra_isize(&mut self, v: u16) {
        assert!(self.raw.len() > GOOD_OLD_INODE_SIZE);
        put_u16(&mut self.raw, 0x80, v);
    }

    /// True if the extra fields reach past byte `end` of the record.
    fn has_extra(&self, end: usize) -> bool {
        GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize()) >= end
    }

    fn time(&self, seconds_off: usize, extra_off: usize) -> InodeTime {
        let extra = if self.has_extra(extra_off + 4) {
            u32_at(&self.raw, extra_off)
        } else {
            0
        };
        InodeTime::decode(u32_at(&self.raw, seconds_off), extra)
    }
    fn set_time(&mut self, seconds_off: usize, extra_off: usize, t: InodeTime) {
        let (seconds, extra) = t.encode();
        put_u32(&mut self.raw, seconds_off, seconds);
        if self.has_extra(extra_off + 4) {
            put_u32(&mut self.raw, extra_off, extra);
        }
    }
    pub fn atime(&self) -> InodeTime {
        self.time(0x08, 0x8C)
    }
    pub fn set_atime(&mut self, t: InodeTime) {
        self.set_time(0x08, 0x8C, t)
    }
    pub fn ctime(&self) -> InodeTime {
        self.time(0x0C, 0x84)
    }
    pub fn set_ctime(&mut self, t: InodeTime) {
        self.set_time(0x0C, 0x84, t)
    }
    pub fn mtime(&self) -> InodeTime {
        self.time(0x10, 0x88)
    }
    pub fn set_mtime(&mut self, t: InodeTime) {
        self.set_time(0x10, 0x88, t)
    }
    pub fn crtime(&self) -> InodeTime {
        if self.has_extra(0x98) {
            self.time(0x90, 0x94)
        } else {
            InodeTime::default()
        }
    }
    pub fn set_crtime(&mut self, t: InodeTime) {
        if self.has_extra(0x98) {
            self.set_time(0x90, 0x94, t)
        }
    }

    /// The 64-bit change counter: `l_i_version` and, when the extra fields reach it,
    /// `i_version_hi`.
    pub fn version(&self) -> u64 {
        let hi = if self.has_extra(0x9C) {
            u32_at(&self.raw, 0x98)
        } else {
            0
        };
        u64::from(self.version_lo()) | u64::from(hi) << 32
    }
    pub fn set_version(&mut self, version: u64) {
        self.set_version_lo(version as u32);
        if self.has_extra(0x9C) {
            put_u32(&mut self.raw, 0x98, (version >> 32) as u32);
        } else {
            assert!(version >> 32 == 0, "no room for i_version_hi");
        }
    }
    /// The project id (0 when the extra fields do not reach `i_projid`).
    pub fn projid(&self) -> u32 {
        if self.has_extra(0xA0) {
            u32_at(&self.raw, 0x9C)
        } else {
            0
        }
    }
    pub fn set_projid(&mut self, projid: u32) {
        assert!(
            self.has_extra(0xA0) || projid == 0,
            "no room for i_projid with i_extra_isize {}",
            self.extra_isize()
        );
        if self.has_extra(0xA0) {
            put_u32(&mut self.raw, 0x9C, projid);
        }
    }

    /// The bytes after the extra fields: the in-inode xattr area (may be empty).
    pub fn xattr_area(&self) -> &[u8] {
        let start = (GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize())).min(self.raw.len());
        &self.raw[start..]
    }
    pub fn xattr_area_mut(&mut self) -> &mut [u8] {
        let start = (GOOD_OLD_INODE_SIZE + usize::from(self.extra_isize())).min(self.raw.len());
        &mut self.raw[start..]
    }

    /// The checksum this inode should carry (full 32 bits).
    pub fn compute_checksum(&self, fs_seed: u32, ino: u32) -> u32 {
        let seed = inode_seed(fs_seed, ino, self.generation());
        let mut copy = self.raw.clone();
        put_u16(&mut copy, CHECKSUM_LO, 0);
        if self.has_extra(CHECKSUM_HI + 2) {
            put_u16(&mut copy, CHECKSUM_HI, 0);
        }
        crc32c_raw(seed, &copy)
    }

    fn stored_checksum(&self) -> (u32, u32) {
        let lo = u32::from(u16_at(&self.raw, CHECKSUM_LO));
        if self.has_extra(CHECKSUM_HI + 2) {
            (
                lo | u32::from(u16_at(&self.raw, CHECKSUM_HI)) << 16,
                u32::MAX,
            )
        } else {
            (lo, 0xFFFF)
        }
    }

    /// Decodes the record of inode `ino`; `fs_seed` is `Some` with metadata_csum.
    pub fn decode(bytes: &[u8], ino: u32, fs_seed: Option<u32>) -> Result<Inode, FormatError> {
        let err = |problem: String| FormatError::new("inode", Location::Inode { ino }, problem);
        if bytes.len() < GOOD_OLD_INODE_SIZE {
            return Err(err(format!("record of only {} bytes", bytes.len())));
        }
        let inode = Inode {
            raw: bytes.to_vec(),
        };
        if bytes.len() > GOOD_OLD_INODE_SIZE {
            let extra = usize::from(inode.extra_isize());
            if GOOD_OLD_INODE_SIZE + extra > bytes.len() || extra % 4 != 0 {
                return Err(err(format!(
                    "i_extra_isize {extra} does not fit a {}-byte inode",
                    bytes.len()
                )));
            }
        }
        if let Some(seed) = fs_seed {
            let (stored, mask) = inode.stored_checksum();
            let computed = inode.compute_checksum(seed, ino) & mask;
            // An all-zero record is a never-used slot in a lazily initialised table.
            if stored != computed && bytes.iter().any(|&b| b != 0) {
                return Err(err(format!(
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )));
            }
        }
        Ok(inode)
    }

    /// The record with a fresh checksum (when `fs_seed` is `Some`).
    pub fn encode(&self, ino: u32, fs_seed: Option<u32>) -> Vec<u8> {
        let mut out = self.raw.clone();
        if let Some(seed) = fs_seed {
            let csum = self.compute_checksum(seed, ino);
            put_u16(&mut out, CHECKSUM_LO, csum as u16);
            if self.has_extra(CHECKSUM_HI + 2) {
                put_u16(&mut out, CHECKSUM_HI, (csum >> 16) as u16);
            }
        }
        out
    }

    pub fn raw(&self) -> &[u8] {
        &self.raw
    }
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("mode", &format_args!("{:o}", self.mode()))
            .field("size", &self.size())
            .field("links", &self.links_count())
            .field("flags", &format_args!("{:#x}", self.flags()))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_cover_the_extended_epochs() {
        for t in [
            InodeTime {
                seconds: 0,
                nanoseconds: 0,
            },
            InodeTime {
                seconds: -1,
                nanoseconds: 5,
            },
            InodeTime {
                seconds: i64::from(i32::MAX) + 10,
                nanoseconds: 999_999_999,
            },
            InodeTime {
                seconds: 1 << 33,
                nanoseconds: 1,
            },
        ] {
            let (s, e) = t.encode();
            assert_eq!(InodeTime::decode(s, e), t);
        }
    }

    #[test]
    fn round_trips_and_verifies_the_checksum() {
        let mut inode = Inode::new(256, 32);
        inode.set_mode(0o100644);
        inode.set_uid(70000);
        inode.set_gid(5);
        inode.set_size(5 << 32 | 7);
        inode.set_links_count(1);
        inode.set_generation(0xdead);
        inode.set_mtime(InodeTime {
            seconds: 1_700_000_000,
            nanoseconds: 42,
        });
        inode.set_crtime(InodeTime {
            seconds: 3,
            nanoseconds: 4,
        });
        inode.set_file_acl(0x1_0000_0002);
        inode.set_blocks_512(1 << 50, 4096);
        inode.i_block_mut()[0] = 0x0A;
        inode.xattr_area_mut()[0] = 0x00;
        let bytes = inode.encode(12, Some(0x1234));
        let back = Inode::decode(&bytes, 12, Some(0x1234)).unwrap();
        assert_eq!(back.encode(12, Some(0x1234)), bytes);
        assert_eq!(back.uid(), 70000);
        assert_eq!(back.size(), 5 << 32 | 7);
        assert_eq!(back.blocks_512(4096), 1 << 50);
        assert_eq!(back.flags() & flags::HUGE_FILE, flags::HUGE_FILE);
        assert_eq!(
            back.mtime(),
            InodeTime {
                seconds: 1_700_000_000,
                nanoseconds: 42
            }
        );
        assert_eq!(back.file_acl(), 0x1_0000_0002);
        assert_eq!(
            back.crtime(),
            InodeTime {
                seconds: 3,
                nanoseconds: 4
            }
        );
        let err = Inode::decode(&bytes, 13, Some(0x1234)).unwrap_err();
        assert!(err.to_string().contains("inode 13"), "{err}");
        let mut bad = bytes.clone();
        bad[0x80] = 250;
        assert!(Inode::decode(&bad, 12, None)
            .unwrap_err()
            .to_string()
            .contains("i_extra_isize"));
    }

    #[test]
    fn version_and_projid_need_the_extra_fields() {
        let mut inode = Inode::new(256, 32);
        inode.set_version(0x1_0000_0002);
        inode.set_projid(9);
        assert_eq!((inode.version(), inode.projid()), (0x1_0000_0002, 9));
        let mut short = Inode::new(256, 28);
        short.set_version(5);
        assert_eq!((short.version(), short.projid()), (5, 0));
        assert_eq!(&short.raw()[0x9C..0xA0], &[0; 4]);
    }

    #[test]
    fn small_inodes_have_no_extra_fields() {
        let mut inode = Inode::new(128, 0);
        inode.set_mtime(InodeTime {
            seconds: 9,
            nanoseconds: 500,
        });
        assert_eq!(
            inode.mtime(),
            InodeTime {
                seconds: 9,
                nanoseconds: 0
            }
        );
        assert!(inode.xattr_area().is_empty());
        let bytes = inode.encode(5, Some(1));
        Inode::decode(&bytes, 5, Some(1)).unwrap();
    }
}
