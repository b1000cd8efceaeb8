//! Runs: creating one with its plan, reading it back (the API's view, an event's progress,
//! the plan's request, the sweeps' lists) and reading its recorded results. Workers' writes
//! (results and the counters they advance) live in [`super::results`]; the run's state
//! transitions in [`super::lifecycle`]; publishing in [`super::publishing`]; versions in
//! [`super::versions`]. The pieces meet on `eval_results` rows and `runs` counters:
//!
//! - a run is created with its plan only ([`insert_run`]: the version's stored definition, the
//!   filter, `total` planned cases), no row per case;
//! - its jobs are published chunk by chunk; after each chunk's confirms the watermark
//!   `published_through` moves past it ([`advance_published`]);
//! - a case's row is inserted once, when its outcome is known (a worker's result, or written
//!   off as `skipped` when the run stopped), with the counters moved by exactly the rows
//!   inserted; pending cases are the planned ones without a row.
//!
//! All queries are checked at run time (no database needed to build).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Row};

use super::{Store, StoreError};
use uuid::Uuid;

use skilleval_execution::result::CaseStatus;
use skilleval_execution::variant::{Configuration, Variant};

use super::lifecycle::{RunKind, RunState, RunStatus, StopReason};

/// A run to create.
#[derive(Debug)]
pub struct NewRun<'a> {
    pub id: Uuid,
    pub version_id: Uuid,
    pub kind: RunKind,
    pub runner: Option<Value>,
    pub callback_url: Option<&'a str>,
    pub idempotency_key: Option<&'a str>,
    /// `maxConcurrentTests`: jobs of this run in flight at once (`None`: all).
    pub max_in_flight: Option<i32>,
    pub fail_fast: bool,
    /// The request's filter, what the run's plan is made from again.
    pub request: Value,
    /// Budget: the run stops once its cases spent more than this (`None`: no cap).
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
    /// The regression gate's thresholds (`skilleval_model::gate::GateConfig` as JSON; `None`:
    /// no gate).
    pub gate: Option<Value>,
    /// The creating request's W3C trace context, kept so later work on the run joins its trace.
    pub traceparent: Option<String>,
    /// The run's own definition (a rescore's inline `eval_config`): deflated text, profile and
    /// settings; `None`: its version's.
    pub definition: Option<OwnDefinition<'a>>,
    /// The stored token that asked for the run (`None`: a static token, none, or the service).
    pub token_id: Option<Uuid>,
}

/// A definition a run keeps itself (not its version's).
#[derive(Debug, Clone)]
pub struct OwnDefinition<'a> {
    pub deflated: &'a [u8],
    pub profile: &'a str,
    pub settings: Value,
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

