//! Publishers, scoped tokens, quotas, deletion, retention and the audit log (issue 20,
//! docs/security.md), against the real PostgreSQL and RabbitMQ.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{json, Value};
use skilleval_infra::config::{QuotaLimits, Settings};
use uuid::Uuid;

use crate::helpers::{spawn_app_configured, AppOptions, TestApp};
use crate::openapi::doc;
use crate::packages::given_package;
use crate::versions::finish_run;

/// The static token of these tests' coordinators: the implicit publisher, every scope.
const ROOT: &str = "root-token-for-tests";

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete"];

async fn app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_configured(AppOptions::default(), |s| {
        s.coordinator.auth_tokens = vec![skilleval_infra::config::Secret::new(ROOT)];
        configure(s);
    })
    .await
}

/// One answer: status, headers, JSON body (null when none).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

async fn send(app: &TestApp, method: Method, path: &str, token: &str, body: Body) -> Answer {
    let mut request = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    request = match body {
        Body::None => request,
        Body::Json(v) => request.json(&v),
        Body::Zip(z) => request.header("Content-Type", "application/zip").body(z),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

#[derive(Clone)]
enum Body {
    None,
    Json(Value),
    Zip(Vec<u8>),
}

/// A token for `publisher` with `scopes`, made through the admin endpoint.
async fn token(app: &TestApp, publisher: &str, scopes: &[&str]) -> (String, String) {
    let a = send(
        app,
        Method::POST,
        "/v1/admin/tokens",
        ROOT,
        Body::Json(json!({ "publisher": publisher, "scopes": scopes })),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    (
        a.body["token"].as_str().unwrap().to_string(),
        a.body["prefix"].as_str().unwrap().to_string(),
    )
}

const WRITER: &[&str] = &["skills:write", "runs:write", "read", "samples:write"];

async fn upload(app: &TestApp, token: &str, zip: Vec<u8>, query: &str) -> Answer {
    send(
        app,
        Method::POST,
        &format!("/v1/skills{query}"),
        token,
        Body::Zip(zip),
    )
    .await
}

fn id(v: &Value, field: &str) -> Uuid {
    v[field].as_str().unwrap().parse().unwrap()
}

/// Publisher A's objects: a skill with two versions, their completed runs, a comparison,
/// a monitor and samples.
struct Objects {
    skill: String,
    version: String,
    run: Uuid,
    other_run: Uuid,
    version_id: Uuid,
    comparison: Uuid,
    report: Uuid,
    matrix: Uuid,
    zip: Vec<u8>,
}

async fn publish_objects(app: &TestApp, token: &str, skill: &str) -> Objects {
    let zip = given_package(skill, &["ok", "ok", "no"], json!({}));
    let first = upload(app, token, zip.clone(), "").await;
    assert_eq!(first.status, 201, "{}", first.body);
    let run = id(&first.body, "run_id");
    finish_run(app, run, 3, &[2]).await;
    let second = upload(
        app,
        token,
        given_package(skill, &["ok", "ok", "ok"], json!({})),
        "",
    )
    .await;
    assert_eq!(second.status, 201, "{}", second.body);
    let other_run = id(&second.body, "run_id");
    finish_run(app, other_run, 3, &[]).await;
    let c = send(
        app,
        Method::POST,
        "/v1/comparisons",
        token,
        Body::Json(json!({ "base": run, "head": other_run })),
    )
    .await;
    assert_eq!(c.status, 201, "{}", c.body);
    let report = send(
        app,
        Method::POST,
        "/v1/reports",
        token,
        Body::Json(json!({ "skill": skill, "format": "json" })),
    )
    .await;
    assert_eq!(report.status, 201, "{}", report.body);
    let m = send(
        app,
        Method::PUT,
        &format!("/v1/skills/{skill}/monitor"),
        token,
        Body::Json(crate::sampling::says_ok(1.0)),
    )
    .await;
    assert!(m.status < 300, "{}", m.body);
    let s = send(
        app,
        Method::POST,
        &format!("/v1/skills/{skill}/samples"),
        token,
        Body::Json(json!([crate::sampling::sample("s-1", "ok", None)])),
    )
    .await;
    assert!(s.status < 300, "{}", s.body);
    // A matrix needs a skill a model produces (this one replays recorded outputs), so the
    // test stores one over her runs through the store, as `POST /v1/matrix` would.
    let matrix = Uuid::now_v7();
    let publisher: Uuid = sqlx::query_scalar("SELECT publisher_id FROM skills WHERE name = $1")
        .bind(skill)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let version_id = id(&first.body, "version_id");
    app.state
        .store
        .insert_matrix(&skilleval_infra::store::matrix::NewMatrix {
            id: matrix,
            publisher_id: publisher,
            request: &json!({ "models": ["m"] }),
            estimate: &json!({ "cells": [] }),
            plan: &json!([]),
            idempotency_key: None,
        })
        .await
        .unwrap();
    app.state
        .store
        .insert_matrix_cell(
            matrix,
            &skilleval_infra::store::matrix::NewCell {
                position: 0,
                version_id,
                model: "m",
                run_id: other_run,
                reference_run: run,
            },
        )
        .await
        .unwrap();
    app.state
        .store
        .finish_matrix_creation(matrix)
        .await
        .unwrap();
    Objects {
        skill: skill.to_string(),
        version: first.body["version"].as_str().unwrap().to_string(),
        run,
        other_run,
        version_id: id(&first.body, "version_id"),
        comparison: id(&c.body, "comparison_id"),
        report: id(&report.body, "id"),
        matrix,
        zip,
    }
}

/// The lists: they name no object, and show only the caller's.
const LISTS: &[&str] = &["/v1/skills", "/v1/runs"];

/// Trace ingest names its skills inside the body: another publisher's skill is a rejected span
/// in a 200, with the reason a skill that exists nowhere gets.
const OTLP_TRACES: &str = "/v1/otlp/v1/traces";

/// An OTLP/JSON export of one GenAI agent span of `skill`, with its messages: a span the
/// mapping takes, so what refuses it is the skill's visibility.
fn genai_export(skill: &str) -> Value {
    let attr = |key: &str, value: &str| json!({ "key": key, "value": { "stringValue": value } });
    json!({ "resourceSpans": [{
        "resource": { "attributes": [attr("service.name", "shop-agent")] },
        "scopeSpans": [{ "spans": [{
            "traceId": "5b8efff798038103d269b633813fc60c",
            "spanId": "eee19b7ec3c1b174",
            "name": "invoke_agent shop",
            "kind": 1,
            "startTimeUnixNano": "1764000000000000000",
            "endTimeUnixNano": "1764000001000000000",
            "attributes": [
                attr("gen_ai.operation.name", "invoke_agent"),
                attr("skilleval.skill", skill),
                attr("gen_ai.input.messages", r#"[{"role":"user","parts":[{"type":"text","content":"Where is my order?"}]}]"#),
                attr("gen_ai.output.messages", r#"[{"role":"assistant","parts":[{"type":"text","content":"It ships today."}],"finish_reason":"stop"}]"#),
            ],
        }]}],
    }]})
}

/// Routes that read or change no stored object.
const NAMES_NO_OBJECT: &[&str] = &["/v1/skills/validate", "/v1/schemas/check"];

/// Every documented `/v1` operation, with the path's parameters replaced by `objects`' ids
/// (or by ids that exist nowhere, when `objects` is `None`) and the body it needs. A new
/// route with a parameter this does not know fails the test: classify it here.
fn operations(
    objects: Option<&Objects>,
    token_prefix: &str,
) -> Vec<(Method, String, String, Body)> {
    let doc = doc();
    let mut ops = Vec::new();
    for (template, item) in doc["paths"].as_object().unwrap() {
        // Validating a package or compiling a schema names no stored object: there is nothing
        // of another publisher's for them to hide.
        if !template.starts_with("/v1/")
            || template == "/v1/openapi.json"
            || NAMES_NO_OBJECT.contains(&template.as_str())
        {
            continue;
        }
        for m in METHODS.iter().filter(|m| item.get(**m).is_some()) {
            let nowhere = Uuid::now_v7().to_string();
            let (skill, version, run, comparison, report, matrix) = match objects {
                Some(o) => (
                    o.skill.clone(),
                    o.version.clone(),
                    o.run.to_string(),
                    o.comparison.to_string(),
                    o.report.to_string(),
                    o.matrix.to_string(),
                ),
                None => (
                    "no-such-skill".to_string(),
                    "9".to_string(),
                    nowhere.clone(),
                    nowhere.clone(),
                    nowhere.clone(),
                    nowhere.clone(),
                ),
            };
            let mut path = template.clone();
            for (param, value) in [("{name}", skill.as_str()), ("{version}", version.as_str())] {
                path = path.replace(param, value);
            }
            if path.contains("{id}") {
                let value = if template.starts_with("/v1/runs/") {
                    run.clone()
                } else if template.starts_with("/v1/comparisons/") {
                    comparison.clone()
                } else if template.starts_with("/v1/reports/") {
                    report.clone()
                } else if template.starts_with("/v1/matrix/") {
                    matrix.clone()
                } else if template.starts_with("/v1/admin/tokens/") {
                    token_prefix.to_string()
                } else if template.starts_with("/v1/admin/") {
                    nowhere.clone()
                } else {
                    panic!(
                        "{m} {template}: this test does not know what `{{id}}` names; classify it"
                    )
                };
                path = path.replace("{id}", &value);
            }
            assert!(
                !path.contains('{'),
                "{m} {template}: a path parameter this test does not know; classify it"
            );
            let method = Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let body = body_for(&method, template, objects);
            ops.push((method, template.clone(), path, body));
        }
    }
    ops
}

/// A body that passes validation, so what answers is the visibility check.
fn body_for(method: &Method, template: &str, objects: Option<&Objects>) -> Body {
    let nowhere = Uuid::now_v7();
    match (method.as_str(), template) {
        ("POST", "/v1/skills") => Body::Zip(objects.map_or_else(
            || given_package("no-such-skill", &["ok"], json!({})),
            |o| o.zip.clone(),
        )),
        ("POST", "/v1/runs") => {
            Body::Json(json!({ "version_id": objects.map_or(nowhere, |o| o.version_id) }))
        }
        ("POST", "/v1/comparisons") => Body::Json(json!({
            "base": objects.map_or(nowhere, |o| o.run),
            "head": objects.map_or(nowhere, |o| o.other_run),
        })),
        ("POST", "/v1/reports") => Body::Json(json!({
            "skill": objects.map_or("no-such-skill", |o| o.skill.as_str()),
            "format": "markdown",
        })),
        ("POST", "/v1/matrix") => Body::Json(json!({
            "skills": [objects.map_or("no-such-skill", |o| o.skill.as_str())],
            "models": ["any-model"],
        })),
        ("PUT", "/v1/skills/{name}/monitor") => Body::Json(crate::sampling::says_ok(1.0)),
        ("POST", "/v1/skills/{name}/samples") => {
            Body::Json(json!([crate::sampling::sample("s-2", "ok", None)]))
        }
        ("POST", "/v1/runs/{id}/rescore") => Body::Json(json!({})),
        ("POST", OTLP_TRACES) => Body::Json(genai_export(
            objects.map_or("no-such-skill", |o| o.skill.as_str()),
        )),
        ("POST", "/v1/admin/tokens") => {
            Body::Json(json!({ "publisher": "intruder", "scopes": ["admin"] }))
        }
        _ => Body::None,
    }
}

/// What another publisher's token must get: admin routes need a scope it lacks (403, the
/// same for every caller without it); an upload under a taken name is 409 (skill names are
/// one namespace, documented); the lists answer 200 without the other publisher's objects;
/// every other route answers 404, as for an object that does not exist.
fn expected(template: &str, method: &Method) -> u16 {
    if template.starts_with("/v1/admin/") {
        403
    } else if method == Method::POST && template == "/v1/skills" {
        409
    } else if (method == Method::GET && LISTS.contains(&template)) || template == OTLP_TRACES {
        200
    } else {
        404
    }
}

#[tokio::test]
async fn another_publishers_objects_answer_as_missing_through_every_route() {
    let app = app_with(|_| {}).await;
    let (alice, alice_prefix) = token(&app, "alice", WRITER).await;
    let (bob, _) = token(&app, "bob", WRITER).await;
    let objects = publish_objects(&app, &alice, "alpha").await;
    let untouched = app.all_counts().await;

    let theirs = operations(Some(&objects), &alice_prefix);
    let nowhere = operations(None, &alice_prefix);
    assert_eq!(theirs.len(), nowhere.len());
    assert!(
        theirs.len() >= 20,
        "only {} operations documented?",
        theirs.len()
    );
    for ((method, template, path, body), (_, _, missing_path, missing_body)) in
        theirs.into_iter().zip(nowhere)
    {
        let want = expected(&template, &method);
        let got = send(&app, method.clone(), &path, &bob, body).await;
        assert_eq!(
            got.status, want,
            "{method} {path} with another publisher's token: {}",
            got.body
        );
        assert_eq!(
            app.all_counts().await,
            untouched,
            "{method} {path} changed something"
        );
        if template == OTLP_TRACES {
            // The span is rejected as for a skill that exists nowhere; only the name it sent
            // differs in the answer.
            let missing = send(&app, method.clone(), &missing_path, &bob, missing_body).await;
            let partial = &got.body["partialSuccess"];
            assert_eq!(partial["rejectedSpans"], 1, "{}", got.body);
            assert_eq!(
                got.body
                    .to_string()
                    .replace(&objects.skill, "no-such-skill"),
                missing.body.to_string(),
                "trace ingest answers another publisher's skill unlike a missing one"
            );
        } else if want == 200 {
            let shown = got.body.to_string();
            assert!(
                !shown.contains(&objects.skill) && !shown.contains(&objects.run.to_string()),
                "{method} {path} lists another publisher's objects: {shown}"
            );
        } else if want == 404 {
            // Indistinguishable from an object that exists nowhere: same status, same code.
            let missing = send(&app, method.clone(), &missing_path, &bob, missing_body).await;
            assert_eq!(
                (missing.status, &missing.body["error"]["code"]),
                (got.status, &got.body["error"]["code"]),
                "{method} {template}: another publisher's object answers unlike a missing one"
            );
        }
    }

    // Bob's own run rescored against alice's version: her version is not found either.
    let own = upload(&app, &bob, given_package("bobs", &["ok"], json!({})), "").await;
    assert_eq!(own.status, 201, "{}", own.body);
    let own_run = id(&own.body, "run_id");
    finish_run(&app, own_run, 1, &[]).await;
    let r = send(
        &app,
        Method::POST,
        &format!("/v1/runs/{own_run}/rescore"),
        &bob,
        Body::Json(json!({ "version_id": objects.version_id })),
    )
    .await;
    assert_eq!(
        (r.status, &r.body["error"]["code"]),
        (404, &json!("not_found")),
        "{}",
        r.body
    );

    // Alice still sees all of it.
    for path in [
        format!("/v1/runs/{}", objects.run),
        format!("/v1/skills/{}/versions", objects.skill),
        format!("/v1/comparisons/{}", objects.comparison),
        format!("/v1/skills/{}/monitor", objects.skill),
        format!("/v1/reports/{}", objects.report),
        format!("/v1/matrix/{}", objects.matrix),
    ] {
        let a = send(&app, Method::GET, &path, &alice, Body::None).await;
        assert_eq!(a.status, 200, "{path}: {}", a.body);
    }
    // An admin token sees every publisher's objects.
    let a = send(
        &app,
        Method::GET,
        &format!("/v1/runs/{}", objects.run),
        ROOT,
        Body::None,
    )
    .await;
    assert_eq!(a.status, 200);
    app.cleanup().await;
}

#[tokio::test]
async fn a_revoked_token_is_refused_at_once_by_every_replica() {
    let app = app_with(|_| {}).await;
    // A second coordinator on the same database: what one revokes the other refuses.
    let replica =
        skilleval_coordinator::startup::Application::build_with(app.settings.clone(), false)
            .await
            .unwrap();
    let replica_url = format!("http://127.0.0.1:{}", replica.port());
    let stop = replica.shutdown_token();
    let served = tokio::spawn(replica.run_until_stopped());

    let (secret, prefix) = token(&app, "carol", &["read"]).await;
    let get = |base: String, token: String| async move {
        reqwest::Client::new()
            .get(format!("{base}/v1/skills/none/versions"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    // Accepted (the skill does not exist: 404, not 401) on both replicas.
    assert_eq!(get(app.address.clone(), secret.clone()).await, 404);
    assert_eq!(get(replica_url.clone(), secret.clone()).await, 404);
    // A read-only token cannot upload.
    let a = upload(&app, &secret, given_package("c", &["ok"], json!({})), "").await;
    assert_eq!(a.status, 403);
    assert_eq!(a.body["error"]["details"]["scope"], "skills:write");

    let listed = send(&app, Method::GET, "/v1/admin/tokens", ROOT, Body::None).await;
    let row = listed.body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["prefix"] == prefix.as_str())
        .unwrap()
        .clone();
    assert!(row["last_used_at"].is_string(), "{row}");
    assert!(row.get("token").is_none() && !listed.body.to_string().contains(&secret));

    let r = send(
        &app,
        Method::DELETE,
        &format!("/v1/admin/tokens/{prefix}"),
        ROOT,
        Body::None,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["revoked_at"].is_string());
    assert_eq!(get(replica_url.clone(), secret.clone()).await, 401);
    assert_eq!(get(app.address.clone(), secret.clone()).await, 401);
    stop.cancel();
    let _ = served.await;
    app.cleanup().await;
}

/// The 429 answer: the limit named in the body, `Retry-After` in whole seconds, counted in
/// the metric.
async fn assert_refused(
    app: &TestApp,
    a: &Answer,
    limit: &str,
    retry: std::ops::RangeInclusive<u64>,
    refusals: usize,
) {
    assert_eq!(a.status, 429, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "quota_exceeded");
    assert_eq!(a.body["error"]["details"]["limit"], limit);
    let after: u64 = a.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        retry.contains(&after),
        "Retry-After {after} not in {retry:?}"
    );
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let line = format!("skilleval_coordinator_quota_refused_total{{limit=\"{limit}\"}} {refusals}");
    assert!(metrics.contains(&line), "no `{line}` in\n{metrics}");
}

fn limits(f: impl FnOnce(&mut QuotaLimits)) -> QuotaLimits {
    let mut l = QuotaLimits::default();
    f(&mut l);
    l
}

#[tokio::test]
async fn requests_per_second_per_token_answer_429_past_the_limit() {
    let app = app_with(|s| {
        s.coordinator.quotas.token = limits(|l| l.requests_per_second = Some(2));
    })
    .await;
    let (dave, _) = token(&app, "dave", &["read"]).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(
            send(
                &app,
                Method::GET,
                "/v1/skills/x/versions",
                &dave,
                Body::None,
            )
            .await,
        );
    }
    assert!(answers[0].status == 404 && answers[1].status == 404);
    let refused: Vec<&Answer> = answers.iter().filter(|a| a.status == 429).collect();
    assert!(!refused.is_empty(), "no 429 within 4 requests");
    assert_refused(
        &app,
        refused[0],
        "coordinator.quotas.token.requests_per_second",
        1..=1,
        refused.len(),
    )
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn uploads_per_hour_answer_429_at_the_limit() {
    let app = app_with(|s| {
        s.coordinator.quotas.publisher = limits(|l| l.uploads_per_hour = Some(1));
    })
    .await;
    let (erin, _) = token(&app, "erin", WRITER).await;
    let a = upload(
        &app,
        &erin,
        given_package("e1", &["ok"], json!({})),
        "?run=false",
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let b = upload(
        &app,
        &erin,
        given_package("e2", &["ok"], json!({})),
        "?run=false",
    )
    .await;
    assert_refused(
        &app,
        &b,
        "coordinator.quotas.publisher.uploads_per_hour",
        3_500..=3_601,
        1,
    )
    .await;
    // Another publisher has its own count.
    let (frank, _) = token(&app, "frank", WRITER).await;
    let c = upload(
        &app,
        &frank,
        given_package("f1", &["ok"], json!({})),
        "?run=false",
    )
    .await;
    assert_eq!(c.status, 201, "{}", c.body);
    app.cleanup().await;
}

/// Sends 12 `POST /v1/runs` with `body` at once: exactly one is created, the rest get 429.
async fn assert_one_of_12_racing_runs_is_created(app: &TestApp, token: &str, body: &Value) {
    let racing = (0..12).map(|_| {
        send(
            app,
            Method::POST,
            "/v1/runs",
            token,
            Body::Json(body.clone()),
        )
    });
    let mut statuses: Vec<u16> = futures::future::join_all(racing)
        .await
        .iter()
        .map(|a| a.status)
        .collect();
    statuses.sort_unstable();
    let mut want = vec![429; 12];
    want[0] = 202;
    assert_eq!(statuses, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_answer_429_at_the_limit() {
    let app = app_with(|s| {
        s.coordinator.quotas.publisher = limits(|l| l.concurrent_runs = Some(1));
    })
    .await;
    let (gina, _) = token(&app, "gina", WRITER).await;
    let a = upload(
        &app,
        &gina,
        given_package("g", &["ok", "ok"], json!({})),
        "",
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    app.wait_created(id(&a.body, "run_id")).await;
    let body = json!({ "version_id": a.body["version_id"] });
    let b = send(
        &app,
        Method::POST,
        "/v1/runs",
        &gina,
        Body::Json(body.clone()),
    )
    .await;
    assert_refused(
        &app,
        &b,
        "coordinator.quotas.publisher.concurrent_runs",
        30..=30,
        1,
    )
    .await;
    // Once the first run is finished, there is room again, for exactly one of several
    // requests racing for it (the check and the creation take turns in PostgreSQL).
    finish_run(&app, id(&a.body, "run_id"), 2, &[]).await;
    assert_one_of_12_racing_runs_is_created(&app, &gina, &body).await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_tokens_concurrent_runs_hold_while_its_runs_are_created() {
    // The per-token count reads the runs' token: it must be recorded by the insert itself,
    // or a request racing the first one's creation counts zero runs of the token.
    let app = app_with(|s| {
        s.coordinator.quotas.token = limits(|l| l.concurrent_runs = Some(1));
    })
    .await;
    let (ivy, _) = token(&app, "ivy", WRITER).await;
    let a = upload(
        &app,
        &ivy,
        given_package("i", &["ok", "ok"], json!({})),
        "?run=false",
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let body = json!({ "version_id": a.body["version_id"] });
    assert_one_of_12_racing_runs_is_created(&app, &ivy, &body).await;
    let b = send(&app, Method::POST, "/v1/runs", &ivy, Body::Json(body)).await;
    assert_refused(
        &app,
        &b,
        "coordinator.quotas.token.concurrent_runs",
        30..=30,
        12,
    )
    .await;
    app.cleanup().await;
}

#[tokio::test]
async fn cases_per_day_answer_429_at_the_limit() {
    let app = app_with(|s| {
        s.coordinator.quotas.token = limits(|l| l.cases_per_day = Some(5));
    })
    .await;
    let (hal, _) = token(&app, "hal", WRITER).await;
    let a = upload(
        &app,
        &hal,
        given_package("h", &["ok", "ok", "ok"], json!({})),
        "",
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.body);
    let b = send(
        &app,
        Method::POST,
        "/v1/runs",
        &hal,
        Body::Json(json!({ "version_id": a.body["version_id"] })),
    )
    .await;
    assert_refused(
        &app,
        &b,
        "coordinator.quotas.token.cases_per_day",
        86_000..=86_401,
        1,
    )
    .await;
    // A new token of the same publisher has its own per-token count.
    let (hal2, _) = token(&app, "hal", WRITER).await;
    let c = send(
        &app,
        Method::POST,
        "/v1/runs",
        &hal2,
        Body::Json(json!({ "version_id": a.body["version_id"] })),
    )
    .await;
    assert_eq!(c.status, 202, "{}", c.body);
    app.cleanup().await;
}

#[tokio::test]
async fn model_spend_per_day_answers_429_at_the_limit() {
    let app = app_with(|s| {
        s.coordinator.quotas.publisher = limits(|l| l.spend_usd_per_day = Some(0.5));
    })
    .await;
    let (ivy, _) = token(&app, "ivy", WRITER).await;
    let a = upload(&app, &ivy, given_package("i", &["ok"], json!({})), "").await;
    assert_eq!(a.status, 201, "{}", a.body);
    let run = id(&a.body, "run_id");
    finish_run(&app, run, 1, &[]).await;
    let body = Body::Json(json!({ "version_id": a.body["version_id"] }));
    let b = send(&app, Method::POST, "/v1/runs", &ivy, body.clone()).await;
    assert_eq!(b.status, 202, "under the limit: {}", b.body);
    finish_run(&app, id(&b.body, "run_id"), 1, &[]).await;
    // What the workers would have added up for the first run's model calls.
    sqlx::query("UPDATE runs SET cost_usd = 0.75 WHERE id = $1")
        .bind(run)
        .execute(&app.pool)
        .await
        .unwrap();
    let c = send(&app, Method::POST, "/v1/runs", &ivy, body).await;
    assert_refused(
        &app,
        &c,
        "coordinator.quotas.publisher.spend_usd_per_day",
        86_000..=86_401,
        1,
    )
    .await;
    app.cleanup().await;
}

/// Tables whose rows may name a deleted object on purpose: the audit log records what was
/// done to it (its own retention applies); migrations are sqlx's.
const KEPT_ON_PURPOSE: &[&str] = &["audit_log", "_sqlx_migrations"];

/// Rows, in every table of the schema (found through information_schema, so a table added
/// later is walked too), whose text (bytea columns included) contains `needle`.
async fn rows_naming(app: &TestApp, needle: &str) -> BTreeMap<String, i64> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = 'public' AND table_type = 'BASE TABLE'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(tables.len() >= 15, "{tables:?}");
    let mut found = BTreeMap::new();
    for table in tables {
        if KEPT_ON_PURPOSE.contains(&table.as_str()) {
            continue;
        }
        // A row's text shows bytea columns (packages, webhook and parked bodies) in hex:
        // look for the needle's hex too.
        let sql = format!(
            "SELECT count(*) FROM \"{table}\" t WHERE t::text LIKE '%' || $1 || '%'
               OR t::text LIKE '%' || encode(convert_to($1, 'UTF8'), 'hex') || '%'"
        );
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(needle)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if n > 0 {
            found.insert(table, n);
        }
    }
    found
}

/// Every id (and package hash) of the skill's rows, and of what hangs off them.
async fn ids_of_skill(app: &TestApp, skill: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT s.id::text FROM skills s WHERE s.name = $1
         UNION SELECT v.id::text FROM skill_versions v JOIN skills s ON s.id = v.skill_id WHERE s.name = $1
         UNION SELECT v.package_hash FROM skill_versions v JOIN skills s ON s.id = v.skill_id WHERE s.name = $1
         UNION SELECT r.id::text FROM runs r JOIN skill_versions v ON v.id = r.version_id
               JOIN skills s ON s.id = v.skill_id WHERE s.name = $1
         UNION SELECT c.id::text FROM comparisons c JOIN runs r ON r.id = c.baseline_run_id
               JOIN skill_versions v ON v.id = r.version_id JOIN skills s ON s.id = v.skill_id
               WHERE s.name = $1",
    )
    .bind(skill)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn deleting_leaves_no_row_behind_in_any_table() {
    let app = app_with(|_| {}).await;
    let (alice, _) = token(&app, "alice", WRITER).await;
    let (bob, _) = token(&app, "bob", WRITER).await;
    publish_objects(&app, &alice, "alpha").await;
    let b = publish_objects(&app, &bob, "beta").await;
    let alpha_ids = ids_of_skill(&app, "alpha").await;
    assert!(alpha_ids.len() >= 7, "{alpha_ids:?}");

    // A run still running is cancelled, then deleted; repeating answers 404 and changes nothing.
    let live = send(
        &app,
        Method::POST,
        "/v1/runs",
        &bob,
        Body::Json(json!({ "version_id": b.version_id })),
    )
    .await;
    assert_eq!(live.status, 202, "{}", live.body);
    let live_run = id(&live.body, "run_id");
    app.wait_created(live_run).await;
    let path = format!("/v1/runs/{live_run}");
    assert_eq!(
        send(&app, Method::DELETE, &path, &bob, Body::None)
            .await
            .status,
        204
    );
    assert_eq!(
        send(&app, Method::DELETE, &path, &bob, Body::None)
            .await
            .status,
        404
    );
    assert_eq!(
        rows_naming(&app, &live_run.to_string()).await,
        BTreeMap::new()
    );

    // One version of beta.
    let path = format!("/v1/skills/beta/versions/{}", b.version);
    assert_eq!(
        send(&app, Method::DELETE, &path, &bob, Body::None)
            .await
            .status,
        204
    );
    assert_eq!(
        send(&app, Method::DELETE, &path, &bob, Body::None)
            .await
            .status,
        404
    );
    for gone in [
        b.version_id.to_string(),
        b.run.to_string(),
        b.comparison.to_string(),
    ] {
        assert_eq!(rows_naming(&app, &gone).await, BTreeMap::new(), "{gone}");
    }
    let versions = send(
        &app,
        Method::GET,
        "/v1/skills/beta/versions",
        &bob,
        Body::None,
    )
    .await;
    assert_eq!(
        versions.body["versions"].as_array().unwrap().len(),
        1,
        "{}",
        versions.body
    );
    // What beta holds now: its skill, the remaining version, that version's package, its run.
    let beta_ids = ids_of_skill(&app, "beta").await;
    assert!(beta_ids.contains(&b.other_run.to_string()), "{beta_ids:?}");
    assert!(beta_ids.len() >= 4, "{beta_ids:?}");

    // An alert of alpha's monitor and its notification, as the alert round records them.
    let alert = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO alerts (id, skill_id, monitor_id, rule, from_state, to_state, evaluation)
         SELECT $1, m.skill_id, m.id, 'pass-rate', 'ok', 'firing', '{}'::jsonb
         FROM monitors m JOIN skills s ON s.id = m.skill_id WHERE s.name = 'alpha'",
    )
    .bind(alert)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, event, url, body)
         VALUES ($1, 'alert.firing', 'http://127.0.0.1:9/hook', convert_to($2, 'UTF8'))",
    )
    .bind(Uuid::now_v7())
    .bind(json!({ "event": "alert.firing", "alert_id": alert, "skill": "alpha" }).to_string())
    .execute(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows_naming(&app, &alert.to_string()).await.len(), 2);
    let alpha_ids = [alpha_ids, vec![alert.to_string()]].concat();

    // The whole of alpha.
    assert_eq!(
        send(&app, Method::DELETE, "/v1/skills/alpha", &alice, Body::None)
            .await
            .status,
        204
    );
    assert_eq!(
        send(&app, Method::DELETE, "/v1/skills/alpha", &alice, Body::None)
            .await
            .status,
        404
    );
    for gone in &alpha_ids {
        assert_eq!(
            rows_naming(&app, gone).await,
            BTreeMap::new(),
            "alpha's {gone}"
        );
    }
    // Beta's remaining version and run are untouched.
    let kept = send(
        &app,
        Method::GET,
        &format!("/v1/runs/{}", b.other_run),
        &bob,
        Body::None,
    )
    .await;
    assert_eq!(kept.status, 200);
    assert!(!rows_naming(&app, &b.other_run.to_string()).await.is_empty());
    assert_eq!(ids_of_skill(&app, "beta").await, beta_ids);
    for kept in &beta_ids {
        assert!(!rows_naming(&app, kept).await.is_empty(), "beta's {kept}");
    }
    // And each deletion is audited.
    let audit = send(
        &app,
        Method::GET,
        "/v1/admin/audit?limit=1000",
        ROOT,
        Body::None,
    )
    .await;
    let deletes: Vec<&Value> = audit.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["method"] == "DELETE" && e["outcome"] == "succeeded")
        .collect();
    assert_eq!(deletes.len(), 3, "{}", audit.body);
    app.cleanup().await;
}

#[tokio::test]
async fn retention_sweeps_what_is_older_than_the_setting_and_nothing_newer() {
    let app = app_with(|s| {
        s.coordinator.retention = skilleval_infra::config::RetentionSettings {
            results_days: Some(30),
            outputs_days: Some(7),
            packages_days: Some(60),
            audit_days: Some(90),
        };
    })
    .await;
    let (kim, _) = token(&app, "kim", WRITER).await;
    let mut runs = Vec::new();
    let mut versions = Vec::new();
    for outputs in [["ok", "no"], ["ok", "ok"], ["no", "no"]] {
        let a = upload(&app, &kim, given_package("k", &outputs, json!({})), "").await;
        assert_eq!(a.status, 201, "{}", a.body);
        let run = id(&a.body, "run_id");
        finish_run(&app, run, 2, &[]).await;
        runs.push(run);
        versions.push(id(&a.body, "version_id"));
    }
    let age = |table: &'static str,
               column: &'static str,
               id_col: &'static str,
               id: Uuid,
               days: i32| {
        let pool = app.pool.clone();
        async move {
            let sql = format!(
                "UPDATE {table} SET {column} = now() - make_interval(days => $2) WHERE {id_col} = $1"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .bind(days)
                .execute(&pool)
                .await
                .unwrap();
        }
    };
    // Version 0 is 61 days old: its package goes, with its run; version 1 is 59 days old
    // and stays.
    age("skill_versions", "created_at", "id", versions[0], 61).await;
    age("skill_versions", "created_at", "id", versions[1], 59).await;
    // A skill's only (newest) version stays however old it is.
    let solo = upload(&app, &kim, given_package("solo", &["ok"], json!({})), "").await;
    assert_eq!(solo.status, 201, "{}", solo.body);
    let solo_run = id(&solo.body, "run_id");
    finish_run(&app, solo_run, 1, &[]).await;
    // Outputs as a worker records them.
    sqlx::query("UPDATE eval_results SET output = 'an output'")
        .execute(&app.pool)
        .await
        .unwrap();
    age(
        "skill_versions",
        "created_at",
        "id",
        id(&solo.body, "version_id"),
        400,
    )
    .await;
    // Run 1 is 31 days old (its results go); run 2 is 29 days old (stays).
    age("runs", "created_at", "id", runs[1], 31).await;
    age("runs", "created_at", "id", runs[2], 29).await;
    // Run 2's outputs finished 8 days ago (cleared); nothing else is that old.
    age("eval_results", "finished_at", "run_id", runs[2], 8).await;
    sqlx::query(
        "INSERT INTO audit_log (at, request_id, method, route, path, status, outcome)
         VALUES (now() - interval '91 days', 'old', 'POST', '/v1/runs', '/v1/runs', 202, 'succeeded'),
                (now() - interval '89 days', 'recent', 'POST', '/v1/runs', '/v1/runs', 202, 'succeeded')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let outputs_of = |run: Uuid| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM eval_results WHERE run_id = $1 AND output IS NOT NULL",
            )
            .bind(run)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(outputs_of(runs[2]).await, 2);

    skilleval_coordinator::startup::sweep_retention(
        &app.state.store,
        &app.settings.coordinator.retention,
    )
    .await;

    let exists = |sql: &'static str, id: Uuid| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>(sqlx::AssertSqlSafe(sql))
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    const VERSION: &str = "SELECT EXISTS (SELECT 1 FROM skill_versions WHERE id = $1)";
    const RUN: &str = "SELECT EXISTS (SELECT 1 FROM runs WHERE id = $1)";
    assert!(
        !exists(VERSION, versions[0]).await,
        "the old package stayed"
    );
    assert!(!exists(RUN, runs[0]).await, "the old package's run stayed");
    assert!(exists(VERSION, versions[1]).await);
    assert!(exists(VERSION, versions[2]).await);
    assert!(
        exists(VERSION, id(&solo.body, "version_id")).await,
        "the skill's newest version went"
    );
    assert!(
        !exists(RUN, runs[1]).await,
        "results older than 30 days stayed"
    );
    assert!(
        exists(RUN, runs[2]).await,
        "results newer than 30 days went"
    );
    assert_eq!(
        outputs_of(runs[2]).await,
        0,
        "outputs older than 7 days stayed"
    );
    assert_eq!(
        outputs_of(solo_run).await,
        1,
        "outputs newer than 7 days went"
    );
    let results: i64 = sqlx::query_scalar("SELECT count(*) FROM eval_results WHERE run_id = $1")
        .bind(runs[2])
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(results, 2, "clearing outputs removed results");
    let report = send(
        &app,
        Method::GET,
        &format!("/v1/runs/{}/results", runs[2]),
        &kim,
        Body::None,
    )
    .await;
    assert_eq!(report.status, 200, "{}", report.body);
    let audit: Vec<String> = sqlx::query_scalar(
        "SELECT request_id FROM audit_log WHERE request_id IN ('old', 'recent')",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(audit, vec!["recent".to_string()]);
    app.cleanup().await;
}

#[tokio::test]
async fn every_state_changing_request_is_audited_and_only_admin_reads_the_log() {
    let app = app_with(|_| {}).await;
    let (lee, prefix) = token(&app, "lee", WRITER).await;
    let a = app
        .client
        .post(format!("{}/v1/skills?run=false", app.address))
        .bearer_auth(&lee)
        .header("Content-Type", "application/zip")
        .header("X-Request-Id", "req-upload-1")
        .body(given_package("l", &["ok"], json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(a.status().as_u16(), 201);
    assert_eq!(a.headers()["x-request-id"], "req-upload-1");
    // Refused (another publisher's... nothing: no such run) and unauthenticated changes too.
    let missing = format!("/v1/runs/{}/cancel", Uuid::now_v7());
    assert_eq!(
        send(&app, Method::POST, &missing, &lee, Body::None)
            .await
            .status,
        404
    );
    assert_eq!(
        send(&app, Method::POST, &missing, "wrong", Body::None)
            .await
            .status,
        401
    );
    // Reads are not audited.
    send(&app, Method::GET, "/v1/skills/l/versions", &lee, Body::None).await;
    // Lee is no admin.
    let refused = send(&app, Method::GET, "/v1/admin/audit", &lee, Body::None).await;
    assert_eq!(refused.status, 403);

    let page = send(
        &app,
        Method::GET,
        "/v1/admin/audit?limit=2",
        ROOT,
        Body::None,
    )
    .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let entries = page.body["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["status"], 401);
    assert_eq!(entries[0]["outcome"], "refused");
    assert!(entries[0]["publisher_id"].is_null());
    assert_eq!(entries[1]["status"], 404);
    assert_eq!(entries[1]["token_prefix"], prefix.as_str());
    let cursor = page.body["next_cursor"].as_str().unwrap();
    let next = send(
        &app,
        Method::GET,
        &format!("/v1/admin/audit?limit=2&cursor={cursor}"),
        ROOT,
        Body::None,
    )
    .await;
    let entries = next.body["entries"].as_array().unwrap();
    let upload = &entries[0];
    assert_eq!(upload["route"], "/v1/skills");
    assert_eq!(upload["request_id"], "req-upload-1");
    assert_eq!(upload["outcome"], "succeeded");
    assert_eq!(upload["token_prefix"], prefix.as_str());
    // The token's creation is the entry before.
    assert_eq!(entries[1]["route"], "/v1/admin/tokens");
    assert_eq!(entries[1]["token_prefix"], "static#1");
    app.cleanup().await;
}

#[tokio::test]
async fn without_tokens_configured_every_request_is_the_implicit_publisher() {
    let app = spawn_app_configured(AppOptions::default(), |_| {}).await;
    let a = app
        .upload_zip(given_package("dev", &["ok"], json!({})), "?run=false")
        .await;
    assert_eq!(a.status().as_u16(), 201);
    let owner: Uuid = sqlx::query_scalar("SELECT publisher_id FROM skills WHERE name = 'dev'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(owner, skilleval_infra::store::tenancy::DEFAULT_PUBLISHER);
    app.cleanup().await;
}

/// `skilleval-coordinator tokens <args>` against the app's database: exit status and output.
fn tokens_cli(app: &TestApp, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_skilleval-coordinator"))
        .arg("tokens")
        .args(args)
        .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
        .env("DATABASE_URL", app.settings.database.url.expose())
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_tokens_command_creates_lists_and_revokes_and_stores_only_a_hash() {
    let app = app_with(|_| {}).await;
    let (ok, out, err) = tokens_cli(
        &app,
        &[
            "create",
            "--publisher",
            "ops",
            "--scopes",
            "read,runs:write",
        ],
    );
    assert!(ok, "{err}");
    let created: Value = serde_json::from_str(&out).unwrap();
    let secret = created["token"].as_str().unwrap().to_string();
    let prefix = created["prefix"].as_str().unwrap().to_string();
    assert!(secret.starts_with(&prefix) && secret.len() > prefix.len() + 40);
    assert_eq!(created["scopes"], json!(["read", "runs:write"]));
    // The secret is nowhere in the database; its SHA-256 is.
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_tokens t WHERE t::text LIKE '%' || $1 || '%'")
            .bind(&secret)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(rows, 0);
    let by_hash: i64 =
        sqlx::query_scalar("SELECT count(*) FROM api_tokens WHERE token_hash = sha256($1::bytea)")
            .bind(secret.as_bytes())
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(by_hash, 1);
    // It works, and a listing never shows it again.
    let a = send(
        &app,
        Method::GET,
        "/v1/skills/x/versions",
        &secret,
        Body::None,
    )
    .await;
    assert_eq!(a.status, 404);
    let (ok, out, err) = tokens_cli(&app, &["list"]);
    assert!(ok, "{err}");
    assert!(out.contains(&prefix) && !out.contains(&secret), "{out}");
    // Bad input names the flag and the rule.
    let (ok, _, err) = tokens_cli(
        &app,
        &["create", "--publisher", "ops", "--scopes", "write-all"],
    );
    assert!(
        !ok && err.contains("--scopes") && err.contains("unknown scope `write-all`"),
        "{err}"
    );
    let bad = send(
        &app,
        Method::POST,
        "/v1/admin/tokens",
        ROOT,
        Body::Json(json!({ "publisher": "ops", "scopes": ["read", "root"] })),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.body["error"]["details"]["field"], "/scopes");
    let (ok, _, err) = tokens_cli(&app, &["revoke", "skev_nonexistent"]);
    assert!(!ok && err.contains("skev_nonexistent"), "{err}");
    let (ok, out, err) = tokens_cli(&app, &["revoke", &prefix]);
    assert!(ok, "{err}");
    assert!(out.contains("revoked_at"));
    let a = send(
        &app,
        Method::GET,
        "/v1/skills/x/versions",
        &secret,
        Body::None,
    )
    .await;
    assert_eq!(a.status, 401);
    assert_eq!(a.headers["www-authenticate"], "Bearer");
    app.cleanup().await;
}
