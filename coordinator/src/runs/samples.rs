//! Samples runs ([`Planning::Samples`]): one ingest batch of production samples, judged on the
//! lower-priority lane. One job per sampled item (the run's `samples` rows, in position
//! order), graded by the monitor revision the batch was taken with. A samples run is created
//! by ingest only ([`prepare`], in the ingest's transaction with its rows), never from a
//! definition.
//!
//! [`Planning::Samples`]: skilleval_infra::store::lifecycle::Planning::Samples

use std::sync::Arc;

use serde_json::{json, Value};
use skilleval_execution::monitor::{
    sample_job, CriteriaSelection, Monitor, Sample, SampleJobContext,
};
use skilleval_execution::plan::Job;
use skilleval_infra::store::lifecycle::RunKind;
use skilleval_infra::store::runs::RunPlanRequest;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Lane;
use uuid::Uuid;

use super::error::LaunchError;
use super::plan::{JobChunks, KindPlan, PreparedRun, RunPlan, PUBLISH_CHUNK};

/// The samples run of one ingest batch, for `RunPlanner::prepare_samples`.
#[derive(Debug)]
pub struct SamplesRun {
    pub skill_id: Uuid,
    pub version_id: Uuid,
    pub package_hash: String,
    pub monitor: Arc<Monitor>,
    pub monitor_revision: u32,
    pub selection: CriteriaSelection,
    /// How many items were sampled (the run's plan: positions `0..total`).
    pub total: usize,
}

/// The plan of a samples run: its `samples` rows and the monitor revision they were taken
/// with.
#[derive(Debug)]
pub struct SamplesPlan {
    store: Store,
    monitor: Arc<Monitor>,
    request: SamplesRequest,
}

/// A samples run's `runs.request`: what planning it again needs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct SamplesRequest {
    skill_id: Uuid,
    monitor_revision: u32,
    selection: CriteriaSelection,
    package_hash: String,
}

impl KindPlan for SamplesPlan {
    fn chunks(&self, run_id: Uuid, _package_hash: &str, from: usize, limit: usize) -> JobChunks {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(samples_chunks(
            run_id,
            self.store.clone(),
            Arc::clone(&self.monitor),
            self.request.clone(),
            from,
            limit,
            tx,
        ));
        rx
    }

    fn lane(&self) -> Lane {
        Lane::Samples
    }

    fn recorded_request(&self) -> Value {
        json!(self.request)
    }
}

/// Plans the samples run of one ingest batch: `total` sampled items, whose `samples` rows
/// the caller inserts in the same transaction as the run (`RunPlanner::insert`), with
/// positions `0..total`.
pub(crate) fn prepare(store: &Store, samples: SamplesRun) -> PreparedRun {
    let run_id = Uuid::now_v7();
    let plan = SamplesPlan {
        store: store.clone(),
        monitor: samples.monitor,
        request: SamplesRequest {
            skill_id: samples.skill_id,
            monitor_revision: samples.monitor_revision,
            selection: samples.selection,
            package_hash: samples.package_hash.clone(),
        },
    };
    PreparedRun {
        gate: None,
        own_definition: None,
        token_id: None,
        run_id,
        version_id: samples.version_id,
        kind: RunKind::Samples,
        callback_url: None,
        idempotency_key: None,
        max_in_flight: None,
        fail_fast: false,
        max_cost_usd: None,
        max_tokens: None,
        total: samples.total,
        plan: Arc::new(RunPlan::new(
            run_id,
            samples.package_hash,
            Box::new(plan),
            skilleval_infra::telemetry::current_traceparent(),
        )),
    }
}

/// A created samples run's plan again: the monitor revision its batch was taken with.
pub(crate) async fn reload(
    store: &Store,
    run_id: Uuid,
    stored: RunPlanRequest,
) -> Result<RunPlan, LaunchError> {
    let request: SamplesRequest =
        serde_json::from_value(stored.request).map_err(|e| LaunchError::Corrupt {
            run_id,
            what: format!("its stored samples request does not parse: {e}"),
        })?;
    let (_, monitor) = store
        .monitor_revision_of_skill(
            request.skill_id,
            i32::try_from(request.monitor_revision).unwrap_or(i32::MAX),
        )
        .await?
        .ok_or_else(|| LaunchError::Corrupt {
            run_id,
            what: format!("monitor revision {} is gone", request.monitor_revision),
        })?;
    let monitor: Monitor = serde_json::from_value(monitor).map_err(|e| LaunchError::Corrupt {
        run_id,
        what: format!("its monitor revision does not parse: {e}"),
    })?;
    let package_hash = request.package_hash.clone();
    let plan = SamplesPlan {
        store: store.clone(),
        monitor: Arc::new(monitor),
        request,
    };
    Ok(RunPlan::new(
        run_id,
        package_hash,
        Box::new(plan),
        stored.traceparent,
    ))
}

/// A samples run's jobs from position `from` (at most `limit`), a page of rows at a time:
/// each row's sample graded by the run's monitor revision, its position the case index.
async fn samples_chunks(
    run_id: Uuid,
    store: Store,
    monitor: Arc<Monitor>,
    request: SamplesRequest,
    from: usize,
    limit: usize,
    tx: tokio::sync::mpsc::Sender<Result<Vec<Job>, LaunchError>>,
) {
    let ctx = SampleJobContext {
        run_id,
        package_hash: &request.package_hash,
        monitor_revision: request.monitor_revision,
        selection: request.selection,
    };
    let mut position = from;
    let end = from.saturating_add(limit);
    while position < end {
        let want = (end - position).min(PUBLISH_CHUNK);
        let start = i32::try_from(position).unwrap_or(i32::MAX);
        let page = match store.sample_page(run_id, start, want as i64).await {
            Ok(page) => page,
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        };
        if page.is_empty() {
            return;
        }
        position += page.len();
        let jobs: Result<Vec<Job>, LaunchError> = page
            .iter()
            .map(|(index, body)| {
                let corrupt = |what: String| LaunchError::Corrupt { run_id, what };
                let sample: Sample = serde_json::from_str(body)
                    .map_err(|e| corrupt(format!("sample at {index} does not parse: {e}")))?;
                let index = u32::try_from(*index).unwrap_or(u32::MAX);
                sample_job(&monitor, &sample, index, &ctx).ok_or_else(|| {
                    corrupt(format!("sample `{}` leaves no criterion", sample.sample_id))
                })
            })
            .collect();
        let failed = jobs.is_err();
        if tx.send(jobs).await.is_err() || failed {
            return;
        }
    }
}
