//! The fault soak (issue 22): runs of sandboxed cases on several workers while the broker's
//! connections, the database's backends and the workers themselves are knocked over, checked
//! case by case against what the suite says each case gives.
//!
//! A coordinator and `workers` workers (`slots` execution slots each) run as child processes
//! ([`crate::cluster`]) against a database and a RabbitMQ vhost of their own. One package of
//! `cases` cases (runner `command`: `scripts/run.sh` reads its input, sleeps `sleep_ms`, prints
//! `ok`; graded by `exact_match`; every `fail_every`-th case expects another answer, so it
//! fails) is stored, then `runs` runs of it are created at once. Every `fault_every`, in
//! rotation, one fault is injected: every connection of the vhost force-closed, every backend
//! of the database terminated, a random worker SIGKILLed and a new one started, a random
//! worker SIGTERMed (it drains) and a new one started. Faults stop once every run is
//! completed. Then each run's rows are read: one per case, each with the status the suite
//! gives it (passed, or failed for the expected-wrong ones), none errored.
//!
//! With `brokers: 3` the soak runs on a private three-node RabbitMQ cluster of its own
//! (`skilleval_test_support::cluster`; default vhost, every queue a quorum queue, every child
//! given the three addresses) instead of a vhost of the machine's node, and the rotation gains
//! two broker-node faults: a random node killed with SIGKILL and started again, and a random
//! node's broker stopped (`stop_app`) and started again. One node is down at a time at most
//! (a node fault is skipped while the last one is being undone), so the queues keep their
//! majority.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{Cursor, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use serde_json::{json, Value};
use sqlx::{Connection as _, PgConnection};
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

use std::sync::Arc;

use skilleval_test_support::cluster::RabbitCluster;

use crate::cluster::{terminate_backends, Proc, Vhost};

/// What to soak, and how hard.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The program that runs the children (dispatching with [`crate::cluster::child_main`]).
    pub exe: PathBuf,
    pub runs: usize,
    pub cases: usize,
    pub workers: usize,
    pub slots: u16,
    pub sleep_ms: u64,
    /// Every this many cases, one expects a wrong answer (0: none).
    pub fail_every: usize,
    pub fault_every: Duration,
    /// Give up (an error) when, for this long, no case was recorded and no run completed: a
    /// bound on a stall, not on the soak's length, so a machine busy with other work slows
    /// the soak down without failing it.
    pub stall: Duration,
    /// `worker.claim_lease_secs` of every process (`None`: the service's default, 60 s). A
    /// copy of a job delivered again after its claim's holder was SIGKILLed waits about this
    /// long (plus the longest delay queue) before it runs the case: the soak's longest gap.
    pub claim_lease_secs: Option<u64>,
    /// `worker.retry_tiers_ms` of every process (`None`: the service's default).
    pub retry_tiers_ms: Option<Vec<u64>>,
    /// 1: a vhost of the machine's RabbitMQ; 3: a private three-node cluster, with node
    /// faults in the rotation.
    pub brokers: usize,
}

/// A kind of fault the soak injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// Every broker connection of the vhost force-closed.
    BrokerClose,
    /// Every database backend of the database terminated.
    DbTerminate,
    /// A worker SIGKILLed, a new one started.
    WorkerKill,
    /// A worker SIGTERMed (it finishes its jobs), a new one started.
    WorkerTerm,
    /// A broker node killed with SIGKILL, then started again (a cluster only).
    NodeKill,
    /// A broker node's application stopped (`stop_app`), then started again (a cluster only).
    NodeStop,
}

impl FaultKind {
    /// A fault of a broker node (a cluster only): one node is down at a time at most.
    fn is_node(self) -> bool {
        matches!(self, FaultKind::NodeKill | FaultKind::NodeStop)
    }

    const ROTATION: [FaultKind; 4] = [
        FaultKind::BrokerClose,
        FaultKind::DbTerminate,
        FaultKind::WorkerKill,
        FaultKind::WorkerTerm,
    ];

