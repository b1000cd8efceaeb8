//! Catalogue collisions at upload (issue 33): a local model server picks, for each query, the
//! listed skill whose description shares the most words with it (the first listed on a tie, so
//! near-duplicates split the runs as the lineup rotates). Two publishers: Bob's public skill
//! is a neighbour of Alice's near-duplicate and its queries never reach Alice; Bob's private
//! skill is never a neighbour of hers.

use std::time::Duration;

use axum::body::Bytes;
use axum::Router;
use reqwest::Method;
use serde_json::{json, Value};
use skilleval_execution::triggers::fixtures::pick_by_word_overlap;

use crate::helpers::{
    local_provider, only_provider, serve_local, spawn_app_configured, AppOptions, TestApp,
};
use crate::packages::{given_tests, zip_of};

pub(crate) const ROOT: &str = "root-token-for-collisions";
const WRITER: &[&str] = &["skills:write", "runs:write", "read"];
pub(crate) const PDF: &str = "Extracts tables from invoice PDF files into spreadsheets";
/// A word only Bob's queries carry: it must never reach Alice.
const BOB_SECRET: &str = "zebraquartz";

pub(crate) async fn overlap_model(body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let prompt: String = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    let answer = json!({"skill": pick_by_word_overlap(&prompt), "reason": "overlap"}).to_string();
    axum::Json(json!({
        "model": "overlap",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}
    }))
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
    let (addr, model) = serve_local(Router::new().fallback(overlap_model)).await;
    let app = spawn_app_configured(
        AppOptions {
            providers: Some(only_provider(local_provider(addr, "overlap", "overlap"))),
            ..AppOptions::default()
        },
        |s| {
            s.coordinator.auth_tokens = vec![skilleval_infra::config::Secret::new(ROOT)];
            s.coordinator.catalogue.max_share = 0.2;
        },
    )
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
    upload(
        &app,
        &alice,
        package(
            "weather",
            "Tells the weather forecast for a city",
            &["what is the weather forecast for Paris"],
        ),
        "",
    )
    .await;
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