/// Inserts the run and its plan (`total` planned cases; the definition is the version's, the
/// filter the request's), `creating`, in the caller's transaction. No case has a row until
/// its outcome is known. With an idempotency key already used, changes nothing and returns
/// that run.
#[tracing::instrument(skip_all, fields(run_id = %run.id, jobs = total))]
async fn insert_run(
    conn: &mut PgConnection,
    run: &NewRun<'_>,
    total: usize,
) -> Result<RunInsert, sqlx::Error> {
    let total = i32::try_from(total).unwrap_or(i32::MAX);
    let inserted: Option<Uuid> = sqlx::query_scalar(
        "INSERT INTO runs
            (id, version_id, kind, status, total, runner, callback_url, idempotency_key,
             max_in_flight, fail_fast, request, budget_max_cost_usd, budget_max_tokens, gate,
             traceparent, definition_deflate, definition_profile, definition_settings, token_id)
         VALUES ($1, $2, $3, 'creating', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                 $16, $17, $18)
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
    .bind(&run.gate)
    .bind(run.traceparent.as_deref())
    .bind(run.definition.as_ref().map(|d| d.deflated))
    .bind(run.definition.as_ref().map(|d| d.profile))
    .bind(run.definition.as_ref().map(|d| &d.settings))
    .bind(run.token_id)
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

/// Stopped runs whose unrecorded cases are not written off yet (a coordinator that stopped
/// one died before it wrote them, or a budget stop a worker made).
async fn runs_to_write_off(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs
         WHERE NOT finalised AND stop_reason IS NOT NULL AND completed < total
         ORDER BY created_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// What planning a run again needs: its version, runner override and filter.
#[derive(Debug, Clone)]
pub struct RunPlanRequest {
    pub version_id: Uuid,
    pub kind: RunKind,
    pub runner: Option<Value>,
    pub request: Value,
    /// The creating request's W3C trace context.
    pub traceparent: Option<String>,
    /// The run's own definition, deflated (a rescore's inline `eval_config`).
    pub definition: Option<Vec<u8>>,
}

async fn run_plan_request(
    conn: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
) -> Result<Option<RunPlanRequest>, sqlx::Error> {
    type Row = (
        Uuid,
        RunKind,
        Option<Value>,
        Value,
        Option<String>,
        Option<Vec<u8>>,
    );
    let row: Option<Row> = sqlx::query_as(
        "SELECT version_id, kind, runner, request, traceparent, definition_deflate
         FROM runs WHERE id = $1",
    )
    .bind(run_id)
    .fetch_optional(conn)
    .await?;
    Ok(row.map(
        |(version_id, kind, runner, request, traceparent, definition)| RunPlanRequest {
            version_id,
            kind,
            runner,
            request,
            traceparent,
            definition,
        },
    ))
}

/// What an event needs to know about its run, in one read of its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunProgress {
    pub state: RunState,
    pub fail_fast: bool,
    /// `maxConcurrentTests` holds jobs back (`max_in_flight` set).
    pub capped: bool,
    /// A `runInSequence` chain of the run is not published to its end: a recorded case may
    /// let its next one go.
    pub sequenced: bool,
}

/// The run's state for an event (`None`: no such run).
async fn progress(pool: &PgPool, run_id: Uuid) -> Result<Option<RunProgress>, sqlx::Error> {
    #[derive(sqlx::FromRow)]
    struct Row {
        #[sqlx(flatten)]
        state: RunState,
        fail_fast: bool,
        capped: bool,
        sequenced: bool,
    }
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {}, fail_fast, max_in_flight IS NOT NULL AS capped,
                EXISTS (SELECT 1 FROM run_sequences s
                        WHERE s.run_id = runs.id AND s.published < s.length) AS sequenced
         FROM runs WHERE id = $1",
        super::lifecycle::STATE_COLUMNS
    )))
    .bind(run_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| RunProgress {
        state: r.state,
        fail_fast: r.fail_fast,
        capped: r.capped,
        sequenced: r.sequenced,
    }))
}

/// Runs whose counters are complete but that are not finalised yet (the aggregator's sweep),
/// leaving out an upload run whose version's `no_collision` gate is still being evaluated.
async fn runs_ready_to_finalise(pool: &PgPool, limit: i64) -> Result<Vec<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT id FROM runs r WHERE NOT finalised AND completed >= total
            AND NOT (kind = 'upload' AND EXISTS (
                SELECT 1 FROM version_collisions c
                 WHERE c.version_id = r.version_id AND c.gated AND c.status = 'pending'))
         ORDER BY created_at LIMIT $1",
    )
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// One row of a run as the summary reads it: the stored result (rows skipped before results
/// were written once carry their job instead, which describes the case).
#[derive(Debug, Clone)]
pub struct CaseRow {
    pub case_index: i32,
    pub test_case_id: String,
    pub status: CaseStatus,
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
fn case_rows(
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
            status: case_status(&r.try_get::<String, _>(2)?)?,
            result: r.try_get(3)?,
            job: r.try_get(4)?,
            details: r.try_get(5)?,
        })
    })
}

/// A run's counters: one per planned case (`total`), and one per recorded row of each
/// outcome; `completed = passed + failed + errored + skipped` always holds. The API shows
/// them as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counters {
    pub total: i32,
    pub completed: i32,
    pub passed: i32,
    pub failed: i32,
    pub errored: i32,
    pub skipped: i32,
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
    pub kind: RunKind,
    pub status: RunStatus,
    pub counters: Counters,
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
    /// Why the run stopped early, when it did, and the stop's sentence.
    pub stop_reason: Option<StopReason>,
    pub stop_detail: Option<String>,
    /// The regression gate the run was created with (`GateConfig` as JSON).
    pub gate: Option<Value>,
    /// The creating request's W3C trace context (see [`NewRun::traceparent`]).
    pub traceparent: Option<String>,
    /// The version's package risk report (`None`: stored before reports existed).
    pub risk_report: Option<Value>,
}

