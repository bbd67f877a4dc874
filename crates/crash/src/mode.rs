//! A mode the explorer records and recovers workloads in: the data mode (`data=`), how
//! the journal commits (`journal_commit=`: single-I/O by default, or classic), what a
//! logged block goes as (`journal_records=`: its changed bytes by default, or whole
//! blocks), where an fsync's i-transaction goes (`ijournal=`: the one ext4
//! fast-commit area by default, or the paper's per-core rings), and how an ordered file's
//! small synced appends go (`small_syncs=`: journaled by default, or in place before an
//! i-transaction). Written as the data mode with a suffix for each choice that is not the
//! default: `ordered`, `ordered+classic`, `journal+blocks`, `ordered+percore`,
//! `ordered+in_place`, `ordered+classic+percore+in_place` (in reproducer lines and
//! `jext crash --mode`). `adaptive` (`data=adaptive`: ordered, each rollback journal's
//! data journaled) stands in the data mode's place: `adaptive+classic`.
//!
//! Promises: `Display` and `FromStr` are inverses; an unknown mode is refused by name.

use jext_fs::options::ADAPTIVE;
use jext_fs::{DataMode, FsError, IJournal, SmallSyncs};
use jext_journal::{CommitMode, RecordMode};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    pub data: DataMode,
    /// `data=adaptive` (then `data` is ordered).
    pub adaptive: bool,
    pub commit: CommitMode,
    pub records: RecordMode,
    pub ijournal: IJournal,
    pub small_syncs: SmallSyncs,
}

const PERCORE: &str = "percore";

impl Mode {
    /// `data` with every other choice at its default.
    pub fn with_defaults(data: DataMode) -> Mode {
        Mode {
            data,
            adaptive: false,
            commit: CommitMode::default(),
            records: RecordMode::default(),
            ijournal: IJournal::Single,
            small_syncs: SmallSyncs::default(),
        }
    }

    /// `data=adaptive` with every other choice at its default.
    pub fn adaptive() -> Mode {
        Mode {
            adaptive: true,
            ..Mode::with_defaults(DataMode::Ordered)
        }
    }
}

impl From<DataMode> for Mode {
    fn from(data: DataMode) -> Mode {
        Mode::with_defaults(data)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.adaptive {
            true => f.write_str(ADAPTIVE)?,
            false => write!(f, "{}", self.data)?,
        }
        if self.commit != CommitMode::default() {
            write!(f, "+{}", self.commit.name())?;
        }
        if self.records != RecordMode::default() {
            write!(f, "+{}", self.records.name())?;
        }
        if self.ijournal == IJournal::PerCore {
            write!(f, "+{PERCORE}")?;
        }
        if self.small_syncs != SmallSyncs::default() {
            write!(f, "+{}", self.small_syncs.name())?;
        }
        Ok(())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        let mut parts = s.split('+');
        let mut mode = match parts.next().unwrap_or_default() {
            ADAPTIVE => Mode::adaptive(),
            data => Mode::with_defaults(
                data.parse()
                    .map_err(|e: FsError| format!("mode {s:?}: {e}"))?,
            ),
        };
        for part in parts {
            let commit = [CommitMode::SingleIo, CommitMode::Classic]
                .into_iter()
                .find(|c| c.name() == part);
            let records = [RecordMode::Bytes, RecordMode::Blocks]
                .into_iter()
                .find(|r| r.name() == part);
            let small_syncs = [SmallSyncs::Journal, SmallSyncs::InPlace]
                .into_iter()
                .find(|m| m.name() == part);
            match (commit, records, small_syncs) {
                (Some(commit), _, _) => mode.commit = commit,
                (_, Some(records), _) => mode.records = records,
                (_, _, Some(small_syncs)) => mode.small_syncs = small_syncs,
                _ if part == PERCORE => mode.ijournal = IJournal::PerCore,
                _ => {
                    return Err(format!(
                        "mode {s:?}: after the data mode come +single_io, +classic, +bytes, \
                         +blocks, +{PERCORE}, +journal or +in_place, not +{part}"
                    ))
                }
            }
        }
        Ok(mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_print_and_parse_back() {
        for data in [DataMode::Ordered, DataMode::Journal, DataMode::Writeback] {
            for commit in [CommitMode::SingleIo, CommitMode::Classic] {
                for records in [RecordMode::Bytes, RecordMode::Blocks] {
                    for (ijournal, small_syncs) in [
                        (IJournal::Single, SmallSyncs::Journal),
                        (IJournal::PerCore, SmallSyncs::InPlace),
                        (IJournal::Single, SmallSyncs::InPlace),
                    ] {
                        let mode = Mode {
                            data,
                            adaptive: false,
                            commit,
                            records,
                            ijournal,
                            small_syncs,
                        };
                        assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
                        if data == DataMode::Ordered {
                            let adaptive = Mode {
                                adaptive: true,
                                ..mode
                            };
                            assert_eq!(adaptive.to_string().parse::<Mode>(), Ok(adaptive));
                        }
                    }
                }
            }
        }
        let m: Mode = "ordered+classic+percore".parse().unwrap();
        assert_eq!(
            (m.data, m.commit, m.ijournal),
            (DataMode::Ordered, CommitMode::Classic, IJournal::PerCore)
        );
        let m: Mode = "journal+blocks".parse().unwrap();
        assert_eq!((m.data, m.records), (DataMode::Journal, RecordMode::Blocks));
        assert_eq!(m.to_string(), "journal+blocks");
        let m: Mode = "adaptive+classic".parse().unwrap();
        assert_eq!((m.data, m.adaptive), (DataMode::Ordered, true));
        assert_eq!(m.commit, CommitMode::Classic);
        assert_eq!(m.to_string(), "adaptive+classic");
        let m: Mode = "ordered+percore+in_place".parse().unwrap();
        assert_eq!(
            (m.ijournal, m.small_syncs),
            (IJournal::PerCore, SmallSyncs::InPlace)
        );
        assert!("ordered+shared".parse::<Mode>().is_err());
        assert!("fast".parse::<Mode>().is_err());
    }
}
