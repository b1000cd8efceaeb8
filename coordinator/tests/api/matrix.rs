//! The model matrix (issue 33's must-show): three skills × two provider settings, each served
//! by a model server this test starts on loopback; one of them answers one skill's prompts
//! wrongly. A real in-process worker runs every job. The matrix must flag exactly that skill ×
//! model cell as significantly worse; a dry run estimates and creates nothing; an estimate
//! over the budget is refused naming the field; another publisher cannot read the matrix.
//!
//! Creation is all or nothing on the quotas and resumable: a matrix whose cells do not all
//! fit the concurrent-runs quota is refused whole; a replay with the same idempotency key
//! answers the same matrix and creates no run; a matrix whose creation stopped half-way is
//! completed by a replay without running any cell twice.

use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::Method;
use serde_json::{json, Value};
use skilleval_providers::{ProviderConfig, Providers};

use crate::e2e::start_worker_with_providers;
use crate::helpers::{
    local_provider, serve_local, spawn_app_configured, spawn_app_with, AppOptions, TestApp,
};
use crate::packages::{skill_md, zip_of};

const ROOT: &str = "root-token-for-matrix-tests";
const WRITER: &[&str] = &["skills:write", "runs:write", "read"];
/// Cases per skill: enough that eight flipped verdicts are significant (McNemar's exact test,
/// p = 2 / 2^8 ≈ 0.008 < 0.05).
const CASES: usize = 8;

/// The model's answer: the word the prompt asks for, except that a model told to fail on
/// `sabotaged` answers every prompt that mentions it with something else.
fn answer(body: &Value, sabotaged: Option<&str>) -> Value {
    let prompt: String = skilleval_execution::fixtures::chat_user_text(body);
    let word = prompt
        .rsplit("Reply with exactly: ")
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    let content = match sabotaged {
        Some(s) if prompt.contains(s) => "something else entirely".to_string(),
        _ => word,
    };
    json!({
        "id": "chatcmpl-matrix",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 60, "completion_tokens": 4}
    })
}

async fn chat(
    State(sabotaged): State<Option<&'static str>>,
    Json(body): Json<Value>,
) -> Json<Value> {
    Json(answer(&body, sabotaged))
}

async fn model_server(
    sabotaged: Option<&'static str>,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    serve_local(
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(sabotaged),
    )
    .await
}

/// A skill whose cases the `llm` runner produces: each asks for a word and expects it back.
fn model_skill(name: &str) -> Vec<u8> {
    let cases: Vec<Value> = (0..CASES)
        .map(|i| {
            let word = format!("{name}-{i}");
            json!({
                "id": format!("case-{i}"), "name": format!("case {i}"),
                "input": {"prompt": format!("For the {name} skill. Reply with exactly: {word}")},
                "expected": {"output": word},
                "evaluation": {"strategy": "exact_match"}
            })
        })
        .collect();
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": "llm"},
        "testCases": cases
    });
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
    ])
}

fn priced(config: ProviderConfig) -> ProviderConfig {
    ProviderConfig {
        price_input_per_mtok: 1.0,
        price_output_per_mtok: 2.0,
        ..config
    }
}

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut request = app
        .client
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn token(app: &TestApp, publisher: &str) -> String {
    let body = json!({ "publisher": publisher, "scopes": WRITER });
    let (status, answer) = send(app, Method::POST, "/v1/admin/tokens", ROOT, Some(&body)).await;
    assert_eq!(status, 201, "{answer}");
    answer["token"].as_str().unwrap().to_string()
}

/// Uploads [`model_skill`] `name` as `token`'s and waits for its upload run to pass (the
/// reference run a matrix cell is compared with); the upload's answer.
async fn upload_passing(app: &TestApp, token: &str, name: &str) -> Value {
    let upload = app.upload_zip_as(model_skill(name), token).await;
    let run_id = upload["run_id"]
        .as_str()
        .expect("an upload run")
        .to_string();
    let run = wait_for_verdict(app, token, &run_id).await;
    assert_eq!(run["verdict"], "pass", "{name}: {run}");
    upload
}

