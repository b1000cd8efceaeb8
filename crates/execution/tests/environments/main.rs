//! Environments from declared dependencies, through the real executor, sandbox and resolvers
//! (`uv`, `npm`) against indexes the test serves on loopback with wheels and a tarball it
//! built: one build for several cases, the environment read-only in the sandbox, the build
//! reaching nothing but the index, a missing dependency as the package's fault naming it, an
//! unreachable index as the host's. Needs bubblewrap, python3, uv and npm (scripts/test.sh
//! installs them): a host without them fails loudly rather than skipping.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use skilleval_execution::environment::fixtures as index;
use skilleval_execution::environment::{EnvironmentConfig, Environments};
use skilleval_execution::executor::{Executor, ExecutorBuilder};
use skilleval_execution::fixtures::planned_jobs;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_model::grade::Fault;
use skilleval_sandbox::fixtures;
use skilleval_sandbox::{Sandbox, SandboxPolicy};

/// A script that declares `skdemo` with PEP 723 and prints what its module says.
const RUN_PY: &str = r#"# /// script
# dependencies = ["skdemo>=1"]
# ///
import json, sys
import skdemo
json.load(sys.stdin)
print(skdemo.greet())
"#;

/// A package of `cases` cases run by `script` (with `files` beside it), graded on `expect`.
fn package(cases: usize, script: &str, expect: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
    let test_cases: Vec<Value> = (0..cases)
        .map(|i| {
            json!({"id": format!("case-{i}"), "input": {"prompt": "go"},
                   "expected": {"includes": [expect]}, "evaluation": {"strategy": "contains"}})
        })
        .collect();
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "command", "script": "scripts/run.py"}, "defaultTimeout": 300000},
        "testCases": test_cases,
    });
    let mut all = vec![
        (
            "SKILL.md",
            "---\nname: deps-demo\ndescription: Imports a package.\n---\n# Demo\n".to_string(),
        ),
        ("scripts/run.py", script.to_string()),
        ("eval/tests.json", tests.to_string()),
    ];
    all.extend(files.iter().map(|(p, c)| (*p, (*c).to_string())));
    let refs: Vec<(&str, &str)> = all.iter().map(|(p, c)| (*p, c.as_str())).collect();
    fixtures::package(&refs)
}

fn sandbox() -> Sandbox {
    fixtures::bwrap_sandbox(SandboxPolicy::default())
}

/// An executor whose environments come from `python_index` and `npm_registry`, cached in a
/// folder of its own (kept alive by the returned guard).
fn executor(python_index: &str, npm_registry: &str) -> (Executor, tempfile::TempDir) {
    let cache = tempfile::Builder::new()
        .prefix("skilleval-env-test-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let environments = Environments::new(EnvironmentConfig {
        dir: Some(cache.path().join("envs")),
        python_index: python_index.to_string(),
        npm_registry: npm_registry.to_string(),
        ..EnvironmentConfig::default()
    });
    let executor = ExecutorBuilder::new()
        .sandbox(sandbox())
        .environments(Arc::new(environments))
        .build();
    (executor, cache)
}

/// Every case of the package at `root`, run at once.
async fn run_all(executor: &Executor, root: &Path) -> Vec<JobResult> {
    let jobs = planned_jobs(root, executor.strategies());
    futures::future::join_all(jobs.iter().map(|job| executor.execute(job, root))).await
}

