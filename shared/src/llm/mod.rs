//! Model providers and everything that calls them: the `llm` runner, the model-backed
//! strategies (`llm_judge`, `assertions`, `semantic_sim`), the A/B comparator, trigger evals,
//! and the pure arithmetic of baselines, repeats and budgets.
//!
//! Layout:
//! - [`config`]: [`Providers`] by name ([`ProviderConfig`]: endpoint, model, key variable,
//!   prices, limits), from TOML or the `SKILLEVAL_PROVIDER_*` variables; [`ApiKey`].
//! - [`client`]: [`LlmClient`], one per provider — OpenAI-compatible chat completions and
//!   embeddings, the Anthropic Messages API — with the call layer around every request:
//!   response [`cache`], [`limit`]s (adaptive concurrency, requests/tokens per minute) and
//!   bounded retries of transient [`faults`] honouring `Retry-After`.
//! - [`ask`] + [`json`]: a JSON answer of a known shape from a model, recovered when fenced,
//!   wrapped in prose or truncated, corrected once, else a fault carrying the raw answer.
//! - [`runner`]: the `llm` runner (SKILL.md as system prompt; baseline without it; repeats).
//! - [`llm_judge`], [`assertions`], [`semantic_sim`]: the strategies, registered over the
//!   placeholders by [`register_strategies`]; [`comparator`]; [`triggers`].
//! - [`benchmark`] (pass@k, uplift, skill-creator's `benchmark.json`) and [`budget`]: pure.
//!
//! The CLI builds [`ProviderClients`] with a [`cache::DirCache`] and in-process limits; the
//! service builds them with its Postgres-backed [`cache::ResponseCache`] and
//! [`limit::RateLimiter`]. Both then register the same runner and strategies.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::grade::Fault;
use crate::model::TestCase;
use crate::problem::Problem;
use crate::runner::RunnerRegistry;
use crate::strategy::{CompileContext, StrategyRegistryBuilder};

mod anthropic;
pub mod ask;
pub mod assertions;
pub mod benchmark;
pub mod budget;
pub mod cache;
pub mod client;
pub mod comparator;
pub mod config;
pub mod faults;
pub mod json;
pub mod limit;
pub mod llm_judge;
mod openai;
pub mod runner;
pub mod semantic_sim;
pub mod triggers;

#[cfg(test)]
mod tests;

pub use cache::{DirCache, MemoryCache, NoCache, ResponseCache};
pub use client::{ChatRequest, ChatResponse, LlmClient, Message, OutputSchema};
pub use config::{ApiKey, ConfigError, ProviderConfig, ProviderKind, Providers};
pub use limit::{LocalRateLimiter, RateLimiter};

/// The option a test case names its provider with (`evaluation.options.provider`).
pub const PROVIDER_OPTION: &str = "provider";

/// What a provider is wanted for (each has its own default in [`Providers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Produce,
    Judge,
    Embed,
}

/// The clients of every configured provider.
#[derive(Debug, Default)]
pub struct ProviderClients {
    providers: Providers,
    clients: BTreeMap<String, Arc<LlmClient>>,
}

impl ProviderClients {
    /// Builds a client per provider, reading each key from its `api_key_env` variable once.
    /// Without `rate`, per-process token buckets are built from the providers'
    /// `requests_per_minute` / `tokens_per_minute`.
    pub fn connect(
        providers: &Providers,
        cache: &Arc<dyn ResponseCache>,
        rate: Option<Arc<dyn RateLimiter>>,
    ) -> Result<Self, ConfigError> {
        providers.check()?;
        let rate: Arc<dyn RateLimiter> = match rate {
            Some(r) => r,
            None => {
                let limits: HashMap<String, (Option<u32>, Option<u64>)> = providers
                    .providers
                    .values()
                    .map(|p| (p.name.clone(), (p.requests_per_minute, p.tokens_per_minute)))
                    .collect();
                Arc::new(LocalRateLimiter::new(limits))
            }
        };
        let mut clients = ProviderClients::new(providers.clone());
        for p in providers.providers.values() {
            let key = ApiKey::from_env(p)?;
            let client = LlmClient::new(p.clone(), key)?
                .with_cache(cache.clone())
                .with_rate_limiter(rate.clone());
            clients.insert(client);
        }
        Ok(clients)
    }

    /// No clients yet (add them with [`ProviderClients::insert`]).
    pub fn new(providers: Providers) -> Self {
        ProviderClients {
            providers,
            clients: BTreeMap::new(),
        }
    }

    /// Adds a client under its provider's name (the first one becomes the default).
    pub fn insert(&mut self, client: LlmClient) {
        let name = client.name().to_string();
        if !self.providers.providers.contains_key(&name) {
            self.providers.insert(client.config().clone(), false);
        }
        self.clients.insert(name, Arc::new(client));
    }

    pub fn providers(&self) -> &Providers {
        &self.providers
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<LlmClient>> {
        self.clients.get(name)
    }

    /// The client for `purpose`: the one named, else the purpose's default.
    pub fn pick(&self, named: Option<&str>, purpose: Purpose) -> Result<Arc<LlmClient>, String> {
        let name = match named {
            Some(n) => Some(n),
            None => match purpose {
                Purpose::Produce => self.providers.default_name(),
                Purpose::Judge => self.providers.judge_name(),
                Purpose::Embed => self.providers.embeddings_name(),
            },
        };
        let Some(name) = name else {
            return Err(
                "no default model provider is configured; set `default` in skilleval.toml".into(),
            );
        };
        self.clients.get(name).cloned().ok_or_else(|| {
            format!(
                "unknown provider `{name}`; configured: {}",
                self.clients.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// [`ProviderClients::pick`] as a permanent fault.
    pub fn pick_or_fault(
        &self,
        named: Option<&str>,
        purpose: Purpose,
    ) -> Result<Arc<LlmClient>, Fault> {
        self.pick(named, purpose).map_err(Fault::permanent)
    }
}

/// The provider a case names in option `provider`, resolved at compile time (a problem at the
/// option when it is not a configured one).
pub(crate) fn case_client(
    clients: &ProviderClients,
    case: &TestCase,
    ctx: &CompileContext<'_>,
    purpose: Purpose,
    strategy: &str,
) -> Result<Arc<LlmClient>, Vec<Problem>> {
    let named = case.option(PROVIDER_OPTION);
    let pointer = if case.evaluation.options.contains_key(PROVIDER_OPTION) {
        "/evaluation/options/provider"
    } else {
        "/expected/provider"
    };
    let named = match named {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(vec![ctx.problem(
                pointer,
                format!("{strategy}: option `provider` must be a provider name"),
            )])
        }
    };
    clients.pick(named, purpose).map_err(|message| {
        let at = if named.is_some() {
            pointer
        } else {
            "/evaluation/strategy"
        };
        vec![ctx.problem(at, format!("{strategy}: {message}"))]
    })
}

/// Registers the model-backed strategies over their placeholders.
pub fn register_strategies(
    builder: StrategyRegistryBuilder,
    clients: &Arc<ProviderClients>,
) -> StrategyRegistryBuilder {
    builder
        .register(Arc::new(llm_judge::LlmJudge::new(clients.clone())))
        .register(Arc::new(assertions::Assertions::new(clients.clone())))
        .register(Arc::new(semantic_sim::SemanticSim::new(clients.clone())))
}

/// Adds the `llm` runner.
pub fn register_runner(registry: RunnerRegistry, clients: &Arc<ProviderClients>) -> RunnerRegistry {
    registry.with(Arc::new(runner::LlmRunner::new(clients.clone())))
}
