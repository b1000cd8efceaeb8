//! One sandboxed process run to its end ([`Sandbox::run`]): the uid lease, the command line,
//! the output read under its caps, the wall-clock timeout, and the reaping of everything it
//! started.
//!
//! **Whose fault.** The program is started through `sh -c 'printf MARKER >&2; exec "$0" "$@"'`
//! inside the sandbox (`exec`, so no extra process stays): the marker on stderr is the proof
//! that the sandbox machinery (prlimit, setpriv, bubblewrap) got as far as the skill's
//! program. A run that ends without it failed before any of the skill's code ran (bubblewrap
//! could not fork or create its namespaces, setpriv could not exec it): that is
//! [`SandboxError::Machinery`], a fault of the host, with the tools' own diagnostics. What
//! happens after the marker (a crash, the skill's own fork bomb hitting the process limit) is
//! the skill's. The marker is removed from the stderr the caller sees.
//!
//! Because the sandbox runs under another uid, a package directory must be world-readable:
//! package loaders extract with directories 0755 and files 0644, and [`Sandbox::run`] refuses a
//! package root that uid cannot reach, with an error saying so.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use crate::argv::{display_argv, Plan, STARTED_MARKER};
use crate::host::Host;
use crate::lease::{chown_tree, Identity, UidLease, UID_POOL_BASE};
use crate::output::{read_capped, read_tail, Tail, STDERR_KEEP};
use crate::policy::{SandboxBind, SandboxError, SandboxMode, SandboxOutput, SandboxRequest};
use crate::reaper::Reaper;
use crate::sandbox::Sandbox;
use crate::tools::check_world_readable;

/// After the main process exits, how long leftover children may keep its pipes open.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// After a kill, how long to keep reading what was already written to the pipes.
const KILL_DRAIN: Duration = Duration::from_secs(1);

