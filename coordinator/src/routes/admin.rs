//! `/v1/admin`: what operators need beyond the runs API — the jobs drained from the parking
//! queue, and requeueing them ([`crate::parked`]).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skilleval_infra::store::lifecycle::TransitionError;
use skilleval_infra::store::parked::{ParkedJob, ParkedState, RequeueError};

use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiQuery};
use crate::parked::{requeue, RequeueFailed};
use crate::state::AppState;

/// Rows listed when the request names no limit, and the most it may name.
const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParkedQuery {
    #[serde(default)]
    pub state: Option<ParkedState>,
    #[serde(default)]
    pub limit: Option<i64>,
}

#[derive(Debug, Serialize)]
pub struct ParkedList {
    pub parked: Vec<ParkedJob>,
}

#[derive(Debug, Serialize)]
pub struct RequeueResponse {
    pub id: uuid::Uuid,
    pub run_id: Option<uuid::Uuid>,
    pub state: ParkedState,
    /// The case's errored result was given back to its run (which runs it again).
    pub reopened: bool,
}

/// `GET /v1/admin/parked`: parked jobs, newest first.
pub async fn list_parked(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<ParkedQuery>,
) -> Result<Json<ParkedList>, ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid_field(
            "invalid_query",
            "limit",
            format!("must be 1 to {MAX_LIMIT}"),
        ));
    }
    let parked = state.store.list_parked(query.state, limit).await?;
    Ok(Json(ParkedList { parked }))
}

/// `POST /v1/admin/parked/{id}/requeue`: publishes the parked job again (an errored case is
/// given back to its run first).
pub async fn requeue_parked(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<RequeueResponse>), ApiError> {
    let id = parse_uuid("id", &id)?;
    match requeue(&state.store, state.sink.as_ref(), id).await {
        Ok(requeued) => Ok((
            StatusCode::ACCEPTED,
            Json(RequeueResponse {
                id,
                run_id: requeued.run_id,
                state: ParkedState::Requeued,
                reopened: requeued.reopened,
            }),
        )),
        Err(RequeueFailed::Refused(RequeueError::NotFound(_))) => {
            Err(ApiError::not_found("parked job", id))
        }
        Err(RequeueFailed::Refused(RequeueError::AlreadyRequeued(_))) => Err(ApiError::conflict(
            "already_requeued",
            format!("parked job {id} was requeued already"),
        )
        .with_details(json!({ "state": ParkedState::Requeued }))),
        Err(RequeueFailed::Refused(RequeueError::Transition(TransitionError::Illegal {
            run_id,
            state: run,
            ..
        }))) => Err(ApiError::conflict(
            "run_stopped",
            format!(
                "run {run_id} was stopped ({}): its cases are not run again",
                run.stop_reason.map_or("stopped", |r| r.as_str())
            ),
        )
        .with_details(json!({ "run_id": run_id, "stop_reason": run.stop_reason }))),
        Err(RequeueFailed::Publish(e)) => Err(ApiError::unavailable(e)),
        Err(e) => Err(ApiError::internal(e)),
    }
}
