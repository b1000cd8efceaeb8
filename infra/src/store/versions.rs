//! Skills, their versions and eval definitions: storing an upload's version (deduplicated by
//! content hash), reading a version's definition to plan a run, the package bytes workers
//! fetch, and the versions endpoint's listing.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use super::{Store, StoreError};

/// A version to store, from a validated package.
#[derive(Debug)]
pub struct NewVersion<'a> {
    pub skill_name: &'a str,
    pub description: &'a str,
    pub description_hash: &'a str,
    pub package_hash: &'a str,
    pub package_bytes: &'a [u8],
    pub manifest: Value,
    /// `metadata.version` from SKILL.md; `None`: the next number for this skill.
    pub version_label: Option<String>,
    pub eval_version: &'a str,
    pub profile: &'a str,
    /// The templated definition (`EvalConfig`) the runs are planned from, as deflated JSON
    /// text (`skilleval_execution::plan::DefinitionText::deflated`: a definition of 100,000 cases is
    /// 44 MB of JSON, about 2 MB deflated).
    pub config_deflate: &'a [u8],
    /// The definition's `settings` alone (`null` when it has none): read on every poll of a
    /// run, so stored apart from the whole definition.
    pub settings: Value,
    pub test_cases: i32,
    /// The uploading publisher: owns the skill when it is new; must own it otherwise.
    pub publisher_id: Uuid,
    /// An `admin` upload may add a version to any publisher's skill (the owner stays).
    pub any_owner: bool,
    /// The package's risk report (`skilleval_model::package::RiskReport` as JSON).
    pub risk_report: Value,
    /// The models the definition names (what the skills list filters on).
    pub models: Vec<String>,
}

/// A stored version.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredVersion {
    pub skill_id: Uuid,
    pub version_id: Uuid,
    pub version: String,
    /// false: a version with the same package content existed and was reused.
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("version `{version}` of skill `{skill}` already exists with different content")]
    LabelTaken { skill: String, version: String },
    /// The name belongs to another publisher's skill.
    #[error("skill `{skill}` belongs to another publisher")]
    NameTaken { skill: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Creates the skill if new and stores the version with its eval config. A package whose
/// content hash the skill already has is the same version (returned, not duplicated).
#[tracing::instrument(skip_all, fields(skill = v.skill_name))]
async fn upsert_version(
    conn: &mut PgConnection,
    v: &NewVersion<'_>,
) -> Result<StoredVersion, VersionError> {
    // The conditional update returns no row when the name is another publisher's skill.
    let skill_id: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO skills (id, name, publisher_id) VALUES ($1, $2, $3)
         ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
         WHERE skills.publisher_id = EXCLUDED.publisher_id OR $4
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(v.skill_name)
    .bind(v.publisher_id)
    .bind(v.any_owner)
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("storing a version"))?;
    let Some(skill_id) = skill_id else {
        return Err(VersionError::NameTaken {
            skill: v.skill_name.to_string(),
        });
    };
    // Serialises version numbering per skill (the upsert above already row-locked it).
    let existing = sqlx::query(
        "SELECT id, version FROM skill_versions WHERE skill_id = $1 AND package_hash = $2",
    )
    .bind(skill_id)
    .bind(v.package_hash)
    .fetch_optional(&mut *conn)
    .await
    .map_err(StoreError::query("storing a version"))?;
    if let Some(row) = existing {
        let version: String = row
            .try_get("version")
            .map_err(StoreError::query("reading a stored version"))?;
        if v.version_label.as_ref().is_none_or(|l| *l == version) {
            return Ok(StoredVersion {
                skill_id,
                version_id: row
                    .try_get("id")
                    .map_err(StoreError::query("reading a stored version"))?,
                version,
                created: false,
            });
        }
    }
    let version = match &v.version_label {
        Some(label) => label.clone(),
        None => {
            let n: i64 =
                sqlx::query_scalar("SELECT count(*) FROM skill_versions WHERE skill_id = $1")
                    .bind(skill_id)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(StoreError::query("storing a version"))?;
            (n + 1).to_string()
        }
    };
    let version_id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO skill_versions
            (id, skill_id, version, description, description_hash, package_hash, package_bytes, manifest,
             risk_report, models)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (skill_id, version) DO NOTHING",
    )
    .bind(version_id)
    .bind(skill_id)
    .bind(&version)
    .bind(v.description)
    .bind(v.description_hash)
    .bind(v.package_hash)
    .bind(v.package_bytes)
    .bind(&v.manifest)
    .bind(&v.risk_report)
    .bind(&v.models)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("storing a version"))?;
    if inserted.rows_affected() == 0 {
        return Err(VersionError::LabelTaken {
            skill: v.skill_name.to_string(),
            version,
        });
    }
    sqlx::query(
        "INSERT INTO eval_configs
            (id, version_id, version, profile, config_deflate, test_cases, settings)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(Uuid::now_v7())
    .bind(version_id)
    .bind(v.eval_version)
    .bind(v.profile)
    .bind(v.config_deflate)
    .bind(v.test_cases)
    .bind(&v.settings)
    .execute(&mut *conn)
    .await
    .map_err(StoreError::query("storing a version"))?;
    Ok(StoredVersion {
        skill_id,
        version_id,
        version,
        created: true,
    })
}

