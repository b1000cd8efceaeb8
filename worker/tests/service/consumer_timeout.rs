//! A job that outlives the broker's consumer acknowledgement timeout, against a RabbitMQ node
//! of the test's own with a 2 s `consumer_timeout` (checked every 500 ms: 3.10 checks it on
//! the channel's tick, a minute by default). The broker closes the worker's channel and
//! delivers the jobs again while their first copies still run; each case must be recorded
//! once and run once: the copies delivered again find the cases claimed and are put off until
//! the first copies' results are recorded.

use std::time::Duration;

use skilleval_test_support::cluster::{NodeConfig, RabbitCluster};

use crate::helpers::{metric_sum, Produce, TestEnv};

/// Executions a worker finished (produced and graded), whatever became of their results.
fn executions(w: &crate::helpers::RunningWorker) -> u64 {
    metric_sum(
        &w.worker.metrics().encode().expect("metrics"),
        "skilleval_worker_job_duration_seconds_count",
    )
}

fn counter(w: &crate::helpers::RunningWorker, name: &str) -> u64 {
    metric_sum(&w.worker.metrics().encode().expect("metrics"), name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_held_past_the_consumer_timeout_is_recorded_once_and_run_once() {
    let node = tokio::task::spawn_blocking(|| {
        RabbitCluster::start_configured(
            1,
            &NodeConfig {
                conf: "consumer_timeout = 2000\n".into(),
                advanced: Some("[{rabbit, [{channel_tick_interval, 500}]}].\n".into()),
            },
        )
    })
    .await
    .expect("the node starts");
    let env = TestEnv::on_broker(Some(node.nodes[0].url())).await;
    // Each case runs 8 s: four times the consumer timeout.
    let seeded = env.seed_run(3, &Produce::Sleep { secs: 8.0 }).await;
    let settings = |name: &str| {
        let mut s = env.settings(name);
        // Slots to spare: a copy delivered again is looked at at once, wherever it lands,
        // not after a running case frees a slot.
        s.worker.concurrency = 6;
        s.worker.claim_after_ms = 300;
        s.worker.claim_lease_secs = 3;
        s.worker.broker_consumer_timeout_ms = Some(2_000);
        s
    };
    let a = env.start_worker(settings("a")).await;
    env.publish(&seeded.jobs).await;
    // A second worker, free to take the copies the broker delivers again.
    let b = env.start_worker(settings("b")).await;

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(180))
        .await;
    assert_eq!(
        c.passed,
        3,
        "{c:?}: {:?}",
        env.errors_of(seeded.run_id).await
    );
    env.assert_run_consistent(&seeded).await;
    // The first copies' results are committed; the copies delivered again then find the
    // cases recorded (settled) once they come back from the delay queue. Wait for that, so
    // the counts below are final.
    let settled = || {
        counter(&a, "skilleval_worker_settled_redeliveries_total")
            + counter(&b, "skilleval_worker_settled_redeliveries_total")
    };
    crate::helpers::eventually(Duration::from_secs(60), "the put-off copies settle", || {
        let n = settled();
        async move { n >= 3 }
    })
    .await;

    let redelivered = counter(&a, "skilleval_worker_redeliveries_total")
        + counter(&b, "skilleval_worker_redeliveries_total");
    let deferred = counter(&a, "skilleval_worker_deferred_copies_total")
        + counter(&b, "skilleval_worker_deferred_copies_total");
    assert!(
        redelivered >= 3,
        "the broker delivered every job again after its consumer timeout ({redelivered} redeliveries); node log:\n{}",
        node.log(0)
    );
    assert!(
        deferred >= 3,
        "each copy delivered again was put off ({deferred})"
    );
    assert_eq!(
        executions(&a) + executions(&b),
        3,
        "each case ran once (a: {}, b: {})",
        executions(&a),
        executions(&b)
    );
    let superseded = counter(&a, "skilleval_worker_superseded_copies_total")
        + counter(&b, "skilleval_worker_superseded_copies_total");
    assert_eq!(superseded, 0, "no running copy lost its claim");
    a.stop().await.expect("worker a stops");
    b.stop().await.expect("worker b stops");
}
