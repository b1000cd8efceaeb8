//! [`RunSweeper`]: what no request is left to finish. It resumes the publishing of live runs
//! whose watermark is short of their plan after the grace period and whose publisher is gone
//! (nobody holds the run's lock), through the one pipeline (`crate::runs::publish`), and it
//! writes off the cases of stopped runs (cancel, failFast, budget): each planned case without
//! a row is written `skipped` with the stop's sentence ([`RunSweeper::write_off`]), which is
//! what lets a stopped run complete. A cancel and the aggregator write off at once; the sweep
//! catches what they did not.

use std::sync::Arc;
use std::time::Duration;

use skilleval_execution::result::JobResult;
use skilleval_infra::store::lifecycle::{Transition, TransitionError, WrittenOff};
use skilleval_infra::store::Store;
use tracing::Instrument as _;
use uuid::Uuid;

use super::error::LaunchError;
use super::planner::RunPlanner;
use super::publish::{unlock, Pass, RunPublisher};
use crate::metrics::Metrics;

/// Resumes unfinished publishing passes and writes off stopped runs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RunSweeper {
    store: Store,
    planner: RunPlanner,
    publisher: RunPublisher,
    metrics: Arc<Metrics>,
    /// How old a run short of its plan must be before its publishing is resumed (its creator
    /// may still be at work).
    publish_grace: Duration,
}

impl RunSweeper {
    pub fn new(
        store: Store,
        planner: RunPlanner,
        publisher: RunPublisher,
        metrics: Arc<Metrics>,
        publish_grace: Duration,
    ) -> Self {
        RunSweeper {
            store,
            planner,
            publisher,
            metrics,
            publish_grace,
        }
    }

    /// The sweep: resumes the publishing of live runs whose watermark is short of their plan
    /// after the grace period and whose publisher is gone (nobody holds the run's lock: a
    /// creator killed mid-creation, a chunk the broker did not confirm, or a cap with room),
    /// and writes off the cases of stopped runs nobody wrote off. Returns how many jobs it
    /// published.
    pub async fn sweep_unpublished(&self) -> Result<usize, LaunchError> {
        let run_ids = self
            .store
            .runs_to_publish(self.publish_grace.as_secs_f64(), 200)
            .await?;
        let mut published = 0;
        for run_id in run_ids {
            match self.resume(run_id).await {
                Ok(n) => published += n,
                Err(e) => {
                    tracing::warn!(%run_id, error = %e, "resuming the run's publishing failed");
                }
            }
        }
        if published > 0 {
            self.metrics.sweeper_republished.inc_by(published as u64);
            tracing::info!(published, "sweeper published jobs left unpublished");
        }
        let stopped = self.store.runs_to_write_off(50).await?;
        for run_id in stopped {
            if let Err(e) = self.write_off(run_id).await {
                tracing::warn!(%run_id, error = %e, "writing off a stopped run's cases failed");
            }
        }
        Ok(published)
    }

    /// One run of the sweep: skipped when a publisher of it is alive.
    async fn resume(&self, run_id: Uuid) -> Result<usize, LaunchError> {
        let mut conn = self
            .store
            .pool()
            .acquire()
            .await
            .map_err(LaunchError::database("taking a connection to resume a run"))?;
        if !self.store.try_lock_publishing(&mut conn, run_id).await? {
            return Ok(0);
        }
        let published = match self.planner.plan_of(run_id).await {
            Ok(plan) => {
                let span = Pass::Resume.span(&plan);
                self.publisher
                    .publish_pass(&mut conn, &plan, Pass::Resume)
                    .instrument(span)
                    .await
            }
            Err(e) => Err(e),
        };
        unlock(&self.store, conn, run_id).await;
        let published = published?;
        self.publisher.end_creation(run_id).await;
        if published > 0 {
            tracing::info!(%run_id, published, "resumed the run's publishing");
        }
        Ok(published)
    }

    /// Writes every planned case of a stopped run that has no row as `skipped` (with the
    /// stop's sentence), a chunk at a time; cases recorded meanwhile keep their row and the
    /// counters move by exactly the rows written. Returns how many it wrote. Refused
    /// (a typed error) for a run that is not stopped.
    #[tracing::instrument(skip(self))]
    pub async fn write_off(&self, run_id: Uuid) -> Result<i64, LaunchError> {
        let state = self
            .store
            .run_state(run_id)
            .await?
            .ok_or(LaunchError::RunNotFound(run_id))?;
        if !state.awaits_write_off() {
            if state.stop_reason.is_none() {
                return Err(LaunchError::Transition(TransitionError::Illegal {
                    run_id,
                    transition: Transition::WriteOff,
                    state,
                }));
            }
            return Ok(0);
        }
        let reason = state
            .stop_detail
            .unwrap_or_else(|| "the run stopped before this case ran".to_string());
        let plan = self.planner.plan_of(run_id).await?;
        let mut planned = plan.chunks(0, usize::MAX);
        let mut written = 0;
        while let Some(chunk) = planned.recv().await {
            let chunk = chunk?;
            let results: Vec<JobResult> = chunk
                .iter()
                .map(|job| JobResult::skipped(job, &reason))
                .collect();
            let mut cases = WrittenOff::default();
            for r in &results {
                let text = serde_json::to_string(r).map_err(|e| LaunchError::Corrupt {
                    run_id,
                    what: format!("a skipped result does not serialise: {e}"),
                })?;
                cases.push(r, text);
            }
            written += self.store.write_off(run_id, &cases).await?;
        }
        self.planner.forget(run_id);
        Ok(written)
    }
}
