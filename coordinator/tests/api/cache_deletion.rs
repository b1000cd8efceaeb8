//! Deleting a run, a version or a skill deletes the cached model answers only it used (issue
//! 20, docs/security.md): runs graded by a local test judge through an in-process worker on
//! the Postgres cache, then deleted through the API.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use skilleval_infra::store::llm::PgResponseCache;
use skilleval_providers::ResponseCache;

use crate::e2e::{start_worker_with_providers, wait_for_verdict};
use crate::e2e_llm::{llm_package_named, start_judge};
use crate::helpers::{local_provider, only_provider, spawn_app_with, AppOptions, TestApp};

async fn cache_keys(app: &TestApp) -> BTreeSet<String> {
    sqlx::query_scalar("SELECT key FROM llm_cache")
        .fetch_all(&app.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

async fn links_of(app: &TestApp, run: &str) -> BTreeSet<String> {
    sqlx::query_scalar("SELECT key FROM llm_cache_uses WHERE run_id = $1::uuid")
        .bind(run)
        .fetch_all(&app.pool)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// Uploads the package and waits for its run's verdict; (run id, version label).
async fn graded_upload(app: &TestApp, zip: Vec<u8>) -> (String, String) {
    let upload: Value = app.upload_zip(zip, "").await.json().await.unwrap();
    let run = upload["run_id"].as_str().expect("a run").to_string();
    let version = upload["version"].as_str().expect("a version").to_string();
    let done = wait_for_verdict(app, &run).await;
    assert_eq!(done["status"], "completed", "{done}");
    (run, version)
}

async fn delete(app: &TestApp, path: &str) -> u16 {
    app.client
        .delete(format!("{}{path}", app.address))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Waits until the run's links are `want` (hits are linked by the write-behind writer, a few
/// milliseconds after the answer was served).
async fn wait_links(app: &TestApp, run: &str, want: &BTreeSet<String>) {
    for _ in 0..1_200 {
        if &links_of(app, run).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        &links_of(app, run).await,
        want,
        "the links of run {run} (hang guard: waited up to 30 s)"
    );
}

#[tokio::test]
async fn deleting_a_run_version_or_skill_deletes_the_model_answers_only_it_used() {
    let (addr, calls, judge_task) = start_judge().await;
    let providers = only_provider(local_provider(addr, "judge", "judge-model"));
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        ..AppOptions::default()
    })
    .await;
    let package_cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with_providers(&app, providers, package_cache.path()).await;

    // An answer stored outside any run (as before links existed): no deletion touches it.
    let unowned = "0".repeat(64);
    PgResponseCache::new(app.pool.clone())
        .put(&unowned, &json!({"text": "from nowhere"}))
        .await;

    // Alpha's first run asks the judge 5 questions; its answers are linked to it.
    let (alpha_first, alpha_version) =
        graded_upload(&app, llm_package_named("alpha", " (alpha)")).await;
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let mut alpha = cache_keys(&app).await;
    alpha.remove(&unowned);
    assert_eq!(alpha.len(), 5, "{alpha:?}");
    wait_links(&app, &alpha_first, &alpha).await;

    // Beta and gamma ask other questions (other outputs): answers of their own.
    let before = cache_keys(&app).await;
    let (beta_run, _) = graded_upload(&app, llm_package_named("beta", " (beta)")).await;
    let beta: BTreeSet<String> = cache_keys(&app)
        .await
        .difference(&before)
        .cloned()
        .collect();
    assert_eq!(beta.len(), 5, "{beta:?}");
    wait_links(&app, &beta_run, &beta).await;
    let before = cache_keys(&app).await;
    let (gamma_run, gamma_version) =
        graded_upload(&app, llm_package_named("gamma", " (gamma)")).await;
    let gamma: BTreeSet<String> = cache_keys(&app)
        .await
        .difference(&before)
        .cloned()
        .collect();
    assert_eq!(gamma.len(), 5, "{gamma:?}");
    wait_links(&app, &gamma_run, &gamma).await;
    assert_eq!(calls.load(Ordering::SeqCst), 15);

    // A second run of alpha's version is served alpha's answers: linked to it as well.
    let version_id: String = sqlx::query_scalar(
        "SELECT v.id::text FROM skill_versions v JOIN skills s ON s.id = v.skill_id
         WHERE s.name = 'alpha' AND v.version = $1",
    )
    .bind(&alpha_version)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let again: Value = app
        .client
        .post(format!("{}/v1/runs", app.address))
        .json(&json!({ "version_id": version_id }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let alpha_second = again["run_id"].as_str().expect("a run").to_string();
    let done = wait_for_verdict(&app, &alpha_second).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(calls.load(Ordering::SeqCst), 15, "served from the cache");
    wait_links(&app, &alpha_second, &alpha).await;

    let all = |sets: &[&BTreeSet<String>]| -> BTreeSet<String> {
        let mut keys: BTreeSet<String> = sets.iter().flat_map(|s| s.iter().cloned()).collect();
        keys.insert(unowned.clone());
        keys
    };

    // Deleting alpha's first run keeps the answers its second run still uses.
    assert_eq!(delete(&app, &format!("/v1/runs/{alpha_first}")).await, 204);
    assert_eq!(cache_keys(&app).await, all(&[&alpha, &beta, &gamma]));
    assert!(links_of(&app, &alpha_first).await.is_empty());

    // Deleting the second removes them; nobody else's go.
    assert_eq!(delete(&app, &format!("/v1/runs/{alpha_second}")).await, 204);
    assert_eq!(cache_keys(&app).await, all(&[&beta, &gamma]));

    // Deleting a version removes the answers of its runs.
    assert_eq!(
        delete(&app, &format!("/v1/skills/gamma/versions/{gamma_version}")).await,
        204
    );
    assert_eq!(cache_keys(&app).await, all(&[&beta]));

    // Deleting a skill removes the answers of every run of it.
    assert_eq!(delete(&app, "/v1/skills/beta").await, 204);
    assert_eq!(cache_keys(&app).await, all(&[]));
    let links: i64 = sqlx::query_scalar("SELECT count(*) FROM llm_cache_uses")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(links, 0);

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    judge_task.abort();
    app.cleanup().await;
}