impl Sandbox {
    /// Checks that a run can be had right now: `true` through the whole machinery (lease,
    /// limits, bubblewrap). A sandbox that refuses (no usable bubblewrap) looks at the host
    /// again first, so installing or repairing bubblewrap is noticed without a restart.
    /// `Err` says what failed.
    pub async fn probe(&self) -> Result<(), String> {
        if self.mode() == SandboxMode::Refusing {
            self.rediscover().await?;
        }
        let req = SandboxRequest {
            argv: vec!["sh".into(), "-c".into(), "exit 0".into()],
            package_root: PathBuf::from("/usr"),
            stdin: Vec::new(),
            timeout: Duration::from_secs(10),
            env: BTreeMap::new(),
        };
        match self.run(req).await {
            Ok(out) if out.exit_code == Some(0) => Ok(()),
            Ok(out) => Err(format!(
                "a trivial program failed ({}): {}",
                out.exit_code
                    .map_or_else(|| "killed".to_string(), |c| format!("exit code {c}")),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs one process to completion, timeout, or output limit, and reaps everything it
    /// started.
    pub async fn run(&self, req: SandboxRequest) -> Result<SandboxOutput, SandboxError> {
        self.run_with_binds(req, &[]).await
    }

    /// [`Sandbox::run`] with extra directories mounted (bubblewrap only: an unsandboxed run
    /// sees the host, so the caller passes host paths instead).
    pub async fn run_with_binds(
        &self,
        req: SandboxRequest,
        binds: &[SandboxBind],
    ) -> Result<SandboxOutput, SandboxError> {
        // One view of the host for the whole run, even if a probe replaces it meanwhile.
        let host = self.host();
        let mode = self.mode_of(&host);
        if mode == SandboxMode::Refusing {
            return Err(SandboxError::NoSandbox);
        }
        if mode == SandboxMode::Unsandboxed {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    reason = host.bwrap_problem.as_deref().unwrap_or("not installed"),
                    "bubblewrap is not usable: running untrusted package code WITHOUT a sandbox (resource limits only; network and host files are reachable)"
                );
            }
        }
        let Some(program) = req.argv.first() else {
            return Err(SandboxError::Spawn {
                program: String::new(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
            });
        };
        let package = std::fs::canonicalize(&req.package_root)?;
        let lease = Host::lease_off_runtime(&host).await?;
        let uid = lease.as_ref().map(|l| l.uid);
        if let Some(uid) = uid {
            check_world_readable(&package).map_err(|reason| SandboxError::PackageNotReadable {
                path: package.clone(),
                reason: format!("{reason} (the sandbox runs as uid {uid})"),
            })?;
            for b in binds.iter().filter(|b| b.writable) {
                chown_tree(&b.source, uid)?;
            }
        }
        let program = host.tools.resolve_program(program)?;
        // Unsandboxed, HOME and TMPDIR are a private scratch directory on the host.
        let scratch = match mode {
            SandboxMode::Unsandboxed => Some(scratch_dir(uid)?),
            _ => None,
        };
        let plan = host.plan(
            &self.policy,
            &req,
            &program,
            &package,
            uid,
            scratch.as_ref().map(tempfile::TempDir::path),
            binds,
            self.environment(),
        )?;
        tracing::debug!(argv = ?plan.argv, "sandbox: spawning");
        let out = self.execute(&host, plan, &req, lease).await;
        drop(scratch);
        let out = out?;
        if !out.started && !out.timed_out && !out.stdout_truncated {
            let status = out
                .exit_code
                .map_or_else(|| "killed".to_string(), |c| format!("exit code {c}"));
            let diagnostics = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(SandboxError::Machinery {
                status,
                diagnostics: if diagnostics.is_empty() {
                    "(no diagnostics)".to_string()
                } else {
                    diagnostics
                },
            });
        }
        Ok(out)
    }

    async fn execute(
        &self,
        host: &Host,
        plan: Plan,
        req: &SandboxRequest,
        lease: Option<UidLease>,
    ) -> Result<SandboxOutput, SandboxError> {
        let start = Instant::now();
        let (mut child, pgid) = plan.spawn()?;
        // Kills the group (and the run's uid) if this future is dropped mid-run, e.g. by the
        // executor's own timeout.
        let mut guard = Reaper::new(pgid, host.sweep_command(lease.as_ref()), lease);

        let stdin_task = child.stdin.take().map(|mut stdin| {
            let data = req.stdin.clone();
            // A script that never reads stdin must not block the run: write concurrently and
            // ignore a closed pipe.
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
                let _ = stdin.shutdown().await;
            })
        });
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();

        let limit = self.policy.max_output_bytes;
        let mut out_buf = Vec::new();
        let mut err_tail = Tail::with_marker(STDERR_KEEP, STARTED_MARKER);
        let mut status = None;
        let mut timed_out = false;
        let mut truncated = false;
        let mut killed = false;
        {
            let out_fut = read_capped(stdout.as_mut(), &mut out_buf, limit);
            let err_fut = read_tail(stderr.as_mut(), &mut err_tail);
            tokio::pin!(out_fut, err_fut);
            let timer = tokio::time::sleep_until((start + req.timeout).into());
            tokio::pin!(timer);
            let mut out_done = false;
            let mut err_done = false;
            let mut draining = false;
            loop {
                if out_done && err_done && status.is_some() {
                    break;
                }
                tokio::select! {
                    cut = &mut out_fut, if !out_done => {
                        out_done = true;
                        if cut && !killed {
                            // A flood of output: stop it now rather than read it all.
                            truncated = true;
                            killed = true;
                            guard.kill().await;
                            timer.as_mut().reset((Instant::now() + KILL_DRAIN).into());
                        }
                    }
                    () = &mut err_fut, if !err_done => err_done = true,
                    st = child.wait(), if status.is_none() => {
                        status = Some(st?);
                        let pipes_open = !(out_done && err_done);
                        if pipes_open && !killed && !draining {
                            // The main process is gone but something it started still holds
                            // its pipes; give it a moment, then kill it.
                            draining = true;
                            let grace = (Instant::now() + EXIT_GRACE).min(start + req.timeout);
                            timer.as_mut().reset(grace.into());
                        }
                    }
                    () = &mut timer => {
                        if killed {
                            // Pipes still open after a kill (an escaped daemon): stop reading.
                            break;
                        }
                        timed_out = status.is_none();
                        killed = true;
                        guard.kill().await;
                        timer.as_mut().reset((Instant::now() + KILL_DRAIN).into());
                    }
                }
            }
        }
        // Always reap the child, even when the loop gave up on its pipes.
        let status = match status {
            Some(st) => st,
            None => {
                guard.kill().await;
                child.wait().await?
            }
        };
        guard.finish().await;
        if let Some(task) = stdin_task {
            task.abort();
        }
        let duration = start.elapsed();
        let exit_code = match (status.code(), status.signal()) {
            (Some(code), _) => Some(code),
            (None, Some(_)) if killed => None,
            (None, Some(sig)) => Some(128 + sig),
            (None, None) => None,
        };
        let started = err_tail.started();
        let (stderr, stderr_truncated) = err_tail.finish();
        Ok(SandboxOutput {
            exit_code,
            stdout: out_buf,
            stderr,
            stderr_truncated,
            stdout_truncated: truncated,
            timed_out,
            duration,
            started,
        })
    }

    /// The command line [`Sandbox::run`] would spawn for `req` (with a placeholder uid), for
    /// logs and diagnostics.
    pub fn describe(&self, req: &SandboxRequest) -> Result<String, SandboxError> {
        let host = self.host();
        let program = req
            .argv
            .first()
            .map_or(Ok(PathBuf::new()), |p| host.tools.resolve_program(p))?;
        let uid = match &host.identity {
            Identity::Pool { .. } => Some(UID_POOL_BASE),
            Identity::Shared(uid) => Some(*uid),
            Identity::Inherit => None,
        };
        let scratch = (self.mode() == SandboxMode::Unsandboxed).then_some(Path::new("$SCRATCH"));
        let plan = host.plan(
            &self.policy,
            req,
            &program,
            &req.package_root,
            uid,
            scratch,
            &[],
            self.environment(),
        )?;
        Ok(display_argv(&plan.argv))
    }
}

/// A private HOME/TMPDIR for an unsandboxed run, owned by the run's uid.
fn scratch_dir(uid: Option<u32>) -> Result<tempfile::TempDir, SandboxError> {
    let dir = tempfile::Builder::new()
        .prefix("skilleval-sandbox-")
        .tempdir()?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid))?;
    }
    Ok(dir)
}
