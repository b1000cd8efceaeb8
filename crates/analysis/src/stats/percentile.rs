//! Percentiles by linear interpolation between order statistics (Hyndman & Fan's type 7, the
//! default of R's `quantile` and NumPy), used for the p10/p50/p90 of quality buckets.

use serde::{Deserialize, Serialize};

/// The `q`-quantile (`q` in [0, 1], clamped) of `values`; `None` when there is no finite value.
/// NaN values are left out.
pub fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_unstable_by(f64::total_cmp);
    Some(percentile_sorted(&sorted, q))
}

/// The `q`-quantile of an ascending, non-empty slice (0 when empty).
pub(crate) fn percentile_sorted(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return 0.0;
    }
    let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

/// The p10, p50 and p90 of a bucket's scores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    pub p10: f64,
    pub p50: f64,
    pub p90: f64,
}

impl Quantiles {
    /// `None` when there is no value.
    pub fn of(values: &[f64]) -> Option<Quantiles> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        if sorted.is_empty() {
            return None;
        }
        sorted.sort_unstable_by(f64::total_cmp);
        Some(Quantiles {
            p10: percentile_sorted(&sorted, 0.1),
            p50: percentile_sorted(&sorted, 0.5),
            p90: percentile_sorted(&sorted, 0.9),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_seven_matches_r_quantile() {
        // R: quantile(c(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), c(.1, .5, .9)) = 1.9 5.5 9.1
        // (h = 9q: 0.9 -> 1 + 0.9, 4.5 -> 5.5, 8.1 -> 9 + 0.1).
        let xs: Vec<f64> = (1..=10).map(f64::from).collect();
        let q = Quantiles::of(&xs).unwrap();
        assert!((q.p10 - 1.9).abs() < 1e-12);
        assert!((q.p50 - 5.5).abs() < 1e-12);
        assert!((q.p90 - 9.1).abs() < 1e-12);
        // Order does not matter; NaN is left out.
        let shuffled = [0.9, f64::NAN, 0.1, 0.5];
        // Sorted 0.1, 0.5, 0.9: p10 at h = 0.2 -> 0.1 + 0.2 x 0.4 = 0.18.
        assert!((percentile(&shuffled, 0.1).unwrap() - 0.18).abs() < 1e-12);
        assert_eq!(percentile(&shuffled, 0.5), Some(0.5));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(
            Quantiles::of(&[0.7]).map(|q| (q.p10, q.p90)),
            Some((0.7, 0.7))
        );
    }
}
