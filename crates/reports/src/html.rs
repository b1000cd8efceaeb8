//! The run page in HTML: the same rendering for the coordinator's `/ui/` pages, `skilleval
//! view` and the self-contained `eval/report.html` of `skilleval run --format html`.
//!
//! Markup is built with `maud`, which escapes every interpolated value: a skill's output,
//! input and grader text are untrusted and are only ever written as text. The pieces here are
//! fragments (summary, histogram, criteria, usage, case table, case detail); the coordinator
//! wraps them in its layout, and [`standalone_report`] in a file with its CSS and script
//! inline (a file has no server to load them from).

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

use skilleval_analysis::summary::RunSummary;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_model::package::RiskReport;

use super::ReportContext;

pub mod why;

/// The stylesheet every page uses (served as a static file by the coordinator, inlined in a
/// report file).
pub const STYLE: &str = include_str!("html/style.css");
/// The report page's script: table filtering without a server.
pub const REPORT_SCRIPT: &str = include_str!("html/report.js");

/// Score histogram buckets: [0, 0.1), [0.1, 0.2), ... [0.9, 1.0].
pub const HISTOGRAM_BINS: usize = 10;

/// One row of the per-case table.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseRow {
    /// Position in the eval file (stable, URL-safe).
    pub case_index: u32,
    pub test_case_id: String,
    pub name: String,
    pub status: CaseStatus,
    pub strategy: String,
    pub score: Option<f64>,
    pub tags: Vec<String>,
    pub suites: Vec<String>,
}

impl From<&JobResult> for CaseRow {
    fn from(r: &JobResult) -> Self {
        CaseRow {
            case_index: r.case_index,
            test_case_id: r.test_case_id.clone(),
            name: r.name.clone(),
            status: r.status,
            strategy: r.strategy.clone(),
            score: r.score,
            tags: r.tags.clone(),
            suites: r.suites.clone(),
        }
    }
}

/// The bucket of a score in [0, 1] (out-of-range scores are clamped).
pub fn histogram_bin(score: f64) -> usize {
    let clamped = score.clamp(0.0, 1.0);
    ((clamped * HISTOGRAM_BINS as f64) as usize).min(HISTOGRAM_BINS - 1)
}

