//! The fs layer: ext4 structures and the file system operations built on them.
//!
//! `format` encodes and decodes every on-disk ext4 structure and nothing else; the
//! modules above it give those structures behaviour (allocation, extent trees, directories,
//! xattrs, orphans) and journal every change through the layers below.

pub mod format;
