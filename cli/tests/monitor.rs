//! End-to-end tests of `skilleval monitor`: the example's log graded offline, the report in
//! each format, and bad input refused with exit code 2.
#![allow(clippy::unwrap_used)] // Helpers of a test binary; a failed setup should panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skilleval"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn refund_triage() -> PathBuf {
    repo().join("examples/skills/refund-triage")
}

fn example_log() -> PathBuf {
    repo().join("examples/sampling/samples.jsonl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_example_log_is_graded_offline_and_reported_in_markdown() {
    let out = bin()
        .args(["monitor", "--quiet"])
        .arg(example_log())
        .arg(refund_triage())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report = stdout(&out);
    assert!(
        report.starts_with("# Production quality: refund-triage"),
        "{report}"
    );
    assert!(report.contains("| 2026-11-18 |"), "{report}");
    assert!(report.contains("version 1.3.0 → 1.4.0"), "{report}");
    for criterion in ["answers", "policy-cited", "tool-calls-valid", "no-abuse"] {
        assert!(report.contains(criterion), "{criterion} missing: {report}");
    }
    // The log's broken lines are named by line number; the rest are graded.
    let err = stderr(&out);
    assert!(err.contains("samples.jsonl:41: not JSON"), "{err}");
    assert!(err.contains("samples.jsonl:102: /output"), "{err}");
    assert!(err.contains("3 refused, 1 duplicate(s)"), "{err}");
}

#[test]
fn json_and_html_reports_go_to_the_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("q.json");
    let out = bin()
        .args([
            "monitor",
            "--quiet",
            "--format",
            "json",
            "--sample-rate",
            "1",
            "--bucket",
            "hour",
            "-o",
        ])
        .arg(&json_path)
        .arg(example_log())
        .arg(refund_triage())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    let report: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    assert_eq!(report["bucket"], "hour");
    // Every readable, unfiltered, distinct sample is graded at rate 1.
    let err = stderr(&out);
    let graded = err
        .split("grading ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap();
    assert_eq!(
        report["total"]["n"].as_u64().unwrap() + report["total"]["errored"].as_u64().unwrap(),
        graded
    );
    assert!(err.contains("0 not sampled"), "{err}");
    let buckets = report["buckets"].as_array().unwrap();
    assert!(buckets.len() > 100, "six days of hours");
    let n: u64 = buckets.iter().map(|b| b["n"].as_u64().unwrap()).sum();
    assert_eq!(n, report["total"]["n"].as_u64().unwrap());

    let html_path = dir.path().join("q.html");
    let out = bin()
        .args([
            "monitor",
            "--quiet",
            "--format",
            "html",
            "--criterion",
            "policy-cited",
            "-o",
        ])
        .arg(&html_path)
        .arg(example_log())
        .arg(refund_triage())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html_path).unwrap();
    assert!(
        page.starts_with("<!DOCTYPE html>") && page.contains("<svg"),
        "{page}"
    );
    assert!(page.contains("criterion policy-cited"));
}

fn skill_with(dir: &Path, monitoring: Option<Value>) -> PathBuf {
    let root = dir.join("skill");
    std::fs::create_dir_all(root.join("eval")).unwrap();
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: echo\ndescription: Echoes.\n---\nEcho the input.\n",
    )
    .unwrap();
    let mut doc = json!({
        "version": "2.0",
        "testCases": [{"id": "a", "given": {"output": "hi"}, "expected": {"output": "hi"}}]
    });
    if let Some(m) = monitoring {
        doc["monitoring"] = m;
    }
    std::fs::write(root.join("eval/tests.json"), doc.to_string()).unwrap();
    root
}

#[test]
fn bad_input_and_configuration_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.jsonl");
    std::fs::write(
        &log,
        "{\"sample_id\": \"1\", \"input\": \"q\", \"output\": \"hi\"}\n",
    )
    .unwrap();

    // No monitoring section.
    let plain = skill_with(dir.path(), None);
    let out = bin()
        .args(["monitor"])
        .arg(&log)
        .arg(&plain)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no `monitoring` section"),
        "{}",
        stderr(&out)
    );

    // An invalid monitor: every problem listed with its pointer.
    std::fs::remove_dir_all(&plain).unwrap();
    let broken = skill_with(
        dir.path(),
        Some(
            json!({"sample_rate": -1, "criteria": [{"name": "x", "strategy": "lexical_similarity"}]}),
        ),
    );
    let out = bin()
        .args(["monitor"])
        .arg(&log)
        .arg(&broken)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("/monitoring/sample_rate"), "{err}");
    assert!(err.contains("/monitoring/criteria/0/strategy"), "{err}");

    // A log with no readable line; a log that does not exist.
    std::fs::remove_dir_all(&broken).unwrap();
    let ok = skill_with(
        dir.path(),
        Some(
            json!({"sample_rate": 1, "criteria": [{"name": "greets", "strategy": "contains", "options": {"includes": ["hi"]}}]}),
        ),
    );
    let junk = dir.path().join("junk.jsonl");
    std::fs::write(&junk, "nope\n{\"input\": 1}\n").unwrap();
    let out = bin()
        .args(["monitor"])
        .arg(&junk)
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no readable sample"),
        "{}",
        stderr(&out)
    );
    let out = bin()
        .args(["monitor"])
        .arg(dir.path().join("missing.jsonl"))
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));

    // And the good log on the good monitor: one sample, passed.
    let out = bin()
        .args(["monitor", "--quiet", "-f", "json"])
        .arg(&log)
        .arg(&ok)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(
        (
            report["total"]["n"].as_u64(),
            report["total"]["passed"].as_u64()
        ),
        (Some(1), Some(1))
    );
}
