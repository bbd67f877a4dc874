//! The fs layer: ext4 structures and the file system operations built on them.
//!
//! `format` encodes and decodes every on-disk ext4 structure and nothing else; the
//! modules above it give those structures behaviour (allocation, extent trees, directories,
//! xattrs, orphans) and journal every change through the layers below.

pub mod error;
pub mod extent_tree;
pub mod format;
pub mod geometry;
pub mod meta;
pub mod options;
pub mod types;

pub use error::{FsError, FsResult};
pub use options::{DataMode, ErrorBehavior, MountOptions};
