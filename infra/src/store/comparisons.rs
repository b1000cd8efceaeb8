//! Comparisons and version history: storing a computed comparison and reading it back, the
//! runs a comparison or the regression gate picks (a version's latest completed run, the
//! previous version's, the last version that passed), and a skill's history page.
//!
//! A comparison is computed in full by `skilleval_analysis::compare` when it is asked for and stored
//! whole (`result`, the `comparison.json` shape); it is `completed` when stored.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::lifecycle::RunStatus;
use super::{Store, StoreError};

/// Where a comparison is (`comparisons.status`). Comparisons are computed before they are
/// stored, so only `completed` is written; the others are the schema's, for a comparison
/// computed in the background later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum ComparisonStatus {
    Pending,
    Running,
    Completed,
    Failed,
}

/// A computed comparison to store.
#[derive(Debug)]
pub struct NewComparison<'a> {
    pub id: Uuid,
    pub base_run: Uuid,
    pub head_run: Uuid,
    pub base_version: Uuid,
    pub head_version: Uuid,
    pub forced: bool,
    /// The comparison, `comparison.json` shape.
    pub result: &'a Value,
}

/// A stored comparison.
#[derive(Debug, Clone)]
pub struct StoredComparison {
    pub id: Uuid,
    pub base_run: Uuid,
    pub head_run: Uuid,
    pub forced: bool,
    pub status: ComparisonStatus,
    pub result: Option<Value>,
    pub created_at: DateTime<Utc>,
}

const COMPARISON_COLUMNS: &str =
    "id, baseline_run_id, candidate_run_id, forced, status, result, created_at";

fn comparison_of(r: &sqlx::postgres::PgRow) -> Result<StoredComparison, sqlx::Error> {
    Ok(StoredComparison {
        id: r.try_get(0)?,
        base_run: r.try_get(1)?,
        head_run: r.try_get(2)?,
        forced: r.try_get(3)?,
        status: r.try_get(4)?,
        result: r.try_get(5)?,
        created_at: r.try_get(6)?,
    })
}

/// One version of a skill as its history shows it, with its latest completed run.
#[derive(Debug, Clone)]
pub struct HistoryRow {
    pub version_id: Uuid,
    pub version: String,
    pub description_hash: String,
    pub package_hash: String,
    pub created_at: DateTime<Utc>,
    /// The latest completed run (upload or manual): id, verdict, summary, finished.
    pub run: Option<HistoryRun>,
}

/// A version's latest completed run.
#[derive(Debug, Clone)]
pub struct HistoryRun {
    pub run_id: Uuid,
    pub verdict: Option<String>,
    pub summary: Option<Value>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The run a version is represented by: its latest completed run of a kind that grades the
/// version's own outputs (upload, manual), newest finish first. A model matrix's runs produce
/// with another model than the version's own, so they never represent it.
pub(super) const LATEST_COMPLETED: &str = "SELECT id FROM runs
     WHERE version_id = v.id AND status = 'completed' AND kind IN ('upload', 'manual')
       AND NOT EXISTS (SELECT 1 FROM matrix_runs m WHERE m.run_id = runs.id)
     ORDER BY finished_at DESC NULLS LAST, id DESC LIMIT 1";

async fn history(
    pool: &PgPool,
    name: &str,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> Result<Option<(Uuid, Vec<HistoryRow>)>, sqlx::Error> {
    let Some(skill_id): Option<Uuid> = sqlx::query_scalar("SELECT id FROM skills WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let (before_at, before_id) = before.unzip();
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT v.id, v.version, v.description_hash, v.package_hash, v.created_at,
                r.id, r.verdict, r.summary, r.finished_at
         FROM skill_versions v
         LEFT JOIN LATERAL ({LATEST_COMPLETED}) lr ON true
         LEFT JOIN runs r ON r.id = lr.id
         WHERE v.skill_id = $1
           AND ($2::timestamptz IS NULL OR (v.created_at, v.id) < ($2, $3))
         ORDER BY v.created_at DESC, v.id DESC
         LIMIT $4"
    )))
    .bind(skill_id)
    .bind(before_at)
    .bind(before_id)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let rows = rows
        .into_iter()
        .map(|r| {
            let run_id: Option<Uuid> = r.try_get(5)?;
            Ok(HistoryRow {
                version_id: r.try_get(0)?,
                version: r.try_get(1)?,
                description_hash: r.try_get(2)?,
                package_hash: r.try_get(3)?,
                created_at: r.try_get(4)?,
                run: run_id
                    .map(|run_id| {
                        Ok::<_, sqlx::Error>(HistoryRun {
                            run_id,
                            verdict: r.try_get(6)?,
                            summary: r.try_get(7)?,
                            finished_at: r.try_get(8)?,
                        })
                    })
                    .transpose()?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some((skill_id, rows)))
}

/// The latest completed run of the newest version of `skill_id` created before the version
/// `(created_at, version_id)` that has one (`passed_only`: whose verdict is `pass`), with
/// that version's id.
async fn previous_run(
    pool: &PgPool,
    skill_id: Uuid,
    created_at: DateTime<Utc>,
    version_id: Uuid,
    passed_only: bool,
) -> Result<Option<(Uuid, Uuid)>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT v.id, r.id
         FROM skill_versions v
         JOIN LATERAL ({LATEST_COMPLETED}) lr ON true
         JOIN runs r ON r.id = lr.id
         WHERE v.skill_id = $1 AND (v.created_at, v.id) < ($2, $3)
           AND (NOT $4 OR r.verdict = 'pass')
         ORDER BY v.created_at DESC, v.id DESC
         LIMIT 1"
    )))
    .bind(skill_id)
    .bind(created_at)
    .bind(version_id)
    .bind(passed_only)
    .fetch_optional(pool)
    .await
}

