//! Run creation and publishing: commit a run with its plan, then publish one job per planned
//! case, chunk by chunk, with publisher confirms, moving the run's published watermark past
//! each chunk once the broker confirmed it.
//!
//! No case has a row until its outcome is known, so creating a run is one row whatever its
//! size, and the upload answers before anything is published. Everything that publishes goes
//! through one pipeline, [`RunLauncher::publish_pass`]: the creation's first pass, a release
//! when `maxConcurrentTests` has room again (in flight = published − recorded), and the
//! sweeper's resumption of a pass that did not finish (a coordinator killed mid-creation, a
//! chunk the broker did not confirm). A pass starts at the watermark and holds the run's
//! session lock, so two passes never publish the same positions and a live creator is told
//! from a dead one; a pass cut off republishes at most the chunks in flight when it died,
//! and a job published twice writes nothing twice (results are keyed by run and case).
//!
//! A stopped run (cancel, failFast, budget) has its never-recorded cases written off as
//! `skipped` by [`RunLauncher::write_off`], which is what lets it complete.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use skilleval::compare::{GateConfig, GateSpec, GateSpecError};
use skilleval::executor::{CaseStatus, JobResult};
use skilleval::llm::benchmark::{Configuration, Variant};
use skilleval::llm::trigger_runner::TriggerPlan;
use skilleval::model::{EvalConfig, Given, RunnerConfig, RunnerSpec};
use skilleval::monitor::{sample_job, CriteriaSelection, Monitor, Sample, SampleJobContext};
use skilleval::plan::{CaseFilter, DefinitionText, Job, PlanError, TextError};
use skilleval_infra::messages::EncodedJob;
use skilleval_infra::store::lifecycle::{
    Planning, RunKind, Transition, TransitionError, WrittenOff,
};
use skilleval_infra::store::runs::OwnDefinition;
use skilleval_infra::store::{Store, StoreError};
use skilleval_infra::topology::Lane;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::db::{NewRun, RunInsert};
use crate::jobs::{JobSink, PublishError};
use crate::metrics::Metrics;
use skilleval_infra::store::versions::StoredDefinition;

/// Jobs planned, published and confirmed at a time; the watermark moves once per chunk.
pub const PUBLISH_CHUNK: usize = 2_000;

/// Chunks of one pass publishing at the same time (the broker always has confirms
/// outstanding instead of draining them at the end of every chunk).
const CHUNKS_IN_FLIGHT: usize = 3;

/// Plans kept in memory (runs being created or released under a cap); past it the cache
/// starts over (a plan is read again from the database when needed).
const PLANS_KEPT: usize = 64;

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub version_id: Uuid,
    pub runner: Option<RunnerSpec>,
    pub filter: CaseFilter,
    pub callback_url: Option<String>,
    pub idempotency_key: Option<String>,
    pub kind: RunKind,
    /// Budget: the run stops once its cases spent more than this (`None`: no cap). Validated
    /// by the route (`> 0`, `>= 1`); the database's CHECKs hold the same rules.
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
    /// The regression gate asked for (`None`: the definition's `settings.gate`, if any).
    pub gate: Option<GateSpec>,
    /// A rescore's source run: its stored outputs are graded again (kind `rescore` only).
    pub rescore_of: Option<Uuid>,
    /// Each case also run without the skill (the runner leaves it out), to report the uplift.
    pub baseline: bool,
    /// Attempts per case (1: no repeats), to report pass@k and pass^k.
    pub repeats: u32,
    /// The package's trigger eval queries to run, one job each after the cases.
    pub triggers: Option<TriggerPlan>,
    /// A definition of the run's own instead of the version's (a rescore's inline
    /// `eval_config`, validated like an upload's); the run keeps it.
    pub definition: Option<Arc<DefinitionText>>,
    /// The stored token that asked for the run, recorded with it in the same insert: the
    /// per-token `concurrent_runs` quota counts its unfinished runs.
    pub token_id: Option<Uuid>,
}

impl RunRequest {
    /// A request for every case of a version, nothing else set.
    pub fn all_cases(version_id: Uuid, kind: RunKind) -> Self {
        RunRequest {
            version_id,
            runner: None,
            filter: CaseFilter::default(),
            callback_url: None,
            idempotency_key: None,
            kind,
            max_cost_usd: None,
            max_tokens: None,
            gate: None,
            rescore_of: None,
            baseline: false,
            repeats: 1,
            triggers: None,
            definition: None,
            token_id: None,
        }
    }

    /// The variants each planned case runs as ([`Variant::all`]).
    pub fn variants(&self) -> Vec<Variant> {
        Variant::all(self.repeats, self.baseline)
    }
}

