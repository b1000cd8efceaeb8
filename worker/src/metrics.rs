//! Prometheus metrics of one worker process, served as text at `/metrics`.
//!
//! What an operator watches: throughput by final status, retries and parked messages (a rising
//! rate means a provider or a package is failing), batch sizes (how well commits amortise),
//! jobs in flight (against `worker.concurrency`), and acks that did not go out (a broker
//! connection lost between commit and ack: harmless, the redelivery is recognised and settled).

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
}

impl WorkerMetrics {
    pub fn new() -> WorkerMetrics {
        let mut registry = Registry::with_prefix("skilleval_worker");
        let jobs_processed = Family::<JobLabels, Counter>::default();
        let retries = Counter::default();
        let parked = Counter::default();
        let redeliveries = Counter::default();
        let settled_redeliveries = Counter::default();
        let batch_size = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        let batch_failures = Counter::default();
        let ack_failures = Counter::default();
        let in_flight = Family::<LaneLabels, Gauge>::default();
        let reconnects = Counter::default();
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
        }
        WorkerMetrics {
            registry,
            jobs_processed,
            retries,
            parked,
            redeliveries,
            settled_redeliveries,
            batch_size,
            batch_failures,
            ack_failures,
            in_flight,
            reconnects,
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
