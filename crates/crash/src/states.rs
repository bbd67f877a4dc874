//! Which crash states to check: crash points in the log, and for each, which of the
//! cached writes survived.
//!
//! Crash points are every flush (just before it, with its whole window in play, and just
//! after it), every return of a sync call, the end of the log, and a sampled share of the
//! points between. At a point whose window is small every subset is checked; otherwise a
//! seeded sample: nothing, everything, in-order prefixes and random subsets. With torn
//! writes on, some states also keep only some sectors of one write; with
//! `every_cut_of_largest_write`, the largest write of the window (a single-I/O commit) is
//! cut after every sector and torn at every sector. Subsets a barrier
//! device could not persist (a later epoch without an earlier one) are never produced.

use jext_device::{CrashCapture, Kept, LoggedOp, Selection, WindowWrite};
use rand::rngs::StdRng;
use rand::Rng;

/// How densely to sample.
#[derive(Clone, Debug)]
pub struct Sampling {
    /// Windows of at most this many writes are explored exhaustively.
    pub exhaustive_max: usize,
    /// States per crash point when the window is larger.
    pub samples_per_point: usize,
    /// The share of the other log positions also used as crash points.
    pub between_fraction: f64,
    /// Also keep only some 512-byte sectors of a write.
    pub torn_writes: bool,
    /// Also cut the largest write of each window (a single-I/O commit: descriptor,
    /// logged blocks and commit block in one write) after every sector, and tear it at
    /// every sector (all of it but that sector), the rest of the window kept.
    pub every_cut_of_largest_write: bool,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling {
            exhaustive_max: 4,
            samples_per_point: 8,
            between_fraction: 0.05,
            torn_writes: false,
            every_cut_of_largest_write: false,
        }
    }
}

/// One crash state to build and check.
#[derive(Clone, Debug)]
pub struct Planned {
    pub point: usize,
    pub selection: Selection,
}

/// Crash points in increasing order.
pub fn crash_points(capture: &CrashCapture, sampling: &Sampling, rng: &mut StdRng) -> Vec<usize> {
    let ops = capture.ops();
    let mut points = vec![ops.len()];
    for (i, op) in ops.iter().enumerate() {
        match op {
            LoggedOp::Flush => points.extend([i, i + 1]),
            LoggedOp::Mark(_) => points.push(i + 1),
            _ if rng.gen_bool(sampling.between_fraction) => points.push(i),
            _ => {}
        }
    }
    points.sort_unstable();
    points.dedup();
    points
}

/// The states to check at one crash point.
pub fn selections(window: &[WindowWrite], sampling: &Sampling, rng: &mut StdRng) -> Vec<Selection> {
    let n = window.len();
    let mut out: Vec<Selection> = Vec::new();
    if n <= sampling.exhaustive_max {
        for mask in 0u64..(1 << n) {
            out.push(Selection::from_mask(n, mask));
        }
    } else {
        out.push(Selection::nothing(n));
        out.push(Selection(vec![Kept::Whole; n]));
        while out.len() < sampling.samples_per_point {
            let selection = if rng.gen_bool(0.3) {
                let keep = rng.gen_range(1..n);
                Selection((0..n).map(|i| whole_if(i < keep)).collect())
            } else {
                Selection((0..n).map(|_| whole_if(rng.gen_bool(0.5))).collect())
            };
            out.push(selection);
        }
    }
    if sampling.torn_writes && n > 0 {
        let torn: Vec<Selection> = out.iter().filter_map(|s| tear(s, window, rng)).collect();
        out.extend(torn.into_iter().take(sampling.samples_per_point / 2 + 1));
    }
    if sampling.every_cut_of_largest_write {
        out.extend(every_cut_of_largest(window));
    }
    out.retain(|s| s.respects_epochs(window));
    out.sort_by_key(|s| s.to_string());
    out.dedup();
    out
}

/// The largest multi-sector write of the window cut after each of its sectors (every
/// prefix, the empty one and the whole write included) with the rest of the window kept
/// and with it lost, and torn at each sector (every sector but that one kept).
fn every_cut_of_largest(window: &[WindowWrite]) -> Vec<Selection> {
    let Some((victim, write)) = window
        .iter()
        .enumerate()
        .filter(|(_, w)| w.sectors() > 1)
        .max_by_key(|(i, w)| (w.sectors(), *i))
    else {
        return Vec::new();
    };
    let sectors = write.sectors();
    let with = |others: Kept, kept: Kept| {
        let mut selection = Selection(vec![others; window.len()]);
        selection.0[victim] = kept;
        selection
    };
    let mut out = Vec::with_capacity(3 * sectors + 2);
    for cut in 0..=sectors {
        let prefix = Kept::Sectors((0..sectors).map(|i| i < cut).collect());
        out.push(with(Kept::Whole, prefix.clone()));
        if window.len() > 1 {
            out.push(with(Kept::Nothing, prefix));
        }
    }
    for hole in 0..sectors {
        let torn = Kept::Sectors((0..sectors).map(|i| i != hole).collect());
        out.push(with(Kept::Whole, torn));
    }
    out
}

