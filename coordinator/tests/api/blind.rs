//! The blind comparator beside a comparison's statistics (issue 18): with a provider on the
//! coordinator and `comparator: true`, each paired case's two outputs are judged by a real
//! local HTTP model server, the order each pair is shown in drawn from a recorded seed, and
//! the verdicts summarised in the stored comparison (JSON and Markdown).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::e2e::{start_worker_with, wait_for_verdict};
use crate::helpers::{local_provider, only_provider, serve_local, spawn_app_with, AppOptions};
use crate::packages::given_package;

/// The comparator's judge: prefers whichever response says `better`, scoring every criterion
/// 5 for it and 2 for the other; counts its calls.
async fn judge(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    let text = body["messages"].to_string();
    // The comparator fences each response as data between `<<<marker BEGIN response_1>>>`
    // and `<<<marker END response_1>>>`.
    let first = text
        .split(" BEGIN response_1>>>")
        .nth(1)
        .and_then(|t| t.split(" END response_1>>>").next())
        .unwrap_or_default()
        .to_string();
    let (s1, s2, winner) = if first.contains("better") {
        (5, 2, "1")
    } else {
        (2, 5, "2")
    };
    let criteria: Vec<Value> = ["completeness", "coherence", "professionalism", "accuracy"]
        .iter()
        .map(|c| json!({"criterion": c, "score_1": s1, "score_2": s2, "justification_1": "j", "justification_2": "j"}))
        .collect();
    let answer = json!({"criteria": criteria, "winner": winner, "key_differentiators": ["one says better"], "summary": "Response with better wins."});
    Json(json!({
        "id": "chatcmpl-test",
        "model": "judge-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20}
    }))
}

async fn start_judge() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(judge))
        .with_state(calls.clone());
    let (addr, task) = serve_local(app).await;
    (addr, calls, task)
}

/// Which output each verdict of a blind comparison showed first (`A` or `B`), in order.
fn shown_first(blind: &Value) -> Vec<String> {
    blind["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["shown_first"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn the_blind_comparator_judges_each_pair_in_a_seeded_order_beside_the_statistics() {
    let (addr, calls, judge_task) = start_judge().await;
    let providers = only_provider(local_provider(addr, "judge", "judge-model"));
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        providers: Some(providers),
        ..AppOptions::default()
    })
    .await;
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), package_cache.path()).await;

    // Recorded outputs (`given`): no generation; the head's say `better`.
    let outputs_a = ["ok plain", "ok plain", "ok plain", "ok plain"];
    let outputs_b = ["ok better", "ok better", "ok better", "ok better"];
    let mut runs = Vec::new();
    for outputs in [outputs_a, outputs_b] {
        let upload: Value = app
            .upload_zip(given_package("blind", &outputs, json!({})), "")
            .await
            .json()
            .await
            .unwrap();
        let run_id = upload["run_id"].as_str().unwrap().to_string();
        assert_eq!(wait_for_verdict(&app, &run_id).await["status"], "completed");
        runs.push(run_id);
    }
    let before = calls.load(Ordering::SeqCst);

    let compare = |seed: u64, both: bool| {
        // The recorded outputs are part of each case's definition: `force` pairs them anyway.
        json!({"base": runs[0], "head": runs[1], "force": true, "comparator": true, "comparator_seed": seed, "both_orders": both})
    };
    let response = app.post_json("/v1/comparisons", &compare(7, false)).await;
    assert_eq!(response.status().as_u16(), 201);
    let c: Value = response.json().await.unwrap();
    let blind = &c["blind_comparator"];
    assert_eq!(blind["seed"], 7);
    assert_eq!(blind["pairs"], 4, "{blind}");
    assert_eq!(
        blind["wins_b"], 4,
        "the head's outputs win wherever they are shown: {blind}"
    );
    assert_eq!(blind["wins_a"], 0);
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        4,
        "one call per pair"
    );
    let orders = shown_first(blind);
    assert!(orders.iter().all(|o| o == "A" || o == "B"), "{orders:?}");
    assert!(
        orders.iter().any(|o| o == "A") && orders.iter().any(|o| o == "B"),
        "seed 7 shows some pairs each way round: {orders:?}"
    );
    // The statistics are still there, beside it.
    assert!(c["pass_rate"].is_object() && c["counts"].is_object(), "{c}");

    // The same seed shows the pairs in the same orders; both orders judge each twice.
    let orders_of_seed = |seed: u64| {
        let app = &app;
        let body = compare(seed, false);
        async move {
            let c: Value = app
                .post_json("/v1/comparisons", &body)
                .await
                .json()
                .await
                .unwrap();
            shown_first(&c["blind_comparator"])
        }
    };
    assert_eq!(orders, orders_of_seed(7).await);
    assert_ne!(
        orders,
        orders_of_seed(8).await,
        "another seed draws other orders"
    );
    let before = calls.load(Ordering::SeqCst);
    let both: Value = app
        .post_json("/v1/comparisons", &compare(7, true))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        calls.load(Ordering::SeqCst) - before,
        8,
        "two calls per pair"
    );
    assert_eq!(both["blind_comparator"]["position_consistent"], 4);

    // Stored: read again, as JSON and as Markdown.
    let id = c["comparison_id"].as_str().unwrap();
    let (status, stored) = app.get_json(&format!("/v1/comparisons/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(stored["blind_comparator"], c["blind_comparator"]);
    let md = app
        .get(&format!("/v1/comparisons/{id}?format=markdown"))
        .await
        .text()
        .await
        .unwrap();
    assert!(md.contains("### Blind comparator (judge-model)"), "{md}");
    assert!(md.contains("head (B) won 4"), "{md}");

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    judge_task.abort();
    app.cleanup().await;
}
