//! The runners skilleval ships, registered by name in one place: `given`, `command`, `llm`,
//! `trigger` and `agent`, the model-backed ones on the given provider clients.

use std::sync::Arc;

use super::{agent, command, given, RunnerRegistry};
use crate::runner::llm::LlmRunner;
use crate::runner::trigger::TriggerRunner;
use skilleval_providers::ProviderClients;

impl RunnerRegistry {
    /// Every runner, `llm` without a provider (see [`RunnerRegistry::with_providers`]).
    pub fn builtin() -> Self {
        RunnerRegistry::with_providers(None)
    }

    /// `given`, `command`, and `llm` producing with `providers` (none: `llm` refuses to produce
    /// and says a provider is needed).
    pub fn with_providers(providers: Option<&Arc<ProviderClients>>) -> Self {
        RunnerRegistry::default()
            .with(Arc::new(given::GivenRunner))
            .with(Arc::new(command::CommandRunner))
            .with(Arc::new(LlmRunner::new(providers.cloned())))
            .with(Arc::new(TriggerRunner::new(providers.cloned())))
            .with(Arc::new(agent::AgentRunner::new(providers.cloned())))
    }
}
