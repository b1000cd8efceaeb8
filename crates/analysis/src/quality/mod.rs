//! Quality over time: graded samples grouped into UTC hour or day buckets, each with its pass
//! rate and Wilson 95 % interval, mean score, p10/p50/p90 and per-criterion means, and a
//! marker wherever the skill's version or the monitor's revision changed.
//!
//! A sample's grade is read back from its job's result by [`graded_sample`]; [`alert`] judges a
//! window of them against the days before it, and [`render`] draws a report as text.
//!
//! Pure: the service feeds it rows from the store, the CLI the samples it just graded. Errored
//! samples were never graded: they are counted per bucket but are not in `n`.

pub mod alert;
pub mod render;

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, Utc};
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::stats::{wilson_interval, Interval, Quantiles};
use skilleval_execution::monitor::job_info;
use skilleval_execution::plan::Job;
use skilleval_execution::result::{CaseStatus, JobResult};

/// Most buckets one report may hold (a year of hours is 8,760).
pub const MAX_BUCKETS: usize = 10_000;

/// The outcome of grading one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SampleStatus {
    Passed,
    Failed,
    /// Could not be graded (a grader fault, a timeout).
    Errored,
}

/// One criterion's grade on one sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CriterionGrade {
    pub score: f64,
    pub passed: bool,
}

/// One graded sample, as the quality report reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GradedSample {
    pub sample_id: String,
    pub observed_at: DateTime<Utc>,
    /// The skill version that produced the output, when the sample said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The monitor revision it was graded with.
    pub monitor_revision: u32,
    pub status: SampleStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Per criterion name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub criteria: BTreeMap<String, CriterionGrade>,
}

impl GradedSample {
    /// Whether it passed; `None` when it was not graded.
    pub fn passed(&self) -> Option<bool> {
        match self.status {
            SampleStatus::Passed => Some(true),
            SampleStatus::Failed => Some(false),
            SampleStatus::Errored => None,
        }
    }

    /// Passed and score as seen through `criterion` (the whole sample when `None`).
    fn view(&self, criterion: Option<&str>) -> Option<(bool, Option<f64>)> {
        match criterion {
            None => self.passed().map(|p| (p, self.score)),
            Some(name) => self.criteria.get(name).map(|g| (g.passed, Some(g.score))),
        }
    }
}

/// Bucket width.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BucketSize {
    Hour,
    #[default]
    Day,
}

impl BucketSize {
    pub fn duration(self) -> Duration {
        match self {
            BucketSize::Hour => Duration::hours(1),
            BucketSize::Day => Duration::days(1),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BucketSize::Hour => "hour",
            BucketSize::Day => "day",
        }
    }

    /// The start of the bucket holding `t` (UTC).
    pub fn floor(self, t: DateTime<Utc>) -> DateTime<Utc> {
        t.duration_trunc(self.duration()).unwrap_or(t)
    }
}

impl std::str::FromStr for BucketSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hour" => Ok(BucketSize::Hour),
            "day" => Ok(BucketSize::Day),
            other => Err(format!("bucket must be `hour` or `day`, not `{other}`")),
        }
    }
}

/// What to report on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QualityQuery {
    /// First bucket holds this instant (default: the first sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DateTime<Utc>>,
    /// Samples before this instant (default: just after the last sample).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<DateTime<Utc>>,
    #[serde(default)]
    pub bucket: BucketSize,
    /// Only samples of this skill version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Judge by this criterion alone (its pass and score) instead of the whole sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion: Option<String>,
}

/// One bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityBucket {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// Graded samples.
    pub n: u64,
    pub passed: u64,
    /// Samples that could not be graded (not in `n`).
    pub errored: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate: Option<f64>,
    /// Wilson 95 % interval of `pass_rate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_rate_ci: Option<Interval>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_quantiles: Option<Quantiles>,
    /// Mean score per criterion.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub criteria: BTreeMap<String, f64>,
}

/// What changed at a marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarkerKind {
    Version,
    MonitorRevision,
}

/// A change of the skill's version or the monitor's revision between consecutive samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Marker {
    /// The first sample observed with the new value.
    pub at: DateTime<Utc>,
    /// The bucket it falls in.
    pub bucket_start: DateTime<Utc>,
    pub kind: MarkerKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    pub to: String,
}

