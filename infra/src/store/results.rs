//! The workers' writes: results and the run counters they advance.
//!
//! A case's row is written once, when its outcome is known. [`Store::record_results`] inserts
//! a whole batch in one statement: only for runs still live (locked first, in id order, so a
//! stop and a batch serialise), `ON CONFLICT DO NOTHING` on `(run_id, test_case_id)` (so a
//! redelivered job, or the same case finished by two workers, writes nothing the second time),
//! and, in the same statement, adds to each run's counters exactly the rows inserted — cases
//! and the tokens and cost they spent (producing and grading). When that pushes a run over its
//! budget (`max_tokens`, `max_cost_usd`), the same transaction stops it
//! ([`lifecycle::stop_in`], reason `budget`) while the run's row is still locked; the
//! coordinator then writes off the cases never recorded. Deadlocks and lost connections are
//! transient ([`super::StoreError::is_transient`]): the batch is retried.

use std::borrow::Cow;
use std::collections::HashSet;

use chrono::{DateTime, Utc};
use skilleval_analysis::budget::BUDGET_EXCEEDED;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::variant::Variant;
use skilleval_model::text::{replace_nul, replace_nul_in_json};
use uuid::Uuid;

use super::lifecycle::{self, RunState, StopReason};
use super::{Store, StoreError};

/// A result whose row this call inserted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub status: CaseStatus,
}

/// Where a case stands, read before running a redelivered job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseState {
    /// The run still records results ([`RunState::is_live`]).
    pub run_live: bool,
    /// `None`: no outcome is recorded for this case yet.
    pub case_status: Option<CaseStatus>,
}

impl CaseState {
    /// Nothing is left to do for the case: it is recorded, or its run stopped or finished.
    pub fn is_decided(&self) -> bool {
        !self.run_live || self.case_status.is_some()
    }
}

