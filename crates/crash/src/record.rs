//! Recording: runs a workload on a fresh image over the simulated device with capture on,
//! and keeps, beside the device log, what the oracle needs: where each operation's
//! requests start and end in the log, what every path held after each operation (the
//! timeline), and what each completed sync call promised.
//!
//! The expected states come from the live file system itself (read after each operation
//! through the same [`read_node`] used on the recovered image); the model tests check
//! that live behaviour, this module checks that it survives crashes.

use crate::mode::Mode;
use crate::snapshot::{read_node, Identity, Node};
use crate::workload::{pattern, Falloc, Op, Workload};
use jext_device::{CrashCapture, SimDevice, SimFault};
use jext_fs::format::acl::{self, Acl, AclEntry};
use jext_fs::{
    mkfs, FallocateMode, FileJournalMode, Fs, FsError, FsResult, Ino, MkfsOptions, MountOptions,
    RenameFlags, SetAttr, XattrSetMode,
};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The simulated disk: small, so that each recovery and check is cheap.
pub const IMAGE_BYTES: u64 = 32 << 20;
const BLOCK_SIZE: u32 = 4096;
const JOURNAL_BLOCKS: u32 = 1024;
/// Writes in setup use op numbers from here, so their pattern differs from the ops'.
const SETUP_PATTERN_BASE: usize = 200;

/// Which parts of a path's state a completed sync call made durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aspects {
    /// What the path names (which inode, or nothing).
    pub exists: bool,
    /// Size and bytes.
    pub content: bool,
    /// Permissions, owner, link count, mtime, xattrs.
    pub meta: bool,
}

const ALL: Aspects = Aspects {
    exists: true,
    content: true,
    meta: true,
};

/// A promise: from device-log index `done_at` on, `aspects` of the path hold at least
/// their state after operation `state - 1`. A sync call's holds at every crash after
/// `done_at`; a barrier's (`ordered`) only at a crash whose recovered file system shows
/// the effect of a later operation, since a barrier orders without making durable.
#[derive(Clone, Copy, Debug)]
pub struct Promise {
    pub done_at: usize,
    pub state: usize,
    pub aspects: Aspects,
    pub ordered: bool,
}

/// Where a crash happened (after device-log entries `..point`) and how far its recovery
/// got: `seen` is the latest state some path shows that no earlier state explains.
#[derive(Clone, Copy, Debug)]
pub struct CrashAt {
    pub point: usize,
    pub seen: usize,
}

impl Promise {
    fn holds_at(&self, at: CrashAt) -> bool {
        if self.ordered {
            self.done_at <= at.point && self.state < at.seen
        } else {
            self.done_at <= at.point
        }
    }
}

/// A recorded run.
pub struct Recording {
    pub workload: Workload,
    pub mode: Mode,
    pub capture: CrashCapture,
    pub timeline: Timeline,
    /// Fsyncs that wrote a fast commit instead of a full one.
    pub fast_commits: u64,
}

/// What the workload did, operation by operation, beside the device log.
pub struct Timeline {
    /// Every path the workload can make exist.
    pub paths: Vec<String>,
    /// Per operation, the range of device-log indices its requests (and its mark) took.
    pub spans: Vec<(usize, usize)>,
    /// Per path, (state index, node) at each change; state 0 is before the first op,
    /// state k + 1 after op k.
    pub history: Vec<Vec<(usize, Arc<Node>)>>,
    /// Per inode, (state index, node) at each change, whatever its path: a file keeps
    /// its history across renames.
    pub inode_history: HashMap<Ino, Vec<(usize, Arc<Node>)>>,
    /// Per path, the promises of what it names (`exists`), in order.
    pub promises: Vec<Vec<Promise>>,
    /// Per inode, the promises of its content and attributes, in order.
    pub inode_promises: HashMap<Ino, Vec<Promise>>,
}

