//! Building and running the coordinator: [`Application::build`] connects and migrates the
//! database, connects the broker and declares the topology, binds the listener (port 0 picks a
//! free port, read back with [`Application::port`]) and starts the background tasks;
//! [`Application::run_until_stopped`] serves until the shutdown token is cancelled (SIGTERM or
//! ctrl-c in the binary), then stops every task and waits for them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use skilleval_grading::zod::ZodConverter;
use skilleval_grading::StrategyRegistry;
use skilleval_infra::config::{RetentionSettings, Settings};
use skilleval_infra::failover::BrokerNodes;
use skilleval_infra::store::tenancy::Swept;
use skilleval_infra::store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::aggregate::RunAggregator;
use crate::alerts::AlertScheduler;
use crate::auth::{AuthConfig, Tokens};
use crate::broker::{consume, consume_events, BrokerJobSink};
use crate::collisions::CollisionLane;
use crate::jobs::JobSink;
use crate::metrics::Metrics;
use crate::parked::{ParkingDrain, PARKING_PREFETCH};
use crate::policy::AccessPolicy;
use crate::routes::router;
use crate::runs::planner::RunPlanner;
use crate::runs::publish::RunPublisher;
use crate::runs::sweep::RunSweeper;
use crate::state::AppState;
use crate::webhook::{WebhookOutbox, WebhookPolicy};

/// How long in-flight HTTP requests get to finish after shutdown begins.
const HTTP_DRAIN: Duration = Duration::from_secs(20);

/// A built coordinator, listening but not yet serving.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    state: AppState,
    settings: Settings,
    shutdown: CancellationToken,
    tasks: TaskTracker,
    /// Whether the background loops (events consumer, sweepers) run; tests that drive them by
    /// hand turn them off.
    background: bool,
}

/// The `migrate` subcommand (`serve` applies migrations too): creates the database first when
/// `create_database` allows it and it is missing, then applies the pending migrations.
pub async fn migrate(settings: &Settings, create_database: bool) -> anyhow::Result<()> {
    // The URL with the configured TLS settings, so the database is created over TLS too.
    let url = settings.database.connect_url()?;
    if create_database && skilleval_infra::store::create_database_if_missing(url.expose()).await? {
        tracing::info!(database = %settings.database.url.redacted(), "database created");
    }
    let store = Store::connect(&settings.database).await?;
    store.migrate().await?;
    Ok(())
}

