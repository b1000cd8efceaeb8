//! Publishing: a run is committed with its plan and published from it chunk by chunk; a
//! coordinator killed before or during that loses nothing (the sweeper resumes from the
//! published watermark after the grace period), a stop while it is published writes the
//! never-recorded cases off, and `maxConcurrentTests` holds jobs back until earlier ones
//! finish.

use std::time::Duration;

use serde_json::{json, Value};
use skilleval_coordinator::db;
use skilleval_coordinator::runs::plan::{PreparedRun, RunRequest, PUBLISH_CHUNK};
use skilleval_execution::result::CaseStatus;
use skilleval_infra::store::lifecycle::RunKind;
use uuid::Uuid;

use crate::helpers::{record_as_worker, spawn_app, spawn_app_with, AppOptions, TestApp};
use crate::packages::given_package;

/// The run's status and watermark, and how many rows it has.
async fn publishing(app: &TestApp, run_id: Uuid) -> (String, i32, i64) {
    sqlx::query_as(
        "SELECT status, published_through,
                (SELECT count(*) FROM eval_results WHERE run_id = $1)
         FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_run_committed_but_never_published_is_published_by_the_sweeper_after_the_grace_period() {
    let app = spawn_app_with(AppOptions {
        publish_grace_secs: 2,
        ..AppOptions::default()
    })
    .await;
    let version_id = stored_version(&app, "crashy", 3).await;
    // What a coordinator killed right after the commit leaves behind: the run and its plan
    // committed, still `creating`, nothing published.
    let (_, inserted) = committed_run(&app, version_id).await;
    let run_id = inserted.run_id();
    let sweeper = &app.state.sweeper;
    assert_eq!(publishing(&app, run_id).await, ("creating".into(), 0, 0));
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);

    // Within the grace period the sweeper leaves the run alone (its creator may be busy).
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);
    assert_eq!(publishing(&app, run_id).await, ("creating".into(), 0, 0));
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    // After it, nobody holds the run's lock: the sweeper plans it again and publishes it
    // from the watermark, and the creation ends.
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 3);
    assert_eq!(publishing(&app, run_id).await, ("running".into(), 3, 0));
    assert_eq!(app.wait_for_jobs(3).await, 3);
    let jobs = app.drain_jobs().await;
    assert!(jobs.iter().all(|j| j.run_id == run_id));
    // Nothing left to sweep.
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);
    app.cleanup().await;
}

