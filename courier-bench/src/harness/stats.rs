//! Summary statistics of a set of samples.
//!
//! The columns are those of the Linux `iov_iter` dispatch patch's test
//! program (TOTAL, LOWEST, HIGHEST, MEAN, STDDEV) plus the quantiles a latency
//! figure needs. Quantiles interpolate linearly between
//! the two nearest ranks (Hyndman & Fan type 7, the default of R and NumPy):
//! for `n` sorted samples `x[0..n]`, quantile `q` sits at position
//! `h = (n - 1) * q` and is `x[⌊h⌋] + (h - ⌊h⌋) * (x[⌊h⌋ + 1] - x[⌊h⌋])`.
//! The standard deviation is the sample one (divided by `n - 1`), and 0 for a
//! single sample.

/// Everything the reports say about one set of samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Sum of all samples (TOTAL).
    pub total: f64,
    /// Smallest sample (LOWEST).
    pub min: f64,
    /// Largest sample (HIGHEST).
    pub max: f64,
    /// Arithmetic mean (MEAN).
    pub mean: f64,
    /// Sample standard deviation (STDDEV).
    pub stddev: f64,
    /// First quartile.
    pub p25: f64,
    /// Median: the figure every report quotes.
    pub median: f64,
    /// Third quartile.
    pub p75: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none or one is not a number.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() || samples.iter().any(|x| x.is_nan()) {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let total: f64 = sorted.iter().sum();
        let mean = total / n as f64;
        let stddev = if n > 1 {
            let squares: f64 = sorted.iter().map(|x| (x - mean) * (x - mean)).sum();
            (squares / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        Some(Summary {
            n,
            total,
            min: sorted[0],
            max: sorted[n - 1],
            mean,
            stddev,
            p25: quantile(&sorted, 0.25),
            median: quantile(&sorted, 0.5),
            p75: quantile(&sorted, 0.75),
            p99: quantile(&sorted, 0.99),
        })
    }

    /// The spread the tables print: the interquartile range as a fraction of
    /// the median (0.10 = the middle half of the samples lies within a band
    /// 10% of the median wide). Robust to the rare outlier a shared VM throws
    /// in, unlike the standard deviation.
    pub fn spread(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.p75 - self.p25) / self.median.abs()
        }
    }
}

/// Quantile `q` (0 to 1) of already sorted samples, interpolated (type 7).
///
/// # Panics
/// If `sorted` is empty or `q` lies outside `0..=1`.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty(), "quantile of no samples");
    assert!((0.0..=1.0).contains(&q), "quantile {q} outside 0..=1");
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(sorted.len() - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn four_samples_by_hand() {
        // Given out of order on purpose: the summary must sort.
        let s = Summary::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!(s.n, 4);
        assert_eq!(s.total, 10.0);
        assert_eq!(s.min, 1.0);
        assert_eq!(s.max, 4.0);
        assert_eq!(s.mean, 2.5);
        // Squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, over n - 1 = 3.
        assert!(close(s.stddev, (5.0f64 / 3.0).sqrt()));
        // h = 3 * 0.25 = 0.75 -> 1 + 0.75 * (2 - 1).
        assert!(close(s.p25, 1.75));
        // h = 1.5 -> halfway between 2 and 3.
        assert!(close(s.median, 2.5));
        // h = 2.25 -> 3 + 0.25 * (4 - 3).
        assert!(close(s.p75, 3.25));
        // h = 2.97 -> 3 + 0.97.
        assert!(close(s.p99, 3.97));
        // (3.25 - 1.75) / 2.5.
        assert!(close(s.spread(), 0.6));
    }

    #[test]
    fn odd_count_median_is_the_middle_sample() {
        let s = Summary::of(&[10.0, 30.0, 20.0, 50.0, 40.0]).unwrap();
        assert_eq!(s.median, 30.0);
        assert_eq!(s.p25, 20.0);
        assert_eq!(s.p75, 40.0);
        // Deviations -20 -10 0 10 20: squares sum to 1000, / 4 = 250.
        assert!(close(s.stddev, 250f64.sqrt()));
    }

    #[test]
    fn one_sample_has_no_deviation() {
        let s = Summary::of(&[7.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.p99), (7.0, 7.0, 7.0, 7.0));
        assert_eq!(s.stddev, 0.0);
        assert_eq!(s.spread(), 0.0);
    }

    #[test]
    fn p99_of_a_hundred_and_one_ranks() {
        // 0, 1, ..., 100: h = 100 * 0.99 = 99 exactly.
        let samples: Vec<f64> = (0..=100).rev().map(f64::from).collect();
        let s = Summary::of(&samples).unwrap();
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.median, 50.0);
        assert_eq!(s.total, 5050.0);
    }

    #[test]
    fn nothing_to_summarise() {
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(Summary::of(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn quantile_ends_are_min_and_max() {
        let sorted = [2.0, 3.0, 5.0, 8.0];
        assert_eq!(quantile(&sorted, 0.0), 2.0);
        assert_eq!(quantile(&sorted, 1.0), 8.0);
        // h = 3 * 0.5 = 1.5 -> 3 + 0.5 * 2.
        assert_eq!(quantile(&sorted, 0.5), 4.0);
    }
}
