//! [`RunPlanner`]: plans runs of every kind, records them with their plans, and gives a run's
//! plan back to whoever publishes it, writes it off or lists its pending cases.
//!
//! This is the one place that chooses a kind's module, by the lifecycle's [`Planning`] of the
//! run's kind (see [`crate::runs::plan`]). A plan is kept in memory from the run's creation
//! (or its first read) until the run is written off or finalised, a bounded number of them,
//! and read again from the run's row otherwise (after a restart, on another replica), which
//! gives the same plan: the row records what planning it needs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::json;
use skilleval_execution::plan::Job;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::variant::Variant;
use skilleval_infra::store::lifecycle::Planning;
use skilleval_infra::store::runs::{NewRun, OwnDefinition, RunInsert};
use skilleval_infra::store::Store;
use sqlx::PgConnection;
use uuid::Uuid;

use super::error::LaunchError;
use super::plan::{variant_keys, PlannedVersion, PreparedRun, RunPlan, RunRequest};
use super::samples::SamplesRun;
use super::{rescore, samples, upload};

/// Plans kept in memory (runs being created or released under a cap); past it the cache
/// starts over (a plan is read again from the database when needed).
const PLANS_KEPT: usize = 64;

/// Plans runs and keeps their plans. Cheap to clone: clones share the plans in memory.
#[derive(Debug, Clone)]
pub struct RunPlanner {
    store: Store,
    plans: Arc<Mutex<HashMap<Uuid, Arc<RunPlan>>>>,
}

impl RunPlanner {
    pub fn new(store: Store) -> Self {
        RunPlanner {
            store,
            plans: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Plans a run of a stored version (its definition read from the database).
    #[tracing::instrument(skip_all, fields(version_id = %request.version_id))]
    pub async fn prepare_stored(
        &self,
        conn: &mut PgConnection,
        request: &RunRequest,
    ) -> Result<PreparedRun, LaunchError> {
        match request.kind.planning() {
            Planning::StoredDefinition => upload::prepare_stored(&self.store, conn, request).await,
            Planning::StoredOutputs => rescore::prepare_stored(&self.store, conn, request).await,
            Planning::Samples => Err(LaunchError::IngestOnly),
        }
    }

    /// Plans a run of the definition in hand: checks the request's filter against the
    /// definition and counts its jobs (a filter other than "everything" reads every case's id
    /// and tags: for a stored definition use [`RunPlanner::prepare_stored`], which does that
    /// off the async threads).
    pub fn prepare(
        &self,
        version: PlannedVersion,
        request: &RunRequest,
    ) -> Result<PreparedRun, LaunchError> {
        match request.kind.planning() {
            Planning::StoredDefinition => upload::prepare(version, request),
            Planning::StoredOutputs => Err(LaunchError::RescoreWithoutSource),
            Planning::Samples => Err(LaunchError::IngestOnly),
        }
    }

    /// Plans the samples run of one ingest batch: `total` sampled items, whose `samples` rows
    /// the caller inserts in the same transaction as the run ([`RunPlanner::insert`]), with
    /// positions `0..total`.
    pub fn prepare_samples(&self, samples: SamplesRun) -> PreparedRun {
        samples::prepare(&self.store, samples)
    }

    /// Inserts a prepared run (one row: the run and its plan, `creating`) in the caller's
    /// transaction. Nothing is published yet: call `RunPublisher::start` after the commit.
    pub async fn insert(
        &self,
        conn: &mut PgConnection,
        prepared: &PreparedRun,
    ) -> Result<RunInsert, LaunchError> {
        let own_definition = match &prepared.own_definition {
            Some(definition) => Some(OwnDefinition {
                deflated: definition.deflated(),
                profile: definition.header().profile.as_str(),
                settings: serde_json::to_value(&definition.header().settings).map_err(|e| {
                    LaunchError::Corrupt {
                        run_id: prepared.run_id,
                        what: format!("its definition's settings do not serialise: {e}"),
                    }
                })?,
            }),
            None => None,
        };
        let new_run = NewRun {
            id: prepared.run_id,
            version_id: prepared.version_id,
            kind: prepared.kind,
            runner: prepared.plan.runner().map(|r| json!(r)),
            callback_url: prepared.callback_url.as_deref(),
            idempotency_key: prepared.idempotency_key.as_deref(),
            max_in_flight: prepared.max_in_flight,
            fail_fast: prepared.fail_fast,
            request: prepared.plan.recorded_request(),
            max_cost_usd: prepared.max_cost_usd,
            max_tokens: prepared.max_tokens,
            gate: prepared.gate.map(|g| json!(g)),
            traceparent: prepared.plan.traceparent().map(str::to_string),
            definition: own_definition,
            token_id: prepared.token_id,
        };
        let inserted = self
            .store
            .insert_run(conn, &new_run, prepared.total)
            .await?;
        // On the creating request's span: what an operator searches the trace by.
        skilleval_infra::telemetry::set_current_attribute(
            "skilleval.run_id",
            inserted.run_id().to_string(),
        );
        Ok(inserted)
    }

    /// The run's plan: kept in memory while it is published, else read again from the run's
    /// stored request and its version's definition.
    pub async fn plan_of(&self, run_id: Uuid) -> Result<Arc<RunPlan>, LaunchError> {
        if let Some(plan) = self.plans.lock().ok().and_then(|p| p.get(&run_id).cloned()) {
            return Ok(plan);
        }
        let stored = self
            .store
            .run_plan_request(run_id)
            .await?
            .ok_or(LaunchError::RunNotFound(run_id))?;
        let plan = match stored.kind.planning() {
            Planning::StoredDefinition => upload::reload(&self.store, run_id, stored).await?,
            Planning::StoredOutputs => rescore::reload(&self.store, run_id, stored).await?,
            Planning::Samples => samples::reload(&self.store, run_id, stored).await?,
        };
        let plan = Arc::new(plan);
        self.remember(Arc::clone(&plan));
        Ok(plan)
    }

    /// Keeps a plan in memory (its run is being published).
    pub(crate) fn remember(&self, plan: Arc<RunPlan>) {
        if let Ok(mut plans) = self.plans.lock() {
            if plans.len() >= PLANS_KEPT {
                plans.clear();
            }
            plans.insert(plan.run_id(), plan);
        }
    }

    /// Drops a run's plan from memory (its publishing is over).
    pub fn forget(&self, run_id: Uuid) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.remove(&run_id);
        }
    }

