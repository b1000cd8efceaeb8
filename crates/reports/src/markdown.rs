//! The Markdown report.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::ReportContext;
use skilleval_analysis::compare::GateRecord;
use skilleval_analysis::summary::{GroupStats, RunSummary};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_model::gate::GateRule;
use skilleval_model::package::RiskReport;

/// Longest excerpt of an output or expected value shown per failing case.
const EXCERPT_CHARS: usize = 600;
/// Longest excerpt of a strategy's details shown per failing case.
const DETAILS_CHARS: usize = 1_500;
/// Failing cases listed in full; the rest are counted.
const MAX_FAILING_LISTED: usize = 50;

/// Renders the report of a run as Markdown.
pub fn render_markdown(ctx: &ReportContext<'_>) -> String {
    let s = ctx.summary;
    let mut out = String::with_capacity(8 * 1024);
    let _ = writeln!(out, "# Evaluation report: {}\n", ctx.skill_name);
    if !ctx.skill_description.is_empty() {
        let _ = writeln!(out, "> {}\n", ctx.skill_description.replace('\n', " "));
    }
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| Run | `{}` |", ctx.run_id);
    if let Some(v) = ctx.version {
        let _ = writeln!(out, "| Version | {v} |");
    }
    let _ = writeln!(out, "| Profile | {} |", ctx.profile);
    let _ = writeln!(out, "| Package | `{}` |", short_hash(ctx.package_hash));
    let _ = writeln!(out, "| Generated | {} |\n", ctx.created_at.to_rfc3339());

    executive_summary(&mut out, s);
    if let Some(risk) = ctx.risk {
        package_risk(&mut out, risk);
    }
    histogram(&mut out, ctx.results);
    breakdowns(&mut out, s);
    failing_cases(&mut out, ctx.results);
    recommendations(&mut out, s, ctx.results);
    out
}

/// The package's risk findings, one row each (docs/security.md).
fn package_risk(out: &mut String, risk: &RiskReport) {
    let _ = writeln!(out, "## Package risk\n");
    if risk.is_empty() {
        let _ = writeln!(out, "The static scan found nothing to review.\n");
        return;
    }
    let (low, medium, high) = risk.counts();
    let _ = writeln!(
        out,
        "{} finding(s): {high} high, {medium} medium, {low} low.\n",
        risk.findings.len()
    );
    let _ = writeln!(
        out,
        "| Severity | Rule | Where | Finding |\n|---|---|---|---|"
    );
    for f in &risk.findings {
        let place = match f.line {
            Some(line) => format!("`{}`:{line}", f.file),
            None => format!("`{}`", f.file),
        };
        let _ = writeln!(
            out,
            "| {} | `{}` | {place} | {} |",
            f.severity,
            f.rule,
            f.message.replace('|', "\\|").replace('\n', " ")
        );
    }
    out.push('\n');
}

/// The regression gate's record: its verdict, the run it compared with, why it failed and the
/// cases that regressed (all of them: the verdict reason names only the first few).
pub(crate) fn gate_section(gate: &GateRecord) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "## Regression gate\n");
    let _ = writeln!(out, "| | |\n|---|---|");
    let rule = match gate.rule {
        GateRule::NoRegression => "no_regression",
        GateRule::None => "none",
        GateRule::NoCollision => "no_collision",
    };
    let _ = writeln!(out, "| Rule | `{rule}` |");
    let _ = writeln!(out, "| Verdict | **{}** |", gate.verdict.as_str());
    let _ = writeln!(
        out,
        "| Thresholds | alpha {}, score margin {} |",
        gate.config.alpha, gate.config.score_margin
    );
    if let Some(run) = gate.base_run {
        let _ = writeln!(out, "| Compared with run | `{run}` |");
    }
    if let Some(version) = gate.base_version {
        let _ = writeln!(out, "| Of version | `{version}` |");
    }
    if let Some(id) = &gate.comparison_id {
        let _ = writeln!(out, "| Comparison | `{id}` |");
    }
    out.push('\n');
    if let Some(note) = &gate.note {
        let _ = writeln!(out, "{note}\n");
    }
    for reason in &gate.reasons {
        let _ = writeln!(out, "- {reason}");
    }
    if !gate.reasons.is_empty() {
        out.push('\n');
    }
    if !gate.regressed_cases.is_empty() {
        let cases: Vec<String> = gate
            .regressed_cases
            .iter()
            .map(|c| format!("`{c}`"))
            .collect();
        let _ = writeln!(
            out,
            "Regressed cases ({}), worst first: {}\n",
            gate.regressed_cases.len(),
            cases.join(", ")
        );
    }
    out
}

