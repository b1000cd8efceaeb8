//! The web interface's HTTP side without a browser: the validate-only endpoint, reviews and
//! judge agreement, the feedback export, sign-in and cross-site protection, the pages' headers
//! and the run table's SQL filter and paging.

use std::time::Duration;

use serde_json::{json, Value};

use crate::e2e::{start_worker_with, wait_for_verdict};
use crate::helpers::{spawn_app, spawn_app_with, AppOptions, TestApp};
use crate::openapi::{check, doc};
use crate::packages::{given_package, invalid_tests_package};

#[tokio::test]
async fn validate_only_lists_every_problem_and_stores_nothing() {
    let app = spawn_app().await;
    let r = app
        .client
        .post(format!("{}/v1/skills/validate", app.address))
        .header("Content-Type", "application/zip")
        .body(invalid_tests_package())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    check(&doc(), "post", "/v1/skills/validate", 200, &body);
    assert_eq!(body["valid"], false, "{body}");
    assert_eq!(body["code"], "package_invalid");
    let pointers: Vec<&str> = body["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["severity"] == "error")
        .map(|p| p["pointer"].as_str().unwrap())
        .collect();
    assert!(pointers.len() >= 3, "{body}");
    assert!(
        pointers.iter().any(|p| p.starts_with("/testCases/1")),
        "{pointers:?}"
    );
    assert!(
        pointers
            .iter()
            .any(|p| p.starts_with("/testCases/2/expected/patterns/0")),
        "{pointers:?}"
    );
    assert_eq!(app.count("skills").await, 0);
    assert_eq!(app.count("skill_versions").await, 0);

    let r = app
        .client
        .post(format!("{}/v1/skills/validate", app.address))
        .header("Content-Type", "application/zip")
        .body(given_package("fine", &["ok", "no"], json!({})))
        .send()
        .await
        .unwrap();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["valid"], true, "{body}");
    assert_eq!(body["name"], "fine");
    assert_eq!(body["test_cases"], 2);
    assert_eq!(
        app.count("skills").await,
        0,
        "a valid package is not stored either"
    );
    app.cleanup().await;
}

async fn finished_run(app: &TestApp, zip: Vec<u8>) -> String {
    finished_run_with(app, zip, "").await
}

async fn finished_run_with(app: &TestApp, zip: Vec<u8>, query: &str) -> String {
    let upload: Value = app.upload_zip(zip, query).await.json().await.unwrap();
    let run_id = upload["run_id"].as_str().unwrap().to_string();
    wait_for_verdict(app, &run_id).await;
    run_id
}

