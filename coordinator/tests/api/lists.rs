//! `GET /v1/skills` and `GET /v1/runs` (issue 30): search, filters, sorts and keyset pages
//! against the real PostgreSQL and RabbitMQ. Every paged walk is compared with the one-page
//! answer: a page boundary that falls among equal sort keys repeats no row and skips none.
//! Each publisher lists only its own skills and runs, and a cursor is refused by any other
//! query (another filter, sort, list or caller).

use std::collections::BTreeSet;

use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{spawn_app, spawn_app_configured, AppOptions, TestApp};
use crate::openapi::{check, doc};
use crate::packages::{given_tests, zip_of};
use crate::versions::finish_run;

/// A `given` package: `name`, its description, its profile, one case per output (each
/// expects `ok`; a run passes at a pass rate of 0.5), the first case naming `model`.
fn listed_package(
    name: &str,
    description: &str,
    profile: &str,
    outputs: &[&str],
    model: Option<&str>,
) -> Vec<u8> {
    let mut tests = given_tests(outputs, json!({ "passThreshold": 0.5 }));
    tests["profile"] = json!(profile);
    if let Some(m) = model {
        tests["testCases"][0]["metadata"] = json!({ "model": m });
    }
    let skill = format!("---\nname: {name}\ndescription: {description}\n---\n\nAnswer briefly.\n");
    zip_of(&[
        ("SKILL.md", skill.as_bytes()),
        ("eval/tests.json", &serde_json::to_vec(&tests).unwrap()),
    ])
}

/// Uploads (with `query`) and, unless `failing` is `None`, records the cases and finalises the
/// run; returns the upload's answer.
async fn upload(app: &TestApp, zip: Vec<u8>, query: &str, failing: Option<&[usize]>) -> Value {
    let response = app.upload_zip(zip, query).await;
    assert_eq!(response.status().as_u16(), 201);
    let body: Value = response.json().await.unwrap();
    if let Some(failing) = failing {
        let run: Uuid = body["run_id"].as_str().unwrap().parse().unwrap();
        let cases = body["test_cases"].as_u64().unwrap() as usize;
        finish_run(app, run, cases, failing).await;
    }
    body
}

/// A list's answer, checked against the OpenAPI document.
async fn list(app: &TestApp, route: &str, query: &str) -> Value {
    let (status, body) = app.get_json(&format!("{route}?{query}")).await;
    assert_eq!(status, 200, "{route}?{query}: {body}");
    check(&doc(), "get", route, 200, &body);
    body
}

/// Every item of `query` walked page by page (`limit` each), and the pages' count.
async fn walk(
    app: &TestApp,
    route: &str,
    items: &str,
    query: &str,
    limit: u32,
) -> (Vec<Value>, usize) {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut q = format!("{query}&limit={limit}");
        if let Some(c) = &cursor {
            q.push_str(&format!("&cursor={c}"));
        }
        let page = list(app, route, &q).await;
        pages += 1;
        let got = page[items].as_array().unwrap();
        assert!(got.len() <= limit as usize);
        all.extend(got.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
        assert!(pages < 100, "hang guard: the pages do not end");
    }
    (all, pages)
}

fn field<'a>(items: &'a [Value], key: &str) -> Vec<&'a str> {
    items.iter().map(|i| i[key].as_str().unwrap()).collect()
}

/// The paged walk returns exactly the one-page answer, in its order, each row once.
async fn assert_pages_match(
    app: &TestApp,
    route: &str,
    items: &str,
    id: &str,
    query: &str,
    limit: u32,
) -> Vec<Value> {
    let whole = list(app, route, &format!("{query}&limit=100")).await;
    let whole = whole[items].as_array().unwrap().clone();
    let (paged, pages) = walk(app, route, items, query, limit).await;
    assert_eq!(
        field(&paged, id),
        field(&whole, id),
        "{route}?{query} paged by {limit}"
    );
    let unique: BTreeSet<&str> = field(&paged, id).into_iter().collect();
    assert_eq!(unique.len(), paged.len(), "a row came twice");
    assert_eq!(pages, whole.len().div_ceil(limit as usize).max(1));
    whole
}

