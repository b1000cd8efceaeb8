//! Model matrices (issue 33): the skills a matrix may run (each one's latest passing version
//! and the run it is compared with), the matrix and its cells, and who may read it.
//!
//! A cell is an ordinary run created by the coordinator's run pipeline; this module only links
//! it to its matrix. A version's *reference run* is its latest completed upload or manual run
//! outside every matrix (`comparisons::LATEST_COMPLETED`), so a matrix's runs never become
//! the run a version is represented or compared by.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::comparisons::LATEST_COMPLETED;
use super::tenancy::Viewer;
use super::{Store, StoreError};

/// A skill a matrix may include: its newest version whose reference run passed, when it has
/// one.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixSkill {
    pub name: String,
    pub passing: Option<PassingVersion>,
}

/// A version whose reference run passed.
#[derive(Debug, Clone, PartialEq)]
pub struct PassingVersion {
    pub version_id: Uuid,
    pub version: String,
    pub reference_run: Uuid,
}

/// Which skills a matrix is over.
#[derive(Debug, Clone, Copy)]
pub enum MatrixScope<'a> {
    /// These skills, by name.
    Named(&'a [String]),
    /// Every skill of the publisher of this name.
    Publisher(&'a str),
}

/// How far a matrix's creation went (`matrices.status`): its row is written `creating` with
/// every planned cell, and becomes `created` once every cell's run is created and linked. A
/// matrix left `creating` (its creator stopped half-way) is completed by a replay of its
/// request with the same idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum MatrixStatus {
    Creating,
    Created,
}

/// A matrix to store, `creating`, before its cells.
#[derive(Debug)]
pub struct NewMatrix<'a> {
    pub id: Uuid,
    pub publisher_id: Uuid,
    pub request: &'a Value,
    pub estimate: &'a Value,
    /// Every planned cell, in position order, as the coordinator re-drives them.
    pub plan: &'a Value,
    /// The caller's key: the publisher's matrix with this key is answered instead of a new one.
    pub idempotency_key: Option<&'a str>,
}

/// Whether [`Store::insert_matrix`] stored the matrix or found the publisher's matrix with the
/// same idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatrixInsert {
    Created(Uuid),
    Existing(Uuid),
}

/// One cell to link: the run of `version_id` produced with `model`.
#[derive(Debug)]
pub struct NewCell<'a> {
    pub position: i32,
    pub version_id: Uuid,
    pub model: &'a str,
    pub run_id: Uuid,
    pub reference_run: Uuid,
}

/// A stored matrix with its cells in order.
#[derive(Debug, Clone)]
pub struct StoredMatrix {
    pub id: Uuid,
    pub request: Value,
    pub estimate: Value,
    pub created_at: DateTime<Utc>,
    pub status: MatrixStatus,
    /// The planned cells (`None` for a matrix stored before plans were kept: all `created`).
    pub plan: Option<Value>,
    pub cells: Vec<StoredCell>,
}

/// A stored cell.
#[derive(Debug, Clone)]
pub struct StoredCell {
    pub position: i32,
    pub skill: String,
    pub version: String,
    pub version_id: Uuid,
    pub model: String,
    pub run_id: Uuid,
    /// `None` once the reference run was deleted.
    pub reference_run: Option<Uuid>,
}