/// Why a run could not be created or published; the routes map it to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("version {0} not found")]
    VersionNotFound(Uuid),
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    /// The request's filter does not fit the definition.
    #[error(transparent)]
    Filter(#[from] PlanError),
    /// A samples run is created by ingest only (`POST /v1/skills/{name}/samples`).
    #[error(
        "runs of kind `samples` are created by ingesting samples, not planned from a definition"
    )]
    IngestOnly,
    #[error("reading the stored eval definition: {0}")]
    Definition(#[from] TextError),
    #[error("run {run_id}: {what}")]
    Corrupt { run_id: Uuid, what: String },
    #[error("{context}: {source}")]
    Database {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A rescore names no source run.
    #[error("a rescore run needs the run whose outputs it grades")]
    RescoreWithoutSource,
    /// None of the source run's recorded outputs belongs to a case of the definition.
    #[error("run {source_run} recorded no output for any test case of the definition")]
    NothingToRescore { source_run: Uuid },
    /// The gate's thresholds are out of range; `in_definition`: the definition's
    /// `settings.gate`, not the request's.
    #[error("the regression gate: {error}")]
    Gate {
        error: GateSpecError,
        in_definition: bool,
    },
}

fn db(context: &'static str) -> impl FnOnce(sqlx::Error) -> LaunchError {
    move |source| LaunchError::Database { context, source }
}

/// Creates runs and publishes their jobs.
#[derive(Debug, Clone)]
pub struct RunLauncher {
    store: Store,
    sink: Arc<dyn JobSink>,
    metrics: Arc<Metrics>,
    publish_grace: Duration,
    plans: Arc<Mutex<HashMap<Uuid, Arc<RunPlan>>>>,
}

impl RunLauncher {
    pub fn new(
        store: Store,
        sink: Arc<dyn JobSink>,
        metrics: Arc<Metrics>,
        publish_grace: Duration,
    ) -> Self {
        RunLauncher {
            store,
            sink,
            metrics,
            publish_grace,
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
        let planning = request.kind.planning();
        let givens = match (planning, request.rescore_of) {
            (Planning::StoredOutputs, Some(source)) => Some(self.stored_outputs(source).await?),
            (Planning::StoredOutputs, None) => return Err(LaunchError::RescoreWithoutSource),
            (Planning::StoredDefinition, _) => None,
            (Planning::Samples, _) => return Err(LaunchError::IngestOnly),
        };
        let version = self
            .store
            .version_for_run(conn, request.version_id)
            .await?
            .ok_or(LaunchError::VersionNotFound(request.version_id))?;
        // Reading the definition (and counting a filter's jobs) parses all of it: CPU work,
        // kept off the async threads.
        let mut filter = request.filter.clone();
        let outputs = givens.clone();
        let own = request.definition.clone();
        let (definition, filter, total) = tokio::task::spawn_blocking(move || {
            let definition = match own {
                Some(own) => own,
                None => Arc::new(read_definition(version.config)?),
            };
            if let Some(outputs) = &outputs {
                // A rescore grades the definition's cases the source run has an output for.
                filter.case_ids = case_ids(&definition)?
                    .into_iter()
                    .filter(|id| outputs.contains_key(id))
                    .collect();
            }
            let total = definition.count(&filter)?;
            Ok::<_, TextError>((definition, filter, total))
        })
        .await??;
        if let (Some(source_run), true) = (request.rescore_of, filter.case_ids.is_empty()) {
            if givens.is_some() {
                return Err(LaunchError::NothingToRescore { source_run });
            }
        }
        let planned = PlannedVersion {
            version_id: version.version_id,
            package_hash: version.package_hash,
            definition,
        };
        let mut request = request.clone();
        request.filter = filter;
        let mut prepared = self.prepare_counted(planned, &request, total?)?;
        if let Some(givens) = givens {
            let plan = Arc::get_mut(&mut prepared.plan).ok_or_else(|| LaunchError::Corrupt {
                run_id: prepared.run_id,
                what: "its plan is shared before it is made".into(),
            })?;
            if let PlanSource::Definition {
                runner, rescore, ..
            } = &mut plan.source
            {
                *runner = Some(RunnerConfig {
                    kind: "given".into(),
                    ..RunnerConfig::default()
                });
                *rescore = Some((request.rescore_of.unwrap_or_default(), givens));
            }
            // A rescore grades outputs again; it is no new version to gate.
            prepared.gate = None;
        }
        Ok(prepared)
    }

    /// The outputs a completed run recorded, by test case id (what a rescore grades again).
    async fn stored_outputs(&self, source: Uuid) -> Result<Givens, LaunchError> {
        let results = crate::results::load_results(&self.store, source)
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

    /// Plans a run: checks the request's filter against the definition and counts its jobs
    /// (a filter other than "everything" reads every case's id and tags: for a stored
    /// definition use [`RunLauncher::prepare_stored`], which does that off the async threads).
    pub fn prepare(
        &self,
        version: PlannedVersion,
        request: &RunRequest,
    ) -> Result<PreparedRun, LaunchError> {
        match request.kind.planning() {
            Planning::StoredDefinition => {}
            Planning::StoredOutputs => return Err(LaunchError::RescoreWithoutSource),
            Planning::Samples => return Err(LaunchError::IngestOnly),
        }
        let total = version.definition.count(&request.filter)??;
        self.prepare_counted(version, request, total)
    }

    fn prepare_counted(
        &self,
        version: PlannedVersion,
        request: &RunRequest,
        total: usize,
    ) -> Result<PreparedRun, LaunchError> {
        let header = version.definition.header();
        let runner = request
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
        let gate = match (request.gate, header.settings.gate) {
            (Some(spec), _) => spec.config().map_err(|error| LaunchError::Gate {
                error,
                in_definition: false,
            })?,
            (None, Some(spec)) => spec.config().map_err(|error| LaunchError::Gate {
                error,
                in_definition: true,
            })?,
            (None, None) => None,
        };
        let run_id = Uuid::now_v7();
        let variants = request.variants();
        Ok(PreparedRun {
            gate,
            own_definition: request.definition.clone(),
            token_id: request.token_id,
            run_id,
            version_id: version.version_id,
            kind: request.kind,
            callback_url: request.callback_url.clone(),
            idempotency_key: request.idempotency_key.clone(),
            max_in_flight,
            fail_fast: header.settings.fail_fast,
            max_cost_usd: request.max_cost_usd,
            max_tokens: request.max_tokens,
            total: total
                .saturating_mul(variants.len())
                .saturating_add(request.triggers.as_ref().map_or(0, |t| t.queries.len())),
            plan: Arc::new(RunPlan {
                run_id,
                package_hash: version.package_hash,
                source: PlanSource::Definition {
                    definition: version.definition,
                    filter: request.filter.clone(),
                    runner,
                    rescore: None,
                    variants: Variants {
                        each: variants,
                        cases: total,
                    },
                    triggers: request.triggers.clone(),
                },
                traceparent: skilleval_infra::telemetry::current_traceparent(),
            }),
        })
    }

    /// Plans the samples run of one ingest batch: `total` sampled items, whose `samples` rows
    /// the caller inserts in the same transaction as the run ([`RunLauncher::insert`]), with
    /// positions `0..total`.
    pub fn prepare_samples(&self, samples: SamplesRun) -> PreparedRun {
        let run_id = Uuid::now_v7();
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
            plan: Arc::new(RunPlan {
                run_id,
                package_hash: samples.package_hash.clone(),
                source: PlanSource::Samples(SamplesPlan {
                    store: self.store.clone(),
                    monitor: samples.monitor,
                    request: SamplesRequest {
                        skill_id: samples.skill_id,
                        monitor_revision: samples.monitor_revision,
                        selection: samples.selection,
                        package_hash: samples.package_hash,
                    },
                }),
                traceparent: skilleval_infra::telemetry::current_traceparent(),
            }),
        }
    }

    /// Inserts a prepared run (one row: the run and its plan, `creating`) in the caller's
    /// transaction. Nothing is published yet: call [`RunLauncher::start`] after the commit.
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
            traceparent: prepared.plan.traceparent.clone(),
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

    /// After the commit of [`RunLauncher::insert`]: the creation's publishing pass, in a task
    /// of its own (the caller answers at once; a caller that goes away does not cut the pass
    /// off halfway). A failure is logged: the run is committed and the sweeper resumes it.
    /// Returns the task (`None`: the run existed already), for callers that wait for it.
    pub fn start(
        &self,
        prepared: PreparedRun,
        inserted: RunInsert,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let RunInsert::Created(run_id) = inserted else {
            return None;
        };
        self.metrics.runs_created.inc();
        self.remember(Arc::clone(&prepared.plan));
        let launcher = self.clone();
        // In the creating request's span: the jobs' send spans belong to its trace.
        Some(tokio::spawn(skilleval_infra::telemetry::in_current_trace(
            async move {
                if let Err(e) = launcher.create_pass(&prepared.plan).await {
                    launcher.metrics.publish_failures.inc();
                    tracing::warn!(%run_id, error = %e, "publishing the run's jobs failed; the sweeper will resume");
                }
            },
        )))
    }

    /// Creates a run of a stored version and starts publishing it.
    pub async fn create(&self, request: &RunRequest) -> Result<RunInsert, LaunchError> {
        let mut tx = self
            .store
            .pool()
            .begin()
            .await
            .map_err(db("starting the run's transaction"))?;
        let prepared = self.prepare_stored(&mut tx, request).await?;
        let inserted = self.insert(&mut tx, &prepared).await?;
        tx.commit().await.map_err(db("committing the run"))?;
        drop(self.start(prepared, inserted));
        Ok(inserted)
    }

    /// The creator's pass: publish what the cap allows, then end the creation.
    async fn create_pass(&self, plan: &RunPlan) -> Result<usize, LaunchError> {
        let mut conn = self.locked(plan.run_id).await?;
        let published = self.publish_pass(&mut conn, plan, Pass::Creation).await;
        unlock(&self.store, conn, plan.run_id).await;
        let published = published?;
        self.end_creation(plan.run_id).await;
        Ok(published)
    }

    /// `creating` -> `running`; a run stopped or finalised meanwhile stays as it is.
    async fn end_creation(&self, run_id: Uuid) {
        match self.store.end_creation(run_id).await {
            Ok(()) | Err(TransitionError::Illegal { .. } | TransitionError::NotFound(_)) => {}
            Err(e) => tracing::warn!(%run_id, error = %e, "ending the run's creation failed"),
        }
    }

    /// A connection holding the run's publishing lock (waiting for it); give it back with
    /// [`unlock`].
    async fn locked(&self, run_id: Uuid) -> Result<PoolConnection<Postgres>, LaunchError> {
        let mut conn = self
            .store
            .pool()
            .acquire()
            .await
            .map_err(db("taking a connection to lock the run"))?;
        self.store.lock_publishing(&mut conn, run_id).await?;
        Ok(conn)
    }

    /// The one publishing pipeline. From the run's watermark, publishes as many planned
    /// positions as the run allows now (all the rest, or what `maxConcurrentTests` leaves),
    /// chunk by chunk: each chunk is planned from the definition (in a blocking thread, a
    /// chunk or two ahead), published with pipelined confirms while the next is prepared, and
    /// once confirmed whole (and every earlier one was) the watermark moves past it. A chunk
    /// not confirmed whole ends the pass (the sweeper resumes from the watermark). A run
    /// stopped meanwhile ends it too. Call holding the run's lock. Returns how many jobs the
    /// broker confirmed.
    #[tracing::instrument(skip_all, fields(run_id = %plan.run_id, ?pass, from, room))]
    async fn publish_pass(
        &self,
        conn: &mut PgConnection,
        plan: &RunPlan,
        pass: Pass,
    ) -> Result<usize, LaunchError> {
        let run_id = plan.run_id;
        let Some(window) = self.store.publish_window(conn, run_id).await? else {
            return Ok(0);
        };
        let room = window.room();
        let from = usize::try_from(window.published).unwrap_or(0);
        tracing::Span::current().record("from", from);
        tracing::Span::current().record("room", room);
        if room == 0 {
            return Ok(0);
        }
        let mut planned = plan.chunks(from, room);
        let mut in_flight: VecDeque<(tokio::task::JoinHandle<Confirms>, i32)> = VecDeque::new();
        let mut position = from;
        let mut whole = true;
        let mut confirmed = 0;
        let mut first = true;
        while let Some(chunk) = planned.recv().await {
            let chunk = chunk?;
            // A run stopped while it is published gets nothing more (a stop's write-off
            // records its remaining cases); checked once per chunk.
            if !first && self.store.publish_window(conn, run_id).await?.is_none() {
                tracing::info!(%run_id, "the run stopped while it was published");
                break;
            }
            first = false;
            position += chunk.len();
            let end = i32::try_from(position).unwrap_or(i32::MAX);
            let jobs = self.encode(run_id, &chunk, pass).await?;
            drop(chunk);
            let lane = plan.lane();
            while in_flight.len() >= CHUNKS_IN_FLIGHT {
                if let Some(oldest) = in_flight.pop_front() {
                    confirmed += self.confirm(conn, run_id, oldest, &mut whole).await?;
                }
            }
            if !whole {
                break;
            }
            let sink = self.sink.clone();
            let span = tracing::info_span!("publish_chunk", jobs = jobs.len(), through = end);
            in_flight.push_back((
                tokio::spawn(skilleval_infra::telemetry::in_current_trace(
                    async move { Confirms::of(&sink, jobs, lane).await }.instrument(span),
                )),
                end,
            ));
        }
        while let Some(oldest) = in_flight.pop_front() {
            confirmed += self.confirm(conn, run_id, oldest, &mut whole).await?;
        }
        Ok(confirmed)
    }

    /// A chunk's jobs as the messages to publish; a resuming pass leaves out the cases
    /// already recorded (a duplicate would be harmless, only wasted work).
    async fn encode(
        &self,
        run_id: Uuid,
        chunk: &[Job],
        pass: Pass,
    ) -> Result<Vec<EncodedJob>, LaunchError> {
        let recorded: HashSet<(String, Variant)> = if pass == Pass::Resume {
            self.store
                .recorded_among(run_id, &variant_keys(chunk))
                .await?
                .into_iter()
                .collect()
        } else {
            HashSet::new()
        };
        chunk
            .iter()
            .filter(|job| !recorded.contains(&(job.case.id.clone(), Variant::of(&job.runner))))
            .map(|job| {
                let text = serde_json::to_string(job).map_err(|e| LaunchError::Corrupt {
                    run_id,
                    what: format!("job `{}` does not serialise: {e}", job.case.id),
                })?;
                Ok(EncodedJob::from_stored(
                    run_id,
                    job.case.id.clone(),
                    job.attempt,
                    &text,
                ))
            })
            .collect()
    }

    /// Waits for a chunk's confirms; moves the watermark past it when it was confirmed whole
    /// and every earlier chunk was (`whole`). Returns how many jobs were confirmed.
    async fn confirm(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        (task, through): (tokio::task::JoinHandle<Confirms>, i32),
        whole: &mut bool,
    ) -> Result<usize, LaunchError> {
        let confirms = task.await?;
        self.metrics
            .jobs_published
            .inc_by(confirms.confirmed as u64);
        if let Some((failed, first)) = &confirms.failed {
            self.metrics.publish_failures.inc_by(*failed as u64);
            tracing::warn!(%run_id, failed, error = %first, "some jobs were not confirmed; the sweeper will publish them again");
            *whole = false;
        }
        if *whole {
            self.store.advance_published(conn, run_id, through).await?;
        }
        Ok(confirms.confirmed)
    }

    /// Publishes what `maxConcurrentTests` leaves room for now (the aggregator calls it as
    /// cases finish). Returns how many jobs were confirmed.
    pub async fn release(&self, run_id: Uuid) -> Result<usize, LaunchError> {
        let plan = self.plan_of(run_id).await?;
        let span = plan.pass_span(Pass::Release);
        async {
            let mut conn = self.locked(run_id).await?;
            let published = self.publish_pass(&mut conn, &plan, Pass::Release).await;
            unlock(&self.store, conn, run_id).await;
            published
        }
        .instrument(span)
        .await
    }

    /// [`RunLauncher::release`], logging a failure instead of returning it: the sweeper
    /// publishes later whatever went wrong now.
    pub async fn release_logged(&self, run_id: Uuid) {
        if let Err(e) = self.release(run_id).await {
            self.metrics.publish_failures.inc();
            tracing::warn!(%run_id, error = %e, "publishing the run's jobs failed; the sweeper will retry");
        }
    }

    /// The sweeper: resumes the publishing of live runs whose watermark is short of their
    /// plan after the grace period and whose publisher is gone (nobody holds the run's lock:
    /// a creator killed mid-creation, a chunk the broker did not confirm, or a cap with room),
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
            .map_err(db("taking a connection to resume a run"))?;
        if !self.store.try_lock_publishing(&mut conn, run_id).await? {
            return Ok(0);
        }
        let published = match self.plan_of(run_id).await {
            Ok(plan) => {
                let span = plan.pass_span(Pass::Resume);
                self.publish_pass(&mut conn, &plan, Pass::Resume)
                    .instrument(span)
                    .await
            }
            Err(e) => Err(e),
        };
        unlock(&self.store, conn, run_id).await;
        let published = published?;
        self.end_creation(run_id).await;
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
        let plan = self.plan_of(run_id).await?;
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
        self.forget(run_id);
        Ok(written)
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
                if found.len() >= limit && !plan.has_variants() {
                    return Ok(found);
                }
            }
        }
        found.sort_by_key(|r| (r.case_index, r.variant));
        found.truncate(limit);
        Ok(found)
    }

    /// The run's plan: kept in memory while it is published, else read again from the run's
    /// stored request and its version's definition.
    pub async fn plan_of(&self, run_id: Uuid) -> Result<Arc<RunPlan>, LaunchError> {
        if let Some(plan) = self.plans.lock().ok().and_then(|p| p.get(&run_id).cloned()) {
            return Ok(plan);
        }
        let mut conn = self
            .store
            .pool()
            .acquire()
            .await
            .map_err(db("taking a connection to read a plan"))?;
        let stored = self
            .store
            .run_plan_request(run_id)
            .await?
            .ok_or(LaunchError::RunNotFound(run_id))?;
        if stored.kind.planning() == Planning::Samples {
            let request: SamplesRequest =
                serde_json::from_value(stored.request).map_err(|e| LaunchError::Corrupt {
                    run_id,
                    what: format!("its stored samples request does not parse: {e}"),
                })?;
            let plan = Arc::new(
                self.samples_plan(run_id, request, stored.traceparent)
                    .await?,
            );
            self.remember(Arc::clone(&plan));
            return Ok(plan);
        }
        let version = self
            .store
            .version_for_run(&mut conn, stored.version_id)
            .await?
            .ok_or(LaunchError::VersionNotFound(stored.version_id))?;
        drop(conn);
        let recorded = serde_json::from_value::<RecordedFilter>(stored.request).map_err(|e| {
            LaunchError::Corrupt {
                run_id,
                what: format!("its stored request does not parse: {e}"),
            }
        })?;
        let rescore = match recorded.rescore_of {
            Some(source) => Some((source, self.stored_outputs(source).await?)),
            None => None,
        };
        let each = Variant::all(recorded.repeats, recorded.baseline);
        let triggers = recorded.triggers.clone();
        let variants = match recorded.cases {
            Some(cases) => Variants { each, cases },
            None if each.len() == 1 && triggers.is_none() => Variants::primary(usize::MAX),
            None => {
                return Err(LaunchError::Corrupt {
                    run_id,
                    what: "its stored request has variants but no case count".into(),
                })
            }
        };
        let filter: CaseFilter = recorded.into();
        let runner: Option<RunnerConfig> = stored
            .runner
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| LaunchError::Corrupt {
                run_id,
                what: format!("its stored runner does not parse: {e}"),
            })?;
        // A run with a definition of its own (a rescore's inline eval_config) plans from it.
        let config = match stored.definition {
            Some(deflated) => StoredDefinition::Deflated(deflated),
            None => version.config,
        };
        let definition = tokio::task::spawn_blocking(move || read_definition(config)).await??;
        let plan = Arc::new(RunPlan {
            run_id,
            package_hash: version.package_hash,
            source: PlanSource::Definition {
                definition: Arc::new(definition),
                filter,
                runner,
                rescore,
                variants,
                triggers,
            },
            traceparent: stored.traceparent,
        });
        self.remember(Arc::clone(&plan));
        Ok(plan)
    }

    /// A samples run's plan again: the monitor revision its batch was taken with.
    async fn samples_plan(
        &self,
        run_id: Uuid,
        request: SamplesRequest,
        traceparent: Option<String>,
    ) -> Result<RunPlan, LaunchError> {
        let (_, monitor) = self
            .store
            .monitor_revision_of_skill(
                request.skill_id,
                i32::try_from(request.monitor_revision).unwrap_or(i32::MAX),
            )
            .await?
            .ok_or_else(|| LaunchError::Corrupt {
                run_id,
                what: format!("monitor revision {} is gone", request.monitor_revision),
            })?;
        let monitor: Monitor =
            serde_json::from_value(monitor).map_err(|e| LaunchError::Corrupt {
                run_id,
                what: format!("its monitor revision does not parse: {e}"),
            })?;
        Ok(RunPlan {
            run_id,
            package_hash: request.package_hash.clone(),
            source: PlanSource::Samples(SamplesPlan {
                store: self.store.clone(),
                monitor: Arc::new(monitor),
                request,
            }),
            traceparent,
        })
    }

    fn remember(&self, plan: Arc<RunPlan>) {
        if let Ok(mut plans) = self.plans.lock() {
            if plans.len() >= PLANS_KEPT {
                plans.clear();
            }
            plans.insert(plan.run_id, plan);
        }
    }

    /// Drops a run's plan from memory (its publishing is over).
    pub fn forget(&self, run_id: Uuid) {
        if let Ok(mut plans) = self.plans.lock() {
            plans.remove(&run_id);
        }
    }
}