async fn error(app: &TestApp, path: &str) -> Value {
    let (status, body) = app.get_json(path).await;
    assert_eq!(status, 400, "{path}: {body}");
    check(&doc(), "get", path.split('?').next().unwrap(), 400, &body);
    body["error"].clone()
}

/// `(key, id)` of each item must be in order (`desc`: non-increasing) with the id breaking
/// ties in the same direction.
fn assert_sorted(items: &[Value], key: impl Fn(&Value) -> f64, id: &str, desc: bool) {
    for pair in items.windows(2) {
        let (a, b) = (key(&pair[0]), key(&pair[1]));
        let (ia, ib) = (pair[0][id].as_str().unwrap(), pair[1][id].as_str().unwrap());
        let ordered = if desc {
            a > b || (a == b && ia > ib)
        } else {
            a < b || (a == b && ia < ib)
        };
        assert!(ordered, "{} before {}", pair[0], pair[1]);
    }
}

#[tokio::test]
async fn the_skills_list_searches_filters_sorts_and_pages() {
    let app = spawn_app().await;
    let ok2 = ["ok", "ok"];
    let alpha = upload(
        &app,
        listed_package("alpha-one", "Formats dates.", "deterministic", &ok2, None),
        "",
        Some(&[]),
    )
    .await;
    upload(
        &app,
        listed_package(
            "alpha-two",
            "Parses invoices.",
            "structured",
            &ok2,
            Some("m-big"),
        ),
        "",
        Some(&[]),
    )
    .await;
    upload(
        &app,
        listed_package("beta-one", "Formats money.", "deterministic", &ok2, None),
        "",
        Some(&[1]),
    )
    .await;
    upload(
        &app,
        listed_package("beta-two", "Writes poems.", "creative", &ok2, None),
        "",
        Some(&[0, 1]),
    )
    .await;
    upload(
        &app,
        listed_package("gamma", "Counts 100% of words.", "flexible", &ok2, None),
        "?run=false",
        None,
    )
    .await;
    // Four more at pass rate 1: five skills share the top sort key.
    for i in 0..4 {
        upload(
            &app,
            listed_package(
                &format!("delta-{i}"),
                "Says ok.",
                "deterministic",
                &ok2,
                None,
            ),
            "",
            Some(&[]),
        )
        .await;
    }
    // A second version of alpha-one: its latest version is what the list shows.
    let alpha2 = upload(
        &app,
        listed_package(
            "alpha-one",
            "Formats dates and times.",
            "deterministic",
            &["ok", "no"],
            None,
        ),
        "",
        Some(&[1]),
    )
    .await;

    let all = list(&app, "/v1/skills", "").await;
    let names = field(all["skills"].as_array().unwrap(), "name");
    assert_eq!(
        names,
        [
            "alpha-one",
            "alpha-two",
            "beta-one",
            "beta-two",
            "delta-0",
            "delta-1",
            "delta-2",
            "delta-3",
            "gamma"
        ],
        "by name, ascending, by default"
    );
    let a = &all["skills"][0];
    assert_eq!(a["versions"], 2);
    assert_eq!(a["description"], "Formats dates and times.");
    assert_eq!(a["latest_version"]["version_id"], alpha2["version_id"]);
    assert_eq!(a["latest_version"]["profile"], "deterministic");
    assert_eq!(a["latest_run_id"], alpha2["run_id"]);
    assert_ne!(a["latest_run_id"], alpha["run_id"]);
    assert_eq!(
        (a["verdict"].as_str(), a["pass_rate"].as_f64()),
        (Some("pass"), Some(0.5))
    );
    let gamma = &all["skills"][8];
    assert_eq!(
        (gamma["verdict"].clone(), gamma["pass_rate"].clone()),
        (Value::Null, Value::Null)
    );

    // Search: name or description, case-insensitive, `%` taken literally.
    let names_of = |v: &Value| -> Vec<String> {
        v["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "search=FORMATS").await),
        ["alpha-one", "beta-one"]
    );
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "search=alpha").await),
        ["alpha-one", "alpha-two"]
    );
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "search=100%25").await),
        ["gamma"]
    );
    assert!(names_of(&list(&app, "/v1/skills", "search=%25%25%25").await).is_empty());
    // Filters.
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "profile=structured").await),
        ["alpha-two"]
    );
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "verdict=fail").await),
        ["beta-two"]
    );
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "verdict=none").await),
        ["gamma"]
    );
    assert_eq!(
        names_of(&list(&app, "/v1/skills", "model=m-big").await),
        ["alpha-two"]
    );
    assert_eq!(
        names_of(
            &list(
                &app,
                "/v1/skills",
                "verdict=pass&profile=deterministic&search=delta-3"
            )
            .await
        ),
        ["delta-3"]
    );
    assert_eq!(
        list(&app, "/v1/skills", "model=m-big").await["skills"][0]["models"],
        json!(["m-big"])
    );

    // Sorts, paged across equal keys.
    let by_rate = assert_pages_match(
        &app,
        "/v1/skills",
        "skills",
        "skill_id",
        "sort=pass_rate",
        2,
    )
    .await;
    assert_sorted(
        &by_rate,
        |s| s["pass_rate"].as_f64().unwrap_or(-1.0),
        "skill_id",
        true,
    );
    assert_eq!(
        by_rate
            .iter()
            .filter(|s| s["pass_rate"] == json!(1.0))
            .count(),
        5
    );
    assert_eq!(
        by_rate.last().unwrap()["name"],
        "gamma",
        "no pass rate sorts last"
    );
    let up = assert_pages_match(
        &app,
        "/v1/skills",
        "skills",
        "skill_id",
        "sort=pass_rate&order=asc",
        4,
    )
    .await;
    assert_sorted(
        &up,
        |s| s["pass_rate"].as_f64().unwrap_or(-1.0),
        "skill_id",
        false,
    );
    let desc = assert_pages_match(
        &app,
        "/v1/skills",
        "skills",
        "name",
        "sort=name&order=desc",
        2,
    )
    .await;
    let mut reversed = names.clone();
    reversed.reverse();
    assert_eq!(field(&desc, "name"), reversed);
    let micros = |key: &'static str| {
        move |s: &Value| {
            chrono::DateTime::parse_from_rfc3339(s[key].as_str().unwrap())
                .unwrap()
                .timestamp_micros() as f64
        }
    };
    let created =
        assert_pages_match(&app, "/v1/skills", "skills", "skill_id", "sort=created", 3).await;
    assert_sorted(&created, micros("created_at"), "skill_id", true);
    let updated =
        assert_pages_match(&app, "/v1/skills", "skills", "skill_id", "sort=updated", 3).await;
    assert_sorted(&updated, micros("updated_at"), "skill_id", true);
    assert_eq!(
        updated[0]["name"], "alpha-one",
        "its second version is the latest upload"
    );

    // Refusals name the parameter and the values it accepts.
    let e = error(&app, "/v1/skills?colour=red").await;
    assert_eq!(e["details"]["field"], "colour");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("accepted: search, profile, verdict, model, sort, order, limit, cursor"),
        "{e}"
    );
    let e = error(&app, "/v1/skills?sort=size").await;
    assert_eq!(e["details"]["field"], "sort");
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("name, created, updated, pass_rate"),
        "{e}"
    );
    let e = error(&app, "/v1/skills?verdict=maybe").await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("pass, fail, none"),
        "{e}"
    );
    let e = error(&app, "/v1/skills?profile=weird").await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("deterministic, structured, flexible, creative, enterprise"),
        "{e}"
    );
    assert_eq!(
        error(&app, "/v1/skills?order=up").await["details"]["field"],
        "order"
    );
    assert_eq!(
        error(&app, "/v1/skills?limit=0").await["details"]["field"],
        "limit"
    );
    let e = error(&app, "/v1/skills?cursor=zz").await;
    assert_eq!(e["details"]["field"], "cursor");
    assert!(
        e["details"]["rule"].as_str().unwrap().contains("malformed"),
        "{e}"
    );
    // A cursor belongs to its query: another sort, filter or list refuses it.
    let first = list(&app, "/v1/skills", "sort=name&limit=2").await;
    let cursor = first["next_cursor"].as_str().unwrap();
    list(
        &app,
        "/v1/skills",
        &format!("sort=name&limit=5&cursor={cursor}"),
    )
    .await;
    for other in [
        format!("/v1/skills?sort=pass_rate&cursor={cursor}"),
        format!("/v1/skills?sort=name&search=a&cursor={cursor}"),
        format!("/v1/skills?sort=name&order=desc&cursor={cursor}"),
    ] {
        let e = error(&app, &other).await;
        assert_eq!(e["details"]["field"], "cursor", "{other}");
        assert!(
            e["details"]["rule"]
                .as_str()
                .unwrap()
                .contains("another query"),
            "{e}"
        );
    }
    let e = error(&app, &format!("/v1/runs?cursor={cursor}")).await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("another query"),
        "{e}"
    );
    app.cleanup().await;
}

