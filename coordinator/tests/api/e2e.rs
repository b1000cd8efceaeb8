//! End to end: upload -> a real worker (the worker library, in-process, on the same broker and
//! database) -> the run completes -> its verdict, summary and per-case scores equal a local
//! run of the same package through the domain crates (executor + summarize, as `skilleval run` does).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skilleval_analysis::summary::{summarize, RunSummary};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_execution::validate::validate;
use skilleval_infra::store::Store;
use skilleval_model::package::Package;
use skilleval_sandbox::Sandbox;
use tokio_util::sync::CancellationToken;

use crate::helpers::{spawn_app_with, AppOptions, TestApp};
use crate::packages::given_package;

/// Per case: (status, score).
pub(crate) type CaseScores = BTreeMap<String, (String, Option<f64>)>;

/// What a local run says: the summary and, per case, (status, score).
pub(crate) fn local_run(
    zip: &[u8],
    settings: &skilleval_infra::config::Settings,
) -> (RunSummary, CaseScores) {
    local_run_with(zip, settings, None)
}

/// A local run as `skilleval run` does it; with `clients`, the model-backed strategies and the
/// `llm` runner get them through the same executor builder as the CLI.
pub(crate) fn local_run_with(
    zip: &[u8],
    settings: &skilleval_infra::config::Settings,
    clients: Option<&Arc<skilleval_providers::ProviderClients>>,
) -> (RunSummary, CaseScores) {
    let package = Package::from_zip_bytes(zip, &settings.limits, None).expect("the package opens");
    let executor = ExecutorBuilder::new()
        .providers(clients.cloned())
        .sandbox(Sandbox::detect(settings.sandbox.clone()))
        .build();
    let validation = validate(&package, executor.strategies());
    assert!(validation.is_ok(), "{:?}", validation.problems);
    let jobs = plan(
        &package.config,
        &package.content_hash,
        uuid::Uuid::now_v7(),
        &CaseFilter::default(),
        None,
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let results: Vec<_> = runtime.block_on(async {
        let mut out = Vec::new();
        for job in &jobs {
            out.push(executor.execute(job, package.root()).await);
        }
        out
    });
    let summary = summarize(&results, &package.config.settings);
    let cases = results
        .iter()
        .map(|r| {
            (
                r.test_case_id.clone(),
                (r.status.as_str().to_string(), r.score),
            )
        })
        .collect();
    (summary, cases)
}

/// Starts an in-process worker next to the app; returns its shutdown token and task.
async fn start_worker(
    app: &TestApp,
    cache: &Path,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    start_worker_with(app.settings.clone(), cache).await
}

/// Starts an in-process worker with the app's settings and `providers` as its model providers.
pub(crate) async fn start_worker_with_providers(
    app: &TestApp,
    providers: skilleval_providers::Providers,
    cache: &Path,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let mut settings = app.settings.clone();
    settings.llm.providers = providers;
    start_worker_with(settings, cache).await
}

/// Starts an in-process worker with `settings` (the app's, adjusted by the caller).
pub(crate) async fn start_worker_with(
    settings: skilleval_infra::config::Settings,
    cache: &Path,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let mut settings = settings;
    settings.worker.package_cache_dir = cache.to_path_buf();
    settings.worker.http_port = 0;
    settings.worker.concurrency = 4;
    let store = Store::connect(&settings.database)
        .await
        .expect("worker store");
    let worker = Arc::new(skilleval_worker::Worker::new(settings, store).expect("worker"));
    let token = CancellationToken::new();
    let stop = token.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = worker.run(stop).await {
            eprintln!("worker stopped with an error: {e}");
        }
    });
    (token, task)
}

pub(crate) async fn wait_for_verdict(app: &TestApp, run_id: &str) -> Value {
    for _ in 0..600 {
        let (_, run) = app.get_json(&format!("/v1/runs/{run_id}")).await;
        if run["verdict"].is_string() {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: run {run_id} has no verdict after 60 s");
}

pub(crate) async fn server_cases(app: &TestApp, run_id: &str) -> CaseScores {
    let (_, page) = app
        .get_json(&format!("/v1/runs/{run_id}/results?limit=1000"))
        .await;
    page["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["test_case_id"].as_str().unwrap().to_string(),
                (
                    r["status"].as_str().unwrap().to_string(),
                    r["score"].as_f64(),
                ),
            )
        })
        .collect()
}

pub(crate) fn assert_same(server: &Value, local: &RunSummary) {
    let summary = &server["summary"];
    assert_eq!(server["verdict"], local.verdict.as_str());
    assert_eq!(summary["verdict"], local.verdict.as_str());
    for (key, want) in [
        ("mean", local.mean),
        ("median", local.median),
        ("std_dev", local.std_dev),
        ("min", local.min),
        ("max", local.max),
        ("weighted_mean", local.weighted_mean),
        ("pass_rate", local.pass_rate),
    ] {
        let got = summary[key].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "{key}: server {got}, local {want}"
        );
    }
    assert_eq!(server["counters"]["passed"], local.passed);
    assert_eq!(server["counters"]["failed"], local.failed);
    assert_eq!(server["counters"]["errored"], local.errored);
}

async fn round_trip(app: &TestApp, zip: Vec<u8>) {
    let (local_summary, local_cases) = {
        let zip = zip.clone();
        let settings = app.settings.clone();
        tokio::task::spawn_blocking(move || local_run(&zip, &settings))
            .await
            .unwrap()
    };
    assert_eq!(
        local_summary.errored, 0,
        "the package runs cleanly here: {local_cases:?}"
    );
    assert!(local_summary.passed > 0, "{local_cases:?}");
    let upload: Value = app.upload_zip(zip, "").await.json().await.unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = wait_for_verdict(app, &run_id).await;
    assert_eq!(run["status"], "completed");
    assert_same(&run, &local_summary);
    assert_eq!(
        server_cases(app, &run_id).await,
        local_cases,
        "per-case statuses and scores"
    );
    let report = app.get(&format!("/v1/runs/{run_id}/report")).await;
    assert_eq!(report.status().as_u16(), 200);
}

#[tokio::test]
async fn a_run_through_a_real_worker_matches_a_local_run_of_the_same_package() {
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker(&app, cache.path()).await;

    // Recorded outputs: some pass, some fail; no model, no sandbox.
    round_trip(
        &app,
        given_package("e2e-given", &["ok", "no", "ok", "ok ", "OK"], json!({})),
    )
    .await;

    // A real example skill whose runner is a sandboxed script of the package.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills/slugify");
    if Sandbox::detect(app.settings.sandbox.clone())
        .unavailable_reason()
        .is_none()
    {
        let zip = skilleval_cli::submit::zip_folder(&example).unwrap();
        round_trip(&app, zip).await;
    } else {
        eprintln!(
            "bubblewrap is not available: skipping the sandboxed example in the end-to-end test"
        );
    }

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}
