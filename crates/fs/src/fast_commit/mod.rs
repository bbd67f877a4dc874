//! Fast commits (iJournaling, paper 000, in the form ext4 and Linux replay): an fsync of
//! an eligible regular file writes only that file's changes — its inode, the block ranges
//! whose mapping changed, and the directory entries that make it reachable when those are
//! not durable yet — to the journal's fast-commit area, instead of committing the whole
//! running transaction. The running transaction still commits every `commit=` interval.
//!
//! - this module: what each inode and the file system remember between fsyncs, the
//!   eligibility rules, and [`plan`], which turns one fsync into records;
//! - `replay`: applies the fast commits recovery found, as the mount's first transaction.
//!
//! With `ijournal=percore` the same records go to the journal as one jext-private
//! i-transaction in one of the per-core rings (jext_journal's `percore`), the plan's
//! ticket being its sub-transaction id and the first ticket of its tid the point from
//! which recovery replays that tid's i-transactions in order. There a file that
//! journals its data (`data=journal`, `chattr +j`, or for now in memory after small
//! synced appends) is eligible too: its i-transaction carries the blocks the running
//! transaction journaled for it since the last one (`FcInode::uncarried`, noted by
//! `file::writeback`'s `journal_pages`), and recovery writes them home. An ext4 fast
//! commit cannot carry data, so in the default mode such files commit in full.
//!
//! Rules that keep replay right (TECHNIQUES.md §1.4):
//! - a name, range or inode is "uncommitted" while the transaction that changed it is not
//!   durable (compared with the journal's durable tid at each fsync, never cleared early);
//! - what a fast commit cannot say falls back to a full commit, counted by reason: until
//!   the transaction holding a rename, link or xattr change is durable, no fsync writes a
//!   fast commit (as Linux's ineligible window); a file whose orphan-list link changed
//!   commits in full until that is durable; special files always commit in full, and so
//!   do data-journaled files (with `ijournal=percore`, only past [`MAX_CARRIED_BLOCKS`]
//!   blocks in one tid), as does a directory's fsync while the directory is new;
//! - a new file under directories made in the same tid: with `ijournal=percore` its
//!   i-transaction creates them, top down, each once per tid; an ext4 fast commit cannot
//!   (Linux's replay leaves the group's directory count wrong: `plan_new_directories`
//!   says why), so there the fsync commits in full;
//! - a new file whose name went in a directory that grew by a block in a tid not durable
//!   commits in full with ext4 fast commits: Linux's replay of its CREAT would grow the
//!   directory without counting the block in `i_blocks` (`grew_parent` says why);
//! - a directory's fsync is a fast commit of its entries: the pending UNLINKs and the
//!   files created in it that are not durable (see `directory_records`);
//! - unlinks are said, not avoided: every fast commit starts with an UNLINK record for
//!   each name removed since the last durable commit (in order), so that replay removes
//!   a name (and frees its inode) before re-creating it;
//! - blocks freed by a transaction that is not durable are never reused (the allocator's
//!   pending frees), and inode numbers are freed only by operations that close the window.
//!
//! Must never: write a fast commit that names an inode, block or entry whose state it does
//! not also carry, or hand out a ticket that does not reach the journal.

mod new_names;
pub(crate) mod replay;

use crate::blockmap;
use crate::error::FsResult;
use crate::format::inode::flags;
use crate::op::{Op, Reach};
use crate::options::IJournal;
use crate::state::{FsInner, InodeInfo};
use jext_journal::format::fast_commit::{max_range_len, Dentry, FcRecord, OLD_INODE_SIZE};
use jext_journal::format::itransaction::CarriedBlock;
use jext_journal::{tid_gt, FastCommitOutcome, Tid};
use new_names::NewNames;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Why an fsync committed the running transaction instead of writing a fast commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ineligible {
    /// The journal has no fast-commit area (an image without `fast_commit`).
    NoArea,
    /// The mount is `data=journal` or the file is `chattr +j`.
    DataJournaled,
    /// An ordered file journals its data for now (`crate::sync_journaling`, or since a
    /// barrier): its fsync commits the data with the transaction, in one flush.
    JournalsInMemory,
    /// A directory, symlink or special file.
    NotRegular,
    Rename,
    Link,
    /// More unlinks wait for a durable commit than a fast commit carries.
    Unlink,
    /// The file is unlinked but open, or its orphan-list link changed (a long truncate)
    /// in a transaction that is not durable.
    Orphan,
    /// An extended attribute (or ACL) changed.
    Xattr,
    /// A new file's directory chain is deeper than a fast commit carries.
    DeepPath,
    /// A new file's directory was made in the fast commit's transaction (an ext4 fast
    /// commit cannot create it right for Linux; an i-transaction could not, see
    /// `plan_new_directories`), or a directory not yet durable was fsync'd.
    NewDirectory,
    /// A new file's name went in a directory that gained a block in a transaction not
    /// yet durable (ext4 fast commits only: Linux's replay of the CREAT would add the
    /// block without counting it in the directory's `i_blocks`, see [`grew_parent`]).
    DirectoryGrew,
    /// The fast-commit area is full until the running transaction commits.
    AreaFull,
    /// The file's changes are all in a transaction already committing: the fsync waits
    /// for it and writes nothing.
    AlreadyCommitting,
    /// A barrier (fbarrier, fdatabarrier) ordered changes in a transaction not yet
    /// durable, which a fast commit would be replayed without (`crate::epochs`).
    Barrier,
    /// `ijournal=percore`: a file that journals its data changed more blocks of it in the
    /// running transaction than an i-transaction carries.
    TooMuchData,
}

