//! Baselines and repeats in the service (issue 18, item 2): a run asked for `baseline: true`
//! and `repeats: k` runs each case k times with the skill and k times without it, records
//! every attempt once (keyed by case, configuration and attempt), and reports the uplift and
//! pass@k / pass^k exactly as `skilleval run --baseline --repeats k` does on the same package
//! against the same local model server.
//!
//! The model server answers from what it is sent, so both runs get the same answers: with the
//! skill's SKILL.md as system prompt it writes `GOOD` (for the `flaky` case only on every other
//! call of that prompt, so its two attempts split one pass, one fail in either run), without it
//! `bare`; the `hard` case is never good.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser as _;
use serde_json::{json, Value};
use skilleval_execution::fixtures::chat_user_text as user_text;

use crate::e2e::{start_worker_with_providers, wait_for_verdict};
use crate::helpers::{local_provider, only_provider, serve_local, spawn_app_with, AppOptions};
use crate::packages::zip_of;

const SKILL_MD: &str = "---\nname: variants\ndescription: Answers with the magic word when asked.\n---\n\n# Magic word\n\nAlways answer with GOOD.\n";

/// Calls per (prompt, with the skill) key, to alternate the `flaky` case's answers.
type Calls = Arc<Mutex<HashMap<(String, bool), usize>>>;

/// A trigger eval's selection: the skill for queries about the magic word (and, wrongly, the
/// one about a magic trick), `none` for the rest.
fn choose(body: &Value) -> Json<Value> {
    let text = user_text(body);
    let query = text.split("<query>").nth(1).unwrap_or_default();
    let pick = if query.contains("magic") {
        "variants"
    } else {
        "none"
    };
    Json(json!({
        "id": "chatcmpl-test",
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": json!({"skill": pick, "reason": "r"}).to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}
    }))
}

async fn chat(State(calls): State<Calls>, Json(body): Json<Value>) -> Json<Value> {
    if body.pointer("/response_format/json_schema/name") == Some(&json!("choose_skill")) {
        return choose(&body);
    }
    let with_skill = body["messages"][0]["role"] == "system"
        && body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("# Magic word");
    let prompt = user_text(&body);
    let n = {
        let mut calls = calls.lock().unwrap();
        let n = calls.entry((prompt.clone(), with_skill)).or_default();
        *n += 1;
        *n
    };
    let good = with_skill
        && if prompt.contains("flaky") {
            n % 2 == 1
        } else {
            !prompt.contains("hard")
        };
    let (content, tokens) = if good {
        ("GOOD: here it is", 120)
    } else {
        ("bare answer", 80)
    };
    Json(json!({
        "id": "chatcmpl-test",
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": tokens, "completion_tokens": 10}
    }))
}

async fn start_model() -> (SocketAddr, Calls, tokio::task::JoinHandle<()>) {
    let calls: Calls = Arc::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(calls.clone());
    let (addr, task) = serve_local(app).await;
    (addr, calls, task)
}

fn tests_json() -> Value {
    let case = |id: &str| {
        json!({
            "id": id, "name": id,
            "input": {"prompt": format!("{id}: say the magic word")},
            "evaluation": {"strategy": "contains", "options": {"includes": ["GOOD"]}}
        })
    };
    json!({
        "version": "2.0",
        "profile": "structured",
        "settings": {"runner": "llm", "passRate": 0.5},
        "testCases": [case("steady"), case("flaky"), case("hard")]
    })
}

/// Trigger eval queries: two that should select the skill (one does), two that should not
/// (one does): precision 1/2, recall 1/2.
fn triggers_json() -> Value {
    json!([
        {"query": "What is the magic word?", "should_trigger": true},
        {"query": "Say the secret password", "should_trigger": true},
        {"query": "Show me a magic trick", "should_trigger": false},
        {"query": "What is the weather today?", "should_trigger": false}
    ])
}

/// The package as a folder (for the CLI) and as a ZIP (for the service).
fn package(dir: &std::path::Path) -> Vec<u8> {
    let tests = serde_json::to_vec_pretty(&tests_json()).unwrap();
    let triggers = serde_json::to_vec_pretty(&triggers_json()).unwrap();
    std::fs::create_dir_all(dir.join("eval")).unwrap();
    std::fs::write(dir.join("SKILL.md"), SKILL_MD).unwrap();
    std::fs::write(dir.join("eval/tests.json"), &tests).unwrap();
    std::fs::write(dir.join("eval/triggers.json"), &triggers).unwrap();
    zip_of(&[
        ("SKILL.md", SKILL_MD.as_bytes()),
        ("eval/tests.json", &tests),
        ("eval/triggers.json", &triggers),
    ])
}