/// The mount options every recording and recovery uses: no timer commits, so the
/// request log depends only on the workload.
pub fn mount_options(mode: Mode) -> MountOptions {
    MountOptions {
        data_mode: mode.data,
        adaptive_journal: mode.adaptive,
        journal_commit: mode.commit,
        journal_records: mode.records,
        ijournal: mode.ijournal,
        small_syncs: mode.small_syncs,
        commit_interval_ms: 3_600_000,
        ..MountOptions::default()
    }
}

/// Runs `workload` in `mode` from a fresh image. A failing setup or a file system error
/// while reading the expected states is an error; an op that fails (unlink of a missing
/// file) changes nothing and promises nothing.
pub fn record(workload: &Workload, mode: Mode, fault: Option<SimFault>) -> FsResult<Recording> {
    let dev = Arc::new(SimDevice::new(IMAGE_BYTES));
    mkfs(
        dev.clone(),
        &MkfsOptions {
            block_size: Some(BLOCK_SIZE),
            journal_blocks: Some(JOURNAL_BLOCKS),
            assume_zeroed: true,
            uuid: Some([7; 16]),
            ..MkfsOptions::default()
        },
    )?;
    let fs = Fs::open(dev.clone(), mount_options(mode))?;
    for (i, op) in workload.setup.iter().enumerate() {
        apply(&fs, op, SETUP_PATTERN_BASE + i)
            .map_err(|e| FsError::Invalid(format!("setup op {i} ({op}) failed: {e}")))?;
    }
    fs.sync()?;
    let paths = workload.paths();
    let mut timeline = Timeline {
        promises: vec![Vec::new(); paths.len()],
        history: Vec::with_capacity(paths.len()),
        paths,
        spans: Vec::new(),
        inode_history: HashMap::new(),
        inode_promises: HashMap::new(),
    };
    for i in 0..timeline.paths.len() {
        let node = Arc::new(read_node(&fs, &timeline.paths[i])?);
        timeline.note_inode_state(0, &node);
        timeline.history.push(vec![(0, node)]);
    }
    if let Some(fault) = fault {
        dev.inject(fault);
    }
    dev.start_capture();
    for (k, op) in workload.ops.iter().enumerate() {
        let start = dev.capture_len();
        let result = apply(&fs, op, k);
        let promises = (op.is_sync() || op.is_barrier()) && result.is_ok();
        if promises {
            dev.mark(format!("op {k} ({op}) returned"));
        }
        let end = dev.capture_len();
        timeline.spans.push((start, end));
        timeline.snapshot_after(&fs, op, k)?;
        if promises {
            timeline.promise(op, end, k + 1);
        }
    }
    Ok(Recording {
        workload: workload.clone(),
        mode,
        capture: dev.take_capture().expect("the capture was started"),
        timeline,
        fast_commits: fs.fast_commit_stats().fast_commits,
    })
}

impl Timeline {
    /// The node of path `i` at state `s`.
    pub fn node_at(&self, i: usize, s: usize) -> &Arc<Node> {
        let h = &self.history[i];
        let at = h.partition_point(|(state, _)| *state <= s);
        &h[at - 1].1
    }

    /// The first state at which path `i` held a node like `identity`, if it ever did.
    pub fn first_state_like(&self, i: usize, identity: &Identity) -> Option<usize> {
        self.history[i]
            .iter()
            .find(|(_, node)| &node.identity() == identity)
            .map(|(state, _)| *state)
    }

    /// The distinct nodes path `i` held over states `from..=to`, with the first state
    /// of each.
    pub fn nodes_between(&self, i: usize, from: usize, to: usize) -> Vec<(usize, &Arc<Node>)> {
        let h = &self.history[i];
        let first = h.partition_point(|(state, _)| *state <= from) - 1;
        h[first..]
            .iter()
            .take_while(|(state, _)| *state <= to)
            .map(|(state, node)| ((*state).max(from), node))
            .collect()
    }

    /// The last state whose effects may be on disk at a crash after log entries
    /// `..point`: after the last op that had issued a request before the crash.
    pub fn last_possible_state(&self, point: usize) -> usize {
        self.spans
            .iter()
            .rposition(|(start, _)| *start < point)
            .map_or(0, |k| k + 1)
    }