fn short_hash(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn executive_summary(out: &mut String, s: &RunSummary) {
    let _ = writeln!(out, "## Executive summary\n");
    let mark = match s.verdict {
        skilleval_analysis::summary::Verdict::Pass => "PASS",
        skilleval_analysis::summary::Verdict::Fail => "FAIL",
    };
    let _ = writeln!(
        out,
        "**Verdict: {mark}** — {} of {} cases passed ({}), mean score {:.3}, weighted mean {:.3}.\n",
        s.passed,
        s.total,
        pct(s.pass_rate),
        s.mean,
        s.weighted_mean
    );
    for reason in &s.verdict_reasons {
        let _ = writeln!(out, "- {reason}");
    }
    if !s.verdict_reasons.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(out, "| Metric | Value |\n|---|---|");
    let _ = writeln!(
        out,
        "| Passed / failed / errored / skipped | {} / {} / {} / {} |",
        s.passed, s.failed, s.errored, s.skipped
    );
    let _ = writeln!(
        out,
        "| Pass rate (threshold) | {} ({}) |",
        pct(s.pass_rate),
        pct(s.pass_threshold)
    );
    let _ = writeln!(out, "| Mean / median | {:.3} / {:.3} |", s.mean, s.median);
    let _ = writeln!(out, "| Std dev | {:.3} |", s.std_dev);
    let _ = writeln!(out, "| Min / max | {:.3} / {:.3} |", s.min, s.max);
    let _ = writeln!(out, "| Weighted mean | {:.3} |", s.weighted_mean);
    if let Some(rate) = s.schema_compliance_rate {
        let _ = writeln!(out, "| Schema compliance | {} |", pct(rate));
    }
    let _ = writeln!(
        out,
        "| Duration total / p50 / p95 | {} ms / {} ms / {} ms |",
        s.durations.total_ms, s.durations.p50_ms, s.durations.p95_ms
    );
    let tokens = s.produce_usage.total_tokens() + s.grade_usage.total_tokens();
    if tokens > 0 {
        let _ = writeln!(
            out,
            "| Tokens (produce / grade) | {} / {} |\n| Cost (USD) | {:.4} |",
            s.produce_usage.total_tokens(),
            s.grade_usage.total_tokens(),
            s.produce_usage.cost_usd + s.grade_usage.cost_usd
        );
    }
    out.push('\n');
}

/// Ten buckets of width 0.1; the last includes 1.0.
pub(crate) fn buckets(results: &[JobResult]) -> [u64; 10] {
    let mut b = [0u64; 10];
    for score in results.iter().filter_map(|r| r.score) {
        let i = ((score * 10.0).floor() as usize).min(9);
        b[i] += 1;
    }
    b
}

fn histogram(out: &mut String, results: &[JobResult]) {
    let b = buckets(results);
    let max = b.iter().copied().max().unwrap_or(0);
    let _ = writeln!(out, "## Score distribution\n\n```");
    if max == 0 {
        let _ = writeln!(out, "(no graded case)");
    }
    for (i, n) in b.iter().enumerate().rev() {
        if max == 0 {
            break;
        }
        let width = (*n as f64 / max as f64 * 40.0).round() as usize;
        let hi = if i == 9 {
            "1.0]".to_string()
        } else {
            format!("{:.1})", (i + 1) as f64 / 10.0)
        };
        let _ = writeln!(
            out,
            "[{:.1}, {hi:<4} {:<40} {n}",
            i as f64 / 10.0,
            "█".repeat(width)
        );
    }
    let _ = writeln!(out, "```\n");
}

fn group_table(out: &mut String, title: &str, groups: &BTreeMap<String, GroupStats>) {
    if groups.is_empty() {
        return;
    }
    let _ = writeln!(out, "### By {title}\n\n| {title} | cases | passed | failed | errored | pass rate | mean |\n|---|---|---|---|---|---|---|");
    for (name, g) in groups {
        let mean = g.mean.map_or("–".to_string(), |m| format!("{m:.3}"));
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {mean} |",
            g.total,
            g.passed,
            g.failed,
            g.errored,
            pct(g.pass_rate)
        );
    }
    out.push('\n');
}

