//! The fast-commit area's writer: appends one fast commit (records the file system
//! built for one fsync) to the area after the log, and makes it durable.
//!
//! A fast commit carries the running transaction's tid and counts at recovery only while
//! that tid is the first one not in the log. So the writer:
//! 1. waits until every earlier transaction is durable (else recovery would stop before
//!    the fast commit's tid and drop it);
//! 2. skips the write if the tid itself became durable meanwhile (its full commit holds
//!    everything the fast commit would say);
//! 3. starts the area over (with a HEAD) at the first fast commit of a new tid: the older
//!    tid is durable, so what the area held is obsolete;
//! 4. writes the blocks after a flush (the file's data, written before, must be durable
//!    before anything points at it) and makes them durable (FUA), as Linux's
//!    `REQ_PREFLUSH | REQ_FUA` on the tail block (see [`write_durably`]).
//!
//! Fast commits are written in ticket order (the order the file system planned them in,
//! under its lock): replay applies records in log order, so a newer inode image must
//! never land before an older one. An area without room refuses, and the caller commits
//! in full instead; so does every later fast commit of the same tid, which may rely on
//! records the refused one carried. Must never: write a fast commit of a tid whose predecessor is not
//! durable, or overwrite the area while a tid it holds is not durable.

use crate::format::fast_commit::{FastCommitWriter, FcRecord};
use crate::journal::Shared;
use crate::tid::{tid_geq, Tid};
use crate::JournalError;
use jext_io::{IoFlags, WriteRequest};
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

/// What became of one fast commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastCommitOutcome {
    /// Written and durable, in this many blocks.
    Written { blocks: u32 },
    /// Its tid was durable before it was written: nothing to write.
    Obsolete,
    /// The area (or the journal: no fast-commit area) has no room: commit in full.
    NoRoom,
}

/// The area's state: which tid it holds and where the next fast commit goes.
pub(crate) struct FastCommitArea {
    /// First journal block of the area and its length (0 without the feature).
    pub(crate) first: u32,
    pub(crate) len: u32,
    state: Mutex<AreaState>,
    turn: Condvar,
}

struct AreaState {
    /// The tid the area's fast commits carry, if any was written since load.
    tid: Option<Tid>,
    /// The area block the next fast commit starts at.
    next_block: u32,
    /// The ticket whose turn it is.
    next_ticket: u64,
    /// A fast commit of this tid was not written (no room): no later one of the tid may
    /// be, since it may rely on what the unwritten one carried (an unlink said once).
    failed_tid: Option<Tid>,
}

impl FastCommitArea {
    pub(crate) fn new(first: u32, len: u32) -> FastCommitArea {
        FastCommitArea {
            first,
            len,
            state: Mutex::new(AreaState {
                tid: None,
                next_block: 0,
                next_ticket: 0,
                failed_tid: None,
            }),
            turn: Condvar::new(),
        }
    }
}

/// Writes fast commit `ticket` (tickets are handed out 0, 1, 2, ... by the caller, and
/// every ticket must be passed here exactly once, even when there is nothing to write).
pub(crate) fn write(
    shared: &Shared,
    ticket: u64,
    tid: Tid,
    records: &[FcRecord],
) -> Result<FastCommitOutcome, JournalError> {
    let area = &shared.fast_commits;
    let mut st = area.state.lock();
    while st.next_ticket != ticket {
        area.turn.wait(&mut st);
    }
    let outcome = write_in_turn(shared, &mut st, tid, records);
    st.next_ticket += 1;
    area.turn.notify_all();
    outcome
}

fn write_in_turn(
    shared: &Shared,
    st: &mut AreaState,
    tid: Tid,
    records: &[FcRecord],
) -> Result<FastCommitOutcome, JournalError> {
    let area = &shared.fast_commits;
    if area.len == 0 {
        return Ok(FastCommitOutcome::NoRoom);
    }
    shared.wait_for(tid.wrapping_sub(1), true)?;
    if tid_geq(shared.committed(), tid) {
        return Ok(FastCommitOutcome::Obsolete);
    }
    if st.failed_tid == Some(tid) {
        return Ok(FastCommitOutcome::NoRoom);
    }
    let first_of_tid = st.tid != Some(tid);
    let start = if first_of_tid { 0 } else { st.next_block };
    let block_size = shared.area.block_size as usize;
    let mut writer = FastCommitWriter::new(block_size, tid, first_of_tid);
    let no_room = |st: &mut AreaState| {
        st.failed_tid = Some(tid);
        Ok(FastCommitOutcome::NoRoom)
    };
    for record in records {
        writer.push(record);
        if start as usize + writer.blocks_so_far() > area.len as usize {
            return no_room(st);
        }
    }
    let blocks = writer.finish();
    if start as usize + blocks.len() > area.len as usize {
        return no_room(st);
    }
    shared.point_superblock_at_log(tid)?;
    let written = write_durably(shared, area.first + start, blocks)?;
    st.tid = Some(tid);
    st.next_block = start + written;
    shared.note_fast_commit(written);
    Ok(FastCommitOutcome::Written { blocks: written })
}

/// Writes `blocks` from journal block `first` and returns their count once they are
/// durable. First a flush: the file's data, written (and waited for) before, must be
/// durable before anything points at it; it is a flush of its own rather than a PREFLUSH
/// on the first block, because a PREFLUSH write holds back every write issued after it
/// until its flush is done, which would make concurrent fsyncs (other files' data
/// writes, other rings) queue behind this one; concurrent flushes are shared. Then every
/// block with FUA (they merge into one FUA write): a FUA only on the last would leave
/// the others in the device's cache when the fsync returns.
pub(crate) fn write_durably(
    shared: &Shared,
    first: u32,
    blocks: Vec<Vec<u8>>,
) -> Result<u32, JournalError> {
    let count = blocks.len() as u32;
    let flags = if shared.config.barrier {
        shared.io.flush()?;
        IoFlags::FUA
    } else {
        IoFlags::empty()
    };
    let requests = blocks
        .into_iter()
        .enumerate()
        .map(|(i, block)| {
            let offset = shared.area.byte_offset(first + i as u32);
            WriteRequest::new(offset, Arc::<[u8]>::from(block), flags)
        })
        .collect();
    shared.io.submit(requests).wait()?;
    Ok(count)
}
