//! `/v1/runs`: idempotent creation, reading, results pagination, reports, cancel; request
//! errors that name the field and the rule.

use serde_json::{json, Value};
use skilleval_execution::result::CaseStatus;

use crate::helpers::{record_as_worker, spawn_app};
use crate::packages::given_package;

async fn stored_version(app: &crate::helpers::TestApp, name: &str, outputs: &[&str]) -> String {
    let response = app
        .upload_zip(given_package(name, outputs, json!({})), "?run=false")
        .await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    body["version_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn the_same_idempotency_key_returns_the_same_run() {
    let app = spawn_app().await;
    let version_id = stored_version(&app, "idem", &["ok", "ok"]).await;
    let body = json!({ "version_id": version_id, "idempotency_key": "ci-build-42" });
    let first = app.post_json("/v1/runs", &body).await;
    assert_eq!(first.status().as_u16(), 202);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["created"], true);
    let second: Value = app.post_json("/v1/runs", &body).await.json().await.unwrap();
    assert_eq!(second["run_id"], first["run_id"]);
    assert_eq!(second["created"], false);
    // Concurrent replays too.
    let replays = futures::future::join_all((0..5).map(|_| app.post_json("/v1/runs", &body))).await;
    for r in replays {
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["run_id"], first["run_id"]);
    }
    assert_eq!(app.count("runs").await, 1);
    assert_eq!(
        app.count("eval_results").await,
        0,
        "no row before an outcome"
    );
    assert_eq!(app.wait_for_jobs(2).await, 2, "published once");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        app.queue_depth(&app.topology.jobs_queue()).await,
        2,
        "published once"
    );
    // Without a key, every request is a new run.
    let other: Value = app
        .post_json("/v1/runs", &json!({ "version_id": version_id }))
        .await
        .json()
        .await
        .unwrap();
    assert_ne!(other["run_id"], first["run_id"]);
    app.cleanup().await;
}

#[tokio::test]
async fn bad_requests_name_the_field_and_the_rule() {
    let app = spawn_app().await;
    let version_id = stored_version(&app, "strict", &["ok"]).await;
    let cases = [
        (json!({ "version_id": "not-a-uuid" }), 400, "/version_id"),
        (
            json!({ "version_id": version_id, "tags": "smoke" }),
            400,
            "/tags",
        ),
        (
            json!({ "version_id": version_id, "colour": "red" }),
            400,
            "/colour",
        ),
        (
            json!({ "version_id": version_id, "callback_url": "ftp://x" }),
            400,
            "/callback_url",
        ),
        (
            json!({ "version_id": version_id, "runner": "teleport" }),
            400,
            "/runner",
        ),
        (
            json!({ "version_id": version_id, "suite": "nope" }),
            422,
            "suite",
        ),
        (json!({ "version_id": uuid::Uuid::nil() }), 404, ""),
    ];
    for (body, status, field) in cases {
        let response = app.post_json("/v1/runs", &body).await;
        assert_eq!(response.status().as_u16(), status, "{body}");
        let err: Value = response.json().await.unwrap();
        let e = &err["error"];
        assert!(e["code"].is_string() && e["message"].is_string(), "{err}");
        if status == 400 || status == 422 {
            assert_eq!(e["details"]["field"], field, "{err}");
            assert!(
                e["details"]["rule"].as_str().is_some_and(|r| !r.is_empty()),
                "{err}"
            );
        }
    }
    let (status, err) = app.get_json("/v1/runs/123").await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["details"]["field"], "id");
    let (status, err) = app
        .get_json(&format!("/v1/runs/{}/results?limit=0", uuid::Uuid::nil()))
        .await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["details"]["field"], "limit");
    let (status, err) = app
        .get_json(&format!("/v1/runs/{}/results?limit=abc", uuid::Uuid::nil()))
        .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["details"]["field"], "limit");
    let response = app
        .client
        .post(format!("{}/v1/runs", app.address))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 415);
    app.cleanup().await;
}

