//! `agent` runner cases against a scripted tool-using model answering after 50 ms.
//!
//! Run with `cargo run --release -p skilleval-bench --bin agent_bench` (root, bubblewrap
//! installed: the cases run in the real sandbox, one per case).
//!
//! The model is [`scripted_model`]: an OpenAI-compatible server in this process (its own
//! multi-threaded runtime) that answers every request after 50 ms, following a script keyed by
//! the number of assistant turns in the conversation: `read_file /skill/SKILL.md`, then `bash`
//! (`wc -l` of the input file), then `write_file`, then a text answer — 3 tool calls and 4 model
//! turns per case, so a case spends at least 200 ms waiting for the model and the ideal rate at
//! concurrency C is `C / 0.2 s`.
//!
//! Printed:
//! 1. **Sandbox overhead per tool call once the sandbox is up**: one session, `true` run 300
//!    times through it one after the other; the time of a call is all overhead (the command
//!    does nothing). Also the time to open a session (bubblewrap start), 20 times.
//! 2. For 16 and 128 cases in flight: `max(4 × C, 64)` cases through `Executor::execute` (as a
//!    worker runs them), cases/s, the ideal, the ratio, errors, the mean and p95 of the tool
//!    calls' durations recorded in the transcripts (ms), and this process's peak RSS (`VmHWM`:
//!    it hosts the executor as a worker does; the model server is in it too).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use axum::body::Bytes;
use axum::Router;
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_execution::result::CaseStatus;
use skilleval_execution::validate::validate;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_providers::{ApiKey, LlmClient, ProviderClients, ProviderConfig, ProviderKind};
use skilleval_sandbox::egress::AllowedHosts;
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy, SandboxSession};

const LATENCY: Duration = Duration::from_millis(50);
const TURNS_PER_CASE: u32 = 4;
const LEVELS: [usize; 2] = [16, 128];

async fn scripted(body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let turn = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
        + 1;
    tokio::time::sleep(LATENCY).await;
    let call = |name: &str, args: Value| {
        json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": format!("call_{turn}"), "type": "function",
            "function": {"name": name, "arguments": args.to_string()}}]})
    };
    let message = match turn {
        1 => call("read_file", json!({"path": "/skill/SKILL.md"})),
        2 => call("bash", json!({"command": "wc -l < data.txt"})),
        3 => call(
            "write_file",
            json!({"path": "out/result.txt", "content": "3 lines\n"}),
        ),
        _ => json!({"role": "assistant", "content": "done: 3 lines"}),
    };
    axum::Json(json!({
        "model": "mock-model",
        "choices": [{"message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 20}
    }))
}

/// Starts the scripted model on its own runtime; returns its base URL.
fn scripted_model() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            let app = Router::new().fallback(axum::routing::post(scripted));
            let _ = axum::serve(listener, app).await;
        });
    });
    Ok(format!("http://{addr}/v1"))
}

fn write_package(root: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(root.join("eval"))?;
    std::fs::create_dir_all(root.join("evals"))?;
    std::fs::write(
        root.join("SKILL.md"),
        "---\nname: line-count\ndescription: Counts lines of a file. Use when asked how many lines a file has.\n---\n# Line count\n\nRun `wc -l`.\n",
    )?;
    std::fs::write(root.join("evals/data.txt"), "a\nb\nc\n")?;
    std::fs::write(
        root.join("eval/tests.json"),
        serde_json::to_string(&json!({
            "version": "2.0",
            "settings": {"runner": {"type": "agent", "provider": "mock"}, "defaultTimeout": 120000},
            "testCases": [{"id": "count", "input": {"prompt": "How many lines?", "files": ["evals/data.txt"]},
                           "expected": {"includes": ["3 lines"], "files": [{"path": "out/result.txt"}]},
                           "evaluation": {"strategy": "contains"}}]
        }))?,
    )?;
    for d in ["", "eval", "evals"] {
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(0o755))?;
    }
    for f in ["SKILL.md", "evals/data.txt", "eval/tests.json"] {
        std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn vm_hwm_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// A session on the package, its files where the runner keeps them (`/dev/shm` by default).
async fn open(
    sandbox: &Sandbox,
    root: &Path,
) -> anyhow::Result<(tempfile::TempDir, SandboxSession)> {
    let control = sandbox.session_scratch("skilleval-bench-")?;
    let session = sandbox
        .open_session(
            root,
            &[],
            control.path(),
            Default::default(),
            &AllowedHosts::default(),
        )
        .await
        .context("opening a session")?;
    Ok((control, session))
}

async fn sandbox_overhead(sandbox: &Sandbox, root: &Path) -> anyhow::Result<()> {
    let mut opens = Vec::new();
    for _ in 0..20 {
        let t0 = Instant::now();
        let (_control, session) = open(sandbox, root).await?;
        opens.push(t0.elapsed().as_secs_f64() * 1000.0);
        session.close().await;
    }
    let (_control, mut session) = open(sandbox, root).await?;
    let mut calls = Vec::new();
    for _ in 0..300 {
        let out = session.run("true", Duration::from_secs(10)).await?;
        if out.exit_code != 0 {
            bail!("`true` exited {}", out.exit_code);
        }
        calls.push(out.duration.as_secs_f64() * 1000.0);
    }
    session.close().await;
    opens.sort_by(f64::total_cmp);
    calls.sort_by(f64::total_cmp);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "session open (bubblewrap start): mean {:.1} ms, p50 {:.1} ms, p95 {:.1} ms (20 opens)",
        mean(&opens),
        percentile(&opens, 0.5),
        percentile(&opens, 0.95)
    );
    println!(
        "tool call overhead once up (`true`, 300 calls): mean {:.2} ms, p50 {:.2} ms, p95 {:.2} ms, max {:.2} ms",
        mean(&calls),
        percentile(&calls, 0.5),
        percentile(&calls, 0.95),
        calls.last().copied().unwrap_or(0.0)
    );
    Ok(())
}

