//! The names created by transactions that are not durable yet, one log per transaction.
//!
//! Fast commits need, for each inode created since the last durable commit, the name it
//! was made with: a new file's fsync carries the new names above it, a directory's fsync
//! its new children. Each transaction's creations go in one log (an ordered map from
//! inode number to a fixed-size record, the creation order, and every name's bytes in one
//! buffer), so that a log whose transaction became durable is forgotten whole, with no
//! lookup per name. Forgetting names one by one, four per create, cost the creates of a
//! 10^6-name directory a fifth of their speed in the tenths after each commit (each
//! removal a hash-table miss). The map is a B-tree because new inode numbers mostly
//! ascend: each insert lands on the right edge, which stays in the CPU's cache, where a
//! hash table's random slot missed it once the log outgrew the cache.
//!
//! Promises: a name is answered only while its transaction is not durable; an inode
//! forgotten (deleted) has no name until it is created again. Must never answer with a
//! name from a log other than the newest that holds the inode.

use super::NewName;
use jext_journal::{tid_gt, Tid};
use std::collections::{BTreeMap, VecDeque};

/// The creations of transactions not yet durable, oldest transaction first.
#[derive(Debug, Default)]
pub(crate) struct NewNames {
    logs: VecDeque<CreationLog>,
    /// A forgotten log, emptied, kept for the next transaction's creations (its buffers
    /// already grown to a transaction's size).
    spare: Option<CreationLog>,
}

/// One transaction's creations.
#[derive(Debug, Default)]
struct CreationLog {
    tid: Tid,
    /// (parent, inode) in creation order: where a directory's fsync looks.
    order: Vec<(u32, u32)>,
    records: BTreeMap<u32, NameRecord>,
    name_bytes: Vec<u8>,
}

/// A [`NewName`] without its transaction (the log's) and with its name in the log's
/// buffer.
#[derive(Clone, Copy, Debug)]
struct NameRecord {
    parent: u32,
    name_at: u32,
    name_len: u16,
    regular: bool,
    parent_grown: Option<Tid>,
}

impl CreationLog {
    fn name(&self, record: &NameRecord) -> NewName {
        let at = record.name_at as usize;
        NewName {
            parent: record.parent,
            name: self.name_bytes[at..at + usize::from(record.name_len)].to_vec(),
            tid: self.tid,
            regular: record.regular,
            parent_grown: record.parent_grown,
        }
    }
}

impl NewNames {
    /// Remembers that `name` was created as `ino`, and forgets the logs of transactions
    /// up to `durable`.
    pub fn note(&mut self, ino: u32, name: NewName, durable: Tid) {
        self.forget_durable(durable);
        let log = self.log_for(name.tid);
        let name_at = u32::try_from(log.name_bytes.len()).expect("a log's names fit in 4 GiB");
        let name_len = u16::try_from(name.name.len()).expect("a name is at most 255 bytes");
        log.name_bytes.extend_from_slice(&name.name);
        log.order.push((name.parent, ino));
        let record = NameRecord {
            parent: name.parent,
            name_at,
            name_len,
            regular: name.regular,
            parent_grown: name.parent_grown,
        };
        log.records.insert(ino, record);
    }

    /// The name `ino` was created with, while that creation is not durable.
    pub fn get(&self, ino: u32, durable: Tid) -> Option<NewName> {
        self.live_logs(durable)
            .find_map(|log| log.records.get(&ino).map(|r| log.name(r)))
    }

    /// The inodes created in `dir` and not durable whose newest creation is still in
    /// `dir`, in creation order (an inode number freed and created again appears again).
    pub fn created_in(&self, dir: u32, durable: Tid) -> Vec<(u32, NewName)> {
        let mut found = Vec::new();
        for log in self.live_logs(durable) {
            for &(_, ino) in log.order.iter().filter(|(parent, _)| *parent == dir) {
                if let Some(name) = self.get(ino, durable).filter(|n| n.parent == dir) {
                    found.push((ino, name));
                }
            }
        }
        found
    }

    /// Forgets a deleted inode (its number may be reused, by a file elsewhere).
    pub fn forget(&mut self, ino: u32) {
        for log in &mut self.logs {
            log.records.remove(&ino);
        }
    }

    /// The logs not durable, newest first.
    fn live_logs(&self, durable: Tid) -> impl Iterator<Item = &CreationLog> {
        self.logs
            .iter()
            .rev()
            .filter(move |log| tid_gt(log.tid, durable))
    }

    fn forget_durable(&mut self, durable: Tid) {
        while self
            .logs
            .front()
            .is_some_and(|log| !tid_gt(log.tid, durable))
        {
            let mut log = self.logs.pop_front().expect("just looked");
            log.order.clear();
            log.records.clear();
            log.name_bytes.clear();
            // The buffers keep their capacity for the next transaction.
            self.spare = Some(log);
        }
    }

    /// The log of `tid`, made (in tid order) if it has none. Creations come in tid order
    /// (a transaction's handles end before the next one's begin), so that is the newest.
    fn log_for(&mut self, tid: Tid) -> &mut CreationLog {
        let at = match self.logs.iter().rposition(|log| !tid_gt(log.tid, tid)) {
            Some(at) if self.logs[at].tid == tid => at,
            before => {
                let mut log = self.spare.take().unwrap_or_default();
                log.tid = tid;
                let at = before.map_or(0, |b| b + 1);
                self.logs.insert(at, log);
                at
            }
        };
        &mut self.logs[at]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parent: u32, text: &str, tid: Tid) -> NewName {
        NewName {
            parent,
            name: text.as_bytes().to_vec(),
            tid,
            regular: true,
            parent_grown: None,
        }
    }

    #[test]
    fn names_are_answered_until_their_transaction_is_durable() {
        let mut names = NewNames::default();
        names.note(12, name(2, "a", 5), 4);
        names.note(13, name(2, "b", 6), 4);
        assert_eq!(names.get(12, 4), Some(name(2, "a", 5)));
        assert_eq!(names.get(13, 5), Some(name(2, "b", 6)));
        assert_eq!(names.get(12, 5), None, "tid 5 is durable");
        // The next note forgets tid 5's log and reuses its memory for tid 7.
        names.note(14, name(13, "c", 7), 5);
        assert_eq!(names.logs.len(), 2);
        assert_eq!(names.get(14, 5).map(|n| n.name), Some(b"c".to_vec()));
        assert_eq!(names.created_in(2, 5), vec![(13, name(2, "b", 6))]);
    }

    #[test]
    fn a_forgotten_inode_has_no_name_until_created_again() {
        let mut names = NewNames::default();
        names.note(12, name(2, "a", 5), 4);
        names.forget(12);
        assert_eq!(names.get(12, 4), None);
        assert!(names.created_in(2, 4).is_empty());
        names.note(12, name(3, "again", 6), 4);
        assert_eq!(names.get(12, 4), Some(name(3, "again", 6)));
        assert!(names.created_in(2, 4).is_empty(), "its old parent lost it");
        assert_eq!(names.created_in(3, 4).len(), 1);
    }

    #[test]
    fn a_creation_noted_late_goes_to_its_own_transaction() {
        let mut names = NewNames::default();
        names.note(20, name(2, "new", 8), 4);
        names.note(21, name(2, "old", 7), 4);
        let tids: Vec<Tid> = names.logs.iter().map(|l| l.tid).collect();
        assert_eq!(tids, vec![7, 8]);
        assert_eq!(names.get(21, 7), None, "tid 7 durable");
        assert_eq!(names.get(20, 7).map(|n| n.tid), Some(8));
    }
}
