//! Parked jobs: what the coordinator drained from the parking queue, and what became of it.
//!
//! ```text
//!   parking queue ──drain──> errored    the case is recorded `errored` with the reason
//!                       └──> unmatched  no job (unparseable), or its case already has an outcome
//!   errored | unmatched ──requeue──> requeued   (the message is published again)
//! ```
//!
//! **Draining** ([`Store::record_parked`]) writes, in one transaction, the parked row and, for
//! a job of a live run whose case has no outcome yet, that case's `errored` result through the
//! workers' own insert ([`Store::record_results_in`]: `ON CONFLICT DO NOTHING`, counters
//! advanced by exactly the rows inserted). The broker message is acked after the commit; a
//! drain that dies before the ack sees the message again and adds nothing (the result
//! conflicts, and so does the parked row: one row per case until it is requeued).
//!
//! **Requeueing** ([`Store::requeue_parked`]) of an `errored` job gives the case back to its
//! run (the lifecycle's `reopen`: the errored row deleted, the counters given back, a finalised
//! run `running` again) and marks the row `requeued`, in the caller's transaction; the caller
//! publishes the job again before committing, so either both happen or neither. A run stopped
//! meanwhile (cancel, budget, failFast) is refused: its cases are not run any more.

use chrono::{DateTime, Utc};
use skilleval_execution::result::JobResult;
use skilleval_execution::variant::{Configuration, Variant};
use uuid::Uuid;

use super::lifecycle::TransitionError;
use super::results::Changed;
use super::{Store, StoreError};

/// What became of a parked message (`parked_jobs.state`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize, serde::Deserialize,
)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum ParkedState {
    /// Its case is recorded `errored` with the reason (its run can finalise).
    Errored,
    /// Nothing was recorded: the message is no job, its run is gone or stopped, or its case
    /// already had an outcome. Kept for an operator to look at.
    Unmatched,
    /// An operator published it again.
    Requeued,
}

/// A message taken off the parking queue.
#[derive(Debug, Clone)]
pub struct NewParked<'a> {
    /// The job's run, case and variant, when the body is a job.
    pub case: Option<(Uuid, &'a str, Variant)>,
    pub from_queue: &'a str,
    pub reason: &'a str,
    pub body: &'a [u8],
}

/// A parked row as listed.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct ParkedJob {
    pub id: Uuid,
    pub run_id: Option<Uuid>,
    pub test_case_id: Option<String>,
    pub from_queue: String,
    pub reason: String,
    pub state: ParkedState,
    pub parked_at: DateTime<Utc>,
    pub requeued_at: Option<DateTime<Utc>>,
}

/// What [`Store::record_parked`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drained {
    /// The parked row (`None`: this message was drained before).
    pub parked: Option<(Uuid, ParkedState)>,
    /// The errored result it recorded (empty when none).
    pub changed: Vec<Changed>,
}