async fn wait_for_verdict(app: &TestApp, token: &str, run_id: &str) -> Value {
    for _ in 0..1_200 {
        let (_, run) = send(app, Method::GET, &format!("/v1/runs/{run_id}"), token, None).await;
        if run["verdict"].is_string() {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: run {run_id} has no verdict after 120 s");
}

/// Polls the matrix until every cell's run finished and was compared.
/// As if the matrix's creation had stopped before its last cell (position 1) was linked.
async fn cut_short(app: &TestApp, matrix: uuid::Uuid) {
    sqlx::query("DELETE FROM matrix_runs WHERE matrix_id = $1 AND position = 1")
        .bind(matrix)
        .execute(&app.pool)
        .await
        .unwrap();
    mark_creating(app, matrix).await;
}

/// As if the matrix's creation had not finished, and had started just now (so the
/// background sweep, which completes creations stalled for a minute, leaves it to the test).
async fn mark_creating(app: &TestApp, matrix: uuid::Uuid) {
    sqlx::query("UPDATE matrices SET status = 'creating', created_at = now() WHERE id = $1")
        .bind(matrix)
        .execute(&app.pool)
        .await
        .unwrap();
}

async fn wait_for_matrix(app: &TestApp, token: &str, id: &str) -> Value {
    let mut last = Value::Null;
    for _ in 0..1_800 {
        let (status, matrix) =
            send(app, Method::GET, &format!("/v1/matrix/{id}"), token, None).await;
        assert_eq!(status, 200, "{matrix}");
        let compared = matrix["cells"]
            .as_array()
            .is_some_and(|cells| cells.iter().all(|c| c["change"].is_string()));
        if matrix["status"] == "completed" && compared {
            return matrix;
        }
        last = matrix;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: matrix {id} not compared after 180 s: {last}");
}

#[tokio::test]
async fn the_matrix_flags_exactly_the_skill_and_model_made_worse() {
    let (steady_addr, steady_task) = model_server(None).await;
    let (shaky_addr, shaky_task) = model_server(Some("For the gamma skill")).await;
    let mut providers = Providers::default();
    providers.insert(
        priced(local_provider(steady_addr, "steady", "steady-model")),
        true,
    );
    providers.insert(
        priced(local_provider(shaky_addr, "shaky", "shaky-model")),
        false,
    );

    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        auth_tokens: vec![ROOT.to_string()],
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, cache.path()).await;
    let alice = token(&app, "alice").await;
    let bob = token(&app, "bob").await;

    // The reference runs: each skill uploaded, produced by the default provider, passing.
    for name in ["alpha", "beta", "gamma"] {
        upload_passing(&app, &alice, name).await;
    }
    let runs_before = app.count("runs").await;

    let body = json!({
        "skills": ["alpha", "beta", "gamma"],
        "models": ["steady", {"provider": "shaky"}],
        "versions": "latest"
    });

    // A dry run: the estimate, and nothing created.
    let (status, dry) = send(
        &app,
        Method::POST,
        "/v1/matrix?dry_run=true",
        &alice,
        Some(&body),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    let estimate = &dry["estimate"];
    assert_eq!(estimate["cells"].as_array().unwrap().len(), 6, "{dry}");
    let tokens = estimate["estimated_tokens"]
        .as_u64()
        .expect("tokens estimated");
    let cost = estimate["estimated_cost_usd"]
        .as_f64()
        .expect("cost estimated");
    // Each reference run spent 64 tokens on each of its 8 cases; six runs like it.
    assert_eq!(tokens, 6 * CASES as u64 * 64, "{dry}");
    assert!(cost > 0.0, "{dry}");
    assert_eq!(
        app.count("runs").await,
        runs_before,
        "a dry run creates no run"
    );
    assert_eq!(
        app.count("matrices").await,
        0,
        "a dry run creates no matrix"
    );
    let doc = crate::openapi::doc();
    crate::openapi::check(&doc, "post", "/v1/matrix", 200, &dry);

    // By publisher: every skill of alice's, the same six cells; bob may not name her.
    let by_publisher = json!({ "publisher": "alice", "models": ["steady", "shaky"] });
    let (status, dry_all) = send(
        &app,
        Method::POST,
        "/v1/matrix?dry_run=true",
        &alice,
        Some(&by_publisher),
    )
    .await;
    assert_eq!(status, 200, "{dry_all}");
    assert_eq!(dry_all["estimate"]["estimated_tokens"], json!(tokens));
    let (status, theirs) = send(
        &app,
        Method::POST,
        "/v1/matrix?dry_run=true",
        &bob,
        Some(&by_publisher),
    )
    .await;
    assert_eq!(
        (status, &theirs["error"]["code"]),
        (404, &json!("not_found")),
        "{theirs}"
    );

    // Over budget: refused before anything is created, naming the field and the estimate.
    let mut over = body.clone();
    over["budget"] = json!({ "max_cost_usd": cost / 2.0 });
    let (status, refused) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&over)).await;
    assert_eq!(status, 422, "{refused}");
    assert_eq!(refused["error"]["code"], "over_budget", "{refused}");
    crate::openapi::check(&doc, "post", "/v1/matrix", 422, &refused);
    assert_eq!(refused["error"]["details"]["field"], "/budget/max_cost_usd");
    assert_eq!(
        refused["error"]["details"]["estimate"]["estimated_tokens"],
        json!(tokens)
    );
    assert_eq!(app.count("runs").await, runs_before);
    assert_eq!(app.count("matrices").await, 0);

    // Another publisher cannot run a matrix over alice's skills: they are not found.
    let (status, theirs) = send(&app, Method::POST, "/v1/matrix", &bob, Some(&body)).await;
    assert_eq!(
        (status, &theirs["error"]["code"]),
        (404, &json!("not_found")),
        "{theirs}"
    );

    // Within budget: six ordinary runs tied to one matrix.
    let mut within = body.clone();
    within["budget"] = json!({ "max_cost_usd": cost * 10.0 });
    let (status, created) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&within)).await;
    assert_eq!(status, 202, "{created}");
    assert_eq!(created["cells"], 6);
    crate::openapi::check(&doc, "post", "/v1/matrix", 202, &created);
    let id = created["matrix_id"].as_str().unwrap().to_string();
    assert_eq!(app.count("runs").await, runs_before + 6);

    let matrix = wait_for_matrix(&app, &alice, &id).await;
    crate::openapi::check(&doc, "get", "/v1/matrix/{id}", 200, &matrix);
    let cells = matrix["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 6);
    for cell in cells {
        let (skill, model) = (
            cell["skill"].as_str().unwrap(),
            cell["model"].as_str().unwrap(),
        );
        let made_worse = skill == "gamma" && model == "shaky";
        assert_eq!(
            cell["change"],
            if made_worse { "worse" } else { "no_change" },
            "{skill} × {model}: {cell}"
        );
        assert_eq!(cell["status"], "completed", "{cell}");
        assert_eq!(cell["total"], CASES, "{cell}");
        let rate = cell["pass_rate"].as_f64().unwrap();
        let [low, high] = [
            cell["pass_rate_interval"][0].as_f64().unwrap(),
            cell["pass_rate_interval"][1].as_f64().unwrap(),
        ];
        assert!(low <= rate && rate <= high, "{cell}");
        if made_worse {
            assert_eq!(cell["verdict"], "fail");
            assert_eq!(rate, 0.0);
            assert_eq!(cell["comparison"]["counts"]["regressed"], CASES, "{cell}");
        } else {
            assert_eq!(cell["verdict"], "pass");
            assert_eq!(rate, 1.0);
        }
    }
    assert_eq!(
        matrix["flagged"],
        json!([{"skill": "gamma", "model": "shaky", "change": "worse"}])
    );
    // The runs produced with the provider each cell names, each bounded by its share of the
    // matrix's budget.
    for cell in cells {
        let (_, run) = send(
            &app,
            Method::GET,
            &format!("/v1/runs/{}", cell["run_id"].as_str().unwrap()),
            &alice,
            None,
        )
        .await;
        let share = run["budget"]["max_cost_usd"].as_f64().unwrap();
        assert!((share - cost * 10.0 / 6.0).abs() < 1e-9, "{run}");
        let (_, page) = send(
            &app,
            Method::GET,
            &format!(
                "/v1/runs/{}/results?limit=1",
                cell["run_id"].as_str().unwrap()
            ),
            &alice,
            None,
        )
        .await;
        assert_eq!(
            page["results"][0]["details"]["runner"]["provider"], cell["model"],
            "{page}"
        );
    }

    // The page: a table coloured by change, the one worse cell marked as such.
    let page_as = |token: &str| {
        app.client
            .get(format!("{}/ui/matrix/{id}", app.address))
            .bearer_auth(token)
            .send()
    };
    let page = page_as(&alice).await.unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert_eq!(html.matches("data-change=\"worse\"").count(), 1, "{html}");
    assert_eq!(
        html.matches("data-change=\"no_change\"").count(),
        5,
        "{html}"
    );
    assert!(
        html.contains("data-skill=\"gamma\" data-model=\"shaky\" data-change=\"worse\""),
        "{html}"
    );
    assert_eq!(page_as(&bob).await.unwrap().status(), 404);

    // The CLI: `skilleval matrix --server URL --token T --skill … --model …` creates a matrix
    // like this one, waits for it and exits 1 because a cell got significantly worse.
    let cli_args = skilleval_cli::matrix::MatrixArgs {
        server: app.address.clone(),
        token: Some(alice.clone()),
        skills: vec!["alpha".into(), "beta".into(), "gamma".into()],
        publisher: None,
        models: vec!["steady".into(), "shaky".into()],
        max_cost: Some(cost * 10.0),
        max_tokens: None,
        dry_run: false,
        idempotency_key: Some("cli-nightly".into()),
        no_wait: false,
        timeout: 300,
        json: false,
    };
    assert_eq!(
        skilleval_cli::matrix::matrix(&cli_args).await,
        skilleval_cli::EXIT_FAIL
    );
    assert_eq!(app.count("matrices").await, 2);
    // The same command again with its `--idempotency-key`: the same matrix, no new run.
    let runs_after_cli = app.count("runs").await;
    let again = skilleval_cli::matrix::MatrixArgs {
        no_wait: true,
        ..cli_args.clone()
    };
    assert_eq!(
        skilleval_cli::matrix::matrix(&again).await,
        skilleval_cli::EXIT_PASS
    );
    assert_eq!(app.count("matrices").await, 2);
    assert_eq!(app.count("runs").await, runs_after_cli);

    // Another publisher's token: the matrix and its page are not found, like a missing one.
    let (status, hidden) = send(&app, Method::GET, &format!("/v1/matrix/{id}"), &bob, None).await;
    let missing = uuid::Uuid::now_v7();
    let (missing_status, nowhere) = send(
        &app,
        Method::GET,
        &format!("/v1/matrix/{missing}"),
        &bob,
        None,
    )
    .await;
    assert_eq!(status, 404, "{hidden}");
    crate::openapi::check(&doc, "get", "/v1/matrix/{id}", 404, &hidden);
    assert_eq!(
        (status, &hidden["error"]["code"]),
        (missing_status, &nowhere["error"]["code"])
    );

    stop.cancel();
    let _ = worker.await;
    steady_task.abort();
    shaky_task.abort();
    app.cleanup().await;
}

