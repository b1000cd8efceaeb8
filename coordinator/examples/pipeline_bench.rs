//! Pipeline throughput (issue 5): the raw limits of this box, then the real pipeline, in one run.
//!
//! Run with
//! `cargo run --release -p skilleval-coordinator --example pipeline_bench -- [--cases 10000]
//! [--workers 1,2] [--repeat 1] [--concurrency 256] [--batch-size 200]`.
//!
//! Everything runs on loopback against the PostgreSQL and RabbitMQ of this machine
//! (`SKILLEVAL_BENCH_PG`, an admin URL without the database, default
//! `postgres://postgres@127.0.0.1:5432`; `SKILLEVAL_BENCH_AMQP`, default guest on
//! `127.0.0.1:5672`). The benchmark creates its own database (random name) and queue prefix
//! (random), and drops the database and deletes every queue and exchange of the prefix at the
//! end, also when a step fails or on ctrl-c.
//!
//! **1. Raw limits**, measured by this process with lapin and sqlx directly, with messages of
//! the same size as the pipeline's job messages (the mean encoded size of the package's jobs,
//! ~1 KB) and N messages or rows each:
//! - confirmed publish msg/s: persistent messages to a durable quorum queue on a confirm-mode
//!   channel, up to 1,000 confirms outstanding (pipelined, as the coordinator publishes);
//! - acked consume msg/s: the same messages consumed with prefetch 1,000, one ack each;
//! - rows/s inserted into a table created `LIKE eval_results` (same columns, defaults, unique
//!   key and indexes), 500 rows per statement (`INSERT ... SELECT FROM UNNEST`, one commit per
//!   statement), and with one `COPY ... FROM STDIN (FORMAT csv)` of all N rows;
//! - publish + consume + insert jobs/s: a publisher task publishes N messages (confirmed,
//!   pipelined) while a consumer (prefetch 400) collects deliveries into batches of up to 200
//!   (or 20 ms), inserts one row per message in one statement, commits, then acks the batch
//!   (one `multiple` ack). Timed from the first publish to the last ack. This is the limit the
//!   pipeline's figures are divided by.
//!
//! **2. End to end**: a skill package of N cases with given outputs (runner `given`), 40 %
//! `exact_match`, 30 % `regex_match` (two patterns), 30 % `json_schema`, all passing, is
//! uploaded (`POST /v1/skills`) to the real coordinator and processed by 1, then 2 workers.
//! Coordinator and workers are **child processes**: this example re-run with `coordinator`
//! (`Application::build` + `run_until_stopped`, as `skilleval-coordinator serve` does) or
//! `worker` (`Worker::new` + `Worker::run`, as `skilleval-worker` does, without its HTTP
//! server), configured through the environment like the binaries, so each has its own RSS.
//! Each scenario starts a fresh coordinator and fresh workers (so `VmHWM` is that scenario's
//! peak), waits until every worker consumes, then times from the upload request to the
//! moment `GET /v1/runs/{id}` says `completed` (polled every 20 ms); the time at which its
//! counters first read complete, and the time the upload request took to answer (the package
//! validated and stored, the run's rows inserted, every job published and confirmed), are
//! printed too: they split the time into upload, processing and finalisation.
//! Latency is per case from `eval_results`: `updated_at - published_at`. Both are
//! `now()`, i.e. transaction start times: `published_at` is when the coordinator's release
//! transaction began (before the first publish of the run), `updated_at` when the worker's
//! batch transaction began (just before its one statement and commit). With the whole run
//! published at once, this is a burst: the latency is mostly queueing, and grows with N.
//! Peak RSS is `VmHWM` of each child from `/proc/<pid>/status`; CPU is user + system time of
//! each child over the run (100 % = one core), and the whole machine's busy share.
//!
//! Worker settings: `--concurrency` (the prefetch; default 256) and `--batch-size` (default
//! 200, as the raw limit), `batch_max_wait_ms` 20 (the default). With the shipped defaults
//! (concurrency 4, batches of 50) a worker holds at most 4 unacked jobs, so a batch never
//! holds more than 4 results and throughput is bounded by 4 per commit round trip.
//!
//! With `--repeat R` > 1, every figure printed at the end is the median of the R runs.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Cursor, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::{json, Value};
use skilleval::package::{Package, PackageLimits};
use skilleval::plan::{plan, CaseFilter};
use skilleval_infra::config::Settings;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Topology;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

