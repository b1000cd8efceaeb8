//! Comparing two runs of a skill: is the head better or worse than the base, and is the
//! difference real?
//!
//! Cases are paired by test case id, their attempts (repeats) nested under them; cases only in
//! one run are listed as added or removed, never paired. For the overall score and each rubric
//! criterion the comparison reports the paired mean difference with its case-clustered standard
//! error and t interval and a seeded bootstrap interval of whole cases ([`crate::stats`]); for
//! the pass rate, the paired difference and the exact McNemar test on the cases that flipped.
//! Criteria are many tests at once, so their p-values are Holm-adjusted. A case whose
//! definition, grader or judge model changed measures something else: it is flagged
//! `not_comparable` and left out of the statistics (unless forced).
//!
//! The [regression gate](GateConfig) fails when the head is significantly worse: the McNemar
//! test finds more pass→fail than fail→pass flips than chance explains (p < α), or the whole
//! interval of the mean score difference lies below a margin (−0.02). `docs/comparing.md`
//! gives the reasoning. The result serialises to the JSON-shapes seed's `comparison.json`
//! (criteria scores, totals, winner, key differentiators, summary) extended with these
//! statistics, and renders as Markdown for a pull-request comment ([`markdown`]).

mod input;
mod markdown;
mod record;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use input::{
    differences, fingerprint, fingerprints, AttemptOutcome, CaseFingerprint, CaseRecord,
    NotComparableReason, RunSide,
};
pub use markdown::markdown;
pub use record::GateRecord;

use crate::stats::{
    holm_adjust, mcnemar_exact, paired_bootstrap, paired_difference, BootstrapInterval, McNemar,
    PairedDifference, StatsError, DEFAULT_RESAMPLES,
};
use crate::summary::Verdict;
use skilleval_model::gate::GateConfig;

/// A case whose score moved less than this is unchanged.
pub const UNCHANGED_BELOW: f64 = 0.01;

/// How a comparison is computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareOptions {
    pub comparison_id: String,
    pub timestamp: DateTime<Utc>,
    /// Seeds the bootstrap; stored with the comparison so it reproduces.
    pub seed: u64,
    /// Bootstrap resamples (10,000).
    pub resamples: u32,
    /// Interval level (0.95).
    pub confidence: f64,
    /// A case moving less than this is unchanged (0.01).
    pub unchanged_below: f64,
    /// Compare cases flagged `not_comparable` too (the issue's `force=true`).
    pub force: bool,
    pub gate: GateConfig,
}

impl CompareOptions {
    /// The defaults, seeded from the two run ids (the same pair always gives the same
    /// intervals).
    pub fn new(comparison_id: impl Into<String>, base_run: &str, head_run: &str) -> Self {
        CompareOptions {
            comparison_id: comparison_id.into(),
            timestamp: Utc::now(),
            seed: seed_for(base_run, head_run),
            resamples: DEFAULT_RESAMPLES,
            confidence: 0.95,
            unchanged_below: UNCHANGED_BELOW,
            force: false,
            gate: GateConfig::default(),
        }
    }
}

/// A seed derived from the two run ids: the top 53 bits of SHA-256("base\nhead"), so it
/// survives a round trip through JSON numbers in any client (JavaScript's are doubles).
pub fn seed_for(base_run: &str, head_run: &str) -> u64 {
    let digest = Sha256::digest(format!("{base_run}\n{head_run}").as_bytes());
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(bytes) >> 11
}

/// Why two runs could not be compared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    #[error("no test case ran in both runs (base {base_run}, head {head_run})")]
    NoCommonCases { base_run: String, head_run: String },
    #[error(
        "not_comparable: all {count} shared test cases changed their definition, grader or \
         judge model; compare them anyway with force"
    )]
    NotComparable { count: usize },
    /// A statistic refused its input: an option out of range (confidence, resamples) or a
    /// non-finite score in a hand-built [`CaseRecord`].
    #[error("comparison statistics: {0}")]
    Statistics(#[from] StatsError),
}

/// How a case moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Improved,
    Regressed,
    Unchanged,
}

/// A case whose pass/fail verdict changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flip {
    PassToFail,
    FailToPass,
}

/// The seed's `winner`: `A` (the base) when the head is significantly worse, `B` when it is
/// significantly better, `tie` when no difference is detectable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Winner {
    A,
    B,
    #[serde(rename = "tie")]
    Tie,
}

/// The head against the base, in words the history shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Better,
    Worse,
    NoDetectableDifference,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Better => "better",
            Outcome::Worse => "worse",
            Outcome::NoDetectableDifference => "no detectable difference",
        }
    }
}

