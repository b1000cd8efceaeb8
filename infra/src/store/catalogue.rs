//! Catalogue collisions (docs/catalogue.md): each version's catalogue card (description,
//! should-trigger queries, public or not), the catalogue a publisher's upload is compared
//! with (the latest card of every skill it owns or that is public), and the version's
//! collision matrix with its lifecycle (`pending` → `completed` | `failed`).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, Row};
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

/// A version's catalogue card as an upload stores it.
#[derive(Debug, Clone, Copy)]
pub struct NewCard<'a> {
    pub version_id: Uuid,
    pub skill_id: Uuid,
    pub description: &'a str,
    /// The should-trigger queries.
    pub queries: &'a [String],
    pub public: bool,
    /// The upload asked for `gate=no_collision`: its runs wait for the eval.
    pub gated: bool,
}

/// A skill's latest version that has no catalogue card, as the backfill reads it.
#[derive(Debug, Clone)]
pub struct UncataloguedVersion {
    pub version_id: Uuid,
    pub skill_id: Uuid,
    pub description: String,
    /// The stored ZIP (its trigger file gives the card's queries).
    pub package: Vec<u8>,
}

/// A pending eval a coordinator claimed: everything the eval reads, from the store, so a
/// coordinator other than the upload's can run it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedEval {
    pub version_id: Uuid,
    pub skill_id: Uuid,
    pub publisher_id: Uuid,
    pub name: String,
    pub description: String,
    pub queries: Vec<String>,
    pub public: bool,
    pub gated: bool,
    /// The version's package, by content hash ([`Store::package_bytes`]).
    pub package_hash: String,
    /// This claim's attempt, from 1.
    pub attempt: u32,
}

/// What a gated upload run's finalisation reads of its version's eval.
#[derive(Debug, Clone)]
pub struct GateState {
    pub status: CollisionStatus,
    /// The `no_collision` verdict (`CollisionGate` as JSON) once completed.
    pub gate: Option<Value>,
    pub error: Option<String>,
}