/// Confirms outstanding at once when publishing (pipelined, bounded so memory stays flat).
const PUBLISH_WINDOW: usize = 1_000;
const CONSUME_PREFETCH: u16 = 1_000;
const INSERT_BATCH: usize = 500;
/// The combined limit's batch: rows committed per transaction before acking.
const COMBINED_BATCH: usize = 200;
const COMBINED_WAIT: Duration = Duration::from_millis(20);
/// How long a scenario may take before the benchmark gives up on it.
const RUN_TIMEOUT: Duration = Duration::from_secs(1_800);

// ---------------------------------------------------------------- options

#[derive(Debug, Clone)]
struct Options {
    cases: usize,
    workers: Vec<usize>,
    repeat: usize,
    concurrency: u16,
    batch_size: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        cases: 10_000,
        workers: vec![1, 2],
        repeat: 1,
        concurrency: 256,
        batch_size: 200,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cases" => o.cases = value()?.parse().context("--cases")?,
            "--repeat" => o.repeat = value()?.parse().context("--repeat")?,
            "--concurrency" => o.concurrency = value()?.parse().context("--concurrency")?,
            "--batch-size" => o.batch_size = value()?.parse().context("--batch-size")?,
            "--workers" => {
                o.workers = value()?
                    .split(',')
                    .map(|w| w.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .context("--workers takes a list like 1,2")?;
            }
            other => bail!("unknown argument `{other}`"),
        }
    }
    if o.cases == 0 || o.repeat == 0 || o.workers.is_empty() || o.workers.contains(&0) {
        bail!("--cases, --repeat and every --workers count must be at least 1");
    }
    Ok(o)
}

fn pg_base() -> String {
    std::env::var("SKILLEVAL_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

fn amqp_url() -> String {
    std::env::var("SKILLEVAL_BENCH_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

// ---------------------------------------------------------------- child processes

/// `coordinator`: the coordinator as its binary runs it; prints its port on stdout.
fn child_coordinator() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    skilleval_infra::telemetry::init(&settings.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = skilleval_coordinator::startup::Application::build(settings).await?;
        println!("{}", app.port());
        std::io::stdout().flush()?;
        app.run_until_stopped().await
    })
}

/// `worker`: the worker as `skilleval-worker` runs it (without the health/metrics server).
fn child_worker() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    skilleval_infra::telemetry::init(&settings.log)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::connect(&settings.database).await?;
        let worker = Arc::new(skilleval_worker::Worker::new(settings, store)?);
        // Killed by the parent at the end of its scenario; nothing to drain then.
        worker.run(CancellationToken::new()).await?;
        Ok(())
    })
}

/// A child process, killed when dropped (also when the benchmark fails half-way).
struct Proc {
    child: Child,
    pid: u32,
}