impl Ineligible {
    pub fn name(self) -> &'static str {
        match self {
            Ineligible::NoArea => "no_fast_commit_area",
            Ineligible::DataJournaled => "data_journaled",
            Ineligible::JournalsInMemory => "journals_in_memory",
            Ineligible::NotRegular => "not_regular_file",
            Ineligible::Rename => "rename",
            Ineligible::Link => "link",
            Ineligible::Unlink => "unlink",
            Ineligible::Orphan => "orphan",
            Ineligible::Xattr => "xattr",
            Ineligible::DeepPath => "deep_new_path",
            Ineligible::NewDirectory => "new_directory",
            Ineligible::DirectoryGrew => "directory_grew",
            Ineligible::AreaFull => "area_full",
            Ineligible::AlreadyCommitting => "already_committing",
            Ineligible::Barrier => "barrier",
            Ineligible::TooMuchData => "too_much_data",
        }
    }
}

/// New directories above a new file that one fast commit may create.
const MAX_NEW_ANCESTORS: usize = 32;

/// What an inode remembers for its next fast commit.
#[derive(Clone, Debug, Default)]
pub(crate) struct FcInode {
    /// Logical blocks `[start, end)` whose mapping changed since its last fast commit,
    /// and the newest transaction that changed them.
    pub changed: Option<(u32, u32, Tid)>,
    /// The transaction and `InodeInfo::journaled_changes` its last fast commit that
    /// became durable carried it as of.
    pub fast_committed: Option<(Tid, u64)>,
    /// With `ijournal=percore`, for a file that journals its data: the blocks the running
    /// transaction journaled for it that no i-transaction carried yet.
    pub uncarried: Option<Uncarried>,
}

/// Blocks of a data-journaling file's data journaled in `tid`, by home block, as
/// journaled, waiting for an i-transaction to carry them (`ijournal=percore`).
#[derive(Clone, Debug)]
pub(crate) struct Uncarried {
    pub tid: Tid,
    pub blocks: BTreeMap<u64, Arc<[u8]>>,
    /// More were journaled than an i-transaction carries: the file commits in full
    /// until the next transaction.
    pub too_many: bool,
}

/// Data blocks an i-transaction carries at most for one file in one tid: a larger sync
/// commits in full (a full commit writes every block once for all the fsyncs waiting,
/// and a ring of 32 blocks, the region of a 64 MiB journal split in 8, still holds
/// another i-transaction beside one this size).
const MAX_CARRIED_BLOCKS: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NewName {
    pub parent: u32,
    pub name: Vec<u8>,
    pub tid: Tid,
    /// A regular file (what fast commits can create).
    pub regular: bool,
    /// The newest transaction that changed the parent's block mapping (it grew), as of
    /// the creation: its `FcInode::changed`.
    pub parent_grown: Option<Tid>,
}

impl NewName {
    /// Whether a CREAT of this name, replayed by Linux, may add a block to its parent that
    /// Linux's replay would not count (see [`grew_parent`]).
    fn grew_parent(&self, durable: Tid) -> bool {
        self.parent_grown.is_some_and(|t| tid_gt(t, durable))
    }
}

impl FcInode {
    /// Whether anything here still matters (a transaction named in it is not durable).
    pub fn is_live(&self, durable: Tid) -> bool {
        self.changed.is_some_and(|(_, _, t)| tid_gt(t, durable))
            || self
                .uncarried
                .as_ref()
                .is_some_and(|u| tid_gt(u.tid, durable))
    }

    /// Notes that transaction `tid` journaled `bytes` as the contents of the file's
    /// block `home`. Blocks noted in an earlier tid are dropped: an i-transaction of
    /// `tid` is written only once that one is durable, and it holds them.
    pub fn note_journaled(&mut self, tid: Tid, home: u64, bytes: Arc<[u8]>) {
        let fresh = || Uncarried {
            tid,
            blocks: BTreeMap::new(),
            too_many: false,
        };
        let uncarried = self.uncarried.get_or_insert_with(fresh);
        if uncarried.tid != tid {
            *uncarried = fresh();
        }
        if uncarried.too_many {
            return;
        }
        uncarried.blocks.insert(home, bytes);
        if uncarried.blocks.len() > MAX_CARRIED_BLOCKS {
            uncarried.blocks.clear();
            uncarried.too_many = true;
        }
    }

    /// Whether the blocks noted for `tid` are more than an i-transaction carries.
    fn too_much_data(&self, tid: Tid) -> bool {
        self.uncarried
            .as_ref()
            .is_some_and(|u| u.tid == tid && u.too_many)
    }

    /// The blocks noted for `tid`, taken: each goes in one i-transaction, and a later
    /// one of the same tid replays after it (or not at all, if it is not written).
    fn take_carried(&mut self, tid: Tid) -> Vec<CarriedBlock> {
        match self.uncarried.take() {
            Some(u) if u.tid == tid && !u.too_many => u
                .blocks
                .into_iter()
                .map(|(home, bytes)| CarriedBlock { home, bytes })
                .collect(),
            other => {
                self.uncarried = other;
                Vec::new()
            }
        }
    }

