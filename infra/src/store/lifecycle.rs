//! The run lifecycle: a run's states, kinds and stop reasons as types, and every transition
//! between states as one guarded SQL statement. This module is the only writer of
//! `runs.status`, `runs.stop_reason` and `runs.finalised`.
//!
//! ```text
//!   create ──> creating ──end_creation──> running ──finalise──> completed
//!                 │  └──────────────finalise───────────┘  │
//!                 ├──stop(fail_fast|budget|delivery_limit)─> running (stopped)
//!                 └──cancel──> cancelled ──finalise──> cancelled (finalised)
//! ```
//!
//! - `creating`: the creator's first publishing pass is under way (the run's cases are being
//!   published from its plan, chunk by chunk); workers already record results.
//! - `running`: every case the cap allows is published; results come in.
//! - A *stop* (`stop_reason` set) ends a live run early: no further result is recorded, and
//!   the coordinator writes the cases never recorded as `skipped` ([`Store::write_off`]), so
//!   the run completes. `cancelled` is the stop a user asked for, and the run's final status.
//! - `finalise` happens once, when every planned case is recorded: the summary is stored and
//!   the status becomes `completed` (a cancelled run stays `cancelled`).
//! - `reopen` (an operator requeued a parked job): a `completed` run that was not stopped
//!   gives the case's `errored` row back and is `running` again until that case is recorded,
//!   when it finalises again (and announces it again).
//!
//! An illegal transition is refused with [`TransitionError`]: its guard matches no row and
//! the run's state is read back to say why.

use serde_json::Value;
use skilleval_execution::variant::Variant;
use uuid::Uuid;

use super::{Store, StoreError};

/// Where a run is in its life (`runs.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Creating,
    Running,
    Completed,
    Cancelled,
    Failed,
}

impl RunStatus {
    /// Every status, in lifecycle order (metrics report each, at 0 when no run has it).
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Creating,
        RunStatus::Running,
        RunStatus::Completed,
        RunStatus::Cancelled,
        RunStatus::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Creating => "creating",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Failed => "failed",
        }
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a run evaluates, which says how its jobs are planned and what finalising it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    /// Created by an upload (`POST /v1/skills`).
    Upload,
    /// Created by `POST /v1/runs`: planned and finalised exactly as an upload's run; only its
    /// origin differs (kept so that clients reading `kind` see what they saw before).
    Manual,
    /// Grades a completed run's stored outputs against a version's definition (no generation).
    Rescore,
    /// Judges one ingest batch of production samples on the lower-priority lane
    /// (`POST /v1/skills/{name}/samples`).
    Samples,
}

/// How a kind's jobs are planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// One job per selected case of the version's stored definition, in case order.
    StoredDefinition,
    /// One job per case of the version's definition that the source run recorded an output
    /// for, carrying that output (`given` runner: nothing is produced again).
    StoredOutputs,
    /// One job per sampled item of the run's ingest batch (its `samples` rows, in position
    /// order), graded by the monitor revision the batch was taken with.
    Samples,
}

/// What finalising a run of a kind produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalising {
    /// A suite summary and a pass/fail verdict, announced by webhook.
    Verdict,
    /// The same summary, announced to nobody: a samples run is one ingest batch; what its
    /// results mean is read over time (quality, alerts), not per run.
    Tally,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Upload => "upload",
            RunKind::Manual => "manual",
            RunKind::Rescore => "rescore",
            RunKind::Samples => "samples",
        }
    }

    /// How this kind's jobs are planned.
    pub fn planning(self) -> Planning {
        match self {
            RunKind::Upload | RunKind::Manual => Planning::StoredDefinition,
            RunKind::Rescore => Planning::StoredOutputs,
            RunKind::Samples => Planning::Samples,
        }
    }

    /// What finalising a run of this kind produces.
    pub fn finalising(self) -> Finalising {
        match self {
            RunKind::Upload | RunKind::Manual | RunKind::Rescore => Finalising::Verdict,
            RunKind::Samples => Finalising::Tally,
        }
    }
}

