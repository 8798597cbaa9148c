//! Medians, paired ratios and bootstrap intervals for the run summary.
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use crate::stats::median;

/// Bootstrap resamples per interval: enough for stable 2.5% / 97.5% percentiles, cheap next
/// to a run (a few ms for hundreds of pairs).
pub const BOOTSTRAP_RESAMPLES: usize = 2000;

/// Fixed seed of the bootstrap, so the same records give the same interval.
const BOOTSTRAP_SEED: u64 = 0x5eed_b007;

/// The `q`-quantile (0..=1) of sorted `v` by linear interpolation between closest ranks.
fn quantile_sorted(v: &[f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// A median with its percentile-bootstrap 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MedianInterval {
    /// Median of the values.
    pub median: f64,
    /// 2.5% percentile of the bootstrap medians.
    pub low: f64,
    /// 97.5% percentile of the bootstrap medians.
    pub high: f64,
    /// Number of values.
    pub n: usize,
}

/// The median of `values` and a 95% percentile-bootstrap interval for it: the values are
/// resampled with replacement [`BOOTSTRAP_RESAMPLES`] times (fixed seed), and the interval
/// is the 2.5% and 97.5% quantiles of the resamples' medians. One value gives a zero-width
/// interval; no values give `None`.
pub fn median_interval(values: &[f64]) -> Option<MedianInterval> {
    let median = median(values)?;
    let n = values.len();
    let mut rng = StdRng::seed_from_u64(BOOTSTRAP_SEED);
    let mut medians = Vec::with_capacity(BOOTSTRAP_RESAMPLES);
    let mut sample = vec![0.0; n];
    for _ in 0..BOOTSTRAP_RESAMPLES {
        for s in sample.iter_mut() {
            *s = values[rng.random_range(0..n)];
        }
        medians.push(self::median(&sample).unwrap_or(median));
    }
    medians.sort_by(f64::total_cmp);
    Some(MedianInterval {
        median,
        low: quantile_sorted(&medians, 0.025),
        high: quantile_sorted(&medians, 0.975),
        n,
    })
}

/// Paired ratios `a[k] / b[k]` for every key present in both lists (keys compared with
/// `==`; pairs with a non-positive denominator are skipped), in `a`'s order.
pub fn paired_ratios<K: PartialEq>(a: &[(K, f64)], b: &[(K, f64)]) -> Vec<f64> {
    a.iter()
        .filter_map(|(key, num)| {
            let (_, den) = b.iter().find(|(k, _)| k == key)?;
            (*den > 0.0).then(|| num / den)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_ratios_match_keys_not_positions() {
        let spec = [((0, "a"), 6.0), ((0, "b"), 9.0), ((1, "a"), 8.0)];
        let base = [
            ((1, "a"), 4.0),
            ((0, "b"), 3.0),
            ((0, "a"), 2.0),
            ((2, "z"), 1.0),
        ];
        assert_eq!(paired_ratios(&spec, &base), vec![3.0, 3.0, 2.0]);
        // A missing partner or a zero denominator drops the pair.
        assert_eq!(paired_ratios(&spec, &[((0, "a"), 0.0)]), Vec::<f64>::new());
    }

    #[test]
    fn a_single_value_has_a_zero_width_interval() {
        let i = median_interval(&[1.5]).unwrap();
        assert_eq!((i.median, i.low, i.high, i.n), (1.5, 1.5, 1.5, 1));
        assert_eq!(median_interval(&[]), None);
    }

    #[test]
    fn identical_values_have_a_zero_width_interval() {
        let i = median_interval(&[2.0; 7]).unwrap();
        assert_eq!((i.low, i.high), (2.0, 2.0));
    }

    #[test]
    fn interval_brackets_the_median_and_lies_within_the_data() {
        // 1.00, 1.01, ..., 1.99 (shuffled order does not matter).
        let values: Vec<f64> = (0..100)
            .map(|i| 1.0 + ((i * 37) % 100) as f64 / 100.0)
            .collect();
        let i = median_interval(&values).unwrap();
        assert!((i.median - 1.495).abs() < 1e-12);
        assert!(i.low < i.median && i.median < i.high, "{i:?}");
        assert!(i.low >= 1.0 && i.high <= 1.99, "{i:?}");
        // The median of 100 uniform values has a standard error of about 0.05 here: the
        // interval is about ±2 standard errors wide, not the data's whole range.
        assert!(i.high - i.low > 0.08 && i.high - i.low < 0.4, "{i:?}");
    }

    #[test]
    fn interval_is_deterministic() {
        let values = [1.2, 0.9, 1.4, 1.1, 1.3, 1.0];
        assert_eq!(median_interval(&values), median_interval(&values));
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v = [0.0, 10.0, 20.0, 30.0, 40.0];
        assert_eq!(quantile_sorted(&v, 0.0), 0.0);
        assert_eq!(quantile_sorted(&v, 0.5), 20.0);
        assert_eq!(quantile_sorted(&v, 0.975), 39.0);
        assert_eq!(quantile_sorted(&v, 0.025), 1.0);
    }
}
