//! `GET /v1/skills/{name}/collisions`: the catalogue collision eval of the skill's latest
//! evaluated version (docs/catalogue.md), and what other skills' evals found about this one.
//!
//! The stored matrix is already the uploader's view (another publisher's queries were never
//! stored). What another skill's eval found about this skill is shown as two rates with their
//! counts and no queries of either side; the other skill is named only when it is public.

use axum::extract::{Path, State};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::Serialize;
use skilleval_analysis::collisions::{for_neighbour, CollisionGate, CollisionMatrix, PairRate};
use skilleval_infra::store::catalogue::CollisionStatus;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::state::AppState;

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
    pub taken_from_you: PairRate,
    /// The other skill's queries picking this one.
    pub taken_by_you: PairRate,
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
            taken_from_you: report.taken_from_you,
            taken_by_you: report.taken_by_you,
        });
    }
    Ok(CollisionsView {
        skill: name.to_string(),
        latest,
        reported_by_others,
    })
}

/// `GET /v1/skills/{name}/collisions`.
pub async fn get_collisions(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<CollisionsView>, ApiError> {
    Ok(Json(collisions_view(&state, &principal, &name).await?))
}
