//! What every service test needs: a fresh, migrated database with a random name, a random
//! queue prefix with its topology declared, a real skill package stored in the database, a run
//! seeded with its plan (no case recorded), and ways to start workers (in this process, or the
//! real `skilleval-worker` binary) and to wait for the run. Everything is removed on drop
//! (`DROP DATABASE ... WITH (FORCE)`, the prefix's queues and exchanges), even when a test
//! fails.
//!
//! The services are the ones on this machine: PostgreSQL on 127.0.0.1:5432 (trust auth) and
//! RabbitMQ on 127.0.0.1:5672 (guest/guest); `SKILLEVAL_TEST_PG` (an admin URL without the
//! database) and `SKILLEVAL_TEST_AMQP` point elsewhere.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{Cursor, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::options::BasicGetOptions;
use lapin::types::ShortString;
use lapin::Connection;
use serde_json::json;
use skilleval_execution::plan::{plan, CaseFilter, Job};
use skilleval_infra::config::{SecretUrl, Settings};
use skilleval_infra::store::Store;
use skilleval_infra::topology::{self, Lane, Publisher, Topology};
use skilleval_model::package::{Package, PackageLimits};
use skilleval_test_support::Scratch;
use skilleval_worker::Worker;
use sqlx::{Connection as _, PgConnection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

pub use skilleval_test_support::{amqp_url, pg_admin_base};

/// How the package's cases produce their output.
#[derive(Debug, Clone)]
pub enum Produce {
    /// Recorded outputs (`given` runner): instant. Every `fail_every`-th case fails.
    Given { fail_every: usize },
    /// `scripts/run.sh` in the sandbox: sleeps this long, then prints `ok`.
    Sleep { secs: f64 },
    /// `scripts/run.sh` never finishes; cases time out after `timeout_ms`.
    Hang { timeout_ms: u64 },
}

/// A skill package ZIP with `n` deterministic (exact_match) cases.
pub fn package_zip(n: usize, produce: &Produce) -> Vec<u8> {
    let mut cases = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("tc-{i:04}");
        let mut case = json!({
            "id": id,
            "name": format!("case {i}"),
            "tags": ["svc"],
            "input": { "prompt": format!("say ok {i}") },
            "expected": { "output": "ok" },
            "evaluation": { "strategy": "exact_match" }
        });
        if let Produce::Given { fail_every } = produce {
            let output = if *fail_every > 0 && i % fail_every == fail_every - 1 {
                "wrong"
            } else {
                "ok"
            };
            case["given"] = json!({ "output": output });
        }
        cases.push(case);
    }
    let (runner, timeout_ms, script) = match produce {
        // A recorded output takes no time to produce: its timeout only guards against a hang,
        // and a machine busy with other builds must not reach it.
        Produce::Given { .. } => (json!("given"), 120_000, None),
        Produce::Sleep { secs } => (
            json!({"type": "command", "script": "scripts/run.sh"}),
            30_000,
            Some(format!("cat > /dev/null\nsleep {secs}\necho ok\n")),
        ),
        Produce::Hang { timeout_ms } => (
            json!({"type": "command", "script": "scripts/run.sh"}),
            *timeout_ms,
            Some("cat > /dev/null\nsleep 600\necho ok\n".to_string()),
        ),
    };
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": { "defaultTimeout": timeout_ms, "runner": runner },
        "testCases": cases,
    });
    let mut files: Vec<(String, Vec<u8>)> = vec![
        (
            "svc-skill/SKILL.md".into(),
            b"---\nname: svc-skill\ndescription: Says ok when asked, for the service tests.\n---\n\nSay ok.\n".to_vec(),
        ),
        (
            "svc-skill/eval/tests.json".into(),
            serde_json::to_vec_pretty(&tests).expect("tests.json"),
        ),
    ];
    if let Some(script) = script {
        files.push(("svc-skill/scripts/run.sh".into(), script.into_bytes()));
    }
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    for (name, bytes) in &files {
        writer
            .start_file(name.as_str(), options)
            .expect("start zip entry");
        writer.write_all(bytes).expect("write zip entry");
    }
    writer.finish().expect("finish zip").into_inner()
}

