//! The ext4 on-disk format: one module per structure, each with its byte layout spelled
//! out at the top, its encoder and decoder side by side, its checksum, and a round-trip
//! test.
//!
//! Decoders check what they read and return a [`FormatError`] that names the structure,
//! where it is, and what is wrong; they never panic on bad bytes and never repair. Encoders
//! assert their own invariants (a value that does not fit its field is a bug above, not a
//! disk problem). All multi-byte integers on disk are little-endian.

use std::fmt;

/// Where a structure sits on disk, for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// The primary superblock (byte 1024) or a backup in the given group.
    Superblock { group: u32 },
    /// A group descriptor.
    GroupDesc { group: u32 },
    /// An inode's fixed record in the inode table.
    Inode { ino: u32 },
    /// The 60-byte `i_block` area of an inode (extent root, inline symlink).
    InodeBlockArea { ino: u32 },
    /// The in-inode extended attribute area.
    InodeXattrArea { ino: u32 },
    /// A file system block; `ino` is the inode it belongs to, when known.
    Block { block: u64, ino: Option<u32> },
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Location::Superblock { group: 0 } => write!(f, "the superblock"),
            Location::Superblock { group } => write!(f, "the backup superblock in group {group}"),
            Location::GroupDesc { group } => write!(f, "group descriptor {group}"),
            Location::Inode { ino } => write!(f, "inode {ino}"),
            Location::InodeBlockArea { ino } => write!(f, "the i_block area of inode {ino}"),
            Location::InodeXattrArea { ino } => write!(f, "the in-inode xattr area of inode {ino}"),
            Location::Block { block, ino: None } => write!(f, "block {block}"),
            Location::Block {
                block,
                ino: Some(ino),
            } => write!(f, "block {block} (of inode {ino})"),
        }
    }
}

/// A structure on disk that does not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatError {
    /// What was being decoded: "superblock", "extent header", "directory entry", ...
    pub structure: &'static str,
    pub location: Location,
    /// What is wrong, with the values seen: "bad magic 0x1234 (expected 0xf30a)".
    pub problem: String,
}

impl FormatError {
    pub fn new(structure: &'static str, location: Location, problem: impl Into<String>) -> Self {
        FormatError {
            structure,
            location,
            problem: problem.into(),
        }
    }
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "corrupt {} at {}: {}",
            self.structure, self.location, self.problem
        )
    }
}

impl std::error::Error for FormatError {}

pub mod acl;
pub mod bitmap;
pub mod csum;
pub mod dirent;
pub mod extent;
pub mod group_desc;
pub mod hash;
pub mod htree;
pub mod indirect;
pub mod inode;
pub mod superblock;
pub mod xattr;

/// Little-endian field access on byte slices, shared by every structure in this module.
pub(crate) mod le {
    pub fn u16_at(b: &[u8], off: usize) -> u16 {
        u16::from_le_bytes([b[off], b[off + 1]])
    }
    pub fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
    }
    pub fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
    }
    pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
        b[off..off + 2].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
        b[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }
    pub fn put_u64(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }
}
