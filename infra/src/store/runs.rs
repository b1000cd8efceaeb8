//! The coordinator's SQL: skills, versions, eval configs, run creation, queries, cancellation,
//! the publish sweeper and finalisation. Workers' SQL (result upserts, counters) lives in
//! [`super::results`]; the two meet on `eval_results` rows and `runs` counters:
//!
//! - a run is created with one `queued` row per case, in one transaction ([`insert_run`],
//!   [`insert_queued`]) or,
//!   streamed, chunk by chunk while it is `creating` ([`insert_chunk`], [`begin_settle`]);
//! - a queued row is published once the broker confirmed it: `published_at` set, or its
//!   `case_index` under the run's `published_through` watermark;
//! - a row leaves `queued` exactly once, by a worker's upsert or by [`skip_queued`] (cancel,
//!   failFast, a budget stop), and whoever moves it bumps the run's counters in the same statement;
//! - a run whose `completed` reached `total` is finalised once ([`finalise`]: a conditional
//!   `UPDATE ... WHERE NOT finalised`).
//!
//! All queries are checked at run time (no database needed to build).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use skilleval::plan::Job;

/// Rows per `INSERT` when creating a run.
const INSERT_CHUNK: usize = 5_000;

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
    /// text (`skilleval::plan::DefinitionText::deflated`: a definition of 100,000 cases is
    /// 44 MB of JSON, about 2 MB deflated).
    pub config_deflate: &'a [u8],
    /// The definition's `settings` alone (`null` when it has none): read on every poll of a
    /// run, so stored apart from the whole definition.
    pub settings: Value,
    pub test_cases: i32,
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
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

