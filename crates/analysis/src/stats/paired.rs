//! Means with standard errors clustered on the test case, and the paired difference of two runs.
//!
//! Repeats of a case are not independent draws: a hard case fails in most of its attempts. The
//! unit drawn from the universe of possible cases is the case, so the standard error is
//! clustered on it (Miller 2024, §2.3): `SE² = (1/N²) Σ_c (Σ_{i∈c} (x_i − x̄))²` over the `N`
//! observations, times `C/(C−1)` for the `C` clusters (the usual small-sample correction, which
//! makes a run with one attempt per case give exactly the textbook `s/√n`).
//!
//! Two runs over the same cases are compared case by case (Miller §4): each case contributes the
//! difference of its attempt means, `d_c = mean(head_c) − mean(base_c)`, and the estimate is the
//! mean of the `d_c` with standard error `sd(d)/√C` — the case-clustered error of that estimator,
//! since a case's attempts enter only through its `d_c`. Pairing removes the between-case
//! variance both runs share, which is what makes small suites informative. The interval uses
//! Student's t on `C − 1` degrees of freedom: suites are often a few dozen cases, where 1.96
//! would be too narrow.

use serde::{Deserialize, Serialize};

use super::{invalid, t_critical, t_two_sided_p, StatsError};

/// A mean over observations grouped in clusters, with its clustered standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClusteredMean {
    pub mean: f64,
    /// Clustered on the case; 0 with a single cluster (nothing to estimate it from).
    pub se: f64,
    /// Observations (attempts).
    pub n: u64,
    /// Clusters (cases).
    pub clusters: u64,
}

/// The mean of every observation and its standard error clustered on `clusters` (each slice is
/// one case's attempts). Empty clusters are ignored; no observation at all is an error.
pub fn clustered_mean(clusters: &[&[f64]]) -> Result<ClusteredMean, StatsError> {
    let n: usize = clusters.iter().map(|c| c.len()).sum();
    let c = clusters.iter().filter(|c| !c.is_empty()).count();
    if n == 0 {
        return Err(invalid("clusters", "needs at least one observation"));
    }
    if clusters
        .iter()
        .flat_map(|c| c.iter())
        .any(|x| !x.is_finite())
    {
        return Err(invalid(
            "clusters",
            "every observation must be a finite number",
        ));
    }
    let nf = n as f64;
    let mean = clusters.iter().flat_map(|c| c.iter()).sum::<f64>() / nf;
    let se = if c < 2 {
        0.0
    } else {
        let sum_sq: f64 = clusters
            .iter()
            .map(|cl| cl.iter().map(|x| x - mean).sum::<f64>().powi(2))
            .sum();
        let cf = c as f64;
        (sum_sq * cf / (cf - 1.0)).sqrt() / nf
    };
    Ok(ClusteredMean {
        mean,
        se,
        n: n as u64,
        clusters: c as u64,
    })
}

/// The paired mean difference (head − base) over cases, with its interval and test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PairedDifference {
    /// Mean over cases of the per-case difference.
    pub mean: f64,
    /// Standard error clustered on the case; 0 with one case.
    pub se: f64,
    pub ci_low: f64,
    pub ci_high: f64,
    /// The confidence level of the interval (0.95).
    pub confidence: f64,
    /// Two-sided p-value of the paired t-test of "no difference"; the exact sign test's when
    /// every case moved by the same amount, 1 with a single case.
    pub p_value: f64,
    /// Cases paired.
    pub cases: u64,
}

/// The per-case difference of attempt means, `mean(head) − mean(base)`; `None` when either side
/// has no observation.
pub fn case_difference(base: &[f64], head: &[f64]) -> Option<f64> {
    if base.is_empty() || head.is_empty() {
        return None;
    }
    let mb = base.iter().sum::<f64>() / base.len() as f64;
    let mh = head.iter().sum::<f64>() / head.len() as f64;
    Some(mh - mb)
}

