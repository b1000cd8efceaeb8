//! `/v1/runs`: create (idempotent by key), read, list results, report, cancel.

use crate::db::{ResultRow, RunInsert};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use skilleval::compare::GateSpec;
use skilleval::executor::{CaseStatus, JobResult};
use skilleval::forecast::{forecast, CallCounts, Measured, Shape};
use skilleval::model::RunnerSpec;
use skilleval::plan::CaseFilter;
use skilleval::report::{render, ReportContext, ReportFormat};
use skilleval_infra::store::lifecycle::{RunKind, RunStatus, TransitionError};

use crate::aggregate::{load_results, stored_summary};
use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson, ApiQuery};
use crate::launch::RunRequest;
use crate::routes::skills::check_callback_url;
use crate::state::AppState;
use crate::views::{CancelResponse, CreateRunResponse, ResultPage, ResultView, RunView};

/// Results per page when the request names no limit, and the most it may name.
const DEFAULT_PAGE: i64 = 100;
const MAX_PAGE: i64 = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRunBody {
    pub version_id: uuid::Uuid,
    #[serde(default)]
    pub runner: Option<RunnerSpec>,
    #[serde(default)]
    pub suite: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub test_cases: Vec<String>,
    #[serde(default)]
    pub callback_url: Option<String>,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Budget: stop the run once its cases spent more than this many US dollars.
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    /// Budget: stop the run once its cases spent more than this many tokens. Signed so that a
    /// negative value reaches the range check and its message, not a type error.
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// The regression gate: `"no_regression"` or `{"rule", "alpha", "score_margin"}`.
    #[serde(default)]
    pub gate: Option<GateSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRunQuery {
    /// Plan the run and answer what it would cost and detect, creating nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /v1/runs` (`?dry_run=true`: the forecast, nothing created).
#[tracing::instrument(skip_all, fields(version_id = %body.version_id))]
pub async fn create(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<CreateRunQuery>,
    ApiJson(body): ApiJson<CreateRunBody>,
) -> Result<Response, ApiError> {
    if let Some(url) = &body.callback_url {
        check_callback_url("/callback_url", url)?;
    }
    if let Some(key) = &body.idempotency_key {
        if key.is_empty() || key.len() > 200 {
            return Err(ApiError::invalid_field(
                "invalid_body",
                "/idempotency_key",
                "must be 1 to 200 characters",
            ));
        }
    }
    if let Some(RunnerSpec::Name(name)) = &body.runner {
        if !matches!(name.as_str(), "agent" | "command" | "given" | "llm") {
            return Err(ApiError::invalid_field(
                "invalid_body",
                "/runner",
                format!("unknown runner `{name}`: use `agent`, `command`, `given` or `llm`"),
            ));
        }
    }
    check_budget(body.max_cost_usd, body.max_tokens)?;
    let request = RunRequest {
        version_id: body.version_id,
        runner: body.runner,
        filter: CaseFilter {
            tags: body.tags,
            case_ids: body.test_cases,
            suite: body.suite,
        },
        callback_url: body.callback_url,
        idempotency_key: body.idempotency_key,
        kind: RunKind::Manual,
        max_cost_usd: body.max_cost_usd,
        max_tokens: body.max_tokens,
        gate: body.gate,
        rescore_of: None,
    };
    if query.dry_run {
        return Ok(Json(dry_run(&state, &request).await?).into_response());
    }
    let inserted = state.launcher.create(&request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CreateRunResponse {
            run_id: inserted.run_id(),
            created: matches!(inserted, RunInsert::Created(_)),
        }),
    )
        .into_response())
}

/// What the run would cost and could detect: its jobs planned (filter and runner applied)
/// and counted a chunk at a time, priced and powered from the skill's last completed run
/// (this version's, else the previous version's), as `skilleval plan` does locally.
async fn dry_run(state: &AppState, request: &RunRequest) -> Result<serde_json::Value, ApiError> {
    let prepared = {
        let mut conn = state.store.pool().acquire().await?;
        state.launcher.prepare_stored(&mut conn, request).await?
    };
    let registry = skilleval::strategy::StrategyRegistry::builtin().build();
    let mut counts = CallCounts::default();
    let mut chunks = prepared.plan.chunks(0, usize::MAX);
    while let Some(chunk) = chunks.recv().await {
        let jobs = chunk.map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
        counts.add(&jobs, &registry);
    }
    let last_run = match state.store.latest_completed_run(request.version_id).await? {
        Some(run) => Some(run),
        None => state
            .store
            .previous_run(request.version_id, false)
            .await?
            .map(|(_, run)| run),
    };
    let measured = match last_run {
        Some(run_id) => {
            let results = load_results(&state.store, run_id).await?;
            let version = state.store.get_run(run_id).await?.map(|r| r.version);
            let source = match version {
                Some(v) => format!("run {run_id} of version {v}"),
                None => format!("run {run_id}"),
            };
            Measured::from_results(source, &results)
        }
        None => None,
    };
    // The service runs each case once, with the skill, and no trigger evals yet.
    let shape = Shape {
        repeats: 1,
        baseline: false,
        trigger_queries: 0,
        trigger_runs: 0,
    };
    let f = forecast(&counts, shape, measured.as_ref())
        .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let mut doc = json!(f);
    doc["dry_run"] = json!(true);
    doc["version_id"] = json!(request.version_id);
    doc["measured"] = json!(measured);
    Ok(doc)
}

