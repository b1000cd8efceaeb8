//! The catalogue lane: after an upload has answered, its version's collision eval
//! (docs/catalogue.md). The upload commits the version's catalogue card and a `pending` eval
//! with the version; the lane then finds the nearest `neighbours` skills of the uploader's
//! catalogue (its own skills and public ones: [`Store::catalogue_for`] filters in SQL) by the
//! configured embeddings provider or the lexical fallback, runs the catalogue trigger eval
//! with the judge provider, and writes the matrix (another publisher's queries left out) with
//! the version. At most `coordinator.catalogue.concurrency` evals run at once in a
//! coordinator. An eval is claimed with a lease it renews while it runs: one whose
//! coordinator stopped, or that hit a host fault, is claimed again by any coordinator's
//! sweep ([`CollisionLane::resume`]), up to `max_attempts`. An upload that asked for
//! `gate=no_collision` has its run wait for the eval, whose gate is then part of the run's
//! verdict (`crate::aggregate`). Skills stored before catalogue cards existed get theirs at
//! start ([`CollisionLane::backfill`]).
//!
//! With `coordinator.catalogue.mode = "agent"` the eval's runs give each query to the `agent`
//! runner instead, in the coordinator's sandbox, with the version's package (read from the
//! store and extracted as a worker does) at `/skill`; a coordinator without a working sandbox
//! fails the eval as a configuration problem (`crate::catalogue_agent`).
//!
//! [`collisions_view`] is what `GET /v1/skills/{name}/collisions` and the skill page show: the
//! stored matrix is already the uploader's view (another publisher's queries were never
//! stored); what another skill's eval found about this skill is two rates with their counts,
//! no queries of either side, the other skill named only when it is public or the viewer's.
//!
//! [`Store::catalogue_for`]: skilleval_infra::store::Store::catalogue_for

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use skilleval_analysis::collisions::{
    self, for_neighbour, CollisionGate, CollisionMatrix, PairRate,
};
use skilleval_analysis::stats::proportion::Interval;
use skilleval_execution::catalogue::Picker;
use skilleval_execution::catalogue::{self, CatalogueSkill};
use skilleval_execution::triggers::SkillCard;
use skilleval_infra::config::{CatalogueMode, CatalogueSettings};
use skilleval_infra::store::catalogue::{ClaimedEval, CollisionStatus};
use skilleval_infra::store::Store;
use skilleval_model::package::{Package, PackageLimits, TriggerCase};
use skilleval_providers::{ProviderClients, Purpose};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::aggregate::RunAggregator;
use crate::auth::Principal;
use crate::catalogue_agent::{picker_for, AgentSetupError, CatalogueAgent};
use crate::error::ApiError;

/// Why an eval did not produce a matrix, which decides what happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EvalError {
    /// The coordinator cannot run collision evals as configured (no judge provider, the lane
    /// disabled): recorded `failed` at once; retrying would not help.
    Configuration(String),
    /// The judge, the embeddings provider or the store failed: retried until
    /// `max_attempts`.
    Host(String),
}

/// The catalogue lane: runs each version's collision eval after its upload has answered, at
/// most `coordinator.catalogue.concurrency` at once, and resumes the evals nobody holds.
/// The eval's lifecycle (`pending` → `completed` | `failed`, claims, attempts) is kept in
/// the store; the lane only claims, evaluates and records, then finalises the upload runs
/// that waited for the `no_collision` gate.
#[derive(Clone)]
pub struct CollisionLane(Arc<Lane>);

/// What the lane's clones share (one pointer in the app's state).
struct Lane {
    store: Store,
    providers: Option<Arc<ProviderClients>>,
    settings: CatalogueSettings,
    aggregator: RunAggregator,
    permits: Arc<Semaphore>,
    /// Agent mode's sandbox and package limits (`coordinator.catalogue.mode = "agent"`).
    agent: Option<CatalogueAgent>,
    /// The limits a stored package is opened under (the backfill reads trigger files).
    limits: PackageLimits,
}

