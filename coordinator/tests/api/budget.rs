//! Per-run budget: results recorded as a worker would (through `Store::record_results`) add
//! their tokens and cost to the run; the batch that pushes a run over its `max_tokens` or
//! `max_cost_usd` stops the run with the reason, in the same transaction; the coordinator,
//! told by the batch's event, writes the rest of the run off as skipped with that reason, and
//! the run is finalised once with verdict `fail`. Bad caps are 422 naming the field; a run without
//! a budget is never stopped.

use serde_json::{json, Value};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::messages::CaseFinished;
use skilleval_infra::store::Store;
use skilleval_model::grade::Usage;
use uuid::Uuid;

use crate::helpers::{planned_jobs, spawn_app, TestApp};
use crate::packages::given_package;

/// Uploads a package of `cases` passing cases without running it and starts a run of it with
/// `extra` merged into the request body.
async fn run_with(app: &TestApp, name: &str, cases: usize, extra: Value) -> Uuid {
    let outputs = vec!["ok"; cases];
    let upload: Value = app
        .upload_zip(given_package(name, &outputs, json!({})), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let mut body = json!({ "version_id": upload["version_id"] });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    let response = app.post_json("/v1/runs", &body).await;
    assert_eq!(response.status().as_u16(), 202, "{body}");
    let created: Value = response.json().await.unwrap();
    let run_id = created["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run_id).await;
    run_id
}

/// A passing result for the case that spent `produce` producing and `grade` grading.
async fn spent(
    app: &TestApp,
    run_id: Uuid,
    case_id: &str,
    produce: Usage,
    grade: Usage,
) -> JobResult {
    let jobs = planned_jobs(app, run_id).await;
    let job = jobs.iter().find(|j| j.case.id == case_id).unwrap();
    let mut r = JobResult::skipped(job, "placeholder");
    r.status = CaseStatus::Passed;
    r.score = Some(1.0);
    r.details = json!({ "simulated": true });
    r.produce_usage = produce;
    r.grade_usage = grade;
    r
}

fn usage(input_tokens: u64, output_tokens: u64, cost_usd: f64) -> Usage {
    Usage {
        input_tokens,
        output_tokens,
        cost_usd,
    }
}

/// Records the batch as a worker does and returns the events it would publish.
async fn record(app: &TestApp, batch: &[JobResult]) -> Vec<CaseFinished> {
    Store::from_pool(app.pool.clone())
        .record_results(batch)
        .await
        .unwrap()
        .into_iter()
        .map(|c| CaseFinished {
            run_id: c.run_id,
            test_case_id: c.test_case_id,
            status: c.status,
        })
        .collect()
}

#[tokio::test]
async fn a_run_over_its_token_budget_skips_the_rest_and_fails_with_the_reason() {
    let app = spawn_app().await;
    let run_id = run_with(&app, "budgeted", 5, json!({ "max_tokens": 100 })).await;
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["budget"],
        json!({ "max_cost_usd": null, "max_tokens": 100 })
    );
    assert_eq!(run["usage"]["tokens"], 0);
    assert!(run["stop_reason"].is_null());

    // Each case spends 95 tokens (60 + 10 producing, 20 + 5 grading): the first batch of two
    // spends 190 > 100.
    let mut batch = Vec::new();
    for case in ["case-000", "case-001"] {
        batch.push(spent(&app, run_id, case, usage(60, 10, 0.01), usage(20, 5, 0.002)).await);
    }
    let events = record(&app, &batch).await;
    assert_eq!(events.len(), 2, "the batch itself is recorded");
    let reason = "budget exceeded: tokens 190 > 100 (max_tokens)";

    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["stop_reason"], reason, "{run}");
    assert_eq!(run["usage"]["tokens"], 190);
    assert!((run["usage"]["cost_usd"].as_f64().unwrap() - 0.024).abs() < 1e-9);
    assert_eq!(
        run["counters"],
        json!({ "total": 5, "completed": 2, "passed": 2, "failed": 0, "errored": 0, "skipped": 0 }),
        "the stop itself writes no row"
    );

    // Workers check before running a job: the stopped run's jobs do not run ...
    let store = Store::from_pool(app.pool.clone());
    assert!(store.is_cancelled(run_id).await.unwrap());
    // ... and what one that ran anyway records changes nothing, totals included.
    let late = spent(
        &app,
        run_id,
        "case-003",
        usage(1000, 0, 1.0),
        usage(0, 0, 0.0),
    )
    .await;
    assert!(record(&app, &[late]).await.is_empty());

    // The coordinator, told by the event, writes off the rest with the reason.
    app.state
        .aggregator
        .on_case_finished(&events[0])
        .await
        .unwrap();
    let skipped: Vec<(String, Value)> = sqlx::query_as(
        "SELECT test_case_id, details FROM eval_results
         WHERE run_id = $1 AND status = 'skipped' ORDER BY case_index",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let ids: Vec<&str> = skipped.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["case-002", "case-003", "case-004"]);
    for (_, details) in &skipped {
        assert_eq!(details["skipped"], reason);
    }
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["counters"],
        json!({ "total": 5, "completed": 5, "passed": 2, "failed": 0, "errored": 0, "skipped": 3 }),
        "the write-off counted exactly the rows it wrote"
    );

    // The run completed and was finalised once, failing with the stop as its first reason.
    assert!(!app.state.aggregator.finalise(run_id).await.unwrap());
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["verdict"], "fail");
    assert_eq!(run["usage"]["tokens"], 190);
    assert_eq!(run["counters"]["completed"], 5);
    let first = run["summary"]["verdict_reasons"][0].as_str().unwrap();
    assert!(
        first.contains(reason) && first.contains("3 case(s) not run"),
        "{first}"
    );
    let finalised = app
        .state
        .metrics
        .runs_finalised
        .get_or_create(&skilleval_coordinator::metrics::OutcomeLabels {
            outcome: "fail".into(),
        })
        .get();
    assert_eq!(finalised, 1, "finalised exactly once");
    app.cleanup().await;
}