    /// The state from which what path `i` names is promised at crash `at`.
    pub fn promised_state(&self, i: usize, at: CrashAt) -> usize {
        latest_promise(&self.promises[i], at, |a| a.exists)
    }

    /// The state from which `aspect` of inode `ino` is promised at crash `at`.
    pub fn promised_inode_state(
        &self,
        ino: Ino,
        at: CrashAt,
        aspect: impl Fn(&Aspects) -> bool,
    ) -> usize {
        self.inode_promises
            .get(&ino)
            .map_or(0, |p| latest_promise(p, at, aspect))
    }

    /// The states inode `ino` went through over `from..=to` (the one it was in at
    /// `from` included).
    pub fn inode_states(&self, ino: Ino, from: usize, to: usize) -> Vec<&Arc<Node>> {
        let Some(h) = self.inode_history.get(&ino) else {
            return Vec::new();
        };
        let first = h
            .partition_point(|(state, _)| *state <= from)
            .saturating_sub(1);
        h[first..]
            .iter()
            .take_while(|(state, _)| *state <= to)
            .map(|(_, node)| node)
            .collect()
    }

    fn note_inode_state(&mut self, state: usize, node: &Arc<Node>) {
        let Some(ino) = Node::ino(node) else { return };
        let h = self.inode_history.entry(ino).or_default();
        if h.last().is_none_or(|(_, last)| last != node) {
            h.push((state, node.clone()));
        }
    }

    fn index_of(&self, path: &str) -> Option<usize> {
        self.paths.binary_search_by(|p| p.as_str().cmp(path)).ok()
    }

    /// Reads again every path op `k` may have changed: the paths it names, what lies
    /// under them, and every other name of the inodes involved.
    fn snapshot_after(&mut self, fs: &Fs, op: &Op, k: usize) -> FsResult<()> {
        let named: Vec<&str> = op.paths();
        if named.is_empty() {
            return Ok(());
        }
        let state = k + 1;
        let mut inos: HashSet<Ino> = HashSet::new();
        for p in &named {
            if let Some(i) = self.index_of(p) {
                inos.extend(Node::ino(self.node_at(i, state)));
            }
            inos.extend(Node::ino(&read_node(fs, p)?));
        }
        for i in 0..self.paths.len() {
            let path = &self.paths[i];
            let under = named
                .iter()
                .any(|n| path == n || path.strip_prefix(n).is_some_and(|r| r.starts_with('/')));
            let same_inode = Node::ino(self.node_at(i, state)).is_some_and(|x| inos.contains(&x));
            if !under && !same_inode {
                continue;
            }
            let node = read_node(fs, path)?;
            if **self.node_at(i, state) != node {
                let node = Arc::new(node);
                self.note_inode_state(state, &node);
                self.history[i].push((state, node));
            }
        }
        Ok(())
    }

    /// Notes what a completed sync call or barrier promised.
    fn promise(&mut self, op: &Op, done_at: usize, state: usize) {
        let mut promised: Vec<(usize, Aspects)> = Vec::new();
        match op {
            Op::Sync | Op::RemountCycle => promised.extend((0..self.paths.len()).map(|i| (i, ALL))),
            Op::Fsync(p) | Op::Fdatasync(p) | Op::Fbarrier(p) | Op::Fdatabarrier(p) => {
                let datasync = matches!(op, Op::Fdatasync(_) | Op::Fdatabarrier(_));
                let Some(i) = self.index_of(p) else { return };
                let is_dir = matches!(**self.node_at(i, state), Node::Dir { .. });
                promised.push((
                    i,
                    Aspects {
                        exists: true,
                        content: !is_dir,
                        meta: !datasync,
                    },
                ));
                if is_dir {
                    let children = (0..self.paths.len()).filter(|&c| {
                        self.paths[c]
                            .rsplit_once('/')
                            .is_some_and(|(parent, _)| parent == p)
                    });
                    promised.extend(children.map(|c| {
                        (
                            c,
                            Aspects {
                                exists: true,
                                ..Aspects::default()
                            },
                        )
                    }));
                }
            }
            _ => unreachable!("only sync calls and barriers promise"),
        }
        for (i, aspects) in promised {
            let promise = Promise {
                done_at,
                state,
                aspects,
                ordered: op.is_barrier(),
            };
            self.promises[i].push(promise);
            if let Some(ino) = Node::ino(self.node_at(i, state)) {
                if aspects.content || aspects.meta {
                    self.inode_promises.entry(ino).or_default().push(promise);
                }
            }
        }
    }
}

