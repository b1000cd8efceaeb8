//! Model-backed cases against a provider answering after 50 ms: cases/s by concurrency.
//!
//! Run with `cargo run --release -p skilleval-bench --bin llm_bench`
//! (`-- --max-concurrency N` sets the provider's `max_concurrency`, 512 by default;
//! `-- --spawn` runs each case as a tokio task of its own instead of through `execute_all`,
//! to compare).
//!
//! The provider is a real OpenAI-compatible chat-completions server on 127.0.0.1:0 in a child
//! process (this binary re-run with `serve`, on its own multi-threaded runtime) that answers
//! every request after a 50 ms `tokio::time::sleep`. The measured process is the CLI's code
//! path only: a skill package on disk (SKILL.md + `eval/tests.json`, runner `llm`, strategy
//! `regex_match`) is opened, validated and planned as `skilleval run` does, providers are
//! connected with [`NoCache`] and no rate limit, and the jobs go through
//! [`skilleval_cli::run::execute_all`] (`buffer_unordered` over `Executor::execute`). Each case
//! makes exactly one model call (the `llm` runner producing the output; `regex_match` grades
//! it locally), so the ideal rate is `concurrency / 0.05 s`.
//!
//! For each concurrency in 1, 16, 128, 512: one warm-up round of `concurrency` cases (opens the
//! connections), then `max(200, 20 × concurrency)` cases timed, cycling through the package's
//! 512 cases. Printed: cases, seconds, cases/s, ideal (`concurrency / 50 ms`), ratio to it,
//! ratio to `concurrency / rtt` (rtt: a bare sequential request to the mock, measured first),
//! the most requests the server saw in flight at once, CPU of this process and of the server
//! (100 % = one core), and this process's peak and current RSS (`VmHWM`, `VmRSS`; the
//! server's memory is not in them).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use skilleval_bench::cluster;
use skilleval_execution::executor::{Executor, ExecutorBuilder};
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_execution::result::CaseStatus;
use skilleval_execution::validate::validate;
use skilleval_model::grade::RetryPolicy;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_providers::{NoCache, ProviderClients, Providers, ResponseCache};
use uuid::Uuid;

use skilleval_bench::mock_provider::{self, LATENCY};

const CONCURRENCY: [usize; 4] = [1, 16, 128, 512];
const PROVIDER: &str = "mock";
/// Cases in the package; the timed jobs cycle through them (a worker holds one compiled
/// grader per distinct case, so more distinct cases would measure the grader cache instead).
const DISTINCT_CASES: usize = 512;

fn cases_for(concurrency: usize) -> usize {
    (20 * concurrency).max(200)
}

// ---------------------------------------------------------------- the provider (child process)

/// The server process; killed when dropped.
struct Server {
    child: Child,
    addr: String,
    pid: String,
}

impl Server {
    fn start() -> anyhow::Result<Server> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg("serve")
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the provider process")?;
        let stdout = child.stdout.take().context("provider stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let addr = line.trim().to_string();
        if addr.is_empty() {
            let _ = child.kill();
            bail!("the provider process did not print its address");
        }
        let pid = child.id().to_string();
        Ok(Server { child, addr, pid })
    }

    async fn peak(&self) -> anyhow::Result<u64> {
        let v: Value = reqwest::get(format!("http://{}/stats", self.addr))
            .await?
            .json()
            .await?;
        v["peak"].as_u64().context("peak")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- measurements of this process

/// A `kB` field of /proc/self/status, in MiB.
fn status_mib(field: &str) -> Option<f64> {
    cluster::proc_status_kib("self", field).map(|kb| kb / 1024.0)
}

fn cpu_seconds(pid: &str) -> Option<f64> {
    cluster::proc_cpu_seconds(pid)
}

// ---------------------------------------------------------------- the benchmark

/// A skill whose every case is produced by the `llm` runner and graded by `regex_match`.
fn write_package(root: &Path, cases: usize) -> anyhow::Result<()> {
    std::fs::create_dir_all(root.join("eval"))?;
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: llm-bench\ndescription: Answers refund questions briefly. Use for the llm_bench benchmark.\n---\n\n# Refunds\n\nAnswer in one sentence and always quote the order number.\n",
    )?;
    let tests = cluster::llm_refund_tests(cases, |i| {
        format!("Was my refund for order {} approved?", 1000 + i)
    });
    std::fs::write(
        root.join("eval").join("tests.json"),
        serde_json::to_vec_pretty(&tests)?,
    )?;
    Ok(())
}

fn max_concurrency_arg() -> anyhow::Result<u32> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().position(|a| a == "--max-concurrency") {
        None => Ok(512),
        Some(i) => {
            let v = args
                .get(i + 1)
                .context("--max-concurrency needs a number after it")?;
            v.parse()
                .with_context(|| format!("--max-concurrency must be a whole number, not `{v}`"))
        }
    }
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return mock_provider::serve();
    }
    let max_concurrency = max_concurrency_arg()?;
    let server = Server::start()?;
    // The runtime `skilleval run` builds (multi-threaded, one worker per core).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let spawn = std::env::args().any(|a| a == "--spawn");
    runtime.block_on(bench(&server, max_concurrency, spawn))
}

