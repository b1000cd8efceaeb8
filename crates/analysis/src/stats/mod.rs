//! The statistics behind comparisons, power planning and production monitoring: pure functions,
//! no I/O.
//!
//! The approach follows "Adding error bars to evals" (Miller, 2024, arXiv 2411.00640): a test
//! case is the unit that was drawn from the universe of possible cases, so standard errors are
//! clustered on the case (repeats of a case are not independent evidence), two runs over the
//! same cases are compared through paired per-case differences, resampling draws whole cases,
//! and the number of cases a difference needs is worked out before a run.
//!
//! - [`mcnemar`]: the exact McNemar test on pass↔fail flips.
//! - [`paired`]: means with standard errors clustered on the case, and the paired mean
//!   difference with its interval.
//! - [`bootstrap`]: the seeded paired bootstrap interval (whole cases resampled).
//! - [`holm`]: Holm's step-down correction of several p-values.
//! - [`power`]: minimum detectable effects on a pass rate and the advice that goes with them.
//! - [`proportion`]: Wilson intervals, the one-sided two-proportion z-test, pass@k and pass^k.
//! - [`percentile`]: percentiles (p10/p50/p90 of quality buckets).
//! - [`agreement`]: percent agreement and Cohen's kappa between a judge and human reviewers.
//!
//! Distributions come from `statrs`; the random numbers from `rand_chacha`'s ChaCha8, a fixed
//! algorithm whose output stream that crate keeps stable across releases, so a seed reproduces
//! the same interval on any version and platform.

pub mod agreement;
pub mod bootstrap;
pub mod holm;
pub mod mcnemar;
pub mod paired;
pub mod percentile;
pub mod power;
pub mod proportion;

pub use agreement::{cohen_kappa, Agreement, AgreementTable};
pub use bootstrap::{paired_bootstrap, BootstrapInterval, DEFAULT_RESAMPLES};
pub use holm::holm_adjust;
pub use mcnemar::{mcnemar_exact, McNemar};
pub use paired::{
    case_difference, clustered_mean, paired_difference, ClusteredMean, PairedDifference,
};
pub use percentile::{percentile, Quantiles};
pub use power::{
    cases_for_drop, estimate_within_case_share, mde_pass_rate, power_advice, Design, Mde, Pairing,
    PowerAdvice, Sided, DEFAULT_CASE_CORRELATION, DEFAULT_WITHIN_CASE_SHARE,
};
pub use proportion::{
    pass_at_k, pass_hat_k, two_proportion_z_test, wilson_interval, Interval, ZTest,
};

use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

/// Why a statistic could not be computed. Each names the input and the rule it broke.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatsError {
    #[error("{field}: {rule}")]
    Invalid {
        field: &'static str,
        rule: &'static str,
    },
}

pub(crate) fn invalid(field: &'static str, rule: &'static str) -> StatsError {
    StatsError::Invalid { field, rule }
}

/// The two-sided critical value of the standard normal for a confidence level (1.96 at 0.95).
pub fn z_critical(confidence: f64) -> f64 {
    Normal::standard().inverse_cdf(1.0 - (1.0 - confidence) / 2.0)
}

/// The standard normal quantile at `p` (`z_quantile(0.8)` = 0.8416).
pub fn z_quantile(p: f64) -> f64 {
    Normal::standard().inverse_cdf(p)
}

/// The two-sided critical value of Student's t with `df` degrees of freedom; the normal's when
/// `df` is not finite and positive.
pub fn t_critical(confidence: f64, df: f64) -> f64 {
    match StudentsT::new(0.0, 1.0, df) {
        Ok(t) if df.is_finite() => t.inverse_cdf(1.0 - (1.0 - confidence) / 2.0),
        _ => z_critical(confidence),
    }
}

/// The two-sided p-value of a t statistic with `df` degrees of freedom.
pub fn t_two_sided_p(t_stat: f64, df: f64) -> f64 {
    if t_stat.is_nan() {
        return 1.0;
    }
    let tail = match StudentsT::new(0.0, 1.0, df) {
        Ok(t) if df.is_finite() => t.sf(t_stat.abs()),
        _ => Normal::standard().sf(t_stat.abs()),
    };
    (2.0 * tail).min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn critical_values_match_the_printed_tables() {
        // Standard normal table: z(0.975) = 1.959964, z(0.8) = 0.841621.
        assert!((z_critical(0.95) - 1.959_964).abs() < 1e-6);
        assert!((z_quantile(0.8) - 0.841_621).abs() < 1e-6);
        // Student t table: t(0.975, 9) = 2.262157, t(0.975, 29) = 2.045230.
        assert!((t_critical(0.95, 9.0) - 2.262_157).abs() < 1e-5);
        assert!((t_critical(0.95, 29.0) - 2.045_230).abs() < 1e-5);
        // t = 2.262157 on 9 df is exactly the 5 % two-sided point.
        assert!((t_two_sided_p(2.262_157, 9.0) - 0.05).abs() < 1e-5);
    }
}
