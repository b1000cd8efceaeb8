//! `/v1/matrix`: a model matrix (issue 33). Each chosen skill's latest passing version runs
//! against each model (a named provider of the workers) as an ordinary manual run whose
//! runner is the version's own with the provider replaced; the matrix shows every cell's
//! verdict and pass rate beside the paired comparison with the version's reference run (its
//! latest completed run outside every matrix), computed by the same code as
//! `POST /v1/comparisons`.
//!
//! Cost is estimated before anything is created (every cell's run forecast as `POST /v1/runs?
//! dry_run=true` forecasts one, from the reference run's spend) and bounded by `budget`: an
//! estimate over it is refused, and each cell's run carries an equal share of it as its own
//! budget, so the runs stop themselves if the estimate was low.
//!
//! Creation is all or nothing on the quotas and resumable: every cell's run is counted
//! against the run quotas (`concurrent_runs`, `spend_usd_per_day`, `cases_per_day`) at once
//! before anything is stored, so a refusal creates nothing; then the matrix is stored
//! `creating` with its plan, each cell's run is created with an idempotency key derived from
//! the matrix and the cell's position, and the matrix becomes `created` once every cell is
//! linked. A replay with the same `idempotency_key` (per publisher) answers the same matrix
//! (`created: false`) and, when its creation stopped half-way, creates the missing cells: the
//! runs' keys make re-driving never run a cell twice.

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skilleval_analysis::stats::proportion::wilson_interval;
use skilleval_execution::variant::Configuration;
use skilleval_infra::store::lifecycle::{RunKind, RunStatus};
use skilleval_infra::store::matrix::{
    MatrixInsert, MatrixScope, MatrixStatus, NewCell, NewMatrix, StoredCell, StoredMatrix,
};
use skilleval_infra::store::runs::{RunInsert, RunRow};
use skilleval_model::definition::{RunnerConfig, RunnerSpec};
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson, ApiQuery};
use crate::results::load_results;
use crate::routes::runs::{check_idempotency_key, dry_run, CreateRunQuery};
use crate::runs::plan::RunRequest;
use crate::state::AppState;

/// The most skills and models one matrix may name, and the most cells it may have.
const MAX_SKILLS: usize = 50;
const MAX_MODELS: usize = 10;
const MAX_CELLS: usize = 200;

/// A model of the matrix: the name of a provider the workers are configured with
/// (docs/providers.md), or `{"provider": name}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ModelSpec {
    Name(String),
    Detailed(ModelDetail),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelDetail {
    pub provider: String,
}

impl ModelSpec {
    fn provider(&self) -> &str {
        match self {
            ModelSpec::Name(name) => name,
            ModelSpec::Detailed(d) => &d.provider,
        }
    }
}

/// The matrix's cost bound, checked against the estimate before it starts and split equally
/// over its runs as their budgets.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateMatrixBody {
    /// Skills by name; or, instead, `publisher`: every skill of that publisher.
    #[serde(default)]
    pub skills: Option<Vec<String>>,
    #[serde(default)]
    pub publisher: Option<String>,
    pub models: Vec<ModelSpec>,
    /// Which version of each skill: `"latest"` (its newest version whose reference run
    /// passed), the only choice today.
    #[serde(default)]
    pub versions: Option<String>,
    #[serde(default)]
    pub budget: Option<MatrixBudget>,
    /// The same key (per publisher) always answers the same matrix and never creates a
    /// second one; a replay completes a matrix whose creation stopped half-way.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// A skill a matrix leaves out (publisher scope only; named skills are refused instead).
#[derive(Debug, Serialize)]
struct Skipped {
    skill: String,
    reason: String,
}

/// One planned cell: everything its run is created from, kept with the matrix (`plan`) so
/// that a stopped creation is completed exactly as it was planned.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PlannedCell {
    skill: String,
    version: String,
    version_id: Uuid,
    reference_run: Uuid,
    model: String,
    runner: RunnerConfig,
    baseline: bool,
    repeats: u32,
    max_cost_usd: Option<f64>,
    max_tokens: Option<i64>,
    token_id: Option<Uuid>,
}