/// One paired case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseDelta {
    pub test_case_id: String,
    pub name: String,
    pub attempts_a: u64,
    pub attempts_b: u64,
    /// Mean score over graded attempts; `None` when every attempt errored.
    pub score_a: Option<f64>,
    pub score_b: Option<f64>,
    pub pass_rate_a: f64,
    pub pass_rate_b: f64,
    pub passed_a: bool,
    pub passed_b: bool,
    /// Score difference (head − base) where both sides have a score, else the pass-rate
    /// difference.
    pub delta: f64,
    pub change: Change,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flip: Option<Flip>,
    /// Why the two runs of this case measure different things (empty when they do not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_comparable: Vec<NotComparableReason>,
}

/// A paired score comparison: means, difference with its clustered SE and t interval, and the
/// bootstrap interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreDelta {
    pub mean_a: f64,
    pub mean_b: f64,
    /// Cases with a score on both sides.
    pub cases: u64,
    pub difference: PairedDifference,
    pub bootstrap: BootstrapInterval,
}

/// One rubric criterion, in the seed's `criteria_scores` shape plus its statistics. Scores are
/// means of the normalised criterion (0–1), not the seed comparator's 1–5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionScore {
    pub criterion: String,
    pub score_a: f64,
    pub score_b: f64,
    pub justification_a: String,
    pub justification_b: String,
    #[serde(flatten)]
    pub statistics: ScoreDelta,
    /// The paired t-test's p-value after Holm's correction across the criteria.
    pub p_holm: f64,
    /// `p_holm` below the gate's α.
    pub significant: bool,
}

/// The pass rate, paired.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassRateDelta {
    /// Mean over cases of the case's pass rate (attempts passed / attempts).
    pub rate_a: f64,
    pub rate_b: f64,
    pub cases: u64,
    pub difference: PairedDifference,
    pub bootstrap: BootstrapInterval,
    /// On the cases whose verdict (at least half the attempts passed) flipped.
    pub mcnemar: McNemar,
}

/// How many cases went where.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Cases in the statistics.
    pub paired: u64,
    pub improved: u64,
    pub regressed: u64,
    pub unchanged: u64,
    pub added: u64,
    pub removed: u64,
    pub not_comparable: u64,
    pub not_run: u64,
}

/// A case left out because its two runs measure different things.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotComparableCase {
    pub test_case_id: String,
    pub reasons: Vec<NotComparableReason>,
}

/// The regression gate's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateDecision {
    pub verdict: Verdict,
    /// Each rule that failed, in words (empty on `pass`).
    pub reasons: Vec<String>,
    /// Paired cases that regressed, worst first (named in the report whenever the gate fails).
    pub regressed_cases: Vec<String>,
    pub config: GateConfig,
}

/// Two runs compared: the seed's `comparison.json` fields first, then the statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub comparison_id: String,
    pub timestamp: DateTime<Utc>,
    pub version_a: Value,
    pub version_b: Value,
    pub criteria_scores: Vec<CriterionScore>,
    /// Mean score of the paired cases (0 when none was scored on both sides).
    pub total_score_a: f64,
    pub total_score_b: f64,
    pub winner: Winner,
    pub key_differentiators: Vec<String>,
    pub summary: String,
    pub run_a: String,
    pub run_b: String,
    pub outcome: Outcome,
    /// `None` when no paired case has a score on both sides (every attempt errored).
    pub overall: Option<ScoreDelta>,
    pub pass_rate: PassRateDelta,
    pub counts: Counts,
    /// Paired cases, the most moved first.
    pub cases: Vec<CaseDelta>,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// In both runs but without an attempt that ran in one of them.
    pub not_run: Vec<String>,
    pub not_comparable: Vec<NotComparableCase>,
    pub gate: GateDecision,
    pub seed: u64,
    pub resamples: u32,
    pub confidence: f64,
    /// The blind comparator's verdicts beside the statistics, when it was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blind_comparator: Option<skilleval_grading::comparator::BlindSummary>,
}

