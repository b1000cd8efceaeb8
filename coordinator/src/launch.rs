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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use crate::db::{self as runs, NewRun, RunInsert};
use anyhow::Context as _;
use serde_json::json;
use skilleval::model::{EvalConfig, RunnerConfig, RunnerSpec};
use skilleval::plan::{plan, CaseFilter, PlanError};
use skilleval_infra::messages::EncodedJob;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::error::ApiError;
use crate::jobs::JobSink;
use crate::metrics::Metrics;

/// Rows read, published and marked at a time by a release.
pub const RELEASE_PAGE: usize = 2_000;

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
        let config: EvalConfig =
            serde_json::from_value(version.config.clone()).with_context(|| {
                format!(
                    "stored eval config of version {} does not parse",
                    version.version_id
                )
            })?;
        let planned = PlannedVersion {
            version_id: version.version_id,
            package_hash: &version.package_hash,
            config: &config,
        };
        self.insert_planned(conn, &planned, request).await
    }

    /// [`RunLauncher::insert`] with the version's definition in hand (an upload): plans the
    /// run and inserts it with its rows.
    pub async fn insert_planned(
        &self,
        conn: &mut PgConnection,
        version: &PlannedVersion<'_>,
        request: &RunRequest,
    ) -> Result<RunInsert, ApiError> {
        let config = version.config;
        let runner_override = request
            .runner
            .as_ref()
            .map(|spec| resolve_runner(spec, config));
        let run_id = Uuid::now_v7();
        let jobs = plan(
            config,
            version.package_hash,
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
    ///
    /// Page by page ([`RELEASE_PAGE`] rows in case order, streamed from one query): each page
    /// (the stored job text, not parsed) is published with pipelined confirms, a few pages at
    /// once while the next is read, and its confirmed rows are marked published in one
    /// statement that commits at once, so memory stays flat whatever the run's size and
    /// workers recording early results never wait on the release's row locks.
    /// A page with a failed publish ends the release; the sweeper retries the rest.
    #[tracing::instrument(skip(self))]
    pub async fn release(&self, run_id: Uuid) -> anyhow::Result<usize> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .context("taking a connection for the release")?;
        runs::lock_run_release(&mut conn, run_id)
            .await
            .context("locking the run for release")?;
        let released = self.release_locked(&mut conn, run_id).await;
        if let Err(e) = runs::unlock_run_release(&mut conn, run_id).await {
            // Closing the connection is what frees a session lock for sure.
            tracing::warn!(%run_id, error = %e, "unlocking the run failed; closing the connection");
            drop(conn.detach());
        }
        released
    }

    async fn release_locked(&self, conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<usize> {
        let Some(room) = runs::release_room(conn, run_id)
            .await
            .context("reading what the run may publish")?
        else {
            return Ok(0);
        };
        if room == Some(0) {
            return Ok(0);
        }
        let rows = runs::unpublished_rows(conn, run_id, room);
        futures::pin_mut!(rows);
        // Pages publish and confirm in tasks of their own, up to PAGES_IN_FLIGHT at once,
        // while the next page is read: the broker always has confirms outstanding instead of
        // draining them at the end of every page.
        let mut in_flight: VecDeque<tokio::task::JoinHandle<PageOutcome>> = VecDeque::new();
        let mut confirmed_total = 0;
        let mut reading = true;
        loop {
            while reading && in_flight.len() < PAGES_IN_FLIGHT {
                let page = next_page(&mut rows, run_id).await?;
                if page.is_empty() {
                    reading = false;
                    break;
                }
                let sink = self.sink.clone();
                let pool = self.pool.clone();
                in_flight.push_back(tokio::spawn(publish_page(sink, pool, run_id, page)));
            }
            let Some(oldest) = in_flight.pop_front() else {
                break;
            };
            let outcome = oldest.await.context("a page's publish task failed")?;
            self.metrics.jobs_published.inc_by(outcome.confirmed as u64);
            confirmed_total += outcome.confirmed;
            if let Some(e) = outcome.unmarked {
                // The jobs are on the broker; only the record of it is missing, so the
                // sweeper will publish them again (harmless). Keep releasing the rest.
                tracing::warn!(%run_id, error = %e, "recording publisher confirms failed");
            }
            if let Some((failed, first)) = outcome.failed {
                self.metrics.publish_failures.inc_by(failed as u64);
                tracing::warn!(%run_id, failed, %first, "some jobs were not confirmed; the sweeper will retry them");
                // Stop reading; the pages already sent still settle and are counted.
                reading = false;
            }
        }
        Ok(confirmed_total)
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

/// A version to plan a run of.
#[derive(Debug, Clone, Copy)]
pub struct PlannedVersion<'a> {
    pub version_id: Uuid,
    pub package_hash: &'a str,
    pub config: &'a EvalConfig,
}

/// Pages of one release publishing at the same time.
const PAGES_IN_FLIGHT: usize = 3;

/// What became of one page: how many jobs the broker confirmed, how many it did not with the
/// first reason, and why the confirmed ones could not be marked published, if so.
struct PageOutcome {
    confirmed: usize,
    failed: Option<(usize, String)>,
    unmarked: Option<String>,
}

/// Publishes a page and marks its confirmed rows published (through the pool: the release's
/// own connection is busy streaming the rows).
async fn publish_page(
    sink: Arc<dyn JobSink>,
    pool: PgPool,
    run_id: Uuid,
    page: Vec<EncodedJob>,
) -> PageOutcome {
    // On the database's clock, like the workers' `updated_at`; unknown (the mark's own time
    // is used) if the database does not answer.
    let sent_at = runs::db_clock(&pool).await.ok();
    let outcomes = sink.publish(&page).await;
    let mut confirmed = Vec::with_capacity(page.len());
    let mut failures = Vec::new();
    for (job, outcome) in page.into_iter().zip(outcomes) {
        match outcome {
            Ok(()) => confirmed.push(job.test_case_id),
            Err(e) => failures.push(format!("{}: {e}", job.test_case_id)),
        }
    }
    let unmarked = runs::mark_published(&pool, run_id, &confirmed, sent_at)
        .await
        .err()
        .map(|e| e.to_string());
    PageOutcome {
        confirmed: confirmed.len(),
        failed: failures
            .first()
            .cloned()
            .map(|first| (failures.len(), first)),
        unmarked,
    }
}

/// Up to [`RELEASE_PAGE`] rows of a release's stream, encoded for publishing.
async fn next_page(
    rows: &mut (impl futures::Stream<Item = Result<(String, String), sqlx::Error>> + Unpin),
    run_id: Uuid,
) -> anyhow::Result<Vec<EncodedJob>> {
    use futures::TryStreamExt as _;
    let mut page = Vec::with_capacity(RELEASE_PAGE);
    while page.len() < RELEASE_PAGE {
        let Some((id, text)) = rows.try_next().await.context("reading jobs to release")? else {
            break;
        };
        page.push(EncodedJob::from_stored(run_id, id, &text));
    }
    Ok(page)
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
