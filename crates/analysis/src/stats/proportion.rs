//! Proportions: Wilson score intervals, the one-sided two-proportion z-test, pass@k and pass^k.
//!
//! The Wilson interval (Wilson 1927) is used for pass rates because the textbook `p ± z·√(pq/n)`
//! collapses to a zero-width interval at 0 % and 100 %, exactly where quality buckets and small
//! suites often sit (Newcombe 1998 compares the methods). The z-test is production
//! monitoring's alert test: is the last window's pass rate below the baseline's?

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, Normal};

use super::{invalid, z_critical, StatsError};

/// A two-sided interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    pub low: f64,
    pub high: f64,
}

/// The Wilson score interval for `successes` out of `n` at `confidence` (0.95).
pub fn wilson_interval(successes: u64, n: u64, confidence: f64) -> Result<Interval, StatsError> {
    if n == 0 {
        return Err(invalid("n", "needs at least one trial"));
    }
    if successes > n {
        return Err(invalid("successes", "must not exceed n"));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(invalid("confidence", "must be strictly between 0 and 1"));
    }
    let z = z_critical(confidence);
    let nf = n as f64;
    let p = successes as f64 / nf;
    let z2 = z * z;
    let denom = 1.0 + z2 / nf;
    let centre = (p + z2 / (2.0 * nf)) / denom;
    let half = z / denom * (p * (1.0 - p) / nf + z2 / (4.0 * nf * nf)).sqrt();
    // At 0 and n successes the bound is exactly 0 (or 1); computed, it is off by rounding.
    Ok(Interval {
        low: if successes == 0 {
            0.0
        } else {
            (centre - half).max(0.0)
        },
        high: if successes == n {
            1.0
        } else {
            (centre + half).min(1.0)
        },
    })
}

/// The one-sided two-proportion z-test of "the current rate is below the baseline's".
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ZTest {
    pub baseline_rate: f64,
    pub current_rate: f64,
    /// `current − baseline`.
    pub difference: f64,
    /// `(current − baseline) / SE` with the pooled standard error; negative on a drop.
    pub z: f64,
    /// `P(Z <= z)`: small when the current rate is credibly lower.
    pub p_value: f64,
}

/// Tests whether `current_passed / current_n` is below `baseline_passed / baseline_n` (pooled
/// standard error, as the textbook test under the null of equal rates).
pub fn two_proportion_z_test(
    baseline_passed: u64,
    baseline_n: u64,
    current_passed: u64,
    current_n: u64,
) -> Result<ZTest, StatsError> {
    if baseline_n == 0 {
        return Err(invalid("baseline_n", "needs at least one sample"));
    }
    if current_n == 0 {
        return Err(invalid("current_n", "needs at least one sample"));
    }
    if baseline_passed > baseline_n {
        return Err(invalid("baseline_passed", "must not exceed baseline_n"));
    }
    if current_passed > current_n {
        return Err(invalid("current_passed", "must not exceed current_n"));
    }
    let (n1, n2) = (baseline_n as f64, current_n as f64);
    let p1 = baseline_passed as f64 / n1;
    let p2 = current_passed as f64 / n2;
    let pooled = (baseline_passed + current_passed) as f64 / (n1 + n2);
    let se = (pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2)).sqrt();
    let difference = p2 - p1;
    let z = if se == 0.0 {
        // Both windows all-pass or all-fail: identical rates, no evidence of a drop.
        0.0
    } else {
        difference / se
    };
    Ok(ZTest {
        baseline_rate: p1,
        current_rate: p2,
        difference,
        z,
        p_value: Normal::standard().cdf(z),
    })
}

/// The unbiased pass@k estimate (Chen et al. 2021, "Evaluating Large Language Models Trained on
/// Code", eq. 1): the chance that at least one of `k` attempts drawn without replacement from
/// `n` (of which `c` passed) passes, `1 − C(n−c, k) / C(n, k)`, computed as a product so large
/// `n` does not overflow. `None` when `k` is 0 or exceeds `n`, or `c > n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    // C(n−c, k) / C(n, k) = Π_{i = n−c+1}^{n} (1 − k/i).
    let none: f64 = ((n - c + 1)..=n)
        .map(|i| 1.0 - k as f64 / i as f64)
        .product();
    Some(1.0 - none)
}

