//! Production sampling: monitors and their revisions, ingested samples, what quality and
//! alerts read back, alert states and transitions, and the retention sweep.
//!
//! A sampled item is a case of a `samples` run: its row here names the run and its position
//! in the run's plan, and its result is that run's `eval_results` row (test case id =
//! `sample_id`), written once by the workers' batch like any case. The `sample_results` view
//! joins the two, so a sample is never graded or stored twice. Ingest of one skill is
//! serialised by a transaction-scoped advisory lock ([`Store::lock_ingest`]), which makes the
//! duplicate count and `max_samples_per_hour` exact under concurrent batches.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{Store, StoreError};

/// Where a monitor revision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum RevisionSource {
    /// The `monitoring` section of an uploaded package.
    Package,
    /// `PUT /v1/skills/{name}/monitor`.
    Api,
}

/// What became of an ingested sample (`samples.disposition`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// Graded: a job of a samples run.
    Sampled,
    /// Its hash fell outside `sample_rate`.
    Unsampled,
    /// Its metadata did not pass the monitor's filters.
    Filtered,
    /// Sampled, but `max_samples_per_hour` was reached.
    OverHourlyCap,
    /// Sampled, but `max_cost_usd_per_day` is spent and every criterion needs a model.
    OverDailyCost,
}

impl Disposition {
    pub fn as_str(self) -> &'static str {
        match self {
            Disposition::Sampled => "sampled",
            Disposition::Unsampled => "unsampled",
            Disposition::Filtered => "filtered",
            Disposition::OverHourlyCap => "over_hourly_cap",
            Disposition::OverDailyCost => "over_daily_cost",
        }
    }
}

/// A skill's current monitor.
#[derive(Debug, Clone)]
pub struct StoredMonitor {
    pub id: Uuid,
    pub skill_id: Uuid,
    pub revision: i32,
    /// As given.
    pub document: Value,
    /// Validated, defaults applied.
    pub monitor: Value,
    pub source: RevisionSource,
    pub callback_url: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// What [`Store::put_monitor`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutMonitor {
    pub monitor_id: Uuid,
    pub revision: i32,
    /// False: the document equals the current revision's (no new revision).
    pub changed: bool,
}

/// A monitor revision to store.
#[derive(Debug)]
pub struct NewRevision<'a> {
    pub skill_id: Uuid,
    pub document: &'a Value,
    pub monitor: &'a Value,
    pub source: RevisionSource,
    pub callback_url: Option<&'a str>,
}

/// Samples to insert, as parallel columns (what `UNNEST` takes).
#[derive(Debug, Default)]
pub struct NewSamples {
    pub sample_ids: Vec<String>,
    pub dispositions: Vec<&'static str>,
    pub positions: Vec<Option<i32>>,
    pub versions: Vec<Option<String>>,
    pub observed_at: Vec<DateTime<Utc>>,
    pub bodies: Vec<Option<String>>,
}

impl NewSamples {
    pub fn len(&self) -> usize {
        self.sample_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sample_ids.is_empty()
    }
}

/// A graded sample as stored (the `sample_results` view).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct SampleResultRow {
    pub sample_id: String,
    pub observed_at: DateTime<Utc>,
    pub version: Option<String>,
    pub monitor_revision: i32,
    pub status: String,
    pub score: Option<f64>,
    pub details: Option<Value>,
}

/// A monitor the alert scheduler evaluates.
#[derive(Debug, Clone)]
pub struct MonitorToEvaluate {
    pub monitor_id: Uuid,
    pub skill_id: Uuid,
    pub skill: String,
    pub monitor: Value,
    pub callback_url: Option<String>,
}

/// One recorded alert transition.
#[derive(Debug, Clone, sqlx::FromRow, serde::Serialize)]
pub struct AlertRow {
    pub id: Uuid,
    pub rule: String,
    pub from_state: String,
    pub to_state: String,
    pub evaluation: Value,
    pub at: DateTime<Utc>,
    /// Its webhook's state in the outbox (`pending`, `delivered`, `failed`), or `no_url`
    /// when the monitor has no callback URL.
    pub delivery: Option<String>,
}

