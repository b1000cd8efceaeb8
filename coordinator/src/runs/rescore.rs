//! Rescore runs ([`Planning::StoredOutputs`]): a completed run's recorded outputs graded again
//! against a version's definition (or the rescore's own inline one). One job per case of the
//! definition that the source run recorded an output for, each carrying that output for the
//! `given` runner, so nothing is produced again; judges are called only where the
//! definition's strategies need them. A rescore is no new version: it is not gated.
//!
//! [`Planning::StoredOutputs`]: skilleval_infra::store::lifecycle::Planning::StoredOutputs

use std::sync::Arc;

use serde_json::Value;
use skilleval_execution::result::CaseStatus;
use skilleval_execution::runner::trigger::TriggerPlan;
use skilleval_infra::store::runs::RunPlanRequest;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Lane;
use skilleval_model::definition::{Given, RunnerConfig};
use sqlx::PgConnection;
use uuid::Uuid;

use super::definition::{case_ids, prepare_counted, read_version, DefinitionJobs, Givens};
use super::error::LaunchError;
use super::plan::{JobChunks, KindPlan, PreparedRun, RunPlan, RunRequest};
use crate::results::load_results;

/// The plan of a rescore: the definition's jobs for the cases the source run recorded, each
/// carrying the output it recorded.
#[derive(Debug)]
pub struct StoredOutputsPlan {
    jobs: DefinitionJobs,
    /// The run whose outputs are graded again.
    source_run: Uuid,
    outputs: Givens,
}

impl KindPlan for StoredOutputsPlan {
    fn chunks(&self, run_id: Uuid, package_hash: &str, from: usize, limit: usize) -> JobChunks {
        self.jobs.chunks(
            run_id,
            package_hash,
            from,
            limit,
            Some(Arc::clone(&self.outputs)),
        )
    }

    fn lane(&self) -> Lane {
        Lane::Ci
    }

    fn recorded_request(&self) -> Value {
        self.jobs.recorded_request(Some(self.source_run))
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
}

/// Plans a rescore of the request's source run (`rescore_of`) against the stored version's
/// definition (or the request's own): the definition's cases the source run has an output
/// for, run by the `given` runner.
pub(crate) async fn prepare_stored(
    store: &Store,
    conn: &mut PgConnection,
    request: &RunRequest,
) -> Result<PreparedRun, LaunchError> {
    let Some(source_run) = request.rescore_of else {
        return Err(LaunchError::RescoreWithoutSource);
    };
    let outputs = stored_outputs(store, source_run).await?;
    let recorded = Arc::clone(&outputs);
    let (version, filter, total) = read_version(store, conn, request, move |definition, filter| {
        // The definition's cases the source run has an output for.
        filter.case_ids = case_ids(definition)?
            .into_iter()
            .filter(|id| recorded.contains_key(id))
            .collect();
        Ok(())
    })
    .await?;
    if filter.case_ids.is_empty() {
        return Err(LaunchError::NothingToRescore { source_run });
    }
    let mut request = request.clone();
    request.filter = filter;
    let mut prepared = prepare_counted(version, &request, total?, |mut jobs| {
        jobs.runner = Some(given_runner());
        Box::new(StoredOutputsPlan {
            jobs,
            source_run,
            outputs,
        })
    })?;
    // A rescore grades outputs again; it is no new version to gate.
    prepared.gate = None;
    Ok(prepared)
}

/// A created rescore's plan again, from its row (the source run's outputs read again).
pub(crate) async fn reload(
    store: &Store,
    run_id: Uuid,
    stored: RunPlanRequest,
) -> Result<RunPlan, LaunchError> {
    let traceparent = stored.traceparent.clone();
    let (package_hash, jobs, source_run) = super::definition::reload(store, run_id, stored).await?;
    let source_run = source_run.ok_or_else(|| LaunchError::Corrupt {
        run_id,
        what: "its stored request names no source run to rescore".into(),
    })?;
    let outputs = stored_outputs(store, source_run).await?;
    let plan = StoredOutputsPlan {
        jobs,
        source_run,
        outputs,
    };
    Ok(RunPlan::new(
        run_id,
        package_hash,
        Box::new(plan),
        traceparent,
    ))
}

/// The runner of a rescore's jobs: each carries its output, nothing is produced.
fn given_runner() -> RunnerConfig {
    RunnerConfig {
        kind: "given".into(),
        ..RunnerConfig::default()
    }
}

/// The outputs a completed run recorded, by test case id (what a rescore grades again).
async fn stored_outputs(store: &Store, source: Uuid) -> Result<Givens, LaunchError> {
    let results = load_results(store, source)
        .await
        .map_err(|e| LaunchError::Corrupt {
            run_id: source,
            what: format!("its results do not read: {e:#}"),
        })?;
    Ok(Arc::new(
        results
            .into_iter()
            .filter(|r| !matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued))
            // A run with a baseline or repeats: the with-skill first attempt is its output.
            .filter(|r| r.variant.is_primary())
            .filter_map(|r| {
                let output = r.output?;
                Some((
                    r.test_case_id,
                    Given {
                        output,
                        tool_calls: None,
                    },
                ))
            })
            .collect(),
    ))
}