fn latest_promise(promises: &[Promise], at: CrashAt, aspect: impl Fn(&Aspects) -> bool) -> usize {
    promises
        .iter()
        .filter(|p| p.holds_at(at) && aspect(&p.aspects))
        .map(|p| p.state)
        .max()
        .unwrap_or(0)
}

/// The parent directory's inode and the last name of `path`.
/// `u::rw-,u:UID:r--,g::r--,m::r--,o::---`: an ACL no mode can say (a named user).
fn read_for(uid: u32) -> Acl {
    let entry = |tag, perm, id| AclEntry { tag, perm, id };
    Acl {
        entries: vec![
            entry(acl::TAG_USER_OBJ, 6, 0),
            entry(acl::TAG_USER, 4, uid),
            entry(acl::TAG_GROUP_OBJ, 4, 0),
            entry(acl::TAG_MASK, 4, 0),
            entry(acl::TAG_OTHER, 0, 0),
        ],
    }
}

fn parent_and_name<'p>(fs: &Fs, path: &'p str) -> FsResult<(Ino, &'p [u8])> {
    let (dir, name) = path
        .rsplit_once('/')
        .ok_or_else(|| FsError::Invalid(format!("{path:?} is not absolute")))?;
    Ok((fs.resolve(dir)?, name.as_bytes()))
}

