//! Re-scoring (issue 18): a `rescore` run grades a completed run's stored outputs against
//! another version's definition without producing them again. The outputs come from a real
//! local HTTP model server (the `llm` runner); the rescore makes no call to it, its verdicts
//! follow the new criteria, and the source run is left as it was.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};
use skilleval_providers::ProviderConfig;

use crate::e2e::{server_cases, start_worker_with_providers, wait_for_verdict};
use crate::helpers::{local_provider, only_provider, serve_local, spawn_app_with, AppOptions};
use crate::packages::zip_of;

/// The model: answers `ok` to a prompt marked `(even)`, `no` otherwise; counts every call.
async fn generate(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    let answer = if body["messages"].to_string().contains("(even)") {
        "ok"
    } else {
        "no"
    };
    Json(json!({
        "id": "chatcmpl-test",
        "model": "gen-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 1}
    }))
}

async fn start_model() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(generate))
        .with_state(calls.clone());
    let (addr, task) = serve_local(app).await;
    (addr, calls, task)
}

/// Four cases produced by the `llm` runner, each expecting `expected`; `prefix` names them.
/// Their prompts differ, so the response cache never answers one case with another's call.
fn llm_package(body: &str, prefix: &str, expected: &str) -> Vec<u8> {
    let cases: Vec<Value> = (0..4)
        .map(|i| {
            let parity = if i % 2 == 0 { "even" } else { "odd" };
            json!({
                "id": format!("{prefix}-{i}"),
                "name": format!("Case {i}"),
                "input": { "prompt": format!("Answer ({parity}), case {i}") },
                "expected": { "output": expected },
                "evaluation": { "strategy": "exact_match" },
            })
        })
        .collect();
    let tests = json!({
        "version": "2.0", "profile": "deterministic",
        "settings": { "runner": "llm" },
        "testCases": cases,
    });
    let skill = format!("---\nname: rescored\ndescription: Rescored outputs.\n---\n\n{body}\n");
    zip_of(&[
        ("SKILL.md", skill.as_bytes()),
        ("eval/tests.json", &serde_json::to_vec(&tests).unwrap()),
    ])
}

#[tokio::test]
async fn a_rescore_grades_stored_outputs_again_without_producing_them() {
    let (addr, calls, model) = start_model().await;
    let providers = only_provider(ProviderConfig {
        requests_per_minute: Some(1_000),
        tokens_per_minute: Some(10_000_000),
        ..local_provider(addr, "gen", "gen-model")
    });
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;

    // v1 produces the outputs: the even cases answer `ok` and pass.
    let upload = app.upload_zip(llm_package("One.", "c", "ok"), "").await;
    assert_eq!(upload.status().as_u16(), 201);
    let upload: Value = upload.json().await.unwrap();
    let source = upload["run_id"].as_str().unwrap().to_string();
    let run = wait_for_verdict(&app, &source).await;
    assert_eq!(run["status"], "completed", "{run}");
    let produced = calls.load(Ordering::SeqCst);
    assert_eq!(produced, 4, "one generation per case");
    let before = server_cases(&app, &source).await;
    let status = |cases: &crate::e2e::CaseScores, id: &str| cases[id].0.clone();
    assert_eq!(status(&before, "c-0"), "passed");
    assert_eq!(status(&before, "c-1"), "failed");
    let (_, source_results) = app
        .get_json(&format!("/v1/runs/{source}/results?limit=1000"))
        .await;

    // v2 expects `no`: the same outputs, graded against it.
    let v2: Value = app
        .upload_zip(llm_package("Two.", "c", "no"), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let v2 = v2["version_id"].as_str().unwrap().to_string();
    let (status_code, plan) = {
        let r = app
            .post_json(
                &format!("/v1/runs/{source}/rescore"),
                &json!({ "version_id": v2, "dry_run": true }),
            )
            .await;
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status_code, 200, "{plan}");
    let doc = crate::openapi::doc();
    crate::openapi::check(&doc, "post", "/v1/runs/{id}/rescore", 200, &plan);
    assert_eq!(plan["cases"], 4);
    assert_eq!(plan["generation_calls"], 0);
    assert_eq!(plan["judge_calls"], 0);
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "version_id": v2 }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 202);
    let created: Value = response.json().await.unwrap();
    crate::openapi::check(&doc, "post", "/v1/runs/{id}/rescore", 202, &created);
    let rescore = created["run_id"].as_str().unwrap().to_string();
    let run = wait_for_verdict(&app, &rescore).await;
    assert_eq!(run["kind"], "rescore");
    assert_eq!(run["status"], "completed", "{run}");
    let after = server_cases(&app, &rescore).await;
    for (id, was, now) in [
        ("c-0", "passed", "failed"),
        ("c-1", "failed", "passed"),
        ("c-2", "passed", "failed"),
        ("c-3", "failed", "passed"),
    ] {
        assert_eq!(status(&before, id), was);
        assert_eq!(status(&after, id), now, "{id} graded against v2");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        produced,
        "the rescore made no generation call"
    );
    let (_, source_again) = app
        .get_json(&format!("/v1/runs/{source}/results?limit=1000"))
        .await;
    assert_eq!(source_again, source_results, "the source run is unchanged");

    // A definition sharing no case with the source has nothing to rescore; an unknown run is
    // not found.
    let v3: Value = app
        .upload_zip(llm_package("Three.", "other", "ok"), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "version_id": v3["version_id"] }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    crate::openapi::check(&doc, "post", "/v1/runs/{id}/rescore", 422, &body);
    assert_eq!(body["error"]["code"], "nothing_to_rescore", "{body}");
    let other: Value = app
        .upload_zip(
            crate::packages::given_package("another-skill", &["ok"], json!({})),
            "?run=false",
        )
        .await
        .json()
        .await
        .unwrap();
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "version_id": other["version_id"] }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/version_id", "{body}");
    let response = app
        .post_json(
            &format!("/v1/runs/{}/rescore", uuid::Uuid::now_v7()),
            &json!({}),
        )
        .await;
    assert_eq!(response.status().as_u16(), 404);

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    model.abort();
    app.cleanup().await;
}

