//! `/v1/runs`: create (idempotent by key), read, list results, report, cancel.

use crate::db::{ResultRow, RunInsert};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use skilleval_analysis::forecast::{forecast, CallCounts, Measured, Shape};
use skilleval_execution::plan::CaseFilter;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::runner::trigger::is_trigger_result;
use skilleval_execution::variant::{Configuration, Variant};
use skilleval_infra::store::lifecycle::{RunKind, RunStatus, TransitionError};
use skilleval_model::definition::RunnerSpec;
use skilleval_model::gate::GateSpec;
use skilleval_model::package::RiskReport;
use skilleval_reports::{render_with, ReportContext, ReportFormat};

use crate::aggregate::variant_extras;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson, ApiQuery};
use crate::results::{load_results, stored_gate, stored_summary};
use crate::routes::fields::{check_callback_url, check_repeats, check_trigger_runs, trigger_plan};
use crate::runs::plan::RunRequest;
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
    /// Also run each case without the skill (the runner leaves it out) and report the uplift.
    #[serde(default)]
    pub baseline: bool,
    /// Attempts per case (pass@k, pass^k, flaky cases); 1 to
    /// [`MAX_REPEATS`](super::fields::MAX_REPEATS). Signed so that a negative value reaches
    /// the range check and its message, not a type error.
    #[serde(default)]
    pub repeats: Option<i64>,
    /// Also run the package's trigger evals (precision, recall, F1 of selecting the skill).
    #[serde(default)]
    pub triggers: bool,
    /// Runs per trigger query (1 to [`MAX_TRIGGER_RUNS`](super::fields::MAX_TRIGGER_RUNS);
    /// default 3); implies `triggers`.
    #[serde(default)]
    pub trigger_runs: Option<i64>,
}