    /// On a cluster: the node faults between the others.
    const CLUSTER_ROTATION: [FaultKind; 6] = [
        FaultKind::BrokerClose,
        FaultKind::NodeKill,
        FaultKind::DbTerminate,
        FaultKind::WorkerKill,
        FaultKind::NodeStop,
        FaultKind::WorkerTerm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::BrokerClose => "broker-close",
            FaultKind::DbTerminate => "db-terminate",
            FaultKind::WorkerKill => "worker-sigkill",
            FaultKind::WorkerTerm => "worker-sigterm",
            FaultKind::NodeKill => "node-sigkill",
            FaultKind::NodeStop => "node-stop-app",
        }
    }
}

/// One run's outcome against the suite.
#[derive(Debug, Clone, Default)]
pub struct RunFigures {
    pub run_id: String,
    pub cases: usize,
    /// Result rows stored for the run.
    pub rows: usize,
    /// (got, the suite says) per status.
    pub passed: (usize, usize),
    pub failed: (usize, usize),
    pub errored: usize,
    /// Cases whose stored status is not the one the suite gives them.
    pub mismatched: usize,
    /// The distinct error messages of errored cases (a few).
    pub errors: Vec<String>,
    /// Faults injected while the run was in flight, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    pub duration: Duration,
}

impl RunFigures {
    /// Every case as the suite gives it, one row each, none errored.
    pub fn exact(&self) -> bool {
        self.rows == self.cases
            && self.mismatched == 0
            && self.errored == 0
            && self.passed.0 == self.passed.1
            && self.failed.0 == self.failed.1
    }
}

impl fmt::Display for RunFigures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{} {n}", k.as_str()))
            .collect();
        write!(
            f,
            "{} cases, {} rows: passed {}/{}, failed {}/{}, errored {}, not as the suite gives {}; faults: {}; {:.1} s{}",
            self.cases,
            self.rows,
            self.passed.0,
            self.passed.1,
            self.failed.0,
            self.failed.1,
            self.errored,
            self.mismatched,
            if faults.is_empty() { "none".to_string() } else { faults.join(", ") },
            self.duration.as_secs_f64(),
            if self.exact() { "" } else { "  << NOT EXACT" }
        )?;
        for e in &self.errors {
            write!(f, "\n      error: {e}")?;
        }
        Ok(())
    }
}

/// A whole soak.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub runs: Vec<RunFigures>,
    /// Every fault injected, by kind.
    pub faults: BTreeMap<FaultKind, usize>,
    pub duration: Duration,
    /// What the sandbox uids held, sampled every 100 ms.
    pub uids: UidCensus,
}

/// Processes of the private sandbox uids (2,000,000,000 and up), as sampled from `/proc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct UidCensus {
    /// The most processes one uid had at once (zombies included).
    pub most_on_one_uid: usize,
    /// The most zombies of sandbox uids at once (dead, not yet reaped).
    pub most_zombies: usize,
    pub samples: usize,
}

impl UidCensus {
    fn sample(&mut self) {
        let mut per_uid: BTreeMap<u32, usize> = BTreeMap::new();
        let mut zombies = 0;
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in dir.flatten() {
            let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
                continue;
            };
            let mut zombie = false;
            for line in status.lines() {
                if let Some(state) = line.strip_prefix("State:") {
                    zombie = state.trim_start().starts_with('Z');
                } else if let Some(uids) = line.strip_prefix("Uid:") {
                    let uid = uids.split_whitespace().next().and_then(|u| u.parse().ok());
                    if let Some(uid) = uid.filter(|u: &u32| *u >= 2_000_000_000) {
                        *per_uid.entry(uid).or_default() += 1;
                        zombies += usize::from(zombie);
                    }
                    break;
                }
            }
        }
        self.samples += 1;
        self.most_zombies = self.most_zombies.max(zombies);
        self.most_on_one_uid = self
            .most_on_one_uid
            .max(per_uid.values().copied().max().unwrap_or(0));
    }
}

