//! Aggregation: a complete run is finalised exactly once even when aggregators race, its
//! webhook arrives once with a valid signature; failFast stops a run at its first failure.

use std::time::Duration;

use serde_json::{json, Value};
use skilleval_coordinator::webhook;
use skilleval_execution::result::CaseStatus;

use crate::helpers::{record_as_worker, spawn_app, WebhookReceiver, WEBHOOK_SECRET};
use crate::packages::given_package;

#[tokio::test]
async fn finalisation_happens_exactly_once_when_aggregators_race() {
    let app = spawn_app().await;
    let hook = WebhookReceiver::start().await;
    let query = format!("?callback_url={}", urlencode(&hook.url));
    let upload: Value = app
        .upload_zip(
            given_package("raced", &["ok", "ok", "ok"], json!({})),
            &query,
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    let events = record_as_worker(
        &app,
        run_id,
        &[
            ("case-000", CaseStatus::Passed, 1.0),
            ("case-001", CaseStatus::Passed, 1.0),
            ("case-002", CaseStatus::Passed, 0.5),
        ],
    )
    .await;
    assert_eq!(events.len(), 3);

    // Two replicas' aggregators (clones share nothing but the database) finalise at once, and
    // event handlers and the sweep pile in too.
    let a = app.state.aggregator.clone();
    let b = app.state.aggregator.clone();
    let (ra, rb, rc, rd) = tokio::join!(
        a.finalise(run_id),
        b.finalise(run_id),
        a.on_case_finished(&events[2]),
        b.sweep()
    );
    // The event handler finalises too but does not say whether it won: count every win
    // through the finalisation counter all four share.
    let wins = [ra.unwrap(), rb.unwrap()].iter().filter(|w| **w).count() + rd.unwrap();
    rc.unwrap();
    assert!(wins <= 1, "{wins} finalisers won");
    let finalised = app
        .state
        .metrics
        .runs_finalised
        .get_or_create(&skilleval_coordinator::metrics::OutcomeLabels {
            outcome: "pass".into(),
        })
        .get();
    assert_eq!(finalised, 1, "exactly one finaliser wins");
    assert!(
        !a.finalise(run_id).await.unwrap(),
        "and later calls do nothing"
    );

    let deliveries = hook.wait_for(1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let deliveries_after = hook.received.lock().await.len();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(deliveries_after, 1, "the webhook is sent once");
    let (headers, body) = &deliveries[0];
    let signature = headers.get("x-skilleval-signature").expect("signed");
    assert!(
        webhook::verify(WEBHOOK_SECRET.as_bytes(), body, signature),
        "signature {signature}"
    );
    assert!(!webhook::verify(b"wrong", body, signature));
    let payload: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(payload["event"], "run.finished");
    assert_eq!(payload["run"]["run_id"], run_id.to_string());
    assert_eq!(payload["run"]["status"], "completed");
    assert_eq!(payload["run"]["verdict"], "pass");
    assert!((payload["run"]["summary"]["mean"].as_f64().unwrap() - 2.5 / 3.0).abs() < 1e-9);

    let finalised: (bool, String) =
        sqlx::query_as("SELECT finalised, status FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(finalised, (true, "completed".to_string()));
    app.cleanup().await;
}

#[tokio::test]
async fn fail_fast_skips_the_rest_of_the_run_at_the_first_failure() {
    let app = spawn_app().await;
    let upload: Value = app
        .upload_zip(
            given_package(
                "fast",
                &["no", "ok", "ok", "ok", "ok"],
                json!({ "failFast": true }),
            ),
            "",
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    let events = record_as_worker(&app, run_id, &[("case-000", CaseStatus::Failed, 0.0)]).await;
    app.state
        .aggregator
        .on_case_finished(&events[0])
        .await
        .unwrap();

    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["status"], "completed",
        "failFast completes the run: {run}"
    );
    assert_eq!(run["verdict"], "fail");
    assert_eq!(run["counters"]["failed"], 1);
    assert_eq!(run["counters"]["skipped"], 4);
    assert_eq!(run["counters"]["completed"], 5);
    let skipped: Vec<String> = sqlx::query_scalar(
        "SELECT test_case_id FROM eval_results WHERE run_id = $1 AND status = 'skipped' ORDER BY case_index",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        skipped,
        vec!["case-001", "case-002", "case-003", "case-004"]
    );
    // Workers that still hold those jobs change nothing.
    assert!(
        record_as_worker(&app, run_id, &[("case-003", CaseStatus::Passed, 1.0)])
            .await
            .is_empty()
    );

    // Without failFast a failure skips nothing.
    let upload: Value = app
        .upload_zip(given_package("slow", &["no", "ok"], json!({})), "")
        .await
        .json()
        .await
        .unwrap();
    let other: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(other).await;
    let events = record_as_worker(&app, other, &[("case-000", CaseStatus::Failed, 0.0)]).await;
    app.state
        .aggregator
        .on_case_finished(&events[0])
        .await
        .unwrap();
    let (_, run) = app.get_json(&format!("/v1/runs/{other}")).await;
    assert_eq!(run["status"], "running");
    assert_eq!(run["counters"]["skipped"], 0);
    app.cleanup().await;
}

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}
