//! `skilleval collisions` against a local chat-completions server on 127.0.0.1:0 that picks,
//! for each query, the listed skill whose description shares the most words with it (the
//! first listed on a tie, so near-duplicates split the runs as the lineup rotates). Asked with
//! tools (`--agent`), it is an agent that reads the `SKILL.md` of the skill of its catalogue
//! whose description shares the most words with the query (the first by name on a tie).

#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::{Command, Output};

use axum::body::Bytes;
use axum::Router;
use serde_json::{json, Value};
use skilleval_execution::triggers::fixtures::{
    agent_reply_by_word_overlap, content_words, pick_reply_by_word_overlap,
};

/// A bag-of-words vector over a small fixed vocabulary: texts sharing words point alike.
fn embedding(text: &str) -> Vec<f32> {
    let vocabulary = [
        "invoice",
        "tables",
        "spreadsheets",
        "weather",
        "forecast",
        "city",
        "extracts",
    ];
    let w = content_words(text);
    vocabulary
        .iter()
        .map(|v| if w.contains(*v) { 1.0 } else { 0.0 })
        .collect()
}

async fn handle(body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(inputs) = body["input"].as_array() {
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"index": i, "embedding": embedding(t.as_str().unwrap_or_default())}))
            .collect();
        return axum::Json(
            json!({"model": "bow", "data": data, "usage": {"prompt_tokens": 10, "total_tokens": 10}}),
        );
    }
    if body.get("tools").is_some() {
        return axum::Json(agent_reply_by_word_overlap(&body));
    }
    axum::Json(pick_reply_by_word_overlap(&body))
}

fn start() -> std::net::SocketAddr {
    support::serve_on_thread(Router::new().fallback(handle))
}

fn skill(dir: &Path, name: &str, description: &str, queries: &[&str]) {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("evals")).unwrap();
    std::fs::write(
        root.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: {description}\n---\n\n# {name}\n\nDo it.\n"),
    )
    .unwrap();
    let cases: Vec<Value> = queries
        .iter()
        .map(|q| json!({"query": q, "should_trigger": true}))
        .collect();
    std::fs::write(
        root.join("evals/triggers.json"),
        serde_json::to_string(&cases).unwrap(),
    )
    .unwrap();
}

fn collisions(
    addr: std::net::SocketAddr,
    skill: &Path,
    catalogue: &Path,
    extra: &[&str],
) -> Output {
    collisions_with(addr, skill, catalogue, extra, &[])
}

fn collisions_with(
    addr: std::net::SocketAddr,
    skill: &Path,
    catalogue: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skilleval"));
    cmd.env_remove("SKILLEVAL_PROVIDER_EMBEDDING_MODEL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    for var in [
        "SKILLEVAL_PROVIDER_KIND",
        "SKILLEVAL_PROVIDER_API_KEY_ENV",
        "OPENAI_API_KEY",
        "SKILLEVAL_ALLOW_UNSANDBOXED",
        "SKILLEVAL_BWRAP",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("SKILLEVAL_PROVIDER_MODEL", "overlap")
        .env("SKILLEVAL_PROVIDER_BASE_URL", format!("http://{addr}/v1"))
        .args(["collisions", "--json", "--no-cache", "--catalogue"])
        .arg(catalogue)
        .args(extra)
        .arg(skill)
        .output()
        .unwrap()
}

const PDF: &str = "Extracts tables from invoice PDF files into spreadsheets";

/// A catalogue folder of two skills: `invoice-tables` (every new skill here is its
/// near-duplicate) and `weather` (distinct from all of them).
fn twin_and_weather() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue");
    skill(
        &catalogue,
        "invoice-tables",
        PDF,
        &["extract tables from this invoice PDF"],
    );
    skill(
        &catalogue,
        "weather",
        "Tells the weather forecast for a city",
        &["what is the weather forecast for Paris"],
    );
    (dir, catalogue)
}