fn describe(r: &JobResult) -> String {
    format!(
        "{} {:?} {:?} output={:?} details={}",
        r.test_case_id, r.status, r.error, r.output, r.details
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn several_cases_share_one_build_and_import_the_declared_package() {
    let index = index::serve().await;
    index.add_wheel(
        "skdemo",
        "1.2.0",
        "def greet():\n    return 'hello from skdemo'\n",
    );
    let (executor, _cache) = executor(&index.simple_url(), "http://127.0.0.1:9/");
    let pkg = package(4, RUN_PY, "hello from skdemo", &[]);
    let results = run_all(&executor, pkg.path()).await;
    for r in &results {
        assert_eq!(r.status, CaseStatus::Passed, "{}", describe(r));
        let env = &r.details["environment"];
        assert_eq!(env["python"], json!(["skdemo==1.2.0"]), "{}", describe(r));
    }
    assert_eq!(
        executor.environments().builds(),
        1,
        "one build for four cases"
    );
    let built: Vec<&JobResult> = results
        .iter()
        .filter(|r| r.details["environment"]["built"] == json!(true))
        .collect();
    assert_eq!(
        built.len(),
        1,
        "one case waited for the build, the others found it"
    );
    let pages = index
        .log()
        .iter()
        .filter(|p| p.as_str() == "/simple/skdemo/")
        .count();
    assert_eq!(pages, 1, "the index was asked once: {:?}", index.log());

    // Run again: held, not rebuilt.
    let again = run_all(&executor, pkg.path()).await;
    assert!(again.iter().all(|r| r.status == CaseStatus::Passed));
    assert_eq!(executor.environments().builds(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_read_only_inside_the_sandbox() {
    let index = index::serve().await;
    index.add_wheel("skdemo", "1.0.0", "def greet():\n    return 'hi'\n");
    let (executor, _cache) = executor(&index.simple_url(), "http://127.0.0.1:9/");
    let script = r#"# /// script
# dependencies = ["skdemo"]
# ///
import os, skdemo
target = os.path.join(os.path.dirname(skdemo.__file__), "planted.py")
try:
    open(target, "w").write("x = 1\n")
    print("wrote " + target)
except OSError as e:
    print(f"refused: {e.strerror}; VIRTUAL_ENV={os.environ['VIRTUAL_ENV']}")
"#;
    let pkg = package(1, script, "refused: Read-only file system", &[]);
    let results = run_all(&executor, pkg.path()).await;
    assert_eq!(
        results[0].status,
        CaseStatus::Passed,
        "{}",
        describe(&results[0])
    );
    assert!(
        results[0]
            .output
            .as_deref()
            .unwrap_or_default()
            .contains("VIRTUAL_ENV=/opt/skilleval-env/python"),
        "{}",
        describe(&results[0])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_build_reaches_nothing_but_the_index() {
    // The index links its wheel to another loopback server: the build's proxy refuses it.
    let other = index::serve().await;
    other.add_wheel("skdemo", "1.0.0", "def greet():\n    return 'hi'\n");
    let index = index::serve().await;
    let (file, bytes) = index::wheel("skdemo", "1.0.0", "def greet():\n    return 'hi'\n");
    index.shelf.lock().unwrap().wheels.insert(
        "skdemo".into(),
        (file, bytes, Some(format!("http://{}", other.addr))),
    );
    let (executor, _cache) = executor(&index.simple_url(), "http://127.0.0.1:9/");
    let pkg = package(1, RUN_PY, "hi", &[]);
    let results = run_all(&executor, pkg.path()).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Errored, "{}", describe(r));
    let message = r.error.as_ref().unwrap().to_string();
    assert!(message.contains("403"), "the proxy's refusal: {message}");
    assert!(index.log().contains(&"/simple/skdemo/".to_string()));
    assert!(
        other.log().is_empty(),
        "the other server was reached: {:?}",
        other.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dependency_errs_every_case_as_the_packages_fault_naming_it() {
    let index = index::serve().await;
    let (executor, _cache) = executor(&index.simple_url(), "http://127.0.0.1:9/");
    let script = "# /// script\n# dependencies = [\"no-such-dist\"]\n# ///\nprint('x')\n";
    let pkg = package(3, script, "x", &[]);
    let results = run_all(&executor, pkg.path()).await;
    for r in &results {
        assert_eq!(r.status, CaseStatus::Errored, "{}", describe(r));
        let fault = r.error.as_ref().unwrap();
        assert!(matches!(fault, Fault::Permanent { .. }), "{fault:?}");
        assert!(fault.to_string().contains("no-such-dist"), "{fault}");
        eprintln!("missing: {fault}");
    }
    assert_eq!(
        executor.environments().builds(),
        1,
        "the failure is remembered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_index_is_a_host_fault_and_a_retry_builds_once_it_is_back() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let url = format!("http://{addr}/simple/");
    let (executor, _cache) = executor(&url, "http://127.0.0.1:9/");
    let pkg = package(1, RUN_PY, "hello", &[]);
    let first = run_all(&executor, pkg.path()).await;
    let fault = first[0].error.clone().unwrap();
    assert!(fault.is_host(), "{}", describe(&first[0]));
    assert!(fault.to_string().contains(&url), "{fault}");
    eprintln!("unreachable: {fault}");

    // The index comes up on that address; the retry (the CLI's policy, the worker's delay
    // queue) builds.
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let index = index::serve_on(listener).await;
    index.add_wheel("skdemo", "1.0.0", "def greet():\n    return 'hello'\n");
    let second = run_all(&executor, pkg.path()).await;
    assert_eq!(
        second[0].status,
        CaseStatus::Passed,
        "{}",
        describe(&second[0])
    );
    assert_eq!(executor.environments().builds(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_dependencies_are_installed_from_the_registry_and_found_by_require() {
    let index = index::serve().await;
    index.add_tarball(
        "skdemo-js",
        "2.0.1",
        "exports.greet = () => 'hello from js';\n",
    );
    let (executor, _cache) = executor("http://127.0.0.1:9/simple/", &index.registry_url());
    let script = r#"import subprocess
print(subprocess.run(["node", "-e", "console.log(require('skdemo-js').greet())"],
      capture_output=True, text=True).stdout)
"#;
    let pkg = package(
        2,
        script,
        "hello from js",
        &[(
            "package.json",
            r#"{"dependencies": {"skdemo-js": "^2.0.0"}}"#,
        )],
    );
    let results = run_all(&executor, pkg.path()).await;
    for r in &results {
        assert_eq!(r.status, CaseStatus::Passed, "{}", describe(r));
        assert_eq!(r.details["environment"]["node"], json!(["skdemo-js@2.0.1"]));
    }
    assert_eq!(executor.environments().builds(), 1);
}
