//! Catalogue collisions at upload (issue 33): a local model server picks, for each query, the
//! listed skill whose description shares the most words with it (the first listed on a tie, so
//! near-duplicates split the runs as the lineup rotates). Two publishers: Bob's public skill
//! is a neighbour of Alice's near-duplicate and its queries never reach Alice; Bob's private
//! skill is never a neighbour of hers. The `no_collision` gate decides an upload's run, which
//! waits for the eval; the eval survives host faults and a coordinator that stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::Router;
use reqwest::Method;
use serde_json::{json, Value};
use skilleval_execution::result::CaseStatus;
use skilleval_execution::triggers::fixtures::pick_reply_by_word_overlap;
use uuid::Uuid;

use crate::helpers::{
    local_provider, only_provider, record_as_worker, serve_local, spawn_app_configured, AppOptions,
    TestApp,
};
use crate::packages::{given_tests, zip_of};

pub(crate) const ROOT: &str = "root-token-for-collisions";
const WRITER: &[&str] = &["skills:write", "runs:write", "read"];
pub(crate) const PDF: &str = "Extracts tables from invoice PDF files into spreadsheets";
/// A word only Bob's queries carry: it must never reach Alice.
const BOB_SECRET: &str = "zebraquartz";

pub(crate) async fn overlap_model(body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    axum::Json(pick_reply_by_word_overlap(&body))
}

/// A coordinator whose only model provider is the local server `router` (started here;
/// abort the returned task at the end), with the root token and `configure`'s settings.
pub(crate) async fn catalogue_app(
    router: Router,
    configure: impl FnOnce(&mut skilleval_infra::config::Settings),
) -> (TestApp, tokio::task::JoinHandle<()>) {
    let (addr, model) = serve_local(router).await;
    let app = spawn_app_configured(
        AppOptions {
            providers: Some(only_provider(local_provider(addr, "overlap", "overlap"))),
            ..AppOptions::default()
        },
        |s| {
            s.coordinator.auth_tokens = vec![skilleval_infra::config::Secret::new(ROOT)];
            configure(s);
        },
    )
    .await;
    (app, model)
}

/// A skill no other here resembles.
pub(crate) fn weather() -> Vec<u8> {
    package(
        "weather",
        "Tells the weather forecast for a city",
        &["what is the weather forecast for Paris"],
    )
}

pub(crate) fn package(name: &str, description: &str, queries: &[&str]) -> Vec<u8> {
    let md = format!("---\nname: {name}\ndescription: {description}\n---\n\nDo it.\n");
    let tests = serde_json::to_vec(&given_tests(&["ok"], json!({}))).unwrap();
    let triggers: Vec<Value> = queries
        .iter()
        .map(|q| json!({"query": q, "should_trigger": true}))
        .collect();
    let triggers = serde_json::to_vec(&triggers).unwrap();
    zip_of(&[
        ("SKILL.md", md.as_bytes()),
        ("eval/tests.json", &tests),
        ("evals/triggers.json", &triggers),
    ])
}

