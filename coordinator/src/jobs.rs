//! Where jobs go: the [`JobSink`] the coordinator publishes through.
//!
//! In production this is the broker publisher (persistent messages, `mandatory`, publisher
//! confirms awaited); the trait keeps run creation, the sweeper and `maxConcurrentTests`
//! independent of the transport, so a publish that fails for any reason simply leaves the row
//! unpublished for the sweeper.

use async_trait::async_trait;
use skilleval_infra::messages::EncodedJob;

/// Publishes jobs and says which the broker confirmed.
#[async_trait]
pub trait JobSink: Send + Sync + std::fmt::Debug {
    /// Publishes every job (pipelined) and returns, per job in order, whether the broker
    /// confirmed it (`Err` says why not: nack, unroutable return, closed channel).
    async fn publish(&self, jobs: &[EncodedJob]) -> Vec<Result<(), String>>;

    /// Whether the broker connection is usable (readiness).
    async fn check(&self) -> Result<(), String>;
}
