//! Versions and comparisons (issue 18): a skill's history and benchmark after three uploads
//! whose pass rate changes, comparisons of runs and versions stored and read back, and the
//! refusals (`not_comparable` unless forced, unknown ids, unfinished runs) naming the field.

use serde_json::{json, Value};
use skilleval_execution::result::CaseStatus;
use uuid::Uuid;

use crate::helpers::{record_as_worker, TestApp};
use crate::packages::{given_tests, zip_of};

/// A `given` package of `cases` cases whose SKILL.md body is `body` (a new body is a new
/// version with the same definition); `expected` is what every case expects.
pub(crate) fn versioned_package(name: &str, body: &str, cases: usize, expected: &str) -> Vec<u8> {
    package_with_settings(name, body, cases, expected, json!({}))
}

/// [`versioned_package`] with the definition's `settings`.
pub(crate) fn package_with_settings(
    name: &str,
    body: &str,
    cases: usize,
    expected: &str,
    settings: Value,
) -> Vec<u8> {
    let outputs = vec!["ok"; cases];
    let mut tests = given_tests(&outputs, settings);
    for case in tests["testCases"].as_array_mut().unwrap() {
        case["expected"]["output"] = json!(expected);
    }
    let skill = format!(
        "---\nname: {name}\ndescription: A skill whose versions are compared.\n---\n\n{body}\n"
    );
    zip_of(&[
        ("SKILL.md", skill.as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
    ])
}

/// Records `failing` of the run's `cases` cases as failed (score 0), the rest as passed
/// (score 1), as a worker would, and finalises the run.
pub(crate) async fn finish_run(app: &TestApp, run_id: Uuid, cases: usize, failing: &[usize]) {
    app.wait_created(run_id).await;
    let ids: Vec<String> = (0..cases).map(|i| format!("case-{i:03}")).collect();
    let outcomes: Vec<(&str, CaseStatus, f64)> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            if failing.contains(&i) {
                (id.as_str(), CaseStatus::Failed, 0.0)
            } else {
                (id.as_str(), CaseStatus::Passed, 1.0)
            }
        })
        .collect();
    record_as_worker(app, run_id, &outcomes).await;
    assert!(app.state.aggregator.finalise(run_id).await.unwrap());
}

/// Uploads a version, records `failing` of its cases as failed (score 0) and the rest as
/// passed (score 1) as a worker would, and finalises the run. Returns (version id, run id).
pub(crate) async fn upload_and_finish(
    app: &TestApp,
    zip: Vec<u8>,
    query: &str,
    failing: &[usize],
) -> (Uuid, Uuid) {
    let response = app.upload_zip(zip, query).await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    let version_id: Uuid = body["version_id"].as_str().unwrap().parse().unwrap();
    let run_id: Uuid = body["run_id"].as_str().unwrap().parse().unwrap();
    let cases = body["test_cases"].as_u64().unwrap() as usize;
    finish_run(app, run_id, cases, failing).await;
    (version_id, run_id)
}

