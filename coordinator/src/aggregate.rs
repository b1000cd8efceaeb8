//! Aggregation: turn finished cases into finished runs.
//!
//! Workers announce finished cases on the events exchange, one event per run per committed
//! batch. For each event the aggregator reads the run's row once, then applies `failFast` (a
//! failed or errored case stops its run), writes off the never-recorded cases of a stopped run
//! (failFast, or a budget stop a worker's batch made), publishes more of the run's jobs when
//! `maxConcurrentTests` holds some back or a `runInSequence` chain's next case is due, and
//! finalises the run once every planned case is recorded. A periodic sweep does the same for runs whose events were missed (a coordinator
//! restart, a lost event), so a complete run is always finalised.
//!
//! Finalising is exactly-once even with several replicas racing: the summary is computed from
//! the stored results, then written by the lifecycle's guarded `finalise`; only the caller
//! whose update matched enqueues the webhook, in the same transaction (the outbox,
//! [`crate::webhook`]), so a finalised run's webhook is never lost to a crash.
//!
//! A run its budget stopped is finalised like any other, but its verdict is `fail` with the
//! stop as the first reason. An upload run whose upload asked for `gate=no_collision` waits,
//! once complete, for its version's collision eval (`crate::collisions`): a failed gate, or
//! one the eval could not decide, makes its verdict `fail` with the reason first.

use std::sync::Arc;

use anyhow::Context as _;
use serde_json::{json, Value};
use skilleval_analysis::benchmark::{BenchmarkMetadata, Extras};
use skilleval_analysis::budget::mark_stopped;
use skilleval_analysis::collisions::CollisionGate;
use skilleval_analysis::summary::{Summarizer, Verdict};
use skilleval_execution::result::NO_BASELINE;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::runner::trigger::{is_trigger_result, trigger_report, TriggerPlan};
use skilleval_execution::triggers::{self, SkillCard};
use skilleval_execution::variant::Configuration;
pub use skilleval_infra::messages::{CaseFinished, CasesFinished};
use skilleval_infra::store::catalogue::{CollisionStatus, GateState};
use skilleval_infra::store::lifecycle::{
    Finalising, RunKind, RunState, RunStatus, StopReason, TransitionError,
};
use skilleval_infra::store::outbox::NewWebhook;
use skilleval_infra::store::runs::RunRow;
use skilleval_infra::store::Store;
use skilleval_model::definition::EvalSettings;
use skilleval_model::gate::GateConfig;
use skilleval_reports::ReportExtras;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::comparing::regression_gate;
use crate::metrics::Metrics;
use crate::results::{for_each_result, load_results};
use crate::runs::planner::RunPlanner;
use crate::runs::publish::RunPublisher;
use crate::runs::sweep::RunSweeper;
use crate::views::RunView;
use crate::webhook::WebhookOutbox;

/// The event a finalised run's webhook announces.
pub const RUN_FINISHED: &str = "run.finished";

/// Applies events and sweeps to runs: failFast, releases, finalisation and webhooks.
#[derive(Debug, Clone)]
pub struct RunAggregator {
    store: Store,
    planner: RunPlanner,
    publisher: RunPublisher,
    sweeper: RunSweeper,
    metrics: Arc<Metrics>,
    webhooks: Option<WebhookOutbox>,
}

