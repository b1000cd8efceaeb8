//! Aggregation: turn finished cases into finished runs.
//!
//! Workers announce finished cases on the events exchange, one event per run per committed
//! batch. For each event the aggregator reads the run's row once, then applies `failFast` (a
//! failed or errored case skips the rest of its run), releases more of the run's jobs when
//! `maxConcurrentTests` holds some back, and finalises the run once its counters are complete. A
//! periodic sweep does the same for runs whose events were missed (a coordinator restart, a
//! lost event), so a complete run is always finalised.
//!
//! Finalising is exactly-once even with several replicas racing: the summary is computed from
//! the stored results, then written by a conditional `UPDATE ... WHERE NOT finalised`; only the
//! caller whose update matched sends the webhook.
//!
//! A run its budget stopped (`stop_reason`, set when recording results pushed it over) is
//! finalised like any other, but its verdict is `fail` with the stop as the first reason.

use std::sync::Arc;

use crate::db::{self as runs, CaseRow};
use anyhow::Context as _;
use futures::TryStreamExt as _;
use serde_json::{json, Value};
use skilleval::executor::{CaseStatus, JobResult};
use skilleval::llm::budget::mark_stopped;
use skilleval::model::Settings;
use skilleval::plan::Job;
use skilleval::summary::{RunSummary, Summarizer};
pub use skilleval_infra::messages::{CaseFinished, CasesFinished};
use sqlx::PgPool;
use uuid::Uuid;

use crate::launch::RunLauncher;
use crate::metrics::Metrics;
use crate::views::RunView;
use crate::webhook::WebhookSender;

/// Applies events and sweeps to runs: failFast, releases, finalisation and webhooks.
#[derive(Debug, Clone)]
pub struct RunAggregator {
    pool: PgPool,
    launcher: RunLauncher,
    metrics: Arc<Metrics>,
    webhooks: Option<WebhookSender>,
}

impl RunAggregator {
    pub fn new(
        pool: PgPool,
        launcher: RunLauncher,
        metrics: Arc<Metrics>,
        webhooks: Option<WebhookSender>,
    ) -> Self {
        RunAggregator {
            pool,
            launcher,
            metrics,
            webhooks,
        }
    }

    /// Handles one case-finished event (a batch of one).
    pub async fn on_case_finished(&self, event: &CaseFinished) -> anyhow::Result<()> {
        self.on_cases_finished(&CasesFinished::from(event.clone()))
            .await
    }

    /// Handles one event: the cases of one run a worker committed in one batch. One read of
    /// the run decides what else is needed: failFast when a case failed and the run asks for
    /// it, a release when `maxConcurrentTests` holds jobs back, finalisation when the counters
    /// are complete. A run without a cap has nothing to release here (creation published
    /// everything; the sweeper republishes what a broker failure left behind).
    #[tracing::instrument(skip_all, fields(run_id = %event.run_id, cases = event.cases.len()))]
    pub async fn on_cases_finished(&self, event: &CasesFinished) -> anyhow::Result<()> {
        self.metrics.events_consumed.inc();
        let Some(state) = runs::progress(&self.pool, event.run_id).await? else {
            return Ok(());
        };
        let mut complete = state.complete;
        if state.running && state.fail_fast {
            if let Some(failure) = event.first_failure() {
                let skipped =
                    runs::stop_after_failure(&self.pool, event.run_id, &failure.test_case_id)
                        .await?;
                if skipped > 0 {
                    tracing::info!(skipped, "failFast: skipped the rest of the run");
                    complete = runs::is_ready_to_finalise(&self.pool, event.run_id).await?;
                }
            }
        }
        if state.running && state.capped && !complete {
            self.launcher.release_logged(event.run_id).await;
        }
        if complete {
            self.finalise(event.run_id).await?;
        }
        Ok(())
    }