impl std::fmt::Debug for CollisionLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollisionLane")
            .field("settings", &self.0.settings)
            .field("providers", &self.0.providers.is_some())
            .finish_non_exhaustive()
    }
}

impl CollisionLane {
    pub fn new(
        store: Store,
        providers: Option<Arc<ProviderClients>>,
        settings: CatalogueSettings,
        aggregator: RunAggregator,
        agent: Option<CatalogueAgent>,
        limits: PackageLimits,
    ) -> Self {
        CollisionLane(Arc::new(Lane {
            store,
            providers,
            permits: Arc::new(Semaphore::new(settings.concurrency.max(1))),
            settings,
            aggregator,
            agent,
            limits,
        }))
    }

    /// Why this coordinator cannot decide `gate=no_collision` (an upload asking for it is
    /// refused with this rule), or `None`.
    pub fn gate_unavailable(&self) -> Option<String> {
        let lane = &self.0;
        if !lane.settings.enabled {
            return Some(
                "needs the catalogue lane, which coordinator.catalogue.enabled turns off here"
                    .into(),
            );
        }
        let purpose = match lane.settings.mode {
            CatalogueMode::Model => Purpose::Judge,
            CatalogueMode::Agent => Purpose::Produce,
        };
        let picker = lane.providers.as_deref().map(|p| p.pick(None, purpose));
        if !matches!(picker, Some(Ok(_))) {
            return Some(
                "needs a model provider on the coordinator (llm.providers) to pick skills, and none is configured"
                    .into(),
            );
        }
        match (lane.settings.mode, &lane.agent) {
            (CatalogueMode::Model, _) => None,
            (CatalogueMode::Agent, Some(agent)) => agent.sandbox_problem(),
            (CatalogueMode::Agent, None) => {
                Some("needs the agent mode's sandbox, which this coordinator did not set up".into())
            }
        }
    }

    /// Starts the version's eval in the background (its card and `pending` row are committed
    /// with the upload); returns at once.
    pub fn start(&self, version_id: Uuid) {
        let lane = self.clone();
        tokio::spawn(Box::pin(lane.run(version_id)));
    }

    /// Starts the pending evals nobody holds (never started, their coordinator stopped, or
    /// due again after a host fault), as many as the lane has room for; returns how many.
    pub async fn resume(&self) -> anyhow::Result<usize> {
        let room = self.0.permits.available_permits();
        if room == 0 {
            return Ok(0);
        }
        let due = self
            .0
            .store
            .unclaimed_collisions(i64::try_from(room).unwrap_or(i64::MAX))
            .await?;
        for version_id in &due {
            self.start(*version_id);
        }
        Ok(due.len())
    }

    /// Gives every skill uploaded before catalogue cards existed its card, from its latest
    /// version (the description, and the should-trigger queries of its stored package), so
    /// it is a neighbour like any other; returns how many cards this call added. Such a card
    /// is private (only its own publisher's evals see it) until the skill is uploaded again
    /// with `public=true`. A package that no longer opens under today's limits gives a card
    /// with its description and no queries. Bounded per call; the coordinator calls it at
    /// start until it adds nothing.
    pub async fn backfill(&self) -> anyhow::Result<usize> {
        const BATCH: i64 = 8;
        const PER_CALL: usize = 400;
        let mut added = 0;
        let mut seen = 0;
        while seen < PER_CALL {
            let batch = self.0.store.uncatalogued_versions(BATCH).await?;
            if batch.is_empty() {
                break;
            }
            seen += batch.len();
            for version in batch {
                let limits = self.0.limits.clone();
                let package = version.package;
                let opened = tokio::task::spawn_blocking(move || {
                    Package::from_zip_bytes_streamed(&package, &limits)
                })
                .await?;
                let queries: Vec<String> = match opened {
                    Ok(p) => p
                        .triggers
                        .iter()
                        .filter(|t| t.should_trigger)
                        .map(|t| t.query.clone())
                        .collect(),
                    Err(e) => {
                        tracing::warn!(version_id = %version.version_id, error = %e, "a stored package did not open; its catalogue card has no queries");
                        Vec::new()
                    }
                };
                if self
                    .0
                    .store
                    .backfill_card(
                        version.version_id,
                        version.skill_id,
                        &version.description,
                        &queries,
                    )
                    .await?
                {
                    added += 1;
                }
            }
        }
        Ok(added)
    }