async fn get_run(
    pool: impl sqlx::PgExecutor<'_>,
    run_id: Uuid,
) -> Result<Option<RunRow>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT r.id, r.version_id, s.name, v.version, v.description, v.package_hash,
                COALESCE(r.definition_profile, c.profile),
                COALESCE(r.definition_settings, c.settings), r.kind, r.status, r.total, r.completed, r.passed, r.failed, r.errored, r.skipped,
                r.summary, r.verdict, r.callback_url, r.finalised, r.created_at, r.finished_at,
                r.tokens, r.cost_usd, r.budget_max_tokens, r.budget_max_cost_usd, r.stop_reason,
                r.stop_detail, r.gate, r.traceparent, v.risk_report
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
            counters: Counters {
                total: r.try_get(10)?,
                completed: r.try_get(11)?,
                passed: r.try_get(12)?,
                failed: r.try_get(13)?,
                errored: r.try_get(14)?,
                skipped: r.try_get(15)?,
            },
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
            stop_detail: r.try_get(27)?,
            gate: r.try_get(28)?,
            traceparent: r.try_get(29)?,
            risk_report: r.try_get(30)?,
        })
    })
    .transpose()
}

/// One result as the results endpoint lists it.
#[derive(Debug, Clone)]
pub struct ResultRow {
    pub case_index: i32,
    /// Which configuration and attempt of the case the row is.
    pub variant: Variant,
    pub test_case_id: String,
    pub name: String,
    pub status: CaseStatus,
    pub strategy: String,
    pub result: Option<Value>,
    pub details: Option<Value>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Configurations in listing order (`Configuration`'s), positions from 1 as SQL numbers them.
const CONFIGURATION_ORDER: [Configuration; 3] = [
    Configuration::WithSkill,
    Configuration::WithoutSkill,
    Configuration::Trigger,
];

/// A page of recorded results after the row keyed `after` (case index, variant), in
/// (case index, variant) order, optionally of one status.
async fn list_results(
    pool: &PgPool,
    run_id: Uuid,
    status: Option<CaseStatus>,
    after: (i32, Variant),
    limit: i64,
) -> Result<Vec<ResultRow>, sqlx::Error> {
    // Variants in `Variant`'s order: with the skill, without, trigger queries, then by attempt
    // (an integer, not the text, so no collation can reorder them).
    let (after_index, after_variant) = after;
    let rows = sqlx::query(
        "SELECT case_index, test_case_id, name, status, strategy, result, details, finished_at,
                configuration, run_number
         FROM eval_results
         WHERE run_id = $1 AND case_index >= $2 AND ($3::text IS NULL OR status = $3)
           AND (case_index, array_position($7::text[], configuration), run_number) > ($2, $5, $6)
         ORDER BY case_index, array_position($7::text[], configuration), run_number LIMIT $4",
    )
    .bind(run_id)
    .bind(after_index)
    .bind(status.map(CaseStatus::as_str))
    .bind(limit)
    .bind(
        CONFIGURATION_ORDER
            .iter()
            .position(|c| *c == after_variant.configuration)
            .map_or(i32::MAX, |i| i32::try_from(i + 1).unwrap_or(i32::MAX)),
    )
    .bind(i32::try_from(after_variant.run_number).unwrap_or(i32::MAX))
    .bind(CONFIGURATION_ORDER.map(Configuration::as_str).to_vec())
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|r| {
            let configuration: String = r.try_get(8)?;
            let run_number: i32 = r.try_get(9)?;
            Ok(ResultRow {
                variant: Variant {
                    configuration: Configuration::parse(&configuration).ok_or_else(|| {
                        sqlx::Error::Decode(
                            format!("unknown configuration `{configuration}`").into(),
                        )
                    })?,
                    run_number: u32::try_from(run_number).unwrap_or(1),
                },
                case_index: r.try_get(0)?,
                test_case_id: r.try_get(1)?,
                name: r.try_get(2)?,
                status: case_status(&r.try_get::<String, _>(3)?)?,
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

/// Runs per status, and planned jobs of live runs not yet confirmed by the broker (for
/// `/metrics`).
async fn gauges(pool: &PgPool) -> Result<(Vec<(RunStatus, i64)>, i64), sqlx::Error> {
    let by_status: Vec<(RunStatus, i64)> =
        sqlx::query_as("SELECT status, count(*) FROM runs GROUP BY status")
            .fetch_all(pool)
            .await?;
    let unpublished: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(total - published_through), 0)::int8 FROM runs
         WHERE NOT finalised AND stop_reason IS NULL AND status IN ('creating', 'running')",
    )
    .fetch_one(pool)
    .await?;
    Ok((by_status, unpublished))
}

/// A stored case status (the table's CHECK allows no other).
fn case_status(s: &str) -> Result<CaseStatus, sqlx::Error> {
    CaseStatus::parse(s).ok_or_else(|| {
        sqlx::Error::Decode(format!("unknown case status `{s}` in eval_results").into())
    })
}

impl Store {
    /// Inserts the run and its plan (`total` planned cases), `creating`, in the caller's
    /// transaction; with an idempotency key already used, returns that run.
    pub async fn insert_run(
        &self,
        conn: &mut PgConnection,
        run: &NewRun<'_>,
        total: usize,
    ) -> Result<RunInsert, StoreError> {
        insert_run(conn, run, total)
            .await
            .map_err(StoreError::query("inserting a run"))
    }

    /// What planning the run again needs (`None`: no such run).
    pub async fn run_plan_request(
        &self,
        run_id: Uuid,
    ) -> Result<Option<RunPlanRequest>, StoreError> {
        run_plan_request(self.pool(), run_id)
            .await
            .map_err(StoreError::query("reading a run's request"))
    }

    /// Stopped runs whose unrecorded cases are not written off yet.
    pub async fn runs_to_write_off(&self, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        runs_to_write_off(self.pool(), limit)
            .await
            .map_err(StoreError::query("listing stopped runs"))
    }

    /// The run's state for an event (`None`: no such run).
    pub async fn progress(&self, run_id: Uuid) -> Result<Option<RunProgress>, StoreError> {
        progress(self.pool(), run_id)
            .await
            .map_err(StoreError::query("reading a run's progress"))
    }

    /// Runs whose counters are complete but that are not finalised yet.
    pub async fn runs_ready_to_finalise(&self, limit: i64) -> Result<Vec<Uuid>, StoreError> {
        runs_ready_to_finalise(self.pool(), limit)
            .await
            .map_err(StoreError::query("listing runs to finalise"))
    }

    /// Every recorded row of a run in case order, streamed.
    pub fn case_rows(
        &self,
        run_id: Uuid,
    ) -> impl futures::Stream<Item = Result<CaseRow, StoreError>> + Send + '_ {
        use futures::StreamExt as _;
        case_rows(self.pool(), run_id)
            .map(|row| row.map_err(StoreError::query("reading a run's results")))
    }

    /// A run as the API shows it (`None`: no such run).
    pub async fn get_run(&self, run_id: Uuid) -> Result<Option<RunRow>, StoreError> {
        get_run(self.pool(), run_id)
            .await
            .map_err(StoreError::query("reading a run"))
    }

    /// [`Store::get_run`] in the caller's transaction (what it wrote is visible).
    pub async fn get_run_in(
        &self,
        conn: &mut PgConnection,
        run_id: Uuid,
    ) -> Result<Option<RunRow>, StoreError> {
        get_run(conn, run_id)
            .await
            .map_err(StoreError::query("reading a run"))
    }

    /// A page of recorded results after `after_index`, optionally of one status.
    pub async fn list_results(
        &self,
        run_id: Uuid,
        status: Option<CaseStatus>,
        after: (i32, Variant),
        limit: i64,
    ) -> Result<Vec<ResultRow>, StoreError> {
        list_results(self.pool(), run_id, status, after, limit)
            .await
            .map_err(StoreError::query("listing a run's results"))
    }

    /// Runs per status, and planned jobs of live runs not yet confirmed (for `/metrics`).
    pub async fn gauges(&self) -> Result<(Vec<(RunStatus, i64)>, i64), StoreError> {
        gauges(self.pool())
            .await
            .map_err(StoreError::query("reading the run gauges"))
    }
}
