//! The summary table printed at the end of `skilleval run` (on stderr; stdout is the report).

use std::fmt::Write;

use skilleval_analysis::summary::Verdict;
use skilleval_execution::result::CaseStatus;
use skilleval_reports::ReportContext;

/// Widest case name shown before it is cut.
const NAME_WIDTH: usize = 40;

fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// One line per case, then the totals and the verdict with its reasons.
pub fn summary_table(ctx: &ReportContext<'_>) -> String {
    let mut out = String::new();
    let id_width = ctx
        .results
        .iter()
        .map(|r| r.test_case_id.chars().count())
        .max()
        .unwrap_or(2)
        .clamp(2, 24);
    let _ = writeln!(
        out,
        "\n{:<id_width$}  {:<NAME_WIDTH$}  {:<18}  {:<8}  {:>6}  {:>8}",
        "id", "name", "strategy", "status", "score", "time"
    );
    let _ = writeln!(
        out,
        "{}",
        "-".repeat(id_width + NAME_WIDTH + 18 + 8 + 6 + 8 + 10)
    );
    for r in ctx.results {
        let score = r.score.map_or("-".to_string(), |s| format!("{s:.3}"));
        let status = match r.status {
            CaseStatus::Passed => "PASS",
            CaseStatus::Failed => "FAIL",
            CaseStatus::Errored => "ERROR",
            CaseStatus::Skipped => "SKIP",
            CaseStatus::Queued => "QUEUED",
        };
        let _ = writeln!(
            out,
            "{:<id_width$}  {:<NAME_WIDTH$}  {:<18}  {:<8}  {:>6}  {:>6}ms",
            cut(&r.test_case_id, id_width),
            cut(&r.name, NAME_WIDTH),
            cut(&r.strategy, 18),
            status,
            score,
            r.duration_ms
        );
        if let Some(err) = &r.error {
            let _ = writeln!(out, "{:id_width$}  ↳ {}", "", cut(&err.to_string(), 100));
        }
    }
    let s = ctx.summary;
    let _ = writeln!(
        out,
        "\n{} cases: {} passed, {} failed, {} errored, {} skipped · pass rate {:.1}% · mean {:.3} · weighted {:.3} · p95 {} ms",
        s.total,
        s.passed,
        s.failed,
        s.errored,
        s.skipped,
        s.pass_rate * 100.0,
        s.mean,
        s.weighted_mean,
        s.durations.p95_ms
    );
    let verdict = match s.verdict {
        Verdict::Pass => "PASS",
        Verdict::Fail => "FAIL",
    };
    let _ = writeln!(out, "verdict: {verdict}");
    for reason in &s.verdict_reasons {
        let _ = writeln!(out, "  - {reason}");
    }
    out
}