/// Counts per bucket of the graded cases' scores.
pub fn histogram(scores: impl IntoIterator<Item = f64>) -> [u64; HISTOGRAM_BINS] {
    let mut bins = [0u64; HISTOGRAM_BINS];
    for s in scores {
        if s.is_finite() {
            bins[histogram_bin(s)] += 1;
        }
    }
    bins
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

fn score_text(s: Option<f64>) -> String {
    s.map_or_else(|| "—".to_string(), |s| format!("{s:.3}"))
}

/// The score histogram as an inline SVG bar chart (no script, no external resource).
pub fn histogram_svg(bins: &[u64]) -> Markup {
    let max = bins.iter().copied().max().unwrap_or(0).max(1);
    let (w, h, pad) = (400.0_f64, 160.0_f64, 20.0_f64);
    let bar_w = (w - 2.0 * pad) / bins.len().max(1) as f64;
    html! {
        svg.histogram #histogram role="img" viewBox=(format!("0 0 {w} {h}")) width="400" height="160"
            aria-label="Score histogram" {
            @for (i, n) in bins.iter().enumerate() {
                @let bh = (h - 2.0 * pad) * (*n as f64) / (max as f64);
                @let x = pad + bar_w * i as f64;
                rect.bar x=(format!("{x:.1}")) y=(format!("{:.1}", h - pad - bh))
                    width=(format!("{:.1}", bar_w - 2.0)) height=(format!("{bh:.1}")) {
                    title { (format!("{:.1}–{:.1}: {n}", i as f64 / 10.0, (i + 1) as f64 / 10.0)) }
                }
                @if *n > 0 {
                    text x=(format!("{:.1}", x + bar_w / 2.0 - 1.0)) y=(format!("{:.1}", h - pad - bh - 3.0))
                        text-anchor="middle" font-size="10" { (n) }
                }
            }
            text x=(pad) y=(h - 4.0) font-size="10" { "0" }
            text x=(w - pad) y=(h - 4.0) font-size="10" text-anchor="end" { "1" }
        }
    }
}

/// The package's static risk report: each finding with its file, line, rule and severity.
pub fn risk_section(risk: &RiskReport) -> Markup {
    let (low, medium, high) = risk.counts();
    html! {
        section.risk #risk {
            h2 { "Package risk" }
            @if risk.findings.is_empty() {
                p.muted { "No finding: the scripts and SKILL.md ask for nothing the rules look for." }
            } @else {
                p { (high) " high, " (medium) " medium, " (low) " low" }
                table.risk-findings {
                    thead { tr { th { "severity" } th { "rule" } th { "file" } th { "line" } th { "finding" } } }
                    tbody {
                        @for f in &risk.findings {
                            tr.(f.severity.as_str()) {
                                td { (f.severity.as_str()) }
                                td { (f.rule.as_str()) }
                                td { (f.file) }
                                td { @if let Some(line) = f.line { (line) } }
                                td { (f.message) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Verdict, reasons, statistics, criteria, schema compliance and usage of a finalised run.
pub fn summary_section(summary: &RunSummary, bins: &[u64]) -> Markup {
    let verdict = summary.verdict.as_str();
    html! {
        section.summary #summary {
            p { "Verdict: " span.verdict.(verdict) #verdict { (verdict) } }
            @if !summary.verdict_reasons.is_empty() {
                ul.reasons { @for r in &summary.verdict_reasons { li { (r) } } }
            }
            table.stats {
                tr { th { "cases" } td { (summary.total) } th { "passed" } td { (summary.passed) }
                     th { "failed" } td { (summary.failed) } th { "errored" } td { (summary.errored) }
                     th { "skipped" } td { (summary.skipped) } }
                tr { th { "pass rate" } td #pass-rate { (pct(summary.pass_rate)) }
                     th { "mean" } td { (format!("{:.3}", summary.mean)) }
                     th { "median" } td { (format!("{:.3}", summary.median)) }
                     th { "std dev" } td { (format!("{:.3}", summary.std_dev)) }
                     th { "weighted mean" } td { (format!("{:.3}", summary.weighted_mean)) } }
            }
            h3 { "Score histogram" }
            (histogram_svg(bins))
            @if !summary.by_criterion.is_empty() {
                h3 { "Rubric criteria" }
                table.criteria #criteria {
                    tr { th { "criterion" } th { "mean" } th { "weight" } th { "contribution" } th { "n" } }
                    @for (name, c) in &summary.by_criterion {
                        tr { td { (name) } td { (format!("{:.3}", c.average_score)) }
                             td { (format!("{:.2}", c.weight)) } td { (format!("{:.3}", c.contribution)) }
                             td { (c.count) } }
                    }
                }
            }
            @if let Some(rate) = summary.schema_compliance_rate {
                p #schema-compliance { "Schema compliance: " (pct(rate)) }
            }
            h3 { "Cost and tokens" }
            table.usage #usage {
                tr { th { "" } th { "input tokens" } th { "output tokens" } th { "cost (USD)" } }
                tr { th { "producing" } td { (summary.produce_usage.input_tokens) }
                     td { (summary.produce_usage.output_tokens) } td { (format!("{:.4}", summary.produce_usage.cost_usd)) } }
                tr { th { "judging" } td { (summary.grade_usage.input_tokens) }
                     td { (summary.grade_usage.output_tokens) } td { (format!("{:.4}", summary.grade_usage.cost_usd)) } }
            }
            p.durations { "Duration: p50 " (summary.durations.p50_ms) " ms, p95 "
                (summary.durations.p95_ms) " ms, wall " (summary.durations.wall_ms) " ms" }
        }
    }
}

/// The per-case table; `href` links a row to its case (a page, or an anchor in a file).
pub fn case_table(rows: &[CaseRow], href: &dyn Fn(&CaseRow) -> String) -> Markup {
    html! {
        table.cases #cases {
            thead { tr { th { "case" } th { "name" } th { "status" } th { "score" } th { "strategy" }
                         th { "tags" } th { "suites" } } }
            tbody {
                @for r in rows {
                    tr.case data-status=(r.status.as_str()) data-strategy=(r.strategy)
                        data-tags=(r.tags.join(" ")) data-suites=(r.suites.join(" "))
                        data-score=(r.score.map_or(-1.0, |s| s)) {
                        td { a href=(href(r)) { (r.test_case_id) } }
                        td { (r.name) }
                        td { span.status.(r.status.as_str()) { (r.status.as_str()) } }
                        td.num { (score_text(r.score)) }
                        td { (r.strategy) }
                        td { (r.tags.join(", ")) }
                        td { (r.suites.join(", ")) }
                    }
                }
            }
        }
    }
}

/// What a case asked, when the caller knows it (results do not carry it: the service reads
/// it from the run's plan).
#[derive(Debug, Clone, Copy)]
pub struct CaseInput<'a> {
    pub prompt: &'a str,
    pub description: Option<&'a str>,
    /// `input.context`, shown apart from the prompt.
    pub context: Option<&'a Value>,
    /// Package-relative input files.
    pub files: &'a [String],
}

/// Everything about one case: what it asked, why it failed (the output beside what was
/// expected, the difference marked: [`why`]) or its error, shown once with whose it is, the
/// grader's feedback and criteria, and its attempts.
pub fn case_detail(r: &JobResult, input: Option<&CaseInput<'_>>) -> Markup {
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let error_text = r.error.as_ref().map(ToString::to_string);
    html! {
        section.case-detail #case-detail data-case=(r.test_case_id) {
            p { "Status: " span.status.(r.status.as_str()) #case-status { (r.status.as_str()) }
                " · score " (score_text(r.score)) " · strategy " (r.strategy)
                " · " (r.duration_ms) " ms" }
            @if let Some(d) = input.and_then(|i| i.description).filter(|d| !d.trim().is_empty()) {
                p.description #case-description { (d) }
            }
            @if let Some(input) = input {
                h3 { "Prompt" } pre.text #case-prompt { (input.prompt) }
                @if let Some(context) = input.context.filter(|c| !c.is_null()) {
                    h3 { "Context" } pre.text #case-context { (context.as_str().map_or_else(|| pretty(context), str::to_string)) }
                }
                @if !input.files.is_empty() {
                    h3 { "Input files" }
                    ul #case-files { @for f in input.files { li { code { (f) } } } }
                }
            }
            @if let Some(fault) = &r.error {
                @let origin = fault.origin();
                section.case-error #case-error data-origin=(origin.as_str()) {
                    h3 { "Error: " (origin.label()) " (" (fault.kind()) ")" }
                    pre.text #case-error-message { (fault) }
                }
                @if let Some(output) = r.output.as_deref().filter(|o| !o.is_empty()) {
                    h3 { "Output before the error" } pre.text #case-output { (output) }
                }
            } @else if let Some(markup) = why::output_and_expected(r) {
                (markup)
            }
            @if let Some(f) = &r.feedback {
                h3 { "Grader feedback" } pre.text { (f) }
            }
            @if let Some(p) = &r.matched_patterns {
                @if r.strategy != "regex_match" {
                    h3 { "Matched patterns" } ul { @for m in p { li { code { (m) } } } }
                }
            }
            @if let Some(serde_json::Value::Object(criteria)) = &r.rubric_scores {
                h3 { "Criteria" }
                table.criteria {
                    tr { th { "criterion" } th { "score" } th { "reasoning" } }
                    @for (name, c) in criteria {
                        tr { td { (name) }
                             td { (c.get("normalized").or_else(|| c.get("score")).map(ToString::to_string).unwrap_or_default()) }
                             td { (c.get("reasoning").or_else(|| c.get("reason")).and_then(|v| v.as_str()).unwrap_or("")) } }
                    }
                }
            }
            // An errored case's details are its error again: shown once, above.
            @if r.error.is_none() {
                h3 { "Grader details" }
                pre.text.details { (pretty(&r.details)) }
            }
            h3 { "Attempts" }
            table.attempts {
                tr { th { "#" } th { "status" } th { "score" } th { "ms" } th { "grading ms" } th { "error" } }
                @for a in &r.attempts {
                    tr { td { (a.number) } td { (a.status.as_str()) } td { (score_text(a.score)) }
                         td { (a.duration_ms) } td { (a.grade_ms) }
                         td { @match (&a.error, &error_text) {
                             (Some(e), Some(last)) if e == last => span.muted { "the error above" },
                             (Some(e), _) => (e),
                             (None, _) => "",
                         } } }
                }
            }
        }
    }
}

/// Where the report page's stylesheet and script come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assets<'a> {
    /// In the page (a file has no server to load them from).
    Inline,
    /// `{prefix}style.css` and `{prefix}report.js`, served beside the page (so a strict
    /// Content-Security-Policy can forbid inline script).
    Linked { prefix: &'a str },
}

/// The whole run page as one self-contained file: inline CSS and script, every case in the
/// table (filtered by the script), each case's detail in a collapsed block.
pub fn standalone_report(ctx: &ReportContext<'_>) -> String {
    report_page(ctx, Assets::Inline, None)
}

/// The run page with every case, its assets inline or linked, and an optional link back
/// (`skilleval view`'s list of runs).
pub fn report_page(ctx: &ReportContext<'_>, assets: Assets<'_>, back: Option<&str>) -> String {
    let rows: Vec<CaseRow> = ctx.results.iter().map(CaseRow::from).collect();
    let bins = histogram(ctx.results.iter().filter_map(|r| r.score));
    let anchor = |r: &CaseRow| format!("#case-{}", r.case_index);
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "skilleval: " (ctx.skill_name) }
                @match assets {
                    Assets::Inline => style { (PreEscaped(STYLE)) },
                    Assets::Linked { prefix } => {
                        link rel="icon" href="data:,";
                        link rel="stylesheet" href=(format!("{prefix}style.css"));
                    }
                }
            }
            body {
                header {
                    h1 { "skilleval · " (ctx.skill_name) @if let Some(v) = ctx.version { " " (v) } }
                    @if let Some(back) = back { nav { a href=(back) { "All runs" } } }
                }
                main {
                    p.meta { "Run " (ctx.run_id) " · profile " (ctx.profile) " · "
                        (ctx.created_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                    (summary_section(ctx.summary, &bins))
                    @if let Some(risk) = ctx.risk { (risk_section(risk)) }
                    h2 { "Cases" }
                    form.filters #filters {
                        label { "status " select #filter-status {
                            option value="" { "any" }
                            @for s in ["passed", "failed", "errored", "skipped"] { option value=(s) { (s) } }
                        } }
                        label { " text " input #filter-text type="search"; }
                    }
                    (case_table(&rows, &anchor))
                    h2 { "Case details" }
                    @for r in ctx.results {
                        details.case id=(format!("case-{}", r.case_index)) {
                            summary { (r.test_case_id) " — " (r.status.as_str()) }
                            (case_detail(r, None))
                        }
                    }
                }
                @match assets {
                    Assets::Inline => script { (PreEscaped(REPORT_SCRIPT)) },
                    Assets::Linked { prefix } => script src=(format!("{prefix}report.js")) {},
                }
            }
        }
    };
    markup.into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_puts_scores_in_tenths() {
        let bins = histogram([0.0, 0.05, 0.1, 0.55, 0.99, 1.0, f64::NAN]);
        assert_eq!(bins, [2, 1, 0, 0, 0, 1, 0, 0, 0, 2]);
    }

    #[test]
    fn untrusted_text_is_escaped() {
        let rows = vec![CaseRow {
            case_index: 0,
            test_case_id: "<script>alert(1)</script>".into(),
            name: "<img src=x onerror=alert(1)>".into(),
            status: CaseStatus::Failed,
            strategy: "exact_match".into(),
            score: Some(0.0),
            tags: vec![],
            suites: vec![],
        }];
        let html = case_table(&rows, &|r| format!("/x/{}", r.test_case_id)).into_string();
        assert!(!html.contains("<script>"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;"));
    }
}
