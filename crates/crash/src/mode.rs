//! A mode the explorer records and recovers workloads in: the data mode (`data=`), how
//! the journal commits (`journal_commit=`: single-I/O by default, or classic), and where
//! an fsync's i-transaction goes (`ijournal=`: the one ext4 fast-commit area by default,
//! or the paper's per-core rings). Written as the data mode with a suffix for each
//! choice that is not the default: `ordered`, `ordered+classic`, `ordered+percore`,
//! `ordered+classic+percore` (in reproducer lines and `jext crash --mode`).
//!
//! Promises: `Display` and `FromStr` are inverses; an unknown mode is refused by name.

use jext_fs::{DataMode, FsError, IJournal};
use jext_journal::CommitMode;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    pub data: DataMode,
    pub commit: CommitMode,
    pub ijournal: IJournal,
}

const PERCORE: &str = "percore";

impl Mode {
    /// `data` with every other choice at its default.
    pub fn with_defaults(data: DataMode) -> Mode {
        Mode {
            data,
            commit: CommitMode::default(),
            ijournal: IJournal::Single,
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
        write!(f, "{}", self.data)?;
        if self.commit != CommitMode::default() {
            write!(f, "+{}", self.commit.name())?;
        }
        if self.ijournal == IJournal::PerCore {
            write!(f, "+{PERCORE}")?;
        }
        Ok(())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        let mut parts = s.split('+');
        let data = parts.next().unwrap_or_default();
        let data = data
            .parse()
            .map_err(|e: FsError| format!("mode {s:?}: {e}"))?;
        let mut mode = Mode::with_defaults(data);
        for part in parts {
            match [CommitMode::SingleIo, CommitMode::Classic]
                .into_iter()
                .find(|c| c.name() == part)
            {
                Some(commit) => mode.commit = commit,
                None if part == PERCORE => mode.ijournal = IJournal::PerCore,
                None => {
                    return Err(format!(
                        "mode {s:?}: after the data mode come +single_io, +classic or \
                         +{PERCORE}, not +{part}"
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
                for ijournal in [IJournal::Single, IJournal::PerCore] {
                    let mode = Mode {
                        data,
                        commit,
                        ijournal,
                    };
                    assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
                }
            }
        }
        let m: Mode = "ordered+classic+percore".parse().unwrap();
        assert_eq!(
            (m.data, m.commit, m.ijournal),
            (DataMode::Ordered, CommitMode::Classic, IJournal::PerCore)
        );
        assert!("ordered+shared".parse::<Mode>().is_err());
        assert!("fast".parse::<Mode>().is_err());
    }
}