#[tokio::test]
async fn reviews_are_checked_stored_exported_and_summarised_as_judge_agreement() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    let run_id = finished_run(
        &app,
        given_package("judged", &["ok", "no", "ok", "no"], json!({})),
    )
    .await;

    // Every bad review names its field; nothing is stored.
    for (body, field) in [
        (
            json!({"reviews": [{"test_case_id": "nope", "verdict": "agree"}]}),
            "/reviews/0/test_case_id",
        ),
        (
            json!({"reviews": [{"test_case_id": "case-000", "criterion": "tone", "verdict": "agree"}]}),
            "/reviews/0/criterion",
        ),
        (json!({"reviews": []}), "/reviews"),
    ] {
        let r = app
            .post_json(&format!("/v1/runs/{run_id}/reviews"), &body)
            .await;
        assert_eq!(r.status().as_u16(), 422, "{body}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["details"]["field"], field, "{e}");
    }
    let r = app
        .post_json(
            &format!("/v1/runs/{run_id}/reviews"),
            &json!({"reviews": [{"test_case_id": "case-000", "verdict": "maybe"}]}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 400, "a shape error");
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["details"]["field"], "/reviews/0/verdict", "{e}");
    assert_eq!(app.count("case_reviews").await, 0);
    // The review form's errors name its own inputs, not the API's pointers.
    let r = app
        .client
        .post(format!("{}/ui/runs/{run_id}/cases/0/review", app.address))
        .form(&[("criterion:tone", "agree")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
    let page = r.text().await.unwrap();
    assert!(page.contains("criterion:tone"), "{page}");
    assert!(!page.contains("/reviews/0/criterion"), "{page}");
    assert_eq!(app.count("case_reviews").await, 0);

    // The judge passed case-000 and case-002, failed case-001 and case-003. The reviewer agrees
    // on three and says case-001 should have passed: 3/4 agreement; judge labels P F P F,
    // reviewer P P P F: pe = 0.5·0.75 + 0.5·0.25 = 0.5, kappa = (0.75 − 0.5)/0.5 = 0.5.
    let body = json!({"reviewer": "ann", "reviews": [
        {"test_case_id": "case-000", "verdict": "agree"},
        {"test_case_id": "case-001", "verdict": "disagree", "note": "<b>fine</b> really"},
        {"test_case_id": "case-002", "verdict": "agree"},
        {"test_case_id": "case-003", "verdict": "agree"},
    ]});
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/reviews"), &body)
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let (status, agreement) = app.get_json("/v1/skills/judged/agreement").await;
    assert_eq!(status, 200);
    check(
        &doc(),
        "get",
        "/v1/skills/{name}/agreement",
        200,
        &agreement,
    );
    let (_, listed) = app.get_json(&format!("/v1/runs/{run_id}/reviews")).await;
    check(&doc(), "get", "/v1/runs/{id}/reviews", 200, &listed);
    assert_eq!(listed["reviews"].as_array().unwrap().len(), 4);
    let row = &agreement["agreement"][0];
    assert_eq!(row["criterion"], Value::Null, "{agreement}");
    assert_eq!(row["judge"], "exact_match");
    assert_eq!(row["n"], 4);
    assert!((row["percent_agreement"].as_f64().unwrap() - 0.75).abs() < 1e-12);
    assert!(
        (row["kappa"].as_f64().unwrap() - 0.5).abs() < 1e-12,
        "{row}"
    );

    // The case page shows the review beside the grade, its note escaped.
    let page = app
        .get(&format!("/ui/runs/{run_id}/cases/1"))
        .await
        .text()
        .await
        .unwrap();
    assert!(page.contains("&lt;b&gt;fine&lt;/b&gt; really"), "{page}");
    assert!(!page.contains("<b>fine</b>"));

    // A second review by the same reviewer replaces the first.
    let again =
        json!({"reviewer": "ann", "reviews": [{"test_case_id": "case-001", "verdict": "agree"}]});
    app.post_json(&format!("/v1/runs/{run_id}/reviews"), &again)
        .await;
    let (_, agreement) = app.get_json("/v1/skills/judged/agreement").await;
    assert_eq!(agreement["agreement"][0]["percent_agreement"], 1.0);
    assert_eq!(app.count("case_reviews").await, 4);

    // skill-creator's feedback.json shape.
    let (status, feedback) = app.get_json(&format!("/v1/runs/{run_id}/feedback")).await;
    assert_eq!(status, 200);
    check(&doc(), "get", "/v1/runs/{id}/feedback", 200, &feedback);
    assert_eq!(feedback["status"], "complete");
    let reviews = feedback["reviews"].as_array().unwrap();
    assert_eq!(reviews.len(), 4);
    assert!(reviews.iter().all(|r| r["run_id"].is_string()
        && r["feedback"].is_string()
        && r["timestamp"].is_string()));
    // Keyed as skill-creator's viewer names runs; agreeing that a case passes is "fine".
    assert_eq!(reviews[0]["run_id"], "eval-1-case-000-with_skill-run-1");
    assert_eq!(reviews[0]["feedback"], "", "{feedback}");
    assert_eq!(
        reviews[1]["feedback"],
        "not fine: the reviewer agrees with the failing grade of exact_match"
    );
    assert_eq!(reviews[1]["reviewer"], "ann");

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

#[tokio::test]
async fn pages_need_a_session_carry_a_strict_csp_and_refuse_cross_site_changes() {
    let app = spawn_app_with(AppOptions {
        auth_tokens: vec!["secret-token".into()],
        ..AppOptions::default()
    })
    .await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let url = |p: &str| format!("{}{p}", app.address);
    let r = client.get(url("/")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/ui/");
    let r = client.get(url("/ui/")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303, "not signed in");
    assert_eq!(r.headers()["location"], "/ui/login");
    let r = client
        .get(url("/ui/static/style.css"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "assets are open");

    let r = client
        .post(url("/ui/login"))
        .form(&[("token", "wrong")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = client
        .post(url("/ui/login"))
        .form(&[("token", "secret-token")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();

    let r = client
        .get(url("/ui/"))
        .header("Cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert!(csp.contains("default-src 'none'"));
    let html = r.text().await.unwrap();
    assert!(!html.contains("<script>"), "no inline script");

    // The cookie authenticates the API too, but a state change must come from our pages.
    let validate = |origin: Option<&str>| {
        let mut req = client
            .post(url("/v1/skills/validate"))
            .header("Content-Type", "application/zip")
            .header("Cookie", &session)
            .body(given_package("x", &["ok"], json!({})));
        if let Some(o) = origin {
            req = req.header("Origin", o);
        }
        req.send()
    };
    assert_eq!(
        validate(Some("http://evil.example"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        403
    );
    assert_eq!(
        validate(None).await.unwrap().status().as_u16(),
        403,
        "a cookie without an origin"
    );
    assert_eq!(
        validate(Some(&app.address))
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    // A form of another site posting to a page lands on the HTML error page, not on JSON.
    let r = client
        .post(url("/ui/compare"))
        .header("Cookie", &session)
        .header("Origin", "http://evil.example")
        .form(&[("base", "x"), ("head", "y")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let page = r.text().await.unwrap();
    assert!(
        page.contains("Error 403") && page.contains("own pages"),
        "{page}"
    );
    // A bearer client (no browser) needs no origin.
    let r = client
        .post(url("/v1/skills/validate"))
        .header("Content-Type", "application/zip")
        .bearer_auth("secret-token")
        .body(given_package("x", &["ok"], json!({})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    app.cleanup().await;
}

#[tokio::test]
async fn the_run_table_filters_sorts_and_pages_in_sql() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    // 150 cases, every third one failing.
    let outputs: Vec<&str> = (0..150)
        .map(|i| if i % 3 == 0 { "no" } else { "ok" })
        .collect();
    let run_id = finished_run(&app, given_package("paged", &outputs, json!({}))).await;
    let app_ref = &app;
    let page = |q: &str| {
        let path = format!("/ui/runs/{run_id}{q}");
        async move { app_ref.get(&path).await.text().await.unwrap() }
    };
    let rows = |html: &str| html.matches("<tr class=\"case\"").count();
    let all = page("").await;
    assert_eq!(rows(&all), 100, "one page");
    assert!(all.contains("150 matching cases · page 1 of 2"));
    assert!(all.contains("id=\"histogram\""));
    let second = page("?page=2").await;
    assert_eq!(rows(&second), 50);
    let failed = page("?status=failed").await;
    assert_eq!(rows(&failed), 50);
    assert!(!failed.contains("data-status=\"passed\""));
    // Rows' statuses in page order: sorted by score, the 50 failures come first; in case order
    // they alternate with passes.
    let statuses = |html: &str| -> Vec<String> {
        let marker = "<tr class=\"case\" data-status=\"";
        html.match_indices(marker)
            .filter_map(|(i, _)| html[i + marker.len()..].split('"').next())
            .map(str::to_string)
            .collect()
    };
    let sorted = statuses(&page("?sort=score").await);
    assert_eq!(sorted.len(), 100);
    assert!(sorted[..50].iter().all(|s| s == "failed"), "{sorted:?}");
    assert!(sorted[50..].iter().all(|s| s == "passed"), "{sorted:?}");
    assert_eq!(statuses(&all)[..3], ["failed", "passed", "passed"]);
    let bad = app.get(&format!("/ui/runs/{run_id}?status=nope")).await;
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.text().await.unwrap().contains("status"));
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

#[tokio::test]
async fn a_run_with_repeats_shows_and_reviews_each_case_once() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    let run_id = finished_run_with(
        &app,
        given_package("repeated", &["ok", "no", "ok"], json!({})),
        "?repeats=3",
    )
    .await;
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM eval_results WHERE run_id = $1")
        .bind(uuid::Uuid::parse_str(&run_id).unwrap())
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 9, "three attempts of three cases are stored");
    let page = app
        .get(&format!("/ui/runs/{run_id}"))
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(page.matches("<tr class=\"case\"").count(), 3, "{page}");
    assert!(page.contains("3 matching cases"), "{page}");
    let case = app.get(&format!("/ui/runs/{run_id}/cases/1")).await;
    assert_eq!(case.status().as_u16(), 200);
    let body = json!({"reviewer": "ann", "reviews": [
        {"test_case_id": "case-000", "verdict": "agree"},
        {"test_case_id": "case-001", "verdict": "disagree"},
    ]});
    let r = app
        .post_json(&format!("/v1/runs/{run_id}/reviews"), &body)
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let (_, listed) = app.get_json(&format!("/v1/runs/{run_id}/reviews")).await;
    assert_eq!(listed["reviews"].as_array().unwrap().len(), 2, "{listed}");
    let (_, agreement) = app.get_json("/v1/skills/repeated/agreement").await;
    assert_eq!(agreement["agreement"][0]["n"], 2, "{agreement}");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

#[tokio::test]
async fn preview_grades_one_case_against_a_pasted_output_and_stores_nothing() {
    let app = spawn_app().await;
    let r = app
        .upload_zip(
            given_package("previewed", &["ok", "no"], json!({})),
            "?run=false",
        )
        .await;
    assert_eq!(r.status().as_u16(), 201);
    let preview = |body: Value| {
        let app = &app;
        async move {
            let r = app.post_json("/v1/skills/previewed/preview", &body).await;
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let (status, passed) = preview(json!({"test_case_id": "case-001", "output": "ok"})).await;
    assert_eq!(status, 200, "{passed}");
    check(&doc(), "post", "/v1/skills/{name}/preview", 200, &passed);
    assert_eq!(passed["status"], "passed", "{passed}");
    assert_eq!(passed["score"], 1.0);
    assert_eq!(
        passed["output"], "ok",
        "the pasted output, not the recorded one"
    );
    let (_, failed) = preview(json!({"test_case_id": "case-001", "output": "<b>nope</b>"})).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["details"]["expected"], "ok");
    for (body, field) in [
        (
            json!({"test_case_id": "case-999", "output": "ok"}),
            "/test_case_id",
        ),
        (
            json!({"test_case_id": "case-001", "output": "ok", "version": "7"}),
            "/version",
        ),
    ] {
        let (status, e) = preview(body).await;
        assert_eq!(status, 422, "{e}");
        assert_eq!(e["error"]["details"]["field"], field, "{e}");
    }
    let r = app
        .post_json(
            "/v1/skills/nope/preview",
            &json!({"test_case_id": "a", "output": ""}),
        )
        .await;
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(app.count("runs").await, 0, "a preview creates no run");
    app.cleanup().await;
}