const RECORD_RESULTS: &str = r"
WITH input AS (
    SELECT * FROM UNNEST(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::text[], $7::text[],
        $8::text[], $9::bool[], $10::text[], $11::text[], $12::text[], $13::int8[], $14::text[],
        $15::text[], $16::int8[], $17::int8[], $18::float8[], $19::int8[], $20::int8[],
        $21::float8[], $22::text[], $23::text[], $24::text[], $25::float8[], $26::bool[],
        $27::text[], $28::timestamptz[], $29::timestamptz[], $30::text[], $31::int4[],
        $32::text[], $33::int4[]
    ) AS t(run_id, test_case_id, status, strategy, score, rubric_scores, feedback,
           output, output_truncated, expected_output, matched_patterns, schema_errors,
           duration_ms, attempts, error, produce_input_tokens, produce_output_tokens,
           produce_cost_usd, grade_input_tokens, grade_output_tokens, grade_cost_usd,
           details, tags, suites, weight, critical, result, started_at, finished_at,
           name, case_index, configuration, run_number)
),
-- The batch's runs that still take results (live: not stopped, not finalised), locked in id
-- order before anything is written: a stop or cancel (which updates the run's row) waits for
-- this batch to commit, or this batch waits for it and then finds the run stopped and writes
-- nothing for it. Either way no case is recorded past a stop.
live AS (
    SELECT id, total FROM runs
    WHERE id IN (SELECT DISTINCT run_id FROM input)
      AND status IN ('creating', 'running') AND stop_reason IS NULL AND NOT finalised
    ORDER BY id
    FOR NO KEY UPDATE
),
added AS (
    INSERT INTO eval_results (
        run_id, test_case_id, name, case_index, status, strategy, score, rubric_scores,
        feedback, output, output_truncated, expected_output, matched_patterns, schema_errors,
        duration_ms, attempts, error, produce_input_tokens, produce_output_tokens,
        produce_cost_usd, grade_input_tokens, grade_output_tokens, grade_cost_usd, details,
        tags, suites, weight, critical, result, started_at, finished_at, configuration,
        run_number)
    SELECT i.run_id, i.test_case_id, i.name, i.case_index, i.status, i.strategy, i.score,
           i.rubric_scores::jsonb, i.feedback, i.output, i.output_truncated, i.expected_output,
           CASE WHEN i.matched_patterns IS NULL THEN NULL
                ELSE ARRAY(SELECT jsonb_array_elements_text(i.matched_patterns::jsonb)) END,
           i.schema_errors::jsonb, i.duration_ms, i.attempts::jsonb, i.error::jsonb,
           i.produce_input_tokens, i.produce_output_tokens, i.produce_cost_usd,
           i.grade_input_tokens, i.grade_output_tokens, i.grade_cost_usd, i.details::jsonb,
           ARRAY(SELECT jsonb_array_elements_text(i.tags::jsonb)),
           ARRAY(SELECT jsonb_array_elements_text(i.suites::jsonb)),
           i.weight, i.critical, i.result, i.started_at, i.finished_at, i.configuration,
           i.run_number
    -- Positions outside the plan are not the run's cases.
    FROM input i JOIN live l ON l.id = i.run_id AND i.case_index < l.total
    -- A redelivered job, or the same case (and variant) finished by two workers: the first
    -- row stays.
    ON CONFLICT (run_id, test_case_id, configuration, run_number) DO NOTHING
    RETURNING run_id, test_case_id, status,
              produce_input_tokens + produce_output_tokens
                + grade_input_tokens + grade_output_tokens AS tokens,
              produce_cost_usd + grade_cost_usd AS cost_usd
),
counts AS (
    SELECT run_id,
           count(*)::int4 AS n,
           sum(tokens)::int8 AS tokens,
           sum(cost_usd)::float8 AS cost_usd,
           (count(*) FILTER (WHERE status = 'passed'))::int4 AS passed,
           (count(*) FILTER (WHERE status = 'failed'))::int4 AS failed,
           (count(*) FILTER (WHERE status = 'errored'))::int4 AS errored,
           (count(*) FILTER (WHERE status = 'skipped'))::int4 AS skipped
    FROM added GROUP BY run_id
),
bumped AS (
    UPDATE runs r SET
        completed = r.completed + c.n,
        passed = r.passed + c.passed,
        failed = r.failed + c.failed,
        errored = r.errored + c.errored,
        skipped = r.skipped + c.skipped,
        tokens = r.tokens + c.tokens,
        cost_usd = r.cost_usd + c.cost_usd,
        started_at = COALESCE(r.started_at, now())
    FROM counts c
    WHERE r.id = c.run_id
    -- The new totals and the caps: the caller stops a run over budget in this transaction,
    -- while this statement's row lock on the run is still held.
    RETURNING r.id, r.tokens, r.cost_usd, r.budget_max_tokens, r.budget_max_cost_usd
)
SELECT a.run_id, a.test_case_id, a.status,
       b.tokens, b.cost_usd, b.budget_max_tokens, b.budget_max_cost_usd
FROM added a JOIN bumped b ON b.id = a.run_id
";

/// A changed row with its run's totals after this batch, as [`RECORD_RESULTS`] returns it.
type RecordedRow = (Uuid, String, String, i64, f64, Option<i64>, Option<f64>);

/// What a run spent against its caps, right after a batch was added to it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSpend {
    pub tokens: i64,
    pub cost_usd: f64,
    pub max_tokens: Option<i64>,
    pub max_cost_usd: Option<f64>,
}

impl RunSpend {
    /// `Some(reason)` when a cap is exceeded (strictly: spending exactly the cap is within it).
    /// The reason is what every case the stop skips records, and the run's `stop_reason`.
    pub fn exceeded(&self) -> Option<String> {
        if let Some(max) = self.max_tokens.filter(|max| self.tokens > *max) {
            return Some(format!(
                "{BUDGET_EXCEEDED}: tokens {} > {max} (max_tokens)",
                self.tokens
            ));
        }
        if let Some(max) = self.max_cost_usd.filter(|max| self.cost_usd > *max) {
            return Some(format!(
                "{BUDGET_EXCEEDED}: cost_usd {:.6} > {max:.6} (max_cost_usd)",
                self.cost_usd
            ));
        }
        None
    }
}