fn whole_if(keep: bool) -> Kept {
    if keep {
        Kept::Whole
    } else {
        Kept::Nothing
    }
}

/// The same selection with one multi-sector write torn (some sectors kept, not all).
fn tear(selection: &Selection, window: &[WindowWrite], rng: &mut StdRng) -> Option<Selection> {
    let candidates: Vec<usize> = (0..window.len())
        .filter(|&i| window[i].sectors() > 1)
        .collect();
    let &victim = candidates.get(rng.gen_range(0..candidates.len().max(1)))?;
    let sectors = window[victim].sectors();
    let mut flags: Vec<bool> = (0..sectors).map(|_| rng.gen_bool(0.5)).collect();
    // Keep at least one sector and drop at least one, so the write is really torn.
    let keep = rng.gen_range(0..sectors);
    let drop = (keep + rng.gen_range(1..sectors)) % sectors;
    flags[keep] = true;
    flags[drop] = false;
    let mut torn = selection.clone();
    torn.0[victim] = Kept::Sectors(flags);
    Some(torn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn window(n: usize) -> Vec<WindowWrite> {
        (0..n)
            .map(|i| WindowWrite {
                op_index: i,
                offset: i as u64 * 4096,
                len_bytes: 4096,
                epoch: 0,
            })
            .collect()
    }

    #[test]
    fn small_windows_are_explored_exhaustively() {
        let mut rng = StdRng::seed_from_u64(1);
        let all = selections(&window(3), &Sampling::default(), &mut rng);
        assert_eq!(all.len(), 8);
    }

    #[test]
    fn large_windows_are_sampled_with_both_extremes() {
        let mut rng = StdRng::seed_from_u64(1);
        let sampled = selections(&window(20), &Sampling::default(), &mut rng);
        assert!(sampled.len() <= 8 && sampled.len() >= 3);
        assert!(sampled.contains(&Selection::nothing(20)));
        assert!(sampled.contains(&Selection(vec![Kept::Whole; 20])));
    }

    #[test]
    fn torn_states_tear_one_write_for_real() {
        let mut rng = StdRng::seed_from_u64(2);
        let sampling = Sampling {
            torn_writes: true,
            ..Sampling::default()
        };
        let states = selections(&window(2), &sampling, &mut rng);
        let torn: Vec<&Vec<bool>> = states
            .iter()
            .flat_map(|s| &s.0)
            .filter_map(|k| match k {
                Kept::Sectors(flags) => Some(flags),
                _ => None,
            })
            .collect();
        assert!(!torn.is_empty());
        assert!(torn.iter().all(|f| f.contains(&true) && f.contains(&false)));
    }

    #[test]
    fn the_largest_write_is_cut_at_every_sector_and_torn_at_each() {
        let mut w = window(2);
        w[1].len_bytes = 3 * 4096;
        let sampling = Sampling {
            exhaustive_max: 0,
            samples_per_point: 2,
            every_cut_of_largest_write: true,
            ..Sampling::default()
        };
        let states = selections(&w, &sampling, &mut StdRng::seed_from_u64(4));
        let sectors = 24;
        let cuts: Vec<&Vec<bool>> = states
            .iter()
            .filter_map(|s| match &s.0[1] {
                Kept::Sectors(flags) => Some(flags),
                _ => None,
            })
            .collect();
        for cut in 0..=sectors {
            let prefix: Vec<bool> = (0..sectors).map(|i| i < cut).collect();
            assert!(cuts.contains(&&prefix), "the cut after {cut} sectors");
        }
        for hole in 0..sectors {
            let torn: Vec<bool> = (0..sectors).map(|i| i != hole).collect();
            assert!(cuts.contains(&&torn), "the tear at sector {hole}");
        }
    }

    #[test]
    fn barrier_epochs_prune_impossible_subsets() {
        let mut w = window(2);
        w[1].epoch = 1;
        let mut rng = StdRng::seed_from_u64(3);
        let states = selections(&w, &Sampling::default(), &mut rng);
        assert_eq!(states.len(), 3, "{{}}, {{0}}, {{0,1}} but not {{1}}");
    }
}
