//! Catalogue collisions in agent mode (`coordinator.catalogue.mode = "agent"`): each run gives
//! the query to the `agent` runner in the coordinator's sandbox, with the version's package at
//! `/skill` and its neighbours as decoys. The local model server is an agent that reads the
//! `SKILL.md` of the skill whose description shares the most words with the query (the first
//! by name on a tie). Needs bubblewrap, like the agent runner's own tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Router;
use serde_json::Value;
use skilleval_execution::triggers::fixtures::agent_reply_by_word_overlap;
use skilleval_infra::config::{CatalogueMode, Settings};

use crate::collisions::{
    catalogue_app, overlap_model, package, pair, settled, token, upload, weather, PDF,
};
use crate::helpers::TestApp;

/// Answers agent turns (requests with tools) by word overlap, counting them; anything else as
/// the model-mode picker does.
async fn agent_model(State(turns): State<Arc<AtomicUsize>>, body: Bytes) -> axum::Json<Value> {
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if parsed.get("tools").is_some() {
        turns.fetch_add(1, Ordering::SeqCst);
        return axum::Json(agent_reply_by_word_overlap(&parsed));
    }
    overlap_model(body).await
}

/// A coordinator in agent mode whose model is [`agent_model`], with `configure`'s settings
/// too; the counter is its agent turns.
async fn agent_app(
    configure: impl FnOnce(&mut Settings),
) -> (TestApp, tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let turns = Arc::new(AtomicUsize::new(0));
    let (app, model) = catalogue_app(
        Router::new()
            .fallback(agent_model)
            .with_state(turns.clone()),
        |s| {
            s.coordinator.catalogue.mode = CatalogueMode::Agent;
            configure(s);
        },
    )
    .await;
    (app, model, turns)
}

/// The skill the near-duplicate collides with.
fn invoice_tables() -> Vec<u8> {
    package(
        "invoice-tables",
        PDF,
        &["extract tables from this invoice PDF"],
    )
}

#[tokio::test]
async fn in_agent_mode_the_skill_md_the_agent_opens_is_the_pick() {
    let (app, model, turns) = agent_app(|s| s.coordinator.catalogue.runs_per_query = 2).await;
    let alice = token(&app, "alice").await;
    upload(&app, &alice, invoice_tables(), "").await;
    settled(&app, &alice, "invoice-tables").await;
    upload(&app, &alice, weather(), "").await;
    settled(&app, &alice, "weather").await;
    // A near-duplicate named to come first in the agent's catalogue: on the tie the agent
    // opens it, for the twin's queries too.
    upload(
        &app,
        &alice,
        package(
            "a-pdf-tables",
            PDF,
            &["turn the invoice PDF tables into spreadsheets"],
        ),
        "&gate=no_collision",
    )
    .await;
    let (v, body) = settled(&app, &alice, "a-pdf-tables").await;
    let latest = &v["latest"];
    assert_eq!(latest["status"], "completed", "{body}");
    let m = &latest["matrix"];
    assert_eq!(m["mode"], "agent", "{body}");
    let taken = pair(m, "invoice-tables", "a-pdf-tables");
    assert_eq!(
        (taken["hits"].as_u64(), taken["runs"].as_u64()),
        (Some(2), Some(2)),
        "{body}"
    );
    assert_eq!(pair(m, "weather", "a-pdf-tables")["hits"], 0, "{body}");
    assert_eq!(pair(m, "a-pdf-tables", "weather")["hits"], 0, "{body}");
    let own = m["queries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["owner"] == "a-pdf-tables")
        .unwrap();
    assert_eq!(
        own["picks"]["a-pdf-tables"], 2,
        "the agent opened /skill/SKILL.md: {body}"
    );
    assert_eq!(latest["gate"]["passed"], false, "{body}");
    assert!(
        turns.load(Ordering::SeqCst) > 0,
        "the picks came from agent turns"
    );
    model.abort();
    app.cleanup().await;
}

#[tokio::test]
async fn agent_mode_without_a_sandbox_fails_the_eval_as_a_configuration_problem() {
    let missing = tempfile::tempdir().unwrap();
    let bwrap = missing.path().join("bwrap");
    let (app, model, turns) = agent_app(|s| {
        s.sandbox.bwrap = Some(bwrap);
        s.sandbox.allow_unsandboxed = false;
    })
    .await;
    let alice = token(&app, "alice").await;
    upload(&app, &alice, invoice_tables(), "").await;
    let (v, body) = settled(&app, &alice, "invoice-tables").await;
    assert_eq!(v["latest"]["status"], "failed", "{body}");
    let error = v["latest"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("configuration problem") && error.contains("bubblewrap"),
        "{body}"
    );
    assert!(
        v["latest"]["matrix"].is_null(),
        "no collision is reported: {body}"
    );
    assert_eq!(turns.load(Ordering::SeqCst), 0, "no agent ran");
    model.abort();
    app.cleanup().await;
}
