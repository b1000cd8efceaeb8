//! Production sampling against the real PostgreSQL and RabbitMQ: monitors and revisions,
//! ingest (idempotent, deterministic and nested sampling, per-item errors, caps), grading by
//! a real worker on the samples lane, quality buckets with hand-computed Wilson intervals,
//! alerts that fire and resolve once, and the retention sweep.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use skilleval_execution::monitor::is_sampled;
use skilleval_infra::config::WorkerSettings;
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

/// Polls until `n` samples of the skill are graded; returns how many were. `within` is a
/// guard against a hang (60 s or more): the caller checks the count.
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
    for _ in 0..300 {
        depth = app.queue_depth(&samples_queue).await;
        if depth == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(depth, 40, "hang guard: waited up to 30 s");
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
    // Until finalised; the status below says if it never was (a guard against a hang, 30 s).
    for _ in 0..300 {
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

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
}

/// `n` samples with ids `{prefix}-{i}`, the first `passing` saying "ok", observed from
/// `start` every `step`.
fn history(
    prefix: &str,
    n: usize,
    passing: usize,
    start: DateTime<Utc>,
    step: chrono::Duration,
    version: &str,
) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut s = sample(
                &format!("{prefix}-{i:04}"),
                if i < passing { "ok" } else { "bad" },
                Some(start + step * i32::try_from(i).unwrap()),
            );
            s["version"] = json!(version);
            s
        })
        .collect()
}

fn close(got: &Value, want: f64) {
    let got = got.as_f64().unwrap_or(f64::NAN);
    assert!((got - want).abs() < 5e-5, "{got} != {want}");
}

