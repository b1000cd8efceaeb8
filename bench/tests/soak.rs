//! The fault soak of issue 22, scaled down for CI: 3 runs x 200 cases on 3 workers while a
//! fault (broker connections closed, database backends terminated, a worker SIGKILLed, a
//! worker SIGTERMed, in rotation) is injected every 0.6 s. Every case must end as the suite
//! gives it, one row each, none errored. `cargo run --release -p skilleval-bench --bin soak`
//! is the full soak.

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
        timeout: Duration::from_secs(100),
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
