//! Production sampling against the real PostgreSQL and RabbitMQ: monitors and revisions,
//! ingest (idempotent, deterministic and nested sampling, per-item errors, caps), grading by
//! a real worker on the samples lane, quality buckets with hand-computed Wilson intervals,
//! alerts that fire and resolve once, and the retention sweep.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use skilleval::monitor::is_sampled;
use uuid::Uuid;

use crate::e2e::start_worker_with;
use crate::helpers::{spawn_app, spawn_app_with, AppOptions, TestApp};
use crate::packages::{given_tests, skill_md, zip_of};

/// A `given` package whose definition carries a monitor: a sample passes when its output
/// contains "ok".
pub(crate) fn monitored_package(name: &str, monitoring: Value) -> Vec<u8> {
    let mut tests = given_tests(&["ok", "ok"], json!({}));
    tests["monitoring"] = monitoring;
    let tests = serde_json::to_vec_pretty(&tests).unwrap();
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        ("eval/tests.json", &tests),
    ])
}

pub(crate) fn says_ok(rate: f64) -> Value {
    json!({
        "sample_rate": rate,
        "criteria": [{"name": "says-ok", "strategy": "contains", "options": {"includes": ["ok"]}}]
    })
}

pub(crate) fn sample(id: &str, output: &str, observed_at: Option<DateTime<Utc>>) -> Value {
    let mut s = json!({"sample_id": id, "input": "hi", "output": output, "version": "1.0.0"});
    if let Some(t) = observed_at {
        s["observed_at"] = json!(t.to_rfc3339());
    }
    s
}

async fn upload(app: &TestApp, zip: Vec<u8>) {
    let r = app.upload_zip(zip, "?run=false").await;
    assert_eq!(r.status().as_u16(), 201, "{:?}", r.text().await);
}

