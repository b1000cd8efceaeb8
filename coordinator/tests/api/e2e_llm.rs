//! End to end with a model (issue 4's must-show): the same LLM-graded package gives the same
//! verdict, summary and per-case scores through a local run (as `skilleval run` does it: the
//! shared executor, providers connected with a folder cache and in-process limits) and through
//! the service (upload -> an in-process worker configured with the provider, the Postgres
//! cache and the fleet rate limiter -> finalised run). One test HTTP server speaking the OpenAI
//! chat-completions protocol answers both, deterministically, by looking at the output text.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use skilleval_providers::{DirCache, ProviderClients, ProviderConfig};

use crate::e2e::{
    assert_same, local_run_with, server_cases, start_worker_with_providers, wait_for_verdict,
};
use crate::helpers::{local_provider, only_provider, serve_local, spawn_app_with, AppOptions};
use crate::packages::{skill_md, zip_of};

/// The judge's answer to one chat request: rubric scores or assertion verdicts, decided by
/// markers in the output under judgement (never in the prompts or the rubric).
fn judge(body: &Value) -> Value {
    let text: String = skilleval_execution::fixtures::chat_user_text(body);
    let content = if body.to_string().contains("record_assertion_verdicts") {
        let verdict = |passed: bool, evidence: &str| {
            json!({
                "result": if passed { "pass" } else { "fail" },
                "confidence": "high",
                "evidence": evidence,
            })
        };
        json!({
            "assertions": [
                verdict(text.contains("March 14"), "March 14"),
                verdict(text.contains("Owner: Ana"), "Owner: Ana"),
            ],
            "factual_issues": [],
            "eval_critique": {"vague_assertions": [], "missing_coverage": [], "suggested_assertions": []}
        })
    } else {
        let (clarity, tone) = if text.contains("EXCELLENT") {
            (5, 90)
        } else if text.contains("MEDIOCRE") {
            (3, 60)
        } else {
            (1, 10)
        };
        json!({"criteria": [
            {"name": "clarity", "score": clarity, "reasoning": "judged by the test server"},
            {"name": "tone", "score": tone, "reasoning": "judged by the test server"}
        ]})
    };
    json!({
        "id": "chatcmpl-test",
        "model": "judge-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content.to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 200, "completion_tokens": 40}
    })
}

async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    Json(judge(&body))
}

/// Starts the judge on 127.0.0.1:0; returns its address, call counter and task.
pub(crate) async fn start_judge() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(calls.clone());
    let (addr, task) = serve_local(app).await;
    (addr, calls, task)
}

/// Recorded outputs (`given` runner), so only grading calls the model.
fn llm_package() -> Vec<u8> {
    llm_package_named("e2e-llm", "")
}

/// [`llm_package`] as skill `name`, `tag` appended to every recorded output (packages with
/// different tags ask the judge different questions; the verdicts are the same).
pub(crate) fn llm_package_named(name: &str, tag: &str) -> Vec<u8> {
    let rubric = json!({
        "criteria": [
            {"name": "clarity", "description": "Easy to follow", "weight": 0.6,
             "scale": {"min": 1, "max": 5, "descriptions": {"1": "confusing", "5": "crystal clear"}}},
            {"name": "tone", "description": "On brand", "weight": 0.4, "scale": "percent"}
        ],
        "passingThreshold": 0.7
    });
    let judged = |id: &str, output: &str| {
        json!({
            "id": id, "name": id,
            "input": {"prompt": "Write the launch note"},
            "expected": {"rubric": rubric},
            "evaluation": {"strategy": "llm_judge"},
            "given": {"output": format!("{output}{tag}")}
        })
    };
    let asserted = |id: &str, output: &str| {
        json!({
            "id": id, "name": id,
            "input": {"prompt": "Summarise the meeting"},
            "expected": {"assertions": ["The launch date is stated", "An owner is named"]},
            "evaluation": {"strategy": "assertions"},
            "given": {"output": format!("{output}{tag}")}
        })
    };
    let tests = json!({
        "version": "2.0",
        "profile": "creative",
        "settings": {"runner": "given"},
        "testCases": [
            judged("judge-excellent", "EXCELLENT: we launch with a clear plan."),
            judged("judge-mediocre", "MEDIOCRE: launching, some time."),
            judged("judge-poor", "meh"),
            asserted("assert-both", "We launch on March 14. Owner: Ana."),
            asserted("assert-one", "We launch on March 14."),
            {
                "id": "exact", "name": "exact",
                "input": {"prompt": "Say ok"},
                "expected": {"output": "ok"},
                "evaluation": {"strategy": "exact_match"},
                "given": {"output": "ok"}
            }
        ]
    });
    let tests = serde_json::to_vec_pretty(&tests).unwrap();
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        ("eval/tests.json", &tests),
    ])
}

#[tokio::test]
async fn an_llm_graded_package_gets_the_same_verdict_locally_and_through_the_service() {
    let (addr, calls, judge_task) = start_judge().await;
    let providers = only_provider(ProviderConfig {
        requests_per_minute: Some(1_000),
        tokens_per_minute: Some(10_000_000),
        ..local_provider(addr, "judge", "judge-model")
    });

    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let zip = llm_package();

    // Locally, as the CLI does: a folder cache and in-process limits.
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
    assert_eq!(local_calls, 5, "one judge call per model-graded case");
    assert_eq!(local_summary.errored, 0, "{local_cases:?}");
    assert!(
        local_summary.passed > 0 && local_summary.failed > 0,
        "{local_cases:?}"
    );

    // Through the service: a worker configured with the same provider.
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
        local_calls + 5,
        "the service graded with the same model (its Postgres cache started empty)"
    );
    // The worker's cache writes behind its model calls (batched, off the call's path): the
    // answers land shortly after the grades, so they are awaited, not read once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let cached = loop {
        let (cached,): (i64,) = sqlx::query_as("SELECT count(*) FROM llm_cache")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if cached >= 5 || std::time::Instant::now() > deadline {
            break cached;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        cached, 5,
        "the service cached each judge answer in Postgres"
    );
    let (granted,): (Option<i64>,) = sqlx::query_as(
        "SELECT sum(requests)::int8 FROM provider_rate_windows WHERE provider = 'judge'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        granted,
        Some(5),
        "every call went through the fleet limiter"
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    judge_task.abort();
    app.cleanup().await;
}
