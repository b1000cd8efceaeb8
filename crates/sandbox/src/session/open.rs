//! Opening a session: the sandbox's command line with the session's mounts, its loop started
//! and answering, its processes found, and, when the case names hosts, the allowed-hosts proxy
//! served inside its network namespace.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::inside::Inside;
use super::{SandboxSession, SESSION_CONTROL_DIR, SESSION_DRIVER, SESSION_START_TIMEOUT};
use crate::argv::STARTED_MARKER;
use crate::egress::{self, AllowedHosts, EgressProxy};
use crate::host::Host;
use crate::lease::chown_tree;
use crate::output::{Tail, STDERR_KEEP};
use crate::policy::{SandboxBind, SandboxError, SandboxMode, SandboxRequest};
use crate::reaper::Reaper;
use crate::sandbox::Sandbox;
use crate::tools::check_world_readable;

impl Sandbox {
    /// Starts a long-lived sandbox: `package_root` read-only at `/skill`, each of `binds`
    /// where it says, and `control` (an empty host directory) at [`SESSION_CONTROL_DIR`].
    /// Bubblewrap only: without it a session would run the model's commands on the host, so
    /// it is refused even when the policy allows unsandboxed runs.
    ///
    /// The sandbox has no network; with `allowed` hosts it gets the proxy of
    /// [`crate::egress`] on its loopback (`HTTP_PROXY`/`HTTPS_PROXY` set), which reaches those
    /// hosts only.
    pub async fn open_session(
        &self,
        package_root: &Path,
        binds: &[SandboxBind],
        control: &Path,
        mut env: BTreeMap<String, String>,
        allowed: &AllowedHosts,
    ) -> Result<SandboxSession, SandboxError> {
        let host = self.host();
        if self.mode_of(&host) != SandboxMode::Bubblewrap {
            return Err(SandboxError::NoSandbox);
        }
        let package = std::fs::canonicalize(package_root)?;
        let lease = Host::lease_off_runtime(&host).await?;
        let uid = lease.as_ref().map(|l| l.uid);
        let mut all = binds.to_vec();
        all.push(SandboxBind {
            source: control.to_path_buf(),
            dest: SESSION_CONTROL_DIR,
            writable: true,
        });
        if let Some(uid) = uid {
            check_world_readable(&package).map_err(|reason| SandboxError::PackageNotReadable {
                path: package.clone(),
                reason: format!("{reason} (the sandbox runs as uid {uid})"),
            })?;
            for b in all.iter().filter(|b| b.writable) {
                chown_tree(&b.source, uid)?;
            }
        }
        if !allowed.is_empty() {
            let proxy = format!("http://127.0.0.1:{}", egress::PROXY_PORT);
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.insert(name.to_string(), proxy.clone());
            }
            env.remove("NO_PROXY");
            env.remove("no_proxy");
        }
        let req = SandboxRequest {
            argv: vec!["sh".into(), "-c".into(), SESSION_DRIVER.into()],
            package_root: package.clone(),
            stdin: Vec::new(),
            timeout: Duration::MAX,
            env,
        };
        let program = host.tools.resolve_program("sh")?;
        let plan = host.plan(
            &self.policy,
            &req,
            &program,
            &package,
            uid,
            None,
            &all,
            self.environment(),
        )?;
        let (mut child, pgid) = plan.spawn()?;
        // No `kill -1` sweep as the uid (two more programs to start per case): every
        // process of a session is in its pid namespace, which the kernel empties when its
        // init dies ([`SandboxSession::close`] kills it by pidfd; bubblewrap's
        // --die-with-parent kills it if we die), and the next lease's census still skips
        // the uid until its last task is gone.
        let guard = Reaper::new(pgid, None, lease);
        let io_missing = || {
            SandboxError::Io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the session's pipes were not set up",
            ))
        };
        let stdin = child.stdin.take().ok_or_else(io_missing)?;
        let stdout = child.stdout.take().ok_or_else(io_missing)?;
        let stderr_tail = Arc::new(Mutex::new(Tail::with_marker(STDERR_KEEP, STARTED_MARKER)));
        if let Some(mut err) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 4096];
                while let Ok(n) = err.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut t) = tail.lock() {
                        t.push(&chunk[..n]);
                    }
                }
            });
        }
        let mut session = SandboxSession {
            child,
            stdin,
            stdout: tokio::io::BufReader::new(stdout),
            ctl: control.to_path_buf(),
            guard,
            next: 0,
            max_output: self.policy.max_output_bytes,
            stderr: stderr_tail,
            broken: false,
            egress: None,
            inside: None,
        };
        let mut line = String::new();
        let ready = tokio::time::timeout(
            SESSION_START_TIMEOUT,
            tokio::io::AsyncBufReadExt::read_line(&mut session.stdout, &mut line),
        )
        .await;
        if !matches!(ready, Ok(Ok(_)) if line.trim() == "ready") {
            let diagnostics = session.diagnostics();
            session.close().await;
            return Err(SandboxError::Machinery {
                status: "the session did not start".to_string(),
                diagnostics,
            });
        }
        let found = session
            .child
            .id()
            .ok_or_else(|| std::io::Error::other("the session's bubblewrap has already exited"))
            .and_then(Inside::find);
        match found {
            Ok(inside) => session.inside = Some(Arc::new(inside)),
            Err(e) => {
                let diagnostics = format!("{e}; {}", session.diagnostics());
                session.close().await;
                return Err(SandboxError::Machinery {
                    status: "the session's processes could not be found".to_string(),
                    diagnostics,
                });
            }
        }
        if !allowed.is_empty() {
            match session
                .open_egress(allowed.clone(), self.policy.allow_private_egress)
                .await
            {
                Ok(proxy) => session.egress = Some(proxy),
                Err(e) => {
                    session.close().await;
                    return Err(e);
                }
            }
        }
        Ok(session)
    }
}

impl Sandbox {
    /// A fresh directory for one session's host-side files (see
    /// [`SandboxPolicy::session_dir`](crate::policy::SandboxPolicy::session_dir)), removed
    /// when dropped.
    pub fn session_scratch(&self, prefix: &str) -> std::io::Result<tempfile::TempDir> {
        let builder = {
            let mut b = tempfile::Builder::new();
            b.prefix(prefix);
            b
        };
        if let Some(dir) = &self.policy.session_dir {
            return builder.tempdir_in(dir);
        }
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            if let Ok(dir) = builder.tempdir_in(shm) {
                return Ok(dir);
            }
        }
        builder.tempdir()
    }
}

impl SandboxSession {
    /// Serves the allowed-hosts proxy inside the session's network namespace: that of
    /// bubblewrap's init (bubblewrap itself stays in the host's namespaces).
    async fn open_egress(
        &self,
        allowed: AllowedHosts,
        allow_private: bool,
    ) -> Result<EgressProxy, SandboxError> {
        let setup = |why: String| SandboxError::Egress(egress::EgressError::Setup(why));
        let inside = self
            .inside
            .as_ref()
            .ok_or_else(|| setup("the sandbox's processes were not found".into()))?;
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        let theirs = std::fs::read_link(format!("/proc/{}/ns/net", inside.init))
            .map_err(|e| setup(format!("reading the sandbox's network namespace: {e}")))?;
        if ours == theirs {
            return Err(setup(
                "the sandbox shares the host's network namespace".into(),
            ));
        }
        let listener = egress::listen_in(inside.init, egress::PROXY_PORT).await?;
        Ok(EgressProxy::serve(listener, allowed, allow_private))
    }
}
