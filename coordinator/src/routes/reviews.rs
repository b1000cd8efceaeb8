//! Human review of automatic grades: `POST /v1/runs/{id}/reviews` stores a reviewer's agree or
//! disagree on a case's grade and on each rubric criterion's, with a note; `GET` lists them;
//! `GET /v1/runs/{id}/feedback` exports them in skill-creator's `feedback.json` shape; and
//! `GET /v1/skills/{name}/agreement` summarises them as judge agreement (percent agreement and
//! Cohen's kappa with its interval) per rubric criterion and judge.
//!
//! The grade reviewed is read from the stored result when the review arrives (pass or not;
//! the judge model, else the strategy) and stored with the review, so the agreement needs
//! nothing but the reviews.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skilleval_analysis::stats::{cohen_kappa, Agreement, AgreementTable};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::store::reviews::{NewReview, ReviewRow, ReviewVerdict};
use uuid::Uuid;

use crate::error::ApiError;
use crate::extract::{parse_uuid, ApiJson};
use crate::state::AppState;

/// A criterion's normalised score at or above this counts as the judge saying "pass".
pub const CRITERION_PASS: f64 = 0.5;
/// Longest note kept.
const MAX_NOTE_CHARS: usize = 10_000;
/// Most reviews in one request.
const MAX_REVIEWS: usize = 1_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewsBody {
    /// Who reviews (optional; one review per reviewer and grade, a later one replaces it).
    #[serde(default)]
    pub reviewer: String,
    pub reviews: Vec<ReviewItem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewItem {
    pub test_case_id: String,
    /// Absent: the case's grade; else a rubric criterion of the case.
    #[serde(default)]
    pub criterion: Option<String>,
    pub verdict: ReviewVerdict,
    #[serde(default)]
    pub note: String,
}

/// Who graded a result: the judge model when a model graded it, else the strategy.
pub fn judge_of(r: &JobResult) -> String {
    r.details
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map_or_else(|| r.strategy.clone(), str::to_string)
}

/// A criterion's normalised score in a result.
pub fn criterion_score(r: &JobResult, criterion: &str) -> Option<f64> {
    let c = r.rubric_scores.as_ref()?.get(criterion)?;
    c.get("normalized")
        .or_else(|| c.get("score"))
        .and_then(Value::as_f64)
}

/// A review that is well-formed JSON but names what the run does not have, or breaks a limit:
/// 422 naming the field (a JSON pointer) and the rule.
fn invalid_review(field: &str, rule: impl Into<String>) -> ApiError {
    ApiError::unprocessable_field("invalid_review", field, rule)
}

/// Checks each review against the run's stored results and stores them all, or none.
pub async fn store_reviews(
    state: &AppState,
    run_id: Uuid,
    body: ReviewsBody,
) -> Result<usize, ApiError> {
    if body.reviews.is_empty() {
        return Err(invalid_review("/reviews", "must list at least one review"));
    }
    if body.reviews.len() > MAX_REVIEWS {
        return Err(invalid_review(
            "/reviews",
            format!("at most {MAX_REVIEWS} reviews per request"),
        ));
    }
    if body.reviewer.chars().count() > 200 {
        return Err(invalid_review("/reviewer", "at most 200 characters"));
    }
    if state.store.get_run(run_id).await?.is_none() {
        return Err(ApiError::not_found("run", run_id));
    }
    let mut ids: Vec<String> = body
        .reviews
        .iter()
        .map(|r| r.test_case_id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    let mut results: BTreeMap<String, JobResult> = BTreeMap::new();
    for (id, text) in state.store.case_results_by_id(run_id, &ids).await? {
        if let Some(text) = text {
            let parsed: JobResult = serde_json::from_str(&text).map_err(|e| {
                ApiError::internal(anyhow::anyhow!(
                    "stored result of `{id}` does not parse: {e}"
                ))
            })?;
            results.insert(id, parsed);
        }
    }
    let mut reviews = Vec::with_capacity(body.reviews.len());
    for (i, item) in body.reviews.into_iter().enumerate() {
        let Some(result) = results.get(&item.test_case_id) else {
            return Err(invalid_review(
                &format!("/reviews/{i}/test_case_id"),
                format!(
                    "`{}` is no recorded case of run {run_id}",
                    item.test_case_id
                ),
            ));
        };
        if matches!(
            result.status,
            CaseStatus::Errored | CaseStatus::Skipped | CaseStatus::Queued
        ) {
            return Err(invalid_review(
                &format!("/reviews/{i}/test_case_id"),
                format!(
                    "case `{}` was {}: it has no grade to review",
                    item.test_case_id,
                    result.status.as_str()
                ),
            ));
        }
        if item.note.chars().count() > MAX_NOTE_CHARS {
            return Err(invalid_review(
                &format!("/reviews/{i}/note"),
                format!("at most {MAX_NOTE_CHARS} characters"),
            ));
        }
        let judge_pass = match &item.criterion {
            None => result.status == CaseStatus::Passed,
            Some(c) => {
                let Some(score) = criterion_score(result, c) else {
                    return Err(invalid_review(
                        &format!("/reviews/{i}/criterion"),
                        format!(
                            "`{c}` is no graded rubric criterion of case `{}`",
                            item.test_case_id
                        ),
                    ));
                };
                score >= CRITERION_PASS
            }
        };
        reviews.push(NewReview {
            test_case_id: item.test_case_id,
            criterion: item.criterion,
            reviewer: body.reviewer.clone(),
            verdict: item.verdict,
            note: item.note,
            judge_pass,
            judge: judge_of(result),
        });
    }
    state.store.upsert_reviews(run_id, &reviews).await?;
    Ok(reviews.len())
}

/// `POST /v1/runs/{id}/reviews`.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ReviewsBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let stored = store_reviews(&state, run_id, body).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "run_id": run_id, "stored": stored })),
    ))
}

