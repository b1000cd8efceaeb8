//! Agent mode of the catalogue lane (`coordinator.catalogue.mode = "agent"`,
//! docs/catalogue.md): the coordinator's sandbox, detected once at start from `sandbox` as a
//! worker's executor does, and the picker of one eval: the version's package read from the
//! store and extracted (the hardened extraction of a worker's package cache) into a folder the
//! eval owns, at `/skill` for the `agent` runner. A coordinator without a working sandbox is a
//! configuration problem, never a collision.

use std::sync::Arc;

use skilleval_execution::catalogue::Picker;
use skilleval_execution::triggers::AgentTriggers;
use skilleval_infra::config::{CatalogueMode, CatalogueSettings, Settings};
use skilleval_infra::store::Store;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_sandbox::{Sandbox, SandboxMode};

/// What agent-mode collision evals need of the coordinator: the sandbox the agent runs in
/// (detected once at start from `sandbox`, as a worker's executor does) and the limits a
/// version's package is extracted under.
#[derive(Clone)]
pub struct CatalogueAgent {
    sandbox: Arc<Sandbox>,
    limits: PackageLimits,
}

impl std::fmt::Debug for CatalogueAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogueAgent")
            .field("sandbox", &self.sandbox.mode())
            .finish_non_exhaustive()
    }
}

impl CatalogueAgent {
    /// `None` unless the catalogue lane runs in agent mode. A coordinator without a working
    /// sandbox starts anyway (uploads and runs need none) and says so; each eval then fails
    /// as a configuration problem.
    pub fn from_settings(settings: &Settings) -> Option<Self> {
        let catalogue = &settings.coordinator.catalogue;
        if !catalogue.enabled || catalogue.mode != CatalogueMode::Agent {
            return None;
        }
        let agent = CatalogueAgent {
            sandbox: Arc::new(Sandbox::detect(settings.sandbox.clone())),
            limits: settings.limits.clone(),
        };
        if let Some(problem) = agent.sandbox_problem() {
            tracing::warn!(problem, "collision evals in agent mode will fail");
        }
        Some(agent)
    }

    /// Why the agent cannot run here: a configuration problem of the coordinator's host.
    pub(crate) fn sandbox_problem(&self) -> Option<String> {
        (self.sandbox.mode() == SandboxMode::Refusing).then(|| {
            format!(
                "coordinator.catalogue.mode = \"agent\" runs the agent in a sandbox, and this coordinator has no working sandbox ({}); install bubblewrap on the coordinator's host (Debian/Ubuntu: `apt-get install bubblewrap`) or set coordinator.catalogue.mode = \"model\"",
                self.sandbox
                    .unavailable_reason()
                    .unwrap_or_else(|| "bubblewrap is not usable".to_string())
            )
        })
    }
}

/// Why agent mode could not be set up for an eval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentSetupError {
    /// This coordinator cannot run the agent as configured (no sandbox): retrying won't help.
    Configuration(String),
    /// Reading or extracting the version's package failed.
    Host(String),
}

impl std::fmt::Display for AgentSetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentSetupError::Configuration(m) => write!(f, "configuration problem: {m}"),
            AgentSetupError::Host(m) => f.write_str(m),
        }
    }
}

/// How the eval's runs pick, from `coordinator.catalogue.mode`: in agent mode, the sandbox is
/// checked first, then the version's package is read from the store and extracted into a
/// folder of its own (as a worker's package cache extracts it), which lives as long as the
/// returned `TempDir`: keep it until the eval is done.
pub(crate) async fn picker_for(
    store: &Store,
    settings: &CatalogueSettings,
    agent: Option<&CatalogueAgent>,
    package_hash: &str,
) -> Result<(Picker, Option<tempfile::TempDir>), AgentSetupError> {
    use std::os::unix::fs::PermissionsExt;
    if settings.mode == CatalogueMode::Model {
        return Ok((Picker::Model, None));
    }
    let agent = agent.ok_or_else(|| {
        AgentSetupError::Configuration(
            "coordinator.catalogue.mode = \"agent\", but this coordinator set up no sandbox for it"
                .into(),
        )
    })?;
    if let Some(problem) = agent.sandbox_problem() {
        return Err(AgentSetupError::Configuration(problem));
    }
    let host =
        |what: &str, e: &dyn std::fmt::Display| AgentSetupError::Host(format!("{what}: {e}"));
    let bytes = store
        .package_bytes(package_hash)
        .await
        .map_err(|e| host("reading the version's package", &e))?
        .ok_or_else(|| AgentSetupError::Host("the version's package is not stored".into()))?;
    let dir = tempfile::Builder::new()
        .prefix("skilleval-catalogue-")
        .tempdir()
        .map_err(|e| host("a folder for the version's package", &e))?;
    // The sandbox's uid must pass through to the package.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .map_err(|e| host("a folder for the version's package", &e))?;
    let dest = dir.path().join("package");
    let limits = agent.limits.clone();
    let root = tokio::task::spawn_blocking(move || Package::extract_files(&bytes, &limits, &dest))
        .await
        .map_err(|e| host("extracting the version's package", &e))?
        .map_err(|e| host("extracting the version's package", &e))?;
    let picker = Picker::Agent(AgentTriggers {
        sandbox: agent.sandbox.clone(),
        package_root: root,
        max_turns: settings.agent_max_turns.clamp(1, 20),
        timeout: std::time::Duration::from_secs(settings.agent_timeout_secs.max(1)),
    });
    Ok((picker, Some(dir)))
}
