//! Statistics for benchmark samples: means, nearest-rank percentiles and ratios.
//!
//! Promises: every figure is computed from the samples given, with no smoothing and no
//! outlier removal (a p99.9 is the sample at that rank). Never divides by zero: a summary of
//! no samples is `None`, a ratio against zero is `None`.

/// A latency distribution, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencySummary {
    pub samples: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub p9999_us: f64,
    pub max_us: f64,
}

impl LatencySummary {
    /// Summarises latencies given in nanoseconds.
    pub fn of_ns(samples_ns: &[u64]) -> Option<LatencySummary> {
        if samples_ns.is_empty() {
            return None;
        }
        let mut sorted = samples_ns.to_vec();
        sorted.sort_unstable();
        let us = |ns: u64| ns as f64 / 1000.0;
        let total_ns: u128 = sorted.iter().map(|&s| u128::from(s)).sum();
        Some(LatencySummary {
            samples: sorted.len(),
            mean_us: total_ns as f64 / sorted.len() as f64 / 1000.0,
            p50_us: us(percentile(&sorted, 50.0)),
            p95_us: us(percentile(&sorted, 95.0)),
            p99_us: us(percentile(&sorted, 99.0)),
            p999_us: us(percentile(&sorted, 99.9)),
            p9999_us: us(percentile(&sorted, 99.99)),
            max_us: us(*sorted.last().expect("not empty")),
        })
    }
}

/// The nearest-rank percentile of sorted samples: the smallest sample such that at least
/// `pct` percent of the samples are at or below it.
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    assert!(
        (0.0..=100.0).contains(&pct),
        "percentile {pct} out of range"
    );
    debug_assert!(
        sorted.windows(2).all(|w| w[0] <= w[1]),
        "samples not sorted"
    );
    // The epsilon keeps float error (99.9 / 100 * 1000 = 999.0000000000001) off the rank.
    let rank = (pct / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of a few repetitions' results (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    Some(if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    })
}

/// `value / reference`, or `None` when the reference is zero or missing.
pub fn ratio(value: f64, reference: Option<f64>) -> Option<f64> {
    reference.filter(|r| *r != 0.0).map(|r| value / r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_of_one_to_a_hundred() {
        let samples: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&samples, 50.0), 50);
        assert_eq!(percentile(&samples, 99.0), 99);
        assert_eq!(percentile(&samples, 99.9), 100);
        assert_eq!(percentile(&samples, 0.0), 1);
        assert_eq!(percentile(&samples, 100.0), 100);
    }

    #[test]
    fn a_summary_sees_the_tail() {
        let mut samples_ns = vec![1_000u64; 999];
        samples_ns.push(5_000_000);
        let s = LatencySummary::of_ns(&samples_ns).unwrap();
        assert_eq!(s.samples, 1000);
        assert_eq!(s.p50_us, 1.0);
        assert_eq!(s.p99_us, 1.0);
        assert_eq!(s.p999_us, 1.0);
        assert_eq!(s.p9999_us, 5000.0);
        assert_eq!(s.max_us, 5000.0);
        assert!((s.mean_us - 5.999).abs() < 1e-9, "mean {}", s.mean_us);
        assert_eq!(LatencySummary::of_ns(&[]), None);
    }

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(ratio(3.0, Some(2.0)), Some(1.5));
        assert_eq!(ratio(3.0, Some(0.0)), None);
        assert_eq!(ratio(3.0, None), None);
    }
}
