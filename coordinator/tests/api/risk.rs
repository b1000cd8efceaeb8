//! The package risk report at upload: returned and stored with the version, shown on the run;
//! `coordinator.risk.refuse_at` refuses a package with findings at or above it (422 naming
//! them) and stores nothing.

use std::io::{Cursor, Write as _};
use std::path::Path;

use serde_json::{json, Value};
use skilleval_model::package::risk::{RiskPolicy, Severity};
use zip::write::SimpleFileOptions;

use crate::helpers::{spawn_app_with, AppOptions};
use crate::packages::given_tests;

/// The shared fixture package (one finding of each rule), with a `given` definition so it
/// runs anywhere.
fn risky_zip() -> Vec<u8> {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/model/tests/fixtures/risky-skill");
    let read = |p: &str| std::fs::read(fixture.join(p)).unwrap();
    let tests = serde_json::to_vec(&given_tests(&["ok"], json!({}))).unwrap();
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let deflated =
        SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    let stored = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (path, bytes, options) in [
        ("SKILL.md", read("SKILL.md"), deflated),
        ("scripts/collect.py", read("scripts/collect.py"), deflated),
        // Stored: a megabyte of zeros deflated is past the compression ratio limit.
        ("assets/model.bin", read("assets/model.bin"), stored),
        ("eval/tests.json", tests, deflated),
    ] {
        w.start_file(path, options).unwrap();
        w.write_all(&bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

fn rules(findings: &Value) -> Vec<String> {
    let mut rules: Vec<String> = findings
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap().to_string())
        .collect();
    rules.sort();
    rules
}

#[tokio::test]
async fn the_risk_report_is_returned_stored_and_shown_on_the_run() {
    let app = spawn_app_with(AppOptions::default()).await;
    let response = app.upload_zip(risky_zip(), "").await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    let findings = &body["risk"]["findings"];
    assert_eq!(findings.as_array().unwrap().len(), 7, "{findings}");
    let injection = findings
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rule"] == "judge_injection")
        .unwrap();
    assert_eq!(injection["file"], "SKILL.md");
    assert_eq!(injection["line"], 9);
    assert_eq!(injection["severity"], "high");

    let stored: Value = sqlx::query_scalar("SELECT risk_report FROM skill_versions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(&stored, &body["risk"]);
    let run_id = body["run_id"].as_str().unwrap();
    let (status, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(status, 200);
    assert_eq!(run["risk"], body["risk"]);
    app.cleanup().await;
}

#[tokio::test]
async fn the_policy_refuses_high_findings_with_a_422_naming_them_and_stores_nothing() {
    let app = spawn_app_with(AppOptions {
        risk: RiskPolicy {
            refuse_at: Some(Severity::High),
        },
        ..AppOptions::default()
    })
    .await;
    let response = app.upload_zip(risky_zip(), "").await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "package_risk");
    assert_eq!(
        body["error"]["details"]["policy"],
        "coordinator.risk.refuse_at"
    );
    assert_eq!(body["error"]["details"]["refuse_at"], "high");
    assert_eq!(
        rules(&body["error"]["details"]["findings"]),
        ["home_files", "judge_injection", "obfuscated_code"]
    );
    let message = body["error"]["message"].as_str().unwrap();
    for named in [
        "SKILL.md:9",
        "scripts/collect.py:7",
        "scripts/collect.py:9",
        "judge_injection",
    ] {
        assert!(message.contains(named), "{message}");
    }
    assert_eq!(app.count("skill_versions").await, 0);
    assert_eq!(app.count("runs").await, 0);

    // A package without a high finding passes the same policy.
    let clean = crate::packages::given_package("clean-skill", &["ok"], json!({}));
    assert_eq!(app.upload_zip(clean, "").await.status().as_u16(), 201);
    app.cleanup().await;
}
