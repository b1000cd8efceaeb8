//! Running the service as child processes, for the benchmarks and the soak: the coordinator
//! and the worker as their binaries run them (this program re-executed with a role), the
//! local PostgreSQL and RabbitMQ they connect to, and the faults a soak injects into them.
//!
//! A program using this module dispatches on its first argument with [`child_main`] before
//! anything else; [`Proc::spawn`] re-executes it with a role. Children are configured through
//! the environment, exactly like the binaries.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use anyhow::{bail, Context};
use skilleval_infra::config::Settings;
use skilleval_infra::store::Store;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use tokio_util::sync::CancellationToken;

/// PostgreSQL admin URL without a database (`SKILLEVAL_BENCH_PG`).
pub fn pg_base() -> String {
    std::env::var("SKILLEVAL_BENCH_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// RabbitMQ URL of the default vhost (`SKILLEVAL_BENCH_AMQP`).
pub fn amqp_url() -> String {
    std::env::var("SKILLEVAL_BENCH_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// Runs the child role named by the first argument, if there is one: `Some(outcome)` means
/// this process was a child and must exit with it.
pub fn child_main() -> Option<anyhow::Result<()>> {
    match std::env::args().nth(1).as_deref() {
        Some("coordinator") => Some(child_coordinator()),
        Some("worker") => Some(child_worker()),
        Some("serve") => Some(crate::mock_provider::serve()),
        _ => None,
    }
}

/// `coordinator`: the coordinator as its binary runs it; prints its port on stdout.
fn child_coordinator() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    let mut telemetry = skilleval_infra::telemetry::init(
        &settings.log,
        &settings.telemetry,
        "skilleval-coordinator",
    )?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let app = skilleval_coordinator::startup::Application::build(settings).await?;
        println!("{}", app.port());
        std::io::stdout().flush()?;
        let token = app.shutdown_token();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::spawn(async move {
            term.recv().await;
            token.cancel();
        });
        app.run_until_stopped().await
    })?;
    telemetry.shutdown();
    Ok(())
}

/// `worker`: the worker as `skilleval-worker` runs it (without the health/metrics server):
/// SIGTERM stops it gracefully, SIGKILL does not.
fn child_worker() -> anyhow::Result<()> {
    let settings = Settings::load()?;
    let mut telemetry =
        skilleval_infra::telemetry::init(&settings.log, &settings.telemetry, "skilleval-worker")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::connect(&settings.database).await?;
        let worker = Arc::new(
            skilleval_worker::Worker::new(settings, store)?
                .with_evaluation_events(telemetry.evaluations()),
        );
        let shutdown = CancellationToken::new();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let on_term = shutdown.clone();
        tokio::spawn(async move {
            term.recv().await;
            on_term.cancel();
        });
        worker.run(shutdown).await?;
        anyhow::Ok(())
    })?;
    telemetry.shutdown();
    Ok(())
}

/// A child process, killed when dropped (also when the program fails half-way).
#[derive(Debug)]
pub struct Proc {
    child: Child,
    pid: u32,
}

impl Proc {
    /// Re-executes this program as `role` with `env` added. The coordinator's port (and the
    /// mock provider's address) is its first line of stdout, returned. `PIPELINE_BENCH_LOG`
    /// (a `RUST_LOG` filter, default `warn`) sets the children's logging.
    pub fn spawn(role: &str, env: &[(String, String)]) -> anyhow::Result<(Proc, Option<String>)> {
        Proc::spawn_exe(&std::env::current_exe()?, role, env)
    }