/// An alert transition to record.
#[derive(Debug)]
pub struct NewAlert<'a> {
    pub id: Uuid,
    pub skill_id: Uuid,
    pub monitor_id: Uuid,
    pub rule: &'a str,
    pub from_state: &'a str,
    pub to_state: &'a str,
    pub evaluation: &'a Value,
    /// The webhook delivery announcing it (enqueued in the same transaction), if any.
    pub delivery: Option<Uuid>,
}

/// The key of the alert scheduler's advisory lock (any constant no other lock uses; the
/// publishing locks are keyed by run ids hashed into the same 64-bit space).
const ALERT_LOCK_KEY: i64 = 0x5345_5641_4c41_4c54; // "SEVALALT"

type MonitorRow = (
    Uuid,
    Uuid,
    i32,
    Value,
    Value,
    RevisionSource,
    Option<String>,
    DateTime<Utc>,
);

fn monitor_of(
    (id, skill_id, revision, document, monitor, source, callback_url, updated_at): MonitorRow,
) -> StoredMonitor {
    StoredMonitor {
        id,
        skill_id,
        revision,
        document,
        monitor,
        source,
        callback_url,
        updated_at,
    }
}

impl Store {
    /// The skill's id (`None`: no such skill).
    pub async fn skill_id(&self, name: &str) -> Result<Option<Uuid>, StoreError> {
        self.visible_skill(super::tenancy::Viewer::All, name).await
    }

    /// Sets the skill's monitor: a new revision when the document differs from the current
    /// one (the first is revision 1), nothing otherwise. In the caller's transaction.
    pub async fn put_monitor(
        &self,
        conn: &mut PgConnection,
        new: &NewRevision<'_>,
    ) -> Result<PutMonitor, StoreError> {
        put_monitor(conn, new)
            .await
            .map_err(StoreError::query("storing a monitor revision"))
    }

    /// The skill's current monitor (`None`: it has none).
    pub async fn current_monitor(
        &self,
        skill_id: Uuid,
    ) -> Result<Option<StoredMonitor>, StoreError> {
        let row: Option<MonitorRow> = sqlx::query_as(
            "SELECT m.id, m.skill_id, m.revision, r.document, r.monitor, r.source,
                    m.callback_url, m.updated_at
             FROM monitors m
             JOIN monitor_revisions r ON r.monitor_id = m.id AND r.revision = m.revision
             WHERE m.skill_id = $1",
        )
        .bind(skill_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a monitor"))?;
        Ok(row.map(monitor_of))
    }

    /// Every revision of a monitor: (revision, validated monitor), oldest first.
    pub async fn monitor_revisions(
        &self,
        monitor_id: Uuid,
    ) -> Result<Vec<(i32, Value)>, StoreError> {
        sqlx::query_as(
            "SELECT revision, monitor FROM monitor_revisions WHERE monitor_id = $1
             ORDER BY revision",
        )
        .bind(monitor_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a monitor's revisions"))
    }

    /// One revision of the skill's monitor: (monitor id, validated monitor).
    pub async fn monitor_revision_of_skill(
        &self,
        skill_id: Uuid,
        revision: i32,
    ) -> Result<Option<(Uuid, Value)>, StoreError> {
        sqlx::query_as(
            "SELECT m.id, r.monitor FROM monitors m
             JOIN monitor_revisions r ON r.monitor_id = m.id
             WHERE m.skill_id = $1 AND r.revision = $2",
        )
        .bind(skill_id)
        .bind(revision)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a monitor revision"))
    }

    /// Serialises ingest into one skill until the transaction ends.
    pub async fn lock_ingest(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
    ) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('samples:' || $1::text, 0))")
            .bind(skill_id)
            .execute(conn)
            .await
            .map_err(StoreError::query("locking a skill's ingest"))?;
        Ok(())
    }

