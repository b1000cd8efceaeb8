//! `skilleval compare` on real runs of a small deterministic skill, and `skilleval plan`.
#![allow(clippy::unwrap_used)] // Helpers of a test binary; a failed setup should panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skilleval"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const CASES: usize = 8;

/// An `upper` skill: answers with its prompt in capitals. `broken` cases (by index) answer in
/// lower case instead; `expected_suffix` changes every case's definition.
fn write_skill(root: &Path, broken: &[usize], expected_suffix: &str) {
    std::fs::create_dir_all(root.join("scripts")).unwrap();
    std::fs::create_dir_all(root.join("eval")).unwrap();
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: upper\ndescription: Answers with the prompt in capital letters.\n---\n\n# Upper\n\nRepeat the prompt in capitals.\n",
    )
    .unwrap();
    let broken: Vec<String> = broken.iter().map(|i| format!("word{i}")).collect();
    std::fs::write(
        root.join("scripts/run.py"),
        format!(
            "import json, sys\nBROKEN = {broken:?}\np = json.load(sys.stdin).get('prompt', '')\nprint(p if p in BROKEN else p.upper())\n"
        ),
    )
    .unwrap();
    let cases: Vec<Value> = (0..CASES)
        .map(|i| {
            serde_json::json!({
                "id": format!("tc-{i}"),
                "name": format!("case {i}"),
                "input": {"prompt": format!("word{i}")},
                "expected": {"output": format!("WORD{i}{expected_suffix}")},
                "evaluation": {"strategy": "exact_match"},
            })
        })
        .collect();
    let tests = serde_json::json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {"defaultTimeout": 5000, "runner": {"type": "command", "script": "scripts/run.py"}},
        "testCases": cases,
    });
    std::fs::write(
        root.join("eval/tests.json"),
        serde_json::to_string_pretty(&tests).unwrap(),
    )
    .unwrap();
    // The sandbox runs the script as another user: the copy must be world-readable.
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(root)
        .status();
}

/// Runs the skill at `root` with the real binary and returns its new run folder.
fn run(root: &Path) -> PathBuf {
    run_with(root, &[])
}

fn run_with(root: &Path, extra: &[&str]) -> PathBuf {
    let runs = root.join("eval/runs");
    let before: Vec<PathBuf> = list(&runs);
    let out = bin()
        .args(["run", "--quiet"])
        .args(extra)
        .arg(root)
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "run failed: {}",
        stderr(&out)
    );
    let new: Vec<PathBuf> = list(&runs)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "one new run folder: {new:?}");
    new[0].clone()
}