    /// Finalises every complete run not finalised yet, and releases held-back jobs. Returns
    /// how many runs this call finalised.
    pub async fn sweep(&self) -> anyhow::Result<usize> {
        let ready = runs::runs_ready_to_finalise(&self.pool, 200).await?;
        let mut finalised = 0;
        for run_id in ready {
            match self.finalise(run_id).await {
                Ok(true) => finalised += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(%run_id, error = ?e, "finalising the run failed; the next sweep retries");
                }
            }
        }
        Ok(finalised)
    }

    /// Computes the summary and finalises the run if nobody did yet; `true` when this call
    /// finalised it (and sent the webhook).
    #[tracing::instrument(skip(self))]
    pub async fn finalise(&self, run_id: Uuid) -> anyhow::Result<bool> {
        let Some(run) = runs::get_run(&self.pool, run_id).await? else {
            return Ok(false);
        };
        if run.finalised {
            return Ok(false);
        }
        let settings: Settings = if run.settings.is_null() {
            Settings::default()
        } else {
            serde_json::from_value(run.settings.clone()).context("stored eval settings")?
        };
        // Streamed row by row: memory does not grow with the run's size.
        let mut summarizer = Summarizer::default();
        let mut not_run = 0u64;
        let stop_reason = run.stop_reason.as_deref();
        for_each_result(&self.pool, run_id, |r| {
            // A run its budget stopped did not run every case: the cases the stop skipped
            // carry the reason itself.
            if stop_reason.is_some()
                && r.status == CaseStatus::Skipped
                && r.details.get("skipped").and_then(Value::as_str) == stop_reason
            {
                not_run += 1;
            }
            summarizer.add(&r);
        })
        .await?;
        let mut summary = summarizer.finish(&settings);
        if let Some(reason) = stop_reason {
            // It must not pass, whatever the cases it did run scored.
            mark_stopped(&mut summary, reason, not_run);
        }
        let summary_json = serde_json::to_value(&summary).context("serialising the summary")?;
        let won =
            runs::finalise(&self.pool, run_id, &summary_json, summary.verdict.as_str()).await?;
        if !won {
            return Ok(false);
        }
        let outcome = if run.status == "cancelled" {
            "cancelled"
        } else {
            summary.verdict.as_str()
        };
        Metrics::count(&self.metrics.runs_finalised, outcome);
        tracing::info!(
            verdict = summary.verdict.as_str(),
            pass_rate = summary.pass_rate,
            "run finalised"
        );
        if let (Some(url), Some(sender)) = (run.callback_url.clone(), self.webhooks.clone()) {
            let Some(view) = runs::get_run(&self.pool, run_id)
                .await?
                .map(|r| RunView::from_row(&r))
            else {
                return Ok(true);
            };
            let body = serde_json::to_vec(&json!({ "event": "run.finished", "run": view }))
                .context("webhook body")?;
            let metrics = self.metrics.clone();
            // Delivery retries for minutes: never hold up the aggregator for it.
            tokio::spawn(async move {
                let delivery = sender.deliver(&url, "run.finished", &body).await;
                Metrics::count(&metrics.webhooks, delivery.outcome());
            });
        }
        Ok(true)
    }
}

/// Every result of a run in case order, read page by page; a case that never ran (skipped,
/// or still queued) is described from its job.
pub async fn load_results(pool: &PgPool, run_id: Uuid) -> anyhow::Result<Vec<JobResult>> {
    let mut results = Vec::new();
    for_each_result(pool, run_id, |r| results.push(r)).await?;
    Ok(results)
}

/// Hands every result of a run to `f` in case order, streamed: one row in hand at a time.
pub async fn for_each_result(
    pool: &PgPool,
    run_id: Uuid,
    mut f: impl FnMut(JobResult),
) -> anyhow::Result<()> {
    let rows = runs::case_rows(pool, run_id);
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
        .unwrap_or(if row.status == "queued" {
            "not run"
        } else {
            "skipped"
        })
        .to_string();
    let mut r = JobResult::skipped(&job, &reason);
    if row.status == "queued" {
        r.status = CaseStatus::Queued;
    }
    Ok(r)
}

/// The stored summary of a finalised run.
pub fn stored_summary(summary: Option<&Value>) -> Option<RunSummary> {
    summary.and_then(|v| serde_json::from_value(v.clone()).ok())
}
