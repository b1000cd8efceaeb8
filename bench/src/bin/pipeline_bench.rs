//! Pipeline throughput (issue 5): the raw limits of this box, then the real pipeline, in one run.
//!
//! Run with
//! `cargo run --release -p skilleval-bench --bin pipeline_bench -- [--cases 10000]
//! [--workers 1,2] [--repeat 1] [--concurrency 256] [--batch-size 200]
//! [--endpoint-concurrency 16,128,512] [--endpoint-workers 1] [--endpoint-max-cases 20480]
//! [--skip-endpoint] [--paced-seconds 10] [--paced-run-cases 200] [--skip-paced]`.
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
//! validated and stored, the run and its plan committed: no row per case, nothing published
//! yet), are printed too: they split the time into upload, processing and finalisation.
//! Latency is per case from `eval_results`: `updated_at` (when the worker's batch transaction
//! that inserted the case's row began) minus the run's `created_at` (when the transaction that
//! committed the run and its plan began), both on the database's clock; the run is published
//! from then on, chunk by chunk (no per-row publish time is stored). With the whole run
//! published at once, this is a burst: the latency is mostly queueing, and grows with N.
//! Peak RSS is `VmHWM` of each child from `/proc/<pid>/status`; CPU is user + system time of
//! each child over the run (100 % = one core), of the local RabbitMQ (`beam.smp`) and
//! PostgreSQL (`postgres`) processes with their exited children (backends), and the whole
//! machine's busy share: where the two cores went.
//!
//! Worker settings: `--concurrency` (execution slots, default 256; the prefetch is twice that)
//! and `--batch-size` (default 200, as the raw limit), `batch_max_wait_ms` 20 (the default).
//! With the shipped defaults (concurrency 4, batches of 50) a worker holds at most 8 unacked
//! jobs, so a batch never holds more than 8 results and throughput is bounded by 8 per commit
//! round trip.
//!
//! **3. A 50 ms endpoint** (`--skip-endpoint` leaves it out): an OpenAI-compatible
//! chat-completions server (this example re-run as `serve`, axum on its own multi-threaded
//! runtime, started once for the whole benchmark) answers every request after a 50 ms
//! `tokio::time::sleep` with a valid completion, and counts the completions it served and the
//! most requests it had in flight. For each concurrency c of `--endpoint-concurrency`
//! (default 16, 128, 512), a fresh coordinator and `--endpoint-workers` fresh workers (one by
//! default) process a package of M cases with runner `llm` (one model call per case, the default
//! provider) graded by `regex_match` on the completion (nothing else calls the model); every
//! prompt carries the scenario's number, so the workers' shared response cache
//! (`llm_cache`, in the same database) never answers for the mock. The workers get the mock
//! through `SKILLEVAL__LLM__PROVIDERS_FILE` (a providers TOML with `max_concurrency` = c and
//! no rate limits) and `SKILLEVAL__WORKER__CONCURRENCY` = c. M = 40 × workers × c, at least
//! 2,000, at most `--endpoint-max-cases` (default 20,480). Timed as in 2 (upload to
//! `completed`); printed per level: cases/s, the ideal workers × c / 50 ms and the ratio to
//! it, the ratio to the given-output cases/s of the same number of workers measured earlier in
//! the same repeat (else of the largest number measured), the processing rate alone (cases /
//! (last `updated_at` - first publish), i.e. without storing the package and
//! inserting the run's rows) and its ratio to the ideal, peak RSS, CPU of the workers and
//! of the mock. Every case must pass and the mock must have served exactly M completions,
//! else the benchmark fails.
//!
//! **4. Paced latency** (`--skip-paced` leaves it out): with the largest worker count of
//! `--workers`, a package of `--paced-run-cases` (default 200) given-output cases (the same
//! 40/30/30 mix) is stored without a run (`POST /v1/skills?run=false`); one run of it is
//! processed to warm up (not measured); then a new run of it is created (`POST /v1/runs`
//! with its `version_id`) every `run cases / (0.5 × peak)` seconds for `--paced-seconds`
//! (default 10), where peak is the highest given-output cases/s of this repeat: the offered
//! load is 50 % of the peak rate. Requests are sent on schedule whether or not earlier ones
//! answered (open loop). Printed: offered and achieved cases/s (cases / time from the first
//! request to the last commit), the mean time `POST /v1/runs` took, and p50 / p99 / max of
//! `updated_at` - the publish time (as above) over every case of the paced runs.
//!
//! With `--repeat R` > 1, every figure printed at the end is the median of the R runs.

