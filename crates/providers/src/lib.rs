//! Model providers: the only crate that talks to a model over the network. It sends chat and
//! embedding requests (OpenAI-compatible chat completions and embeddings, the Anthropic
//! Messages API, tool use included), prices them, caches answers, enforces rate and
//! concurrency limits, and retries transient faults within bounds (the one place below the
//! executor that waits: see [`client`]). It produces no case's output and grades nothing: the
//! `llm` and `agent` runners (`skilleval_execution`) and the model-backed strategies
//! (`skilleval_grading`) are built on it.
//!
//! Layout:
//! - [`config`]: [`Providers`] by name ([`ProviderConfig`]: endpoint, model, key variable,
//!   prices, limits), from TOML or the `SKILLEVAL_PROVIDER_*` variables; [`ApiKey`].
//! - [`chat`]: requests and answers, provider-neutral; [`tools`]: tool-use turns for agents.
//! - [`client`]: [`LlmClient`], one per provider, with the call layer around every request:
//!   response [`cache`], [`limit`]s (adaptive concurrency, requests/tokens per minute) and
//!   bounded retries of transient [`faults`] honouring `Retry-After`.
//! - [`ask`] + [`json`]: a JSON answer of a known shape from a model, recovered when fenced,
//!   wrapped in prose or truncated, corrected once, else a fault carrying the raw answer;
//!   [`fence`]: untrusted text put in a prompt as data.
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
