//! What a replicated broker costs (issue 32): the pipeline against one RabbitMQ node and
//! against a three-node cluster, in the same run on this machine, and the time from the loss
//! of a node until a run makes progress again.
//!
//! Run with
//! `cargo run --release -p skilleval-bench --bin cluster_bench -- [--cases 5000] [--workers 2]
//! [--concurrency 128] [--repeat 2] [--recoveries 3]`.
//!
//! Both brokers are private nodes of Debian's rabbitmq-server started by this program
//! (`skilleval_test_support::cluster`, the same configuration): one node alone, then three
//! clustered. Against each, a coordinator and `--workers` workers run as child processes (this
//! program re-run with a role, as `pipeline_bench` does), with every queue a quorum queue
//! (`amqp.replicated_queues`): one member on the single node, three on the cluster, where each
//! message is written by a majority before it is confirmed. Each measured run uploads a package
//! of `--cases` cases with given outputs (runner `given`, `exact_match`) and is timed from the
//! upload request until `GET /v1/runs/{id}` says `completed`; cases/s is cases over that time.
//!
//! **Recovery** (the cluster only): a run of `--cases` cases is started; once a fifth of it is
//! recorded, the node leading the jobs queue is killed with SIGKILL. Printed: the time until
//! the run's recorded count first moves again, and until it passes the count at the kill plus
//! every job the workers could have held unacknowledged then (workers × prefetch): past that,
//! the cases recorded were delivered after the loss, so the pipeline is running again. The node
//! is then started again (and the run finishes) before the next recovery.
//!
//! Needs the local PostgreSQL (`SKILLEVAL_BENCH_PG`) and Debian's rabbitmq-server installed
//! (the machine's own node is not used). The databases and nodes are removed at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use lapin::options::QueueDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use serde_json::{json, Value};
use skilleval_bench::cluster::{self, Proc};
use skilleval_test_support::cluster::RabbitCluster;
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;

struct Options {
    cases: usize,
    workers: usize,
    concurrency: u16,
    repeat: usize,
    recoveries: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        cases: 5_000,
        workers: 2,
        concurrency: 128,
        repeat: 2,
        recoveries: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let n: u64 = value
            .parse()
            .with_context(|| format!("{flag}: `{value}` is not a whole number"))?;
        match flag.as_str() {
            "--cases" => o.cases = usize::try_from(n)?.max(100),
            "--workers" => o.workers = usize::try_from(n)?.max(1),
            "--concurrency" => o.concurrency = u16::try_from(n)?.max(1),
            "--repeat" => o.repeat = usize::try_from(n)?.max(1),
            "--recoveries" => o.recoveries = usize::try_from(n)?,
            other => bail!("unknown flag {other} (see the comment at the top of cluster_bench.rs)"),
        }
    }
    Ok(o)
}

/// A package of `n` cases whose outputs are given and pass.
fn package_zip(n: usize) -> anyhow::Result<Vec<u8>> {
    use std::io::Write as _;
    let cases: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "id": format!("tc-{i:05}"),
                "input": { "prompt": format!("say ok ({i})") },
                "expected": { "output": "ok" },
                "given": { "output": "ok" },
                "evaluation": { "strategy": "exact_match" }
            })
        })
        .collect();
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": { "runner": "given" },
        "testCases": cases,
    });
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    writer.start_file("cluster-bench/SKILL.md", options)?;
    writer.write_all(
        b"---\nname: cluster-bench\ndescription: Says ok, for the cluster benchmark.\n---\n\nSay ok.\n",
    )?;
    writer.start_file("cluster-bench/eval/tests.json", options)?;
    writer.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(writer.finish()?.into_inner())
}

/// A coordinator and workers against one broker, with their own database.
struct Service {
    cluster: Arc<RabbitCluster>,
    db_name: String,
    db: PgConnection,
    base: String,
    http: reqwest::Client,
    coordinator: Proc,
    workers: Vec<Proc>,
}

const PREFIX: &str = "bench";