/// The v2 definition of [`llm_package`]'s four cases expecting `expected`.
fn inline_tests(prefix: &str, expected: &str) -> Value {
    let cases: Vec<Value> = (0..4)
        .map(|i| {
            let parity = if i % 2 == 0 { "even" } else { "odd" };
            json!({
                "id": format!("{prefix}-{i}"),
                "name": format!("Case {i}"),
                "input": { "prompt": format!("Answer ({parity}), case {i}") },
                "expected": { "output": expected },
                "evaluation": { "strategy": "exact_match" },
            })
        })
        .collect();
    json!({
        "version": "2.0", "profile": "deterministic",
        "settings": { "runner": "llm" },
        "testCases": cases,
    })
}

#[tokio::test]
async fn a_rescore_grades_stored_outputs_against_an_inline_eval_config() {
    let (addr, calls, model) = start_model().await;
    let providers = only_provider(local_provider(addr, "gen", "gen-model"));
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;

    let upload: Value = app
        .upload_zip(llm_package("One.", "c", "ok"), "")
        .await
        .json()
        .await
        .unwrap();
    let source = upload["run_id"].as_str().unwrap().to_string();
    let run = wait_for_verdict(&app, &source).await;
    assert_eq!(run["status"], "completed", "{run}");
    let produced = calls.load(Ordering::SeqCst);
    assert_eq!(produced, 4);
    let before = server_cases(&app, &source).await;
    let (_, versions_before) = app.get_json("/v1/skills/rescored/versions").await;

    // An invalid definition is refused like an upload's: every problem, with its pointer.
    let mut bad = inline_tests("c", "no");
    bad["testCases"][1]["evaluation"]["strategy"] = json!("no_such_strategy");
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "eval_config": bad }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    let problems = body["error"]["details"]["problems"].as_array().unwrap();
    assert!(
        problems.iter().any(|p| p["file"] == "eval_config"
            && p["pointer"]
                .as_str()
                .unwrap()
                .starts_with("/testCases/1/evaluation/strategy")),
        "{body}"
    );
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "eval_config": inline_tests("c", "no"), "version_id": upload["version_id"] }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/eval_config", "{body}");

    // A valid one grades the stored outputs: every verdict flips, nothing is produced.
    let response = app
        .post_json(
            &format!("/v1/runs/{source}/rescore"),
            &json!({ "eval_config": inline_tests("c", "no") }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 202);
    let created: Value = response.json().await.unwrap();
    let rescore = created["run_id"].as_str().unwrap().to_string();
    let run = wait_for_verdict(&app, &rescore).await;
    assert_eq!(run["kind"], "rescore");
    assert_eq!(run["status"], "completed", "{run}");
    let after = server_cases(&app, &rescore).await;
    for id in ["c-0", "c-1", "c-2", "c-3"] {
        assert_ne!(
            after[id].0, before[id].0,
            "{id} graded against the inline definition"
        );
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        produced,
        "the rescore made no generation call"
    );
    // The run keeps its definition: listing its plan again reads it, not the version's.
    let (_, page) = app
        .get_json(&format!("/v1/runs/{rescore}/results?status=queued"))
        .await;
    assert_eq!(page["results"], json!([]));
    let (_, versions_after) = app.get_json("/v1/skills/rescored/versions").await;
    let ids = |doc: &Value| -> Vec<Value> {
        doc["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["version_id"].clone())
            .collect()
    };
    assert_eq!(
        ids(&versions_after),
        ids(&versions_before),
        "an inline definition is no new version"
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    model.abort();
    app.cleanup().await;
}