    /// The ids among `ids` the skill already has.
    pub async fn existing_samples(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
        ids: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT sample_id FROM samples WHERE skill_id = $1 AND sample_id = ANY($2::text[])",
        )
        .bind(skill_id)
        .bind(ids)
        .fetch_all(conn)
        .await
        .map_err(StoreError::query("looking for duplicate samples"))
    }

    /// Samples of the skill taken for grading since the start of the current UTC hour.
    pub async fn sampled_this_hour(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(
            "SELECT count(*) FROM samples
             WHERE skill_id = $1 AND disposition = 'sampled'
               AND received_at >= date_trunc('hour', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'",
        )
        .bind(skill_id)
        .fetch_one(conn)
        .await
        .map_err(StoreError::query("counting this hour's samples"))
    }

    /// What grading the skill's samples cost since the start of the current UTC day (the
    /// recorded results of its samples runs created today).
    pub async fn samples_cost_today(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
    ) -> Result<f64, StoreError> {
        sqlx::query_scalar(
            "SELECT COALESCE(sum(r.cost_usd), 0)::float8 FROM runs r
             JOIN skill_versions v ON v.id = r.version_id
             WHERE v.skill_id = $1 AND r.kind = 'samples'
               AND r.created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'",
        )
        .bind(skill_id)
        .fetch_one(conn)
        .await
        .map_err(StoreError::query("summing today's sample grading cost"))
    }

    /// The skill's newest version: (version id, package hash). A samples run belongs to it.
    pub async fn latest_version(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
    ) -> Result<Option<(Uuid, String)>, StoreError> {
        sqlx::query_as(
            "SELECT id, package_hash FROM skill_versions WHERE skill_id = $1
             ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .bind(skill_id)
        .fetch_optional(conn)
        .await
        .map_err(StoreError::query("reading a skill's newest version"))
    }

    /// Inserts the samples (`run_id` on the sampled ones) in the caller's transaction; a
    /// sample id the skill has already is left alone. Returns how many rows were inserted.
    pub async fn insert_samples(
        &self,
        conn: &mut PgConnection,
        skill_id: Uuid,
        run_id: Option<Uuid>,
        monitor_revision: i32,
        rows: &NewSamples,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "INSERT INTO samples (skill_id, sample_id, disposition, run_id, position,
                                  monitor_revision, version, observed_at, body)
             SELECT $1, t.sample_id, t.disposition,
                    CASE WHEN t.disposition = 'sampled' THEN $2::uuid END, t.position,
                    CASE WHEN t.disposition = 'sampled' THEN $3::int4 END,
                    t.version, t.observed_at, t.body
             FROM UNNEST($4::text[], $5::text[], $6::int4[], $7::text[], $8::timestamptz[],
                         $9::text[]) AS t(sample_id, disposition, position, version,
                                          observed_at, body)
             ON CONFLICT (skill_id, sample_id) DO NOTHING",
        )
        .bind(skill_id)
        .bind(run_id)
        .bind(monitor_revision)
        .bind(&rows.sample_ids)
        .bind(&rows.dispositions)
        .bind(&rows.positions)
        .bind(&rows.versions)
        .bind(&rows.observed_at)
        .bind(&rows.bodies)
        .execute(conn)
        .await
        .map_err(StoreError::query("inserting samples"))?;
        Ok(done.rows_affected())
    }

    /// A samples run's planned samples with position in `[from, from + limit)`, in position
    /// order: (position, sample as JSON).
    pub async fn sample_page(
        &self,
        run_id: Uuid,
        from: i32,
        limit: i64,
    ) -> Result<Vec<(i32, String)>, StoreError> {
        sqlx::query_as(
            "SELECT position, body FROM samples
             WHERE run_id = $1 AND position >= $2 AND position < $2 + $3
             ORDER BY position",
        )
        .bind(run_id)
        .bind(from)
        .bind(i32::try_from(limit).unwrap_or(i32::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading a samples run's plan"))
    }

    /// The skill's graded samples observed in `[from, to)`, optionally of one version.
    pub async fn sample_results(
        &self,
        skill_id: Uuid,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        version: Option<&str>,
    ) -> Result<Vec<SampleResultRow>, StoreError> {
        sqlx::query_as(
            "SELECT sample_id, observed_at, version, monitor_revision, status, score, details
             FROM sample_results
             WHERE skill_id = $1 AND observed_at >= $2 AND observed_at < $3
               AND ($4::text IS NULL OR version = $4)
             ORDER BY observed_at, sample_id",
        )
        .bind(skill_id)
        .bind(from)
        .bind(to)
        .bind(version)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading graded samples"))
    }

    /// Graded samples observed in `[start, end)` and how many passed: (passed, n).
    pub async fn sample_counts(
        &self,
        skill_id: Uuid,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Result<(i64, i64), StoreError> {
        sqlx::query_as(
            "SELECT (count(*) FILTER (WHERE status = 'passed'))::int8,
                    (count(*) FILTER (WHERE status IN ('passed', 'failed')))::int8
             FROM sample_results
             WHERE skill_id = $1 AND observed_at >= $2 AND observed_at < $3",
        )
        .bind(skill_id)
        .bind(start)
        .bind(end)
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("counting graded samples"))
    }

    /// When the skill's first graded sample was observed (`None`: none yet).
    pub async fn first_graded_sample(
        &self,
        skill_id: Uuid,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        sqlx::query_scalar("SELECT min(observed_at) FROM sample_results WHERE skill_id = $1")
            .bind(skill_id)
            .fetch_one(self.pool())
            .await
            .map_err(StoreError::query("reading the first graded sample"))
    }

    /// Takes the alert scheduler's lease for the caller's transaction: `false` when another
    /// coordinator holds it (that one evaluates this round).
    pub async fn try_alert_lease(&self, conn: &mut PgConnection) -> Result<bool, StoreError> {
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(ALERT_LOCK_KEY)
            .fetch_one(conn)
            .await
            .map_err(StoreError::query("taking the alert lease"))
    }

    /// Every monitor with its skill (what a round of alert evaluation walks).
    pub async fn monitors_to_evaluate(
        &self,
        conn: &mut PgConnection,
    ) -> Result<Vec<MonitorToEvaluate>, StoreError> {
        let rows: Vec<(Uuid, Uuid, String, Value, Option<String>)> = sqlx::query_as(
            "SELECT m.id, m.skill_id, s.name, r.monitor, m.callback_url
             FROM monitors m
             JOIN skills s ON s.id = m.skill_id
             JOIN monitor_revisions r ON r.monitor_id = m.id AND r.revision = m.revision
             ORDER BY m.id",
        )
        .fetch_all(conn)
        .await
        .map_err(StoreError::query("listing monitors"))?;
        Ok(rows
            .into_iter()
            .map(
                |(monitor_id, skill_id, skill, monitor, callback_url)| MonitorToEvaluate {
                    monitor_id,
                    skill_id,
                    skill,
                    monitor,
                    callback_url,
                },
            )
            .collect())
    }

    /// A rule's tracker and when it was last evaluated (`None`: never evaluated).
    pub async fn alert_tracker(
        &self,
        conn: &mut PgConnection,
        monitor_id: Uuid,
        rule: &str,
    ) -> Result<Option<(Value, DateTime<Utc>)>, StoreError> {
        sqlx::query_as(
            "SELECT tracker, evaluated_at FROM alert_states WHERE monitor_id = $1 AND rule = $2",
        )
        .bind(monitor_id)
        .bind(rule)
        .fetch_optional(conn)
        .await
        .map_err(StoreError::query("reading an alert state"))
    }

    /// Saves a rule's tracker after an evaluation.
    pub async fn save_alert_tracker(
        &self,
        conn: &mut PgConnection,
        monitor_id: Uuid,
        rule: &str,
        state: &str,
        tracker: &Value,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO alert_states (monitor_id, rule, state, tracker, evaluated_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (monitor_id, rule)
             DO UPDATE SET state = $3, tracker = $4, evaluated_at = $5",
        )
        .bind(monitor_id)
        .bind(rule)
        .bind(state)
        .bind(tracker)
        .bind(at)
        .execute(conn)
        .await
        .map_err(StoreError::query("saving an alert state"))?;
        Ok(())
    }

    /// Records a transition.
    pub async fn insert_alert(
        &self,
        conn: &mut PgConnection,
        alert: &NewAlert<'_>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO alerts
                 (id, skill_id, monitor_id, rule, from_state, to_state, evaluation, delivery)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(alert.id)
        .bind(alert.skill_id)
        .bind(alert.monitor_id)
        .bind(alert.rule)
        .bind(alert.from_state)
        .bind(alert.to_state)
        .bind(alert.evaluation)
        .bind(alert.delivery.map(|id| id.to_string()))
        .execute(conn)
        .await
        .map_err(StoreError::query("recording an alert"))?;
        Ok(())
    }

    /// The skill's alert transitions, newest first, and each rule's current state.
    pub async fn alerts_of(
        &self,
        skill_id: Uuid,
        limit: i64,
    ) -> Result<(Vec<AlertRow>, Vec<(String, String, DateTime<Utc>)>), StoreError> {
        let alerts = sqlx::query_as(
            "SELECT a.id, a.rule, a.from_state, a.to_state, a.evaluation, a.at,
                    CASE WHEN a.delivery IS NULL THEN 'no_url' ELSE w.state END AS delivery
             FROM alerts a
             LEFT JOIN webhook_deliveries w ON w.id::text = a.delivery
             WHERE a.skill_id = $1 ORDER BY a.at DESC, a.id DESC LIMIT $2",
        )
        .bind(skill_id)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing alerts"))?;
        let states = sqlx::query_as(
            "SELECT a.rule, a.state, a.evaluated_at FROM alert_states a
             JOIN monitors m ON m.id = a.monitor_id WHERE m.skill_id = $1 ORDER BY a.rule",
        )
        .bind(skill_id)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("reading alert states"))?;
        Ok((alerts, states))
    }

    /// The retention sweep: deletes samples received before `cutoff`, and the finalised
    /// samples runs created before it (their results with them). Returns (samples, runs).
    pub async fn delete_old_samples(
        &self,
        cutoff: DateTime<Utc>,
    ) -> Result<(u64, u64), StoreError> {
        let runs = {
            let ctx = "deleting old samples runs";
            let mut tx = self.pool().begin().await.map_err(StoreError::query(ctx))?;
            // Locked first, then their cached model answers released (see
            // `release_cached_answers`).
            let ids: Vec<Uuid> = sqlx::query_scalar(
                "SELECT id FROM runs WHERE kind = 'samples' AND finalised AND created_at < $1
                 ORDER BY id FOR UPDATE",
            )
            .bind(cutoff)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query(ctx))?;
            super::llm::release_cached_answers(&mut tx, &ids)
                .await
                .map_err(StoreError::query(ctx))?;
            let n = sqlx::query("DELETE FROM runs WHERE id = ANY($1)")
                .bind(&ids)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::query(ctx))?
                .rows_affected();
            tx.commit().await.map_err(StoreError::query(ctx))?;
            n
        };
        // A sampled row of a run not finalised yet stays: it is that run's plan (a run older
        // than the retention has long finished; the next sweep takes it).
        let samples = sqlx::query(
            "DELETE FROM samples WHERE received_at < $1
               AND (run_id IS NULL
                    OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = samples.run_id
                                   AND NOT r.finalised))",
        )
        .bind(cutoff)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("deleting old samples"))?
        .rows_affected();
        Ok((samples, runs))
    }
}

