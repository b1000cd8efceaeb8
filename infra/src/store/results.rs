//! The workers' writes: results and the run counters they advance.
//!
//! A result row is created `queued` with its run (by the coordinator) and leaves `queued`
//! exactly once. [`Store::record_results`] writes a whole batch in one statement: it updates
//! only rows still `queued` (so a redelivered job, or the same case finished by two workers,
//! changes nothing the second time) and, in the same statement, adds to each run's counters
//! exactly the rows that changed, once per run — cases and the tokens and cost they spent
//! (producing and grading). When that pushes a run over its budget (`max_tokens`,
//! `max_cost_usd`), the same transaction stops it: [`runs::stop_for_budget`] sets its
//! `stop_reason` and skips its remaining queued rows, holding the run's row lock throughout.
//! A concurrent batch of the same run that already locked some of those rows can deadlock with
//! the stop; Postgres aborts one of the two (a transient error, as below), and a retry either
//! finds its rows skipped or stops the run itself. Concurrent writers of the same row serialise on
//! its row lock; the loser re-checks `status = 'queued'` after the winner commits and matches
//! nothing. Two batches that overlap in rows can deadlock; Postgres then aborts one, which
//! [`super::StoreError::is_transient`] reports as worth retrying.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use skilleval::executor::{CaseStatus, JobResult};
use skilleval::llm::budget::BUDGET_EXCEEDED;
use uuid::Uuid;

use super::{runs, Store, StoreError};

/// A result whose row this call moved out of `queued`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub run_id: Uuid,
    pub test_case_id: String,
    pub status: CaseStatus,
}

/// Where a case stands, read before running a redelivered job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseState {
    pub run_status: String,
    /// `None`: the run has no row for this case.
    pub case_status: Option<CaseStatus>,
}

impl CaseState {
    /// Nothing is left to do for the case: it finished, or its run is gone or cancelled.
    pub fn is_settled(&self) -> bool {
        self.run_status == "cancelled" || self.case_status.is_none_or(CaseStatus::is_final)
    }
}

const RECORD_RESULTS: &str = r"
WITH input AS (
    SELECT * FROM UNNEST(
        $1::uuid[], $2::text[], $3::text[], $4::text[], $5::float8[], $6::text[], $7::text[],
        $8::text[], $9::bool[], $10::text[], $11::text[], $12::text[], $13::int8[], $14::text[],
        $15::text[], $16::int8[], $17::int8[], $18::float8[], $19::int8[], $20::int8[],
        $21::float8[], $22::text[], $23::text[], $24::text[], $25::float8[], $26::bool[],
        $27::text[], $28::timestamptz[], $29::timestamptz[]
    ) AS t(run_id, test_case_id, status, strategy, score, rubric_scores, feedback,
           output, output_truncated, expected_output, matched_patterns, schema_errors,
           duration_ms, attempts, error, produce_input_tokens, produce_output_tokens,
           produce_cost_usd, grade_input_tokens, grade_output_tokens, grade_cost_usd,
           details, tags, suites, weight, critical, result, started_at, finished_at)
),
changed AS (
    UPDATE eval_results e SET
        status = i.status,
        strategy = i.strategy,
        score = i.score,
        rubric_scores = i.rubric_scores::jsonb,
        feedback = i.feedback,
        output = i.output,
        output_truncated = i.output_truncated,
        expected_output = i.expected_output,
        matched_patterns = CASE WHEN i.matched_patterns IS NULL THEN NULL
                                ELSE ARRAY(SELECT jsonb_array_elements_text(i.matched_patterns::jsonb)) END,
        schema_errors = i.schema_errors::jsonb,
        duration_ms = i.duration_ms,
        attempts = i.attempts::jsonb,
        error = i.error::jsonb,
        produce_input_tokens = i.produce_input_tokens,
        produce_output_tokens = i.produce_output_tokens,
        produce_cost_usd = i.produce_cost_usd,
        grade_input_tokens = i.grade_input_tokens,
        grade_output_tokens = i.grade_output_tokens,
        grade_cost_usd = i.grade_cost_usd,
        details = i.details::jsonb,
        tags = ARRAY(SELECT jsonb_array_elements_text(i.tags::jsonb)),
        suites = ARRAY(SELECT jsonb_array_elements_text(i.suites::jsonb)),
        weight = i.weight,
        critical = i.critical,
        result = i.result,
        -- Nothing reads a recorded case's job again (see the migration that made it nullable).
        job = NULL,
        started_at = i.started_at,
        finished_at = i.finished_at,
        updated_at = now()
    FROM input i
    -- `status || ''` keeps the planner off any index on `status` for this join (there was a
    -- `(run_id, status)` one: a new run's rows looked rare to it, so it walked every queued row
    -- of the run for each input row, 1 s per 200-row batch at 30,000 cases) and on the
    -- primary key (run_id, test_case_id), one row each.
    WHERE e.run_id = i.run_id AND e.test_case_id = i.test_case_id AND e.status || '' = 'queued'
    RETURNING e.run_id, e.test_case_id, e.status,
              e.produce_input_tokens + e.produce_output_tokens
                + e.grade_input_tokens + e.grade_output_tokens AS tokens,
              e.produce_cost_usd + e.grade_cost_usd AS cost_usd
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
    FROM changed GROUP BY run_id
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
    RETURNING r.id, r.tokens, r.cost_usd, r.budget_max_tokens, r.budget_max_cost_usd,
              (r.status = 'running' AND NOT r.finalised AND r.stop_reason IS NULL) AS stoppable
)
SELECT c.run_id, c.test_case_id, c.status,
       b.tokens, b.cost_usd, b.budget_max_tokens, b.budget_max_cost_usd, b.stoppable
