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

/// The latency distribution as `points` evenly spaced quantiles, in microseconds: entry
/// `i` is the nearest-rank value at quantile `(i + 1) / points`, so the last is the maximum.
/// Empty for no samples.
pub fn cdf_us(samples_ns: &[u64], points: usize) -> Vec<f64> {
    if samples_ns.is_empty() {
        return Vec::new();
    }
    let mut sorted = samples_ns.to_vec();
    sorted.sort_unstable();
    (1..=points)
        .map(|i| percentile(&sorted, 100.0 * i as f64 / points as f64) as f64 / 1000.0)
        .collect()
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
    fn cdf_points_are_nearest_rank_quantiles() {
        let samples_ns: Vec<u64> = (1..=200).rev().map(|i| i * 1000).collect();
        assert_eq!(cdf_us(&samples_ns, 4), vec![50.0, 100.0, 150.0, 200.0]);
        let hundred = cdf_us(&samples_ns, 100);
        assert_eq!(hundred.len(), 100);
        assert_eq!((hundred[0], hundred[49], hundred[99]), (2.0, 100.0, 200.0));
        // Fewer samples than points: steps, never interpolation.
        assert_eq!(cdf_us(&[3000, 1000], 4), vec![1.0, 1.0, 3.0, 3.0]);
        assert!(cdf_us(&[], 100).is_empty());
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