/// A version's skill and creation time (the keys of "previous").
async fn version_position(
    pool: &PgPool,
    version_id: Uuid,
) -> Result<Option<(Uuid, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as("SELECT skill_id, created_at FROM skill_versions WHERE id = $1")
        .bind(version_id)
        .fetch_optional(pool)
        .await
}

impl Store {
    /// Stores a computed comparison (`completed`).
    pub async fn insert_comparison(&self, c: &NewComparison<'_>) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO comparisons
                (id, baseline_run_id, candidate_run_id, baseline_version_id,
                 candidate_version_id, forced, status, result, finished_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now())",
        )
        .bind(c.id)
        .bind(c.base_run)
        .bind(c.head_run)
        .bind(c.base_version)
        .bind(c.head_version)
        .bind(c.forced)
        .bind(ComparisonStatus::Completed)
        .bind(c.result)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("storing a comparison"))?;
        Ok(())
    }

    /// A stored comparison (`None`: no such comparison).
    pub async fn get_comparison(&self, id: Uuid) -> Result<Option<StoredComparison>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COMPARISON_COLUMNS} FROM comparisons WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .and_then(|r| r.as_ref().map(comparison_of).transpose())
        .map_err(StoreError::query("reading a comparison"))
    }

    /// The latest completed comparison of `head` against `base` (forced or not) made with
    /// the gate thresholds `gate_config` (`result.gate.config`: they decide its outcome too).
    pub async fn find_comparison(
        &self,
        base_run: Uuid,
        head_run: Uuid,
        forced: bool,
        gate_config: &Value,
    ) -> Result<Option<StoredComparison>, StoreError> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COMPARISON_COLUMNS} FROM comparisons
             WHERE candidate_run_id = $1 AND baseline_run_id = $2 AND forced = $3
               AND status = $4 AND result -> 'gate' -> 'config' = $5
             ORDER BY created_at DESC LIMIT 1"
        )))
        .bind(head_run)
        .bind(base_run)
        .bind(forced)
        .bind(ComparisonStatus::Completed)
        .bind(gate_config)
        .fetch_optional(self.pool())
        .await
        .and_then(|r| r.as_ref().map(comparison_of).transpose())
        .map_err(StoreError::query("looking up a comparison"))
    }

    /// The run a version is compared by: its latest completed upload or manual run outside
    /// any model matrix.
    pub async fn latest_completed_run(&self, version_id: Uuid) -> Result<Option<Uuid>, StoreError> {
        sqlx::query_scalar(
            "SELECT id FROM runs
             WHERE version_id = $1 AND status = $2 AND kind IN ('upload', 'manual')
               AND NOT EXISTS (SELECT 1 FROM matrix_runs m WHERE m.run_id = runs.id)
             ORDER BY finished_at DESC NULLS LAST, id DESC LIMIT 1",
        )
        .bind(version_id)
        .bind(RunStatus::Completed)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query(
            "finding a version's latest completed run",
        ))
    }

    /// Whether a version with this id exists.
    pub async fn version_exists(&self, version_id: Uuid) -> Result<bool, StoreError> {
        Ok(version_position(self.pool(), version_id)
            .await
            .map_err(StoreError::query("reading a version"))?
            .is_some())
    }

    /// A page of a skill's history, newest first, after the keyset `before` (the last row of
    /// the previous page); `None` for an unknown skill.
    pub async fn history(
        &self,
        name: &str,
        before: Option<(DateTime<Utc>, Uuid)>,
        limit: i64,
    ) -> Result<Option<(Uuid, Vec<HistoryRow>)>, StoreError> {
        history(self.pool(), name, before, limit)
            .await
            .map_err(StoreError::query("reading a skill's history"))
    }

    /// The version before `version_id` (in creation order) that has a completed run, with
    /// that run: `(version_id, run_id)`. `passed_only`: the last one whose run passed (what
    /// the regression gate compares with).
    pub async fn previous_run(
        &self,
        version_id: Uuid,
        passed_only: bool,
    ) -> Result<Option<(Uuid, Uuid)>, StoreError> {
        let context = "finding the previous version's run";
        let Some((skill_id, created_at)) = version_position(self.pool(), version_id)
            .await
            .map_err(StoreError::query(context))?
        else {
            return Ok(None);
        };
        previous_run(self.pool(), skill_id, created_at, version_id, passed_only)
            .await
            .map_err(StoreError::query(context))
    }
}
