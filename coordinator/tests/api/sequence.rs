//! Suites with `runInSequence` in the service: a chain's first case is published with the rest
//! of the run at its creation, each next one only once the one before it is recorded; the
//! run's other cases are not held back. A lost event (a coordinator that died between a result
//! and the next publish) and a cursor that never moved after a confirm are repaired by the
//! sweeper, which never publishes a case before the one ahead of it is recorded and skips
//! nothing. With a real worker, each case of
//! the chain starts after the one before it finished.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use skilleval_execution::result::CaseStatus;
use skilleval_infra::messages::CasesFinished;
use uuid::Uuid;

use crate::e2e::{start_worker_with, wait_for_verdict};
use crate::helpers::{record_as_worker, spawn_app_with, AppOptions, TestApp};
use crate::packages::{given_tests, skill_md, zip_of};

/// A `given` package of `n` passing cases (`case-000`, ...) whose suite `ordered` runs the
/// cases `order` in sequence, in that order; a second suite lists other cases without it.
fn sequenced_package(name: &str, n: usize, order: &[usize]) -> Vec<u8> {
    let mut tests = given_tests(&vec!["ok"; n], json!({}));
    let ids: Vec<String> = order.iter().map(|i| format!("case-{i:03}")).collect();
    tests["suites"] = json!([
        {"name": "loose", "testIds": ["case-000", "case-002"]},
        {"name": "ordered", "testIds": ids, "runInSequence": true},
    ]);
    let tests = serde_json::to_vec_pretty(&tests).unwrap();
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        ("eval/tests.json", &tests),
    ])
}

async fn upload_run(app: &TestApp, zip: Vec<u8>) -> Uuid {
    let response = app.upload_zip(zip, "").await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    let run_id: Uuid = body["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run_id).await;
    run_id
}

/// The ids of the jobs in the queue once `n` are there (sorted); the queue is emptied.
async fn queued(app: &TestApp, n: u32) -> Vec<String> {
    assert_eq!(app.wait_for_jobs(n).await, n);
    let mut ids: Vec<String> = app
        .drain_jobs()
        .await
        .into_iter()
        .map(|j| j.case.id)
        .collect();
    ids.sort();
    ids
}

/// The run's chain cursors, in chain order.
async fn cursors(app: &TestApp, run_id: Uuid) -> Vec<(i32, i32)> {
    sqlx::query_as("SELECT published, length FROM run_sequences WHERE run_id = $1 ORDER BY chain")
        .bind(run_id)
        .fetch_all(&app.pool)
        .await
        .unwrap()
}

/// Records the case as a worker does and hands its event to the aggregator.
async fn finish(app: &TestApp, run_id: Uuid, case: &str) {
    let events = record_as_worker(app, run_id, &[(case, CaseStatus::Passed, 1.0)]).await;
    assert_eq!(events.len(), 1, "{case} recorded once");
    app.state
        .aggregator
        .on_cases_finished(&CasesFinished::from(events[0].clone()))
        .await
        .unwrap();
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

#[tokio::test]
async fn a_sequence_publishes_its_next_case_once_the_one_before_is_recorded_and_the_rest_at_once() {
    let app = spawn_app_with(AppOptions::default()).await;
    let run_id = upload_run(&app, sequenced_package("in-order", 6, &[4, 1, 3])).await;
    // At creation: every case outside the chain, and the chain's first case only.
    assert_eq!(
        queued(&app, 4).await,
        ids(&["case-000", "case-002", "case-004", "case-005"])
    );
    assert_eq!(cursors(&app, run_id).await, vec![(1, 3)]);
    // The run's other cases finishing publishes nothing of the chain.
    finish(&app, run_id, "case-000").await;
    finish(&app, run_id, "case-005").await;
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);
    // The chain's first case recorded: its second, and nothing else.
    finish(&app, run_id, "case-004").await;
    assert_eq!(queued(&app, 1).await, ids(&["case-001"]));
    finish(&app, run_id, "case-001").await;
    assert_eq!(queued(&app, 1).await, ids(&["case-003"]));
    assert_eq!(cursors(&app, run_id).await, vec![(3, 3)]);
    finish(&app, run_id, "case-003").await;
    finish(&app, run_id, "case-002").await;
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);
    let (status, rows): (String, i64) = sqlx::query_as(
        "SELECT status, (SELECT count(*) FROM eval_results WHERE run_id = $1) FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((status.as_str(), rows), ("completed", 6));
    app.cleanup().await;
}

#[tokio::test]
async fn a_next_case_lost_to_a_crash_is_published_by_the_sweeper_in_order_and_each_case_recorded_once(
) {
    let app = spawn_app_with(AppOptions {
        publish_grace_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let run_id = upload_run(&app, sequenced_package("crashy-order", 5, &[1, 3, 4])).await;
    assert_eq!(
        queued(&app, 3).await,
        ids(&["case-000", "case-001", "case-002"])
    );
    finish(&app, run_id, "case-000").await;
    finish(&app, run_id, "case-002").await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let sweeper = &app.state.sweeper;
    // The chain's case in flight is not recorded: nothing is due.
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);

    // The coordinator dies after the worker recorded case-001, before it published the next
    // (the event is never handled): the sweeper publishes case-003, once.
    record_as_worker(&app, run_id, &[("case-001", CaseStatus::Passed, 1.0)]).await;
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 1);
    assert_eq!(queued(&app, 1).await, ids(&["case-003"]));
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);
    assert_eq!(cursors(&app, run_id).await, vec![(2, 3)]);

    // A pass that died after case-003's confirm, before its cursor moved: the cursor is
    // still at it. Publishing is at least once: the sweeper publishes case-003 again (the
    // same case: never the one after it, whose turn has not come).
    let rewind = || async {
        sqlx::query("UPDATE run_sequences SET published = 1 WHERE run_id = $1")
            .bind(run_id)
            .execute(&app.pool)
            .await
            .unwrap();
    };
    rewind().await;
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 1);
    assert_eq!(queued(&app, 1).await, ids(&["case-003"]));
    // The same, when case-003 was recorded before the sweeper came: it moves the cursor past
    // the recorded case without publishing it, and publishes case-004.
    rewind().await;
    record_as_worker(&app, run_id, &[("case-003", CaseStatus::Passed, 1.0)]).await;
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 1);
    assert_eq!(queued(&app, 1).await, ids(&["case-004"]));
    assert_eq!(cursors(&app, run_id).await, vec![(3, 3)]);

    record_as_worker(&app, run_id, &[("case-004", CaseStatus::Passed, 1.0)]).await;
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);
    assert_eq!(app.state.aggregator.sweep().await.unwrap(), 1);
    let per_case: Vec<(String, i64)> = sqlx::query_as(
        "SELECT test_case_id, count(*) FROM eval_results WHERE run_id = $1
         GROUP BY test_case_id ORDER BY test_case_id",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let want: Vec<(String, i64)> = (0..5).map(|i| (format!("case-{i:03}"), 1)).collect();
    assert_eq!(per_case, want, "exactly one row per case");
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed", "{run}");
    app.cleanup().await;
}

