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
use skilleval::plan::{CaseFilter, DefinitionText, Job, PlanError, TextError};
use skilleval_infra::messages::EncodedJob;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
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

    /// Plans a run of a stored version (its definition read from the database).
    #[tracing::instrument(skip_all, fields(version_id = %request.version_id))]
    pub async fn prepare_stored(
        &self,
        conn: &mut PgConnection,
        request: &RunRequest,
    ) -> Result<PreparedRun, ApiError> {
        let version = runs::version_for_run(conn, request.version_id)
            .await?
            .ok_or_else(|| ApiError::not_found("version", request.version_id))?;
        let version_id = version.version_id;
        // Reading the definition (and counting a filter's jobs) parses all of it: CPU work,
        // kept off the async threads.
        let filter = request.filter.clone();
        let read = tokio::task::spawn_blocking(move || {
            let definition = read_definition(version.config)?;
            let total = definition.count(&filter)?;
            Ok::<_, TextError>((definition, total))
        })
        .await
        .context("reading the stored eval config")?;
        let (definition, total) = read
            .with_context(|| format!("reading the stored eval config of version {version_id}"))?;
        let planned = PlannedVersion {
            version_id,
            package_hash: version.package_hash,
            definition: Arc::new(definition),
        };
        self.prepare_counted(planned, request, total.map_err(|e| plan_error(&e))?)
    }

    /// Plans a run: checks the request's filter against the definition and counts its jobs
    /// (a filter other than "everything" reads every case's id and tags: for a stored
    /// definition use [`RunLauncher::prepare_stored`], which does that off the async threads).
    /// The jobs themselves are planned from the definition's text while the run is created
    /// ([`PreparedRun::job_chunks`]), a chunk at a time.
    pub fn prepare(
        &self,
        version: PlannedVersion,
        request: &RunRequest,
    ) -> Result<PreparedRun, ApiError> {
        let total = version
            .definition
            .count(&request.filter)
            .context("counting the run's jobs")?
            .map_err(|e| plan_error(&e))?;
        self.prepare_counted(version, request, total)
    }

    /// [`RunLauncher::prepare`] once the filter is checked and its jobs counted (`total`).
    fn prepare_counted(
        &self,
        version: PlannedVersion,
        request: &RunRequest,
        total: usize,
    ) -> Result<PreparedRun, ApiError> {
        let header = version.definition.header();
        let runner_override = request
            .runner
            .as_ref()
            .map(|spec| resolve_runner(spec, header));
        let max_in_flight = match header.settings.parallel_execution {
            Some(false) => Some(1),
            _ => header
                .settings
                .max_concurrent_tests
                .filter(|n| *n > 0)
                .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
        };
        let fail_fast = header.settings.fail_fast;
        Ok(PreparedRun {
            run_id: Uuid::now_v7(),
            version_id: version.version_id,
            kind: request.kind,
            runner: runner_override.as_ref().map(|r| json!(r)),
            callback_url: request.callback_url.clone(),
            idempotency_key: request.idempotency_key.clone(),
            max_in_flight,
            fail_fast,
            request: json!(RecordedFilter::from(&request.filter)),
            max_cost_usd: request.max_cost_usd,
            max_tokens: request.max_tokens,
            // A cap or failFast decides which jobs go out as results come in: those runs are
            // created whole and released by the cap. Any other is streamed.
            streamed: max_in_flight.is_none() && !fail_fast,
            total,
            definition: version.definition,
            package_hash: version.package_hash,
            filter: request.filter.clone(),
            runner_override,
        })
    }

    /// Inserts a prepared run in the caller's transaction: the run and all its rows, or for a
    /// streamed run the run alone, marked `creating`. Nothing is published yet: call
    /// [`RunLauncher::start`] after the commit.
    pub async fn insert(
        &self,
        conn: &mut PgConnection,
        prepared: &PreparedRun,
    ) -> Result<RunInsert, ApiError> {
        let new_run = NewRun {
            id: prepared.run_id,
            version_id: prepared.version_id,
            kind: prepared.kind,
            runner: prepared.runner.clone(),
            callback_url: prepared.callback_url.as_deref(),
            idempotency_key: prepared.idempotency_key.as_deref(),
            max_in_flight: prepared.max_in_flight,
            fail_fast: prepared.fail_fast,
            request: prepared.request.clone(),
            max_cost_usd: prepared.max_cost_usd,
            max_tokens: prepared.max_tokens,
            creating: prepared.streamed,
        };
        let inserted = runs::insert_run(conn, &new_run, prepared.total).await?;
        if let (RunInsert::Created(run_id), false) = (inserted, prepared.streamed) {
            let mut chunks = prepared.job_chunks();
            while let Some(jobs) = chunks.recv().await {
                let jobs = jobs.context("planning the run's jobs")?;
                runs::insert_queued(conn, run_id, &jobs).await?;
            }
        }
        Ok(inserted)
    }

    /// After the commit of [`RunLauncher::insert`]: a run created whole is released; a
    /// streamed run gets its rows, chunk by chunk, each chunk published once committed. A
    /// failure is logged, not returned: the run is committed and the sweeper finishes it.
    ///
    /// The work runs in a task of its own, so a caller that goes away (an HTTP client that
    /// disconnects from a long upload drops the request's future) does not cut it off halfway,
    /// holding the run's session lock on a connection handed back to the pool.
    pub async fn start(&self, prepared: PreparedRun, inserted: RunInsert) {
        let RunInsert::Created(run_id) = inserted else {
            return;
        };
        self.metrics.runs_created.inc();
        let launcher = self.clone();
        let task = tokio::spawn(async move {
            if !prepared.streamed {
                launcher.release_logged(run_id).await;
                return;
            }
            if let Err(e) = launcher.populate(run_id, &prepared).await {
                launcher.metrics.publish_failures.inc();
                tracing::warn!(%run_id, error = ?e, "creating the run's rows failed; the sweeper will finish it");
            }
        });
        if let Err(e) = task.await {
            tracing::error!(%run_id, error = %e, "the run's creation task failed; the sweeper will finish it");
        }
    }

    /// Creates a run of a stored version and starts it.
    pub async fn create(&self, request: &RunRequest) -> Result<RunInsert, ApiError> {
        let mut tx = self.pool.begin().await?;
        let prepared = self.prepare_stored(&mut tx, request).await?;
        let inserted = self.insert(&mut tx, &prepared).await?;
        tx.commit().await.context("committing the run")?;
        self.start(prepared, inserted).await;
        Ok(inserted)
    }

    /// Streamed creation: inserts the run's rows in chunks of [`RELEASE_PAGE`], each in a
    /// transaction of its own and published (from memory, with pipelined confirms) as soon as
    /// it is committed, while the next chunk is inserted; the run's `published_through`
    /// watermark records the confirmed prefix (one write per chunk, none per row). Workers
    /// start on the first chunk while the rest is inserted.
    ///
    /// Holds the run's release lock throughout (a live creator is how the sweeper tells a
    /// creation under way from one whose coordinator died). A run stopped meanwhile (cancel,
    /// budget) is settled: its remaining cases are inserted `skipped`.
    async fn populate(&self, run_id: Uuid, prepared: &PreparedRun) -> anyhow::Result<()> {
        let mut conn = self.locked(run_id).await?;
        let populated = self.populate_locked(&mut conn, run_id, prepared).await;
        unlock(conn, run_id).await;
        populated
    }

    /// A connection holding the run's release lock (waiting for it); give it back with
    /// [`unlock`].
    async fn locked(&self, run_id: Uuid) -> anyhow::Result<PoolConnection<Postgres>> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .context("taking a connection to lock the run")?;
        runs::lock_run_release(&mut conn, run_id)
            .await
            .context("locking the run")?;
        Ok(conn)
    }

    /// The jobs are planned from the definition's text a chunk at a time while earlier
    /// chunks are inserted and published, and each chunk's jobs are dropped once it is
    /// handed to the publisher (which keeps only their encoded text until confirmed): a
    /// creation holds the text and a few chunks, whatever the run's size.
    async fn populate_locked(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        prepared: &PreparedRun,
    ) -> anyhow::Result<()> {
        let total = prepared.total;
        let mut planned = prepared.job_chunks();
        let mut in_flight: VecDeque<(tokio::task::JoinHandle<ChunkOutcome>, i32)> = VecDeque::new();
        // Every chunk settled so far was confirmed whole: the watermark may advance.
        let mut whole = true;
        // Where the time goes (logged at the end): waiting for the planner, inserting, and
        // waiting for the oldest chunks' confirms (and recording them) before the next.
        let started = std::time::Instant::now();
        let mut inserting = Duration::ZERO;
        let mut planning = Duration::ZERO;
        let mut confirming = Duration::ZERO;
        let mut queued_so_far = 0;
        let mut chunks = 0;
        let mut stopped = false;
        loop {
            let plan_started = std::time::Instant::now();
            let Some(chunk) = planned.recv().await else {
                break;
            };
            planning += plan_started.elapsed();
            let chunk = chunk.context("planning the run's jobs")?;
            chunks += 1;
            let confirm_started = std::time::Instant::now();
            while in_flight.len() >= PAGES_IN_FLIGHT {
                if let Some(oldest) = in_flight.pop_front() {
                    whole = self.settle_chunk(conn, run_id, oldest, whole).await?;
                }
            }
            confirming += confirm_started.elapsed();
            let texts = runs::encode_jobs(&chunk).context("encoding jobs")?;
            let last = queued_so_far + chunk.len() >= total;
            let insert_started = std::time::Instant::now();
            let queued = runs::insert_chunk(conn, run_id, &chunk, &texts, last)
                .await
                .context("inserting a chunk of the run's rows")?;
            inserting += insert_started.elapsed();
            if !queued {
                let unqueued = settle(conn, run_id, Some(chunk), &mut planned)
                    .await
                    .context("settling a run stopped while it was created")?
                    .1;
                tracing::info!(%run_id, unqueued, "the run stopped while it was created");
                stopped = true;
                break;
            }
            queued_so_far += chunk.len();
            let next_index = chunk.last().map_or(0, |job| {
                i32::try_from(job.case_index).unwrap_or(i32::MAX - 1) + 1
            });
            let page: Vec<EncodedJob> = chunk
                .iter()
                .zip(&texts)
                .map(|(job, text)| EncodedJob::from_stored(run_id, job.case.id.clone(), text))
                .collect();
            drop(texts);
            drop(chunk);
            let sink = self.sink.clone();
            in_flight.push_back((tokio::spawn(publish_chunk(sink, page)), next_index));
            if last {
                break;
            }
        }
        let confirm_started = std::time::Instant::now();
        while let Some(oldest) = in_flight.pop_front() {
            whole = self.settle_chunk(conn, run_id, oldest, whole).await?;
        }
        confirming += confirm_started.elapsed();
        if queued_so_far < total && !stopped {
            // The planner gave fewer jobs than it counted (it cannot, planning the same text
            // with the same filter): the run stays `creating` and the sweeper settles it.
            anyhow::bail!("planned {queued_so_far} of the run's {total} jobs");
        }
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            %run_id,
            jobs = total,
            chunks,
            create_ms = ms(started.elapsed()),
            insert_ms = ms(inserting),
            plan_wait_ms = ms(planning),
            confirm_wait_ms = ms(confirming),
            "run created"
        );
        Ok(())
    }

    /// Records what became of a chunk's publish: the watermark moves past a chunk confirmed
    /// whole while every earlier one was; otherwise its confirmed rows are marked one by one
    /// and the rest are left to the sweeper. Returns whether the prefix is still whole.
    async fn settle_chunk(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        (task, next_index): (tokio::task::JoinHandle<ChunkOutcome>, i32),
        whole: bool,
    ) -> anyhow::Result<bool> {
        let outcome = task.await.context("a chunk's publish task failed")?;
        self.metrics
            .jobs_published
            .inc_by(outcome.confirmed.len() as u64);
        if let Some((failed, first)) = &outcome.failed {
            self.metrics.publish_failures.inc_by(*failed as u64);
            tracing::warn!(%run_id, failed, %first, "some jobs were not confirmed; the sweeper will retry them");
        }
        if whole && outcome.failed.is_none() {
            runs::advance_published(conn, run_id, next_index)
                .await
                .context("recording publisher confirms")?;
            return Ok(true);
        }
        if let Err(e) = runs::mark_published(&mut *conn, run_id, &outcome.confirmed, None).await {
            tracing::warn!(%run_id, error = %e, "recording publisher confirms failed");
        }
        Ok(false)
    }

    /// Finishes creations whose coordinator died (the run still `creating` after the grace
    /// period and nobody holding its lock): plans the run again from its stored definition and
    /// request, inserts the cases that have no row, then publishes what is unpublished.
    /// Returns how many jobs it published.
    pub async fn resume_creations(&self) -> anyhow::Result<usize> {
        let run_ids = runs::runs_left_creating(&self.pool, self.publish_grace.as_secs_f64(), 50)
            .await
            .context("listing runs left creating")?;
        let mut resumed = 0;
        for run_id in run_ids {
            let mut conn = self
                .pool
                .acquire()
                .await
                .context("taking a connection to resume a creation")?;
            if !runs::try_lock_run_release(&mut conn, run_id).await? {
                continue; // its creator is alive
            }
            let outcome = self.resume_locked(&mut conn, run_id).await;
            unlock(conn, run_id).await;
            match outcome {
                Ok(published) => {
                    resumed += published;
                    tracing::info!(%run_id, published, "resumed a run's creation");
                }
                Err(e) => tracing::warn!(%run_id, error = ?e, "resuming a run's creation failed"),
            }
        }
        Ok(resumed)
    }

    async fn resume_locked(&self, conn: &mut PgConnection, run_id: Uuid) -> anyhow::Result<usize> {
        let Some(stored) = runs::run_plan_request(conn, run_id).await? else {
            return Ok(0);
        };
        let version = runs::version_for_run(conn, stored.version_id)
            .await?
            .with_context(|| format!("version {} of the run is gone", stored.version_id))?;
        let definition = read_definition(version.config)?;
        let filter: CaseFilter = serde_json::from_value::<RecordedFilter>(stored.request)
            .context("the run's stored request does not parse")?
            .into();
        let runner: Option<RunnerConfig> = stored
            .runner
            .map(serde_json::from_value)
            .transpose()
            .context("the run's stored runner does not parse")?;
        let mut planned = plan_in_background(
            Arc::new(definition),
            version.package_hash,
            filter,
            runner,
            run_id,
        );
        if settle(conn, run_id, None, &mut planned).await?.0 {
            self.release_locked(conn, run_id).await
        } else {
            Ok(0)
        }
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
        let mut conn = self.locked(run_id).await?;
        let released = self.release_locked(&mut conn, run_id).await;
        unlock(conn, run_id).await;
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
        let resumed = match self.resume_creations().await {
            Ok(published) => published,
            Err(e) => {
                tracing::warn!(error = ?e, "resuming creations failed");
                0
            }
        };
        let run_ids =
            runs::runs_with_unpublished_jobs(&self.pool, self.publish_grace.as_secs_f64(), 500)
                .await
                .context("listing runs with unpublished jobs")?;
        let mut published = resumed;
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

/// A version to plan a run of: its definition as text.
#[derive(Debug)]
pub struct PlannedVersion {
    pub version_id: Uuid,
    pub package_hash: String,
    pub definition: Arc<DefinitionText>,
}

/// A run's filter as `runs.request` records it (the API's field names): written at creation,
/// read back to plan the run again.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct RecordedFilter {
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    suite: Option<String>,
    #[serde(default)]
    test_cases: Vec<String>,
}

