//! Faults: hanging cases, garbage messages, cancelled runs, lost broker and database.

use std::time::{Duration, Instant};

use lapin::types::{AMQPValue, FieldTable};
use skilleval_execution::result::JobResult;
use skilleval_infra::store::lifecycle::WrittenOff;
use skilleval_infra::topology::{Outgoing, JOB_ROUTING_KEY, PARKED_REASON_HEADER};

use crate::helpers::{
    close_broker_connections, eventually, metric_sum, terminate_backends, Produce, TestEnv,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_case_is_killed_retried_with_backoff_then_errored() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(2, &Produce::Hang { timeout_ms: 400 }).await;
    let mut settings = env.settings("hang");
    settings.worker.max_attempts = 3;
    let w = env.start_worker(settings).await;
    let start = Instant::now();
    env.publish(&seeded.jobs).await;

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(40))
        .await;
    let elapsed = start.elapsed();
    assert_eq!((c.completed, c.errored), (2, 2), "{c:?}");
    env.assert_run_consistent(&seeded).await;
    // Three attempts of 400 ms each, and two waits in delay queues of at least the first tier:
    // a lower bound, which a loaded machine only makes truer.
    assert!(
        elapsed >= Duration::from_millis(3 * 400 + 2 * 300),
        "too fast for the backoff: {elapsed:?}"
    );
    let metrics = w.worker.metrics().encode().unwrap();
    assert_eq!(
        metric_sum(&metrics, "skilleval_worker_retries_total"),
        4,
        "{metrics}"
    );

    let rows: Vec<(serde_json::Value, serde_json::Value)> =
        sqlx::query_as("SELECT error, details FROM eval_results WHERE run_id = $1")
            .bind(seeded.run_id)
            .fetch_all(env.store.pool())
            .await
            .unwrap();
    for (error, details) in rows {
        assert_eq!(error["kind"], "timeout", "{error}");
        assert_eq!(details["gave_up_after_attempts"], 3, "{details}");
    }
    // The hung processes were killed at the timeout, not left behind.
    eventually(
        Duration::from_secs(30),
        "no `sleep 600` left running",
        || async {
            !std::process::Command::new("pgrep")
                .args(["-f", "sleep 600"])
                .status()
                .is_ok_and(|s| s.success())
        },
    )
    .await;
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unparseable_message_is_parked_and_its_neighbours_run() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(20, &Produce::Given { fail_every: 0 }).await;
    env.publish(&seeded.jobs[..10]).await;
    let exchange = env.topology.jobs_exchange();
    let garbage: &[u8] = b"{this is not a job";
    let future_schema: &[u8] = br#"{"schema": 99, "job": {}}"#;
    for body in [garbage, future_schema] {
        let mut headers = FieldTable::default();
        headers.insert("x-test".into(), AMQPValue::LongString("kept".into()));
        env.publisher
            .publish(Outgoing {
                exchange: &exchange,
                routing_key: JOB_ROUTING_KEY,
                body,
                headers,
                message_id: None,
                mandatory: true,
            })
            .await
            .unwrap();
    }
    env.publish(&seeded.jobs[10..]).await;
    let w = env.start_worker(env.settings("park")).await;

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(30))
        .await;
    assert_eq!(c.passed, 20, "{c:?}");
    env.assert_run_consistent(&seeded).await;

    let mut parked = Vec::new();
    let start = std::time::Instant::now();
    while parked.len() < 2 && start.elapsed() < Duration::from_secs(30) {
        parked.extend(env.drain_parking().await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(parked.len(), 2, "hang guard: 30 s and not both parked");
    let mut bodies: Vec<Vec<u8>> = parked.iter().map(|m| m.delivery.data.clone()).collect();
    bodies.sort();
    let mut expected = vec![garbage.to_vec(), future_schema.to_vec()];
    expected.sort();
    assert_eq!(bodies, expected, "parked with the raw body");
    for m in &parked {
        let headers = m.delivery.properties.headers().clone().unwrap_or_default();
        let reason = match headers.inner().get(PARKED_REASON_HEADER) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            other => panic!("no parked reason: {other:?}"),
        };
        assert!(
            reason.contains("not a job") || reason.contains("schema version 99"),
            "{reason}"
        );
        assert!(
            headers.inner().contains_key("x-test"),
            "original headers kept"
        );
    }
    let metrics = w.worker.metrics().encode().unwrap();
    assert_eq!(metric_sum(&metrics, "skilleval_worker_parked_total"), 2);
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_a_cancelled_run_are_skipped_without_running() {
    let env = TestEnv::new().await;
    let seeded = env
        .seed_run(30, &Produce::Hang { timeout_ms: 20_000 })
        .await;
    env.store.cancel(seeded.run_id).await.unwrap();
    let w = env.start_worker(env.settings("cancel")).await;
    env.publish(&seeded.jobs).await;
    eventually(Duration::from_secs(60), "every job handled", || async {
        metric_sum(
            &w.worker.metrics().encode().unwrap(),
            "skilleval_worker_batch_size_sum",
        ) >= 30
    })
    .await;
    // Skipped without running: not one of them reached the executor (each would hang 20 s).
    assert_eq!(
        metric_sum(
            &w.worker.metrics().encode().unwrap(),
            "skilleval_worker_job_duration_seconds_count",
        ),
        0,
        "a job of the cancelled run was executed"
    );
    // What the worker recorded for the stopped run changed nothing ...
    assert!(env.rows_by_status(seeded.run_id).await.is_empty());
    assert_eq!(env.counters(seeded.run_id).await.completed, 0);
    // ... the coordinator writes its cases off, each once.
    let skipped: Vec<JobResult> = seeded
        .jobs
        .iter()
        .map(|j| JobResult::skipped(j, "the run was cancelled"))
        .collect();
    let mut cases = WrittenOff::default();
    for r in &skipped {
        cases.push(r, serde_json::to_string(r).unwrap());
    }
    assert_eq!(
        env.store.write_off(seeded.run_id, &cases).await.unwrap(),
        30
    );
    let c = env.assert_run_consistent(&seeded).await;
    assert_eq!(c.skipped, 30, "{c:?}");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_completes_through_broker_and_database_outages() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(200, &Produce::Sleep { secs: 0.3 }).await;
    let mut sa = env.settings("a");
    sa.worker.concurrency = 5;
    let mut sb = env.settings("b");
    sb.worker.concurrency = 5;
    let a = env.start_worker(sa).await;
    let b = env.start_worker(sb).await;
    env.publish(&seeded.jobs).await;

    let run_id = seeded.run_id;
    eventually(Duration::from_secs(30), "20 cases done", || async {
        env.counters(run_id).await.completed >= 20
    })
    .await;
    let closed = close_broker_connections(&format!("worker-{}", env.prefix));
    assert!(
        closed >= 2,
        "closed {closed} worker connections; the broker has: {:?}",
        crate::helpers::broker_connections()
    );
    let after_close = env.counters(run_id).await.completed;
    eventually(
        Duration::from_secs(30),
        "progress after the broker outage",
        || async { env.counters(run_id).await.completed >= after_close + 20 },
    )
    .await;
    let terminated = terminate_backends(&env.db_name).await;
    assert!(terminated >= 1, "terminated {terminated} backends");

    let c = env.wait_for_run(run_id, Duration::from_secs(50)).await;
    assert_eq!(c.passed, 200, "{c:?}");
    env.assert_run_consistent(&seeded).await;
    let reconnects = metric_sum(
        &a.worker.metrics().encode().unwrap(),
        "skilleval_worker_reconnects_total",
    ) + metric_sum(
        &b.worker.metrics().encode().unwrap(),
        "skilleval_worker_reconnects_total",
    );
    assert!(reconnects >= 2, "both workers reconnected: {reconnects}");
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}
