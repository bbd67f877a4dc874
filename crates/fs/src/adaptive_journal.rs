//! `data=adaptive`: the mount picks each regular file's journal mode from what the file
//! does (issue 14 item 3; JoJ leaves the choice to the application, TECHNIQUES.md §3.5).
//!
//! An adaptive mount is ordered. A regular file whose content lives as a rollback
//! journal's does — it is synced (fsync, fdatasync, fbarrier) after small writes (at most
//! [`SMALL_BYTES`] since it was last empty) and then deleted or truncated to 0 within
//! [`SHORT_LIFE`] of its first write — gets the `j` flag, and from then on is exactly a
//! `chattr +j` file of an ordered mount (`crate::journal_mode`):
//! - **deleted** (SQLite's DELETE journal mode): its (directory, name) goes into a
//!   per-mount table of [`REMEMBERED_NAMES`] entries, least recently used dropped first,
//!   in memory only; a regular file created later under a remembered name is born with
//!   `j` (no switch: it has no data yet);
//! - **truncated to 0** (TRUNCATE mode): it switches to journaled at that truncate, when it
//!   has no data and no dirty page, through `journal_mode::prepare_flags_change` with the
//!   file system held alone (the truncate runs exclusive when this is about to happen);
//! - **its header zeroed** (PERSIST mode: SQLite's `zeroJournalHdr` writes 28 zero bytes
//!   at offset 0 and keeps the file): the content ends there as at a truncate, and the
//!   file switches to journaled right after that write, through the same switch path with
//!   the file system held alone (the file keeps its old bytes: the switch writes them
//!   back and flushes the journal first, as `chattr +j` on a file with data does).
//!
//! Everything else stays ordered: a WAL (appended for long, synced at every commit, reset
//! in place) does not end its content within seconds of writing it. The lifetime counts
//! from the first write after the file was empty, not from its create or truncate: a
//! TRUNCATE-mode journal sits empty between transactions for as long as the application
//! is idle, and what marks it is how briefly its content lives.
//!
//! A file the policy journaled goes back to ordered once it grows past [`GROWN_BYTES`] (the
//! rollback journal of a huge transaction, whose every block data journaling would write
//! twice and whose syncs would fill the log). That switch flushes the journal with every
//! operation held off, so it happens at most once per file per mount: after it the policy
//! leaves the file alone. The threshold is 16 times the one that switched it on, so a
//! file near one threshold never flips back and forth.
//!
//! Promises: the choice is the file's on-disk `j` flag (`FS_JOURNAL_DATA_FL`): it survives
//! a remount, Linux ext4 honours it, `lsattr` shows it, commits carry it. It is sticky: the
//! policy switches a file off only if it switched it on in this mount (after a remount a
//! `j` flag looks like the user's and stays), and leaves alone every file whose `j` flag
//! the user changed (`chattr ±j`, [`crate::File::set_journal_mode`]) in this mount.
//!
//! Must never: give `j` to a file that has data except through the switch path, switch a
//! file without holding the file system alone, or keep memory that grows with the number
//! of files it looks at (the name table is bounded; what a file did lives in its in-memory
//! inode, [`FileHistory`], and goes with it; only files the user switched are listed).

use crate::error::FsResult;
use crate::format::inode::flags;
use crate::op::Op;
use crate::state::FsInner;
use crate::tx::Tx;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

/// Most bytes written to a file since it was empty for it to look like a rollback journal.
pub const SMALL_BYTES: u64 = 1 << 20;
/// Longest life of a rollback journal's content, from its first write to its delete or
/// truncate (SQLite's one-row transaction takes well under a millisecond of it).
pub const SHORT_LIFE: Duration = Duration::from_secs(5);
/// Size past which a file the policy journaled goes back to ordered.
pub const GROWN_BYTES: u64 = 16 * SMALL_BYTES;
/// (directory, name) pairs remembered from deleted rollback journals.
pub const REMEMBERED_NAMES: usize = 256;

/// Longest write at offset 0 that, all zeros, ends a file's content as SQLite's PERSIST
/// journal mode ends a transaction's journal (it zeroes the 28-byte header).
pub const ZEROED_HEADER_MAX_BYTES: usize = 512;