impl PlannedCell {
    /// The cell's run request; `key` is its idempotency key once the matrix exists.
    fn request(&self, key: Option<String>) -> RunRequest {
        RunRequest {
            runner: Some(RunnerSpec::Detailed(self.runner.clone())),
            baseline: self.baseline,
            repeats: self.repeats,
            max_cost_usd: self.max_cost_usd,
            max_tokens: self.max_tokens,
            token_id: self.token_id,
            idempotency_key: key,
            ..RunRequest::all_cases(self.version_id, RunKind::Manual)
        }
    }
}

/// The idempotency key of the run of the matrix's cell at `position`: re-driving a matrix's
/// creation finds the run instead of creating a second one.
fn cell_run_key(matrix_id: Uuid, position: usize) -> String {
    format!("matrix:{matrix_id}:{position}")
}

fn invalid(field: &str, rule: impl Into<String>) -> ApiError {
    ApiError::invalid_field("invalid_matrix", field, rule)
}

fn check_provider_name(field: &str, name: &str) -> Result<(), ApiError> {
    if crate::routes::fields::is_plain_name(name, 64) {
        Ok(())
    } else {
        Err(invalid(
            field,
            "must name a configured provider: 1 to 64 letters, digits, `-`, `_` or `.`",
        ))
    }
}

fn check_budget(budget: &MatrixBudget) -> Result<(), ApiError> {
    if budget
        .max_cost_usd
        .is_some_and(|m| !(m > 0.0 && m.is_finite()))
    {
        return Err(invalid(
            "/budget/max_cost_usd",
            "must be a number greater than 0",
        ));
    }
    if budget.max_tokens.is_some_and(|m| m < 1) {
        return Err(invalid(
            "/budget/max_tokens",
            "must be an integer of at least 1",
        ));
    }
    Ok(())
}

/// The runner a cell's run uses: the version's own (its definition's `settings.runner`, else
/// `llm`) producing with `provider`. Only model-producing runners can change model.
fn cell_runner(reference: &RunRow, provider: &str) -> Result<RunnerConfig, String> {
    let own = reference
        .settings
        .get("runner")
        .cloned()
        .and_then(|v| serde_json::from_value::<RunnerSpec>(v).ok())
        .map_or_else(
            || RunnerConfig {
                kind: "llm".into(),
                ..RunnerConfig::default()
            },
            |spec| spec.config(),
        );
    if !matches!(own.kind.as_str(), "llm" | "agent") {
        return Err(format!(
            "its runner `{}` produces no model output; a matrix needs an `llm` or `agent` runner",
            own.kind
        ));
    }
    Ok(RunnerConfig {
        provider: Some(provider.to_string()),
        ..own
    })
}

