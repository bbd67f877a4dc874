//! The orphan list: inodes that must be finished after a crash.
//!
//! An inode whose last name is gone while it is still open, or whose truncate spans
//! several transactions, is put on the list (`s_last_orphan` in the superblock, each
//! orphan's `i_dtime` naming the next). At mount, every orphan is finished: deleted if it
//! has no links, truncated to its size otherwise. The list is changed in the same
//! transaction as the change that makes an inode an orphan, so a crash can never leave an
//! unreachable inode holding blocks.
//!
//! The list in memory (`FsInner::orphans`) is the truth about every link. Taking an inode
//! off the list changes its predecessor's link, and the predecessor is an inode this
//! operation does not hold (another may be changing it): so the link is patched into the
//! predecessor's record in its table block, under the list's lock, and every write of an
//! orphan's record takes its link from the list under the same lock
//! (`Tx::write_inode`, [`next_of`]), so neither write loses the other's.

use crate::error::FsResult;
use crate::format::inode::Inode;
use crate::tx::Tx;

/// The link `ino`'s record must carry if it is on the list (`list`, head first): the next
/// orphan, or 0 at the tail; `None` if it is not an orphan.
pub(crate) fn next_of(list: &[u32], ino: u32) -> Option<u32> {
    let at = list.iter().position(|&o| o == ino)?;
    Some(list.get(at + 1).copied().unwrap_or(0))
}

/// Puts `ino` (held by the operation) at the head of the orphan list.
pub(crate) fn add(tx: &mut Tx, ino: u32) -> FsResult<()> {
    {
        let mut list = tx.fs.orphans.lock();
        if list.contains(&ino) {
            return Ok(());
        }
        list.insert(0, ino);
        tx.fs.sb.lock().set_last_orphan(ino);
    }
    tx.note_orphan_change(ino);
    tx.write_inode(ino)?;
    tx.write_superblock()
}

/// Takes `ino` off the orphan list (a no-op if it is not on it).
pub(crate) fn remove(tx: &mut Tx, ino: u32) -> FsResult<()> {
    loop {
        // The predecessor's table block is read before the list is locked (a read must
        // not happen under it), then the list is looked at again.
        let Some(prev) = predecessor(tx, ino) else {
            return Ok(());
        };
        let prev_block = match prev {
            Some(p) => Some(crate::inodes::table_location(tx.fs, p)?),
            None => None,
        };
        let prev_buf = match prev_block {
            Some((block, _)) => Some(tx.buffer(block)?),
            None => None,
        };
        let fs = tx.fs;
        let mut list = fs.orphans.lock();
        let Some(at) = list.iter().position(|&o| o == ino) else {
            return Ok(());
        };
        let now_prev = at.checked_sub(1).map(|i| list[i]);
        if now_prev != prev {
            continue;
        }
        let next = list.get(at + 1).copied().unwrap_or(0);
        list.remove(at);
        match (prev, prev_block, prev_buf) {
            (Some(p), Some((_, offset)), Some(buf)) => {
                let size = fs.geo.inode_size as usize;
                let seed = fs.csum_seed;
                let mut raw = buf.read(|b| Inode::decode(&b[offset..offset + size], p, seed))?;
                raw.set_dtime(next);
                let bytes = raw.encode(p, seed);
                tx.modify_buf(&buf, |b| {
                    b[offset..offset + bytes.len()].copy_from_slice(&bytes)
                })?;
                drop(list);
                tx.note_orphan_change(p);
            }
            _ => {
                fs.sb.lock().set_last_orphan(next);
                drop(list);
                tx.write_superblock()?;
            }
        }
        tx.note_orphan_change(ino);
        tx.inode(ino)?.raw.set_dtime(0);
        return Ok(());
    }
}

/// `None` if `ino` is not an orphan, else its predecessor on the list (`None` at the
/// head).
fn predecessor(tx: &Tx, ino: u32) -> Option<Option<u32>> {
    let list = tx.fs.orphans.lock();
    let at = list.iter().position(|&o| o == ino)?;
    Some(at.checked_sub(1).map(|i| list[i]))
}

#[cfg(test)]
mod tests {
    use super::next_of;

    #[test]
    fn each_orphan_links_to_the_next_and_the_tail_to_nothing() {
        let list = [12, 40, 7];
        assert_eq!(next_of(&list, 12), Some(40));
        assert_eq!(next_of(&list, 40), Some(7));
        assert_eq!(next_of(&list, 7), Some(0));
        assert_eq!(next_of(&list, 99), None);
    }
}
