//! Before a run: what it would cost and what it could detect. `skilleval plan ./skill` and
//! the service's `POST /v1/runs?dry_run=true` both count the planned jobs' model calls with
//! [`CallCounts`], price them from the skill's last run ([`Measured`]: tokens and cost per
//! attempt as measured), and give the minimum detectable drop in pass rate at 80 % power from
//! that run's pass rate ([`forecast`], with [`crate::stats::power_advice`]'s advice).

use serde::Serialize;

use crate::stats::{power_advice, Design, PowerAdvice, StatsError};
use skilleval_execution::plan::Job;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_grading::StrategyRegistry;

/// The drop the advice aims at (five points of pass rate).
pub const TARGET_DROP: f64 = 0.05;
/// The pass rate assumed when the skill has no run yet (or its last passed nothing).
pub const ASSUMED_PASS_RATE: f64 = 0.8;

/// What the skill's last run measured, per attempt that ran.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Which run, in words ("the last local run <id>", "run <id> of version 3").
    pub source: String,
    pub pass_rate: f64,
    pub attempts: u64,
    pub tokens: u64,
    pub cost_usd: f64,
}

impl Measured {
    /// From a run's results (skipped and queued cases left out); `None` when nothing ran.
    pub fn from_results(source: String, results: &[JobResult]) -> Option<Measured> {
        let ran: Vec<&JobResult> = results
            .iter()
            .filter(|r| !matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued))
            .collect();
        if ran.is_empty() {
            return None;
        }
        let passed = ran
            .iter()
            .filter(|r| r.status == CaseStatus::Passed)
            .count();
        let (tokens, cost_usd) = ran.iter().fold((0u64, 0.0f64), |(t, c), r| {
            let u = [&r.produce_usage, &r.grade_usage];
            (
                t + u
                    .iter()
                    .map(|u| u.input_tokens + u.output_tokens)
                    .sum::<u64>(),
                c + u.iter().map(|u| u.cost_usd).sum::<f64>(),
            )
        });
        Some(Measured {
            source,
            pass_rate: passed as f64 / ran.len() as f64,
            attempts: ran.len() as u64,
            tokens,
            cost_usd,
        })
    }
}

/// The planned jobs' model calls, counted as jobs are handed over (a large definition is
/// planned in chunks).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallCounts {
    pub cases: u64,
    /// Cases an `llm` runner produces.
    pub llm_runner: u64,
    /// Cases a model-backed strategy grades.
    pub judged: u64,
    /// `llm` cases a judge grades (their baseline attempts are judged too).
    pub judged_llm: u64,
}

impl CallCounts {
    pub fn add(&mut self, jobs: &[Job], registry: &StrategyRegistry) {
        for j in jobs {
            let strategy = j.case.strategy_name(j.profile);
            let judged = registry.missing_provider(strategy, &j.case).is_some();
            let llm = skilleval_execution::variant::has_baseline(&j.runner.kind);
            self.cases += 1;
            self.llm_runner += u64::from(llm);
            self.judged += u64::from(judged);
            self.judged_llm += u64::from(llm && judged);
        }
    }
}

/// How the run would be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub repeats: u32,
    /// Each `llm` case also run without the skill.
    pub baseline: bool,
    /// Trigger queries and runs per query (0 runs: no trigger evals).
    pub trigger_queries: u64,
    pub trigger_runs: u32,
}

/// Model calls by purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModelCalls {
    pub producing: u64,
    pub judging: u64,
    pub triggers: u64,
    pub total: u64,
}

/// What a run would cost and could detect.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    pub cases: u64,
    pub repeats: u32,
    pub baseline: bool,
    /// Baseline cases (the `llm` ones) when `baseline`.
    pub baseline_cases: u64,
    pub attempts: u64,
    pub model_calls: ModelCalls,
    /// Measured tokens and cost per attempt × attempts; `None` without a measured run.
    pub estimated_tokens: Option<u64>,
    pub estimated_cost_usd: Option<f64>,
    pub baseline_pass_rate: f64,
    pub pass_rate_source: String,
    pub mde_pass_rate: f64,
    pub mde_reachable: bool,
    pub advice: String,
    pub power: PowerAdvice,
}

/// The forecast of a run of `counts` jobs made as `shape` says, priced and powered from
/// `last` (the skill's last run) where there is one.
pub fn forecast(
    counts: &CallCounts,
    shape: Shape,
    last: Option<&Measured>,
) -> Result<Forecast, StatsError> {
    let repeats = u64::from(shape.repeats);
    let (baseline_cases, judged_baseline) = if shape.baseline {
        (counts.llm_runner, counts.judged_llm)
    } else {
        (0, 0)
    };
    let attempts = (counts.cases + baseline_cases) * repeats;
    let producing = (counts.llm_runner + baseline_cases) * repeats;
    let judging = (counts.judged + judged_baseline) * repeats;
    let triggers = shape.trigger_queries * u64::from(shape.trigger_runs);
    let (pass_rate, source) = match last {
        Some(m) if m.pass_rate > 0.0 => (m.pass_rate, m.source.clone()),
        Some(m) => (
            ASSUMED_PASS_RATE,
            format!(
                "assumed: {} passed nothing, there is no drop to detect",
                m.source
            ),
        ),
        None => (
            ASSUMED_PASS_RATE,
            "assumed: no earlier run has measured it".to_string(),
        ),
    };
    let per_attempt = |m: &Measured, v: f64| v / m.attempts as f64 * attempts as f64;
    let design = Design::paired(counts.cases, shape.repeats, pass_rate);
    let power = power_advice(&design, TARGET_DROP)?;
    Ok(Forecast {
        cases: counts.cases,
        repeats: shape.repeats,
        baseline: shape.baseline,
        baseline_cases,
        attempts,
        model_calls: ModelCalls {
            producing,
            judging,
            triggers,
            total: producing + judging + triggers,
        },
        estimated_tokens: last.map(|m| per_attempt(m, m.tokens as f64).round() as u64),
        estimated_cost_usd: last.map(|m| per_attempt(m, m.cost_usd)),
        baseline_pass_rate: pass_rate,
        pass_rate_source: source,
        mde_pass_rate: power.mde.drop,
        mde_reachable: power.mde.reachable,
        advice: power.text.clone(),
        power,
    })
}
