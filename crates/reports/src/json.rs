//! The JSON report: the report spec seed's `EvaluationReport` and `ReportSummary`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{render_markdown, ReportContext};
use skilleval_analysis::summary::RunSummary;
use skilleval_execution::result::JobResult;
use skilleval_model::package::RiskReport;

/// The seed's `EvaluationReport`, with skilleval's summary, verdict and results added.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvaluationReport {
    pub id: String,
    pub task_id: String,
    pub task: Task,
    pub format: String,
    /// The Markdown rendering of the same report, so a JSON consumer can show it as is.
    pub content: String,
    /// Ids of the test-case executions included (one per case).
    pub run_ids: Vec<String>,
    pub summary: ReportSummary,
    pub created_at: DateTime<Utc>,
    pub verdict: String,
    pub verdict_reasons: Vec<String>,
    /// The complete statistics (breakdowns, durations, usage).
    pub run_summary: RunSummary,
    pub results: Vec<JobResult>,
    /// The package's static risk report (docs/security.md), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<RiskReport>,
}

/// What was evaluated.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: String,
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub profile: String,
    pub package_hash: String,
}

/// The seed's `ReportSummary`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    pub total_runs: u64,
    pub average_score: f64,
    pub score_distribution: ScoreDistribution,
    /// 0..1; 1.0 when no case checks a schema.
    pub schema_compliance_rate: f64,
    pub rubric_breakdown: BTreeMap<String, RubricEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScoreDistribution {
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub median: f64,
    pub std_dev: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RubricEntry {
    pub average_score: f64,
    pub weight: f64,
    pub contribution: f64,
}

/// Builds the JSON report of a run.
pub fn evaluation_report(ctx: &ReportContext<'_>) -> EvaluationReport {
    let s = ctx.summary;
    let mut results: Vec<JobResult> = ctx.results.to_vec();
    results.sort_by_key(|r| r.case_index);
    EvaluationReport {
        id: ctx.run_id.to_string(),
        task_id: ctx.skill_name.to_string(),
        task: Task {
            id: ctx.skill_name.to_string(),
            name: ctx.skill_name.to_string(),
            description: ctx.skill_description.to_string(),
            version: ctx.version.map(str::to_string),
            profile: ctx.profile.to_string(),
            package_hash: ctx.package_hash.to_string(),
        },
        format: "json".into(),
        content: render_markdown(ctx),
        run_ids: results.iter().map(|r| r.test_case_id.clone()).collect(),
        summary: ReportSummary {
            total_runs: s.total,
            average_score: s.mean,
            score_distribution: ScoreDistribution {
                min: s.min,
                max: s.max,
                mean: s.mean,
                median: s.median,
                std_dev: s.std_dev,
            },
            schema_compliance_rate: s.schema_compliance_rate.unwrap_or(1.0),
            rubric_breakdown: s
                .by_criterion
                .iter()
                .map(|(k, c)| {
                    (
                        k.clone(),
                        RubricEntry {
                            average_score: c.average_score,
                            weight: c.weight,
                            contribution: c.contribution,
                        },
                    )
                })
                .collect(),
        },
        created_at: ctx.created_at,
        verdict: s.verdict.as_str().to_string(),
        verdict_reasons: s.verdict_reasons.clone(),
        run_summary: s.clone(),
        results,
        risk: ctx.risk.cloned(),
    }
}
