//! Committing results in batches, then acking, then announcing.
//!
//! Finished jobs queue up here; a batch is committed when it holds `worker.batch_size` results
//! or `worker.batch_max_wait_ms` after its first one, whichever comes first, in one statement
//! ([`Store::record_results`]). Only then are the deliveries acked (an ack is never sent for a
//! result that is not committed; a batch is usually one `multiple` ack, see [`crate::acks`]),
//! and only then are the case events published (and, when configured, the results first
//! recorded by this batch emitted as evaluation events, [`crate::evaluations`]). A commit that
//! keeps failing (the database is away for longer than the retries) requeues the batch's
//! deliveries, so nothing is lost and nothing waits unacked forever.
//!
//! Up to [`FLUSHES_IN_FLIGHT`] batches commit at once: while one waits on its commit the next
//! fills, so a worker's throughput is not one batch per database round trip. Order between
//! batches does not matter (a case's row is inserted once, whichever batch holds it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use skilleval_execution::result::JobResult;
use skilleval_infra::evaluations::EvaluationEvents;
use skilleval_infra::messages::CaseFinished;
use skilleval_infra::store::results::Changed;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Lane;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::acks::{self, Pending};
use crate::evaluations::EventContext;
use crate::metrics::WorkerMetrics;
use crate::PublisherSlot;

/// Commits tried for one batch before its deliveries are requeued.
const COMMIT_ATTEMPTS: u32 = 6;

/// Batches committing (then acking and announcing) at the same time.
pub const FLUSHES_IN_FLIGHT: usize = 4;

/// A job with its final result, waiting for the commit before its ack.
#[derive(Debug)]
pub struct Finished {
    pub result: JobResult,
    /// `None` in tests that drive the pipeline without a broker.
    pub acker: Option<Pending>,
    pub lane: Lane,
    /// The result's `commit result` span (a child of the job's `process` span), ended once
    /// the batch holding it is committed.
    pub span: tracing::Span,
    /// What the result's evaluation events need; `None` when they are not emitted.
    pub events: Option<EventContext>,
}

/// What the batcher needs.
#[derive(Debug, Clone)]
pub(crate) struct Batcher {
    pub store: Store,
    pub metrics: Arc<WorkerMetrics>,
    pub publisher: PublisherSlot,
    pub batch_size: usize,
    pub max_wait: Duration,
    pub evaluations: Option<EvaluationEvents>,
}

impl Batcher {
    /// Runs until every sender is dropped, flushing what is left; returns once every batch
    /// is committed and acked (or requeued).
    pub async fn run(self, mut rx: mpsc::Receiver<Finished>) {
        let mut flushing = JoinSet::new();
        while let Some(first) = rx.recv().await {
            let deadline = Instant::now() + self.max_wait;
            let mut batch = vec![first];
            while batch.len() < self.batch_size {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(next)) => batch.push(next),
                    Ok(None) | Err(_) => break,
                }
            }
            while flushing.len() >= FLUSHES_IN_FLIGHT {
                join_flush(flushing.join_next().await);
            }
            let me = self.clone();
            flushing.spawn(async move { me.flush(batch).await });
        }
        while let Some(done) = flushing.join_next().await {
            join_flush(Some(done));
        }
    }

    /// Commits one batch, acks its deliveries, publishes the events.
    #[tracing::instrument(skip_all, fields(batch = batch.len()))]
    pub async fn flush(&self, batch: Vec<Finished>) {
        let mut results = Vec::with_capacity(batch.len());
        let mut settles = Vec::with_capacity(batch.len());
        let mut lanes: HashMap<(Uuid, String), Lane> = HashMap::with_capacity(batch.len());
        let size = batch.len();
        let mut spans = Vec::with_capacity(size);
        let mut contexts = Vec::with_capacity(size);
        for f in batch {
            lanes.insert((f.result.run_id, f.result.test_case_id.clone()), f.lane);
            results.push(f.result);
            contexts.push(f.events);
            settles.push(f.acker);
            f.span.record(
                "skilleval.batch_size",
                i64::try_from(size).unwrap_or(i64::MAX),
            );
            spans.push(f.span);
        }
        let mut attempt = 0;
        let changed = loop {
            attempt += 1;
            match self.store.record_results(&results).await {
                Ok(changed) => break Some(changed),
                Err(e) if attempt < COMMIT_ATTEMPTS => {
                    let wait = Duration::from_millis(100u64 << attempt.min(5));
                    tracing::warn!(error = %e, attempt, ?wait, "committing results failed; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, attempt, "committing results failed; requeueing the batch");
                    break None;
                }
            }
        };
        // One transaction for the whole batch: every result's span ends with it.
        for span in &spans {
            span.record("skilleval.committed", changed.is_some());
        }
        drop(spans);
        let Some(changed) = changed else {
            self.metrics.batch_failures.inc();
            futures::future::join_all(
                settles
                    .iter()
                    .flatten()
                    .map(|a| nack_requeue(a, &self.metrics)),
            )
            .await;
            return;
        };
        #[allow(clippy::cast_precision_loss)]
        self.metrics.batch_size.observe(results.len() as f64);
        for c in &changed {
            let lane = lanes
                .get(&(c.run_id, c.test_case_id.clone()))
                .map_or("ci", |l| l.as_str());
            self.metrics.processed(c.status.as_str(), lane);
        }
        let failed = acks::ack_batch(settles.into_iter().flatten().collect()).await;
        if failed > 0 {
            self.metrics.ack_failures.inc_by(failed as u64);
            tracing::warn!(
                failed,
                "acks not sent: the channel is closed; the messages will be redelivered"
            );
        }
        let events: Vec<CaseFinished> = changed
            .iter()
            .map(|c| CaseFinished {
                run_id: c.run_id,
                test_case_id: c.test_case_id.clone(),
                status: c.status,
            })
            .collect();
        publish_events(&self.publisher, &events).await;
        if let Some(emitter) = &self.evaluations {
            self.emit_evaluations(emitter, &results, &contexts, &changed)
                .await;
        }
    }
}

