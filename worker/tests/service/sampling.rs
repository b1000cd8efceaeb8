//! A samples run (production samples graded on the samples lane) survives a worker killed
//! with -9 mid-batch: every sampled item ends up graded exactly once.

// Tests may unwrap: a failure is the test failing.
#![allow(clippy::unwrap_used)]

use std::io::{Cursor, Write as _};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;
use skilleval_execution::monitor::{
    parse, sample_job, CriteriaSelection, MonitorSource, Sample, SampleJobContext,
};
use skilleval_execution::plan::Job;
use skilleval_grading::StrategyRegistry;
use skilleval_infra::store::samples::{NewRevision, NewSamples, RevisionSource};
use skilleval_infra::topology::Lane;
use skilleval_model::package::{Package, PackageLimits};
use uuid::Uuid;
use zip::write::SimpleFileOptions;

use crate::helpers::{eventually, free_port, metric_sum, TestEnv};

/// A package whose monitor grades with a sandboxed custom grader that takes `secs`.
fn slow_grader_package(secs: f64) -> Vec<u8> {
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": "given"},
        "testCases": [{"id": "a", "given": {"output": "ok"}, "expected": {"output": "ok"}}],
    });
    let grader = format!(
        "import json, sys, time\nd = json.load(sys.stdin)\ntime.sleep({secs})\n\
         print(json.dumps({{\"score\": 1.0 if 'ok' in d['output'] else 0.0}}))\n"
    );
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default();
    for (name, bytes) in [
        (
            "SKILL.md",
            b"---\nname: sampled\ndescription: Graded in production.\n---\nBody.\n".to_vec(),
        ),
        ("eval/tests.json", serde_json::to_vec(&tests).unwrap()),
        ("scripts/grade.py", grader.into_bytes()),
    ] {
        w.start_file(name, options).unwrap();
        w.write_all(&bytes).unwrap();
    }
    w.finish().unwrap().into_inner()
}

/// Seeds, as ingest does, a samples run of `n` sampled items (every fifth one failing), and
/// returns its id and jobs.
async fn seed_samples_run(env: &TestEnv, n: usize) -> (Uuid, Vec<Job>) {
    let zip = slow_grader_package(3.0);
    let package = Package::from_zip_bytes(&zip, &PackageLimits::default(), None).unwrap();
    let document = json!({
        "sample_rate": 1.0,
        "criteria": [{"name": "slow", "strategy": "custom",
                      "expected": {"customScript": "scripts/grade.py"}}]
    });
    let source = MonitorSource {
        file: "monitor",
        pointer: "",
        package_root: package.root(),
    };
    let (monitor, _) = parse(&document, &source, &StrategyRegistry::builtin().build()).unwrap();
    let pool = env.store.pool();
    let skill_id = Uuid::now_v7();
    sqlx::query("INSERT INTO skills (id, name) VALUES ($1, 'sampled')")
        .bind(skill_id)
        .execute(pool)
        .await
        .unwrap();
    let version_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO skill_versions
            (id, skill_id, version, description, description_hash, package_hash, package_bytes, manifest)
         VALUES ($1, $2, '1', 'Graded in production', 'h', $3, $4, '{}'::jsonb)",
    )
    .bind(version_id)
    .bind(skill_id)
    .bind(&package.content_hash)
    .bind(&zip)
    .execute(pool)
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    let monitor_json = serde_json::to_value(&monitor).unwrap();
    env.store
        .put_monitor(
            &mut tx,
            &NewRevision {
                skill_id,
                document: &document,
                monitor: &monitor_json,
                source: RevisionSource::Api,
                callback_url: None,
            },
        )
        .await
        .unwrap();
    let run_id = Uuid::now_v7();
    let request = json!({"skill_id": skill_id, "monitor_revision": 1, "selection": "all",
                         "package_hash": package.content_hash});
    sqlx::query(
        "INSERT INTO runs (id, version_id, kind, status, total, published_through, request)
         VALUES ($1, $2, 'samples', 'running', $3, $3, $4)",
    )
    .bind(run_id)
    .bind(version_id)
    .bind(i32::try_from(n).unwrap())
    .bind(&request)
    .execute(&mut *tx)
    .await
    .unwrap();
    let ctx = SampleJobContext {
        run_id,
        package_hash: &package.content_hash,
        monitor_revision: 1,
        selection: CriteriaSelection::All,
    };
    let mut rows = NewSamples::default();
    let mut jobs = Vec::new();
    for i in 0..n {
        let sample: Sample = serde_json::from_value(json!({
            "sample_id": format!("p-{i:03}"),
            "input": "hi",
            "output": if i % 5 == 0 { "bad" } else { "ok" },
        }))
        .unwrap();
        let index = u32::try_from(i).unwrap();
        jobs.push(sample_job(&monitor, &sample, index, &ctx).unwrap());
        rows.sample_ids.push(sample.sample_id.clone());
        rows.dispositions.push("sampled");
        rows.positions.push(Some(i32::try_from(i).unwrap()));
        rows.versions.push(None);
        rows.observed_at.push(chrono::Utc::now());
        rows.bodies
            .push(Some(serde_json::to_string(&sample).unwrap()));
    }
    env.store
        .insert_samples(&mut tx, skill_id, Some(run_id), 1, &rows)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    (run_id, jobs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_leaves_every_sample_graded_exactly_once() {
    let env = TestEnv::new().await;
    if skilleval_sandbox::Sandbox::detect(env.settings("probe").sandbox)
        .unavailable_reason()
        .is_some()
    {
        eprintln!("bubblewrap is not available: skipping");
        return;
    }
    let (run_id, jobs) = seed_samples_run(&env, 40).await;
    for r in env.publisher.publish_jobs(&jobs, Lane::Samples).await {
        r.unwrap();
    }
    let slots = [("SKILLEVAL__WORKER__SAMPLES_CONCURRENCY", "30".to_string())];
    let mut a = env.spawn_worker_process("a", free_port(), &slots);
    eventually(
        Duration::from_secs(30),
        "worker a grades ~30 samples at once",
        || async {
            a.metrics()
                .await
                .is_some_and(|m| metric_sum(&m, "skilleval_worker_in_flight") >= 25)
        },
    )
    .await;
    a.signal(Signal::SIGKILL);
    let (status, _) = a.wait(Duration::from_secs(30)).await;
    assert!(!status.success());
    let before = env.counters(run_id).await;
    assert!(before.completed <= 15, "killed mid-batch: {before:?}");

    let b = env.spawn_worker_process("b", free_port(), &slots);
    let c = env.wait_for_run(run_id, Duration::from_secs(60)).await;
    assert_eq!(
        (c.total, c.completed, c.passed, c.failed),
        (40, 40, 32, 8),
        "{c:?}"
    );
    // One result row per sample, each joined to its sample (the quality view's rows).
    let (rows, distinct, graded): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM eval_results WHERE run_id = $1),
                (SELECT count(DISTINCT test_case_id) FROM eval_results WHERE run_id = $1),
                (SELECT count(*) FROM sample_results WHERE run_id = $1)",
    )
    .bind(run_id)
    .fetch_one(env.store.pool())
    .await
    .unwrap();
    assert_eq!((rows, distinct, graded), (40, 40, 40));
    let m = b.metrics().await.unwrap_or_default();
    assert!(
        metric_sum(&m, "skilleval_worker_redeliveries_total") >= 25,
        "the killed worker's samples were redelivered: {m}"
    );
}