/// Which kind of publishing pass runs the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// The creator's first pass.
    Creation,
    /// More room under `maxConcurrentTests`.
    Release,
    /// The sweeper resuming a pass that did not finish.
    Resume,
}

/// What became of a chunk's publish: how many jobs the broker confirmed, and how many it did
/// not with the first reason.
struct Confirms {
    confirmed: usize,
    failed: Option<(usize, PublishError)>,
}

impl Confirms {
    async fn of(sink: &Arc<dyn JobSink>, jobs: Vec<EncodedJob>, lane: Lane) -> Confirms {
        let outcomes = sink.publish(&jobs, lane).await;
        let mut confirmed = 0;
        let mut failed: Option<(usize, PublishError)> = None;
        for outcome in outcomes {
            match outcome {
                Ok(()) => confirmed += 1,
                Err(e) => match &mut failed {
                    Some((n, _)) => *n += 1,
                    None => failed = Some((1, e)),
                },
            }
        }
        // A sink that answered for fewer jobs than it was given confirmed none of the rest.
        let unanswered = jobs
            .len()
            .saturating_sub(confirmed + failed.as_ref().map_or(0, |f| f.0));
        if unanswered > 0 {
            match &mut failed {
                Some((n, _)) => *n += unanswered,
                None => failed = Some((unanswered, PublishError::Unanswered)),
            }
        }
        Confirms { confirmed, failed }
    }
}