/// The batch as parallel arrays, one per column (what `UNNEST` takes). Strings are borrowed
/// from the results; JSON columns are sent as the text PostgreSQL parses into `jsonb`, written
/// straight from the result (building `serde_json::Value`s first, and cloning `details`, was a
/// fifth of a worker's CPU at 100,000 given-output cases). PostgreSQL's `text` and `jsonb`
/// cannot hold the NUL character, which a skill's output may: in the free-text columns and in
/// every JSON column it is stored as `␀` ([`skilleval_model::text::NUL_STAND_IN`]), so the
/// result is recorded (the grade was taken on the output as produced).
#[derive(Default)]
struct Columns<'a> {
    run_id: Vec<Uuid>,
    test_case_id: Vec<&'a str>,
    status: Vec<&'static str>,
    strategy: Vec<&'a str>,
    score: Vec<Option<f64>>,
    rubric_scores: Vec<Option<String>>,
    feedback: Vec<Option<Cow<'a, str>>>,
    output: Vec<Option<Cow<'a, str>>>,
    output_truncated: Vec<bool>,
    expected_output: Vec<Option<Cow<'a, str>>>,
    matched_patterns: Vec<Option<String>>,
    schema_errors: Vec<Option<String>>,
    duration_ms: Vec<i64>,
    attempts: Vec<String>,
    error: Vec<Option<String>>,
    produce_input_tokens: Vec<i64>,
    produce_output_tokens: Vec<i64>,
    produce_cost_usd: Vec<f64>,
    grade_input_tokens: Vec<i64>,
    grade_output_tokens: Vec<i64>,
    grade_cost_usd: Vec<f64>,
    details: Vec<String>,
    tags: Vec<String>,
    suites: Vec<String>,
    weight: Vec<f64>,
    critical: Vec<bool>,
    result: Vec<String>,
    started_at: Vec<DateTime<Utc>>,
    finished_at: Vec<DateTime<Utc>>,
    name: Vec<Cow<'a, str>>,
    case_index: Vec<i32>,
    configuration: Vec<&'static str>,
    run_number: Vec<i32>,
}

fn int8(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v)
        .map(replace_nul_in_json)
        .map_err(serialising)
}

fn serialising(e: serde_json::Error) -> StoreError {
    StoreError::Query {
        context: "serialising a result",
        source: sqlx::Error::Encode(Box::new(e)),
    }
}

impl<'a> Columns<'a> {
    fn push(&mut self, r: &'a JobResult) -> Result<(), StoreError> {
        self.run_id.push(r.run_id);
        self.test_case_id.push(&r.test_case_id);
        self.status.push(r.status.as_str());
        self.strategy.push(&r.strategy);
        self.score.push(r.score);
        self.rubric_scores
            .push(r.rubric_scores.as_ref().map(json).transpose()?);
        self.feedback.push(r.feedback.as_deref().map(replace_nul));
        self.output.push(r.output.as_deref().map(replace_nul));
        self.output_truncated.push(r.output_truncated);
        self.expected_output
            .push(r.expected_output.as_deref().map(replace_nul));
        self.matched_patterns
            .push(r.matched_patterns.as_ref().map(json).transpose()?);
        self.schema_errors
            .push(r.schema_errors.as_ref().map(json).transpose()?);
        self.duration_ms.push(int8(r.duration_ms));
        self.attempts.push(json(&r.attempts)?);
        self.error.push(r.error.as_ref().map(json).transpose()?);
        self.produce_input_tokens
            .push(int8(r.produce_usage.input_tokens));
        self.produce_output_tokens
            .push(int8(r.produce_usage.output_tokens));
        self.produce_cost_usd.push(r.produce_usage.cost_usd);
        self.grade_input_tokens
            .push(int8(r.grade_usage.input_tokens));
        self.grade_output_tokens
            .push(int8(r.grade_usage.output_tokens));
        self.grade_cost_usd.push(r.grade_usage.cost_usd);
        self.details.push(json(&r.details)?);
        self.tags.push(json(&r.tags)?);
        self.suites.push(json(&r.suites)?);
        self.weight.push(r.weight);
        self.critical.push(r.critical);
        self.result.push(json(r)?);
        self.started_at.push(r.started_at);
        self.finished_at.push(r.finished_at);
        self.name.push(replace_nul(&r.name));
        self.case_index
            .push(i32::try_from(r.case_index).unwrap_or(i32::MAX));
        self.configuration.push(r.variant.configuration.as_str());
        self.run_number
            .push(i32::try_from(r.variant.run_number).unwrap_or(i32::MAX));
        Ok(())
    }
}

