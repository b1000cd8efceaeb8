//! A package's `setup.script` and `teardown.script` around its cases, through the real
//! executor and the real sandbox: the order setup → runner → grade → teardown, a setup failure
//! as the skill's fault with its stderr, a teardown failure that leaves the grade alone, and an
//! agent working in the workspace its setup prepared. Needs bubblewrap and python3, like
//! `tests/sandbox.rs`: a host without them fails loudly rather than skipping.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::needless_pass_by_value
)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{json, Value};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::fixtures::planned_jobs;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::validate::validate;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy};

/// Appends `setup` to the workspace's log and leaves a fixture; fails when told to.
const SETUP_SH: &str = r#"set -e
echo setup >> log.txt
if [ -f /skill/fail-setup ]; then echo "no fixture for this case" >&2; exit 3; fi
echo prepared > fixture.txt
"#;

/// Appends `runner` to the log and answers with the fixture setup left.
const RUN_PY: &str = r#"import json, os, sys
inp = json.load(sys.stdin)
ws = inp["workspace"]
with open(os.path.join(ws, "log.txt"), "a") as f:
    f.write("runner\n")
fixture = open(os.path.join(ws, "fixture.txt")).read().strip()
print(f"fixture={fixture}")
"#;

/// Appends `teardown <status> <score>` (what grading decided) and prints the whole log.
const TEARDOWN_PY: &str = r#"import json, os, sys
inp = json.load(sys.stdin)
assert os.getcwd() == inp["workspace"], (os.getcwd(), inp["workspace"])
with open("log.txt", "a") as f:
    f.write(f"teardown {inp['status']} {inp['score']}\n")
print(open("log.txt").read(), end="")
if os.path.exists("/skill/fail-teardown"):
    print("cleanup failed", file=sys.stderr)
    sys.exit(1)
"#;

/// A package laid out as loaders extract it (dirs 0755, files 0644).
fn package(tests: &Value, extra: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut files = vec![
        (
            "SKILL.md".to_string(),
            "---\nname: fixtures\ndescription: Reads a fixture.\n---\n# Fixtures\n".to_string(),
        ),
        ("scripts/setup.sh".into(), SETUP_SH.into()),
        ("scripts/run.py".into(), RUN_PY.into()),
        ("scripts/teardown.py".into(), TEARDOWN_PY.into()),
        (
            "eval/tests.json".into(),
            serde_json::to_string_pretty(tests).unwrap(),
        ),
    ];
    for name in extra {
        files.push(((*name).to_string(), "x".to_string()));
    }
    for (rel, content) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    for d in ["", "scripts", "eval"] {
        std::fs::set_permissions(dir.path().join(d), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    dir
}

fn tests(runner: Value) -> Value {
    json!({
        "version": "2.0",
        "settings": {"runner": runner, "defaultTimeout": 60000},
        "setup": {"script": "scripts/setup.sh"},
        "teardown": {"script": "scripts/teardown.py"},
        "testCases": [{"id": "uses-fixture", "input": {"prompt": "go"},
                       "expected": {"includes": ["fixture=prepared"]},
                       "evaluation": {"strategy": "contains"}}]
    })
}

fn sandbox() -> Sandbox {
    let s = Sandbox::detect(SandboxPolicy::default());
    assert_eq!(
        s.mode(),
        SandboxMode::Bubblewrap,
        "bubblewrap must work for these tests: {:?}",
        s.unavailable_reason()
    );
    s
}

async fn run(root: &Path, executor: ExecutorBuilder) -> Vec<JobResult> {
    let executor = executor.sandbox(sandbox()).build();
    let jobs = planned_jobs(root, executor.strategies());
    let mut out = Vec::new();
    for j in &jobs {
        out.push(executor.execute(j, root).await);
    }
    out
}

fn command() -> Value {
    json!({"type": "command", "script": "scripts/run.py"})
}

#[tokio::test]
async fn setup_runs_before_the_runner_and_teardown_after_grading_in_one_workspace() {
    let pkg = package(&tests(command()), &[]);
    let results = run(pkg.path(), ExecutorBuilder::new()).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    assert_eq!(r.output.as_deref(), Some("fixture=prepared"));
    // The log each step appended to, as the teardown printed it: the teardown ran last and
    // was told the grade, so grading came before it.
    let teardown = &r.details["teardown"];
    assert_eq!(
        teardown["stdout_tail"], "setup\nrunner\nteardown passed 1.0\n",
        "{teardown:#}"
    );
    assert_eq!(teardown["failed"], false);
    assert_eq!(teardown["exit_code"], 0);
    assert_eq!(r.details["setup"]["exit_code"], 0, "{:#}", r.details);
    assert_eq!(r.details["setup"]["script"], "scripts/setup.sh");
}

#[tokio::test]
async fn a_failing_setup_errors_the_case_with_its_stderr_and_the_runner_never_starts() {
    let pkg = package(&tests(command()), &["fail-setup"]);
    let results = run(pkg.path(), ExecutorBuilder::new()).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Errored, "{r:#?}");
    let error = r.error.as_ref().unwrap();
    assert!(!error.is_transient(), "the skill's fault: {error:?}");
    assert_eq!(
        error.to_string(),
        "setup.script `scripts/setup.sh` failed with exit code 3; stderr: no fixture for this case"
    );
    // The teardown still ran (to clean up what the setup began), told the case errored, and
    // the log shows no runner.
    assert_eq!(
        r.details["teardown"]["stdout_tail"], "setup\nteardown errored None\n",
        "{:#}",
        r.details
    );
}

#[tokio::test]
async fn a_failing_teardown_is_recorded_and_leaves_the_grade_alone() {
    let pkg = package(&tests(command()), &["fail-teardown"]);
    let results = run(pkg.path(), ExecutorBuilder::new()).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    assert_eq!(r.score, Some(1.0));
    assert!(r.error.is_none());
    let teardown = &r.details["teardown"];
    assert_eq!(teardown["failed"], true, "{teardown:#}");
    assert_eq!(teardown["exit_code"], 1);
    assert_eq!(
        teardown["error"],
        "teardown.script `scripts/teardown.py` failed with exit code 1; stderr: cleanup failed"
    );
}

#[tokio::test]
async fn a_script_of_no_known_interpreter_is_a_validation_problem_naming_the_field() {
    let mut t = tests(command());
    t["setup"]["script"] = json!("scripts/setup.rb");
    let pkg = package(&t, &["scripts/setup.rb"]);
    let package = Package::open(pkg.path(), &PackageLimits::default()).unwrap();
    let executor = ExecutorBuilder::new().build();
    let validation = validate(&package, executor.strategies());
    let problem = validation
        .problems
        .iter()
        .find(|p| p.pointer == "/setup/script")
        .unwrap_or_else(|| panic!("{:?}", validation.problems));
    assert!(
        problem
            .message
            .contains("must end in .py (python3), .js (node) or .sh (sh)"),
        "{}",
        problem.message
    );
}
