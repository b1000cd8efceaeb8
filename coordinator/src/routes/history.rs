//! A skill's history: `GET /v1/skills/{name}/history` (each version, newest first, with its
//! latest completed run and how it compares with the version before) and
//! `GET /v1/skills/{name}/benchmark` (the same versions in skill-creator's `benchmark.json`
//! shape). Both are keyset-paginated on (version creation time, version id).

use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use skilleval_analysis::benchmark::{
    benchmark_json, benchmark_runs, run_summary, BenchmarkMetadata,
};
use skilleval_infra::store::comparisons::HistoryRow;
use uuid::Uuid;

use crate::comparing::comparison_between;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::results::load_results;
use crate::state::AppState;

/// Versions per page when the request names no limit, and the most it may name.
const DEFAULT_PAGE: i64 = 20;
const MAX_PAGE: i64 = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    #[serde(default)]
    pub limit: Option<i64>,
    #[serde(default)]
    pub cursor: Option<String>,
}

/// Where a page starts: after the version created at this time with this id.
type Keyset = (DateTime<Utc>, Uuid);

/// The page's limit and keyset from the query.
fn page(query: &HistoryQuery) -> Result<(i64, Option<Keyset>), ApiError> {
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::invalid_field(
            "invalid_query",
            "limit",
            format!("must be between 1 and {MAX_PAGE}"),
        ));
    }
    let before = query
        .cursor
        .as_deref()
        .map(|c| {
            parse_cursor(c).ok_or_else(|| {
                ApiError::invalid_field(
                    "invalid_query",
                    "cursor",
                    "must be a `next_cursor` value from a previous page",
                )
            })
        })
        .transpose()?;
    Ok((limit, before))
}

/// `<microseconds since the epoch>.<version id>` of the last version of a page.
fn cursor_of(row: &HistoryRow) -> String {
    format!("{}.{}", row.created_at.timestamp_micros(), row.version_id)
}

fn parse_cursor(cursor: &str) -> Option<Keyset> {
    let (micros, id) = cursor.split_once('.')?;
    let at = DateTime::from_timestamp_micros(micros.parse().ok()?)?;
    Some((at, id.parse().ok()?))
}

/// A page of the skill's history (one more row than asked, to know whether another page
/// follows) and the next page's cursor.
async fn history_page(
    state: &AppState,
    name: &str,
    query: &HistoryQuery,
) -> Result<(Vec<HistoryRow>, Option<String>), ApiError> {
    let (limit, before) = page(query)?;
    let (_, mut rows) = state
        .store
        .history(name, before, limit + 1)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", name))?;
    let more = rows.len() > usize::try_from(limit).unwrap_or(usize::MAX);
    rows.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    let next = if more {
        rows.last().map(cursor_of)
    } else {
        None
    };
    Ok((rows, next))
}

/// The headline numbers of a stored summary.
fn summary_view(summary: Option<&Value>) -> Value {
    let Some(s) = summary else {
        return Value::Null;
    };
    let mut out = serde_json::Map::new();
    for key in [
        "total",
        "passed",
        "failed",
        "errored",
        "skipped",
        "pass_rate",
        "mean",
        "weighted_mean",
        "verdict",
        "verdict_reasons",
        "regression_gate",
        "collision_gate",
    ] {
        if let Some(v) = s.get(key) {
            out.insert(key.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// The comparison of a version's run with the previous version's, in a few fields.
fn comparison_view(previous_version: Uuid, c: &Value) -> Value {
    json!({
        "version_id": previous_version,
        "run_id": c["run_a"],
        "comparison_id": c["comparison_id"],
        "outcome": c["outcome"],
        "summary": c["summary"],
        "pass_rate_delta": c.pointer("/pass_rate/difference/mean"),
        "mean_score_delta": c.pointer("/overall/difference/mean"),
        "mcnemar_p": c.pointer("/pass_rate/mcnemar/p_two_sided"),
        "regressed_cases": c.pointer("/gate/regressed_cases"),
    })
}

/// `GET /v1/skills/{name}/history?limit=&cursor=`.
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn history(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    let (rows, next_cursor) = history_page(&state, &name, &query).await?;
    let mut versions = Vec::with_capacity(rows.len());
    for row in &rows {
        let previous = match &row.run {
            None => Value::Null,
            Some(run) => match state.store.previous_run(row.version_id, false).await? {
                None => Value::Null,
                Some((prev_version, prev_run)) => {
                    match comparison_between(&state.store, prev_run, run.run_id).await? {
                        Some(c) => comparison_view(prev_version, &c),
                        None => json!({
                            "version_id": prev_version,
                            "run_id": prev_run,
                            "outcome": "not_comparable",
                        }),
                    }
                }
            },
        };
        versions.push(json!({
            "version_id": row.version_id,
            "version": row.version,
            "description_hash": row.description_hash,
            "package_hash": row.package_hash,
            "created_at": row.created_at,
            "latest_run": row.run.as_ref().map(|run| json!({
                "run_id": run.run_id,
                "verdict": run.verdict,
                "finished_at": run.finished_at,
                "summary": summary_view(run.summary.as_ref()),
            })),
            "previous": previous,
        }));
    }
    Ok(Json(json!({
        "skill": name,
        "versions": versions,
        "next_cursor": next_cursor,
    })))
}

/// `GET /v1/skills/{name}/benchmark?limit=&cursor=`: per version with a completed run,
/// newest first, that run in skill-creator's `benchmark.json` shape (`with_skill` runs; a
/// `without_skill` configuration where a baseline ran).
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn benchmark(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> Result<Json<Value>, ApiError> {
    let (rows, next_cursor) = history_page(&state, &name, &query).await?;
    let mut versions = Vec::with_capacity(rows.len());
    for row in &rows {
        let Some(run) = &row.run else {
            continue;
        };
        let results = load_results(&state.store, run.run_id).await?;
        let primary: Vec<_> = results
            .iter()
            .filter(|r| r.variant.is_primary())
            .cloned()
            .collect();
        let runs = benchmark_runs(&primary);
        let summary = run_summary(&runs);
        let timestamp = run
            .finished_at
            .unwrap_or(row.created_at)
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let notes = vec![format!(
            "version {} (package {}), run {}",
            row.version, row.package_hash, run.run_id
        )];
        let meta = BenchmarkMetadata::of(
            &name,
            &skilleval_reports::skill_creator::service_skill_path(&name, &row.version),
            &timestamp,
            &primary,
        );
        let mut doc = benchmark_json(&meta, &runs, &summary, None, &notes);
        doc["metadata"]["version"] = json!(row.version);
        doc["metadata"]["version_id"] = json!(row.version_id);
        doc["metadata"]["run_id"] = json!(run.run_id);
        versions.push(doc);
    }
    Ok(Json(json!({
        "skill_name": name,
        "versions": versions,
        "next_cursor": next_cursor,
    })))
}