#[tokio::test]
async fn the_runs_list_filters_sorts_and_pages() {
    let app = spawn_app().await;
    let ok2 = ["ok", "ok"];
    let a1 = upload(
        &app,
        listed_package("runs-a", "First.", "deterministic", &ok2, None),
        "",
        Some(&[]),
    )
    .await;
    let a2 = upload(
        &app,
        listed_package("runs-a", "Second.", "deterministic", &ok2, None),
        "",
        Some(&[1]),
    )
    .await;
    let b1 = upload(
        &app,
        listed_package("runs-b", "First.", "deterministic", &ok2, None),
        "",
        Some(&[0, 1]),
    )
    .await;
    let b2 = upload(
        &app,
        listed_package("runs-b", "Second.", "deterministic", &ok2, None),
        "",
        None,
    )
    .await;
    let running: Uuid = b2["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(running).await;
    // Four manual runs of runs-a's first version, every case passing: five runs at score 1.
    let mut manual = Vec::new();
    for _ in 0..4 {
        let r = app
            .post_json("/v1/runs", &json!({ "version_id": a1["version_id"] }))
            .await;
        assert_eq!(r.status().as_u16(), 202);
        let run: Uuid = r.json::<Value>().await.unwrap()["run_id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        finish_run(&app, run, 2, &[]).await;
        manual.push(run);
    }
    // Equal creation times: the first four runs were created at the same instant.
    let early = "2026-01-01T00:00:00Z";
    let ids: Vec<Uuid> = [&a1, &a2, &b1, &b2]
        .iter()
        .map(|u| u["run_id"].as_str().unwrap().parse().unwrap())
        .collect();
    sqlx::query("UPDATE runs SET created_at = $1::timestamptz WHERE id = ANY($2)")
        .bind(early)
        .bind(&ids)
        .execute(&app.pool)
        .await
        .unwrap();

    let all = list(&app, "/v1/runs", "").await;
    let runs = all["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    let top: Vec<String> = manual.iter().rev().map(Uuid::to_string).collect();
    assert_eq!(field(&runs[..4], "run_id"), top, "newest first by default");
    let b1_item = runs.iter().find(|r| r["run_id"] == b1["run_id"]).unwrap();
    assert_eq!(b1_item["skill"], "runs-b");
    assert_eq!(b1_item["version"], "1");
    assert_eq!(b1_item["kind"], "upload");
    assert_eq!(b1_item["status"], "completed");
    assert_eq!(b1_item["verdict"], "fail");
    assert_eq!(b1_item["score"], 0.0);
    assert_eq!(b1_item["counters"]["failed"], 2);
    let running_item = runs.iter().find(|r| r["run_id"] == b2["run_id"]).unwrap();
    assert_eq!(
        (
            running_item["verdict"].clone(),
            running_item["score"].clone()
        ),
        (Value::Null, Value::Null)
    );

    let ids_of = |v: &Value| -> BTreeSet<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let set = |runs: &[&Value]| -> BTreeSet<String> {
        runs.iter()
            .map(|u| u["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let manual_ids: BTreeSet<String> = manual.iter().map(Uuid::to_string).collect();
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "skill=runs-b").await),
        set(&[&b1, &b2])
    );
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "skill=runs-a&version=2").await),
        set(&[&a2])
    );
    let v1 = list(
        &app,
        "/v1/runs",
        &format!("version={}", a1["version_id"].as_str().unwrap()),
    )
    .await;
    let mut want = manual_ids.clone();
    want.insert(a1["run_id"].as_str().unwrap().to_string());
    assert_eq!(ids_of(&v1), want);
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "status=running").await),
        set(&[&b2])
    );
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "kind=manual").await),
        manual_ids
    );
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "verdict=fail").await),
        set(&[&b1])
    );
    assert_eq!(
        ids_of(&list(&app, "/v1/runs", "verdict=pass&skill=runs-a&kind=upload").await),
        set(&[&a1, &a2])
    );
    assert_eq!(
        ids_of(
            &list(
                &app,
                "/v1/runs",
                "created_after=2025-12-31T00:00:00Z&created_before=2026-01-01T00:00:00.000001Z"
            )
            .await
        ),
        set(&[&a1, &a2, &b1, &b2])
    );
    assert_eq!(
        ids_of(
            &list(
                &app,
                "/v1/runs",
                "created_after=2026-01-02T00:00:00%2B00:00"
            )
            .await
        ),
        manual_ids
    );
    assert!(
        ids_of(&list(&app, "/v1/runs", "created_before=2025-01-01T00:00:00Z").await).is_empty()
    );

    // Sorts, paged across equal keys (four runs created at one instant, five at score 1).
    let micros = |r: &Value| {
        chrono::DateTime::parse_from_rfc3339(r["created_at"].as_str().unwrap())
            .unwrap()
            .timestamp_micros() as f64
    };
    for limit in [1, 3] {
        let newest =
            assert_pages_match(&app, "/v1/runs", "runs", "run_id", "sort=created", limit).await;
        assert_sorted(&newest, micros, "run_id", true);
        let oldest = assert_pages_match(
            &app,
            "/v1/runs",
            "runs",
            "run_id",
            "sort=created&order=asc",
            limit,
        )
        .await;
        assert_sorted(&oldest, micros, "run_id", false);
        let best =
            assert_pages_match(&app, "/v1/runs", "runs", "run_id", "sort=score", limit).await;
        assert_sorted(
            &best,
            |r| r["score"].as_f64().unwrap_or(-1.0),
            "run_id",
            true,
        );
        assert_eq!(best.iter().filter(|r| r["score"] == json!(1.0)).count(), 5);
        assert_eq!(
            best.last().unwrap()["run_id"],
            b2["run_id"],
            "an unfinished run sorts last"
        );
        let worst = assert_pages_match(
            &app,
            "/v1/runs",
            "runs",
            "run_id",
            "sort=score&order=asc&skill=runs-a",
            limit,
        )
        .await;
        assert_sorted(
            &worst,
            |r| r["score"].as_f64().unwrap_or(-1.0),
            "run_id",
            false,
        );
        assert_eq!(worst[0]["run_id"], a2["run_id"]);
    }

    // Refusals.
    let e = error(&app, "/v1/runs?version=2").await;
    assert_eq!(e["details"]["field"], "version");
    let e = error(&app, "/v1/runs?status=done").await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("creating, running, completed, cancelled, failed"),
        "{e}"
    );
    let e = error(&app, "/v1/runs?kind=nightly").await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("upload, manual, rescore, samples"),
        "{e}"
    );
    assert_eq!(
        error(&app, "/v1/runs?sort=name").await["details"]["field"],
        "sort"
    );
    assert_eq!(
        error(&app, "/v1/runs?created_after=yesterday").await["details"]["field"],
        "created_after"
    );
    assert_eq!(
        error(
            &app,
            "/v1/runs?created_after=2026-01-02T00:00:00Z&created_before=2026-01-01T00:00:00Z"
        )
        .await["details"]["field"],
        "created_before"
    );
    let e = error(&app, "/v1/runs?skill=a&skill=b").await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("more than once"),
        "{e}"
    );
    let first = list(&app, "/v1/runs", "sort=score&limit=2").await;
    let cursor = first["next_cursor"].as_str().unwrap();
    let e = error(
        &app,
        &format!("/v1/runs?sort=score&skill=runs-a&cursor={cursor}"),
    )
    .await;
    assert!(
        e["details"]["rule"]
            .as_str()
            .unwrap()
            .contains("another query"),
        "{e}"
    );
    app.cleanup().await;
}