/// A version to plan a run of: its definition as text.
#[derive(Debug)]
pub struct PlannedVersion {
    pub version_id: Uuid,
    pub package_hash: String,
    pub definition: Arc<DefinitionText>,
}

/// A run's plan: what its jobs are planned from, the same every time (so a position in the
/// plan names the same case every time).
#[derive(Debug)]
pub struct RunPlan {
    run_id: Uuid,
    package_hash: String,
    source: PlanSource,
    /// The W3C trace context of the request that created the run: later passes (releases,
    /// the sweeper) publish in its trace.
    traceparent: Option<String>,
}

/// Where a run's jobs come from, by [`Planning`].
#[derive(Debug)]
enum PlanSource {
    /// The definition, the filter and the runner override.
    Definition {
        definition: Arc<DefinitionText>,
        filter: CaseFilter,
        runner: Option<RunnerConfig>,
        /// A rescore's source run and its recorded outputs, carried by each job.
        rescore: Option<(Uuid, Givens)>,
        /// What each selected case runs as (baseline, repeats).
        variants: Variants,
        /// Trigger eval queries, planned after every case's variants.
        triggers: Option<TriggerPlan>,
    },
    /// The run's `samples` rows and the monitor revision they were taken with.
    Samples(SamplesPlan),
}

/// The variants of a plan: every selected case runs once per variant, variant after variant
/// ([`Variant::all`]'s order), so plan position `p` is case `p % cases` as variant
/// `p / cases`.
#[derive(Debug, Clone)]
struct Variants {
    each: Vec<Variant>,
    /// Cases the filter selects (positions per variant).
    cases: usize,
}