#[tokio::test]
async fn a_cost_budget_stops_the_run_at_the_batch_that_passes_it_not_before() {
    let app = spawn_app().await;
    let run_id = run_with(&app, "priced", 4, json!({ "max_cost_usd": 0.05 })).await;
    let first = spent(
        &app,
        run_id,
        "case-000",
        usage(10, 10, 0.03),
        usage(0, 0, 0.02),
    )
    .await;
    record(&app, &[first]).await;
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert!(
        run["stop_reason"].is_null(),
        "reaching the cap is within it: {run}"
    );
    assert_eq!(run["counters"]["skipped"], 0);
    assert_eq!(run["status"], "running");

    let second = spent(
        &app,
        run_id,
        "case-001",
        usage(10, 10, 0.001),
        usage(0, 0, 0.0),
    )
    .await;
    let events = record(&app, &[second]).await;
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    let reason = run["stop_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("budget exceeded: cost_usd 0.051000 > 0.050000"),
        "{reason}"
    );
    assert_eq!(run["counters"]["passed"], 2);
    app.state
        .aggregator
        .on_case_finished(&events[0])
        .await
        .unwrap();
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["counters"]["passed"], 2);
    assert_eq!(run["counters"]["skipped"], 2);
    assert_eq!(run["counters"]["completed"], 4);
    assert_eq!(run["verdict"], "fail", "{run}");
    app.cleanup().await;
}

#[tokio::test]
async fn invalid_budget_values_are_422_naming_the_field() {
    let app = spawn_app().await;
    let upload: Value = app
        .upload_zip(given_package("capped", &["ok"], json!({})), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let version_id = &upload["version_id"];
    let cases = [
        (json!({ "max_cost_usd": 0 }), "/max_cost_usd"),
        (json!({ "max_cost_usd": -1.5 }), "/max_cost_usd"),
        (json!({ "max_tokens": 0 }), "/max_tokens"),
        (json!({ "max_tokens": -5 }), "/max_tokens"),
    ];
    for (extra, field) in cases {
        let mut body = json!({ "version_id": version_id });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let response = app.post_json("/v1/runs", &body).await;
        assert_eq!(response.status().as_u16(), 422, "{body}");
        let err: Value = response.json().await.unwrap();
        assert_eq!(err["error"]["details"]["field"], field, "{err}");
        assert!(
            err["error"]["details"]["rule"]
                .as_str()
                .is_some_and(|r| !r.is_empty()),
            "{err}"
        );
    }
    assert_eq!(app.count("runs").await, 0, "no run was created");
    app.cleanup().await;
}

#[tokio::test]
async fn a_run_without_a_budget_counts_spending_and_is_never_stopped() {
    let app = spawn_app().await;
    let run_id = run_with(&app, "unbudgeted", 3, json!({})).await;
    let batch = vec![
        spent(
            &app,
            run_id,
            "case-000",
            usage(1_000_000, 0, 50.0),
            usage(0, 0, 0.0),
        )
        .await,
        spent(&app, run_id, "case-001", usage(0, 0, 0.0), usage(5, 5, 0.5)).await,
    ];
    let events = record(&app, &batch).await;
    assert_eq!(events.len(), 2);
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["budget"],
        json!({ "max_cost_usd": null, "max_tokens": null })
    );
    assert_eq!(run["usage"]["tokens"], 1_000_010);
    assert!((run["usage"]["cost_usd"].as_f64().unwrap() - 50.5).abs() < 1e-9);
    assert!(run["stop_reason"].is_null());
    assert_eq!(run["status"], "running");
    assert_eq!(run["counters"]["completed"], 2);
    assert_eq!(run["counters"]["skipped"], 0);
    assert!(!Store::from_pool(app.pool.clone())
        .is_cancelled(run_id)
        .await
        .unwrap());

    let last = spent(&app, run_id, "case-002", usage(1, 1, 0.0), usage(0, 0, 0.0)).await;
    let events = record(&app, &[last]).await;
    app.state
        .aggregator
        .on_case_finished(&events[0])
        .await
        .unwrap();
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(run["verdict"], "pass", "{run}");
    assert_eq!(run["usage"]["tokens"], 1_000_012);
    app.cleanup().await;
}