/// Creates the skill if new and stores the version with its eval config. A package whose
/// content hash the skill already has is the same version (returned, not duplicated).
#[tracing::instrument(skip_all, fields(skill = v.skill_name))]
pub async fn upsert_version(
    conn: &mut PgConnection,
    v: &NewVersion<'_>,
) -> Result<StoredVersion, VersionError> {
    let skill_id: Uuid = sqlx::query_scalar(
        "INSERT INTO skills (id, name) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name
         RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(v.skill_name)
    .fetch_one(&mut *conn)
    .await?;
    // Serialises version numbering per skill (the upsert above already row-locked it).
    let existing = sqlx::query(
        "SELECT id, version FROM skill_versions WHERE skill_id = $1 AND package_hash = $2",
    )
    .bind(skill_id)
    .bind(v.package_hash)
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(row) = existing {
        let version: String = row.try_get("version")?;
        if v.version_label.as_ref().is_none_or(|l| *l == version) {
            return Ok(StoredVersion {
                skill_id,
                version_id: row.try_get("id")?,
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
                    .await?;
            (n + 1).to_string()
        }
    };
    let version_id = Uuid::now_v7();
    let inserted = sqlx::query(
        "INSERT INTO skill_versions
            (id, skill_id, version, description, description_hash, package_hash, package_bytes, manifest)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
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
    .execute(&mut *conn)
    .await?;
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
    .await?;
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

pub async fn version_for_run(
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
pub async fn package_bytes(
    pool: &PgPool,
    package_hash: &str,
) -> Result<Option<Vec<u8>>, sqlx::Error> {
    sqlx::query_scalar("SELECT package_bytes FROM skill_versions WHERE package_hash = $1 LIMIT 1")
        .bind(package_hash)
        .fetch_optional(pool)
        .await
}

/// A run to create.
#[derive(Debug)]
pub struct NewRun<'a> {
    pub id: Uuid,
    pub version_id: Uuid,
    /// `upload` or `manual`.
    pub kind: &'a str,
    pub runner: Option<Value>,
    pub callback_url: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    /// `maxConcurrentTests`: jobs of this run in flight at once (`None`: all).
    pub max_in_flight: Option<i32>,
    pub fail_fast: bool,
    /// The request that made it (filters), for the record.
    pub request: Value,
    /// Budget: the run stops once its cases spent more than this (`None`: no cap).
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
    /// Streamed creation: [`insert_run`] inserts only the run (marked `creating`, its `total`
    /// the jobs' count); the creator then adds the rows with [`insert_chunk`].
    pub creating: bool,
}

/// Whether [`insert_run`] created the run or found the one with the same idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunInsert {
    Created(Uuid),
    Existing(Uuid),
}

impl RunInsert {
    pub fn run_id(self) -> Uuid {
        match self {
            RunInsert::Created(id) | RunInsert::Existing(id) => id,
        }
    }
}

/// Inserts the run (of `total` jobs), in the caller's transaction; a run not `creating` gets
/// its rows from [`insert_queued`] in the same transaction. With an idempotency key already
/// used, changes nothing and returns that run.
#[tracing::instrument(skip_all, fields(run_id = %run.id, jobs = total))]
pub async fn insert_run(
    conn: &mut PgConnection,
    run: &NewRun<'_>,
    total: usize,
) -> Result<RunInsert, sqlx::Error> {
    let total = i32::try_from(total).unwrap_or(i32::MAX);
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO runs
            (id, version_id, kind, status, total, runner, callback_url, idempotency_key,
             max_in_flight, fail_fast, request, budget_max_cost_usd, budget_max_tokens, creating)
         VALUES ($1, $2, $3, 'running', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (idempotency_key) DO NOTHING
         RETURNING id",
    )
    .bind(run.id)
    .bind(run.version_id)
    .bind(run.kind)
    .bind(total)
    .bind(&run.runner)
    .bind(run.callback_url)
    .bind(run.idempotency_key)
    .bind(run.max_in_flight)
    .bind(run.fail_fast)
    .bind(&run.request)
    .bind(run.max_cost_usd)
    .bind(run.max_tokens)
    .bind(run.creating)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(run_id) = inserted else {
        let existing: Uuid = sqlx::query_scalar("SELECT id FROM runs WHERE idempotency_key = $1")
            .bind(run.idempotency_key)
            .fetch_one(&mut *conn)
            .await?;
        return Ok(RunInsert::Existing(existing));
    };
    Ok(RunInsert::Created(run_id))
}

/// Inserts `queued` rows for `jobs` of a run created by [`insert_run`] (not `creating`), in
/// the caller's transaction (the run appears whole or not at all).
pub async fn insert_queued(
    conn: &mut PgConnection,
    run_id: Uuid,
    jobs: &[Job],
) -> Result<(), sqlx::Error> {
    // In chunks, so a large chunk's encoded rows are never all in memory at once.
    for chunk in jobs.chunks(INSERT_CHUNK) {
        let texts = encode_jobs(chunk)?;
        insert_rows(&mut *conn, run_id, chunk, &texts, RowsAs::Queued).await?;
    }
    Ok(())
}

/// Each job as the JSON text its row stores (and its message carries, see
/// [`EncodedJob::from_stored`](crate::messages::EncodedJob::from_stored)).
pub fn encode_jobs(jobs: &[Job]) -> Result<Vec<String>, sqlx::Error> {
    jobs.iter()
        .map(|job| serde_json::to_string(job).map_err(|e| sqlx::Error::Encode(Box::new(e))))
        .collect()
}

/// How [`insert_rows`] creates rows.
#[derive(Debug, Clone, Copy)]
enum RowsAs<'a> {
    /// `queued`, as a run is created.
    Queued,
    /// `queued`, leaving alone the cases that already have a row (resuming a creation).
    QueuedIfMissing,
    /// `skipped` with this reason (the run stopped before they were queued), counted as
    /// completed in the same statement; cases that already have a row are left alone.
    SkippedIfMissing(&'a str),
}

/// Inserts rows for `jobs` (their JSON `texts` alongside) in one statement.
async fn insert_rows(
    conn: &mut PgConnection,
    run_id: Uuid,
    jobs: &[Job],
    texts: &[String],
    how: RowsAs<'_>,
) -> Result<(), sqlx::Error> {
    let mut ids = Vec::with_capacity(jobs.len());
    let mut names = Vec::with_capacity(jobs.len());
    let mut indexes = Vec::with_capacity(jobs.len());
    let mut strategies = Vec::with_capacity(jobs.len());
    let mut weights = Vec::with_capacity(jobs.len());
    for job in jobs {
        ids.push(job.case.id.as_str());
        names.push(job.case.name.as_str());
        indexes.push(i32::try_from(job.case_index).unwrap_or(i32::MAX));
        strategies.push(job.strategy());
        weights.push(job.case.weight);
    }
    // The rows as one `UNNEST` ($2..$7), shared by the three statements below.
    macro_rules! from_rows {
        () => {
            " FROM UNNEST($2::text[], $3::text[], $4::int4[], $5::text[], $6::float8[], $7::text[])
                   AS t(id, name, idx, strategy, weight, job)"
        };
    }
    const QUEUED: &str = concat!(
        "INSERT INTO eval_results (run_id, test_case_id, name, case_index, strategy, weight, status, job)
         SELECT $1, t.id, t.name, t.idx, t.strategy, t.weight, 'queued', t.job",
        from_rows!()
    );
    const QUEUED_IF_MISSING: &str = concat!(
        "INSERT INTO eval_results (run_id, test_case_id, name, case_index, strategy, weight, status, job)
         SELECT $1, t.id, t.name, t.idx, t.strategy, t.weight, 'queued', t.job",
        from_rows!(),
        " ON CONFLICT (run_id, test_case_id) DO NOTHING"
    );
    const SKIPPED_IF_MISSING: &str = concat!(
        "WITH added AS (
             INSERT INTO eval_results (run_id, test_case_id, name, case_index, strategy, weight,
                                       status, job, details, finished_at)
             SELECT $1, t.id, t.name, t.idx, t.strategy, t.weight, 'skipped', t.job,
                    jsonb_build_object('skipped', $8::text), now()",
        from_rows!(),
        " ON CONFLICT (run_id, test_case_id) DO NOTHING
             RETURNING 1
         ), n AS (SELECT count(*)::int AS n FROM added)
         UPDATE runs SET completed = completed + n.n, skipped = skipped + n.n
         FROM n WHERE runs.id = $1"
    );
    let (sql, reason) = match how {
        RowsAs::Queued => (QUEUED, None),
        RowsAs::QueuedIfMissing => (QUEUED_IF_MISSING, None),
        RowsAs::SkippedIfMissing(reason) => (SKIPPED_IF_MISSING, Some(reason)),
    };
    let mut query = sqlx::query(sql)
        .bind(run_id)
        .bind(&ids)
        .bind(&names)
        .bind(&indexes)
        .bind(&strategies)
        .bind(&weights)
        .bind(texts);
    if let Some(reason) = reason {
        query = query.bind(reason);
    }
    query.execute(&mut *conn).await?;
    Ok(())
}

/// Streamed creation: inserts one chunk of a `creating` run's rows as `queued` in a
/// transaction of its own (committed before its jobs are published), if the run still runs.
/// `last`: the same transaction ends the creation. Returns `false`, inserting nothing, when
/// the run was cancelled, stopped by its budget or finalised meanwhile (see
/// [`begin_settle`]).
///
/// The check takes a `KEY SHARE` lock on the run: a cancel (`FOR UPDATE`) waits for the chunk
/// and then skips its rows, while workers recording results (which update the run's counters)
/// are not held up. A budget stop does not wait for it either: a chunk that passed the check
/// just before one is queued and published (the budget overshoots by at most one chunk), and
/// the creator settles the run at the next chunk.
pub async fn insert_chunk(
    conn: &mut PgConnection,
    run_id: Uuid,
    jobs: &[Job],
    texts: &[String],
    last: bool,
) -> Result<bool, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let live: Option<i32> = sqlx::query_scalar(
        "SELECT 1 FROM runs
         WHERE id = $1 AND creating AND status = 'running' AND NOT finalised AND stop_reason IS NULL
         FOR KEY SHARE",
    )
    .bind(run_id)
    .fetch_optional(&mut *tx)
    .await?;
    if live.is_none() {
        return Ok(false);
    }
    insert_rows(&mut tx, run_id, jobs, texts, RowsAs::Queued).await?;
    if last {
        end_creation(&mut tx, run_id).await?;
    }
    tx.commit().await?;
    Ok(true)
}

/// Marks a run's creation finished (its rows are all in).
async fn end_creation(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET creating = false WHERE id = $1")
        .bind(run_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Ends the creation of a run whose remaining cases cannot be queued, or whose creator died:
/// under the run's row lock, inserts the cases that have no row yet ([`Settling::add`], a
/// chunk at a time) — `queued` if the run still runs, else `skipped` — skips rows a stop raced
/// with, and ends the creation ([`Settling::finish`]), all in one transaction. `None` when the
/// run is not being created (any more): someone settled it already.
pub async fn begin_settle(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<Settling<'_>>, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    let state: Option<(bool, String)> = sqlx::query_as(
        "SELECT status = 'running' AND NOT finalised AND stop_reason IS NULL, status
         FROM runs WHERE id = $1 AND creating FOR UPDATE",
    )
    .bind(run_id)
    .fetch_optional(&mut *tx)
    .await?;
    Ok(state.map(|(live, status)| Settling {
        tx,
        run_id,
        live,
        reason: if status == "cancelled" {
            "the run was cancelled"
        } else {
            "the run stopped before this case was queued"
        },
    }))
}

/// A creation being settled ([`begin_settle`]): the run's row locked in a transaction.
pub struct Settling<'c> {
    tx: sqlx::Transaction<'c, sqlx::Postgres>,
    run_id: Uuid,
    live: bool,
    /// Why the cases are skipped, when the run stopped.
    reason: &'static str,
}

impl Settling<'_> {
    /// Whether the run still runs (its remaining cases are queued, not skipped).
    pub fn live(&self) -> bool {
        self.live
    }

    /// Inserts the cases of `jobs` that have no row yet.
    pub async fn add(&mut self, jobs: &[Job]) -> Result<(), sqlx::Error> {
        let how = if self.live {
            RowsAs::QueuedIfMissing
        } else {
            RowsAs::SkippedIfMissing(self.reason)
        };
        for chunk in jobs.chunks(INSERT_CHUNK) {
            let texts = encode_jobs(chunk)?;
            insert_rows(&mut self.tx, self.run_id, chunk, &texts, how).await?;
        }
        Ok(())
    }

    /// Skips the rows a stop raced with (a chunk that passed its check just before it), ends
    /// the creation and commits. Returns whether the run still runs (its unpublished rows are
    /// to be released).
    pub async fn finish(mut self) -> Result<bool, sqlx::Error> {
        if !self.live {
            skip_queued(&mut self.tx, self.run_id, self.reason).await?;
        }
        end_creation(&mut self.tx, self.run_id).await?;
        self.tx.commit().await?;
        Ok(self.live)
    }
}

/// Records that the broker confirmed every job of the run below `case_index` (a streamed
/// creation's watermark; it only moves forward).
pub async fn advance_published(
    conn: &mut PgConnection,
    run_id: Uuid,
    case_index: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET published_through = $2 WHERE id = $1 AND published_through < $2")
        .bind(run_id)
        .bind(case_index)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Runs still `creating` after `grace_secs`: either a large creation still under way (its
/// creator holds the run's release lock) or one whose creator died.
pub async fn runs_left_creating(
    pool: &PgPool,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs WHERE creating AND created_at < now() - make_interval(secs => $1)
         ORDER BY created_at LIMIT $2",
    )
    .bind(grace_secs)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The request a run was created with (to plan it again): its runner override and filter.
#[derive(Debug, Clone)]
pub struct RunPlanRequest {
    pub version_id: Uuid,
    pub runner: Option<Value>,
    pub request: Value,
}

pub async fn run_plan_request(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<RunPlanRequest>, sqlx::Error> {
    let row: Option<(Uuid, Option<Value>, Value)> =
        sqlx::query_as("SELECT version_id, runner, request FROM runs WHERE id = $1")
            .bind(run_id)
            .fetch_optional(&mut *conn)
            .await?;
    Ok(row.map(|(version_id, runner, request)| RunPlanRequest {
        version_id,
        runner,
        request,
    }))
}

/// Serialises releasers of one run (creation, events, the sweeper, other replicas) on this
/// connection's session until [`unlock_run_release`], so `maxConcurrentTests` is never
/// overshot by a race and two releasers never publish the same rows. A session lock (not a
/// transaction's) because a release commits page by page: rows a worker must update are not
/// held locked for the whole release. The lock goes with the connection if the process dies.
pub async fn lock_run_release(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// [`lock_run_release`] without waiting: `false` when another session holds the lock (a
/// creator or releaser of the run is alive).
pub async fn try_lock_run_release(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .fetch_one(&mut *conn)
        .await
}

/// Releases [`lock_run_release`]'s lock.
pub async fn unlock_run_release(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// How many more of a run's jobs may be published now: `None` when the run is not running
/// (nothing to publish), `Some(None)` when no cap holds jobs back, `Some(Some(n))` under
/// `max_in_flight` (what the cap leaves after the published, still queued rows). Call under
/// [`lock_run_release`].
pub async fn release_room(
    conn: &mut PgConnection,
    run_id: Uuid,
) -> Result<Option<Option<i64>>, sqlx::Error> {
    let cap: Option<Option<i32>> = sqlx::query_scalar(
        "SELECT max_in_flight FROM runs WHERE id = $1 AND status = 'running' AND NOT finalised",
    )
    .bind(run_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(cap) = cap else { return Ok(None) };
    let Some(cap) = cap else {
        return Ok(Some(None));
    };
    let in_flight: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM eval_results e JOIN runs r ON r.id = e.run_id
         WHERE e.run_id = $1 AND e.status = 'queued'
           AND (e.published_at IS NOT NULL OR e.case_index < r.published_through)",
    )
    .bind(run_id)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Some(Some((i64::from(cap) - in_flight).max(0))))
}

/// A run's unpublished `queued` rows in case order, at most `limit` (`None`: all), streamed
/// from one query (see [`case_rows`] for why not keyset pages): case id and the stored job as
/// JSON text (published as it is, see
/// [`EncodedJob::from_stored`](crate::messages::EncodedJob::from_stored)).
pub fn unpublished_rows(
    conn: &mut PgConnection,
    run_id: Uuid,
    limit: Option<i64>,
) -> impl futures::Stream<Item = Result<(String, String), sqlx::Error>> + Send + '_ {
    sqlx::query_as(
        "SELECT test_case_id, job FROM eval_results
         WHERE run_id = $1 AND status = 'queued' AND published_at IS NULL
           AND case_index >= (SELECT published_through FROM runs WHERE id = $1)
         ORDER BY case_index LIMIT $2",
    )
    .bind(run_id)
    .bind(limit)
    .fetch(conn)
}

/// Records the broker's confirms for these cases (one statement): `published_at` becomes
/// `sent_at`, the database's clock read just before the jobs were sent (so the time from
/// publish to result is measured from the send, never negative for a worker faster than the
/// confirm), or the statement's time when it is unknown.
///
/// Rows a worker holds locked (it is recording their result right now) are skipped rather
/// than waited for: waiting let this statement and a worker's batch lock overlapping rows in
/// different orders, and the deadlock PostgreSQL then broke could abort the release (seen at
/// 512 jobs in flight: the rest of the run waited 30 s for the sweeper). A skipped row is
/// leaving `queued` anyway; if its worker rolls back, the sweeper publishes it again, which is
/// harmless.
pub async fn mark_published(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    case_ids: &[String],
    sent_at: Option<DateTime<Utc>>,
) -> Result<u64, sqlx::Error> {
    if case_ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query(
        "UPDATE eval_results SET published_at = COALESCE($3, now())
         WHERE run_id = $1
           AND test_case_id IN (SELECT test_case_id FROM eval_results
                                WHERE run_id = $1 AND test_case_id = ANY($2)
                                  AND published_at IS NULL
                                FOR UPDATE SKIP LOCKED)",
    )
    .bind(run_id)
    .bind(case_ids)
    .bind(sent_at)
    .execute(conn)
    .await?;
    Ok(done.rows_affected())
}

/// The database's clock now (`clock_timestamp()`, not the transaction's start).
pub async fn db_clock(conn: impl sqlx::PgExecutor<'_>) -> Result<DateTime<Utc>, sqlx::Error> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(conn)
        .await
}

/// Runs with a `queued`, unpublished row older than `grace_secs`: a coordinator died between
/// commit and publish, a publish was nacked, or `maxConcurrentTests` holds jobs back (the
/// release respects the cap, so listing those is harmless).
pub async fn runs_with_unpublished_jobs(
    pool: &PgPool,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT DISTINCT e.run_id FROM eval_results e JOIN runs r ON r.id = e.run_id
         WHERE e.status = 'queued' AND e.published_at IS NULL AND r.status = 'running'
           AND e.case_index >= r.published_through AND NOT r.creating
           AND NOT r.finalised AND e.queued_at < now() - make_interval(secs => $1)
         LIMIT $2",
    )
    .bind(grace_secs)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Marks every `queued` row of a run `skipped` and counts them as completed, in one statement;
/// rows a worker finished first are untouched. Returns how many were skipped.
pub async fn skip_queued(
    conn: &mut PgConnection,
    run_id: Uuid,
    reason: &str,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(
        "WITH skipped AS (
             UPDATE eval_results
             SET status = 'skipped', finished_at = now(),
                 details = jsonb_build_object('skipped', $2::text)
             WHERE run_id = $1 AND status = 'queued'
             RETURNING 1
         ), n AS (SELECT count(*)::int AS n FROM skipped)
         UPDATE runs SET completed = completed + n.n, skipped = skipped + n.n
         FROM n WHERE runs.id = $1
         RETURNING n.n::int8",
    )
    .bind(run_id)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await
    .map(|n| n.unwrap_or(0))
}

/// What a cancel request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    NotFound,
    /// The run had already finished with this status.
    AlreadyFinished(String),
    Cancelled {
        skipped: i64,
    },
}

/// Cancels a run that is still going: status `cancelled`, its queued cases `skipped`.
#[tracing::instrument(skip(pool))]
pub async fn cancel_run(pool: &PgPool, run_id: Uuid) -> Result<CancelOutcome, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let status: Option<(String, bool)> =
        sqlx::query_as("SELECT status, finalised FROM runs WHERE id = $1 FOR UPDATE")
            .bind(run_id)
            .fetch_optional(&mut *tx)
            .await?;
    let outcome = match status {
        None => CancelOutcome::NotFound,
        Some((status, finalised))
            if finalised || !matches!(status.as_str(), "pending" | "running") =>
        {
            CancelOutcome::AlreadyFinished(status)
        }
        Some(_) => {
            sqlx::query("UPDATE runs SET status = 'cancelled' WHERE id = $1")
                .bind(run_id)
                .execute(&mut *tx)
                .await?;
            let skipped = skip_queued(&mut tx, run_id, "the run was cancelled").await?;
            CancelOutcome::Cancelled { skipped }
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// What an event needs to know about its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunProgress {
    /// `running` and not finalised.
    pub running: bool,
    pub fail_fast: bool,
    /// `maxConcurrentTests` holds jobs back (`max_in_flight` set).
    pub capped: bool,
    /// The counters are complete and the run awaits finalisation.
    pub complete: bool,
}

/// The run's state for an event, in one read of its row (`None`: no such run).
pub async fn progress(pool: &PgPool, run_id: Uuid) -> Result<Option<RunProgress>, sqlx::Error> {
    let row: Option<(bool, bool, bool, bool)> = sqlx::query_as(
        "SELECT status = 'running' AND NOT finalised, fail_fast, max_in_flight IS NOT NULL,
                completed >= total AND NOT finalised AND NOT creating
         FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?;
    Ok(
        row.map(|(running, fail_fast, capped, complete)| RunProgress {
            running,
            fail_fast,
            capped,
            complete,
        }),
    )
}

/// failFast: skips the rest of a running run after a failure (the run then completes).
pub async fn stop_after_failure(
    pool: &PgPool,
    run_id: Uuid,
    case_id: &str,
) -> Result<i64, sqlx::Error> {
    let mut tx = pool.begin().await?;
    let running: Option<String> = sqlx::query_scalar(
        "SELECT status FROM runs WHERE id = $1 AND status = 'running' AND fail_fast FOR UPDATE",
    )
    .bind(run_id)
    .fetch_optional(&mut *tx)
    .await?;
    let skipped = if running.is_some() {
        skip_queued(
            &mut tx,
            run_id,
            &format!("failFast: case `{case_id}` did not pass"),
        )
        .await?
    } else {
        0
    };
    tx.commit().await?;
    Ok(skipped)
}

/// Budget: stops a running run that went over its budget, in the caller's transaction (the one
/// that recorded the spending): sets `stop_reason` once and skips the run's remaining queued
/// rows through [`skip_queued`], so the counters stay exact and the run then completes and is
/// finalised like any other. Returns how many rows it skipped (0 when the run was already
/// stopped, cancelled or finalised).
pub async fn stop_for_budget(
    conn: &mut PgConnection,
    run_id: Uuid,
    reason: &str,
) -> Result<i64, sqlx::Error> {
    let stopped: Option<Uuid> = sqlx::query_scalar(
        "UPDATE runs SET stop_reason = $2
         WHERE id = $1 AND status = 'running' AND NOT finalised AND stop_reason IS NULL
         RETURNING id",
    )
    .bind(run_id)
    .bind(reason)
    .fetch_optional(&mut *conn)
    .await?;
    if stopped.is_none() {
        return Ok(0);
    }
    skip_queued(conn, run_id, reason).await
}

/// Runs whose counters are complete but that are not finalised yet (the aggregator's sweep).
pub async fn runs_ready_to_finalise(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs WHERE NOT finalised AND NOT creating AND completed >= total
         ORDER BY created_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Whether a run's counters are complete and it still awaits finalisation.
pub async fn is_ready_to_finalise(pool: &PgPool, run_id: Uuid) -> Result<bool, sqlx::Error> {
    let v: Option<bool> = sqlx::query_scalar(
        "SELECT completed >= total AND NOT creating FROM runs WHERE id = $1 AND NOT finalised",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?;
    Ok(v.unwrap_or(false))
}

/// One row of a run as the summary reads it: the stored result when the case finished, else
/// the job (to describe a case that never ran).
#[derive(Debug, Clone)]
pub struct CaseRow {
    pub case_index: i32,
    pub test_case_id: String,
    pub status: String,
    /// The stored result as JSON text (parsed straight into its type by the reader: no
    /// intermediate `Value`, which cost more than the query when summarising a large run).
    pub result: Option<String>,
    /// Only read when there is no result (the job describes a case that never ran).
    pub job: Option<String>,
    /// Likewise only when there is no result (why the case was skipped).
    pub details: Option<Value>,
}

/// Every row of a run in case order, streamed from one query (the server sends rows as they
/// are read; the caller holds one at a time). One query rather than keyset pages: for a run
/// just created, the planner estimates a few hundred rows and answers each page with a bitmap
/// scan and sort of every remaining row, which made pages O(N) each and a 30,000-case
/// finalisation take 4 s; one scan and one sort are O(N log N) in all.
pub fn case_rows(
    pool: &PgPool,
    run_id: Uuid,
) -> impl futures::Stream<Item = Result<CaseRow, sqlx::Error>> + Send + '_ {
    use futures::StreamExt as _;
    sqlx::query(
        "SELECT case_index, test_case_id, status, result,
                CASE WHEN result IS NULL THEN job END,
                CASE WHEN result IS NULL THEN details END
         FROM eval_results
         WHERE run_id = $1 ORDER BY case_index",
    )
    .bind(run_id)
    .fetch(pool)
    .map(|row| {
        let r = row?;
        Ok(CaseRow {
            case_index: r.try_get(0)?,
            test_case_id: r.try_get(1)?,
            status: r.try_get(2)?,
            result: r.try_get(3)?,
            job: r.try_get(4)?,
            details: r.try_get(5)?,
        })
    })
}

/// Finalises a run exactly once: the first caller whose conditional update matches wins and
/// gets `true`; every later or concurrent caller gets `false` and must not notify anyone.
/// A cancelled run keeps its status; any other becomes `completed`.
#[tracing::instrument(skip(pool, summary))]
pub async fn finalise(
    pool: &PgPool,
    run_id: Uuid,
    summary: &Value,
    verdict: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE runs
         SET finalised = true, summary = $2, verdict = $3, finished_at = now(),
             status = CASE WHEN status = 'cancelled' THEN 'cancelled' ELSE 'completed' END
         WHERE id = $1 AND NOT finalised AND NOT creating AND completed >= total",
    )
    .bind(run_id)
    .bind(summary)
    .bind(verdict)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A run as the API shows it.
#[derive(Debug, Clone)]
pub struct RunRow {
    pub id: Uuid,
    pub version_id: Uuid,
    pub skill: String,
    pub version: String,
    pub description: String,
    pub package_hash: String,
    pub profile: String,
    /// The definition's `settings` only (not the whole definition, which grows with the cases
    /// and would be read on every poll of a run); `null` when it has none.
    pub settings: Value,
    pub kind: String,
    pub status: String,
    pub total: i32,
    pub completed: i32,
    pub passed: i32,
    pub failed: i32,
    pub errored: i32,
    pub skipped: i32,
    pub summary: Option<Value>,
    pub verdict: Option<String>,
    pub callback_url: Option<String>,
    pub finalised: bool,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// What the recorded cases spent, producing and grading together.
    pub tokens: i64,
    pub cost_usd: f64,
    pub max_tokens: Option<i64>,
    pub max_cost_usd: Option<f64>,
    /// Why the run stopped early (a budget), when it did.
    pub stop_reason: Option<String>,
}

pub async fn get_run(pool: &PgPool, run_id: Uuid) -> Result<Option<RunRow>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT r.id, r.version_id, s.name, v.version, v.description, v.package_hash, c.profile,
                c.settings, r.kind, r.status, r.total, r.completed, r.passed, r.failed, r.errored, r.skipped,
                r.summary, r.verdict, r.callback_url, r.finalised, r.created_at, r.finished_at,
                r.tokens, r.cost_usd, r.budget_max_tokens, r.budget_max_cost_usd, r.stop_reason
         FROM runs r
         JOIN skill_versions v ON v.id = r.version_id
         JOIN skills s ON s.id = v.skill_id
         JOIN eval_configs c ON c.version_id = v.id
         WHERE r.id = $1",
    )
    .bind(run_id)
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(RunRow {
            id: r.try_get(0)?,
            version_id: r.try_get(1)?,
            skill: r.try_get(2)?,
            version: r.try_get(3)?,
            description: r.try_get(4)?,
            package_hash: r.try_get(5)?,
            profile: r.try_get(6)?,
            settings: r.try_get(7)?,
            kind: r.try_get(8)?,
            status: r.try_get(9)?,
            total: r.try_get(10)?,
            completed: r.try_get(11)?,
            passed: r.try_get(12)?,
            failed: r.try_get(13)?,
            errored: r.try_get(14)?,
            skipped: r.try_get(15)?,
            summary: r.try_get(16)?,
            verdict: r.try_get(17)?,
            callback_url: r.try_get(18)?,
            finalised: r.try_get(19)?,
            created_at: r.try_get(20)?,
            finished_at: r.try_get(21)?,
            tokens: r.try_get(22)?,
            cost_usd: r.try_get(23)?,
            max_tokens: r.try_get(24)?,
            max_cost_usd: r.try_get(25)?,
            stop_reason: r.try_get(26)?,
        })
    })
    .transpose()
}

/// One result as the results endpoint lists it.
#[derive(Debug, Clone)]
pub struct ResultRow {
    pub case_index: i32,
    pub test_case_id: String,
    pub name: String,
    pub status: String,
    pub strategy: String,
    pub result: Option<Value>,
    pub details: Option<Value>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A page of results after `after_index`, optionally of one status.
pub async fn list_results(
    pool: &PgPool,
    run_id: Uuid,
    status: Option<&str>,
    after_index: i32,
    limit: i64,
) -> Result<Vec<ResultRow>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT case_index, test_case_id, name, status, strategy, result, details, finished_at
         FROM eval_results
         WHERE run_id = $1 AND case_index > $2 AND ($3::text IS NULL OR status = $3)
         ORDER BY case_index LIMIT $4",
    )
    .bind(run_id)
    .bind(after_index)
    .bind(status)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            Ok(ResultRow {
                case_index: r.try_get(0)?,
                test_case_id: r.try_get(1)?,
                name: r.try_get(2)?,
                status: r.try_get(3)?,
                strategy: r.try_get(4)?,
                result: r
                    .try_get::<Option<String>, _>(5)?
                    .map(|text| serde_json::from_str(&text))
                    .transpose()
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
                details: r.try_get(6)?,
                finished_at: r.try_get(7)?,
            })
        })
        .collect()
}

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
pub async fn versions_of(
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

/// Runs per status, and queued jobs not yet confirmed by the broker (for `/metrics`).
pub async fn gauges(pool: &PgPool) -> Result<(Vec<(String, i64)>, i64), sqlx::Error> {
    let by_status: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM runs GROUP BY status")
            .fetch_all(pool)
            .await?;
    let unpublished: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM eval_results e JOIN runs r ON r.id = e.run_id
         WHERE e.status = 'queued' AND e.published_at IS NULL
           AND e.case_index >= r.published_through",
    )
    .fetch_one(pool)
    .await?;
    Ok((by_status, unpublished))
}