#[tokio::test]
async fn quality_buckets_carry_hand_computed_wilson_intervals_and_old_samples_are_swept() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    upload(&app, monitored_package("qual", says_ok(1.0))).await;
    let day1 = at("2026-10-01T00:00:00Z");
    let day2 = at("2026-10-02T00:00:00Z");
    let hour = chrono::Duration::hours(1);
    let (_, first) = ingest(
        &app,
        "qual",
        &json!(history("d1", 10, 7, day1 + hour, hour, "1.0.0")),
    )
    .await;
    let (_, second) = ingest(
        &app,
        "qual",
        &json!(history("d2", 20, 5, day2, hour, "1.1.0")),
    )
    .await;
    assert_eq!(
        (first["sampled"].as_u64(), second["sampled"].as_u64()),
        (Some(10), Some(20))
    );
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(fast_samples(&app), cache.path()).await;
    assert_eq!(
        wait_graded(&app, "qual", 30, Duration::from_secs(60)).await,
        30
    );

    let (status, q) = app
        .get_json(
            "/v1/skills/qual/quality?from=2026-10-01T00:00:00Z&to=2026-10-03T00:00:00Z&bucket=day",
        )
        .await;
    assert_eq!(status, 200, "{q}");
    let b = q["buckets"].as_array().unwrap();
    assert_eq!(b.len(), 2);
    // 7 of 10: Wilson 95 %, z = 1.959964, by hand:
    // centre = (0.7 + z²/20) / (1 + z²/10) = 0.892073 / 1.384146 = 0.644491
    // half   = z·√(0.7·0.3/10 + z²/400) / 1.384146 = 0.247715  ->  [0.396776, 0.892206]
    assert_eq!(
        (b[0]["n"].as_u64(), b[0]["passed"].as_u64()),
        (Some(10), Some(7))
    );
    close(&b[0]["pass_rate"], 0.7);
    close(&b[0]["pass_rate_ci"]["low"], 0.396776);
    close(&b[0]["pass_rate_ci"]["high"], 0.892206);
    // 5 of 20: centre = (0.25 + z²/40) / (1 + z²/20) = 0.346037 / 1.192073 = 0.290282
    // half = z·√(0.25·0.75/20 + z²/1600) / 1.192073 = 0.178418  ->  [0.111864, 0.468701]
    assert_eq!(
        (b[1]["n"].as_u64(), b[1]["passed"].as_u64()),
        (Some(20), Some(5))
    );
    close(&b[1]["pass_rate"], 0.25);
    close(&b[1]["pass_rate_ci"]["low"], 0.111864);
    close(&b[1]["pass_rate_ci"]["high"], 0.468701);
    close(&b[1]["criteria"]["says-ok"], 0.25);
    assert_eq!(q["total"]["n"], 30);
    let markers = q["markers"].as_array().unwrap();
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(
        (markers[0]["kind"].as_str(), markers[0]["to"].as_str()),
        (Some("version"), Some("1.1.0"))
    );
    // One version only.
    let (_, v) = app
        .get_json("/v1/skills/qual/quality?from=2026-10-01T00:00:00Z&to=2026-10-03T00:00:00Z&version=1.0.0")
        .await;
    assert_eq!(v["total"]["n"], 10);
    // Markdown and a self-contained HTML page, by format= or by Accept.
    let md = app
        .get("/v1/skills/qual/quality?from=2026-10-01T00:00:00Z&to=2026-10-03T00:00:00Z&format=markdown")
        .await;
    assert!(md.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    assert!(md.text().await.unwrap().contains("| 2026-10-02"));
    let html = app
        .client
        .get(format!(
            "{}/v1/skills/qual/quality?from=2026-10-01T00:00:00Z&to=2026-10-03T00:00:00Z",
            app.address
        ))
        .header("Accept", "text/html")
        .send()
        .await
        .unwrap();
    assert!(html.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = html.text().await.unwrap();
    assert!(page.contains("<svg"), "a chart");
    assert!(
        !page.contains("<script src") && !page.contains("<link"),
        "self-contained"
    );
    // A bad range names the parameter.
    let (status, e) = app
        .get_json("/v1/skills/qual/quality?from=2026-10-03T00:00:00Z&to=2026-10-01T00:00:00Z")
        .await;
    assert_eq!(
        (status, e["error"]["details"]["field"].as_str()),
        (400, Some("from"))
    );
    // So does a criterion the monitor never had.
    let (status, e) = app
        .get_json("/v1/skills/qual/quality?from=2026-10-01T00:00:00Z&to=2026-10-03T00:00:00Z&criterion=nope")
        .await;
    assert_eq!(
        (status, e["error"]["details"]["field"].as_str()),
        (400, Some("criterion"))
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("`nope`"),
        "{e}"
    );

    // Retention: the first batch (received "100 days ago") goes, with its finished run and
    // results; the second stays.
    let run1: Uuid = first["run_id"].as_str().unwrap().parse().unwrap();
    let run2: Uuid = second["run_id"].as_str().unwrap().parse().unwrap();
    // Until both are finalised (a guard against a hang, 30 s: what follows needs them so).
    for _ in 0..300 {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE finalised")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if n == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sqlx::query("UPDATE samples SET received_at = now() - interval '100 days' WHERE run_id = $1")
        .bind(run1)
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET created_at = now() - interval '100 days' WHERE id = $1")
        .bind(run1)
        .execute(&app.pool)
        .await
        .unwrap();
    skilleval_coordinator::startup::sweep_samples(&app.state.store, 90).await;
    assert_eq!(app.count("samples").await, 20);
    let runs: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM runs WHERE kind = 'samples'")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(runs, [run2]);
    assert_eq!(app.count("eval_results").await, 20);
    assert_eq!(graded(&app, "qual").await, 20);
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

#[tokio::test]
async fn an_alert_fires_once_on_a_drop_resolves_once_and_a_small_window_stays_quiet() {
    let app = spawn_app().await;
    let hooks = crate::helpers::WebhookReceiver::start().await;
    let monitor = |rate: f64| {
        let mut m = says_ok(rate);
        m["alerts"] = json!([{"name": "drop", "min_samples": 40}]);
        m
    };
    for skill in ["alerty", "quiet"] {
        upload(&app, monitored_package(skill, monitor(1.0))).await;
        let url = format!(
            "{}/v1/skills/{skill}/monitor?callback_url={}",
            app.address, hooks.url
        );
        let r = app
            .client
            .put(url)
            .json(&monitor(1.0))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    let t = at("2026-10-10T00:00:00Z");
    let h = chrono::Duration::hours(1);
    // Baseline: 140 samples hourly from 8 days back (the history is old enough to judge),
    // 90 % pass; then a day at 50 % (50 samples).
    let baseline = history("base", 140, 126, t - chrono::Duration::days(8), h, "1.0.0");
    let drop = history(
        "drop",
        50,
        25,
        t - h * 20,
        chrono::Duration::minutes(20),
        "1.1.0",
    );
    ingest(&app, "alerty", &json!(baseline)).await;
    ingest(&app, "alerty", &json!(drop)).await;
    // The quiet skill drops as much, but its window holds 10 graded samples (< 40).
    ingest(
        &app,
        "quiet",
        &json!(history(
            "base",
            140,
            126,
            t - chrono::Duration::days(8),
            h,
            "1.0.0"
        )),
    )
    .await;
    ingest(
        &app,
        "quiet",
        &json!(history("drop", 10, 2, t - h * 20, h, "1.1.0")),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(fast_samples(&app), cache.path()).await;
    assert_eq!(
        wait_graded(&app, "alerty", 190, Duration::from_secs(90)).await,
        190
    );
    assert_eq!(
        wait_graded(&app, "quiet", 150, Duration::from_secs(90)).await,
        150
    );

    let alerts = &app.state.alerts;
    // Breach, breach (fires: 2 of 3), breach (still firing: no second alert).
    for hours in 1..=3 {
        let round = alerts.round(t + h * hours).await.unwrap();
        assert!(round.leased);
        let fired: Vec<&str> = round.transitions.iter().map(|a| a.skill.as_str()).collect();
        assert_eq!(
            fired,
            if hours == 2 { vec!["alerty"] } else { vec![] },
            "at +{hours} h"
        );
    }
    // A second evaluation within the gap (another coordinator's round) is skipped.
    let again = alerts
        .round(t + h * 3 + chrono::Duration::seconds(10))
        .await
        .unwrap();
    assert_eq!(again.evaluated, 0);
    // Recovery: a good day after the drop.
    let good = history(
        "good",
        60,
        60,
        t + h * 7,
        chrono::Duration::minutes(20),
        "1.1.1",
    );
    ingest(&app, "alerty", &json!(good)).await;
    assert_eq!(
        wait_graded(&app, "alerty", 250, Duration::from_secs(60)).await,
        250
    );
    let mut resolved_at = Vec::new();
    for hours in 30..=33 {
        let round = alerts.round(t + h * hours).await.unwrap();
        if !round.transitions.is_empty() {
            resolved_at.push(hours);
        }
    }
    assert_eq!(
        resolved_at,
        [31],
        "resolves once, when fewer than 2 of the last 3 breach"
    );

    let delivered = hooks.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(delivered.len(), 2);
    let events: Vec<&str> = delivered
        .iter()
        .map(|(h, _)| h["x-skilleval-event"].as_str())
        .collect();
    assert_eq!(events, ["alert.firing", "alert.resolved"]);
    for (headers, body) in &delivered {
        assert!(skilleval_coordinator::webhook::verify(
            crate::helpers::WEBHOOK_SECRET.as_bytes(),
            body,
            &headers["x-skilleval-signature"]
        ));
        let body: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(body["skill"], "alerty");
    }

    let (_, list) = app.get_json("/v1/skills/alerty/alerts").await;
    let transitions: Vec<(&str, &str)> = list["alerts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["from_state"].as_str().unwrap(),
                a["to_state"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(transitions, [("firing", "resolved"), ("ok", "firing")]);
    assert_eq!(list["rules"][0]["state"], "resolved");
    let firing = &list["alerts"][1]["evaluation"];
    assert_eq!(firing["finding"], "breached");
    assert_eq!(
        (
            firing["window"]["n"].as_u64(),
            firing["window"]["passed"].as_u64()
        ),
        (Some(50), Some(25))
    );
    let (_, quiet) = app.get_json("/v1/skills/quiet/alerts").await;
    assert_eq!(quiet["alerts"], json!([]));
    assert_eq!(quiet["rules"][0]["state"], "no_data");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

/// Uploads the calculator example and waits for its verdict; returns the run.
async fn calculator_run(app: &TestApp, zip: &[u8]) -> Uuid {
    let upload: Value = app.upload_zip(zip.to_vec(), "").await.json().await.unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = crate::e2e::wait_for_verdict(app, &run_id).await;
    assert_eq!(run["status"], "completed", "{run}");
    run_id.parse().unwrap()
}

/// When each job of a run was taken, in order, as the worker recorded it: the executor
/// stamps a result's `started_at` when it takes the job (`Executor::execute`), which the
/// worker calls once the job holds an execution slot of its lane.
async fn job_starts(app: &TestApp, run_id: Uuid) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT started_at FROM eval_results
         WHERE run_id = $1 AND started_at IS NOT NULL ORDER BY started_at",
    )
    .bind(run_id)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

/// When each graded sample of the skill was taken (the same record), in order.
async fn sample_starts(app: &TestApp, skill: &str) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar(
        "SELECT r.started_at FROM samples x
         JOIN skills s ON s.id = x.skill_id
         JOIN eval_results r ON r.run_id = x.run_id AND r.test_case_id = x.sample_id
         WHERE s.name = $1 AND r.started_at IS NOT NULL ORDER BY r.started_at",
    )
    .bind(skill)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

/// Polls until `queue` holds `n` messages ready; the deadline only guards against a hang.
async fn wait_for_depth(app: &TestApp, queue: &str, n: u32) {
    let mut depth = 0;
    for _ in 0..600 {
        depth = app.queue_depth(queue).await;
        if depth >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: {queue} held {depth} of {n} messages after 60 s");
}

#[tokio::test]
async fn an_upload_run_is_not_starved_by_queued_samples() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    if skilleval_sandbox::Sandbox::detect(app.settings.sandbox.clone())
        .unavailable_reason()
        .is_some()
    {
        eprintln!("bubblewrap is not available: skipping the lane priority test");
        app.cleanup().await;
        return;
    }
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills/calculator");
    let zip = skilleval_cli::submit::zip_folder(&example).unwrap();
    upload(&app, monitored_package("flood", says_ok(1.0))).await;
    // Warm-up: a worker fetches and caches the package, and goes.
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    calculator_run(&app, &zip).await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;

    // 3,000 samples queued on the samples lane (the full 20,000 is the benchmark's, which
    // also prints how much longer the run takes than idle), then the upload's jobs behind
    // them, all before a worker is there: what it takes first is its own choice.
    const FLOOD: usize = 3_000;
    for batch in 0..FLOOD / 1_000 {
        let items: Vec<Value> = (0..1_000)
            .map(|i| sample(&format!("f-{batch}-{i:04}"), "ok", None))
            .collect();
        let (_, r) = ingest(&app, "flood", &json!(items)).await;
        assert_eq!(r["sampled"], 1_000);
    }
    wait_for_depth(&app, &app.topology.samples_queue(), 3_000).await;
    let upload: Value = app.upload_zip(zip.clone(), "").await.json().await.unwrap();
    let run_id: Uuid = upload["run_id"].as_str().expect("a run").parse().unwrap();
    wait_for_depth(&app, &app.topology.jobs_queue(), 6).await;

    // The default split (`start_worker_with`: 4 CI slots, and a quarter of that, 1, for
    // samples), each lane with a semaphore, a consumer and a prefetch of its own. The broker
    // sends a lane no more than its prefetch of unacked deliveries, and the worker acks a job
    // only once the batch holding its result is committed. Batches of 8, the upload's 6
    // results and 2 samples, make that moment an event rather than a time: the first batch
    // cannot commit before the upload's last job is done, so until then the samples lane
    // holds its first prefetch of samples and nothing more (60 s of batch wait only guards
    // against a hang: 8 results arrive long before).
    let mut settings = app.settings.clone();
    settings.worker.batch_size = 8;
    settings.worker.batch_max_wait_ms = 60_000;
    let (stop, worker) = start_worker_with(settings.clone(), cache.path()).await;
    let samples_prefetch = usize::from(WorkerSettings::prefetch_for(
        settings.worker.samples_slots(),
    ));
    let run = crate::e2e::wait_for_verdict(&app, &run_id.to_string()).await;
    assert_eq!(run["status"], "completed", "{run}");
    let graded_then = graded(&app, "flood").await;
    assert!(
        graded_then < i64::try_from(FLOOD).unwrap(),
        "the flood was still there when the upload run finished ({graded_then} graded)"
    );
    // Stopped, the worker has committed every job it took: the record below is complete.
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;

    // The order in which the worker took the jobs: every upload job before the samples lane
    // took more than its prefetch (2: twice its 1 slot). An upload job waits for a CI slot
    // and nothing else, and CI slots are the CI lane's alone. Were the samples ahead of the
    // upload in a queue both lanes share, or handed slots first, the upload jobs would be
    // taken after the flood, or after the part of it already delivered: a worker changed to
    // consume each lane's queue with the other lane's slots took 24 samples before the second
    // upload job, one changed to take its samples deliveries first, from one pool of slots,
    // took 200 before the first.
    let jobs = job_starts(&app, run_id).await;
    assert_eq!(jobs.len(), 6, "one result per calculator case: {jobs:?}");
    let samples = sample_starts(&app, "flood").await;
    for (i, &started) in jobs.iter().enumerate() {
        let samples_before = samples.iter().filter(|&&s| s < started).count();
        assert!(
            samples_before <= samples_prefetch,
            "upload job {i} was taken after {samples_before} samples (at most the samples \
             lane's prefetch, {samples_prefetch}); {} samples were taken in all",
            samples.len()
        );
    }
    eprintln!(
        "with {FLOOD} samples queued: {graded_then} graded when the upload run finished, {} taken in all",
        samples.len()
    );
    app.cleanup().await;
}

#[tokio::test]
async fn samples_push_sends_a_log_in_batches_and_a_second_push_is_all_duplicates() {
    let app = spawn_app().await;
    upload(&app, monitored_package("pushed", says_ok(0.5))).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("log.jsonl");
    let mut lines: Vec<String> = (0..25)
        .map(|i| sample(&format!("l-{i:02}"), "ok", None).to_string())
        .collect();
    lines.insert(3, "{not json".into());
    lines.insert(
        12,
        json!({"sample_id": "no-output", "input": "x"}).to_string(),
    );
    lines.insert(20, String::new());
    std::fs::write(&file, lines.join("\n")).unwrap();
    let args = skilleval_cli::samples::PushArgs {
        file: file.clone(),
        server: app.address.clone(),
        skill: "pushed".into(),
        token: None,
        batch_size: 10,
        attempts: 2,
        quiet: true,
    };
    let first = skilleval_cli::samples::push(&args).await.unwrap();
    assert_eq!((first.lines, first.batches), (27, 3), "{first:?}");
    assert_eq!(first.accepted, 25);
    assert_eq!(first.sampled + first.dropped, 25);
    assert_eq!(first.errors.len(), 2, "{:?}", first.errors);
    assert!(
        first.errors[0].starts_with("line 4: not JSON"),
        "{:?}",
        first.errors
    );
    assert!(
        first.errors[1].starts_with("line 13: /output"),
        "{:?}",
        first.errors
    );
    // Pushed again (as a retry would): nothing new, nothing graded twice.
    let runs = app.count("runs").await;
    let second = skilleval_cli::samples::push(&args).await.unwrap();
    assert_eq!((second.accepted, second.duplicates), (0, 25));
    assert_eq!(app.count("runs").await, runs);
    assert_eq!(app.count("samples").await, 25);
    // An unknown skill is the server's 404, reported as an error.
    let ghost = skilleval_cli::samples::PushArgs {
        skill: "ghost".into(),
        ..args
    };
    let e = skilleval_cli::samples::push(&ghost).await.unwrap_err();
    assert!(e.contains("404"), "{e}");
    app.cleanup().await;
}

#[tokio::test]
async fn a_spent_daily_cost_cap_stops_the_model_criteria_visibly() {
    let app = spawn_app().await;
    let judge = json!({"name": "judge", "strategy": "llm_judge"});
    let says_ok =
        json!({"name": "says-ok", "strategy": "contains", "options": {"includes": ["ok"]}});
    // A cap of 0 is spent from the start of the day.
    upload(
        &app,
        monitored_package(
            "capped",
            json!({"sample_rate": 1.0, "max_cost_usd_per_day": 0, "criteria": [says_ok, judge]}),
        ),
    )
    .await;
    upload(
        &app,
        monitored_package(
            "judged",
            json!({"sample_rate": 1.0, "max_cost_usd_per_day": 0, "criteria": [judge]}),
        ),
    )
    .await;
    let batch = json!([sample("x-1", "ok", None), sample("x-2", "ok", None)]);
    let (_, r) = ingest(&app, "capped", &batch).await;
    assert_eq!(r["sampled"], 2, "{r}");
    assert_eq!(r["skipped_criteria"], json!(["judge"]));
    // Each job records what it was graded without.
    let run_id: Uuid = r["run_id"].as_str().unwrap().parse().unwrap();
    let jobs = crate::helpers::planned_jobs(&app, run_id).await;
    assert_eq!(jobs.len(), 2);
    for job in &jobs {
        let info = skilleval_execution::monitor::job_info(job).unwrap();
        assert_eq!(info.skipped_criteria, ["judge"]);
        assert!(!job.case.evaluation.weights.contains_key("llm_judge"));
    }
    // Only model criteria: nothing can be graded until tomorrow, and the answer says so.
    let (_, r) = ingest(&app, "judged", &batch).await;
    assert_eq!(
        (r["sampled"].as_u64(), r["dropped_over_daily_cost"].as_u64()),
        (Some(0), Some(2)),
        "{r}"
    );
    // With budget left, every criterion grades.
    put_monitor(
        &app,
        "capped",
        &json!({"sample_rate": 1.0, "max_cost_usd_per_day": 5, "criteria": [says_ok, judge]}),
    )
    .await;
    let (_, r) = ingest(&app, "capped", &json!([sample("x-3", "ok", None)])).await;
    assert_eq!(
        (r["sampled"].as_u64(), &r["skipped_criteria"]),
        (Some(1), &json!([]))
    );
    app.cleanup().await;
}
