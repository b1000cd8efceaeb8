//! Catalogue collisions (docs/catalogue.md): each version's catalogue card (description,
//! should-trigger queries, public or not), the catalogue a publisher's upload is compared
//! with (the latest card of every skill it owns or that is public), and the version's
//! collision matrix with its lifecycle (`pending` → `completed` | `failed`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use super::{Store, StoreError};

/// Where a version's collision eval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize, serde::Deserialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum CollisionStatus {
    Pending,
    Completed,
    Failed,
}

/// A skill of the catalogue as the collision eval reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogueCard {
    pub skill_id: Uuid,
    pub name: String,
    pub publisher_id: Uuid,
    pub description: String,
    pub queries: Vec<String>,
}

/// A version's stored collision eval.
#[derive(Debug, Clone)]
pub struct CollisionRow {
    pub version_id: Uuid,
    pub version: String,
    pub status: CollisionStatus,
    pub matrix: Option<Value>,
    pub gate: Option<Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Another skill's matrix that names a skill as a neighbour.
#[derive(Debug, Clone)]
pub struct NamingRow {
    pub matrix: Value,
    /// The evaluated skill's publisher.
    pub publisher_id: Uuid,
    /// Whether the evaluated skill's card is public (else its name is not shown).
    pub public: bool,
}

impl Store {
    /// Stores a version's card and its collision eval as `pending`, in one statement each;
    /// a second upload of the same version replaces both.
    pub async fn put_catalogue_card(
        &self,
        version_id: Uuid,
        skill_id: Uuid,
        description: &str,
        queries: &[String],
        public: bool,
    ) -> Result<(), StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("storing a catalogue card"))?;
        sqlx::query(
            "INSERT INTO catalogue_cards (version_id, skill_id, description, queries, public)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (version_id) DO UPDATE
               SET description = EXCLUDED.description, queries = EXCLUDED.queries,
                   public = EXCLUDED.public, created_at = now()",
        )
        .bind(version_id)
        .bind(skill_id)
        .bind(description)
        .bind(serde_json::json!(queries))
        .bind(public)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("storing a catalogue card"))?;
        sqlx::query(
            "INSERT INTO version_collisions (version_id, status) VALUES ($1, 'pending')
             ON CONFLICT (version_id) DO UPDATE
               SET status = 'pending', matrix = NULL, gate = NULL, neighbours = '{}',
                   error = NULL, created_at = now(), finished_at = NULL",
        )
        .bind(version_id)
        .execute(&mut *tx)
        .await
        .map_err(StoreError::query("starting a collision eval"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("storing a catalogue card"))
    }

    /// The catalogue `publisher_id`'s upload is compared with: the latest card of every other
    /// skill that this publisher owns or that is public. Another publisher's private skill is
    /// never in it (the filter is in this `WHERE`).
    pub async fn catalogue_for(
        &self,
        publisher_id: Uuid,
        except_skill: Uuid,
    ) -> Result<Vec<CatalogueCard>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT ON (c.skill_id) c.skill_id, s.name, s.publisher_id, c.description,
                    c.queries, c.public
               FROM catalogue_cards c JOIN skills s ON s.id = c.skill_id
              WHERE c.skill_id <> $2
              ORDER BY c.skill_id, c.created_at DESC",
        )
        .bind(publisher_id)
        .bind(except_skill)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading the catalogue"))?;
        let mut cards = Vec::with_capacity(rows.len());
        for row in rows {
            // The latest card decides: a skill made private again leaves the catalogue.
            let owner: Uuid = row.get("publisher_id");
            let public: bool = row.get("public");
            if owner != publisher_id && !public {
                continue;
            }
            let queries: Value = row.get("queries");
            cards.push(CatalogueCard {
                skill_id: row.get("skill_id"),
                name: row.get("name"),
                publisher_id: owner,
                description: row.get("description"),
                queries: serde_json::from_value(queries).unwrap_or_default(),
            });
        }
        Ok(cards)
    }

    /// Records the finished eval: its matrix, gate and neighbours.
    pub async fn finish_collisions(
        &self,
        version_id: Uuid,
        matrix: &Value,
        gate: Option<&Value>,
        neighbours: &[Uuid],
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE version_collisions
                SET status = 'completed', matrix = $2, gate = $3, neighbours = $4,
                    finished_at = now()
              WHERE version_id = $1",
        )
        .bind(version_id)
        .bind(matrix)
        .bind(gate)
        .bind(neighbours)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("storing a collision matrix"))?;
        Ok(())
    }

    /// Records why the eval could not run (a host fault: no provider answered).
    pub async fn fail_collisions(&self, version_id: Uuid, error: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE version_collisions SET status = 'failed', error = $2, finished_at = now()
              WHERE version_id = $1",
        )
        .bind(version_id)
        .bind(error)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("recording a failed collision eval"))?;
        Ok(())
    }

    /// The collision eval of the skill's latest version that has one.
    pub async fn latest_collisions(
        &self,
        skill_id: Uuid,
    ) -> Result<Option<CollisionRow>, StoreError> {
        let row = sqlx::query(
            "SELECT c.version_id, v.version, c.status, c.matrix, c.gate, c.error, c.created_at,
                    c.finished_at
               FROM version_collisions c JOIN skill_versions v ON v.id = c.version_id
              WHERE v.skill_id = $1
              ORDER BY c.created_at DESC
              LIMIT 1",
        )
        .bind(skill_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a collision matrix"))?;
        Ok(row.map(|row| CollisionRow {
            version_id: row.get("version_id"),
            version: row.get("version"),
            status: row.get("status"),
            matrix: row.get("matrix"),
            gate: row.get("gate"),
            error: row.get("error"),
            created_at: row.get("created_at"),
            finished_at: row.get("finished_at"),
        }))
    }

    /// The latest completed matrix of each other skill that names `skill_id` as a neighbour.
    pub async fn collisions_naming(&self, skill_id: Uuid) -> Result<Vec<NamingRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT DISTINCT ON (v.skill_id) c.matrix, s.publisher_id,
                    COALESCE(cc.public, false) AS public
               FROM version_collisions c
               JOIN skill_versions v ON v.id = c.version_id
               JOIN skills s ON s.id = v.skill_id
               LEFT JOIN catalogue_cards cc ON cc.version_id = c.version_id
              WHERE c.status = 'completed' AND $1 = ANY (c.neighbours) AND v.skill_id <> $1
              ORDER BY v.skill_id, c.created_at DESC",
        )
        .bind(skill_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading collisions naming a skill"))?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                Some(NamingRow {
                    matrix: row.get::<Option<Value>, _>("matrix")?,
                    publisher_id: row.get("publisher_id"),
                    public: row.get("public"),
                })
            })
            .collect())
    }
}
