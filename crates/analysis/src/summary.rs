//! Aggregating job results into a run summary and a verdict.
//!
//! Scores are statistics over graded cases (passed and failed); an errored case has no score
//! but counts against the pass rate. The verdict is `fail` when any `priority: critical` case did
//! not pass, when the pass rate is under `settings.passThreshold` (default 1.0), or when the
//! weighted mean is under `settings.scoreThreshold` (when set).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_model::definition::EvalSettings;
use skilleval_model::grade::Usage;

/// Pass rate a run needs when the definition sets none: every case must pass.
pub const DEFAULT_PASS_THRESHOLD: f64 = 1.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
        }
    }
}

/// Counts and mean of one slice of results (a tag, a suite, a strategy).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    pub total: u64,
    pub passed: u64,
    pub failed: u64,
    pub errored: u64,
    pub pass_rate: f64,
    /// Mean score of the graded cases; `None` when none was graded.
    pub mean: Option<f64>,
}

/// A rubric criterion across the run (report spec's `rubricBreakdown`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CriterionStats {
    /// Mean normalised score in [0, 1].
    pub average_score: f64,
    pub weight: f64,
    /// `average_score * weight`.
    pub contribution: f64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Durations {
    /// Sum of case durations (CPU-ish time, not wall clock when cases ran in parallel).
    pub total_ms: u64,
    pub p50_ms: u64,
    pub p95_ms: u64,
    /// Wall clock from the first start to the last finish.
    pub wall_ms: u64,
}

/// Everything a report or a gate needs about a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub total: u64,
    pub passed: u64,
    pub failed: u64,
    pub errored: u64,
    pub skipped: u64,
    /// `passed / total`.
    pub pass_rate: f64,
    pub mean: f64,
    pub median: f64,
    pub std_dev: f64,
    pub min: f64,
    pub max: f64,
    /// Mean weighted by the cases' `weight`.
    pub weighted_mean: f64,
    pub by_tag: BTreeMap<String, GroupStats>,
    pub by_suite: BTreeMap<String, GroupStats>,
    pub by_strategy: BTreeMap<String, GroupStats>,
    pub by_criterion: BTreeMap<String, CriterionStats>,
    /// Share of `json_schema` cases whose output was valid; `None` without such cases.
    pub schema_compliance_rate: Option<f64>,
    pub durations: Durations,
    pub produce_usage: Usage,
    pub grade_usage: Usage,
    pub verdict: Verdict,
    /// Why the verdict is what it is, one line each.
    pub verdict_reasons: Vec<String>,
    pub pass_threshold: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_threshold: Option<f64>,
}

/// Mean, median, population standard deviation, min and max; zeros for no values.
pub fn describe(values: &[f64]) -> (f64, f64, f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0, 0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 0 {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    };
    (
        mean,
        median,
        var.sqrt(),
        sorted[0],
        sorted[sorted.len() - 1],
    )
}

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A group's counts and the running sum of its scores (its mean is all a group reports).
#[derive(Debug, Default)]
struct GroupAcc {
    stats: GroupStats,
    score_sum: f64,
    scored: u64,
}

impl GroupAcc {
    fn add(&mut self, r: &JobResult) {
        self.stats.total += 1;
        match r.status {
            CaseStatus::Passed => self.stats.passed += 1,
            CaseStatus::Failed => self.stats.failed += 1,
            CaseStatus::Errored => self.stats.errored += 1,
            _ => {}
        }
        if let Some(s) = r.score {
            self.score_sum += s;
            self.scored += 1;
        }
    }
}

fn finish(groups: BTreeMap<String, GroupAcc>) -> BTreeMap<String, GroupStats> {
    groups
        .into_iter()
        .map(|(k, acc)| {
            let mut g = acc.stats;
            g.pass_rate = ratio(g.passed, g.total);
            g.mean = (acc.scored > 0).then(|| acc.score_sum / acc.scored as f64);
            (k, g)
        })
        .collect()
}

/// `a / b`, or 0 when `b` is 0 (an empty group has no rate).
pub fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Summarises a run's results against its settings.
pub fn summarize(results: &[JobResult], settings: &EvalSettings) -> RunSummary {
    let mut s = Summarizer::default();
    for r in results {
        s.add(r);
    }
    s.finish(settings)
}

/// [`summarize`] one result at a time, so a caller can stream a run's results (a page from
/// the database at a time) instead of holding them all. What it keeps per case is one score
/// and one duration (8 bytes each, for the median and the percentiles); everything else is
/// counters and per-group sums.
#[derive(Debug, Default)]
pub struct Summarizer {
    passed: u64,
    failed: u64,
    errored: u64,
    skipped: u64,
    scores: Vec<f64>,
    weighted: (f64, f64),
    by_tag: BTreeMap<String, GroupAcc>,
    by_suite: BTreeMap<String, GroupAcc>,
    by_strategy: BTreeMap<String, GroupAcc>,
    criteria: BTreeMap<String, (f64, f64, u64)>,
    schema: (u64, u64),
    durations: Vec<u64>,
    produce_usage: Usage,
    grade_usage: Usage,
    reasons: Vec<String>,
    first_start: Option<chrono::DateTime<chrono::Utc>>,
    last_finish: Option<chrono::DateTime<chrono::Utc>>,
}

