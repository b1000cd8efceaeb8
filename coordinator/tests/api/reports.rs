//! Reports over chosen runs (issue 30): `POST /v1/reports` over every completed run of a skill
//! or the ones named, with the report spec seed's summary across runs (checked against
//! hand-computed figures), stored and read again by `GET /v1/reports/{id}` in Markdown and
//! JSON; the refusals name the field; a report goes when one of its runs is deleted; the
//! run-level report keeps its shape.

use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, TestApp};
use crate::openapi::{check, doc};
use crate::versions::{finish_run, package_with_settings, upload_and_finish};

fn package(name: &str, body: &str) -> Vec<u8> {
    package_with_settings(name, body, 4, "ok", json!({ "passThreshold": 0.5 }))
}

async fn create(app: &TestApp, body: Value) -> (u16, Value) {
    let r = app.post_json("/v1/reports", &body).await;
    let status = r.status().as_u16();
    let answer: Value = r.json().await.unwrap();
    check(&doc(), "post", "/v1/reports", status, &answer);
    (status, answer)
}

fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-9)
}

#[tokio::test]
async fn a_report_over_chosen_runs_is_stored_and_read_again_with_the_seeds_summary() {
    let app = spawn_app().await;
    let name = "reported";
    // Scores 0.75 (pass), 0.25 (fail), then a manual run of v1 at 1.0 (pass).
    let (v1, r1) = upload_and_finish(&app, package(name, "One."), "", &[0]).await;
    let (_, r2) = upload_and_finish(&app, package(name, "Two."), "", &[0, 1, 2]).await;
    let manual = app
        .post_json("/v1/runs", &json!({ "version_id": v1 }))
        .await;
    let r3: Uuid = manual.json::<Value>().await.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    finish_run(&app, r3, 4, &[]).await;
    // A run still going is in no report.
    let running: Value = app
        .upload_zip(package(name, "Three."), "")
        .await
        .json()
        .await
        .unwrap();
    let r4: Uuid = running["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(r4).await;

    let (status, all) = create(&app, json!({ "skill": name, "format": "markdown" })).await;
    assert_eq!(status, 201, "{all}");
    let report = &all["report"];
    assert_eq!(report["id"], all["id"]);
    assert_eq!(report["taskId"], name);
    assert_eq!(report["format"], "markdown");
    assert_eq!(
        report["runIds"],
        json!([r1, r2, r3]),
        "every completed run, oldest first"
    );
    let s = &report["summary"];
    assert_eq!(s["totalRuns"], 3);
    let mean = (0.75 + 0.25 + 1.0) / 3.0;
    assert!(close(&s["averageScore"], mean), "{s}");
    let d = &s["scoreDistribution"];
    assert!(
        close(&d["min"], 0.25) && close(&d["max"], 1.0) && close(&d["median"], 0.75),
        "{d}"
    );
    let var =
        ((0.75_f64 - mean).powi(2) + (0.25_f64 - mean).powi(2) + (1.0_f64 - mean).powi(2)) / 3.0;
    assert!(close(&d["stdDev"], var.sqrt()), "{d}");
    assert!(
        close(&s["schemaComplianceRate"], 1.0),
        "no case checks a schema"
    );
    assert_eq!(s["rubricBreakdown"], json!({}));
    assert_eq!(report["passedRuns"], 2);
    assert_eq!(report["runs"][1]["verdict"], "fail");
    assert!(close(&report["runs"][1]["averageScore"], 0.25));

    // The runs named: just those.
    let (status, chosen) = create(
        &app,
        json!({ "skill": name, "run_ids": [r3, r2], "format": "json" }),
    )
    .await;
    assert_eq!(status, 201, "{chosen}");
    assert_eq!(chosen["report"]["runIds"], json!([r2, r3]));
    assert!(close(&chosen["report"]["summary"]["averageScore"], 0.625));
    assert_eq!(app.count("reports").await, 2);

    // Read again: in the format it was made in, or the one asked for.
    let id = all["id"].as_str().unwrap();
    let r = app.get(&format!("/v1/reports/{id}")).await;
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    let markdown = r.text().await.unwrap();
    assert_eq!(markdown, report["content"].as_str().unwrap());
    assert!(
        markdown.contains("over 3 run(s)") && markdown.contains(&r2.to_string()),
        "{markdown}"
    );
    assert!(markdown.contains("2 of 3 run(s) passed"), "{markdown}");
    let (status, json_doc) = app.get_json(&format!("/v1/reports/{id}?format=json")).await;
    assert_eq!(status, 200);
    check(&doc(), "get", "/v1/reports/{id}", 200, &json_doc);
    assert_eq!(json_doc, *report);
    let chosen_id = chosen["id"].as_str().unwrap();
    let (_, again) = app.get_json(&format!("/v1/reports/{chosen_id}")).await;
    assert_eq!(again, chosen["report"], "a json report reads back as JSON");

    // The run-level report keeps its shape.
    let (status, run_report) = app
        .get_json(&format!("/v1/runs/{r1}/report?format=json"))
        .await;
    assert_eq!(status, 200);
    for key in ["runSummary", "results", "verdict", "summary"] {
        assert!(run_report.get(key).is_some(), "{key}");
    }
    assert_eq!(
        run_report["summary"]["totalRuns"], 4,
        "a run's report counts its cases"
    );

    // Refusals name the field.
    let other = upload_and_finish(&app, package("reported-other", "One."), "", &[])
        .await
        .1;
    let refusals = [
        (json!({ "skill": name, "format": "pdf" }), 400, "/format"),
        (
            json!({ "skill": name, "run_ids": [], "format": "json" }),
            400,
            "/run_ids",
        ),
        (
            json!({ "skill": name, "run_ids": [r1, r1], "format": "json" }),
            400,
            "/run_ids/1",
        ),
        (
            json!({ "skill": name, "run_ids": [r1, r4], "format": "json" }),
            422,
            "/run_ids/1",
        ),
        (
            json!({ "skill": name, "run_ids": [Uuid::now_v7()], "format": "json" }),
            422,
            "/run_ids/0",
        ),
        (
            json!({ "skill": name, "run_ids": [other], "format": "json" }),
            422,
            "/run_ids/0",
        ),
        (
            json!({ "skill": name, "format": "json", "colour": 1 }),
            400,
            "/colour",
        ),
    ];
    for (body, want, field) in refusals {
        let (status, e) = create(&app, body.clone()).await;
        assert_eq!(status, want, "{body}: {e}");
        assert_eq!(e["error"]["details"]["field"], field, "{body}: {e}");
    }
    let (_, e) = create(
        &app,
        json!({ "skill": name, "run_ids": [r1, r4], "format": "json" }),
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not completed"),
        "{e}"
    );
    let (_, e) = create(
        &app,
        json!({ "skill": name, "run_ids": [other], "format": "json" }),
    )
    .await;
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("another skill"),
        "{e}"
    );
    let (status, _) = create(&app, json!({ "skill": "no-such-skill", "format": "json" })).await;
    assert_eq!(status, 404);
    let none: Value = app
        .upload_zip(package("never-run", "One."), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    assert!(none["run_id"].is_null());
    let (status, e) = create(&app, json!({ "skill": "never-run", "format": "json" })).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(e["error"]["code"], "no_completed_run");
    let (status, _) = app
        .get_json(&format!("/v1/reports/{}", Uuid::now_v7()))
        .await;
    assert_eq!(status, 404);
    let (status, e) = app.get_json(&format!("/v1/reports/{id}?format=html")).await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["details"]["field"], "format");
    assert_eq!(app.count("reports").await, 2, "no refusal stored anything");

    // A report describes exactly its runs: deleting one deletes the reports that cover it.
    let r = app
        .client
        .delete(format!("{}/v1/runs/{r3}", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(app.count("reports").await, 0);
    assert_eq!(app.count("report_runs").await, 0);
    app.cleanup().await;
}
