//! Human review of automatic grades: `POST /v1/runs/{id}/reviews` stores a reviewer's agree or
//! disagree on a case's grade and on each rubric criterion's, with a note; `GET` lists them;
//! `GET /v1/runs/{id}/feedback` exports them in skill-creator's `feedback.json` shape; and
//! `GET /v1/skills/{name}/agreement` summarises them as judge agreement (percent agreement and
//! Cohen's kappa with its interval) per rubric criterion and judge.
//!
//! The grade reviewed is read from the stored result when the review arrives (pass or not;
//! the judge model, else the strategy) and stored with the review, so the agreement needs
//! nothing but the reviews.
//!
//! skill-creator's `feedback.json` goes both ways, with its meaning: a review is keyed by the
//! viewer's name of the run it is about (`eval-1-with_skill-run-1`, the run's folder as
//! `skilleval_reports::skill_creator` lays it out) and its `feedback` is empty when the
//! reviewer found the output fine and had nothing to add ("empty means fine"), else what they
//! said. The same file, written by skill-creator's viewer, can be posted to
//! `POST /v1/runs/{id}/reviews`: an empty feedback is a reviewer who says the case passes, any
//! text one who says it does not, and each becomes an agree or a disagree with the stored grade.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skilleval_analysis::stats::{cohen_kappa, Agreement, AgreementTable};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::variant::Configuration;
use skilleval_infra::store::reviews::{NewReview, ReviewRow, ReviewVerdict};
use skilleval_reports::skill_creator::{review_run_id, EvalDirs, ViewerRuns};
use uuid::Uuid;

use crate::error::ApiError;
use crate::extract::{parse_json, parse_uuid, ApiJson};
use crate::results::load_results;
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

/// skill-creator's `feedback.json`, as its viewer writes it (`reviewer` is ours: its viewer
/// writes none).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackFile {
    pub reviews: Vec<FeedbackEntry>,
    /// `complete` or `in_progress`; either is taken.
    #[serde(default)]
    pub status: Option<String>,
    /// Who reviewed, for the entries that do not say.
    #[serde(default)]
    pub reviewer: String,
}

/// One run's feedback in skill-creator's `feedback.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackEntry {
    /// The viewer's name of the run (`eval-1-with_skill-run-1`).
    pub run_id: String,
    /// Empty: the output is fine.
    pub feedback: String,
    #[serde(default)]
    pub timestamp: Option<String>,
    #[serde(default)]
    pub reviewer: Option<String>,
}

/// Whether a reviews body is skill-creator's `feedback.json` (its entries name a `run_id`)
/// rather than our own shape (`test_case_id` and a verdict).
fn is_feedback_file(body: &Value) -> bool {
    body.get("reviews")
        .and_then(Value::as_array)
        .and_then(|items| items.first())
        .is_some_and(|first| first.get("run_id").is_some())
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

/// `POST /v1/runs/{id}/reviews`: our reviews, or skill-creator's `feedback.json`.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn create(
    State(state): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let run_id = parse_uuid("id", &id)?;
    // Parsed again as the shape it is, so a type error names its field in that shape.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    if is_feedback_file(&body) {
        let file: FeedbackFile = parse_json(&bytes)?;
        let (stored, ignored) = import_feedback(&state, run_id, file).await?;
        return Ok((
            StatusCode::CREATED,
            Json(json!({ "run_id": run_id, "stored": stored, "ignored": ignored })),
        ));
    }
    let body: ReviewsBody = parse_json(&bytes)?;
    let stored = store_reviews(&state, run_id, body).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "run_id": run_id, "stored": stored, "ignored": [] })),
    ))
}

/// An entry of a `feedback.json` that names a run of the folder but is not imported, and why.
#[derive(Debug, Clone, Serialize)]
pub struct IgnoredFeedback {
    pub run_id: String,
    pub reason: String,
}