impl From<&CaseFilter> for RecordedFilter {
    fn from(filter: &CaseFilter) -> Self {
        RecordedFilter {
            tags: filter.tags.clone(),
            suite: filter.suite.clone(),
            test_cases: filter.case_ids.clone(),
        }
    }
}

impl From<RecordedFilter> for CaseFilter {
    fn from(recorded: RecordedFilter) -> Self {
        CaseFilter {
            tags: recorded.tags,
            case_ids: recorded.test_cases,
            suite: recorded.suite,
        }
    }
}

/// Frees the run's release lock held by `conn`; if that fails the connection is closed, which
/// is what frees a session lock for sure.
async fn unlock(mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    if let Err(e) = runs::unlock_run_release(&mut conn, run_id).await {
        tracing::warn!(%run_id, error = %e, "unlocking the run failed; closing the connection");
        drop(conn.detach());
    }
}

/// A planned run, ready to insert ([`RunLauncher::insert`]) and start ([`RunLauncher::start`]).
#[derive(Debug)]
pub struct PreparedRun {
    pub run_id: Uuid,
    version_id: Uuid,
    kind: &'static str,
    runner: Option<serde_json::Value>,
    callback_url: Option<String>,
    idempotency_key: Option<String>,
    max_in_flight: Option<i32>,
    fail_fast: bool,
    request: serde_json::Value,
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
    /// Created chunk by chunk (see [`RunLauncher::start`]).
    pub streamed: bool,
    /// How many jobs the filter selects.
    pub total: usize,
    definition: Arc<DefinitionText>,
    package_hash: String,
    filter: CaseFilter,
    runner_override: Option<RunnerConfig>,
}

