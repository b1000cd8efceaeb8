//! The `command` runner against real processes, through the real sandbox: a package script's
//! output, transcript, faults and limits as the runner reports them, and whose fault a failure
//! is (the sandbox's machinery or the skill's code). The sandbox's own properties are tested in
//! its crate (`crates/sandbox/tests/sandbox/`).
//!
//! These need bubblewrap (`apt-get install bubblewrap`), python3 and node; a host without
//! bubblewrap fails them loudly rather than skipping, since a skipped isolation test proves
//! nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use skilleval_execution::runner::command::CommandRunner;
use skilleval_execution::runner::{OutputRunner, ProduceRequest};
use skilleval_grading::GradeEnv;
use skilleval_model::definition::{RunnerConfig, TestCase};
use skilleval_model::grade::Fault;
use skilleval_sandbox::fixtures::{
    bwrap_sandbox, package, request, run, stderr, stdout, HANG_GUARD,
};
use skilleval_sandbox::{Sandbox, SandboxError, SandboxMode, SandboxPolicy};
use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// The `command` runner
// ---------------------------------------------------------------------------------------------

fn grade_env(pkg: &TempDir, sandbox: Sandbox) -> GradeEnv {
    GradeEnv {
        sandbox: Arc::new(sandbox),
        package_root: Arc::from(pkg.path()),
    }
}

fn case(prompt: &str) -> TestCase {
    let mut case = TestCase {
        id: "tc-1".into(),
        name: "one".into(),
        ..TestCase::default()
    };
    case.input.prompt = prompt.into();
    case.input.context = Some(json!({"doc": "ctx"}));
    case.input.variables.insert("who".into(), "world".into());
    case.input.files.push("eval/fixtures/a.txt".into());
    case
}

fn runner_config(script: &str) -> RunnerConfig {
    RunnerConfig {
        kind: "command".into(),
        script: Some(script.into()),
        ..RunnerConfig::default()
    }
}

async fn produce(
    pkg: &TempDir,
    sandbox: Sandbox,
    script: &str,
    environment: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<skilleval_model::output::Produced, Fault> {
    let tc = case("Say hello to {{who}}");
    let cfg = runner_config(script);
    let req = ProduceRequest {
        case: &tc,
        runner: &cfg,
        given: None,
        environment,
        timeout,
        workspace: None,
    };
    CommandRunner.produce(&req, &grade_env(pkg, sandbox)).await
}

#[tokio::test]
async fn command_runner_echoes_the_prompt_from_stdin_json() {
    let script = r#"
import json, os, sys
inp = json.load(sys.stdin)
assert inp["test_case_id"] == "tc-1", inp
assert inp["context"] == {"doc": "ctx"}, inp
assert inp["variables"] == {"who": "world"}, inp
assert inp["files"] == ["eval/fixtures/a.txt"], inp
sys.stdout.write(inp["prompt"] + " / " + os.environ.get("SETUP_VAR", "missing"))
"#;
    let pkg = package(&[("scripts/run.py", script)]);
    let env = BTreeMap::from([("SETUP_VAR".to_string(), "from-setup".to_string())]);
    let produced = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "scripts/run.py",
        &env,
        Duration::from_secs(10),
    )
    .await
    .expect("produced");
    assert_eq!(produced.output, "Say hello to {{who}} / from-setup");
    assert!(produced.tool_calls.is_none());
    assert!(!produced.truncated);
    assert_eq!(produced.details["exit_code"], json!(0));
}

