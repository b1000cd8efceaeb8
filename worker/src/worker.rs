//! The consume loop: broker sessions, one task per delivery, reconnects and shutdown.
//!
//! A session is one connection with three channels: a confirm-mode publisher (retries, parked
//! messages, events) and one consumer channel per lane, each with its own prefetch. Every
//! delivery becomes a task that decides what the job needs ([`Worker::handle`]): a final
//! result goes to the [`Batcher`](crate::batch) and is acked after its commit; a retry, a parked
//! message or a redelivery of a case already decided is acked at once (a retry only after its publish
//! was confirmed).
//!
//! A delivery's session that is lost (the connection, or its channel closed by the broker's
//! `consumer_timeout`) takes its deliveries back to the queue: one not started yet is dropped
//! (the broker delivers it again), one running goes on under its case's claim
//! ([`crate::claim`]), which a copy delivered again respects instead of running the case too.
//!
//! A consumer stream that ends or errors ends the session: the worker reconnects with backoff
//! (to another broker node first, when several are configured: [`BrokerNodes`]) and consumes
//! again, and exits with an error after `worker.max_reconnect_attempts` failures in a row so
//! its supervisor restarts it. A round that tries every node and finds none counts as one
//! failure. Jobs still running from the lost session finish and are committed;
//! their acks fail and the broker redelivers them, which the next delivery recognises as
//! decided. On shutdown the worker cancels its consumers, lets in-flight jobs finish within the
//! grace period, flushes the last batch and closes the connection; anything unfinished is
//! still unacked and is redelivered to another worker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Connection, Consumer};
use skilleval_execution::executor::Executor;
use skilleval_execution::plan::Job;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::config::{Settings, WorkerSettings};
use skilleval_infra::evaluations::EvaluationEvents;
use skilleval_infra::failover::{Backoff, BrokerNodes};
use skilleval_infra::messages::{self, CaseFinished};
use skilleval_infra::store::results::Claim;
use skilleval_infra::store::Store;
use skilleval_infra::topology::{self, BrokerError, Lane, Publisher, Topology, TRACEPARENT_HEADER};
use skilleval_model::grade::Fault;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acks::{AckWindow, Pending};
use tracing::Instrument;

use crate::batch::{self, Batcher, Finished};
use crate::cancel::CancelCache;
use crate::claim::CaseClaim;
use crate::evaluations::EventContext;
use crate::http::{self, HttpState};
use crate::metrics::WorkerMetrics;
use crate::packages::PackageCache;
use crate::sandbox_gate::SandboxGate;
use crate::{retry, PublisherSlot};

