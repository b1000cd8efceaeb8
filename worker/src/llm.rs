//! Model providers in the worker: with providers configured (`llm` in the settings), the
//! executor gets the real model-backed strategies and the `llm` runner, registered through the
//! same shared functions as `skilleval run`, but with the fleet's Postgres-backed response
//! cache and rate limiter instead of the CLI's folder cache and in-process buckets. Without
//! providers the executor is the built-in one, unchanged.

use std::sync::Arc;
use std::time::Duration;

use skilleval::executor::Executor;
use skilleval::llm::{self, ConfigError, ProviderClients, RateLimiter, ResponseCache};
use skilleval::runner::RunnerRegistry;
use skilleval::sandbox::Sandbox;
use skilleval::strategy::StrategyRegistry;
use skilleval_infra::config::Settings;
use skilleval_infra::store::llm::{PgRateLimiter, PgResponseCache, WriteBehindCache};
use skilleval_infra::store::Store;

/// The clients of the configured providers, on the fleet's cache and limits; `None` when no
/// provider is configured. Fails when a provider's API key variable is not set.
pub fn provider_clients(
    settings: &Settings,
    store: &Store,
) -> Result<Option<Arc<ProviderClients>>, ConfigError> {
    let providers = &settings.llm.providers;
    if providers.is_empty() {
        return Ok(None);
    }
    let pg = PgResponseCache::new(store.pool().clone())
        .with_ttl(settings.llm.cache_ttl_secs.map(Duration::from_secs));
    // Writes batched off the call's path (inside a runtime, which a worker always is).
    let cache: Arc<dyn ResponseCache> = match WriteBehindCache::start(pg.clone()) {
        Some(batched) => Arc::new(batched),
        None => Arc::new(pg),
    };
    let rate: Arc<dyn RateLimiter> = Arc::new(PgRateLimiter::for_providers(
        store.pool().clone(),
        providers,
    ));
    let clients = ProviderClients::connect(providers, &cache, Some(rate))?;
    Ok(Some(Arc::new(clients)))
}

/// The executor a worker runs jobs with: built-in strategies and runners, plus the model-backed
/// ones when providers are configured; sandboxed as configured.
pub fn build_executor(settings: &Settings, store: &Store) -> Result<Executor, ConfigError> {
    let sandbox = Arc::new(Sandbox::detect(settings.sandbox.clone()));
    let (strategies, runners) = match provider_clients(settings, store)? {
        Some(clients) => {
            tracing::info!(
                providers = ?clients.providers().providers.keys().collect::<Vec<_>>(),
                "model providers configured"
            );
            (
                llm::register_strategies(StrategyRegistry::builtin(), &clients).build(),
                llm::register_runner(RunnerRegistry::builtin(), &clients),
            )
        }
        None => (
            StrategyRegistry::builtin().build(),
            RunnerRegistry::builtin(),
        ),
    };
    Ok(Executor::new(strategies, runners, sandbox))
}