#[tokio::test]
async fn command_runner_reads_tool_calls_from_a_json_transcript() {
    let script = r#"
import json
print(json.dumps({"output": "done", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}))
"#;
    let pkg = package(&[("scripts/agent.py", script)]);
    let produced = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "scripts/agent.py",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect("produced");
    assert_eq!(produced.output, "done");
    let calls = produced.tool_calls.expect("tool calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "search");
    assert_eq!(calls[0].arguments, json!({"q": "x"}));
}

#[tokio::test]
async fn command_runner_runs_node_and_sh_scripts() {
    let pkg = package(&[
        (
            "run.js",
            "let d='';process.stdin.on('data',c=>d+=c).on('end',()=>process.stdout.write(JSON.parse(d).prompt.toUpperCase()));\n",
        ),
        ("run.sh", "echo shell-output\n"),
    ]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let produced = produce(
        &pkg,
        sandbox.clone(),
        "run.js",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect("node");
    assert_eq!(produced.output, "SAY HELLO TO {{WHO}}");
    let produced = produce(
        &pkg,
        sandbox,
        "run.sh",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect("sh");
    // The trailing newline of stdout is dropped, as shell command substitution does.
    assert_eq!(produced.output, "shell-output");
}

#[tokio::test]
async fn command_runner_turns_a_non_zero_exit_into_a_permanent_fault_with_stderr() {
    let script =
        "import sys\nsys.stderr.write('x' * 5000 + '\\nboom: bad input\\n')\nsys.exit(3)\n";
    let pkg = package(&[("fail.py", script)]);
    let fault = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "fail.py",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect_err("must fail");
    let Fault::Permanent { message } = &fault else {
        panic!("expected a permanent fault, got {fault:?}");
    };
    assert!(message.contains("exit code 3"), "{message}");
    assert!(message.contains("boom: bad input"), "{message}");
    assert!(
        message.len() < 2300,
        "the stderr tail is not capped: {} bytes",
        message.len()
    );
}

#[tokio::test]
async fn command_runner_reports_a_timeout() {
    let pkg = package(&[("hang.py", "import time\ntime.sleep(300)\n")]);
    // The script sleeps 300 s: only the 800 ms timeout ends the run before the hang guard.
    let fault = tokio::time::timeout(
        HANG_GUARD,
        produce(
            &pkg,
            bwrap_sandbox(SandboxPolicy::default()),
            "hang.py",
            &BTreeMap::new(),
            Duration::from_millis(800),
        ),
    )
    .await
    .expect("hang guard: the run had not ended after 60 s")
    .expect_err("must time out");
    assert_eq!(fault, Fault::Timeout { timeout_ms: 800 });
}

#[tokio::test]
async fn command_runner_flags_truncated_output() {
    let pkg = package(&[(
        "flood.py",
        "import sys\nwhile True:\n    sys.stdout.write('z' * 65536)\n",
    )]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_output_bytes: 10_000,
        ..SandboxPolicy::default()
    });
    let produced = produce(
        &pkg,
        sandbox,
        "flood.py",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect("truncated output is still an output");
    assert!(produced.truncated);
    assert_eq!(produced.output.len(), 10_000);
    assert_eq!(produced.details["truncated"], json!(true));
    assert_eq!(produced.details["limit_bytes"], json!(10_000));
}

#[tokio::test]
async fn command_runner_rejects_bad_scripts_before_running_anything() {
    let pkg = package(&[("run.rb", "puts 1\n"), ("ok.py", "print(1)\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    for (script, expect) in [
        ("../ok.py", ".."),
        ("/etc/ok.py", "absolute"),
        ("run.rb", ".py"),
        ("missing.py", "does not exist"),
    ] {
        let fault = produce(
            &pkg,
            sandbox.clone(),
            script,
            &BTreeMap::new(),
            Duration::from_secs(5),
        )
        .await
        .expect_err(script);
        let Fault::Permanent { message } = &fault else {
            panic!("{script}: expected a permanent fault, got {fault:?}");
        };
        assert!(message.contains(expect), "{script}: {message}");
    }
}

#[tokio::test]
async fn command_runner_without_a_sandbox_is_a_fault_of_the_host() {
    let pkg = package(&[("ok.py", "print(1)\n")]);
    let sandbox = Sandbox::with_bwrap_path(SandboxPolicy::default(), None);
    let fault = produce(
        &pkg,
        sandbox,
        "ok.py",
        &BTreeMap::new(),
        Duration::from_secs(5),
    )
    .await
    .expect_err("refused");
    let Fault::Host { message } = &fault else {
        panic!("expected a fault of the host, got {fault:?}");
    };
    assert!(message.contains("bubblewrap"), "{message}");
    assert!(fault.is_transient(), "another worker may have a sandbox");
}

// ---------------------------------------------------------------------------------------------
// Whose fault: the sandbox's machinery or the skill's code
// ---------------------------------------------------------------------------------------------

/// A stand-in for bubblewrap that is the real one, except that while `<dir>/broken` exists
/// it starts the real one with a process limit of 1 for its uid, so that bubblewrap's own
/// `clone` fails with EAGAIN exactly as on a uid already at its limit.
fn limited_bwrap() -> (TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let real = ["/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("bubblewrap is installed");
    let path = dir.path().join("bwrap");
    let script = format!(
        "#!/bin/sh\nif [ -e '{dir}/broken' ]; then exec prlimit --nproc=1 -- {real} \"$@\"; fi\nexec {real} \"$@\"\n",
        dir = dir.path().display()
    );
    std::fs::write(&path, script).expect("write the stand-in");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (dir, path)
}

#[tokio::test]
async fn a_sandbox_that_cannot_fork_before_the_program_is_a_machinery_error_and_a_host_fault() {
    let (dir, bwrap) = limited_bwrap();
    let sandbox = Sandbox::with_bwrap_path(SandboxPolicy::default(), Some(bwrap));
    assert_eq!(
        sandbox.mode(),
        SandboxMode::Bubblewrap,
        "{:?}",
        sandbox.unavailable_reason()
    );
    let pkg = package(&[("ok.sh", "echo fine\n")]);
    std::fs::write(dir.path().join("broken"), "").expect("break it");
    let err = sandbox
        .run(request(&pkg, &["sh", "ok.sh"], Duration::from_secs(10)))
        .await
        .expect_err("bubblewrap cannot fork");
    let SandboxError::Machinery { diagnostics, .. } = &err else {
        panic!("expected a machinery error, got {err:?}");
    };
    assert!(
        diagnostics.contains("bwrap") && diagnostics.contains("Resource temporarily unavailable"),
        "{diagnostics}"
    );
    let fault = produce(
        &pkg,
        sandbox.clone(),
        "ok.sh",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect_err("still broken");
    assert!(fault.is_host(), "{fault:?}");
    assert!(fault.to_string().contains("not the skill's"), "{fault}");
    assert!(sandbox.probe().await.is_err(), "the probe sees it too");

    std::fs::remove_file(dir.path().join("broken")).expect("repair it");
    assert_eq!(sandbox.probe().await, Ok(()));
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "ok.sh"], Duration::from_secs(10)),
    )
    .await;
    assert!(out.started);
    assert_eq!(stdout(&out).trim(), "fine");
    assert!(
        !stderr(&out).contains("skilleval-sandbox"),
        "the start marker is not shown: {}",
        stderr(&out)
    );
}

#[tokio::test]
async fn a_skill_that_fork_bombs_itself_fails_as_its_own_fault_with_its_reason() {
    // The classic shell fork bomb, bounded so a broken limit cannot take the host down.
    let script = "cat > /dev/null\nbomb() { bomb | bomb & }\nbomb\nsleep 2\nexit 1\n";
    let pkg = package(&[("bomb.sh", script)]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_processes: 32,
        ..SandboxPolicy::default()
    });
    let fault = produce(
        &pkg,
        sandbox,
        "bomb.sh",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect_err("a fork bomb does not produce an output");
    let Fault::Permanent { message } = &fault else {
        panic!("the skill's own fork bomb is the skill's fault, got {fault:?}");
    };
    assert!(
        message.contains("Cannot fork") || message.contains("Resource temporarily unavailable"),
        "the reason is the process limit: {message}"
    );
}