#[tokio::test]
async fn history_and_benchmark_follow_three_versions_whose_pass_rate_changes() {
    let app = crate::helpers::spawn_app().await;
    let name = "changing-skill";
    let ten: Vec<usize> = (0..10).collect();
    // v1: all 20 pass; v2: 10 fail (a real drop: 10 pass→fail flips, none back); v3: all pass.
    let (v1, r1) =
        upload_and_finish(&app, versioned_package(name, "One.", 20, "ok"), "", &[]).await;
    let (v2, r2) =
        upload_and_finish(&app, versioned_package(name, "Two.", 20, "ok"), "", &ten).await;
    let (v3, r3) =
        upload_and_finish(&app, versioned_package(name, "Three.", 20, "ok"), "", &[]).await;

    let (status, history) = app.get_json(&format!("/v1/skills/{name}/history")).await;
    assert_eq!(status, 200, "{history}");
    let versions = history["versions"].as_array().unwrap();
    let ids: Vec<&str> = versions
        .iter()
        .map(|v| v["version_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec![v3.to_string(), v2.to_string(), v1.to_string()],
        "newest first"
    );
    let runs: Vec<&str> = versions
        .iter()
        .map(|v| v["latest_run"]["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(runs, vec![r3.to_string(), r2.to_string(), r1.to_string()]);
    let rates: Vec<f64> = versions
        .iter()
        .map(|v| v["latest_run"]["summary"]["pass_rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates, vec![1.0, 0.5, 1.0]);
    for v in versions {
        assert_eq!(v["description_hash"].as_str().unwrap().len(), 64);
        assert_eq!(v["package_hash"].as_str().unwrap().len(), 64);
    }
    assert_ne!(versions[0]["package_hash"], versions[1]["package_hash"]);
    assert_eq!(
        versions[0]["previous"]["outcome"], "better",
        "{}",
        versions[0]
    );
    assert_eq!(versions[0]["previous"]["version_id"], v2.to_string());
    assert_eq!(
        versions[1]["previous"]["outcome"], "worse",
        "{}",
        versions[1]
    );
    assert_eq!(
        versions[1]["previous"]["pass_rate_delta"].as_f64(),
        Some(-0.5)
    );
    assert_eq!(
        versions[1]["previous"]["regressed_cases"]
            .as_array()
            .unwrap()
            .len(),
        10
    );
    assert!(
        versions[2]["previous"].is_null(),
        "the first version has none"
    );
    assert_eq!(history["next_cursor"], Value::Null);
    let doc = crate::openapi::doc();
    crate::openapi::check(&doc, "get", "/v1/skills/{name}/history", 200, &history);

    // The comparisons are stored once and reused by the next read.
    assert_eq!(app.count("comparisons").await, 2);
    let (_, again) = app.get_json(&format!("/v1/skills/{name}/history")).await;
    assert_eq!(app.count("comparisons").await, 2);
    assert_eq!(
        again["versions"][1]["previous"]["comparison_id"],
        versions[1]["previous"]["comparison_id"]
    );

    // Keyset pages: two, then one.
    let (_, first) = app
        .get_json(&format!("/v1/skills/{name}/history?limit=2"))
        .await;
    assert_eq!(first["versions"].as_array().unwrap().len(), 2);
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_string();
    let (_, second) = app
        .get_json(&format!(
            "/v1/skills/{name}/history?limit=2&cursor={cursor}"
        ))
        .await;
    let rest = second["versions"].as_array().unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0]["version_id"], v1.to_string());
    assert_eq!(second["next_cursor"], Value::Null);

    // The benchmark: each version's run in skill-creator's shape.
    let (status, bench) = app.get_json(&format!("/v1/skills/{name}/benchmark")).await;
    assert_eq!(status, 200, "{bench}");
    crate::openapi::check(&doc, "get", "/v1/skills/{name}/benchmark", 200, &bench);
    let docs = bench["versions"].as_array().unwrap();
    assert_eq!(docs.len(), 3);
    let case_rates: Vec<f64> = docs
        .iter()
        .map(|d| {
            d["run_summary"]["with_skill"]["case_pass_rate"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(case_rates, vec![1.0, 0.5, 1.0]);
    assert_eq!(docs[1]["metadata"]["version_id"], v2.to_string());
    assert_eq!(docs[1]["metadata"]["skill_name"], name);
    assert_eq!(docs[1]["runs"].as_array().unwrap().len(), 20);
    assert_eq!(docs[1]["runs"][0]["configuration"], "with_skill");
    assert!(
        docs[1]["run_summary"]["without_skill"].is_null(),
        "no baseline ran"
    );

    // Refusals name the parameter.
    let (status, body) = app
        .get_json(&format!("/v1/skills/{name}/history?cursor=nope"))
        .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["details"]["field"], "cursor");
    let (status, _) = app.get_json("/v1/skills/no-such-skill/history").await;
    assert_eq!(status, 404);
    app.cleanup().await;
}

#[tokio::test]
async fn comparisons_are_stored_and_read_back_and_refuse_what_cannot_be_compared() {
    let app = crate::helpers::spawn_app().await;
    let name = "compared-skill";
    let (v1, r1) =
        upload_and_finish(&app, versioned_package(name, "One.", 12, "ok"), "", &[]).await;
    let (_, r2) = upload_and_finish(
        &app,
        versioned_package(name, "Two.", 12, "ok"),
        "",
        &[0, 3, 5, 7, 9, 11],
    )
    .await;

    // A version id stands for its latest completed run.
    let response = app
        .post_json("/v1/comparisons", &json!({ "base": v1, "head": r2 }))
        .await;
    assert_eq!(response.status().as_u16(), 201);
    let location = response.headers()["location"].to_str().unwrap().to_string();
    let created: Value = response.json().await.unwrap();
    let doc = crate::openapi::doc();
    crate::openapi::check(&doc, "post", "/v1/comparisons", 201, &created);
    assert_eq!(created["run_a"], r1.to_string());
    assert_eq!(created["run_b"], r2.to_string());
    assert_eq!(created["outcome"], "worse");
    assert_eq!(created["winner"], "A");
    assert_eq!(created["pass_rate"]["mcnemar"]["regressions"], 6);
    assert_eq!(created["gate"]["verdict"], "fail");
    let mut regressed: Vec<&str> = created["gate"]["regressed_cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    regressed.sort();
    assert_eq!(
        regressed,
        vec!["case-000", "case-003", "case-005", "case-007", "case-009", "case-011"]
    );
    let (status, stored) = app.get_json(&location).await;
    assert_eq!(status, 200);
    assert_eq!(stored, created, "read back as stored");
    let markdown = app.get(&format!("{location}?format=markdown")).await;
    assert_eq!(markdown.status().as_u16(), 200);
    assert!(markdown.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/markdown"));
    let text = markdown.text().await.unwrap();
    assert!(text.contains("case-011"), "{text}");
    let (status, body) = app.get_json(&format!("{location}?format=pdf")).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["details"]["field"], "format");

    // A version whose every case expects something else measures something else.
    let (_, r3) =
        upload_and_finish(&app, versioned_package(name, "Three.", 12, "okay"), "", &[]).await;
    let response = app
        .post_json("/v1/comparisons", &json!({ "base": r1, "head": r3 }))
        .await;
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().await.unwrap();
    crate::openapi::check(&doc, "post", "/v1/comparisons", 409, &body);
    assert_eq!(body["error"]["code"], "not_comparable", "{body}");
    let forced = app
        .post_json(
            "/v1/comparisons",
            &json!({ "base": r1, "head": r3, "force": true }),
        )
        .await;
    assert_eq!(forced.status().as_u16(), 201);
    let forced: Value = forced.json().await.unwrap();
    assert_eq!(forced["counts"]["not_comparable"], 12);
    assert_eq!(
        forced["not_comparable"][0]["reasons"],
        json!(["definition"])
    );

    // Unknown ids and runs still going are refused naming the side.
    let response = app
        .post_json(
            "/v1/comparisons",
            &json!({ "base": Uuid::now_v7(), "head": r2 }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/base", "{body}");
    let unfinished: Value = app
        .upload_zip(versioned_package(name, "Four.", 12, "ok"), "")
        .await
        .json()
        .await
        .unwrap();
    let response = app
        .post_json(
            "/v1/comparisons",
            &json!({ "base": r1, "head": unfinished["run_id"] }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 409);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/head", "{body}");
    let (status, _) = app
        .get_json(&format!("/v1/comparisons/{}", Uuid::now_v7()))
        .await;
    assert_eq!(status, 404);
    app.cleanup().await;
}

#[tokio::test]
async fn a_gated_upload_fails_on_a_real_regression_and_passes_on_noise() {
    let app = crate::helpers::spawn_app().await;
    let name = "gated-skill";
    // Half the cases passing is enough for the threshold: only the gate can fail these runs.
    let package =
        |body: &str| package_with_settings(name, body, 20, "ok", json!({ "passThreshold": 0.5 }));
    let verdict_of = |run: Uuid| {
        let app = &app;
        async move {
            let (_, run) = app.get_json(&format!("/v1/runs/{run}")).await;
            run
        }
    };
    let summary_of = |run: Uuid| {
        let pool = app.pool.clone();
        async move {
            let s: Value = sqlx::query_scalar("SELECT summary FROM runs WHERE id = $1")
                .bind(run)
                .fetch_one(&pool)
                .await
                .unwrap();
            s
        }
    };
    let (_, r1) = upload_and_finish(&app, package("One."), "", &[]).await;
    // Noise: two cases fail (McNemar 2 vs 0 flips, p = 0.5; the score interval reaches 0).
    let (v2, r2) = upload_and_finish(&app, package("Two."), "?gate=no_regression", &[4, 17]).await;
    let s2 = summary_of(r2).await;
    assert_eq!(s2["verdict"], "pass", "{s2}");
    assert_eq!(s2["regression_gate"]["verdict"], "pass");
    assert_eq!(s2["regression_gate"]["base_run"], r1.to_string());
    assert_eq!(verdict_of(r2).await["verdict"], "pass");

    // A real regression: eight more cases fail against v2, the last version that passed.
    let failing: Vec<usize> = (0..8).chain([17]).collect();
    let (v3, r3) =
        upload_and_finish(&app, package("Three."), "?gate=no_regression", &failing).await;
    let s3 = summary_of(r3).await;
    assert_eq!(s3["verdict"], "fail", "{s3}");
    let gate = &s3["regression_gate"];
    assert_eq!(gate["verdict"], "fail");
    assert_eq!(
        gate["base_run"],
        r2.to_string(),
        "compared with the last passing version"
    );
    assert_eq!(gate["base_version"], v2.to_string());
    let mut regressed: Vec<&str> = gate["regressed_cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    regressed.sort();
    assert_eq!(
        regressed,
        vec!["case-000", "case-001", "case-002", "case-003", "case-005", "case-006", "case-007"],
        "case-004 and case-017 failed in v2 already"
    );
    let reason = s3["verdict_reasons"][0].as_str().unwrap();
    assert!(
        reason.contains("regression gate") && reason.contains("case-007"),
        "{reason}"
    );
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM comparisons WHERE candidate_run_id = $1 AND baseline_run_id = $2",
    )
    .bind(r3)
    .bind(r2)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(stored, 1, "the gate's comparison is stored");
    let report = app
        .get(&format!("/v1/runs/{r3}/report?format=markdown"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        report.contains("regression gate no_regression failed") && report.contains("case-005"),
        "the report names the regressed cases: {report}"
    );

    // The same regression without the gate passes on the threshold alone.
    let (_, r4) = upload_and_finish(&app, package("Four."), "", &failing).await;
    assert_eq!(summary_of(r4).await["verdict"], "pass");

    // Thresholds are configurable: a manual run of v3 at alpha 0.001 and a -0.9 margin is not
    // a detectable regression from v2 (seven flips: p = 0.016).
    let response = app
        .post_json(
            "/v1/runs",
            &json!({ "version_id": v3, "gate": { "rule": "no_regression", "alpha": 0.001, "score_margin": -0.9 } }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 202);
    let created: Value = response.json().await.unwrap();
    let r5: Uuid = created["run_id"].as_str().unwrap().parse().unwrap();
    finish_run(&app, r5, 20, &failing).await;
    let s5 = summary_of(r5).await;
    assert_eq!(s5["regression_gate"]["verdict"], "pass", "{s5}");
    assert_eq!(s5["regression_gate"]["config"]["alpha"], 0.001);
    assert_eq!(s5["regression_gate"]["base_run"], r2.to_string());
    // The history compares v3's latest run (r5) with v2's under the default thresholds: the
    // gate's comparison at alpha 0.001 is not reused for it.
    let (_, history) = app.get_json(&format!("/v1/skills/{name}/history")).await;
    let v3_entry = history["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version_id"] == v3.to_string())
        .unwrap()
        .clone();
    assert_eq!(v3_entry["latest_run"]["run_id"], r5.to_string());
    assert_eq!(v3_entry["previous"]["outcome"], "worse", "{v3_entry}");
    assert_ne!(
        v3_entry["previous"]["comparison_id"],
        s5["regression_gate"]["comparison_id"]
    );

    // The definition may ask for the gate itself. v4 (ungated, passing on the threshold) is
    // now the last version that passed: six more cases failing than in v4 is a regression.
    let gated_definition = package_with_settings(
        name,
        "Six.",
        20,
        "ok",
        json!({ "passThreshold": 0.2, "gate": "no_regression" }),
    );
    let worse: Vec<usize> = (0..14).chain([17]).collect();
    let (_, r6) = upload_and_finish(&app, gated_definition, "", &worse).await;
    let s6 = summary_of(r6).await;
    assert_eq!(s6["regression_gate"]["verdict"], "fail", "{s6}");
    assert_eq!(s6["regression_gate"]["base_run"], r4.to_string());
    assert_eq!(
        s6["regression_gate"]["regressed_cases"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert_eq!(s6["verdict"], "fail");

    // Out-of-range thresholds are refused naming the field.
    let response = app
        .post_json(
            "/v1/runs",
            &json!({ "version_id": v3, "gate": { "rule": "no_regression", "alpha": 1.5 } }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "/gate/alpha");
    let response = app
        .upload_zip(
            package("Five."),
            "?gate=no_regression&gate_score_margin=0.5",
        )
        .await;
    assert_eq!(response.status().as_u16(), 400);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["details"]["field"], "gate_score_margin");
    app.cleanup().await;
}

#[tokio::test]
async fn a_dry_run_forecasts_cost_and_power_from_the_skills_last_run_and_creates_nothing() {
    let app = crate::helpers::spawn_app().await;
    let name = "planned-skill";
    // v1 runs: 15 of 20 pass, each case measured at 150 tokens and $0.002.
    let upload: Value = app
        .upload_zip(versioned_package(name, "One.", 20, "ok"), "")
        .await
        .json()
        .await
        .unwrap();
    let r1: Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(r1).await;
    let store = skilleval_infra::store::Store::from_pool(app.pool.clone());
    let results: Vec<_> = crate::helpers::planned_jobs(&app, r1)
        .await
        .iter()
        .map(|job| {
            let mut r = skilleval_execution::result::JobResult::skipped(job, "placeholder");
            let passed = job.case_index >= 5;
            r.status = if passed {
                CaseStatus::Passed
            } else {
                CaseStatus::Failed
            };
            r.score = Some(if passed { 1.0 } else { 0.0 });
            r.produce_usage.input_tokens = 100;
            r.produce_usage.output_tokens = 50;
            r.produce_usage.cost_usd = 0.002;
            r
        })
        .collect();
    store.record_results(&results).await.unwrap();
    assert!(app.state.aggregator.finalise(r1).await.unwrap());
    // v2 is stored without a run: its forecast comes from v1's.
    let upload: Value = app
        .upload_zip(versioned_package(name, "Two.", 20, "ok"), "?run=false")
        .await
        .json()
        .await
        .unwrap();
    let v2 = upload["version_id"].as_str().unwrap().to_string();
    let runs_before = app.count("runs").await;

    let response = app
        .post_json("/v1/runs?dry_run=true", &json!({ "version_id": v2 }))
        .await;
    assert_eq!(response.status().as_u16(), 200);
    let plan: Value = response.json().await.unwrap();
    crate::openapi::check(&crate::openapi::doc(), "post", "/v1/runs", 200, &plan);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["cases"], 20);
    assert_eq!(plan["attempts"], 20);
    assert_eq!(
        plan["model_calls"]["total"], 0,
        "given outputs, exact matches"
    );
    assert_eq!(plan["baseline_pass_rate"], 0.75);
    assert!(plan["pass_rate_source"]
        .as_str()
        .unwrap()
        .contains(&r1.to_string()));
    assert_eq!(plan["estimated_tokens"], 150 * 20);
    let cost = plan["estimated_cost_usd"].as_f64().unwrap();
    assert!((cost - 0.04).abs() < 1e-9, "{cost}");
    // The power numbers are the shared statistics' (what `skilleval plan` prints).
    let expected = skilleval_analysis::stats::power_advice(
        &skilleval_analysis::stats::Design::paired(20, 1, 0.75),
        skilleval_analysis::forecast::TARGET_DROP,
    )
    .unwrap();
    assert_eq!(plan["mde_pass_rate"].as_f64().unwrap(), expected.mde.drop);
    assert_eq!(plan["advice"], expected.text);
    assert!(plan["advice"].as_str().unwrap().contains("20 cases"));
    assert_eq!(
        app.count("runs").await,
        runs_before,
        "a dry run creates nothing"
    );

    // The request's filter is planned as a run would be.
    let (_, narrowed) = {
        let r = app
            .post_json(
                "/v1/runs?dry_run=true",
                &json!({ "version_id": v2, "test_cases": ["case-000", "case-001"] }),
            )
            .await;
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(narrowed["cases"], 2);
    assert_eq!(narrowed["estimated_tokens"], 300);
    let response = app
        .post_json(
            "/v1/runs?dry_run=true",
            &json!({ "version_id": v2, "test_cases": ["nope"] }),
        )
        .await;
    assert_eq!(response.status().as_u16(), 422);
    let response = app
        .post_json("/v1/runs?dry_run=maybe", &json!({ "version_id": v2 }))
        .await;
    assert_eq!(response.status().as_u16(), 400);
    app.cleanup().await;
}

#[tokio::test]
async fn skilleval_compare_with_a_server_prints_the_comparison_and_exits_by_the_gate() {
    use skilleval_cli::compare::{self as cli, CompareArgs, CompareFormat, Gate};
    let app = crate::helpers::spawn_app().await;
    let name = "cli-compared";
    let (v1, r1) =
        upload_and_finish(&app, versioned_package(name, "One.", 12, "ok"), "", &[]).await;
    let (_, r2) = upload_and_finish(
        &app,
        versioned_package(name, "Two.", 12, "ok"),
        "",
        &[1, 2, 3, 4, 5, 6],
    )
    .await;
    let (_, r3) =
        upload_and_finish(&app, versioned_package(name, "Three.", 12, "okay"), "", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("comparison.json");
    let args = |base: String, head: String, force: bool| CompareArgs {
        base: base.into(),
        head: head.into(),
        server: Some(app.address.clone()),
        token: None,
        format: CompareFormat::Md,
        output: Some(out.clone()),
        gate: Gate::NoRegression,
        force,
        comparator: false,
        comparator_seed: None,
        both_orders: false,
    };
    // v1 (a version id) against r2: six pass→fail flips, the gate fails: exit 1.
    assert_eq!(
        cli::compare(&args(v1.to_string(), r2.to_string(), false)).await,
        1
    );
    let written: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(written["run_a"], r1.to_string());
    assert_eq!(written["gate"]["verdict"], "fail");
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM comparisons")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1, "the server stored it");
    // r2 against v1's run: better, the gate passes: exit 0.
    assert_eq!(
        cli::compare(&args(r2.to_string(), r1.to_string(), false)).await,
        0
    );
    // Not comparable without --force is bad input (2); not an id either.
    assert_eq!(
        cli::compare(&args(r1.to_string(), r3.to_string(), false)).await,
        2
    );
    assert_eq!(
        cli::compare(&args(r1.to_string(), r3.to_string(), true)).await,
        0
    );
    assert_eq!(
        cli::compare(&args("eval/runs/x".into(), r3.to_string(), false)).await,
        2
    );
    app.cleanup().await;
}