    /// Claims the eval (another coordinator may hold it: then nothing happens), evaluates it
    /// while renewing the claim, records the outcome, and finalises the runs that waited.
    async fn run(self, version_id: Uuid) {
        let Ok(_permit) = self.0.permits.clone().acquire_owned().await else {
            return;
        };
        let lease = Duration::from_secs(self.0.settings.lease_secs.max(3));
        let claimed = match self.0.store.claim_collisions(version_id, lease).await {
            Ok(Some(claimed)) => claimed,
            Ok(None) => return,
            Err(e) => {
                // Unclaimed, so the next sweep tries again.
                tracing::warn!(error = %e, %version_id, "claiming the collision eval failed");
                return;
            }
        };
        let outcome = {
            let eval = evaluate(
                &self.0.store,
                self.0.providers.as_deref(),
                &self.0.settings,
                self.0.agent.as_ref(),
                &claimed,
            );
            tokio::pin!(eval);
            let mut renew = tokio::time::interval(lease / 3);
            renew.tick().await;
            loop {
                tokio::select! {
                    outcome = &mut eval => break outcome,
                    _ = renew.tick() => {
                        if let Err(e) = self.0.store.renew_collisions(version_id, lease).await {
                            tracing::warn!(error = %e, %version_id, "renewing the collision eval's claim failed");
                        }
                    }
                }
            }
        };
        let stored = match outcome {
            Ok((matrix, gate, neighbours)) => {
                self.0
                    .store
                    .finish_collisions(version_id, &matrix, gate.as_ref(), &neighbours)
                    .await
            }
            Err(EvalError::Host(reason)) if claimed.attempt < self.0.settings.max_attempts => {
                tracing::warn!(%version_id, attempt = claimed.attempt, reason, "the collision eval hit a host fault; it is retried");
                let retry = Duration::from_secs(self.0.settings.retry_after_secs);
                if let Err(e) = self
                    .0
                    .store
                    .release_collisions(version_id, &reason, retry)
                    .await
                {
                    tracing::warn!(error = %e, %version_id, "releasing the collision eval failed; its claim lapses instead");
                }
                return;
            }
            Err(error) => {
                let reason = match &error {
                    EvalError::Configuration(m) => format!("configuration problem: {m}"),
                    EvalError::Host(m) => {
                        format!("{m} (after {} attempts)", claimed.attempt)
                    }
                };
                tracing::warn!(%version_id, reason, "the collision eval did not run");
                self.0.store.fail_collisions(version_id, &reason).await
            }
        };
        if let Err(e) = stored {
            // The claim lapses and another sweep runs the eval again.
            tracing::warn!(error = %e, %version_id, "the collision eval was not recorded");
            return;
        }
        // Only a gated upload's runs wait for the eval; others are finalised as usual.
        if claimed.gated {
            self.finalise_waiting(version_id).await;
        }
    }

    /// Finalises the version's upload runs that had every case recorded and waited for the
    /// gate (a run finishing later is finalised by its last event as usual).
    async fn finalise_waiting(&self, version_id: Uuid) {
        let runs = match self.0.store.runs_awaiting_collisions(version_id).await {
            Ok(runs) => runs,
            Err(e) => {
                tracing::warn!(error = %e, %version_id, "listing the runs waiting on the collision gate failed; the finalisation sweep finds them");
                return;
            }
        };
        for run_id in runs {
            if let Err(e) = self.0.aggregator.finalise(run_id).await {
                tracing::warn!(error = ?e, %run_id, "finalising the gated run failed; the finalisation sweep retries");
            }
        }
    }
}