impl Variants {
    /// Only the primary variant (no baseline, no repeats): one job per case.
    fn primary(cases: usize) -> Self {
        Variants {
            each: vec![Variant::PRIMARY],
            cases,
        }
    }

    fn is_primary_only(&self) -> bool {
        self.each.iter().all(Variant::is_primary)
    }

    /// The baseline and repeats these variants are: (baseline, attempts per case).
    fn asked(&self) -> (bool, u32) {
        let baseline = self
            .each
            .iter()
            .any(|v| v.configuration == Configuration::WithoutSkill);
        let repeats = self.each.iter().map(|v| v.run_number).max().unwrap_or(1);
        (baseline, repeats)
    }
}

/// What a samples run's jobs are built from.
#[derive(Debug)]
struct SamplesPlan {
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

/// The samples run of one ingest batch, for [`RunLauncher::prepare_samples`].
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

/// Recorded outputs by test case id.
type Givens = Arc<HashMap<String, Given>>;

impl RunPlan {
    /// A span for a pass that runs outside the creating request, in the run's trace.
    fn pass_span(&self, pass: Pass) -> tracing::Span {
        let span = tracing::info_span!(
            "publish run",
            skilleval.run_id = %self.run_id,
            skilleval.pass = ?pass,
        );
        skilleval_infra::telemetry::set_parent(&span, self.traceparent.as_deref());
        span
    }

