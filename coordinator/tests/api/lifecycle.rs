//! The run lifecycle refuses every illegal transition with a typed error and leaves the run
//! as it was; results arriving for a run that no longer takes them change nothing.

use serde_json::{json, Value};
use skilleval_coordinator::runs::error::LaunchError;
use skilleval_coordinator::runs::plan::RunRequest;
use skilleval_execution::result::CaseStatus;
use skilleval_infra::store::lifecycle::{
    RunKind, RunStatus, StopReason, Transition, TransitionError,
};
use uuid::Uuid;

use crate::helpers::{record_as_worker, spawn_app, TestApp};
use crate::packages::given_package;

/// Starts a run of `n` passing cases through the API and waits for its creation pass.
async fn run_of(app: &TestApp, name: &str, n: usize) -> Uuid {
    let upload: Value = app
        .upload_zip(given_package(name, &vec!["ok"; n], json!({})), "")
        .await
        .json()
        .await
        .unwrap();
    let run_id = upload["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run_id).await;
    run_id
}

/// The transition refused, and the status the run was found in.
fn refused(e: TransitionError) -> (Transition, RunStatus) {
    match e {
        TransitionError::Illegal {
            transition, state, ..
        } => (transition, state.status),
        other => panic!("expected an illegal transition, got {other:?}"),
    }
}

async fn status(app: &TestApp, run_id: Uuid) -> (String, bool, i32) {
    sqlx::query_as("SELECT status, finalised, completed FROM runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn cancelling_a_completed_run_is_refused_and_changes_nothing() {
    let app = spawn_app().await;
    let run_id = run_of(&app, "done", 1).await;
    for event in record_as_worker(&app, run_id, &[("case-000", CaseStatus::Passed, 1.0)]).await {
        app.state.aggregator.on_case_finished(&event).await.unwrap();
    }
    assert_eq!(status(&app, run_id).await, ("completed".into(), true, 1));
    let e = app.state.store.cancel(run_id).await.unwrap_err();
    assert_eq!(refused(e), (Transition::Cancel, RunStatus::Completed));
    assert_eq!(status(&app, run_id).await, ("completed".into(), true, 1));
    app.cleanup().await;
}

#[tokio::test]
async fn finalising_a_run_with_unrecorded_cases_or_a_finalised_run_is_refused() {
    let app = spawn_app().await;
    let run_id = run_of(&app, "early", 2).await;
    let mut conn = app.pool.acquire().await.unwrap();
    let e = app
        .state
        .store
        .finalise(&mut conn, run_id, &json!({}), "pass")
        .await
        .unwrap_err();
    drop(conn);
    assert_eq!(refused(e), (Transition::Finalise, RunStatus::Running));
    assert_eq!(status(&app, run_id).await, ("running".into(), false, 0));

    // Cancelled and finalised: finalising again is refused, the status stays.
    let cancelled = app
        .post_json(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(cancelled.status().as_u16(), 202);
    assert_eq!(status(&app, run_id).await, ("cancelled".into(), true, 2));
    let mut conn = app.pool.acquire().await.unwrap();
    let e = app
        .state
        .store
        .finalise(&mut conn, run_id, &json!({}), "pass")
        .await
        .unwrap_err();
    drop(conn);
    assert_eq!(refused(e), (Transition::Finalise, RunStatus::Cancelled));
    assert!(!app.state.aggregator.finalise(run_id).await.unwrap());
    app.cleanup().await;
}

#[tokio::test]
async fn a_result_arriving_for_a_cancelled_runs_skipped_case_changes_nothing() {
    let app = spawn_app().await;
    let run_id = run_of(&app, "late", 3).await;
    app.state.store.cancel(run_id).await.unwrap();
    // Before the write-off: the stopped run takes no result.
    assert!(
        record_as_worker(&app, run_id, &[("case-000", CaseStatus::Passed, 1.0)])
            .await
            .is_empty()
    );
    assert_eq!(app.state.sweeper.write_off(run_id).await.unwrap(), 3);
    // After it: the skipped row stays, counters too.
    assert!(
        record_as_worker(&app, run_id, &[("case-001", CaseStatus::Failed, 0.0)])
            .await
            .is_empty()
    );
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT status FROM eval_results WHERE run_id = $1 ORDER BY case_index")
            .bind(run_id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(rows, ["skipped", "skipped", "skipped"]);
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(
        run["counters"],
        json!({ "total": 3, "completed": 3, "passed": 0, "failed": 0, "errored": 0, "skipped": 3 })
    );
    app.cleanup().await;
}

#[tokio::test]
async fn writing_off_a_live_run_and_stopping_a_stopped_one_are_refused() {
    let app = spawn_app().await;
    let run_id = run_of(&app, "live", 2).await;
    match app.state.sweeper.write_off(run_id).await.unwrap_err() {
        LaunchError::Transition(e) => {
            assert_eq!(refused(e), (Transition::WriteOff, RunStatus::Running));
        }
        other => panic!("expected a refused write-off, got {other:?}"),
    }
    assert_eq!(status(&app, run_id).await, ("running".into(), false, 0));

    app.state
        .store
        .stop(
            run_id,
            StopReason::FailFast,
            "failFast: case `case-000` did not pass",
        )
        .await
        .unwrap();
    let e = app
        .state
        .store
        .stop(run_id, StopReason::Budget, "budget exceeded")
        .await
        .unwrap_err();
    assert_eq!(
        refused(e),
        (Transition::Stop(StopReason::Budget), RunStatus::Running)
    );
    let state = app.state.store.run_state(run_id).await.unwrap().unwrap();
    assert_eq!(
        state.stop_reason,
        Some(StopReason::FailFast),
        "the first stop stands"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn ending_a_creation_that_ended_is_refused() {
    let app = spawn_app().await;
    let run_id = run_of(&app, "ended", 1).await;
    let e = app.state.store.end_creation(run_id).await.unwrap_err();
    assert_eq!(refused(e), (Transition::EndCreation, RunStatus::Running));
    assert!(matches!(
        app.state.store.end_creation(Uuid::now_v7()).await,
        Err(TransitionError::NotFound(_))
    ));
    app.cleanup().await;
}

#[tokio::test]
async fn runs_whose_kind_needs_a_source_are_refused_when_created_from_a_definition() {
    let app = spawn_app().await;
    let upload: Value = app
        .upload_zip(given_package("rescored", &["ok"], json!({})), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let version_id: Uuid = upload["version_id"].as_str().unwrap().parse().unwrap();
    // A rescore needs the run whose outputs it grades.
    let request = RunRequest::all_cases(version_id, RunKind::Rescore);
    assert!(matches!(
        app.state.publisher.create(&request).await,
        Err(LaunchError::RescoreWithoutSource)
    ));
    // A samples run comes from ingest only, never from a definition.
    let request = RunRequest::all_cases(version_id, RunKind::Samples);
    assert!(matches!(
        app.state.publisher.create(&request).await,
        Err(LaunchError::IngestOnly)
    ));
    assert_eq!(app.count("runs").await, 0);
    app.cleanup().await;
}