impl Summarizer {
    /// Counts one result.
    pub fn add(&mut self, r: &JobResult) {
        match r.status {
            CaseStatus::Passed => self.passed += 1,
            CaseStatus::Failed => self.failed += 1,
            CaseStatus::Errored => self.errored += 1,
            CaseStatus::Skipped | CaseStatus::Queued => self.skipped += 1,
        }
        if let Some(s) = r.score {
            self.scores.push(s);
            self.weighted.0 += s * r.weight;
            self.weighted.1 += r.weight;
        }
        if r.critical && r.status != CaseStatus::Passed {
            self.reasons.push(format!(
                "critical case `{}` did not pass ({})",
                r.test_case_id,
                r.status.as_str()
            ));
        }
        for tag in &r.tags {
            self.by_tag.entry(tag.clone()).or_default().add(r);
        }
        for suite in &r.suites {
            self.by_suite.entry(suite.clone()).or_default().add(r);
        }
        match self.by_strategy.get_mut(&r.strategy) {
            Some(g) => g.add(r),
            None => self
                .by_strategy
                .entry(r.strategy.clone())
                .or_default()
                .add(r),
        }
        if let Some(serde_json::Value::Object(map)) = &r.rubric_scores {
            for (name, c) in map {
                let score = c
                    .get("normalized")
                    .or_else(|| c.get("score"))
                    .and_then(serde_json::Value::as_f64);
                let weight = c
                    .get("weight")
                    .and_then(serde_json::Value::as_f64)
                    .unwrap_or(0.0);
                if let Some(score) = score {
                    let entry = self.criteria.entry(name.clone()).or_default();
                    entry.0 += score;
                    entry.1 = weight;
                    entry.2 += 1;
                }
            }
        }
        // Only graded cases say anything about compliance: errored and skipped ones never
        // produced JSON to check.
        if r.strategy == skilleval_grading::json_schema::NAME
            && matches!(r.status, CaseStatus::Passed | CaseStatus::Failed)
        {
            self.schema.1 += 1;
            if r.schema_errors.as_ref().is_none_or(Vec::is_empty)
                && r.score.is_some_and(|s| s >= 1.0)
            {
                self.schema.0 += 1;
            }
        }
        if r.status != CaseStatus::Skipped && r.status != CaseStatus::Queued {
            self.durations.push(r.duration_ms);
            self.first_start = Some(
                self.first_start
                    .map_or(r.started_at, |s| s.min(r.started_at)),
            );
            self.last_finish = Some(
                self.last_finish
                    .map_or(r.finished_at, |s| s.max(r.finished_at)),
            );
        }
        self.produce_usage.add(&r.produce_usage);
        self.grade_usage.add(&r.grade_usage);
    }