    pub fn note_changed(&mut self, from: u32, to: u64, tid: Tid) {
        let to = to.min(u64::from(u32::MAX)) as u32;
        self.changed = Some(match self.changed {
            Some((s, e, _)) => (s.min(from), e.max(to), tid),
            None => (from, to, tid),
        });
    }
}

/// What the file system remembers for fast commits.
#[derive(Debug, Default)]
pub(crate) struct FcState {
    /// The newest transaction holding a change no fast commit can say, and what it was.
    pub ineligible: Option<(Tid, Ineligible)>,
    /// The ticket the next plan takes (the journal writes fast commits in ticket order;
    /// in `ijournal=percore` it is the i-transaction's sub-transaction id).
    pub next_ticket: u64,
    /// The newest tid planned for and the first ticket planned in it (the first
    /// sub-tid of that tid, from which recovery replays i-transactions in order).
    pub tid_first_ticket: Option<(Tid, u64)>,
    /// Names removed by transactions that may not be durable and not yet carried by a
    /// fast commit, oldest first, with their transactions: the next fast commit starts
    /// with them.
    pub unlinks: Vec<(Tid, Dentry)>,
    /// The names inodes were created with, while not durable (kept here rather than with
    /// the inodes: a new file's fsync looks at the names of the directories above it,
    /// which it does not hold, and a directory's fsync for its new entries).
    new_names: NewNames,
    /// The last transaction that put each inode on or off the orphan list or changed its
    /// link there (a removal changes the predecessor's, which nobody here holds).
    pub orphan_changes: HashMap<u32, Tid>,
    /// Inodes a planned fast commit created (a CREAT), and in which tid: a directory is
    /// created once per tid (a second CREAT of it would replay as a fresh first block,
    /// losing the names put in it since; Linux's replay even fails there, `ext4_append`
    /// finding block 0 mapped).
    pub carried: HashMap<u32, Tid>,
}

/// Removed names a fast commit carries at most; more commit in full until durable.
const MAX_PENDING_UNLINKS: usize = 128;

impl FcState {
    /// Refuses fast commits until transaction `tid` is durable, for `reason`; a fence at
    /// a later transaction stays.
    pub fn fence(&mut self, tid: Tid, reason: Ineligible) {
        match self.ineligible {
            Some((later, _)) if tid_gt(later, tid) => {}
            _ => self.ineligible = Some((tid, reason)),
        }
    }

    /// Remembers a creation (for directory fsyncs, and for the fsyncs of files below a
    /// new directory), forgetting those now durable.
    pub fn note_created(&mut self, name: NewName, ino: u32, durable: Tid) {
        self.new_names.note(ino, name, durable);
    }

    /// The name `ino` was created with, while that creation is not durable.
    pub fn new_name(&self, ino: u32, durable: Tid) -> Option<NewName> {
        self.new_names.get(ino, durable)
    }

    /// Forgets a deleted inode (its number may be reused, by a file elsewhere, though the
    /// allocator avoids that until the deletion is durable). Not its orphan-list change:
    /// until that is durable, the number's record on disk may still sit on the orphan
    /// list, and a fast commit of a new file with the number would replay over it (Linux
    /// takes the record's `i_dtime`, the list's next link, from the fast commit and loses
    /// the orphans after it).
    pub fn forget_inode(&mut self, ino: u32) {
        self.new_names.forget(ino);
        self.carried.remove(&ino);
    }

    /// Whether a fast commit planned in `tid` created `ino`.
    fn carried_in(&self, ino: u32, tid: Tid) -> bool {
        self.carried.get(&ino) == Some(&tid)
    }

    /// Notes the inodes `records` create (taken in `tid`), forgetting what is durable.
    fn note_carried(&mut self, records: &[FcRecord], tid: Tid, durable: Tid) {
        self.carried.retain(|_, t| tid_gt(*t, durable));
        for record in records {
            if let FcRecord::Creat(d) = record {
                self.carried.insert(d.ino, tid);
            }
        }
    }

    /// Notes that `ino`'s orphan-list state changed in transaction `tid`.
    pub fn note_orphan_change(&mut self, ino: u32, tid: Tid) {
        self.orphan_changes.insert(ino, tid);
    }

    /// Whether `ino`'s orphan-list state changed in a transaction that is not durable.
    fn orphan_changed(&mut self, ino: u32, durable: Tid) -> bool {
        self.orphan_changes.retain(|_, t| tid_gt(*t, durable));
        self.orphan_changes.contains_key(&ino)
    }

    /// Remembers an unlink for the fast commits to come; false if too many are pending.
    pub fn note_unlink(&mut self, tid: Tid, parent: u32, ino: u32, name: &[u8]) -> bool {
        if self.unlinks.len() >= MAX_PENDING_UNLINKS {
            return false;
        }
        let name = name.to_vec();
        self.unlinks.push((tid, Dentry { parent, ino, name }));
        true
    }

    /// The UNLINK records of every removal not yet durable nor carried, taken: each goes
    /// in exactly one fast commit. Replay applies every fast commit of a tid in order,
    /// and a later tid means this one is durable, so once is enough; twice would be
    /// wrong when the name and inode number were both reused meanwhile (the second
    /// UNLINK would remove the new file). A fast commit that is then not written leaves
    /// the journal refusing every later one of its tid (see the journal's writer).
    fn unlink_records(&mut self, durable: Tid) -> Vec<FcRecord> {
        self.unlinks
            .drain(..)
            .filter(|(tid, _)| tid_gt(*tid, durable))
            .map(|(_, d)| FcRecord::Unlink(d))
            .collect()
    }
}