impl Application {
    /// Connects everything and binds `coordinator.bind`.
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        Application::build_with(settings, true).await
    }

    /// [`Application::build`], with the background loops on or off.
    pub async fn build_with(settings: Settings, background: bool) -> anyhow::Result<Application> {
        let store = Store::connect(&settings.database).await?;
        store.migrate().await?;
        let nodes = Arc::new(BrokerNodes::from_settings(&settings.amqp));
        let sink: Arc<dyn JobSink> = BrokerJobSink::connect(&settings, nodes.clone()).await?;
        let metrics = Metrics::new();
        let planner = RunPlanner::new(store.clone());
        let publisher = RunPublisher::new(
            store.clone(),
            planner.clone(),
            sink.clone(),
            metrics.clone(),
        );
        let sweeper = RunSweeper::new(
            store.clone(),
            planner.clone(),
            publisher.clone(),
            metrics.clone(),
            Duration::from_secs(settings.coordinator.publish_grace_secs),
        );
        let secret = settings
            .coordinator
            .webhook_secret
            .as_ref()
            .map(|s| s.expose().as_bytes());
        if secret.is_none() {
            tracing::warn!("coordinator.webhook_secret is not set: webhooks are sent unsigned");
        }
        let webhooks = WebhookOutbox::new(
            store.clone(),
            secret,
            WebhookPolicy::from_settings(&settings.coordinator),
            metrics.clone(),
        )?;
        let aggregator = RunAggregator::new(
            store.clone(),
            planner.clone(),
            publisher.clone(),
            sweeper.clone(),
            metrics.clone(),
            Some(webhooks.clone()),
        );
        // Half an interval: a round that follows another coordinator's within the same
        // interval finds every rule just evaluated and leaves it.
        let alerts = AlertScheduler::new(
            store.clone(),
            Some(webhooks.clone()),
            Duration::from_secs(settings.coordinator.sampling.alert_interval_secs.max(1) / 2),
        );
        let comparator = comparator_clients(&settings);
        let collisions = CollisionLane::new(
            store.clone(),
            comparator.clone(),
            settings.coordinator.catalogue,
            aggregator.clone(),
            crate::catalogue_agent::CatalogueAgent::from_settings(&settings),
            settings.limits.clone(),
        );
        let state = AppState {
            store,
            sink,
            nodes,
            planner,
            publisher,
            sweeper,
            aggregator,
            webhooks,
            alerts,
            metrics,
            strategies: Arc::new(
                StrategyRegistry::builtin()
                    .zod(Arc::new(ZodConverter::detect(
                        settings.sandbox.clone(),
                        settings.coordinator.zod_dir.clone(),
                    )))
                    .build(),
            ),
            limits: Arc::new(settings.limits.clone()),
            max_upload_bytes: settings.coordinator.max_upload_bytes,
            sampling: settings.coordinator.sampling.clone(),
            access: Arc::new(AccessPolicy::new(
                AuthConfig {
                    tokens: Tokens::new(
                        settings.coordinator.auth_tokens.iter().map(|t| t.expose()),
                    ),
                    require: settings.coordinator.require_auth,
                },
                settings.coordinator.quotas.clone(),
            )),
            risk_policy: settings.coordinator.risk,
            comparator,
            collisions,
        };
        let listener = TcpListener::bind(&settings.coordinator.bind)
            .await
            .with_context(|| format!("binding {}", settings.coordinator.bind))?;
        let port = listener
            .local_addr()
            .context("reading the bound address")?
            .port();
        Ok(Application {
            listener,
            port,
            state,
            settings,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            background,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The shared state (tests drive the planner, publisher, sweeper and aggregator through
    /// it).
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Cancel it to stop the server and every background task.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Serves until the shutdown token is cancelled, then drains and stops everything.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let Application {
            listener,
            port,
            state,
            settings,
            shutdown,
            tasks,
            background,
        } = self;
        if background {
            spawn_background(&tasks, &settings, &state, &shutdown);
        }
        tasks.close();
        let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
        tracing::info!(port, "coordinator listening");
        let stop = shutdown.clone();
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .context("serving HTTP")?;
        shutdown.cancel();
        if tokio::time::timeout(HTTP_DRAIN, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("background tasks did not stop within {HTTP_DRAIN:?}");
        }
        tracing::info!("coordinator stopped");
        Ok(())
    }
}

/// The events consumer, the webhook outbox and the sweeps (publishing, finalisation, expired
/// model answers), each
/// stopped by the token.
fn spawn_background(
    tasks: &TaskTracker,
    settings: &Settings,
    state: &AppState,
    shutdown: &CancellationToken,
) {
    tasks.spawn(consume_events(
        settings.clone(),
        state.nodes.clone(),
        state.aggregator.clone(),
        shutdown.clone(),
    ));
    // Every replica sends due webhook deliveries (claims keep them from sending one twice).
    tasks.spawn(state.webhooks.clone().run(shutdown.clone()));
    // And drains the parking queue into errored results (the broker hands each message to
    // one of them).
    let topology = skilleval_infra::topology::Topology::from_settings(settings);
    let drain = ParkingDrain::new(
        state.store.clone(),
        state.aggregator.clone(),
        state.metrics.clone(),
        topology.jobs_queue(),
    );
    tasks.spawn(consume(
        settings.clone(),
        state.nodes.clone(),
        topology.parking_queue(),
        "skilleval-coordinator-parking",
        PARKING_PREFETCH,
        drain,
        shutdown.clone(),
    ));
    let interval = Duration::from_secs(settings.coordinator.sweep_interval_secs.max(1));
    // Every upload gives its version a catalogue card, so only skills stored before cards
    // existed lack one: one pass at start (retried each interval until it succeeds), not a
    // query every sweep.
    let lane = state.collisions.clone();
    let token = shutdown.clone();
    tasks.spawn(async move {
        loop {
            let wait = match lane.backfill().await {
                Ok(0) => return,
                Ok(n) => {
                    tracing::info!(
                        cards = n,
                        "catalogue cards added for skills uploaded before them"
                    );
                    Duration::ZERO
                }
                Err(e) => {
                    tracing::warn!(error = ?e, "the catalogue backfill failed; it is tried again");
                    interval
                }
            };
            tokio::select! {
                () = token.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    });
    let sweeper = state.sweeper.clone();
    let aggregator = state.aggregator.clone();
    let collisions = state.collisions.clone();
    let app = state.clone();
    let store = state.store.clone();
    let metrics = state.metrics.clone();
    let retention_days = settings.coordinator.sampling.retention_days;
    let retention = settings.coordinator.retention.clone();
    let access = state.access.clone();
    let token = shutdown.clone();
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = sweeper.sweep_unpublished().await {
                tracing::warn!(error = ?e, "publish sweep failed");
            }
            // Before the finalisation sweep: a gated run whose eval is due waits for it.
            if let Err(e) = collisions.resume().await {
                tracing::warn!(error = ?e, "resuming collision evals failed");
            }
            // A matrix whose creation stopped a minute ago or more is completed here.
            match crate::routes::matrix::complete_stalled(&app, Duration::from_secs(60)).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(matrices = n, "completed matrices whose creation stopped"),
                Err(e) => tracing::warn!(error = ?e, "completing stalled matrices failed; the next sweep retries"),
            }
            match aggregator.sweep().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(finalised = n, "finalisation sweep"),
                Err(e) => tracing::warn!(error = ?e, "finalisation sweep failed"),
            }
            match store.delete_expired_llm_cache().await {
                Ok(0) => {}
                Ok(n) => {
                    metrics.llm_cache_expired.inc_by(n);
                    tracing::info!(deleted = n, "expired model answers deleted");
                }
                Err(e) => tracing::warn!(error = %e, "deleting expired model answers failed"),
            }
            sweep_samples(&store, retention_days).await;
            sweep_retention(&store, &retention).await;
            access.forget_idle();
        }
    });
    let alerts = state.alerts.clone();
    let token = shutdown.clone();
    let every = Duration::from_secs(settings.coordinator.sampling.alert_interval_secs.max(1));
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = token.cancelled() => return,
                _ = tick.tick() => {}
            }
            match alerts.round(chrono::Utc::now()).await {
                Ok(round) if !round.transitions.is_empty() => {
                    tracing::info!(transitions = round.transitions.len(), "alert round");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = ?e, "alert round failed"),
            }
        }
    });
}

