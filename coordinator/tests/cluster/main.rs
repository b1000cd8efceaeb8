//! The service on a three-node RabbitMQ cluster, losing a node while runs are in flight: the
//! coordinator and a worker (in this process, each on a node of its own) take the cluster's
//! three addresses, every queue is a quorum queue with three members, and a node is lost four
//! ways: killed with SIGKILL and started again; stopped with `stop_app` and started again; the
//! worker's node killed while the worker holds unacknowledged jobs; the coordinator's
//! publishing node killed while it publishes a run. Each run must end as the single-node crash
//! tests require: exactly one row per case, no row left queued, counters equal to the rows.
//!
//! The test starts its own cluster on ports of its own and removes it at the end
//! ([`RabbitCluster`]); the four losses happen one after the other on it, each undone before
//! the next. Every wait is a hang guard of minutes: nothing here is timed.

use std::io::{Cursor, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skilleval_coordinator::startup::Application;
use skilleval_infra::config::{SecretUrl, Settings};
use skilleval_infra::store::Store;
use skilleval_infra::topology::Topology;
use skilleval_test_support::cluster::RabbitCluster;
use skilleval_test_support::Scratch;
use skilleval_worker::Worker;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::ZipWriter;

/// Cases per run: a few hundred, as CI affords.
const CASES: usize = 300;

/// A hang guard, not a measure.
const HANG_GUARD: Duration = Duration::from_secs(240);

/// A skill (a version per `tag`) whose `n` cases each sleep `secs` in the sandbox and print `ok` (exact match), with
/// at most `cap` of them in flight (`maxConcurrentTests`) when given.
fn package(tag: &str, n: usize, secs: f64, cap: Option<u32>) -> Vec<u8> {
    let cases: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "id": format!("tc-{i:04}"),
                "input": { "prompt": format!("say ok {i} ({tag})") },
                "expected": { "output": "ok" },
                "evaluation": { "strategy": "exact_match" }
            })
        })
        .collect();
    let mut settings = json!({
        "defaultTimeout": 60_000,
        "runner": {"type": "command", "script": "scripts/run.sh"},
    });
    if let Some(cap) = cap {
        settings["maxConcurrentTests"] = json!(cap);
    }
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": settings,
        "testCases": cases,
    });
    let files: [(&str, Vec<u8>); 3] = [
        (
            "cluster-skill/SKILL.md",
            b"---\nname: cluster-skill\ndescription: Says ok, for the cluster tests.\n---\n\nSay ok.\n"
                .to_vec(),
        ),
        (
            "cluster-skill/eval/tests.json",
            serde_json::to_vec(&tests).expect("tests.json"),
        ),
        (
            "cluster-skill/scripts/run.sh",
            format!("cat > /dev/null\nsleep {secs}\necho ok\n").into_bytes(),
        ),
    ];
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes) in files {
        writer
            .start_file(name, SimpleFileOptions::default())
            .expect("zip entry");
        writer.write_all(&bytes).expect("zip entry");
    }
    writer.finish().expect("zip").into_inner()
}

/// The cluster, a database, the coordinator and a worker.
struct Scene {
    cluster: RabbitCluster,
    address: String,
    worker: Arc<Worker>,
    worker_http: u16,
    pool: PgPool,
    client: reqwest::Client,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    scratch: Scratch,
    _cache: tempfile::TempDir,
}

/// The cluster's addresses starting at node `first`: processes of one pid start at the same
/// place in their list, so a list rotated by one puts the worker on another node than the
/// coordinator.
fn addresses_from(cluster: &RabbitCluster, first: usize) -> String {
    let n = cluster.nodes.len();
    (0..n)
        .map(|k| cluster.nodes[(first + k) % n].url())
        .collect::<Vec<_>>()
        .join(",")
}

