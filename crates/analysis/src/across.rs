//! What several runs of a skill add up to: the report spec seed's `ReportSummary` over runs
//! (`totalRuns`, `averageScore`, the distribution of the runs' scores, the schema compliance
//! rate, the rubric breakdown with each criterion's contribution). A run's score is its mean
//! case score; compliance and criteria are pooled over the runs' cases, each run weighing by
//! how many cases it measured them on.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::summary::{describe, CriterionStats, RunSummary, Verdict};

/// The distribution of the runs' scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub median: f64,
    /// Population standard deviation, as a run's own summary has it.
    pub std_dev: f64,
}

/// Several runs summed up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcrossRuns {
    pub total_runs: u64,
    /// The mean of the runs' scores.
    pub average_score: f64,
    pub distribution: Distribution,
    /// Valid `json_schema` outputs over every such case of the runs; `None` when no run had one.
    pub schema_compliance_rate: Option<f64>,
    /// Each rubric criterion over every case of the runs that scored it.
    pub rubric_breakdown: BTreeMap<String, CriterionStats>,
    pub passed_runs: u64,
    /// The mean of the runs' pass rates.
    pub average_pass_rate: f64,
}

/// Sums up `runs` (each a run's stored summary).
pub fn across_runs(runs: &[RunSummary]) -> AcrossRuns {
    let scores: Vec<f64> = runs.iter().map(|r| r.mean).collect();
    let (mean, median, std_dev, min, max) = describe(&scores);
    let n = runs.len() as f64;
    // Compliance pooled by the json_schema cases each run graded (at least one: a run that
    // reports a rate measured something).
    let mut valid = 0.0;
    let mut checked = 0.0;
    for r in runs {
        if let Some(rate) = r.schema_compliance_rate {
            let cases = r
                .by_strategy
                .get("json_schema")
                .map_or(1, |g| g.total.max(1)) as f64;
            valid += rate * cases;
            checked += cases;
        }
    }
    let mut sums: BTreeMap<String, (f64, f64, u64)> = BTreeMap::new();
    for r in runs {
        for (name, c) in &r.by_criterion {
            let weight = c.count.max(1) as f64;
            let e = sums.entry(name.clone()).or_default();
            e.0 += c.average_score * weight;
            e.1 += c.weight * weight;
            e.2 += c.count.max(1);
        }
    }
    let rubric_breakdown = sums
        .into_iter()
        .map(|(name, (score_sum, weight_sum, count))| {
            let average_score = score_sum / count as f64;
            let weight = weight_sum / count as f64;
            (
                name,
                CriterionStats {
                    average_score,
                    weight,
                    contribution: average_score * weight,
                    count,
                },
            )
        })
        .collect();
    AcrossRuns {
        total_runs: runs.len() as u64,
        average_score: mean,
        distribution: Distribution {
            min,
            max,
            mean,
            median,
            std_dev,
        },
        schema_compliance_rate: (checked > 0.0).then(|| valid / checked),
        rubric_breakdown,
        passed_runs: runs.iter().filter(|r| r.verdict == Verdict::Pass).count() as u64,
        average_pass_rate: if runs.is_empty() {
            0.0
        } else {
            runs.iter().map(|r| r.pass_rate).sum::<f64>() / n
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::GroupStats;

    fn run(mean: f64, pass_rate: f64, verdict: Verdict) -> RunSummary {
        let mut s: RunSummary = serde_json::from_value(serde_json::json!({
            "total": 4, "passed": 0, "failed": 0, "errored": 0, "skipped": 0,
            "pass_rate": pass_rate, "mean": mean, "median": mean, "std_dev": 0.0,
            "min": mean, "max": mean, "weighted_mean": mean,
            "by_tag": {}, "by_suite": {}, "by_strategy": {}, "by_criterion": {},
            "schema_compliance_rate": null,
            "durations": {"total_ms": 0, "p50_ms": 0, "p95_ms": 0, "wall_ms": 0},
            "produce_usage": {}, "grade_usage": {},
            "verdict": "pass", "verdict_reasons": [], "pass_threshold": 1.0
        }))
        .unwrap();
        s.verdict = verdict;
        s
    }

    #[test]
    fn three_runs_add_up_to_hand_computed_figures() {
        let mut a = run(0.9, 1.0, Verdict::Pass);
        let mut b = run(0.6, 0.5, Verdict::Fail);
        let c = run(0.3, 0.25, Verdict::Fail);
        // a: 4 json_schema cases, 3 valid; b: 1 case, valid; c: none.
        a.schema_compliance_rate = Some(0.75);
        a.by_strategy.insert(
            "json_schema".into(),
            GroupStats {
                total: 4,
                ..GroupStats::default()
            },
        );
        b.schema_compliance_rate = Some(1.0);
        b.by_strategy.insert(
            "json_schema".into(),
            GroupStats {
                total: 1,
                ..GroupStats::default()
            },
        );
        // accuracy: a scored it on 3 cases at 0.8 (weight 0.5), b on 1 case at 0.4 (weight 0.5).
        a.by_criterion.insert(
            "accuracy".into(),
            CriterionStats {
                average_score: 0.8,
                weight: 0.5,
                contribution: 0.4,
                count: 3,
            },
        );
        b.by_criterion.insert(
            "accuracy".into(),
            CriterionStats {
                average_score: 0.4,
                weight: 0.5,
                contribution: 0.2,
                count: 1,
            },
        );
        let s = across_runs(&[a, b, c]);
        assert_eq!(s.total_runs, 3);
        assert!((s.average_score - 0.6).abs() < 1e-12);
        assert!((s.distribution.median - 0.6).abs() < 1e-12);
        assert_eq!((s.distribution.min, s.distribution.max), (0.3, 0.9));
        // Population std dev of 0.9, 0.6, 0.3: sqrt(0.06) = 0.2449...
        assert!((s.distribution.std_dev - 0.06_f64.sqrt()).abs() < 1e-12);
        // (3 + 1) valid of 5.
        assert!((s.schema_compliance_rate.unwrap() - 0.8).abs() < 1e-12);
        let acc = &s.rubric_breakdown["accuracy"];
        // (0.8 * 3 + 0.4) / 4 = 0.7; contribution 0.7 * 0.5.
        assert!((acc.average_score - 0.7).abs() < 1e-12);
        assert!((acc.weight - 0.5).abs() < 1e-12);
        assert!((acc.contribution - 0.35).abs() < 1e-12);
        assert_eq!(acc.count, 4);
        assert_eq!(s.passed_runs, 1);
        assert!((s.average_pass_rate - 1.75 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn no_runs_and_no_schema_cases_are_zeros_and_none() {
        let s = across_runs(&[]);
        assert_eq!(s.total_runs, 0);
        assert_eq!(s.average_score, 0.0);
        assert_eq!(s.schema_compliance_rate, None);
        let s = across_runs(&[run(0.5, 0.5, Verdict::Pass)]);
        assert_eq!(s.schema_compliance_rate, None);
        assert!(s.rubric_breakdown.is_empty());
    }
}