/// What a regular file did since it was last empty; kept in its in-memory inode.
#[derive(Clone, Debug, Default)]
pub(crate) struct FileHistory {
    /// The first write since the file was created or truncated to 0.
    first_write: Option<Instant>,
    bytes_written: u64,
    /// Synced since that first write.
    synced: bool,
    /// The policy gave it `j` in this mount (it may take it back once: [`GROWN_BYTES`]).
    policy_journaled: bool,
    /// The policy took `j` back: it leaves the file alone from then on.
    settled: bool,
}

impl FileHistory {
    fn note_write(&mut self, bytes: u64, now: impl FnOnce() -> Instant) {
        if bytes > 0 {
            self.first_write.get_or_insert_with(now);
            self.bytes_written = self.bytes_written.saturating_add(bytes);
        }
    }

    fn note_sync(&mut self) {
        self.synced |= self.first_write.is_some();
    }

    /// Whether the content the file loses at `now` (deleted, or truncated to 0) lived as a
    /// rollback journal's does.
    fn looks_like_rollback_journal(&self, now: Instant) -> bool {
        self.synced
            && self.bytes_written <= SMALL_BYTES
            && self
                .first_write
                .is_some_and(|t| now.saturating_duration_since(t) <= SHORT_LIFE)
    }

    /// The file is empty again: what it wrote before no longer counts.
    fn restart(&mut self) {
        self.first_write = None;
        self.bytes_written = 0;
        self.synced = false;
    }

    /// Whether the policy should take back the `j` it gave a file now `size` bytes long.
    fn grew_out(&self, size: u64) -> bool {
        self.policy_journaled && !self.settled && size > GROWN_BYTES
    }
}

/// What the policy did since mount (`Fs::adaptive_journal_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdaptiveJournalStats {
    /// Deletes of a rollback journal, whose (directory, name) was remembered.
    pub names_remembered: u64,
    /// Files created journaled under a remembered name.
    pub born_journaled: u64,
    /// Files switched to journaled at a truncate to 0.
    pub switched_at_truncate: u64,
    /// Files switched to journaled after their header was zeroed (SQLite's PERSIST mode).
    pub switched_at_zeroed_header: u64,
    /// Files switched back to ordered because they grew past [`GROWN_BYTES`].
    pub switched_off_grown: u64,
}

/// The per-mount part (`FsInner::adaptive`): remembered names, the files the user
/// switched, the counters.
#[derive(Default)]
pub(crate) struct AdaptiveJournal {
    names: NameTable,
    user_chosen: HashSet<u32>,
    stats: AdaptiveJournalStats,
}

impl AdaptiveJournal {
    pub fn stats(&self) -> AdaptiveJournalStats {
        self.stats.clone()
    }
}

type DirName = (u32, Vec<u8>);

/// A least-recently-used set of at most [`REMEMBERED_NAMES`] (directory, name) pairs.
#[derive(Default)]
struct NameTable {
    /// Each pair and when it was last used.
    by_name: HashMap<DirName, u64>,
    /// The same pairs by when they were last used, oldest first.
    by_use: BTreeMap<u64, DirName>,
    clock: u64,
}

impl NameTable {
    fn remember(&mut self, key: DirName) {
        self.clock += 1;
        if let Some(old) = self.by_name.insert(key.clone(), self.clock) {
            self.by_use.remove(&old);
        }
        self.by_use.insert(self.clock, key);
        if self.by_use.len() > REMEMBERED_NAMES {
            let (_, oldest) = self.by_use.pop_first().expect("more than the limit");
            self.by_name.remove(&oldest);
        }
        self.check();
    }

    /// Whether `key` is remembered; a hit counts as a use.
    fn recall(&mut self, key: &DirName) -> bool {
        let hit = self.by_name.contains_key(key);
        if hit {
            self.remember(key.clone());
        }
        hit
    }

    fn check(&self) {
        assert_eq!(
            self.by_name.len(),
            self.by_use.len(),
            "the name table's two indexes hold the same pairs"
        );
        assert!(self.by_name.len() <= REMEMBERED_NAMES);
    }
}

fn is_regular(raw: &crate::format::inode::Inode) -> bool {
    u32::from(raw.mode()) & 0o170000 == 0o100000
}

