//! The [`Sandbox`] handle: a policy and the shared view of the host it runs processes on. Its
//! one-shot runs are in the `command` module, its sessions in `session`.
//!
//! Without bubblewrap (or with one that cannot create namespaces here) the sandbox refuses to
//! run anything ([`SandboxError::NoSandbox`](crate::policy::SandboxError::NoSandbox)) unless
//! the policy allows unsandboxed execution; then the process still gets the limits, its own
//! uid, a process group, the timeout, the output cap and the scrubbed environment, but it can
//! use the network and see the host's files.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use crate::host::Host;
use crate::lease::{Identity, UID_POOL_BASE, UID_POOL_SIZE};
use crate::policy::{SandboxEnvironment, SandboxMode, SandboxPolicy};
use crate::tools::find_tool;

/// Runs processes under a [`SandboxPolicy`]. Cheap to clone: what was found out about the
/// host (tools, interpreters, whether bubblewrap works) is shared and probed once per process
/// and bubblewrap binary; [`Sandbox::probe`] looks again after a failure.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub policy: SandboxPolicy,
    host: Arc<HostCell>,
    /// Mounted read-only into every process and session of this handle.
    environment: Option<Arc<SandboxEnvironment>>,
}

/// What is known about the host for one bubblewrap binary; replaced when a probe finds the
/// host changed (bubblewrap installed or repaired).
#[derive(Debug)]
struct HostCell {
    bwrap: Option<PathBuf>,
    current: std::sync::RwLock<Arc<Host>>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::detect(SandboxPolicy::default())
    }
}

impl Sandbox {
    /// Same as [`Sandbox::detect`].
    pub fn new(policy: SandboxPolicy) -> Self {
        Sandbox::detect(policy)
    }

    /// Finds bubblewrap (the policy's `bwrap`, else the system directories, then PATH) and
    /// checks once per process that it works here.
    pub fn detect(policy: SandboxPolicy) -> Self {
        let bwrap = match &policy.bwrap {
            Some(path) => Some(path.clone()),
            None => find_tool("bwrap"),
        };
        Sandbox::with_bwrap_path(policy, bwrap)
    }

    /// Uses this bubblewrap binary, or none (`None`: as if bubblewrap were not installed).
    pub fn with_bwrap_path(policy: SandboxPolicy, bwrap: Option<PathBuf>) -> Self {
        static HOSTS: OnceLock<Mutex<BTreeMap<Option<PathBuf>, Arc<HostCell>>>> = OnceLock::new();
        let hosts = HOSTS.get_or_init(Mutex::default);
        let mut hosts = hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let host = hosts
            .entry(bwrap.clone())
            .or_insert_with(|| {
                Arc::new(HostCell {
                    current: std::sync::RwLock::new(Arc::new(Host::discover(bwrap.clone()))),
                    bwrap,
                })
            })
            .clone();
        Sandbox {
            policy,
            host,
            environment: None,
        }
    }

    /// The same sandbox with `environment` mounted read-only into every process it runs
    /// (one-shot runs and sessions alike), its variables set and its directories first on
    /// `PATH`.
    #[must_use]
    pub fn with_environment(&self, environment: Arc<SandboxEnvironment>) -> Sandbox {
        Sandbox {
            environment: Some(environment),
            ..self.clone()
        }
    }

    /// The environment this handle mounts, if any.
    pub fn environment(&self) -> Option<&SandboxEnvironment> {
        self.environment.as_deref()
    }

    pub(crate) fn host(&self) -> Arc<Host> {
        self.host
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How processes are run under this policy on this host.
    pub fn mode(&self) -> SandboxMode {
        self.mode_of(&self.host())
    }

    /// Why bubblewrap is not used, when it is not.
    pub fn unavailable_reason(&self) -> Option<String> {
        self.host().bwrap_problem.clone()
    }

    /// Which uid sandboxed processes run as, for logs.
    pub fn identity(&self) -> String {
        match &self.host().identity {
            Identity::Pool { .. } => format!(
                "a private uid per run ({UID_POOL_BASE}..{})",
                UID_POOL_BASE + UID_POOL_SIZE
            ),
            Identity::Shared(uid) => format!("uid {uid}, shared by every run"),
            Identity::Inherit => "this process's uid".to_string(),
        }
    }

    /// Looks at the host again (a blocking look, off the runtime) and keeps what it finds if
    /// bubblewrap is usable now; `Err` says why it is not.
    pub(crate) async fn rediscover(&self) -> Result<(), String> {
        let bwrap = self.host.bwrap.clone();
        let fresh = tokio::task::spawn_blocking(move || Host::discover(bwrap))
            .await
            .map_err(|e| format!("looking at the host: {e}"))?;
        if fresh.bwrap.is_none() {
            return Err(fresh
                .bwrap_problem
                .unwrap_or_else(|| "bubblewrap is not usable".to_string()));
        }
        *self
            .host
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }

    pub(crate) fn mode_of(&self, host: &Host) -> SandboxMode {
        if host.bwrap.is_some() {
            SandboxMode::Bubblewrap
        } else if self.policy.allow_unsandboxed {
            SandboxMode::Unsandboxed
        } else {
            SandboxMode::Refusing
        }
    }
}