use std::collections::HashMap;
use std::io::{Cursor, Write};
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
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_infra::config::Settings;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Topology;
use skilleval_model::package::{Package, PackageLimits};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use skilleval_bench::cluster::{self, amqp_url, Proc};
use skilleval_bench::mock_provider::LATENCY;

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
    /// The 50 ms endpoint scenario (`--skip-endpoint` leaves it out).
    endpoint: bool,
    /// Worker concurrency (execution slots, so in-flight model calls) per endpoint level.
    endpoint_concurrency: Vec<u16>,
    endpoint_workers: usize,
    /// The most cases of one endpoint level.
    endpoint_max_cases: usize,
    /// The paced latency scenario (`--skip-paced` leaves it out).
    paced: bool,
    paced_seconds: f64,
    paced_run_cases: usize,
}

fn list<T: std::str::FromStr>(flag: &str, value: &str) -> anyhow::Result<Vec<T>> {
    value
        .split(',')
        .map(|w| w.trim().parse::<T>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("{flag} takes a list of whole numbers like 1,2"))
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        cases: 10_000,
        workers: vec![1, 2],
        repeat: 1,
        concurrency: 256,
        batch_size: 200,
        endpoint: true,
        endpoint_concurrency: vec![16, 128, 512],
        endpoint_workers: 1,
        endpoint_max_cases: 20_480,
        paced: true,
        paced_seconds: 10.0,
        paced_run_cases: 200,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--skip-endpoint" {
            o.endpoint = false;
            continue;
        }
        if flag == "--skip-paced" {
            o.paced = false;
            continue;
        }
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cases" => o.cases = value()?.parse().context("--cases")?,
            "--repeat" => o.repeat = value()?.parse().context("--repeat")?,
            "--concurrency" => o.concurrency = value()?.parse().context("--concurrency")?,
            "--batch-size" => o.batch_size = value()?.parse().context("--batch-size")?,
            "--workers" => o.workers = list(flag, value()?)?,
            "--endpoint-concurrency" => o.endpoint_concurrency = list(flag, value()?)?,
            "--endpoint-workers" => {
                o.endpoint_workers = value()?.parse().context("--endpoint-workers")?;
            }
            "--endpoint-max-cases" => {
                o.endpoint_max_cases = value()?.parse().context("--endpoint-max-cases")?;
            }
            "--paced-seconds" => o.paced_seconds = value()?.parse().context("--paced-seconds")?,
            "--paced-run-cases" => {
                o.paced_run_cases = value()?.parse().context("--paced-run-cases")?;
            }
            other => bail!("unknown argument `{other}`"),
        }
    }
    if o.cases == 0 || o.repeat == 0 || o.workers.is_empty() || o.workers.contains(&0) {
        bail!("--cases, --repeat and every --workers count must be at least 1");
    }
    if o.endpoint
        && (o.endpoint_workers == 0
            || o.endpoint_max_cases == 0
            || o.endpoint_concurrency.is_empty()
            || o.endpoint_concurrency.contains(&0))
    {
        bail!("--endpoint-workers, --endpoint-max-cases and every --endpoint-concurrency must be at least 1");
    }
    if o.paced && (o.paced_run_cases == 0 || o.paced_seconds.is_nan() || o.paced_seconds <= 0.0) {
        bail!("--paced-run-cases and --paced-seconds must be greater than 0");
    }
    Ok(o)
}