/// The trigger eval queries of a stored version's package (opened from its stored ZIP).
async fn stored_triggers(
    state: &AppState,
    version_id: uuid::Uuid,
) -> Result<Vec<skilleval_model::package::TriggerCase>, ApiError> {
    let version = {
        let mut conn = state.store.pool().acquire().await?;
        state.store.version_for_run(&mut conn, version_id).await?
    }
    .ok_or_else(|| ApiError::not_found("version", version_id))?;
    let bytes = state
        .store
        .package_bytes(&version.package_hash)
        .await?
        .ok_or_else(|| ApiError::not_found("version", version_id))?;
    let limits = state.limits.clone();
    let package = tokio::task::spawn_blocking(move || {
        skilleval_model::package::Package::from_zip_bytes_streamed(&bytes, &limits)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?
    .map_err(|e| ApiError::internal(anyhow::anyhow!("the stored package does not open: {e}")))?;
    Ok(package.triggers)
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
    Extension(principal): Extension<Principal>,
    ApiQuery(query): ApiQuery<CreateRunQuery>,
    ApiJson(body): ApiJson<CreateRunBody>,
) -> Result<Response, ApiError> {
    if let Some(url) = &body.callback_url {
        check_callback_url("/callback_url", url)?;
    }
    check_idempotency_key("/idempotency_key", body.idempotency_key.as_deref())?;
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
    // Another publisher's version is not found (filtered on the publisher in SQL).
    if !state
        .store
        .visible_version(principal.viewer(), body.version_id)
        .await?
    {
        return Err(ApiError::not_found("version", body.version_id));
    }
    let repeats = check_repeats("/repeats", body.repeats)?;
    let trigger_runs = check_trigger_runs("/trigger_runs", body.trigger_runs)?;
    let triggers = if body.triggers || body.trigger_runs.is_some() {
        let queries = stored_triggers(&state, body.version_id).await?;
        Some(trigger_plan("/triggers", trigger_runs, queries)?)
    } else {
        None
    };
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
        baseline: body.baseline,
        repeats,
        triggers,
        definition: None,
        token_id: principal.token_id,
    };
    if query.dry_run {
        return Ok(Json(dry_run(&state, &request).await?).into_response());
    }
    let cases = state.store.version_cases(request.version_id).await?;
    let slot = crate::access::reserve_run(&state, &principal, cases).await?;
    let inserted = state.publisher.create(&request).await?;
    drop(slot);
    Ok((
        StatusCode::ACCEPTED,
        Json(CreateRunResponse {
            run_id: inserted.run_id(),
            created: matches!(inserted, RunInsert::Created(_)),
        }),
    )
        .into_response())
}

/// An idempotency key's rule (runs and matrices): 1 to 200 bytes.
pub(crate) fn check_idempotency_key(field: &str, key: Option<&str>) -> Result<(), ApiError> {
    match key {
        Some(key) if key.is_empty() || key.len() > 200 => Err(ApiError::invalid_field(
            "invalid_body",
            field,
            "must be 1 to 200 characters",
        )),
        _ => Ok(()),
    }
}

/// What the run would cost and could detect: its jobs planned (filter and runner applied)
/// and counted a chunk at a time, priced and powered from the skill's last completed run
/// (this version's, else the previous version's), as `skilleval plan` does locally.
pub(crate) async fn dry_run(
    state: &AppState,
    request: &RunRequest,
) -> Result<serde_json::Value, ApiError> {
    let prepared = {
        let mut conn = state.store.pool().acquire().await?;
        state.planner.prepare_stored(&mut conn, request).await?
    };
    let registry = skilleval_grading::StrategyRegistry::builtin().build();
    let mut counts = CallCounts::default();
    let mut chunks = prepared.plan.chunks(0, usize::MAX);
    while let Some(chunk) = chunks.recv().await {
        let jobs = chunk.map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
        // The cases once each: the shape below multiplies them by the repeats and baseline
        // (and adds the trigger queries), as `skilleval plan` does.
        let primary: Vec<skilleval_execution::plan::Job> = jobs
            .into_iter()
            .filter(|j| Variant::of(&j.runner).is_primary())
            .collect();
        counts.add(&primary, &registry);
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
    let shape = Shape {
        repeats: request.repeats.max(1),
        baseline: request.baseline,
        trigger_queries: request
            .triggers
            .as_ref()
            .map_or(0, |t| t.queries.len() as u64),
        trigger_runs: request.triggers.as_ref().map_or(0, |t| t.runs_per_query),
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
        None => (-1, Variant::PRIMARY),
        Some(c) => parse_cursor(c).ok_or_else(|| {
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
        let pending = state.planner.pending_after(run_id, after, wanted).await?;
        rows.extend(pending.iter().map(pending_row));
        rows.sort_by_key(|r| (r.case_index, r.variant));
        rows.truncate(wanted);
    }
    let more = rows.len() > wanted - 1;
    rows.truncate(wanted - 1);
    let next_cursor = if more {
        rows.last().map(|r| cursor_of(r.case_index, r.variant))
    } else {
        None
    };
    let mut results: Vec<ResultView> = rows.into_iter().map(ResultView::from_row).collect();
    results.shrink_to_fit();
    Ok(Json(ResultPage {
        results,
        next_cursor,
    }))
}

/// A page's cursor: the last row's key, `<case index>` for a case's primary attempt (what
/// every row of a run without baseline or repeats is), else
/// `<case index>:<configuration>:<attempt>`.
fn cursor_of(case_index: i32, variant: Variant) -> String {
    if variant.is_primary() {
        case_index.to_string()
    } else {
        format!(
            "{case_index}:{}:{}",
            variant.configuration.as_str(),
            variant.run_number
        )
    }
}

/// The key a cursor of [`cursor_of`] names.
fn parse_cursor(cursor: &str) -> Option<(i32, Variant)> {
    let mut parts = cursor.split(':');
    let index = parts.next()?.parse::<i32>().ok().filter(|n| *n >= 0)?;
    let variant = match (parts.next(), parts.next(), parts.next()) {
        (None, _, _) => Variant::PRIMARY,
        (Some(configuration), Some(n), None) => Variant {
            configuration: Configuration::parse(configuration)?,
            run_number: n.parse::<u32>().ok().filter(|n| *n >= 1)?,
        },
        _ => return None,
    };
    Some((index, variant))
}

/// A planned case without an outcome, as a results row.
fn pending_row(r: &JobResult) -> ResultRow {
    ResultRow {
        variant: r.variant,
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

/// `GET /v1/runs/{id}/report?format=markdown|json|html`.
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
        return Err(ApiError::run_not_finished(&run, ""));
    };
    let all = load_results(&state.store, run_id).await?;
    // The run proper is its with-skill attempts; a baseline and repeats add their sections.
    let triggers = if all.iter().any(is_trigger_result) {
        state.planner.plan_of(run_id).await?.triggers().cloned()
    } else {
        None
    };
    let mut extras = variant_extras(&all, &run, triggers.as_ref());
    extras.regression_gate = stored_gate(run.summary.as_ref());
    let results = skilleval_analysis::benchmark::with_skill(&all);
    // A version stored before risk reports existed has none; an unreadable one is left out.
    let risk: Option<RiskReport> = run
        .risk_report
        .clone()
        .and_then(|v| serde_json::from_value(v).ok());
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
        risk: risk.as_ref(),
    };
    let body = render_with(&ctx, format, &extras);
    let content_type = match format {
        ReportFormat::Markdown => "text/markdown; charset=utf-8",
        ReportFormat::Json => "application/json",
        ReportFormat::Html => "text/html; charset=utf-8",
    };
    Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// Cancels a live run: the transition, the write-off of its queued jobs (how many were
/// skipped), and its finalisation at once, since nothing is in flight any more (a failure there
/// is left to the sweep). The inner `Err` says why the run could not be cancelled.
pub(crate) async fn cancel_run(
    state: &AppState,
    run_id: uuid::Uuid,
) -> Result<Result<i64, TransitionError>, ApiError> {
    if let Err(e) = state.store.cancel(run_id).await {
        return Ok(Err(e));
    }
    let skipped = state.sweeper.write_off(run_id).await?;
    if let Err(e) = state.aggregator.finalise(run_id).await {
        tracing::warn!(%run_id, error = ?e, "finalising the cancelled run failed; the sweep retries");
    }
    Ok(Ok(skipped))
}

/// `POST /v1/runs/{id}/cancel`: the run stops; its cases never recorded are written off as
/// `skipped`; workers skip the run's remaining jobs.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CancelResponse>), ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let skipped = match cancel_run(&state, run_id).await? {
        Ok(skipped) => skipped,
        Err(TransitionError::NotFound(_)) => return Err(ApiError::not_found("run", run_id)),
        Err(TransitionError::Illegal { state: run, .. }) => {
            return Err(ApiError::conflict(
                "run_finished",
                format!("run {run_id} has already finished ({})", run.status),
            )
            .with_details(json!({ "status": run.status })))
        }
        Err(TransitionError::Store(e)) => return Err(ApiError::internal(e)),
    };
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
    /// A definition given inline instead (the `eval/tests.json` shape), validated like an
    /// upload's; the source run's package supplies everything else.
    #[serde(default)]
    pub eval_config: Option<serde_json::Value>,
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
    Extension(principal): Extension<Principal>,
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
    if body.version_id.is_some() && body.eval_config.is_some() {
        let rule = "give `version_id` or `eval_config`, not both";
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("`/eval_config`: {rule}"),
        )
        .with_details(json!({ "field": "/eval_config", "rule": rule })));
    }
    let definition = match &body.eval_config {
        Some(config) => Some(std::sync::Arc::new(
            crate::routes::validation::inline_definition(&state, &source.package_hash, config)
                .await?,
        )),
        None => None,
    };
    let version_id = body.version_id.unwrap_or(source.version_id);
    if !state
        .store
        .visible_version(principal.viewer(), version_id)
        .await?
    {
        return Err(ApiError::not_found("version", version_id));
    }
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
        // A rescore grades the recorded outputs once: no new attempts, no baseline.
        baseline: false,
        repeats: 1,
        triggers: None,
        definition,
        token_id: principal.token_id,
    };
    if body.dry_run {
        let prepared = {
            let mut conn = state.store.pool().acquire().await?;
            state.planner.prepare_stored(&mut conn, &request).await?
        };
        let registry = skilleval_grading::StrategyRegistry::builtin().build();
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
    let cases = state.store.version_cases(version_id).await?;
    let slot = crate::access::reserve_run(&state, &principal, cases).await?;
    let inserted = state.publisher.create(&request).await?;
    drop(slot);
    Ok((
        StatusCode::ACCEPTED,
        Json(CreateRunResponse {
            run_id: inserted.run_id(),
            created: matches!(inserted, RunInsert::Created(_)),
        }),
    )
        .into_response())
}