/// The sandbox alone at `concurrency` sessions in flight, no model: each task opens a session,
/// runs 3 calls (`true`) and closes it. Prints the sessions/s and the p50/p95 of each phase, so
/// the model-driven figures below can be split into sandbox time and the rest.
async fn sandbox_only(sandbox: &Sandbox, root: &Path, concurrency: usize) -> anyhow::Result<()> {
    let n = (4 * concurrency).max(64);
    let t0 = Instant::now();
    let phases: Vec<anyhow::Result<[f64; 3]>> = stream::iter(0..n)
        .map(|_| async move {
            let t = Instant::now();
            let (_control, mut session) = open(sandbox, root).await?;
            let open = t.elapsed().as_secs_f64() * 1000.0;
            let t = Instant::now();
            for _ in 0..3 {
                session.run("true", Duration::from_secs(10)).await?;
            }
            let call = t.elapsed().as_secs_f64() * 1000.0 / 3.0;
            let t = Instant::now();
            session.close().await;
            Ok([open, call, t.elapsed().as_secs_f64() * 1000.0])
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let phases: Vec<[f64; 3]> = phases.into_iter().collect::<anyhow::Result<_>>()?;
    let column = |i: usize| {
        let mut v: Vec<f64> = phases.iter().map(|p| p[i]).collect();
        v.sort_by(f64::total_cmp);
        (percentile(&v, 0.5), percentile(&v, 0.95))
    };
    let ((o50, o95), (c50, c95), (x50, x95)) = (column(0), column(1), column(2));
    println!(
        "sandbox only, {concurrency:>3} in flight: {n} sessions of 3 calls in {secs:.2} s = {:.1} sessions/s; open p50 {o50:.1} ms p95 {o95:.1} ms; call p50 {c50:.1} ms p95 {c95:.1} ms; close p50 {x50:.1} ms p95 {x95:.1} ms",
        n as f64 / secs
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sandbox = Sandbox::detect(SandboxPolicy::default());
    if sandbox.mode() != SandboxMode::Bubblewrap {
        bail!("bubblewrap is needed: {:?}", sandbox.unavailable_reason());
    }
    let dir = tempfile::tempdir()?;
    let root = dir.path();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
    }
    write_package(root)?;
    sandbox_overhead(&sandbox, root).await?;
    for concurrency in LEVELS {
        sandbox_only(&sandbox, root, concurrency).await?;
    }

    let base_url = scripted_model()?;
    let config = ProviderConfig {
        base_url,
        max_concurrency: Some(1024),
        ..ProviderConfig::new("mock", ProviderKind::Openai, "mock-model")
    };
    let mut clients = ProviderClients::default();
    clients.insert(LlmClient::new(config, Some(ApiKey::new("sk-bench")))?);
    let executor = Arc::new(
        ExecutorBuilder::new()
            .providers(Some(Arc::new(clients)))
            .sandbox(sandbox)
            .build(),
    );
    let package = Package::open(root, &PackageLimits::default())?;
    let validation = validate(&package, executor.strategies());
    if !validation.is_ok() {
        bail!(
            "the bench package does not validate: {:?}",
            validation.problems
        );
    }
    let jobs = plan(
        &package.config,
        &package.content_hash,
        uuid::Uuid::new_v4(),
        &CaseFilter::default(),
        None,
    )?;
    let job = jobs.first().context("no job planned")?.clone();
    println!(
        "model: 50 ms per turn, {TURNS_PER_CASE} turns and 3 tool calls per case (ideal = concurrency / {:.1} s)",
        LATENCY.as_secs_f64() * f64::from(TURNS_PER_CASE)
    );
    for concurrency in LEVELS {
        let n = (4 * concurrency).max(64);
        let t0 = Instant::now();
        let results: Vec<_> = stream::iter(0..n)
            .map(|_| {
                let executor = executor.clone();
                let job = job.clone();
                let root = root.to_path_buf();
                async move { executor.execute(&job, &root).await }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let secs = t0.elapsed().as_secs_f64();
        let passed = results
            .iter()
            .filter(|r| r.status == CaseStatus::Passed)
            .count();
        let first_problem = results
            .iter()
            .find(|r| r.status != CaseStatus::Passed)
            .map(|r| format!("{:?}: {:?}", r.status, r.error));
        let mut call_ms: Vec<f64> = results
            .iter()
            .flat_map(|r| {
                r.details
                    .pointer("/runner/transcript/tool_calls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|c| c["duration_ms"].as_u64().map(|d| d as f64))
            .collect();
        call_ms.sort_by(f64::total_cmp);
        let rate = n as f64 / secs;
        let ideal = concurrency as f64 / (LATENCY.as_secs_f64() * f64::from(TURNS_PER_CASE));
        println!(
            "concurrency {concurrency:>3}: {n} cases in {secs:.2} s = {rate:.1} cases/s; ideal {ideal:.0}/s, ratio {:.0} %; passed {passed}/{n}; tool call in-case mean {:.1} ms p95 {:.0} ms; peak RSS {:.0} MiB",
            100.0 * rate / ideal,
            call_ms.iter().sum::<f64>() / call_ms.len().max(1) as f64,
            percentile(&call_ms, 0.95),
            vm_hwm_mib()
        );
        if let Some(p) = first_problem {
            println!("  first case that did not pass: {p}");
        }
    }
    Ok(())
}
