//! The skilleval worker: takes jobs from RabbitMQ, runs and grades them with the shared
//! executor, and writes one result per test case to PostgreSQL.
//!
//! Layout:
//!
//! - [`worker`] is the consume loop: broker sessions with a consumer per lane (CI jobs and
//!   production samples), one task per delivery, reconnects, and shutdown. Its one-step
//!   function, [`Worker::handle`], decides what a delivery needs (park it, skip it, run it,
//!   retry it) and is what tests drive directly.
//! - [`batch`] commits finished results in batches through the store, then acks, then
//!   announces the cases on the events exchange.
//! - [`evaluations`] turns a first-recorded result into `gen_ai.evaluation.result` events
//!   (when a logs endpoint is configured), parented to the case's span.
//! - [`packages`] fetches a package once per content hash and caches it on disk.
//! - [`retry`] computes backoff and picks the delay queue tier.
//! - [`cancel`] caches whether a run was cancelled.
//! - [`claim`] keeps a case's claim while its job runs, so a copy the broker delivers again
//!   (a consumer timeout, a lost connection) does not run the case too.
//! - [`llm`] connects the model providers (Postgres cache and fleet-wide rate limits) when
//!   configured and builds the executor on them with the shared `ExecutorBuilder`.
//! - [`sandbox_gate`] stops the consumers while the sandbox does not work (none at start, or
//!   repeated faults of the host) and probes it until it does.
//! - [`http`] serves `/healthz`, `/readyz` and `/metrics` ([`metrics`]).
//!
//! The guarantees, in order: a job's result is committed before its delivery is acked; a
//! case's row is inserted once, however often its job is delivered; every job ends in a
//! stored result (retries are bounded, poison jobs are stored `errored`), so every run
//! completes; a case runs in one copy at a time, however often its job is delivered (a copy
//! that runs long holds the case's claim).

use std::sync::{Arc, RwLock};

use skilleval_infra::topology::Publisher;

pub mod acks;
pub mod batch;
pub mod cancel;
pub mod claim;
pub mod evaluations;
pub mod http;
pub mod llm;
pub mod metrics;
pub mod packages;
pub mod retry;
pub mod sandbox_gate;
pub mod worker;

pub use worker::{DeliveryInfo, Disposition, HandleError, Worker, WorkerError};

/// The publisher of the current broker session, if any (shared by the delivery tasks and the
/// batcher, replaced on reconnect).
pub type PublisherSlot = Arc<RwLock<Option<Publisher>>>;

pub(crate) fn current_publisher(slot: &PublisherSlot) -> Option<Publisher> {
    slot.read().ok().and_then(|p| p.clone())
}

pub(crate) fn set_publisher(slot: &PublisherSlot, publisher: Option<Publisher>) {
    if let Ok(mut p) = slot.write() {
        *p = publisher;
    }
}
