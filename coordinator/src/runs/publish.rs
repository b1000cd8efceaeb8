//! [`RunPublisher`]: the one publishing pipeline. A pass publishes a run's jobs from its plan,
//! chunk by chunk, with publisher confirms, and moves the run's published watermark past
//! each chunk once the broker confirmed it.
//!
//! Everything that publishes goes through [`RunPublisher::publish_pass`]: the creation's
//! first pass ([`RunPublisher::start`]), a release when `maxConcurrentTests` has room again
//! (in flight = published − recorded, [`RunPublisher::release`]), and the sweeper's resumption
//! of a pass that did not finish (a coordinator killed mid-creation, a chunk the broker did not
//! confirm: `crate::runs::sweep`). A pass starts at the watermark and holds the run's session
//! lock, so two passes never publish the same positions and a live creator is told from a dead
//! one; a pass cut off republishes at most the chunks in flight when it died, and a job
//! published twice writes nothing twice (results are keyed by run and case).
//!
//! A run with `runInSequence` suites publishes each suite's cases (a chain,
//! `crate::runs::sequence`) one at a time instead: a pass first publishes, for each chain, its
//! next case when the one before it is recorded (the first at once), moving the chain's cursor
//! in the store after the confirm, then runs the watermark pass, which skips chain positions.
//! A case recorded is announced to the aggregator, whose release runs such a pass; a missed
//! event or a crash between a result and the next publish leaves a chain short of its end,
//! which the sweeper lists and resumes the same way. `maxConcurrentTests` counts a chain's
//! published cases, not its positions below the watermark.
//!
//! No case has a row until its outcome is known, so creating a run is one row whatever its
//! size, and the request that creates it answers before anything is published.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use skilleval_execution::plan::Job;
use skilleval_execution::variant::Variant;
use skilleval_infra::messages::EncodedJob;
use skilleval_infra::store::lifecycle::TransitionError;
use skilleval_infra::store::publishing::PublishWindow;
use skilleval_infra::store::runs::RunInsert;
use skilleval_infra::store::Store;
use skilleval_infra::topology::Lane;
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use tracing::Instrument as _;
use uuid::Uuid;

use super::error::LaunchError;
use super::plan::{variant_keys, PreparedRun, RunPlan, RunRequest};
use super::planner::RunPlanner;
use super::sequence::Chains;
use crate::jobs::{JobSink, PublishError};
use crate::metrics::Metrics;

/// Chunks of one pass publishing at the same time (the broker always has confirms
/// outstanding instead of draining them at the end of every chunk).
const CHUNKS_IN_FLIGHT: usize = 3;

/// Publishes runs' jobs with confirms, moving their watermarks. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RunPublisher {
    store: Store,
    planner: RunPlanner,
    sink: Arc<dyn JobSink>,
    metrics: Arc<Metrics>,
}

impl RunPublisher {
    pub fn new(
        store: Store,
        planner: RunPlanner,
        sink: Arc<dyn JobSink>,
        metrics: Arc<Metrics>,
    ) -> Self {
        RunPublisher {
            store,
            planner,
            sink,
            metrics,
        }
    }

