//! Response bodies of the API, built from store rows. Their shapes are the OpenAPI document's
//! schemas (`src/openapi.json`); the tests validate examples of each against it.

use crate::db::{Counters, ResultRow, RunRow};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use skilleval_analysis::compare::GateRecord;
use skilleval_infra::store::lifecycle::StopReason;
use skilleval_infra::store::versions::VersionRow;
use skilleval_model::package::RiskReport;
use skilleval_model::problem::Problem;
use uuid::Uuid;

use crate::results::{stored_gate, stored_summary};

#[derive(Debug, Clone, Serialize)]
pub struct UploadResponse {
    pub skill_id: Uuid,
    pub version_id: Uuid,
    pub name: String,
    pub version: String,
    pub test_cases: usize,
    pub run_id: Option<Uuid>,
    pub warnings: Vec<Problem>,
    /// The package's static risk report (docs/security.md).
    pub risk: RiskReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct CreateRunResponse {
    pub run_id: Uuid,
    pub created: bool,
}

/// What a run's recorded cases spent, producing and grading together.
#[derive(Debug, Clone, Serialize)]
pub struct UsageView {
    pub tokens: i64,
    pub cost_usd: f64,
}

/// The caps a run was created with (`None`: no cap on that measure).
#[derive(Debug, Clone, Serialize)]
pub struct BudgetView {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SummaryView {
    pub mean: f64,
    pub median: f64,
    pub std_dev: f64,
    pub min: f64,
    pub max: f64,
    pub weighted_mean: f64,
    pub pass_rate: f64,
    pub verdict: &'static str,
    pub verdict_reasons: Vec<String>,
    /// With a baseline or repeats: skill-creator's `benchmark.json` of the run (uplift,
    /// pass@k, pass^k, flaky cases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<Value>,
    /// The trigger evals' report (precision, recall, F1), when they ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub triggers: Option<Value>,
    /// What the regression gate decided, when the run asked for one (docs/comparing.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regression_gate: Option<GateRecord>,
    /// What the `no_collision` gate decided, when the upload asked for it
    /// (docs/catalogue.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collision_gate: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub run_id: Uuid,
    pub version_id: Uuid,
    pub skill: String,
    pub version: String,
    pub kind: String,
    pub status: String,
    pub counters: Counters,
    pub summary: Option<SummaryView>,
    pub verdict: Option<String>,
    pub callback_url: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub usage: UsageView,
    pub budget: BudgetView,
    /// Why the run stopped before running every case (a budget), when it did.
    pub stop_reason: Option<String>,
    /// The static risk report of the version's package; `null` for a version stored before
    /// reports existed.
    pub risk: Option<Value>,
}

impl RunView {
    pub fn from_row(r: &RunRow) -> Self {
        let summary = if r.finalised {
            stored_summary(r.summary.as_ref()).map(|s| SummaryView {
                mean: s.mean,
                median: s.median,
                std_dev: s.std_dev,
                min: s.min,
                max: s.max,
                weighted_mean: s.weighted_mean,
                pass_rate: s.pass_rate,
                verdict: s.verdict.as_str(),
                verdict_reasons: s.verdict_reasons,
                benchmark: r.summary.as_ref().and_then(|v| v.get("benchmark")).cloned(),
                triggers: r.summary.as_ref().and_then(|v| v.get("triggers")).cloned(),
                regression_gate: stored_gate(r.summary.as_ref()),
                collision_gate: r
                    .summary
                    .as_ref()
                    .and_then(|v| v.get("collision_gate"))
                    .cloned(),
            })
        } else {
            None
        };
        RunView {
            run_id: r.id,
            version_id: r.version_id,
            skill: r.skill.clone(),
            version: r.version.clone(),
            kind: r.kind.as_str().to_string(),
            status: r.status.as_str().to_string(),
            counters: r.counters,
            summary,
            verdict: if r.finalised { r.verdict.clone() } else { None },
            callback_url: r.callback_url.clone(),
            created_at: r.created_at,
            finished_at: r.finished_at,
            usage: UsageView {
                tokens: r.tokens,
                cost_usd: r.cost_usd,
            },
            budget: BudgetView {
                max_cost_usd: r.max_cost_usd,
                max_tokens: r.max_tokens,
            },
            stop_reason: match r.stop_reason {
                Some(StopReason::Budget) => r.stop_detail.clone(),
                _ => None,
            },
            risk: r.risk_report.clone(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ResultView {
    pub test_case_id: String,
    pub name: String,
    pub case_index: i32,
    /// `with_skill`, or `without_skill` for a baseline attempt.
    pub configuration: &'static str,
    /// The attempt (1 unless the run asked for repeats).
    pub run_number: u32,
    pub status: String,
    pub strategy: String,
    pub score: Option<f64>,
    pub duration_ms: Option<u64>,
    pub attempts: usize,
    pub output: Option<String>,
    pub expected_output: Option<String>,
    pub feedback: Option<String>,
    pub error: Option<String>,
    pub details: Value,
    pub finished_at: Option<DateTime<Utc>>,
}

impl ResultView {
    pub fn from_row(r: ResultRow) -> Self {
        let result = r.result.unwrap_or(Value::Null);
        let str_field = |k: &str| result.get(k).and_then(Value::as_str).map(str::to_string);
        let error = result
            .get("error")
            .filter(|e| !e.is_null())
            .map(|e| match e {
                Value::String(s) => s.clone(),
                other => other
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| other.to_string(), str::to_string),
            });
        ResultView {
            test_case_id: r.test_case_id,
            name: r.name,
            case_index: r.case_index,
            configuration: r.variant.configuration.as_str(),
            run_number: r.variant.run_number,
            status: r.status.as_str().to_string(),
            strategy: r.strategy,
            score: result.get("score").and_then(Value::as_f64),
            duration_ms: result.get("duration_ms").and_then(Value::as_u64),
            attempts: result
                .get("attempts")
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
            output: str_field("output"),
            expected_output: str_field("expected_output"),
            feedback: str_field("feedback"),
            error,
            details: result
                .get("details")
                .cloned()
                .or(r.details)
                .unwrap_or(Value::Null),
            finished_at: r.finished_at,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ResultPage {
    pub results: Vec<ResultView>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CancelResponse {
    pub run_id: Uuid,
    pub status: &'static str,
    pub skipped: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LatestRun {
    pub run_id: Uuid,
    pub status: String,
    pub verdict: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VersionView {
    pub version_id: Uuid,
    pub version: String,
    pub description: String,
    pub package_hash: String,
    pub profile: String,
    pub test_cases: i32,
    pub created_at: DateTime<Utc>,
    pub latest_run: Option<LatestRun>,
}

impl VersionView {
    pub fn from_row(v: VersionRow) -> Self {
        VersionView {
            version_id: v.version_id,
            version: v.version,
            description: v.description,
            package_hash: v.package_hash,
            profile: v.profile,
            test_cases: v.test_cases,
            created_at: v.created_at,
            latest_run: v.latest_run.map(|(run_id, status, verdict)| LatestRun {
                run_id,
                status,
                verdict,
            }),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VersionList {
    pub skill: String,
    pub skill_id: Uuid,
    pub versions: Vec<VersionView>,
}

/// A skill's latest version, as the skills list shows it.
#[derive(Debug, Clone, Serialize)]
pub struct LatestVersion {
    pub version_id: Uuid,
    pub version: String,
    pub profile: String,
}

/// One skill of `GET /v1/skills`.
#[derive(Debug, Clone, Serialize)]
pub struct SkillListItem {
    pub skill_id: Uuid,
    pub name: String,
    /// The latest version's description.
    pub description: String,
    pub created_at: DateTime<Utc>,
    /// When the latest version was uploaded.
    pub updated_at: DateTime<Utc>,
    pub versions: i64,
    pub latest_version: LatestVersion,
    /// The models the skill's versions name.
    pub models: Vec<String>,
    /// The latest version's latest finished upload or manual run, its verdict and pass rate
    /// (`null` until one finished).
    pub latest_run_id: Option<Uuid>,
    pub verdict: Option<String>,
    pub pass_rate: Option<f64>,
}

impl SkillListItem {
    pub fn from_item(s: skilleval_infra::store::listing::SkillItem) -> Self {
        SkillListItem {
            skill_id: s.skill_id,
            name: s.name,
            description: s.description,
            created_at: s.created_at,
            updated_at: s.updated_at,
            versions: s.versions,
            latest_version: LatestVersion {
                version_id: s.latest_version_id,
                version: s.latest_version,
                profile: s.profile,
            },
            models: s.models,
            latest_run_id: s.latest_run_id,
            verdict: s.verdict,
            pass_rate: s.pass_rate,
        }
    }
}

/// `GET /v1/skills`.
#[derive(Debug, Clone, Serialize)]
pub struct SkillList {
    pub skills: Vec<SkillListItem>,
    pub next_cursor: Option<String>,
}

/// One run of `GET /v1/runs`.
#[derive(Debug, Clone, Serialize)]
pub struct RunListItem {
    pub run_id: Uuid,
    pub skill: String,
    pub version_id: Uuid,
    pub version: String,
    pub kind: String,
    pub status: String,
    pub verdict: Option<String>,
    pub counters: Counters,
    /// The summary's mean score, once finished.
    pub score: Option<f64>,
    pub pass_rate: Option<f64>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl RunListItem {
    pub fn from_item(r: skilleval_infra::store::listing::RunItem) -> Self {
        RunListItem {
            run_id: r.run_id,
            skill: r.skill,
            version_id: r.version_id,
            version: r.version,
            kind: r.kind,
            status: r.status,
            verdict: r.verdict,
            counters: r.counters,
            score: r.score,
            pass_rate: r.pass_rate,
            created_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}

/// `GET /v1/runs`.
#[derive(Debug, Clone, Serialize)]
pub struct RunList {
    pub runs: Vec<RunListItem>,
    pub next_cursor: Option<String>,
}