/// Why a run stopped before running every case (`runs.stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// `failFast`: a case failed or errored.
    FailFast,
    /// The run spent more than its budget.
    Budget,
    /// A user cancelled it.
    Cancelled,
    /// A job hit the jobs queue's delivery limit.
    DeliveryLimit,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::FailFast => "fail_fast",
            StopReason::Budget => "budget",
            StopReason::Cancelled => "cancelled",
            StopReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A transition of the lifecycle, named in [`TransitionError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    EndCreation,
    Stop(StopReason),
    Cancel,
    WriteOff,
    Finalise,
    /// A finalised run takes one case back (an operator requeued its parked job).
    Reopen,
}

/// A run's lifecycle state (what a refused transition found it in). Read from the row's
/// [`STATE_COLUMNS`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RunState {
    pub status: RunStatus,
    pub stop_reason: Option<StopReason>,
    /// The stop's sentence (what every case it skipped records).
    pub stop_detail: Option<String>,
    pub finalised: bool,
    pub total: i32,
    pub completed: i32,
}

impl RunState {
    /// Results are recorded and jobs published: not stopped, not finalised.
    pub fn is_live(&self) -> bool {
        matches!(self.status, RunStatus::Creating | RunStatus::Running)
            && self.stop_reason.is_none()
            && !self.finalised
    }

    /// Stopped early and not finalised: its unrecorded cases are to be written off.
    pub fn awaits_write_off(&self) -> bool {
        self.stop_reason.is_some() && !self.finalised && self.completed < self.total
    }

    /// Every planned case is recorded and the run is not finalised yet.
    pub fn awaits_finalising(&self) -> bool {
        !self.finalised && self.completed >= self.total
    }
}

/// A transition the run's state does not allow.
#[derive(Debug, thiserror::Error)]
pub enum TransitionError {
    #[error("run {0} does not exist")]
    NotFound(Uuid),
    #[error("run {run_id} cannot {transition:?} from {state:?}")]
    Illegal {
        run_id: Uuid,
        transition: Transition,
        state: RunState,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The columns a transition's `RETURNING` and a refusal's read give back.
pub(crate) const STATE_COLUMNS: &str =
    "status, stop_reason, stop_detail, finalised, total, completed";

type StateRow = (
    RunStatus,
    Option<StopReason>,
    Option<String>,
    bool,
    i32,
    i32,
);

fn state_of((status, stop_reason, stop_detail, finalised, total, completed): StateRow) -> RunState {
    RunState {
        status,
        stop_reason,
        stop_detail,
        finalised,
        total,
        completed,
    }
}

/// A finalised run's outcome, as [`Store::finalise`] wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalised {
    pub status: RunStatus,
}

impl Store {
    /// The run's lifecycle state (`None`: no such run).
    pub async fn run_state(&self, run_id: Uuid) -> Result<Option<RunState>, StoreError> {
        let row: Option<StateRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {STATE_COLUMNS} FROM runs WHERE id = $1"
        )))
        .bind(run_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a run's state"))?;
        Ok(row.map(state_of))
    }

    /// Why `transition` matched nothing: the run is gone, or its state forbids it.
    async fn refused(&self, run_id: Uuid, transition: Transition) -> TransitionError {
        match self.run_state(run_id).await {
            Ok(Some(state)) => TransitionError::Illegal {
                run_id,
                transition,
                state,
            },
            Ok(None) => TransitionError::NotFound(run_id),
            Err(e) => TransitionError::Store(e),
        }
    }

    /// `creating` -> `running`: the creator's first pass is done.
    pub async fn end_creation(&self, run_id: Uuid) -> Result<(), TransitionError> {
        let done =
            sqlx::query("UPDATE runs SET status = 'running' WHERE id = $1 AND status = 'creating'")
                .bind(run_id)
                .execute(self.pool())
                .await
                .map_err(StoreError::query("ending a run's creation"))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(self.refused(run_id, Transition::EndCreation).await)
        }
    }

    /// Stops a live run (not stopped, not finalised) for `reason` (not `cancelled`: that is
    /// [`Store::cancel`]); a run still `creating` becomes `running` (nothing more of it is
    /// published). Its unrecorded cases are then written off ([`Store::write_off`]).
    pub async fn stop(
        &self,
        run_id: Uuid,
        reason: StopReason,
        detail: &str,
    ) -> Result<(), TransitionError> {
        let mut conn = self
            .pool()
            .acquire()
            .await
            .map_err(StoreError::query("taking a connection to stop a run"))?;
        if stop_in(&mut conn, run_id, reason, detail)
            .await
            .map_err(StoreError::query("stopping a run"))?
        {
            Ok(())
        } else {
            Err(self.refused(run_id, Transition::Stop(reason)).await)
        }
    }

    /// `creating`/`running` -> `cancelled` for a run not finalised (stop reason `cancelled`
    /// unless it was stopped already: that stop stays its reason). Its unrecorded cases are
    /// then written off ([`Store::write_off`]).
    pub async fn cancel(&self, run_id: Uuid) -> Result<(), TransitionError> {
        let done = sqlx::query(
            "UPDATE runs SET status = 'cancelled',
                             stop_reason = COALESCE(stop_reason, 'cancelled'),
                             stop_detail = COALESCE(stop_detail, 'the run was cancelled')
             WHERE id = $1 AND status IN ('creating', 'running') AND NOT finalised",
        )
        .bind(run_id)
        .execute(self.pool())
        .await
        .map_err(StoreError::query("cancelling a run"))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(self.refused(run_id, Transition::Cancel).await)
        }
    }

    /// Writes the given cases of a stopped, unfinalised run that have no row yet as `skipped`
    /// (each `results` entry a skipped `JobResult` as JSON text, with its case's id, name and
    /// index), and counts exactly the rows inserted, in one statement. Refused for a run that
    /// is not stopped: a live run's cases are recorded by workers only. Returns how many rows
    /// it wrote.
    pub async fn write_off(
        &self,
        run_id: Uuid,
        cases: &WrittenOff<'_>,
    ) -> Result<i64, TransitionError> {
        let written: Option<i64> = sqlx::query_scalar(
            "WITH run AS (
                 SELECT id, COALESCE(stop_detail, stop_reason) AS why FROM runs
                 WHERE id = $1 AND stop_reason IS NOT NULL AND NOT finalised
                 FOR NO KEY UPDATE
             ), added AS (
                 INSERT INTO eval_results (run_id, test_case_id, name, case_index, strategy,
                                           weight, status, details, result, finished_at,
                                           configuration, run_number)
                 SELECT run.id, t.id, t.name, t.idx, t.strategy, t.weight, 'skipped',
                        jsonb_build_object('skipped', run.why), t.result, now(),
                        t.configuration, t.run_number
                 FROM run, UNNEST($2::text[], $3::text[], $4::int4[], $5::text[], $6::float8[],
                                  $7::text[], $8::text[], $9::int4[])
                          AS t(id, name, idx, strategy, weight, result, configuration,
                               run_number)
                 ON CONFLICT (run_id, test_case_id, configuration, run_number) DO NOTHING
                 RETURNING 1
             ), n AS (SELECT count(*)::int AS n FROM added)
             UPDATE runs SET completed = completed + n.n, skipped = skipped + n.n
             FROM n, run WHERE runs.id = run.id
             RETURNING n.n::int8",
        )
        .bind(run_id)
        .bind(&cases.ids)
        .bind(&cases.names)
        .bind(&cases.indexes)
        .bind(&cases.strategies)
        .bind(&cases.weights)
        .bind(&cases.results)
        .bind(&cases.configurations)
        .bind(&cases.run_numbers)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("writing off a stopped run's cases"))?;
        match written {
            Some(n) => Ok(n),
            None => Err(self.refused(run_id, Transition::WriteOff).await),
        }
    }

    /// Finalises a run exactly once, when every planned case is recorded: stores the summary
    /// and verdict, sets `finished_at`, and the status `completed` (a cancelled run stays
    /// `cancelled`). Of racing callers one wins; the others are refused (their webhook must
    /// not be sent). In the caller's transaction: what announces the finalisation (the
    /// webhook, [`Store::enqueue_webhook`]) commits with it or not at all.
    pub async fn finalise(
        &self,
        conn: &mut sqlx::PgConnection,
        run_id: Uuid,
        summary: &Value,
        verdict: &str,
    ) -> Result<Finalised, TransitionError> {
        let status: Option<RunStatus> = sqlx::query_scalar(
            "UPDATE runs
             SET finalised = true, summary = $2, verdict = $3, finished_at = now(),
                 status = CASE WHEN status = 'cancelled' THEN 'cancelled' ELSE 'completed' END
             WHERE id = $1 AND NOT finalised AND status IN ('creating', 'running', 'cancelled')
               AND completed >= total
             RETURNING status",
        )
        .bind(run_id)
        .bind(summary)
        .bind(verdict)
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query("finalising a run"))?;
        match status {
            Some(status) => Ok(Finalised { status }),
            None => Err(self.refused(run_id, Transition::Finalise).await),
        }
    }

    /// Reopens a finalised, completed run (not stopped) for one more case: the case's row is
    /// deleted and its counters given back, the summary and verdict cleared, the status
    /// `running` again; the run finalises again once the case is recorded. This is how an
    /// operator's requeue of a parked job ([`Store::requeue_parked`]) makes the case run
    /// again. A run not finalised yet only loses the row. In the caller's transaction; returns
    /// whether the case's row was there and deleted.
    pub(crate) async fn reopen_for_case(
        &self,
        conn: &mut sqlx::PgConnection,
        run_id: Uuid,
        test_case_id: &str,
        variant: Variant,
    ) -> Result<bool, TransitionError> {
        let reopened: Option<i32> = sqlx::query_scalar(
            "WITH run AS (
                 SELECT id FROM runs
                 WHERE id = $1 AND stop_reason IS NULL
                   AND status IN ('creating', 'running', 'completed')
                 FOR NO KEY UPDATE
             ), gone AS (
                 DELETE FROM eval_results e USING run
                 WHERE e.run_id = run.id AND e.test_case_id = $2 AND e.status = 'errored'
                   AND e.configuration = $3 AND e.run_number = $4
                 RETURNING e.run_id
             )
             UPDATE runs r
             SET completed = r.completed - 1, errored = r.errored - 1,
                 finalised = false, summary = NULL, verdict = NULL, finished_at = NULL,
                 status = CASE WHEN r.status = 'completed' THEN 'running' ELSE r.status END
             FROM gone WHERE r.id = gone.run_id
             RETURNING 1",
        )
        .bind(run_id)
        .bind(test_case_id)
        .bind(variant.configuration.as_str())
        .bind(i32::try_from(variant.run_number).unwrap_or(i32::MAX))
        .fetch_optional(&mut *conn)
        .await
        .map_err(StoreError::query("reopening a run for a requeued case"))?;
        match reopened {
            Some(_) => Ok(true),
            None => match self.run_state(run_id).await? {
                Some(state) if state.stop_reason.is_some() => Err(TransitionError::Illegal {
                    run_id,
                    transition: Transition::Reopen,
                    state,
                }),
                Some(_) => Ok(false),
                None => Err(TransitionError::NotFound(run_id)),
            },
        }
    }
}

/// [`Store::stop`] on a connection (the worker's results transaction stops a run over its
/// budget in the same transaction). Returns whether the run was live and is now stopped.
pub(crate) async fn stop_in(
    conn: &mut sqlx::PgConnection,
    run_id: Uuid,
    reason: StopReason,
    detail: &str,
) -> Result<bool, sqlx::Error> {
    debug_assert!(reason != StopReason::Cancelled, "a cancel is Store::cancel");
    let done = sqlx::query(
        "UPDATE runs SET stop_reason = $2, stop_detail = $3,
                         status = CASE WHEN status = 'creating' THEN 'running' ELSE status END
         WHERE id = $1 AND status IN ('creating', 'running') AND stop_reason IS NULL
           AND NOT finalised",
    )
    .bind(run_id)
    .bind(reason)
    .bind(detail)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Cases to write off ([`Store::write_off`]) as parallel columns.
#[derive(Debug, Default)]
pub struct WrittenOff<'a> {
    ids: Vec<&'a str>,
    names: Vec<&'a str>,
    indexes: Vec<i32>,
    strategies: Vec<&'a str>,
    weights: Vec<f64>,
    results: Vec<String>,
    configurations: Vec<&'static str>,
    run_numbers: Vec<i32>,
}

impl<'a> WrittenOff<'a> {
    /// Adds a case: its skipped result (what summaries and reports read) as JSON text.
    pub fn push(&mut self, result: &'a skilleval_execution::result::JobResult, text: String) {
        self.ids.push(&result.test_case_id);
        self.names.push(&result.name);
        self.indexes
            .push(i32::try_from(result.case_index).unwrap_or(i32::MAX));
        self.strategies.push(&result.strategy);
        self.weights.push(result.weight);
        self.results.push(text);
        self.configurations
            .push(result.variant.configuration.as_str());
        self.run_numbers
            .push(i32::try_from(result.variant.run_number).unwrap_or(i32::MAX));
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}
