//! The oracle: is a recovered file system one that the crash was allowed to leave?
//!
//! For a crash after device-log entries `..point`, the operations that may have reached
//! the disk end at some state `s_max`; a path's state is promised from the last sync call
//! that covered it and returned before the crash (or from the start: setup is durable),
//! or from the last barrier (fbarrier, fdatabarrier) that covered it and returned before
//! a write the crash kept: whatever a crash leaves is a prefix of the barrier-delimited
//! epochs.
//! Each path must then show a state it held between its promise and `s_max`:
//!
//! - what it names (which inode, or nothing) is one of the names it had;
//! - a file's size is one of its sizes, and each block (each 512-byte sector when writes
//!   may tear) equals that block in one of its states, so a block never mixes two
//!   `write()` calls and never shows stale data; with `data=writeback`, whose contract
//!   allows stale data in unsynced blocks, only content unchanged since the promise is
//!   compared;
//! - its attributes (permissions, owner, links, mtime, xattrs) are one of its sets;
//! - across paths, a file never ends with two names if it never had two at once, and
//!   never with none if it always had one since it was promised (rename atomicity).
//!
//! The oracle reads; it must never change the recovered file system.

use crate::record::{Aspects, CrashAt, Recording, Timeline};
use crate::snapshot::{read_node, Identity, Node};
use jext_fs::{DataMode, Fs, Ino};
use std::collections::HashMap;
use std::sync::Arc;

/// The unit a crash may leave half-written: a block, or a sector when writes may tear.
/// `None`: unsynced content may be anything (writeback mode).
pub fn data_unit(mode: DataMode, torn_writes: bool) -> Option<usize> {
    match mode {
        // Journal replay rewrites whole blocks, torn or not.
        DataMode::Journal => Some(4096),
        DataMode::Ordered if torn_writes => Some(512),
        DataMode::Ordered => Some(4096),
        DataMode::Writeback => None,
    }
}

/// How many names each inode had, state by state: (first state, count) at each change.
pub struct NameCounts(HashMap<Ino, Vec<(usize, u32)>>);

impl NameCounts {
    pub fn of(timeline: &Timeline) -> NameCounts {
        let mut events: Vec<(usize, Ino, i32)> = Vec::new();
        for h in &timeline.history {
            let mut before: Option<Ino> = None;
            for (state, node) in h {
                let now = linkable_ino(node);
                if now != before {
                    events.extend(before.map(|x| (*state, x, -1)));
                    events.extend(now.map(|x| (*state, x, 1)));
                }
                before = now;
            }
        }
        events.sort_unstable();
        let mut counts: HashMap<Ino, Vec<(usize, u32)>> = HashMap::new();
        for (state, ino, delta) in events {
            let series = counts.entry(ino).or_default();
            let last = series.last().map_or(0, |(_, c)| *c);
            let next = (last as i32 + delta) as u32;
            match series.last_mut() {
                Some((s, c)) if *s == state => *c = next,
                _ => series.push((state, next)),
            }
        }
        NameCounts(counts)
    }

    /// The fewest and most names `ino` had over states `from..=to`.
    fn range(&self, ino: Ino, from: usize, to: usize) -> (u32, u32) {
        let Some(series) = self.0.get(&ino) else {
            return (0, 0);
        };
        let first = series.partition_point(|(s, _)| *s <= from);
        let at_from = if first == 0 { 0 } else { series[first - 1].1 };
        series[first..]
            .iter()
            .take_while(|(s, _)| *s <= to)
            .fold((at_from, at_from), |(lo, hi), (_, c)| {
                (lo.min(*c), hi.max(*c))
            })
    }
}

/// Files and symlinks: the inodes whose names the rename checks count.
fn linkable_ino(node: &Node) -> Option<Ino> {
    match node.identity() {
        Identity::File(i) | Identity::Symlink(i) => Some(i),
        _ => None,
    }
}