/// The report over the whole range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityReport {
    pub skill: String,
    pub bucket: BucketSize,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub criterion: Option<String>,
    /// Every bucket of the range, empty ones included (a gap is information).
    pub buckets: Vec<QualityBucket>,
    pub markers: Vec<Marker>,
    /// The whole range as one bucket.
    pub total: QualityBucket,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QualityError {
    #[error("from must be before to")]
    EmptyRange,
    #[error(
        "the range holds {0} buckets (at most {MAX_BUCKETS}): use bucket=day or a shorter range"
    )]
    TooManyBuckets(i64),
}

#[derive(Default)]
struct Acc {
    passed: u64,
    n: u64,
    errored: u64,
    scores: Vec<f64>,
    criteria: BTreeMap<String, (f64, u64)>,
}

impl Acc {
    fn add(&mut self, s: &GradedSample, criterion: Option<&str>) {
        match s.view(criterion) {
            Some((passed, score)) => {
                self.n += 1;
                self.passed += u64::from(passed);
                if let Some(score) = score {
                    self.scores.push(score);
                }
                for (name, g) in &s.criteria {
                    if criterion.is_none_or(|c| c == name) {
                        let e = self.criteria.entry(name.clone()).or_default();
                        e.0 += g.score;
                        e.1 += 1;
                    }
                }
            }
            None if s.status == SampleStatus::Errored => self.errored += 1,
            None => {}
        }
    }

    fn finish(self, start: DateTime<Utc>, end: DateTime<Utc>) -> QualityBucket {
        let pass_rate = (self.n > 0).then(|| self.passed as f64 / self.n as f64);
        let mean_score = (!self.scores.is_empty())
            .then(|| self.scores.iter().sum::<f64>() / self.scores.len() as f64);
        QualityBucket {
            start,
            end,
            n: self.n,
            passed: self.passed,
            errored: self.errored,
            pass_rate,
            pass_rate_ci: wilson_interval(self.passed, self.n, 0.95).ok(),
            mean_score,
            score_quantiles: Quantiles::of(&self.scores),
            criteria: self
                .criteria
                .into_iter()
                .map(|(k, (sum, n))| (k, sum / n as f64))
                .collect(),
        }
    }
}

/// Computes the report of `samples` (any order) for `query`.
pub fn quality(
    skill: &str,
    samples: &[GradedSample],
    query: &QualityQuery,
) -> Result<QualityReport, QualityError> {
    let size = query.bucket;
    let width = size.duration();
    let mut selected: Vec<&GradedSample> = samples
        .iter()
        .filter(|s| query.version.is_none() || s.version == query.version)
        .filter(|s| query.from.is_none_or(|f| s.observed_at >= f))
        .filter(|s| query.to.is_none_or(|t| s.observed_at < t))
        .collect();
    selected.sort_by(|a, b| {
        a.observed_at
            .cmp(&b.observed_at)
            .then_with(|| a.sample_id.cmp(&b.sample_id))
    });
    let first = query
        .from
        .or_else(|| selected.first().map(|s| s.observed_at))
        .unwrap_or_else(Utc::now);
    let from = size.floor(first);
    let to = query
        .to
        .or_else(|| {
            selected
                .last()
                .map(|s| s.observed_at + Duration::nanoseconds(1))
        })
        .unwrap_or(first + Duration::nanoseconds(1));
    if to <= first {
        return Err(QualityError::EmptyRange);
    }
    let span = (to - from).num_nanoseconds().unwrap_or(i64::MAX);
    let step = width.num_nanoseconds().unwrap_or(i64::MAX);
    let count = span / step + i64::from(span % step != 0);
    if count > MAX_BUCKETS as i64 {
        return Err(QualityError::TooManyBuckets(count));
    }
    let count = count.max(1) as usize;
    let mut accs: Vec<Acc> = (0..count).map(|_| Acc::default()).collect();
    let mut total = Acc::default();
    let criterion = query.criterion.as_deref();
    let mut markers = Vec::new();
    let mut last_version: Option<&str> = None;
    let mut last_revision: Option<u32> = None;
    for s in &selected {
        let index = ((s.observed_at - from).num_seconds() / width.num_seconds()) as usize;
        if let Some(acc) = accs.get_mut(index) {
            acc.add(s, criterion);
        }
        total.add(s, criterion);
        if let Some(v) = s.version.as_deref() {
            if last_version.is_some_and(|l| l != v) {
                markers.push(Marker {
                    at: s.observed_at,
                    bucket_start: size.floor(s.observed_at),
                    kind: MarkerKind::Version,
                    from: last_version.map(str::to_string),
                    to: v.to_string(),
                });
            }
            last_version = Some(v);
        }
        if last_revision.is_some_and(|r| r != s.monitor_revision) {
            markers.push(Marker {
                at: s.observed_at,
                bucket_start: size.floor(s.observed_at),
                kind: MarkerKind::MonitorRevision,
                from: last_revision.map(|r| r.to_string()),
                to: s.monitor_revision.to_string(),
            });
        }
        last_revision = Some(s.monitor_revision);
    }
    let buckets = accs
        .into_iter()
        .enumerate()
        .map(|(i, acc)| {
            let start = from + width * i as i32;
            acc.finish(start, start + width)
        })
        .collect();
    Ok(QualityReport {
        skill: skill.to_string(),
        bucket: size,
        from,
        to,
        version: query.version.clone(),
        criterion: query.criterion.clone(),
        buckets,
        markers,
        total: total.finish(from, to),
    })
}

