//! Upload and manual runs ([`Planning::StoredDefinition`]): one job per selected case of the
//! version's stored definition, in case order, once per variant (a baseline, repeats), then
//! the trigger eval queries. An upload plans from the definition in hand (the one it just
//! stored, [`prepare`]); `POST /v1/runs` reads the version's ([`prepare_stored`]). Both kinds
//! are planned and finalised alike; only their origin differs.
//!
//! [`Planning::StoredDefinition`]: skilleval_infra::store::lifecycle::Planning::StoredDefinition

use serde_json::Value;
use skilleval_execution::runner::trigger::TriggerPlan;
use skilleval_infra::store::runs::RunPlanRequest;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Lane;
use skilleval_model::definition::{EvalConfig, RunnerConfig};
use sqlx::PgConnection;
use uuid::Uuid;

use super::definition::{prepare_counted, read_version, DefinitionJobs};
use super::error::LaunchError;
use super::plan::{JobChunks, KindPlan, PlannedVersion, PreparedRun, RunPlan, RunRequest};

/// The plan of an upload or manual run: the definition's jobs as they are.
#[derive(Debug)]
pub struct StoredDefinitionPlan {
    jobs: DefinitionJobs,
}

impl KindPlan for StoredDefinitionPlan {
    fn chunks(&self, run_id: Uuid, package_hash: &str, from: usize, limit: usize) -> JobChunks {
        self.jobs.chunks(run_id, package_hash, from, limit, None)
    }

    fn lane(&self) -> Lane {
        Lane::Ci
    }

    fn recorded_request(&self) -> Value {
        self.jobs.recorded_request(None)
    }

    fn runner(&self) -> Option<&RunnerConfig> {
        self.jobs.runner.as_ref()
    }

    fn triggers(&self) -> Option<&TriggerPlan> {
        self.jobs.triggers()
    }

    fn in_case_order(&self) -> bool {
        self.jobs.in_case_order()
    }

    fn sequenced(&self) -> Option<&EvalConfig> {
        self.jobs.sequenced()
    }
}

fn plan(jobs: DefinitionJobs) -> Box<dyn KindPlan> {
    Box::new(StoredDefinitionPlan { jobs })
}

/// Plans a run of the definition in hand: checks the request's filter against the definition
/// and counts its jobs (a filter other than "everything" reads every case's id and tags: for
/// a stored definition use [`prepare_stored`], which does that off the async threads).
pub(crate) fn prepare(
    version: PlannedVersion,
    request: &RunRequest,
) -> Result<PreparedRun, LaunchError> {
    let total = version.definition.count(&request.filter)??;
    prepare_counted(version, request, total, plan)
}

/// Plans a run of a stored version (its definition read from the database).
pub(crate) async fn prepare_stored(
    store: &Store,
    conn: &mut PgConnection,
    request: &RunRequest,
) -> Result<PreparedRun, LaunchError> {
    let (version, _, total) = read_version(store, conn, request, |_, _| Ok(())).await?;
    prepare_counted(version, request, total?, plan)
}

/// A created upload or manual run's plan again, from its row.
pub(crate) async fn reload(
    store: &Store,
    run_id: Uuid,
    stored: RunPlanRequest,
) -> Result<RunPlan, LaunchError> {
    let traceparent = stored.traceparent.clone();
    let (package_hash, jobs, _) = super::definition::reload(store, run_id, stored).await?;
    Ok(RunPlan::new(run_id, package_hash, plan(jobs), traceparent))
}