impl SoakReport {
    pub fn exact(&self) -> bool {
        self.runs.iter().all(RunFigures::exact)
    }

    pub fn errored(&self) -> usize {
        self.runs.iter().map(|r| r.errored).sum()
    }
}

/// Where the soak's broker is.
enum Broker {
    /// A vhost of the machine's node.
    Vhost(Vhost),
    /// A private cluster (its default vhost).
    Cluster(Arc<RabbitCluster>),
}

/// The database and broker of one soak; [`Scene::cleanup`] removes both.
struct Scene {
    db_name: String,
    db_url: String,
    broker: Broker,
}

impl Scene {
    async fn create(brokers: usize) -> anyhow::Result<Scene> {
        let id = Uuid::new_v4().simple().to_string();
        let (db_name, db_url) = crate::cluster::create_database("skilleval_soak").await?;
        let broker = if brokers > 1 {
            // Panics (a node that does not start) are the harness's way to fail.
            match tokio::task::spawn_blocking(move || RabbitCluster::start(brokers)).await {
                Ok(cluster) => Broker::Cluster(Arc::new(cluster)),
                Err(e) => {
                    crate::cluster::drop_database(&db_name).await;
                    bail!("starting the soak's RabbitMQ cluster: {e}");
                }
            }
        } else {
            match Vhost::create(&format!("skilleval-soak-{}", &id[..12])) {
                Ok(v) => Broker::Vhost(v),
                Err(e) => {
                    crate::cluster::drop_database(&db_name).await;
                    return Err(e.context("creating the soak's vhost"));
                }
            }
        };
        Ok(Scene {
            db_url,
            db_name,
            broker,
        })
    }

    /// Errors are printed, not returned: cleanup must run to its end.
    async fn cleanup(self) {
        crate::cluster::drop_database(&self.db_name).await;
        match self.broker {
            Broker::Vhost(vhost) => {
                if let Err(e) = vhost.delete() {
                    eprintln!("cleanup: deleting vhost {}: {e}", vhost.name);
                }
            }
            // The last handle stops the nodes and removes their folder.
            Broker::Cluster(cluster) => {
                let _ = tokio::task::spawn_blocking(move || drop(cluster)).await;
            }
        }
    }

    fn amqp_url(&self) -> String {
        match &self.broker {
            Broker::Vhost(vhost) => vhost.url(),
            Broker::Cluster(cluster) => cluster.urls(),
        }
    }