/// Checks the recovered `fs` against the recording for a crash after `..point`;
/// returns every problem found (empty: the state is one the crash could leave) and what
/// each path of the recording holds after recovery (absent where it cannot be read).
pub fn check(
    rec: &Recording,
    names: &NameCounts,
    point: usize,
    fs: &Fs,
    unit: Option<usize>,
) -> (Vec<String>, Vec<Node>) {
    let t = &rec.timeline;
    let s_max = t.last_possible_state(point);
    let mut problems = Vec::new();
    let recovered: Vec<Node> = t
        .paths
        .iter()
        .map(|path| {
            read_node(fs, path).unwrap_or_else(|e| {
                problems.push(format!("{path}: cannot be read after recovery: {e}"));
                Node::Absent
            })
        })
        .collect();
    let at = CrashAt {
        point,
        seen: state_seen(t, &recovered),
    };
    for (i, node) in recovered.iter().enumerate() {
        let view = PathView { rec, i, at, s_max };
        view.check(node, unit, &mut problems);
    }
    check_names(rec, names, at, s_max, &recovered, &mut problems);
    (problems, recovered)
}

/// The latest state the recovered paths show: for each path the first state at which it
/// looked like that (a lower bound on what recovery replayed), the largest of those.
fn state_seen(t: &Timeline, recovered: &[Node]) -> usize {
    recovered
        .iter()
        .enumerate()
        .filter_map(|(i, node)| first_state_showing(t, i, node))
        .max()
        .unwrap_or(0)
}

/// The first state at which path `i` looked like `node`: for a file, by its content too,
/// so that data overwritten in place after a barrier counts as a later write the crash
/// kept; by its identity alone when no state had that content (a torn or mixed block,
/// which the checks report by themselves).
fn first_state_showing(t: &Timeline, i: usize, node: &Node) -> Option<usize> {
    if let Node::File { ino, data, .. } = node {
        let same_content = t.history[i].iter().find(|(_, then)| match &**then {
            Node::File {
                ino: was,
                data: had,
                ..
            } => was == ino && had == data,
            _ => false,
        });
        if let Some((state, _)) = same_content {
            return Some(*state);
        }
    }
    t.first_state_like(i, &node.identity())
}

/// One path's history as seen from one crash point.
struct PathView<'a> {
    rec: &'a Recording,
    i: usize,
    at: CrashAt,
    s_max: usize,
}

impl PathView<'_> {
    fn path(&self) -> &str {
        &self.rec.timeline.paths[self.i]
    }

    /// From which state `aspect` of the inode `node` names is promised.
    fn since(&self, node: &Node, aspect: fn(&Aspects) -> bool) -> usize {
        match node.ino() {
            Some(ino) => self.rec.timeline.promised_inode_state(ino, self.at, aspect),
            None => 0,
        }
    }

    /// Names the operation that made state `s` promised.
    fn origin(&self, s: usize) -> String {
        match s {
            0 => "the setup".into(),
            s => format!("op {} ({})", s - 1, self.rec.workload.ops[s - 1]),
        }
    }

    /// The states of the inode `node` names over `from..=s_max`, under any of its
    /// names, of the same kind.
    fn same_inode(&self, node: &Node, from: usize) -> Vec<&Arc<Node>> {
        let Some(ino) = node.ino() else {
            return Vec::new();
        };
        self.rec
            .timeline
            .inode_states(ino, from, self.s_max)
            .into_iter()
            .filter(|n| n.identity() == node.identity())
            .collect()
    }

    /// Whether the inode `node` names existed, as the same kind, at state `s`.
    fn existed_at(&self, node: &Node, s: usize) -> bool {
        let Some(ino) = node.ino() else {
            return false;
        };
        let then = self.rec.timeline.inode_states(ino, s, s);
        then.iter().any(|n| n.identity() == node.identity())
    }

    fn check(&self, got: &Node, unit: Option<usize>, problems: &mut Vec<String>) {
        let exists_since = self.rec.timeline.promised_state(self.i, self.at);
        let allowed = self
            .rec
            .timeline
            .nodes_between(self.i, exists_since, self.s_max);
        if !allowed.iter().any(|(_, n)| n.identity() == got.identity()) {
            let was: Vec<String> = allowed.iter().map(|(_, n)| n.describe()).collect();
            problems.push(format!(
                "{}: recovered as {}, but since {} it was only: {}",
                self.path(),
                got.describe(),
                self.origin(exists_since),
                was.join(", then ")
            ));
            return;
        }
        match got {
            Node::Absent => {}
            Node::File { data, .. } => self.check_data(got, data, unit, problems),
            Node::Symlink { target, .. } => {
                let states = self.same_inode(got, self.since(got, |a| a.content));
                if !states
                    .iter()
                    .any(|n| matches!(&***n, Node::Symlink { target: t, .. } if t == target))
                {
                    problems.push(format!(
                        "{}: symlink target {:?} was never written",
                        self.path(),
                        String::from_utf8_lossy(target)
                    ));
                }
            }
            Node::Dir { .. } => {}
        }
        self.check_meta(got, problems);
    }

    fn check_data(&self, got: &Node, data: &[u8], unit: Option<usize>, problems: &mut Vec<String>) {
        let since = self.since(got, |a| a.content);
        let states: Vec<&[u8]> = self
            .same_inode(got, since)
            .into_iter()
            .filter_map(|n| match &**n {
                Node::File { data, .. } => Some(&data[..]),
                _ => None,
            })
            .collect();
        if !states.iter().any(|s| s.len() == data.len()) {
            let sizes: Vec<usize> = states.iter().map(|s| s.len()).collect();
            problems.push(format!(
                "{}: size {} after recovery; since {} its sizes were {sizes:?}",
                self.path(),
                data.len(),
                self.origin(since)
            ));
            return;
        }
        let unchanged = states.windows(2).all(|w| w[0] == w[1]);
        let unit = match unit {
            Some(unit) => unit,
            // data=writeback promises content only as a sync left it: the file's at its
            // promise, kept since. A file made after the promise, even one that appeared
            // with its data (an O_TMPFILE file linked once written), was promised nothing.
            None if unchanged && self.existed_at(got, since) => data.len().max(1),
            None => return,
        };
        for start in (0..data.len()).step_by(unit) {
            let end = (start + unit).min(data.len());
            let piece = &data[start..end];
            if !states.iter().any(|s| zero_extended_eq(s, start, piece)) {
                problems.push(format!(
                    "{}: bytes {start}..{end} match none of its states since {} \
                     (lost, stale or mixed data; first byte {:#04x})",
                    self.path(),
                    self.origin(since),
                    piece[0]
                ));
                return;
            }
        }
    }

    fn check_meta(&self, got: &Node, problems: &mut Vec<String>) {
        let Some(meta) = got.meta() else { return };
        let since = self.since(got, |a| a.meta);
        let states = self.same_inode(got, since);
        if !states.iter().any(|n| n.meta() == Some(meta)) {
            let latest = states.last().and_then(|n| n.meta());
            problems.push(format!(
                "{}: attributes {meta:?} after recovery; since {} the latest were {latest:?}",
                self.path(),
                self.origin(since)
            ));
        }
    }
}

