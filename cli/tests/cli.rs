//! End-to-end tests of the `skilleval` binary: exit codes, files written, reports printed.
#![allow(clippy::unwrap_used)] // Helpers of a test binary; a failed setup should panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

mod support;
use support::example_copy;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skilleval"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn calculator_passes_and_writes_grading_and_benchmark_files() {
    let (_tmp, root) = example_copy("calculator");
    let out = bin().args(["run", "--quiet"]).arg(&root).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("6 cases: 6 passed"), "{err}");
    assert!(err.contains("verdict: PASS"), "{err}");

    let runs: Vec<_> = std::fs::read_dir(root.join("eval/runs")).unwrap().collect();
    assert_eq!(runs.len(), 1);
    let run_dir = runs[0].as_ref().unwrap().path();
    let grading: Value = serde_json::from_str(
        &std::fs::read_to_string(run_dir.join("grading/tc-002.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(grading["test_case_id"], "tc-002");
    assert_eq!(grading["status"], "passed");
    assert_eq!(grading["expectations"][0]["passed"], true);
    assert!(run_dir.join("report.md").exists());
    // The seed's version history, under its own name.
    let history: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("eval/version-history.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(history["skill_name"], "calculator");
    assert_eq!(history["entries"][0]["num_test_cases"], 6);
    assert_eq!(history["entries"][0]["description_version"], 1);
    assert!(!root.join("eval/benchmark.json").exists());
    // The run folder is a skill-creator iteration: string case ids numbered by position.
    let bench: Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join("benchmark.json")).unwrap())
            .unwrap();
    assert_eq!(bench["metadata"]["skill_name"], "calculator");
    assert_eq!(bench["runs"].as_array().unwrap().len(), 6);
    assert_eq!(bench["runs"][1]["eval_id"], 2);
    assert_eq!(bench["runs"][1]["case_id"], "tc-002");
    assert!(run_dir
        .join("eval-2-tc-002/with_skill/run-1/grading.json")
        .exists());
    assert!(run_dir
        .join("eval-2-tc-002/with_skill/run-1/outputs/output.md")
        .exists());
}

#[test]
fn a_version_history_written_as_benchmark_json_is_continued() {
    let (_tmp, root) = example_copy("calculator");
    let legacy = serde_json::json!({
        "skill_name": "calculator", "description_version": 4, "created_at": "2024-01-01T00:00:00Z",
        "entries": [{"description_version": 4, "description_hash": "old", "run_id": "r"}]
    });
    std::fs::write(root.join("eval/benchmark.json"), legacy.to_string()).unwrap();
    let out = bin()
        .args(["run", "--quiet", "--case", "tc-001"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let history: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("eval/version-history.json")).unwrap(),
    )
    .unwrap();
    let entries = history["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{history}");
    assert_eq!(
        entries[1]["description_version"], 5,
        "a new description hash counts on"
    );
}

#[test]
fn a_failing_case_makes_the_verdict_fail_with_exit_1() {
    let (_tmp, root) = example_copy("calculator");
    let tests = root.join("eval/tests.json");
    let text = std::fs::read_to_string(&tests)
        .unwrap()
        .replace("\"output\": \"27\"", "\"output\": \"28\"");
    std::fs::write(&tests, text).unwrap();
    let out = bin()
        .args(["run", "--quiet", "--no-write", "--format", "json"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "fail");
    assert_eq!(report["runSummary"]["failed"], 1);
    let failed: Vec<&Value> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == "failed")
        .collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["test_case_id"], "tc-002");
    assert_eq!(failed[0]["details"]["expected"], "28");
    assert!(!root.join("eval/runs").exists(), "--no-write wrote files");
}

#[test]
fn a_suite_in_sequence_runs_its_cases_one_at_a_time_in_its_order() {
    let (_tmp, root) = example_copy("calculator");
    let tests = root.join("eval/tests.json");
    let mut def: Value = serde_json::from_str(&std::fs::read_to_string(&tests).unwrap()).unwrap();
    let order = ["tc-005", "tc-002", "tc-006", "tc-001"];
    def["suites"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "ordered", "testIds": order, "runInSequence": true}));
    std::fs::write(&tests, serde_json::to_string_pretty(&def).unwrap()).unwrap();
    let out = bin()
        .args([
            "run",
            "--quiet",
            "--no-write",
            "--format",
            "json",
            "-j",
            "6",
        ])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = report["results"].as_array().unwrap();
    let time = |id: &str, field: &str| -> chrono::DateTime<chrono::Utc> {
        let r = results.iter().find(|r| r["test_case_id"] == id).unwrap();
        r[field].as_str().unwrap().parse().unwrap()
    };
    // Each case of the suite started after the one before it in the suite was recorded.
    for pair in order.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        assert!(
            time(after, "started_at") >= time(before, "finished_at"),
            "{after} started before {before} finished: {results:#?}"
        );
    }
}