/// `POST /v1/matrix` (`?dry_run=true`: the estimate, nothing created).
#[tracing::instrument(skip_all)]
pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(query): ApiQuery<CreateRunQuery>,
    ApiJson(body): ApiJson<CreateMatrixBody>,
) -> Result<Response, ApiError> {
    if let Some(v) = &body.versions {
        if v != "latest" {
            return Err(invalid("/versions", "must be `latest`"));
        }
    }
    let scope = match (&body.skills, &body.publisher) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "/publisher",
                "give `skills` or `publisher`, not both",
            ))
        }
        (None, None) => return Err(invalid("/skills", "give `skills` or `publisher`")),
        (Some(names), None) => {
            if names.is_empty() || names.len() > MAX_SKILLS {
                return Err(invalid(
                    "/skills",
                    format!("must list 1 to {MAX_SKILLS} skills"),
                ));
            }
            for (i, name) in names.iter().enumerate() {
                if names[..i].contains(name) {
                    return Err(invalid(&format!("/skills/{i}"), "names a skill twice"));
                }
            }
            MatrixScope::Named(names)
        }
        (None, Some(publisher)) => MatrixScope::Publisher(publisher),
    };
    if body.models.is_empty() || body.models.len() > MAX_MODELS {
        return Err(invalid(
            "/models",
            format!("must list 1 to {MAX_MODELS} models"),
        ));
    }
    let mut providers: Vec<String> = Vec::new();
    for (i, model) in body.models.iter().enumerate() {
        let field = format!("/models/{i}");
        check_provider_name(&field, model.provider())?;
        if providers.iter().any(|p| p == model.provider()) {
            return Err(invalid(&field, "names a model twice"));
        }
        providers.push(model.provider().to_string());
    }
    let budget = body.budget.clone().unwrap_or_default();
    check_budget(&budget)?;
    let key = body.idempotency_key.as_deref();
    check_idempotency_key("/idempotency_key", key)?;
    // A replay: the matrix this key created, completed if its creation stopped half-way.
    if let (Some(key), false) = (key, query.dry_run) {
        if let Some(id) = state
            .store
            .matrix_by_key(principal.publisher_id, key)
            .await?
        {
            return resume(&state, &principal, id).await;
        }
    }

    // Only the caller's skills (an admin's: anyone's); another publisher's is not found.
    let found = state.store.matrix_skills(principal.viewer(), scope).await?;
    let mut skipped = Vec::new();
    let mut chosen = Vec::new();
    match scope {
        MatrixScope::Named(names) => {
            for (i, name) in names.iter().enumerate() {
                let Some(skill) = found.iter().find(|s| &s.name == name) else {
                    return Err(ApiError::not_found("skill", name));
                };
                let Some(passing) = &skill.passing else {
                    return Err(ApiError::invalid_field(
                        "no_passing_version",
                        &format!("/skills/{i}"),
                        format!("skill `{name}` has no version whose run passed"),
                    ));
                };
                chosen.push((i, skill.name.clone(), passing.clone()));
            }
        }
        MatrixScope::Publisher(publisher) => {
            if found.is_empty() {
                return Err(ApiError::not_found("publisher", publisher));
            }
            for skill in &found {
                match &skill.passing {
                    Some(p) => chosen.push((chosen.len(), skill.name.clone(), p.clone())),
                    None => skipped.push(Skipped {
                        skill: skill.name.clone(),
                        reason: "no version whose run passed".into(),
                    }),
                }
            }
        }
    }

    let cells_wanted = chosen.len() * providers.len();
    if cells_wanted > MAX_CELLS {
        return Err(invalid(
            "/models",
            format!("{cells_wanted} cells: a matrix may have at most {MAX_CELLS}"),
        ));
    }
    let share = |total: Option<f64>| total.map(|t| t / cells_wanted.max(1) as f64);
    let token_share = budget
        .max_tokens
        .map(|t| (t / cells_wanted.max(1) as i64).max(1));

    let mut planned = Vec::new();
    for (i, name, passing) in chosen {
        let reference = state
            .store
            .get_run(passing.reference_run)
            .await?
            .ok_or_else(|| ApiError::not_found("run", passing.reference_run))?;
        // Baselines and repeats as the reference run had them, so the two pair case by case.
        let results = load_results(&state.store, reference.id).await?;
        let baseline = results
            .iter()
            .any(|r| r.variant.configuration == Configuration::WithoutSkill);
        let repeats = results
            .iter()
            .map(|r| r.variant.run_number)
            .max()
            .unwrap_or(1)
            .max(1);
        for provider in &providers {
            let runner = match cell_runner(&reference, provider) {
                Ok(r) => r,
                Err(why) => match scope {
                    MatrixScope::Named(_) => {
                        return Err(ApiError::invalid_field(
                            "not_a_model_skill",
                            &format!("/skills/{i}"),
                            format!("skill `{name}`: {why}"),
                        ))
                    }
                    MatrixScope::Publisher(_) => {
                        skipped.push(Skipped {
                            skill: name.clone(),
                            reason: why,
                        });
                        break;
                    }
                },
            };
            planned.push(PlannedCell {
                skill: name.clone(),
                version: passing.version.clone(),
                version_id: passing.version_id,
                reference_run: reference.id,
                model: provider.clone(),
                runner,
                baseline,
                repeats,
                max_cost_usd: share(budget.max_cost_usd),
                max_tokens: token_share,
                token_id: principal.token_id,
            });
        }
    }
    if planned.is_empty() {
        return Err(invalid(
            "/publisher",
            "none of the publisher's skills has a passing version produced by a model",
        ));
    }

    // The estimate: every cell forecast as its own run would be.
    let mut cells_estimate = Vec::new();
    let (mut tokens, mut cost, mut known) = (0u64, 0.0f64, true);
    for cell in &planned {
        let forecast = dry_run(&state, &cell.request(None)).await?;
        let t = forecast["estimated_tokens"].as_u64();
        let c = forecast["estimated_cost_usd"].as_f64();
        match (t, c) {
            (Some(t), Some(c)) => {
                tokens += t;
                cost += c;
            }
            _ => known = false,
        }
        cells_estimate.push(json!({
            "skill": cell.skill,
            "version": cell.version,
            "model": cell.model,
            "cases": forecast["cases"],
            "attempts": forecast["attempts"],
            "model_calls": forecast["model_calls"],
            "estimated_tokens": t,
            "estimated_cost_usd": c,
        }));
    }
    let estimate = json!({
        "cells": cells_estimate,
        "estimated_tokens": known.then_some(tokens),
        "estimated_cost_usd": known.then_some(cost),
        "priced_from": "each skill's reference run: what its attempts spent, at the prices of the provider that produced it",
    });
    if known {
        if let Some(max) = budget.max_cost_usd {
            if cost > max {
                return Err(over_budget("/budget/max_cost_usd", &estimate, &json!(max)));
            }
        }
        if let Some(max) = budget.max_tokens {
            if tokens > u64::try_from(max).unwrap_or(0) {
                return Err(over_budget("/budget/max_tokens", &estimate, &json!(max)));
            }
        }
    }
    if query.dry_run {
        return Ok(Json(json!({
            "dry_run": true,
            "estimate": estimate,
            "budget": budget,
            "skipped": skipped,
        }))
        .into_response());
    }

    // Every cell's run counted against the run quotas at once: a refusal creates nothing.
    let positions: Vec<usize> = (0..planned.len()).collect();
    let slot = reserve_cells(&state, &principal, &planned, &positions, &[]).await?;
    let request = json!({
        "models": providers,
        "versions": "latest",
        "budget": budget,
        "skipped": skipped,
    });
    let plan = serde_json::to_value(&planned).map_err(ApiError::internal)?;
    let inserted = state
        .store
        .insert_matrix(&NewMatrix {
            id: Uuid::now_v7(),
            publisher_id: principal.publisher_id,
            request: &request,
            estimate: &estimate,
            plan: &plan,
            idempotency_key: key,
        })
        .await?;
    let matrix_id = match inserted {
        MatrixInsert::Created(id) => id,
        // A request with the same key stored its matrix first: that one is the answer.
        MatrixInsert::Existing(id) => {
            drop(slot);
            return resume(&state, &principal, id).await;
        }
    };
    create_cells(&state, matrix_id, &planned, &positions).await?;
    drop(slot);
    Ok(created_answer(
        matrix_id,
        planned.len(),
        &estimate,
        &json!(skipped),
        true,
    ))
}