fn breakdowns(out: &mut String, s: &RunSummary) {
    let _ = writeln!(out, "## Breakdowns\n");
    group_table(out, "strategy", &s.by_strategy);
    group_table(out, "suite", &s.by_suite);
    group_table(out, "tag", &s.by_tag);
    if !s.by_criterion.is_empty() {
        let _ = writeln!(out, "### By rubric criterion\n\n| criterion | average | weight | contribution |\n|---|---|---|---|");
        for (name, c) in &s.by_criterion {
            let _ = writeln!(
                out,
                "| {name} | {:.3} | {:.2} | {:.3} |",
                c.average_score, c.weight, c.contribution
            );
        }
        out.push('\n');
    }
}

fn excerpt(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max).collect();
    format!("{cut}\n… ({} more characters)", s.chars().count() - max)
}

fn fence(s: &str) -> String {
    // A fence longer than any backtick run inside, so outputs cannot break out of it.
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    "`".repeat(longest.max(2) + 1)
}

fn failing_cases(out: &mut String, results: &[JobResult]) {
    let mut failing: Vec<&JobResult> = results
        .iter()
        .filter(|r| matches!(r.status, CaseStatus::Failed | CaseStatus::Errored))
        .collect();
    failing.sort_by_key(|r| (!r.critical, r.case_index));
    let _ = writeln!(out, "## Failing cases\n");
    if failing.is_empty() {
        let _ = writeln!(out, "None: every graded case passed.\n");
        return;
    }
    for r in failing.iter().take(MAX_FAILING_LISTED) {
        let score = r.score.map_or("–".to_string(), |s| format!("{s:.3}"));
        let crit = if r.critical { " · **critical**" } else { "" };
        let _ = writeln!(
            out,
            "### `{}` — {}\n\n{} · strategy `{}` · score {score}{crit}\n",
            r.test_case_id,
            r.name,
            r.status.as_str(),
            r.strategy
        );
        if let Some(err) = &r.error {
            let _ = writeln!(out, "Error: {err}\n");
        }
        if let Some(expected) = &r.expected_output {
            let e = excerpt(expected, EXCERPT_CHARS);
            let f = fence(&e);
            let _ = writeln!(out, "Expected:\n\n{f}\n{e}\n{f}\n");
        }
        if let Some(actual) = &r.output {
            let a = excerpt(actual, EXCERPT_CHARS);
            let f = fence(&a);
            let _ = writeln!(out, "Actual:\n\n{f}\n{a}\n{f}\n");
        }
        if !r.details.is_null() {
            let d = excerpt(
                &serde_json::to_string_pretty(&r.details).unwrap_or_default(),
                DETAILS_CHARS,
            );
            let f = fence(&d);
            let _ = writeln!(out, "Details:\n\n{f}json\n{d}\n{f}\n");
        }
    }
    if failing.len() > MAX_FAILING_LISTED {
        let _ = writeln!(
            out,
            "… and {} more failing cases (see the JSON report).\n",
            failing.len() - MAX_FAILING_LISTED
        );
    }
}