/// Compares `head` (B) with `base` (A).
pub fn compare(
    base: &RunSide,
    head: &RunSide,
    options: &CompareOptions,
) -> Result<Comparison, CompareError> {
    let head_by_id: BTreeMap<&str, &CaseRecord> = head
        .cases
        .iter()
        .map(|c| (c.test_case_id.as_str(), c))
        .collect();
    let base_ids: BTreeSet<&str> = base.cases.iter().map(|c| c.test_case_id.as_str()).collect();
    let added: Vec<String> = head
        .cases
        .iter()
        .filter(|c| !base_ids.contains(c.test_case_id.as_str()))
        .map(|c| c.test_case_id.clone())
        .collect();
    let mut removed = Vec::new();
    let mut not_run = Vec::new();
    let mut shared: Vec<(&CaseRecord, &CaseRecord, Vec<NotComparableReason>)> = Vec::new();
    for a in &base.cases {
        let Some(b) = head_by_id.get(a.test_case_id.as_str()) else {
            removed.push(a.test_case_id.clone());
            continue;
        };
        if a.attempts.is_empty() || b.attempts.is_empty() {
            not_run.push(a.test_case_id.clone());
            continue;
        }
        let reasons = differences(a.fingerprint.as_ref(), b.fingerprint.as_ref());
        shared.push((a, b, reasons));
    }
    if shared.is_empty() {
        return Err(CompareError::NoCommonCases {
            base_run: base.run_id.clone(),
            head_run: head.run_id.clone(),
        });
    }
    let not_comparable: Vec<NotComparableCase> = shared
        .iter()
        .filter(|(_, _, r)| !r.is_empty())
        .map(|(a, _, r)| NotComparableCase {
            test_case_id: a.test_case_id.clone(),
            reasons: r.clone(),
        })
        .collect();
    if not_comparable.len() == shared.len() && !options.force {
        return Err(CompareError::NotComparable {
            count: shared.len(),
        });
    }
    let pairs: Vec<(&CaseRecord, &CaseRecord, Vec<NotComparableReason>)> = shared
        .into_iter()
        .filter(|(_, _, r)| options.force || r.is_empty())
        .collect();

    let mut cases: Vec<CaseDelta> = pairs
        .iter()
        .map(|(a, b, r)| case_delta(a, b, r, options.unchanged_below))
        .collect();

    // Overall score: cases scored on both sides.
    let scored: Vec<(f64, f64)> = pairs
        .iter()
        .filter_map(|(a, b, _)| Some((a.mean_score()?, b.mean_score()?)))
        .collect();
    let overall = if scored.is_empty() {
        None
    } else {
        Some(score_delta(&scored, options, 0)?)
    };

    // Pass rate: every paired case (an errored attempt counts as not passed).
    let rates: Vec<(f64, f64)> = pairs
        .iter()
        .filter_map(|(a, b, _)| Some((a.pass_rate()?, b.pass_rate()?)))
        .collect();
    let rate_delta = score_delta(&rates, options, 1)?;
    let regressions = cases
        .iter()
        .filter(|c| c.flip == Some(Flip::PassToFail))
        .count() as u64;
    let improvements = cases
        .iter()
        .filter(|c| c.flip == Some(Flip::FailToPass))
        .count() as u64;
    let pass_rate = PassRateDelta {
        rate_a: rate_delta.mean_a,
        rate_b: rate_delta.mean_b,
        cases: rate_delta.cases,
        difference: rate_delta.difference,
        bootstrap: rate_delta.bootstrap,
        mcnemar: mcnemar_exact(regressions, improvements),
    };

    let criteria_scores = criteria(&pairs, options)?;

    cases.sort_by(|x, y| {
        y.delta
            .abs()
            .total_cmp(&x.delta.abs())
            .then_with(|| x.test_case_id.cmp(&y.test_case_id))
    });
    let count = |change: Change| cases.iter().filter(|c| c.change == change).count() as u64;
    let counts = Counts {
        paired: cases.len() as u64,
        improved: count(Change::Improved),
        regressed: count(Change::Regressed),
        unchanged: count(Change::Unchanged),
        added: added.len() as u64,
        removed: removed.len() as u64,
        not_comparable: not_comparable.len() as u64,
        not_run: not_run.len() as u64,
    };

    let gate = gate(&options.gate, overall.as_ref(), &pass_rate, &cases);
    let outcome = outcome(&options.gate, overall.as_ref(), &pass_rate, &gate);
    let winner = match outcome {
        Outcome::Better => Winner::B,
        Outcome::Worse => Winner::A,
        Outcome::NoDetectableDifference => Winner::Tie,
    };
    let key_differentiators = cases
        .iter()
        .filter(|c| c.change != Change::Unchanged)
        .take(5)
        .map(describe_case)
        .collect();
    let summary = summary_sentence(outcome, overall.as_ref(), &pass_rate, &counts);

    Ok(Comparison {
        comparison_id: options.comparison_id.clone(),
        timestamp: options.timestamp,
        version_a: base.version.clone(),
        version_b: head.version.clone(),
        criteria_scores,
        total_score_a: overall.as_ref().map_or(0.0, |o| o.mean_a),
        total_score_b: overall.as_ref().map_or(0.0, |o| o.mean_b),
        winner,
        key_differentiators,
        summary,
        run_a: base.run_id.clone(),
        run_b: head.run_id.clone(),
        outcome,
        overall,
        pass_rate,
        counts,
        cases,
        added,
        removed,
        not_run,
        not_comparable,
        gate,
        seed: options.seed,
        resamples: options.resamples,
        confidence: options.confidence,
        blind_comparator: None,
    })
}