impl RunAggregator {
    pub fn new(
        store: Store,
        planner: RunPlanner,
        publisher: RunPublisher,
        sweeper: RunSweeper,
        metrics: Arc<Metrics>,
        webhooks: Option<WebhookOutbox>,
    ) -> Self {
        RunAggregator {
            store,
            planner,
            publisher,
            sweeper,
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
    /// it, a write-off when the run is stopped, a release when `maxConcurrentTests` holds jobs
    /// back, finalisation when every planned case is recorded.
    #[tracing::instrument(skip_all, fields(run_id = %event.run_id, cases = event.cases.len()))]
    pub async fn on_cases_finished(&self, event: &CasesFinished) -> anyhow::Result<()> {
        self.metrics.events_consumed.inc();
        let run_id = event.run_id;
        let Some(progress) = self.store.progress(run_id).await? else {
            return Ok(());
        };
        let mut state = progress.state;
        if state.is_live() && progress.fail_fast {
            if let Some(failure) = event.first_failure() {
                let detail = format!("failFast: case `{}` did not pass", failure.test_case_id);
                match self.store.stop(run_id, StopReason::FailFast, &detail).await {
                    Ok(()) => tracing::info!("failFast: the run stopped"),
                    // Stopped meanwhile (another event, a cancel): that stop stands.
                    Err(TransitionError::Illegal { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
                state = self.state(run_id).await?;
            }
        }
        if state.awaits_write_off() {
            let skipped = self.sweeper.write_off(run_id).await?;
            if skipped > 0 {
                tracing::info!(skipped, "wrote off the stopped run's remaining cases");
            }
            state = self.state(run_id).await?;
        }
        if state.is_live() && (progress.capped || progress.sequenced) && !state.awaits_finalising()
        {
            self.publisher.release_logged(run_id).await;
        }
        if state.awaits_finalising() {
            self.finalise(run_id).await?;
        }
        Ok(())
    }

    async fn state(&self, run_id: Uuid) -> anyhow::Result<RunState> {
        self.store
            .run_state(run_id)
            .await?
            .with_context(|| format!("run {run_id} is gone"))
    }

    /// Writes off stopped runs, then finalises every complete run not finalised yet.
    /// Returns how many runs this call finalised.
    pub async fn sweep(&self) -> anyhow::Result<usize> {
        let stopped = self.store.runs_to_write_off(50).await?;
        for run_id in stopped {
            if let Err(e) = self.sweeper.write_off(run_id).await {
                tracing::warn!(%run_id, error = %e, "writing off the stopped run failed; the next sweep retries");
            }
        }
        let ready = self.store.runs_ready_to_finalise(200).await?;
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
    /// finalised it (and enqueued its webhook). Traced in the run's trace (a child of the
    /// request that created it), whichever event or sweep got here.
    pub async fn finalise(&self, run_id: Uuid) -> anyhow::Result<bool> {
        let Some(run) = self.store.get_run(run_id).await? else {
            return Ok(false);
        };
        if run.finalised || run.counters.completed < run.counters.total {
            return Ok(false);
        }
        // An upload that asked for `gate=no_collision`: its run waits for the version's
        // collision eval (the catalogue lane finalises it once the eval is recorded).
        let collision_gate = if run.kind == RunKind::Upload && run.status != RunStatus::Cancelled {
            self.store.collision_gate_of(run.version_id).await?
        } else {
            None
        };
        if collision_gate
            .as_ref()
            .is_some_and(|g| g.status == CollisionStatus::Pending)
        {
            return Ok(false);
        }
        let span = tracing::info_span!(
            "finalise run",
            skilleval.run_id = %run_id,
            skilleval.verdict = tracing::field::Empty,
        );
        skilleval_infra::telemetry::set_parent(&span, run.traceparent.as_deref());
        self.finalise_run(run, collision_gate)
            .instrument(span)
            .await
    }

    async fn finalise_run(
        &self,
        run: RunRow,
        collision_gate: Option<GateState>,
    ) -> anyhow::Result<bool> {
        let run_id = run.id;
        let announce = match run.kind.finalising() {
            Finalising::Verdict => true,
            Finalising::Tally => false,
        };
        let settings: EvalSettings = if run.settings.is_null() {
            EvalSettings::default()
        } else {
            serde_json::from_value(run.settings.clone()).context("stored eval settings")?
        };
        // Streamed row by row: memory does not grow with the run's size.
        let mut summarizer = Summarizer::default();
        let mut not_run = 0u64;
        // Whether the run has other variants than the primary one: the run's summary and
        // verdict are over its with-skill attempts (as the CLI's), the rest is only compared
        // against.
        let mut variants = false;
        let mut trigger_queries = false;
        // A run its budget stopped did not run every case: the cases the stop wrote off
        // carry its sentence.
        let budget_stop = match run.stop_reason {
            Some(StopReason::Budget) => run.stop_detail.as_deref(),
            _ => None,
        };
        for_each_result(&self.store, run_id, |r| {
            variants |= !r.variant.is_primary();
            trigger_queries |= is_trigger_result(&r);
            if r.variant.configuration != Configuration::WithSkill {
                return;
            }
            if budget_stop.is_some()
                && r.status == CaseStatus::Skipped
                && r.details.get("skipped").and_then(Value::as_str) == budget_stop
            {
                not_run += 1;
            }
            summarizer.add(&r);
        })
        .await?;
        let mut summary = summarizer.finish(&settings);
        if let Some(reason) = budget_stop {
            // It must not pass, whatever the cases it did run scored.
            mark_stopped(&mut summary, reason, not_run);
        }
        // The regression gate judges what the run measured: not a run its budget cut short,
        // nor a cancelled one.
        let gate = match (&run.gate, budget_stop, run.status) {
            (Some(config), None, status) if status != RunStatus::Cancelled => {
                let config: GateConfig =
                    serde_json::from_value(config.clone()).context("stored gate")?;
                let report = regression_gate(&self.store, &run, config).await?;
                if report.verdict == Verdict::Fail {
                    summary.verdict = Verdict::Fail;
                    summary.verdict_reasons.insert(0, report.reason());
                }
                Some(report)
            }
            _ => None,
        };
        let collision_gate = match collision_gate {
            Some(state) if run.status != RunStatus::Cancelled => {
                let record = collision_gate_record(state)?;
                if let Some(reason) = &record.reason {
                    summary.verdict = Verdict::Fail;
                    summary.verdict_reasons.insert(0, reason.clone());
                }
                Some(record.json)
            }
            _ => None,
        };
        let mut summary_json = serde_json::to_value(&summary).context("serialising the summary")?;
        if variants {
            // A baseline, repeats or trigger evals: skill-creator's benchmark.json and the
            // trigger report of the run, from every attempt, through the code `skilleval run`
            // reports with.
            let results = load_results(&self.store, run_id).await?;
            let triggers = if trigger_queries {
                self.planner.plan_of(run_id).await?.triggers().cloned()
            } else {
                None
            };
            let extras = variant_extras(&results, &run, triggers.as_ref());
            if let Value::Object(map) = &mut summary_json {
                if let Some(benchmark) = extras.benchmark {
                    map.insert("benchmark".into(), benchmark);
                }
                if let Some(triggers) = extras.triggers {
                    map.insert("triggers".into(), triggers);
                }
            }
        }
        if let (Some(record), Value::Object(map)) = (collision_gate, &mut summary_json) {
            map.insert("collision_gate".into(), record);
        }
        if let (Some(report), Value::Object(map)) = (gate, &mut summary_json) {
            map.insert(
                "regression_gate".into(),
                serde_json::to_value(report).context("serialising the gate")?,
            );
        }
        let mut tx = self
            .store
            .pool()
            .begin()
            .await
            .context("starting the finalisation transaction")?;
        let finalised = match self
            .store
            .finalise(&mut tx, run_id, &summary_json, summary.verdict.as_str())
            .await
        {
            Ok(finalised) => finalised,
            // Another replica won the race (or the run changed meanwhile): not ours to announce.
            Err(TransitionError::Illegal { .. } | TransitionError::NotFound(_)) => {
                return Ok(false)
            }
            Err(e) => return Err(e.into()),
        };
        // The webhook is enqueued with the finalisation: both commit, or neither.
        let mut delivery = None;
        // A samples run is a tally of its batch: nobody waits on it.
        if let (true, Some(url)) = (announce, run.callback_url.as_deref()) {
            let view = self
                .store
                .get_run_in(&mut tx, run_id)
                .await?
                .map(|r| RunView::from_row(&r))
                .with_context(|| format!("run {run_id} vanished while finalising"))?;
            let body = serde_json::to_vec(&json!({ "event": RUN_FINISHED, "run": view }))
                .context("webhook body")?;
            // Sent later, by whichever coordinator claims it, as a child of this span.
            let traceparent = skilleval_infra::telemetry::current_traceparent();
            let webhook = NewWebhook {
                event: RUN_FINISHED,
                url,
                body: &body,
                run_id: Some(run_id),
                traceparent: traceparent.as_deref(),
            };
            delivery = Some(self.store.enqueue_webhook(&mut tx, &webhook).await?);
        }
        tx.commit().await.context("committing the finalisation")?;
        self.planner.forget(run_id);
        let outcome = if finalised.status == RunStatus::Cancelled {
            "cancelled"
        } else {
            summary.verdict.as_str()
        };
        Metrics::count(&self.metrics.runs_finalised, outcome);
        tracing::Span::current().record("skilleval.verdict", outcome);
        tracing::info!(
            verdict = summary.verdict.as_str(),
            pass_rate = summary.pass_rate,
            delivery_id = delivery.map(|d| d.to_string()),
            "run finalised"
        );
        if let (Some(id), Some(outbox)) = (delivery, &self.webhooks) {
            outbox.nudge(vec![id]);
        }
        Ok(true)
    }
}

/// A decided `no_collision` gate as the run's summary records it (`summary.collision_gate`),
/// and the reason it fails the run, if it does.
struct CollisionGateRecord {
    json: Value,
    reason: Option<String>,
}

/// The gate's verdict from a recorded eval: the stored `CollisionGate` when the eval
/// completed; when it failed (the providers failed every attempt), the gate is undecided and
/// the run fails with the eval's error, which says it is a configuration problem or a host
/// fault, not the skill's collision.
fn collision_gate_record(state: GateState) -> anyhow::Result<CollisionGateRecord> {
    match (state.status, state.gate) {
        (CollisionStatus::Completed, Some(gate)) => {
            let decided: CollisionGate =
                serde_json::from_value(gate.clone()).context("stored collision gate")?;
            Ok(CollisionGateRecord {
                reason: decided.reason(),
                json: gate,
            })
        }
        (status, _) => {
            let error = state
                .error
                .unwrap_or_else(|| format!("the collision eval is {status:?} without a gate"));
            Ok(CollisionGateRecord {
                reason: Some(format!(
                    "gate no_collision could not be decided: the collision eval failed: {error}"
                )),
                json: json!({ "passed": Value::Null, "error": error }),
            })
        }
    }
}

/// What a run's baseline and repeats add to its report (nothing for a run of primary
/// attempts only): the sections and skill-creator's `benchmark.json`, built by the code
/// `skilleval run` reports with. Its notes name the cases whose runner could not leave the
/// skill out (their baseline attempts are recorded `skipped`).
pub fn variant_extras(
    results: &[JobResult],
    run: &RunRow,
    triggers: Option<&TriggerPlan>,
) -> ReportExtras {
    let mut out = ReportExtras::default();
    let skill = SkillCard::new(&run.skill, &run.description);
    let trigger_report = triggers.and_then(|plan| trigger_report(&skill, plan, results));
    if let Some(report) = &trigger_report {
        out.markdown = triggers::markdown(report);
        out.triggers = serde_json::to_value(report).ok();
    }
    let cases: Vec<JobResult> = results
        .iter()
        .filter(|r| !is_trigger_result(r))
        .cloned()
        .collect();
    if cases.iter().all(|r| r.variant.is_primary()) {
        return out;
    }
    let results = &cases;
    let repeats = results
        .iter()
        .map(|r| r.variant.run_number)
        .max()
        .unwrap_or(1);
    let extras = Extras::build(results, repeats);
    let no_baseline = results
        .iter()
        .filter(|r| {
            r.variant.configuration == Configuration::WithoutSkill
                && r.variant.run_number == 1
                && r.status == CaseStatus::Skipped
                && r.details
                    .get("skipped")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.starts_with(NO_BASELINE))
        })
        .count();
    let notes: Vec<String> = (no_baseline > 0)
        .then(|| {
            format!(
                "{no_baseline} case(s) have no baseline: their runner cannot leave the skill out"
            )
        })
        .into_iter()
        .collect();
    // Baseline and repeats first, then the trigger evals, as `skilleval run` orders them.
    out.markdown = extras.markdown() + &out.markdown;
    let meta = BenchmarkMetadata::of(
        &run.skill,
        &skilleval_reports::skill_creator::service_skill_path(&run.skill, &run.version),
        &run.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        results,
    );
    out.benchmark = Some(extras.benchmark_json(&meta, &notes));
    out
}