/// The static token of the isolation test's coordinator: the implicit publisher, every scope.
const ROOT: &str = "root-token-for-lists";

async fn get_as(app: &TestApp, path: &str, token: &str) -> (u16, Value) {
    let r = app
        .client
        .get(format!("{}{path}", app.address))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn publisher_token(app: &TestApp, publisher: &str) -> String {
    let r = app
        .client
        .post(format!("{}/v1/admin/tokens", app.address))
        .bearer_auth(ROOT)
        .json(&json!({ "publisher": publisher, "scopes": ["skills:write", "runs:write", "read"] }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn each_publisher_lists_only_its_own_skills_and_runs() {
    let app = spawn_app_configured(AppOptions::default(), |s| {
        s.coordinator.auth_tokens = vec![skilleval_infra::config::Secret::new(ROOT)];
    })
    .await;
    let alice = publisher_token(&app, "alice").await;
    let bob = publisher_token(&app, "bob").await;
    let mut runs_of = std::collections::BTreeMap::<&str, BTreeSet<String>>::new();
    for (token, who, names) in [
        (&alice, "alice", vec!["alice-a", "alice-b"]),
        (&bob, "bob", vec!["bob-a"]),
    ] {
        for name in names {
            let body = app_upload_as(
                &app,
                listed_package(name, "Shared words.", "deterministic", &["ok"], None),
                token,
            )
            .await;
            let run: Uuid = body["run_id"].as_str().unwrap().parse().unwrap();
            finish_run(&app, run, 1, &[]).await;
            runs_of.entry(who).or_default().insert(run.to_string());
        }
    }
    let names = |v: &Value| -> Vec<String> {
        v["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    let runs = |v: &Value| -> BTreeSet<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, a) = get_as(&app, "/v1/skills?search=shared", &alice).await;
    assert_eq!(status, 200, "{a}");
    assert_eq!(names(&a), ["alice-a", "alice-b"]);
    let (_, b) = get_as(&app, "/v1/skills?search=shared", &bob).await;
    assert_eq!(names(&b), ["bob-a"]);
    let (_, b) = get_as(&app, "/v1/skills?search=alice", &bob).await;
    assert!(names(&b).is_empty(), "{b}");
    let (_, a) = get_as(&app, "/v1/runs", &alice).await;
    assert_eq!(runs(&a), runs_of["alice"]);
    let (_, b) = get_as(&app, "/v1/runs", &bob).await;
    assert_eq!(runs(&b), runs_of["bob"]);
    let (_, b) = get_as(&app, "/v1/runs?skill=alice-a", &bob).await;
    assert!(runs(&b).is_empty(), "{b}");
    // An admin token lists every publisher's.
    let (_, all) = get_as(&app, "/v1/skills?search=shared", ROOT).await;
    assert_eq!(names(&all), ["alice-a", "alice-b", "bob-a"]);
    // Alice's cursor is Alice's: Bob's same query refuses it.
    let (_, page) = get_as(&app, "/v1/skills?search=shared&limit=1", &alice).await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let (status, e) = get_as(
        &app,
        &format!("/v1/skills?search=shared&limit=1&cursor={cursor}"),
        &bob,
    )
    .await;
    assert_eq!(status, 400, "{e}");
    assert_eq!(e["error"]["details"]["field"], "cursor");
    let (status, next) = get_as(
        &app,
        &format!("/v1/skills?search=shared&limit=1&cursor={cursor}"),
        &alice,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(names(&next), ["alice-b"]);
    app.cleanup().await;
}

async fn app_upload_as(app: &TestApp, zip: Vec<u8>, token: &str) -> Value {
    let body = app.upload_zip_as(zip, token).await;
    assert!(body["run_id"].is_string(), "{body}");
    body
}

#[tokio::test]
async fn the_cli_lists_skills_and_runs_page_by_page_and_prints_the_servers_refusal() {
    use skilleval_cli::lists::{
        fetch, runs_params, runs_table, skills_table, RunsListArgs, ServerArgs,
    };
    let app = spawn_app().await;
    for name in ["cli-a", "cli-b", "cli-c"] {
        upload(
            &app,
            listed_package(name, "Listed.", "deterministic", &["ok"], None),
            "",
            Some(&[]),
        )
        .await;
    }
    let server = |limit: Option<u32>, all: bool| ServerArgs {
        server: app.address.clone(),
        token: None,
        limit,
        cursor: None,
        all,
        json: false,
    };
    let search = "cli-".to_string();
    let every = fetch(
        &server(Some(1), true),
        "/v1/skills",
        "skills",
        &[("search", Some(&search))],
    )
    .await
    .unwrap();
    assert_eq!(
        field(&every.items, "name"),
        ["cli-a", "cli-b", "cli-c"],
        "--all follows the cursors"
    );
    assert_eq!(every.next_cursor, None);
    let first = fetch(
        &server(Some(2), false),
        "/v1/skills",
        "skills",
        &[("search", Some(&search))],
    )
    .await
    .unwrap();
    assert_eq!(first.items.len(), 2);
    let mut more = server(Some(2), false);
    more.cursor = first.next_cursor.clone();
    let rest = fetch(&more, "/v1/skills", "skills", &[("search", Some(&search))])
        .await
        .unwrap();
    assert_eq!(
        field(&rest.items, "name"),
        ["cli-c"],
        "--cursor continues the listing"
    );
    let table = skills_table(&every.items);
    assert!(
        table.lines().nth(1).unwrap().starts_with("cli-a"),
        "{table}"
    );
    assert!(table.contains("100.0%"), "{table}");

    let args = RunsListArgs {
        server: server(None, false),
        skill: Some("cli-b".into()),
        version: None,
        status: Some("completed".into()),
        kind: None,
        verdict: None,
        created_after: None,
        created_before: None,
        sort: Some("score".into()),
        order: None,
    };
    let runs = fetch(&args.server, "/v1/runs", "runs", &runs_params(&args))
        .await
        .unwrap();
    assert_eq!(runs.items.len(), 1);
    assert!(runs_table(&runs.items).contains("cli-b@1"));
    let bad = RunsListArgs {
        status: Some("done".into()),
        ..args
    };
    let e = fetch(&bad.server, "/v1/runs", "runs", &runs_params(&bad))
        .await
        .unwrap_err();
    assert!(
        e.contains("400") && e.contains("`status`") && e.contains("completed"),
        "{e}"
    );
    app.cleanup().await;
}
