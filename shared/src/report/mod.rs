//! Reports of a finished run, in Markdown for people and JSON for machines, and the run page
//! in HTML ([`html`]: the web interface's and the self-contained `report.html`).
//!
//! The JSON shape is the report spec seed's `EvaluationReport` with its `ReportSummary`, plus
//! the full [`RunSummary`], the verdict and the per-case results. The Markdown report has the
//! seed's sections: header, executive summary, a text histogram of scores, breakdowns, failing
//! cases with expected vs actual and the strategy's details, and recommendations.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::executor::JobResult;
use crate::package::RiskReport;
use crate::summary::RunSummary;

pub mod html;
mod json;
mod markdown;

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