/// The answer to a creation or a replay.
fn created_answer(
    matrix_id: Uuid,
    cells: usize,
    estimate: &Value,
    skipped: &Value,
    created: bool,
) -> Response {
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/v1/matrix/{matrix_id}"))],
        Json(json!({
            "matrix_id": matrix_id,
            "created": created,
            "cells": cells,
            "estimate": estimate,
            "skipped": skipped,
        })),
    )
        .into_response()
}

/// Counts the runs of the cells at `positions` against the run quotas, all at once; a cell
/// whose run already exists (its key in `existing`) is not counted again.
async fn reserve_cells(
    state: &AppState,
    principal: &Principal,
    planned: &[PlannedCell],
    positions: &[usize],
    existing: &[usize],
) -> Result<crate::access::RunSlot, ApiError> {
    let mut runs = 0i64;
    let mut cases = 0i64;
    for &position in positions.iter().filter(|p| !existing.contains(p)) {
        runs += 1;
        cases += state
            .store
            .version_cases(planned[position].version_id)
            .await?;
    }
    crate::access::reserve_runs(state, principal, runs, cases).await
}

/// Creates (or, by its key, finds) the run of each cell at `positions` and links it, then
/// marks the matrix `created`.
async fn create_cells(
    state: &AppState,
    matrix_id: Uuid,
    planned: &[PlannedCell],
    positions: &[usize],
) -> Result<(), ApiError> {
    for &position in positions {
        let cell = &planned[position];
        let inserted = state
            .publisher
            .create(&cell.request(Some(cell_run_key(matrix_id, position))))
            .await?;
        // A run found by the cell's key must be the one this cell planned (run keys are
        // global, so a run someone else made with it is refused, never linked).
        if let RunInsert::Existing(run_id) = inserted {
            let same = state
                .store
                .get_run(run_id)
                .await?
                .is_some_and(|r| r.version_id == cell.version_id);
            if !same {
                let rule = format!(
                    "the run key `{}` of matrix {matrix_id}'s cell {position} names only that \
                     cell's run, and a run of another version holds it",
                    cell_run_key(matrix_id, position)
                );
                return Err(ApiError::conflict(
                    "idempotency_conflict",
                    format!("`idempotency_key`: {rule}"),
                )
                .with_details(json!({ "field": "idempotency_key", "rule": rule })));
            }
        }
        state
            .store
            .insert_matrix_cell(
                matrix_id,
                &NewCell {
                    position: i32::try_from(position).unwrap_or(i32::MAX),
                    version_id: cell.version_id,
                    model: &cell.model,
                    run_id: inserted.run_id(),
                    reference_run: cell.reference_run,
                },
            )
            .await?;
    }
    state.store.finish_matrix_creation(matrix_id).await?;
    Ok(())
}