async fn bench(server: &Server, max_concurrency: u32, spawn: bool) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("llm-bench");
    write_package(&root, DISTINCT_CASES)?;

    let providers = Providers::from_toml_str(
        "llm_bench",
        &format!(
            "default = \"{PROVIDER}\"\n[providers.{PROVIDER}]\nkind = \"openai\"\nbase_url = \"http://{}/v1\"\nmodel = \"mock-model\"\nmax_concurrency = {max_concurrency}\n",
            server.addr
        ),
    )?;
    let cache: Arc<dyn ResponseCache> = Arc::new(NoCache);
    let clients = Arc::new(ProviderClients::connect(&providers, &cache, None)?);
    let executor = Arc::new(
        ExecutorBuilder::new()
            .providers(Some(clients.clone()))
            .build(),
    );

    let package = Package::open(&root, &PackageLimits::default())?;
    let validation = validate(&package, executor.strategies());
    if !validation.is_ok() {
        bail!(
            "the bench package does not validate: {:?}",
            validation.problems
        );
    }
    executor.prime(
        &package.content_hash,
        package.config.profile,
        &package.config.test_cases,
        validation.graders,
    );
    let jobs = plan(
        &package.config,
        &package.content_hash,
        Uuid::now_v7(),
        &CaseFilter::default(),
        None,
    )?;
    let client = clients
        .get(PROVIDER)
        .ok_or_else(|| anyhow!("no client"))?
        .clone();

    let floor = round_trip(server).await?;
    println!(
        "provider latency {} ms (one bare HTTP round trip: {:.1} ms), max_concurrency {max_concurrency}, 1 model call per case, {} cores; RSS after setup {:.1} MiB",
        LATENCY.as_millis(),
        floor * 1000.0,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        status_mib("VmRSS:").unwrap_or(0.0),
    );
    println!(
        "{:>11} {:>6} {:>8} {:>9} {:>8} {:>6} {:>6} {:>9} {:>6} {:>6} {:>9} {:>8}",
        "concurrency",
        "cases",
        "seconds",
        "cases/s",
        "ideal",
        "ratio",
        "vs rtt",
        "in flight",
        "cpu%",
        "srv%",
        "peak MiB",
        "RSS MiB"
    );
    for concurrency in CONCURRENCY {
        let cases = cases_for(concurrency);
        let cycle = |n: usize| -> Vec<skilleval_execution::plan::Job> {
            jobs.iter().cycle().take(n).cloned().collect()
        };
        let warm_up = cycle(concurrency);
        let timed = cycle(cases);
        let results = run(&executor, warm_up, package.root(), concurrency, spawn).await;
        check(&results)?;
        server.peak().await?;

        let sent = client.requests_sent();
        let cpu = cpu_seconds("self").unwrap_or(0.0);
        let server_cpu = cpu_seconds(&server.pid).unwrap_or(0.0);
        let start = Instant::now();
        let results = run(&executor, timed, package.root(), concurrency, spawn).await;
        let seconds = start.elapsed().as_secs_f64();
        let cpu = cpu_seconds("self").unwrap_or(0.0) - cpu;
        let server_cpu = cpu_seconds(&server.pid).unwrap_or(0.0) - server_cpu;
        check(&results)?;
        let calls = client.requests_sent() - sent;
        if calls != cases as u64 {
            bail!("{calls} model calls for {cases} cases: expected one each");
        }
        let in_flight = server.peak().await?;

        let rate = cases as f64 / seconds;
        let ideal = concurrency as f64 / LATENCY.as_secs_f64();
        println!(
            "{concurrency:>11} {cases:>6} {seconds:>8.2} {rate:>9.1} {ideal:>8.0} {:>6.3} {:>6.3} {in_flight:>9} {:>6.0} {:>6.0} {:>9.1} {:>8.1}",
            rate / ideal,
            rate / (concurrency as f64 / floor),
            100.0 * cpu / seconds,
            100.0 * server_cpu / seconds,
            status_mib("VmHWM:").unwrap_or(0.0),
            status_mib("VmRSS:").unwrap_or(0.0),
        );
    }
    Ok(())
}

/// The mean of 20 sequential bare requests to the provider (no executor): the round trip
/// the mock actually achieves (timer granularity and loopback HTTP on top of its 50 ms).
async fn round_trip(server: &Server) -> anyhow::Result<f64> {
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/chat/completions", server.addr);
    let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]});
    http.post(&url).json(&body).send().await?.bytes().await?;
    let start = Instant::now();
    for _ in 0..20 {
        http.post(&url).json(&body).send().await?.bytes().await?;
    }
    Ok(start.elapsed().as_secs_f64() / 20.0)
}

async fn run(
    executor: &Arc<Executor>,
    jobs: Vec<skilleval_execution::plan::Job>,
    root: &Path,
    concurrency: usize,
    spawn: bool,
) -> Vec<skilleval_execution::result::JobResult> {
    if spawn {
        // Diagnostic only: every case a task of its own, so cases run on every runtime thread.
        let root: Arc<Path> = Arc::from(root);
        return stream::iter(jobs)
            .map(|job| {
                let executor = executor.clone();
                let root = root.clone();
                tokio::spawn(async move { executor.execute(&job, &root).await })
            })
            .buffer_unordered(concurrency)
            .filter_map(|r| async move { r.ok() })
            .collect()
            .await;
    }
    skilleval_cli::run::execute_all(
        executor,
        jobs,
        Vec::new(),
        root,
        concurrency,
        false,
        RetryPolicy::default(),
        true,
        None,
    )
    .await
}

fn check(results: &[skilleval_execution::result::JobResult]) -> anyhow::Result<()> {
    if let Some(r) = results.iter().find(|r| r.status != CaseStatus::Passed) {
        bail!(
            "case {} is {}: {:?}",
            r.test_case_id,
            r.status.as_str(),
            r.error
        );
    }
    Ok(())
}