impl Store {
    /// Stores a batch of final results in one transaction and one statement, and advances the
    /// counters of their runs by exactly the rows that changed. Returns the rows that changed;
    /// a result whose row is not `queued` any more (already recorded, skipped by a cancel) or
    /// does not exist is left out. Results still `queued` are ignored.
    #[tracing::instrument(skip_all, fields(batch = results.len()))]
    pub async fn record_results(&self, results: &[JobResult]) -> Result<Vec<Changed>, StoreError> {
        let mut seen = HashSet::with_capacity(results.len());
        let mut cols = Columns::default();
        for r in results {
            if !r.status.is_final() || !seen.insert((r.run_id, r.test_case_id.as_str(), r.variant))
            {
                continue;
            }
            cols.push(r)?;
        }
        if cols.run_id.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(StoreError::query("starting the results transaction"))?;
        let changed = record_columns(&mut tx, cols).await?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing results"))?;
        Ok(changed)
    }

    /// [`Store::record_results`] in the caller's transaction (the parking drain records a
    /// parked job's errored result with its parked row).
    pub async fn record_results_in(
        &self,
        conn: &mut sqlx::PgConnection,
        results: &[JobResult],
    ) -> Result<Vec<Changed>, StoreError> {
        let mut seen = HashSet::with_capacity(results.len());
        let mut cols = Columns::default();
        for r in results {
            if !r.status.is_final() || !seen.insert((r.run_id, r.test_case_id.as_str(), r.variant))
            {
                continue;
            }
            cols.push(r)?;
        }
        if cols.run_id.is_empty() {
            return Ok(Vec::new());
        }
        record_columns(conn, cols).await
    }
}

/// The insert, the counters and the budget stops of a batch, in `tx`.
async fn record_columns(
    tx: &mut sqlx::PgConnection,
    cols: Columns<'_>,
) -> Result<Vec<Changed>, StoreError> {
    {
        let rows: Vec<RecordedRow> = sqlx::query_as(RECORD_RESULTS)
            .bind(cols.run_id)
            .bind(cols.test_case_id)
            .bind(cols.status)
            .bind(cols.strategy)
            .bind(cols.score)
            .bind(cols.rubric_scores)
            .bind(cols.feedback)
            .bind(cols.output)
            .bind(cols.output_truncated)
            .bind(cols.expected_output)
            .bind(cols.matched_patterns)
            .bind(cols.schema_errors)
            .bind(cols.duration_ms)
            .bind(cols.attempts)
            .bind(cols.error)
            .bind(cols.produce_input_tokens)
            .bind(cols.produce_output_tokens)
            .bind(cols.produce_cost_usd)
            .bind(cols.grade_input_tokens)
            .bind(cols.grade_output_tokens)
            .bind(cols.grade_cost_usd)
            .bind(cols.details)
            .bind(cols.tags)
            .bind(cols.suites)
            .bind(cols.weight)
            .bind(cols.critical)
            .bind(cols.result)
            .bind(cols.started_at)
            .bind(cols.finished_at)
            .bind(cols.name)
            .bind(cols.case_index)
            .bind(cols.configuration)
            .bind(cols.run_number)
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query("recording results"))?;
        // A run this batch pushed over its budget stops now, in the same transaction (its row
        // is still locked): no other batch of the run records a case past the stop. The
        // coordinator writes off its unrecorded cases when it learns of the stop.
        let mut over: Vec<(Uuid, String)> = Vec::new();
        for (run_id, _, _, tokens, cost_usd, max_tokens, max_cost_usd) in &rows {
            if over.iter().any(|(id, _)| id == run_id) {
                continue;
            }
            let spend = RunSpend {
                tokens: *tokens,
                cost_usd: *cost_usd,
                max_tokens: *max_tokens,
                max_cost_usd: *max_cost_usd,
            };
            if let Some(reason) = spend.exceeded() {
                over.push((*run_id, reason));
            }
        }
        for (run_id, reason) in &over {
            let stopped = lifecycle::stop_in(&mut *tx, *run_id, StopReason::Budget, reason)
                .await
                .map_err(StoreError::query("stopping a run over its budget"))?;
            if stopped {
                tracing::info!(%run_id, reason = %reason, "budget exceeded: run stopped");
            }
        }
        Ok(rows
            .into_iter()
            .filter_map(|(run_id, test_case_id, status, ..)| {
                CaseStatus::parse(&status).map(|status| Changed {
                    run_id,
                    test_case_id,
                    status,
                })
            })
            .collect())
    }
}