impl PreparedRun {
    /// The run's jobs in chunks of [`RELEASE_PAGE`], in case order, planned from the
    /// definition's text in a blocking thread (parsing is CPU work) a chunk or two ahead of
    /// the receiver; dropping the receiver stops the planning.
    pub fn job_chunks(&self) -> JobChunks {
        plan_in_background(
            Arc::clone(&self.definition),
            self.package_hash.clone(),
            self.filter.clone(),
            self.runner_override.clone(),
            self.run_id,
        )
    }

    /// Every job of the run at once (tests).
    pub async fn plan_all(&self) -> Result<Vec<Job>, TextError> {
        let mut chunks = self.job_chunks();
        let mut jobs = Vec::with_capacity(self.total);
        while let Some(chunk) = chunks.recv().await {
            jobs.extend(chunk?);
        }
        Ok(jobs)
    }
}

/// Pages of one release (or chunks of a creation) publishing at the same time.
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

/// What became of a chunk of a streamed creation: the confirmed cases, and how many were not
/// confirmed with the first reason.
struct ChunkOutcome {
    confirmed: Vec<String>,
    failed: Option<(usize, String)>,
}

/// Publishes a chunk of a creation (its rows are committed).
async fn publish_chunk(sink: Arc<dyn JobSink>, page: Vec<EncodedJob>) -> ChunkOutcome {
    let outcomes = sink.publish(&page).await;
    let mut confirmed = Vec::with_capacity(page.len());
    let mut failures = Vec::new();
    for (job, outcome) in page.into_iter().zip(outcomes) {
        match outcome {
            Ok(()) => confirmed.push(job.test_case_id),
            Err(e) => failures.push(format!("{}: {e}", job.test_case_id)),
        }
    }
    ChunkOutcome {
        confirmed,
        failed: failures
            .first()
            .cloned()
            .map(|first| (failures.len(), first)),
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

/// A run's jobs as they are planned, a chunk at a time.
pub type JobChunks = tokio::sync::mpsc::Receiver<Result<Vec<Job>, TextError>>;

/// Plans a run's jobs from its definition in a blocking thread (parsing is CPU work), in
/// chunks of [`RELEASE_PAGE`] in case order, a chunk or two ahead of the receiver; dropping
/// the receiver stops the planning.
fn plan_in_background(
    definition: Arc<DefinitionText>,
    package_hash: String,
    filter: CaseFilter,
    runner: Option<RunnerConfig>,
    run_id: Uuid,
) -> JobChunks {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::task::spawn_blocking(move || {
        let planned = definition.plan_chunks(
            &package_hash,
            run_id,
            &filter,
            runner.as_ref(),
            RELEASE_PAGE,
            |jobs| tx.blocking_send(Ok(jobs)).is_ok(),
        );
        if let Err(e) = planned {
            // The receiver may be gone; then nobody needs the error either.
            let _ = tx.blocking_send(Err(e));
        }
    });
    rx
}

/// Settles a creation ([`runs::begin_settle`]) with the jobs still to come (`first`, then the
/// rest of `planned`), a chunk at a time, in one transaction. Returns whether the run still
/// runs and how many jobs were settled (0 when the run was settled already).
async fn settle(
    conn: &mut PgConnection,
    run_id: Uuid,
    first: Option<Vec<Job>>,
    planned: &mut JobChunks,
) -> anyhow::Result<(bool, usize)> {
    let Some(mut settling) = runs::begin_settle(conn, run_id).await? else {
        return Ok((false, 0));
    };
    let mut settled = 0;
    let mut next = first;
    loop {
        let chunk = match next.take() {
            Some(chunk) => chunk,
            None => match planned.recv().await {
                Some(chunk) => chunk.context("planning the run's jobs")?,
                None => break,
            },
        };
        settling.add(&chunk).await?;
        settled += chunk.len();
    }
    let live = settling.finish().await?;
    Ok((live, settled))
}

/// A version's stored definition, read for planning.
fn read_definition(stored: runs::StoredDefinition) -> Result<DefinitionText, TextError> {
    match stored {
        runs::StoredDefinition::Deflated(bytes) => DefinitionText::from_deflated(bytes),
        runs::StoredDefinition::Text(text) => DefinitionText::parse(text),
    }
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

#[cfg(test)]
mod tests {
    use super::{CaseFilter, RecordedFilter};
    use serde_json::json;

    #[test]
    fn a_recorded_filter_uses_the_api_names_and_plans_the_same_cases_again() {
        let filter = CaseFilter {
            tags: vec!["smoke".into()],
            case_ids: vec!["a".into(), "b".into()],
            suite: Some("nightly".into()),
        };
        let recorded = json!(RecordedFilter::from(&filter));
        assert_eq!(
            recorded,
            json!({"tags": ["smoke"], "suite": "nightly", "test_cases": ["a", "b"]})
        );
        let back: CaseFilter = serde_json::from_value::<RecordedFilter>(recorded)
            .unwrap()
            .into();
        assert_eq!(back, filter);
        // Runs recorded before a field existed read it as empty.
        let old: CaseFilter = serde_json::from_value::<RecordedFilter>(json!({}))
            .unwrap()
            .into();
        assert_eq!(old, CaseFilter::default());
    }
}