/// Fast commits and fallbacks since mount.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FastCommitStats {
    pub fast_commits: u64,
    /// Blocks they took, their carried data blocks included.
    pub fast_commit_blocks: u64,
    /// Data blocks i-transactions carried (`ijournal=percore`).
    pub carried_blocks: u64,
    /// Fast commits found unnecessary when their turn came (the full commit was durable).
    pub obsolete: u64,
    /// Full commits instead, by reason.
    pub fallbacks: BTreeMap<&'static str, u64>,
}

/// One fsync's fast commit, ready for the journal.
pub(crate) struct Plan {
    pub ticket: u64,
    /// The first ticket planned in `tid`.
    pub first_ticket_of_tid: u64,
    pub tid: Tid,
    pub records: Vec<FcRecord>,
    /// Data blocks it carries (`ijournal=percore`, files that journal their data).
    pub data: Vec<CarriedBlock>,
    /// The flush its files' data written in place needs first; `None`: whatever
    /// completed so far (`IoQueue::covering_flush`).
    pub data_flush: Option<u64>,
    /// The regular file this fast commit makes durable, and its
    /// `InodeInfo::journaled_changes` as planned.
    pub file: Option<(u32, u64)>,
}

/// Turns an fsync of `ino` (held by `op`, its data just written back, its newest change
/// in transaction `wanted`) into a fast commit, or says why it must commit in full.
pub(crate) fn plan(op: &mut Op, ino: u32, wanted: Tid) -> FsResult<Result<Plan, Ineligible>> {
    let fs = op.fs;
    let is_dir = op.inode(ino).is_dir();
    let checked = match is_dir {
        true => eligible_directory(fs, ino),
        false => eligible(fs, op.inode(ino), ino),
    };
    if let Err(reason) = checked {
        return Ok(Err(reason));
    }
    let tid = fs.journal.fast_commit_tid();
    if tid != wanted {
        // Everything of the file is in a transaction already committing: waiting for it
        // costs what a fast commit would wait for anyway, and writes nothing more.
        return Ok(Err(Ineligible::AlreadyCommitting));
    }
    let durable = fs.journal.committed_tid();
    if is_dir {
        let mut children = Vec::new();
        let records = match directory_records(op, ino, durable, &mut children)? {
            Ok(records) => records,
            Err(reason) => return Ok(Err(reason)),
        };
        let draft = Draft {
            records,
            file: None,
            data_flush: None,
        };
        let carry = || {
            let mut data = Vec::new();
            for child in children {
                data.extend(op.inode_mut(child).fc.take_carried(tid));
            }
            data
        };
        return Ok(take_ticket(fs, tid, durable, draft, |_| Ok(()), carry));
    }
    let chain = match new_chain(fs, ino, durable) {
        Ok(chain) => chain,
        Err(reason) => return Ok(Err(reason)),
    };
    // A directory above made in this tid. One made in an earlier tid exists wherever this
    // fast commit is replayed: a fast commit is replayed only once its tid's predecessors
    // committed.
    let dirs = match chain.get(1) {
        Some((_, name)) if name.tid == tid => match fs.options.ijournal {
            IJournal::Single => return Ok(Err(Ineligible::NewDirectory)),
            IJournal::PerCore => new_directories(&fs.fc.lock(), &chain, tid),
        },
        _ => Vec::new(),
    };
    if !dirs.is_empty() {
        return plan_new_directories(op, ino, tid, dirs);
    }
    if let Err(reason) = grew_parent(fs, chain.first().map(|(_, name)| name), durable) {
        return Ok(Err(reason));
    }
    let draft = Draft {
        records: file_records(op, ino, chain.first().map(|(_, name)| name), durable)?,
        file: Some((ino, op.inode(ino).journaled_changes)),
        data_flush: in_place_flush(fs, op.inode(ino)),
    };
    let carry = || op.inode_mut(ino).fc.take_carried(tid);
    Ok(take_ticket(fs, tid, durable, draft, |_| Ok(()), carry))
}

/// The flush the data `info`'s file wrote in place needs before a fast commit may point
/// at it; `None`: whatever completed so far. A file that journals its data wrote none in
/// place since it began to (the switch flushed what came before: `journal_mode`), and
/// its i-transactions carry what it journaled since.
fn in_place_flush(fs: &FsInner, info: &InodeInfo) -> Option<u64> {
    match fs.options.ijournal {
        IJournal::PerCore if fs.flags_journal_data(&info.raw) => Some(0),
        IJournal::PerCore if info.journals_in_memory => info.in_place_flush,
        _ => None,
    }
}

/// A regular file's records: for a new one, as Linux writes them, the inode, its blocks,
/// its name (replay links it with one link), and the inode again, which sets the link
/// and block counts from the blocks now mapped; else its blocks and its inode.
fn file_records(
    op: &mut Op,
    ino: u32,
    new_name: Option<&NewName>,
    durable: Tid,
) -> FsResult<Vec<FcRecord>> {
    let fs = op.fs;
    let ranges = range_records(op, ino, durable)?;
    let mut records = Vec::new();
    match new_name {
        Some(name) => {
            records.push(inode_record(fs, op.inode(ino), ino));
            records.extend(ranges);
            records.push(FcRecord::Creat(dentry(name, ino)));
            records.push(inode_record(fs, op.inode(ino), ino));
        }
        None => {
            records.extend(ranges);
            records.push(inode_record(fs, op.inode(ino), ino));
        }
    }
    Ok(records)
}