impl Store {
    /// The skills in `scope` that `viewer` may see, by name, each with its latest passing
    /// version. Named skills that do not exist (or are another publisher's) are not returned.
    pub async fn matrix_skills(
        &self,
        viewer: Viewer,
        scope: MatrixScope<'_>,
    ) -> Result<Vec<MatrixSkill>, StoreError> {
        let (names, publisher) = match scope {
            MatrixScope::Named(names) => (Some(names), None),
            MatrixScope::Publisher(name) => (None, Some(name)),
        };
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT s.name, p.id, p.version, p.run_id
             FROM skills s
             LEFT JOIN LATERAL (
                 SELECT v.id, v.version, r.id AS run_id
                 FROM skill_versions v
                 JOIN LATERAL ({LATEST_COMPLETED}) lr ON true
                 JOIN runs r ON r.id = lr.id
                 WHERE v.skill_id = s.id AND r.verdict = 'pass'
                 ORDER BY v.created_at DESC, v.id DESC
                 LIMIT 1
             ) p ON true
             WHERE ($1::text[] IS NULL OR s.name = ANY($1))
               AND ($2::text IS NULL
                    OR s.publisher_id = (SELECT id FROM publishers WHERE name = $2))
               AND ($3::uuid IS NULL OR s.publisher_id = $3)
             ORDER BY s.name"
        )))
        .bind(names)
        .bind(publisher)
        .bind(viewer.filter())
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("finding a matrix's skills"))?;
        rows.iter()
            .map(|r| {
                let version_id: Option<Uuid> = r.try_get(1)?;
                let version: Option<String> = r.try_get(2)?;
                let run: Option<Uuid> = r.try_get(3)?;
                Ok(MatrixSkill {
                    name: r.try_get(0)?,
                    passing: match (version_id, version, run) {
                        (Some(version_id), Some(version), Some(reference_run)) => {
                            Some(PassingVersion {
                                version_id,
                                version,
                                reference_run,
                            })
                        }
                        _ => None,
                    },
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::query("reading a matrix's skills"))
    }

    /// Stores a matrix, `creating` (its cells are linked as their runs are created). With an
    /// idempotency key the publisher already used, stores nothing and returns that matrix.
    pub async fn insert_matrix(&self, m: &NewMatrix<'_>) -> Result<MatrixInsert, StoreError> {
        let inserted: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO matrices (id, publisher_id, request, estimate, plan, idempotency_key, status)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (publisher_id, idempotency_key) WHERE idempotency_key IS NOT NULL
             DO NOTHING
             RETURNING id",
        )
        .bind(m.id)
        .bind(m.publisher_id)
        .bind(m.request)
        .bind(m.estimate)
        .bind(m.plan)
        .bind(m.idempotency_key)
        .bind(MatrixStatus::Creating)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("storing a matrix"))?;
        if let Some(id) = inserted {
            return Ok(MatrixInsert::Created(id));
        }
        let existing = match m.idempotency_key {
            Some(key) => self.matrix_by_key(m.publisher_id, key).await?,
            None => None,
        };
        existing
            .map(MatrixInsert::Existing)
            .ok_or_else(|| StoreError::query("storing a matrix")(sqlx::Error::RowNotFound))
    }

    /// The publisher's matrix stored with this idempotency key, if any.
    pub async fn matrix_by_key(
        &self,
        publisher_id: Uuid,
        key: &str,
    ) -> Result<Option<Uuid>, StoreError> {
        sqlx::query_scalar(
            "SELECT id FROM matrices WHERE publisher_id = $1 AND idempotency_key = $2",
        )
        .bind(publisher_id)
        .bind(key)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("finding a matrix by its idempotency key"))
    }

    /// Which of these run idempotency keys a run already has (a matrix's cells whose run was
    /// created but not linked yet).
    pub async fn used_run_keys(&self, keys: &[String]) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT idempotency_key FROM runs WHERE idempotency_key = ANY($1)")
            .bind(keys)
            .fetch_all(self.pool())
            .await
            .map_err(StoreError::query("finding runs by their idempotency keys"))
    }

    /// Marks a matrix `created`: every planned cell is linked.
    pub async fn finish_matrix_creation(&self, id: Uuid) -> Result<(), StoreError> {
        sqlx::query("UPDATE matrices SET status = $2 WHERE id = $1")
            .bind(id)
            .bind(MatrixStatus::Created)
            .execute(self.pool())
            .await
            .map_err(StoreError::query("marking a matrix created"))?;
        Ok(())
    }

    /// Links a created run to its matrix as one cell (a position already linked stays as it
    /// is: creation re-driven after a stop links each cell once).
    pub async fn insert_matrix_cell(
        &self,
        matrix_id: Uuid,
        cell: &NewCell<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO matrix_runs (matrix_id, position, version_id, model, run_id, reference_run_id)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (matrix_id, position) DO NOTHING",
        )
        .bind(matrix_id)
        .bind(cell.position)
        .bind(cell.version_id)
        .bind(cell.model)
        .bind(cell.run_id)
        .bind(cell.reference_run)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("linking a run to its matrix"))?;
        Ok(())
    }

    /// Whether `viewer` may read the matrix: it is the viewer's publisher's (and so are all its
    /// skills, which its creation checked).
    pub async fn visible_matrix(&self, viewer: Viewer, id: Uuid) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM matrices m
                WHERE m.id = $1 AND ($2::uuid IS NULL OR (m.publisher_id = $2 AND NOT EXISTS (
                    SELECT 1 FROM matrix_runs c
                    JOIN skill_versions v ON v.id = c.version_id JOIN skills s ON s.id = v.skill_id
                    WHERE c.matrix_id = m.id AND s.publisher_id <> $2))))",
        )
        .bind(id)
        .bind(viewer.filter())
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("finding a matrix"))
    }

    /// Matrices still `creating` that were accepted more than `after` ago (a creation in
    /// flight takes less): their coordinator stopped mid-request. Oldest first.
    pub async fn stalled_matrices(
        &self,
        after: std::time::Duration,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query_scalar(
            "SELECT id FROM matrices
              WHERE status = $1 AND created_at < now() - make_interval(secs => $2)
              ORDER BY created_at LIMIT $3",
        )
        .bind(MatrixStatus::Creating)
        .bind(after.as_secs_f64())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing matrices whose creation stopped"))
    }

    /// A matrix with its cells in order; `None` when there is none with this id.
    pub async fn get_matrix(&self, id: Uuid) -> Result<Option<StoredMatrix>, StoreError> {
        let Some(head) = sqlx::query(
            "SELECT id, request, estimate, created_at, status, plan FROM matrices WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a matrix"))?
        else {
            return Ok(None);
        };
        let cells = sqlx::query(
            "SELECT c.position, s.name, v.version, c.version_id, c.model, c.run_id,
                    c.reference_run_id
             FROM matrix_runs c
             JOIN skill_versions v ON v.id = c.version_id JOIN skills s ON s.id = v.skill_id
             WHERE c.matrix_id = $1
             ORDER BY c.position",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a matrix's cells"))?;
        let read = || -> Result<StoredMatrix, sqlx::Error> {
            Ok(StoredMatrix {
                id: head.try_get(0)?,
                request: head.try_get(1)?,
                estimate: head.try_get(2)?,
                created_at: head.try_get(3)?,
                status: head.try_get(4)?,
                plan: head.try_get(5)?,
                cells: cells
                    .iter()
                    .map(|r| {
                        Ok(StoredCell {
                            position: r.try_get(0)?,
                            skill: r.try_get(1)?,
                            version: r.try_get(2)?,
                            version_id: r.try_get(3)?,
                            model: r.try_get(4)?,
                            run_id: r.try_get(5)?,
                            reference_run: r.try_get(6)?,
                        })
                    })
                    .collect::<Result<_, sqlx::Error>>()?,
            })
        };
        read()
            .map(Some)
            .map_err(StoreError::query("reading a matrix"))
    }
}