/// A run seeded in the database: its id and its jobs (not published yet).
#[derive(Debug, Clone)]
pub struct SeededRun {
    pub run_id: Uuid,
    pub jobs: Vec<Job>,
}

pub use skilleval_infra::store::runs::Counters;

/// One test's database, queue prefix, publisher and package cache.
pub struct TestEnv {
    pub db_name: String,
    pub db_url: String,
    pub store: Store,
    pub prefix: String,
    pub topology: Topology,
    pub conn: Connection,
    pub publisher: Publisher,
    pub cache_dir: tempfile::TempDir,
    /// The broker's URL: the machine's, or a node of the test's own.
    pub amqp: String,
    /// Removes the database and the prefix's queues when the test ends.
    _scratch: Scratch,
}

impl TestEnv {
    pub async fn new() -> TestEnv {
        TestEnv::on_broker(None).await
    }

    /// A test environment on the broker at `amqp` (a node the test started, removed with its
    /// queues when it stops), or the machine's (`None`).
    pub async fn on_broker(amqp: Option<String>) -> TestEnv {
        // `SKILLEVAL_TEST_LOG=debug cargo test ...` shows the in-process workers' logs.
        if let Ok(filter) = std::env::var("SKILLEVAL_TEST_LOG") {
            // Kept for the test binary's life: no exporter is installed without an endpoint.
            if let Ok(t) = skilleval_infra::telemetry::init(
                &skilleval_infra::config::LogSettings {
                    filter,
                    format: skilleval_infra::config::LogFormat::Text,
                },
                &Default::default(),
                "skilleval-worker-tests",
            ) {
                std::mem::forget(t);
            }
        }
        let mut scratch = Scratch::create().await;
        let (db_name, db_url, prefix) = (
            scratch.db_name.clone(),
            scratch.db_url.clone(),
            scratch.prefix.clone(),
        );
        let topology = Topology::new(
            prefix.clone(),
            vec![300, 600, 1_200],
            topology::DELIVERY_LIMIT,
        );
        if amqp.is_none() {
            scratch.owns(topology.clone());
        }
        let amqp = amqp.unwrap_or_else(amqp_url);
        let store = Store::connect_url(&db_url, 5)
            .await
            .expect("connect to the test database");
        store.migrate().await.expect("migrate");
        let conn = Connection::connect(
            &amqp,
            lapin::ConnectionProperties::default()
                .with_connection_name(format!("test-publisher-{prefix}").into()),
        )
        .await
        .expect("connect to RabbitMQ");
        let ch = conn.create_channel().await.expect("channel");
        topology.declare(&ch).await.expect("declare topology");
        let publisher = Publisher::open(&conn, topology.clone())
            .await
            .expect("publisher");
        TestEnv {
            db_name,
            db_url,
            store,
            prefix,
            topology,
            conn,
            publisher,
            cache_dir: tempfile::tempdir().expect("cache dir"),
            amqp,
            _scratch: scratch,
        }
    }

    /// Worker settings for this test: its database, prefix, cache, short tiers and batches.
    pub fn settings(&self, name: &str) -> Settings {
        let mut s = Settings::default();
        s.database.url = SecretUrl::new(self.db_url.clone());
        s.database.max_connections = 5;
        s.amqp.url = SecretUrl::new(self.amqp.clone());
        s.amqp.prefix = self.prefix.clone();
        s.amqp.connection_name = Some(self.connection_name(name));
        s.worker.concurrency = 8;
        s.worker.retry_tiers_ms = self.topology.retry_tiers_ms().to_vec();
        s.worker.max_redeliveries = 10;
        s.worker.package_cache_dir = self.cache_dir.path().to_path_buf();
        s.worker.http_port = 0;
        s.worker.shutdown_grace_secs = 20;
        s.worker.batch_max_wait_ms = 10;
        s.worker.cancel_cache_ttl_ms = 200;
        s.worker.max_reconnect_attempts = 20;
        s
    }

    /// Names this test's broker connections carry (so a test closes only its own).
    pub fn connection_name(&self, name: &str) -> String {
        format!("worker-{}-{name}", self.prefix)
    }