#[tokio::test]
async fn a_creation_cut_off_midway_is_resumed_from_the_watermark_and_publishes_only_what_is_not_recorded(
) {
    let app = spawn_app_with(AppOptions {
        publish_grace_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let version_id = stored_version(&app, "midway", 5).await;
    let (_, inserted) = committed_run(&app, version_id).await;
    let run_id = inserted.run_id();
    let sweeper = &app.state.sweeper;
    // The creator published a first chunk (cases 0-1) and recorded its confirms, published
    // a second (cases 2-3) whose confirms it never recorded, and died; a worker recorded
    // case 3 meanwhile.
    let mut conn = app.pool.acquire().await.unwrap();
    let store = &app.state.store;
    store.advance_published(&mut conn, run_id, 2).await.unwrap();
    record_as_worker(&app, run_id, &[("case-003", CaseStatus::Passed, 1.0)]).await;
    // A live creator holds the run's lock: the sweeper leaves the run alone, grace or not.
    store.lock_publishing(&mut conn, run_id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 0);
    store.unlock_publishing(&mut conn, run_id).await.unwrap();

    // From the watermark: case 2 (unconfirmed) and 4 (never published); case 3 is recorded.
    assert_eq!(sweeper.sweep_unpublished().await.unwrap(), 2);
    assert_eq!(app.wait_for_jobs(2).await, 2);
    let mut published: Vec<u32> = app
        .drain_jobs()
        .await
        .iter()
        .map(|j| j.case_index)
        .collect();
    published.sort_unstable();
    assert_eq!(published, vec![2, 4]);
    assert_eq!(publishing(&app, run_id).await, ("running".into(), 5, 1));
    drop(conn);
    app.cleanup().await;
}

#[tokio::test]
async fn a_run_cancelled_while_it_is_created_writes_off_the_cases_not_recorded_and_finalises() {
    let app = spawn_app().await;
    let version_id = stored_version(&app, "cut", 5).await;
    let (prepared, inserted) = committed_run(&app, version_id).await;
    let run_id = inserted.run_id();
    // Two cases are published and one recorded when the run is cancelled; the creator then
    // goes on.
    let mut conn = app.pool.acquire().await.unwrap();
    app.state
        .store
        .advance_published(&mut conn, run_id, 2)
        .await
        .unwrap();
    drop(conn);
    record_as_worker(&app, run_id, &[("case-000", CaseStatus::Passed, 1.0)]).await;
    app.state.store.cancel(run_id).await.unwrap();
    assert_eq!(app.state.sweeper.write_off(run_id).await.unwrap(), 4);
    app.state
        .publisher
        .start(prepared, inserted)
        .unwrap()
        .await
        .unwrap();

    assert_eq!(
        app.queue_depth(&app.topology.jobs_queue()).await,
        0,
        "nothing published"
    );
    let rows: Vec<(String, String, Value)> = sqlx::query_as(
        "SELECT test_case_id, status, details FROM eval_results WHERE run_id = $1 ORDER BY case_index",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_eq!(rows[0].1, "passed");
    assert!(rows[1..]
        .iter()
        .all(|(_, status, details)| status == "skipped"
            && details["skipped"] == "the run was cancelled"));
    assert_eq!(app.state.aggregator.sweep().await.unwrap(), 1);
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["counters"]["skipped"], 4, "{run}");
    assert_eq!(run["counters"]["completed"], 5, "{run}");
    app.cleanup().await;
}

#[tokio::test]
async fn a_run_cancelled_before_its_creation_starts_writes_off_every_chunk() {
    let app = spawn_app().await;
    // More than one chunk: the write-off plans every chunk of the run.
    let n = PUBLISH_CHUNK + 3;
    let version_id = stored_version(&app, "cut-large", n).await;
    let (prepared, inserted) = committed_run(&app, version_id).await;
    let run_id = inserted.run_id();
    app.state.store.cancel(run_id).await.unwrap();
    let written = app.state.sweeper.write_off(run_id).await.unwrap();
    assert_eq!(written, i64::try_from(n).unwrap());
    app.state
        .publisher
        .start(prepared, inserted)
        .unwrap()
        .await
        .unwrap();

    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);
    let (rows, skipped, first, last): (i64, i64, i32, i32) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'skipped'
                                              AND details->>'skipped' = 'the run was cancelled'),
                min(case_index), max(case_index)
         FROM eval_results WHERE run_id = $1",
    )
    .bind(run_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let n = i64::try_from(n).unwrap();
    assert_eq!((rows, skipped), (n, n));
    assert_eq!((i64::from(first), i64::from(last)), (0, n - 1));
    // A second write-off writes nothing twice.
    assert_eq!(app.state.sweeper.write_off(run_id).await.unwrap(), 0);
    assert_eq!(app.state.aggregator.sweep().await.unwrap(), 1);
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["counters"]["skipped"], n, "{run}");
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
    let version_id = stored_version(&app, "swept", 2).await;
    committed_run(&app, version_id).await;
    let mut depth = 0;
    for _ in 0..300 {
        depth = app.queue_depth(&app.topology.jobs_queue()).await;
        if depth == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(depth, 2, "hang guard: waited up to 30 s");
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
    app.wait_created(run_id).await;
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
    app.state.publisher.release(run_id).await.unwrap();
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
    let n = PUBLISH_CHUNK * 2 + 7;
    let outputs = vec!["ok"; n];
    let upload: Value = app
        .upload_zip(given_package("paged", &outputs, json!({})), "")
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    // The upload answers at once; its run is published in the background, the watermark
    // moving chunk by chunk over the whole run, and no case has a row before its outcome.
    app.wait_created(run_id).await;
    assert_eq!(
        publishing(&app, run_id).await,
        ("running".into(), n as i32, 0)
    );
    assert_eq!(app.wait_for_jobs(n as u32).await, n as u32);
    let jobs = app.drain_jobs().await;
    assert_eq!(jobs.len(), n);
    let mut indexes: Vec<u32> = jobs.iter().map(|j| j.case_index).collect();
    indexes.sort_unstable();
    indexes.dedup();
    assert_eq!(indexes.len(), n, "every case published exactly once");
    assert!(jobs.iter().all(|j| j.run_id == run_id));
    // A second release finds nothing left to publish.
    assert_eq!(app.state.publisher.release(run_id).await.unwrap(), 0);
    app.cleanup().await;
}