/// The unbiased pass^k estimate (Yao et al. 2024, τ-bench): the chance that all `k` attempts
/// drawn without replacement from `n` (of which `c` passed) pass, `C(c, k) / C(n, k)`. `None`
/// when `k` is 0 or exceeds `n`, or `c > n`.
pub fn pass_hat_k(n: u64, c: u64, k: u64) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if c < k {
        return Some(0.0);
    }
    // C(c, k) / C(n, k) = Π_{i=0}^{k−1} (c − i) / (n − i).
    Some((0..k).map(|i| (c - i) as f64 / (n - i) as f64).product())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn wilson_matches_hand_computed_and_newcombes_values() {
        // 0 of 20: the interval is [0, z²/(n + z²)] = 3.841459 / 23.841459 = 0.16112
        // (Newcombe 1998, Table I, method 3: 0.0000–0.1611).
        let w = wilson_interval(0, 20, 0.95).unwrap();
        assert_eq!(w.low, 0.0);
        assert!(close(w.high, 0.161_12, 1e-5), "{w:?}");
        // 8 of 10 by hand: p = 0.8, z² = 3.841459, denominator 1.3841459,
        // centre (0.8 + 0.192073) / 1.3841459 = 0.716740,
        // half 1.959964 / 1.3841459 x sqrt(0.016 + 0.0096037) = 0.226586 -> 0.49016–0.94333.
        let w = wilson_interval(8, 10, 0.95).unwrap();
        assert!(close(w.low, 0.490_16, 1e-4), "{w:?}");
        assert!(close(w.high, 0.943_33, 1e-4), "{w:?}");
        // Newcombe 1998, Table I: 81/263 -> 0.2553–0.3662; 15/148 -> 0.0624–0.1605.
        let w = wilson_interval(81, 263, 0.95).unwrap();
        assert!(
            close(w.low, 0.2553, 1e-4) && close(w.high, 0.3662, 1e-4),
            "{w:?}"
        );
        let w = wilson_interval(15, 148, 0.95).unwrap();
        assert!(
            close(w.low, 0.0624, 1e-4) && close(w.high, 0.1605, 1e-4),
            "{w:?}"
        );
        assert!(wilson_interval(3, 2, 0.95).is_err());
        assert!(wilson_interval(0, 0, 0.95).is_err());
    }

    #[test]
    fn z_test_matches_a_hand_computed_example() {
        // Baseline 60/100, current 45/100: pooled 105/200 = 0.525, SE = sqrt(0.525 x 0.475 x
        // 0.02) = 0.0706222, z = -0.15 / 0.0706222 = -2.12398, one-sided p = Φ(-2.12398) =
        // 0.016838 (R: prop.test(c(60, 45), c(100, 100), alternative = "greater",
        // correct = FALSE)$p.value = 0.01684).
        let t = two_proportion_z_test(60, 100, 45, 100).unwrap();
        assert!(close(t.z, -2.123_98, 1e-4), "{t:?}");
        assert!(close(t.p_value, 0.016_84, 1e-4), "{t:?}");
        assert!(close(t.difference, -0.15, 1e-12));
        // A rise is not a drop.
        assert!(two_proportion_z_test(45, 100, 60, 100).unwrap().p_value > 0.98);
        // Identical all-pass windows: no evidence.
        assert_eq!(two_proportion_z_test(10, 10, 5, 5).unwrap().p_value, 0.5);
        assert!(two_proportion_z_test(1, 0, 1, 1).is_err());
    }

    #[test]
    fn pass_at_k_matches_the_codex_formula() {
        // Chen et al. 2021: pass@k = 1 − C(n−c, k)/C(n, k).
        // n = 5, c = 2: pass@1 = 2/5; pass@2 = 1 − C(3,2)/C(5,2) = 1 − 3/10 = 0.7;
        // pass@3 = 1 − C(3,3)/C(5,3) = 1 − 1/10 = 0.9; pass@4: n − c < k so 1.
        assert!(close(pass_at_k(5, 2, 1).unwrap(), 0.4, 1e-12));
        assert!(close(pass_at_k(5, 2, 2).unwrap(), 0.7, 1e-12));
        assert!(close(pass_at_k(5, 2, 3).unwrap(), 0.9, 1e-12));
        assert_eq!(pass_at_k(5, 2, 4), Some(1.0));
        // n = 10, c = 3, k = 5: 1 − C(7,5)/C(10,5) = 1 − 21/252 = 0.916667.
        assert!(close(
            pass_at_k(10, 3, 5).unwrap(),
            1.0 - 21.0 / 252.0,
            1e-12
        ));
        assert_eq!(pass_at_k(5, 0, 5), Some(0.0));
        assert_eq!(pass_at_k(3, 1, 4), None);
        assert_eq!(pass_at_k(3, 1, 0), None);
    }

    #[test]
    fn pass_hat_k_is_all_k_pass() {
        // n = 5, c = 3: pass^1 = 3/5; pass^2 = C(3,2)/C(5,2) = 3/10; pass^3 = 1/10; pass^4 = 0.
        assert!(close(pass_hat_k(5, 3, 1).unwrap(), 0.6, 1e-12));
        assert!(close(pass_hat_k(5, 3, 2).unwrap(), 0.3, 1e-12));
        assert!(close(pass_hat_k(5, 3, 3).unwrap(), 0.1, 1e-12));
        assert_eq!(pass_hat_k(5, 3, 4), Some(0.0));
        assert_eq!(pass_hat_k(4, 4, 4), Some(1.0));
        assert_eq!(pass_hat_k(4, 5, 1), None);
    }
}
