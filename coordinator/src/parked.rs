//! Parked jobs: the coordinator drains the parking queue into the database, and operators
//! list and requeue what it drained.
//!
//! A job lands in the parking queue when RabbitMQ dead-letters it at the jobs queue's
//! `x-delivery-limit` (workers died on it again and again), and a message no worker could
//! parse is parked there by the worker. The coordinator consumes the queue
//! ([`ParkingDrain`]): a job of a live run whose case has no outcome becomes that case's
//! `errored` result with the reason (so the run finalises, and its results and report say
//! why), and every message becomes a row of `parked_jobs` (`skilleval_infra::store::parked`
//! says how that is exactly-once). The coordinator drains, not the workers: it is always
//! running (workers may be scaled to zero while the jobs queues are empty, and the parking
//! queue scales nothing), it owns the runs' finalisation, and the operator's endpoints live
//! in it.
//!
//! [`requeue`] publishes a parked message again: a parked `errored` job gives its case back
//! to its run first (a finalised run is `running` again, and finalises again, with a new
//! webhook, once the case is recorded).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::types::{AMQPValue, FieldTable};
use skilleval_execution::result::JobResult;
use skilleval_infra::messages::{self, CaseFinished, CasesFinished};
use skilleval_infra::store::parked::{Drained, NewParked, ParkedState, RequeueError, Requeued};
use skilleval_infra::store::Store;
use skilleval_infra::topology::{
    header_integer, header_text, DELIVERY_COUNT_HEADER, PARKED_FROM_HEADER, PARKED_REASON_HEADER,
};
use skilleval_model::grade::Fault;
use uuid::Uuid;

use crate::aggregate::RunAggregator;
use crate::broker::{QueueHandler, Settle};
use crate::jobs::{JobSink, PublishError};
use crate::metrics::Metrics;

/// Messages of the parking queue handled at once.
pub const PARKING_PREFETCH: u16 = 8;

/// Drains the parking queue (see the module documentation).
#[derive(Debug, Clone)]
pub struct ParkingDrain {
    store: Store,
    aggregator: RunAggregator,
    metrics: Arc<Metrics>,
    /// The queue jobs are parked from when the message does not say (the jobs queue).
    default_queue: String,
}

impl ParkingDrain {
    pub fn new(
        store: Store,
        aggregator: RunAggregator,
        metrics: Arc<Metrics>,
        default_queue: String,
    ) -> Self {
        ParkingDrain {
            store,
            aggregator,
            metrics,
            default_queue,
        }
    }

    /// Records one parked message (and its case's errored result), then lets the aggregator
    /// see the case (the run may be complete now).
    pub async fn drain(
        &self,
        body: &[u8],
        headers: Option<&FieldTable>,
    ) -> anyhow::Result<Drained> {
        let why = ParkedBecause::from_headers(headers);
        let from_queue = why.queue.as_deref().unwrap_or(&self.default_queue);
        let job = messages::decode_job(body).ok();
        let reason = why.sentence(from_queue);
        let errored = job.as_ref().map(|job| {
            JobResult::errored(
                job,
                Fault::permanent(format!("the job was parked: {reason}")),
            )
        });
        let parked = NewParked {
            case: job.as_ref().map(|j| {
                (
                    j.run_id,
                    j.case.id.as_str(),
                    skilleval_execution::variant::Variant::of(&j.runner),
                )
            }),
            from_queue,
            reason: &reason,
            body,
        };
        let drained = self.store.record_parked(&parked, errored.as_ref()).await?;
        if let Some((id, state)) = drained.parked {
            Metrics::count(&self.metrics.parked_jobs, state_name(state));
            tracing::warn!(
                parked_id = %id,
                state = state_name(state),
                run_id = job.as_ref().map(|j| j.run_id.to_string()),
                test_case_id = job.as_ref().map(|j| j.case.id.clone()),
                %reason,
                "parked job drained"
            );
        }
        if let Some(first) = drained.changed.first() {
            let event = CasesFinished::from(CaseFinished {
                run_id: first.run_id,
                test_case_id: first.test_case_id.clone(),
                status: first.status,
            });
            if let Err(e) = self.aggregator.on_cases_finished(&event).await {
                tracing::warn!(error = ?e, "aggregating a parked case failed; the sweep catches up");
            }
        }
        Ok(drained)
    }
}

#[async_trait]
impl QueueHandler for ParkingDrain {
    async fn handle(&self, body: &[u8], headers: Option<&FieldTable>) -> Settle {
        match Box::pin(self.drain(body, headers)).await {
            Ok(_) => Settle::Ack,
            Err(e) => {
                // The database is away: keep the message, try again in a moment.
                tracing::warn!(error = ?e, "draining a parked message failed; requeued");
                tokio::time::sleep(Duration::from_secs(1)).await;
                Settle::Requeue
            }
        }
    }
}

/// The metric label (and API word) of a state.
pub fn state_name(state: ParkedState) -> &'static str {
    match state {
        ParkedState::Errored => "errored",
        ParkedState::Unmatched => "unmatched",
        ParkedState::Requeued => "requeued",
    }
}

/// Why a message is in the parking queue, from its headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ParkedBecause {
    /// The worker's reason (an unparseable message).
    worker_reason: Option<String>,
    /// The broker's dead-lettering reason (`delivery_limit`, `rejected`, `expired`, ...).
    dead_letter_reason: Option<String>,
    /// The queue it was parked from.
    queue: Option<String>,
    /// Deliveries the broker counted.
    deliveries: Option<i64>,
}