/// Whether a CREAT of `name` may be replayed by Linux (`ijournal=single`) into a parent
/// that must grow by a block for it: the parent gained one in a transaction not durable
/// when the name went in, by this create or an earlier one (later growth is beside the
/// point: the name found room without it, and finds the same room on replay). Linux 6.18
/// replays a CREAT by adding the name itself (`ext4_fc_replay_create` → `__ext4_link`
/// → `ext4_add_entry` → `ext4_append`); the block comes from
/// `ext4_mb_new_blocks_simple`, which returns before the quota charge that counts it in
/// `i_blocks`, and nothing after counts it: `e2fsck -fn` finds the parent's `i_blocks`
/// one block short (tests/fast_commit_dir_growth.rs, for a linear block, the block that
/// makes a directory indexed, and a leaf split). Linux's own fast commits carry no INODE
/// of a directory (`ext4_fc_track_inode` ignores directories) and so leave the same
/// count. An INODE record of the parent after the CREAT would set the count (its replay
/// recounts `i_blocks` from the extent tree), but it would also set the parent's size
/// and link count as jext holds them, with every change of the transaction that no fast
/// commit carries (another new file's growth, a new subdirectory), and an INODE of the
/// root fails Linux's recovery: so such an fsync commits in full. It is rare (one create
/// in a block's worth of names), and the full commit makes the block durable for the
/// creates after it. jext's replay of an i-transaction (`ijournal=percore`) adds the name
/// through jext's own directory code, which counts the block.
fn grew_parent(fs: &FsInner, name: Option<&NewName>, durable: Tid) -> Result<(), Ineligible> {
    match (fs.options.ijournal, name) {
        (IJournal::Single, Some(name)) if name.grew_parent(durable) => {
            Err(Ineligible::DirectoryGrew)
        }
        _ => Ok(()),
    }
}

/// The directories above a file (`chain`, from [`new_chain`]) made in `tid` that no
/// fast commit created yet, top down: what its fast commit creates before the file.
fn new_directories(fc: &FcState, chain: &[(u32, NewName)], tid: Tid) -> Vec<(u32, NewName)> {
    let uncarried = chain[1..]
        .iter()
        .take_while(|(dir, name)| name.tid == tid && !fc.carried_in(*dir, tid))
        .count();
    chain[1..=uncarried].iter().rev().cloned().collect()
}

/// An fsync of new file `ino` (held by `op`) under directories made in `tid` that no
/// fast commit created yet (`dirs`, top down), with `ijournal=percore`: one
/// i-transaction creates them, each an INODE and a CREAT, then the file. Each directory
/// is created once per tid: replaying a CREAT of a directory gives it a fresh first
/// block, which would lose the names an earlier i-transaction put in it. Only jext's
/// replay applies i-transactions (Linux refuses the journal while one is pending: the
/// JEXT_PERCORE bit), and it leaves a new directory right: counted in its group, its
/// link counts recounted from the entries, sizes and block counts from the blocks
/// (`replay`).
///
/// ext4 fast commits (`ijournal=single`) cannot do this, as Linux 6.18 replays them
/// (fs/ext4/fast_commit.c, ialloc.c); e2fsck -fn finds every such image wrong:
/// - the group's directory count: CREAT and INODE mark the inode used with
///   `ext4_mark_inode_used`, which takes no mode and never raises `bg_used_dirs_count`,
///   and no record reaches `__ext4_new_inode`, the one place that does ("Directories
///   count wrong for group");
/// - a new directory in the root leaves the root's link count one short: CREAT
///   (`ext4_fc_replay_create`) sets the new directory's count to 1 and leaves its
///   parent's, and only an INODE record could set the parent's, but
///   `ext4_fc_replay_inode` calls `ext4_mark_inode_used`, which refuses an inode below
///   `s_first_ino` with -EFSCORRUPTED, and the whole recovery fails (the mount with it).
///
/// Elsewhere the counts can be put right (the directory's INODE again after every
/// CREAT, then the parent's INODE), all but the group's directory count: the test
/// `linux_replays_a_new_directory_with_its_group_count_one_short` (tests/
/// fast_commit_new_dirs.rs) replays such records with Linux. So those fsyncs commit in
/// full.
fn plan_new_directories(
    op: &mut Op,
    ino: u32,
    tid: Tid,
    dirs: Vec<(u32, NewName)>,
) -> FsResult<Result<Plan, Ineligible>> {
    let fs = op.fs;
    // Locked again top down (directories before the file), as a path walk does; a
    // directory deleted meanwhile took the file's name with it.
    op.unlock(ino);
    let mut above = None;
    for &(dir, _) in &dirs {
        let reach = above.map_or(Reach::First, Reach::EntryOf);
        if op.lock(dir, reach).is_err() {
            return Ok(Err(Ineligible::NewDirectory));
        }
        above = Some(dir);
    }
    let reach = above.map_or(Reach::First, Reach::EntryOf);
    if op.lock(ino, reach).is_err() {
        return Ok(Err(Ineligible::NewDirectory));
    }
    // What changed while the file was not held.
    if let Err(reason) = eligible(fs, op.inode(ino), ino) {
        return Ok(Err(reason));
    }
    if fs.journal.fast_commit_tid() != tid {
        return Ok(Err(Ineligible::AlreadyCommitting));
    }
    let durable = fs.journal.committed_tid();
    let chain = match new_chain(fs, ino, durable) {
        Ok(chain) => chain,
        Err(reason) => return Ok(Err(reason)),
    };
    if chain.len() < 2 || new_directories(&fs.fc.lock(), &chain, tid) != dirs {
        return Ok(Err(Ineligible::NewDirectory));
    }
    let extent_mapped = dirs.iter().all(|&(dir, _)| {
        let info = op.inode(dir);
        info.is_dir() && info.raw.flags() & flags::EXTENTS != 0
    });
    if !extent_mapped {
        return Ok(Err(Ineligible::NewDirectory));
    }
    let mut records = Vec::new();
    for (dir, name) in &dirs {
        records.push(inode_record(fs, op.inode(*dir), *dir));
        records.push(FcRecord::Creat(dentry(name, *dir)));
    }
    records.extend(file_records(op, ino, Some(&chain[0].1), durable)?);
    let draft = Draft {
        records,
        file: Some((ino, op.inode(ino).journaled_changes)),
        data_flush: in_place_flush(fs, op.inode(ino)),
    };
    // Another fsync below one of them may have created it since the list was taken.
    let guard = |fc: &FcState| match dirs.iter().any(|&(dir, _)| fc.carried_in(dir, tid)) {
        true => Err(Ineligible::NewDirectory),
        false => Ok(()),
    };
    let carry = || op.inode_mut(ino).fc.take_carried(tid);
    Ok(take_ticket(fs, tid, durable, draft, guard, carry))
}

