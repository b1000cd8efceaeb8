//! Prometheus metrics of one worker process, served as text at `/metrics`.
//!
//! What an operator watches: throughput by final status, retries and parked messages (a rising
//! rate means a provider or a package is failing), batch sizes (how well commits amortise),
//! jobs in flight (against `worker.concurrency`), and acks that did not go out (a broker
//! connection lost between commit and ack: harmless, the redelivery is recognised and settled).
//! Per execution: how long jobs and their graders took, and the tokens and cost they spent;
//! per model provider: requests sent and the 429s among them (read from the provider clients
//! when scraped).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// `passed`, `failed`, `errored`, `skipped`.
    pub status: String,
    /// `ci` or `samples`.
    pub lane: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabels {
    pub lane: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabels {
    pub strategy: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    /// `produce` (the runner) or `grade` (model-backed graders).
    pub purpose: String,
    /// `input` or `output`.
    pub direction: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PurposeLabels {
    pub purpose: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

/// A counter of dollars.
type CostCounter = Counter<f64, AtomicU64>;

/// Every metric the worker exports.
#[derive(Debug)]
pub struct WorkerMetrics {
    registry: Registry,
    /// Results committed, by status (a redelivered job already recorded is not counted).
    pub jobs_processed: Family<JobLabels, Counter>,
    /// Jobs re-published to a delay queue after a transient fault.
    pub retries: Counter,
    /// Messages sent to the parking queue (unparseable).
    pub parked: Counter,
    /// Deliveries the broker marked redelivered (a worker died or lost its connection
    /// holding them, or a batch was requeued).
    pub redeliveries: Counter,
    /// Redelivered jobs found already settled and acked without running.
    pub settled_redeliveries: Counter,
    /// Copies delivered again while another copy held the case's claim, put off.
    pub deferred: Counter,
    /// Copies that found the case's claim taken by another copy while they ran, stopped and
    /// put off.
    pub superseded: Counter,
    /// Results per committed batch.
    pub batch_size: Histogram,
    /// Batches that failed to commit (each is retried, then its deliveries requeued).
    pub batch_failures: Counter,
    /// Acks or nacks the broker did not take (the message will be redelivered).
    pub ack_failures: Counter,
    /// Jobs being executed now.
    pub in_flight: Family<LaneLabels, Gauge>,
    /// Broker sessions started after the first (connection lost or consumer ended).
    pub reconnects: Counter,
    /// How long a delivered job waited in its queue since it was (re)published, by lane.
    pub queue_wait: Family<LaneLabels, Histogram>,
    /// Wall time of an execution (all its in-job attempts), by lane.
    pub job_duration: Family<LaneLabels, Histogram>,
    /// Time the last attempt's grader took, by strategy.
    pub grader_duration: Family<StrategyLabels, Histogram>,
    /// Model tokens spent, by purpose and direction.
    pub tokens: Family<TokenLabels, Counter>,
    /// Model cost in USD, by purpose.
    pub cost_usd: Family<PurposeLabels, CostCounter>,
    /// HTTP requests sent to each model provider (retries included).
    pub provider_requests: Family<ProviderLabels, Counter>,
    /// HTTP 429 answers from each model provider.
    pub provider_rate_limited: Family<ProviderLabels, Counter>,
    /// The provider clients whose counts `provider_*` mirror (set once, when providers exist).
    providers: OnceLock<Arc<skilleval_providers::ProviderClients>>,
    /// Serialises [`WorkerMetrics::sync_providers`]: two scrapes at once would add a delta twice.
    sync: Mutex<()>,
    /// Jobs that met a fault of the host (the sandbox failing before the skill's code ran).
    pub host_faults: Counter,
}

impl WorkerMetrics {
    pub fn new() -> WorkerMetrics {
        let mut registry = Registry::with_prefix("skilleval_worker");
        let jobs_processed = Family::<JobLabels, Counter>::default();
        let retries = Counter::default();
        let parked = Counter::default();
        let redeliveries = Counter::default();
        let settled_redeliveries = Counter::default();
        let deferred = Counter::default();
        let superseded = Counter::default();
        let batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        let batch_failures = Counter::default();
        let ack_failures = Counter::default();
        let in_flight = Family::<LaneLabels, Gauge>::default();
        let reconnects = Counter::default();
        let queue_wait = Family::<LaneLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
            ])
        });
        let job_duration = Family::<LaneLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 16))
        });
        let grader_duration = Family::<StrategyLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 18))
        });
        let tokens = Family::<TokenLabels, Counter>::default();
        let cost_usd = Family::<PurposeLabels, CostCounter>::default();
        let provider_requests = Family::<ProviderLabels, Counter>::default();
        let provider_rate_limited = Family::<ProviderLabels, Counter>::default();
        let host_faults = Counter::default();
        registry.register(
            "host_faults",
            "Jobs that met a fault of the host: the sandbox failed before the skill's code ran",
            host_faults.clone(),
        );
        registry.register(
            "jobs_processed",
            "Results committed, by status and lane",
            jobs_processed.clone(),
        );
        registry.register(
            "retries",
            "Jobs re-published to a delay queue after a transient fault",
            retries.clone(),
        );
        registry.register(
            "parked",
            "Unparseable messages moved to the parking queue",
            parked.clone(),
        );
        registry.register(
            "redeliveries",
            "Deliveries the broker marked redelivered",
            redeliveries.clone(),
        );
        registry.register(
            "settled_redeliveries",
            "Redelivered jobs already recorded, acked without running",
            settled_redeliveries.clone(),
        );
        registry.register(
            "deferred_copies",
            "Jobs delivered again while another copy held the case's claim, put off to look again",
            deferred.clone(),
        );
        registry.register(
            "superseded_copies",
            "Jobs that found their case's claim taken by another copy while they ran, stopped and put off",
            superseded.clone(),
        );
        registry.register(
            "batch_size",
            "Results per committed batch",
            batch_size.clone(),
        );
        registry.register(
            "batch_failures",
            "Result batches that failed to commit",
            batch_failures.clone(),
        );
        registry.register(
            "ack_failures",
            "Acks and nacks the broker did not take",
            ack_failures.clone(),
        );
        registry.register(
            "in_flight",
            "Jobs being executed now, by lane",
            in_flight.clone(),
        );
        registry.register(
            "reconnects",
            "Broker sessions restarted",
            reconnects.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "How long a delivered job waited in its queue since it was published (whole seconds), by lane",
            queue_wait.clone(),
        );
        registry.register(
            "job_duration_seconds",
            "Wall time of a job's execution (produce and grade, every in-job attempt), by lane",
            job_duration.clone(),
        );
        registry.register(
            "grader_duration_seconds",
            "Time a job's grader took (its last attempt), by strategy",
            grader_duration.clone(),
        );
        registry.register(
            "tokens",
            "Model tokens spent, by purpose (produce, grade) and direction (input, output)",
            tokens.clone(),
        );
        registry.register(
            "cost_usd",
            "Model cost in USD, by purpose (produce, grade)",
            cost_usd.clone(),
        );
        registry.register(
            "provider_requests",
            "HTTP requests sent to each model provider, retries included",
            provider_requests.clone(),
        );
        registry.register(
            "provider_rate_limited",
            "HTTP 429 answers from each model provider",
            provider_rate_limited.clone(),
        );
        // Every label set exists from the start (at zero), so dashboards and `rate()` see the
        // series before the first job of a kind.
        for lane in ["ci", "samples"] {
            for status in ["passed", "failed", "errored", "skipped"] {
                let _ = jobs_processed.get_or_create(&JobLabels {
                    status: status.into(),
                    lane: lane.into(),
                });
            }
            let _ = in_flight.get_or_create(&LaneLabels { lane: lane.into() });
            let _ = job_duration.get_or_create(&LaneLabels { lane: lane.into() });
            let _ = queue_wait.get_or_create(&LaneLabels { lane: lane.into() });
        }
        for purpose in ["produce", "grade"] {
            for direction in ["input", "output"] {
                let _ = tokens.get_or_create(&TokenLabels {
                    purpose: purpose.into(),
                    direction: direction.into(),
                });
            }
            let _ = cost_usd.get_or_create(&PurposeLabels {
                purpose: purpose.into(),
            });
        }
        WorkerMetrics {
            registry,
            jobs_processed,
            retries,
            parked,
            redeliveries,
            settled_redeliveries,
            deferred,
            superseded,
            batch_size,
            batch_failures,
            ack_failures,
            in_flight,
            reconnects,
            queue_wait,
            job_duration,
            grader_duration,
            tokens,
            cost_usd,
            provider_requests,
            provider_rate_limited,
            providers: OnceLock::new(),
            sync: Mutex::new(()),
            host_faults,
        }
    }

    /// Mirrors these clients' request and 429 counts in `provider_*` from now on.
    pub fn watch_providers(&self, clients: Arc<skilleval_providers::ProviderClients>) {
        for client in clients.clients() {
            let labels = ProviderLabels {
                provider: client.name().to_string(),
            };
            let _ = self.provider_requests.get_or_create(&labels);
            let _ = self.provider_rate_limited.get_or_create(&labels);
        }
        let _ = self.providers.set(clients);
    }

    /// Records the wait of a delivery published at `published` (Unix seconds).
    pub fn waited(&self, lane: &str, published: u64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.queue_wait
            .get_or_create(&LaneLabels {
                lane: lane.to_string(),
            })
            .observe(now.saturating_sub(published) as f64);
    }

    /// Records one execution: its duration, its grader's, and what it spent on models.
    pub fn executed(&self, result: &skilleval_execution::result::JobResult, lane: &str) {
        let seconds = |ms: u64| ms as f64 / 1000.0;
        let total_ms: u64 = result.attempts.iter().map(|a| a.duration_ms).sum();
        self.job_duration
            .get_or_create(&LaneLabels {
                lane: lane.to_string(),
            })
            .observe(seconds(total_ms));
        if let Some(last) = result.attempts.last().filter(|a| a.score.is_some()) {
            self.grader_duration
                .get_or_create(&StrategyLabels {
                    strategy: result.strategy.clone(),
                })
                .observe(seconds(last.grade_ms));
        }
        for (purpose, usage) in [
            ("produce", &result.produce_usage),
            ("grade", &result.grade_usage),
        ] {
            for (direction, n) in [
                ("input", usage.input_tokens),
                ("output", usage.output_tokens),
            ] {
                self.tokens
                    .get_or_create(&TokenLabels {
                        purpose: purpose.into(),
                        direction: direction.into(),
                    })
                    .inc_by(n);
            }
            if usage.cost_usd > 0.0 {
                self.cost_usd
                    .get_or_create(&PurposeLabels {
                        purpose: purpose.into(),
                    })
                    .inc_by(usage.cost_usd);
            }
        }
    }

    /// Brings `provider_*` up to the clients' own counts (they only grow).
    fn sync_providers(&self) {
        let Some(clients) = self.providers.get() else {
            return;
        };
        let _serial = self
            .sync
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for client in clients.clients() {
            let labels = ProviderLabels {
                provider: client.name().to_string(),
            };
            let requests = self.provider_requests.get_or_create(&labels);
            requests.inc_by(client.requests_sent().saturating_sub(requests.get()));
            let limited = self.provider_rate_limited.get_or_create(&labels);
            limited.inc_by(client.rate_limited().saturating_sub(limited.get()));
        }
    }

    pub fn processed(&self, status: &str, lane: &str) {
        self.jobs_processed
            .get_or_create(&JobLabels {
                status: status.to_string(),
                lane: lane.to_string(),
            })
            .inc();
    }

    pub fn in_flight(&self, lane: &str) -> Gauge {
        self.in_flight
            .get_or_create(&LaneLabels {
                lane: lane.to_string(),
            })
            .clone()
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.sync_providers();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        WorkerMetrics::new()
    }
}
