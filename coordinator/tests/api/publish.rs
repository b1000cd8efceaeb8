//! Publishing: a coordinator killed between commit and publish loses nothing (the sweeper
//! publishes after the grace period), and `maxConcurrentTests` holds jobs back until earlier
//! ones finish.

use std::time::Duration;

use serde_json::{json, Value};
use skilleval::executor::CaseStatus;
use skilleval::plan::CaseFilter;
use skilleval_coordinator::launch::RunRequest;

use crate::helpers::{record_as_worker, spawn_app_with, AppOptions};
use crate::packages::given_package;

#[tokio::test]
async fn a_run_committed_but_never_published_is_published_by_the_sweeper_after_the_grace_period() {
    let app = spawn_app_with(AppOptions {
        publish_grace_secs: 2,
        ..AppOptions::default()
    })
    .await;
    let upload: Value = app
        .upload_zip(
            given_package("crashy", &["ok", "ok", "ok"], json!({})),
            "?run=false",
        )
        .await
        .json()
        .await
        .unwrap();
    let version_id = upload["version_id"].as_str().unwrap().parse().unwrap();

    // What a coordinator killed right after the commit leaves behind: the transaction that
    // inserts the run and its rows, and no publish.
    let request = RunRequest {
        version_id,
        filter: CaseFilter::default(),
        kind: "manual",
        ..RunRequest::default()
    };
    let mut tx = app.pool.begin().await.unwrap();
    let run_id = app
        .state
        .launcher
        .insert(&mut tx, &request)
        .await
        .unwrap()
        .run_id();
    tx.commit().await.unwrap();

    let unpublished = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM eval_results WHERE run_id = $1 AND status = 'queued' AND published_at IS NULL",
        )
        .bind(run_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
    };
    assert_eq!(unpublished().await, 3);
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);

    // Within the grace period the sweeper leaves the rows alone (their publisher may be busy).
    assert_eq!(app.state.launcher.sweep_unpublished().await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    assert_eq!(app.state.launcher.sweep_unpublished().await.unwrap(), 3);
    assert_eq!(unpublished().await, 0);
    assert_eq!(app.wait_for_jobs(3).await, 3);
    let jobs = app.drain_jobs().await;
    assert!(jobs.iter().all(|j| j.run_id == run_id));
    // Nothing left to sweep.
    assert_eq!(app.state.launcher.sweep_unpublished().await.unwrap(), 0);
    app.cleanup().await;
}

#[tokio::test]
async fn the_background_sweeper_publishes_on_its_own() {
    let app = spawn_app_with(AppOptions {
        background: true,
        publish_grace_secs: 1,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let upload: Value = app
        .upload_zip(
            given_package("swept", &["ok", "ok"], json!({})),
            "?run=false",
        )
        .await
        .json()
        .await
        .unwrap();
    let request = RunRequest {
        version_id: upload["version_id"].as_str().unwrap().parse().unwrap(),
        kind: "manual",
        ..RunRequest::default()
    };
    let mut tx = app.pool.begin().await.unwrap();
    app.state.launcher.insert(&mut tx, &request).await.unwrap();
    tx.commit().await.unwrap();
    let mut depth = 0;
    for _ in 0..60 {
        depth = app.queue_depth(&app.topology.jobs_queue()).await;
        if depth == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(depth, 2);
    app.cleanup().await;
}

#[tokio::test]
async fn max_concurrent_tests_publishes_more_as_earlier_cases_finish() {
    let app = spawn_app_with(AppOptions::default()).await;
    let upload: Value = app
        .upload_zip(
            given_package("capped", &["ok"; 5], json!({ "maxConcurrentTests": 2 })),
            "",
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        app.wait_for_jobs(2).await,
        2,
        "only the cap is published at first"
    );
    let first: Vec<String> = app
        .drain_jobs()
        .await
        .into_iter()
        .map(|j| j.case.id)
        .collect();
    assert_eq!(first, vec!["case-000", "case-001"]);
    // The sweeper respects the cap too.
    tokio::time::sleep(Duration::from_millis(50)).await;
    app.state.launcher.release(run_id).await.unwrap();
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);

    for event in record_as_worker(&app, run_id, &[("case-000", CaseStatus::Passed, 1.0)]).await {
        app.state.aggregator.on_case_finished(&event).await.unwrap();
    }
    assert_eq!(
        app.wait_for_jobs(1).await,
        1,
        "one finished, one more released"
    );
    let next: Vec<String> = app
        .drain_jobs()
        .await
        .into_iter()
        .map(|j| j.case.id)
        .collect();
    assert_eq!(next, vec!["case-002"]);
    app.cleanup().await;
}

#[tokio::test]
async fn a_run_larger_than_a_release_page_is_published_whole_each_job_once() {
    let app = spawn_app_with(AppOptions::default()).await;
    let n = skilleval_coordinator::launch::RELEASE_PAGE * 2 + 7;
    let outputs = vec!["ok"; n];
    let upload: Value = app
        .upload_zip(given_package("paged", &outputs, json!({})), "")
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    // The upload answers once every page is confirmed and marked.
    let unpublished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM eval_results WHERE run_id = $1 AND published_at IS NULL",
    )
    .bind(run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(unpublished, 0);
    // `published_at` is when each page was sent: after the run was created, before now.
    let out_of_order: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM eval_results e JOIN runs r ON r.id = e.run_id
         WHERE e.run_id = $1 AND (e.published_at < r.created_at OR e.published_at > now())",
    )
    .bind(run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(out_of_order, 0);
    assert_eq!(app.wait_for_jobs(n as u32).await, n as u32);
    let jobs = app.drain_jobs().await;
    assert_eq!(jobs.len(), n);
    let mut indexes: Vec<u32> = jobs.iter().map(|j| j.case_index).collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), n, "every case published exactly once");
    assert!(jobs.iter().all(|j| j.run_id == run_id));
    // A second release finds nothing left to publish.
    assert_eq!(app.state.launcher.release(run_id).await.unwrap(), 0);
    app.cleanup().await;
}
