//! skill-creator's files from the service: a finished run as its iteration folder
//! (`GET /v1/runs/{id}/workspace`, `skilleval export --skill-creator --server`), and the
//! `feedback.json` of its viewer imported as reviews (`POST /v1/runs/{id}/reviews`,
//! `skilleval feedback push`).

use std::time::Duration;

use serde_json::{json, Value};

use crate::e2e::{start_worker_with, wait_for_verdict};
use crate::helpers::{spawn_app_with, AppOptions};
use crate::openapi::{check, doc};
use crate::packages::given_package;

fn read_json(path: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[tokio::test]
async fn a_finished_run_exports_as_a_workspace_and_takes_back_skill_creators_feedback() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    let upload: Value = app
        .upload_zip(
            given_package("exported", &["ok", "no", "ok"], json!({})),
            "",
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id = upload["run_id"].as_str().unwrap().to_string();
    wait_for_verdict(&app, &run_id).await;

    // The workspace, unpacked by the CLI as a user would.
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("iteration-1");
    let code = skilleval_cli::export::export(&skilleval_cli::export::ExportArgs {
        skill_creator: true,
        run: run_id.clone(),
        out: target.clone(),
        server: Some(app.address.clone()),
        token: None,
    })
    .await;
    assert_eq!(code, 0);
    let bench = read_json(&target.join("benchmark.json"));
    assert_eq!(bench["metadata"]["skill_name"], "exported");
    assert_eq!(
        bench["metadata"]["skill_path"],
        format!("skilleval:exported@{}", upload["version"].as_str().unwrap())
    );
    assert_eq!(bench["metadata"]["evals_run"], json!([1, 2, 3]));
    assert_eq!(bench["runs"].as_array().unwrap().len(), 3);
    let run = target.join("eval-2-case-001/with_skill/run-1");
    let grading = read_json(&run.join("grading.json"));
    assert_eq!(grading["summary"]["pass_rate"], 0.0);
    assert_eq!(
        read_json(&run.join("eval_metadata.json"))["prompt"],
        "Say ok (1)"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("outputs/output.md")).unwrap(),
        "no"
    );
    assert!(run.join("timing.json").exists());
    // A second export into the same folder is refused: one run per folder.
    let again = skilleval_cli::export::export(&skilleval_cli::export::ExportArgs {
        skill_creator: true,
        run: run_id.clone(),
        out: target.clone(),
        server: Some(app.address.clone()),
        token: None,
    })
    .await;
    assert_eq!(again, 2);

    // skill-creator's viewer's feedback.json: every run listed, empty = fine.
    let feedback = json!({
        "reviews": [
            {"run_id": "eval-1-case-000-with_skill-run-1", "feedback": "", "timestamp": "2026-01-15T10:30:00Z"},
            {"run_id": "eval-2-case-001-with_skill-run-1", "feedback": "", "timestamp": "2026-01-15T10:30:00Z"},
            {"run_id": "eval-3-case-002-with_skill-run-1", "feedback": "the tone is off", "timestamp": "2026-01-15T10:31:00Z"}
        ],
        "status": "complete"
    });
    // A run the folder does not have is named, and nothing is stored.
    let mut wrong = feedback.clone();
    wrong["reviews"][1]["run_id"] = json!("eval-9-with_skill-run-1");
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/reviews"), &wrong)
        .await;
    assert_eq!(r.status().as_u16(), 422);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["details"]["field"], "/reviews/1/run_id", "{e}");
    assert_eq!(app.count("case_reviews").await, 0);
    // An entry of the wrong shape names its field.
    let mut bad = feedback.clone();
    bad["reviews"][0]["feedback"] = json!(3);
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/reviews"), &bad)
        .await;
    assert_eq!(r.status().as_u16(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["details"]["field"], "/reviews/0/feedback", "{e}");

    // Sent as a user would, with the CLI.
    let file = out.path().join("feedback.json");
    std::fs::write(&file, feedback.to_string()).unwrap();
    let code = skilleval_cli::export::feedback(&skilleval_cli::export::FeedbackArgs {
        command: skilleval_cli::export::FeedbackCommand::Push(
            skilleval_cli::export::FeedbackPushArgs {
                file,
                run: run_id.clone(),
                reviewer: "bo".into(),
                server: app.address.clone(),
                token: None,
            },
        ),
    })
    .await;
    assert_eq!(code, 0);
    let (_, listed) = app.get_json(&format!("/v1/runs/{run_id}/reviews")).await;
    let verdicts: Vec<(String, String, String, String)> = listed["reviews"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["test_case_id"].as_str().unwrap().to_string(),
                r["verdict"].as_str().unwrap().to_string(),
                r["note"].as_str().unwrap().to_string(),
                r["reviewer"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let v = |id: &str, verdict: &str, note: &str| {
        (
            id.to_string(),
            verdict.to_string(),
            note.to_string(),
            "bo".to_string(),
        )
    };
    assert_eq!(
        verdicts,
        [
            v("case-000", "agree", ""),
            v("case-001", "disagree", ""),
            v("case-002", "disagree", "the tone is off"),
        ],
        "fine on a pass agrees, fine on a fail disagrees, a complaint on a pass disagrees"
    );
    // The raw endpoint says what it stored and what it ignored; the same file again replaces.
    let mut again = feedback.clone();
    again["reviewer"] = json!("bo");
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/reviews"), &again)
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let body: Value = r.json().await.unwrap();
    check(&doc(), "post", "/v1/runs/{id}/reviews", 201, &body);
    assert_eq!(body["stored"], 3);
    assert_eq!(body["ignored"], json!([]));
    assert_eq!(app.count("case_reviews").await, 3);

    // And back out: the export keys them as the viewer does, fine is empty.
    let (_, exported) = app.get_json(&format!("/v1/runs/{run_id}/feedback")).await;
    let back: Vec<(&str, &str)> = exported["reviews"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap(),
                r["feedback"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        back,
        [
            ("eval-1-case-000-with_skill-run-1", ""),
            ("eval-2-case-001-with_skill-run-1", ""),
            ("eval-3-case-002-with_skill-run-1", "the tone is off"),
        ]
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}
