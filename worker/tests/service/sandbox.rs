//! A worker and its sandbox: a sandbox that fails before the skill's code runs is the host's
//! fault (retried, the case graded normally); a worker whose sandbox keeps failing, or that
//! has none, is not ready and takes no job until a probe passes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use skilleval_infra::config::Settings;
use tempfile::TempDir;

use crate::helpers::{eventually, metric_sum, Produce, TestEnv};

/// A stand-in for bubblewrap in a directory the sandbox's uid can read: the real one, except
/// that it starts the real one with a process limit of 1 for its uid (so bubblewrap's own
/// `clone` fails with EAGAIN, as on a uid already at its limit) while `<dir>/broken` exists,
/// or once per token directory it removes from `<dir>/tokens`.
struct StandIn {
    dir: TempDir,
}

impl StandIn {
    fn new() -> StandIn {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let tokens = dir.path().join("tokens");
        std::fs::create_dir(&tokens).expect("tokens dir");
        // The sandbox's uid takes the tokens.
        std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        StandIn { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("bwrap")
    }

    /// Writes the stand-in (until then the configured path does not exist).
    fn install(&self) {
        let real = ["/usr/bin/bwrap", "/bin/bwrap"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("bubblewrap is installed");
        let dir = self.dir.path().display();
        let script = format!(
            r#"#!/bin/sh
if [ -e '{dir}/broken' ]; then exec prlimit --nproc=1 -- {real} "$@"; fi
for t in '{dir}'/tokens/*; do
  if rmdir "$t" 2>/dev/null; then exec prlimit --nproc=1 -- {real} "$@"; fi
done
exec {real} "$@"
"#
        );
        std::fs::write(self.path(), script).expect("write the stand-in");
        std::fs::set_permissions(self.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }

    fn break_it(&self) {
        std::fs::write(self.dir.path().join("broken"), "").expect("break");
    }

    fn repair(&self) {
        std::fs::remove_file(self.dir.path().join("broken")).expect("repair");
    }

    /// The next `n` sandbox starts fail.
    fn fail_next(&self, n: usize) {
        for i in 0..n {
            let token = self.dir.path().join("tokens").join(i.to_string());
            std::fs::create_dir(&token).expect("token");
            std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o777))
                .expect("chmod");
        }
    }
}

fn settings_with(env: &TestEnv, name: &str, bwrap: &Path) -> Settings {
    let mut s = env.settings(name);
    s.sandbox.bwrap = Some(bwrap.to_path_buf());
    s.worker.sandbox_probe_interval_ms = 200;
    s
}

/// `/readyz`: status code and body.
async fn readyz(port: u16) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_failing_with_eagain_at_start_is_retried_and_the_case_graded_normally() {
    let env = TestEnv::new().await;
    let stand_in = StandIn::new();
    stand_in.install();
    let seeded = env.seed_run(6, &Produce::Sleep { secs: 0.05 }).await;
    let mut settings = settings_with(&env, "eagain", &stand_in.path());
    // Six faults must not close the gate here: this is about the retry.
    settings.worker.host_fault_threshold = 100;
    let w = env.start_worker(settings).await;
    stand_in.fail_next(6);
    env.publish(&seeded.jobs).await;

    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(40))
        .await;
    assert_eq!((c.passed, c.errored), (6, 0), "{c:?}");
    env.assert_run_consistent(&seeded).await;
    let metrics = w.worker.metrics().encode().unwrap();
    assert_eq!(
        metric_sum(&metrics, "skilleval_worker_host_faults_total"),
        6,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "skilleval_worker_retries_total"),
        6,
        "{metrics}"
    );
    let leftover = std::fs::read_dir(stand_in.dir.path().join("tokens"))
        .unwrap()
        .count();
    assert_eq!(leftover, 0, "every failing start was taken");
    let rows: Vec<(Option<serde_json::Value>,)> =
        sqlx::query_as("SELECT error FROM eval_results WHERE run_id = $1")
            .bind(seeded.run_id)
            .fetch_all(env.store.pool())
            .await
            .unwrap();
    assert!(rows.iter().all(|(e,)| e.is_none()), "{rows:?}");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_sandbox_breaks_goes_not_ready_and_comes_back() {
    let env = TestEnv::new().await;
    let stand_in = StandIn::new();
    stand_in.install();
    let seeded = env.seed_run(30, &Produce::Sleep { secs: 0.05 }).await;
    let mut settings = settings_with(&env, "breaks", &stand_in.path());
    settings.worker.host_fault_threshold = 3;
    settings.worker.max_attempts = 6;
    settings.worker.concurrency = 2;
    let w = env.start_worker(settings).await;
    let (addr, _http) = w.worker.serve_http(w.shutdown.clone()).await.unwrap();
    eventually(Duration::from_secs(30), "ready", || async {
        readyz(addr.port())
            .await
            .is_some_and(|(code, _)| code == 200)
    })
    .await;

    stand_in.break_it();
    env.publish(&seeded.jobs).await;
    eventually(Duration::from_secs(30), "not ready, saying why", || async {
        readyz(addr.port()).await.is_some_and(|(code, body)| {
            code == 503 && body.contains("sandbox failed") && body.contains("Resource")
        })
    })
    .await;
    assert!(w.worker.sandbox_problem().is_some());
    // While broken, nothing is graded: the jobs wait for a working sandbox.
    let before = env.counters(seeded.run_id).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = env.counters(seeded.run_id).await;
    assert_eq!(
        before.completed, during.completed,
        "no job taken while broken"
    );
    assert_eq!(during.errored, 0, "{during:?}");

    stand_in.repair();
    eventually(Duration::from_secs(30), "ready again", || async {
        readyz(addr.port())
            .await
            .is_some_and(|(code, _)| code == 200)
    })
    .await;
    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(60))
        .await;
    assert_eq!((c.passed, c.errored), (30, 0), "{c:?}");
    env.assert_run_consistent(&seeded).await;
    let metrics = w.worker.metrics().encode().unwrap();
    assert!(
        metric_sum(&metrics, "skilleval_worker_host_faults_total") >= 3,
        "{metrics}"
    );
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_a_sandbox_is_not_ready_and_takes_no_job_until_it_has_one() {
    let env = TestEnv::new().await;
    // Configured, but not there yet: as on a host without bubblewrap.
    let stand_in = StandIn::new();
    let seeded = env.seed_run(5, &Produce::Sleep { secs: 0.05 }).await;
    let w = env
        .start_worker(settings_with(&env, "nobwrap", &stand_in.path()))
        .await;
    let (addr, _http) = w.worker.serve_http(w.shutdown.clone()).await.unwrap();
    let (code, body) = readyz(addr.port()).await.expect("readyz answers");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("no working sandbox") && body.contains("apt-get install bubblewrap"),
        "{body}"
    );

    env.publish(&seeded.jobs).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c = env.counters(seeded.run_id).await;
    assert_eq!(c.completed, 0, "took a job without a sandbox: {c:?}");
    assert_eq!(w.processed(), 0);

    stand_in.install();
    eventually(
        Duration::from_secs(30),
        "ready once bubblewrap is there",
        || async {
            readyz(addr.port())
                .await
                .is_some_and(|(code, _)| code == 200)
        },
    )
    .await;
    let c = env
        .wait_for_run(seeded.run_id, Duration::from_secs(30))
        .await;
    assert_eq!(c.passed, 5, "{c:?}");
    env.assert_run_consistent(&seeded).await;
    w.stop().await.unwrap();
}