type Evaluated = (serde_json::Value, Option<serde_json::Value>, Vec<Uuid>);

async fn evaluate(
    store: &Store,
    providers: Option<&ProviderClients>,
    settings: &CatalogueSettings,
    agent: Option<&CatalogueAgent>,
    job: &ClaimedEval,
) -> Result<Evaluated, EvalError> {
    if !settings.enabled {
        return Err(EvalError::Configuration(
            "coordinator.catalogue.enabled is false".into(),
        ));
    }
    let providers = providers.ok_or_else(|| {
        EvalError::Configuration(
            "no model provider is configured (llm.providers) to pick skills".into(),
        )
    })?;
    // The package on disk (agent mode) lives until the eval is done.
    let (picker, _package) = picker_for(store, settings, agent, &job.package_hash)
        .await
        .map_err(|e| match e {
            AgentSetupError::Configuration(m) => EvalError::Configuration(m),
            AgentSetupError::Host(m) => EvalError::Host(m),
        })?;
    // The agent produces (the `agent` runner's provider); the model mode's pick is a judgement.
    let purpose = match picker {
        Picker::Model => Purpose::Judge,
        Picker::Agent(_) => Purpose::Produce,
    };
    let judge = providers
        .pick(None, purpose)
        .map_err(EvalError::Configuration)?;
    let embedder = providers
        .pick(None, Purpose::Embed)
        .ok()
        .filter(|c| c.config().embedding_model.is_some());
    let catalogue = store
        .catalogue_for(job.publisher_id, job.skill_id)
        .await
        .map_err(|e| EvalError::Host(e.to_string()))?;
    let cards: Vec<SkillCard> = catalogue
        .iter()
        .map(|c| SkillCard::new(&c.name, &c.description))
        .collect();
    let skill = CatalogueSkill {
        card: SkillCard::new(&job.name, &job.description),
        queries: cases(&job.queries),
    };
    let (neighbours, method, _) = catalogue::nearest(
        embedder.as_deref(),
        &skill.card,
        &cards,
        settings.neighbours.clamp(1, 50),
    )
    .await
    .map_err(|f| EvalError::Host(format!("embedding the descriptions: {f}")))?;
    let chosen: Vec<_> = neighbours
        .iter()
        .filter_map(|n| catalogue.iter().find(|c| c.name == n.name))
        .collect();
    let decoys: Vec<CatalogueSkill> = chosen
        .iter()
        .map(|c| CatalogueSkill {
            card: SkillCard::new(&c.name, &c.description),
            queries: cases(&c.queries),
        })
        .collect();
    let run = catalogue::evaluate_catalogue(
        &judge,
        &skill,
        &decoys,
        settings.runs_per_query.clamp(1, 10),
        4,
        &picker,
    )
    .await;
    judge_answered(&run).map_err(EvalError::Host)?;
    let foreign = |name: &str| {
        chosen
            .iter()
            .any(|c| c.name == name && c.publisher_id != job.publisher_id)
    };
    let matrix = collisions::matrix(&run, &neighbours, method, foreign);
    let gate = job
        .gated
        .then(|| collisions::gate(&matrix, settings.max_share));
    let matrix = serde_json::to_value(&matrix).map_err(|e| EvalError::Host(e.to_string()))?;
    let gate = gate
        .map(|g| serde_json::to_value(&g).map_err(|e| EvalError::Host(e.to_string())))
        .transpose()?;
    Ok((matrix, gate, chosen.iter().map(|c| c.skill_id).collect()))
}