    /// The cases of a run not recorded yet with a case index above `after`, in case order,
    /// at most `limit`, described from the plan (status `queued`).
    pub async fn pending_after(
        &self,
        run_id: Uuid,
        after: (i32, Variant),
        limit: usize,
    ) -> Result<Vec<JobResult>, LaunchError> {
        let plan = self.plan_of(run_id).await?;
        let mut planned = plan.chunks(0, usize::MAX);
        let mut found = Vec::new();
        let after = (i64::from(after.0), after.1);
        while let Some(chunk) = planned.recv().await {
            let chunk: Vec<Job> = chunk?
                .into_iter()
                .filter(|job| (i64::from(job.case_index), Variant::of(&job.runner)) > after)
                .collect();
            if chunk.is_empty() {
                continue;
            }
            let recorded: HashSet<(String, Variant)> = self
                .store
                .recorded_among(run_id, &variant_keys(&chunk))
                .await?
                .into_iter()
                .collect();
            for job in chunk
                .iter()
                .filter(|j| !recorded.contains(&(j.case.id.clone(), Variant::of(&j.runner))))
            {
                found.push(pending(job));
                // The plan lists variant after variant: with variants, the first pending in
                // (case, variant) order are known only once every one is seen.
                if found.len() >= limit && plan.in_case_order() {
                    return Ok(found);
                }
            }
        }
        found.sort_by_key(|r| (r.case_index, r.variant));
        found.truncate(limit);
        Ok(found)
    }
}

/// A planned case not recorded yet, as the results endpoint lists it.
fn pending(job: &Job) -> JobResult {
    let mut r = JobResult::skipped(job, "");
    r.status = CaseStatus::Queued;
    r.details = serde_json::Value::Null;
    r
}