    /// Whether its cases run as more than one variant (a baseline, repeats) or it has
    /// trigger eval queries: its plan order is not the results' order.
    fn has_variants(&self) -> bool {
        match &self.source {
            PlanSource::Definition {
                variants, triggers, ..
            } => !variants.is_primary_only() || triggers.is_some(),
            PlanSource::Samples(_) => false,
        }
    }

    /// The trigger evals it runs.
    pub fn triggers(&self) -> Option<&TriggerPlan> {
        match &self.source {
            PlanSource::Definition { triggers, .. } => triggers.as_ref(),
            PlanSource::Samples(_) => None,
        }
    }

    /// The lane its jobs are published on: samples go to the lower-priority one.
    pub fn lane(&self) -> Lane {
        match self.source {
            PlanSource::Definition { .. } => Lane::Ci,
            PlanSource::Samples(_) => Lane::Samples,
        }
    }

    fn runner(&self) -> Option<&RunnerConfig> {
        match &self.source {
            PlanSource::Definition { runner, .. } => runner.as_ref(),
            PlanSource::Samples(_) => None,
        }
    }

    /// What `runs.request` records to plan the run again.
    fn recorded_request(&self) -> serde_json::Value {
        match &self.source {
            PlanSource::Definition {
                filter,
                rescore,
                variants,
                triggers,
                ..
            } => {
                let (baseline, repeats) = variants.asked();
                json!(RecordedFilter {
                    rescore_of: rescore.as_ref().map(|(source, _)| *source),
                    baseline,
                    repeats,
                    cases: (!variants.is_primary_only() || triggers.is_some())
                        .then_some(variants.cases),
                    triggers: triggers.clone(),
                    ..RecordedFilter::from(filter)
                })
            }
            PlanSource::Samples(samples) => json!(samples.request),
        }
    }