/// Rule-based advice drawn from the numbers; each line names what to look at.
pub(crate) fn recommendation_lines(s: &RunSummary, results: &[JobResult]) -> Vec<String> {
    let mut lines = Vec::new();
    let critical: Vec<&str> = results
        .iter()
        .filter(|r| r.critical && r.status != CaseStatus::Passed)
        .map(|r| r.test_case_id.as_str())
        .collect();
    if !critical.is_empty() {
        lines.push(format!(
            "Fix the critical cases first: {}. Any critical failure fails the run.",
            critical.join(", ")
        ));
    }
    let timeouts = results
        .iter()
        .filter(|r| matches!(r.error, Some(skilleval_model::grade::Fault::Timeout { .. })))
        .count();
    if timeouts > 0 {
        lines.push(format!(
            "{timeouts} case(s) timed out: make the skill faster or raise `evaluation.timeout` / `settings.defaultTimeout`."
        ));
    }
    let other_errors = s.errored as usize - timeouts.min(s.errored as usize);
    if other_errors > 0 {
        lines.push(format!(
            "{other_errors} case(s) errored before they could be graded (see their errors); errored cases count against the pass rate."
        ));
    }
    for (name, g) in &s.by_strategy {
        if g.total >= 2 && g.pass_rate < 0.5 {
            lines.push(format!("Strategy `{name}` passes only {} of its cases: check the expectations or the skill's handling of them.", pct(g.pass_rate)));
        }
    }
    if let Some(rate) = s.schema_compliance_rate {
        if rate < 1.0 {
            lines.push(format!("Schema compliance is {}: tighten the skill's output format instructions or show the schema in SKILL.md.", pct(rate)));
        }
    }
    for (name, c) in &s.by_criterion {
        if c.average_score < 0.6 {
            lines.push(format!(
                "Rubric criterion `{name}` averages {:.2}: it is the weakest dimension.",
                c.average_score
            ));
        }
    }
    let flaky: Vec<&str> = results
        .iter()
        .filter(|r| {
            r.attempts.len() > 1
                && r.attempts.iter().any(|a| a.status == CaseStatus::Passed)
                && r.attempts.iter().any(|a| a.status == CaseStatus::Failed)
        })
        .map(|r| r.test_case_id.as_str())
        .collect();
    if !flaky.is_empty() {
        lines.push(format!(
            "Flaky cases (passed only on a retry): {}.",
            flaky.join(", ")
        ));
    }
    if s.by_tag.is_empty() && s.total > 5 {
        lines.push("Tag your cases (`tags`) to get per-area breakdowns.".into());
    }
    if lines.is_empty() {
        lines.push("No issue found: consider adding harder or edge-case tests to keep the suite discriminating.".into());
    }
    lines
}