#[test]
fn tag_and_case_filters_select_cases() {
    let (_tmp, root) = example_copy("calculator");
    let out = bin()
        .args(["run", "--quiet", "--no-write", "--tag", "edge-case"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("3 cases: 3 passed"),
        "{}",
        stderr(&out)
    );
    let out = bin()
        .args([
            "run",
            "--quiet",
            "--no-write",
            "--case",
            "tc-001",
            "--format",
            "md",
        ])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(md.contains("# Evaluation report: calculator"), "{md}");
    assert!(stderr(&out).contains("1 cases: 1 passed"));
    let out = bin()
        .args(["run", "--quiet", "--no-write", "--case", "nope"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("unknown test case id `nope`"));
}

#[test]
fn validate_lists_every_problem_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("eval")).unwrap();
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: Bad_Name\ndescription: has <html>\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(
        root.join("eval/tests.json"),
        r#"{"version":"2.0","testCases":[
            {"id":"a","input":{"prompt":"x"},"expected":{"patterns":["(unclosed"]},"evaluation":{"strategy":"regex_match"}},
            {"id":"a","input":{"prompt":"{{missing}}"},"expected":{"output":"y"}}
        ]}"#,
    )
    .unwrap();
    let out = bin().args(["validate"]).arg(root).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for needle in [
        "SKILL.md#/name",
        "SKILL.md#/description",
        "/testCases/0/expected/patterns/0",
        "/testCases/1/id",
        "missing",
    ] {
        assert!(err.contains(needle), "missing {needle} in:\n{err}");
    }
    let out = bin()
        .args(["validate", "--json"])
        .arg(root)
        .output()
        .unwrap();
    let body: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(body["valid"], false);
    assert!(body["problems"].as_array().unwrap().len() >= 5);
}

#[test]
fn the_zod_schema_example_case_runs_and_a_broken_source_is_named() {
    // contact-extractor's `zod-contract` case: converted by tools/zod, found from the working
    // directory (the crate's folder inside the checkout).
    let (_tmp, root) = example_copy("contact-extractor");
    let out = bin()
        .args(["run", "--quiet", "--no-write", "--case", "zod-contract"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("1 passed"), "{}", stderr(&out));

    let tests = root.join("eval/tests.json");
    let text = std::fs::read_to_string(&tests).unwrap();
    std::fs::write(
        &tests,
        text.replace("z.string().email()", "z.string().emial()"),
    )
    .unwrap();
    let out = bin().args(["validate"]).arg(&root).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("/testCases/4/expected/zodSchema"), "{err}");
    assert!(err.contains("emial is not a function"), "{err}");
}

#[test]
fn a_zip_runs_like_its_folder() {
    let (tmp, root) = example_copy("slugify");
    let zip_path = tmp.path().join("slugify.zip");
    let status = Command::new("python3")
        .args([
            "-c",
            "import shutil,sys; shutil.make_archive(sys.argv[1][:-4], 'zip', sys.argv[2])",
        ])
        .arg(&zip_path)
        .arg(&root)
        .status()
        .unwrap();
    assert!(status.success());
    let out_dir = tmp.path().join("out");
    let out = bin()
        .args(["run", "--quiet", "--out"])
        .arg(&out_dir)
        .arg(&zip_path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("4 cases: 4 passed"));
    assert!(out_dir.join("version-history.json").exists());
}

