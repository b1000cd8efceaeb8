//! Reports over chosen runs of a skill (`POST /v1/reports`): the completed runs they may
//! cover, storing one with the runs it covers, and reading it back for whoever may see it.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use super::tenancy::Viewer;
use super::{Store, StoreError};

/// A completed run a report may cover, with its stored summary.
#[derive(Debug, Clone)]
pub struct ReportRunRow {
    pub run_id: Uuid,
    pub version: String,
    pub created_at: DateTime<Utc>,
    pub summary: Value,
}

/// What the report covers: the kinds whose summary measures the skill (a samples run is a
/// tally of production traffic, not an evaluation of a version).
const REPORTED_KINDS: &str = "r.kind IN ('upload', 'manual', 'rescore')";

async fn completed_runs(
    pool: &PgPool,
    skill_id: Uuid,
    only: Option<&[Uuid]>,
) -> Result<Vec<ReportRunRow>, sqlx::Error> {
    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT r.id, v.version, r.created_at, r.summary FROM runs r
         JOIN skill_versions v ON v.id = r.version_id
         WHERE v.skill_id = $1 AND r.status = 'completed' AND r.finalised
           AND r.summary IS NOT NULL AND {REPORTED_KINDS}
           AND ($2::uuid[] IS NULL OR r.id = ANY($2))
         ORDER BY r.created_at, r.id"
    )))
    .bind(skill_id)
    .bind(only)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(ReportRunRow {
                run_id: r.try_get(0)?,
                version: r.try_get(1)?,
                created_at: r.try_get(2)?,
                summary: r.try_get(3)?,
            })
        })
        .collect()
}

/// A stored report.
#[derive(Debug, Clone)]
pub struct StoredReport {
    pub id: Uuid,
    pub format: String,
    pub report: Value,
}

impl Store {
    /// The skill's completed runs (of the kinds a report covers), oldest first; with `only`,
    /// just those of them.
    pub async fn reportable_runs(
        &self,
        skill_id: Uuid,
        only: Option<&[Uuid]>,
    ) -> Result<Vec<ReportRunRow>, StoreError> {
        completed_runs(self.pool(), skill_id, only)
            .await
            .map_err(StoreError::query("reading the runs of a report"))
    }

    /// The run's skill, status and kind when the viewer may see it: why a run named for a
    /// report cannot be in it.
    pub async fn run_for_report(
        &self,
        viewer: Viewer,
        run_id: Uuid,
    ) -> Result<Option<(Uuid, String, String)>, StoreError> {
        let row = sqlx::query(
            "SELECT v.skill_id, r.status, r.kind FROM runs r
             JOIN skill_versions v ON v.id = r.version_id JOIN skills s ON s.id = v.skill_id
             WHERE r.id = $1 AND ($2::uuid IS NULL OR s.publisher_id = $2)",
        )
        .bind(run_id)
        .bind(viewer.filter())
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("finding a run of a report"))?;
        row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .transpose()
            .map_err(StoreError::query("reading a run of a report"))
    }

    /// Stores a report and the runs it covers, at once.
    pub async fn insert_report(
        &self,
        id: Uuid,
        skill_id: Uuid,
        format: &str,
        report: &Value,
        run_ids: &[Uuid],
    ) -> Result<(), StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("storing a report"))?;
        sqlx::query("INSERT INTO reports (id, skill_id, format, report) VALUES ($1, $2, $3, $4)")
            .bind(id)
            .bind(skill_id)
            .bind(format)
            .bind(report)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("storing a report"))?;
        sqlx::query("INSERT INTO report_runs (report_id, run_id) SELECT $1, unnest($2::uuid[])")
            .bind(id)
            .bind(run_ids)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::query("storing a report's runs"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("storing a report"))
    }

    /// A stored report, when the viewer may see it.
    pub async fn get_report(
        &self,
        viewer: Viewer,
        id: Uuid,
    ) -> Result<Option<StoredReport>, StoreError> {
        let row = sqlx::query(
            "SELECT p.id, p.format, p.report FROM reports p JOIN skills s ON s.id = p.skill_id
             WHERE p.id = $1 AND ($2::uuid IS NULL OR s.publisher_id = $2)",
        )
        .bind(id)
        .bind(viewer.filter())
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a report"))?;
        row.map(|r| {
            Ok(StoredReport {
                id: r.try_get(0)?,
                format: r.try_get(1)?,
                report: r.try_get(2)?,
            })
        })
        .transpose()
        .map_err(StoreError::query("reading a report"))
    }

    /// The description of the skill's latest version.
    pub async fn latest_description(&self, skill_id: Uuid) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT description FROM skill_versions WHERE skill_id = $1
             ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(skill_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a skill's description"))
    }

    /// Whether the report exists and the viewer may see it.
    pub async fn visible_report(&self, viewer: Viewer, id: Uuid) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM reports p JOIN skills s ON s.id = p.skill_id
                WHERE p.id = $1 AND ($2::uuid IS NULL OR s.publisher_id = $2))",
        )
        .bind(id)
        .bind(viewer.filter())
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("finding a report"))
    }
}