impl Proc {
    fn spawn(role: &str, env: &[(String, String)]) -> anyhow::Result<(Proc, Option<String>)> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.arg(role)
            .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
            .env("RUST_LOG", "warn")
            .env("SKILLEVAL_LOG_FORMAT", "text")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting the {role}"))?;
        let pid = child.id();
        let mut first_line = None;
        if role == "coordinator" {
            let stdout = child.stdout.take().context("coordinator stdout")?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if line.trim().is_empty() {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the coordinator did not start (see its error above)");
            }
            first_line = Some(line.trim().to_string());
        }
        Ok((Proc { child, pid }, first_line))
    }

    fn peak_rss_mib(&self) -> f64 {
        status_kib(self.pid, "VmHWM:").map_or(0.0, |kb| kb / 1024.0)
    }

    fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid).unwrap_or(0.0)
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU seconds of a process (clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// (busy, total) jiffies of the whole machine, from the first line of /proc/stat.
fn machine_jiffies() -> (u64, u64) {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return (0, 0);
    };
    let values: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().sum();
    // idle + iowait are not busy.
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

// ---------------------------------------------------------------- the environment

/// The benchmark's database and queue prefix; [`Env::cleanup`] removes both.
struct Env {
    db_name: String,
    db_url: String,
    prefix: String,
    raw_queue: String,
    store: Store,
}

impl Env {
    async fn create() -> anyhow::Result<Env> {
        let id = Uuid::new_v4().simple().to_string();
        let db_name = format!("skilleval_bench_{}", &id[..16]);
        let prefix = format!("bench{}", &id[..12]);
        let mut admin = PgConnection::connect(&format!("{}/postgres", pg_base()))
            .await
            .context("connecting to PostgreSQL's maintenance database")?;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db_name}\"")))
            .execute(&mut admin)
            .await
            .context("creating the benchmark database")?;
        let db_url = format!("{}/{db_name}", pg_base());
        let env = Env {
            raw_queue: format!("{prefix}.raw"),
            db_name,
            prefix,
            store: Store::connect_url(&db_url, 4).await?,
            db_url,
        };
        Ok(env)
    }

    /// Drops the database and deletes the raw queue and the prefix's topology. Errors are
    /// printed, not returned: cleanup must run to its end.
    async fn cleanup(&self) {
        self.store.pool().close().await;
        match PgConnection::connect(&format!("{}/postgres", pg_base())).await {
            Ok(mut admin) => {
                let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.db_name);
                if let Err(e) = sqlx::query(AssertSqlSafe(drop)).execute(&mut admin).await {
                    eprintln!("cleanup: dropping {}: {e}", self.db_name);
                }
            }
            Err(e) => eprintln!("cleanup: connecting to PostgreSQL: {e}"),
        }
        let deleted = async {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            let _ = ch
                .queue_delete(
                    ShortString::from(self.raw_queue.as_str()),
                    QueueDeleteOptions::default(),
                )
                .await;
            let topology = self.topology();
            // A topology never declared (the run failed before) makes a delete fail and closes
            // the channel: each object gets a fresh channel.
            for q in topology.queues() {
                let ch = conn.create_channel().await?;
                let _ = ch
                    .queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default())
                    .await;
            }
            for x in topology.exchanges() {
                let ch = conn.create_channel().await?;
                let _ = ch
                    .exchange_delete(ShortString::from(x.as_str()), Default::default())
                    .await;
            }
            let _ = conn.close(200, ShortString::from("bench done")).await;
            anyhow::Ok(())
        };
        if let Err(e) = deleted.await {
            eprintln!("cleanup: deleting the queues of {}: {e}", self.prefix);
        }
    }

    /// The topology the children declare (default retry tiers, this prefix).
    fn topology(&self) -> Topology {
        let mut settings = Settings::default();
        settings.amqp.prefix.clone_from(&self.prefix);
        Topology::from_settings(&settings)
    }

    /// The environment of a child process: this database and prefix, as the binaries read it.
    fn child_env(&self, opts: &Options, cache_dir: &std::path::Path) -> Vec<(String, String)> {
        [
            ("DATABASE_URL", self.db_url.clone()),
            ("AMQP_URL", amqp_url()),
            ("SKILLEVAL__AMQP__PREFIX", self.prefix.clone()),
            ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
            ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
            (
                "SKILLEVAL__WORKER__CONCURRENCY",
                opts.concurrency.to_string(),
            ),
            ("SKILLEVAL__WORKER__BATCH_SIZE", opts.batch_size.to_string()),
            (
                "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
                cache_dir.display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

// ---------------------------------------------------------------- the package

/// A skill package with `n` given-output cases: 40 % exact_match, 30 % regex_match, 30 %
/// json_schema, every one passing.
fn package_zip(name: &str, n: usize) -> anyhow::Result<Vec<u8>> {
    let schema = json!({
        "type": "object",
        "required": ["order", "status", "amount"],
        "properties": {
            "order": {"type": "integer", "minimum": 1},
            "status": {"type": "string", "enum": ["approved", "rejected", "pending"]},
            "amount": {"type": "number"},
            "note": {"type": "string", "maxLength": 200}
        },
        "additionalProperties": false
    });
    let cases: Vec<Value> = (0..n)
        .map(|i| {
            let order = 10_000 + i;
            let sentence = format!(
                "The refund for order {order} was approved; the money reaches your card within five business days."
            );
            let (expected, output, strategy) = match i % 10 {
                0..=3 => (json!({"output": sentence}), sentence, "exact_match"),
                4..=6 => (
                    json!({"patterns": [r"order \d+", r"(?i)business days"]}),
                    sentence,
                    "regex_match",
                ),
                _ => (
                    json!({"jsonSchema": schema}),
                    json!({"order": order, "status": "approved", "amount": 42.5, "note": "refunded to the card"})
                        .to_string(),
                    "json_schema",
                ),
            };
            json!({
                "id": format!("case-{i:06}"),
                "name": format!("refund {order}"),
                "input": {"prompt": format!("Was my refund for order {order} approved?")},
                "given": {"output": output},
                "expected": expected,
                "evaluation": {"strategy": strategy}
            })
        })
        .collect();
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {"runner": "given"},
        "testCases": cases
    });
    let skill = format!(
        "---\nname: {name}\ndescription: Answers refund questions, for the pipeline benchmark.\n---\n\n# Refunds\n\nAnswer in one sentence.\n"
    );
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    writer.start_file(format!("{name}/SKILL.md"), options)?;
    writer.write_all(skill.as_bytes())?;
    writer.start_file(format!("{name}/eval/tests.json"), options)?;
    writer.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(writer.finish()?.into_inner())
}

/// The mean size of the package's job messages, as the coordinator encodes them.
fn mean_job_bytes(zip: &[u8]) -> anyhow::Result<usize> {
    let package = Package::from_zip_bytes(zip, &PackageLimits::default(), None)?;
    let jobs = plan(
        &package.config,
        &package.content_hash,
        Uuid::now_v7(),
        &CaseFilter::default(),
        None,
    )?;
    let mut total = 0;
    for job in &jobs {
        total += skilleval_infra::messages::encode_job(job)?.len();
    }
    Ok(total / jobs.len().max(1))
}

// ---------------------------------------------------------------- 1. raw limits

#[derive(Debug, Clone, Copy, Default)]
struct Raw {
    publish: f64,
    consume: f64,
    insert: f64,
    copy: f64,
    combined: f64,
}

/// A JSON document of about `bytes` bytes (the message body and the `job` column).
fn payload(bytes: usize) -> Value {
    let skeleton =
        json!({"run_id": Uuid::nil(), "case": {"id": "case-000000", "input": {"prompt": ""}}});
    let pad = bytes.saturating_sub(skeleton.to_string().len()).max(1);
    json!({"run_id": Uuid::nil(), "case": {"id": "case-000000", "input": {"prompt": "x".repeat(pad)}}})
}

async fn amqp() -> anyhow::Result<Connection> {
    Ok(Connection::connect(&amqp_url(), ConnectionProperties::default()).await?)
}

async fn declare_quorum(ch: &Channel, queue: &str) -> anyhow::Result<()> {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    ch.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        args,
    )
    .await?;
    Ok(())
}