/// `skilleval run` with `flags` on the folder, into `out/<name>`; returns the run's folder.
async fn cli_run(
    root: &std::path::Path,
    addr: SocketAddr,
    out: &std::path::Path,
    name: &str,
    flags: &[&str],
) -> std::path::PathBuf {
    let providers = out.join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            "default = \"test\"\n\n[providers.test]\nkind = \"openai\"\nbase_url = \"http://{addr}/v1\"\nmodel = \"test-model\"\n"
        ),
    )
    .unwrap();
    let mut argv: Vec<String> = ["skilleval", "run", "--quiet", "--no-cache"]
        .iter()
        .chain(flags)
        .map(|s| s.to_string())
        .collect();
    argv.extend([
        "--providers".to_string(),
        providers.display().to_string(),
        "--out".to_string(),
        out.join(name).display().to_string(),
        root.display().to_string(),
    ]);
    let cli = skilleval_cli::Cli::parse_from(argv);
    let skilleval_cli::Command::Run(args) = cli.command else {
        panic!("not a run");
    };
    let code = skilleval_cli::run::run(&args).await;
    assert!(code <= 1, "the CLI run reached a verdict (exit {code})");
    let runs: Vec<_> = std::fs::read_dir(out.join(name).join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1);
    runs[0].clone()
}

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `skilleval run --baseline --repeats 2` on the folder; returns its benchmark.json.
async fn cli_benchmark(root: &std::path::Path, addr: SocketAddr, out: &std::path::Path) -> Value {
    let dir = cli_run(
        root,
        addr,
        out,
        "local",
        &["--baseline", "--repeats", "2", "--trigger-runs", "0"],
    )
    .await;
    read_json(&dir.join("benchmark.json"))
}

/// The document with every `time_seconds` (and the signed delta of it) removed.
fn without_times(mut doc: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(map) => {
                map.remove("time_seconds");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut doc);
    doc
}

#[tokio::test]
async fn a_baseline_and_repeats_run_reports_the_uplift_and_pass_at_k_the_cli_reports() {
    let (addr, _calls, model) = start_model().await;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("variants");
    let zip = package(&root);

    let local = cli_benchmark(&root, addr, tmp.path()).await;

    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let providers = only_provider(local_provider(addr, "test", "test-model"));
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;

    // Bad input first: the rule is named.
    let bad = app.upload_zip(zip.clone(), "?repeats=0").await;
    assert_eq!(bad.status().as_u16(), 422);
    let bad: Value = bad.json().await.unwrap();
    assert_eq!(bad["error"]["details"]["field"], "repeats", "{bad}");

    let upload: Value = app
        .upload_zip(zip, "?baseline=true&repeats=2")
        .await
        .json()
        .await
        .unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = wait_for_verdict(&app, &run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["counters"]["total"], 12,
        "3 cases x 2 attempts x (with, without)"
    );
    assert_eq!(run["counters"]["completed"], 12);

    // Every attempt is its own row: 12 rows, one per (case, configuration, attempt).
    let (rows,): (i64,) = sqlx::query_as(
        "SELECT count(DISTINCT (test_case_id, configuration, run_number)) FROM eval_results
         WHERE run_id = $1::uuid",
    )
    .bind(&run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows, 12);

    // The summary is over the with-skill attempts, as the CLI's: steady 2/2, flaky 1/2.
    assert_eq!(run["summary"]["pass_rate"], 0.5, "{run}");

    let (_, report) = app
        .get_json(&format!("/v1/runs/{run_id}/report?format=json"))
        .await;
    let service = without_times(report["benchmark"].clone());
    assert!(
        service.is_object(),
        "the JSON report carries benchmark.json: {report}"
    );
    let local = without_times(local);
    // Durations differ between two runs; every other number is the same.
    assert_eq!(service["run_summary"], local["run_summary"], "the uplift");
    assert_eq!(
        service["repeats"], local["repeats"],
        "pass@k, pass^k, flaky cases"
    );
    assert_eq!(service["uplift"], local["uplift"], "per case and criterion");
    let attempts = |doc: &Value| {
        // Which of a case's attempts got which answer depends on scheduling, not on code.
        let mut runs: Vec<String> = doc["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.as_object_mut().unwrap().remove("run_number");
                r.to_string()
            })
            .collect();
        runs.sort();
        runs
    };
    assert_eq!(attempts(&service), attempts(&local), "every attempt");
    // What those equal numbers are (so the equality is not of two empty documents).
    assert_eq!(local["run_summary"]["delta"]["case_pass_rate"], "+0.50");
    assert_eq!(local["repeats"]["flaky_cases"], json!(["flaky"]));
    let flaky = local["repeats"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["test_case_id"] == "flaky")
        .unwrap();
    assert_eq!(flaky["pass_at"]["pass@2"], 1.0);
    assert_eq!(flaky["pass_all"]["pass^2"], 0.0);
    assert_eq!(
        without_times(run["summary"]["benchmark"].clone())["repeats"],
        local["repeats"],
        "the stored summary carries it too"
    );

    let md = app
        .get(&format!("/v1/runs/{run_id}/report?format=markdown"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        md.contains("## Baseline: with vs without the skill"),
        "{md}"
    );
    assert!(md.contains("### Uplift per case"), "{md}");

    // Results list every attempt, each saying which it is; pages cut between attempts.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/runs/{run_id}/results?limit=5&cursor={c}"),
            None => format!("/v1/runs/{run_id}/results?limit=5"),
        };
        let (status, page) = app.get_json(&path).await;
        assert_eq!(status, 200, "{page}");
        for r in page["results"].as_array().unwrap() {
            seen.push(format!(
                "{}/{}/{}",
                r["test_case_id"].as_str().unwrap(),
                r["configuration"].as_str().unwrap(),
                r["run_number"]
            ));
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 12, "each attempt listed once: {seen:?}");

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    model.abort();
    app.cleanup().await;
}

