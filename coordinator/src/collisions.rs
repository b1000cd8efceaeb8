//! The catalogue lane: after an upload has answered, its version's collision eval
//! (docs/catalogue.md). The version's catalogue card is stored, the nearest `neighbours`
//! skills of the uploader's catalogue (its own skills and public ones: [`Store::catalogue_for`]
//! filters in SQL) are found by the configured embeddings provider or the lexical fallback, the
//! catalogue trigger eval runs with the judge provider, and the matrix (another publisher's
//! queries left out before it is stored) is written with the version. With
//! `coordinator.catalogue.mode = "agent"` the eval's runs give each query to the `agent`
//! runner instead, in the coordinator's sandbox, with the version's package (read from the
//! store and extracted as a worker does) at `/skill`; a coordinator without a working sandbox
//! fails the eval as a configuration problem. At most
//! `coordinator.catalogue.concurrency` evals run at once in a coordinator; they are tasks of
//! the coordinator, not broker jobs, so an eval in flight when the coordinator stops stays
//! `pending` until the version is uploaded again.
//!
//!
//! [`collisions_view`] is what `GET /v1/skills/{name}/collisions` and the skill page show: the
//! stored matrix is already the uploader's view (another publisher's queries were never
//! stored); what another skill's eval found about this skill is two rates with their counts,
//! no queries of either side, the other skill named only when it is public or the viewer's.
//!
//! [`Store::catalogue_for`]: skilleval_infra::store::Store::catalogue_for

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use serde::Serialize;
use skilleval_analysis::collisions::{
    self, for_neighbour, CollisionGate, CollisionMatrix, PairRate,
};
use skilleval_analysis::stats::proportion::Interval;
use skilleval_execution::catalogue::Picker;
use skilleval_execution::catalogue::{self, CatalogueSkill};
use skilleval_execution::triggers::SkillCard;
use skilleval_infra::config::CatalogueSettings;
use skilleval_infra::store::catalogue::CollisionStatus;
use skilleval_infra::store::Store;
use skilleval_model::package::TriggerCase;
use skilleval_providers::{ProviderClients, Purpose};
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::auth::Principal;
use crate::catalogue_agent::{picker_for, CatalogueAgent};
use crate::error::ApiError;
use crate::state::AppState;

/// What the lane needs of an upload.
#[derive(Debug, Clone)]
pub(crate) struct CollisionJob {
    pub version_id: Uuid,
    pub skill_id: Uuid,
    pub publisher_id: Uuid,
    pub name: String,
    pub description: String,
    /// The should-trigger queries.
    pub queries: Vec<String>,
    pub public: bool,
    /// The upload asked for `gate=no_collision`.
    pub gate: bool,
    /// The coordinator's agent-mode setup (`coordinator.catalogue.mode = "agent"`).
    pub agent: Option<CatalogueAgent>,
}

fn lane(settings: &CatalogueSettings) -> Arc<Semaphore> {
    static LANE: OnceLock<Arc<Semaphore>> = OnceLock::new();
    LANE.get_or_init(|| Arc::new(Semaphore::new(settings.concurrency.max(1))))
        .clone()
}

/// Stores the card and starts the eval in the background; returns at once.
pub(crate) fn spawn(
    store: Store,
    providers: Option<Arc<ProviderClients>>,
    settings: CatalogueSettings,
    job: CollisionJob,
) {
    let lane = lane(&settings);
    tokio::spawn(async move {
        let version_id = job.version_id;
        if let Err(e) = store
            .put_catalogue_card(
                job.version_id,
                job.skill_id,
                &job.description,
                &job.queries,
                job.public,
            )
            .await
        {
            tracing::warn!(error = %e, %version_id, "the catalogue card was not stored");
            return;
        }
        let Ok(_permit) = lane.acquire_owned().await else {
            return;
        };
        let outcome = evaluate(&store, providers.as_deref(), &settings, &job).await;
        let stored = match outcome {
            Ok((matrix, gate, neighbours)) => {
                store
                    .finish_collisions(version_id, &matrix, gate.as_ref(), &neighbours)
                    .await
            }
            Err(reason) => {
                tracing::warn!(%version_id, reason, "the collision eval did not run");
                store.fail_collisions(version_id, &reason).await
            }
        };
        if let Err(e) = stored {
            tracing::warn!(error = %e, %version_id, "the collision eval was not recorded");
        }
    });
}

type Evaluated = (serde_json::Value, Option<serde_json::Value>, Vec<Uuid>);

async fn evaluate(
    store: &Store,
    providers: Option<&ProviderClients>,
    settings: &CatalogueSettings,
    job: &CollisionJob,
) -> Result<Evaluated, String> {
    if !settings.enabled {
        return Err("coordinator.catalogue.enabled is false".into());
    }
    let providers =
        providers.ok_or("no model provider is configured (llm.providers) to pick skills")?;
    // The package on disk (agent mode) lives until the eval is done.
    let (picker, _package) = picker_for(store, settings, job.agent.as_ref(), job.version_id)
        .await
        .map_err(|e| e.to_string())?;
    // The agent produces (the `agent` runner's provider); the model mode's pick is a judgement.
    let judge = match picker {
        Picker::Model => providers.pick(None, Purpose::Judge)?,
        Picker::Agent(_) => providers.pick(None, Purpose::Produce)?,
    };
    let embedder = providers
        .pick(None, Purpose::Embed)
        .ok()
        .filter(|c| c.config().embedding_model.is_some());
    let catalogue = store
        .catalogue_for(job.publisher_id, job.skill_id)
        .await
        .map_err(|e| e.to_string())?;
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
    .map_err(|f| format!("embedding the descriptions: {f}"))?;
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
    let foreign = |name: &str| {
        chosen
            .iter()
            .any(|c| c.name == name && c.publisher_id != job.publisher_id)
    };
    let matrix = collisions::matrix(&run, &neighbours, method, foreign);
    let gate = job
        .gate
        .then(|| collisions::gate(&matrix, settings.max_share));
    let matrix = serde_json::to_value(&matrix).map_err(|e| e.to_string())?;
    let gate = gate
        .map(|g| serde_json::to_value(&g).map_err(|e| e.to_string()))
        .transpose()?;
    Ok((matrix, gate, chosen.iter().map(|c| c.skill_id).collect()))
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
    state: &AppState,
    principal: &Principal,
    name: &str,
) -> Result<CollisionsView, ApiError> {
    let skill_id = state
        .store
        .visible_skill(principal.viewer(), name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", name))?;
    let latest = match state.store.latest_collisions(skill_id).await? {
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
    for row in state.store.collisions_naming(skill_id).await? {
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