#[tokio::test]
async fn with_a_worker_each_case_of_a_sequence_starts_after_the_one_before_it_finished() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    let order = [6, 2, 7, 0, 4];
    let run_id = upload_run(&app, sequenced_package("worked-order", 8, &order)).await;
    let run = wait_for_verdict(&app, &run_id.to_string()).await;
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["counters"]["passed"], 8, "{run}");
    type Times = (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>);
    let rows: Vec<(
        String,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    )> = sqlx::query_as(
        "SELECT test_case_id, started_at, finished_at FROM eval_results WHERE run_id = $1",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 8, "one row per case");
    let times: BTreeMap<String, Times> = rows
        .into_iter()
        .map(|(id, started, finished)| (id, (started, finished)))
        .collect();
    let chain: Vec<&Times> = order
        .iter()
        .map(|i| &times[&format!("case-{i:03}")])
        .collect();
    for (k, pair) in chain.windows(2).enumerate() {
        assert!(
            pair[1].0 >= pair[0].1,
            "case {} of the sequence started at {} before case {} finished at {}",
            k + 1,
            pair[1].0,
            k,
            pair[0].1
        );
    }
    // The cases outside the sequence were not held back behind it: each started before the
    // sequence's second case did (they were all queued at the creation, that case only after
    // its first finished).
    for lone in [1, 3, 5] {
        let (started, _) = times[&format!("case-{lone:03}")];
        assert!(
            started < chain[1].0,
            "case {lone} started at {started}, after the sequence's second case ({})",
            chain[1].0
        );
    }
    stop.cancel();
    worker.await.unwrap();
    app.cleanup().await;
}
