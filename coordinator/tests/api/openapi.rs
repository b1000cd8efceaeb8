//! The OpenAPI document stays true: it lists exactly the routes the router serves, its own
//! examples fit its schemas, and real responses — successes and errors — validate against the
//! schema it gives for their path, method and status.

use std::collections::BTreeSet;

use serde_json::{json, Value};
use skilleval_coordinator::openapi::OPENAPI_JSON;
use skilleval_coordinator::routes::ROUTES;
use skilleval_execution::result::CaseStatus;

use crate::helpers::{record_as_worker, spawn_app, spawn_app_with, AppOptions};
use crate::packages::{given_package, invalid_tests_package, zip_slip};

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete", "head", "options"];

pub(crate) fn doc() -> Value {
    serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
}

#[test]
fn the_document_lists_exactly_the_routes_the_router_serves() {
    let doc = doc();
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            METHODS
                .iter()
                .filter(|m| item.get(**m).is_some())
                .map(|m| (m.to_string(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let phantom: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not documented: {undocumented:?}"
    );
    assert!(phantom.is_empty(), "documented but not served: {phantom:?}");
}

/// A validator for `schema` resolved inside the document (its `$ref`s point at components).
fn validator(doc: &Value, schema: &Value) -> jsonschema::Validator {
    let mut root = doc.clone();
    let obj = root.as_object_mut().unwrap();
    obj.insert(
        "$schema".into(),
        json!("https://json-schema.org/draft/2020-12/schema"),
    );
    if let Some(map) = schema.as_object() {
        for (k, v) in map {
            obj.insert(k.clone(), v.clone());
        }
    }
    jsonschema::validator_for(&root).expect("a valid schema")
}

pub(crate) fn assert_valid(doc: &Value, schema: &Value, instance: &Value, what: &str) {
    let v = validator(doc, schema);
    let errors: Vec<String> = v
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match the document: {errors:?}\n{instance:#}"
    );
}

#[test]
fn the_documents_own_examples_fit_its_schemas() {
    let doc = doc();
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS {
            let Some(op) = item.get(*method) else {
                continue;
            };
            for (status, response) in op["responses"].as_object().unwrap() {
                let Some(content) = response["content"]["application/json"].as_object() else {
                    continue;
                };
                if let Some(example) = content.get("example") {
                    assert_valid(
                        &doc,
                        &content["schema"],
                        example,
                        &format!("example of {method} {path} {status}"),
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 8, "only {checked} examples");
}

/// Checks a live response against the document's schema for (method, route, status).
pub(crate) fn check(doc: &Value, method: &str, route: &str, status: u16, body: &Value) {
    let op = &doc["paths"][route][method];
    assert!(op.is_object(), "{method} {route} is not documented");
    let response = &op["responses"][status.to_string()];
    assert!(
        response.is_object(),
        "{method} {route} answered {status}, which the document does not list"
    );
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {route} {status} has no JSON schema"
    );
    assert_valid(doc, schema, body, &format!("{method} {route} {status}"));
}

/// `check` for a response whose status the test does not pin: whatever it answered must be listed.
pub(crate) async fn check_response(doc: &Value, method: &str, route: &str, r: reqwest::Response) {
    let status = r.status().as_u16();
    check(doc, method, route, status, &r.json().await.unwrap());
}

#[tokio::test]
async fn live_responses_validate_against_the_document() {
    let doc = doc();
    let app = spawn_app().await;
    let url = |p: &str| format!("{}{p}", app.address);

    let r = app
        .upload_zip(given_package("documented", &["ok", "no"], json!({})), "")
        .await;
    let upload: Value = r.json().await.unwrap();
    check(&doc, "post", "/v1/skills", 201, &upload);
    let run_id = upload["run_id"].as_str().unwrap().to_string();
    let version_id = upload["version_id"].as_str().unwrap().to_string();

    for (zip, what) in [
        (invalid_tests_package(), "invalid"),
        (zip_slip(), "refused"),
    ] {
        let r = app.upload_zip(zip, "").await;
        assert_eq!(r.status().as_u16(), 422, "{what}");
        check(&doc, "post", "/v1/skills", 422, &r.json().await.unwrap());
    }
    let r = app
        .client
        .post(url("/v1/skills"))
        .header("Content-Type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    check_response(&doc, "post", "/v1/skills", r).await;

    let r = app
        .post_json(
            "/v1/runs",
            &json!({ "version_id": version_id, "idempotency_key": "k" }),
        )
        .await;
    check_response(&doc, "post", "/v1/runs", r).await;
    let r = app.post_json("/v1/runs", &json!({ "version_id": 5 })).await;
    check(&doc, "post", "/v1/runs", 400, &r.json().await.unwrap());
    let r = app
        .post_json(
            "/v1/runs",
            &json!({ "version_id": version_id, "suite": "x" }),
        )
        .await;
    check(&doc, "post", "/v1/runs", 422, &r.json().await.unwrap());

    let (s, running) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    check(&doc, "get", "/v1/runs/{id}", s, &running);
    let (s, page) = app
        .get_json(&format!("/v1/runs/{run_id}/results?limit=1"))
        .await;
    check(&doc, "get", "/v1/runs/{id}/results", s, &page);
    let (s, err) = app.get_json(&format!("/v1/runs/{run_id}/report")).await;
    check(&doc, "get", "/v1/runs/{id}/report", s, &err);
    let (s, err) = app
        .get_json(&format!("/v1/runs/{}", uuid::Uuid::nil()))
        .await;
    check(&doc, "get", "/v1/runs/{id}", s, &err);
    let (s, err) = app.get_json("/v1/runs/nope").await;
    check(&doc, "get", "/v1/runs/{id}", s, &err);

    let run: uuid::Uuid = run_id.parse().unwrap();
    record_as_worker(
        &app,
        run,
        &[
            ("case-000", CaseStatus::Passed, 1.0),
            ("case-001", CaseStatus::Failed, 0.0),
        ],
    )
    .await;
    app.state.aggregator.finalise(run).await.unwrap();
    let (s, done) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    check(&doc, "get", "/v1/runs/{id}", s, &done);
    assert!(done["summary"].is_object());
    let (s, page) = app.get_json(&format!("/v1/runs/{run_id}/results")).await;
    check(&doc, "get", "/v1/runs/{id}/results", s, &page);
    let (s, report) = app
        .get_json(&format!("/v1/runs/{run_id}/report?format=json"))
        .await;
    check(&doc, "get", "/v1/runs/{id}/report", s, &report);
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/cancel"), &json!({}))
        .await;
    check_response(&doc, "post", "/v1/runs/{id}/cancel", r).await;
    let other: Value = app
        .post_json("/v1/runs", &json!({ "version_id": version_id }))
        .await
        .json()
        .await
        .unwrap();
    let r = app
        .post_json(
            &format!("/v1/runs/{}/cancel", other["run_id"].as_str().unwrap()),
            &json!({}),
        )
        .await;
    check_response(&doc, "post", "/v1/runs/{id}/cancel", r).await;

    let (s, versions) = app.get_json("/v1/skills/documented/versions").await;
    check(&doc, "get", "/v1/skills/{name}/versions", s, &versions);
    let (s, err) = app.get_json("/v1/skills/unknown/versions").await;
    check(&doc, "get", "/v1/skills/{name}/versions", s, &err);

    // Production monitoring.
    let r = app
        .upload_zip(
            crate::sampling::monitored_package("watched", crate::sampling::says_ok(0.5)),
            "?run=false",
        )
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let (s, monitor) = app.get_json("/v1/skills/watched/monitor").await;
    check(&doc, "get", "/v1/skills/{name}/monitor", s, &monitor);
    let (s, err) = app.get_json("/v1/skills/documented/monitor").await;
    check(&doc, "get", "/v1/skills/{name}/monitor", s, &err);
    for body in [
        crate::sampling::says_ok(0.7),
        json!({"sample_rate": -1, "criteria": []}),
    ] {
        let r = app
            .client
            .put(url("/v1/skills/watched/monitor"))
            .json(&body)
            .send()
            .await
            .unwrap();
        check_response(&doc, "put", "/v1/skills/{name}/monitor", r).await;
    }
    let batch = json!([
        crate::sampling::sample("d-1", "ok", None),
        crate::sampling::sample("d-2", "no", None),
        {"sample_id": "d-3"}
    ]);
    for skill in ["watched", "documented", "unknown"] {
        let r = app
            .post_json(&format!("/v1/skills/{skill}/samples"), &batch)
            .await;
        check_response(&doc, "post", "/v1/skills/{name}/samples", r).await;
    }
    let r = app
        .post_json("/v1/skills/watched/samples", &json!({"samples": 3}))
        .await;
    check(
        &doc,
        "post",
        "/v1/skills/{name}/samples",
        400,
        &r.json().await.unwrap(),
    );
    for query in [
        "?bucket=hour",
        "?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
    ] {
        let (s, q) = app
            .get_json(&format!("/v1/skills/watched/quality{query}"))
            .await;
        check(&doc, "get", "/v1/skills/{name}/quality", s, &q);
    }
    let (s, alerts) = app.get_json("/v1/skills/watched/alerts").await;
    check(&doc, "get", "/v1/skills/{name}/alerts", s, &alerts);
    let (s, err) = app.get_json("/v1/skills/unknown/alerts").await;
    check(&doc, "get", "/v1/skills/{name}/alerts", s, &err);

    let (s, health) = app.get_json("/healthz").await;
    check(&doc, "get", "/healthz", s, &health);
    let (s, ready) = app.get_json("/readyz").await;
    check(&doc, "get", "/readyz", s, &ready);
    let (s, served) = app.get_json("/v1/openapi.json").await;
    assert_eq!(s, 200);
    assert_eq!(served, doc, "the served document is the file");
    let metrics = app.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("skilleval_coordinator_runs_created_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("skilleval_coordinator_http_requests_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"route="/v1/runs/{id}""#),
        "requests are labelled by route template: {metrics}"
    );
    assert!(
        metrics.contains(r#"skilleval_coordinator_runs{status="completed"} 1"#),
        "{metrics}"
    );
    app.cleanup().await;

    let small = spawn_app_with(AppOptions {
        max_upload_bytes: Some(100),
        ..AppOptions::default()
    })
    .await;
    let r = small
        .upload_zip(given_package("too-big", &["ok"], json!({})), "")
        .await;
    check(&doc, "post", "/v1/skills", 413, &r.json().await.unwrap());
    small.cleanup().await;
}
