//! The exact McNemar test: did a pass rate move between two runs over the same cases?
//!
//! Only the cases that flipped carry information: `b` passed in the base and fail in the head
//! (regressions), `c` failed and now pass (improvements). Under "no change" each flip is equally
//! likely to go either way, so `b ~ Binomial(b + c, 1/2)`. The exact test uses that binomial
//! directly rather than the chi-square approximation, which is poor at the handful of flips a
//! skill's test suite produces.

use serde::{Deserialize, Serialize};
use statrs::distribution::{Binomial, DiscreteCDF};

/// The flips and their p-values.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct McNemar {
    /// Passed in the base, failed in the head.
    pub regressions: u64,
    /// Failed in the base, passed in the head.
    pub improvements: u64,
    /// `P(|X - n/2| >= |b - n/2|)`: the head differs, either way (R's `binom.test`).
    pub p_two_sided: f64,
    /// `P(X >= b)`: the head is worse.
    pub p_worse: f64,
    /// `P(X <= b)`: the head is better.
    pub p_better: f64,
}

/// The exact McNemar test on `regressions` (pass→fail) and `improvements` (fail→pass) flips.
/// With no flips there is no evidence either way: every p-value is 1.
pub fn mcnemar_exact(regressions: u64, improvements: u64) -> McNemar {
    let n = regressions + improvements;
    let (p_worse, p_better) = match Binomial::new(0.5, n) {
        Ok(bin) if n > 0 => {
            // P(X >= b) = 1 - P(X <= b - 1); P(X <= c') by symmetry of p = 1/2.
            let worse = if regressions == 0 {
                1.0
            } else {
                bin.sf(regressions - 1)
            };
            (worse, bin.cdf(regressions))
        }
        _ => (1.0, 1.0),
    };
    // The binomial at p = 1/2 is symmetric, so the two-sided p is twice the smaller tail.
    let p_two_sided = (2.0 * p_worse.min(p_better)).min(1.0);
    McNemar {
        regressions,
        improvements,
        p_two_sided,
        p_worse: p_worse.min(1.0),
        p_better: p_better.min(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn ten_regressions_two_improvements_matches_binom_test() {
        // n = 12: P(X <= 2) = (C(12,0) + C(12,1) + C(12,2)) / 2^12 = (1 + 12 + 66) / 4096
        // = 79/4096 = 0.019287; R: binom.test(10, 12)$p.value = 0.03857 (twice that).
        let m = mcnemar_exact(10, 2);
        assert!(close(m.p_two_sided, 2.0 * 79.0 / 4096.0, 1e-12), "{m:?}");
        assert!(close(m.p_worse, 79.0 / 4096.0, 1e-12));
        // P(X <= 10) = 1 - (1 + 12) / 4096.
        assert!(close(m.p_better, 1.0 - 13.0 / 4096.0, 1e-12));
        // Mirror image: improvements are the better tail.
        let mirror = mcnemar_exact(2, 10);
        assert!(close(mirror.p_better, 79.0 / 4096.0, 1e-12));
        assert!(close(mirror.p_two_sided, m.p_two_sided, 1e-15));
    }

    #[test]
    fn small_and_balanced_flip_counts() {
        // 5 regressions, 0 improvements: 2 * (1/2)^5 = 0.0625, not significant at 0.05 —
        // the smallest all-one-way count that is significant is 6 (2/64 = 0.03125).
        assert!(close(mcnemar_exact(5, 0).p_two_sided, 0.0625, 1e-12));
        assert!(close(mcnemar_exact(6, 0).p_two_sided, 0.03125, 1e-12));
        assert!(close(mcnemar_exact(6, 0).p_worse, 1.0 / 64.0, 1e-12));
        // Balanced flips: the two-sided p is 1 (capped).
        assert_eq!(mcnemar_exact(4, 4).p_two_sided, 1.0);
        // No flips: nothing to test.
        let none = mcnemar_exact(0, 0);
        assert_eq!(
            (none.p_two_sided, none.p_worse, none.p_better),
            (1.0, 1.0, 1.0)
        );
        // One regression alone: P(X >= 1 | n = 1) = 1/2.
        assert!(close(mcnemar_exact(1, 0).p_worse, 0.5, 1e-12));
    }

    #[test]
    fn many_flips_agree_with_the_normal_approximation() {
        // b = 60, c = 40: the continuity-corrected z = (|60 - 40| - 1) / sqrt(100) = 1.9,
        // two-sided normal p = 0.0574; the exact p (R binom.test(60, 100)) is 0.05689.
        let m = mcnemar_exact(60, 40);
        assert!(close(m.p_two_sided, 0.056_89, 5e-5), "{}", m.p_two_sided);
    }
}
