//! The regression gate's record (`summary.regression_gate`) everywhere a run is shown: the run
//! view, the `run.finished` webhook built from it, and the run's report (JSON and Markdown).
//! Each test uploads a passing version, then a gated one whose eight regressed cases fail the
//! gate (McNemar: 8 pass→fail flips, none back, p = 0.008).

use std::time::Duration;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, TestApp, WebhookReceiver};
use crate::openapi::{assert_valid, doc};
use crate::versions::{package_with_settings, upload_and_finish};

/// The cases the gated run fails that passed before, sorted.
fn regressed() -> Vec<String> {
    (0..8).map(|i| format!("case-{i:03}")).collect()
}

/// Uploads a passing version of `name`, then a gated one (with `extra` query parameters) that
/// regresses; returns (the passing run, the gated run).
async fn gated_regression(app: &TestApp, name: &str, extra: &str) -> (Uuid, Uuid) {
    // Half the cases passing is enough for the threshold: only the gate can fail the run.
    let package =
        |body: &str| package_with_settings(name, body, 20, "ok", json!({ "passThreshold": 0.5 }));
    let (_, base) = upload_and_finish(app, package("One."), "", &[]).await;
    let failing: Vec<usize> = (0..8).collect();
    let query = format!("?gate=no_regression{extra}");
    let (_, head) = upload_and_finish(app, package("Two."), &query, &failing).await;
    (base, head)
}

/// Checks a gate record: a failed `no_regression` gate against `base` naming the regressed
/// cases.
fn assert_failed_gate(gate: &Value, base: Uuid) {
    assert_eq!(gate["rule"], "no_regression", "{gate}");
    assert_eq!(gate["verdict"], "fail", "{gate}");
    assert_eq!(gate["base_run"], base.to_string(), "{gate}");
    assert_eq!(gate["config"]["alpha"], 0.05, "{gate}");
    assert!(gate["comparison_id"].is_string(), "{gate}");
    assert!(!gate["reasons"].as_array().unwrap().is_empty(), "{gate}");
    let mut cases: Vec<String> = gate["regressed_cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    cases.sort();
    assert_eq!(cases, regressed(), "{gate}");
}

#[tokio::test]
async fn the_run_view_shows_the_gate_record_of_a_gated_run_and_none_for_an_ungated_one() {
    let app = spawn_app().await;
    let (base, head) = gated_regression(&app, "gate-view", "").await;
    let (status, run) = app.get_json(&format!("/v1/runs/{head}")).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["verdict"], "fail");
    assert_failed_gate(&run["summary"]["regression_gate"], base);
    let doc = doc();
    assert_valid(
        &doc,
        &json!({ "$ref": "#/components/schemas/Run" }),
        &run,
        "the gated run's view",
    );
    // The stored record and the view's are the same document.
    let stored: Value =
        sqlx::query_scalar("SELECT summary->'regression_gate' FROM runs WHERE id = $1")
            .bind(head)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(run["summary"]["regression_gate"], stored);

    let (_, ungated) = app.get_json(&format!("/v1/runs/{base}")).await;
    assert_eq!(ungated["verdict"], "pass");
    assert!(
        ungated["summary"].get("regression_gate").is_none(),
        "a run without a gate has no record: {ungated}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn the_run_finished_webhook_carries_the_gate_record() {
    let app = spawn_app().await;
    let hook = WebhookReceiver::start().await;
    let callback: String = url::form_urlencoded::byte_serialize(hook.url.as_bytes()).collect();
    let (base, head) =
        gated_regression(&app, "gate-hook", &format!("&callback_url={callback}")).await;
    // Only the gated upload named the hook: one delivery. The wait is a hang guard.
    let deliveries = hook.wait_for(1, Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), 1);
    let payload: Value = serde_json::from_slice(&deliveries[0].1).unwrap();
    assert_eq!(payload["event"], "run.finished");
    assert_eq!(payload["run"]["run_id"], head.to_string());
    assert_eq!(payload["run"]["verdict"], "fail");
    let gate = &payload["run"]["summary"]["regression_gate"];
    assert_failed_gate(gate, base);
    assert_valid(
        &doc(),
        &json!({ "$ref": "#/components/schemas/WebhookBody" }),
        &payload,
        "the webhook body",
    );
    let (_, run) = app.get_json(&format!("/v1/runs/{head}")).await;
    assert_eq!(
        *gate, run["summary"]["regression_gate"],
        "the same record as the run view"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn the_run_report_carries_the_gate_record_in_json_and_markdown() {
    let app = spawn_app().await;
    let (base, head) = gated_regression(&app, "gate-report", "").await;
    let response = app
        .get(&format!("/v1/runs/{head}/report?format=json"))
        .await;
    assert_eq!(response.status().as_u16(), 200);
    let report: Value = response.json().await.unwrap();
    assert_eq!(report["verdict"], "fail");
    assert_failed_gate(&report["runSummary"]["regression_gate"], base);
    let content = report["content"].as_str().unwrap();
    assert!(content.contains("## Regression gate"), "{content}");

    let markdown = app
        .get(&format!("/v1/runs/{head}/report?format=markdown"))
        .await
        .text()
        .await
        .unwrap();
    let section = markdown
        .split("## Regression gate")
        .nth(1)
        .unwrap_or_else(|| panic!("no gate section: {markdown}"));
    assert!(section.contains("**fail**"), "{section}");
    assert!(section.contains(&base.to_string()), "{section}");
    for case in regressed() {
        assert!(
            section.contains(&format!("`{case}`")),
            "{case} not named: {section}"
        );
    }
    // The ungated run's report has no such section, nor a record.
    let plain: Value = app
        .get(&format!("/v1/runs/{base}/report?format=json"))
        .await
        .json()
        .await
        .unwrap();
    assert!(plain["runSummary"].get("regression_gate").is_none());
    assert!(!plain["content"]
        .as_str()
        .unwrap()
        .contains("## Regression gate"));
    app.cleanup().await;
}
