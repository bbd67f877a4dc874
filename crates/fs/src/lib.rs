//! The fs layer: ext4 structures and the file system operations built on them.
//!
//! - `format`: every on-disk ext4 structure, encoded and decoded, nothing else.
//! - `geometry`, `groups`, `alloc`, `inodes`: where things are and how they are handed out.
//! - `extent_tree`, `blockmap`, `dir`, `xattr_ops`: behaviour of the structures, written
//!   through `meta::MetaIo` so they are journaled without knowing it.
//! - `namei`, `file`, `truncate`, `orphan`: the operations.
//! - `lock_order`, `inode_table`, `op`: the locks that let operations on different files
//!   run at once, the order they are taken in, and what one operation holds.
//! - `tx`, `state`, `mount`, `api`: transactions, shared state, mounting, and the public
//!   [`Fs`] API.

mod acl;
mod adaptive_journal;
mod alloc;
mod api;
mod blockmap;
pub mod debug;
mod dir;
mod epochs;
pub mod error;
pub mod extent_tree;
pub mod fast_commit;
mod file;
pub mod format;
pub mod fsck;
pub mod geometry;
mod groups;
mod inode_guard;
mod inode_table;
mod inodes;
mod journal_mode;
mod lock_order;
pub mod meta;
pub mod mkfs;
mod mount;
mod namei;
pub mod node_memo;
mod op;
pub mod options;
mod orphan;
mod privileges;
mod state;
mod sync_journaling;
mod truncate;
mod tx;
pub mod types;
mod writeback_policy;
mod xattr_ops;

pub use adaptive_journal::AdaptiveJournalStats;
pub use api::{File, Fs};
pub use error::{FsError, FsResult};
pub use fast_commit::replay::ReplayReport;
pub use fast_commit::{FastCommitStats, Ineligible};
pub use fsck::{fsck, FsckReport};
pub use jext_journal::CommitMode;
pub use journal_mode::FileJournalMode;
pub use mkfs::{mkfs, MkfsOptions, MkfsReport};
pub use mount::{MountReport, NO_JOURNAL_NOTE};
pub use options::{AtimeUpdates, DataMode, ErrorBehavior, IJournal, MountOptions, SmallSyncs};
pub use types::{
    DirEntry, FallocateMode, FileKind, Ino, PrivilegeDrop, RenameFlags, SetAttr, Stat, StatFs,
    Timestamp, ROOT_INO,
};
pub use xattr_ops::XattrSetMode;