/// Called in the transaction that creates `ino` as `name` in `parent`: a regular file
/// created under a name a rollback journal had is born journaled.
pub(crate) fn at_create(tx: &mut Tx, parent: u32, name: &[u8], ino: u32) -> FsResult<()> {
    let fs = tx.fs;
    if !fs.options.adaptive_journal {
        return Ok(());
    }
    let regular = is_regular(&tx.inode(ino)?.raw);
    let remembered = {
        let mut table = fs.adaptive.lock();
        // A new file: whatever the user chose for an inode of that number does not hold.
        table.user_chosen.remove(&ino);
        regular && table.names.recall(&(parent, name.to_vec()))
    };
    let info = tx.inode(ino)?;
    // Already journaled (inherited `j`), or DAX, which excludes data journaling.
    if !remembered || info.raw.flags() & (flags::JOURNAL_DATA | flags::DAX) != 0 {
        return Ok(());
    }
    assert_eq!(info.size, 0, "inode {ino} is born with no data");
    info.raw.set_flags(info.raw.flags() | flags::JOURNAL_DATA);
    info.adaptive.policy_journaled = true;
    fs.adaptive.lock().stats.born_journaled += 1;
    Ok(())
}

/// What the policy asks for after a write; the caller runs it with the file system held
/// alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AfterWrite {
    Nothing,
    /// [`switch_on_zeroed_header`]: a rollback journal's header was zeroed.
    SwitchOn,
    /// [`switch_off_grown`]: the file grew out of the journaling the policy gave it.
    SwitchOff,
}

/// Whether writing `data` at `offset` zeroes a file's header, as SQLite's PERSIST journal
/// mode ends a transaction (a rollback journal's header starts with a non-zero magic).
fn zeroes_header(offset: u64, data: &[u8]) -> bool {
    offset == 0
        && !data.is_empty()
        && data.len() <= ZEROED_HEADER_MAX_BYTES
        && data.iter().all(|&b| b == 0)
}

/// After `data` was written at `offset` of `ino`.
pub(crate) fn at_write(op: &mut Op, ino: u32, offset: u64, data: &[u8]) -> AfterWrite {
    if !op.fs.options.adaptive_journal || !op.inode(ino).is_reg() {
        return AfterWrite::Nothing;
    }
    let now = Instant::now();
    if zeroes_header(offset, data) && op.inode(ino).adaptive.first_write.is_some() {
        // The content ends here, as at a truncate to 0: what it wrote no longer counts.
        let switch = switches_on(op, ino, now);
        op.inode_mut(ino).adaptive.restart();
        return match switch {
            true => AfterWrite::SwitchOn,
            false => AfterWrite::Nothing,
        };
    }
    let info = op.inode_mut(ino);
    info.adaptive.note_write(data.len() as u64, || now);
    match info.adaptive.grew_out(info.size) {
        true => AfterWrite::SwitchOff,
        false => AfterWrite::Nothing,
    }
}

/// After a sync of `ino` was planned.
pub(crate) fn at_sync(op: &mut Op, ino: u32) {
    if op.fs.options.adaptive_journal {
        op.inode_mut(ino).adaptive.note_sync();
    }
}

/// After `name` (inode `target`) was removed from `parent`: remembers the name if the file
/// was a rollback journal.
pub(crate) fn at_unlink(op: &Op, parent: u32, name: &[u8], target: u32) {
    let fs = op.fs;
    let info = op.inode(target);
    if !fs.options.adaptive_journal || !info.is_reg() {
        return;
    }
    if info.adaptive.looks_like_rollback_journal(Instant::now()) {
        let mut table = fs.adaptive.lock();
        table.names.remember((parent, name.to_vec()));
        table.stats.names_remembered += 1;
    }
}

/// Whether truncating `ino` to 0 now switches it to journaled (the truncate must then run
/// with the file system held alone).
pub(crate) fn switches_at_truncate(op: &Op, ino: u32) -> bool {
    switches_on(op, ino, Instant::now())
}

/// Whether `ino`'s content, ending at `now`, lived as a rollback journal's, and the policy
/// may give it `j`.
fn switches_on(op: &Op, ino: u32, now: Instant) -> bool {
    may_switch_on(op, ino) && op.inode(ino).adaptive.looks_like_rollback_journal(now)
}

/// Whether the policy may give `ino` the `j` flag: an ordered regular file, not DAX, that
/// neither the user nor the policy's own switch-off settled.
fn may_switch_on(op: &Op, ino: u32) -> bool {
    let fs = op.fs;
    let info = op.inode(ino);
    fs.options.adaptive_journal
        && info.is_reg()
        && !fs.flags_journal_data(&info.raw)
        && info.raw.flags() & flags::DAX == 0
        && !info.adaptive.settled
        && !fs.adaptive.lock().user_chosen.contains(&ino)
}

