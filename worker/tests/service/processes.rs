//! The real `skilleval-worker` binary: killed hard, and stopped gracefully.

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::helpers::{eventually, free_port, metric_sum, Produce, TestEnv};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_jobs_in_flight_loses_none() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(60, &Produce::Sleep { secs: 4.0 }).await;
    env.publish(&seeded.jobs).await;
    let concurrency = [("SKILLEVAL__WORKER__CONCURRENCY", "50".to_string())];
    let mut a = env.spawn_worker_process("a", free_port(), &concurrency);

    eventually(
        Duration::from_secs(30),
        "worker a holds ~50 jobs",
        || async {
            a.metrics()
                .await
                .is_some_and(|m| metric_sum(&m, "skilleval_worker_in_flight") >= 45)
        },
    )
    .await;
    a.signal(Signal::SIGKILL);
    let (status, _) = a.wait(Duration::from_secs(30)).await;
    assert!(!status.success());
    let before = env.counters(seeded.run_id).await;
    assert!(
        before.completed <= 15,
        "the killed jobs had not finished: {before:?}"
    );

    let b_port = free_port();
    let b = env.spawn_worker_process("b", b_port, &concurrency);
    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(50))
        .await;
    assert_eq!(c.passed, 60, "{c:?}");
    env.assert_run_consistent(&seeded).await;
    let m = b.metrics().await.unwrap_or_default();
    assert!(
        metric_sum(&m, "skilleval_worker_redeliveries_total") >= 45,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_jobs_finish_and_exits_zero() {
    let env = TestEnv::new().await;
    let seeded = env.seed_run(40, &Produce::Sleep { secs: 2.0 }).await;
    env.publish(&seeded.jobs).await;
    let settings = [
        ("SKILLEVAL__WORKER__CONCURRENCY", "4".to_string()),
        ("SKILLEVAL__WORKER__SHUTDOWN_GRACE_SECS", "20".to_string()),
    ];
    let mut a = env.spawn_worker_process("a", free_port(), &settings);
    let b = env.spawn_worker_process("b", free_port(), &settings);

    eventually(
        Duration::from_secs(30),
        "worker a is running jobs",
        || async {
            a.metrics()
                .await
                .is_some_and(|m| metric_sum(&m, "skilleval_worker_in_flight") >= 2)
        },
    )
    .await;
    a.signal(Signal::SIGTERM);
    // Its in-flight jobs take 2 s and its grace is 20 s: a guard against a hang.
    let (status, stderr) = a.wait(Duration::from_secs(60)).await;
    assert!(status.success(), "exit status {status:?}\n{stderr}");
    assert!(
        stderr.contains("stopped consuming") && stderr.contains("worker stopped"),
        "{stderr}"
    );

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(50))
        .await;
    assert_eq!(c.passed, 40, "{c:?}");
    env.assert_run_consistent(&seeded).await;
    // Worker a acked everything it held: b never got one of its jobs back.
    let m = b.metrics().await.unwrap_or_default();
    assert_eq!(
        metric_sum(&m, "skilleval_worker_redeliveries_total"),
        0,
        "worker b got jobs of a back:\n{m}\nworker a said:\n{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_reach_the_broker_exits_non_zero() {
    let env = TestEnv::new().await;
    let closed_port = free_port();
    let mut w = env.spawn_worker_process(
        "nobroker",
        free_port(),
        &[
            (
                "AMQP_URL",
                format!("amqp://guest:guest@127.0.0.1:{closed_port}/%2f"),
            ),
            ("SKILLEVAL__WORKER__MAX_RECONNECT_ATTEMPTS", "2".to_string()),
        ],
    );
    let (status, stderr) = w.wait(Duration::from_secs(30)).await;
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("broker stayed unreachable"), "{stderr}");
}