/// `GET /v1/runs/{id}/reviews`.
pub async fn list(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    if state.store.get_run(run_id).await?.is_none() {
        return Err(ApiError::not_found("run", run_id));
    }
    let reviews = state.store.reviews_of_run(run_id).await?;
    let agreement = agreement_rows(&reviews);
    Ok(Json(
        json!({ "run_id": run_id, "reviews": reviews, "agreement": agreement }),
    ))
}

/// `GET /v1/runs/{id}/feedback`: skill-creator's `feedback.json` (`{reviews: [{run_id,
/// feedback, timestamp}], status}`), one entry per review; `run_id` names the case (and
/// `#criterion` for a criterion's review), `feedback` says agree/disagree and the note.
pub async fn feedback(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    if state.store.get_run(run_id).await?.is_none() {
        return Err(ApiError::not_found("run", run_id));
    }
    let reviews = state.store.reviews_of_run(run_id).await?;
    Ok(Json(feedback_json(&reviews)))
}

/// The `feedback.json` document of some reviews.
pub fn feedback_json(reviews: &[ReviewRow]) -> Value {
    let entries: Vec<Value> = reviews
        .iter()
        .map(|r| {
            let target = match &r.criterion {
                Some(c) => format!("{}#{c}", r.test_case_id),
                None => r.test_case_id.clone(),
            };
            let verdict = match r.verdict {
                ReviewVerdict::Agree => "agree",
                ReviewVerdict::Disagree => "disagree",
            };
            let feedback = if r.note.is_empty() {
                verdict.to_string()
            } else {
                format!("{verdict}: {}", r.note)
            };
            json!({
                "run_id": target,
                "feedback": feedback,
                "timestamp": r.created_at,
                "reviewer": r.reviewer,
            })
        })
        .collect();
    json!({ "reviews": entries, "status": "complete" })
}

/// Judge agreement for one (criterion, judge).
#[derive(Debug, Clone, Serialize)]
pub struct AgreementRow {
    /// `None`: the case grade.
    pub criterion: Option<String>,
    pub judge: String,
    pub table: AgreementTable,
    #[serde(flatten)]
    pub agreement: Agreement,
}

/// Agreement per (criterion, judge), the case grade first, then criteria by name.
pub fn agreement_rows(reviews: &[ReviewRow]) -> Vec<AgreementRow> {
    let mut tables: BTreeMap<(Option<String>, String), AgreementTable> = BTreeMap::new();
    for r in reviews {
        let reviewer_pass = match r.verdict {
            ReviewVerdict::Agree => r.judge_pass,
            ReviewVerdict::Disagree => !r.judge_pass,
        };
        tables
            .entry((r.criterion.clone(), r.judge.clone()))
            .or_default()
            .add(r.judge_pass, reviewer_pass);
    }
    tables
        .into_iter()
        .filter_map(|((criterion, judge), table)| {
            let agreement = cohen_kappa(&table, 0.95).ok()?;
            Some(AgreementRow {
                criterion,
                judge,
                table,
                agreement,
            })
        })
        .collect()
}

/// `GET /v1/skills/{name}/agreement`: judge agreement over every review of the skill's runs.
pub async fn agreement(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if state.store.versions_of(&name).await?.is_none() {
        return Err(ApiError::not_found("skill", &name));
    }
    let reviews = state.store.reviews_of_skill(&name).await?;
    Ok(Json(json!({
        "skill": name,
        "reviews": reviews.len(),
        "agreement": agreement_rows(&reviews),
    })))
}
