//! Model providers in the worker: with providers configured (`llm` in the settings), their
//! clients use the fleet's Postgres-backed response cache and rate limiter instead of the CLI's
//! folder cache and in-process buckets; the executor is then built by the same
//! [`ExecutorBuilder`] as `skilleval run`'s.

use std::sync::Arc;
use std::time::Duration;

use skilleval_execution::environment::Environments;
use skilleval_execution::executor::{Executor, ExecutorBuilder};
use skilleval_infra::config::Settings;
use skilleval_infra::store::llm::{PgRateLimiter, PgResponseCache, WriteBehindCache};
use skilleval_infra::store::Store;
use skilleval_providers::{ConfigError, ProviderClients, RateLimiter, ResponseCache};
use skilleval_sandbox::Sandbox;

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

/// The executor a worker runs jobs with: every strategy and runner, the model-backed ones on
/// the configured providers (when there are any); sandboxed as configured. Also returns the
/// provider clients (for their request counts in `/metrics`).
pub fn build_executor(
    settings: &Settings,
    store: &Store,
) -> Result<(Executor, Option<Arc<ProviderClients>>), ConfigError> {
    let clients = provider_clients(settings, store)?;
    if let Some(clients) = &clients {
        tracing::info!(
            providers = ?clients.providers().providers.keys().collect::<Vec<_>>(),
            "model providers configured"
        );
    }
    let executor = ExecutorBuilder::new()
        .providers(clients.clone())
        .sandbox(Sandbox::detect(settings.sandbox.clone()))
        .environments(Arc::new(Environments::new(settings.environments.clone())))
        .build()
        .with_content_capture(settings.telemetry.capture_model_content);
    Ok((executor, clients))
}