fn list(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

fn compare(base: &Path, head: &Path, extra: &[&str]) -> Output {
    bin()
        .arg("compare")
        .arg(base)
        .arg(head)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn a_run_writes_what_a_comparison_needs() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("upper");
    write_skill(&root, &[], "");
    let dir = run(&root);
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["skill_name"], "upper");
    assert_eq!(record["fingerprints"].as_object().unwrap().len(), CASES);
    assert_eq!(record["fingerprints"]["tc-0"]["grader"], "exact_match");
    let lines = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), CASES);

    // Repeats are kept, every attempt, and nest under their case in a comparison.
    let repeated = run_with(&root, &["--repeats", "2"]);
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(repeated.join("run.json")).unwrap()).unwrap();
    assert_eq!(record["repeats"], 2);
    let lines = std::fs::read_to_string(repeated.join("results.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2 * CASES);
    let out = compare(&dir, &repeated, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["pass_rate"]["cases"], CASES);
}

#[test]
fn an_identical_head_passes_the_gate_and_a_real_regression_fails_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("upper");
    write_skill(&root, &[], "");
    let base = run(&root);
    let same = run(&root);
    let out = compare(&base, &same, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    assert!(table.contains("Regression gate: ✅ pass"), "{table}");
    assert!(table.contains("| Pass rate |"), "{table}");

    // One case of eight breaking is within noise: the gate passes and counts it.
    write_skill(&root, &[3], "");
    let noisy = run(&root);
    let out = compare(&base, &noisy, &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["counts"]["regressed"], 1);
    assert_eq!(c["gate"]["verdict"], "pass");

    // Six of eight breaking is a real regression: exit 1, the cases named.
    write_skill(&root, &[0, 1, 2, 3, 4, 5], "");
    let worse = run(&root);
    let file = tmp.path().join("comparison.json");
    let out = compare(&base, &worse, &["--output", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("❌"), "{}", stdout(&out));
    let c: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(c["gate"]["verdict"], "fail");
    assert_eq!(c["gate"]["regressed_cases"].as_array().unwrap().len(), 6);
    assert_eq!(c["run_a"], base.file_name().unwrap().to_str().unwrap());

    // --gate none reports without failing.
    let out = compare(&base, &worse, &["--gate", "none"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn changed_definitions_are_refused_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("upper");
    write_skill(&root, &[], "");
    let base = run(&root);
    write_skill(&root, &[], "!");
    let changed = run(&root);
    let out = compare(&base, &changed, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("not_comparable"), "{}", stderr(&out));
    assert!(stderr(&out).contains("--force"), "{}", stderr(&out));
    // Forced, every case now fails against the new expectation: a regression by the gate.
    let out = compare(&base, &changed, &["--force"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn a_folder_that_is_not_a_run_is_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let out = compare(tmp.path(), &tmp.path().join("missing"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("run.json"), "{}", stderr(&out));
}

#[test]
fn plan_prints_the_detectable_drop_and_advice_from_the_last_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("upper");
    write_skill(&root, &[0, 1], "");
    let last = run(&root);
    let out = bin().arg("plan").arg(&root).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("cases: 8"), "{text}");
    assert!(text.contains("minimum detectable drop"), "{text}");
    assert!(
        text.contains("advice: 8 cases × 1 repeat at a pass rate of 75 %"),
        "{text}"
    );

    let out = bin()
        .args(["plan", "--json", "--repeats", "3"])
        .arg(&root)
        .output()
        .unwrap();
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["attempts"], 24);
    assert_eq!(plan["baseline_pass_rate"], 0.75);
    assert!(plan["pass_rate_source"]
        .as_str()
        .unwrap()
        .contains(last.file_name().unwrap().to_str().unwrap()));
    let mde = plan["mde_pass_rate"].as_f64().unwrap();
    assert!(mde > 0.0 && mde <= 0.75, "{mde}");
    assert!(plan["advice"].as_str().unwrap().contains("3 repeats"));
}

/// Each case's status in a run folder's `results.jsonl`, by case id.
fn statuses(run_dir: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(run_dir.join("results.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            (
                r["test_case_id"].as_str().unwrap().to_string(),
                r["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn rescore_grades_recorded_outputs_against_the_new_definition_without_running_the_skill() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("upper");
    write_skill(&root, &[0, 1], "");
    let source = run(&root);
    let before = statuses(&source);
    assert_eq!(before["tc-0"], "failed");
    assert_eq!(before["tc-2"], "passed");
    // The new definition expects lower case; the skill's script now fails whenever it runs.
    let tests_path = root.join("eval/tests.json");
    let mut tests: Value =
        serde_json::from_str(&std::fs::read_to_string(&tests_path).unwrap()).unwrap();
    for (i, case) in tests["testCases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        case["expected"]["output"] = Value::String(format!("word{i}"));
    }
    std::fs::write(&tests_path, serde_json::to_string_pretty(&tests).unwrap()).unwrap();
    std::fs::write(root.join("scripts/run.py"), "import sys\nsys.exit(3)\n").unwrap();

    let runs = root.join("eval/runs");
    let existing = list(&runs);
    let out = bin()
        .args(["rescore", "--quiet"])
        .arg(&source)
        .arg(&root)
        .output()
        .unwrap();
    // Six of eight cases now fail the new expectation: the verdict is fail.
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("rescoring 8 recorded output(s)"),
        "{}",
        stderr(&out)
    );
    let new: Vec<PathBuf> = list(&runs)
        .into_iter()
        .filter(|p| !existing.contains(p))
        .collect();
    assert_eq!(new.len(), 1, "one new run folder: {new:?}");
    let after = statuses(&new[0]);
    for i in 0..CASES {
        let id = format!("tc-{i}");
        let flipped = if before[&id] == "passed" {
            "failed"
        } else {
            "passed"
        };
        assert_eq!(
            after[&id], flipped,
            "{id}: graded against the new expectation"
        );
    }
    assert_eq!(statuses(&source), before, "the source run is unchanged");

    let out = bin()
        .args(["rescore", "--quiet", "--repeats", "3"])
        .arg(&source)
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}