/// Gives `ino` the `j` flag after its header was zeroed ([`AfterWrite::SwitchOn`]); `op`
/// holds the file system alone. The file has data: the switch path writes it back and
/// flushes the journal before the flag changes. Checks again: the file may have changed
/// since the write.
pub(crate) fn switch_on_zeroed_header(op: &mut Op, ino: u32) -> FsResult<()> {
    if !may_switch_on(op, ino) {
        return Ok(());
    }
    set_journaled(op, ino, true)?;
    op.inode_mut(ino).adaptive.policy_journaled = true;
    op.fs.adaptive.lock().stats.switched_at_zeroed_header += 1;
    Ok(())
}

/// After `ino` was truncated to `size`: at 0 the file starts over, and switches to
/// journaled if its content lived as a rollback journal's (only when `op` holds the file
/// system alone: otherwise the next truncate decides again).
pub(crate) fn at_truncate(op: &mut Op, ino: u32, size: u64) -> FsResult<()> {
    if !op.fs.options.adaptive_journal || size != 0 {
        return Ok(());
    }
    let switch = op.is_exclusive() && switches_at_truncate(op, ino);
    op.inode_mut(ino).adaptive.restart();
    if !switch {
        return Ok(());
    }
    assert_eq!(
        op.inode(ino).size,
        0,
        "inode {ino} switches on with no data"
    );
    set_journaled(op, ino, true)?;
    op.inode_mut(ino).adaptive.policy_journaled = true;
    op.fs.adaptive.lock().stats.switched_at_truncate += 1;
    Ok(())
}

/// Takes back the `j` the policy gave `ino` once it grew past [`GROWN_BYTES`]; `op` holds
/// the file system alone. Checks again: the file may have changed since the write.
pub(crate) fn switch_off_grown(op: &mut Op, ino: u32) -> FsResult<()> {
    let fs = op.fs;
    let info = op.inode(ino);
    let user_chose = fs.adaptive.lock().user_chosen.contains(&ino);
    // A file journaling in memory goes on journaling whatever its flag says, until
    // `journal_mode::stop_journaling_in_memory` finds that safe.
    if user_chose || !fs.flags_journal_data(&info.raw) || !info.adaptive.grew_out(info.size) {
        return Ok(());
    }
    set_journaled(op, ino, false)?;
    let history = &mut op.inode_mut(ino).adaptive;
    history.policy_journaled = false;
    history.settled = true;
    fs.adaptive.lock().stats.switched_off_grown += 1;
    Ok(())
}

/// Before the user changes `ino`'s flags from `old` to `new`: a change of `j` is the
/// user's choice, which the policy leaves alone from then on.
pub(crate) fn at_user_flags(op: &mut Op, ino: u32, old: u32, new: u32) {
    if op.fs.options.adaptive_journal && (old ^ new) & flags::JOURNAL_DATA != 0 {
        op.fs.adaptive.lock().user_chosen.insert(ino);
        op.inode_mut(ino).adaptive.policy_journaled = false;
    }
}

/// Sets or clears `ino`'s `j` flag through the one switch path (`journal_mode`).
fn set_journaled(op: &mut Op, ino: u32, on: bool) -> FsResult<()> {
    assert!(
        op.is_exclusive(),
        "the policy switches with everything held off"
    );
    let old = op.inode(ino).raw.flags();
    let new = match on {
        true => old | flags::JOURNAL_DATA,
        false => old & !flags::JOURNAL_DATA,
    };
    crate::journal_mode::prepare_flags_change(op, ino, new)?;
    let mut tx = Tx::begin(op, 4)?;
    let r = (|| {
        tx.inode(ino)?.raw.set_flags(new);
        tx.write_inode(ino)
    })();
    tx.end(r)?;
    // The flag only: a file journaling in memory journals whatever it says.
    debug_assert_eq!(op.fs.flags_journal_data(&op.inode(ino).raw), on);
    Ok(())
}