/// What planning a run of a version needs.
#[derive(Debug, Clone)]
pub struct VersionForRun {
    pub version_id: Uuid,
    pub skill_name: String,
    pub version: String,
    pub package_hash: String,
    /// The definition as stored.
    pub config: StoredDefinition,
}

/// A version's definition as stored: deflated JSON text, or (versions stored before it was
/// deflated) plain JSON text.
#[derive(Debug, Clone)]
pub enum StoredDefinition {
    Deflated(Vec<u8>),
    Text(String),
}

async fn version_for_run(
    conn: &mut PgConnection,
    version_id: Uuid,
) -> Result<Option<VersionForRun>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT v.id, s.name, v.version, v.package_hash, c.config_deflate, c.config
         FROM skill_versions v
         JOIN skills s ON s.id = v.skill_id
         JOIN eval_configs c ON c.version_id = v.id
         WHERE v.id = $1",
    )
    .bind(version_id)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|r| {
        Ok(VersionForRun {
            version_id: r.try_get(0)?,
            skill_name: r.try_get(1)?,
            version: r.try_get(2)?,
            package_hash: r.try_get(3)?,
            config: match r.try_get::<Option<Vec<u8>>, _>(4)? {
                Some(bytes) => StoredDefinition::Deflated(bytes),
                None => StoredDefinition::Text(r.try_get(5)?),
            },
        })
    })
    .transpose()
}

/// The stored ZIP of a package, by content hash (what workers fetch and cache).
async fn package_bytes(pool: &PgPool, package_hash: &str) -> Result<Option<Vec<u8>>, sqlx::Error> {
    sqlx::query_scalar("SELECT package_bytes FROM skill_versions WHERE package_hash = $1 LIMIT 1")
        .bind(package_hash)
        .fetch_optional(pool)
        .await
}

/// The stored ZIP of a version's package, by version id.
/// A version as the versions endpoint lists it, with its latest run.
#[derive(Debug, Clone)]
pub struct VersionRow {
    pub version_id: Uuid,
    pub version: String,
    pub description: String,
    pub package_hash: String,
    pub profile: String,
    pub test_cases: i32,
    pub created_at: DateTime<Utc>,
    pub latest_run: Option<(Uuid, String, Option<String>)>,
}