/// A matrix is only as good as the runs that answered: when more than half of them failed
/// (the judge down, rate limited), the eval is a host fault to retry, not a matrix whose
/// empty pairs would pass the gate.
fn judge_answered(run: &catalogue::CatalogueRun) -> Result<(), String> {
    let failed: usize = run.queries.iter().map(|q| q.errors.len()).sum();
    let answered: usize = run.queries.iter().map(|q| q.picks.len()).sum();
    if failed == 0 || failed * 2 <= failed + answered {
        return Ok(());
    }
    let first = run
        .queries
        .iter()
        .find_map(|q| q.errors.first())
        .map_or("", String::as_str);
    Err(format!(
        "the judge failed {failed} of {} runs (first: {first})",
        failed + answered
    ))
}

fn cases(queries: &[String]) -> Vec<TriggerCase> {
    queries
        .iter()
        .map(|q| TriggerCase {
            query: q.clone(),
            should_trigger: true,
        })
        .collect()
}

#[derive(Debug, Serialize)]
pub struct CollisionsView {
    pub skill: String,
    /// The latest version's eval; `None` when no version has one.
    pub latest: Option<LatestCollisions>,
    /// Other skills whose evals had this one as a neighbour: counts and rates only.
    pub reported_by_others: Vec<OtherReport>,
}

#[derive(Debug, Serialize)]
pub struct LatestCollisions {
    pub version_id: Uuid,
    pub version: String,
    pub status: CollisionStatus,
    pub matrix: Option<CollisionMatrix>,
    pub gate: Option<CollisionGate>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize)]
pub struct OtherReport {
    /// The other skill's name when it is public or the viewer's own; else `None`.
    pub skill: Option<String>,
    /// The other skill belongs to another publisher.
    pub foreign: bool,
    pub similarity: f64,
    /// This skill's queries picking the other skill.
    pub taken_from_you: Rate,
    /// The other skill's queries picking this one.
    pub taken_by_you: Rate,
}

/// A pair's rate without the names of its two skills.
#[derive(Debug, Serialize)]
pub struct Rate {
    pub hits: u64,
    pub runs: u64,
    pub rate: Option<f64>,
    pub interval: Option<Interval>,
}

impl From<PairRate> for Rate {
    fn from(p: PairRate) -> Self {
        Rate {
            hits: p.hits,
            runs: p.runs,
            rate: p.rate,
            interval: p.interval,
        }
    }
}

/// The view of a skill's collisions for `viewer_publisher` (`None`: an admin sees names).
pub async fn collisions_view(
    store: &Store,
    principal: &Principal,
    name: &str,
) -> Result<CollisionsView, ApiError> {
    let skill_id = store
        .visible_skill(principal.viewer(), name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", name))?;
    let latest = match store.latest_collisions(skill_id).await? {
        Some(row) => Some(LatestCollisions {
            version_id: row.version_id,
            version: row.version,
            status: row.status,
            matrix: row
                .matrix
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?,
            gate: row
                .gate
                .map(serde_json::from_value)
                .transpose()
                .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?,
            error: row.error,
            created_at: row.created_at,
            finished_at: row.finished_at,
        }),
        None => None,
    };
    let mut reported_by_others = Vec::new();
    for row in store.collisions_naming(skill_id).await? {
        let matrix: CollisionMatrix = serde_json::from_value(row.matrix)
            .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
        let Some(report) = for_neighbour(&matrix, name) else {
            continue;
        };
        let foreign = row.publisher_id != principal.publisher_id;
        reported_by_others.push(OtherReport {
            skill: (!foreign || row.public || principal.is_admin()).then(|| report.skill.clone()),
            foreign,
            similarity: report.similarity,
            // From the neighbour's side: the other skill took this one's queries.
            taken_from_you: report.taken_from_you.into(),
            taken_by_you: report.taken_by_you.into(),
        });
    }
    Ok(CollisionsView {
        skill: name.to_string(),
        latest,
        reported_by_others,
    })
}