    fn env(&self, opts: &SoakOptions, cache: &std::path::Path) -> Vec<(String, String)> {
        let replicated = matches!(self.broker, Broker::Cluster(_));
        [
            ("DATABASE_URL", self.db_url.clone()),
            ("AMQP_URL", self.amqp_url()),
            ("SKILLEVAL__AMQP__REPLICATED_QUEUES", replicated.to_string()),
            ("SKILLEVAL__AMQP__PREFIX", "soak".to_string()),
            ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".to_string()),
            ("SKILLEVAL__WORKER__HTTP_PORT", "0".to_string()),
            ("SKILLEVAL__WORKER__CONCURRENCY", opts.slots.to_string()),
            (
                "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
                cache.display().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(opts.claim_lease_secs.map(|secs| {
            (
                "SKILLEVAL__WORKER__CLAIM_LEASE_SECS".to_string(),
                secs.to_string(),
            )
        }))
        .chain(opts.retry_tiers_ms.as_ref().map(|tiers| {
            let tiers: Vec<String> = tiers.iter().map(u64::to_string).collect();
            (
                "SKILLEVAL__WORKER__RETRY_TIERS_MS".to_string(),
                tiers.join(","),
            )
        }))
        .collect()
    }
}

/// Runs one soak; the database and the vhost are removed however it ends (ctrl-c included).
pub async fn soak(opts: &SoakOptions) -> anyhow::Result<SoakReport> {
    let scene = Scene::create(opts.brokers).await?;
    let outcome = tokio::select! {
        r = soak_in(&scene, opts) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    scene.cleanup().await;
    outcome
}

/// The id of case `i` and whether the suite says it fails.
fn case_id(i: usize) -> String {
    format!("tc-{i:04}")
}

fn expected_to_fail(i: usize, fail_every: usize) -> bool {
    fail_every > 0 && i % fail_every == fail_every - 1
}

/// The soak's package: see the module docs.
pub fn package_zip(cases: usize, sleep_ms: u64, fail_every: usize) -> anyhow::Result<Vec<u8>> {
    let test_cases: Vec<Value> = (0..cases)
        .map(|i| {
            let expected = if expected_to_fail(i, fail_every) {
                "a wrong answer"
            } else {
                "ok"
            };
            json!({
                "id": case_id(i),
                "input": { "prompt": format!("say ok ({i})") },
                "expected": { "output": expected },
                "evaluation": { "strategy": "exact_match" }
            })
        })
        .collect();
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {
            "defaultTimeout": 30_000,
            "runner": {"type": "command", "script": "scripts/run.sh"}
        },
        "testCases": test_cases,
    });
    let secs = Duration::from_millis(sleep_ms).as_secs_f64();
    let files: Vec<(&str, Vec<u8>)> = vec![
        (
            "soak-skill/SKILL.md",
            b"---\nname: soak-skill\ndescription: Says ok after a short pause, for the fault soak.\n---\n\nSay ok.\n".to_vec(),
        ),
        ("soak-skill/eval/tests.json", serde_json::to_vec_pretty(&tests)?),
        (
            "soak-skill/scripts/run.sh",
            format!("cat > /dev/null\nsleep {secs}\necho ok\n").into_bytes(),
        ),
    ];
    let mut writer = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    for (name, bytes) in &files {
        writer.start_file(*name, options)?;
        writer.write_all(bytes)?;
    }
    Ok(writer.finish()?.into_inner())
}

/// The workers of the soak: the live ones, and SIGTERMed ones still draining.
struct Workers {
    env: Vec<(String, String)>,
    exe: PathBuf,
    live: Vec<Proc>,
    draining: Vec<Proc>,
}

impl Workers {
    fn start_one(&mut self) -> anyhow::Result<()> {
        let (proc, _) = Proc::spawn_exe(&self.exe, "worker", &self.env)?;
        self.live.push(proc);
        Ok(())
    }

    fn pick(&mut self) -> Option<Proc> {
        if self.live.is_empty() {
            return None;
        }
        let i = rand::random::<usize>() % self.live.len();
        Some(self.live.swap_remove(i))
    }