impl Service {
    async fn start(nodes: usize, o: &Options) -> anyhow::Result<Service> {
        let cluster = tokio::task::spawn_blocking(move || RabbitCluster::start(nodes))
            .await
            .context("starting the RabbitMQ node(s)")?;
        let cluster = Arc::new(cluster);
        let (db_name, db_url) = cluster::create_database("skilleval_cluster_bench").await?;
        let env: Vec<(String, String)> = [
            ("DATABASE_URL", db_url.clone()),
            ("AMQP_URL", cluster.urls()),
            ("SKILLEVAL__AMQP__PREFIX", PREFIX.to_string()),
            ("SKILLEVAL__AMQP__REPLICATED_QUEUES", "true".to_string()),
            ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".to_string()),
            (
                "SKILLEVAL__COORDINATOR__SWEEP_INTERVAL_SECS",
                "1".to_string(),
            ),
            (
                "SKILLEVAL__COORDINATOR__PUBLISH_GRACE_SECS",
                "2".to_string(),
            ),
            ("SKILLEVAL__WORKER__HTTP_PORT", "0".to_string()),
            ("SKILLEVAL__WORKER__CONCURRENCY", o.concurrency.to_string()),
            ("SKILLEVAL__WORKER__BATCH_SIZE", "200".to_string()),
            (
                "SKILLEVAL__WORKER__MAX_RECONNECT_ATTEMPTS",
                "100".to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let (coordinator, port) = Proc::spawn("coordinator", &env)?;
        let base = format!(
            "http://127.0.0.1:{}",
            port.context("the coordinator printed no port")?
        );
        let mut workers = Vec::new();
        for _ in 0..o.workers {
            workers.push(Proc::spawn("worker", &env)?.0);
        }
        let db = PgConnection::connect(&db_url).await?;
        let service = Service {
            cluster,
            db_name,
            db,
            base,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()?,
            coordinator,
            workers,
        };
        service.wait_for_consumers(o.workers).await?;
        Ok(service)
    }

    /// Until the jobs queue has a consumer per worker (as node 0 answers).
    async fn wait_for_consumers(&self, workers: usize) -> anyhow::Result<()> {
        let url = self.cluster.nodes[0].url();
        let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ch = conn.create_channel().await?;
            let q = ch
                .queue_declare(
                    ShortString::from(format!("{PREFIX}.jobs")),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await;
            if let Ok(q) = q {
                if usize::try_from(q.consumer_count())? >= workers {
                    let _ = conn.close(200, "ok".into()).await;
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("the workers did not all consume within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Uploads a package of `n` cases (and runs it); the run's id.
    async fn upload(&self, n: usize) -> anyhow::Result<Uuid> {
        let response = self
            .http
            .post(format!("{}/v1/skills", self.base))
            .header("Content-Type", "application/zip")
            .body(package_zip(n)?)
            .send()
            .await?;
        let body = cluster::expect_status(response, 201, "the upload").await?;
        body["run_id"]
            .as_str()
            .context("the upload answered no run_id")?
            .parse()
            .context("run_id")
    }

    async fn completed(&mut self, run_id: Uuid) -> anyhow::Result<(i32, i32)> {
        Ok(
            sqlx::query_as("SELECT completed, total FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_one(&mut self.db)
                .await?,
        )
    }

    async fn wait_status_completed(&self, run_id: Uuid, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let run: Value = self
                .http
                .get(format!("{}/v1/runs/{run_id}", self.base))
                .send()
                .await?
                .json()
                .await?;
            if run["status"] == "completed" {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!("run {run_id} not completed after {limit:?}: {run}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// One measured run: cases/s from the upload request to `completed`.
    async fn throughput(&self, n: usize) -> anyhow::Result<f64> {
        let start = Instant::now();
        let run_id = self.upload(n).await?;
        self.wait_status_completed(run_id, Duration::from_secs(1_800))
            .await?;
        Ok(n as f64 / start.elapsed().as_secs_f64())
    }

    /// One recovery: see the module docs. `(first progress, past the in-flight bound)`.
    async fn recovery(&mut self, o: &Options) -> anyhow::Result<(Duration, Duration)> {
        // The leader is looked up before the run (`rabbitmqctl` takes seconds on a busy machine,
        // longer than the rest of a run): nothing moves it while every node is up.
        let (leader, _) = self.cluster.quorum_members(0, &format!("{PREFIX}.jobs"));
        let victim = self
            .cluster
            .index_of_name(&leader)
            .with_context(|| format!("the jobs queue's leader {leader} is no node of ours"))?;
        let run_id = self.upload(o.cases).await?;
        let fifth = i32::try_from(o.cases / 5)?;
        loop {
            let (done, _) = self.completed(run_id).await?;
            if done >= fifth {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (at_kill, total) = self.completed(run_id).await?;
        let held = i32::try_from(o.workers * usize::from(o.concurrency) * 2)?;
        if at_kill + held >= total {
            bail!(
                "a run of {total} cases is too small to time a recovery: {at_kill} recorded and up to {held} held by the workers at the loss; use more --cases"
            );
        }
        let bound = at_kill + held;
        // The clock starts with the SIGKILL: `kill` then waits until the node no longer answers
        // (several seconds of `rabbitmqctl` on a busy machine), and the run is watched meanwhile.
        let cluster = self.cluster.clone();
        let lost = Instant::now();
        let killing = tokio::task::spawn_blocking(move || cluster.kill(victim));
        let mut first = None;
        let through = loop {
            let (done, total) = self.completed(run_id).await?;
            if first.is_none() && done > at_kill {
                first = Some(lost.elapsed());
            }
            if done > bound || done >= total {
                break lost.elapsed();
            }
            if lost.elapsed() > Duration::from_secs(600) {
                bail!("no progress 600 s after the loss of {leader}: {done} of {total}");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        killing.await?;
        let cluster = self.cluster.clone();
        tokio::task::spawn_blocking(move || cluster.restart(victim)).await?;
        self.wait_status_completed(run_id, Duration::from_secs(1_800))
            .await?;
        let (done, total) = self.completed(run_id).await?;
        if done != total {
            bail!("run {run_id}: {done} of {total} recorded after the recovery");
        }
        Ok((first.unwrap_or(through), through))
    }

    async fn stop(self) {
        let Service {
            cluster,
            db_name,
            db,
            coordinator,
            workers,
            ..
        } = self;
        drop(workers);
        drop(coordinator);
        let _ = db.close().await;
        cluster::drop_database(&db_name).await;
        let _ = tokio::task::spawn_blocking(move || drop(cluster)).await;
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
    let o = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(&o))
}

async fn bench(o: &Options) -> anyhow::Result<()> {
    println!(
        "cluster_bench: {} cases per run (runner `given`), {} worker(s) x {} slots, {} measured run(s) per broker",
        o.cases, o.workers, o.concurrency, o.repeat
    );
    let mut figures = Vec::new();
    for nodes in [1, 3] {
        let mut service = Service::start(nodes, o).await?;
        let mut rates = Vec::new();
        let outcome: anyhow::Result<()> = async {
            // One unmeasured run warms the package cache and the queues.
            service.throughput(o.cases.min(500)).await?;
            for i in 1..=o.repeat {
                let rate = service.throughput(o.cases).await?;
                println!("  {nodes} node(s), run {i}: {rate:.0} cases/s");
                rates.push(rate);
            }
            if nodes == 3 {
                for i in 1..=o.recoveries {
                    let (first, through) = service.recovery(o).await?;
                    println!(
                        "  recovery {i}: the jobs queue's leader killed; recorded count moving again after {:.2} s, past every job held at the loss after {:.2} s",
                        first.as_secs_f64(),
                        through.as_secs_f64()
                    );
                }
            }
            Ok(())
        }
        .await;
        service.stop().await;
        outcome?;
        figures.push((nodes, median(rates)));
    }
    if let [(_, one), (_, three)] = figures[..] {
        println!(
            "median cases/s: one node {one:.0}, three nodes {three:.0}; three / one = {:.2}",
            three / one
        );
    }
    Ok(())
}