/// A replay of a matrix's creation: the stored matrix, its missing cells created first when
/// its creation stopped half-way (counted against the quotas like a new matrix's, except for
/// runs that exist already).
async fn resume(
    state: &AppState,
    principal: &Principal,
    matrix_id: Uuid,
) -> Result<Response, ApiError> {
    let matrix = state
        .store
        .get_matrix(matrix_id)
        .await?
        .ok_or_else(|| ApiError::not_found("matrix", matrix_id))?;
    let planned = stored_plan(&matrix)?;
    if matrix.status == MatrixStatus::Creating {
        let missing = missing_positions(&matrix, planned.len());
        let keys: Vec<String> = missing
            .iter()
            .map(|&p| cell_run_key(matrix_id, p))
            .collect();
        let used = state.store.used_run_keys(&keys).await?;
        let existing: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|&p| used.contains(&cell_run_key(matrix_id, p)))
            .collect();
        let slot = reserve_cells(state, principal, &planned, &missing, &existing).await?;
        create_cells(state, matrix_id, &planned, &missing).await?;
        drop(slot);
    }
    Ok(created_answer(
        matrix_id,
        planned.len().max(matrix.cells.len()),
        &matrix.estimate,
        &matrix.request["skipped"],
        false,
    ))
}

/// The planned positions of `matrix` (of `planned` cells) that have no linked run yet.
fn missing_positions(matrix: &StoredMatrix, planned: usize) -> Vec<usize> {
    (0..planned)
        .filter(|&p| {
            !matrix
                .cells
                .iter()
                .any(|c| usize::try_from(c.position).is_ok_and(|c| c == p))
        })
        .collect()
}