/// The skill's id and its versions, newest first; `None` for an unknown skill.
async fn versions_of(
    pool: &PgPool,
    name: &str,
) -> Result<Option<(Uuid, Vec<VersionRow>)>, sqlx::Error> {
    let Some(skill_id): Option<Uuid> = sqlx::query_scalar("SELECT id FROM skills WHERE name = $1")
        .bind(name)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let rows = sqlx::query(
        "SELECT v.id, v.version, v.description, v.package_hash, c.profile, c.test_cases, v.created_at,
                lr.id, lr.status, lr.verdict
         FROM skill_versions v
         JOIN eval_configs c ON c.version_id = v.id
         LEFT JOIN LATERAL (
             SELECT id, status, verdict FROM runs WHERE version_id = v.id ORDER BY created_at DESC LIMIT 1
         ) lr ON true
         WHERE v.skill_id = $1
         ORDER BY v.created_at DESC",
    )
    .bind(skill_id)
    .fetch_all(pool)
    .await?;
    let versions = rows
        .into_iter()
        .map(|r| {
            let run_id: Option<Uuid> = r.try_get(7)?;
            let run_status: Option<String> = r.try_get(8)?;
            Ok(VersionRow {
                version_id: r.try_get(0)?,
                version: r.try_get(1)?,
                description: r.try_get(2)?,
                package_hash: r.try_get(3)?,
                profile: r.try_get(4)?,
                test_cases: r.try_get(5)?,
                created_at: r.try_get(6)?,
                latest_run: run_id
                    .zip(run_status)
                    .map(|(id, status)| (id, status, r.try_get(9).ok().flatten())),
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Some((skill_id, versions)))
}

/// The skill and version names of runs, by run id.
async fn skill_versions_of_runs(
    pool: &PgPool,
    run_ids: &[Uuid],
) -> Result<Vec<(Uuid, String, String)>, sqlx::Error> {
    sqlx::query(
        "SELECT r.id, s.name, v.version FROM runs r
           JOIN skill_versions v ON v.id = r.version_id
           JOIN skills s ON s.id = v.skill_id
          WHERE r.id = ANY($1)",
    )
    .bind(run_ids)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
    .collect()
}

impl Store {
    /// The skill name and version of each of `run_ids` that exists (what a worker's
    /// evaluation events name).
    pub async fn skill_versions_of_runs(
        &self,
        run_ids: &[Uuid],
    ) -> Result<std::collections::HashMap<Uuid, (String, String)>, StoreError> {
        Ok(skill_versions_of_runs(self.pool(), run_ids)
            .await
            .map_err(StoreError::query("reading the skills of runs"))?
            .into_iter()
            .map(|(id, skill, version)| (id, (skill, version)))
            .collect())
    }

    /// Creates the skill if new and stores the version with its eval config, in the caller's
    /// transaction; a package whose content the skill already has is that version.
    #[tracing::instrument(skip_all, fields(skill = v.skill_name))]
    pub async fn upsert_version(
        &self,
        conn: &mut PgConnection,
        v: &NewVersion<'_>,
    ) -> Result<StoredVersion, VersionError> {
        upsert_version(conn, v).await
    }

    /// What planning a run of the version needs (`None`: no such version).
    pub async fn version_for_run(
        &self,
        conn: &mut PgConnection,
        version_id: Uuid,
    ) -> Result<Option<VersionForRun>, StoreError> {
        version_for_run(conn, version_id)
            .await
            .map_err(StoreError::query("reading a version to plan"))
    }

    /// The stored ZIP of a package, by content hash (what workers fetch and cache).
    pub async fn package_bytes(&self, package_hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        package_bytes(self.pool(), package_hash)
            .await
            .map_err(StoreError::query("reading a package"))
    }

    /// The skill's id and its versions, newest first; `None` for an unknown skill.
    pub async fn versions_of(
        &self,
        name: &str,
    ) -> Result<Option<(Uuid, Vec<VersionRow>)>, StoreError> {
        versions_of(self.pool(), name)
            .await
            .map_err(StoreError::query("listing a skill's versions"))
    }
}
