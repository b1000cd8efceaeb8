//! Where jobs go: the [`JobSink`] the coordinator publishes through.
//!
//! In production this is the broker publisher (persistent messages, `mandatory`, publisher
//! confirms awaited); the trait keeps run creation, the sweeper and `maxConcurrentTests`
//! independent of the transport, so a publish that fails for any reason simply leaves the
//! run's watermark short of it, for the sweeper.

use std::sync::Arc;

use async_trait::async_trait;
use skilleval_infra::messages::EncodedJob;
use skilleval_infra::topology::{BrokerError, Lane, QueueDepth};

/// Why the broker did not confirm a job.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// No usable connection to the broker (the reason is shared by every job of the call).
    #[error("no broker connection: {0}")]
    Unavailable(Arc<str>),
    /// The broker answered, but not with a confirm: a nack, an unroutable return, a channel
    /// closed while waiting.
    #[error(transparent)]
    Refused(Arc<BrokerError>),
    /// The sink gave no answer for the job.
    #[error("the publisher gave no answer for the job")]
    Unanswered,
}

/// Publishes jobs and says which the broker confirmed.
#[async_trait]
pub trait JobSink: Send + Sync + std::fmt::Debug {
    /// Publishes every job (pipelined) on `lane` and returns, per job in order, whether the
    /// broker confirmed it.
    async fn publish(&self, jobs: &[EncodedJob], lane: Lane) -> Vec<Result<(), PublishError>>;

    /// Whether the broker connection is usable (readiness).
    async fn check(&self) -> Result<(), PublishError>;

    /// The depth and consumers of every queue of the topology, for `/metrics`; `None` when
    /// the sink has no broker to ask.
    async fn queue_depths(&self) -> Option<Result<Vec<QueueDepth>, String>> {
        None
    }

    /// `host:port` of the broker node the publisher is connected to, for readiness; `None`
    /// while it has no connection, or when the sink has no broker.
    async fn node(&self) -> Option<String> {
        None
    }

    /// Publishes a parked message again (an operator's requeue): a job to its lane on the
    /// jobs exchange, anything else straight to `from_queue`; confirmed.
    async fn republish(&self, from_queue: &str, body: &[u8]) -> Result<(), PublishError> {
        let _ = (from_queue, body);
        Err(PublishError::Unavailable("this sink has no broker".into()))
    }
}