/// After cancelling a consumer, how long to wait for deliveries already sent to it.
const CANCEL_DRAIN: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the broker stayed unreachable after {attempts} attempts: {last}")]
    BrokerUnavailable { attempts: u32, last: String },
    /// Connecting cannot work as configured (a certificate that does not verify, TLS files
    /// that do not load): reported at once instead of after every reconnect attempt.
    #[error(transparent)]
    BrokerConfiguration(BrokerError),
    #[error("preparing the package cache {dir}: {source}")]
    Cache {
        dir: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the health/metrics server: {0}")]
    Http(#[source] std::io::Error),
    #[error("model providers: {0}")]
    Providers(#[from] skilleval_providers::ConfigError),
    /// The database's migrations differ from the ones this binary embeds: consuming would
    /// write rows in a shape the schema does not have.
    #[error("refusing to consume: {0}")]
    Schema(skilleval_infra::store::SchemaStatus),
    #[error("checking the database schema: {0}")]
    Store(#[from] skilleval_infra::store::StoreError),
}

/// What a delivery needs once [`Worker::handle`] looked at it.
#[derive(Debug)]
pub enum Disposition {
    /// A final result: commit it, then ack.
    Record(Box<JobResult>),
    /// Re-published to a delay queue (confirmed): ack.
    Retried { attempt: u32, tier_ms: u64 },
    /// Unparseable, moved to the parking queue (confirmed): ack.
    Parked(String),
    /// A redelivery of a case already decided (recorded, or its run stopped): ack without
    /// running it; re-announce the case in case the first announcement was lost.
    Decided(Option<CaseFinished>),
    /// A copy delivered again while another copy of the case holds its claim (runs it): put
    /// off into the delay queue of `tier_ms` to look again (confirmed), ack.
    Deferred { tier_ms: u64 },
    /// This copy found its case's claim taken by another copy while it ran, stopped, and was
    /// put off like [`Disposition::Deferred`] (confirmed): ack.
    Superseded,
}

/// Why a delivery could not be dealt with now; it is requeued.
#[derive(Debug, thiserror::Error)]
pub enum HandleError {
    #[error("no broker session to publish with")]
    NoPublisher,
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// What is known about one delivery, apart from its body.
#[derive(Debug, Clone, Default)]
pub struct DeliveryInfo {
    pub redelivered: bool,
    /// Deliveries before this one (quorum queues count them).
    pub delivery_count: u32,
    /// The W3C trace context of the `send` span that published the message.
    pub traceparent: Option<String>,
    /// Put off before because another copy held the case's claim: look again before running.
    pub deferred: bool,
    /// Cancelled when the session the delivery came on is lost: the broker has it back.
    pub session_lost: CancellationToken,
}

impl DeliveryInfo {
    /// Whether the job may have been delivered before (redelivered, counted, or put off):
    /// its case's state and claim are read before it runs.
    pub fn seen_before(&self) -> bool {
        self.redelivered || self.delivery_count > 0 || self.deferred
    }
}

impl DeliveryInfo {
    /// What a delivery's `redelivered` flag and headers say.
    pub fn from_headers(redelivered: bool, headers: Option<&FieldTable>) -> DeliveryInfo {
        let get = |key: &str| headers.and_then(|h| h.inner().get(key));
        let delivery_count = get(topology::DELIVERY_COUNT_HEADER)
            .and_then(topology::header_integer)
            .unwrap_or(0);
        let traceparent = get(TRACEPARENT_HEADER).and_then(topology::header_text);
        let deferred = matches!(
            get(topology::DEFERRED_HEADER),
            Some(lapin::types::AMQPValue::Boolean(true))
        );
        DeliveryInfo {
            redelivered,
            delivery_count: u32::try_from(delivery_count).unwrap_or(u32::MAX),
            traceparent,
            deferred,
            session_lost: CancellationToken::new(),
        }
    }
}

/// How a session ended.
enum SessionEnd {
    /// Shutdown was asked for. The connection and the consumer channels are still open: the
    /// acks of in-flight jobs go out on them (lapin closes a channel when its last handle is
    /// dropped, so they are kept until the last batch is flushed).
    Shutdown(Box<(Connection, Vec<lapin::Channel>)>),
    /// The broker went away (or a consumer ended); reconnect.
    Lost(String),
}

/// A worker process's state. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Worker {
    settings: Settings,
    store: Store,
    executor: Arc<Executor>,
    packages: PackageCache,
    metrics: Arc<WorkerMetrics>,
    cancelled: CancelCache,
    topology: Topology,
    /// The broker nodes the sessions connect to, and the one the worker is on.
    nodes: Arc<BrokerNodes>,
    publisher: PublisherSlot,
    consuming: Arc<AtomicBool>,
    name: String,
    /// Execution slots of the CI and samples lanes (`concurrency`, `samples_slots()`).
    slots: (Semaphore, Semaphore),
    /// Closed while the sandbox does not work: then no jobs are taken.
    gate: Arc<SandboxGate>,
    /// Where recorded results go as `gen_ai.evaluation.result` events (a logs endpoint is
    /// configured), or `None`.
    evaluations: Option<EvaluationEvents>,
}

impl Worker {
    /// A worker with the built-in strategies and runners, plus the model-backed ones when
    /// providers are configured ([`crate::llm`]), sandboxed as configured. Fails when a
    /// configured provider's API key variable is not set.
    pub fn new(settings: Settings, store: Store) -> Result<Worker, WorkerError> {
        let (executor, clients) = crate::llm::build_executor(&settings, &store)?;
        let worker = Worker::with_executor(settings, store, executor);
        if let Some(clients) = clients {
            worker.metrics.watch_providers(clients);
        }
        Ok(worker)
    }

    /// A worker that executes with `executor` (tests register their own runners).
    pub fn with_executor(settings: Settings, store: Store, executor: Executor) -> Worker {
        let topology = Topology::from_settings(&settings);
        let packages = PackageCache::new(
            settings.worker.package_cache_dir.clone(),
            settings.limits.clone(),
            store.clone(),
        );
        let name = settings
            .amqp
            .connection_name
            .clone()
            .unwrap_or_else(|| format!("skilleval-worker-{}", std::process::id()));
        let cancelled =
            CancelCache::new(Duration::from_millis(settings.worker.cancel_cache_ttl_ms));
        let gate = Arc::new(SandboxGate::new(
            executor.sandbox().clone(),
            &settings.worker,
        ));
        Worker {
            gate,
            store,
            executor: Arc::new(executor),
            packages,
            metrics: Arc::new(WorkerMetrics::new()),
            cancelled,
            topology,
            nodes: Arc::new(BrokerNodes::from_settings(&settings.amqp)),
            publisher: PublisherSlot::default(),
            consuming: Arc::new(AtomicBool::new(false)),
            name,
            slots: (
                Semaphore::new(usize::from(settings.worker.concurrency)),
                Semaphore::new(usize::from(settings.worker.samples_slots())),
            ),
            settings,
            evaluations: None,
        }
    }

    /// Emits every result this worker records first as evaluation events through `events`
    /// (the process's [`skilleval_infra::telemetry::Telemetry::evaluations`]).
    #[must_use]
    pub fn with_evaluation_events(mut self, events: Option<EvaluationEvents>) -> Worker {
        self.evaluations = events;
        self
    }

    pub fn metrics(&self) -> &Arc<WorkerMetrics> {
        &self.metrics
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// `host:port` of the broker node the worker is connected to, while it is.
    pub fn broker_node(&self) -> Option<String> {
        self.nodes.current().map(str::to_string)
    }

    /// Why the worker takes no jobs for want of a working sandbox, while it does not.
    pub fn sandbox_problem(&self) -> Option<String> {
        self.gate.reason()
    }

    /// Serves `/healthz`, `/readyz`, `/metrics` on `worker.http_port` until `shutdown`.
    pub async fn serve_http(
        &self,
        shutdown: CancellationToken,
    ) -> Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>), WorkerError> {
        let state = HttpState {
            metrics: self.metrics.clone(),
            consuming: self.consuming.clone(),
            nodes: self.nodes.clone(),
            store: self.store.clone(),
            gate: self.gate.clone(),
        };
        http::serve(self.settings.worker.http_port, state, shutdown)
            .await
            .map_err(WorkerError::Http)
    }

    /// Decides what one delivery needs: parses it, skips decided or cancelled cases, runs the
    /// job, and re-publishes it for a later attempt after a transient fault. Publishing (retry,
    /// parking) uses `publisher` and is confirmed before this returns.
    pub async fn handle(
        &self,
        body: &[u8],
        headers: Option<&FieldTable>,
        info: &DeliveryInfo,
        lane: Lane,
        publisher: Option<&Publisher>,
    ) -> Result<Disposition, HandleError> {
        self.handle_traced(body, headers, info, lane, publisher)
            .await
            .0
    }

    /// [`Worker::handle`], also returning the job's CONSUMER `process` span (disabled for a
    /// message that is not a job), the parent of its result's commit, and what its evaluation
    /// events need (when they are emitted).
    async fn handle_traced(
        &self,
        body: &[u8],
        headers: Option<&FieldTable>,
        info: &DeliveryInfo,
        lane: Lane,
        publisher: Option<&Publisher>,
    ) -> (
        Result<Disposition, HandleError>,
        tracing::Span,
        Option<EventContext>,
    ) {
        let job = match messages::decode_job(body) {
            Ok(job) => job,
            Err(e) => {
                let reason = e.to_string();
                let parked = async {
                    let publisher = publisher.ok_or(HandleError::NoPublisher)?;
                    publisher
                        .publish_parked(body, &reason, &self.topology.queue(lane), headers)
                        .await?;
                    self.metrics.parked.inc();
                    tracing::warn!(%reason, bytes = body.len(), "unparseable message parked");
                    Ok(Disposition::Parked(reason.clone()))
                }
                .await;
                return (parked, tracing::Span::none(), None);
            }
        };
        let span = process_span(&job, info, &self.topology.queue(lane), lane);
        let events = self
            .evaluations
            .is_some()
            .then(|| EventContext::of(&job, &span));
        let outcome = self
            .handle_job(job, info, lane, publisher)
            .instrument(span.clone())
            .await;
        let disposition = match &outcome {
            Ok(Disposition::Record(r)) => r.status.as_str(),
            Ok(Disposition::Retried { .. }) => "retried",
            Ok(Disposition::Parked(_)) => "parked",
            Ok(Disposition::Decided(_)) => "decided",
            Ok(Disposition::Deferred { .. }) => "deferred",
            Ok(Disposition::Superseded) => "superseded",
            Err(_) => "requeued",
        };
        span.record("skilleval.disposition", disposition);
        (outcome, span, events)
    }

    async fn handle_job(
        &self,
        mut job: Job,
        info: &DeliveryInfo,
        lane: Lane,
        publisher: Option<&Publisher>,
    ) -> Result<Disposition, HandleError> {
        if info.seen_before() {
            match self
                .store
                .case_state(
                    job.run_id,
                    &job.case.id,
                    skilleval_execution::variant::Variant::of(&job.runner),
                )
                .await
            {
                Ok(Some(state)) if state.is_decided() => {
                    self.metrics.settled_redeliveries.inc();
                    let event =
                        state
                            .case_status
                            .filter(|s| s.is_final())
                            .map(|status| CaseFinished {
                                run_id: job.run_id,
                                test_case_id: job.case.id.clone(),
                                status,
                            });
                    return Ok(Disposition::Decided(event));
                }
                Ok(None) => return Ok(Disposition::Decided(None)),
                Ok(Some(_)) => {}
                // Run it anyway: recording is idempotent.
                Err(e) => tracing::warn!(error = %e, "could not read the case's state"),
            }
        }
        if info.delivery_count >= self.settings.worker.max_redeliveries {
            let fault = Fault::permanent(format!(
                "the job was delivered {} times without finishing (a worker stopped while running it each time)",
                info.delivery_count + 1
            ));
            tracing::error!(
                delivery_count = info.delivery_count,
                "poison job stored as errored"
            );
            return Ok(Disposition::Record(Box::new(JobResult::errored(
                &job, fault,
            ))));
        }
        if self.cancelled.is_cancelled(&self.store, job.run_id).await {
            let skipped = JobResult::skipped(&job, "the run was cancelled");
            return Ok(Disposition::Record(Box::new(skipped)));
        }
        let worker = &self.settings.worker;
        if let Some(timeout) = worker.broker_consumer_timeout_ms {
            if job.timeout_ms.saturating_mul(2) > timeout {
                tracing::warn!(
                    job_timeout_ms = job.timeout_ms,
                    consumer_timeout_ms = timeout,
                    "the job may outlive the broker's consumer_timeout (it can wait for a slot as long as it runs): the broker will deliver it again, and its claim keeps it from running twice; raise consumer_timeout"
                );
            }
        }
        let claim = CaseClaim {
            store: &self.store,
            run_id: job.run_id,
            test_case_id: &job.case.id,
            variant: skilleval_execution::variant::Variant::of(&job.runner),
            attempt: job.attempt,
            holder: uuid::Uuid::new_v4(),
            after: worker.claim_after(),
            lease: worker.claim_lease(),
        };
        let mut held = false;
        if info.seen_before() {
            match claim.take().await {
                Ok(Claim::Held) => held = true,
                Ok(Claim::Elsewhere) => {
                    let tier_ms = deferral_tier(&self.topology);
                    let publisher = publisher.ok_or(HandleError::NoPublisher)?;
                    publisher.publish_deferred(&job, lane, tier_ms).await?;
                    self.metrics.deferred.inc();
                    tracing::info!(
                        tier_ms,
                        "another copy of the job runs the case; this one looks again later"
                    );
                    return Ok(Disposition::Deferred { tier_ms });
                }
                // Run it anyway (claiming later): recording is idempotent.
                Err(e) => tracing::warn!(error = %e, "could not claim the case"),
            }
        }
        let mut result = if let Some(reason) = self.gate.reason() {
            // Taken just before the consumers stopped: let a healthy worker run it.
            JobResult::errored(
                &job,
                Fault::host(format!("this worker's sandbox does not work: {reason}")),
            )
        } else {
            let result = match self.packages.root(&job.package_hash).await {
                Ok(root) => {
                    // The model answers this job stores or is served are linked to its run,
                    // and deleted with it (docs/security.md).
                    let owner = skilleval_providers::CacheOwner { run_id: job.run_id };
                    // Boxed: the execution's future is large, and it is moved into the claim's.
                    let execution = Box::pin(owner.scope(self.executor.execute(&job, &root)));
                    let Some(result) = claim.keep_while(held, &info.session_lost, execution).await
                    else {
                        // Put off like a copy delivered again: should the holder die, this
                        // copy runs the case when it comes back.
                        let tier_ms = deferral_tier(&self.topology);
                        let publisher = publisher.ok_or(HandleError::NoPublisher)?;
                        publisher.publish_deferred(&job, lane, tier_ms).await?;
                        self.metrics.superseded.inc();
                        return Ok(Disposition::Superseded);
                    };
                    self.metrics.executed(&result, lane.as_str());
                    result
                }
                Err(fault) => JobResult::errored(&job, fault),
            };
            if let Some(fault) = result.error.as_ref().filter(|f| f.is_host()) {
                self.metrics.host_faults.inc();
                tracing::warn!(error = %fault, "fault of the host; the job will be retried");
                self.gate.host_fault(&fault.to_string());
            }
            result
        };
        let transient = result.status == CaseStatus::Errored
            && result.error.as_ref().is_some_and(Fault::is_transient);
        if transient && job.attempt < self.settings.worker.max_attempts {
            let fault = result
                .error
                .clone()
                .unwrap_or_else(|| Fault::transient("unknown"));
            let tier_ms = retry::tier(&self.topology, job.attempt, &fault);
            let publisher = publisher.ok_or(HandleError::NoPublisher)?;
            job.attempt += 1;
            publisher.publish_retry(&job, lane, tier_ms).await?;
            self.metrics.retries.inc();
            tracing::info!(error = %fault, next_attempt = job.attempt, tier_ms, "transient fault; retry scheduled");
            return Ok(Disposition::Retried {
                attempt: job.attempt,
                tier_ms,
            });
        }
        if transient {
            let attempts = job.attempt;
            if let Some(attempt) = result.attempts.last_mut() {
                attempt.number = attempts;
            }
            if let serde_json::Value::Object(details) = &mut result.details {
                details.insert("gave_up_after_attempts".into(), attempts.into());
            }
            tracing::warn!(
                attempts,
                "transient fault on the last attempt; stored as errored"
            );
        }
        Ok(Disposition::Record(Box::new(result)))
    }

    /// Consumes until `shutdown`, reconnecting when the broker goes away. Returns an error when
    /// the broker stays unreachable (the process should exit non-zero), and before consuming
    /// anything when the database's migrations are not the ones this binary embeds.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WorkerError> {
        match self.store.schema_status().await? {
            skilleval_infra::store::SchemaStatus::Current => {}
            other => return Err(WorkerError::Schema(other)),
        }
        self.packages
            .prepare()
            .map_err(|source| WorkerError::Cache {
                dir: self.settings.worker.package_cache_dir.display().to_string(),
                source,
            })?;
        let capacity =
            usize::from(self.settings.worker.concurrency) * 2 + self.settings.worker.batch_size;
        let (tx, rx) = mpsc::channel::<Finished>(capacity);
        let batcher = tokio::spawn(
            Batcher {
                store: self.store.clone(),
                metrics: self.metrics.clone(),
                publisher: self.publisher.clone(),
                batch_size: self.settings.worker.batch_size,
                max_wait: self.settings.worker.batch_max_wait(),
                evaluations: self.evaluations.clone(),
            }
            .run(rx),
        );
        let tracker = TaskTracker::new();
        // Cancelled after the grace period: jobs still running are abandoned (left unacked).
        let abandon = CancellationToken::new();
        let mut backoff = Backoff::reconnect();
        let mut sessions = 0u32;
        let outcome = loop {
            if shutdown.is_cancelled() {
                break Ok(None);
            }
            if sessions > 0 {
                self.metrics.reconnects.inc();
            }
            sessions += 1;
            let end = self
                .session(&shutdown, &tracker, &abandon, &tx, &mut backoff)
                .await;
            self.consuming.store(false, Ordering::SeqCst);
            if !matches!(end, Ok(SessionEnd::Shutdown(..))) {
                crate::set_publisher(&self.publisher, None);
            }
            match end {
                Ok(SessionEnd::Shutdown(held)) => break Ok(Some(*held)),
                Ok(SessionEnd::Lost(reason)) => {
                    let failures = backoff.failures() + 1;
                    tracing::warn!(%reason, failures, "broker session lost");
                    if failures > self.settings.worker.max_reconnect_attempts {
                        break Err(WorkerError::BrokerUnavailable {
                            attempts: failures,
                            last: reason,
                        });
                    }
                }
                Err(e) if e.is_configuration() => {
                    break Err(WorkerError::BrokerConfiguration(e));
                }
                Err(e) => {
                    let failures = backoff.failures() + 1;
                    tracing::warn!(error = %e, failures, "broker session could not start");
                    if failures > self.settings.worker.max_reconnect_attempts {
                        break Err(WorkerError::BrokerUnavailable {
                            attempts: failures,
                            last: e.to_string(),
                        });
                    }
                }
            }
            let wait = backoff.next_wait();
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = tokio::time::sleep(wait) => {}
            }
        };

        // Let in-flight jobs finish (their results are committed either way), then flush.
        tracker.close();
        let grace = self.settings.worker.shutdown_grace();
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!(
                unfinished = tracker.len(),
                "grace period over; unfinished jobs are left unacked for redelivery"
            );
            abandon.cancel();
            tracker.wait().await;
        }
        drop(tx);
        if let Err(e) = batcher.await {
            tracing::error!(error = %e, "the batcher task failed");
        }
        crate::set_publisher(&self.publisher, None);
        match outcome {
            Ok(held) => {
                if let Some((conn, channels)) = held {
                    for channel in channels {
                        let _ = channel
                            .close(200, ShortString::from("worker shutting down"))
                            .await;
                    }
                    if let Err(e) = conn
                        .close(200, ShortString::from("worker shutting down"))
                        .await
                    {
                        tracing::debug!(error = %e, "closing the broker connection");
                    }
                }
                tracing::info!("worker stopped");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// One broker session: connect to a node, declare, consume until shutdown or a fault; a
    /// session that ends otherwise than by shutdown reports its node lost.
    async fn session(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
        abandon: &CancellationToken,
        tx: &mpsc::Sender<Finished>,
        backoff: &mut Backoff,
    ) -> Result<SessionEnd, BrokerError> {
        let topology::Connected { connection, node } =
            topology::connect_any(&self.settings, &self.nodes, &self.name).await?;
        // Cancelled when the session ends otherwise than by shutdown: its deliveries are
        // back in the queue.
        let lost = CancellationToken::new();
        let end = self
            .session_on(connection, shutdown, tracker, abandon, tx, backoff, &lost)
            .await;
        if !matches!(end, Ok(SessionEnd::Shutdown(..))) {
            lost.cancel();
            self.nodes.lost(node);
        }
        end
    }

    #[allow(clippy::too_many_arguments)]
    async fn session_on(
        self: &Arc<Self>,
        conn: Connection,
        shutdown: &CancellationToken,
        tracker: &TaskTracker,
        abandon: &CancellationToken,
        tx: &mpsc::Sender<Finished>,
        backoff: &mut Backoff,
        lost: &CancellationToken,
    ) -> Result<SessionEnd, BrokerError> {
        let setup = conn
            .create_channel()
            .await
            .map_err(|source| BrokerError::Amqp {
                context: "opening a channel".into(),
                source,
            })?;
        self.topology.declare(&setup).await?;
        let _ = setup.close(200, ShortString::from("declared")).await;
        let publisher = Publisher::open(&conn, self.topology.clone()).await?;
        crate::set_publisher(&self.publisher, Some(publisher));
        if !self.gate.reopen(shutdown).await {
            return Ok(SessionEnd::Shutdown(Box::new((conn, Vec::new()))));
        }
        let mut ci = self
            .consume(
                &conn,
                Lane::Ci,
                WorkerSettings::prefetch_for(self.settings.worker.concurrency),
                lost,
            )
            .await?;
        let mut samples = self
            .consume(
                &conn,
                Lane::Samples,
                WorkerSettings::prefetch_for(self.settings.worker.samples_slots()),
                lost,
            )
            .await?;
        self.consuming.store(true, Ordering::SeqCst);
        backoff.reset();
        tracing::info!(
            connection = %self.name,
            node = self.nodes.current().unwrap_or("?"),
            concurrency = self.settings.worker.concurrency,
            samples = self.settings.worker.samples_slots(),
            "consuming"
        );
        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => None,
                () = self.gate.wait_closed() => {
                    // No consumers while the sandbox does not work: the broker hands the jobs
                    // to other workers. What was already delivered runs (and is retried).
                    for consumer in [&mut ci, &mut samples] {
                        consumer.stop(self, tracker, abandon, tx).await;
                    }
                    self.consuming.store(false, Ordering::SeqCst);
                    if !self.gate.reopen(shutdown).await {
                        tracing::info!("shutdown: stopped consuming");
                        let held = (conn, vec![ci.channel, samples.channel]);
                        return Ok(SessionEnd::Shutdown(Box::new(held)));
                    }
                    for consumer in [&mut ci, &mut samples] {
                        consumer.resume().await?;
                    }
                    self.consuming.store(true, Ordering::SeqCst);
                    tracing::info!("consuming again");
                    continue;
                }
                next = ci.consumer.next() => Some((Lane::Ci, next)),
                next = samples.consumer.next() => Some((Lane::Samples, next)),
            };
            match event {
                None => {
                    for consumer in [&mut ci, &mut samples] {
                        consumer.stop(self, tracker, abandon, tx).await;
                    }
                    tracing::info!("shutdown: stopped consuming");
                    let held = (conn, vec![ci.channel, samples.channel]);
                    return Ok(SessionEnd::Shutdown(Box::new(held)));
                }
                Some((lane, Some(Ok(delivery)))) => {
                    let window = match lane {
                        Lane::Ci => &ci.window,
                        Lane::Samples => &samples.window,
                    };
                    self.spawn_delivery(tracker, abandon, tx, delivery, lane, window, lost);
                }
                Some((lane, Some(Err(e)))) => {
                    return Ok(SessionEnd::Lost(format!("{} consumer: {e}", lane.as_str())));
                }
                Some((lane, None)) => {
                    return Ok(SessionEnd::Lost(format!(
                        "the {} consumer ended",
                        lane.as_str()
                    )));
                }
            }
        }
    }

    async fn consume(
        &self,
        conn: &Connection,
        lane: Lane,
        prefetch: u16,
        lost: &CancellationToken,
    ) -> Result<LaneConsumer, BrokerError> {
        let amqp = |context: &str| {
            let context = format!("{context} ({} lane)", lane.as_str());
            move |source| BrokerError::Amqp { context, source }
        };
        let channel = conn
            .create_channel()
            .await
            .map_err(amqp("opening a consumer channel"))?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(amqp("setting the prefetch"))?;
        let tag = ShortString::from(format!("{}-{}", self.name, lane.as_str()));
        let consumer = channel
            .basic_consume(
                ShortString::from(self.topology.queue(lane)),
                tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(amqp("starting the consumer"))?;
        Ok(LaneConsumer {
            channel,
            consumer,
            tag,
            lane,
            window: AckWindow::new(),
            lost: lost.clone(),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn_delivery(
        self: &Arc<Self>,
        tracker: &TaskTracker,
        abandon: &CancellationToken,
        tx: &mpsc::Sender<Finished>,
        delivery: Delivery,
        lane: Lane,
        window: &Arc<AckWindow>,
        lost: &CancellationToken,
    ) {
        // Registered here, in the channel's delivery order, before any task can settle it.
        let pending = window.received(delivery.acker.clone(), delivery.delivery_tag);
        let worker = self.clone();
        let abandon = abandon.clone();
        let tx = tx.clone();
        let lost = lost.clone();
        tracker.spawn(async move {
            tokio::select! {
                () = abandon.cancelled() => {}
                () = worker.process(delivery, pending, lane, tx, lost) => {}
            }
        });
    }

    async fn process(
        &self,
        delivery: Delivery,
        pending: Pending,
        lane: Lane,
        tx: mpsc::Sender<Finished>,
        lost: CancellationToken,
    ) {
        // An execution slot of the lane, held while the job runs and released before its
        // result waits for the batch commit (the prefetch leaves room for those).
        let slot = match lane {
            Lane::Ci => &self.slots.0,
            Lane::Samples => &self.slots.1,
        };
        let Ok(permit) = slot.acquire().await else {
            // The semaphores are never closed; should one be, the delivery is left unacked
            // and the broker redelivers it when the channel closes.
            return;
        };
        if lost.is_cancelled() {
            // Its session was lost while it waited for a slot: the broker has it back and
            // delivers it again (here or to another worker); running this copy would run the
            // case twice.
            return;
        }
        let in_flight = self.metrics.in_flight(lane.as_str());
        in_flight.inc();
        if let Some(published) = delivery.properties.timestamp() {
            self.metrics.waited(lane.as_str(), *published);
        }
        let mut info = DeliveryInfo::from_headers(
            delivery.redelivered,
            delivery.properties.headers().as_ref(),
        );
        info.session_lost = lost;
        if info.redelivered {
            self.metrics.redeliveries.inc();
        }
        let publisher = crate::current_publisher(&self.publisher);
        let (outcome, span, events) = self
            .handle_traced(
                &delivery.data,
                delivery.properties.headers().as_ref(),
                &info,
                lane,
                publisher.as_ref(),
            )
            .await;
        in_flight.dec();
        drop(permit);
        match outcome {
            Ok(Disposition::Record(result)) => {
                let span = tracing::info_span!(
                    parent: &span,
                    "commit result",
                    skilleval.run_id = %result.run_id,
                    skilleval.test_case_id = %result.test_case_id,
                    skilleval.status = result.status.as_str(),
                    db.system.name = "postgresql",
                    skilleval.batch_size = tracing::field::Empty,
                    skilleval.committed = tracing::field::Empty,
                );
                let finished = Finished {
                    result: *result,
                    acker: Some(pending),
                    lane,
                    span,
                    events,
                };
                if tx.send(finished).await.is_err() {
                    tracing::error!("the batcher is gone; the delivery is left for redelivery");
                }
            }
            Ok(Disposition::Decided(event)) => {
                batch::ack(&pending, &self.metrics).await;
                if let Some(event) = event {
                    batch::publish_events(&self.publisher, &[event]).await;
                }
            }
            Ok(
                Disposition::Retried { .. }
                | Disposition::Parked(_)
                | Disposition::Deferred { .. }
                | Disposition::Superseded,
            ) => {
                batch::ack(&pending, &self.metrics).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "delivery could not be handled; requeued");
                batch::nack_requeue(&pending, &self.metrics).await;
            }
        }
    }
}

/// The delay queue a copy put off goes to: the longest (it waits for another copy's run).
fn deferral_tier(topology: &Topology) -> u64 {
    topology.retry_tiers_ms().last().copied().unwrap_or(1_000)
}

/// The CONSUMER span of one job (messaging semantic conventions), a child of the `send` span
/// whose context the message carries: the first delivery, a redelivery and a retry's delivery
/// (published from the previous attempt's span) all stay in the trace of the run's creation.
fn process_span(job: &Job, info: &DeliveryInfo, queue: &str, lane: Lane) -> tracing::Span {
    let message_id = format!("{}/{}/{}", job.run_id, job.case.id, job.attempt);
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = queue,
        messaging.message.id = message_id.as_str(),
        skilleval.run_id = %job.run_id,
        skilleval.test_case_id = %job.case.id,
        skilleval.attempt = i64::from(job.attempt),
        skilleval.lane = lane.as_str(),
        skilleval.redelivered = info.redelivered,
        skilleval.delivery_count = i64::from(info.delivery_count),
        skilleval.disposition = tracing::field::Empty,
    );
    skilleval_infra::telemetry::set_parent(&span, info.traceparent.as_deref());
    span
}

struct LaneConsumer {
    channel: lapin::Channel,
    consumer: Consumer,
    tag: ShortString,
    lane: Lane,
    /// The channel's unsettled deliveries (see [`crate::acks`]).
    window: Arc<AckWindow>,
    /// The session's loss (see [`Worker::session`]).
    lost: CancellationToken,
}

impl LaneConsumer {
    /// Consumes again on the same channel (after [`LaneConsumer::stop`]), with the same tag
    /// and window, so in-flight jobs still settle on it.
    async fn resume(&mut self) -> Result<(), BrokerError> {
        let queue = self.consumer.queue();
        self.consumer = self
            .channel
            .basic_consume(
                queue,
                self.tag.clone(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|source| BrokerError::Amqp {
                context: format!("consuming again ({} lane)", self.lane.as_str()),
                source,
            })?;
        Ok(())
    }

    /// Cancels the consumer, then runs the deliveries that were already on their way: they are
    /// this worker's in-flight jobs as much as the running ones.
    async fn stop(
        &mut self,
        worker: &Arc<Worker>,
        tracker: &TaskTracker,
        abandon: &CancellationToken,
        tx: &mpsc::Sender<Finished>,
    ) {
        if let Err(e) = self
            .channel
            .basic_cancel(self.tag.clone(), BasicCancelOptions::default())
            .await
        {
            tracing::debug!(error = %e, lane = self.lane.as_str(), "cancelling the consumer");
        }
        while let Ok(Some(Ok(delivery))) =
            tokio::time::timeout(CANCEL_DRAIN, self.consumer.next()).await
        {
            worker.spawn_delivery(
                tracker,
                abandon,
                tx,
                delivery,
                self.lane,
                &self.window,
                &self.lost,
            );
        }
    }
}