    /// The summary of every result added, against the run's settings.
    pub fn finish(self, settings: &EvalSettings) -> RunSummary {
        let Summarizer {
            passed,
            failed,
            errored,
            skipped,
            scores,
            weighted,
            by_tag,
            by_suite,
            by_strategy,
            criteria,
            schema,
            mut durations,
            produce_usage,
            grade_usage,
            mut reasons,
            first_start,
            last_finish,
        } = self;
        let total = passed + failed + errored + skipped;
        let (mean, median, std_dev, min, max) = describe(&scores);
        let weighted_mean = if weighted.1 > 0.0 {
            weighted.0 / weighted.1
        } else {
            0.0
        };
        let pass_rate = ratio(passed, total);
        let pass_threshold = settings.pass_threshold.unwrap_or(DEFAULT_PASS_THRESHOLD);
        if pass_rate + 1e-9 < pass_threshold {
            reasons.push(format!(
                "pass rate {:.1}% is under the threshold {:.1}%",
                pass_rate * 100.0,
                pass_threshold * 100.0
            ));
        }
        if let Some(t) = settings.score_threshold {
            if weighted_mean + 1e-9 < t {
                reasons.push(format!(
                    "weighted mean score {weighted_mean:.3} is under the threshold {t:.3}"
                ));
            }
        }
        if total == 0 {
            reasons.push("no test case ran".into());
        }
        durations.sort_unstable();
        let wall_ms = match (first_start, last_finish) {
            (Some(a), Some(b)) => u64::try_from((b - a).num_milliseconds()).unwrap_or(0),
            _ => 0,
        };
        RunSummary {
            total,
            passed,
            failed,
            errored,
            skipped,
            pass_rate,
            mean,
            median,
            std_dev,
            min,
            max,
            weighted_mean,
            by_tag: finish(by_tag),
            by_suite: finish(by_suite),
            by_strategy: finish(by_strategy),
            by_criterion: criteria
                .into_iter()
                .map(|(k, (sum, weight, n))| {
                    let average_score = sum / n as f64;
                    (
                        k,
                        CriterionStats {
                            average_score,
                            weight,
                            contribution: average_score * weight,
                            count: n,
                        },
                    )
                })
                .collect(),
            schema_compliance_rate: (schema.1 > 0).then(|| ratio(schema.0, schema.1)),
            durations: Durations {
                total_ms: durations.iter().sum(),
                p50_ms: percentile(&durations, 50.0),
                p95_ms: percentile(&durations, 95.0),
                wall_ms,
            },
            produce_usage,
            grade_usage,
            verdict: if reasons.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Fail
            },
            verdict_reasons: reasons,
            pass_threshold,
            score_threshold: settings.score_threshold,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skilleval_execution::result::test_result;

    fn result(
        id: &str,
        status: CaseStatus,
        score: Option<f64>,
        weight: f64,
        tags: &[&str],
    ) -> JobResult {
        JobResult {
            duration_ms: 10,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            weight,
            ..test_result(id, status, score)
        }
    }

    #[test]
    fn statistics_over_graded_cases() {
        let rs = vec![
            result("a", CaseStatus::Passed, Some(1.0), 3.0, &["x"]),
            result("b", CaseStatus::Failed, Some(0.5), 1.0, &["x", "y"]),
            result("c", CaseStatus::Failed, Some(0.0), 1.0, &[]),
            result("d", CaseStatus::Errored, None, 1.0, &["y"]),
        ];
        let s = summarize(&rs, &EvalSettings::default());
        assert_eq!((s.total, s.passed, s.failed, s.errored), (4, 1, 2, 1));
        assert!((s.pass_rate - 0.25).abs() < 1e-12);
        assert!((s.mean - 0.5).abs() < 1e-12);
        assert!((s.median - 0.5).abs() < 1e-12);
        assert!((s.std_dev - (1.0f64 / 6.0).sqrt()).abs() < 1e-12);
        assert_eq!((s.min, s.max), (0.0, 1.0));
        // (1*3 + 0.5*1 + 0*1) / 5
        assert!((s.weighted_mean - 0.7).abs() < 1e-12);
        assert_eq!(s.by_tag["x"].total, 2);
        assert_eq!(s.by_tag["y"].errored, 1);
        assert_eq!(s.by_tag["y"].mean, Some(0.5));
        assert_eq!(s.verdict, Verdict::Fail);
    }

    #[test]
    fn verdict_passes_over_threshold_but_fails_on_a_critical_case() {
        let mut rs = vec![
            result("a", CaseStatus::Passed, Some(1.0), 1.0, &[]),
            result("b", CaseStatus::Passed, Some(1.0), 1.0, &[]),
            result("c", CaseStatus::Passed, Some(1.0), 1.0, &[]),
            result("d", CaseStatus::Failed, Some(0.0), 1.0, &[]),
        ];
        let settings = EvalSettings {
            pass_threshold: Some(0.75),
            ..EvalSettings::default()
        };
        assert_eq!(summarize(&rs, &settings).verdict, Verdict::Pass);
        rs[3].critical = true;
        let s = summarize(&rs, &settings);
        assert_eq!(s.verdict, Verdict::Fail);
        assert!(s.verdict_reasons[0].contains("critical case `d`"));
    }

    #[test]
    fn score_threshold_is_checked_on_the_weighted_mean() {
        let rs = vec![
            result("a", CaseStatus::Passed, Some(0.6), 1.0, &[]),
            result("b", CaseStatus::Passed, Some(0.7), 1.0, &[]),
        ];
        let settings = EvalSettings {
            score_threshold: Some(0.7),
            ..EvalSettings::default()
        };
        let s = summarize(&rs, &settings);
        assert_eq!(s.verdict, Verdict::Fail);
        assert!(s.verdict_reasons[0].contains("weighted mean"));
    }

    #[test]
    fn rubric_breakdown_and_schema_compliance() {
        let mut a = result("a", CaseStatus::Passed, Some(1.0), 1.0, &[]);
        a.strategy = "json_schema".into();
        let mut b = result("b", CaseStatus::Failed, Some(0.8), 1.0, &[]);
        b.strategy = "json_schema".into();
        b.schema_errors = Some(vec![skilleval_model::grade::SchemaError {
            path: "/x".into(),
            message: "m".into(),
            value: None,
            expected: None,
        }]);
        let mut c = result("c", CaseStatus::Passed, Some(0.9), 1.0, &[]);
        c.rubric_scores = Some(json!({"accuracy": {"normalized": 0.5, "weight": 0.4}}));
        let mut d = result("d", CaseStatus::Passed, Some(0.9), 1.0, &[]);
        d.rubric_scores = Some(json!({"accuracy": {"normalized": 1.0, "weight": 0.4}}));
        let s = summarize(&[a, b, c, d], &EvalSettings::default());
        assert_eq!(s.schema_compliance_rate, Some(0.5));
        let acc = &s.by_criterion["accuracy"];
        assert!((acc.average_score - 0.75).abs() < 1e-12);
        assert!((acc.contribution - 0.3).abs() < 1e-12);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 95.0), 95);
        assert_eq!(percentile(&[7], 95.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