/// Why a requeue was refused.
#[derive(Debug, thiserror::Error)]
pub enum RequeueError {
    #[error("no parked job {0}")]
    NotFound(Uuid),
    #[error("parked job {0} was requeued already")]
    AlreadyRequeued(Uuid),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A parked job taken back for publishing, in the caller's transaction.
#[derive(Debug, Clone)]
pub struct Requeued {
    pub run_id: Option<Uuid>,
    pub from_queue: String,
    pub body: Vec<u8>,
    /// Whether the case's errored row was given back to the run.
    pub reopened: bool,
}

/// A parked row locked for a requeue: run, case, queue, body, state, configuration, attempt.
type LockedParked = (
    Option<Uuid>,
    Option<String>,
    String,
    Vec<u8>,
    ParkedState,
    String,
    i32,
);

const PARKED_COLUMNS: &str =
    "id, run_id, test_case_id, from_queue, reason, state, parked_at, requeued_at";

impl Store {
    /// Records a drained message: its parked row and, when it is a job whose case can still
    /// be recorded, the case's `errored` result (`errored` must be that result), in one
    /// transaction.
    pub async fn record_parked(
        &self,
        parked: &NewParked<'_>,
        errored: Option<&JobResult>,
    ) -> Result<Drained, StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("starting the parking transaction"))?;
        let changed = match errored {
            Some(result) => {
                self.record_results_in(&mut tx, std::slice::from_ref(result))
                    .await?
            }
            None => Vec::new(),
        };
        let state = if changed.is_empty() {
            ParkedState::Unmatched
        } else {
            ParkedState::Errored
        };
        let (run_id, test_case_id, variant) = match parked.case {
            Some((run_id, case, variant)) => (Some(run_id), Some(case), variant),
            None => (None, None, Variant::PRIMARY),
        };
        // A run that is gone cannot be referenced: the row keeps no run then.
        let id: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO parked_jobs (id, run_id, test_case_id, from_queue, reason, body, state,
                                      configuration, run_number)
             SELECT $1, r.id, CASE WHEN r.id IS NULL THEN NULL ELSE $3 END, $4, $5, $6, $7,
                    $8, $9
             FROM (SELECT (SELECT id FROM runs WHERE id = $2) AS id) r
             ON CONFLICT (run_id, test_case_id, configuration, run_number)
                WHERE run_id IS NOT NULL AND state <> 'requeued'
             DO NOTHING
             RETURNING id",
        )
        .bind(Uuid::now_v7())
        .bind(run_id)
        .bind(test_case_id)
        .bind(parked.from_queue)
        .bind(parked.reason)
        .bind(parked.body)
        .bind(state)
        .bind(variant.configuration.as_str())
        .bind(i32::try_from(variant.run_number).unwrap_or(i32::MAX))
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::query("recording a parked job"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a parked job"))?;
        Ok(Drained {
            parked: id.map(|id| (id, state)),
            changed,
        })
    }

    /// Parked jobs, newest first; only those in `state` when given.
    pub async fn list_parked(
        &self,
        state: Option<ParkedState>,
        limit: i64,
    ) -> Result<Vec<ParkedJob>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {PARKED_COLUMNS} FROM parked_jobs
             WHERE $1::text IS NULL OR state = $1
             ORDER BY parked_at DESC, id DESC LIMIT $2"
        )))
        .bind(state)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing parked jobs"))
    }

    /// One parked job (`None`: no such row).
    pub async fn get_parked(&self, id: Uuid) -> Result<Option<ParkedJob>, StoreError> {
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {PARKED_COLUMNS} FROM parked_jobs WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a parked job"))
    }

    /// Takes a parked job back in the caller's transaction: marks it `requeued` and, for an
    /// `errored` one, gives its case back to its run (see the module documentation). Publish
    /// the returned message, then commit.
    pub async fn requeue_parked(
        &self,
        conn: &mut sqlx::PgConnection,
        id: Uuid,
    ) -> Result<Requeued, RequeueError> {
        let row: Option<LockedParked> = sqlx::query_as(
            "SELECT run_id, test_case_id, from_queue, body, state, configuration, run_number
             FROM parked_jobs WHERE id = $1 FOR UPDATE",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query("locking a parked job"))?;
        let Some((run_id, test_case_id, from_queue, body, state, configuration, run_number)) = row
        else {
            return Err(RequeueError::NotFound(id));
        };
        let variant = Variant {
            // The column's CHECK admits exactly the two configurations.
            configuration: Configuration::parse(&configuration).unwrap_or(Configuration::WithSkill),
            run_number: u32::try_from(run_number).unwrap_or(1).max(1),
        };
        let reopened = match (state, run_id, test_case_id.as_deref()) {
            (ParkedState::Requeued, ..) => return Err(RequeueError::AlreadyRequeued(id)),
            (ParkedState::Errored, Some(run_id), Some(case)) => {
                self.reopen_for_case(conn, run_id, case, variant).await?
            }
            _ => false,
        };
        sqlx::query("UPDATE parked_jobs SET state = 'requeued', requeued_at = now() WHERE id = $1")
            .bind(id)
            .execute(&mut *conn)
            .await
            .map_err(StoreError::query("marking a parked job requeued"))?;
        Ok(Requeued {
            run_id,
            from_queue,
            body,
            reopened,
        })
    }
}
