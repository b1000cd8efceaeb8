//! What is known about this host for one bubblewrap binary: whether that bubblewrap works, the
//! tools and interpreters, and which identity runs get. [`Host::discover`] finds out once,
//! with the start-up probe: `true` run through the whole command line (lease, limits,
//! bubblewrap) under each identity, best first, until one works; the first that does is the
//! identity of every later run. A bubblewrap that fails under all of them is not used (why is
//! kept, for `Sandbox::unavailable_reason`), and the identity is then the first that works
//! without it, for unsandboxed runs should the policy allow them.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::argv::{self, Plan};
use crate::lease::{uid_lock_dir, Identity, UidLease, NOBODY};
use crate::policy::{SandboxBind, SandboxEnvironment, SandboxError, SandboxPolicy, SandboxRequest};
use crate::tools::{find_tool, Tools};

/// What was found out about this host, once per process.
#[derive(Debug)]
pub(crate) struct Host {
    /// A bubblewrap that passed the functional check.
    pub(crate) bwrap: Option<PathBuf>,
    pub(crate) bwrap_problem: Option<String>,
    pub(crate) tools: Tools,
    pub(crate) identity: Identity,
}

impl Host {
    pub(crate) fn discover(bwrap: Option<PathBuf>) -> Host {
        let is_root = nix::unistd::geteuid().is_root();
        let mut host = Host {
            bwrap: None,
            bwrap_problem: None,
            tools: Tools::find(is_root),
            identity: Identity::Inherit,
        };

        // Identities to try, best first.
        let mut identities = Vec::new();
        if is_root && host.tools.setpriv.is_some() {
            if let Some(lock_dir) = uid_lock_dir() {
                identities.push(Identity::Pool { lock_dir });
            }
            identities.push(Identity::Shared(NOBODY));
        } else {
            identities.push(Identity::Inherit);
        }

        let policy = SandboxPolicy::default();
        let mut problems = Vec::new();
        if let Some(bwrap) = bwrap {
            host.bwrap = Some(bwrap);
            for identity in &identities {
                host.identity = identity.clone();
                match host.probe(&policy) {
                    Ok(()) => {
                        tracing::info!(identity = ?host.identity, "sandbox: bubblewrap works");
                        return host;
                    }
                    Err(problem) => problems.push(format!("as {identity:?}: {problem}")),
                }
            }
            host.bwrap = None;
            let problem = format!("bubblewrap failed its check: {}", problems.join("; "));
            tracing::warn!(%problem, "sandbox: bubblewrap is not usable");
            host.bwrap_problem = Some(problem);
        } else {
            host.bwrap_problem = Some("`bwrap` is not on PATH".to_string());
        }
        // Pick the identity unsandboxed runs will use, should the policy allow them.
        for identity in &identities {
            host.identity = identity.clone();
            if host.probe(&policy).is_ok() {
                return host;
            }
        }
        host.identity = identities.last().cloned().unwrap_or(Identity::Inherit);
        host
    }

    /// [`Host::lease`] on a blocking thread: the census reads `/proc`, which must not hold up
    /// the runtime's workers (the agent runner opens sessions from many tasks at once).
    pub(crate) async fn lease_off_runtime(
        host: &Arc<Host>,
    ) -> Result<Option<UidLease>, SandboxError> {
        let host = host.clone();
        tokio::task::spawn_blocking(move || host.lease())
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(format!("leasing a uid: {e}"))))?
    }

    /// A uid for one run under this host's identity.
    fn lease(&self) -> Result<Option<UidLease>, SandboxError> {
        self.identity.lease(&|uid| self.kill_uid_blocking(uid))
    }

    /// Kills every process of a private uid, waiting for `kill` itself (not for the victims
    /// to be reaped: that is their parent's business, and the census skips the uid until then).
    fn kill_uid_blocking(&self, uid: u32) {
        if let Some(sweep) = argv::sweep_for_uid(&self.tools, uid) {
            if let Some((program, args)) = sweep.split_first() {
                // Failing (ESRCH: nothing left) is the usual outcome and changes nothing.
                let _ = std::process::Command::new(program)
                    .args(args)
                    .env_clear()
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }

    /// [`Host::probe_once`], up to three times: one failed start (a transient shortage) must
    /// not decide the identity for the life of the process.
    fn probe(&self, policy: &SandboxPolicy) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            match self.probe_once(policy) {
                Ok(()) => return Ok(()),
                Err(problem) => last = problem,
            }
        }
        Err(last)
    }

    /// Runs `true` through the full command line, synchronously, under a leased uid.
    fn probe_once(&self, policy: &SandboxPolicy) -> Result<(), String> {
        let lease = self.lease().map_err(|e| e.to_string())?;
        let uid = lease.as_ref().map(|l| l.uid);
        let req = SandboxRequest {
            argv: vec!["true".into()],
            package_root: PathBuf::from("/usr"),
            stdin: Vec::new(),
            timeout: Duration::from_secs(10),
            env: BTreeMap::new(),
        };
        let tmp = std::env::temp_dir();
        let scratch = if self.bwrap.is_some() {
            None
        } else {
            Some(tmp.as_path())
        };
        let program = find_tool("true").unwrap_or_else(|| PathBuf::from("/bin/true"));
        let plan = self
            .plan(
                policy,
                &req,
                &program,
                Path::new("/usr"),
                uid,
                scratch,
                &[],
                None,
            )
            .map_err(|e| e.to_string())?;
        let (program, args) = plan.argv.split_first().ok_or("empty command line")?;
        let out = std::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .current_dir(plan.cwd.as_deref().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not start {}: {e}", program.to_string_lossy()))?;
        if let Some(lease) = lease.as_ref().filter(|l| l.private) {
            self.kill_uid_blocking(lease.uid);
        }
        drop(lease);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} ({})",
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status
            ))
        }
    }

    /// [`argv::plan`] with this host's tools and bubblewrap.
    // The same independent inputs as `argv::plan`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan(
        &self,
        policy: &SandboxPolicy,
        req: &SandboxRequest,
        program: &Path,
        package: &Path,
        uid: Option<u32>,
        scratch: Option<&Path>,
        binds: &[SandboxBind],
        environment: Option<&SandboxEnvironment>,
    ) -> Result<Plan, SandboxError> {
        argv::plan(
            &self.tools,
            self.bwrap.as_deref(),
            policy,
            req,
            program,
            package,
            uid,
            scratch,
            binds,
            environment,
        )
    }

    /// The command that kills everything a private uid still owns.
    pub(crate) fn sweep_command(&self, lease: Option<&UidLease>) -> Option<Vec<OsString>> {
        let lease = lease.filter(|l| l.private)?;
        argv::sweep_for_uid(&self.tools, lease.uid)
    }
}