FROM changed c JOIN bumped b ON b.id = c.run_id
";

/// A changed row with its run's totals after this batch, as [`RECORD_RESULTS`] returns it.
type RecordedRow = (
    Uuid,
    String,
    String,
    i64,
    f64,
    Option<i64>,
    Option<f64>,
    bool,
);

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
/// fifth of a worker's CPU at 100,000 given-output cases).
#[derive(Default)]
struct Columns<'a> {
    run_id: Vec<Uuid>,
    test_case_id: Vec<&'a str>,
    status: Vec<&'static str>,
    strategy: Vec<&'a str>,
    score: Vec<Option<f64>>,
    rubric_scores: Vec<Option<String>>,
    feedback: Vec<Option<&'a str>>,
    output: Vec<Option<&'a str>>,
    output_truncated: Vec<bool>,
    expected_output: Vec<Option<&'a str>>,
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
}

fn int8(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(serialising)
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
        self.feedback.push(r.feedback.as_deref());
        self.output.push(r.output.as_deref());
        self.output_truncated.push(r.output_truncated);
        self.expected_output.push(r.expected_output.as_deref());
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
            if !r.status.is_final() || !seen.insert((r.run_id, r.test_case_id.as_str())) {
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
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::query("recording results"))?;
        // A run this batch pushed over its budget stops now, in the same transaction: its
        // remaining queued rows are skipped (with their counters) before any other batch of
        // the run can commit, so no case is recorded past the stop and the counters stay exact.
        let mut over: Vec<(Uuid, String)> = Vec::new();
        for (run_id, _, _, tokens, cost_usd, max_tokens, max_cost_usd, stoppable) in &rows {
            if !*stoppable || over.iter().any(|(id, _)| id == run_id) {
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
            let skipped = runs::stop_for_budget(&mut tx, *run_id, reason)
                .await
                .map_err(StoreError::query("stopping a run over its budget"))?;
            tracing::info!(%run_id, skipped, reason = %reason, "budget exceeded: run stopped");
        }
        tx.commit()
            .await
            .map_err(StoreError::query("committing results"))?;
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

    /// The run's status and the case's, or `None` when the run does not exist.
    pub async fn case_state(
        &self,
        run_id: Uuid,
        test_case_id: &str,
    ) -> Result<Option<CaseState>, StoreError> {
        let row: Option<(String, Option<String>)> = sqlx::query_as(
            "SELECT r.status, e.status FROM runs r
             LEFT JOIN eval_results e ON e.run_id = r.id AND e.test_case_id = $2
             WHERE r.id = $1",
        )
        .bind(run_id)
        .bind(test_case_id)
        .fetch_optional(self.pool())
        .await
        .map_err(StoreError::query("reading a case's state"))?;
        Ok(row.map(|(run_status, case_status)| CaseState {
            run_status,
            case_status: case_status.as_deref().and_then(CaseStatus::parse),
        }))
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