/// Budget caps are well-formed JSON of the right type but may break their range: that is a
/// 422 (the request is understood, its values are not acceptable), naming field and rule like
/// every other field error.
fn check_budget(max_cost_usd: Option<f64>, max_tokens: Option<i64>) -> Result<(), ApiError> {
    let invalid = |field: &str, rule: &str| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_budget",
            format!("`{field}`: {rule}"),
        )
        .with_details(json!({ "field": field, "rule": rule }))
    };
    // NaN fails this too (JSON cannot carry one, but the rule should not depend on that).
    if max_cost_usd.is_some_and(|max| !(max > 0.0 && max.is_finite())) {
        return Err(invalid("/max_cost_usd", "must be a number greater than 0"));
    }
    if max_tokens.is_some_and(|max| max < 1) {
        return Err(invalid("/max_tokens", "must be an integer of at least 1"));
    }
    Ok(())
}

/// `GET /v1/runs/{id}`.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn get_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<RunView>, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", run_id))?;
    Ok(Json(RunView::from_row(&run)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsQuery {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub limit: Option<i64>,
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `GET /v1/runs/{id}/results`: keyset pagination on the case order; `next_cursor` is opaque.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn results(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ResultsQuery>,
) -> Result<Json<ResultPage>, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let status = match &query.status {
        None => None,
        Some(status) => Some(CaseStatus::parse(status).ok_or_else(|| {
            ApiError::invalid_field(
                "invalid_query",
                "status",
                "must be one of queued, passed, failed, errored, skipped",
            )
        })?),
    };
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid_field(
            "invalid_query",
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    let after = match &query.cursor {
        None => -1,
        Some(c) => c.parse::<i32>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::invalid_field(
                "invalid_query",
                "cursor",
                "must be a `next_cursor` value from a previous page",
            )
        })?,
    };
    let Some(run) = state.store.get_run(run_id).await? else {
        return Err(ApiError::not_found("run", run_id));
    };
    // One more than asked: whether there is a next page.
    let wanted = usize::try_from(limit).unwrap_or(1) + 1;
    let mut rows = if status == Some(CaseStatus::Queued) {
        Vec::new()
    } else {
        state
            .store
            .list_results(run_id, status, after, limit + 1)
            .await?
    };
    // Cases with no outcome yet have no row: they are listed from the run's plan.
    if matches!(status, None | Some(CaseStatus::Queued))
        && run.counters.completed < run.counters.total
    {
        let pending = state.launcher.pending_after(run_id, after, wanted).await?;
        rows.extend(pending.iter().map(pending_row));
        rows.sort_by_key(|r| r.case_index);
        rows.truncate(wanted);
    }
    let more = rows.len() > wanted - 1;
    let mut results: Vec<ResultView> = rows
        .into_iter()
        .take(wanted - 1)
        .map(ResultView::from_row)
        .collect();
    let next_cursor = if more {
        results.last().map(|r| r.case_index.to_string())
    } else {
        None
    };
    results.shrink_to_fit();
    Ok(Json(ResultPage {
        results,
        next_cursor,
    }))
}

/// A planned case without an outcome, as a results row.
fn pending_row(r: &JobResult) -> ResultRow {
    ResultRow {
        case_index: i32::try_from(r.case_index).unwrap_or(i32::MAX),
        test_case_id: r.test_case_id.clone(),
        name: r.name.clone(),
        status: CaseStatus::Queued,
        strategy: r.strategy.clone(),
        result: None,
        details: None,
        finished_at: None,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportQuery {
    #[serde(default)]
    pub format: Option<String>,
}

/// `GET /v1/runs/{id}/report?format=markdown|json`.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn report(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<ReportQuery>,
) -> Result<Response, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let format: ReportFormat = query
        .format
        .as_deref()
        .unwrap_or("markdown")
        .parse()
        .map_err(|e: String| ApiError::invalid_field("invalid_query", "format", e))?;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", run_id))?;
    let Some(summary) = run
        .finalised
        .then(|| stored_summary(run.summary.as_ref()))
        .flatten()
    else {
        return Err(ApiError::conflict(
            "run_not_finished",
            format!(
                "run {run_id} has not finished ({} of {} cases done)",
                run.counters.completed, run.counters.total
            ),
        )
        .with_details(json!({ "status": run.status })));
    };
    let results = load_results(&state.store, run_id).await?;
    let ctx = ReportContext {
        run_id,
        skill_name: &run.skill,
        skill_description: &run.description,
        version: Some(&run.version),
        profile: &run.profile,
        package_hash: &run.package_hash,
        created_at: run.created_at,
        results: &results,
        summary: &summary,
    };
    let body = render(&ctx, format);
    let content_type = match format {
        ReportFormat::Markdown => "text/markdown; charset=utf-8",
        ReportFormat::Json => "application/json",
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// `POST /v1/runs/{id}/cancel`: the run stops; its cases never recorded are written off as
/// `skipped`; workers skip the run's remaining jobs.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CancelResponse>), ApiError> {
    let run_id = parse_uuid("id", &id)?;
    match state.store.cancel(run_id).await {
        Ok(()) => {}
        Err(TransitionError::NotFound(_)) => return Err(ApiError::not_found("run", run_id)),
        Err(TransitionError::Illegal { state: run, .. }) => {
            return Err(ApiError::conflict(
                "run_finished",
                format!("run {run_id} has already finished ({})", run.status),
            )
            .with_details(json!({ "status": run.status })))
        }
        Err(TransitionError::Store(e)) => return Err(ApiError::internal(e)),
    }
    let skipped = state.launcher.write_off(run_id).await?;
    // With nothing in flight the run is complete now; finalise without waiting for the sweep.
    if let Err(e) = state.aggregator.finalise(run_id).await {
        tracing::warn!(%run_id, error = ?e, "finalising the cancelled run failed; the sweep retries");
    }
    Ok((
        StatusCode::ACCEPTED,
        Json(CancelResponse {
            run_id,
            status: "cancelled",
            skipped,
        }),
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RescoreBody {
    /// The version whose definition grades the outputs (default: the source run's).
    #[serde(default)]
    pub version_id: Option<uuid::Uuid>,
    /// Answer the case count and the estimated judge cost, creating nothing.
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub max_cost_usd: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub callback_url: Option<String>,
}

/// `POST /v1/runs/{id}/rescore`: a `rescore` run grading the completed run's stored outputs
/// against a version's definition (the `given` runner carries each output: nothing is
/// produced again; judges are called only where the definition's strategies need them). The
/// source run is not changed.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn rescore(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RescoreBody>,
) -> Result<Response, ApiError> {
    let source_id = parse_uuid("id", &id)?;
    if let Some(url) = &body.callback_url {
        check_callback_url("/callback_url", url)?;
    }
    check_budget(body.max_cost_usd, body.max_tokens)?;
    let source = state
        .store
        .get_run(source_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", source_id))?;
    if source.status != RunStatus::Completed {
        return Err(ApiError::conflict(
            "run_not_completed",
            format!("run {source_id} is {}, not completed", source.status),
        )
        .with_details(json!({ "field": "id", "rule": "only a completed run's outputs can be rescored", "status": source.status })));
    }
    let version_id = body.version_id.unwrap_or(source.version_id);
    let target = {
        let mut conn = state.store.pool().acquire().await?;
        state.store.version_for_run(&mut conn, version_id).await?
    }
    .ok_or_else(|| ApiError::not_found("version", version_id))?;
    if target.skill_name != source.skill {
        let rule = format!(
            "must be a version of `{}`, the run's skill (it is one of `{}`)",
            source.skill, target.skill_name
        );
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("`/version_id`: {rule}"),
        )
        .with_details(json!({ "field": "/version_id", "rule": rule })));
    }
    let request = RunRequest {
        version_id,
        runner: None,
        filter: CaseFilter::default(),
        callback_url: body.callback_url,
        idempotency_key: None,
        kind: RunKind::Rescore,
        max_cost_usd: body.max_cost_usd,
        max_tokens: body.max_tokens,
        gate: None,
        rescore_of: Some(source_id),
    };
    if body.dry_run {
        let prepared = {
            let mut conn = state.store.pool().acquire().await?;
            state.launcher.prepare_stored(&mut conn, &request).await?
        };
        let registry = skilleval::strategy::StrategyRegistry::builtin().build();
        let mut counts = CallCounts::default();
        let mut chunks = prepared.plan.chunks(0, usize::MAX);
        while let Some(chunk) = chunks.recv().await {
            let jobs = chunk.map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
            counts.add(&jobs, &registry);
        }
        // Priced from what judging cost in the source run, per case a model graded there.
        let results = load_results(&state.store, source_id).await?;
        let judged: Vec<f64> = results
            .iter()
            .filter(|r| r.grade_usage.input_tokens + r.grade_usage.output_tokens > 0)
            .map(|r| r.grade_usage.cost_usd)
            .collect();
        let per_case =
            (!judged.is_empty()).then(|| judged.iter().sum::<f64>() / judged.len() as f64);
        return Ok(Json(json!({
            "dry_run": true,
            "source_run": source_id,
            "version_id": request.version_id,
            "cases": counts.cases,
            "judge_calls": counts.judged,
            "generation_calls": 0,
            "estimated_judge_cost_usd": per_case.map(|c| c * counts.judged as f64),
        }))
        .into_response());
    }
    let inserted = state.launcher.create(&request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(CreateRunResponse {
            run_id: inserted.run_id(),
            created: matches!(inserted, RunInsert::Created(_)),
        }),
    )
        .into_response())
}
