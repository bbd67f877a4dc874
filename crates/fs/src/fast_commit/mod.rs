//! Fast commits (iJournaling, paper 000, in the form ext4 and Linux replay): an fsync of
//! an eligible regular file writes only that file's changes — its inode, its changed
//! block ranges and the directory entries that make it reachable, when those are not yet
//! durable — to the journal's fast-commit area, instead of committing the whole running
//! transaction.
//!
//! - `replay`: applies the fast commits recovery found, as the mount's first transaction.
//!
//! Promises: a fast commit is written only when every transaction before the running one
//! is durable (else recovery would not count it) and after the file's data is durable;
//! what a fast commit cannot say (renames, links, unlinks, xattrs, data journaling)
//! makes fsync fall back to a full commit, counted by reason. Must never: reuse a block or
//! inode number freed by a transaction that is not durable, or clear a file's
//! "uncommitted" state before the transaction holding it is durable.

pub(crate) mod replay;