    /// The plan's jobs from position `from`, at most `limit` of them, in chunks of at most
    /// [`PUBLISH_CHUNK`] in case order, planned a chunk or two ahead of the receiver (from a
    /// definition in a blocking thread, parsing is CPU work; from samples rows a page at a
    /// time); dropping the receiver stops the planning.
    pub fn chunks(&self, from: usize, limit: usize) -> JobChunks {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let (definition, filter, runner, givens, variants, triggers) = match &self.source {
            PlanSource::Definition {
                definition,
                filter,
                runner,
                rescore,
                variants,
                triggers,
            } => (
                Arc::clone(definition),
                filter.clone(),
                runner.clone(),
                rescore.as_ref().map(|(_, g)| Arc::clone(g)),
                variants.clone(),
                triggers.clone(),
            ),
            PlanSource::Samples(samples) => {
                tokio::spawn(samples_chunks(
                    self.run_id,
                    samples.store.clone(),
                    Arc::clone(&samples.monitor),
                    samples.request.clone(),
                    from,
                    limit,
                    tx,
                ));
                return rx;
            }
        };
        let package_hash = self.package_hash.clone();
        let run_id = self.run_id;
        tokio::task::spawn_blocking(move || {
            let mut position = 0usize;
            let mut left = limit;
            // One pass over the definition per variant; positions of variants wholly before
            // `from` are skipped without reading the definition.
            for variant in &variants.each {
                if left == 0 {
                    return;
                }
                if position.saturating_add(variants.cases) <= from {
                    position = position.saturating_add(variants.cases);
                    continue;
                }
                let mut going = true;
                let planned = definition.plan_chunks(
                    &package_hash,
                    run_id,
                    &filter,
                    runner.as_ref(),
                    PUBLISH_CHUNK,
                    |mut jobs| {
                        let start = position;
                        position += jobs.len();
                        if position <= from {
                            return true;
                        }
                        if start < from {
                            jobs.drain(..from - start);
                        }
                        jobs.truncate(left);
                        left -= jobs.len();
                        for job in &mut jobs {
                            if let Some(givens) = &givens {
                                job.given = givens.get(&job.case.id).cloned();
                            }
                            if !variant.is_primary() {
                                variant.apply(job);
                            }
                        }
                        going = tx.blocking_send(Ok(jobs)).is_ok() && left > 0;
                        going
                    },
                );
                if let Err(e) = planned {
                    // The receiver may be gone; then nobody needs the error either.
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
                if !going {
                    return;
                }
            }
            // The trigger eval queries, after every case's variants.
            if let Some(triggers) = triggers {
                let jobs = triggers.jobs(
                    run_id,
                    &package_hash,
                    definition.header().profile,
                    from.saturating_sub(position),
                    left,
                );
                if !jobs.is_empty() {
                    let _ = tx.blocking_send(Ok(jobs));
                }
            }
        });
        rx
    }

    /// Every job of the plan at once (tests).
    pub async fn all(&self) -> Result<Vec<Job>, LaunchError> {
        let mut chunks = self.chunks(0, usize::MAX);
        let mut jobs = Vec::new();
        while let Some(chunk) = chunks.recv().await {
            jobs.extend(chunk?);
        }
        Ok(jobs)
    }
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
    /// A rescore's source run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rescore_of: Option<Uuid>,
    /// Each case also run without the skill.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    baseline: bool,
    /// Attempts per case.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    repeats: u32,
    /// Cases the filter selected at creation (the plan's positions per variant), recorded
    /// with a baseline, repeats or trigger evals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cases: Option<usize>,
    /// The trigger eval queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    triggers: Option<TriggerPlan>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl From<&CaseFilter> for RecordedFilter {
    fn from(filter: &CaseFilter) -> Self {
        RecordedFilter {
            tags: filter.tags.clone(),
            suite: filter.suite.clone(),
            test_cases: filter.case_ids.clone(),
            rescore_of: None,
            baseline: false,
            repeats: 1,
            cases: None,
            triggers: None,
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

/// Frees the run's lock held by `conn`; if that fails the connection is closed, which is what
/// frees a session lock for sure.
async fn unlock(store: &Store, mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    if let Err(e) = store.unlock_publishing(&mut conn, run_id).await {
        tracing::warn!(%run_id, error = %e, "unlocking the run failed; closing the connection");
        drop(conn.detach());
    }
}

/// A planned run, ready to insert ([`RunLauncher::insert`]) and start ([`RunLauncher::start`]).
#[derive(Debug)]
pub struct PreparedRun {
    pub run_id: Uuid,
    version_id: Uuid,
    kind: RunKind,
    callback_url: Option<String>,
    idempotency_key: Option<String>,
    max_in_flight: Option<i32>,
    fail_fast: bool,
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
    gate: Option<GateConfig>,
    /// The run's own definition (kept with the run), when it is not its version's.
    own_definition: Option<Arc<DefinitionText>>,
    /// The stored token that asked for the run.
    token_id: Option<Uuid>,
    /// How many jobs the filter selects.
    pub total: usize,
    /// What its jobs are planned from.
    pub plan: Arc<RunPlan>,
}

/// A run's jobs as they are planned, a chunk at a time.
pub type JobChunks = tokio::sync::mpsc::Receiver<Result<Vec<Job>, LaunchError>>;

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

/// A version's stored definition, read for planning.
pub(crate) fn read_definition(stored: StoredDefinition) -> Result<DefinitionText, TextError> {
    match stored {
        StoredDefinition::Deflated(bytes) => DefinitionText::from_deflated(bytes),
        StoredDefinition::Text(text) => DefinitionText::parse(text),
    }
}

/// Every case id of a definition, in definition order.
fn case_ids(definition: &DefinitionText) -> Result<Vec<String>, TextError> {
    let mut ids = Vec::with_capacity(definition.cases());
    definition.plan_chunks(
        "",
        Uuid::nil(),
        &CaseFilter::default(),
        None,
        PUBLISH_CHUNK,
        |jobs| {
            ids.extend(jobs.into_iter().map(|j| j.case.id));
            true
        },
    )?;
    Ok(ids)
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

/// Each job's (case, variant): what its result row is keyed by.
fn variant_keys(jobs: &[Job]) -> Vec<(&str, Variant)> {
    jobs.iter()
        .map(|j| (j.case.id.as_str(), Variant::of(&j.runner)))
        .collect()
}

/// A planned case not recorded yet, as the results endpoint lists it.
fn pending(job: &Job) -> JobResult {
    let mut r = JobResult::skipped(job, "");
    r.status = CaseStatus::Queued;
    r.details = serde_json::Value::Null;
    r
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