/// Completes the matrices whose creation stopped and that nobody replayed: `creating` for
/// longer than `after` (the coordinator that accepted them stopped mid-request; a matrix
/// created without an idempotency key has no other way back). Their missing cells are
/// created from the stored plan, each run found again by its key rather than made twice;
/// the quotas were checked for every cell when the matrix was accepted. The periodic sweep
/// calls it; returns how many matrices it completed.
pub async fn complete_stalled(
    state: &AppState,
    after: std::time::Duration,
) -> anyhow::Result<usize> {
    let stalled = state.store.stalled_matrices(after, 20).await?;
    let mut completed = 0;
    for matrix_id in stalled {
        let Some(matrix) = state.store.get_matrix(matrix_id).await? else {
            continue;
        };
        let planned =
            stored_plan(&matrix).map_err(|e| anyhow::anyhow!("matrix {matrix_id}: {e:?}"))?;
        let missing = missing_positions(&matrix, planned.len());
        create_cells(state, matrix_id, &planned, &missing)
            .await
            .map_err(|e| anyhow::anyhow!("completing matrix {matrix_id}: {e:?}"))?;
        completed += 1;
    }
    Ok(completed)
}

/// A stored matrix's planned cells; a matrix stored before plans were kept has its cells
/// (all of them: it is `created`) instead.
fn stored_plan(matrix: &StoredMatrix) -> Result<Vec<PlannedCell>, ApiError> {
    match &matrix.plan {
        Some(plan) => serde_json::from_value(plan.clone()).map_err(|e| {
            ApiError::internal(anyhow::anyhow!(
                "the stored plan of matrix {} does not read: {e}",
                matrix.id
            ))
        }),
        None => Ok(Vec::new()),
    }
}

fn over_budget(field: &str, estimate: &Value, limit: &Value) -> ApiError {
    let spent = if field.ends_with("max_tokens") {
        &estimate["estimated_tokens"]
    } else {
        &estimate["estimated_cost_usd"]
    };
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "over_budget",
        format!("`{field}`: the matrix is estimated at {spent}, over the budget of {limit}"),
    )
    .with_details(json!({
        "field": field,
        "rule": "the estimate must not exceed the budget",
        "limit": limit,
        "estimate": estimate,
    }))
}

/// Where a matrix is, as `GET /v1/matrix/{id}` says it: `creating` while some planned cells
/// have no run yet (a creation stopped half-way stays so until a replay with its
/// `idempotency_key` completes it), then `running` until every cell's run finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatrixProgress {
    Creating,
    Running,
    Completed,
}

impl MatrixProgress {
    fn of(status: MatrixStatus, runs_done: bool) -> MatrixProgress {
        match (status, runs_done) {
            (MatrixStatus::Creating, _) => MatrixProgress::Creating,
            (MatrixStatus::Created, false) => MatrixProgress::Running,
            (MatrixStatus::Created, true) => MatrixProgress::Completed,
        }
    }
}

/// The significant change a comparison found, as the matrix colours it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Worse,
    Better,
    NoChange,
}

impl Change {
    fn of(outcome: &str) -> Change {
        match outcome {
            "worse" => Change::Worse,
            "better" => Change::Better,
            _ => Change::NoChange,
        }
    }
}

/// One cell as `GET /v1/matrix/{id}` answers it.
#[derive(Debug, Serialize)]
pub struct CellView {
    pub skill: String,
    pub version: String,
    pub version_id: Uuid,
    pub model: String,
    pub run_id: Uuid,
    pub reference_run_id: Option<Uuid>,
    pub status: Option<RunStatus>,
    pub verdict: Option<String>,
    pub passed: u64,
    pub total: u64,
    pub pass_rate: Option<f64>,
    /// Wilson 95 % interval of the pass rate.
    pub pass_rate_interval: Option<[f64; 2]>,
    /// The paired comparison with the reference run, once the cell's run completed.
    pub change: Option<Change>,
    pub comparison: Option<Value>,
}