impl ParkedBecause {
    fn from_headers(headers: Option<&FieldTable>) -> Self {
        let get = |key: &str| headers.and_then(|h| h.inner().get(key));
        let mut why = ParkedBecause {
            worker_reason: get(PARKED_REASON_HEADER).and_then(header_text),
            queue: get(PARKED_FROM_HEADER).and_then(header_text),
            deliveries: get(DELIVERY_COUNT_HEADER).and_then(header_integer),
            ..ParkedBecause::default()
        };
        // `x-death` lists the dead-letterings, latest first: the first one is the parking (an
        // earlier one is a retry delay queue's expiry).
        if let Some(AMQPValue::FieldArray(deaths)) = get("x-death") {
            if let Some(AMQPValue::FieldTable(latest)) = deaths.as_slice().first() {
                let field = |k: &str| latest.inner().get(k);
                why.dead_letter_reason = field("reason").and_then(header_text);
                if why.queue.is_none() {
                    why.queue = field("queue").and_then(header_text);
                }
            }
        }
        why
    }

    fn sentence(&self, queue: &str) -> String {
        if let Some(reason) = &self.worker_reason {
            return format!("a worker could not read it ({reason})");
        }
        match self.dead_letter_reason.as_deref() {
            Some("delivery_limit") => {
                let times = self
                    .deliveries
                    .map_or_else(String::new, |n| format!(" ({n} deliveries)"));
                format!(
                    "it reached the delivery limit of `{queue}`{times} without a result: a worker stopped while running it each time"
                )
            }
            Some(other) => format!("the broker dead-lettered it from `{queue}` ({other})"),
            None => format!("it was parked from `{queue}` for no recorded reason"),
        }
    }
}

/// Why a requeue did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RequeueFailed {
    #[error(transparent)]
    Refused(#[from] RequeueError),
    #[error("publishing the job again: {0}")]
    Publish(#[from] PublishError),
    #[error("{0}")]
    Store(String),
}

/// Requeues a parked job: gives its case back to its run (an `errored` one) and publishes it
/// again, in one transaction that commits only once the broker confirmed the publish.
pub async fn requeue(
    store: &Store,
    sink: &dyn JobSink,
    id: Uuid,
) -> Result<Requeued, RequeueFailed> {
    let store_error = |e: sqlx::Error| RequeueFailed::Store(e.to_string());
    let mut tx = store.pool().begin().await.map_err(store_error)?;
    let requeued = store.requeue_parked(&mut tx, id).await?;
    // The run's row stays locked until the commit: a worker that records the case before
    // then waits for it, and then finds the case free.
    sink.republish(&requeued.from_queue, &requeued.body).await?;
    tx.commit().await.map_err(store_error)?;
    tracing::info!(parked_id = %id, run_id = requeued.run_id.map(|r| r.to_string()), reopened = requeued.reopened, "parked job requeued");
    Ok(requeued)
}

/// `skilleval-coordinator admin parked list`: the parked jobs, newest first, as JSON (what
/// `GET /v1/admin/parked` answers), straight from the database.
pub async fn admin_list(
    settings: &skilleval_infra::config::Settings,
    state: Option<ParkedState>,
    limit: i64,
) -> anyhow::Result<serde_json::Value> {
    let store = Store::connect(&settings.database).await?;
    let parked = store.list_parked(state, limit).await?;
    Ok(serde_json::json!({ "parked": parked }))
}

/// `skilleval-coordinator admin parked requeue <id>`: what `POST
/// /v1/admin/parked/{id}/requeue` does, from the command line.
pub async fn admin_requeue(
    settings: &skilleval_infra::config::Settings,
    id: Uuid,
) -> anyhow::Result<serde_json::Value> {
    let store = Store::connect(&settings.database).await?;
    let nodes = std::sync::Arc::new(skilleval_infra::failover::BrokerNodes::from_settings(
        &settings.amqp,
    ));
    let sink = crate::broker::BrokerJobSink::connect(settings, nodes).await?;
    let requeued = requeue(&store, sink.as_ref(), id).await?;
    Ok(serde_json::json!({
        "id": id,
        "run_id": requeued.run_id,
        "state": ParkedState::Requeued,
        "reopened": requeued.reopened,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString};

    #[test]
    fn the_latest_dead_lettering_says_why() {
        let mut parking = FieldTable::default();
        parking.insert(
            "reason".into(),
            AMQPValue::LongString(LongString::from("delivery_limit")),
        );
        parking.insert(
            "queue".into(),
            AMQPValue::LongString(LongString::from("p.jobs")),
        );
        let mut delay = FieldTable::default();
        delay.insert(
            "reason".into(),
            AMQPValue::LongString(LongString::from("expired")),
        );
        delay.insert(
            "queue".into(),
            AMQPValue::LongString(LongString::from("p.retry.1000")),
        );
        let mut headers = FieldTable::default();
        headers.insert(
            "x-death".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![
                AMQPValue::FieldTable(parking),
                AMQPValue::FieldTable(delay),
            ])),
        );
        headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(3));
        let why = ParkedBecause::from_headers(Some(&headers));
        assert_eq!(why.queue.as_deref(), Some("p.jobs"));
        let sentence = why.sentence("p.jobs");
        assert!(
            sentence.contains("delivery limit of `p.jobs` (3 deliveries)"),
            "{sentence}"
        );

        let mut worker = FieldTable::default();
        worker.insert(
            PARKED_REASON_HEADER.into(),
            AMQPValue::LongString(LongString::from("bad json")),
        );
        let why = ParkedBecause::from_headers(Some(&worker));
        assert_eq!(
            why.sentence("p.jobs"),
            "a worker could not read it (bad json)"
        );
    }
}
