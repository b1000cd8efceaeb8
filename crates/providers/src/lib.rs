//! Model providers and everything that calls them but grades no case: the `llm` runner, the A/B
//! comparator, trigger evals, and the pure arithmetic of baselines, repeats and budgets. The
//! model-backed strategies (`llm_judge`, `assertions`, `semantic_sim`) live with the others in
//! `skilleval_grading` and get their clients from here.
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
//! - [`comparator`] (A/B comparison of two outputs); [`triggers`] (does the skill's
//!   description make a model pick it).
//! - [`benchmark`] (pass@k, uplift, skill-creator's `benchmark.json`) and [`budget`]: pure.
//!
//! The CLI builds [`ProviderClients`] with a [`cache::DirCache`] and in-process limits; the
//! service builds them with its Postgres-backed [`cache::ResponseCache`] and
//! [`limit::RateLimiter`]. Both then hand them to the one
//! `skilleval_execution::executor::ExecutorBuilder`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use skilleval_model::grade::Fault;

mod anthropic;
pub mod ask;
pub mod cache;
pub mod chat;
pub mod client;
pub mod config;
pub mod faults;
pub mod fence;
pub mod json;
pub mod limit;
mod openai;
pub mod tools;

pub use cache::{CacheOwner, DirCache, MemoryCache, NoCache, ResponseCache};
pub use chat::{ChatRequest, ChatResponse, Message, OutputSchema};
pub use client::LlmClient;
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

    /// Every client, by provider name.
    pub fn clients(&self) -> impl Iterator<Item = &Arc<LlmClient>> {
        self.clients.values()
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
