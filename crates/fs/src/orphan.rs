//! The orphan list: inodes that must be finished after a crash.
//!
//! An inode whose last name is gone while it is still open, or whose truncate spans
//! several transactions, is put on the list (`s_last_orphan` in the superblock, each
//! orphan's `i_dtime` naming the next). At mount, every orphan is finished: deleted if it
//! has no links, truncated to its size otherwise. The list is changed in the same
//! transaction as the change that makes an inode an orphan, so a crash can never leave an
//! unreachable inode holding blocks.

use crate::error::FsResult;
use crate::tx::Tx;

/// Puts `ino` at the head of the orphan list.
pub(crate) fn add(tx: &mut Tx, ino: u32) -> FsResult<()> {
    if tx.st.orphans.contains(&ino) {
        return Ok(());
    }
    tx.note_orphan_change(ino);
    let head = tx.st.sb.last_orphan();
    tx.inode(ino)?.raw.set_dtime(head);
    tx.write_inode(ino)?;
    tx.st.sb.set_last_orphan(ino);
    tx.write_superblock()?;
    tx.st.orphans.insert(0, ino);
    Ok(())
}

/// Takes `ino` off the orphan list (a no-op if it is not on it).
pub(crate) fn remove(tx: &mut Tx, ino: u32) -> FsResult<()> {
    let Some(i) = tx.st.orphans.iter().position(|&o| o == ino) else {
        return Ok(());
    };
    tx.note_orphan_change(ino);
    let next = tx.st.orphans.get(i + 1).copied().unwrap_or(0);
    if i == 0 {
        tx.st.sb.set_last_orphan(next);
        tx.write_superblock()?;
    } else {
        let prev = tx.st.orphans[i - 1];
        tx.note_orphan_change(prev);
        tx.inode(prev)?.raw.set_dtime(next);
        tx.write_inode(prev)?;
    }
    tx.inode(ino)?.raw.set_dtime(0);
    tx.st.orphans.remove(i);
    Ok(())
}