impl Batcher {
    /// Emits the evaluation events of the results this batch recorded first (`changed`): a
    /// case found already recorded was emitted by whoever recorded it.
    async fn emit_evaluations(
        &self,
        emitter: &EvaluationEvents,
        results: &[JobResult],
        contexts: &[Option<EventContext>],
        changed: &[Changed],
    ) {
        let new: HashSet<(Uuid, &str)> = changed
            .iter()
            .map(|c| (c.run_id, c.test_case_id.as_str()))
            .collect();
        if new.is_empty() {
            return;
        }
        let mut run_ids: Vec<Uuid> = new.iter().map(|(id, _)| *id).collect();
        run_ids.sort_unstable();
        run_ids.dedup();
        // The skill and version name the events; without them the events still go out.
        let skills = match self.store.skill_versions_of_runs(&run_ids).await {
            Ok(skills) => skills,
            Err(e) => {
                tracing::warn!(error = %e, "reading the skills of evaluation events");
                HashMap::new()
            }
        };
        for (result, ctx) in results.iter().zip(contexts) {
            let Some(ctx) = ctx else { continue };
            if !new.contains(&(result.run_id, result.test_case_id.as_str())) {
                continue;
            }
            let skill = skills.get(&result.run_id);
            for evaluation in crate::evaluations::evaluations(result, ctx, skill) {
                emitter.emit(ctx.parent(), &evaluation);
            }
        }
    }
}

/// A flush task that panicked lost no data (its deliveries stay unacked and come back when
/// the channel closes), but it must be seen.
fn join_flush(done: Option<Result<(), tokio::task::JoinError>>) {
    if let Some(Err(e)) = done {
        tracing::error!(error = %e, "a batch flush task failed; its deliveries will be redelivered");
    }
}

/// Announces finished cases; a failure is logged only (the coordinator's sweep catches up).
pub(crate) async fn publish_events(publisher: &PublisherSlot, events: &[CaseFinished]) {
    if events.is_empty() {
        return;
    }
    let Some(publisher) = crate::current_publisher(publisher) else {
        tracing::warn!(
            events = events.len(),
            "no broker session: case events not published"
        );
        return;
    };
    let failed = publisher
        .publish_events(events)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect::<Vec<_>>();
    if let Some(first) = failed.first() {
        tracing::warn!(failed = failed.len(), error = %first, "publishing case events failed");
    }
}

/// Acks a delivery alone and checks that the ack really went out.
pub(crate) async fn ack(pending: &Pending, metrics: &WorkerMetrics) -> bool {
    let sent = pending.ack().await;
    if !sent {
        metrics.ack_failures.inc();
        tracing::warn!("ack not sent: the channel is closed; the message will be redelivered");
    }
    sent
}

/// Returns a delivery to its queue for another worker (or this one) to take.
pub(crate) async fn nack_requeue(pending: &Pending, metrics: &WorkerMetrics) {
    if !pending.nack_requeue().await {
        metrics.ack_failures.inc();
        tracing::warn!("nack not sent; the message returns when the channel closes");
    }
}