async fn ingest(app: &TestApp, skill: &str, batch: &Value) -> (u16, Value) {
    let r = app
        .post_json(&format!("/v1/skills/{skill}/samples"), batch)
        .await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn put_monitor(app: &TestApp, skill: &str, doc: &Value) -> (u16, Value) {
    let r = app
        .client
        .put(format!("{}/v1/skills/{skill}/monitor", app.address))
        .json(doc)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Graded samples of the skill (rows of the `sample_results` view).
async fn graded(app: &TestApp, skill: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM sample_results r JOIN skills s ON s.id = r.skill_id WHERE s.name = $1",
    )
    .bind(skill)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

async fn wait_graded(app: &TestApp, skill: &str, n: i64, within: Duration) -> i64 {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let got = graded(app, skill).await;
        if got >= n || tokio::time::Instant::now() >= deadline {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sampled_ids(app: &TestApp, skill: &str) -> HashSet<String> {
    sqlx::query_scalar(
        "SELECT sample_id FROM samples x JOIN skills s ON s.id = x.skill_id
         WHERE s.name = $1 AND disposition = 'sampled'",
    )
    .bind(skill)
    .fetch_all(&app.pool)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

#[tokio::test]
async fn a_monitor_is_seeded_by_the_package_versioned_and_validated_with_pointers() {
    let app = spawn_app().await;
    upload(&app, monitored_package("mon", says_ok(0.5))).await;
    let (status, m) = app.get_json("/v1/skills/mon/monitor").await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(m["revision"], 1);
    assert_eq!(m["source"], "package");
    assert_eq!(m["monitor"]["sample_rate"], 0.5);
    let monitor_id = m["monitor_id"].clone();

    // Every problem is named by its pointer; nothing is stored.
    let (status, err) = put_monitor(
        &app,
        "mon",
        &json!({"sample_rate": 2, "criteria": [{"name": "x", "strategy": "exact_match"}]}),
    )
    .await;
    assert_eq!(status, 422, "{err}");
    assert_eq!(err["error"]["code"], "monitor_invalid");
    let pointers: Vec<&str> = err["error"]["details"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pointer"].as_str().unwrap())
        .collect();
    assert!(pointers.contains(&"/sample_rate"), "{pointers:?}");
    assert!(pointers.contains(&"/criteria/0/strategy"), "{pointers:?}");
    assert!(err["error"]["details"]["field"].is_string());

    // A change is a new revision; the same document again is not.
    let (status, m) = put_monitor(&app, "mon", &says_ok(0.8)).await;
    assert_eq!(status, 200, "{m}");
    assert_eq!(
        (m["revision"].as_i64(), m["changed"].as_bool()),
        (Some(2), Some(true))
    );
    assert_eq!(m["source"], "api");
    assert_eq!(
        m["monitor_id"], monitor_id,
        "the sampling identity survives revisions"
    );
    let (_, m) = put_monitor(&app, "mon", &says_ok(0.8)).await;
    assert_eq!(
        (m["revision"].as_i64(), m["changed"].as_bool()),
        (Some(2), Some(false))
    );
    // Re-uploading the unchanged package does not undo the API's revision.
    upload(&app, monitored_package("mon", says_ok(0.5))).await;
    let (_, m) = app.get_json("/v1/skills/mon/monitor").await;
    assert_eq!(
        (m["revision"].as_i64(), &m["monitor"]["sample_rate"]),
        (Some(2), &json!(0.8))
    );
    // A changed section in a new package is a new revision.
    upload(&app, monitored_package("mon", says_ok(0.3))).await;
    let (_, m) = app.get_json("/v1/skills/mon/monitor").await;
    assert_eq!(
        (m["revision"].as_i64(), m["source"].as_str()),
        (Some(3), Some("package"))
    );
    assert_eq!(app.count("monitor_revisions").await, 3);

    let (status, _) = app.get_json("/v1/skills/nobody/monitor").await;
    assert_eq!(status, 404);
    let (status, _) = put_monitor(&app, "nobody", &says_ok(0.1)).await;
    assert_eq!(status, 404);
    app.cleanup().await;
}

#[tokio::test]
async fn ingest_answers_404_for_an_unknown_skill_and_409_without_a_monitor() {
    let app = spawn_app().await;
    let (status, body) = ingest(&app, "ghost", &json!([sample("a", "ok", None)])).await;
    assert_eq!(status, 404, "{body}");
    upload(
        &app,
        crate::packages::given_package("plain", &["ok"], json!({})),
    )
    .await;
    let (status, body) = ingest(&app, "plain", &json!([sample("a", "ok", None)])).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "no_monitor");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("PUT /v1/skills/plain/monitor"),
        "{body}"
    );
    assert_eq!(app.count("samples").await, 0);
    app.cleanup().await;
}

#[tokio::test]
async fn sampling_is_deterministic_nested_and_per_item_errors_do_not_reject_the_batch() {
    let app = spawn_app().await;
    upload(&app, monitored_package("det", says_ok(0.3))).await;
    let (_, m) = app.get_json("/v1/skills/det/monitor").await;
    let identity = m["monitor_id"].as_str().unwrap().to_string();

    let mut batch: Vec<Value> = (0..200)
        .map(|i| sample(&format!("a-{i:03}"), "ok", None))
        .collect();
    batch.insert(7, json!({"sample_id": "bad-1", "input": "x"}));
    batch.insert(
        50,
        json!({"sample_id": "bad-2", "input": "x", "output": "y", "observed_at": "yesterday"}),
    );
    batch.push(sample("a-000", "ok again", None));
    let (status, r) = ingest(&app, "det", &json!(batch)).await;
    assert_eq!(status, 200, "{r}");
    let errors = r["errors"].as_array().unwrap();
    let at: Vec<(u64, &str)> = errors
        .iter()
        .map(|e| (e["index"].as_u64().unwrap(), e["pointer"].as_str().unwrap()))
        .collect();
    assert!(at.contains(&(7, "/output")), "{at:?}");
    assert!(at.contains(&(50, "/observed_at")), "{at:?}");
    assert_eq!(r["accepted"], 200);
    assert_eq!(r["duplicates"], 1, "a-000 twice in one batch");
    let expected: HashSet<String> = (0..200)
        .map(|i| format!("a-{i:03}"))
        .filter(|id| is_sampled(&identity, id, 0.3))
        .collect();
    assert_eq!(r["sampled"], expected.len());
    assert_eq!(r["dropped_unsampled"], 200 - expected.len());
    assert_eq!(sampled_ids(&app, "det").await, expected, "the hash decides");

    // The same batch again: every item a duplicate, no new run.
    let runs = app.count("runs").await;
    let (_, again) = ingest(&app, "det", &json!(batch)).await;
    assert_eq!(again["accepted"], 0);
    assert_eq!(again["duplicates"], 201);
    assert!(again.get("run_id").is_none());
    assert_eq!(app.count("runs").await, runs);

    // Raising the rate keeps what the lower rate took (nested), for new traffic too.
    put_monitor(&app, "det", &says_ok(0.6)).await;
    let fresh: Vec<Value> = (0..200)
        .map(|i| sample(&format!("b-{i:03}"), "ok", None))
        .collect();
    let (_, r) = ingest(&app, "det", &json!(fresh)).await;
    assert_eq!(r["monitor_revision"], 2);
    let taken = sampled_ids(&app, "det").await;
    let low: Vec<String> = (0..200)
        .map(|i| format!("b-{i:03}"))
        .filter(|id| is_sampled(&identity, id, 0.3))
        .collect();
    assert!(low.iter().all(|id| taken.contains(id)), "nested");
    let high = (0..200)
        .map(|i| format!("b-{i:03}"))
        .filter(|id| taken.contains(id))
        .count();
    assert!(high > low.len(), "{high} vs {}", low.len());
    assert_eq!(r["sampled"], high);
    app.cleanup().await;
}

#[tokio::test]
async fn batch_limits_and_caps_are_visible() {
    let app = spawn_app().await;
    upload(
        &app,
        monitored_package(
            "caps",
            json!({
                "sample_rate": 1.0,
                "max_samples_per_hour": 5,
                "filters": {"channel": "web"},
                "criteria": [{"name": "says-ok", "strategy": "contains", "options": {"includes": ["ok"]}}]
            }),
        ),
    )
    .await;
    let batch: Vec<Value> = (0..10)
        .map(|i| {
            let mut s = sample(&format!("c-{i}"), "ok", None);
            s["metadata"] = json!({"channel": if i < 8 { "web" } else { "phone" }});
            s
        })
        .collect();
    let (_, r) = ingest(&app, "caps", &json!(batch)).await;
    assert_eq!(r["accepted"], 10, "{r}");
    assert_eq!(r["dropped_filtered"], 2);
    assert_eq!(r["sampled"], 5);
    assert_eq!(r["dropped_over_hourly_cap"], 3);
    // The next batch this hour finds the cap spent.
    let mut s = sample("c-late", "ok", None);
    s["metadata"] = json!({"channel": "web"});
    let (_, r) = ingest(&app, "caps", &json!([s])).await;
    assert_eq!(
        (r["sampled"].as_u64(), r["dropped_over_hourly_cap"].as_u64()),
        (Some(0), Some(1))
    );

    // Over the configured count: the whole batch is refused, naming the limit.
    let many: Vec<Value> = (0..1001)
        .map(|i| sample(&format!("m-{i}"), "ok", None))
        .collect();
    let (status, body) = ingest(&app, "caps", &json!(many)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"]["details"]["limit"],
        "coordinator.sampling.max_batch_samples"
    );
    app.cleanup().await;
}

/// Settings for a worker that grades samples quickly.
fn fast_samples(app: &TestApp) -> skilleval_infra::config::Settings {
    let mut settings = app.settings.clone();
    settings.worker.samples_concurrency = Some(4);
    settings
}

#[tokio::test]
async fn the_same_batch_twice_is_graded_once_on_the_samples_lane() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    upload(&app, monitored_package("idem", says_ok(1.0))).await;
    let batch: Vec<Value> = (0..40)
        .map(|i| {
            sample(
                &format!("s-{i:02}"),
                if i % 4 == 0 { "bad" } else { "ok" },
                None,
            )
        })
        .collect();
    let (_, first) = ingest(&app, "idem", &json!(batch)).await;
    assert_eq!(first["sampled"], 40, "{first}");
    // Published on the samples queue, not the CI one.
    let samples_queue = app.topology.samples_queue();
    let mut depth = 0;
    for _ in 0..50 {
        depth = app.queue_depth(&samples_queue).await;
        if depth == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(depth, 40);
    assert_eq!(app.queue_depth(&app.topology.jobs_queue()).await, 0);
    let (_, second) = ingest(&app, "idem", &json!(batch)).await;
    assert_eq!(
        (second["accepted"].as_u64(), second["duplicates"].as_u64()),
        (Some(0), Some(40))
    );

    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(fast_samples(&app), cache.path()).await;
    assert_eq!(
        wait_graded(&app, "idem", 40, Duration::from_secs(60)).await,
        40
    );
    let run_id: Uuid = first["run_id"].as_str().unwrap().parse().unwrap();
    for _ in 0..100 {
        let finalised: bool = sqlx::query_scalar("SELECT finalised FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if finalised {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (kind, status, passed, failed): (String, String, i32, i32) =
        sqlx::query_as("SELECT kind, status, passed, failed FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((kind.as_str(), status.as_str()), ("samples", "completed"));
    assert_eq!((passed, failed), (30, 10));
    // Every result row is one graded sample, recorded with the revision it was graded with.
    assert_eq!(app.count("eval_results").await, 40);
    let revisions: Vec<i32> =
        sqlx::query_scalar("SELECT DISTINCT monitor_revision FROM sample_results")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(revisions, [1]);
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}
