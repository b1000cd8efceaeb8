//! The happy path at scale, and the store's guarantees on their own.

use std::time::Duration;

use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::store::Store;

use crate::helpers::{Produce, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_a_thousand_case_run() {
    let env = TestEnv::new().await;
    let seeded = env
        .seed_run(1_000, &Produce::Given { fail_every: 10 })
        .await;
    let a = env.start_worker(env.settings("a")).await;
    let b = env.start_worker(env.settings("b")).await;
    env.publish(&seeded.jobs).await;

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(50))
        .await;
    let c2 = env.assert_run_consistent(&seeded).await;
    assert_eq!(c, c2);
    assert_eq!(
        (c.passed, c.failed, c.errored),
        (900, 100, 0),
        "{c:?}; errored: {:?}",
        env.errors_of(seeded.run_id).await
    );
    let (pa, pb) = (a.processed(), b.processed());
    assert_eq!(
        pa + pb,
        1_000,
        "every committed result counted once: a={pa} b={pb}"
    );
    assert!(pa > 0 && pb > 0, "both workers took jobs: a={pa} b={pb}");

    // Stored results are whole: the summary input parses back.
    let (result, job): (serde_json::Value, Option<String>) = sqlx::query_as(
        "SELECT result::jsonb, job FROM eval_results WHERE run_id = $1 AND test_case_id = 'tc-0009'",
    )
    .bind(seeded.run_id)
    .fetch_one(env.store.pool())
    .await
    .unwrap();
    let parsed: JobResult = serde_json::from_value(result).unwrap();
    assert_eq!(parsed.status, CaseStatus::Failed);
    assert_eq!(parsed.output.as_deref(), Some("wrong"));
    assert_eq!(job, None, "a recorded case's job is cleared");

    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_changes_its_row_once_and_counters_by_exactly_that() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(4, &Produce::Given { fail_every: 0 }).await;
    let j = &seeded.jobs;
    let mut passed = JobResult::skipped(&j[0], "x");
    passed.status = CaseStatus::Passed;
    passed.score = Some(1.0);
    let mut failed = JobResult::skipped(&j[1], "x");
    failed.status = CaseStatus::Failed;
    failed.score = Some(0.0);
    let errored = JobResult::errored(&j[2], skilleval_model::grade::Fault::transient("boom"));

    // A duplicate inside one batch counts once.
    let changed = env
        .store
        .record_results(&[passed.clone(), passed.clone(), failed.clone()])
        .await
        .unwrap();
    assert_eq!(changed.len(), 2);
    let c = env.counters(seeded.run_id).await;
    assert_eq!((c.completed, c.passed, c.failed), (2, 1, 1));

    // A redelivery of a recorded case changes nothing, even with another outcome.
    let mut flipped = passed.clone();
    flipped.status = CaseStatus::Failed;
    let changed = env
        .store
        .record_results(&[flipped, errored.clone()])
        .await
        .unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].test_case_id, j[2].case.id);
    assert_eq!(changed[0].status, CaseStatus::Errored);
    let c = env.counters(seeded.run_id).await;
    assert_eq!((c.completed, c.passed, c.failed, c.errored), (3, 1, 1, 1));

    // Queued results, results outside the run's plan and of unknown runs are ignored.
    let mut queued = JobResult::skipped(&j[3], "x");
    queued.status = CaseStatus::Queued;
    let mut unplanned = JobResult::skipped(&j[3], "x");
    unplanned.test_case_id = "no-such-case".into();
    unplanned.case_index = 4;
    let mut unknown = JobResult::skipped(&j[3], "x");
    unknown.run_id = uuid::Uuid::now_v7();
    assert!(env
        .store
        .record_results(&[queued, unplanned, unknown])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(env.counters(seeded.run_id).await.completed, 3);

    // Concurrent writers of the same rows: each row changes once in total.
    let skipped = JobResult::skipped(&j[3], "cancelled");
    let (x, y) = tokio::join!(
        env.store.record_results(std::slice::from_ref(&skipped)),
        env.store.record_results(std::slice::from_ref(&skipped)),
    );
    assert_eq!(x.unwrap().len() + y.unwrap().len(), 1);
    let c = env.counters(seeded.run_id).await;
    assert_eq!((c.completed, c.skipped), (4, 1));

    // Columns are filled from the result.
    let (status, errors, tags): (String, serde_json::Value, Vec<String>) = sqlx::query_as(
        "SELECT status, error, tags FROM eval_results WHERE run_id = $1 AND test_case_id = $2",
    )
    .bind(seeded.run_id)
    .bind(&j[2].case.id)
    .fetch_one(env.store.pool())
    .await
    .unwrap();
    assert_eq!(status, "errored");
    assert_eq!(errors["kind"], "transient");
    assert_eq!(tags, vec!["svc".to_string()]);
    env.assert_run_consistent(&seeded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_both_succeed() {
    let env = TestEnv::new().await;
    // `TestEnv` migrated already; a fresh schema in the same server shows two starts at once.
    let fresh = format!("{}_m", env.db_name);
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&format!(
        "{}/postgres",
        crate::helpers::pg_admin_base()
    ))
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{fresh}\"")))
        .execute(&mut admin)
        .await
        .unwrap();
    let url = format!("{}/{fresh}", crate::helpers::pg_admin_base());
    let (s1, s2) = (
        Store::connect_url(&url, 2).await.unwrap(),
        Store::connect_url(&url, 2).await.unwrap(),
    );
    let (r1, r2) = tokio::join!(s1.migrate(), s2.migrate());
    r1.unwrap();
    r2.unwrap();
    let (applied,): (i64,) = sqlx::query_as("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(s1.pool())
        .await
        .unwrap();
    assert_eq!(
        applied,
        i64::try_from(skilleval_infra::store::MIGRATOR.iter().count()).unwrap()
    );
    s1.pool().close().await;
    s2.pool().close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE \"{fresh}\" WITH (FORCE)"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_are_served() {
    let env = TestEnv::new().await;
    let w = env.start_worker(env.settings("http")).await;
    let stop_http = tokio_util::sync::CancellationToken::new();
    let (addr, server) = w.worker.serve_http(stop_http.clone()).await.unwrap();
    let port = addr.port();
    assert_eq!(
        crate::helpers::http_get(port, "/healthz").await.as_deref(),
        Some("ok")
    );
    crate::helpers::eventually(Duration::from_secs(30), "ready once consuming", || async {
        crate::helpers::http_get(port, "/readyz")
            .await
            .is_some_and(|body| body.starts_with("ready"))
    })
    .await;
    // It names the node it consumes from.
    let node = w.worker.broker_node().expect("a node while consuming");
    assert_eq!(
        crate::helpers::http_get(port, "/readyz").await,
        Some(format!("ready: broker node {node}"))
    );
    let metrics = crate::helpers::http_get(port, "/metrics").await.unwrap();
    for name in [
        "skilleval_worker_jobs_processed",
        "skilleval_worker_retries",
        "skilleval_worker_parked",
        "skilleval_worker_batch_size",
        "skilleval_worker_in_flight",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    w.stop().await.unwrap();
    // Not consuming any more: alive, but not ready.
    assert_eq!(crate::helpers::http_get(port, "/readyz").await, None);
    assert_eq!(
        crate::helpers::http_get(port, "/healthz").await.as_deref(),
        Some("ok")
    );
    stop_http.cancel();
    server.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_samples_does_not_hold_up_ci_jobs() {
    let env = TestEnv::new().await;
    let samples = env.seed_run(12, &Produce::Sleep { secs: 1.0 }).await;
    let ci = env.seed_run(8, &Produce::Sleep { secs: 1.1 }).await;
    let publish = |jobs: Vec<skilleval_execution::plan::Job>, lane| {
        let publisher = env.publisher.clone();
        async move {
            for r in publisher.publish_jobs(&jobs, lane).await {
                r.unwrap();
            }
        }
    };
    // The samples arrive first and would fill every slot of a single shared queue.
    publish(
        samples.jobs.clone(),
        skilleval_infra::topology::Lane::Samples,
    )
    .await;
    let mut settings = env.settings("lanes");
    settings.worker.concurrency = 4;
    settings.worker.samples_concurrency = Some(1);
    let w = env.start_worker(settings).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    publish(ci.jobs.clone(), skilleval_infra::topology::Lane::Ci).await;

    let c = env.wait_for_run(ci.run_id, Duration::from_secs(30)).await;
    assert_eq!(c.passed, 8, "{c:?}");
    let s = env.counters(samples.run_id).await;
    assert!(
        s.completed < 8,
        "CI finished while most samples still wait: {s:?}"
    );
    let metrics = w.worker.metrics().encode().unwrap();
    assert!(metrics
        .contains(r#"skilleval_worker_jobs_processed_total{status="passed",lane="samples"}"#));
    let sample_done = env
        .wait_for_run(samples.run_id, Duration::from_secs(40))
        .await;
    assert_eq!(sample_done.passed, 12);
    env.assert_run_consistent(&samples).await;
    env.assert_run_consistent(&ci).await;
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_step_decides_what_each_delivery_needs() {
    use skilleval_infra::messages::encode_job;
    use skilleval_infra::topology::Lane;
    use skilleval_worker::{DeliveryInfo, Disposition, Worker};

    let env = TestEnv::new().await;
    let seeded = env.seed_run(3, &Produce::Given { fail_every: 0 }).await;
    let settings = env.settings("step");
    let store = Store::connect(&settings.database).await.unwrap();
    let worker = Worker::new(settings, store).expect("worker");
    let fresh = DeliveryInfo::default();
    let publisher = Some(&env.publisher);

    let parked = worker
        .handle(b"\xff\xfe", None, &fresh, Lane::Ci, publisher)
        .await
        .unwrap();
    assert!(matches!(parked, Disposition::Parked(_)), "{parked:?}");

    let body = encode_job(&seeded.jobs[0]).unwrap();
    let Disposition::Record(result) = worker
        .handle(&body, None, &fresh, Lane::Ci, publisher)
        .await
        .unwrap()
    else {
        panic!("a fresh job is run and recorded");
    };
    assert_eq!(result.status, CaseStatus::Passed);
    assert_eq!(env.store.record_results(&[*result]).await.unwrap().len(), 1);

    let redelivered = DeliveryInfo {
        redelivered: true,
        ..DeliveryInfo::default()
    };
    match worker
        .handle(&body, None, &redelivered, Lane::Ci, publisher)
        .await
        .unwrap()
    {
        Disposition::Decided(Some(event)) => {
            assert_eq!(event.test_case_id, seeded.jobs[0].case.id);
            assert_eq!(event.status, CaseStatus::Passed);
        }
        other => panic!("a recorded case is decided, not run again: {other:?}"),
    }

    let poison = DeliveryInfo {
        redelivered: true,
        delivery_count: 10,
        ..DeliveryInfo::default()
    };
    let body = encode_job(&seeded.jobs[1]).unwrap();
    let Disposition::Record(result) = worker
        .handle(&body, None, &poison, Lane::Ci, publisher)
        .await
        .unwrap()
    else {
        panic!("a poison job is recorded as errored");
    };
    assert_eq!(result.status, CaseStatus::Errored);
    assert!(result
        .error
        .unwrap()
        .to_string()
        .contains("delivered 11 times"));
    assert_eq!(env.drain_parking().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_uses_of_a_package_fetch_it_once() {
    use skilleval_worker::packages::PackageCache;

    let env = TestEnv::new().await;
    let seeded = env.seed_run(2, &Produce::Given { fail_every: 0 }).await;
    let hash = seeded.jobs[0].package_hash.clone();
    let cache = std::sync::Arc::new(PackageCache::new(
        env.cache_dir.path().to_path_buf(),
        skilleval_model::package::PackageLimits::default(),
        env.store.clone(),
    ));
    cache.prepare().unwrap();
    let roots = futures::future::join_all((0..16).map(|_| {
        let cache = cache.clone();
        let hash = hash.clone();
        async move { cache.root(&hash).await.unwrap() }
    }))
    .await;
    assert!(roots.iter().all(|r| r == &roots[0]), "{roots:?}");
    assert_eq!(cache.fetches(), 1, "sixteen first uses, one fetch");
    assert!(roots[0].join("SKILL.md").is_file(), "{:?}", roots[0]);
    let entries: Vec<String> = std::fs::read_dir(env.cache_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        entries,
        vec![hash.clone()],
        "one folder per hash, no leftovers"
    );

    // Another cache (another process) over the same folder reuses it without fetching.
    sqlx::query("UPDATE skill_versions SET package_bytes = ''::bytea")
        .execute(env.store.pool())
        .await
        .unwrap();
    let other = PackageCache::new(
        env.cache_dir.path().to_path_buf(),
        skilleval_model::package::PackageLimits::default(),
        env.store.clone(),
    );
    assert_eq!(other.root(&hash).await.unwrap(), roots[0]);
    assert_eq!(other.fetches(), 0);
    assert!(other.root("../etc").await.is_err(), "hashes are not paths");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_takes_the_next_job_while_its_result_waits_for_the_commit() {
    // Two slots and a long batch window: finished jobs wait ~1 s for their commit. The
    // prefetch is twice the slots, so while the first two results wait, two more jobs run
    // and join the same batch; with the prefetch equal to the slots the batch would hold 2.
    let env = TestEnv::new().await;
    let seeded = env.seed_run(8, &Produce::Given { fail_every: 0 }).await;
    env.publish(&seeded.jobs).await;
    let mut settings = env.settings("slots");
    settings.worker.concurrency = 2;
    settings.worker.batch_size = 100;
    settings.worker.batch_max_wait_ms = 1_000;
    let w = env.start_worker(settings).await;
    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(30))
        .await;
    assert_eq!(c.passed, 8, "{c:?}");
    // Rows committed together share their transaction's `now()`.
    let largest: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM eval_results
                             WHERE run_id = $1 GROUP BY updated_at) batches",
    )
    .bind(seeded.run_id)
    .fetch_one(env.store.pool())
    .await
    .unwrap();
    assert_eq!(
        largest, 4,
        "a batch holds the jobs of both slots twice over"
    );
    w.stop().await.unwrap();
}

/// A batch publish queues every message before awaiting any (see `Publisher::publish_jobs`);
/// two such batches at once on one channel, as a run's creation sends its chunks, must still
/// give one outcome per job, every one confirmed, and put every job on the queue exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batch_publishes_land_every_job_once() {
    use lapin::options::BasicGetOptions;
    use lapin::types::ShortString;
    use skilleval_infra::messages::decode_job;
    use skilleval_infra::topology::Lane;

    let env = TestEnv::new().await;
    let seeded = env.seed_run(3_000, &Produce::Given { fail_every: 0 }).await;
    let (first, second) = seeded.jobs.split_at(1_700);
    let (a, b) = tokio::join!(
        env.publisher.publish_jobs(first, Lane::Ci),
        env.publisher.publish_jobs(second, Lane::Ci)
    );
    assert_eq!((a.len(), b.len()), (first.len(), second.len()));
    for (i, r) in a.iter().chain(&b).enumerate() {
        assert!(r.is_ok(), "job {i} was not confirmed: {r:?}");
    }

    let ch = env.conn.create_channel().await.unwrap();
    let mut seen = std::collections::HashMap::new();
    while let Some(m) = ch
        .basic_get(
            ShortString::from(env.topology.jobs_queue()),
            BasicGetOptions { no_ack: true },
        )
        .await
        .unwrap()
    {
        let job = decode_job(&m.delivery.data).unwrap();
        *seen.entry(job.case.id).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), seeded.jobs.len(), "every job is on the queue");
    assert!(
        seen.values().all(|n| *n == 1),
        "no job was queued twice: {:?}",
        seen.iter()
            .filter(|(_, n)| **n > 1)
            .take(5)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn an_output_holding_the_nul_character_is_recorded() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(1, &Produce::Given { fail_every: 0 }).await;
    let mut result = JobResult::skipped(&seeded.jobs[0], "x");
    result.status = CaseStatus::Failed;
    result.score = Some(0.0);
    result.output = Some("before\0after".into());
    result.feedback = Some("expected `ok`, got `before\0after`".into());
    result.details = serde_json::json!({ "output": "before\0after", "note\0": 1 });
    let changed = env.store.record_results(&[result]).await.unwrap();
    assert_eq!(changed.len(), 1);
    let (output, details): (String, serde_json::Value) =
        sqlx::query_as("SELECT output, details FROM eval_results WHERE run_id = $1")
            .bind(seeded.run_id)
            .fetch_one(env.store.pool())
            .await
            .unwrap();
    assert_eq!(output, "before\u{2400}after");
    assert_eq!(details["output"], "before\u{2400}after");
    env.assert_run_consistent(&seeded).await;
}