/// A plan before its ticket and data ([`take_ticket`]).
struct Draft {
    records: Vec<FcRecord>,
    file: Option<(u32, u64)>,
    data_flush: Option<u64>,
}

/// The plan for `draft`, after the UNLINK records of every removal not yet carried,
/// with the next ticket: one critical section, so that a removal is carried by the
/// first fast commit (in ticket order) planned after it, and `guard` judges the state
/// the ticket is taken in (which names fast commits created); if it refuses, no ticket
/// is taken, and nothing is taken from the files: `carry` (their data blocks, which
/// only one i-transaction may take) runs only once the ticket is.
fn take_ticket(
    fs: &FsInner,
    tid: Tid,
    durable: Tid,
    draft: Draft,
    guard: impl FnOnce(&FcState) -> Result<(), Ineligible>,
    carry: impl FnOnce() -> Vec<CarriedBlock>,
) -> Result<Plan, Ineligible> {
    let mut fc = fs.fc.lock();
    guard(&fc)?;
    fc.note_carried(&draft.records, tid, durable);
    let mut all = fc.unlink_records(durable);
    all.extend(draft.records);
    let ticket = fc.next_ticket;
    fc.next_ticket += 1;
    let first_ticket_of_tid = match fc.tid_first_ticket {
        Some((t, first)) if t == tid => first,
        _ => {
            fc.tid_first_ticket = Some((tid, ticket));
            ticket
        }
    };
    let data = carry();
    Ok(Plan {
        ticket,
        first_ticket_of_tid,
        tid,
        records: all,
        data,
        data_flush: draft.data_flush,
        file: draft.file,
    })
}

/// Whether an fsync of `ino` (held by `op`) wanting transaction `wanted` has nothing to
/// commit: the file's last durable fast commit carried it in `wanted` and nothing of it
/// changed since, and no fast commit is owed anything else (an unlink not yet carried, a
/// change only a full commit can carry). Linux writes the fast commit again; jext only
/// flushes the data written in place, as ext4 without fast commits does for an inode
/// whose transaction committed.
pub(crate) fn already_durable(op: &Op, ino: u32, wanted: Tid) -> bool {
    let info = op.inode(ino);
    info.is_reg()
        && info.fc.fast_committed == Some((wanted, info.journaled_changes))
        && op.fs.fc.lock().unlinks.is_empty()
        && eligible(op.fs, info, ino).is_ok()
}

/// Records that `plan`'s fast commit is durable (once `write` said so), in the file's
/// inode, which `op` holds again.
pub(crate) fn note_durable(op: &mut Op, tid: Tid, file: (u32, u64)) {
    let (ino, changes) = file;
    op.inode_mut(ino).fc.fast_committed = Some((tid, changes));
}

/// A directory's fsync makes its entries durable: the names removed from it (every
/// pending UNLINK, as any fast commit starts with) and the files created in it whose
/// creation is not durable, each as a new file's fsync writes it (INODE, its block
/// ranges, CREAT, INODE). Linux makes a directory fsync a fast commit too (of every
/// queued entry change); SQLite's rollback journal fsyncs its directory on every
/// transaction. A child this cannot say (a new directory or special file, an open
/// unlinked file) makes the fsync commit in full. The children are locked here, after
/// the directory, in ascending order (all regular files); those it creates are pushed to
/// `created` (their data goes with them).
fn directory_records(
    op: &mut Op,
    dir: u32,
    durable: Tid,
    created: &mut Vec<u32>,
) -> FsResult<Result<Vec<FcRecord>, Ineligible>> {
    let children = match new_children(op.fs, dir, durable) {
        Ok(children) => children,
        Err(reason) => return Ok(Err(reason)),
    };
    // A child unlinked while still open may have been freed (its last release) since
    // the list was taken: it has nothing to create. One not cached is that, or durable
    // since (a new inode leaves the cache only once durable), so it needs no record.
    let children: Vec<(u32, NewName)> = children
        .into_iter()
        .filter(|(child, _)| op.lock_if_cached(*child, Reach::EntryOf(dir)))
        .collect();
    let mut records = Vec::new();
    for (child, name) in &children {
        let info = op.inode(*child);
        if info.raw.links_count() == 0 {
            // Unlinked since (its UNLINK is pending) but still open: nothing to create.
            continue;
        }
        if let Err(reason) = eligible(op.fs, info, *child) {
            return Ok(Err(reason));
        }
        if let Err(reason) = grew_parent(op.fs, Some(name), durable) {
            return Ok(Err(reason));
        }
        let ranges = range_records(op, *child, durable)?;
        records.push(inode_record(op.fs, op.inode(*child), *child));
        records.extend(ranges);
        records.push(FcRecord::Creat(dentry(name, *child)));
        records.push(inode_record(op.fs, op.inode(*child), *child));
        created.push(*child);
    }
    Ok(Ok(records))
}