/// The paired mean difference of per-case differences `diffs` (one per case, see
/// [`case_difference`]) with a `confidence` interval on Student's t.
pub fn paired_difference(diffs: &[f64], confidence: f64) -> Result<PairedDifference, StatsError> {
    if diffs.is_empty() {
        return Err(invalid("diffs", "needs at least one paired case"));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(invalid("confidence", "must be strictly between 0 and 1"));
    }
    if diffs.iter().any(|d| !d.is_finite()) {
        return Err(invalid("diffs", "every difference must be a finite number"));
    }
    let n = diffs.len() as f64;
    let mean = diffs.iter().sum::<f64>() / n;
    let (se, half, p_value) = if diffs.len() < 2 {
        // One case: nothing to estimate a spread from, so no evidence either way.
        (0.0, 0.0, 1.0)
    } else {
        let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let se = (var / n).sqrt();
        // Identical differences leave only rounding noise in the variance; call it zero rather
        // than report t = 10^16.
        let se = if se <= 1e-12 * mean.abs().max(1.0) {
            0.0
        } else {
            se
        };
        let df = n - 1.0;
        let p = if se == 0.0 {
            // Every case moved by exactly the same amount (three cases each going from 1 to 0
            // under exact_match): the t-test is undefined. The exact sign test needs no
            // variance: under "no change" each case's sign is a coin toss, so all n agreeing
            // has two-sided probability 2·2⁻ⁿ.
            if mean == 0.0 {
                1.0
            } else {
                (2.0 * 0.5f64.powi(diffs.len().min(1_100) as i32)).min(1.0)
            }
        } else {
            t_two_sided_p(mean / se, df)
        };
        (se, t_critical(confidence, df) * se, p)
    };
    Ok(PairedDifference {
        mean,
        se,
        ci_low: mean - half,
        ci_high: mean + half,
        confidence,
        p_value,
        cases: diffs.len() as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn clustered_se_matches_a_hand_computed_example() {
        // Three cases with two attempts each: {1, 1}, {0, 0}, {1, 0}. N = 6, mean = 3/6 = 0.5.
        // Residual sums per case: (0.5 + 0.5) = 1, (-0.5 - 0.5) = -1, (0.5 - 0.5) = 0.
        // Σ (sum)² = 1 + 1 + 0 = 2; times C/(C-1) = 3/2 gives 3; SE = sqrt(3) / 6 = 0.288675.
        let a: &[f64] = &[1.0, 1.0];
        let b: &[f64] = &[0.0, 0.0];
        let c: &[f64] = &[1.0, 0.0];
        let m = clustered_mean(&[a, b, c]).unwrap();
        assert!(close(m.mean, 0.5, 1e-12));
        assert!(close(m.se, 3f64.sqrt() / 6.0, 1e-12), "{}", m.se);
        assert_eq!((m.n, m.clusters), (6, 3));
        // Treating the six attempts as independent understates it: s/sqrt(6) with s² = 0.3
        // gives 0.2236. Repeats that agree within a case are not six pieces of evidence.
        let naive = (0.3f64 / 6.0).sqrt();
        assert!(m.se > naive);
    }

    #[test]
    fn one_attempt_per_case_is_the_textbook_standard_error() {
        // Scores 0.2, 0.4, 0.9: mean 0.5, s² = (0.09 + 0.01 + 0.16) / 2 = 0.13, SE = sqrt(0.13/3).
        let xs = [[0.2], [0.4], [0.9]];
        let clusters: Vec<&[f64]> = xs.iter().map(|x| x.as_slice()).collect();
        let m = clustered_mean(&clusters).unwrap();
        assert!(close(m.se, (0.13f64 / 3.0).sqrt(), 1e-12));
        assert!(clustered_mean(&[]).is_err());
    }

    #[test]
    fn paired_difference_matches_a_hand_computed_example() {
        // Four cases, repeats nested: base/head attempt means give d = (0.5, 0.25, 0.0, 0.25).
        let d = [
            case_difference(&[0.0, 0.0], &[1.0, 0.0]).unwrap(),
            case_difference(&[0.5, 0.5], &[0.75, 0.75]).unwrap(),
            case_difference(&[1.0], &[1.0, 1.0, 1.0]).unwrap(),
            case_difference(&[0.25, 0.25, 0.25], &[0.5]).unwrap(),
        ];
        assert_eq!(d, [0.5, 0.25, 0.0, 0.25]);
        // mean 0.25; s² = (0.0625 + 0 + 0.0625 + 0) / 3 = 0.041667; SE = sqrt(s²/4) = 0.102062.
        // t(0.975, 3) = 3.182446: interval 0.25 ± 0.324809. t = 2.449490 on 3 df: p = 0.09172.
        let p = paired_difference(&d, 0.95).unwrap();
        assert!(close(p.mean, 0.25, 1e-12));
        assert!(close(p.se, 0.102_062, 1e-6), "{}", p.se);
        assert!(close(p.ci_low, 0.25 - 0.324_809, 1e-5), "{}", p.ci_low);
        assert!(close(p.ci_high, 0.25 + 0.324_809, 1e-5));
        assert!(close(p.p_value, 0.091_72, 1e-4), "{}", p.p_value);
        assert_eq!(p.cases, 4);
    }

    #[test]
    fn degenerate_inputs_are_errors_or_certain() {
        assert!(paired_difference(&[], 0.95).is_err());
        assert!(paired_difference(&[0.1], 1.5).is_err());
        assert!(paired_difference(&[f64::NAN, 0.1], 0.95).is_err());
        // Three identical drops: no spread, so the sign test's 2 x 2^-3 = 0.25, not certainty.
        let same = paired_difference(&[-0.1, -0.1, -0.1], 0.95).unwrap();
        assert_eq!((same.se, same.p_value), (0.0, 0.25));
        // Six of them: 2 x 2^-6 = 0.03125, as McNemar would say of six one-way flips.
        let six = paired_difference(&[-1.0; 6], 0.95).unwrap();
        assert_eq!(six.p_value, 0.031_25);
        // A single case is no evidence.
        assert_eq!(paired_difference(&[-0.5], 0.95).unwrap().p_value, 1.0);
        assert!(case_difference(&[], &[1.0]).is_none());
    }
}
