//! What every handler shares.

use std::sync::Arc;

use skilleval_grading::StrategyRegistry;
use skilleval_infra::config::SamplingSettings;
use skilleval_infra::failover::BrokerNodes;
use skilleval_infra::store::Store;
use skilleval_model::package::risk::RiskPolicy;
use skilleval_model::package::PackageLimits;

use crate::aggregate::RunAggregator;
use crate::alerts::AlertScheduler;
use crate::jobs::JobSink;
use crate::metrics::Metrics;
use crate::policy::AccessPolicy;
use crate::runs::planner::RunPlanner;
use crate::runs::publish::RunPublisher;
use crate::runs::sweep::RunSweeper;
use crate::webhook::WebhookOutbox;

/// Shared by every request: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub sink: Arc<dyn JobSink>,
    /// The broker nodes every connection of this process goes through (the sink's, the
    /// consumers'), so a lost node moves them all to another.
    pub nodes: Arc<BrokerNodes>,
    /// Plans runs and keeps their plans.
    pub planner: RunPlanner,
    /// Publishes runs' jobs with confirms (creation, releases).
    pub publisher: RunPublisher,
    /// Resumes unfinished publishing and writes off stopped runs.
    pub sweeper: RunSweeper,
    pub aggregator: RunAggregator,
    /// Sends the webhook outbox's deliveries.
    pub webhooks: WebhookOutbox,
    /// Evaluates monitors' alert rules and announces transitions.
    pub alerts: AlertScheduler,
    pub metrics: Arc<Metrics>,
    /// Validates uploads (compiles every case's grader).
    pub strategies: Arc<StrategyRegistry>,
    pub limits: Arc<PackageLimits>,
    /// `coordinator.max_upload_bytes`.
    pub max_upload_bytes: u64,
    /// `coordinator.sampling`: ingest limits, retention, alert schedule.
    pub sampling: SamplingSettings,
    /// Authentication, quotas and rate limits, applied to each request by `crate::access`.
    pub access: Arc<AccessPolicy>,
    /// `coordinator.risk`: which package risk findings refuse an upload.
    pub risk_policy: RiskPolicy,
    /// The model providers (`llm.providers`) the blind comparator of `POST /v1/comparisons`
    /// judges with; `None` when none is configured.
    pub comparator: Option<Arc<skilleval_providers::ProviderClients>>,
    /// `coordinator.catalogue`: the collision eval after each upload (with `comparator`'s
    /// providers).
    pub catalogue: skilleval_infra::config::CatalogueSettings,
    /// What agent-mode collision evals run the agent with (`coordinator.catalogue.mode =
    /// "agent"`: the sandbox `sandbox` configures); `None` in model mode.
    pub catalogue_agent: Option<crate::catalogue_agent::CatalogueAgent>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("max_upload_bytes", &self.max_upload_bytes)
            .finish_non_exhaustive()
    }
}