    /// Replaces workers that exited on their own (a worker gives up after too many failed
    /// reconnects) and forgets drained ones.
    fn tend(&mut self) -> anyhow::Result<usize> {
        let before = self.live.len();
        self.live.retain_mut(|p| p.try_exit().is_none());
        let lost = before - self.live.len();
        for _ in 0..lost {
            self.start_one()?;
        }
        self.draining.retain_mut(|p| p.try_exit().is_none());
        Ok(lost)
    }
}

async fn soak_in(scene: &Scene, opts: &SoakOptions) -> anyhow::Result<SoakReport> {
    let cache = tempfile::tempdir().context("package cache dir")?;
    let env = scene.env(opts, cache.path());
    let (_coordinator, port) = Proc::spawn_exe(&opts.exe, "coordinator", &env)?;
    let base = format!(
        "http://127.0.0.1:{}",
        port.context("the coordinator printed no port")?
    );
    let mut workers = Workers {
        env,
        exe: opts.exe.clone(),
        live: Vec::new(),
        draining: Vec::new(),
    };
    for _ in 0..opts.workers {
        workers.start_one()?;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;

    let zip = package_zip(opts.cases, opts.sleep_ms, opts.fail_every)?;
    let version_id = crate::cluster::upload_version(&http, &base, zip).await?;

    let start = Instant::now();
    let mut runs: Vec<(String, Instant, Option<Instant>)> = Vec::new();
    for _ in 0..opts.runs {
        let response = http
            .post(format!("{base}/v1/runs"))
            .json(&json!({ "version_id": version_id }))
            .send()
            .await?;
        let body = crate::cluster::expect_status(response, 202, "POST /v1/runs").await?;
        let run_id = body["run_id"]
            .as_str()
            .context("POST /v1/runs answered no run_id")?
            .to_string();
        runs.push((run_id, Instant::now(), None));
    }

    let mut census = UidCensus::default();
    let mut injected: Vec<(Instant, FaultKind)> = Vec::new();
    let mut next_fault = Instant::now() + opts.fault_every;
    // What the unfinished runs hold, said every so often: a slow soak shows where it waits.
    const PROGRESS_EVERY: Duration = Duration::from_secs(15);
    let mut next_progress = Instant::now() + PROGRESS_EVERY;
    let rotation: &[FaultKind] = match scene.broker {
        Broker::Vhost(_) => &FaultKind::ROTATION,
        Broker::Cluster(_) => &FaultKind::CLUSTER_ROTATION,
    };
    let mut rotation = rotation.iter().copied().cycle();
    let mut closing: Vec<tokio::task::JoinHandle<anyhow::Result<()>>> = Vec::new();
    // The node fault being undone (the node started again), if any.
    let mut node_fault: Option<tokio::task::JoinHandle<anyhow::Result<()>>> = None;
    // Node faults whose turn came while a node was still down: each waits for the node to be
    // back (a second node down would cost the queues their majority) and is then injected
    // before the rotation goes on, so a slow restart on a busy machine delays node faults but
    // never drops one from the rotation.
    let mut deferred: VecDeque<FaultKind> = VecDeque::new();
    // Progress: cases recorded over every run (as last read), and when that or the number of
    // completed runs last moved.
    let mut recorded: BTreeMap<String, u64> = BTreeMap::new();
    let mut progress = (0u64, 0usize);
    let mut last_progress = Instant::now();
    while runs.iter().any(|(_, _, done)| done.is_none()) {
        let now_progress = (
            recorded.values().sum::<u64>(),
            runs.iter().filter(|r| r.2.is_some()).count(),
        );
        if now_progress != progress {
            progress = now_progress;
            last_progress = Instant::now();
        }
        if last_progress.elapsed() > opts.stall {
            let pending: Vec<&str> = runs
                .iter()
                .filter(|r| r.2.is_none())
                .map(|r| r.0.as_str())
                .collect();
            let state = stuck_state(&scene.db_url, &pending, opts.cases).await;
            bail!(
                "runs made no progress for {:?} ({:.0} s into the soak): {pending:?}\n{state}",
                opts.stall,
                start.elapsed().as_secs_f64()
            );
        }
        let lost = workers.tend()?;
        if lost > 0 {
            eprintln!("soak: {lost} worker(s) exited on their own; replaced");
        }
        if Instant::now() >= next_fault {
            next_fault += opts.fault_every;
            let node_busy = node_fault.as_ref().is_some_and(|f| !f.is_finished());
            let mut next_kind = match deferred.front() {
                Some(_) if !node_busy => deferred.pop_front(),
                _ => rotation.next(),
            };
            while let Some(kind) = next_kind.filter(|k| k.is_node() && node_busy) {
                if !deferred.contains(&kind) {
                    deferred.push_back(kind);
                }
                // The rotation's next fault instead.
                next_kind = rotation.next();
            }
            if let Some(kind) = next_kind {
                injected.push((Instant::now(), kind));
                if let Some(slow) = inject(kind, scene, &mut workers).await? {
                    if kind.is_node() {
                        if let Some(done) = node_fault.replace(slow) {
                            closing.push(done);
                        }
                    } else {
                        closing.push(slow);
                    }
                }
            }
        }
        for (run_id, _, done) in runs.iter_mut().filter(|r| r.2.is_none()) {
            // The coordinator's own connections are knocked over too: a failed poll is retried.
            let Ok(response) = http.get(format!("{base}/v1/runs/{run_id}")).send().await else {
                continue;
            };
            let Ok(run) = response.json::<Value>().await else {
                continue;
            };
            if let Some(n) = run["counters"]["completed"].as_u64() {
                recorded.insert(run_id.clone(), n);
            }
            if run["status"] == "completed" {
                *done = Some(Instant::now());
            }
        }
        if Instant::now() >= next_progress {
            next_progress += PROGRESS_EVERY;
            let pending: Vec<&str> = runs
                .iter()
                .filter(|r| r.2.is_none())
                .map(|r| r.0.as_str())
                .collect();
            eprint!(
                "soak: {:.0} s\n{}",
                start.elapsed().as_secs_f64(),
                stuck_state(&scene.db_url, &pending, opts.cases).await
            );
        }
        census.sample();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    closing.extend(node_fault);
    for slow in closing {
        slow.await.context("a broker fault task panicked")??;
    }
    let mut report = SoakReport {
        duration: start.elapsed(),
        uids: census,
        ..SoakReport::default()
    };
    for (_, kind) in &injected {
        *report.faults.entry(*kind).or_default() += 1;
    }
    let mut db = PgConnection::connect(&scene.db_url).await?;
    for (run_id, created, done) in &runs {
        let finished = done.unwrap_or_else(Instant::now);
        let mut figures = figures_of(&mut db, run_id, opts).await?;
        figures.duration = finished.duration_since(*created);
        for (at, kind) in &injected {
            if *at >= *created && *at <= finished {
                *figures.faults.entry(*kind).or_default() += 1;
            }
        }
        report.runs.push(figures);
    }
    Ok(report)
}

/// Injects one fault. Closing broker connections goes through `rabbitmqctl` (an Erlang VM
/// start, about a second), so it runs on a blocking thread and its handle is returned: the
/// fault clock keeps its pace.
async fn inject(
    kind: FaultKind,
    scene: &Scene,
    workers: &mut Workers,
) -> anyhow::Result<Option<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    match kind {
        FaultKind::BrokerClose => {
            return Ok(Some(match &scene.broker {
                Broker::Vhost(vhost) => {
                    let vhost = vhost.clone();
                    tokio::task::spawn_blocking(move || vhost.close_connections())
                }
                Broker::Cluster(cluster) => {
                    let cluster = cluster.clone();
                    tokio::task::spawn_blocking(move || {
                        cluster.close_connections("soak: forced close");
                        Ok(())
                    })
                }
            }));
        }
        FaultKind::NodeKill | FaultKind::NodeStop => {
            let Broker::Cluster(cluster) = &scene.broker else {
                return Ok(None);
            };
            let cluster = cluster.clone();
            let node = rand::random::<usize>() % cluster.nodes.len();
            // Down for a couple of seconds, so clients notice and fail over, then back.
            return Ok(Some(tokio::task::spawn_blocking(move || {
                if kind == FaultKind::NodeKill {
                    cluster.kill(node);
                    std::thread::sleep(Duration::from_secs(2));
                    cluster.restart(node);
                } else {
                    cluster.stop_app(node);
                    std::thread::sleep(Duration::from_secs(2));
                    cluster.start_app(node);
                }
                Ok(())
            })));
        }
        FaultKind::DbTerminate => {
            terminate_backends(&scene.db_name).await?;
        }
        FaultKind::WorkerKill => {
            if let Some(victim) = workers.pick() {
                victim.signal(Signal::SIGKILL);
                // Dropping reaps it.
                drop(victim);
            }
            workers.start_one()?;
        }
        FaultKind::WorkerTerm => {
            if let Some(victim) = workers.pick() {
                victim.signal(Signal::SIGTERM);
                workers.draining.push(victim);
            }
            workers.start_one()?;
        }
    }
    Ok(None)
}

/// What the database holds of runs that did not complete, for the progress lines and the
/// stall's message: the run's counters and publishing watermark, and which cases have no row
/// yet. Whatever fails to be read is said so in the text: this runs on the way to an error.
async fn stuck_state(db_url: &str, run_ids: &[&str], cases: usize) -> String {
    let mut db = match PgConnection::connect(db_url).await {
        Ok(db) => db,
        Err(e) => return format!("(the database could not be read: {e})\n"),
    };
    let mut out = String::new();
    for run_id in run_ids {
        let Ok(id) = Uuid::parse_str(run_id) else {
            continue;
        };
        let run: Result<(String, i32, i32, i32, bool), sqlx::Error> = sqlx::query_as(
            "SELECT status, total, completed, published_through, finalised FROM runs \
             WHERE id = $1",
        )
        .bind(id)
        .fetch_one(&mut db)
        .await;
        let recorded: Result<Vec<(String,)>, sqlx::Error> =
            sqlx::query_as("SELECT test_case_id FROM eval_results WHERE run_id = $1")
                .bind(id)
                .fetch_all(&mut db)
                .await;
        out.push_str(&format!("run {run_id}: "));
        match run {
            Ok((status, total, completed, published, finalised)) => out.push_str(&format!(
                "status {status}, {completed}/{total} completed, published through {published}, \
                 finalised {finalised}"
            )),
            Err(e) => out.push_str(&format!("(its row could not be read: {e})")),
        }
        match recorded {
            Ok(rows) => {
                let have: std::collections::BTreeSet<&str> =
                    rows.iter().map(|r| r.0.as_str()).collect();
                let missing: Vec<String> = (0..cases)
                    .map(case_id)
                    .filter(|c| !have.contains(c.as_str()))
                    .collect();
                let shown: Vec<&str> = missing.iter().take(20).map(String::as_str).collect();
                out.push_str(&format!(
                    "; {} cases without a row: {shown:?}\n",
                    missing.len()
                ));
            }
            Err(e) => out.push_str(&format!("; (its rows could not be read: {e})\n")),
        }
    }
    out
}

/// A run's rows against the suite.
async fn figures_of(
    db: &mut PgConnection,
    run_id: &str,
    opts: &SoakOptions,
) -> anyhow::Result<RunFigures> {
    let id = Uuid::parse_str(run_id)?;
    let rows: Vec<(String, String, Option<Value>)> =
        sqlx::query_as("SELECT test_case_id, status, error FROM eval_results WHERE run_id = $1")
            .bind(id)
            .fetch_all(&mut *db)
            .await?;
    let expected: BTreeMap<String, &str> = (0..opts.cases)
        .map(|i| {
            let status = if expected_to_fail(i, opts.fail_every) {
                "failed"
            } else {
                "passed"
            };
            (case_id(i), status)
        })
        .collect();
    let mut f = RunFigures {
        run_id: run_id.to_string(),
        cases: opts.cases,
        rows: rows.len(),
        ..RunFigures::default()
    };
    f.passed.1 = expected.values().filter(|s| **s == "passed").count();
    f.failed.1 = expected.values().filter(|s| **s == "failed").count();
    let mut seen = std::collections::BTreeSet::new();
    for (case, status, error) in &rows {
        match status.as_str() {
            "passed" => f.passed.0 += 1,
            "failed" => f.failed.0 += 1,
            "errored" => {
                f.errored += 1;
                let message = error
                    .as_ref()
                    .and_then(|e| e["message"].as_str())
                    .unwrap_or("(no message)");
                // The first line of distinct messages, without the stderr's per-case noise.
                let head: String = message.chars().take(200).collect();
                if f.errors.len() < 5 && seen.insert(head.clone()) {
                    f.errors.push(head);
                }
            }
            _ => {}
        }
        if expected.get(case).copied() != Some(status.as_str()) {
            f.mismatched += 1;
        }
    }
    // A case without a row is not as the suite gives it either.
    f.mismatched += opts.cases.saturating_sub(rows.len());
    Ok(f)
}
