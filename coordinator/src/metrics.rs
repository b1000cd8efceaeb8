//! Prometheus metrics of the coordinator, served as text at `/metrics`.
//!
//! Counters are process-local (each replica reports its own; sum them in queries). The run
//! gauges (`skilleval_runs{status}`, `skilleval_jobs_unpublished`) are read from the database
//! and the queue gauges (`queue_messages_ready`, `queue_consumers`) from the broker at scrape
//! time, so every replica reports the same fleet-wide numbers (take the `max`).

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    /// The route template (`/v1/runs/{id}`), never the raw path: bounded cardinality.
    pub route: String,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
}

/// A quota or rate limit, by its configuration key.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    pub limit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub queue: String,
}

/// What one webhook delivery attempt came to, as the metrics count it. Defined with the
/// metrics, which report every outcome from the start; the webhook outbox
/// ([`crate::webhook`]) says which one each attempt was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// 2xx: the delivery is `delivered`.
    Delivered,
    /// Failed, another attempt is scheduled.
    Retried,
    /// A 4xx the receiver will repeat: the delivery is `failed`.
    Rejected,
    /// The last attempt failed: the delivery is `failed`.
    GaveUp,
}

impl WebhookOutcome {
    /// Every outcome (the metrics report each, at 0 until it happens).
    pub const ALL: [WebhookOutcome; 4] = [
        WebhookOutcome::Delivered,
        WebhookOutcome::Retried,
        WebhookOutcome::Rejected,
        WebhookOutcome::GaveUp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WebhookOutcome::Delivered => "delivered",
            WebhookOutcome::Retried => "retried",
            WebhookOutcome::Rejected => "rejected",
            WebhookOutcome::GaveUp => "gave_up",
        }
    }
}

