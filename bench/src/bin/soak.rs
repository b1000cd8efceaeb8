//! The fault soak of issue 22 ([`skilleval_bench::soak`] says what it does).
//!
//! Run with
//! `cargo run --release -p skilleval-bench --bin soak -- [--soaks 1] [--runs 10] [--cases 1000]
//! [--workers 3] [--slots 16] [--sleep-ms 50] [--fail-every 10] [--fault-every-ms 3000]
//! [--stall-secs 600] [--claim-lease-secs N] [--brokers 1|3]`.
//!
//! Needs the local PostgreSQL (`SKILLEVAL_BENCH_PG`, an admin URL without the database) and
//! RabbitMQ (`SKILLEVAL_BENCH_AMQP`; `rabbitmqctl` on this machine, to create the soak's vhost
//! and close its connections), and bubblewrap. Each soak creates its own database and vhost
//! and removes them at the end, also when it fails. Prints per run: cases and rows, statuses
//! against the suite, faults injected while it was in flight by kind, duration; exits
//! non-zero unless every soak was exact (every case as the suite gives it, one row each,
//! none errored). `--brokers 3` runs each soak on a private three-node RabbitMQ cluster of its
//! own (started and removed by the soak) with broker-node faults in the rotation.

use std::time::Duration;

use anyhow::{bail, Context};
use skilleval_bench::cluster;
use skilleval_bench::soak::{soak, SoakOptions};

struct Args {
    soaks: usize,
    opts: SoakOptions,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        soaks: 1,
        opts: SoakOptions {
            exe: std::env::current_exe()?,
            runs: 10,
            cases: 1_000,
            workers: 3,
            slots: 16,
            sleep_ms: 50,
            fail_every: 10,
            fault_every: Duration::from_secs(3),
            stall: Duration::from_secs(600),
            claim_lease_secs: None,
            retry_tiers_ms: None,
            brokers: 1,
        },
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let number = || -> anyhow::Result<u64> {
            value
                .parse()
                .with_context(|| format!("{flag}: `{value}` is not a whole number"))
        };
        match flag.as_str() {
            "--soaks" => a.soaks = usize::try_from(number()?)?,
            "--runs" => a.opts.runs = usize::try_from(number()?)?,
            "--cases" => a.opts.cases = usize::try_from(number()?)?,
            "--workers" => a.opts.workers = usize::try_from(number()?)?.max(1),
            "--slots" => a.opts.slots = u16::try_from(number()?)?.max(1),
            "--sleep-ms" => a.opts.sleep_ms = number()?,
            "--fail-every" => a.opts.fail_every = usize::try_from(number()?)?,
            "--fault-every-ms" => a.opts.fault_every = Duration::from_millis(number()?.max(100)),
            "--stall-secs" => a.opts.stall = Duration::from_secs(number()?),
            "--claim-lease-secs" => a.opts.claim_lease_secs = Some(number()?.max(1)),
            "--brokers" => {
                a.opts.brokers = match number()? {
                    1 => 1,
                    3 => 3,
                    n => bail!("--brokers: {n}: 1 (a vhost of the local node) or 3 (a cluster)"),
                }
            }
            other => bail!("unknown flag {other} (see the comment at the top of soak.rs)"),
        }
    }
    Ok(a)
}

fn main() -> anyhow::Result<()> {
    if let Some(outcome) = cluster::child_main() {
        return outcome;
    }
    let args = args()?;
    let o = &args.opts;
    println!(
        "soak: {} soak(s) of {} runs x {} cases (command runner sleeping {} ms, every {}th case expects a wrong answer), {} workers x {} slots, a fault every {} ms, {}",
        args.soaks,
        o.runs,
        o.cases,
        o.sleep_ms,
        o.fail_every,
        o.workers,
        o.slots,
        o.fault_every.as_millis(),
        if o.brokers > 1 {
            "on a private three-node RabbitMQ cluster, node faults included"
        } else {
            "on a vhost of the local RabbitMQ"
        }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut exact = 0;
    let mut errored = 0;
    for n in 1..=args.soaks {
        let report = runtime.block_on(soak(o))?;
        println!(
            "soak {n}: {:.1} s; sandbox uids: at most {} process(es) on one uid, at most {} zombie(s) at once ({} samples); faults: {}",
            report.duration.as_secs_f64(),
            report.uids.most_on_one_uid,
            report.uids.most_zombies,
            report.uids.samples,
            report
                .faults
                .iter()
                .map(|(k, v)| format!("{} {v}", k.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (i, run) in report.runs.iter().enumerate() {
            println!("  run {}: {run}", i + 1);
        }
        errored += report.errored();
        if report.exact() {
            exact += 1;
        }
        println!(
            "soak {n}: {}; so far {exact}/{n} exact, {errored} errored case(s)",
            if report.exact() { "EXACT" } else { "NOT EXACT" }
        );
    }
    if exact < args.soaks {
        bail!(
            "{} of {} soak(s) were not exact",
            args.soaks - exact,
            args.soaks
        );
    }
    Ok(())
}