#[tokio::test]
async fn results_page_with_a_cursor_and_filter_by_status_and_the_report_follows_finalisation() {
    let app = spawn_app().await;
    let outputs = ["ok"; 7];
    let upload: Value = app
        .upload_zip(given_package("paged", &outputs, json!({})), "")
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run_id).await;
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "running");
    assert_eq!(run["counters"]["total"], 7);
    assert!(run["summary"].is_null());
    for path in ["report", "workspace"] {
        let (status, body) = app.get_json(&format!("/v1/runs/{run_id}/{path}")).await;
        assert_eq!(status, 409, "no {path} before the run finishes: {body}");
        assert_eq!(body["error"]["code"], "run_not_finished", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("0 of 7 cases done")),
            "{body}"
        );
        assert_eq!(body["error"]["details"]["status"], "running", "{body}");
    }

    record_as_worker(
        &app,
        run_id,
        &[
            ("case-000", CaseStatus::Passed, 1.0),
            ("case-001", CaseStatus::Failed, 0.0),
            ("case-002", CaseStatus::Passed, 1.0),
        ],
    )
    .await;
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit=3&cursor={c}"),
            None => "?limit=3".to_string(),
        };
        let (status, page) = app
            .get_json(&format!("/v1/runs/{run_id}/results{query}"))
            .await;
        assert_eq!(status, 200);
        for r in page["results"].as_array().unwrap() {
            seen.push(r["test_case_id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..7).map(|i| format!("case-{i:03}")).collect();
    assert_eq!(seen, expected, "every case once, in order");
    let (_, failed) = app
        .get_json(&format!("/v1/runs/{run_id}/results?status=failed"))
        .await;
    let failed = failed["results"].as_array().unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["test_case_id"], "case-001");
    assert_eq!(failed[0]["score"], 0.0);

    let rest: Vec<(String, CaseStatus, f64)> = (3..7)
        .map(|i| (format!("case-{i:03}"), CaseStatus::Passed, 1.0))
        .collect();
    let rest: Vec<(&str, CaseStatus, f64)> = rest
        .iter()
        .map(|(id, s, v)| (id.as_str(), *s, *v))
        .collect();
    record_as_worker(&app, run_id, &rest).await;
    assert!(app.state.aggregator.finalise(run_id).await.unwrap());
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(run["verdict"], "fail");
    assert_eq!(run["counters"]["passed"], 6);
    assert_eq!(run["counters"]["failed"], 1);
    let pass_rate = run["summary"]["pass_rate"].as_f64().unwrap();
    assert!((pass_rate - 6.0 / 7.0).abs() < 1e-9);
    let markdown = app
        .get(&format!("/v1/runs/{run_id}/report?format=markdown"))
        .await;
    assert_eq!(markdown.status().as_u16(), 200);
    assert!(markdown.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    let text = markdown.text().await.unwrap();
    assert!(text.contains("paged"), "{text}");
    let (status, json_report) = app
        .get_json(&format!("/v1/runs/{run_id}/report?format=json"))
        .await;
    assert_eq!(status, 200);
    assert!(json_report.is_object());
    let (status, err) = app
        .get_json(&format!("/v1/runs/{run_id}/report?format=pdf"))
        .await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["details"]["field"], "format");
    app.cleanup().await;
}

#[tokio::test]
async fn cancel_skips_the_queued_cases_and_finalises_once() {
    let app = spawn_app().await;
    let upload: Value = app
        .upload_zip(
            given_package("cancelled", &["ok", "ok", "ok", "ok"], json!({})),
            "",
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id: uuid::Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    record_as_worker(&app, run_id, &[("case-000", CaseStatus::Passed, 1.0)]).await;
    let response = app
        .post_json(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(response.status().as_u16(), 202);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["skipped"], 3);
    let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(run["status"], "cancelled");
    assert_eq!(run["counters"]["completed"], 4);
    assert_eq!(run["counters"]["skipped"], 3);
    assert!(run["finished_at"].is_string(), "finalised at once: {run}");
    // A worker finishing a skipped case afterwards changes nothing.
    let late = record_as_worker(&app, run_id, &[("case-001", CaseStatus::Passed, 1.0)]).await;
    assert!(late.is_empty());
    let (_, again) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(again["counters"], run["counters"]);
    let second = app
        .post_json(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    assert_eq!(second.status().as_u16(), 409);
    let missing = app
        .post_json(
            &format!("/v1/runs/{}/cancel", uuid::Uuid::nil()),
            &json!({}),
        )
        .await;
    assert_eq!(missing.status().as_u16(), 404);
    app.cleanup().await;
}

#[tokio::test]
async fn a_version_stored_before_definitions_were_deflated_still_runs() {
    let app = spawn_app().await;
    let version_id = stored_version(&app, "legacy", &["ok", "ok"]).await;
    let deflated: Option<Vec<u8>> =
        sqlx::query_scalar("SELECT config_deflate FROM eval_configs WHERE version_id = $1::uuid")
            .bind(&version_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(
        deflated.is_some_and(|b| !b.is_empty()),
        "uploads store it deflated"
    );
    // What an earlier coordinator stored: the definition as plain JSON text (three cases
    // here, so the run shows which column was read).
    let text = crate::packages::given_tests(&["ok", "ok", "no"], json!({})).to_string();
    sqlx::query(
        "UPDATE eval_configs SET config = $2, config_deflate = NULL WHERE version_id = $1::uuid",
    )
    .bind(&version_id)
    .bind(&text)
    .execute(&app.pool)
    .await
    .unwrap();
    let created = app
        .post_json("/v1/runs", &json!({ "version_id": version_id }))
        .await;
    assert_eq!(created.status().as_u16(), 202);
    assert_eq!(app.wait_for_jobs(3).await, 3);
    let jobs = app.drain_jobs().await;
    let mut ids: Vec<&str> = jobs.iter().map(|j| j.case.id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["case-000", "case-001", "case-002"]);
    // A row holds exactly one of the two forms.
    let both = sqlx::query(
        "UPDATE eval_configs SET config_deflate = '\\x00'::bytea WHERE version_id = $1::uuid",
    )
    .bind(&version_id)
    .execute(&app.pool)
    .await;
    assert!(both.is_err(), "a row with both forms is refused");
    app.cleanup().await;
}
