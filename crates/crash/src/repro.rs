//! Reproducers: one line that names a failing crash state, and the replay that rebuilds
//! and checks exactly that state.
//!
//! The form is `WORKLOAD/MODE/POINT/SELECTION`, for example `ace1-17/journal/42/0,2` or
//! `ace3-9/ordered+classic/120/1,3:0f`: the workload id, the mode ([`crate::Mode`]: the
//! data mode, `+classic` for classic journal commits, `+percore` for per-core
//! i-transactions), the crash point (how many logged requests were issued) and which
//! cached writes survived (see [`jext_device::Selection`]'s text form).
//! `jext crash replay LINE` runs it.

use crate::explore::{Checker, E2fsck};
use crate::generate;
use crate::kernel::KernelCheck;
use crate::mode::Mode;
use crate::oracle::{data_unit, NameCounts};
use crate::record::record;
use crate::workload::WorkloadId;
use jext_device::Selection;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reproducer {
    pub workload: WorkloadId,
    pub mode: Mode,
    pub point: usize,
    pub selection: String,
}

impl fmt::Display for Reproducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.workload, self.mode, self.point, self.selection
        )
    }
}

impl FromStr for Reproducer {
    type Err = String;
    fn from_str(s: &str) -> Result<Reproducer, String> {
        let parts: Vec<&str> = s.splitn(4, '/').collect();
        let [workload, mode, point, selection] = parts[..] else {
            return Err(format!(
                "reproducer {s:?}: expected WORKLOAD/MODE/POINT/SELECTION, e.g. ace1-3/ordered/12/0,2"
            ));
        };
        Ok(Reproducer {
            workload: workload.parse()?,
            mode: mode
                .parse()
                .map_err(|e: String| format!("reproducer {s:?}: {e}"))?,
            point: point
                .parse()
                .map_err(|_| format!("reproducer {s:?}: crash point {point:?} is not a number"))?,
            selection: selection.to_string(),
        })
    }
}

/// What a replay found.
pub struct Replay {
    pub listing: String,
    /// How many requests the workload logged, and the window at the crash point.
    pub log_len: usize,
    pub window_len: usize,
    pub problems: Vec<String>,
}

/// Records the workload again, rebuilds the named state, and checks it (with
/// `e2fsck -fn`, and Linux's recovery with `kernel_check`). With `keep_image`, the crash
/// image (before recovery) is saved there.
pub fn replay(
    repro: &Reproducer,
    torn_writes: bool,
    kernel_check: bool,
    keep_image: Option<&Path>,
) -> Result<Replay, String> {
    let kernel = kernel_check.then(KernelCheck::new).transpose()?;
    let workload = generate(&repro.workload)?;
    let rec = record(&workload, repro.mode, None).map_err(|e| format!("recording failed: {e}"))?;
    let log_len = rec.capture.ops().len();
    if repro.point > log_len {
        return Err(format!(
            "crash point {} is past the end of the log ({log_len} requests)",
            repro.point
        ));
    }
    let window = rec.capture.window(repro.point);
    let selection = Selection::parse(&repro.selection, &window)?;
    if let Some(path) = keep_image {
        rec.capture
            .cursor()
            .state(repro.point, &selection)
            .write_current_image(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let names = NameCounts::of(&rec.timeline);
    let torn = torn_writes
        || selection
            .0
            .iter()
            .any(|k| matches!(k, jext_device::Kept::Sectors(_)));
    let checker = Checker {
        rec: &rec,
        names: &names,
        unit: data_unit(repro.mode.data, torn),
    };
    let mut e2fsck = E2fsck::new();
    let problems = checker.state(
        &mut rec.capture.cursor(),
        repro.point,
        &selection,
        (Some(&mut e2fsck), kernel.as_ref()),
    );
    Ok(Replay {
        listing: workload.listing(),
        log_len,
        window_len: window.len(),
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducers_round_trip_and_bad_ones_are_named() {
        let r: Reproducer = "ace3-9/ordered/120/1,3:0f".parse().unwrap();
        assert_eq!(r.point, 120);
        assert_eq!(r.selection, "1,3:0f");
        assert_eq!(r.to_string(), "ace3-9/ordered/120/1,3:0f");
        assert!("ace1-1/ordered/x/none"
            .parse::<Reproducer>()
            .unwrap_err()
            .contains("crash point"));
        assert!("ace1-1/sideways/3/none"
            .parse::<Reproducer>()
            .unwrap_err()
            .contains("data="));
        assert!("ace1-1".parse::<Reproducer>().is_err());
        let classic: Reproducer = "ace1-4/journal+classic/7/none".parse().unwrap();
        assert_eq!(classic.mode.commit, jext_journal::CommitMode::Classic);
        assert_eq!(classic.to_string(), "ace1-4/journal+classic/7/none");
        assert!("ace1-1/ordered+later/3/none"
            .parse::<Reproducer>()
            .unwrap_err()
            .contains("+percore, +journal or +in_place"));
        let percore: Reproducer = "ace1-4/ordered+percore/7/none".parse().unwrap();
        assert_eq!(percore.mode.ijournal, jext_fs::IJournal::PerCore);
    }
}