/// Performs one operation; `op_index` picks the data pattern.
pub fn apply(fs: &Fs, op: &Op, op_index: usize) -> FsResult<()> {
    match op {
        Op::Creat(p) => {
            let (parent, name) = parent_and_name(fs, p)?;
            fs.create(parent, name, 0o644, 0, 0).map(drop)
        }
        Op::Mkdir(p) => {
            let (parent, name) = parent_and_name(fs, p)?;
            fs.mkdir(parent, name, 0o755, 0, 0).map(drop)
        }
        Op::Write { path, offset, len } => {
            let ino = fs.resolve(path)?;
            let data = pattern(op_index, *offset, *len as usize);
            fs.write(ino, *offset, &data).map(drop)
        }
        Op::WriteZeros { path, offset, len } => {
            let ino = fs.resolve(path)?;
            fs.write(ino, *offset, &vec![0; *len as usize]).map(drop)
        }
        Op::Append { path, len } => {
            let ino = fs.resolve(path)?;
            let offset = fs.stat(ino)?.size;
            let data = pattern(op_index, offset, *len as usize);
            fs.write(ino, offset, &data).map(drop)
        }
        Op::Truncate { path, size } => {
            let attr = SetAttr {
                size: Some(*size),
                ..SetAttr::default()
            };
            fs.setattr(fs.resolve(path)?, &attr).map(drop)
        }
        Op::Fallocate {
            path,
            offset,
            len,
            mode,
        } => {
            let mode = FallocateMode {
                keep_size: matches!(mode, Falloc::KeepSize | Falloc::PunchHole),
                punch_hole: *mode == Falloc::PunchHole,
                zero_range: *mode == Falloc::ZeroRange,
            };
            fs.fallocate(fs.resolve(path)?, *offset, *len, mode)
        }
        Op::Link { from, to } => {
            let ino = fs.resolve(from)?;
            let (parent, name) = parent_and_name(fs, to)?;
            fs.link(ino, parent, name).map(drop)
        }
        Op::Unlink(p) => {
            let (parent, name) = parent_and_name(fs, p)?;
            fs.unlink(parent, name)
        }
        Op::Tmpfile { path, len, linked } => {
            let (parent, name) = parent_and_name(fs, path)?;
            let ino = fs.create_unnamed(parent, 0o100_644, 0, 0, 0)?.ino;
            let written = fs.write(ino, 0, &pattern(op_index, 0, *len as usize));
            let synced = written.and_then(|_| fs.fsync(ino, false));
            let named = synced.and_then(|_| match linked {
                true => fs.link(ino, parent, name).map(drop),
                false => Ok(()),
            });
            fs.release(ino).and(named)
        }
        Op::Rmdir(p) => {
            let (parent, name) = parent_and_name(fs, p)?;
            fs.rmdir(parent, name)
        }
        Op::Rename { from, to } => {
            let (src_parent, src) = parent_and_name(fs, from)?;
            let (dst_parent, dst) = parent_and_name(fs, to)?;
            fs.rename(src_parent, src, dst_parent, dst, RenameFlags::default())
        }
        Op::Symlink { target, path } => {
            let (parent, name) = parent_and_name(fs, path)?;
            fs.symlink(parent, name, target.as_bytes(), 0, 0).map(drop)
        }
        Op::SetXattr { path, name, value } => fs.setxattr(
            fs.resolve(path)?,
            name.as_bytes(),
            value.as_bytes(),
            XattrSetMode::Either,
        ),
        Op::Chmod { path, perm } => {
            let attr = SetAttr {
                perm: Some(*perm),
                ..SetAttr::default()
            };
            fs.setattr(fs.resolve(path)?, &attr).map(drop)
        }
        Op::SetAcl { path, uid, default } => {
            let name: &[u8] = if *default {
                b"system.posix_acl_default"
            } else {
                b"system.posix_acl_access"
            };
            let value = read_for(*uid).to_xattr();
            fs.setxattr(fs.resolve(path)?, name, &value, XattrSetMode::Either)
        }
        Op::JournalData { path, on } => {
            let mode = if *on {
                FileJournalMode::Data
            } else {
                FileJournalMode::Mount
            };
            fs.set_journal_mode(fs.resolve(path)?, mode).map(drop)
        }
        Op::Fsync(p) => fs.fsync(fs.resolve(p)?, false),
        Op::Fdatasync(p) => fs.fsync(fs.resolve(p)?, true),
        Op::Fbarrier(p) => fs.fbarrier(fs.resolve(p)?, false),
        Op::Fdatabarrier(p) => fs.fbarrier(fs.resolve(p)?, true),
        Op::WriteBack(p) => fs.write_back(fs.resolve(p)?),
        Op::Sync => fs.sync(),
        Op::RemountCycle => fs.remount(true).and_then(|()| fs.remount(false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_promises_only_once_a_later_operation_shows() {
        let promise = |ordered| Promise {
            done_at: 10,
            state: 3,
            aspects: ALL,
            ordered,
        };
        let at = |point, seen| CrashAt { point, seen };
        // A sync call's promise holds from its return on, whatever recovery shows.
        assert!(!promise(false).holds_at(at(9, 9)));
        assert!(promise(false).holds_at(at(10, 0)));
        // A barrier's only when the recovered state shows an operation after it.
        assert!(!promise(true).holds_at(at(20, 3)));
        assert!(promise(true).holds_at(at(20, 4)));
        assert!(
            !promise(true).holds_at(at(9, 4)),
            "not before the barrier returned"
        );
        let promises = [promise(false), promise(true)];
        assert_eq!(latest_promise(&promises, at(20, 3), |a| a.exists), 3);
        let earlier = Promise {
            state: 1,
            ..promise(false)
        };
        assert_eq!(
            latest_promise(&[earlier, promise(true)], at(20, 3), |a| a.exists),
            1
        );
        assert_eq!(
            latest_promise(&[earlier, promise(true)], at(20, 5), |a| a.exists),
            3
        );
    }
}