/// `GET /v1/matrix/{id}` as a value (also what the matrix page renders).
pub async fn matrix_view(state: &AppState, id: Uuid) -> Result<Option<Value>, ApiError> {
    let Some(matrix) = state.store.get_matrix(id).await? else {
        return Ok(None);
    };
    let mut cells = Vec::with_capacity(matrix.cells.len());
    for cell in &matrix.cells {
        cells.push(cell_view(state, cell).await?);
    }
    let runs_done = cells.iter().all(|c| {
        matches!(
            c.status,
            None | Some(RunStatus::Cancelled | RunStatus::Failed)
        ) || c.verdict.is_some()
    });
    let flagged: Vec<Value> = cells
        .iter()
        .filter(|c| matches!(c.change, Some(Change::Worse | Change::Better)))
        .map(|c| json!({"skill": c.skill, "model": c.model, "change": c.change}))
        .collect();
    Ok(Some(json!({
        "matrix_id": matrix.id,
        "created_at": matrix.created_at,
        "status": MatrixProgress::of(matrix.status, runs_done),
        "cells_planned": matrix
            .plan
            .as_ref()
            .and_then(Value::as_array)
            .map_or(cells.len(), Vec::len),
        "models": matrix.request["models"],
        "budget": matrix.request["budget"],
        "skipped": matrix.request["skipped"],
        "estimate": matrix.estimate,
        "cells": cells,
        "flagged": flagged,
    })))
}

async fn cell_view(state: &AppState, cell: &StoredCell) -> Result<CellView, ApiError> {
    let run = state.store.get_run(cell.run_id).await?;
    let (status, verdict) = match &run {
        Some(r) => (Some(r.status), r.verdict.clone()),
        None => (None, None),
    };
    // The summary's counts (every attempt) once finalised, else the counters so far.
    let (passed, total) = match &run {
        Some(r) => match &r.summary {
            Some(s) => (
                s["passed"].as_u64().unwrap_or(0),
                s["total"].as_u64().unwrap_or(0),
            ),
            None => (
                u64::try_from(r.counters.passed).unwrap_or(0),
                u64::try_from(r.counters.completed).unwrap_or(0),
            ),
        },
        None => (0, 0),
    };
    let interval = wilson_interval(passed, total, 0.95).ok();
    let mut view = CellView {
        skill: cell.skill.clone(),
        version: cell.version.clone(),
        version_id: cell.version_id,
        model: cell.model.clone(),
        run_id: cell.run_id,
        reference_run_id: cell.reference_run,
        status,
        verdict,
        passed,
        total,
        pass_rate: (total > 0).then(|| passed as f64 / total as f64),
        pass_rate_interval: interval.map(|i| [i.low, i.high]),
        change: None,
        comparison: None,
    };
    let completed = run
        .as_ref()
        .is_some_and(|r| r.status == RunStatus::Completed && r.finalised);
    if let (true, Some(reference)) = (completed, cell.reference_run) {
        if let Some(c) =
            crate::comparing::comparison_between(&state.store, reference, cell.run_id).await?
        {
            let outcome = c["outcome"].as_str().unwrap_or_default();
            view.change = Some(Change::of(outcome));
            view.comparison = Some(json!({
                "comparison_id": c["comparison_id"],
                "outcome": c["outcome"],
                "summary": c["summary"],
                "pass_rate": c["pass_rate"],
                "overall": c["overall"],
                "counts": c["counts"],
            }));
        }
    }
    Ok(view)
}

/// `GET /v1/matrix/{id}`.
#[tracing::instrument(skip_all, fields(matrix_id = %id))]
pub async fn get_matrix(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let matrix_id = parse_uuid("id", &id)?;
    matrix_view(&state, matrix_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("matrix", matrix_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_names_are_checked_by_shape() {
        assert!(check_provider_name("/models/0", "gpt-4o_mini.v2").is_ok());
        for bad in ["", "a b", "x/y", &"n".repeat(65)] {
            assert!(check_provider_name("/models/0", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn outcomes_become_changes() {
        assert_eq!(Change::of("worse"), Change::Worse);
        assert_eq!(Change::of("better"), Change::Better);
        assert_eq!(Change::of("no_detectable_difference"), Change::NoChange);
    }
}
