//! Publishing a run's plan: the published watermark (advanced after each chunk's confirms),
//! which cases are recorded, the room `maxConcurrentTests` leaves, the sweeper's list of runs
//! to resume, and the session lock that serialises a run's publishers.

use skilleval_execution::variant::{Configuration, Variant};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Store, StoreError};

/// Records that the broker confirmed the run's plan positions below `through` (the published
/// watermark; it only moves forward). One write per confirmed chunk.
async fn advance_published(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    through: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE runs SET published_through = $2 WHERE id = $1 AND published_through < $2")
        .bind(run_id)
        .bind(through)
        .execute(conn)
        .await?;
    Ok(())
}

/// The (case, variant) keys among `keys` the run has a row for (their outcome is recorded).
async fn recorded_among(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    keys: &[(&str, Variant)],
) -> Result<Vec<(String, Variant)>, sqlx::Error> {
    let ids: Vec<&str> = keys.iter().map(|(id, _)| *id).collect();
    let configurations: Vec<&str> = keys.iter().map(|(_, v)| v.configuration.as_str()).collect();
    let run_numbers: Vec<i32> = keys
        .iter()
        .map(|(_, v)| i32::try_from(v.run_number).unwrap_or(i32::MAX))
        .collect();
    let rows: Vec<(String, String, i32)> = sqlx::query_as(
        "SELECT e.test_case_id, e.configuration, e.run_number
         FROM eval_results e
         JOIN UNNEST($2::text[], $3::text[], $4::int4[]) AS k(id, configuration, run_number)
           ON e.test_case_id = k.id AND e.configuration = k.configuration
          AND e.run_number = k.run_number
         WHERE e.run_id = $1",
    )
    .bind(run_id)
    .bind(ids)
    .bind(configurations)
    .bind(run_numbers)
    .fetch_all(conn)
    .await?;
    rows.into_iter()
        .map(|(id, configuration, run_number)| {
            let configuration = Configuration::parse(&configuration).ok_or_else(|| {
                sqlx::Error::Decode(format!("unknown configuration `{configuration}`").into())
            })?;
            Ok((
                id,
                Variant {
                    configuration,
                    run_number: u32::try_from(run_number).unwrap_or(1),
                },
            ))
        })
        .collect()
}

/// Live runs with plan positions not yet confirmed, created more than `grace_secs` ago: a
/// creator that died (the run still `creating`, nobody holding its lock), a publish the broker
/// did not confirm, or `maxConcurrentTests` holding jobs back (a release respects the cap, so
/// listing those is harmless).
async fn runs_to_publish(
    pool: &PgPool,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs
         WHERE NOT finalised AND status IN ('creating', 'running') AND stop_reason IS NULL
           AND published_through < total
           AND created_at < now() - make_interval(secs => $1)
         ORDER BY created_at LIMIT $2",
    )
    .bind(grace_secs)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// Serialises publishers of one run (creation, events, the sweeper, other replicas) on this
/// connection's session until [`unlock_run_release`], so `maxConcurrentTests` is never
/// overshot by a race, two publishers never publish the same positions, and a live creator
/// is told from a dead one. A session lock (not a transaction's): a publishing pass commits
/// its watermark chunk by chunk. The lock goes with the connection if the process dies.
async fn lock_run_release(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_lock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// [`lock_run_release`] without waiting: `false` when another session holds the lock (a
/// creator or publisher of the run is alive).
async fn try_lock_run_release(conn: &mut PgConnection, run_id: Uuid) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .fetch_one(&mut *conn)
        .await
}

/// Releases [`lock_run_release`]'s lock.
async fn unlock_run_release(conn: &mut PgConnection, run_id: Uuid) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock(hashtextextended($1::text, 7))")
        .bind(run_id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Where a live run's publishing stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishWindow {
    /// Planned cases.
    pub total: i32,
    /// Plan positions confirmed by the broker (the watermark).
    pub published: i32,
    /// Cases recorded.
    pub recorded: i32,
    /// `maxConcurrentTests` (`None`: no cap).
    pub cap: Option<i32>,
}

impl PublishWindow {
    /// How many more positions may be published now: all the rest without a cap, else what
    /// the cap leaves after those in flight (published minus recorded).
    pub fn room(&self) -> usize {
        let rest = i64::from(self.total) - i64::from(self.published);
        let room = match self.cap {
            None => rest,
            Some(cap) => {
                let in_flight = (i64::from(self.published) - i64::from(self.recorded)).max(0);
                (i64::from(cap) - in_flight).min(rest)
            }
        };
        usize::try_from(room.max(0)).unwrap_or(0)
    }
}

/// The run's publishing state, `None` when it is not live (stopped, finalised, gone): nothing
/// of it is to be published. Call under [`lock_run_release`].
async fn publish_window(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
) -> Result<Option<PublishWindow>, sqlx::Error> {
    let row: Option<(i32, i32, i32, Option<i32>)> = sqlx::query_as(
        "SELECT total, published_through, completed, max_in_flight FROM runs
         WHERE id = $1 AND status IN ('creating', 'running') AND stop_reason IS NULL
           AND NOT finalised",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(|(total, published, recorded, cap)| PublishWindow {
        total,
        published,
        recorded,
        cap,
    }))
}

impl Store {
    /// Moves the run's published watermark to `through` (never back), on the publisher's
    /// locked connection.
    pub async fn advance_published(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        through: i32,
    ) -> Result<(), StoreError> {
        advance_published(conn, run_id, through)
            .await
            .map_err(StoreError::query("recording publisher confirms"))
    }

    /// The (case, variant) keys among `keys` the run has a row for.
    pub async fn recorded_among(
        &self,
        run_id: Uuid,
        keys: &[(&str, Variant)],
    ) -> Result<Vec<(String, Variant)>, StoreError> {
        recorded_among(self.pool(), run_id, keys)
            .await
            .map_err(StoreError::query("reading which cases are recorded"))
    }

    /// Live runs with unconfirmed plan positions, created more than `grace_secs` ago.
    pub async fn runs_to_publish(
        &self,
        grace_secs: f64,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        runs_to_publish(self.pool(), grace_secs, limit)
            .await
            .map_err(StoreError::query("listing runs with unpublished jobs"))
    }

    /// Takes the run's publishing lock on `conn`, waiting for it.
    pub async fn lock_publishing(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<(), StoreError> {
        lock_run_release(conn, run_id)
            .await
            .map_err(StoreError::query("locking a run's publishing"))
    }

    /// Takes the run's publishing lock on `conn` if free: `false` when a publisher of the run
    /// is alive.
    pub async fn try_lock_publishing(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<bool, StoreError> {
        try_lock_run_release(conn, run_id)
            .await
            .map_err(StoreError::query("locking a run's publishing"))
    }

    /// Frees the run's publishing lock held by `conn`.
    pub async fn unlock_publishing(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<(), StoreError> {
        unlock_run_release(conn, run_id)
            .await
            .map_err(StoreError::query("unlocking a run's publishing"))
    }

    /// Where a live run's publishing stands (`None`: the run is not live).
    pub async fn publish_window(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<Option<PublishWindow>, StoreError> {
        publish_window(conn, run_id)
            .await
            .map_err(StoreError::query("reading what a run may publish"))
    }
}
