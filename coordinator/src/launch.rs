//! Run creation and publishing: plan a version's jobs, commit the run with one `queued` row per
//! case, then publish the jobs with confirms and record which were confirmed.
//!
//! Crash safety comes from the order: rows are committed before anything is published, and a
//! row is marked published only after its confirm. Whatever is left unpublished — a coordinator
//! killed between commit and publish, a nack, a broker outage — is found by
//! [`RunLauncher::sweep_unpublished`] after `publish_grace` and published then. A job published
//! twice is harmless: workers upsert results keyed by (run, case).
//!
//! `maxConcurrentTests` is enforced at release: [`RunLauncher::release`] publishes only as many
//! of a run's jobs as the cap leaves room for, and runs again whenever a case of the run
//! finishes (the aggregator calls it on events) and on every sweep.

use std::sync::Arc;
use std::time::Duration;

use crate::db::{self as runs, NewRun, RunInsert, VersionForRun};
use anyhow::Context as _;
use serde_json::json;
use skilleval::model::{EvalConfig, RunnerConfig, RunnerSpec};
use skilleval::plan::{plan, CaseFilter, PlanError};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::error::ApiError;
use crate::jobs::JobSink;
use crate::metrics::Metrics;

/// What a run is asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub version_id: Uuid,
    pub runner: Option<RunnerSpec>,
    pub filter: CaseFilter,
    pub callback_url: Option<String>,
    pub idempotency_key: Option<String>,
    /// `upload` or `manual`.
    pub kind: &'static str,
    /// Budget: the run stops once its cases spent more than this (`None`: no cap). Validated
    /// by the route (`> 0`, `>= 1`); the database's CHECKs hold the same rules.
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
}

/// Creates runs and publishes their jobs.
#[derive(Debug, Clone)]
pub struct RunLauncher {
    pool: PgPool,
    sink: Arc<dyn JobSink>,
    metrics: Arc<Metrics>,
    publish_grace: Duration,
}

impl RunLauncher {
    pub fn new(
        pool: PgPool,
        sink: Arc<dyn JobSink>,
        metrics: Arc<Metrics>,
        publish_grace: Duration,
    ) -> Self {
        RunLauncher {
            pool,
            sink,
            metrics,
            publish_grace,
        }
    }

    /// Plans and inserts a run in the caller's transaction (nothing is published yet: call
    /// [`RunLauncher::release`] after the commit).
    #[tracing::instrument(skip_all, fields(version_id = %request.version_id))]
    pub async fn insert(
        &self,
        conn: &mut PgConnection,
        request: &RunRequest,
    ) -> Result<RunInsert, ApiError> {
        let version = runs::version_for_run(conn, request.version_id)
            .await?
            .ok_or_else(|| ApiError::not_found("version", request.version_id))?;
        insert_planned(conn, &version, request).await
    }

    /// Creates a run (one transaction) and publishes what may be published now.
    pub async fn create(&self, request: &RunRequest) -> Result<RunInsert, ApiError> {
        let mut tx = self.pool.begin().await?;
        let inserted = self.insert(&mut tx, request).await?;
        tx.commit().await.context("committing the run")?;
        if let RunInsert::Created(run_id) = inserted {
            self.metrics.runs_created.inc();
            self.release_logged(run_id).await;
        }
        Ok(inserted)
    }

    /// [`RunLauncher::release`], logging a failure instead of returning it: the rows are
    /// committed, so the sweeper publishes them later whatever went wrong now.
    pub async fn release_logged(&self, run_id: Uuid) {
        if let Err(e) = self.release(run_id).await {
            self.metrics.publish_failures.inc();
            tracing::warn!(%run_id, error = ?e, "publishing the run's jobs failed; the sweeper will retry");
        }
    }