/// Every metric the coordinator exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_duration: Family<HttpLabels, Histogram>,
    pub runs_created: Counter,
    pub uploads_refused: Family<OutcomeLabels, Counter>,
    pub jobs_published: Counter,
    pub publish_failures: Counter,
    pub sweeper_republished: Counter,
    pub runs_finalised: Family<OutcomeLabels, Counter>,
    pub webhooks: Family<OutcomeLabels, Counter>,
    /// Webhook deliveries not delivered or failed yet (from the database at scrape time).
    pub webhooks_pending: Gauge,
    /// Seconds the oldest pending webhook delivery has waited (from the database at scrape
    /// time).
    pub webhooks_oldest_pending: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// Messages drained from the parking queue, by what they became (errored, unmatched).
    pub parked_jobs: Family<OutcomeLabels, Counter>,
    pub events_consumed: Counter,
    pub runs_by_status: Family<StatusLabels, Gauge>,
    pub jobs_unpublished: Gauge,
    /// Expired model answers the sweep deleted from `llm_cache`.
    pub llm_cache_expired: Counter,
    /// Ready messages per queue (from the broker at scrape time).
    pub queue_ready: Family<QueueLabels, Gauge>,
    /// Consumers per queue (from the broker at scrape time).
    pub queue_consumers: Family<QueueLabels, Gauge>,
    /// 1 when the last scrape could read the queues from the broker, 0 when not.
    pub queue_scrape_ok: Gauge,
    /// Requests refused with a 429, by the limit reached (its configuration key).
    pub quota_refused: Family<LimitLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("skilleval_coordinator");
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_duration = Family::<HttpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let runs_created = Counter::default();
        let uploads_refused = Family::<OutcomeLabels, Counter>::default();
        let jobs_published = Counter::default();
        let publish_failures = Counter::default();
        let sweeper_republished = Counter::default();
        let runs_finalised = Family::<OutcomeLabels, Counter>::default();
        let webhooks = Family::<OutcomeLabels, Counter>::default();
        let events_consumed = Counter::default();
        let parked_jobs = Family::<OutcomeLabels, Counter>::default();
        let webhooks_pending = Gauge::default();
        let webhooks_oldest_pending = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let runs_by_status = Family::<StatusLabels, Gauge>::default();
        let jobs_unpublished = Gauge::default();
        let llm_cache_expired = Counter::default();
        let queue_ready = Family::<QueueLabels, Gauge>::default();
        let queue_consumers = Family::<QueueLabels, Gauge>::default();
        let queue_scrape_ok = Gauge::default();
        let quota_refused = Family::<LimitLabels, Counter>::default();
        registry.register(
            "quota_refused",
            "Requests refused with 429, by the quota or rate limit reached",
            quota_refused.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests answered, by route and status",
            http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency",
            http_duration.clone(),
        );
        registry.register(
            "runs_created",
            "Runs created (uploads and POST /v1/runs)",
            runs_created.clone(),
        );
        registry.register(
            "uploads_refused",
            "Uploads refused, by reason (too_large, refused, invalid, risk)",
            uploads_refused.clone(),
        );
        registry.register(
            "jobs_published",
            "Job messages confirmed by the broker",
            jobs_published.clone(),
        );
        registry.register(
            "publish_failures",
            "Job publishes nacked, returned or failed (the sweeper retries them)",
            publish_failures.clone(),
        );
        registry.register(
            "sweeper_republished",
            "Jobs published by the sweeper after the grace period",
            sweeper_republished.clone(),
        );
        registry.register(
            "runs_finalised",
            "Runs finalised, by verdict or status",
            runs_finalised.clone(),
        );
        registry.register(
            "webhooks",
            "Webhook delivery attempts, by outcome (delivered, retried, rejected, gave_up)",
            webhooks.clone(),
        );
        registry.register(
            "webhooks_pending",
            "Webhook deliveries pending (from the database at scrape time)",
            webhooks_pending.clone(),
        );
        registry.register(
            "webhooks_oldest_pending_seconds",
            "Age of the oldest pending webhook delivery (from the database at scrape time)",
            webhooks_oldest_pending.clone(),
        );
        registry.register(
            "parked_jobs",
            "Messages drained from the parking queue, by outcome (errored: the case is recorded errored; unmatched: nothing to record)",
            parked_jobs.clone(),
        );
        registry.register(
            "events_consumed",
            "Case-finished events consumed",
            events_consumed.clone(),
        );
        registry.register(
            "runs",
            "Runs by status (from the database at scrape time)",
            runs_by_status.clone(),
        );
        registry.register(
            "jobs_unpublished",
            "Queued jobs not yet confirmed by the broker (held back by maxConcurrentTests, or awaiting the sweeper)",
            jobs_unpublished.clone(),
        );
        registry.register(
            "llm_cache_expired",
            "Expired model answers deleted from llm_cache by the sweep",
            llm_cache_expired.clone(),
        );
        registry.register(
            "queue_messages_ready",
            "Messages ready in each queue (from the broker at scrape time)",
            queue_ready.clone(),
        );
        registry.register(
            "queue_consumers",
            "Consumers of each queue (from the broker at scrape time)",
            queue_consumers.clone(),
        );
        registry.register(
            "queue_scrape_ok",
            "1 when this scrape read the queues from the broker, 0 when it could not",
            queue_scrape_ok.clone(),
        );
        // Every outcome exists from the start (at zero), so `rate()` and alerts see the series
        // before the first failure.
        for outcome in WebhookOutcome::ALL {
            let _ = webhooks.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str().into(),
            });
        }
        for outcome in ["errored", "unmatched"] {
            let _ = parked_jobs.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        for outcome in ["pass", "fail", "cancelled"] {
            let _ = runs_finalised.get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            });
        }
        Arc::new(Metrics {
            registry,
            http_requests,
            http_duration,
            runs_created,
            uploads_refused,
            jobs_published,
            publish_failures,
            sweeper_republished,
            runs_finalised,
            webhooks,
            parked_jobs,
            webhooks_pending,
            webhooks_oldest_pending,
            events_consumed,
            runs_by_status,
            jobs_unpublished,
            llm_cache_expired,
            queue_ready,
            queue_consumers,
            queue_scrape_ok,
            quota_refused,
        })
    }

    pub fn count(family: &Family<OutcomeLabels, Counter>, outcome: &str) {
        family
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
