//! Production sampling throughput (issue 17), measured against the upload path in the same run.
//!
//! Run with
//! `cargo run --release -p skilleval-bench --bin sampling_bench -- [--cases 10000]
//! [--samples 10000] [--concurrency 64] [--flood 20000] [--skip-flood]`.
//!
//! Everything runs on loopback against the PostgreSQL and RabbitMQ of this machine (the same
//! `SKILLEVAL_BENCH_PG` / `SKILLEVAL_BENCH_AMQP` as `pipeline_bench`), in a database and queue
//! prefix of its own, both removed at the end (also on an error or ctrl-c). The coordinator
//! and the worker are child processes configured like the binaries.
//!
//! 1. **Upload path**: a package of `--cases` given-output cases graded by `regex_match` and
//!    `contains` (deterministic) is uploaded and run by one worker (`--concurrency` slots);
//!    cases/s from the upload request until the run reads `completed`.
//! 2. **Sampling path**: a skill whose monitor grades with the same two strategies
//!    (`sample_rate` 1) gets `--samples` samples in batches of 1,000, sent one after the other.
//!    **Accepted/s**: samples over the time the ingest requests took (each batch stored, its
//!    samples run committed; publishing continues in the background). **Graded/s**: samples
//!    over the time from the first request until every sample has a result. The worker is
//!    restarted with `samples_concurrency` = `--concurrency`, so both paths grade with the
//!    same number of slots. Both figures are printed as a ratio to the upload path's cases/s.
//! 3. **Lane priority** (`--skip-flood` leaves it out; needs bubblewrap): the calculator
//!    example is run idle (after a warm-up run), then again once `--flood` samples are queued
//!    on the samples lane (ingested, and every samples run published), by a worker with the
//!    default split (`concurrency` 4, samples a quarter); prints both times and their ratio
//!    (the issue's bound: 2).

use std::io::{Cursor, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lapin::types::ShortString;
use lapin::{Connection, ConnectionProperties};
use serde_json::{json, Value};
use skilleval_bench::cluster::{self, amqp_url, Proc};
use skilleval_infra::config::Settings;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Topology;
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

struct Options {
    cases: usize,
    samples: usize,
    concurrency: u16,
    flood: usize,
    skip_flood: bool,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        cases: 10_000,
        samples: 10_000,
        concurrency: 64,
        flood: 20_000,
        skip_flood: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--cases" => o.cases = value()?.parse()?,
            "--samples" => o.samples = value()?.parse()?,
            "--concurrency" => o.concurrency = value()?.parse()?,
            "--flood" => o.flood = value()?.parse()?,
            "--skip-flood" => o.skip_flood = true,
            other => bail!("unknown option {other}"),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    if let Some(outcome) = cluster::child_main() {
        return outcome;
    }
    let opts = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let env = Env::create().await?;
        let outcome = tokio::select! {
            r = bench(&env, &opts) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        env.cleanup().await;
        outcome
    })
}

/// The benchmark's database and queue prefix; [`Env::cleanup`] removes both.
struct Env {
    db_name: String,
    db_url: String,
    prefix: String,
    store: Store,
    cache: tempfile::TempDir,
}

impl Env {
    async fn create() -> anyhow::Result<Env> {
        let id = Uuid::new_v4().simple().to_string();
        let (db_name, db_url) = cluster::create_database("skilleval_sbench").await?;
        Ok(Env {
            prefix: format!("sbench{}", &id[..12]),
            db_name,
            store: Store::connect_url(&db_url, 2).await?,
            db_url,
            cache: tempfile::tempdir()?,
        })
    }

