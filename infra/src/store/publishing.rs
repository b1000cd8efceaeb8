//! Publishing a run's plan: the published watermark (advanced after each chunk's confirms),
//! the publish cursors of its `runInSequence` chains, which cases are recorded, the room
//! `maxConcurrentTests` leaves, the sweeper's list of runs to resume, and the session lock that
//! serialises a run's publishers.

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

/// Live runs with plan positions not yet confirmed, or a `runInSequence` chain not yet
/// published to its end, created more than `grace_secs` ago: a creator that died (the run
/// still `creating`, nobody holding its lock), a publish the broker did not confirm,
/// `maxConcurrentTests` holding jobs back, or a chain whose next case waits for the one before
/// it (a pass publishes only what is due, so listing those is harmless; it is also what
/// publishes a chain's next case when its event was lost).
async fn runs_to_publish(
    pool: &PgPool,
    grace_secs: f64,
    limit: i64,
) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs
         WHERE NOT finalised AND status IN ('creating', 'running') AND stop_reason IS NULL
           AND (published_through < total
                OR EXISTS (SELECT 1 FROM run_sequences s
                           WHERE s.run_id = runs.id AND s.published < s.length))
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
        self.room_after(0)
    }

    /// [`PublishWindow::room`] for a run whose in-flight count is off the watermark's by
    /// `extra` jobs: a run with `runInSequence` chains publishes their cases by their cursors,
    /// not the watermark (`extra` = chain cases published − chain positions below the
    /// watermark).
    pub fn room_after(&self, extra: i64) -> usize {
        let rest = i64::from(self.total) - i64::from(self.published);
        usize::try_from(self.cap_room(extra).min(rest).max(0)).unwrap_or(0)
    }

    /// How many more jobs `maxConcurrentTests` lets run now, whatever their position
    /// (`i64::MAX` without a cap); `extra` as in [`PublishWindow::room_after`].
    pub fn cap_room(&self, extra: i64) -> i64 {
        match self.cap {
            None => i64::MAX,
            Some(cap) => {
                let in_flight =
                    (i64::from(self.published) - i64::from(self.recorded) + extra).max(0);
                (i64::from(cap) - in_flight).max(0)
            }
        }
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

/// Opens the run's chains (their lengths, in chain order) with their cursors at 0; chains
/// already open keep their cursors.
async fn open_sequences(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    lengths: &[i32],
) -> Result<(), sqlx::Error> {
    let chains: Vec<i32> = (0..lengths.len())
        .map(|c| i32::try_from(c).unwrap_or(i32::MAX))
        .collect();
    sqlx::query(
        "INSERT INTO run_sequences (run_id, chain, length)
         SELECT $1, c, l FROM UNNEST($2::int4[], $3::int4[]) AS t(c, l)
         ON CONFLICT (run_id, chain) DO NOTHING",
    )
    .bind(run_id)
    .bind(chains)
    .bind(lengths)
    .execute(conn)
    .await?;
    Ok(())
}

/// The run's chain cursors, in chain order (empty: not opened).
async fn sequence_cursors(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
) -> Result<Vec<i32>, sqlx::Error> {
    sqlx::query_scalar("SELECT published FROM run_sequences WHERE run_id = $1 ORDER BY chain")
        .bind(run_id)
        .fetch_all(conn)
        .await
}

/// Moves a chain's cursor to `through` (never back).
async fn advance_sequence(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
    chain: i32,
    through: i32,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE run_sequences SET published = $3
         WHERE run_id = $1 AND chain = $2 AND published < $3",
    )
    .bind(run_id)
    .bind(chain)
    .bind(through)
    .execute(conn)
    .await?;
    Ok(())
}

impl Store {
    /// Opens the run's `runInSequence` chains (one cursor each, at 0) unless they are open.
    pub async fn open_sequences(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        lengths: &[i32],
    ) -> Result<(), StoreError> {
        open_sequences(conn, run_id, lengths)
            .await
            .map_err(StoreError::query("opening a run's sequences"))
    }

    /// The run's chain cursors in chain order: how many cases of each chain are published.
    pub async fn sequence_cursors(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<Vec<i32>, StoreError> {
        sequence_cursors(conn, run_id)
            .await
            .map_err(StoreError::query("reading a run's sequences"))
    }

    /// Moves chain `chain`'s cursor to `through` (never back), on the publisher's locked
    /// connection, after the broker confirmed the case before `through`.
    pub async fn advance_sequence(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
        chain: i32,
        through: i32,
    ) -> Result<(), StoreError> {
        advance_sequence(conn, run_id, chain, through)
            .await
            .map_err(StoreError::query("moving a sequence's cursor"))
    }

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