#[tokio::test]
async fn the_service_runs_trigger_evals_and_reports_the_clis_precision_recall_and_f1() {
    let (addr, _calls, model) = start_model().await;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("variants");
    let zip = package(&root);

    let local = read_json(
        &cli_run(&root, addr, tmp.path(), "local", &["--trigger-runs", "2"])
            .await
            .join("triggers.json"),
    );
    let m = &local["metrics"];
    assert_eq!(
        (m["precision"].as_f64(), m["recall"].as_f64()),
        (Some(0.5), Some(0.5))
    );
    assert_eq!(m["f1"].as_f64(), Some(0.5));

    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let providers = only_provider(local_provider(addr, "test", "test-model"));
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;

    let bad = app.upload_zip(zip.clone(), "?trigger_runs=11").await;
    assert_eq!(bad.status().as_u16(), 422);
    let bad: Value = bad.json().await.unwrap();
    assert_eq!(bad["error"]["details"]["field"], "trigger_runs", "{bad}");

    let upload: Value = app
        .upload_zip(zip, "?triggers=true&trigger_runs=2")
        .await
        .json()
        .await
        .unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = wait_for_verdict(&app, &run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(
        run["counters"]["total"],
        3 + 4,
        "3 cases and 4 trigger queries"
    );
    assert_eq!(
        run["summary"]["triggers"], local,
        "the same report: queries, picks, precision, recall, F1, usage"
    );
    let (_, report) = app
        .get_json(&format!("/v1/runs/{run_id}/report?format=json"))
        .await;
    assert_eq!(report["triggers"], local);
    let md = app
        .get(&format!("/v1/runs/{run_id}/report?format=markdown"))
        .await
        .text()
        .await
        .unwrap();
    assert!(md.contains("## Trigger evals"), "{md}");
    assert!(md.contains("F1 50.0%"), "{md}");

    // A second run through POST /v1/runs reads the queries from the stored package.
    let version_id = upload["version_id"].as_str().unwrap();
    let created = app
        .post_json(
            "/v1/runs",
            &json!({"version_id": version_id, "trigger_runs": 2, "test_cases": ["steady"]}),
        )
        .await;
    assert_eq!(created.status().as_u16(), 202);
    let created: Value = created.json().await.unwrap();
    let again = wait_for_verdict(&app, created["run_id"].as_str().unwrap()).await;
    assert_eq!(again["counters"]["total"], 1 + 4);
    assert_eq!(again["summary"]["triggers"]["metrics"], local["metrics"]);

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    model.abort();
    app.cleanup().await;
}