fn case_delta(
    a: &CaseRecord,
    b: &CaseRecord,
    reasons: &[NotComparableReason],
    unchanged_below: f64,
) -> CaseDelta {
    let (score_a, score_b) = (a.mean_score(), b.mean_score());
    let (rate_a, rate_b) = (a.pass_rate().unwrap_or(0.0), b.pass_rate().unwrap_or(0.0));
    let delta = match (score_a, score_b) {
        (Some(x), Some(y)) => y - x,
        _ => rate_b - rate_a,
    };
    let change = if delta.abs() < unchanged_below {
        Change::Unchanged
    } else if delta > 0.0 {
        Change::Improved
    } else {
        Change::Regressed
    };
    let (passed_a, passed_b) = (a.passed(), b.passed());
    let flip = match (passed_a, passed_b) {
        (true, false) => Some(Flip::PassToFail),
        (false, true) => Some(Flip::FailToPass),
        _ => None,
    };
    CaseDelta {
        test_case_id: a.test_case_id.clone(),
        name: if b.name.is_empty() {
            a.name.clone()
        } else {
            b.name.clone()
        },
        attempts_a: a.attempts.len() as u64,
        attempts_b: b.attempts.len() as u64,
        score_a,
        score_b,
        pass_rate_a: rate_a,
        pass_rate_b: rate_b,
        passed_a,
        passed_b,
        delta,
        change,
        flip,
        not_comparable: reasons.to_vec(),
    }
}

/// The paired statistics of per-case `(base, head)` values. `stream` separates the bootstrap
/// seeds of the statistics computed from one comparison seed.
fn score_delta(
    values: &[(f64, f64)],
    options: &CompareOptions,
    stream: u64,
) -> Result<ScoreDelta, StatsError> {
    let n = values.len() as f64;
    let diffs: Vec<f64> = values.iter().map(|(a, b)| b - a).collect();
    let difference = paired_difference(&diffs, options.confidence)?;
    let bootstrap = paired_bootstrap(
        &diffs,
        options.resamples,
        options.confidence,
        options.seed.wrapping_add(stream),
    )?;
    Ok(ScoreDelta {
        mean_a: values.iter().map(|(a, _)| a).sum::<f64>() / n,
        mean_b: values.iter().map(|(_, b)| b).sum::<f64>() / n,
        cases: values.len() as u64,
        difference,
        bootstrap,
    })
}

fn criteria(
    pairs: &[(&CaseRecord, &CaseRecord, Vec<NotComparableReason>)],
    options: &CompareOptions,
) -> Result<Vec<CriterionScore>, StatsError> {
    let names: BTreeSet<&str> = pairs
        .iter()
        .flat_map(|(a, b, _)| a.attempts.iter().chain(b.attempts.iter()))
        .flat_map(|at| at.criteria.keys().map(String::as_str))
        .collect();
    let mut stats = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let values: Vec<(f64, f64)> = pairs
            .iter()
            .filter_map(|(a, b, _)| Some((a.criterion_mean(name)?, b.criterion_mean(name)?)))
            .collect();
        if values.is_empty() {
            continue;
        }
        // Streams 0 and 1 are the overall score and the pass rate.
        stats.push((name, score_delta(&values, options, 2 + i as u64)?));
    }
    let adjusted = holm_adjust(
        &stats
            .iter()
            .map(|(_, s)| s.difference.p_value)
            .collect::<Vec<_>>(),
    );
    Ok(stats
        .into_iter()
        .zip(adjusted)
        .map(|((name, s), p_holm)| CriterionScore {
            criterion: name.to_string(),
            score_a: s.mean_a,
            score_b: s.mean_b,
            justification_a: format!("mean over {} paired cases", s.cases),
            justification_b: format!(
                "mean over {} paired cases; difference {:+.3} (95 % CI {:+.3} to {:+.3})",
                s.cases, s.difference.mean, s.difference.ci_low, s.difference.ci_high
            ),
            statistics: s,
            p_holm,
            significant: p_holm < options.gate.alpha,
        })
        .collect())
}

