//! `/v1/comparisons`: compare two runs (or versions: their latest completed run), store the
//! answer, read it again as `comparison.json` or as the Markdown of a pull-request comment.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use skilleval_analysis::compare::{self, CompareError, Comparison};
use skilleval_model::gate::GateConfig;

use crate::auth::Principal;
use crate::comparing::{compare_and_store, resolve, Blind, ComparingError};
use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson, ApiQuery};
use crate::state::AppState;
use skilleval_grading::comparator::{default_criteria, BlindOptions};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateComparisonBody {
    /// A run id, or a version id (its latest completed run).
    pub base: uuid::Uuid,
    pub head: uuid::Uuid,
    /// Compare cases whose definition, grader or judge model changed too.
    #[serde(default)]
    pub force: bool,
    /// Also judge each pair's outputs with the blind comparator (needs a model provider on
    /// the coordinator, `llm.providers`).
    #[serde(default)]
    pub comparator: bool,
    /// Seeds which output the comparator sees first in each pair (default: random, recorded).
    #[serde(default)]
    pub comparator_seed: Option<u64>,
    /// Judge every pair in both orders (twice the calls) instead of one shuffled order.
    #[serde(default)]
    pub both_orders: bool,
}

/// `POST /v1/comparisons`: 201 with the comparison (`comparison.json` shape).
#[tracing::instrument(skip_all, fields(base = %body.base, head = %body.head))]
pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateComparisonBody>,
) -> Result<Response, ApiError> {
    // A run or version of another publisher is unknown here, as it is everywhere.
    for (field, id) in [("/base", body.base), ("/head", body.head)] {
        let viewer = principal.viewer();
        if !state.store.visible_run(viewer, id).await?
            && !state.store.visible_version(viewer, id).await?
        {
            return Err(comparing_error(ComparingError::Unknown(id), field));
        }
    }
    let base = resolve(&state.store, body.base)
        .await
        .map_err(|e| comparing_error(e, "/base"))?;
    let head = resolve(&state.store, body.head)
        .await
        .map_err(|e| comparing_error(e, "/head"))?;
    let blind = if body.comparator {
        let Some(clients) = &state.comparator else {
            let rule = "the blind comparator needs a model provider configured on the coordinator (llm.providers; see docs/providers.md)";
            return Err(ApiError::conflict("comparator_unavailable", rule)
                .with_details(json!({ "field": "/comparator", "rule": rule })));
        };
        let client = clients
            .pick(None, skilleval_providers::Purpose::Judge)
            .map_err(|e| {
                ApiError::conflict("comparator_unavailable", e.clone())
                    .with_details(json!({ "field": "/comparator", "rule": e }))
            })?;
        Some(Blind {
            client,
            options: BlindOptions {
                seed: body.comparator_seed.unwrap_or_else(rand::random),
                both_orders: body.both_orders,
                criteria: default_criteria(),
                concurrency: 4,
            },
        })
    } else {
        None
    };
    let comparison = compare_and_store(
        &state.store,
        &base,
        &head,
        body.force,
        GateConfig::default(),
        blind.as_ref(),
    )
    .await
    .map_err(|e| comparing_error(e, ""))?;
    let location = format!("/v1/comparisons/{}", comparison.comparison_id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(comparison),
    )
        .into_response())
}

/// A comparison that could not be made, as the API answers it (`field`: which side).
pub fn comparing_error(e: ComparingError, field: &str) -> ApiError {
    let message = e.to_string();
    match e {
        ComparingError::Unknown(id) => ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
            .with_details(json!({ "field": field, "rule": "must be a run id or a version id", "id": id })),
        ComparingError::NoCompletedRun(_) => ApiError::conflict("no_completed_run", message)
            .with_details(json!({ "field": field, "rule": "a version is compared by its latest completed run" })),
        ComparingError::NotCompleted { status, .. } => ApiError::conflict("run_not_completed", message)
            .with_details(json!({ "field": field, "rule": "only a completed run can be compared", "status": status })),
        ComparingError::Compare(CompareError::NotComparable { count }) => {
            ApiError::conflict("not_comparable", message).with_details(json!({
                "field": "/force",
                "rule": "every shared case changed its definition, grader or judge model; set force to compare anyway",
                "cases": count,
            }))
        }
        ComparingError::Compare(CompareError::NoCommonCases { .. }) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "no_common_cases",
            message,
        )
        .with_details(json!({ "field": "/head", "rule": "the two runs must share a test case that ran in both" })),
        ComparingError::Compare(e @ CompareError::Statistics(_)) => ApiError::internal(e),
        ComparingError::Internal(e) => ApiError::internal(e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComparisonQuery {
    #[serde(default)]
    pub format: Option<String>,
}

/// `GET /v1/comparisons/{id}?format=json|markdown` (JSON by default).
#[tracing::instrument(skip_all, fields(comparison_id = %id))]
pub async fn get_comparison(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ComparisonQuery>,
) -> Result<Response, ApiError> {
    let id = parse_uuid("id", &id)?;
    let markdown = match query.format.as_deref() {
        None | Some("json") => false,
        Some("markdown" | "md") => true,
        Some(other) => {
            return Err(ApiError::invalid_field(
                "invalid_query",
                "format",
                format!("must be `json` or `markdown`, got `{other}`"),
            ))
        }
    };
    let stored = state
        .store
        .get_comparison(id)
        .await?
        .ok_or_else(|| ApiError::not_found("comparison", id))?;
    let Some(result) = stored.result else {
        return Err(ApiError::conflict(
            "comparison_not_ready",
            format!("comparison {id} is {:?}", stored.status),
        )
        .with_details(json!({ "status": stored.status })));
    };
    if !markdown {
        return Ok(Json(result).into_response());
    }
    let comparison: Comparison = serde_json::from_value(result)
        .map_err(|e| ApiError::internal(anyhow::anyhow!("stored comparison {id}: {e}")))?;
    Ok((
        [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
        compare::markdown(&comparison),
    )
        .into_response())
}
