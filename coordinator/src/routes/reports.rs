//! Reports over chosen runs of a skill: `POST /v1/reports {skill, run_ids?, format}` sums up
//! every completed run of the skill (or the ones named) as the report spec seed's
//! `EvaluationReport` with its `ReportSummary` across runs, stores it, and answers it;
//! `GET /v1/reports/{id}?format=markdown|json` reads it again. A report reads only the runs'
//! stored summaries, never their results, so one over hundreds of runs is cheap. The
//! run-level report (`GET /v1/runs/{id}/report`) is another thing and keeps its shape.

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};
use skilleval_analysis::across::across_runs;
use skilleval_reports::across::{across_report, AcrossContext, ReportRun};
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson, ApiQuery};
use crate::results::stored_summary;
use crate::state::AppState;

/// Most runs a request may name.
const MAX_NAMED_RUNS: usize = 1_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateReportBody {
    /// The skill's name.
    pub skill: String,
    /// The runs to cover (completed runs of the skill); every completed run when absent.
    #[serde(default)]
    pub run_ids: Option<Vec<Uuid>>,
    /// `markdown` or `json`.
    pub format: String,
}

/// The rendering a report is asked in.
fn format_of(field: &str, value: &str, code: &'static str) -> Result<&'static str, ApiError> {
    match value {
        "markdown" | "md" => Ok("markdown"),
        "json" => Ok("json"),
        other => Err(ApiError::invalid_field(
            code,
            field,
            format!("must be one of markdown, json, got `{other}`"),
        )),
    }
}

fn run_refused(index: usize, rule: impl Into<String>) -> ApiError {
    ApiError::unprocessable_field("invalid_report_runs", &format!("/run_ids/{index}"), rule)
}

/// The named runs, checked: each a visible, completed run of the skill, named once.
async fn check_named(
    state: &AppState,
    principal: &Principal,
    skill_id: Uuid,
    ids: &[Uuid],
) -> Result<(), ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid_field(
            "invalid_body",
            "/run_ids",
            "must name at least one run (leave it out for every completed run of the skill)",
        ));
    }
    if ids.len() > MAX_NAMED_RUNS {
        return Err(ApiError::invalid_field(
            "invalid_body",
            "/run_ids",
            format!("must name at most {MAX_NAMED_RUNS} runs"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, id) in ids.iter().enumerate() {
        if !seen.insert(id) {
            return Err(ApiError::invalid_field(
                "invalid_body",
                &format!("/run_ids/{i}"),
                format!("names run `{id}` a second time"),
            ));
        }
        match state.store.run_for_report(principal.viewer(), *id).await? {
            None => return Err(run_refused(i, format!("no run `{id}`"))),
            Some((owner, _, _)) if owner != skill_id => {
                return Err(run_refused(
                    i,
                    format!("run `{id}` is a run of another skill"),
                ))
            }
            Some((_, _, kind)) if kind == "samples" => {
                return Err(run_refused(
                    i,
                    format!(
                        "run `{id}` judges production samples; a report covers evaluation runs"
                    ),
                ))
            }
            Some((_, status, _)) if status != "completed" => {
                return Err(run_refused(
                    i,
                    format!("run `{id}` is {status}, not completed"),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// `POST /v1/reports`.
#[tracing::instrument(skip_all, fields(skill = %body.skill))]
pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateReportBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let format = format_of("/format", &body.format, "invalid_body")?;
    let skill_id = state
        .store
        .visible_skill(principal.viewer(), &body.skill)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", &body.skill))?;
    if let Some(ids) = &body.run_ids {
        check_named(&state, &principal, skill_id, ids).await?;
    }
    let rows = state
        .store
        .reportable_runs(skill_id, body.run_ids.as_deref())
        .await?;
    if rows.is_empty() {
        return Err(ApiError::conflict(
            "no_completed_run",
            format!("skill `{}` has no completed run to report on", body.skill),
        )
        .with_details(json!({ "field": "/skill", "rule": "a report needs a completed run" })));
    }
    let description = state
        .store
        .latest_description(skill_id)
        .await?
        .unwrap_or_default();
    let mut runs = Vec::with_capacity(rows.len());
    for row in rows {
        let summary = stored_summary(Some(&row.summary)).ok_or_else(|| {
            ApiError::internal(anyhow::anyhow!(
                "the stored summary of run {} does not read",
                row.run_id
            ))
        })?;
        runs.push(ReportRun {
            run_id: row.run_id,
            version: row.version,
            created_at: row.created_at,
            summary,
        });
    }
    let summaries: Vec<_> = runs.iter().map(|r| r.summary.clone()).collect();
    let figures = across_runs(&summaries);
    let id = Uuid::now_v7();
    let ctx = AcrossContext {
        report_id: id,
        skill_name: &body.skill,
        skill_description: &description,
        created_at: Utc::now(),
        runs: &runs,
        summary: &figures,
    };
    let report = serde_json::to_value(across_report(&ctx, format))
        .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let run_ids: Vec<Uuid> = runs.iter().map(|r| r.run_id).collect();
    state
        .store
        .insert_report(id, skill_id, format, &report, &run_ids)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "report": report })),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetReportQuery {
    #[serde(default)]
    pub format: Option<String>,
}

/// `GET /v1/reports/{id}?format=markdown|json` (default: the format it was created in).
#[tracing::instrument(skip_all, fields(report_id = %id))]
pub async fn get_report(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<GetReportQuery>,
) -> Result<Response, ApiError> {
    let id = parse_uuid("id", &id)?;
    let stored = state
        .store
        .get_report(principal.viewer(), id)
        .await?
        .ok_or_else(|| ApiError::not_found("report", id))?;
    let format = match &query.format {
        Some(f) => format_of("format", f, "invalid_query")?,
        None => format_of("format", &stored.format, "invalid_query")?,
    };
    if format == "markdown" {
        let content = stored
            .report
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        return Ok((
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            content,
        )
            .into_response());
    }
    Ok(Json(stored.report).into_response())
}