/// Whether `state[start..start + piece.len()]`, read as zeros past its end, is `piece`.
fn zero_extended_eq(state: &[u8], start: usize, piece: &[u8]) -> bool {
    let have = state.len().saturating_sub(start).min(piece.len());
    let (head, tail) = piece.split_at(have);
    (have == 0 || state[start..start + have] == *head) && tail.iter().all(|&b| b == 0)
}

/// Rename atomicity, counted over names: never two names for a file that never had two
/// at once; never none for a file that always had one since it was promised.
fn check_names(
    rec: &Recording,
    names: &NameCounts,
    at: CrashAt,
    s_max: usize,
    recovered: &[Node],
    problems: &mut Vec<String>,
) {
    let t = &rec.timeline;
    let mut got: HashMap<Ino, Vec<&str>> = HashMap::new();
    for (i, node) in recovered.iter().enumerate() {
        if let Some(ino) = linkable_ino(node) {
            got.entry(ino).or_default().push(&t.paths[i]);
        }
    }
    for (ino, paths) in &got {
        let (_, most) = names.range(*ino, 0, s_max);
        if paths.len() > 1 && most <= 1 {
            problems.push(format!(
                "inode {ino} has {} names after recovery ({}), but never had two at once",
                paths.len(),
                paths.join(", ")
            ));
        }
    }
    for i in 0..t.paths.len() {
        let since = t.promised_state(i, at);
        let Some(ino) = linkable_ino(t.node_at(i, since)) else {
            continue;
        };
        let (fewest, _) = names.range(ino, since, s_max);
        if fewest >= 1 && !got.contains_key(&ino) {
            problems.push(format!(
                "inode {ino} (at {} when promised) has no name after recovery, \
                 but always had one from then to the crash",
                t.paths[i]
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_extension_reads_past_the_end_as_zeros() {
        assert!(zero_extended_eq(b"abc", 1, b"bc\0\0"));
        assert!(!zero_extended_eq(b"abc", 1, b"bcd"));
        assert!(zero_extended_eq(b"abc", 5, b"\0\0"));
        assert!(!zero_extended_eq(b"abc", 5, b"\0x"));
    }
}
