//! A run's stored results read back as the domain's [`JobResult`]s, in case order: streamed
//! one row at a time ([`for_each_result`], what finalisation sums) or whole ([`load_results`],
//! for reports, comparisons and rescores), and a finalised run's stored summary. Below the
//! modules that read them (aggregation, comparisons, rescores, views), which is what keeps
//! their arrows one way.

use anyhow::Context as _;
use futures::TryStreamExt as _;
use serde_json::Value;
use skilleval_analysis::compare::GateRecord;
use skilleval_analysis::summary::RunSummary;
use skilleval_execution::plan::Job;
use skilleval_execution::result::JobResult;
use skilleval_infra::store::runs::CaseRow;
use skilleval_infra::store::Store;
use uuid::Uuid;

/// Every recorded result of a run in case order.
pub async fn load_results(store: &Store, run_id: Uuid) -> anyhow::Result<Vec<JobResult>> {
    let mut results = Vec::new();
    for_each_result(store, run_id, |r| results.push(r)).await?;
    Ok(results)
}

/// Hands every result of a run to `f` in case order, streamed: one row in hand at a time.
pub async fn for_each_result(
    store: &Store,
    run_id: Uuid,
    mut f: impl FnMut(JobResult),
) -> anyhow::Result<()> {
    let rows = store.case_rows(run_id);
    futures::pin_mut!(rows);
    while let Some(row) = rows.try_next().await? {
        f(job_result(row)?);
    }
    Ok(())
}

fn job_result(row: CaseRow) -> anyhow::Result<JobResult> {
    if let Some(result) = row.result {
        return serde_json::from_str(&result).with_context(|| {
            format!(
                "stored result of case `{}` does not parse",
                row.test_case_id
            )
        });
    }
    // A row skipped before results were written once: its job describes the case.
    let job = row
        .job
        .with_context(|| format!("case `{}` has neither a result nor a job", row.test_case_id))?;
    let job: Job = serde_json::from_str(&job)
        .with_context(|| format!("stored job of case `{}` does not parse", row.test_case_id))?;
    let reason = row
        .details
        .as_ref()
        .and_then(|d| d.get("skipped"))
        .and_then(Value::as_str)
        .unwrap_or("skipped")
        .to_string();
    let mut r = JobResult::skipped(&job, &reason);
    r.status = row.status;
    Ok(r)
}

/// What the regression gate of a finalised run decided (its summary's `regression_gate`),
/// when the run asked for a gate.
pub fn stored_gate(summary: Option<&Value>) -> Option<GateRecord> {
    summary
        .and_then(|v| v.get("regression_gate"))
        .and_then(|g| serde_json::from_value(g.clone()).ok())
}

/// The stored summary of a finalised run.
pub fn stored_summary(summary: Option<&Value>) -> Option<RunSummary> {
    summary.and_then(|v| serde_json::from_value(v.clone()).ok())
}