impl Store {
    /// Whether the run was cancelled or stopped by its budget (an unknown run is not): either
    /// way its remaining jobs must not run. A stopped run's rows are no longer `queued`, so
    /// whatever a worker records for them changes nothing; this only saves the execution (and
    /// the money a budget stop is meant to save).
    pub async fn is_cancelled(&self, run_id: Uuid) -> Result<bool, StoreError> {
        let cancelled: Option<bool> = sqlx::query_scalar(
            "SELECT status = 'cancelled' OR stop_reason IS NOT NULL FROM runs WHERE id = $1",
        )
        .bind(run_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a run's status"))?;
        Ok(cancelled.unwrap_or(false))
    }

    /// Whether the run takes results and the recorded outcome of the case's `variant`, or
    /// `None` when the run does not exist.
    pub async fn case_state(
        &self,
        run_id: Uuid,
        test_case_id: &str,
        variant: Variant,
    ) -> Result<Option<CaseState>, StoreError> {
        let Some(run) = self.run_state(run_id).await? else {
            return Ok(None);
        };
        let status: Option<String> = sqlx::query_scalar(
            "SELECT status FROM eval_results
             WHERE run_id = $1 AND test_case_id = $2 AND configuration = $3 AND run_number = $4",
        )
        .bind(run_id)
        .bind(test_case_id)
        .bind(variant.configuration.as_str())
        .bind(i32::try_from(variant.run_number).unwrap_or(i32::MAX))
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a case's state"))?;
        Ok(Some(CaseState {
            run_live: RunState::is_live(&run),
            case_status: status.as_deref().and_then(CaseStatus::parse),
        }))
    }
}

/// What taking or renewing a case's claim found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The caller holds the claim, its lease renewed.
    Held,
    /// Another copy of the case holds it, its lease not expired.
    Elsewhere,
}

impl Store {
    /// Takes (or renews) the claim on attempt `attempt` of the case's `variant` for `holder`,
    /// leased for `lease`:
    /// held when nobody holds it, its lease expired, or `holder` holds it already; else
    /// [`Claim::Elsewhere`] (another copy runs the case).
    pub async fn claim_case(
        &self,
        run_id: Uuid,
        test_case_id: &str,
        variant: Variant,
        attempt: u32,
        holder: Uuid,
        lease: std::time::Duration,
    ) -> Result<Claim, StoreError> {
        let taken: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO case_claims
                (run_id, test_case_id, configuration, run_number, attempt, holder, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
             ON CONFLICT (run_id, test_case_id, configuration, run_number, attempt) DO UPDATE
               SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
               WHERE case_claims.holder = EXCLUDED.holder OR case_claims.expires_at < now()
             RETURNING holder",
        )
        .bind(run_id)
        .bind(test_case_id)
        .bind(variant.configuration.as_str())
        .bind(i32::try_from(variant.run_number).unwrap_or(i32::MAX))
        .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
        .bind(holder)
        .bind(lease.as_secs_f64())
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("claiming a case"))?;
        Ok(if taken.is_some() {
            Claim::Held
        } else {
            Claim::Elsewhere
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_is_exceeded_only_when_spending_passes_it() {
        let spend = |tokens, cost_usd| RunSpend {
            tokens,
            cost_usd,
            max_tokens: Some(100),
            max_cost_usd: Some(0.5),
        };
        assert_eq!(
            spend(100, 0.5).exceeded(),
            None,
            "reaching a cap is within it"
        );
        assert_eq!(
            spend(101, 0.0).exceeded().unwrap(),
            "budget exceeded: tokens 101 > 100 (max_tokens)"
        );
        assert_eq!(
            spend(0, 0.75).exceeded().unwrap(),
            "budget exceeded: cost_usd 0.750000 > 0.500000 (max_cost_usd)"
        );
        let unlimited = RunSpend {
            tokens: i64::MAX,
            cost_usd: f64::MAX,
            max_tokens: None,
            max_cost_usd: None,
        };
        assert_eq!(unlimited.exceeded(), None);
    }
}