fn gate(
    config: &GateConfig,
    overall: Option<&ScoreDelta>,
    pass_rate: &PassRateDelta,
    cases: &[CaseDelta],
) -> GateDecision {
    let mut reasons = Vec::new();
    let m = &pass_rate.mcnemar;
    if m.regressions > m.improvements && m.p_two_sided < config.alpha {
        reasons.push(format!(
            "pass rate fell: {} cases went from pass to fail and {} from fail to pass \
             (exact McNemar p = {:.4} < {})",
            m.regressions, m.improvements, m.p_two_sided, config.alpha
        ));
    }
    if let Some(o) = overall {
        // The p-value condition only matters when the interval is degenerate (every case moved
        // by the same amount, or one case): otherwise an interval below a negative margin
        // already implies it.
        if o.difference.ci_high < config.score_margin && o.difference.p_value < config.alpha {
            reasons.push(format!(
                "mean score fell by {:.3}: its {:.0} % interval ({:+.3} to {:+.3}) lies below \
                 {:+.3}",
                -o.difference.mean,
                o.difference.confidence * 100.0,
                o.difference.ci_low,
                o.difference.ci_high,
                config.score_margin
            ));
        }
    }
    let mut regressed: Vec<&CaseDelta> = cases
        .iter()
        .filter(|c| c.change == Change::Regressed || c.flip == Some(Flip::PassToFail))
        .collect();
    regressed.sort_by(|x, y| {
        x.delta
            .total_cmp(&y.delta)
            .then_with(|| x.test_case_id.cmp(&y.test_case_id))
    });
    GateDecision {
        verdict: if reasons.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        reasons,
        regressed_cases: regressed.iter().map(|c| c.test_case_id.clone()).collect(),
        config: *config,
    }
}

/// Worse when the gate fails or either measure is significantly lower; better when either is
/// significantly higher and neither is lower; otherwise no detectable difference.
fn outcome(
    config: &GateConfig,
    overall: Option<&ScoreDelta>,
    pass_rate: &PassRateDelta,
    gate: &GateDecision,
) -> Outcome {
    let m = &pass_rate.mcnemar;
    let flips_worse = m.regressions > m.improvements && m.p_two_sided < config.alpha;
    let flips_better = m.improvements > m.regressions && m.p_two_sided < config.alpha;
    let significant = |o: &ScoreDelta| o.difference.p_value < config.alpha;
    let score_worse = overall.is_some_and(|o| o.difference.ci_high < 0.0 && significant(o));
    let score_better = overall.is_some_and(|o| o.difference.ci_low > 0.0 && significant(o));
    if gate.verdict == Verdict::Fail || flips_worse || score_worse {
        Outcome::Worse
    } else if flips_better || score_better {
        Outcome::Better
    } else {
        Outcome::NoDetectableDifference
    }
}

fn fmt_score(s: Option<f64>) -> String {
    s.map_or_else(|| "errored".to_string(), |v| format!("{v:.2}"))
}

fn describe_case(c: &CaseDelta) -> String {
    let flip = match c.flip {
        Some(Flip::PassToFail) => ", pass → fail",
        Some(Flip::FailToPass) => ", fail → pass",
        None => "",
    };
    format!(
        "{}: {} → {} ({:+.2}{flip})",
        c.test_case_id,
        fmt_score(c.score_a),
        fmt_score(c.score_b),
        c.delta
    )
}

fn summary_sentence(
    outcome: Outcome,
    overall: Option<&ScoreDelta>,
    pass_rate: &PassRateDelta,
    counts: &Counts,
) -> String {
    let score = overall.map_or_else(String::new, |o| {
        format!(
            "mean score {:.3} → {:.3} ({:+.3}, 95 % CI {:+.3} to {:+.3}); ",
            o.mean_a, o.mean_b, o.difference.mean, o.difference.ci_low, o.difference.ci_high
        )
    });
    format!(
        "B is {} A over {} paired cases: {score}pass rate {:.1} % → {:.1} % \
         (McNemar p = {:.3}); {} improved, {} regressed, {} unchanged.",
        match outcome {
            Outcome::Better => "better than",
            Outcome::Worse => "worse than",
            Outcome::NoDetectableDifference => "not detectably different from",
        },
        counts.paired,
        pass_rate.rate_a * 100.0,
        pass_rate.rate_b * 100.0,
        pass_rate.mcnemar.p_two_sided,
        counts.improved,
        counts.regressed,
        counts.unchanged,
    )
}
