//! The result of one job: what is stored per test case (and per variant and attempt), its
//! status, and its attempts. The executor fills one in; the worker stores it, the CLI writes
//! it, and the analysis and report layers read it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::plan::Job;
use crate::variant::Variant;
use skilleval_model::grade::{Fault, SchemaError, Usage};

/// The state of one test case's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum CaseStatus {
    /// Published, not finished (service only).
    Queued,
    Passed,
    Failed,
    /// Could not be produced or graded: timeout, crash, provider failure.
    Errored,
    /// Not run: the run was cancelled or stopped by `failFast`.
    Skipped,
}

impl CaseStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CaseStatus::Queued => "queued",
            CaseStatus::Passed => "passed",
            CaseStatus::Failed => "failed",
            CaseStatus::Errored => "errored",
            CaseStatus::Skipped => "skipped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => CaseStatus::Queued,
            "passed" => CaseStatus::Passed,
            "failed" => CaseStatus::Failed,
            "errored" => CaseStatus::Errored,
            "skipped" => CaseStatus::Skipped,
            _ => return None,
        })
    }

    pub fn is_final(self) -> bool {
        !matches!(self, CaseStatus::Queued)
    }
}

/// One attempt at a case (a `retryCount` re-run is another attempt).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Attempt {
    pub number: u32,
    pub status: CaseStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    pub duration_ms: u64,
    /// Of `duration_ms`, the time spent grading (0 when the attempt never reached its grader);
    /// the rest is producing the output. Absent in attempts stored before it was measured.
    #[serde(default)]
    pub grade_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How the reason of a baseline attempt its runner cannot run begins (it is recorded
/// `skipped`).
pub const NO_BASELINE: &str = "no baseline";

/// The result of one job: what is stored per test case.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JobResult {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub name: String,
    pub case_index: u32,
    pub status: CaseStatus,
    pub strategy: String,
    /// `None` when the case errored (it was never graded).
    pub score: Option<f64>,
    pub details: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric_scores: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default)]
    pub output_truncated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_patterns: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_errors: Option<Vec<SchemaError>>,
    /// Of the last attempt.
    pub duration_ms: u64,
    pub attempts: Vec<Attempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Fault>,
    /// Spent producing the output (all attempts).
    #[serde(default)]
    pub produce_usage: Usage,
    /// Spent grading it (all attempts).
    #[serde(default)]
    pub grade_usage: Usage,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub suites: Vec<String>,
    pub weight: f64,
    pub critical: bool,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    /// Which configuration (with or without the skill) and attempt this is; a run without
    /// baseline or repeats has only the primary one (written only when it is not that).
    #[serde(default, skip_serializing_if = "crate::variant::skip_primary")]
    pub variant: Variant,
}

impl JobResult {
    pub fn passed(&self) -> bool {
        self.status == CaseStatus::Passed
    }

    /// A result for a case that never ran (cancelled, failFast).
    pub fn skipped(job: &Job, reason: &str) -> Self {
        let now = Utc::now();
        let mut r = JobResult::for_job(job, now);
        r.status = CaseStatus::Skipped;
        r.details = serde_json::json!({ "skipped": reason });
        r.finished_at = now;
        r
    }

    /// A result for a job whose fault the caller gave up retrying.
    pub fn errored(job: &Job, fault: Fault) -> Self {
        let now = Utc::now();
        let mut r = JobResult::for_job(job, now);
        r.status = CaseStatus::Errored;
        r.details = serde_json::json!({ "error": fault.to_string() });
        r.attempts.push(Attempt {
            number: 1,
            status: CaseStatus::Errored,
            score: None,
            duration_ms: 0,
            grade_ms: 0,
            error: Some(fault.to_string()),
        });
        r.error = Some(fault);
        r
    }

    /// A result for `job`, started at `started_at` and not finished: queued, no grade yet.
    pub fn for_job(job: &Job, started_at: DateTime<Utc>) -> Self {
        JobResult {
            run_id: job.run_id,
            test_case_id: job.case.id.clone(),
            name: if job.case.name.is_empty() {
                job.case.id.clone()
            } else {
                job.case.name.clone()
            },
            case_index: job.case_index,
            status: CaseStatus::Queued,
            strategy: job.strategy().to_string(),
            score: None,
            details: Value::Null,
            rubric_scores: None,
            feedback: None,
            output: None,
            output_truncated: false,
            expected_output: job.case.expected.output.clone(),
            matched_patterns: None,
            schema_errors: None,
            duration_ms: 0,
            attempts: Vec::new(),
            error: None,
            produce_usage: Usage::default(),
            grade_usage: Usage::default(),
            tags: job.case.tags.clone(),
            suites: job.suites.clone(),
            weight: job.case.weight,
            critical: job.case.is_critical(),
            started_at,
            finished_at: started_at,
            variant: Variant::of(&job.runner),
        }
    }
}

/// A test fixture: a graded `exact_match` result with neutral defaults (nil run id, name = id,
/// index 0, weight 1, no usage, no tags). Tests override fields with struct-update syntax.
#[cfg(any(test, feature = "test-util"))]
pub fn test_result(id: &str, status: CaseStatus, score: Option<f64>) -> JobResult {
    let now = Utc::now();
    JobResult {
        run_id: Uuid::nil(),
        test_case_id: id.into(),
        name: id.into(),
        case_index: 0,
        status,
        strategy: "exact_match".into(),
        score,
        details: serde_json::json!({}),
        rubric_scores: None,
        feedback: None,
        output: None,
        output_truncated: false,
        expected_output: None,
        matched_patterns: None,
        schema_errors: None,
        duration_ms: 0,
        attempts: vec![],
        error: None,
        produce_usage: Usage::default(),
        grade_usage: Usage::default(),
        tags: vec![],
        suites: vec![],
        weight: 1.0,
        critical: false,
        started_at: now,
        finished_at: now,
        variant: Variant::PRIMARY,
    }
}