/// Publishes `n` persistent copies of `body` to `queue` with up to [`PUBLISH_WINDOW`] confirms
/// outstanding; fails on any nack.
async fn publish_confirmed(ch: &Channel, queue: &str, body: &[u8], n: usize) -> anyhow::Result<()> {
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= PUBLISH_WINDOW {
            check_confirm(pending.next().await)?;
        }
        let confirm = ch
            .basic_publish(
                ShortString::from(""),
                ShortString::from(queue),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        pending.push(confirm);
    }
    while !pending.is_empty() {
        check_confirm(pending.next().await)?;
    }
    Ok(())
}

fn check_confirm(c: Option<lapin::Result<Confirmation>>) -> anyhow::Result<()> {
    match c {
        Some(Ok(Confirmation::Ack(_))) => Ok(()),
        Some(Ok(other)) => bail!("the broker did not confirm a publish: {other:?}"),
        Some(Err(e)) => Err(e.into()),
        None => Ok(()),
    }
}

const RAW_COLUMNS: &str =
    "run_id, test_case_id, name, case_index, status, strategy, score, output, result, job";

/// Inserts rows `first..first + count` of `run_id` in one statement (its own commit, or the
/// caller's transaction).
async fn insert_rows(
    conn: &mut PgConnection,
    run_id: Uuid,
    first: usize,
    count: usize,
    job: &Value,
) -> anyhow::Result<()> {
    let mut ids = Vec::with_capacity(count);
    let mut idx = Vec::with_capacity(count);
    let mut outputs = Vec::with_capacity(count);
    let mut results = Vec::with_capacity(count);
    let mut jobs = Vec::with_capacity(count);
    for i in first..first + count {
        let output = format!("The refund for order {i} was approved; the money reaches your card within five business days.");
        results.push(json!({"status": "passed", "score": 1.0, "output": output, "duration_ms": 0}));
        ids.push(format!("case-{i:06}"));
        idx.push(i32::try_from(i)?);
        outputs.push(output);
        jobs.push(job.clone());
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO bench_raw ({RAW_COLUMNS})
         SELECT $1, t.id, t.id, t.idx, 'passed', 'exact_match', 1.0, t.output, t.result, t.job
         FROM UNNEST($2::text[], $3::int4[], $4::text[], $5::jsonb[], $6::jsonb[])
              AS t(id, idx, output, result, job)"
    )))
    .bind(run_id)
    .bind(&ids)
    .bind(&idx)
    .bind(&outputs)
    .bind(&results)
    .bind(&jobs)
    .execute(conn)
    .await?;
    Ok(())
}