    fn child_env(&self, extra: &[(&str, String)]) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = [
            ("DATABASE_URL", self.db_url.clone()),
            ("AMQP_URL", amqp_url()),
            ("SKILLEVAL__AMQP__PREFIX", self.prefix.clone()),
            ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
            ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
            (
                "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
                self.cache.path().display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        env.extend(extra.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
        env
    }

    async fn cleanup(&self) {
        self.store.pool().close().await;
        cluster::drop_database(&self.db_name).await;
        let deleted = async {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
            let mut settings = Settings::default();
            settings.amqp.prefix.clone_from(&self.prefix);
            cluster::delete_topology(&conn, &Topology::from_settings(&settings)).await?;
            let _ = conn.close(200, ShortString::from("bench done")).await;
            anyhow::Ok(())
        };
        if let Err(e) = deleted.await {
            eprintln!("cleanup: deleting the queues of {}: {e}", self.prefix);
        }
    }

    /// Samples runs whose jobs are not all published yet.
    async fn unpublished_samples_runs(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM runs WHERE kind = 'samples' AND published_through < total",
        )
        .fetch_one(self.store.pool())
        .await?)
    }

    async fn graded(&self, skill: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM sample_results r JOIN skills s ON s.id = r.skill_id
             WHERE s.name = $1",
        )
        .bind(skill)
        .fetch_one(self.store.pool())
        .await?)
    }
}

/// What both paths grade with: a regex and a contains check on the output.
fn criteria() -> Value {
    json!([
        {"name": "cites-order", "strategy": "regex_match", "expected": {"patterns": [r"order \d+", r"(?i)business days"]}},
        {"name": "polite", "strategy": "contains", "options": {"includes": ["refund"]}}
    ])
}

fn output(i: usize) -> String {
    format!(
        "The refund for order {} was approved; the money reaches your card within five business days.",
        10_000 + i
    )
}

fn package(name: &str, cases: usize, monitoring: Option<Value>) -> anyhow::Result<Vec<u8>> {
    let cases: Vec<Value> = (0..cases.max(1))
        .map(|i| {
            let strategy = if i % 2 == 0 {
                "regex_match"
            } else {
                "contains"
            };
            let expected = if i % 2 == 0 {
                json!({"patterns": [r"order \d+", r"(?i)business days"]})
            } else {
                json!({"includes": ["refund"]})
            };
            json!({"id": format!("case-{i:06}"), "input": {"prompt": "refund?"},
                   "given": {"output": output(i)}, "expected": expected,
                   "evaluation": {"strategy": strategy}})
        })
        .collect();
    let mut tests = json!({"version": "2.0", "settings": {"runner": "given"}, "testCases": cases});
    if let Some(m) = monitoring {
        tests["monitoring"] = m;
    }
    let skill =
        format!("---\nname: {name}\ndescription: Refund answers, for the sampling benchmark.\n---\n\nAnswer.\n");
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    w.start_file(format!("{name}/SKILL.md"), options)?;
    w.write_all(skill.as_bytes())?;
    w.start_file(format!("{name}/eval/tests.json"), options)?;
    w.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(w.finish()?.into_inner())
}