/// Imports skill-creator's `feedback.json` onto the run: each entry about a case's first
/// with-skill attempt becomes a review of its grade (empty feedback: the reviewer says it
/// passes; any text: it does not; the text is the note). Entries about another attempt (a
/// repeat, the baseline) or a case with no grade are returned as ignored, with the reason; an
/// entry naming no run of the folder is a 422 naming it. All or none are stored.
pub async fn import_feedback(
    state: &AppState,
    run_id: Uuid,
    file: FeedbackFile,
) -> Result<(usize, Vec<IgnoredFeedback>), ApiError> {
    if state.store.get_run(run_id).await?.is_none() {
        return Err(ApiError::not_found("run", run_id));
    }
    let results: Vec<JobResult> = load_results(&state.store, run_id)
        .await?
        .into_iter()
        .filter(|r| r.variant.configuration != Configuration::Trigger)
        .collect();
    let runs = ViewerRuns::of(&results);
    let mut items = Vec::new();
    let mut ignored = Vec::new();
    for (i, entry) in file.reviews.into_iter().enumerate() {
        let Some((case_id, configuration, run_number)) = runs.get(&entry.run_id) else {
            return Err(invalid_review(
                &format!("/reviews/{i}/run_id"),
                format!(
                    "`{}` names no run of run {run_id}'s skill-creator folder (its runs are named \
                     like `eval-1-with_skill-run-1`: GET /v1/runs/{run_id}/workspace has them)",
                    entry.run_id
                ),
            ));
        };
        if configuration != Configuration::WithSkill || run_number != 1 {
            ignored.push(IgnoredFeedback {
                run_id: entry.run_id,
                reason: "reviews are of a case's grade, its first attempt with the skill; this is \
                         another attempt"
                    .into(),
            });
            continue;
        }
        let Some(result) = results
            .iter()
            .find(|r| r.test_case_id == case_id && r.variant.is_primary())
        else {
            continue;
        };
        if !matches!(result.status, CaseStatus::Passed | CaseStatus::Failed) {
            ignored.push(IgnoredFeedback {
                run_id: entry.run_id,
                reason: format!(
                    "the case was {}: it has no grade to review",
                    result.status.as_str()
                ),
            });
            continue;
        }
        let reviewer_pass = entry.feedback.trim().is_empty();
        let judge_pass = result.status == CaseStatus::Passed;
        items.push((
            entry.reviewer.unwrap_or_else(|| file.reviewer.clone()),
            ReviewItem {
                test_case_id: case_id.to_string(),
                criterion: None,
                verdict: if reviewer_pass == judge_pass {
                    ReviewVerdict::Agree
                } else {
                    ReviewVerdict::Disagree
                },
                note: entry.feedback,
            },
        ));
    }
    // One request per reviewer, each all-or-nothing like any reviews body; a failure of a later
    // one would leave earlier ones stored, so every item is checked first.
    let mut by_reviewer: BTreeMap<String, Vec<ReviewItem>> = BTreeMap::new();
    for (reviewer, item) in items {
        if item.note.chars().count() > MAX_NOTE_CHARS {
            return Err(invalid_review(
                "/reviews",
                format!("a feedback is over {MAX_NOTE_CHARS} characters"),
            ));
        }
        by_reviewer.entry(reviewer).or_default().push(item);
    }
    let mut stored = 0;
    for (reviewer, reviews) in by_reviewer {
        stored += store_reviews(state, run_id, ReviewsBody { reviewer, reviews }).await?;
    }
    Ok((stored, ignored))
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

/// `GET /v1/runs/{id}/feedback`: skill-creator's `feedback.json` of the run's reviews
/// ([`feedback_json`]).
pub async fn feedback(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    if state.store.get_run(run_id).await?.is_none() {
        return Err(ApiError::not_found("run", run_id));
    }
    let reviews = state.store.reviews_of_run(run_id).await?;
    let results: Vec<JobResult> = load_results(&state.store, run_id)
        .await?
        .into_iter()
        .filter(|r| r.variant.configuration != Configuration::Trigger)
        .collect();
    Ok(Json(feedback_json(&reviews, &EvalDirs::of(&results))))
}

/// What one review says in skill-creator's terms: nothing when the reviewer found the output
/// fine and wrote no note; the note when they wrote one; else that the output fails.
fn feedback_line(r: &ReviewRow) -> Option<String> {
    let reviewer_pass = match r.verdict {
        ReviewVerdict::Agree => r.judge_pass,
        ReviewVerdict::Disagree => !r.judge_pass,
    };
    let note = r.note.trim();
    let said = if !note.is_empty() {
        note.to_string()
    } else if reviewer_pass {
        return None;
    } else if r.judge_pass {
        format!(
            "not fine: the reviewer disagrees with the passing grade of {}",
            r.judge
        )
    } else {
        format!(
            "not fine: the reviewer agrees with the failing grade of {}",
            r.judge
        )
    };
    Some(match &r.criterion {
        Some(c) => format!("{c}: {said}"),
        None => said,
    })
}

/// The `feedback.json` of some reviews: one entry per reviewed case, keyed by the viewer's
/// name of its first with-skill attempt (`eval-1-with_skill-run-1`), its `feedback` the lines
/// of its reviews ([`feedback_line`]; empty when every review found it fine with nothing to
/// add), its `timestamp` the latest review's, `reviewer` the reviewers. Cases nobody reviewed
/// are left out: unreviewed is not "fine".
pub fn feedback_json(reviews: &[ReviewRow], dirs: &EvalDirs) -> Value {
    let mut cases: Vec<(&str, Vec<&ReviewRow>)> = Vec::new();
    for r in reviews {
        match cases.iter_mut().find(|(id, _)| *id == r.test_case_id) {
            Some((_, rs)) => rs.push(r),
            None => cases.push((&r.test_case_id, vec![r])),
        }
    }
    let entries: Vec<Value> = cases
        .into_iter()
        .map(|(case_id, rs)| {
            let lines: Vec<String> = rs.iter().filter_map(|r| feedback_line(r)).collect();
            let mut reviewers: Vec<&str> = rs
                .iter()
                .map(|r| r.reviewer.as_str())
                .filter(|r| !r.is_empty())
                .collect();
            reviewers.sort_unstable();
            reviewers.dedup();
            json!({
                "run_id": review_run_id(dirs, case_id).unwrap_or_else(|| case_id.to_string()),
                "feedback": lines.join("\n"),
                "timestamp": rs.iter().map(|r| r.created_at).max(),
                "reviewer": reviewers.join(", "),
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
