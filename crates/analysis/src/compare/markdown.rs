//! The comparison as Markdown, sized for a pull-request comment: the gate first, then one table
//! of the statistics, then the cases that moved most.

use std::fmt::Write;

use super::{CaseDelta, Comparison, Flip, Outcome};
use crate::summary::Verdict;

/// Cases listed in the "moved most" table; the JSON has them all.
const MOST_MOVED: usize = 15;

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn label(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "?".to_string(),
        other => other.to_string(),
    }
}

fn p(v: f64) -> String {
    if v < 0.001 {
        "< 0.001".to_string()
    } else {
        format!("{v:.3}")
    }
}

/// Renders `c` as Markdown.
pub fn markdown(c: &Comparison) -> String {
    let mut out = String::new();
    let (a, b) = (label(&c.version_a), label(&c.version_b));
    let _ = writeln!(out, "## Comparison: {} → {}\n", cell(&a), cell(&b));
    let verdict = match c.gate.verdict {
        Verdict::Pass => "✅ pass",
        Verdict::Fail => "❌ fail",
    };
    let _ = writeln!(
        out,
        "**Regression gate: {verdict}** · outcome: {} · {} paired cases\n",
        c.outcome.as_str(),
        c.counts.paired
    );
    for r in &c.gate.reasons {
        let _ = writeln!(out, "- {}", cell(r));
    }
    if c.gate.verdict == Verdict::Fail && !c.gate.regressed_cases.is_empty() {
        let names: Vec<String> = c
            .gate
            .regressed_cases
            .iter()
            .map(|id| format!("`{}`", id.replace('`', "'")))
            .collect();
        let _ = writeln!(out, "- regressed cases: {}", names.join(", "));
    }
    if !c.gate.reasons.is_empty() || c.gate.verdict == Verdict::Fail {
        out.push('\n');
    }

    let ci = format!("{:.0} % CI", c.confidence * 100.0);
    let _ = writeln!(
        out,
        "| | A | B | Δ (B − A) | {ci} (t, clustered) | {ci} (bootstrap) | p |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    if let Some(o) = &c.overall {
        let _ = writeln!(
            out,
            "| Mean score | {:.3} | {:.3} | {:+.3} | {:+.3} to {:+.3} | {:+.3} to {:+.3} | {} |",
            o.mean_a,
            o.mean_b,
            o.difference.mean,
            o.difference.ci_low,
            o.difference.ci_high,
            o.bootstrap.low,
            o.bootstrap.high,
            p(o.difference.p_value)
        );
    }
    let pr = &c.pass_rate;
    let _ = writeln!(
        out,
        "| Pass rate | {:.1} % | {:.1} % | {:+.1} pts | {:+.1} to {:+.1} | {:+.1} to {:+.1} | {} (McNemar: {}↓ {}↑) |",
        pr.rate_a * 100.0,
        pr.rate_b * 100.0,
        pr.difference.mean * 100.0,
        pr.difference.ci_low * 100.0,
        pr.difference.ci_high * 100.0,
        pr.bootstrap.low * 100.0,
        pr.bootstrap.high * 100.0,
        p(pr.mcnemar.p_two_sided),
        pr.mcnemar.regressions,
        pr.mcnemar.improvements,
    );
    for k in &c.criteria_scores {
        let s = &k.statistics;
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.3} | {:+.3} | {:+.3} to {:+.3} | {:+.3} to {:+.3} | {} (Holm){} |",
            cell(&k.criterion),
            k.score_a,
            k.score_b,
            s.difference.mean,
            s.difference.ci_low,
            s.difference.ci_high,
            s.bootstrap.low,
            s.bootstrap.high,
            p(k.p_holm),
            if k.significant { " *" } else { "" }
        );
    }
    let n = &c.counts;
    let _ = writeln!(
        out,
        "\n{} improved · {} regressed · {} unchanged (|Δ| < 0.01)",
        n.improved, n.regressed, n.unchanged
    );
    let lists = [
        ("Added (not paired)", &c.added),
        ("Removed (not paired)", &c.removed),
        ("Not run in one of the runs", &c.not_run),
    ];
    for (title, ids) in lists {
        if !ids.is_empty() {
            let _ = writeln!(out, "\n{title}: {}", code_list(ids.iter()));
        }
    }
    if !c.not_comparable.is_empty() {
        let items: Vec<String> = c
            .not_comparable
            .iter()
            .map(|nc| {
                let why: Vec<&str> = nc.reasons.iter().map(|r| r.as_str()).collect();
                format!(
                    "`{}` ({})",
                    nc.test_case_id.replace('`', "'"),
                    why.join(", ")
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "\nNot comparable (definition, grader or judge model changed): {}",
            items.join(", ")
        );
    }

    let moved: Vec<&CaseDelta> = c.cases.iter().filter(|d| d.delta != 0.0).collect();
    if !moved.is_empty() {
        let _ = writeln!(out, "\n### Cases that moved most\n");
        let _ = writeln!(out, "| Case | A | B | Δ | |");
        let _ = writeln!(out, "|---|---:|---:|---:|---|");
        for d in moved.iter().take(MOST_MOVED) {
            let flip = match d.flip {
                Some(Flip::PassToFail) => "pass → fail",
                Some(Flip::FailToPass) => "fail → pass",
                None => "",
            };
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {:+.3} | {flip} |",
                d.test_case_id.replace('`', "'").replace('|', "\\|"),
                score(d.score_a, d.pass_rate_a),
                score(d.score_b, d.pass_rate_b),
                d.delta,
            );
        }
        if moved.len() > MOST_MOVED {
            let _ = writeln!(
                out,
                "\n… and {} more in the JSON.",
                moved.len() - MOST_MOVED
            );
        }
    }
    let caveat = match c.outcome {
        Outcome::NoDetectableDifference => "No detectable difference is not proof of none. ",
        Outcome::Better | Outcome::Worse => "",
    };
    let _ = writeln!(
        out,
        "\n<sub>{caveat}Bootstrap: {} resamples of whole cases, seed {}. \
         docs/comparing.md says what each statistic means.</sub>",
        c.resamples, c.seed
    );
    if let Some(blind) = &c.blind_comparator {
        out.push_str(&skilleval_grading::comparator::blind_markdown(blind));
    }
    out
}

fn score(s: Option<f64>, rate: f64) -> String {
    s.map_or_else(
        || format!("pass {:.0} %", rate * 100.0),
        |v| format!("{v:.3}"),
    )
}

fn code_list<'a>(ids: impl Iterator<Item = &'a String>) -> String {
    ids.map(|id| format!("`{}`", id.replace('`', "'")))
        .collect::<Vec<_>>()
        .join(", ")
}