#[tokio::test]
async fn a_filtered_run_of_a_large_stored_definition_gets_exactly_its_cases_each_once() {
    let app = spawn_app().await;
    let n = PUBLISH_CHUNK * 2 + 7;
    // Every third case tagged `slow`: the run's chunks are planned from the stored text
    // across the definition's pages, and the last one is short.
    let mut tests = crate::packages::given_tests(&vec!["ok"; n], json!({}));
    for (i, case) in tests["testCases"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        if i % 3 == 0 {
            case["tags"] = json!(["slow"]);
        }
    }
    let zip = crate::packages::zip_of(&[
        ("SKILL.md", crate::packages::skill_md("filtered").as_bytes()),
        ("eval/tests.json", &serde_json::to_vec(&tests).unwrap()),
    ]);
    let upload: Value = app
        .upload_zip(zip, "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let created = app
        .post_json(
            "/v1/runs",
            &json!({ "version_id": upload["version_id"], "tags": ["slow"] }),
        )
        .await;
    assert_eq!(created.status().as_u16(), 202);
    let created: Value = created.json().await.unwrap();
    let run_id: Uuid = created["run_id"].as_str().unwrap().parse().unwrap();
    let expected: Vec<u32> = (0..n as u32).filter(|i| i % 3 == 0).collect();
    let want = expected.len();
    assert_eq!(app.wait_for_jobs(want as u32).await, want as u32);
    let jobs = app.drain_jobs().await;
    let mut indexes: Vec<u32> = jobs.iter().map(|j| j.case_index).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, expected, "the tagged cases, each once");
    assert!(jobs
        .iter()
        .all(|j| j.run_id == run_id && j.case.tags == ["slow"]));
    app.wait_created(run_id).await;
    let total: i32 = sqlx::query_scalar("SELECT total FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(total, want as i32);
    assert_eq!(
        publishing(&app, run_id).await,
        ("running".into(), want as i32, 0)
    );
    app.cleanup().await;
}

#[tokio::test]
async fn a_creation_goes_on_when_its_caller_goes_away() {
    let app = spawn_app().await;
    let n = PUBLISH_CHUNK * 2 + 7;
    let version_id = stored_version(&app, "left", n).await;
    let (prepared, inserted) = committed_run(&app, version_id).await;
    // The caller (an HTTP request whose client disconnected) does not wait for the pass.
    drop(app.state.publisher.start(prepared, inserted));
    let run_id = inserted.run_id();
    let mut state = publishing(&app, run_id).await;
    for _ in 0..300 {
        state = publishing(&app, run_id).await;
        if state == ("running".into(), n as i32, 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        state,
        ("running".into(), n as i32, 0),
        "every chunk published and confirmed (hang guard: waited up to 30 s)"
    );
    assert_eq!(app.wait_for_jobs(n as u32).await, n as u32);
    app.cleanup().await;
}

/// Uploads a version of `n` passing cases without running it; returns its id.
async fn stored_version(app: &TestApp, name: &str, n: usize) -> Uuid {
    let upload: Value = app
        .upload_zip(given_package(name, &vec!["ok"; n], json!({})), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    upload["version_id"].as_str().unwrap().parse().unwrap()
}

/// A manual run of the version planned and committed as `POST /v1/runs` does before it starts
/// it: the run and its plan, `creating`; nothing is published.
async fn committed_run(app: &TestApp, version_id: Uuid) -> (PreparedRun, db::RunInsert) {
    let request = RunRequest::all_cases(version_id, RunKind::Manual);
    let planner = &app.state.planner;
    let mut tx = app.pool.begin().await.unwrap();
    let prepared = planner.prepare_stored(&mut tx, &request).await.unwrap();
    let inserted = planner.insert(&mut tx, &prepared).await.unwrap();
    tx.commit().await.unwrap();
    (prepared, inserted)
}