    /// After the commit of `RunPlanner::insert`: the creation's publishing pass, in a task of
    /// its own (the caller answers at once; a caller that goes away does not cut the pass off
    /// halfway). A failure is logged: the run is committed and the sweeper resumes it.
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
        self.planner.remember(Arc::clone(&prepared.plan));
        let publisher = self.clone();
        // In the creating request's span: the jobs' send spans belong to its trace.
        Some(tokio::spawn(skilleval_infra::telemetry::in_current_trace(
            async move {
                if let Err(e) = publisher.create_pass(&prepared.plan).await {
                    publisher.metrics.publish_failures.inc();
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
            .map_err(LaunchError::database("starting the run's transaction"))?;
        let prepared = self.planner.prepare_stored(&mut tx, request).await?;
        let inserted = self.planner.insert(&mut tx, &prepared).await?;
        tx.commit()
            .await
            .map_err(LaunchError::database("committing the run"))?;
        drop(self.start(prepared, inserted));
        Ok(inserted)
    }

    /// The creator's pass: publish what the cap allows, then end the creation.
    async fn create_pass(&self, plan: &RunPlan) -> Result<usize, LaunchError> {
        let run_id = plan.run_id();
        let mut conn = self.locked(run_id).await?;
        let published = self.publish_pass(&mut conn, plan, Pass::Creation).await;
        unlock(&self.store, conn, run_id).await;
        let published = published?;
        self.end_creation(run_id).await;
        Ok(published)
    }

    /// `creating` -> `running`; a run stopped or finalised meanwhile stays as it is.
    pub(crate) async fn end_creation(&self, run_id: Uuid) {
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
            .map_err(LaunchError::database("taking a connection to lock the run"))?;
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
    #[tracing::instrument(skip_all, fields(run_id = %plan.run_id(), ?pass, from, room))]
    pub(crate) async fn publish_pass(
        &self,
        conn: &mut PgConnection,
        plan: &RunPlan,
        pass: Pass,
    ) -> Result<usize, LaunchError> {
        let run_id = plan.run_id();
        let Some(window) = self.store.publish_window(conn, run_id).await? else {
            return Ok(0);
        };
        let chains = plan.chains().await?;
        let from = usize::try_from(window.published).unwrap_or(0);
        let (sequenced, extra) = if chains.is_empty() {
            (0, 0)
        } else {
            self.publish_sequences(conn, plan, &chains, &window, pass)
                .await?
        };
        let room = window.room_after(extra);
        tracing::Span::current().record("from", from);
        tracing::Span::current().record("room", room);
        if room == 0 {
            return Ok(sequenced);
        }
        let total = usize::try_from(window.total).unwrap_or(0);
        let mut planned = plan.chunks(from, chains.span(from, room, total));
        let mut in_flight: VecDeque<(tokio::task::JoinHandle<Confirms>, i32)> = VecDeque::new();
        let mut position = from;
        let mut whole = true;
        let mut confirmed = sequenced;
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
            let start = position;
            position += chunk.len();
            let end = i32::try_from(position).unwrap_or(i32::MAX);
            // A chain's cases go by its cursor, not the watermark.
            let chunk: Vec<Job> = chunk
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !chains.holds(start + i))
                .map(|(_, job)| job)
                .collect();
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

    /// The chains' part of a pass: for each chain, its next case once the one before it is
    /// recorded (the first at once), as the cap allows, each published alone with confirms and
    /// the chain's cursor moved after the confirm; a case found recorded already (published by
    /// a pass that died before moving the cursor) moves the cursor without a publish. Opens the
    /// run's chains in the store the first time. A publish not confirmed ends the chains' part
    /// (the sweeper tries again). Returns how many jobs were confirmed, and by how much the
    /// run's jobs in flight differ from what the watermark counts (for the cap).
    async fn publish_sequences(
        &self,
        conn: &mut PgConnection,
        plan: &RunPlan,
        chains: &Chains,
        window: &PublishWindow,
        pass: Pass,
    ) -> Result<(usize, i64), LaunchError> {
        let run_id = plan.run_id();
        let mut cursors = self.store.sequence_cursors(conn, run_id).await?;
        if cursors.len() != chains.chains().len() {
            self.store
                .open_sequences(conn, run_id, &chains.lengths())
                .await?;
            cursors = self.store.sequence_cursors(conn, run_id).await?;
        }
        let below = chains.below(usize::try_from(window.published).unwrap_or(0));
        let mut extra = cursors.iter().map(|&k| i64::from(k)).sum::<i64>()
            - i64::try_from(below).unwrap_or(i64::MAX);
        let mut confirmed = 0;
        for (c, chain) in chains.chains().iter().enumerate() {
            let index = i32::try_from(c).unwrap_or(i32::MAX);
            let mut k = cursors
                .get(c)
                .and_then(|&k| usize::try_from(k).ok())
                .unwrap_or(0);
            while let Some((_, job)) = chain.get(k) {
                let previous = k.checked_sub(1).and_then(|p| chain.get(p));
                let mut keys = variant_keys(std::slice::from_ref(job));
                if let Some((_, before)) = previous {
                    keys.extend(variant_keys(std::slice::from_ref(before)));
                }
                let recorded: HashSet<(String, Variant)> = self
                    .store
                    .recorded_among(run_id, &keys)
                    .await?
                    .into_iter()
                    .collect();
                let is_recorded =
                    |j: &Job| recorded.contains(&(j.case.id.clone(), Variant::of(&j.runner)));
                if previous.is_some_and(|(_, before)| !is_recorded(before)) {
                    break;
                }
                let through = i32::try_from(k + 1).unwrap_or(i32::MAX);
                if is_recorded(job) {
                    self.store
                        .advance_sequence(conn, run_id, index, through)
                        .await?;
                    extra += 1;
                    k += 1;
                    continue;
                }
                if window.cap_room(extra) == 0 {
                    break;
                }
                let jobs = self.encode(run_id, std::slice::from_ref(job), pass).await?;
                let confirms = Confirms::of(&self.sink, jobs, plan.lane()).await;
                self.metrics
                    .jobs_published
                    .inc_by(confirms.confirmed as u64);
                if let Some((failed, first)) = &confirms.failed {
                    self.metrics.publish_failures.inc_by(*failed as u64);
                    tracing::warn!(%run_id, chain = c, error = %first, "a sequence's next case was not confirmed; the sweeper will publish it again");
                    return Ok((confirmed, extra));
                }
                self.store
                    .advance_sequence(conn, run_id, index, through)
                    .await?;
                extra += 1;
                confirmed += confirms.confirmed;
                break;
            }
        }
        Ok((confirmed, extra))
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
        let plan = self.planner.plan_of(run_id).await?;
        let span = Pass::Release.span(&plan);
        async {
            let mut conn = self.locked(run_id).await?;
            let published = self.publish_pass(&mut conn, &plan, Pass::Release).await;
            unlock(&self.store, conn, run_id).await;
            published
        }
        .instrument(span)
        .await
    }

    /// [`RunPublisher::release`], logging a failure instead of returning it: the sweeper
    /// publishes later whatever went wrong now.
    pub async fn release_logged(&self, run_id: Uuid) {
        if let Err(e) = self.release(run_id).await {
            self.metrics.publish_failures.inc();
            tracing::warn!(%run_id, error = %e, "publishing the run's jobs failed; the sweeper will retry");
        }
    }
}

/// Which kind of publishing pass runs the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// The creator's first pass.
    Creation,
    /// More room under `maxConcurrentTests`.
    Release,
    /// The sweeper resuming a pass that did not finish.
    Resume,
}

impl Pass {
    /// A span for a pass that runs outside the creating request, in the run's trace.
    pub(crate) fn span(self, plan: &RunPlan) -> tracing::Span {
        let span = tracing::info_span!(
            "publish run",
            skilleval.run_id = %plan.run_id(),
            skilleval.pass = ?self,
        );
        skilleval_infra::telemetry::set_parent(&span, plan.traceparent());
        span
    }
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

/// Frees the run's lock held by `conn`; if that fails the connection is closed, which is what
/// frees a session lock for sure.
pub(crate) async fn unlock(store: &Store, mut conn: PoolConnection<Postgres>, run_id: Uuid) {
    if let Err(e) = store.unlock_publishing(&mut conn, run_id).await {
        tracing::warn!(%run_id, error = %e, "unlocking the run failed; closing the connection");
        drop(conn.detach());
    }
}