#[test]
fn model_cases_are_listed_not_failed() {
    let (_tmp, root) = example_copy("meeting-notes");
    let out = bin()
        .args(["run", "--quiet", "--no-write"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("3 case(s) need a model provider"), "{err}");
    assert!(err.contains("  - 1: ") && err.contains("  - 3: "), "{err}");
}

#[test]
fn missing_path_is_bad_input() {
    let out = bin()
        .args(["run", "/definitely/not/here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/definitely/not/here"));
}

#[test]
fn without_a_sandbox_a_skill_running_scripts_is_refused_before_running_with_exit_2() {
    let (_tmp, root) = example_copy("calculator");
    // As on a machine without bubblewrap.
    let missing = tempfile::tempdir().unwrap();
    let bwrap = missing.path().join("bwrap");
    let out = bin()
        .args(["run", "--quiet", "--no-write", "--bwrap"])
        .arg(&bwrap)
        .arg(&root)
        .env_remove("SKILLEVAL_ALLOW_UNSANDBOXED")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
    assert!(err.contains("--allow-unsandboxed"), "{err}");
    assert!(err.contains("6 case(s) run untrusted code"), "{err}");
    assert!(!err.contains("verdict"), "nothing was graded: {err}");

    // Allowed explicitly, the same machine runs them (limits, no isolation).
    let out = bin()
        .args([
            "run",
            "--quiet",
            "--no-write",
            "--allow-unsandboxed",
            "--bwrap",
        ])
        .arg(&bwrap)
        .arg(&root)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("verdict: PASS"), "{err}");
}

/// A skill folder with a SKILL.md and nothing else, in a temp dir.
fn bare_skill() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("notes-skill");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: notes-skill\ndescription: Turns meeting transcripts into notes. Use when users want to summarise a meeting transcript, list the decisions of a meeting, or extract action items with owners.\n---\n# Meeting notes\n\n## Writing the notes\n\nSummary, Decisions, Action items.\n",
    )
    .unwrap();
    (dir, root)
}

/// The binary with no model provider from the environment, in `cwd` (no skilleval.toml).
fn bin_without_provider(cwd: &Path) -> Command {
    let mut cmd = bin();
    for var in [
        "SKILLEVAL_PROVIDER_KIND",
        "SKILLEVAL_PROVIDER_MODEL",
        "SKILLEVAL_PROVIDER_BASE_URL",
        "SKILLEVAL_PROVIDER_API_KEY_ENV",
    ] {
        cmd.env_remove(var);
    }
    cmd.current_dir(cwd);
    cmd
}

#[test]
fn a_skill_without_an_eval_gets_exit_3_and_init_writes_one_the_author_completes() {
    let (tmp, root) = bare_skill();
    let validate = |root: &Path| {
        bin_without_provider(tmp.path())
            .arg("validate")
            .arg(root)
            .output()
            .unwrap()
    };
    // No eval definition: its own exit code, and the way on.
    let out = validate(&root);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no eval definition found"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains(&format!("skilleval init {}", root.display())),
        "{}",
        stderr(&out)
    );
    let out = bin_without_provider(tmp.path())
        .args(["run", "--quiet"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("skilleval init"), "{}", stderr(&out));

    // Without a model: prompts from SKILL.md, expectations left to write.
    let out = bin_without_provider(tmp.path())
        .arg("init")
        .arg(&root)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}{}", stderr(&out));
    assert!(said.contains("drafted from SKILL.md"), "{said}");
    assert!(said.contains("write the expectations"), "{said}");
    let evals: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("evals/evals.json")).unwrap())
            .unwrap();
    assert_eq!(evals["skill_name"], "notes-skill");
    let list = evals["evals"].as_array().unwrap();
    assert_eq!(list.len(), 3, "{evals}");
    assert_eq!(
        list[0]["prompt"],
        "Help me with this: summarise a meeting transcript."
    );
    for (i, e) in list.iter().enumerate() {
        assert_eq!(e["id"], i + 1);
        assert_eq!(e["expectations"], serde_json::json!([]));
    }
    let triggers: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("evals/triggers.json")).unwrap())
            .unwrap();
    let polarity = |b: bool| {
        triggers
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["should_trigger"] == b)
            .count()
    };
    assert!(polarity(true) >= 3 && polarity(false) >= 1, "{triggers}");

    // Prompts with no expectations are refused, each where its expectations go.
    let out = validate(&root);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    for i in 0..3 {
        assert!(
            err.contains(&format!("evals/evals.json#/evals/{i}/expectations")),
            "{err}"
        );
    }
    assert!(
        err.contains("add the statements a good output must satisfy"),
        "{err}"
    );
    let out = bin_without_provider(tmp.path())
        .args(["run", "--quiet"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // init never overwrites a definition.
    let out = bin_without_provider(tmp.path())
        .arg("init")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("already has an eval definition (evals/evals.json)"),
        "{}",
        stderr(&out)
    );

    // Once the author writes expectations, it validates.
    let mut evals = evals;
    for e in evals["evals"].as_array_mut().unwrap() {
        e["expectations"] = serde_json::json!(["The notes have a Decisions section"]);
    }
    std::fs::write(root.join("evals/evals.json"), evals.to_string()).unwrap();
    let out = validate(&root);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