fn settings(scratch: &Scratch, urls: String) -> Settings {
    let mut s = Settings::default();
    s.database.url = SecretUrl::new(scratch.db_url.clone());
    s.database.max_connections = 8;
    s.amqp.url = SecretUrl::new(urls);
    s.amqp.replicated_queues = true;
    s.amqp.prefix = scratch.prefix.clone();
    s.coordinator.bind = "127.0.0.1:0".into();
    s.coordinator.sweep_interval_secs = 1;
    s.coordinator.publish_grace_secs = 2;
    s.worker.concurrency = 24;
    s.worker.retry_tiers_ms = vec![300, 600, 1_200];
    s.worker.max_redeliveries = 10;
    s.worker.http_port = 0;
    s.worker.batch_max_wait_ms = 10;
    s.worker.max_reconnect_attempts = 50;
    s
}

impl Scene {
    async fn start() -> Scene {
        let cluster = tokio::task::spawn_blocking(|| RabbitCluster::start(3))
            .await
            .expect("start the cluster");
        let scratch = Scratch::create().await;
        let coordinator_settings = settings(&scratch, addresses_from(&cluster, 0));
        let mut worker_settings = settings(&scratch, addresses_from(&cluster, 1));
        let cache = tempfile::tempdir().expect("package cache");
        worker_settings.worker.package_cache_dir = cache.path().to_path_buf();

        let stop = CancellationToken::new();
        let app = Application::build_with(coordinator_settings, true)
            .await
            .expect("build the coordinator");
        let address = format!("http://127.0.0.1:{}", app.port());
        let coordinator = app.state().clone();
        let app_stop = app.shutdown_token();
        let mut tasks = vec![tokio::spawn(async move {
            if let Err(e) = app.run_until_stopped().await {
                eprintln!("coordinator stopped with an error: {e:#}");
            }
        })];
        let stopped = stop.clone();
        tasks.push(tokio::spawn(async move {
            stopped.cancelled().await;
            app_stop.cancel();
        }));

        let store = Store::connect(&worker_settings.database)
            .await
            .expect("worker store");
        let worker = Arc::new(Worker::new(worker_settings, store).expect("worker"));
        let (http, _) = worker.serve_http(stop.clone()).await.expect("worker http");
        let running = worker.clone();
        let worker_stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = running.run(worker_stop).await {
                eprintln!("worker stopped with an error: {e}");
            }
        }));
        let pool = coordinator.store.pool().clone();
        Scene {
            cluster,
            address,
            worker,
            worker_http: http.port(),
            pool,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            stop,
            tasks,
            scratch,
            _cache: cache,
        }
    }

    /// Uploads the package; the run's id.
    async fn upload(&self, zip: Vec<u8>) -> Uuid {
        let response = self
            .client
            .post(format!("{}/v1/skills", self.address))
            .header("Content-Type", "application/zip")
            .body(zip)
            .send()
            .await
            .expect("upload");
        let status = response.status();
        let body: Value = response.json().await.expect("upload body");
        assert_eq!(status.as_u16(), 201, "{body}");
        body["run_id"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no run id: {body}"))
    }

    /// `(total, completed, published_through)` of the run.
    async fn progress(&self, run_id: Uuid) -> (i32, i32, i32) {
        sqlx::query_as("SELECT total, completed, published_through FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_one(&self.pool)
            .await
            .expect("run progress")
    }

    async fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < HANG_GUARD,
                "hang guard: waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_completed(&self, run_id: Uuid, at_least: i32) {
        let start = Instant::now();
        loop {
            let (total, completed, _) = self.progress(run_id).await;
            if completed >= at_least.min(total) {
                return;
            }
            assert!(
                start.elapsed() < HANG_GUARD,
                "hang guard: {completed} of {total} cases after {HANG_GUARD:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for the run to finish, then checks what every run must hold: one row per case,
    /// none queued, the counters equal to the rows, the run completed.
    async fn assert_run_exact(&self, run_id: Uuid) {
        self.wait_completed(run_id, i32::MAX).await;
        let start = Instant::now();
        loop {
            let (status,): (String,) = sqlx::query_as("SELECT status FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_one(&self.pool)
                .await
                .expect("status");
            if status == "completed" {
                break;
            }
            assert!(
                start.elapsed() < HANG_GUARD,
                "hang guard: run still {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT status, count(*) FROM eval_results WHERE run_id = $1 GROUP BY status",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await
        .expect("rows");
        let rows: std::collections::BTreeMap<String, i64> = rows.into_iter().collect();
        let (distinct,): (i64,) = sqlx::query_as(
            "SELECT count(DISTINCT test_case_id) FROM eval_results WHERE run_id = $1",
        )
        .bind(run_id)
        .fetch_one(&self.pool)
        .await
        .expect("distinct");
        let n = i64::try_from(CASES).expect("n");
        assert_eq!(rows.values().sum::<i64>(), n, "one row per case: {rows:?}");
        assert_eq!(distinct, n, "every case once: {rows:?}");
        assert_eq!(rows.get("passed"), Some(&n), "every case passed: {rows:?}");
        let counters: (i32, i32, i32, i32, i32, i32) = sqlx::query_as(
            "SELECT total, completed, passed, failed, errored, skipped FROM runs WHERE id = $1",
        )
        .bind(run_id)
        .fetch_one(&self.pool)
        .await
        .expect("counters");
        let n = i32::try_from(CASES).expect("n");
        assert_eq!(counters, (n, n, n, 0, 0, 0), "counters equal the rows");
    }

    /// The node the coordinator's `/readyz` names.
    async fn coordinator_node(&self) -> Option<String> {
        let response = self
            .client
            .get(format!("{}/readyz", self.address))
            .send()
            .await
            .ok()?;
        let body: Value = response.json().await.ok()?;
        body["broker_node"].as_str().map(str::to_string)
    }

    /// The node the worker's `/readyz` names, while it is ready.
    async fn worker_node(&self) -> Option<String> {
        let body = self
            .client
            .get(format!("http://127.0.0.1:{}/readyz", self.worker_http))
            .send()
            .await
            .ok()?
            .error_for_status()
            .ok()?
            .text()
            .await
            .ok()?;
        body.strip_prefix("ready: broker node ").map(str::to_string)
    }

    async fn eventually_node(&self, what: &str, worker: bool, unlike: Option<&str>) -> String {
        let start = Instant::now();
        loop {
            let node = if worker {
                self.worker_node().await
            } else {
                self.coordinator_node().await
            };
            if let Some(node) = node.filter(|n| Some(n.as_str()) != unlike) {
                return node;
            }
            assert!(
                start.elapsed() < HANG_GUARD,
                "hang guard: waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn worker_metric(&self, name: &str) -> u64 {
        let text = self.worker.metrics().encode().unwrap_or_default();
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next())
            .filter_map(|v| v.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// Every queue of the prefix is a quorum queue with the three nodes as members.
    fn assert_replicated(&self) {
        let topology = Topology::from_settings(&settings(&self.scratch, String::new()));
        for queue in [
            topology.jobs_queue(),
            topology.samples_queue(),
            topology.parking_queue(),
            topology.retry_queue(skilleval_infra::topology::Lane::Ci, 300),
        ] {
            let (_, members) = self.cluster.quorum_members(0, &queue);
            let mut members = members;
            members.sort();
            let mut nodes: Vec<String> =
                self.cluster.nodes.iter().map(|n| n.name.clone()).collect();
            nodes.sort();
            assert_eq!(members, nodes, "{queue} has every node as a member");
        }
    }

    async fn stop(mut self) {
        self.stop.cancel();
        for task in self.tasks.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(60), task).await;
        }
        let cluster = self.cluster;
        tokio::task::spawn_blocking(move || drop(cluster))
            .await
            .expect("stop the cluster");
    }
}

/// The jobs queue's leader killed with SIGKILL mid-run, and started again.
async fn a_node_killed_and_started_again_mid_run(scene: &Scene) {
    // The jobs queue's leader: the node whose loss forces an election.
    let topology = Topology::from_settings(&settings(&scene.scratch, String::new()));
    let (leader, _) = scene.cluster.quorum_members(0, &topology.jobs_queue());
    let run_id = scene.upload(package("sigkill", CASES, 1.0, None)).await;
    scene.wait_completed(run_id, 30).await;
    let victim = scene
        .cluster
        .index_of_name(&leader)
        .unwrap_or_else(|| panic!("the leader {leader} is a node of the cluster"));
    tokio::task::block_in_place(|| scene.cluster.kill(victim));
    let (_, completed_at_kill, _) = scene.progress(run_id).await;
    tokio::task::block_in_place(|| scene.cluster.restart(victim));
    assert!(
        completed_at_kill < i32::try_from(CASES).expect("n"),
        "the node went while the run was in flight"
    );
    scene.assert_run_exact(run_id).await;
}

/// The worker's node stopped with `stop_app` mid-run, and started again.
async fn a_node_stopped_with_stop_app_and_started_again(scene: &Scene) {
    let node = scene
        .eventually_node("the worker is ready", true, None)
        .await;
    let run_id = scene.upload(package("stop-app", CASES, 1.0, None)).await;
    scene.wait_completed(run_id, 30).await;
    let victim = scene
        .cluster
        .index_of(&node)
        .expect("a node of the cluster");
    tokio::task::block_in_place(|| scene.cluster.stop_app(victim));
    let moved = scene
        .eventually_node("the worker consumes from another node", true, Some(&node))
        .await;
    assert_ne!(moved, node);
    tokio::task::block_in_place(|| scene.cluster.start_app(victim));
    scene.assert_run_exact(run_id).await;
}

/// The worker's node killed while the worker holds unacknowledged jobs.
async fn the_workers_node_lost_while_it_holds_unacked_jobs(scene: &Scene) {
    let run_id = scene.upload(package("worker-node", CASES, 1.0, None)).await;
    let node = scene
        .eventually_node("the worker is ready", true, None)
        .await;
    // (After the earlier losses the coordinator may be on this node too: it fails over as
    // well, which the last loss tests on its own.)
    scene
        .wait_until("the worker holds unacknowledged jobs", || {
            scene.worker_metric("skilleval_worker_in_flight") >= 12
        })
        .await;
    let victim = scene
        .cluster
        .index_of(&node)
        .expect("a node of the cluster");
    let redelivered = scene.worker_metric("skilleval_worker_redeliveries_total");
    tokio::task::block_in_place(|| scene.cluster.kill(victim));
    let moved = scene
        .eventually_node("the worker consumes from another node", true, Some(&node))
        .await;
    assert_ne!(moved, node);
    tokio::task::block_in_place(|| scene.cluster.restart(victim));
    scene.assert_run_exact(run_id).await;
    // The jobs it held came back to it, and were recognised as recorded.
    assert!(
        scene.worker_metric("skilleval_worker_redeliveries_total") > redelivered,
        "the jobs held at the loss were delivered again"
    );
}

/// The node the coordinator publishes through killed while it publishes a run.
async fn the_coordinators_publishing_node_lost_while_it_publishes(scene: &Scene) {
    let node = scene
        .eventually_node("the coordinator is ready", false, None)
        .await;
    let victim = scene
        .cluster
        .index_of(&node)
        .expect("a node of the cluster");
    // At most 20 cases in flight: the coordinator publishes the run's jobs all along it.
    let run_id = scene
        .upload(package("publishing-node", CASES, 0.2, Some(20)))
        .await;
    tokio::task::block_in_place(|| scene.cluster.kill(victim));
    let (total, _, published) = scene.progress(run_id).await;
    assert!(
        published < total,
        "the node went while the run's jobs were being published ({published} of {total})"
    );
    let moved = scene
        .eventually_node(
            "the coordinator publishes through another node",
            false,
            Some(&node),
        )
        .await;
    assert_ne!(moved, node);
    tokio::task::block_in_place(|| scene.cluster.restart(victim));
    scene.assert_run_exact(run_id).await;
}

/// One cluster for the four losses (a cluster's start is the slow part): each loss is undone
/// before the next, and each run is checked on its own. The queues keep three members through
/// it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_three_node_cluster_loses_a_node_four_ways_and_no_case_is_lost_or_graded_twice() {
    let scene = Scene::start().await;
    scene.assert_replicated();
    a_node_killed_and_started_again_mid_run(&scene).await;
    a_node_stopped_with_stop_app_and_started_again(&scene).await;
    the_workers_node_lost_while_it_holds_unacked_jobs(&scene).await;
    the_coordinators_publishing_node_lost_while_it_publishes(&scene).await;
    scene.assert_replicated();
    scene.stop().await;
}
