//! Human reviews of automatic grades: stored per (run, case, criterion, reviewer), read back
//! for a run (shown beside the grades, exported as `feedback.json`) and for a skill (judge
//! agreement across its runs).

use chrono::{DateTime, Utc};
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::{Store, StoreError};

/// Whether the reviewer agreed with the automatic grade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum ReviewVerdict {
    Agree,
    Disagree,
}

/// A review to store (a later one by the same reviewer of the same grade replaces it).
#[derive(Debug, Clone)]
pub struct NewReview {
    pub test_case_id: String,
    /// `None`: the case's grade; else the rubric criterion's name.
    pub criterion: Option<String>,
    pub reviewer: String,
    pub verdict: ReviewVerdict,
    pub note: String,
    /// The automatic grade reviewed: pass or not.
    pub judge_pass: bool,
    /// Who gave it: the judge model, else the strategy.
    pub judge: String,
}

/// A stored review.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReviewRow {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub criterion: Option<String>,
    pub reviewer: String,
    pub verdict: ReviewVerdict,
    pub note: String,
    pub judge_pass: bool,
    pub judge: String,
    pub created_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "r.run_id, r.test_case_id, r.criterion, r.reviewer, r.verdict, r.note, r.judge_pass, r.judge, r.created_at";

fn review_of(r: &sqlx::postgres::PgRow) -> Result<ReviewRow, sqlx::Error> {
    let criterion: String = r.try_get(2)?;
    Ok(ReviewRow {
        run_id: r.try_get(0)?,
        test_case_id: r.try_get(1)?,
        criterion: (!criterion.is_empty()).then_some(criterion),
        reviewer: r.try_get(3)?,
        verdict: r.try_get(4)?,
        note: r.try_get(5)?,
        judge_pass: r.try_get(6)?,
        judge: r.try_get(7)?,
        created_at: r.try_get(8)?,
    })
}

async fn upsert(pool: &PgPool, run_id: Uuid, reviews: &[NewReview]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    for r in reviews {
        sqlx::query(
            "INSERT INTO case_reviews (run_id, test_case_id, criterion, reviewer, verdict, note,
                                       judge_pass, judge)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (run_id, test_case_id, criterion, reviewer) DO UPDATE
             SET verdict = EXCLUDED.verdict, note = EXCLUDED.note,
                 judge_pass = EXCLUDED.judge_pass, judge = EXCLUDED.judge, created_at = now()",
        )
        .bind(run_id)
        .bind(&r.test_case_id)
        .bind(r.criterion.as_deref().unwrap_or(""))
        .bind(&r.reviewer)
        .bind(r.verdict)
        .bind(&r.note)
        .bind(r.judge_pass)
        .bind(&r.judge)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

impl Store {
    /// Stores a run's reviews in one transaction (each replaces the same reviewer's earlier
    /// review of the same grade).
    #[tracing::instrument(skip_all, fields(run_id = %run_id, reviews = reviews.len()))]
    pub async fn upsert_reviews(
        &self,
        run_id: Uuid,
        reviews: &[NewReview],
    ) -> Result<(), StoreError> {
        upsert(self.pool(), run_id, reviews)
            .await
            .map_err(StoreError::query("storing reviews"))
    }

    /// A run's reviews in case order, then criterion, then reviewer.
    pub async fn reviews_of_run(&self, run_id: Uuid) -> Result<Vec<ReviewRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM case_reviews r
             LEFT JOIN eval_results e ON e.run_id = r.run_id AND e.test_case_id = r.test_case_id
               AND e.configuration = 'with_skill' AND e.run_number = 1
             WHERE r.run_id = $1
             ORDER BY e.case_index NULLS LAST, r.test_case_id, r.criterion, r.reviewer"
        )))
        .bind(run_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a run's reviews"))?;
        rows.iter()
            .map(review_of)
            .collect::<Result<_, _>>()
            .map_err(StoreError::query("reading a run's reviews"))
    }

    /// Every review of a skill's runs, newest first.
    pub async fn reviews_of_skill(&self, skill: &str) -> Result<Vec<ReviewRow>, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM case_reviews r
             JOIN runs ON runs.id = r.run_id
             JOIN skill_versions v ON v.id = runs.version_id
             JOIN skills s ON s.id = v.skill_id
             WHERE s.name = $1
             ORDER BY r.created_at DESC"
        )))
        .bind(skill)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a skill's reviews"))?;
        rows.iter()
            .map(review_of)
            .collect::<Result<_, _>>()
            .map_err(StoreError::query("reading a skill's reviews"))
    }
}