fn recommendations(out: &mut String, s: &RunSummary, results: &[JobResult]) {
    let _ = writeln!(out, "## Recommendations\n");
    for line in recommendation_lines(s, results) {
        let _ = writeln!(out, "- {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{render, ReportFormat};
    use chrono::Utc;
    use serde_json::json;
    use skilleval_analysis::summary::summarize;
    use skilleval_execution::result::test_result;
    use skilleval_execution::result::JobResult;
    use skilleval_model::definition::EvalSettings;
    use uuid::Uuid;

    fn result(id: &str, status: CaseStatus, score: Option<f64>) -> JobResult {
        JobResult {
            name: format!("case {id}"),
            details: json!({"expected": "4", "actual": "5"}),
            output: Some("5 ``` tricky".into()),
            expected_output: Some("4".into()),
            duration_ms: 3,
            tags: vec!["math".into()],
            critical: id == "b",
            ..test_result(id, status, score)
        }
    }

    fn render_both(results: &[JobResult]) -> (String, serde_json::Value) {
        let summary = summarize(results, &EvalSettings::default());
        let ctx = ReportContext {
            run_id: Uuid::nil(),
            skill_name: "calc",
            skill_description: "Adds numbers",
            version: None,
            profile: "deterministic",
            package_hash: "abcdef0123456789",
            created_at: Utc::now(),
            results,
            summary: &summary,
            risk: None,
        };
        let md = render(&ctx, ReportFormat::Markdown);
        let js: serde_json::Value =
            serde_json::from_str(&render(&ctx, ReportFormat::Json)).unwrap();
        (md, js)
    }

    #[test]
    fn markdown_has_every_section_and_the_failing_case() {
        let rs = vec![
            result("a", CaseStatus::Passed, Some(1.0)),
            result("b", CaseStatus::Failed, Some(0.0)),
        ];
        let (md, _) = render_both(&rs);
        for section in [
            "# Evaluation report: calc",
            "## Executive summary",
            "## Score distribution",
            "## Breakdowns",
            "## Failing cases",
            "## Recommendations",
        ] {
            assert!(md.contains(section), "missing {section}\n{md}");
        }
        assert!(md.contains("**Verdict: FAIL**"));
        assert!(md.contains("### `b` — case b"));
        assert!(md.contains("critical case `b` did not pass"));
        // The output holds a triple backtick: the fence must be longer.
        assert!(md.contains("````\n5 ``` tricky\n````"));
        assert!(!md.contains("### `a`"));
    }

    #[test]
    fn histogram_buckets_scores() {
        let rs = vec![
            result("a", CaseStatus::Passed, Some(1.0)),
            result("c", CaseStatus::Passed, Some(0.95)),
            result("d", CaseStatus::Failed, Some(0.05)),
            result("e", CaseStatus::Errored, None),
        ];
        let b = buckets(&rs);
        assert_eq!(b[9], 2);
        assert_eq!(b[0], 1);
        assert_eq!(b.iter().sum::<u64>(), 3);
    }

    #[test]
    fn json_report_follows_the_seed_shape() {
        let rs = vec![
            result("a", CaseStatus::Passed, Some(1.0)),
            result("c", CaseStatus::Failed, Some(0.5)),
        ];
        let (_, js) = render_both(&rs);
        assert_eq!(js["format"], "json");
        assert_eq!(js["summary"]["totalRuns"], 2);
        assert_eq!(js["summary"]["averageScore"], 0.75);
        assert_eq!(js["summary"]["scoreDistribution"]["median"], 0.75);
        assert_eq!(js["summary"]["schemaComplianceRate"], 1.0);
        assert_eq!(js["runIds"], json!(["a", "c"]));
        assert_eq!(js["verdict"], "fail");
        assert!(js["content"]
            .as_str()
            .unwrap()
            .starts_with("# Evaluation report"));
        assert_eq!(js["results"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn recommendations_name_timeouts_and_flaky_cases() {
        let mut t = result("t", CaseStatus::Errored, None);
        t.error = Some(skilleval_model::grade::Fault::Timeout { timeout_ms: 10 });
        let mut f = result("f", CaseStatus::Passed, Some(1.0));
        f.attempts = vec![
            skilleval_execution::result::Attempt {
                number: 1,
                status: CaseStatus::Failed,
                score: Some(0.0),
                duration_ms: 1,
                grade_ms: 0,
                error: None,
            },
            skilleval_execution::result::Attempt {
                number: 2,
                status: CaseStatus::Passed,
                score: Some(1.0),
                duration_ms: 1,
                grade_ms: 0,
                error: None,
            },
        ];
        let rs = vec![t, f];
        let s = summarize(&rs, &EvalSettings::default());
        let lines = recommendation_lines(&s, &rs).join("\n");
        assert!(lines.contains("1 case(s) timed out"), "{lines}");
        assert!(
            lines.contains("Flaky cases (passed only on a retry): f."),
            "{lines}"
        );
    }
}
