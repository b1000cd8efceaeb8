//! End to end with the `agent` runner (issue 16's must-show): the same agent package gives the
//! same verdict and per-case scores through a local run (the shared executor, as `skilleval
//! run` does it) and through the service (upload -> an in-process worker with the provider ->
//! finalised run). One scripted tool-use model server (OpenAI protocol) answers both: it reads
//! SKILL.md, runs the skill's script with `bash`, and answers; the tools run in bubblewrap.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use skilleval_providers::{DirCache, ProviderClients};

use crate::e2e::{
    assert_same, local_run_with, server_cases, start_worker_with_providers, wait_for_verdict,
};
use crate::helpers::{local_provider, only_provider, serve_local, spawn_app_with, AppOptions};
use crate::packages::zip_of;

/// The script, by the number of assistant turns so far; the prompt decides what the report
/// is built from, so one case passes and one fails on the file's content.
fn step(body: &Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let turn = messages.iter().filter(|m| m["role"] == "assistant").count() + 1;
    let prompt = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    // The prompt's first line only: the file list the runner appends names both files.
    let input = if prompt.lines().next().unwrap_or_default().contains("empty") {
        "empty.csv"
    } else {
        "sales.csv"
    };
    let call = |name: &str, args: Value| {
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{turn}"), "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]})
    };
    let message = match turn {
        1 => call("read_file", json!({"path": "/skill/SKILL.md"})),
        2 => call(
            "bash",
            json!({"command": format!("python3 /skill/scripts/report.py {input} > report.json")}),
        ),
        _ => json!({"role": "assistant", "content": "The report is in report.json."}),
    };
    json!({
        "model": "agent-model",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 20}
    })
}

async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    Json(step(&body))
}

async fn start_model() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(calls.clone());
    let (addr, task) = serve_local(app).await;
    (addr, calls, task)
}

fn agent_package() -> Vec<u8> {
    let report_py = "import csv, json, sys\nrows = list(csv.DictReader(open(sys.argv[1])))\nprint(json.dumps({\"total\": sum(int(r['amount']) for r in rows), \"count\": len(rows)}))\n";
    let case = |id: &str, prompt: &str| {
        json!({
            "id": id, "name": id,
            "input": {"prompt": prompt, "files": ["evals/files/sales.csv", "evals/files/empty.csv"]},
            "expected": {
                "jsonSchema": {"type": "object", "required": ["total"], "properties": {"total": {"minimum": 1}}},
                "files": [{"path": "report.json"}]
            },
            "evaluation": {"strategy": "json_schema", "target": "file:report.json"}
        })
    };
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "agent", "provider": "agent"}, "defaultTimeout": 60000},
        "testCases": [
            case("sales", "Build the sales report."),
            case("empty", "Build the report of the empty export."),
        ]
    });
    let tests = serde_json::to_vec_pretty(&tests).unwrap();
    zip_of(&[
        (
            "SKILL.md",
            b"---\nname: e2e-agent\ndescription: Builds a JSON sales report from a CSV. Use for sales reports.\n---\n\nRun `python3 /skill/scripts/report.py INPUT.csv > report.json`.\n",
        ),
        ("scripts/report.py", report_py.as_bytes()),
        ("evals/files/sales.csv", b"region,amount\nnorth,10\nsouth,20\n"),
        ("evals/files/empty.csv", b"region,amount\n"),
        ("eval/tests.json", &tests),
    ])
}

#[tokio::test]
async fn an_agent_package_gets_the_same_verdict_locally_and_through_the_service() {
    let (addr, calls, model_task) = start_model().await;
    let providers = only_provider(local_provider(addr, "agent", "agent-model"));
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let zip = agent_package();

    let local_cache = tempfile::tempdir().unwrap();
    let (local_summary, local_cases) = {
        let zip = zip.clone();
        let settings = app.settings.clone();
        let providers = providers.clone();
        let dir = local_cache.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            let cache: Arc<dyn skilleval_providers::ResponseCache> = Arc::new(DirCache::new(dir));
            let clients = Arc::new(ProviderClients::connect(&providers, &cache, None).unwrap());
            local_run_with(&zip, &settings, Some(&clients))
        })
        .await
        .unwrap()
    };
    let local_calls = calls.load(Ordering::SeqCst);
    assert_eq!(local_calls, 6, "three turns per case");
    assert_eq!(local_summary.errored, 0, "{local_cases:?}");
    assert_eq!(
        (local_summary.passed, local_summary.failed),
        (1, 1),
        "{local_cases:?}"
    );

    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;
    let upload: Value = app.upload_zip(zip, "").await.json().await.unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = wait_for_verdict(&app, &run_id).await;
    assert_eq!(run["status"], "completed");
    assert_same(&run, &local_summary);
    assert_eq!(
        server_cases(&app, &run_id).await,
        local_cases,
        "per-case statuses and scores"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        local_calls + 6,
        "the service ran the same agent loop (agent turns are never cached)"
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    model_task.abort();
    app.cleanup().await;
}