    /// [`Proc::spawn`] of another program that dispatches with [`child_main`] (a test runs
    /// the soak binary this way).
    pub fn spawn_exe(
        exe: &Path,
        role: &str,
        env: &[(String, String)],
    ) -> anyhow::Result<(Proc, Option<String>)> {
        let mut cmd = Command::new(exe);
        cmd.arg(role)
            .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
            .env(
                "RUST_LOG",
                std::env::var("PIPELINE_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
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
        if role == "coordinator" || role == "serve" {
            let stdout = child.stdout.take().context("child stdout")?;
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line)?;
            if line.trim().is_empty() {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the {role} process did not start (see its error above)");
            }
            first_line = Some(line.trim().to_string());
        }
        Ok((Proc { child, pid }, first_line))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn peak_rss_mib(&self) -> f64 {
        status_kib(self.pid, "VmHWM:").map_or(0.0, |kb| kb / 1024.0)
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.pid).unwrap_or(0.0)
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal`; a process that already exited is not an error.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// Reaps the process if it exited; `Some(success)` then.
    pub fn try_exit(&mut self) -> Option<bool> {
        self.child.try_wait().ok().flatten().map(|s| s.success())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn status_kib(pid: u32, field: &str) -> Option<f64> {
    proc_status_kib(&pid.to_string(), field)
}

/// A `kB` field (`VmHWM:`, `VmRSS:`) of `/proc/<pid>/status`; `pid` may be `self`.
pub fn proc_status_kib(pid: &str, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User + system CPU seconds of a process (clock ticks of 1/100 s).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    proc_cpu_seconds(&pid.to_string())
}

/// [`cpu_seconds`] of `/proc/<pid>`; `pid` may be `self`.
pub fn proc_cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// The eval definition of a refund-questions suite of `n` cases produced by the `llm` runner
/// (one model call each) and graded locally by `regex_match`; `prompt(i)` is case `i`'s prompt
/// (it must quote an order number for the patterns to pass).
pub fn llm_refund_tests(n: usize, prompt: impl Fn(usize) -> String) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "id": format!("case-{i:06}"),
                "input": {"prompt": prompt(i)},
                "expected": {"patterns": [r"order \d+", r"(?i)business days"]},
                "evaluation": {"strategy": "regex_match"}
            })
        })
        .collect();
    serde_json::json!({
        "version": "2.0",
        "settings": {"runner": "llm"},
        "testCases": cases
    })
}

// ---------------------------------------------------------------- faults

fn rabbitmqctl(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .context("running rabbitmqctl (installed with RabbitMQ; needs the broker's cookie)")?;
    if !out.status.success() {
        bail!(
            "rabbitmqctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A RabbitMQ vhost of its own (guest may use it), deleted with everything in it by
/// [`Vhost::delete`]: faults injected into it reach nobody else on the broker.
#[derive(Debug, Clone)]
pub struct Vhost {
    pub name: String,
}

impl Vhost {
    pub fn create(name: &str) -> anyhow::Result<Vhost> {
        rabbitmqctl(&["add_vhost", name])?;
        rabbitmqctl(&["set_permissions", "-p", name, "guest", ".*", ".*", ".*"])?;
        Ok(Vhost {
            name: name.to_string(),
        })
    }

    /// The AMQP URL of this vhost on the broker of [`amqp_url`].
    pub fn url(&self) -> String {
        let base = amqp_url();
        let root = base
            .rsplit_once('/')
            .map_or(base.as_str(), |(root, _)| root);
        format!("{root}/{}", self.name)
    }

    /// Force-closes every client connection of the vhost, in one `rabbitmqctl` call (each
    /// call starts an Erlang VM, about a second: closing connections one call each held a
    /// soak's fault clock for several seconds).
    pub fn close_connections(&self) -> anyhow::Result<()> {
        rabbitmqctl(&[
            "close_all_connections",
            "--vhost",
            &self.name,
            "--limit",
            "100000",
            "--quiet",
            "soak: forced close",
        ])
        .map(drop)
    }

    pub fn delete(&self) -> anyhow::Result<()> {
        rabbitmqctl(&["delete_vhost", &self.name]).map(drop)
    }
}

/// Runs `bench(database_url, queue_prefix)` against a database and a queue prefix of its own
/// (`skilleval_<name>…`, `<name><12 hex>`), then removes both, whether the benchmark finished,
/// failed or was interrupted with ctrl-c.
pub async fn in_scratch<F, Fut>(name: &str, bench: F) -> anyhow::Result<()>
where
    F: FnOnce(String, String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let id = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("{name}{}", &id[..12]);
    let (db_name, db_url) = create_database(&format!("skilleval_{name}")).await?;
    let outcome = tokio::select! {
        r = bench(db_url, prefix.clone()) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    drop_database(&db_name).await;
    let deleted = async {
        let conn =
            lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await?;
        let mut settings = Settings::default();
        settings.amqp.prefix.clone_from(&prefix);
        delete_topology(
            &conn,
            &skilleval_infra::topology::Topology::from_settings(&settings),
        )
        .await?;
        let _ = conn
            .close(200, lapin::types::ShortString::from("bench done"))
            .await;
        anyhow::Ok(())
    };
    if let Err(e) = deleted.await {
        eprintln!("cleanup: deleting the queues of {prefix}: {e}");
    }
    outcome
}

/// Deletes every queue and exchange of `topology` (what a benchmark's children declared under
/// its prefix). Each object gets a fresh channel: deleting one never declared (a run that
/// failed early) fails and closes its channel.
pub async fn delete_topology(
    conn: &lapin::Connection,
    topology: &skilleval_infra::topology::Topology,
) -> anyhow::Result<()> {
    for q in topology.queues() {
        let ch = conn.create_channel().await?;
        let _ = ch
            .queue_delete(
                lapin::types::ShortString::from(q.as_str()),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    }
    for x in topology.exchanges() {
        let ch = conn.create_channel().await?;
        let _ = ch
            .exchange_delete(
                lapin::types::ShortString::from(x.as_str()),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
    Ok(())
}

/// Terminates every backend connected to `db_name` (and only that database); returns how
/// many.
pub async fn terminate_backends(db_name: &str) -> anyhow::Result<usize> {
    let mut admin = PgConnection::connect(&format!("{}/postgres", pg_base())).await?;
    let rows: Vec<(bool,)> = sqlx::query_as(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(db_name)
    .fetch_all(&mut admin)
    .await?;
    Ok(rows.iter().filter(|(ok,)| *ok).count())
}

/// Creates an empty database named `<prefix>_<random>` on the local server and returns its
/// name and URL; [`drop_database`] removes it.
pub async fn create_database(prefix: &str) -> anyhow::Result<(String, String)> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let db_name = format!("{prefix}_{}", &id[..16]);
    let mut admin = PgConnection::connect(&format!("{}/postgres", pg_base()))
        .await
        .context("connecting to PostgreSQL's maintenance database")?;
    sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db_name}\"")))
        .execute(&mut admin)
        .await
        .with_context(|| format!("creating the database {db_name}"))?;
    let url = format!("{}/{db_name}", pg_base());
    Ok((db_name, url))
}

/// Drops a database [`create_database`] made, closing its connections. Errors are printed, not
/// returned: a cleanup must run to its end.
pub async fn drop_database(db_name: &str) {
    match PgConnection::connect(&format!("{}/postgres", pg_base())).await {
        Ok(mut admin) => {
            let drop = format!("DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)");
            if let Err(e) = sqlx::query(AssertSqlSafe(drop)).execute(&mut admin).await {
                eprintln!("cleanup: dropping {db_name}: {e}");
            }
        }
        Err(e) => eprintln!("cleanup: connecting to PostgreSQL: {e}"),
    }
}

/// The JSON body of `response`, which must have answered `status` (`what` names the request in
/// the error).
pub async fn expect_status(
    response: reqwest::Response,
    status: u16,
    what: &str,
) -> anyhow::Result<serde_json::Value> {
    let got = response.status();
    let body: serde_json::Value = response.json().await?;
    if got.as_u16() != status {
        anyhow::bail!("{what} answered {got}: {body}");
    }
    Ok(body)
}

/// Uploads a package to the coordinator at `base` without running it; returns the version id.
pub async fn upload_version(
    http: &reqwest::Client,
    base: &str,
    zip: Vec<u8>,
) -> anyhow::Result<String> {
    let response = http
        .post(format!("{base}/v1/skills?run=false"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    let body = expect_status(response, 201, "the upload").await?;
    Ok(body["version_id"]
        .as_str()
        .context("the upload answered no version_id")?
        .to_string())
}