    /// Stores the package as a skill version and seeds a run of `n` cases, none recorded.
    pub async fn seed_run(&self, n: usize, produce: &Produce) -> SeededRun {
        let zip = package_zip(n, produce);
        let package =
            Package::from_zip_bytes(&zip, &PackageLimits::default(), None).expect("package opens");
        assert!(
            package.problems.iter().all(|p| !p.is_error()),
            "{:?}",
            package.problems
        );
        let hash = package.content_hash.clone();
        let run_id = Uuid::now_v7();
        let jobs =
            plan(&package.config, &hash, run_id, &CaseFilter::default(), None).expect("plan");
        let pool = self.store.pool();
        let skill_id: Uuid = sqlx::query_scalar(
            "INSERT INTO skills (id, name) VALUES ($1, 'svc-skill')
             ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
        )
        .bind(Uuid::now_v7())
        .fetch_one(pool)
        .await
        .expect("skill");
        let version_id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO skill_versions
                (id, skill_id, version, description, description_hash, package_hash, package_bytes, manifest)
             VALUES ($1, $2, $3, 'Says ok', 'h', $4, $5, '{}'::jsonb)",
        )
        .bind(version_id)
        .bind(skill_id)
        .bind(version_id.to_string())
        .bind(&hash)
        .bind(&zip)
        .execute(pool)
        .await
        .expect("version");
        sqlx::query(
            "INSERT INTO eval_configs (id, version_id, version, profile, config, test_cases)
             VALUES ($1, $2, '2.0', 'deterministic', $3, $4)",
        )
        .bind(Uuid::now_v7())
        .bind(version_id)
        .bind(serde_json::to_string(&package.config).expect("config json"))
        .bind(i32::try_from(n).expect("n"))
        .execute(pool)
        .await
        .expect("eval config");
        // The run and its plan as the coordinator commits them, its jobs all confirmed: no
        // case has a row until its outcome is recorded.
        sqlx::query(
            "INSERT INTO runs (id, version_id, kind, status, total, published_through)
             VALUES ($1, $2, 'manual', 'running', $3, $3)",
        )
        .bind(run_id)
        .bind(version_id)
        .bind(i32::try_from(jobs.len()).expect("total"))
        .execute(pool)
        .await
        .expect("run");
        SeededRun { run_id, jobs }
    }

    /// Publishes every job (pipelined, confirmed); panics on any failure.
    pub async fn publish(&self, jobs: &[Job]) {
        for chunk in jobs.chunks(200) {
            for (i, r) in self
                .publisher
                .publish_jobs(chunk, Lane::Ci)
                .await
                .into_iter()
                .enumerate()
            {
                r.unwrap_or_else(|e| panic!("publishing job {i}: {e}"));
            }
        }
    }

    pub async fn counters(&self, run_id: Uuid) -> Counters {
        let (total, completed, passed, failed, errored, skipped): (i32, i32, i32, i32, i32, i32) =
            sqlx::query_as(
                "SELECT total, completed, passed, failed, errored, skipped FROM runs WHERE id = $1",
            )
            .bind(run_id)
            .fetch_one(self.store.pool())
            .await
            .expect("counters");
        Counters {
            total,
            completed,
            passed,
            failed,
            errored,
            skipped,
        }
    }

    /// Rows per status, read from `eval_results` (not the counters).
    pub async fn rows_by_status(&self, run_id: Uuid) -> BTreeMap<String, i64> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT status, count(*) FROM eval_results WHERE run_id = $1 GROUP BY status",
        )
        .bind(run_id)
        .fetch_all(self.store.pool())
        .await
        .expect("rows by status");
        rows.into_iter().collect()
    }

    /// Waits until the run's counters are complete; panics after `timeout`, a guard against a
    /// hang (give 30 s or more: it measures nothing).
    pub async fn wait_for_run(&self, run_id: Uuid, timeout: Duration) -> Counters {
        let start = Instant::now();
        loop {
            let c = self.counters(run_id).await;
            if c.completed >= c.total {
                return c;
            }
            assert!(
                start.elapsed() < timeout,
                "hang guard: run not complete after {timeout:?}: {c:?}, rows {:?}",
                self.rows_by_status(run_id).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Checks the invariants every finished run must hold: exactly one row per case, no row
    /// left queued, and counters equal to the rows.
    pub async fn assert_run_consistent(&self, seeded: &SeededRun) -> Counters {
        let c = self.counters(seeded.run_id).await;
        let rows = self.rows_by_status(seeded.run_id).await;
        let n = i64::try_from(seeded.jobs.len()).expect("n");
        assert_eq!(rows.values().sum::<i64>(), n, "one row per case: {rows:?}");
        let (distinct,): (i64,) = sqlx::query_as(
            "SELECT count(DISTINCT test_case_id) FROM eval_results WHERE run_id = $1",
        )
        .bind(seeded.run_id)
        .fetch_one(self.store.pool())
        .await
        .expect("distinct");
        assert_eq!(distinct, n);
        assert_eq!(rows.get("queued"), None, "rows left queued: {rows:?}");
        let get = |s: &str| i32::try_from(rows.get(s).copied().unwrap_or(0)).expect("count");
        assert_eq!(c.total, i32::try_from(n).expect("n"));
        assert_eq!(c.completed, c.total, "{c:?}");
        assert_eq!(
            (c.passed, c.failed, c.errored, c.skipped),
            (get("passed"), get("failed"), get("errored"), get("skipped")),
            "counters equal the rows: {c:?} vs {rows:?}"
        );
        c
    }

    /// The errored rows of a run as `case: error`, for a failure message that says why.
    pub async fn errors_of(&self, run_id: Uuid) -> Vec<String> {
        let rows: Vec<(String, Option<String>)> = sqlx::query_as(
            "SELECT test_case_id, error::text FROM eval_results \
             WHERE run_id = $1 AND status = 'errored' ORDER BY test_case_id",
        )
        .bind(run_id)
        .fetch_all(self.store.pool())
        .await
        .expect("errored rows");
        rows.into_iter()
            .map(|(case, error)| format!("{case}: {}", error.unwrap_or_default()))
            .collect()
    }

    /// Starts a worker in this process.
    pub async fn start_worker(&self, settings: Settings) -> RunningWorker {
        let store = Store::connect(&settings.database)
            .await
            .expect("worker store");
        let worker = Arc::new(Worker::new(settings, store).expect("worker"));
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(worker.clone().run(shutdown.clone()));
        RunningWorker {
            worker,
            shutdown,
            handle: Some(handle),
        }
    }

    /// Starts the real `skilleval-worker` binary, configured through its environment.
    pub fn spawn_worker_process(
        &self,
        name: &str,
        http_port: u16,
        extra: &[(&str, String)],
    ) -> WorkerProcess {
        let settings = self.settings(name);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skilleval-worker"));
        cmd.env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
            .env("DATABASE_URL", &self.db_url)
            .env("AMQP_URL", &self.amqp)
            .env("RUST_LOG", "info,skilleval=info")
            .env("SKILLEVAL_LOG_FORMAT", "text")
            .env("SKILLEVAL__AMQP__PREFIX", &self.prefix)
            .env(
                "SKILLEVAL__AMQP__CONNECTION_NAME",
                self.connection_name(name),
            )
            .env("SKILLEVAL__WORKER__HTTP_PORT", http_port.to_string())
            .env(
                "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
                self.cache_dir.path(),
            )
            .env(
                "SKILLEVAL__WORKER__RETRY_TIERS_MS",
                settings
                    .worker
                    .retry_tiers_ms
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .env("SKILLEVAL__WORKER__BATCH_MAX_WAIT_MS", "10")
            .env("SKILLEVAL__WORKER__MAX_REDELIVERIES", "10")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn skilleval-worker");
        WorkerProcess {
            child: Some(child),
            http_port,
            name: name.to_string(),
        }
    }

    /// Takes every message from the parking queue.
    pub async fn drain_parking(&self) -> Vec<lapin::message::BasicGetMessage> {
        let ch = self.conn.create_channel().await.expect("channel");
        let mut out = Vec::new();
        while let Some(m) = ch
            .basic_get(
                ShortString::from(self.topology.parking_queue()),
                BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
        {
            out.push(m);
        }
        out
    }

    /// A fresh connection for the test's own use.
    pub async fn connect_amqp(&self) -> Connection {
        topology::connect(&self.settings("aux"), &format!("test-aux-{}", self.prefix))
            .await
            .expect("amqp")
    }
}

/// A worker running in this process.
pub struct RunningWorker {
    pub worker: Arc<Worker>,
    pub shutdown: CancellationToken,
    handle: Option<JoinHandle<Result<(), skilleval_worker::WorkerError>>>,
}

impl RunningWorker {
    /// Asks it to stop and waits; returns what `run` returned.
    pub async fn stop(mut self) -> Result<(), skilleval_worker::WorkerError> {
        self.shutdown.cancel();
        match self.handle.take() {
            Some(h) => h.await.expect("worker task"),
            None => Ok(()),
        }
    }

    /// Results it committed (all statuses).
    pub fn processed(&self) -> u64 {
        metric_sum(
            &self.worker.metrics().encode().expect("metrics"),
            "skilleval_worker_jobs_processed_total",
        )
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The `skilleval-worker` binary, killed if still running when dropped.
pub struct WorkerProcess {
    child: Option<Child>,
    pub http_port: u16,
    pub name: String,
}

impl WorkerProcess {
    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| i32::try_from(c.id()).expect("pid"))
            .expect("running")
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal)
            .expect("signal the worker");
    }

    /// Waits for the process to exit (panics after `timeout`, a guard against a hang: give 30 s
    /// or more); returns its status and stderr.
    pub async fn wait(&mut self, timeout: Duration) -> (std::process::ExitStatus, String) {
        let mut child = self.child.take().expect("running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                let mut stderr = String::new();
                if let Some(mut s) = child.stderr.take() {
                    use std::io::Read;
                    let _ = s.read_to_string(&mut stderr);
                }
                return (status, stderr);
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "hang guard: worker {} had not exited after {timeout:?}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Its `/metrics` text, or `None` while it does not answer.
    pub async fn metrics(&self) -> Option<String> {
        http_get(self.http_port, "/metrics").await
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free TCP port (bound then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A minimal HTTP/1.0 GET against 127.0.0.1 (no client dependency needed).
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_string()))
}

/// Sum of a metric's samples (all label sets) in Prometheus text.
pub fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next())
        .filter_map(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// Waits until `probe` says yes; panics after `timeout`, a guard against a hang (give 30 s or
/// more: it measures nothing).
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut probe: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !probe().await {
        assert!(
            start.elapsed() < timeout,
            "hang guard: still waiting after {timeout:?} for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Pids (what `rabbitmqctl close_connection` takes) and client properties of this broker's
/// connections.
pub fn broker_connections() -> Vec<(String, String)> {
    let out = Command::new("rabbitmqctl")
        .args([
            "list_connections",
            "pid",
            "client_properties",
            "--no-table-headers",
            "--quiet",
        ])
        .output()
        .expect("rabbitmqctl list_connections");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(name, props)| (name.to_string(), props.to_string()))
        .collect()
}

/// Closes, on the broker side, every connection whose client properties contain `needle`.
/// Returns how many were closed.
pub fn close_broker_connections(needle: &str) -> usize {
    let mut closed = 0;
    for (pid, props) in broker_connections() {
        if props.contains(needle) {
            let status = Command::new("rabbitmqctl")
                .args(["close_connection", &pid, "test: forced close", "--quiet"])
                .status()
                .expect("rabbitmqctl close_connection");
            if status.success() {
                closed += 1;
            }
        }
    }
    closed
}

/// Terminates every backend connected to `db_name` (and only that database).
pub async fn terminate_backends(db_name: &str) -> i64 {
    let mut admin = PgConnection::connect(&format!("{}/postgres", pg_admin_base()))
        .await
        .expect("admin");
    let rows: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(db_name)
    .fetch_all(&mut admin)
    .await
    .expect("terminate backends");
    i64::try_from(rows.iter().filter(|(ok,)| *ok).count()).expect("count")
}

/// The cache folder of a test, as the worker binary is told.
pub fn path_string(p: &std::path::Path) -> String {
    PathBuf::from(p).display().to_string()
}

/// Environment overrides as owned pairs.
pub fn env_pairs(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
