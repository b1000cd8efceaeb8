//! Reports: a finished run rendered for people (Markdown, the HTML run page) and machines
//! (JSON), and the files a local run leaves for skill-creator's tools ([`artifacts`], and a
//! run as skill-creator's iteration folder: [`skill_creator`]). It renders what the layers
//! below computed and computes no statistic of its own; the only files it writes are a local
//! run's (or an export of one), in [`artifacts`] and [`skill_creator`].
//!
//! Reports of a finished run, in Markdown for people and JSON for machines, and the run page
//! in HTML ([`html`]: the web interface's and the self-contained `report.html`).
//!
//! A report over several runs of a skill ([`across`]) has the seed's `ReportSummary` across
//! those runs.
//!
//! The JSON shape is the report spec seed's `EvaluationReport` with its `ReportSummary`, plus
//! the full [`RunSummary`], the verdict and the per-case results. The Markdown report has the
//! seed's sections: header, executive summary, a text histogram of scores, breakdowns, failing
//! cases with expected vs actual and the strategy's details, and recommendations.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use skilleval_analysis::compare::GateRecord;
use skilleval_analysis::summary::RunSummary;
use skilleval_execution::result::JobResult;
use skilleval_model::package::RiskReport;

pub mod across;
pub mod artifacts;
pub mod html;
mod json;
mod markdown;
pub mod skill_creator;

pub use json::{evaluation_report, EvaluationReport, ReportSummary};
pub use markdown::render_markdown;

/// Which rendering a caller wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    Markdown,
    Json,
    /// The run page as one self-contained HTML file ([`html::standalone_report`]).
    Html,
}

impl std::str::FromStr for ReportFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "md" | "markdown" => Ok(ReportFormat::Markdown),
            "json" => Ok(ReportFormat::Json),
            "html" => Ok(ReportFormat::Html),
            other => Err(format!(
                "unknown report format `{other}`: use `markdown` (or `md`), `json` or `html`"
            )),
        }
    }
}

/// What a report is about.
#[derive(Debug, Clone, Copy)]
pub struct ReportContext<'a> {
    pub run_id: Uuid,
    pub skill_name: &'a str,
    pub skill_description: &'a str,
    /// Skill version label, when the service knows one.
    pub version: Option<&'a str>,
    pub profile: &'a str,
    pub package_hash: &'a str,
    pub created_at: DateTime<Utc>,
    pub results: &'a [JobResult],
    pub summary: &'a RunSummary,
    /// The package's static risk report, when it is known.
    pub risk: Option<&'a RiskReport>,
}

/// Renders a report in the wanted format.
pub fn render(ctx: &ReportContext<'_>, format: ReportFormat) -> String {
    match format {
        ReportFormat::Markdown => render_markdown(ctx),
        ReportFormat::Html => html::standalone_report(ctx),
        ReportFormat::Json => serde_json::to_string_pretty(&evaluation_report(ctx))
            .unwrap_or_else(|e| format!("{{\"error\":\"report serialisation failed: {e}\"}}")),
    }
}

/// What a baseline, repeats, trigger evals and the regression gate add to a run's report:
/// Markdown sections appended to the report (and to the JSON report's `content`), and the JSON
/// report's `benchmark` and `triggers` keys and `runSummary.regression_gate`. `skilleval run`
/// and the service report through this.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportExtras {
    pub markdown: String,
    /// skill-creator's `benchmark.json` of the run.
    pub benchmark: Option<serde_json::Value>,
    /// The trigger evals' report.
    pub triggers: Option<serde_json::Value>,
    /// What the run's regression gate decided (the summary's `regression_gate`), when the run
    /// asked for one.
    pub regression_gate: Option<GateRecord>,
}

/// The report with the extra sections (Markdown) or keys (JSON: `benchmark`, `triggers`,
/// `runSummary.regression_gate`).
pub fn render_with(ctx: &ReportContext<'_>, format: ReportFormat, extras: &ReportExtras) -> String {
    let base = render(ctx, format);
    let markdown = match &extras.regression_gate {
        Some(gate) => format!("{}{}", markdown::gate_section(gate), extras.markdown),
        None => extras.markdown.clone(),
    };
    match format {
        ReportFormat::Markdown => format!("{base}{markdown}"),
        ReportFormat::Json
            if extras.benchmark.is_some()
                || extras.triggers.is_some()
                || extras.regression_gate.is_some() =>
        {
            let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(&base) else {
                return base;
            };
            if let Some(content) = doc.get("content").and_then(|c| c.as_str()) {
                doc["content"] = serde_json::Value::String(format!("{content}{markdown}"));
            }
            if let Some(b) = &extras.benchmark {
                doc["benchmark"] = b.clone();
            }
            if let Some(t) = &extras.triggers {
                doc["triggers"] = t.clone();
            }
            if let (Some(gate), Some(summary)) = (
                &extras.regression_gate,
                doc.get_mut("runSummary").and_then(|s| s.as_object_mut()),
            ) {
                if let Ok(record) = serde_json::to_value(gate) {
                    summary.insert("regression_gate".into(), record);
                }
            }
            serde_json::to_string_pretty(&doc).unwrap_or(base)
        }
        // The HTML run page shows the summary's own sections; the extras are in the JSON.
        ReportFormat::Json | ReportFormat::Html => base,
    }
}
