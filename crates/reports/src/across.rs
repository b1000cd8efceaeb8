//! A report over several runs of a skill (the report spec seed's `EvaluationReport` whose
//! `summary` is its `ReportSummary` across runs): the Markdown for people, and the JSON with
//! that Markdown as its `content`. The figures are [`skilleval_analysis::across`]'s.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use skilleval_analysis::across::AcrossRuns;
use skilleval_analysis::summary::{RunSummary, Verdict};

use crate::json::{ReportSummary, RubricEntry, ScoreDistribution};

/// One run of the report.
#[derive(Debug, Clone)]
pub struct ReportRun {
    pub run_id: Uuid,
    pub version: String,
    pub created_at: DateTime<Utc>,
    pub summary: RunSummary,
}

/// What a report over runs is about.
#[derive(Debug, Clone, Copy)]
pub struct AcrossContext<'a> {
    pub report_id: Uuid,
    pub skill_name: &'a str,
    pub skill_description: &'a str,
    pub created_at: DateTime<Utc>,
    /// Oldest first.
    pub runs: &'a [ReportRun],
    pub summary: &'a AcrossRuns,
}

/// The skill a report is about (the seed's `task`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AcrossTask {
    pub id: String,
    pub name: String,
    pub description: String,
}

/// A run's line in the JSON report.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AcrossRunRow {
    pub run_id: Uuid,
    pub version: String,
    pub created_at: DateTime<Utc>,
    pub verdict: String,
    pub total_cases: u64,
    pub pass_rate: f64,
    pub average_score: f64,
}

/// The seed's `EvaluationReport` over runs, with each run's line.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AcrossReport {
    pub id: Uuid,
    pub task_id: String,
    pub task: AcrossTask,
    /// The format the report was asked in (`markdown` or `json`).
    pub format: String,
    /// The Markdown rendering.
    pub content: String,
    pub run_ids: Vec<Uuid>,
    pub summary: ReportSummary,
    pub created_at: DateTime<Utc>,
    pub passed_runs: u64,
    pub average_pass_rate: f64,
    pub runs: Vec<AcrossRunRow>,
}

/// The seed's `ReportSummary` of the runs.
pub fn report_summary(s: &AcrossRuns) -> ReportSummary {
    ReportSummary {
        total_runs: s.total_runs,
        average_score: s.average_score,
        score_distribution: ScoreDistribution {
            min: s.distribution.min,
            max: s.distribution.max,
            mean: s.distribution.mean,
            median: s.distribution.median,
            std_dev: s.distribution.std_dev,
        },
        schema_compliance_rate: s.schema_compliance_rate.unwrap_or(1.0),
        rubric_breakdown: s
            .rubric_breakdown
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
    }
}