/// CPU seconds spent so far by the local RabbitMQ (`beam.smp`) and PostgreSQL (`postgres`)
/// server processes: user + system time of each, plus that of their exited children (the
/// postmaster reaps every backend that ends, so a backend's time is not lost when it exits).
/// The difference over a scenario says what the broker and the database cost it.
fn services_cpu_seconds() -> (f64, f64) {
    let (mut broker, mut database) = (0.0, 0.0);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return (0.0, 0.0);
    };
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let slot = match &stat[open + 1..close] {
            "beam.smp" => &mut broker,
            "postgres" => &mut database,
            _ => continue,
        };
        // After the name: state, ppid, ... utime (11), stime, cutime, cstime (14).
        let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        let ticks: f64 = (11..=14)
            .filter_map(|i| fields.get(i).and_then(|v| v.parse::<f64>().ok()))
            .sum();
        *slot += ticks / 100.0;
    }
    (broker, database)
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
        let prefix = format!("bench{}", &id[..12]);
        let (db_name, db_url) = cluster::create_database("skilleval_bench").await?;
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
        cluster::drop_database(&self.db_name).await;
        let deleted = async {
            let conn = Connection::connect(&amqp_url(), ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            let _ = ch
                .queue_delete(
                    ShortString::from(self.raw_queue.as_str()),
                    QueueDeleteOptions::default(),
                )
                .await;
            cluster::delete_topology(&conn, &self.topology()).await?;
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
    fn child_env(
        &self,
        opts: &Options,
        concurrency: u16,
        cache_dir: &std::path::Path,
    ) -> Vec<(String, String)> {
        [
            ("DATABASE_URL", self.db_url.clone()),
            ("AMQP_URL", amqp_url()),
            ("SKILLEVAL__AMQP__PREFIX", self.prefix.clone()),
            ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
            ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
            ("SKILLEVAL__WORKER__CONCURRENCY", concurrency.to_string()),
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
    zip_package(name, &tests)
}

/// A skill package of `n` cases whose output is the model (runner `llm`, the default
/// provider, one call per case) graded locally by `regex_match`, so the endpoint sees exactly
/// one request per case. `tag` goes into every prompt: the workers' response cache (shared
/// through PostgreSQL) is keyed by the prompt, and a level must not be answered by the
/// cache of an earlier one.
fn llm_package_zip(name: &str, n: usize, tag: &str) -> anyhow::Result<Vec<u8>> {
    let tests = cluster::llm_refund_tests(n, |i| {
        format!("Was my refund for order {} approved? ({tag})", 10_000 + i)
    });
    zip_package(name, &tests)
}

/// `{name}/SKILL.md` and `{name}/eval/tests.json`, deflated.
fn zip_package(name: &str, tests: &Value) -> anyhow::Result<Vec<u8>> {
    let skill = format!(
        "---\nname: {name}\ndescription: Answers refund questions, for the pipeline benchmark.\n---\n\n# Refunds\n\nAnswer in one sentence.\n"
    );
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    writer.start_file(format!("{name}/SKILL.md"), options)?;
    writer.write_all(skill.as_bytes())?;
    writer.start_file(format!("{name}/eval/tests.json"), options)?;
    writer.write_all(&serde_json::to_vec(tests)?)?;
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
/// outstanding; fails on any nack. Each message's frames are queued when its future is first
/// polled, before earlier ones are written (as the coordinator's publisher does): awaiting
/// each `basic_publish` before queueing the next would cost a hand-off to lapin's IO thread
/// per message.
async fn publish_confirmed(ch: &Channel, queue: &str, body: &[u8], n: usize) -> anyhow::Result<()> {
    let publish = || async {
        ch.basic_publish(
            ShortString::from(""),
            ShortString::from(queue),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await?
        .await
    };
    let mut pending = FuturesUnordered::new();
    for _ in 0..n {
        if pending.len() >= PUBLISH_WINDOW {
            check_confirm(pending.next().await)?;
        }
        pending.push(publish());
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
    /// Cases / (last commit - first publish), from `eval_results`: the processing alone,
    /// without storing the package and inserting the run's rows.
    process_rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    coordinator_mib: f64,
    worker_mib: f64,
    coordinator_cpu: f64,
    worker_cpu: f64,
    /// RabbitMQ's and PostgreSQL's CPU over the run (1.0 = one core).
    broker_cpu: f64,
    database_cpu: f64,
    machine_busy: f64,
}

/// The given-output scenario: `opts.cases` cases processed by `workers` workers.
async fn end_to_end(
    env: &Env,
    opts: &Options,
    workers: usize,
    scenario: usize,
) -> anyhow::Result<E2e> {
    let n = opts.cases;
    let zip = package_zip(&format!("pipeline-bench-{scenario}"), n)?;
    let cache = tempfile::tempdir()?;
    let child_env = env.child_env(opts, opts.concurrency, cache.path());
    measure_run(env, &child_env, &child_env, zip, n, workers).await
}

/// Starts a fresh coordinator (`coordinator_env`) and `workers` workers (`worker_env`), uploads
/// `zip` (`n` cases, run on upload) and times it to its verdict; checks that every case
/// passed.
async fn measure_run(
    env: &Env,
    coordinator_env: &[(String, String)],
    worker_env: &[(String, String)],
    zip: Vec<u8>,
    n: usize,
    workers: usize,
) -> anyhow::Result<E2e> {
    let (coordinator, base, mut procs) =
        start_cluster(env, coordinator_env, worker_env, workers).await?;

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let cpu_before: Vec<f64> = procs.iter().map(Proc::cpu_seconds).collect();
    let coordinator_cpu_before = coordinator.cpu_seconds();
    let machine_before = machine_jiffies();
    let services_before = services_cpu_seconds();
    let start = Instant::now();
    let response = http
        .post(format!("{base}/v1/skills"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    let body = cluster::expect_status(response, 201, "the upload").await?;
    let upload_seconds = start.elapsed().as_secs_f64();
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
    let services_after = services_cpu_seconds();
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
    let RowStats {
        rows,
        passed,
        p50,
        p99,
        span,
        ..
    } = row_stats(env, &[run_uuid]).await?;
    if rows != i64::try_from(n)? || passed != rows {
        let first: Option<(String, String, Option<Value>, Option<String>)> = sqlx::query_as(
            "SELECT test_case_id, status, error, output FROM eval_results
             WHERE run_id = $1 AND status <> 'passed' ORDER BY case_index LIMIT 1",
        )
        .bind(run_uuid)
        .fetch_optional(env.store.pool())
        .await?;
        bail!("the run has {rows} rows, {passed} passed; expected {n} passed (first other: {first:?})");
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
        process_rate: if span > 0.0 { n as f64 / span } else { 0.0 },
        p50_ms: p50 * 1000.0,
        p99_ms: p99 * 1000.0,
        coordinator_mib,
        worker_mib,
        coordinator_cpu: coordinator_cpu / seconds,
        worker_cpu: worker_cpu / seconds,
        broker_cpu: (services_after.0 - services_before.0) / seconds,
        database_cpu: (services_after.1 - services_before.1) / seconds,
        machine_busy: busy,
    })
}

/// A fresh coordinator (its base URL) and `workers` workers, once every worker consumes.
async fn start_cluster(
    env: &Env,
    coordinator_env: &[(String, String)],
    worker_env: &[(String, String)],
    workers: usize,
) -> anyhow::Result<(Proc, String, Vec<Proc>)> {
    let (coordinator, port) = Proc::spawn("coordinator", coordinator_env)?;
    let base = format!("http://127.0.0.1:{}", port.unwrap_or_default());
    let mut procs = Vec::with_capacity(workers);
    for _ in 0..workers {
        procs.push(Proc::spawn("worker", worker_env)?.0);
    }
    wait_for_consumers(env, workers, &mut procs).await?;
    Ok((coordinator, base, procs))
}

/// What the rows of some runs say: how many, how many passed, and publish-to-commit latency
/// (`updated_at` - the publish time, seconds): p50, p99, max, and first publish to last commit.
struct RowStats {
    rows: i64,
    passed: i64,
    p50: f64,
    p99: f64,
    max: f64,
    span: f64,
}

async fn row_stats(env: &Env, run_ids: &[Uuid]) -> anyhow::Result<RowStats> {
    let (rows, passed, p50, p99, max, span): (
        i64,
        i64,
        Option<f64>,
        Option<f64>,
        Option<f64>,
        Option<f64>,
    ) = sqlx::query_as(
        "WITH r AS (
             SELECT e.status, e.updated_at, r.created_at AS sent
             FROM eval_results e JOIN runs r ON r.id = e.run_id WHERE e.run_id = ANY($1)
         )
         SELECT count(*), count(*) FILTER (WHERE status = 'passed'),
                percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - sent)::float8),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM updated_at - sent)::float8),
                max(extract(epoch FROM updated_at - sent)::float8),
                extract(epoch FROM max(updated_at) - min(sent))::float8
         FROM r",
    )
    .bind(run_ids)
    .fetch_one(env.store.pool())
    .await?;
    Ok(RowStats {
        rows,
        passed,
        p50: p50.unwrap_or(0.0),
        p99: p99.unwrap_or(0.0),
        max: max.unwrap_or(0.0),
        span: span.unwrap_or(0.0),
    })
}

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

// ---------------------------------------------------------------- 3. the 50 ms endpoint

/// The endpoint scenario runs about this many cases per model call slot
/// (workers × concurrency), at least [`ENDPOINT_MIN_CASES`], at most `--endpoint-max-cases`.
const ENDPOINT_CASES_PER_SLOT: usize = 40;
const ENDPOINT_MIN_CASES: usize = 2_000;

/// The mock provider process (killed when dropped).
struct Mock {
    proc: Proc,
    addr: String,
    http: reqwest::Client,
}

impl Mock {
    fn start() -> anyhow::Result<Mock> {
        let (proc, addr) = Proc::spawn("serve", &[])?;
        Ok(Mock {
            proc,
            addr: addr.context("the mock provider printed no address")?,
            http: reqwest::Client::new(),
        })
    }

    /// (completions served so far, most in flight at once since the last call).
    async fn stats(&self) -> anyhow::Result<(u64, u64)> {
        let v: Value = self
            .http
            .get(format!("http://{}/stats", self.addr))
            .send()
            .await?
            .json()
            .await?;
        Ok((
            v["served"].as_u64().context("served")?,
            v["peak"].as_u64().context("peak")?,
        ))
    }

    /// The mean of 20 sequential bare requests: the round trip the mock actually achieves.
    async fn round_trip(&self) -> anyhow::Result<f64> {
        let url = format!("http://{}/v1/chat/completions", self.addr);
        let body = json!({"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]});
        self.http
            .post(&url)
            .json(&body)
            .send()
            .await?
            .bytes()
            .await?;
        let start = Instant::now();
        for _ in 0..20 {
            self.http
                .post(&url)
                .json(&body)
                .send()
                .await?
                .bytes()
                .await?;
        }
        Ok(start.elapsed().as_secs_f64() / 20.0)
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct EndpointRun {
    cases: usize,
    e: E2e,
    /// workers × concurrency / 50 ms.
    ideal: f64,
    /// The given-output cases/s of the same repeat it is compared with (0: none).
    given_rate: f64,
    given_workers: usize,
    /// The most requests the mock had in flight at once.
    in_flight: u64,
    /// The mock's CPU over the run (1.0 = one core).
    mock_cpu: f64,
}

/// One level of the endpoint scenario: `opts.endpoint_workers` workers with `concurrency`
/// jobs (and model calls) in flight each, against the mock.
async fn endpoint(
    env: &Env,
    opts: &Options,
    mock: &Mock,
    concurrency: u16,
    scenario: usize,
) -> anyhow::Result<EndpointRun> {
    let workers = opts.endpoint_workers;
    let cases = (ENDPOINT_CASES_PER_SLOT * usize::from(concurrency) * workers)
        .max(ENDPOINT_MIN_CASES)
        .min(opts.endpoint_max_cases);
    let zip = llm_package_zip(
        &format!("pipeline-bench-llm-{scenario}"),
        cases,
        &format!("scenario {scenario}"),
    )?;
    let config = tempfile::tempdir()?;
    let providers = config.path().join("providers.toml");
    std::fs::write(
        &providers,
        format!(
            "default = \"mock\"\n[providers.mock]\nkind = \"openai\"\nbase_url = \"http://{}/v1\"\nmodel = \"mock-model\"\nmax_concurrency = {concurrency}\n",
            mock.addr
        ),
    )?;
    let cache = tempfile::tempdir()?;
    let coordinator_env = env.child_env(opts, concurrency, cache.path());
    let mut worker_env = coordinator_env.clone();
    worker_env.push((
        "SKILLEVAL__LLM__PROVIDERS_FILE".into(),
        providers.display().to_string(),
    ));
    let (served_before, _) = mock.stats().await?;
    let mock_cpu_before = mock.proc.cpu_seconds();
    let e = measure_run(env, &coordinator_env, &worker_env, zip, cases, workers).await?;
    let mock_cpu = mock.proc.cpu_seconds() - mock_cpu_before;
    let (served_after, in_flight) = mock.stats().await?;
    let served = served_after - served_before;
    if served != u64::try_from(cases)? {
        bail!("the mock served {served} completions for {cases} cases: expected one each");
    }
    #[allow(clippy::cast_precision_loss)]
    let ideal = (workers * usize::from(concurrency)) as f64 / LATENCY.as_secs_f64();
    Ok(EndpointRun {
        cases,
        e,
        ideal,
        given_rate: 0.0,
        given_workers: 0,
        in_flight,
        mock_cpu: mock_cpu / e.seconds,
    })
}

// ---------------------------------------------------------------- 4. paced latency

#[derive(Debug, Clone, Copy, Default)]
struct Paced {
    workers: usize,
    runs: usize,
    cases: usize,
    interval_ms: f64,
    /// Cases/s offered: run size / interval.
    offered: f64,
    /// Cases/s committed: cases / (first create request to last commit).
    achieved: f64,
    /// Mean time `POST /v1/runs` took to answer.
    create_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// `POST /v1/runs` of a stored version: (run id, seconds to answer).
async fn create_run(
    http: &reqwest::Client,
    base: &str,
    version_id: &str,
) -> anyhow::Result<(Uuid, f64)> {
    let start = Instant::now();
    let response = http
        .post(format!("{base}/v1/runs"))
        .json(&json!({ "version_id": version_id }))
        .send()
        .await?;
    let body = cluster::expect_status(response, 202, "POST /v1/runs").await?;
    let seconds = start.elapsed().as_secs_f64();
    let run_id = body["run_id"]
        .as_str()
        .context("POST /v1/runs answered no run_id")?
        .parse()?;
    Ok((run_id, seconds))
}

/// Waits until `expected` result rows of `run_ids` are committed.
async fn wait_committed(
    env: &Env,
    run_ids: &[Uuid],
    expected: usize,
    procs: &mut [Proc],
) -> anyhow::Result<()> {
    let start = Instant::now();
    let expected = i64::try_from(expected)?;
    loop {
        let (done,): (i64,) =
            sqlx::query_as("SELECT count(*) FROM eval_results WHERE run_id = ANY($1)")
                .bind(run_ids)
                .fetch_one(env.store.pool())
                .await?;
        if done >= expected {
            return Ok(());
        }
        if start.elapsed() > RUN_TIMEOUT {
            bail!("{done} of {expected} results committed after {RUN_TIMEOUT:?}");
        }
        for p in procs.iter_mut() {
            if !p.alive() {
                bail!("a worker exited during the run");
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs of `opts.paced_run_cases` given-output cases (the same 40/30/30 mix) created
/// (`POST /v1/runs` of one stored version) at a fixed interval, so that `offered` cases/s
/// arrive for `opts.paced_seconds`; each request is sent on its schedule whether or not
/// the previous ones answered (open loop). Latency per case: `updated_at` - the publish time.
async fn paced(
    env: &Env,
    opts: &Options,
    workers: usize,
    offered: f64,
    scenario: usize,
) -> anyhow::Result<Paced> {
    let per_run = opts.paced_run_cases;
    #[allow(clippy::cast_precision_loss)]
    let interval = per_run as f64 / offered;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let runs = ((opts.paced_seconds / interval).round() as usize).max(1);
    let zip = package_zip(&format!("pipeline-bench-paced-{scenario}"), per_run)?;
    let cache = tempfile::tempdir()?;
    let child_env = env.child_env(opts, opts.concurrency, cache.path());
    let (coordinator, base, mut procs) =
        start_cluster(env, &child_env, &child_env, workers).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;

    // Store the version without running it.
    let version_id = cluster::upload_version(&http, &base, zip).await?;

    // One run first, not measured: the workers fetch and extract the package, pools warm up.
    let (warm_up, _) = create_run(&http, &base, &version_id).await?;
    wait_committed(env, &[warm_up], per_run, &mut procs).await?;

    let start = tokio::time::Instant::now();
    let mut requests = Vec::with_capacity(runs);
    for k in 0..runs {
        #[allow(clippy::cast_precision_loss)]
        let at = start + Duration::from_secs_f64(interval * k as f64);
        tokio::time::sleep_until(at).await;
        let http = http.clone();
        let base = base.clone();
        let version_id = version_id.clone();
        requests.push(tokio::spawn(async move {
            create_run(&http, &base, &version_id).await
        }));
    }
    let mut run_ids = Vec::with_capacity(runs);
    let mut create_seconds = 0.0;
    for request in requests {
        let (run_id, seconds) = request.await??;
        run_ids.push(run_id);
        create_seconds += seconds;
    }
    let cases = runs * per_run;
    wait_committed(env, &run_ids, cases, &mut procs).await?;
    let elapsed = start.elapsed().as_secs_f64();
    drop(procs);
    drop(coordinator);

    let RowStats {
        rows,
        passed,
        p50,
        p99,
        max,
        ..
    } = row_stats(env, &run_ids).await?;
    if rows != i64::try_from(cases)? || passed != rows {
        bail!("the paced runs have {rows} rows, {passed} passed; expected {cases} passed");
    }
    Ok(Paced {
        workers,
        runs,
        cases,
        interval_ms: interval * 1000.0,
        offered: per_run as f64 / interval,
        achieved: cases as f64 / elapsed,
        create_ms: create_seconds * 1000.0 / runs as f64,
        p50_ms: p50 * 1000.0,
        p99_ms: p99 * 1000.0,
        max_ms: max * 1000.0,
    })
}

// ---------------------------------------------------------------- driver

/// One column of a printed figures table: its header, width, decimals and how a row's value
/// is computed.
struct Col<'a, R> {
    head: &'static str,
    width: usize,
    decimals: usize,
    value: Box<dyn Fn(&R) -> f64 + 'a>,
}

impl<'a, R> Col<'a, R> {
    fn new(
        head: &'static str,
        width: usize,
        decimals: usize,
        value: impl Fn(&R) -> f64 + 'a,
    ) -> Self {
        Col {
            head,
            width,
            decimals,
            value: Box::new(value),
        }
    }
}

/// Prints a header line, then one right-aligned line per row.
fn print_table<R>(cols: &[Col<'_, R>], rows: &[R]) {
    let line =
        |cell: &dyn Fn(&Col<'_, R>) -> String| cols.iter().map(cell).collect::<Vec<_>>().join(" ");
    println!("{}", line(&|c| format!("{:>w$}", c.head, w = c.width)));
    for row in rows {
        println!(
            "{}",
            line(&|c| format!("{:>w$.d$}", (c.value)(row), w = c.width, d = c.decimals))
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
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
    let mock = if opts.endpoint {
        let mock = Mock::start()?;
        println!(
            "mock provider on {}: answers after {} ms (one bare sequential round trip: {:.1} ms); endpoint levels {:?} per worker, {} worker(s)",
            mock.addr,
            LATENCY.as_millis(),
            mock.round_trip().await? * 1000.0,
            opts.endpoint_concurrency,
            opts.endpoint_workers,
        );
        Some(mock)
    } else {
        None
    };
    let paced_workers = opts.workers.iter().copied().max().unwrap_or(1);
    let mut raws = Vec::new();
    let mut e2es: HashMap<usize, Vec<E2e>> = HashMap::new();
    let mut endpoints: HashMap<u16, Vec<EndpointRun>> = HashMap::new();
    let mut paceds: Vec<Paced> = Vec::new();
    let mut scenario = 0;
    for r in 1..=opts.repeat {
        let mut given: Vec<(usize, f64)> = Vec::new();
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
                "[run {r}] {w} worker(s): {:.2} s upload-to-verdict (upload answered after {:.2} s, counters complete after {:.2} s), {:.0} cases/s = {:.2} x limit, latency p50 {:.0} ms p99 {:.0} ms, peak RSS coordinator {:.1} MiB, worker {:.1} MiB, CPU coordinator {:.0} %, workers {:.0} %, RabbitMQ {:.0} %, PostgreSQL {:.0} %, machine {:.0} % busy",
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
                100.0 * e.broker_cpu,
                100.0 * e.database_cpu,
                100.0 * e.machine_busy,
            );
            given.push((w, e.rate));
            e2es.entry(w).or_default().push(e);
        }
        // The given-output rate the endpoint is compared with: the same number of workers,
        // else the largest number measured.
        let reference = given
            .iter()
            .find(|(w, _)| *w == opts.endpoint_workers)
            .or_else(|| given.iter().max_by_key(|(w, _)| *w))
            .copied()
            .unwrap_or_default();
        if let Some(mock) = &mock {
            for &c in &opts.endpoint_concurrency {
                scenario += 1;
                let mut run = endpoint(env, opts, mock, c, scenario).await?;
                run.given_workers = reference.0;
                run.given_rate = reference.1;
                let e = &run.e;
                println!(
                    "[run {r}] endpoint, concurrency {c} x {} worker(s): {} cases in {:.2} s upload-to-verdict (upload answered after {:.2} s), {:.0} cases/s, ideal {:.0} = {:.2} x ideal, {:.2} x the given-output rate ({:.0} cases/s, {} worker(s)); first publish to last commit {:.0} cases/s = {:.2} x ideal; mock served {} completions, at most {} in flight; peak RSS coordinator {:.1} MiB, worker {:.1} MiB, CPU workers {:.0} %, mock {:.0} %, machine {:.0} % busy",
                    opts.endpoint_workers,
                    run.cases,
                    e.seconds,
                    e.upload_seconds,
                    e.rate,
                    run.ideal,
                    e.rate / run.ideal,
                    e.rate / run.given_rate,
                    run.given_rate,
                    run.given_workers,
                    e.process_rate,
                    e.process_rate / run.ideal,
                    run.cases,
                    run.in_flight,
                    e.coordinator_mib,
                    e.worker_mib,
                    100.0 * e.worker_cpu,
                    100.0 * run.mock_cpu,
                    100.0 * e.machine_busy,
                );
                endpoints.entry(c).or_default().push(run);
            }
        }
        if opts.paced {
            let peak = given.iter().map(|(_, rate)| *rate).fold(0.0, f64::max);
            scenario += 1;
            let p = paced(env, opts, paced_workers, 0.5 * peak, scenario).await?;
            println!(
                "[run {r}] paced, {} worker(s): {} runs of {} cases every {:.0} ms for {:.1} s, offered {:.0} cases/s (50 % of the peak given-output rate {peak:.0}), achieved {:.0} cases/s, POST /v1/runs answered in {:.1} ms on average; publish-to-commit latency p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
                p.workers,
                p.runs,
                opts.paced_run_cases,
                p.interval_ms,
                p.interval_ms * p.runs as f64 / 1000.0,
                p.offered,
                p.achieved,
                p.create_ms,
                p.p50_ms,
                p.p99_ms,
                p.max_ms,
            );
            paceds.push(p);
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
    let e2e_rows: Vec<(usize, Vec<E2e>)> = opts
        .workers
        .iter()
        .map(|&w| (w, e2es.get(&w).cloned().unwrap_or_default()))
        .collect();
    let med = |f: fn(&E2e) -> f64| {
        move |(_, runs): &(usize, Vec<E2e>)| median(runs.iter().map(f).collect())
    };
    let cpu = |f: fn(&E2e) -> f64| move |row: &(usize, Vec<E2e>)| 100.0 * med(f)(row);
    #[allow(clippy::cast_precision_loss)]
    print_table(
        &[
            Col::new("workers", 7, 0, |(w, _): &(usize, Vec<E2e>)| *w as f64),
            Col::new("upload", 7, 2, med(|e| e.upload_seconds)),
            Col::new("seconds", 9, 2, med(|e| e.seconds)),
            Col::new("counters", 9, 2, med(|e| e.counters_seconds)),
            Col::new("cases/s", 9, 0, med(|e| e.rate)),
            Col::new("ratio", 6, 2, move |row| med(|e| e.rate)(row) / limit),
            Col::new("p50 ms", 8, 0, med(|e| e.p50_ms)),
            Col::new("p99 ms", 8, 0, med(|e| e.p99_ms)),
            Col::new("coord MiB", 9, 1, med(|e| e.coordinator_mib)),
            Col::new("wrkr MiB", 9, 1, med(|e| e.worker_mib)),
            Col::new("coord%", 7, 0, cpu(|e| e.coordinator_cpu)),
            Col::new("wrkrs%", 7, 0, cpu(|e| e.worker_cpu)),
            Col::new("rmq%", 7, 0, cpu(|e| e.broker_cpu)),
            Col::new("pg%", 7, 0, cpu(|e| e.database_cpu)),
            Col::new("busy%", 7, 0, cpu(|e| e.machine_busy)),
        ],
        &e2e_rows,
    );
    if mock.is_some() {
        let given_workers = endpoints
            .values()
            .flatten()
            .map(|e| e.given_workers)
            .next()
            .unwrap_or(0);
        println!();
        println!(
            "50 ms endpoint (median of {}; {} worker(s); ideal = workers x concurrency / 50 ms; vs given = cases/s / given-output cases/s of {given_workers} worker(s) in the same run; proc c/s = cases / (last commit - first publish)):",
            opts.repeat, opts.endpoint_workers
        );
        type Row = (u16, Vec<EndpointRun>);
        let rows: Vec<Row> = opts
            .endpoint_concurrency
            .iter()
            .map(|&c| (c, endpoints.get(&c).cloned().unwrap_or_default()))
            .collect();
        let med = |f: fn(&EndpointRun) -> f64| {
            move |(_, runs): &Row| median(runs.iter().map(f).collect())
        };
        #[allow(clippy::cast_precision_loss)]
        print_table(
            &[
                Col::new("concurrency", 11, 0, |(c, _): &Row| f64::from(*c)),
                Col::new("cases", 6, 0, |(_, runs): &Row| {
                    runs.first().map_or(0.0, |e| e.cases as f64)
                }),
                Col::new("upload", 7, 2, med(|e| e.e.upload_seconds)),
                Col::new("seconds", 9, 2, med(|e| e.e.seconds)),
                Col::new("cases/s", 9, 0, med(|e| e.e.rate)),
                Col::new("ideal", 8, 0, med(|e| e.ideal)),
                Col::new("ratio", 6, 2, med(|e| e.e.rate / e.ideal)),
                Col::new("vs given", 8, 2, med(|e| e.e.rate / e.given_rate)),
                Col::new("proc c/s", 9, 0, med(|e| e.e.process_rate)),
                Col::new("ratio", 6, 2, med(|e| e.e.process_rate / e.ideal)),
                Col::new("in flight", 9, 0, med(|e| e.in_flight as f64)),
                Col::new("coord MiB", 9, 1, med(|e| e.e.coordinator_mib)),
                Col::new("wrkr MiB", 9, 1, med(|e| e.e.worker_mib)),
                Col::new("wrkrs%", 7, 0, move |row| {
                    100.0 * med(|e| e.e.worker_cpu)(row)
                }),
                Col::new("mock%", 7, 0, move |row| 100.0 * med(|e| e.mock_cpu)(row)),
            ],
            &rows,
        );
    }
    if opts.paced {
        let m = |f: fn(&Paced) -> f64| median(paceds.iter().map(f).collect());
        println!();
        println!(
            "paced latency (median of {}; {paced_workers} worker(s); runs of {} cases created at 50 % of the peak given-output rate of the run; latency = updated_at - the run's creation (committed, then published)):",
            opts.repeat, opts.paced_run_cases
        );
        let one = [()];
        let med = |f: fn(&Paced) -> f64| move |_: &()| m(f);
        #[allow(clippy::cast_precision_loss)]
        print_table(
            &[
                Col::new("runs", 7, 0, med(|p| p.runs as f64)),
                Col::new("cases", 7, 0, med(|p| p.cases as f64)),
                Col::new("interval ms", 11, 1, med(|p| p.interval_ms)),
                Col::new("offered", 9, 0, med(|p| p.offered)),
                Col::new("achieved", 9, 0, med(|p| p.achieved)),
                Col::new("create ms", 9, 1, med(|p| p.create_ms)),
                Col::new("p50 ms", 8, 0, med(|p| p.p50_ms)),
                Col::new("p99 ms", 8, 0, med(|p| p.p99_ms)),
                Col::new("max ms", 8, 0, med(|p| p.max_ms)),
            ],
            &one,
        );
    }
    Ok(())
}