async fn put_monitor(
    conn: &mut PgConnection,
    new: &NewRevision<'_>,
) -> Result<PutMonitor, sqlx::Error> {
    // Two first PUTs of one skill would both find no monitor: they take turns.
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('monitor:' || $1::text, 0))")
        .bind(new.skill_id)
        .execute(&mut *conn)
        .await?;
    let current: Option<(Uuid, i32, Value, Option<String>)> = sqlx::query_as(
        "SELECT m.id, m.revision, r.document, m.callback_url FROM monitors m
         JOIN monitor_revisions r ON r.monitor_id = m.id AND r.revision = m.revision
         WHERE m.skill_id = $1 FOR UPDATE OF m",
    )
    .bind(new.skill_id)
    .fetch_optional(&mut *conn)
    .await?;
    // A package's section is authoritative only when it changed since the package last set
    // it: re-uploading a package does not undo a revision set over the API.
    let current = match current {
        Some((id, revision, document, callback_url)) if new.source == RevisionSource::Package => {
            let last_from_package: Option<Value> = sqlx::query_scalar(
                "SELECT document FROM monitor_revisions
                 WHERE monitor_id = $1 AND source = 'package'
                 ORDER BY revision DESC LIMIT 1",
            )
            .bind(id)
            .fetch_optional(&mut *conn)
            .await?;
            if last_from_package.as_ref() == Some(new.document) || document == *new.document {
                return Ok(PutMonitor {
                    monitor_id: id,
                    revision,
                    changed: false,
                });
            }
            // The package does not say where alerts go: the address set over the API stays.
            return bump(conn, id, revision, new, callback_url.as_deref()).await;
        }
        other => other,
    };
    let (monitor_id, revision) = match current {
        Some((id, revision, document, callback_url))
            if document == *new.document && callback_url.as_deref() == new.callback_url =>
        {
            return Ok(PutMonitor {
                monitor_id: id,
                revision,
                changed: false,
            });
        }
        Some((id, revision, document, _)) if document == *new.document => {
            // Only the webhook address changed: not a new revision of the criteria.
            sqlx::query("UPDATE monitors SET callback_url = $2, updated_at = now() WHERE id = $1")
                .bind(id)
                .bind(new.callback_url)
                .execute(&mut *conn)
                .await?;
            return Ok(PutMonitor {
                monitor_id: id,
                revision,
                changed: false,
            });
        }
        Some((id, revision, _, _)) => {
            return bump(conn, id, revision, new, new.callback_url).await;
        }
        None => {
            let id = Uuid::now_v7();
            sqlx::query(
                "INSERT INTO monitors (id, skill_id, revision, callback_url) VALUES ($1, $2, 1, $3)",
            )
            .bind(id)
            .bind(new.skill_id)
            .bind(new.callback_url)
            .execute(&mut *conn)
            .await?;
            (id, 1)
        }
    };
    insert_revision(conn, monitor_id, revision, new).await
}

/// The monitor's next revision: `revision + 1`, current from now on.
async fn bump(
    conn: &mut PgConnection,
    monitor_id: Uuid,
    revision: i32,
    new: &NewRevision<'_>,
    callback_url: Option<&str>,
) -> Result<PutMonitor, sqlx::Error> {
    sqlx::query(
        "UPDATE monitors SET revision = $2, callback_url = $3, updated_at = now() WHERE id = $1",
    )
    .bind(monitor_id)
    .bind(revision + 1)
    .bind(callback_url)
    .execute(&mut *conn)
    .await?;
    insert_revision(conn, monitor_id, revision + 1, new).await
}

async fn insert_revision(
    conn: &mut PgConnection,
    monitor_id: Uuid,
    revision: i32,
    new: &NewRevision<'_>,
) -> Result<PutMonitor, sqlx::Error> {
    sqlx::query(
        "INSERT INTO monitor_revisions (monitor_id, revision, document, monitor, source)
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(monitor_id)
    .bind(revision)
    .bind(new.document)
    .bind(new.monitor)
    .bind(new.source)
    .execute(&mut *conn)
    .await?;
    Ok(PutMonitor {
        monitor_id,
        revision,
        changed: true,
    })
}
