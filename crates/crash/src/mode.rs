//! A mode the explorer records and recovers workloads in: the data mode (`data=`) and
//! where an fsync's i-transaction goes (`ijournal=`). Written `ordered`, `journal`,
//! `writeback`, or with the paper's per-core rings `ordered+percore` (in reproducer
//! lines and `jext crash --mode`).
//!
//! Promises: `Display` and `FromStr` are inverses; an unknown mode is refused by name.

use jext_fs::{DataMode, IJournal};
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    pub data: DataMode,
    pub ijournal: IJournal,
}

/// The modes a run explores unless told otherwise.
pub const DEFAULT_MODES: [Mode; 3] = [
    Mode::single(DataMode::Ordered),
    Mode::single(DataMode::Journal),
    Mode::single(DataMode::Writeback),
];

const PERCORE_SUFFIX: &str = "+percore";

impl Mode {
    /// `data` with fast commits in the one ext4 area (the default).
    pub const fn single(data: DataMode) -> Mode {
        Mode {
            data,
            ijournal: IJournal::Single,
        }
    }
}

impl From<DataMode> for Mode {
    fn from(data: DataMode) -> Mode {
        Mode::single(data)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ijournal {
            IJournal::Single => write!(f, "{}", self.data),
            IJournal::PerCore => write!(f, "{}{PERCORE_SUFFIX}", self.data),
        }
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        let (data, ijournal) = match s.strip_suffix(PERCORE_SUFFIX) {
            Some(data) => (data, IJournal::PerCore),
            None => (s, IJournal::Single),
        };
        let data = data
            .parse::<DataMode>()
            .map_err(|e| format!("mode {s:?}: {e} (optionally followed by {PERCORE_SUFFIX})"))?;
        Ok(Mode { data, ijournal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_print_and_parse_back() {
        for data in [DataMode::Ordered, DataMode::Journal, DataMode::Writeback] {
            for ijournal in [IJournal::Single, IJournal::PerCore] {
                let mode = Mode { data, ijournal };
                assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
            }
        }
        assert_eq!(
            "ordered+percore".parse::<Mode>().unwrap().data,
            DataMode::Ordered
        );
        assert!("ordered+shared".parse::<Mode>().is_err());
        assert!("fast".parse::<Mode>().is_err());
    }
}