/// The report over runs, `format` naming the rendering it was asked in.
pub fn across_report(ctx: &AcrossContext<'_>, format: &str) -> AcrossReport {
    AcrossReport {
        id: ctx.report_id,
        task_id: ctx.skill_name.to_string(),
        task: AcrossTask {
            id: ctx.skill_name.to_string(),
            name: ctx.skill_name.to_string(),
            description: ctx.skill_description.to_string(),
        },
        format: format.to_string(),
        content: across_markdown(ctx),
        run_ids: ctx.runs.iter().map(|r| r.run_id).collect(),
        summary: report_summary(ctx.summary),
        created_at: ctx.created_at,
        passed_runs: ctx.summary.passed_runs,
        average_pass_rate: ctx.summary.average_pass_rate,
        runs: ctx
            .runs
            .iter()
            .map(|r| AcrossRunRow {
                run_id: r.run_id,
                version: r.version.clone(),
                created_at: r.created_at,
                verdict: r.summary.verdict.as_str().to_string(),
                total_cases: r.summary.total,
                pass_rate: r.summary.pass_rate,
                average_score: r.summary.mean,
            })
            .collect(),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// The Markdown report over runs: header, executive summary, the runs' score distribution as
/// text, the rubric breakdown, schema compliance, each run, and recommendations.
pub fn across_markdown(ctx: &AcrossContext<'_>) -> String {
    let s = ctx.summary;
    let mut out = String::with_capacity(4096);
    let _ = writeln!(
        out,
        "# Evaluation report: {} over {} run(s)\n",
        ctx.skill_name, s.total_runs
    );
    if !ctx.skill_description.is_empty() {
        let _ = writeln!(out, "> {}\n", ctx.skill_description.replace('\n', " "));
    }
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| Report | `{}` |", ctx.report_id);
    let _ = writeln!(out, "| Runs | {} |", s.total_runs);
    let _ = writeln!(out, "| Generated | {} |\n", ctx.created_at.to_rfc3339());

    let _ = writeln!(out, "## Executive summary\n");
    let _ = writeln!(
        out,
        "{} of {} run(s) passed; average score {:.3} (median {:.3}, std dev {:.3}, min {:.3}, max {:.3}); average pass rate {}.\n",
        s.passed_runs,
        s.total_runs,
        s.average_score,
        s.distribution.median,
        s.distribution.std_dev,
        s.distribution.min,
        s.distribution.max,
        pct(s.average_pass_rate)
    );

    let _ = writeln!(out, "## Score distribution\n\n```");
    let mut buckets = [0u64; 10];
    for r in ctx.runs {
        let i = ((r.summary.mean * 10.0).floor().max(0.0) as usize).min(9);
        buckets[i] += 1;
    }
    let most = buckets.iter().copied().max().unwrap_or(0).max(1);
    for (i, n) in buckets.iter().enumerate().rev() {
        let width = (*n as f64 / most as f64 * 40.0).round() as usize;
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

    let _ = writeln!(out, "## Rubric breakdown\n");
    if s.rubric_breakdown.is_empty() {
        let _ = writeln!(out, "No case of these runs was scored on a rubric.\n");
    } else {
        let _ = writeln!(
            out,
            "| criterion | average | weight | contribution | cases |\n|---|---|---|---|---|"
        );
        for (name, c) in &s.rubric_breakdown {
            let _ = writeln!(
                out,
                "| {name} | {:.3} | {:.2} | {:.3} | {} |",
                c.average_score, c.weight, c.contribution, c.count
            );
        }
        out.push('\n');
    }

    let _ = writeln!(out, "## Schema compliance\n");
    match s.schema_compliance_rate {
        Some(rate) => {
            let _ = writeln!(
                out,
                "{} of the `json_schema` cases' outputs were valid.\n",
                pct(rate)
            );
        }
        None => {
            let _ = writeln!(out, "No case of these runs checks a schema.\n");
        }
    }

    let _ = writeln!(out, "## Runs\n");
    let _ = writeln!(out, "| run | version | created | verdict | cases | pass rate | average |\n|---|---|---|---|---|---|---|");
    for r in ctx.runs {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {:.3} |",
            r.run_id,
            r.version,
            r.created_at.to_rfc3339(),
            r.summary.verdict.as_str(),
            r.summary.total,
            pct(r.summary.pass_rate),
            r.summary.mean
        );
    }
    out.push('\n');

    let _ = writeln!(out, "## Recommendations\n");
    let mut any = false;
    let failing = ctx
        .runs
        .iter()
        .filter(|r| r.summary.verdict == Verdict::Fail)
        .count();
    if failing > 0 {
        any = true;
        let _ = writeln!(
            out,
            "- {failing} run(s) failed their gate: read their own reports for the failing cases."
        );
    }
    if let Some((name, c)) = s
        .rubric_breakdown
        .iter()
        .min_by(|a, b| a.1.average_score.total_cmp(&b.1.average_score))
    {
        if c.average_score < 0.7 {
            any = true;
            let _ = writeln!(
                out,
                "- The weakest criterion is `{name}` (average {:.3}): it costs the most score.",
                c.average_score
            );
        }
    }
    if s.distribution.std_dev > 0.1 {
        any = true;
        let _ = writeln!(
            out,
            "- Scores vary across runs (std dev {:.3}): compare the best and the worst run to see what changed.",
            s.distribution.std_dev
        );
    }
    if !any {
        let _ = writeln!(
            out,
            "- Nothing stands out: every run passed and the scores are steady."
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_analysis::across::across_runs;

    fn summary(mean: f64, verdict: &str) -> RunSummary {
        serde_json::from_value(serde_json::json!({
            "total": 2, "passed": 1, "failed": 1, "errored": 0, "skipped": 0,
            "pass_rate": 0.5, "mean": mean, "median": mean, "std_dev": 0.0,
            "min": mean, "max": mean, "weighted_mean": mean,
            "by_tag": {}, "by_suite": {}, "by_strategy": {}, "by_criterion": {},
            "schema_compliance_rate": null,
            "durations": {"total_ms": 0, "p50_ms": 0, "p95_ms": 0, "wall_ms": 0},
            "produce_usage": {}, "grade_usage": {},
            "verdict": verdict, "verdict_reasons": [], "pass_threshold": 0.5
        }))
        .unwrap()
    }

    #[test]
    fn the_report_lists_every_run_with_the_seeds_summary() {
        let runs = vec![
            ReportRun {
                run_id: Uuid::now_v7(),
                version: "1".into(),
                created_at: Utc::now(),
                summary: summary(0.25, "fail"),
            },
            ReportRun {
                run_id: Uuid::now_v7(),
                version: "2".into(),
                created_at: Utc::now(),
                summary: summary(0.75, "pass"),
            },
        ];
        let figures = across_runs(&runs.iter().map(|r| r.summary.clone()).collect::<Vec<_>>());
        let ctx = AcrossContext {
            report_id: Uuid::now_v7(),
            skill_name: "s",
            skill_description: "d",
            created_at: Utc::now(),
            runs: &runs,
            summary: &figures,
        };
        let report = across_report(&ctx, "json");
        assert_eq!(report.summary.total_runs, 2);
        assert!((report.summary.average_score - 0.5).abs() < 1e-12);
        assert_eq!(report.summary.schema_compliance_rate, 1.0);
        assert_eq!(report.run_ids, vec![runs[0].run_id, runs[1].run_id]);
        assert_eq!(report.runs[0].verdict, "fail");
        let md = &report.content;
        for section in [
            "## Executive summary",
            "## Score distribution",
            "## Rubric breakdown",
            "## Schema compliance",
            "## Runs",
            "## Recommendations",
        ] {
            assert!(md.contains(section), "{section}: {md}");
        }
        assert!(md.contains("1 of 2 run(s) passed"), "{md}");
        assert!(md.contains(&runs[1].run_id.to_string()));
        let json = serde_json::to_value(&report).unwrap();
        assert!(
            json["summary"]["scoreDistribution"]["stdDev"].is_number(),
            "{json}"
        );
        assert!(json["summary"]["rubricBreakdown"].is_object());
    }
}