/// The retention sweep of `coordinator.retention`: finished runs, outputs, old versions'
/// packages and audit entries past their settings (docs/security.md).
pub async fn sweep_retention(store: &Store, retention: &RetentionSettings) {
    let cutoff =
        |days: Option<u32>| days.map(|d| chrono::Utc::now() - chrono::Duration::days(i64::from(d)));
    match store
        .sweep_retention(
            cutoff(retention.results_days),
            cutoff(retention.outputs_days),
            cutoff(retention.packages_days),
            cutoff(retention.audit_days),
        )
        .await
    {
        Ok(swept) if swept == Swept::default() => {}
        Ok(swept) => tracing::info!(
            runs = swept.runs,
            outputs = swept.outputs,
            versions = swept.versions,
            audit = swept.audit,
            quota_events = swept.quota_events,
            "retention sweep"
        ),
        Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
    }
}

/// The retention sweep: samples older than `retention_days`, with their finished samples
/// runs and results.
pub async fn sweep_samples(store: &Store, retention_days: u32) {
    let cutoff = chrono::Utc::now() - chrono::Duration::days(i64::from(retention_days));
    match store.delete_old_samples(cutoff).await {
        Ok((0, 0)) => {}
        Ok((samples, runs)) => tracing::info!(samples, runs, "retention: old samples deleted"),
        Err(e) => tracing::warn!(error = %e, "retention sweep of samples failed"),
    }
}

/// The providers the blind comparator judges with: `llm.providers` when any is configured.
/// Comparisons are rare and asked for one at a time, so no response cache and in-process
/// rate limits (the workers' fleet-wide limits are for the jobs). Providers that do not
/// connect here (a key variable only the workers have) leave the comparator off, with a
/// warning: the coordinator's other work needs no model.
fn comparator_clients(settings: &Settings) -> Option<Arc<skilleval_providers::ProviderClients>> {
    if settings.llm.providers.is_empty() {
        return None;
    }
    let cache: Arc<dyn skilleval_providers::ResponseCache> =
        Arc::new(skilleval_providers::cache::NoCache);
    match skilleval_providers::ProviderClients::connect(&settings.llm.providers, &cache, None) {
        Ok(clients) => Some(Arc::new(clients)),
        Err(e) => {
            tracing::warn!(error = %e, "the blind comparator is off: its model providers (llm.providers) do not connect");
            None
        }
    }
}
