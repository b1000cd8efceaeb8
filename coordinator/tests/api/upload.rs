//! `POST /v1/skills`: good uploads are stored and their run published; bad ones are refused with every
//! problem listed, and leave nothing behind.

use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, AppOptions};
use crate::packages::{given_package, invalid_tests_package, zip_bomb, zip_slip, zip_symlink};

#[tokio::test]
async fn upload_stores_the_version_and_publishes_one_message_per_case_writing_no_row() {
    let app = spawn_app().await;
    let zip = given_package("queued-skill", &["ok", "ok", "no"], json!({}));
    let response = app.upload_zip(zip, "").await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["name"], "queued-skill");
    assert_eq!(body["version"], "1");
    assert_eq!(body["test_cases"], 3);
    let run_id: uuid::Uuid = body["run_id"].as_str().unwrap().parse().unwrap();

    // The run and its plan are all that is written: no row per case before its outcome.
    assert_eq!(app.count("eval_results").await, 0);
    app.wait_created(run_id).await;
    let (total, published): (i32, i32) =
        sqlx::query_as("SELECT total, published_through FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((total, published), (3, 3), "every planned case confirmed");
    assert_eq!(app.count("eval_results").await, 0);

    assert_eq!(app.wait_for_jobs(3).await, 3);
    let jobs = app.drain_jobs().await;
    let hash: String = sqlx::query_scalar("SELECT package_hash FROM skill_versions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let mut ids: Vec<_> = jobs.iter().map(|j| j.case.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec!["case-000", "case-001", "case-002"]);
    for job in &jobs {
        assert_eq!(job.run_id, run_id);
        assert_eq!(
            job.package_hash, hash,
            "jobs carry the package content hash"
        );
        assert_eq!(job.runner.kind, "given", "jobs carry the resolved runner");
        assert_eq!(
            job.case.evaluation.strategy, "exact_match",
            "jobs carry the resolved case"
        );
    }

    // The same content again is the same version, with a new run.
    let again = app
        .upload_zip(
            given_package("queued-skill", &["ok", "ok", "no"], json!({})),
            "",
        )
        .await;
    assert_eq!(again.status().as_u16(), 201);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["version_id"], body["version_id"]);
    assert_ne!(again["run_id"], body["run_id"]);
    // Different content is the next version.
    let next = app
        .upload_zip(
            given_package("queued-skill", &["ok"], json!({})),
            "?run=false",
        )
        .await;
    let next: Value = next.json().await.unwrap();
    assert_eq!(next["version"], "2");
    assert!(next["run_id"].is_null(), "run=false starts no run");
    let (status, versions) = app.get_json("/v1/skills/queued-skill/versions").await;
    assert_eq!(status, 200);
    assert_eq!(versions["versions"].as_array().unwrap().len(), 2);
    assert_eq!(versions["versions"][0]["version"], "2", "newest first");
    app.cleanup().await;
}

#[tokio::test]
async fn multipart_field_file_is_accepted() {
    let app = spawn_app().await;
    let zip = given_package("multipart-skill", &["ok"], json!({}));
    let form = reqwest::multipart::Form::new().part(
        "file",
        reqwest::multipart::Part::bytes(zip)
            .file_name("skill.zip")
            .mime_str("application/zip")
            .unwrap(),
    );
    let response = app
        .client
        .post(format!("{}/v1/skills", app.address))
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["name"], "multipart-skill");
    app.cleanup().await;
}

async fn assert_nothing_stored(app: &crate::helpers::TestApp) {
    let counts = app.all_counts().await;
    assert!(
        counts.values().all(|n| *n == 0),
        "a refused upload stored rows: {counts:?}"
    );
    assert_eq!(
        app.queue_depth(&app.topology.jobs_queue()).await,
        0,
        "a refused upload published jobs"
    );
}

#[tokio::test]
async fn hostile_archives_are_refused_naming_the_rule_and_nothing_is_stored() {
    let app = spawn_app().await;
    for (zip, rule) in [
        (zip_bomb(), "compression_ratio"),
        (zip_slip(), "zip_slip"),
        (zip_symlink(), "symlink"),
    ] {
        let response = app.upload_zip(zip, "").await;
        assert_eq!(response.status().as_u16(), 422, "{rule}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "package_refused", "{rule}: {body}");
        assert_eq!(body["error"]["details"]["limit"], rule, "{body}");
        let problems = body["error"]["details"]["problems"].as_array().unwrap();
        assert_eq!(problems.len(), 1, "{body}");
        assert!(!problems[0]["message"].as_str().unwrap().is_empty());
        assert_nothing_stored(&app).await;
    }
    let response = app.upload_zip(b"this is not a zip".to_vec(), "").await;
    assert_eq!(response.status().as_u16(), 422);
    assert_nothing_stored(&app).await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_invalid_definition_lists_every_problem_with_file_and_pointer() {
    let app = spawn_app().await;
    let response = app.upload_zip(invalid_tests_package(), "").await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "package_invalid");
    let problems: Vec<&Value> = body["error"]["details"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["severity"] == "error")
        .collect();
    let pointers: Vec<&str> = problems
        .iter()
        .map(|p| p["pointer"].as_str().unwrap())
        .collect();
    assert!(
        problems.iter().all(|p| p["file"] == "eval/tests.json"),
        "{body}"
    );
    assert!(
        pointers.iter().any(|p| p.starts_with("/testCases/1")),
        "duplicate id: {pointers:?}"
    );
    assert!(
        pointers
            .iter()
            .any(|p| p.starts_with("/testCases/2/expected/patterns/0")),
        "bad regex: {pointers:?}"
    );
    assert!(
        pointers.iter().any(|p| p.starts_with("/testCases/3")),
        "missing expected output: {pointers:?}"
    );
    assert_nothing_stored(&app).await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_oversized_body_is_413_naming_the_limit_and_nothing_is_stored() {
    let app = spawn_app_with(AppOptions {
        max_upload_bytes: Some(2048),
        ..AppOptions::default()
    })
    .await;
    let big = given_package("big-skill", &["ok"; 200], json!({}));
    assert!(big.len() > 2048);
    let response = app.upload_zip(big, "").await;
    assert_eq!(response.status().as_u16(), 413);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(
        body["error"]["details"]["limit"],
        "coordinator.max_upload_bytes"
    );
    assert_eq!(body["error"]["details"]["limit_bytes"], 2048);
    assert_nothing_stored(&app).await;

    // Chunked (no Content-Length) is cut off too.
    let chunks = futures::stream::iter((0..8).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 1024])));
    let response = app
        .client
        .post(format!("{}/v1/skills", app.address))
        .header("Content-Type", "application/zip")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    assert_nothing_stored(&app).await;
    app.cleanup().await;
}

#[tokio::test]
async fn bearer_tokens_guard_the_api_but_not_the_probes() {
    let app = spawn_app_with(AppOptions {
        auth_tokens: vec!["s3cret".into()],
        ..AppOptions::default()
    })
    .await;
    let zip = given_package("guarded", &["ok"], json!({}));
    let denied = app.upload_zip(zip.clone(), "").await;
    assert_eq!(denied.status().as_u16(), 401);
    let body: Value = denied.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let allowed = app
        .client
        .post(format!("{}/v1/skills", app.address))
        .bearer_auth("s3cret")
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status().as_u16(), 201);
    assert_eq!(app.get("/healthz").await.status().as_u16(), 200);
    assert_eq!(app.get("/v1/openapi.json").await.status().as_u16(), 200);
    app.cleanup().await;
}