fn csv_field(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

async fn raw_limits(env: &Env, n: usize, message_bytes: usize) -> anyhow::Result<Raw> {
    let body_json = payload(message_bytes);
    let body = serde_json::to_vec(&body_json)?;
    let conn = amqp().await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    declare_quorum(&ch, &env.raw_queue).await?;
    // A few hundred messages first, so the queue's leader and the connection are warm.
    publish_confirmed(&ch, &env.raw_queue, &body, 500).await?;
    ch.queue_purge(
        ShortString::from(env.raw_queue.as_str()),
        Default::default(),
    )
    .await?;

    let start = Instant::now();
    publish_confirmed(&ch, &env.raw_queue, &body, n).await?;
    let publish = n as f64 / start.elapsed().as_secs_f64();

    let consumer_ch = conn.create_channel().await?;
    consumer_ch
        .basic_qos(CONSUME_PREFETCH, BasicQosOptions::default())
        .await?;
    let start = Instant::now();
    let mut consumer = consumer_ch
        .basic_consume(
            ShortString::from(env.raw_queue.as_str()),
            ShortString::from("bench-raw"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    for _ in 0..n {
        let delivery = consumer
            .next()
            .await
            .context("the consumer ended early")??;
        delivery.ack(BasicAckOptions::default()).await?;
    }
    let consume = n as f64 / start.elapsed().as_secs_f64();
    consumer_ch.close(200, ShortString::from("done")).await?;

    let mut db = PgConnection::connect(&env.db_url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS bench_raw (LIKE eval_results INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)",
    )
    .execute(&mut db)
    .await?;
    sqlx::query("TRUNCATE bench_raw").execute(&mut db).await?;
    let run_id = Uuid::now_v7();
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let count = INSERT_BATCH.min(n - done);
        insert_rows(&mut db, run_id, done, count, &body_json).await?;
        done += count;
    }
    let insert = n as f64 / start.elapsed().as_secs_f64();

    let run_id = Uuid::now_v7();
    let job_csv = csv_field(&body_json.to_string());
    let start = Instant::now();
    let mut data = Vec::with_capacity(n * (body.len() + 400));
    for i in 0..n {
        let output = format!("The refund for order {i} was approved; the money reaches your card within five business days.");
        let result = json!({"status": "passed", "score": 1.0, "output": output, "duration_ms": 0});
        writeln!(
            data,
            "{run_id},case-{i:06},case-{i:06},{i},passed,exact_match,1.0,{},{},{job_csv}",
            csv_field(&output),
            csv_field(&result.to_string()),
        )?;
    }
    let mut copy = db
        .copy_in_raw(&format!(
            "COPY bench_raw ({RAW_COLUMNS}) FROM STDIN (FORMAT csv)"
        ))
        .await?;
    copy.send(data).await?;
    let copied = copy.finish().await?;
    let copy_rate = n as f64 / start.elapsed().as_secs_f64();
    if copied != n as u64 {
        bail!("COPY stored {copied} rows of {n}");
    }

    // Publish + consume + insert in batches of 200, ack after commit.
    sqlx::query("TRUNCATE bench_raw").execute(&mut db).await?;
    let run_id = Uuid::now_v7();
    let consumer_ch = conn.create_channel().await?;
    consumer_ch
        .basic_qos(
            u16::try_from(2 * COMBINED_BATCH)?,
            BasicQosOptions::default(),
        )
        .await?;
    let mut consumer = consumer_ch
        .basic_consume(
            ShortString::from(env.raw_queue.as_str()),
            ShortString::from("bench-combined"),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let start = Instant::now();
    let publisher = {
        let ch = ch.clone();
        let queue = env.raw_queue.clone();
        let body = body.clone();
        tokio::spawn(async move { publish_confirmed(&ch, &queue, &body, n).await })
    };
    let mut stored = 0;
    while stored < n {
        let first = consumer
            .next()
            .await
            .context("the consumer ended early")??;
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + COMBINED_WAIT;
        while batch.len() < COMBINED_BATCH && stored + batch.len() < n {
            match tokio::time::timeout_at(deadline, consumer.next()).await {
                Ok(Some(d)) => batch.push(d?),
                Ok(None) | Err(_) => break,
            }
        }
        let mut tx = db.begin().await?;
        insert_rows(&mut tx, run_id, stored, batch.len(), &body_json).await?;
        tx.commit().await?;
        stored += batch.len();
        if let Some(last) = batch.last() {
            last.ack(BasicAckOptions { multiple: true }).await?;
        }
    }
    let combined = n as f64 / start.elapsed().as_secs_f64();
    publisher.await??;
    consumer_ch.close(200, ShortString::from("done")).await?;
    ch.queue_delete(
        ShortString::from(env.raw_queue.as_str()),
        QueueDeleteOptions::default(),
    )
    .await?;
    let _ = conn.close(200, ShortString::from("done")).await;
    sqlx::query("DROP TABLE bench_raw").execute(&mut db).await?;
    Ok(Raw {
        publish,
        consume,
        insert,
        copy: copy_rate,
        combined,
    })
}

// ---------------------------------------------------------------- 2. end to end

#[derive(Debug, Clone, Copy, Default)]
struct E2e {
    /// Until the upload answered: validated, stored, the run's rows inserted, jobs published.
    upload_seconds: f64,
    seconds: f64,
    counters_seconds: f64,
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    coordinator_mib: f64,
    worker_mib: f64,
    coordinator_cpu: f64,
    worker_cpu: f64,
    machine_busy: f64,
}

async fn end_to_end(
    env: &Env,
    opts: &Options,
    workers: usize,
    scenario: usize,
) -> anyhow::Result<E2e> {
    let n = opts.cases;
    let name = format!("pipeline-bench-{scenario}");
    let zip = package_zip(&name, n)?;
    let cache = tempfile::tempdir()?;
    let child_env = env.child_env(opts, cache.path());
    let (coordinator, port) = Proc::spawn("coordinator", &child_env)?;
    let base = format!("http://127.0.0.1:{}", port.unwrap_or_default());
    let mut procs = Vec::with_capacity(workers);
    for _ in 0..workers {
        procs.push(Proc::spawn("worker", &child_env)?.0);
    }
    wait_for_consumers(env, workers, &mut procs).await?;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let cpu_before: Vec<f64> = procs.iter().map(Proc::cpu_seconds).collect();
    let coordinator_cpu_before = coordinator.cpu_seconds();
    let machine_before = machine_jiffies();
    let start = Instant::now();
    let response = http
        .post(format!("{base}/v1/skills"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    let status = response.status();
    let body: Value = response.json().await?;
    let upload_seconds = start.elapsed().as_secs_f64();
    if status.as_u16() != 201 {
        bail!("upload answered {status}: {body}");
    }
    let run_id = body["run_id"]
        .as_str()
        .context("the upload started no run")?
        .to_string();
    let mut counters_seconds = None;
    let seconds = loop {
        let run: Value = http
            .get(format!("{base}/v1/runs/{run_id}"))
            .send()
            .await?
            .json()
            .await?;
        let completed = run["counters"]["completed"].as_i64().unwrap_or(0);
        if counters_seconds.is_none() && completed >= i64::try_from(n)? {
            counters_seconds = Some(start.elapsed().as_secs_f64());
        }
        if run["status"] == "completed" {
            break start.elapsed().as_secs_f64();
        }
        if start.elapsed() > RUN_TIMEOUT {
            bail!("the run did not complete within {RUN_TIMEOUT:?}: {run}");
        }
        for p in &mut procs {
            if !p.alive() {
                bail!("a worker exited during the run");
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let machine_after = machine_jiffies();
    let worker_cpu = procs
        .iter()
        .zip(&cpu_before)
        .map(|(p, before)| p.cpu_seconds() - before)
        .sum::<f64>();
    let coordinator_cpu = coordinator.cpu_seconds() - coordinator_cpu_before;
    let coordinator_mib = coordinator.peak_rss_mib();
    let worker_mib = procs.iter().map(Proc::peak_rss_mib).fold(0.0, f64::max);
    drop(procs);
    drop(coordinator);

    let run_uuid: Uuid = run_id.parse()?;
    let (rows, passed, p50, p99): (i64, i64, Option<f64>, Option<f64>) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE status = 'passed'),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - published_at)::float8),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - published_at)::float8)
         FROM eval_results WHERE run_id = $1",
    )
    .bind(run_uuid)
    .fetch_one(env.store.pool())
    .await?;
    if rows != i64::try_from(n)? || passed != rows {
        bail!("the run has {rows} rows, {passed} passed; expected {n} passed");
    }
    #[allow(clippy::cast_precision_loss)]
    let busy = {
        let busy = machine_after.0.saturating_sub(machine_before.0) as f64;
        let total = machine_after.1.saturating_sub(machine_before.1) as f64;
        if total > 0.0 {
            busy / total
        } else {
            0.0
        }
    };
    Ok(E2e {
        upload_seconds,
        seconds,
        counters_seconds: counters_seconds.unwrap_or(seconds),
        rate: n as f64 / seconds,
        p50_ms: p50.unwrap_or(0.0) * 1000.0,
        p99_ms: p99.unwrap_or(0.0) * 1000.0,
        coordinator_mib,
        worker_mib,
        coordinator_cpu: coordinator_cpu / seconds,
        worker_cpu: worker_cpu / seconds,
        machine_busy: busy,
    })
}

/// Waits until `workers` consumers are on the jobs queue (the coordinator declared it).
async fn wait_for_consumers(env: &Env, workers: usize, procs: &mut [Proc]) -> anyhow::Result<()> {
    let conn = amqp().await?;
    let queue = env.topology().jobs_queue();
    let start = Instant::now();
    loop {
        let ch = conn.create_channel().await?;
        let declared = ch
            .queue_declare(
                ShortString::from(queue.as_str()),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await;
        if let Ok(q) = declared {
            if q.consumer_count() as usize >= workers {
                let _ = conn.close(200, ShortString::from("ready")).await;
                return Ok(());
            }
        }
        for p in procs.iter_mut() {
            if !p.alive() {
                bail!("a worker exited while starting (see its error above)");
            }
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("the workers did not start consuming within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------- driver

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> anyhow::Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("coordinator") => return child_coordinator(),
        Some("worker") => return child_worker(),
        _ => {}
    }
    let opts = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let env = Env::create().await?;
        // Whatever happens (an error, ctrl-c), the database and the queues go.
        let outcome = tokio::select! {
            r = bench(&env, &opts) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        env.cleanup().await;
        outcome
    })
}

async fn bench(env: &Env, opts: &Options) -> anyhow::Result<()> {
    env.store.migrate().await?;
    let n = opts.cases;
    let message_bytes = mean_job_bytes(&package_zip("pipeline-bench-size", n)?)?;
    println!(
        "pipeline_bench: N = {n}, workers {:?}, repeat {}, worker concurrency {} and batches of {}, {} cores, job messages {message_bytes} B on average",
        opts.workers,
        opts.repeat,
        opts.concurrency,
        opts.batch_size,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
    );
    let mut raws = Vec::new();
    let mut e2es: HashMap<usize, Vec<E2e>> = HashMap::new();
    let mut scenario = 0;
    for r in 1..=opts.repeat {
        let raw = raw_limits(env, n, message_bytes).await?;
        println!(
            "[run {r}] raw: publish {:.0} msg/s, consume {:.0} msg/s, insert (500/stmt) {:.0} rows/s, COPY {:.0} rows/s, publish+consume+insert (200/commit) {:.0} jobs/s",
            raw.publish, raw.consume, raw.insert, raw.copy, raw.combined
        );
        raws.push(raw);
        for &w in &opts.workers {
            scenario += 1;
            let e = end_to_end(env, opts, w, scenario).await?;
            println!(
                "[run {r}] {w} worker(s): {:.2} s upload-to-verdict (upload answered after {:.2} s, counters complete after {:.2} s), {:.0} cases/s = {:.2} x limit, latency p50 {:.0} ms p99 {:.0} ms, peak RSS coordinator {:.1} MiB, worker {:.1} MiB, CPU coordinator {:.0} %, workers {:.0} %, machine {:.0} % busy",
                e.seconds,
                e.upload_seconds,
                e.counters_seconds,
                e.rate,
                e.rate / raw.combined,
                e.p50_ms,
                e.p99_ms,
                e.coordinator_mib,
                e.worker_mib,
                100.0 * e.coordinator_cpu,
                100.0 * e.worker_cpu,
                100.0 * e.machine_busy,
            );
            e2es.entry(w).or_default().push(e);
        }
    }

    let m = |f: fn(&Raw) -> f64| median(raws.iter().map(f).collect());
    let limit = m(|r| r.combined);
    println!();
    println!(
        "raw limits (median of {}; N = {n}, {message_bytes} B messages):",
        opts.repeat
    );
    println!(
        "  confirmed publish, quorum queue     {:>9.0} msg/s",
        m(|r| r.publish)
    );
    println!(
        "  acked consume, quorum queue         {:>9.0} msg/s",
        m(|r| r.consume)
    );
    println!(
        "  INSERT, 500 rows per statement      {:>9.0} rows/s",
        m(|r| r.insert)
    );
    println!(
        "  COPY                                {:>9.0} rows/s",
        m(|r| r.copy)
    );
    println!(
        "  publish+consume+insert (200/commit) {:>9.0} jobs/s  (the limit)",
        limit
    );
    println!();
    println!(
        "end to end (median of {}; N = {n}; ratio = cases/s / publish+consume+insert limit):",
        opts.repeat
    );
    println!(
        "{:>7} {:>7} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>9} {:>9} {:>7} {:>7} {:>7}",
        "workers",
        "upload",
        "seconds",
        "counters",
        "cases/s",
        "ratio",
        "p50 ms",
        "p99 ms",
        "coord MiB",
        "wrkr MiB",
        "coord%",
        "wrkrs%",
        "busy%"
    );
    for &w in &opts.workers {
        let runs = e2es.get(&w).cloned().unwrap_or_default();
        let m = |f: fn(&E2e) -> f64| median(runs.iter().map(f).collect());
        let rate = m(|e| e.rate);
        println!(
            "{w:>7} {:>7.2} {:>9.2} {:>9.2} {rate:>9.0} {:>6.2} {:>8.0} {:>8.0} {:>9.1} {:>9.1} {:>7.0} {:>7.0} {:>7.0}",
            m(|e| e.upload_seconds),
            m(|e| e.seconds),
            m(|e| e.counters_seconds),
            rate / limit,
            m(|e| e.p50_ms),
            m(|e| e.p99_ms),
            m(|e| e.coordinator_mib),
            m(|e| e.worker_mib),
            100.0 * m(|e| e.coordinator_cpu),
            100.0 * m(|e| e.worker_cpu),
            100.0 * m(|e| e.machine_busy),
        );
    }
    Ok(())
}