impl FsInner {
    /// See [`AdaptiveJournalStats`].
    pub(crate) fn adaptive_journal_stats(&self) -> AdaptiveJournalStats {
        self.adaptive.lock().stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollback_journal(start: Instant, bytes: u64) -> FileHistory {
        let mut h = FileHistory::default();
        h.note_write(bytes, || start);
        h.note_sync();
        h
    }

    #[test]
    fn small_synced_short_lived_content_is_a_rollback_journal() {
        let t0 = Instant::now();
        let h = rollback_journal(t0, 4096 + 512);
        assert!(h.looks_like_rollback_journal(t0 + Duration::from_millis(3)));
        assert!(h.looks_like_rollback_journal(t0 + SHORT_LIFE));
        assert!(!h.looks_like_rollback_journal(t0 + SHORT_LIFE + Duration::from_millis(1)));
    }

    #[test]
    fn unsynced_big_or_empty_content_is_not() {
        let t0 = Instant::now();
        let mut unsynced = FileHistory::default();
        unsynced.note_write(100, || t0);
        assert!(!unsynced.looks_like_rollback_journal(t0));
        assert!(!rollback_journal(t0, SMALL_BYTES + 1).looks_like_rollback_journal(t0));
        let mut never_written = FileHistory::default();
        never_written.note_sync();
        never_written.note_write(0, || t0);
        assert!(!never_written.synced && never_written.first_write.is_none());
        assert!(!never_written.looks_like_rollback_journal(t0));
    }

    #[test]
    fn lifetime_counts_from_the_first_write_after_empty() {
        // A TRUNCATE-mode journal idles empty for a minute, then lives 2 ms.
        let t0 = Instant::now();
        let mut h = rollback_journal(t0, 8192);
        h.restart();
        assert!(
            !h.looks_like_rollback_journal(t0),
            "a restart forgets the past"
        );
        let later = t0 + Duration::from_secs(60);
        h.note_write(8192, || later);
        h.note_write(512, || unreachable!("the first write's time stays"));
        h.note_sync();
        assert_eq!(h.bytes_written, 8192 + 512);
        assert!(h.looks_like_rollback_journal(later + Duration::from_millis(2)));
    }

    #[test]
    fn a_wal_never_looks_like_a_rollback_journal() {
        // Appended and synced for longer than SHORT_LIFE before it is ever reset.
        let t0 = Instant::now();
        let mut wal = FileHistory::default();
        for i in 0..100u64 {
            wal.note_write(4096 + 24, || t0 + Duration::from_millis(100 * i));
            wal.note_sync();
        }
        assert!(!wal.looks_like_rollback_journal(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn only_a_short_all_zero_write_at_offset_0_zeroes_a_header() {
        assert!(zeroes_header(0, &[0; 28]));
        assert!(zeroes_header(0, &[0; ZEROED_HEADER_MAX_BYTES]));
        assert!(
            !zeroes_header(0, &[0; ZEROED_HEADER_MAX_BYTES + 1]),
            "a page of zeros"
        );
        assert!(!zeroes_header(512, &[0; 28]), "not the header");
        assert!(!zeroes_header(0, &[]));
        let mut record_count = [0u8; 28];
        record_count[8] = 1;
        assert!(
            !zeroes_header(0, &record_count),
            "the header's record count"
        );
    }

    #[test]
    fn only_what_the_policy_journaled_grows_out_and_only_once() {
        let mut h = FileHistory::default();
        assert!(!h.grew_out(GROWN_BYTES + 1), "not the policy's");
        h.policy_journaled = true;
        assert!(!h.grew_out(GROWN_BYTES));
        assert!(h.grew_out(GROWN_BYTES + 1));
        h.settled = true;
        assert!(!h.grew_out(u64::MAX));
    }

    #[test]
    fn the_name_table_keeps_the_most_recently_used_names() {
        let mut t = NameTable::default();
        let key = |i: u32| (2, format!("db{i}-journal").into_bytes());
        for i in 0..REMEMBERED_NAMES as u32 {
            t.remember(key(i));
        }
        assert!(t.recall(&key(0)), "a hit makes name 0 the most recent");
        t.remember(key(9999));
        assert_eq!(t.by_name.len(), REMEMBERED_NAMES);
        assert!(t.recall(&key(0)));
        assert!(!t.recall(&key(1)), "the least recently used went");
        assert!(
            !t.recall(&(3, key(2).1)),
            "another directory's name is another key"
        );
        t.remember(key(5));
        t.remember(key(5));
        assert_eq!(t.by_name.len(), REMEMBERED_NAMES, "a repeat is one entry");
    }
}