/// The graded sample a job's result stands for. `observed_at` falls back to `received_at`
/// (the ingest time) when the sample did not say.
pub fn graded_sample(job: &Job, result: &JobResult, received_at: DateTime<Utc>) -> GradedSample {
    let info = job_info(job);
    let status = match result.status {
        CaseStatus::Passed => SampleStatus::Passed,
        CaseStatus::Failed => SampleStatus::Failed,
        _ => SampleStatus::Errored,
    };
    let mut criteria = BTreeMap::new();
    if status != SampleStatus::Errored {
        if let (Some(info), Some(Value::Array(components))) =
            (&info, result.details.get("components"))
        {
            for c in components {
                let name = c
                    .get("strategy")
                    .and_then(Value::as_str)
                    .and_then(|s| info.criteria.get(s));
                let score = c.get("score").and_then(Value::as_f64);
                let passed = c.get("passed").and_then(Value::as_bool);
                if let (Some(name), Some(score), Some(passed)) = (name, score, passed) {
                    criteria.insert(name.clone(), CriterionGrade { score, passed });
                }
            }
        }
    }
    GradedSample {
        sample_id: job.case.id.clone(),
        observed_at: info
            .as_ref()
            .and_then(|i| i.observed_at)
            .unwrap_or(received_at),
        version: info.as_ref().and_then(|i| i.version.clone()),
        monitor_revision: info.as_ref().map_or(0, |i| i.monitor_revision),
        status,
        score: result.score.filter(|_| status != SampleStatus::Errored),
        criteria,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(day: u32, hour: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, day, hour, 30, 0).unwrap()
    }

    fn sample(id: &str, t: DateTime<Utc>, passed: bool, version: &str, rev: u32) -> GradedSample {
        let score = if passed { 1.0 } else { 0.25 };
        GradedSample {
            sample_id: id.into(),
            observed_at: t,
            version: Some(version.into()),
            monitor_revision: rev,
            status: if passed {
                SampleStatus::Passed
            } else {
                SampleStatus::Failed
            },
            score: Some(score),
            criteria: [
                (
                    "format".to_string(),
                    CriterionGrade {
                        score: 1.0,
                        passed: true,
                    },
                ),
                ("tone".to_string(), CriterionGrade { score, passed }),
            ]
            .into_iter()
            .collect(),
        }
    }

    /// Day 1: 8 of 10 pass (v1); day 2: nothing; day 3: 0 of 20 (v2 from the start, monitor
    /// revision 2 from the fifth sample); plus one errored sample on day 1.
    fn history() -> Vec<GradedSample> {
        let mut out = Vec::new();
        for i in 0..10 {
            out.push(sample(&format!("a{i}"), at(1, i), i < 8, "1.0.0", 1));
        }
        for i in 0..20 {
            out.push(sample(
                &format!("c{i:02}"),
                at(3, i),
                false,
                "1.1.0",
                if i < 4 { 1 } else { 2 },
            ));
        }
        out.push(GradedSample {
            status: SampleStatus::Errored,
            score: None,
            criteria: BTreeMap::new(),
            ..sample("err", at(1, 12), false, "1.0.0", 1)
        });
        out
    }

    #[test]
    fn buckets_have_known_pass_rates_and_hand_computed_wilson_intervals() {
        let r = quality("s", &history(), &QualityQuery::default()).unwrap();
        assert_eq!(r.buckets.len(), 3);
        let (d1, d2, d3) = (&r.buckets[0], &r.buckets[1], &r.buckets[2]);
        assert_eq!(d1.start, Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap());
        assert_eq!((d1.n, d1.passed, d1.errored), (10, 8, 1));
        assert_eq!(d1.pass_rate, Some(0.8));
        // 8 of 10 by hand: centre (0.8 + 1.920729/10) / 1.3841459 = 0.716740, half-width
        // 1.959964 / 1.3841459 x sqrt(0.016 + 0.0096037) = 0.226586 -> 0.49016 .. 0.94333.
        let ci = d1.pass_rate_ci.unwrap();
        assert!(
            (ci.low - 0.490_16).abs() < 1e-4 && (ci.high - 0.943_33).abs() < 1e-4,
            "{ci:?}"
        );
        // Mean score: (8 x 1 + 2 x 0.25) / 10; quantiles of two 0.25s and eight 1s (type 7):
        // p10 at h = 0.9, between the two 0.25s -> 0.25; p50 at h = 4.5 -> 1.
        assert!((d1.mean_score.unwrap() - 0.85).abs() < 1e-12);
        let q = d1.score_quantiles.unwrap();
        assert!(
            (q.p10 - 0.25).abs() < 1e-12 && q.p50 == 1.0 && q.p90 == 1.0,
            "{q:?}"
        );
        assert!((d1.criteria["tone"] - 0.85).abs() < 1e-12);
        assert_eq!(d1.criteria["format"], 1.0);
        // The empty day is kept, with nothing to say.
        assert_eq!((d2.n, d2.pass_rate, d2.pass_rate_ci), (0, None, None));
        // 0 of 20: Wilson [0, z²/(n + z²)] = 3.841459 / 23.841459 = 0.16112.
        assert_eq!(d3.pass_rate, Some(0.0));
        let ci = d3.pass_rate_ci.unwrap();
        assert_eq!(ci.low, 0.0);
        assert!((ci.high - 0.161_12).abs() < 1e-5, "{ci:?}");
        assert_eq!((r.total.n, r.total.passed, r.total.errored), (30, 8, 1));
    }

    #[test]
    fn markers_where_version_or_revision_changed() {
        let r = quality("s", &history(), &QualityQuery::default()).unwrap();
        let kinds: Vec<(MarkerKind, Option<&str>, &str)> = r
            .markers
            .iter()
            .map(|m| (m.kind, m.from.as_deref(), m.to.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (MarkerKind::Version, Some("1.0.0"), "1.1.0"),
                (MarkerKind::MonitorRevision, Some("1"), "2")
            ]
        );
        assert_eq!(r.markers[0].at, at(3, 0));
        assert_eq!(r.markers[1].at, at(3, 4));
        assert_eq!(r.markers[1].bucket_start, r.buckets[2].start);
    }

    #[test]
    fn filters_by_version_and_criterion_and_buckets_by_hour() {
        let q = QualityQuery {
            version: Some("1.0.0".into()),
            criterion: Some("format".into()),
            bucket: BucketSize::Hour,
            ..QualityQuery::default()
        };
        let r = quality("s", &history(), &q).unwrap();
        // Day 1, 00:30 .. 12:30: thirteen hourly buckets; "format" passed everywhere.
        assert_eq!(r.buckets.len(), 13);
        assert_eq!((r.total.n, r.total.passed), (10, 10));
        assert_eq!(r.total.criteria.keys().collect::<Vec<_>>(), ["format"]);
        assert_eq!(r.buckets[3].n, 1);
        assert_eq!(r.buckets[11].n, 0);
        // An explicit range outside the data: empty buckets, no error.
        let q = QualityQuery {
            from: Some(at(5, 0)),
            to: Some(at(7, 0)),
            ..QualityQuery::default()
        };
        let r = quality("s", &history(), &q).unwrap();
        assert_eq!(r.buckets.len(), 3);
        assert_eq!(r.total.n, 0);
        let q = QualityQuery {
            from: Some(at(1, 0)),
            to: Some(Utc.with_ymd_and_hms(2028, 3, 1, 0, 0, 0).unwrap()),
            bucket: BucketSize::Hour,
            ..QualityQuery::default()
        };
        assert!(matches!(
            quality("s", &history(), &q),
            Err(QualityError::TooManyBuckets(_))
        ));
    }
}