    /// Publishes the run's unpublished jobs the cap leaves room for, marking the confirmed
    /// ones published. Returns how many were confirmed.
    #[tracing::instrument(skip(self))]
    pub async fn release(&self, run_id: Uuid) -> anyhow::Result<usize> {
        let mut tx = self
            .pool
            .begin()
            .await
            .context("starting the release transaction")?;
        runs::lock_run_release(&mut tx, run_id)
            .await
            .context("locking the run for release")?;
        let jobs = runs::jobs_to_release(&mut tx, run_id)
            .await
            .context("reading jobs to release")?;
        if jobs.is_empty() {
            return Ok(0);
        }
        let outcomes = self.sink.publish(&jobs).await;
        let mut confirmed = Vec::with_capacity(jobs.len());
        let mut failures = Vec::new();
        for (job, outcome) in jobs.iter().zip(outcomes) {
            match outcome {
                Ok(()) => confirmed.push(job.case.id.clone()),
                Err(e) => failures.push(format!("{}: {e}", job.case.id)),
            }
        }
        runs::mark_published(&mut tx, run_id, &confirmed)
            .await
            .context("recording publisher confirms")?;
        tx.commit().await.context("committing publisher confirms")?;
        self.metrics.jobs_published.inc_by(confirmed.len() as u64);
        if !failures.is_empty() {
            self.metrics.publish_failures.inc_by(failures.len() as u64);
            tracing::warn!(%run_id, failed = failures.len(), first = %failures[0], "some jobs were not confirmed; the sweeper will retry them");
        }
        Ok(confirmed.len())
    }

    /// Publishes the jobs of runs left unpublished for longer than the grace period.
    /// Returns how many jobs it published.
    pub async fn sweep_unpublished(&self) -> anyhow::Result<usize> {
        let run_ids =
            runs::runs_with_unpublished_jobs(&self.pool, self.publish_grace.as_secs_f64(), 500)
                .await
                .context("listing runs with unpublished jobs")?;
        let mut published = 0;
        for run_id in run_ids {
            match self.release(run_id).await {
                Ok(n) => published += n,
                Err(e) => {
                    tracing::warn!(%run_id, error = ?e, "sweeper could not publish the run's jobs");
                }
            }
        }
        if published > 0 {
            self.metrics.sweeper_republished.inc_by(published as u64);
            tracing::info!(published, "sweeper published jobs left unpublished");
        }
        Ok(published)
    }
}

/// Plans the run of a stored version and inserts it with its rows.
async fn insert_planned(
    conn: &mut PgConnection,
    version: &VersionForRun,
    request: &RunRequest,
) -> Result<RunInsert, ApiError> {
    let config: EvalConfig = serde_json::from_value(version.config.clone()).with_context(|| {
        format!(
            "stored eval config of version {} does not parse",
            version.version_id
        )
    })?;
    let runner_override = request
        .runner
        .as_ref()
        .map(|spec| resolve_runner(spec, &config));
    let run_id = Uuid::now_v7();
    let jobs = plan(
        &config,
        &version.package_hash,
        run_id,
        &request.filter,
        runner_override.as_ref(),
    )
    .map_err(|e| plan_error(&e))?;
    let max_in_flight = match config.settings.parallel_execution {
        Some(false) => Some(1),
        _ => config
            .settings
            .max_concurrent_tests
            .filter(|n| *n > 0)
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
    };
    let new_run = NewRun {
        id: run_id,
        version_id: version.version_id,
        kind: request.kind,
        runner: runner_override.as_ref().map(|r| json!(r)),
        callback_url: request.callback_url.as_deref(),
        idempotency_key: request.idempotency_key.as_deref(),
        max_in_flight,
        fail_fast: config.settings.fail_fast,
        request: json!({
            "tags": request.filter.tags,
            "suite": request.filter.suite,
            "test_cases": request.filter.case_ids,
        }),
        max_cost_usd: request.max_cost_usd,
        max_tokens: request.max_tokens,
    };
    Ok(runs::insert_run(conn, &new_run, &jobs).await?)
}

/// A runner named in a request keeps the definition's runner options (its script) unless the
/// request gives a full runner.
fn resolve_runner(spec: &RunnerSpec, config: &EvalConfig) -> RunnerConfig {
    match spec {
        RunnerSpec::Name(kind) => RunnerConfig {
            kind: kind.clone(),
            ..config
                .settings
                .runner
                .as_ref()
                .map(RunnerSpec::config)
                .unwrap_or_default()
        },
        RunnerSpec::Detailed(cfg) => cfg.clone(),
    }
}

fn plan_error(e: &PlanError) -> ApiError {
    let field = match e {
        PlanError::UnknownSuite(..) => "suite",
        PlanError::UnknownCase(..) => "test_cases",
        PlanError::Empty { .. } => "tags",
    };
    let rule = e.to_string();
    ApiError::new(
        axum::http::StatusCode::UNPROCESSABLE_ENTITY,
        "plan_invalid",
        rule.clone(),
    )
    .with_details(json!({ "field": field, "rule": rule }))
}
