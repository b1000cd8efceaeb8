//! The fault soak of issue 22, scaled down for CI: 3 runs x 200 cases on 3 workers while a
//! fault (broker connections closed, database backends terminated, a worker SIGKILLed, a
//! worker SIGTERMed, in rotation) is injected every 0.6 s. Every case must end as the suite
//! gives it, one row each, none errored. `cargo run --release -p skilleval-bench --bin soak`
//! is the full soak.
//!
//! The workers' claim lease and delay queues are scaled to cases of 50 ms (a 10 s lease, tiers
//! up to 5 s): with the service's 60 s lease and 30 s longest tier, a case whose claim holder
//! was SIGKILLed waits 60-90 s before another copy runs it, which is the soak's whole length
//! at this size. The soak fails on a stall (nothing recorded and no run completed for 3
//! minutes), not on its length, so a machine busy with other builds slows it without failing
//! it.

use std::time::Duration;

use skilleval_bench::soak::{soak, FaultKind, SoakOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_ends_as_the_suite_gives_it_through_broker_database_and_worker_faults() {
    let opts = SoakOptions {
        exe: env!("CARGO_BIN_EXE_soak").into(),
        runs: 3,
        cases: 200,
        workers: 3,
        slots: 8,
        sleep_ms: 50,
        fail_every: 10,
        fault_every: Duration::from_millis(600),
        stall: Duration::from_secs(180),
        claim_lease_secs: Some(10),
        retry_tiers_ms: Some(vec![200, 1_000, 5_000]),
        brokers: 1,
    };
    let report = soak(&opts).await.expect("the soak ran");
    for run in &report.runs {
        println!("{run}");
    }
    for kind in [FaultKind::WorkerKill, FaultKind::WorkerTerm] {
        assert!(
            report.faults.get(&kind).copied().unwrap_or(0) >= 1,
            "no {} injected: {:?}",
            kind.as_str(),
            report.faults
        );
    }
    assert!(report.exact(), "{report:#?}");
    for run in &report.runs {
        assert_eq!(
            (run.passed.0, run.failed.0, run.errored),
            (180, 20, 0),
            "{run}"
        );
    }
}