/// Uploads a package and waits for its run to complete; returns the elapsed time.
async fn run_upload(http: &reqwest::Client, base: &str, zip: Vec<u8>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let response = http
        .post(format!("{base}/v1/skills"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    let body = cluster::expect_status(response, 201, "the upload").await?;
    let run_id = body["run_id"].as_str().context("no run")?.to_string();
    loop {
        let run: Value = http
            .get(format!("{base}/v1/runs/{run_id}"))
            .send()
            .await?
            .json()
            .await?;
        if run["status"] == "completed" {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(1_800) {
            bail!("the run did not complete in 30 minutes: {run}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `n` samples to `skill` in batches of 1,000; returns the time the requests took.
async fn ingest(
    http: &reqwest::Client,
    base: &str,
    skill: &str,
    prefix: &str,
    n: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut sent = 0;
    while sent < n {
        let batch: Vec<Value> = (sent..n.min(sent + 1_000))
            .map(|i| json!({"sample_id": format!("{prefix}-{i:07}"), "input": "refund?", "output": output(i)}))
            .collect();
        let response = http
            .post(format!("{base}/v1/skills/{skill}/samples"))
            .json(&batch)
            .send()
            .await?;
        let answer = cluster::expect_status(response, 200, "an ingest").await?;
        if answer["sampled"].as_u64() != Some(batch.len() as u64) {
            bail!("not every sample was taken: {answer}");
        }
        sent += batch.len();
    }
    Ok(started.elapsed())
}

async fn wait_graded(env: &Env, skill: &str, n: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    while env.graded(skill).await? < i64::try_from(n)? {
        if started.elapsed() > Duration::from_secs(1_800) {
            bail!("samples not graded in 30 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

async fn bench(env: &Env, opts: &Options) -> anyhow::Result<()> {
    env.store.migrate().await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let c = opts.concurrency.to_string();
    let (_coordinator, port) = Proc::spawn("coordinator", &env.child_env(&[]))?;
    let base = format!("http://127.0.0.1:{}", port.context("no port")?);
    println!(
        "sampling_bench: {} upload cases, {} samples, one worker with {} slots per lane, {} cores",
        opts.cases,
        opts.samples,
        opts.concurrency,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
    );

    // 1 and 2, with the same number of slots on both lanes.
    let equal = [
        ("SKILLEVAL__WORKER__CONCURRENCY", c.clone()),
        ("SKILLEVAL__WORKER__SAMPLES_CONCURRENCY", c.clone()),
    ];
    let worker = Proc::spawn("worker", &env.child_env(&equal))?;
    run_upload(&http, &base, package("warm-up", 10, None)?).await?;
    let upload = run_upload(&http, &base, package("uploaded", opts.cases, None)?).await?;
    let upload_rate = opts.cases as f64 / upload.as_secs_f64();
    println!(
        "upload path:   {} cases in {:.2} s = {upload_rate:.0} cases/s",
        opts.cases,
        upload.as_secs_f64()
    );
    let monitor = json!({"sample_rate": 1.0, "criteria": criteria()});
    cluster::upload_version(&http, &base, package("sampled", 1, Some(monitor))?).await?;
    let started = Instant::now();
    let ingest_time = ingest(&http, &base, "sampled", "s", opts.samples).await?;
    wait_graded(env, "sampled", opts.samples).await?;
    let graded_time = started.elapsed();
    let accepted_rate = opts.samples as f64 / ingest_time.as_secs_f64();
    let graded_rate = opts.samples as f64 / graded_time.as_secs_f64();
    println!(
        "sampling path: {} samples accepted in {:.2} s = {accepted_rate:.0} samples/s ({:.2}x the upload path)",
        opts.samples,
        ingest_time.as_secs_f64(),
        accepted_rate / upload_rate
    );
    println!(
        "               graded in {:.2} s = {graded_rate:.0} samples/s ({:.2}x the upload path)",
        graded_time.as_secs_f64(),
        graded_rate / upload_rate
    );
    drop(worker);

    if opts.skip_flood {
        return Ok(());
    }
    let example =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills/calculator");
    let calculator = skilleval_cli::submit::zip_folder(&example).map_err(anyhow::Error::msg)?;
    let defaults = [("SKILLEVAL__WORKER__CONCURRENCY", "4".to_string())];
    let _worker = Proc::spawn("worker", &env.child_env(&defaults))?;
    run_upload(&http, &base, calculator.clone()).await?;
    let idle = run_upload(&http, &base, calculator.clone()).await?;
    let monitor = json!({"sample_rate": 1.0, "criteria": criteria()});
    cluster::upload_version(&http, &base, package("flood", 1, Some(monitor))?).await?;
    ingest(&http, &base, "flood", "f", opts.flood).await?;
    // Queued: every samples run published (the coordinator publishes after answering).
    let publishing = Instant::now();
    while env.unpublished_samples_runs().await? > 0 {
        if publishing.elapsed() > Duration::from_secs(600) {
            bail!("the samples runs were not published in 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let loaded = run_upload(&http, &base, calculator).await?;
    let graded_then = env.graded("flood").await?;
    println!(
        "lane priority: calculator run idle {:.2} s, with {} samples queued {:.2} s ({:.2}x, the issue's bound 2x; {graded_then} samples graded meanwhile)",
        idle.as_secs_f64(),
        opts.flood,
        loaded.as_secs_f64(),
        loaded.as_secs_f64() / idle.as_secs_f64()
    );
    Ok(())
}