#[test]
fn a_near_duplicate_collides_and_a_distinct_skill_does_not() {
    let addr = start();
    let (dir, catalogue) = twin_and_weather();
    let new = dir.path().join("new");
    skill(
        &new,
        "pdf-tables",
        PDF,
        &["turn the invoice PDF tables into spreadsheets"],
    );
    let out = collisions(
        addr,
        &new.join("pdf-tables"),
        &catalogue,
        &["--neighbours", "2", "--max-share", "0.2"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the gate fails: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["matrix"]["method"], "lexical");
    let pair = |owner: &str, picked: &str| {
        v["matrix"]["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["owner"] == owner && p["picked"] == picked)
            .cloned()
            .unwrap()
    };
    // Identical descriptions: the twin's query goes to whichever is listed first, so over
    // three rotated runs the new skill takes some of them.
    let taken = pair("invoice-tables", "pdf-tables");
    assert!(taken["hits"].as_u64().unwrap() > 0, "{taken}");
    assert_eq!(taken["runs"], 3);
    assert!(taken["interval"]["low"].as_f64().unwrap() > 0.0, "{taken}");
    let weather = pair("weather", "pdf-tables");
    assert_eq!(
        weather["hits"], 0,
        "a distinct skill does not collide: {weather}"
    );
    assert_eq!(pair("pdf-tables", "weather")["hits"], 0);
    assert_eq!(v["gate"]["passed"], false);
    assert_eq!(v["gate"]["collisions"][0]["neighbour"], "invoice-tables");

    // Alone with the distinct skill, nothing collides and the gate passes.
    let alone = dir.path().join("alone");
    skill(
        &alone,
        "weather",
        "Tells the weather forecast for a city",
        &["what is the weather forecast for Paris"],
    );
    let out = collisions(
        addr,
        &new.join("pdf-tables"),
        &alone,
        &["--max-share", "0.2"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn without_a_catalogue_folder_it_is_bad_input_naming_the_flag() {
    let addr = start();
    let dir = tempfile::tempdir().unwrap();
    skill(dir.path(), "s", "Does things", &["do things"]);
    let out = collisions(
        addr,
        &dir.path().join("s"),
        &dir.path().join("missing"),
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--catalogue"));
}

#[test]
fn with_an_embedding_model_neighbours_are_found_by_embeddings() {
    let addr = start();
    let dir = tempfile::tempdir().unwrap();
    let catalogue = dir.path().join("catalogue");
    // Lexically far from the new skill's description, but about the same things.
    skill(
        &catalogue,
        "tabulator",
        "Spreadsheets from invoice tables",
        &["invoice tables please"],
    );
    skill(
        &catalogue,
        "weather",
        "Tells the weather forecast for a city",
        &["weather forecast for Oslo"],
    );
    let new = dir.path().join("new");
    skill(&new, "pdf-tables", PDF, &["invoice tables to spreadsheets"]);
    let out = collisions_with(
        addr,
        &new.join("pdf-tables"),
        &catalogue,
        &["--neighbours", "1"],
        &[("SKILLEVAL_PROVIDER_EMBEDDING_MODEL", "bow")],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["matrix"]["method"], "embedding");
    assert_eq!(v["matrix"]["neighbours"][0]["name"], "tabulator", "{v}");
    assert!(v["matrix"]["neighbours"][0]["similarity"].as_f64().unwrap() > 0.8);
}

#[test]
fn in_agent_mode_a_near_duplicate_collides_and_a_distinct_skill_does_not() {
    let addr = start();
    let (dir, catalogue) = twin_and_weather();
    let new = dir.path().join("new");
    // Named to come first in the agent's catalogue: on the tie it opens this one.
    skill(
        &new,
        "a-pdf-tables",
        PDF,
        &["turn the invoice PDF tables into spreadsheets"],
    );
    let out = collisions(
        addr,
        &new.join("a-pdf-tables"),
        &catalogue,
        &[
            "--agent",
            "--neighbours",
            "2",
            "--runs",
            "2",
            "--max-share",
            "0.2",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "the gate fails: {stderr}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let pair = |owner: &str, picked: &str| {
        v["matrix"]["pairs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["owner"] == owner && p["picked"] == picked)
            .cloned()
            .unwrap_or_else(|| panic!("no pair {owner} -> {picked}: {v}"))
    };
    // The agent opened the new skill's SKILL.md for the twin's query in every run.
    let taken = pair("invoice-tables", "a-pdf-tables");
    assert_eq!(
        (taken["hits"].as_u64(), taken["runs"].as_u64()),
        (Some(2), Some(2)),
        "{taken}"
    );
    assert!(taken["interval"]["low"].as_f64().unwrap() > 0.0, "{taken}");
    assert_eq!(
        pair("weather", "a-pdf-tables")["hits"],
        0,
        "a distinct skill does not collide"
    );
    assert_eq!(pair("a-pdf-tables", "weather")["hits"], 0);
    let query = |owner: &str| {
        v["matrix"]["queries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["owner"] == owner)
            .cloned()
            .unwrap()
    };
    assert_eq!(query("weather")["picks"]["weather"], 2, "{v}");
    assert_eq!(query("a-pdf-tables")["picks"]["a-pdf-tables"], 2, "{v}");
    assert_eq!(v["gate"]["passed"], false);
    assert_eq!(v["gate"]["collisions"][0]["neighbour"], "invoice-tables");
}

#[test]
fn agent_mode_without_a_sandbox_is_a_configuration_problem_not_a_collision() {
    let addr = start();
    let dir = tempfile::tempdir().unwrap();
    skill(
        &dir.path().join("catalogue"),
        "other",
        PDF,
        &["invoice tables"],
    );
    skill(dir.path(), "s", PDF, &["invoice tables please"]);
    let missing = dir.path().join("no-such-bwrap");
    let out = collisions(
        addr,
        &dir.path().join("s"),
        &dir.path().join("catalogue"),
        &["--agent", "--bwrap", missing.to_str().unwrap()],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("bubblewrap") && stderr.contains("--agent"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no matrix is printed");
}