fn seconds(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

impl Store {
    /// Stores a version's card and starts its collision eval as `pending`, in the upload's
    /// transaction (so a gated run never exists without the eval it waits for); a second
    /// upload of the same version replaces both and starts the eval again.
    pub async fn put_catalogue_card(
        &self,
        conn: &mut PgConnection,
        card: &NewCard<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO catalogue_cards (version_id, skill_id, description, queries, public)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (version_id) DO UPDATE
               SET description = EXCLUDED.description, queries = EXCLUDED.queries,
                   public = EXCLUDED.public, created_at = now()",
        )
        .bind(card.version_id)
        .bind(card.skill_id)
        .bind(card.description)
        .bind(serde_json::json!(card.queries))
        .bind(card.public)
        .execute(&mut *conn)
        .await
        .map_err(StoreError::query("storing a catalogue card"))?;
        sqlx::query(
            "INSERT INTO version_collisions (version_id, status, gated) VALUES ($1, 'pending', $2)
             ON CONFLICT (version_id) DO UPDATE
               SET status = 'pending', matrix = NULL, gate = NULL, neighbours = '{}',
                   error = NULL, created_at = now(), finished_at = NULL,
                   gated = EXCLUDED.gated, attempts = 0, lease_until = NULL",
        )
        .bind(card.version_id)
        .bind(card.gated)
        .execute(&mut *conn)
        .await
        .map_err(StoreError::query("starting a collision eval"))?;
        Ok(())
    }

    /// Claims the version's eval for `lease` when it is pending and nobody holds it (never
    /// claimed, or its holder's lease lapsed); `None` otherwise. Each claim is an attempt.
    pub async fn claim_collisions(
        &self,
        version_id: Uuid,
        lease: std::time::Duration,
    ) -> Result<Option<ClaimedEval>, StoreError> {
        let row = sqlx::query(
            "WITH claimed AS (
                 UPDATE version_collisions
                    SET lease_until = now() + make_interval(secs => $2), attempts = attempts + 1
                  WHERE version_id = $1 AND status = 'pending'
                    AND (lease_until IS NULL OR lease_until < now())
              RETURNING version_id, gated, attempts)
             SELECT claimed.version_id, claimed.gated, claimed.attempts, c.skill_id,
                    c.description, c.queries, c.public, s.name, s.publisher_id, v.package_hash
               FROM claimed
               JOIN catalogue_cards c ON c.version_id = claimed.version_id
               JOIN skills s ON s.id = c.skill_id
               JOIN skill_versions v ON v.id = claimed.version_id",
        )
        .bind(version_id)
        .bind(seconds(lease))
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("claiming a collision eval"))?;
        Ok(row.map(|row| {
            let queries: Value = row.get("queries");
            ClaimedEval {
                version_id: row.get("version_id"),
                skill_id: row.get("skill_id"),
                publisher_id: row.get("publisher_id"),
                name: row.get("name"),
                description: row.get("description"),
                queries: serde_json::from_value(queries).unwrap_or_default(),
                public: row.get("public"),
                gated: row.get("gated"),
                package_hash: row.get("package_hash"),
                attempt: u32::try_from(row.get::<i32, _>("attempts")).unwrap_or(0),
            }
        }))
    }

    /// Extends a held claim; `false` when the eval is no longer pending.
    pub async fn renew_collisions(
        &self,
        version_id: Uuid,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE version_collisions SET lease_until = now() + make_interval(secs => $2)
              WHERE version_id = $1 AND status = 'pending'",
        )
        .bind(version_id)
        .bind(seconds(lease))
        .execute(self.pool())
        .await
        .map_err(StoreError::query("renewing a collision eval's claim"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Gives a claimed eval back after a host fault: it stays `pending` and no coordinator
    /// claims it again before `retry_after`; `error` says what failed meanwhile.
    pub async fn release_collisions(
        &self,
        version_id: Uuid,
        error: &str,
        retry_after: std::time::Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE version_collisions
                SET lease_until = now() + make_interval(secs => $3), error = $2
              WHERE version_id = $1 AND status = 'pending'",
        )
        .bind(version_id)
        .bind(error)
        .bind(seconds(retry_after))
        .execute(self.pool())
        .await
        .map_err(StoreError::query("releasing a collision eval"))?;
        Ok(())
    }

    /// Pending evals nobody holds: never claimed, or whose holder's lease lapsed (the
    /// coordinator stopped), oldest first.
    pub async fn unclaimed_collisions(&self, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query_scalar(
            "SELECT version_id FROM version_collisions
              WHERE status = 'pending' AND (lease_until IS NULL OR lease_until < now())
              ORDER BY created_at LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing unclaimed collision evals"))
    }

    /// The version's eval as a gated run's finalisation needs it; `None` when the version's
    /// upload did not ask for the gate (or it has no eval).
    pub async fn collision_gate_of(
        &self,
        version_id: Uuid,
    ) -> Result<Option<GateState>, StoreError> {
        let row = sqlx::query(
            "SELECT status, gate, error FROM version_collisions
              WHERE version_id = $1 AND gated",
        )
        .bind(version_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a collision gate"))?;
        Ok(row.map(|row| GateState {
            status: row.get("status"),
            gate: row.get("gate"),
            error: row.get("error"),
        }))
    }

    /// The version's upload runs that have every case recorded and are not finalised: those
    /// that wait for its eval when its upload asked for `gate=no_collision`.
    pub async fn runs_awaiting_collisions(
        &self,
        version_id: Uuid,
    ) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query_scalar(
            "SELECT id FROM runs
              WHERE version_id = $1 AND kind = 'upload' AND NOT finalised AND completed >= total",
        )
        .bind(version_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query(
            "listing runs waiting on a collision eval",
        ))
    }

    /// Skills with no catalogue card at all (uploaded before cards existed): the latest
    /// version of each, with its description and stored package, at most `limit`.
    pub async fn uncatalogued_versions(
        &self,
        limit: i64,
    ) -> Result<Vec<UncataloguedVersion>, StoreError> {
        let rows = sqlx::query(
            "SELECT v.id, v.skill_id, v.description, v.package_bytes
               FROM (SELECT DISTINCT ON (v.skill_id) v.id
                       FROM skill_versions v
                      WHERE NOT EXISTS
                            (SELECT 1 FROM catalogue_cards c WHERE c.skill_id = v.skill_id)
                      ORDER BY v.skill_id, v.created_at DESC
                      LIMIT $1) latest
               JOIN skill_versions v ON v.id = latest.id",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing skills without a catalogue card"))?;
        Ok(rows
            .into_iter()
            .map(|row| UncataloguedVersion {
                version_id: row.get("id"),
                skill_id: row.get("skill_id"),
                description: row.get("description"),
                package: row.get("package_bytes"),
            })
            .collect())
    }

    /// Adds the card of a version uploaded before cards existed: private (its publisher never
    /// said otherwise), and without a collision eval (it was not gated on one). A card
    /// already there (another coordinator's backfill, or an upload meanwhile) is kept.
    pub async fn backfill_card(
        &self,
        version_id: Uuid,
        skill_id: Uuid,
        description: &str,
        queries: &[String],
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "INSERT INTO catalogue_cards (version_id, skill_id, description, queries, public,
                                          created_at)
             SELECT $1, $2, $3, $4, false, v.created_at FROM skill_versions v WHERE v.id = $1
             ON CONFLICT (version_id) DO NOTHING",
        )
        .bind(version_id)
        .bind(skill_id)
        .bind(description)
        .bind(serde_json::json!(queries))
        .execute(self.pool())
        .await
        .map_err(StoreError::query("backfilling a catalogue card"))?;
        Ok(done.rows_affected() == 1)
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
                    error = NULL, finished_at = now(), lease_until = NULL
              WHERE version_id = $1 AND status = 'pending'",
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

    /// Records why the eval could not run: a configuration problem (no provider), or a host
    /// fault that outlasted every attempt.
    pub async fn fail_collisions(&self, version_id: Uuid, error: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE version_collisions
                SET status = 'failed', error = $2, finished_at = now(), lease_until = NULL
              WHERE version_id = $1 AND status = 'pending'",
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