/// Each still-new child of `dir` once, by its current name, in ascending inode order (an
/// inode number may have been freed and created again meanwhile; one deleted since has
/// no name left here). A new child that is not a regular file makes the directory's fsync
/// commit in full.
fn new_children(fs: &FsInner, dir: u32, durable: Tid) -> Result<Vec<(u32, NewName)>, Ineligible> {
    let mut children = fs.fc.lock().new_names.created_in(dir, durable);
    if children.iter().any(|(_, name)| !name.regular) {
        return Err(Ineligible::NotRegular);
    }
    children.sort_by_key(|(ino, _)| *ino);
    children.dedup_by_key(|(ino, _)| *ino);
    Ok(children)
}

/// Whether a directory's fsync can be a fast commit: its own creation is durable and
/// no change a fast commit cannot say is pending.
fn eligible_directory(fs: &FsInner, dir: u32) -> Result<(), Ineligible> {
    if fs.journal.fast_commit_area_blocks() == 0 {
        return Err(Ineligible::NoArea);
    }
    let durable = fs.journal.committed_tid();
    let fc = fs.fc.lock();
    if fc.new_name(dir, durable).is_some() {
        return Err(Ineligible::NewDirectory);
    }
    match fc.ineligible {
        Some((tid, reason)) if tid_gt(tid, durable) => Err(reason),
        _ => Ok(()),
    }
}

/// Writes a planned fast commit, or notes why the fsync must commit in full; returns
/// whether the file is durable without a full commit. Called once every data write of
/// the plan's files completed, so that [`jext_io::IoQueue::covering_flush`] covers them.
pub(crate) fn write(fs: &FsInner, plan: Result<Plan, Ineligible>) -> FsResult<bool> {
    let plan = match plan {
        Ok(plan) => plan,
        Err(reason) => {
            note_fallback(fs, reason);
            return Ok(false);
        }
    };
    let data_flush = plan.data_flush.unwrap_or_else(|| fs.io.covering_flush());
    let journal = &fs.journal;
    let outcome = match fs.options.ijournal {
        IJournal::Single => journal.fast_commit(plan.ticket, plan.tid, data_flush, plan.records)?,
        IJournal::PerCore => journal.percore_commit(
            plan.ticket,
            plan.first_ticket_of_tid,
            plan.tid,
            data_flush,
            &plan.records,
            &plan.data,
        )?,
    };
    match outcome {
        FastCommitOutcome::Written { blocks } => {
            let mut stats = fs.fc_stats.lock();
            stats.fast_commits += 1;
            stats.fast_commit_blocks += u64::from(blocks);
            stats.carried_blocks += plan.data.len() as u64;
            Ok(true)
        }
        FastCommitOutcome::Obsolete => {
            fs.fc_stats.lock().obsolete += 1;
            Ok(true)
        }
        FastCommitOutcome::NoRoom => {
            note_fallback(fs, Ineligible::AreaFull);
            Ok(false)
        }
    }
}

fn note_fallback(fs: &FsInner, reason: Ineligible) {
    *fs.fc_stats
        .lock()
        .fallbacks
        .entry(reason.name())
        .or_default() += 1;
}

/// Whether `info` (inode `ino`, held) can be carried by a fast commit.
fn eligible(fs: &FsInner, info: &InodeInfo, ino: u32) -> Result<(), Ineligible> {
    if fs.journal.fast_commit_area_blocks() == 0 {
        return Err(Ineligible::NoArea);
    }
    if !info.is_reg() {
        return Err(Ineligible::NotRegular);
    }
    let durable = fs.journal.committed_tid();
    let mut fc = fs.fc.lock();
    if fc.orphan_changed(ino, durable) || info.raw.links_count() == 0 {
        return Err(Ineligible::Orphan);
    }
    if fs.journals_data(info) {
        match fs.options.ijournal {
            // An ext4 fast commit carries no data: the full commit carries it.
            IJournal::Single if info.journals_in_memory => {
                return Err(Ineligible::JournalsInMemory)
            }
            IJournal::Single => return Err(Ineligible::DataJournaled),
            IJournal::PerCore if info.fc.too_much_data(fs.journal.fast_commit_tid()) => {
                return Err(Ineligible::TooMuchData)
            }
            IJournal::PerCore => {}
        }
    }
    match fc.ineligible {
        Some((tid, reason)) if tid_gt(tid, durable) => Err(reason),
        _ => Ok(()),
    }
}

