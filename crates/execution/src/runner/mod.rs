//! Output runners: how a test case's output is produced before it is graded.
//!
//! `given` takes a recorded output supplied with the case or the job; `command` runs a package
//! script in the sandbox with the test input as JSON on stdin; `llm` ([`crate::runner::llm`])
//! asks a model provider; `agent` ([`agent`]) runs a tool-calling loop in a sandbox. All four are
//! registered by name in [`RunnerRegistry::with_providers`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use skilleval_grading::GradeEnv;
use skilleval_model::definition::{Given, RunnerConfig, TestCase};
use skilleval_model::grade::Fault;
use skilleval_model::output::Produced;

pub mod agent;
pub mod builtin;
pub mod command;
pub mod given;
pub mod llm;
pub mod trigger;

/// What a runner is asked to produce.
#[derive(Debug, Clone, Copy)]
pub struct ProduceRequest<'a> {
    /// The resolved case: prompt templated, strategy filled in.
    pub case: &'a TestCase,
    pub runner: &'a RunnerConfig,
    /// A recorded output sent with the job (production samples), before the case's own.
    pub given: Option<&'a Given>,
    /// Package-level environment from `setup.environment`.
    pub environment: &'a BTreeMap<String, String>,
    /// Time left for this attempt; a sandboxed process is killed when it runs out.
    pub timeout: std::time::Duration,
    /// The case workspace the package's `setup.script` prepared and its `teardown.script`
    /// will see ([`crate::case_scripts`]): the `agent`'s `/workspace`, mounted at `/workspace`
    /// for a `command` script. `None` (no such script): a runner that wants one makes its own.
    pub workspace: Option<&'a crate::case_scripts::CaseWorkspace>,
}

/// Produces a test case's output.
#[async_trait]
pub trait OutputRunner: Send + Sync {
    fn name(&self) -> &'static str;

    /// Whether this runner needs a model provider the registry was built without (then it
    /// refuses to produce, and callers report a configuration problem, not a failing case).
    fn missing_provider(&self) -> bool {
        false
    }

    /// Whether this runner honours the "without the skill" option
    /// ([`crate::variant::WITHOUT_SKILL_OPTION`], a baseline's variant): produces the
    /// output with the skill left out (the bare model, an agent without it in its catalogue).
    /// A runner that cannot (a script is the skill) gets no baseline: such a job is recorded
    /// `skipped` with the reason, never run with the skill in disguise.
    fn runs_without_skill(&self) -> bool {
        false
    }

    async fn produce(&self, req: &ProduceRequest<'_>, env: &GradeEnv) -> Result<Produced, Fault>;
}

/// Runners by name.
#[derive(Clone, Default)]
pub struct RunnerRegistry {
    by_name: BTreeMap<&'static str, Arc<dyn OutputRunner>>,
}

impl fmt::Debug for RunnerRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunnerRegistry")
            .field("runners", &self.by_name.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RunnerRegistry {
    pub fn with(mut self, runner: Arc<dyn OutputRunner>) -> Self {
        self.by_name.insert(runner.name(), runner);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn OutputRunner>> {
        self.by_name.get(name)
    }

    /// Whether the runner named `kind` can run a job without the skill (a baseline).
    pub fn runs_without_skill(&self, kind: &str) -> bool {
        self.get(kind).is_some_and(|r| r.runs_without_skill())
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }
}