/// The cells of a matrix as `(position order) run ids`.
fn cell_runs(matrix: &Value) -> Vec<String> {
    matrix["cells"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["run_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn matrix_creation_is_all_or_nothing_on_quotas_idempotent_and_resumable() {
    let (addr, server) = model_server(None).await;
    let mut providers = Providers::default();
    providers.insert(priced(local_provider(addr, "steady", "steady-model")), true);
    providers.insert(priced(local_provider(addr, "other", "other-model")), false);
    let app = spawn_app_configured(
        AppOptions {
            background: true,
            sweep_interval_secs: 1,
            auth_tokens: vec![ROOT.to_string()],
            ..AppOptions::default()
        },
        |s| {
            s.coordinator.quotas.publisher.concurrent_runs = Some(3);
        },
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, cache.path()).await;
    let alice = token(&app, "alice").await;
    let mut versions = Vec::new();
    for name in ["alpha", "beta"] {
        let upload = upload_passing(&app, &alice, name).await;
        versions.push(upload["version_id"].as_str().unwrap().to_string());
    }
    let runs_before = app.count("runs").await;
    let doc = crate::openapi::doc();

    // Four cells, three concurrent runs allowed: refused whole, naming the quota; no matrix,
    // no run (the loop used to create three cells before the fourth was refused).
    let too_many = json!({ "skills": ["alpha", "beta"], "models": ["steady", "other"] });
    let (status, refused) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&too_many)).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused}");
    assert_eq!(
        refused["error"]["details"]["limit"], "coordinator.quotas.publisher.concurrent_runs",
        "{refused}"
    );
    assert_eq!(app.count("matrices").await, 0);
    assert_eq!(app.count("matrix_runs").await, 0);
    assert_eq!(app.count("runs").await, runs_before);

    // Two cells with a key: created once.
    let body = json!({
        "skills": ["alpha"],
        "models": ["steady", "other"],
        "idempotency_key": "nightly-2026-11-30"
    });
    let (status, created) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&body)).await;
    assert_eq!(status, 202, "{created}");
    assert_eq!(created["created"], true, "{created}");
    assert_eq!(created["cells"], 2, "{created}");
    crate::openapi::check(&doc, "post", "/v1/matrix", 202, &created);
    let id = created["matrix_id"].as_str().unwrap().to_string();
    assert_eq!(app.count("runs").await, runs_before + 2);

    // The replay: the same matrix, no new run, no second matrix.
    let (status, replay) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&body)).await;
    assert_eq!(status, 202, "{replay}");
    assert_eq!(replay["matrix_id"], created["matrix_id"], "{replay}");
    assert_eq!(replay["created"], false, "{replay}");
    assert_eq!(replay["cells"], 2, "{replay}");
    crate::openapi::check(&doc, "post", "/v1/matrix", 202, &replay);
    assert_eq!(app.count("runs").await, runs_before + 2);
    assert_eq!(app.count("matrices").await, 1);

    let matrix = wait_for_matrix(&app, &alice, &id).await;
    let runs = cell_runs(&matrix);
    assert_eq!(runs.len(), 2, "{matrix}");
    let matrix_uuid = uuid::Uuid::parse_str(&id).unwrap();

    // Stopped after the last cell's run was created but before it was linked: the matrix says
    // it is still being created, and a replay links the run that exists instead of a new one.
    cut_short(&app, matrix_uuid).await;
    let (status, partial) =
        send(&app, Method::GET, &format!("/v1/matrix/{id}"), &alice, None).await;
    assert_eq!(status, 200, "{partial}");
    assert_eq!(partial["status"], "creating", "{partial}");
    assert_eq!(partial["cells_planned"], 2, "{partial}");
    assert_eq!(partial["cells"].as_array().unwrap().len(), 1, "{partial}");
    crate::openapi::check(&doc, "get", "/v1/matrix/{id}", 200, &partial);
    let (status, replay) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&body)).await;
    assert_eq!(
        (status, &replay["created"]),
        (202, &json!(false)),
        "{replay}"
    );
    assert_eq!(replay["matrix_id"], created["matrix_id"], "{replay}");
    assert_eq!(app.count("runs").await, runs_before + 2);
    let matrix = wait_for_matrix(&app, &alice, &id).await;
    assert_eq!(cell_runs(&matrix), runs, "the same runs, linked again");

    // Stopped before the last cell's run was created: a replay creates exactly that run.
    sqlx::query("DELETE FROM runs WHERE id = $1")
        .bind(uuid::Uuid::parse_str(&runs[1]).unwrap())
        .execute(&app.pool)
        .await
        .unwrap();
    mark_creating(&app, matrix_uuid).await;
    assert_eq!(app.count("runs").await, runs_before + 1);
    let (status, replay) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&body)).await;
    assert_eq!(
        (status, &replay["created"]),
        (202, &json!(false)),
        "{replay}"
    );
    assert_eq!(replay["matrix_id"], created["matrix_id"], "{replay}");
    assert_eq!(app.count("runs").await, runs_before + 2);
    assert_eq!(app.count("matrices").await, 1);
    let matrix = wait_for_matrix(&app, &alice, &id).await;
    let completed = cell_runs(&matrix);
    assert_eq!(completed.len(), 2, "{matrix}");
    assert_eq!(completed[0], runs[0], "the cell that existed keeps its run");
    assert_ne!(
        completed[1], runs[1],
        "the missing cell got a run of its own"
    );
    assert_eq!(matrix["cells"][1]["model"], "other", "{matrix}");

    // Stopped before the last cell was linked, and nobody replays it (a matrix without a key
    // could not be): the periodic sweep completes it once it has been `creating` a while,
    // linking the run its key finds, and leaves a creation still in flight alone.
    cut_short(&app, matrix_uuid).await;
    let sweep = |after| skilleval_coordinator::routes::matrix::complete_stalled(&app.state, after);
    assert_eq!(
        sweep(Duration::from_secs(3600)).await.unwrap(),
        0,
        "a matrix accepted within the hour is not stalled"
    );
    assert_eq!(sweep(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(
        app.count("runs").await,
        runs_before + 2,
        "no run made twice"
    );
    let matrix = wait_for_matrix(&app, &alice, &id).await;
    assert_eq!(cell_runs(&matrix), completed, "the same runs, linked again");
    assert_eq!(sweep(Duration::ZERO).await.unwrap(), 0, "once");

    // A cell's run key held by a run of another version (made through `POST /v1/runs` with
    // that key) is never linked: completing the matrix is refused, naming the key.
    cut_short(&app, matrix_uuid).await;
    sqlx::query("DELETE FROM runs WHERE id = $1")
        .bind(uuid::Uuid::parse_str(&completed[1]).unwrap())
        .execute(&app.pool)
        .await
        .unwrap();
    let squatter =
        json!({ "version_id": versions[1], "idempotency_key": format!("matrix:{id}:1") });
    let (status, run) = send(&app, Method::POST, "/v1/runs", &alice, Some(&squatter)).await;
    assert_eq!(status, 202, "{run}");
    let (status, refused) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&body)).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(
        refused["error"]["code"], "idempotency_conflict",
        "{refused}"
    );
    assert_eq!(
        refused["error"]["details"]["field"], "idempotency_key",
        "{refused}"
    );
    let linked: i64 = sqlx::query_scalar("SELECT count(*) FROM matrix_runs WHERE matrix_id = $1")
        .bind(matrix_uuid)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(linked, 1, "the other version's run is not linked");

    // An idempotency key breaks the runs' rule: refused naming the field.
    let mut bad = body.clone();
    bad["idempotency_key"] = json!("");
    let (status, refused) = send(&app, Method::POST, "/v1/matrix", &alice, Some(&bad)).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(
        refused["error"]["details"]["field"], "/idempotency_key",
        "{refused}"
    );

    stop.cancel();
    let _ = worker.await;
    server.abort();
    app.cleanup().await;
}