/// A production sample through the whole flow: its monitor's job, graded by the executor,
/// read back as a graded sample.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod sample_flow_tests {
    use std::sync::Arc;

    use chrono::{TimeZone, Utc};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use skilleval_execution::executor::Executor;
    use skilleval_execution::monitor::fixtures::{monitor_doc, source};
    use skilleval_execution::monitor::{
        parse, sample, sample_job, CriteriaSelection, Sample, SampleJobContext,
    };
    use skilleval_execution::runner::RunnerRegistry;
    use skilleval_grading::StrategyRegistry;
    use skilleval_sandbox::Sandbox;

    fn registry() -> StrategyRegistry {
        StrategyRegistry::builtin().build()
    }

    fn sample(id: &str, output: &str, tools: &[&str]) -> Sample {
        let tool_calls = tools
            .iter()
            .map(|t| json!({"name": t, "arguments": {}}))
            .collect::<Vec<_>>();
        sample::parse_sample(
            0,
            &json!({
                "sample_id": id, "version": "1.2.0", "observed_at": "2026-03-01T10:00:00Z",
                "input": "refund A-1001 please", "output": output, "tool_calls": tool_calls
            }),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_sample_is_graded_as_a_given_job_by_the_executor() {
        let root = tempfile::tempdir().unwrap();
        let (m, _) = parse(&monitor_doc(), &source(root.path()), &registry()).unwrap();
        let ctx = SampleJobContext {
            run_id: Uuid::nil(),
            package_hash: "hash",
            monitor_revision: 3,
            selection: CriteriaSelection::WithoutModel,
        };
        let executor = Executor::new(
            registry(),
            RunnerRegistry::builtin(),
            Arc::new(Sandbox::default()),
        );
        let good = sample_job(
            &m,
            &sample("s1", "Thank you: APPROVED", &["lookup_order"]),
            0,
            &ctx,
        )
        .unwrap();
        assert_eq!(good.runner.kind, "given");
        assert_eq!(good.strategy(), "hybrid");
        let info = job_info(&good).unwrap();
        assert_eq!(info.monitor_revision, 3);
        assert_eq!(info.skipped_criteria, ["judge"]);
        let result = executor.execute(&good, root.path()).await;
        let graded = graded_sample(&good, &result, Utc::now());
        assert_eq!(graded.status, SampleStatus::Passed, "{result:#?}");
        assert_eq!(graded.monitor_revision, 3);
        assert_eq!(graded.version.as_deref(), Some("1.2.0"));
        assert_eq!(
            graded.observed_at,
            Utc.with_ymd_and_hms(2026, 3, 1, 10, 0, 0).unwrap()
        );
        assert_eq!(graded.score, Some(1.0));
        let names: Vec<&String> = graded.criteria.keys().collect();
        assert_eq!(names, ["looked-up", "polite", "states-decision"]);

        // Impolite, called a forbidden tool: two criteria fail; the score is the weighted
        // mean (regex 1 x 1, contains 0 x 0.5, tool_usage 2 of 3 checks... x 1) / 2.5.
        let bad = sample_job(
            &m,
            &sample("s2", "APPROVED", &["lookup_order", "delete_order"]),
            1,
            &ctx,
        )
        .unwrap();
        let result = executor.execute(&bad, root.path()).await;
        let graded = graded_sample(&bad, &result, Utc::now());
        assert_eq!(graded.status, SampleStatus::Failed);
        assert!(graded.criteria["states-decision"].passed);
        assert!(!graded.criteria["polite"].passed);
        assert!(!graded.criteria["looked-up"].passed);
        let tools = graded.criteria["looked-up"].score;
        let expect = (1.0 + 0.0 * 0.5 + tools) / 2.5;
        assert!((graded.score.unwrap() - expect).abs() < 1e-9, "{graded:?}");

        // With the budget available, the model criterion is in the job (and, with no model
        // provider configured, the sample errors rather than passing without it).
        let all = SampleJobContext {
            selection: CriteriaSelection::All,
            ..ctx
        };
        let job = sample_job(
            &m,
            &sample("s3", "Thank you: APPROVED", &["lookup_order"]),
            2,
            &all,
        )
        .unwrap();
        assert!(job.case.evaluation.weights.contains_key("llm_judge"));
        let result = executor.execute(&job, root.path()).await;
        assert_eq!(
            graded_sample(&job, &result, Utc::now()).status,
            SampleStatus::Errored
        );

        // Only model criteria and no budget: no job at all.
        let (judge_only, _) = parse(&json!({"criteria": [{"name": "j", "strategy": "assertions", "expected": {"assertions": ["is polite"]}}]}), &source(root.path()), &registry()).unwrap();
        assert!(sample_job(&judge_only, &sample("s4", "x", &[]), 0, &ctx).is_none());
    }
}