pub(crate) async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    zip: Option<Vec<u8>>,
) -> (u16, String) {
    let mut request = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    if let Some(zip) = zip {
        request = request.header("Content-Type", "application/zip").body(zip);
    }
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

pub(crate) async fn token(app: &TestApp, publisher: &str) -> String {
    let (status, body) = app
        .client
        .post(format!("{}/v1/admin/tokens", app.address))
        .bearer_auth(ROOT)
        .json(&json!({"publisher": publisher, "scopes": WRITER}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    assert_eq!(status, 201);
    let v: Value = body.json().await.unwrap();
    v["token"].as_str().unwrap().to_string()
}

pub(crate) async fn upload(app: &TestApp, token: &str, zip: Vec<u8>, query: &str) {
    let (status, body) = send(
        app,
        Method::POST,
        &format!("/v1/skills?run=false{query}"),
        token,
        Some(zip),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// The skill's collisions once its latest eval is no longer pending (the raw body too).
pub(crate) async fn settled(app: &TestApp, token: &str, skill: &str) -> (Value, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = send(
            app,
            Method::GET,
            &format!("/v1/skills/{skill}/collisions"),
            token,
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let status = &v["latest"]["status"];
        if status == "completed" || status == "failed" {
            return (v, body);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still pending: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(crate) fn pair<'a>(m: &'a Value, owner: &str, picked: &str) -> &'a Value {
    m["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["owner"] == owner && p["picked"] == picked)
        .unwrap_or_else(|| panic!("no pair {owner} -> {picked}: {m}"))
}

#[tokio::test]
async fn a_near_duplicate_collides_across_publishers_without_leaking_queries() {
    let (app, model) = catalogue_app(Router::new().fallback(overlap_model), |s| {
        s.coordinator.catalogue.max_share = 0.2;
    })
    .await;
    let alice = token(&app, "alice").await;
    let bob = token(&app, "bob").await;

    // Bob: a public near-duplicate and a private one; Alice: a distinct skill of her own.
    let bob_query = format!("extract the invoice PDF tables {BOB_SECRET}");
    upload(
        &app,
        &bob,
        package("invoice-tables", PDF, &[&bob_query]),
        "&public=true",
    )
    .await;
    settled(&app, &bob, "invoice-tables").await;
    let private_query = format!("pull invoice PDF tables into spreadsheets {BOB_SECRET}");
    upload(
        &app,
        &bob,
        package("bob-private-pdf", PDF, &[&private_query]),
        "",
    )
    .await;
    settled(&app, &bob, "bob-private-pdf").await;
    upload(&app, &alice, weather(), "").await;
    settled(&app, &alice, "weather").await;

    upload(
        &app,
        &alice,
        package(
            "pdf-tables",
            PDF,
            &["turn the invoice PDF tables into spreadsheets kumquatlion <script>alert(1)</script>"],
        ),
        "&gate=no_collision",
    )
    .await;
    let (v, body) = settled(&app, &alice, "pdf-tables").await;
    let latest = &v["latest"];
    assert_eq!(latest["status"], "completed", "{body}");
    let m = &latest["matrix"];
    assert_eq!(m["mode"], "model", "{body}");
    let neighbours: Vec<&str> = m["neighbours"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(neighbours.contains(&"invoice-tables"), "{neighbours:?}");
    assert!(neighbours.contains(&"weather"), "{neighbours:?}");
    assert!(
        !neighbours.contains(&"bob-private-pdf"),
        "another publisher's private skill is never a neighbour: {neighbours:?}"
    );
    // The twin: identical descriptions, so its query goes to whichever is listed first.
    let taken = pair(m, "invoice-tables", "pdf-tables");
    assert!(taken["hits"].as_u64().unwrap() > 0, "{taken}");
    assert_eq!(taken["runs"], 3);
    assert!(taken["interval"]["low"].as_f64().unwrap() > 0.0, "{taken}");
    // The distinct skill does not collide either way.
    assert_eq!(pair(m, "weather", "pdf-tables")["hits"], 0);
    assert_eq!(pair(m, "pdf-tables", "weather")["hits"], 0);
    // Bob's queries are counted, never shown.
    assert_eq!(m["hidden_queries"], 1);
    assert!(!body.contains(BOB_SECRET), "{body}");
    // The gate fails the colliding upload, naming the neighbour.
    assert_eq!(latest["gate"]["passed"], false, "{body}");
    assert_eq!(
        latest["gate"]["collisions"][0]["neighbour"],
        "invoice-tables"
    );
    // The skill page shows the matrix and nothing of Bob's queries.
    let (status, page) = send(&app, Method::GET, "/ui/skills/pdf-tables", &alice, None).await;
    assert_eq!(status, 200);
    assert!(
        page.contains("invoice-tables"),
        "the page shows the neighbour"
    );
    assert!(!page.contains(BOB_SECRET));
    // Alice's own query is listed, as text.
    assert!(
        !page.contains("<script>alert(1)"),
        "a query is rendered as text"
    );
    assert!(
        page.contains("kumquatlion &lt;script&gt;alert(1)"),
        "the query is listed"
    );

    // Bob learns that a skill of another publisher takes his queries: counts only, and not
    // the name of Alice's private skill nor her queries.
    let (v, body) = settled(&app, &bob, "invoice-tables").await;
    // Alice's two evals had Bob's public skill as a neighbour (his private one's eval, his
    // own, names its skill).
    let foreign: Vec<&Value> = v["reported_by_others"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["foreign"] == true)
        .collect();
    assert_eq!(foreign.len(), 2, "{body}");
    assert!(foreign.iter().all(|r| r["skill"].is_null()), "{body}");
    let twin = foreign
        .iter()
        .find(|r| r["similarity"] == 1.0)
        .unwrap_or_else(|| panic!("{body}"));
    // From Bob's side: his queries picking Alice's skill.
    assert_eq!(twin["taken_from_you"]["hits"], taken["hits"], "{body}");
    assert!(
        !body.contains("pdf-tables") && !body.contains("kumquatlion"),
        "{body}"
    );

    // Alice cannot read Bob's private skill's collisions.
    let (status, _) = send(
        &app,
        Method::GET,
        "/v1/skills/bob-private-pdf/collisions",
        &alice,
        None,
    )
    .await;
    assert_eq!(status, 404);
    model.abort();
    app.cleanup().await;
}

/// A model server answering as [`overlap_model`] while `open` holds true (requests wait
/// meanwhile), and refusing every request with a 400 while `failing` holds true.
#[derive(Clone)]
struct Switches {
    open: tokio::sync::watch::Sender<bool>,
    failing: Arc<AtomicBool>,
}

async fn switched_model(
    axum::extract::State(switches): axum::extract::State<Switches>,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let mut open = switches.open.subscribe();
    let _ = open.wait_for(|open| *open).await;
    if switches.failing.load(Ordering::SeqCst) {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"message": "the judge is refusing requests", "type": "invalid_request_error"}})),
        )
            .into_response();
    }
    overlap_model(body).await.into_response()
}

/// A gated app beside a switchable model server.
async fn gated_app(
    configure: impl FnOnce(&mut skilleval_infra::config::Settings),
) -> (TestApp, Switches, tokio::task::JoinHandle<()>) {
    let switches = Switches {
        open: tokio::sync::watch::channel(true).0,
        failing: Arc::new(AtomicBool::new(false)),
    };
    let router = Router::new()
        .fallback(switched_model)
        .with_state(switches.clone());
    let (app, model) = catalogue_app(router, |s| {
        s.coordinator.catalogue.max_share = 0.2;
        configure(s);
    })
    .await;
    (app, switches, model)
}

/// Uploads with a run and records its one case passed, as a worker would; returns the
/// version and the run.
async fn upload_run_and_pass(
    app: &TestApp,
    token: &str,
    zip: Vec<u8>,
    query: &str,
) -> (Uuid, Uuid) {
    let (status, body) = send(
        app,
        Method::POST,
        &format!("/v1/skills?run=true{query}"),
        token,
        Some(zip),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let version: Uuid = v["version_id"].as_str().unwrap().parse().unwrap();
    let run: Uuid = v["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run).await;
    record_as_worker(app, run, &[("case-000", CaseStatus::Passed, 1.0)]).await;
    (version, run)
}

/// The run once it has a verdict.
async fn verdict_of(app: &TestApp, token: &str, run: Uuid) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = send(app, Method::GET, &format!("/v1/runs/{run}"), token, None).await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        if !v["verdict"].is_null() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no verdict yet: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn eval_row(app: &TestApp, version: Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT status, attempts, error FROM version_collisions WHERE version_id = $1")
        .bind(version)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

const TWIN_QUERY: &str = "extract the invoice PDF tables";

/// Uploads `invoice-tables` (the twin every gated upload here collides with) and waits for its
/// eval.
async fn twin(app: &TestApp, token: &str) {
    upload(
        app,
        token,
        package("invoice-tables", PDF, &[TWIN_QUERY]),
        "",
    )
    .await;
    settled(app, token, "invoice-tables").await;
}
const OWN_QUERY: &str = "turn the invoice PDF tables into spreadsheets";

#[tokio::test]
async fn the_no_collision_gate_fails_the_colliding_uploads_run_which_waits_for_it() {
    let (app, switches, model) = gated_app(|_| {}).await;
    let alice = token(&app, "alice").await;
    twin(&app, &alice).await;

    // The judge holds its answers: the run's one case passes, and the run still waits.
    switches.open.send_replace(false);
    let (_, run) = upload_run_and_pass(
        &app,
        &alice,
        package("pdf-tables", PDF, &[OWN_QUERY]),
        "&gate=no_collision",
    )
    .await;
    assert!(
        !app.state.aggregator.finalise(run).await.unwrap(),
        "a gated run is not finalised before its collision eval"
    );
    assert_eq!(
        app.state.aggregator.sweep().await.unwrap(),
        0,
        "nor by the sweep"
    );
    let (_, waiting) = app.get_json(&format!("/v1/runs/{run}")).await;
    assert!(waiting["verdict"].is_null(), "{waiting}");

    switches.open.send_replace(true);
    let done = verdict_of(&app, &alice, run).await;
    let summary = &done["summary"];
    assert_eq!(done["verdict"], "fail", "{done}");
    assert_eq!(summary["pass_rate"], 1.0, "only the gate fails it: {done}");
    let reason = summary["verdict_reasons"][0].as_str().unwrap();
    assert!(
        reason.starts_with("gate no_collision failed") && reason.contains("`invoice-tables`"),
        "{reason}"
    );
    assert_eq!(summary["collision_gate"]["passed"], false, "{done}");
    assert_eq!(
        summary["collision_gate"]["collisions"][0]["neighbour"],
        "invoice-tables"
    );

    // A distinct skill passes the same gate.
    let (_, run) = upload_run_and_pass(&app, &alice, weather(), "&gate=no_collision").await;
    app.state.aggregator.finalise(run).await.unwrap();
    let done = verdict_of(&app, &alice, run).await;
    assert_eq!(done["verdict"], "pass", "{done}");
    assert_eq!(done["summary"]["collision_gate"]["passed"], true, "{done}");

    // Without the gate the twin's run is the cases' verdict alone.
    let (_, run) =
        upload_run_and_pass(&app, &alice, package("pdf-tables-2", PDF, &[OWN_QUERY]), "").await;
    assert!(app.state.aggregator.finalise(run).await.unwrap());
    let done = verdict_of(&app, &alice, run).await;
    assert_eq!(done["verdict"], "pass", "{done}");
    assert!(done["summary"].get("collision_gate").is_none(), "{done}");
    model.abort();
    app.cleanup().await;
}

#[tokio::test]
async fn a_collision_eval_survives_host_faults_and_its_coordinator_and_fails_only_after_its_attempts(
) {
    let (app, switches, model) = gated_app(|s| {
        s.coordinator.catalogue.max_attempts = 2;
        s.coordinator.catalogue.retry_after_secs = 0;
    })
    .await;
    let alice = token(&app, "alice").await;
    twin(&app, &alice).await;

    // The judge refuses every request: the first attempt is a host fault, the eval stays
    // pending with the fault recorded, and the run waits.
    switches.failing.store(true, Ordering::SeqCst);
    let (version, run) = upload_run_and_pass(
        &app,
        &alice,
        package("pdf-tables", PDF, &[OWN_QUERY]),
        "&gate=no_collision",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let (status, attempts, error) = loop {
        let row = eval_row(&app, version).await;
        if row.2.is_some() {
            break row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no attempt recorded: {row:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((status.as_str(), attempts), ("pending", 1));
    assert!(
        error.unwrap().contains("the judge failed"),
        "the fault is kept"
    );
    assert!(!app.state.aggregator.finalise(run).await.unwrap());

    // The judge answers again: the next sweep resumes the eval, which decides the run.
    switches.failing.store(false, Ordering::SeqCst);
    assert_eq!(app.state.collisions.resume().await.unwrap(), 1);
    let done = verdict_of(&app, &alice, run).await;
    assert_eq!(done["verdict"], "fail", "{done}");
    assert_eq!(done["summary"]["collision_gate"]["passed"], false, "{done}");
    let (status, attempts, error) = eval_row(&app, version).await;
    assert_eq!((status.as_str(), attempts, error), ("completed", 2, None));

    // A coordinator that stopped mid-eval: its claim lapses and another sweep takes it over.
    switches.open.send_replace(false);
    let (version, run) = upload_run_and_pass(&app, &alice, weather(), "&gate=no_collision").await;
    let lease = Duration::from_secs(60);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while eval_row(&app, version).await.1 == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the upload's eval never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        app.state
            .store
            .claim_collisions(version, lease)
            .await
            .unwrap()
            .is_none(),
        "a held eval is not claimed twice"
    );
    assert_eq!(app.state.collisions.resume().await.unwrap(), 0);
    sqlx::query("UPDATE version_collisions SET lease_until = now() - interval '1 second' WHERE version_id = $1")
        .bind(version)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        app.state.collisions.resume().await.unwrap(),
        1,
        "the lapsed claim is resumed"
    );
    switches.open.send_replace(true);
    let done = verdict_of(&app, &alice, run).await;
    assert_eq!(done["verdict"], "pass", "{done}");
    let (status, attempts, _) = eval_row(&app, version).await;
    assert_eq!(
        (status.as_str(), attempts),
        ("completed", 2),
        "the sweep claimed the lapsed eval again"
    );

    // Every attempt faulted: the eval fails, and the run with it, saying the gate was not
    // decided (not that the skill collided).
    switches.failing.store(true, Ordering::SeqCst);
    let (version, run) = upload_run_and_pass(
        &app,
        &alice,
        package("pdf-tables-3", PDF, &[OWN_QUERY]),
        "&gate=no_collision",
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, attempts, _) = eval_row(&app, version).await;
        if status == "failed" {
            assert_eq!(attempts, 2);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the eval never failed"
        );
        app.state.collisions.resume().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = verdict_of(&app, &alice, run).await;
    assert_eq!(done["verdict"], "fail", "{done}");
    let reason = done["summary"]["verdict_reasons"][0].as_str().unwrap();
    assert!(
        reason.starts_with("gate no_collision could not be decided")
            && reason.contains("after 2 attempts"),
        "{reason}"
    );
    assert!(
        done["summary"]["collision_gate"]["passed"].is_null(),
        "{done}"
    );
    model.abort();
    app.cleanup().await;
}

#[tokio::test]
async fn the_no_collision_gate_is_refused_where_no_model_can_decide_it() {
    let app = spawn_app_configured(AppOptions::default(), |s| {
        s.coordinator.auth_tokens = vec![skilleval_infra::config::Secret::new(ROOT)];
    })
    .await;
    let alice = token(&app, "alice").await;
    let (status, body) = send(
        &app,
        Method::POST,
        "/v1/skills?gate=no_collision",
        &alice,
        Some(package("pdf-tables", PDF, &[OWN_QUERY])),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["details"]["field"], "gate", "{body}");
    assert!(body.contains("llm.providers"), "{body}");
    assert_eq!(app.count("skill_versions").await, 0, "nothing is stored");
    app.cleanup().await;
}

#[tokio::test]
async fn skills_uploaded_before_catalogue_cards_are_backfilled_and_become_neighbours() {
    let (app, _switches, model) = gated_app(|_| {}).await;
    let alice = token(&app, "alice").await;
    twin(&app, &alice).await;
    // As a version stored before catalogue cards existed.
    for delete in [
        "DELETE FROM version_collisions",
        "DELETE FROM catalogue_cards",
    ] {
        sqlx::query(delete).execute(&app.pool).await.unwrap();
    }

    assert_eq!(app.state.collisions.backfill().await.unwrap(), 1);
    assert_eq!(app.state.collisions.backfill().await.unwrap(), 0, "once");
    let (description, queries, public): (String, Value, bool) =
        sqlx::query_as("SELECT description, queries, public FROM catalogue_cards")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(description, PDF);
    assert_eq!(
        queries,
        json!([TWIN_QUERY]),
        "the stored package's trigger queries"
    );
    assert!(!public, "a backfilled card is private");
    assert_eq!(
        app.count("version_collisions").await,
        0,
        "no eval for an old version"
    );

    // The near-duplicate's eval has the backfilled skill as a neighbour, queries and all.
    upload(
        &app,
        &alice,
        package("pdf-tables", PDF, &[OWN_QUERY]),
        "&gate=no_collision",
    )
    .await;
    let (v, body) = settled(&app, &alice, "pdf-tables").await;
    let m = &v["latest"]["matrix"];
    assert_eq!(pair(m, "invoice-tables", "pdf-tables")["runs"], 3, "{body}");
    assert_eq!(v["latest"]["gate"]["passed"], false, "{body}");
    model.abort();
    app.cleanup().await;
}