/// The file and each new directory above it whose creation is not durable, bottom up,
/// with the names they were created with; empty if the file's own name is durable.
fn new_chain(fs: &FsInner, ino: u32, durable: Tid) -> Result<Vec<(u32, NewName)>, Ineligible> {
    let fc = fs.fc.lock();
    let mut chain = Vec::new();
    let mut at = ino;
    while let Some(name) = fc.new_name(at, durable) {
        if chain.len() == MAX_NEW_ANCESTORS {
            return Err(Ineligible::DeepPath);
        }
        let parent = name.parent;
        chain.push((at, name));
        at = parent;
    }
    Ok(chain)
}

fn dentry(name: &NewName, ino: u32) -> Dentry {
    Dentry {
        parent: name.parent,
        ino,
        name: name.name.clone(),
    }
}

/// The inode as the journal would log it: the 128-byte base and its `i_extra_isize`.
fn inode_record(fs: &FsInner, info: &InodeInfo, ino: u32) -> FcRecord {
    // An orphan's link lives in the list (as `Tx::write_inode` writes it): the record
    // carries the bytes its table block holds, as Linux's does.
    let mut inode = info.raw.clone();
    if let Some(next) = crate::orphan::next_of(&fs.orphans.lock(), ino) {
        inode.set_dtime(next);
    }
    let mut raw = inode.encode(ino, fs.csum_seed);
    let len = if fs.geo.inode_size as usize > OLD_INODE_SIZE {
        OLD_INODE_SIZE + usize::from(inode.extra_isize())
    } else {
        OLD_INODE_SIZE
    };
    raw.truncate(len.min(raw.len()));
    FcRecord::Inode { ino, raw }
}

/// ADD_RANGE for every mapped run and DEL_RANGE for every hole in the blocks whose
/// mapping changed since the file's last fast commit (taken: the next starts afresh).
fn range_records(op: &mut Op, ino: u32, durable: Tid) -> FsResult<Vec<FcRecord>> {
    let fs = op.fs;
    let info = op.inode_mut(ino);
    let Some((start, end, tid)) = info.fc.changed.take() else {
        return Ok(Vec::new());
    };
    if !tid_gt(tid, durable) || start >= end {
        return Ok(Vec::new());
    }
    let raw = info.raw.clone();
    let mut records = Vec::new();
    let mut next = start;
    for e in blockmap::extents_in(fs, ino, &raw, u64::from(start), u64::from(end))? {
        let from = e.logical.max(start);
        let to = (u64::from(e.logical) + u64::from(e.len)).min(u64::from(end)) as u32;
        if from > next {
            records.push(FcRecord::DelRange {
                ino,
                lblk: next,
                len: from - next,
            });
        }
        push_add_ranges(
            &mut records,
            ino,
            from,
            to,
            e.start + u64::from(from - e.logical),
            e.unwritten,
        );
        next = next.max(to);
    }
    if next < end {
        records.push(FcRecord::DelRange {
            ino,
            lblk: next,
            len: end - next,
        });
    }
    Ok(records)
}

fn push_add_ranges(
    records: &mut Vec<FcRecord>,
    ino: u32,
    from: u32,
    to: u32,
    pblk: u64,
    unwritten: bool,
) {
    let longest = max_range_len(unwritten);
    let mut at = from;
    while at < to {
        let len = (to - at).min(longest);
        records.push(FcRecord::AddRange {
            ino,
            lblk: at,
            len,
            pblk: pblk + u64::from(at - from),
            unwritten,
        });
        at += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(byte: u8) -> Arc<[u8]> {
        Arc::from(vec![byte; 64])
    }

    fn homes(data: &[CarriedBlock]) -> Vec<(u64, u8)> {
        data.iter().map(|d| (d.home, d.bytes[0])).collect()
    }

    #[test]
    fn journaled_blocks_are_carried_once_with_their_newest_bytes() {
        let mut fc = FcInode::default();
        fc.note_journaled(7, 100, page(1));
        fc.note_journaled(7, 101, page(2));
        fc.note_journaled(7, 100, page(3));
        assert!(fc.is_live(6) && !fc.is_live(7));
        // A plan of another tid takes nothing and leaves them.
        assert!(fc.take_carried(8).is_empty());
        assert_eq!(homes(&fc.take_carried(7)), vec![(100, 3), (101, 2)]);
        assert!(
            fc.take_carried(7).is_empty(),
            "each block goes in one i-transaction"
        );
        // A newer tid drops what an older one noted: its i-transactions wait for it.
        fc.note_journaled(7, 102, page(4));
        fc.note_journaled(8, 103, page(5));
        assert_eq!(homes(&fc.take_carried(8)), vec![(103, 5)]);
    }

    #[test]
    fn more_blocks_than_an_i_transaction_carries_commit_in_full_for_that_tid() {
        let mut fc = FcInode::default();
        for home in 0..=MAX_CARRIED_BLOCKS as u64 {
            fc.note_journaled(9, home, page(1));
        }
        assert!(fc.too_much_data(9) && !fc.too_much_data(10));
        assert!(fc.take_carried(9).is_empty());
        assert!(fc.too_much_data(9), "stays until the tid is over");
        fc.note_journaled(10, 5, page(2));
        assert!(!fc.too_much_data(10));
        assert_eq!(homes(&fc.take_carried(10)), vec![(5, 2)]);
    }
}
