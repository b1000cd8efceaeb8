//! Baselines and repeats: the arithmetic, and skill-creator's `benchmark.json`.
//!
//! - A **baseline** runs every case twice: `with_skill` (SKILL.md loaded) and `without_skill`
//!   (the bare model). [`run_summary`] gives, per configuration, the mean / standard deviation /
//!   min / max of each run's pass rate, time, tokens and score, and the **uplift**: with minus
//!   without (skill-creator writes the deltas as signed strings: `"+0.50"`).
//! - **Repeats** run each case `n` times. [`repeat_stats`] gives per case the passes `c`, the
//!   unbiased pass@k estimate `1 - C(n-c, k) / C(n, k)` ([`pass_at_k`]) and the spread of the
//!   scores; a case that both passed and failed is flagged flaky.
//!
//! A "run" here is one (case, configuration, attempt); its pass rate is the share of its
//! expectations that passed (per assertion for `assertions`, per check/rule where a strategy has
//! them, else the case itself), as in skill-creator's `grading.json` summary.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::expectations::{expectations, Expectation};
use crate::summary::ratio;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::variant::Configuration;

/// One run's numbers (skill-creator's `runs[].result`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub pass_rate: f64,
    pub passed: u64,
    pub failed: u64,
    pub total: u64,
    pub time_seconds: f64,
    /// Tokens spent producing the output (what using the skill costs).
    pub tokens: u64,
    /// Tool calls the run made (an agent's, or a transcript's); 0 when it made none.
    #[serde(default)]
    pub tool_calls: u64,
    /// 1 when the case errored.
    pub errors: u64,
    /// The strategy's score; `None` when the case errored.
    #[serde(default)]
    pub score: Option<f64>,
    /// The case passed.
    pub case_passed: bool,
    /// Producing and grading, in USD.
    pub cost_usd: f64,
    /// A with-skill `agent` run whose agent never opened the skill's `SKILL.md`: whatever it
    /// scored is not the skill's doing, so it is flagged rather than credited as uplift.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skill_unused: bool,
}

/// One (case, configuration, attempt) (skill-creator's `runs[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchmarkRun {
    /// skill-creator's integer id of the case ([`EvalNumbering`]).
    pub eval_id: Value,
    pub eval_name: String,
    /// The case's own id (what `eval_id` numbers).
    #[serde(default)]
    pub case_id: String,
    pub configuration: Configuration,
    pub run_number: u32,
    pub result: RunResult,
    pub expectations: Vec<Expectation>,
    /// What a reader of the run should know: retries, an error, a cut output, an agent that
    /// never opened the skill ([`run_notes`]).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// How a run's cases get skill-creator's integer ids: their own when every case id of the run
/// is a whole number (skill-creator's evals, converted), else their 1-based position in the
/// definition, for every case alike (one rule per run, so ids never collide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalNumbering {
    all_numeric: bool,
}

impl EvalNumbering {
    /// The numbering of a run whose case ids are `ids`.
    pub fn of<'a>(ids: impl IntoIterator<Item = &'a str>) -> Self {
        EvalNumbering {
            all_numeric: ids.into_iter().all(|id| id.parse::<u64>().is_ok()),
        }
    }

    /// The eval id of the case `case_id` at `case_index`.
    pub fn eval_id(self, case_id: &str, case_index: u32) -> u64 {
        match case_id.parse::<u64>() {
            Ok(n) if self.all_numeric => n,
            _ => u64::from(case_index) + 1,
        }
    }

    /// Whether the eval id is the case id itself.
    pub fn is_case_id(self) -> bool {
        self.all_numeric
    }
}

/// Tool calls a result's runner made, by tool name (an agent's transcript, or the tool calls a
/// `given` sample or a transcript carried).
pub fn tool_call_counts(r: &JobResult) -> BTreeMap<String, u64> {
    let calls = r
        .details
        .pointer("/runner/transcript/tool_calls")
        .or_else(|| r.details.pointer("/runner/tool_calls"))
        .or_else(|| r.details.get("tool_calls"))
        .and_then(Value::as_array);
    let mut counts = BTreeMap::new();
    for c in calls.into_iter().flatten() {
        let name = c
            .get("name")
            .or_else(|| c.get("tool"))
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        *counts.entry(name.to_string()).or_insert(0) += 1;
    }
    counts
}

/// What a reader of one attempt should know, one sentence each (skill-creator's per-run
/// `notes`): retries, an error and its reason, an output cut at the size limit, an agent run
/// that hit its limit or never opened the skill.
pub fn run_notes(r: &JobResult) -> Vec<String> {
    let mut notes = Vec::new();
    if r.attempts.len() > 1 {
        notes.push(format!(
            "{} after {} attempts",
            r.status.as_str(),
            r.attempts.len()
        ));
    }
    if let Some(e) = &r.error {
        notes.push(format!("errored: {e}"));
    }
    if r.output_truncated {
        notes.push("the output was cut at the stored size limit".to_string());
    }
    if let Some(limit) = r
        .details
        .pointer("/runner/limit_hit")
        .and_then(Value::as_str)
    {
        notes.push(format!("the agent stopped at its limit: {limit}"));
    }
    if r.variant.configuration == Configuration::WithSkill
        && r.details
            .pointer("/runner/skill_used")
            .and_then(Value::as_bool)
            == Some(false)
    {
        notes.push("the agent never opened the skill's SKILL.md".to_string());
    }
    notes
}

/// The run of one result. Skipped cases have none. Its `eval_id` is the case id as a number
/// when it is one; [`Extras::build`] numbers a whole run ([`EvalNumbering`]).
pub fn benchmark_run(
    configuration: Configuration,
    run_number: u32,
    r: &JobResult,
) -> Option<BenchmarkRun> {
    if matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued)
        || configuration == Configuration::Trigger
    {
        return None;
    }
    let exps = expectations(r);
    let passed = exps.iter().filter(|e| e.passed).count() as u64;
    let total = exps.len() as u64;
    let mut cost = r.produce_usage;
    cost.add(&r.grade_usage);
    Some(BenchmarkRun {
        eval_id: r
            .test_case_id
            .parse::<u64>()
            .map_or_else(|_| json!(r.test_case_id), |n| json!(n)),
        eval_name: r.name.clone(),
        case_id: r.test_case_id.clone(),
        configuration,
        run_number,
        result: RunResult {
            pass_rate: ratio(passed, total),
            passed,
            failed: total - passed,
            total,
            time_seconds: r.duration_ms as f64 / 1000.0,
            tokens: r.produce_usage.total_tokens(),
            tool_calls: tool_call_counts(r).values().sum(),
            errors: u64::from(r.status == CaseStatus::Errored),
            score: r.score,
            case_passed: r.status == CaseStatus::Passed,
            cost_usd: cost.cost_usd,
            skill_unused: configuration == Configuration::WithSkill
                && r.details
                    .pointer("/runner/skill_used")
                    .and_then(Value::as_bool)
                    == Some(false),
        },
        expectations: exps,
        notes: run_notes(r),
    })
}

/// The runs of `results` (skipped ones have none), numbered as one run ([`EvalNumbering`]).
pub fn benchmark_runs(results: &[JobResult]) -> Vec<BenchmarkRun> {
    let numbering = EvalNumbering::of(results.iter().map(|r| r.test_case_id.as_str()));
    results
        .iter()
        .filter_map(|r| {
            let mut run = benchmark_run(r.variant.configuration, r.variant.run_number, r)?;
            run.eval_id = json!(numbering.eval_id(&r.test_case_id, r.case_index));
            Some(run)
        })
        .collect()
}

/// Mean, sample standard deviation (n − 1; 0 for a single value), min and max.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
}

pub fn stat(values: &[f64]) -> Stat {
    if values.is_empty() {
        return Stat::default();
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let stddev = if values.len() > 1 {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Stat {
        mean,
        stddev,
        min,
        max,
    }
}

/// One configuration across its runs (skill-creator's `run_summary.with_skill`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigSummary {
    pub pass_rate: Stat,
    pub time_seconds: Stat,
    pub tokens: Stat,
    /// Over the runs that were graded (errored ones have no score).
    pub score: Stat,
    /// Share of runs whose case passed.
    pub case_pass_rate: f64,
    pub runs: u64,
    pub errors: u64,
    pub cost_usd: f64,
    /// Runs flagged [`RunResult::skill_unused`].
    #[serde(default)]
    pub skill_unused: u64,
}

/// With minus without.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Uplift {
    pub pass_rate: f64,
    pub time_seconds: f64,
    pub tokens: f64,
    pub score: f64,
    pub case_pass_rate: f64,
}

/// Per configuration, and the uplift when both ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineSummary {
    pub with_skill: Option<ConfigSummary>,
    pub without_skill: Option<ConfigSummary>,
    pub delta: Option<Uplift>,
}

fn summarise(runs: &[&BenchmarkRun]) -> Option<ConfigSummary> {
    if runs.is_empty() {
        return None;
    }
    let col =
        |f: &dyn Fn(&RunResult) -> f64| runs.iter().map(|r| f(&r.result)).collect::<Vec<f64>>();
    let scores: Vec<f64> = runs.iter().filter_map(|r| r.result.score).collect();
    Some(ConfigSummary {
        pass_rate: stat(&col(&|r| r.pass_rate)),
        time_seconds: stat(&col(&|r| r.time_seconds)),
        tokens: stat(&col(&|r| r.tokens as f64)),
        score: stat(&scores),
        case_pass_rate: ratio(
            runs.iter().filter(|r| r.result.case_passed).count() as u64,
            runs.len() as u64,
        ),
        runs: runs.len() as u64,
        errors: runs.iter().map(|r| r.result.errors).sum(),
        cost_usd: runs.iter().map(|r| r.result.cost_usd).sum(),
        skill_unused: runs.iter().filter(|r| r.result.skill_unused).count() as u64,
    })
}

/// Summaries per configuration and the uplift.
pub fn run_summary(runs: &[BenchmarkRun]) -> BaselineSummary {
    let of = |c: Configuration| {
        runs.iter()
            .filter(|r| r.configuration == c)
            .collect::<Vec<_>>()
    };
    let with_skill = summarise(&of(Configuration::WithSkill));
    let without_skill = summarise(&of(Configuration::WithoutSkill));
    let delta = match (&with_skill, &without_skill) {
        (Some(w), Some(wo)) => Some(Uplift {
            pass_rate: w.pass_rate.mean - wo.pass_rate.mean,
            time_seconds: w.time_seconds.mean - wo.time_seconds.mean,
            tokens: w.tokens.mean - wo.tokens.mean,
            score: w.score.mean - wo.score.mean,
            case_pass_rate: w.case_pass_rate - wo.case_pass_rate,
        }),
        _ => None,
    };
    BaselineSummary {
        with_skill,
        without_skill,
        delta,
    }
}

/// The estimators live with the other proportion statistics (checked there against known
/// values); a benchmark reports them per case.
pub use crate::stats::{pass_at_k, pass_hat_k};

/// The k values reported for `n` attempts: 1, 3, 5, 10 up to `n`, and `n`.
pub fn reported_ks(n: u64) -> Vec<u64> {
    let mut ks: Vec<u64> = [1, 3, 5, 10].into_iter().filter(|k| *k <= n).collect();
    if n > 0 && !ks.contains(&n) {
        ks.push(n);
    }
    ks
}

/// One case over its repeats.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRepeats {
    pub test_case_id: String,
    /// Attempts that ran (skipped ones excluded).
    pub n: u64,
    /// Attempts that passed.
    pub c: u64,
    pub errored: u64,
    /// `"pass@1"`, `"pass@3"`, ... -> estimate.
    pub pass_at: BTreeMap<String, f64>,
    /// `"pass^1"`, `"pass^3"`, ... -> estimate of every one of k attempts passing.
    #[serde(default)]
    pub pass_all: BTreeMap<String, f64>,
    /// Spread of the graded attempts' scores.
    pub score: Stat,
    /// Passed in some attempts and not in others.
    pub flaky: bool,
}

/// Repeats of every case, and the means over cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RepeatsSummary {
    pub repeats: u32,
    pub cases: Vec<CaseRepeats>,
    /// Mean over cases of each pass@k (cases with fewer attempts than k are left out).
    pub mean_pass_at: BTreeMap<String, f64>,
    /// Mean over cases of each pass^k, likewise.
    #[serde(default)]
    pub mean_pass_all: BTreeMap<String, f64>,
    pub flaky_cases: Vec<String>,
}

/// Per case pass@k and spread, from every attempt's result (grouped by case; skipped ones
/// left out).
pub fn repeat_stats(repeats: u32, attempts: &[&JobResult]) -> RepeatsSummary {
    let mut by_case: BTreeMap<(u32, String), Vec<&JobResult>> = BTreeMap::new();
    for r in attempts {
        if matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued) {
            continue;
        }
        by_case
            .entry((r.case_index, r.test_case_id.clone()))
            .or_default()
            .push(r);
    }
    let mut cases = Vec::with_capacity(by_case.len());
    let mut sums: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    let mut sums_all: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for ((_, id), rs) in by_case {
        let n = rs.len() as u64;
        let c = rs.iter().filter(|r| r.status == CaseStatus::Passed).count() as u64;
        let mut pass_at = BTreeMap::new();
        let mut pass_all = BTreeMap::new();
        for k in reported_ks(n) {
            if let Some(p) = pass_at_k(n, c, k) {
                pass_at.insert(format!("pass@{k}"), p);
                let e = sums.entry(k).or_default();
                e.0 += p;
                e.1 += 1;
            }
            if let Some(p) = pass_hat_k(n, c, k) {
                pass_all.insert(format!("pass^{k}"), p);
                let e = sums_all.entry(k).or_default();
                e.0 += p;
                e.1 += 1;
            }
        }
        let scores: Vec<f64> = rs.iter().filter_map(|r| r.score).collect();
        cases.push(CaseRepeats {
            test_case_id: id,
            n,
            c,
            errored: rs
                .iter()
                .filter(|r| r.status == CaseStatus::Errored)
                .count() as u64,
            pass_at,
            pass_all,
            score: stat(&scores),
            flaky: c > 0 && c < n,
        });
    }
    RepeatsSummary {
        repeats,
        flaky_cases: cases
            .iter()
            .filter(|c| c.flaky)
            .map(|c| c.test_case_id.clone())
            .collect(),
        mean_pass_at: sums
            .into_iter()
            .map(|(k, (sum, count))| (format!("pass@{k}"), sum / count as f64))
            .collect(),
        mean_pass_all: sums_all
            .into_iter()
            .map(|(k, (sum, count))| (format!("pass^{k}"), sum / count as f64))
            .collect(),
        cases,
    }
}

fn signed(v: f64, decimals: usize) -> String {
    let v = if v.abs() < 0.5 * 10f64.powi(-(decimals as i32)) {
        0.0
    } else {
        v
    };
    format!("{v:+.decimals$}")
}

/// Who and what a benchmark is about (skill-creator's `metadata`, less what the runs give).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchmarkMetadata {
    pub skill_name: String,
    /// Where the skill is: its folder for a local run, `skilleval:<name>@<version>` for a run
    /// of the service.
    pub skill_path: String,
    /// The model(s) that produced the outputs, or a sentence saying none did.
    pub executor_model: String,
    /// The model(s) that judged the expectations, or a sentence saying none did (skilleval
    /// writes the analyst's notes itself).
    pub analyzer_model: String,
    /// RFC 3339.
    pub timestamp: String,
}

/// What produced no output with a model writes as its model.
pub const NO_EXECUTOR_MODEL: &str = "none: no model produced the outputs (script or given outputs)";
/// What judged nothing with a model writes as its analyzer.
pub const NO_ANALYZER_MODEL: &str = "none: no model judged the expectations";

impl BenchmarkMetadata {
    /// The metadata of a run of `skill_name` at `skill_path`, its models read from its
    /// results: the runner's model (`details.runner.model`) and the judge's
    /// (`details.judge.model`, or an embedding strategy's `details.model`).
    pub fn of(skill_name: &str, skill_path: &str, timestamp: &str, results: &[JobResult]) -> Self {
        let models = |pointers: &[&str]| {
            let mut names: Vec<&str> = results
                .iter()
                .filter_map(|r| {
                    pointers
                        .iter()
                        .find_map(|p| r.details.pointer(p).and_then(Value::as_str))
                })
                .filter(|m| !m.is_empty())
                .collect();
            names.sort_unstable();
            names.dedup();
            names.join(", ")
        };
        let executor = models(&["/runner/model"]);
        let analyzer = models(&["/judge/model", "/model"]);
        BenchmarkMetadata {
            skill_name: skill_name.to_string(),
            skill_path: skill_path.to_string(),
            executor_model: if executor.is_empty() {
                NO_EXECUTOR_MODEL.to_string()
            } else {
                executor
            },
            analyzer_model: if analyzer.is_empty() {
                NO_ANALYZER_MODEL.to_string()
            } else {
                analyzer
            },
            timestamp: timestamp.to_string(),
        }
    }
}

/// skill-creator's `benchmark.json` for one run: `metadata`, `runs`, `run_summary` (deltas as
/// signed strings, as its viewer shows them) and, with repeats, `repeats`.
pub fn benchmark_json(
    meta: &BenchmarkMetadata,
    runs: &[BenchmarkRun],
    summary: &BaselineSummary,
    repeats: Option<&RepeatsSummary>,
    notes: &[String],
) -> Value {
    let mut ids: Vec<Value> = Vec::new();
    for r in runs {
        if !ids.contains(&r.eval_id) {
            ids.push(r.eval_id.clone());
        }
    }
    let per_config = runs.iter().map(|r| r.run_number).max().unwrap_or(0);
    let mut run_summary = serde_json::Map::new();
    if let Some(w) = &summary.with_skill {
        run_summary.insert("with_skill".into(), json!(w));
    }
    if let Some(wo) = &summary.without_skill {
        run_summary.insert("without_skill".into(), json!(wo));
    }
    if let Some(d) = &summary.delta {
        run_summary.insert(
            "delta".into(),
            json!({
                "pass_rate": signed(d.pass_rate, 2),
                "time_seconds": signed(d.time_seconds, 1),
                "tokens": signed(d.tokens, 0),
                "score": signed(d.score, 3),
                "case_pass_rate": signed(d.case_pass_rate, 2),
            }),
        );
    }
    let mut doc = json!({
        "metadata": {
            "skill_name": meta.skill_name,
            "skill_path": meta.skill_path,
            "executor_model": meta.executor_model,
            "analyzer_model": meta.analyzer_model,
            "timestamp": meta.timestamp,
            "evals_run": ids,
            "runs_per_configuration": per_config,
        },
        "runs": runs,
        "run_summary": run_summary,
        "notes": notes,
    });
    if let Some(rep) = repeats {
        doc["repeats"] = json!(rep);
    }
    doc
}

/// One side (with or without the skill) of a case over its attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSide {
    /// Attempts that ran (skipped ones excluded).
    pub attempts: u64,
    /// Share of the attempts that passed.
    pub pass_rate: f64,
    /// Mean score of the graded attempts; `None` when every attempt errored.
    pub score: Option<f64>,
    /// Mean of each rubric criterion (normalised to [0, 1]) where the strategy has them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub criteria: BTreeMap<String, f64>,
}

/// A case's uplift: with minus without the skill, over its attempts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseUplift {
    pub test_case_id: String,
    pub with_skill: CaseSide,
    pub without_skill: CaseSide,
    pub pass_rate: f64,
    /// `None` when a side has no score.
    pub score: Option<f64>,
    /// Per criterion both sides have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub criteria: BTreeMap<String, f64>,
}

/// The uplift per case (cases that ran both with and without the skill, in case order) and
/// per criterion (the mean over those cases of each criterion's uplift).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpliftByCase {
    pub cases: Vec<CaseUplift>,
    pub criteria: BTreeMap<String, f64>,
}

fn case_side(attempts: &[&JobResult]) -> Option<CaseSide> {
    let outcomes: Vec<_> = attempts
        .iter()
        .filter_map(|r| crate::compare::AttemptOutcome::from_result(r))
        .collect();
    if outcomes.is_empty() {
        return None;
    }
    let n = outcomes.len() as u64;
    let scores: Vec<f64> = outcomes.iter().filter_map(|o| o.score).collect();
    let mut sums: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for o in &outcomes {
        for (name, v) in &o.criteria {
            let e = sums.entry(name.clone()).or_default();
            e.0 += v;
            e.1 += 1;
        }
    }
    Some(CaseSide {
        attempts: n,
        pass_rate: ratio(outcomes.iter().filter(|o| o.passed).count() as u64, n),
        score: (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64),
        criteria: sums
            .into_iter()
            .map(|(k, (sum, count))| (k, sum / count as f64))
            .collect(),
    })
}

/// Per case and per criterion uplift from every attempt's result.
pub fn uplift_by_case(results: &[JobResult]) -> UpliftByCase {
    type Sides<'a> = (Vec<&'a JobResult>, Vec<&'a JobResult>);
    let mut by_case: BTreeMap<(u32, &str), Sides<'_>> = BTreeMap::new();
    for r in results {
        let e = by_case
            .entry((r.case_index, r.test_case_id.as_str()))
            .or_default();
        match r.variant.configuration {
            Configuration::WithSkill => e.0.push(r),
            Configuration::WithoutSkill => e.1.push(r),
            Configuration::Trigger => {}
        }
    }
    let mut cases = Vec::new();
    let mut sums: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    for ((_, id), (with, without)) in by_case {
        let (Some(w), Some(wo)) = (case_side(&with), case_side(&without)) else {
            continue;
        };
        let criteria: BTreeMap<String, f64> = w
            .criteria
            .iter()
            .filter_map(|(name, a)| wo.criteria.get(name).map(|b| (name.clone(), a - b)))
            .collect();
        for (name, d) in &criteria {
            let e = sums.entry(name.clone()).or_default();
            e.0 += d;
            e.1 += 1;
        }
        cases.push(CaseUplift {
            test_case_id: id.to_string(),
            pass_rate: w.pass_rate - wo.pass_rate,
            score: w.score.zip(wo.score).map(|(a, b)| a - b),
            criteria,
            with_skill: w,
            without_skill: wo,
        });
    }
    UpliftByCase {
        cases,
        criteria: sums
            .into_iter()
            .map(|(k, (sum, count))| (k, sum / count as f64))
            .collect(),
    }
}

/// What a baseline and repeats add to a run's outputs, built from every attempt's result
/// (each labelled by its [`Variant`](skilleval_execution::variant::Variant)). The CLI and the service both report through this.
#[derive(Debug, Clone, PartialEq)]
pub struct Extras {
    pub runs: Vec<BenchmarkRun>,
    pub summary: BaselineSummary,
    pub repeats: Option<RepeatsSummary>,
    /// With a baseline: the uplift per case and per criterion.
    pub uplift: Option<UpliftByCase>,
}

impl Extras {
    /// From every attempt (with and without the skill); `repeats` is the attempts per case the
    /// run asked for.
    pub fn build(results: &[JobResult], repeats: u32) -> Extras {
        let runs = benchmark_runs(results);
        let summary = run_summary(&runs);
        let repeats = (repeats > 1).then(|| {
            let with: Vec<&JobResult> = results
                .iter()
                .filter(|r| r.variant.configuration == Configuration::WithSkill)
                .collect();
            repeat_stats(repeats, &with)
        });
        let uplift = results
            .iter()
            .any(|r| r.variant.configuration == Configuration::WithoutSkill)
            .then(|| uplift_by_case(results));
        Extras {
            runs,
            summary,
            repeats,
            uplift,
        }
    }

    /// The report's sections (Markdown).
    pub fn markdown(&self) -> String {
        let mut out = markdown(&self.summary, self.repeats.as_ref());
        if let Some(uplift) = &self.uplift {
            out.push_str(&uplift_markdown(uplift));
        }
        out
    }

    /// skill-creator's `benchmark.json` of the run, with `uplift` (per case and criterion)
    /// where a baseline ran.
    pub fn benchmark_json(&self, meta: &BenchmarkMetadata, notes: &[String]) -> Value {
        let mut doc = benchmark_json(
            meta,
            &self.runs,
            &self.summary,
            self.repeats.as_ref(),
            notes,
        );
        if let Some(uplift) = &self.uplift {
            doc["uplift"] = json!(uplift);
        }
        doc
    }
}

/// The run proper: the with-skill attempts (its summary and verdict are over them; the
/// without-skill ones are only compared against).
pub fn with_skill(results: &[JobResult]) -> Vec<JobResult> {
    results
        .iter()
        .filter(|r| r.variant.configuration == Configuration::WithSkill)
        .cloned()
        .collect()
}

/// The per-case and per-criterion uplift as Markdown tables.
fn uplift_markdown(uplift: &UpliftByCase) -> String {
    let mut out = String::new();
    if uplift.cases.is_empty() {
        return out;
    }
    let _ = writeln!(out, "### Uplift per case\n");
    let _ = writeln!(
        out,
        "| Case | Pass rate with | without | Delta | Score delta |\n|---|---|---|---|---|"
    );
    for c in &uplift.cases {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} pts | {} |",
            c.test_case_id,
            pct(c.with_skill.pass_rate),
            pct(c.without_skill.pass_rate),
            signed(c.pass_rate * 100.0, 1),
            c.score.map_or_else(|| "-".to_string(), |d| signed(d, 3)),
        );
    }
    if !uplift.criteria.is_empty() {
        let _ = writeln!(out, "\n### Uplift per criterion\n");
        let _ = writeln!(out, "| Criterion | Mean delta |\n|---|---|");
        for (name, d) in &uplift.criteria {
            let _ = writeln!(out, "| {name} | {} |", signed(*d, 3));
        }
    }
    out.push('\n');
    out
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// Report sections (Markdown) for a baseline and for repeats.
pub fn markdown(summary: &BaselineSummary, repeats: Option<&RepeatsSummary>) -> String {
    let mut out = String::new();
    if let (Some(w), Some(wo), Some(d)) =
        (&summary.with_skill, &summary.without_skill, &summary.delta)
    {
        let _ = writeln!(out, "## Baseline: with vs without the skill\n");
        let _ = writeln!(
            out,
            "| Metric | With skill | Without skill | Delta |\n|---|---|---|---|"
        );
        let _ = writeln!(
            out,
            "| Pass rate (expectations) | {} ± {} | {} ± {} | {} |",
            pct(w.pass_rate.mean),
            pct(w.pass_rate.stddev),
            pct(wo.pass_rate.mean),
            pct(wo.pass_rate.stddev),
            signed(d.pass_rate * 100.0, 1) + " pts"
        );
        let _ = writeln!(
            out,
            "| Cases passed | {} | {} | {} |",
            pct(w.case_pass_rate),
            pct(wo.case_pass_rate),
            signed(d.case_pass_rate * 100.0, 1) + " pts"
        );
        let _ = writeln!(
            out,
            "| Mean score | {:.3} | {:.3} | {} |",
            w.score.mean,
            wo.score.mean,
            signed(d.score, 3)
        );
        let _ = writeln!(
            out,
            "| Tokens (producing) | {:.0} | {:.0} | {} |",
            w.tokens.mean,
            wo.tokens.mean,
            signed(d.tokens, 0)
        );
        let _ = writeln!(
            out,
            "| Time (s) | {:.2} | {:.2} | {} |",
            w.time_seconds.mean,
            wo.time_seconds.mean,
            signed(d.time_seconds, 2)
        );
        let _ = writeln!(
            out,
            "| Runs (errors) | {} ({}) | {} ({}) | |",
            w.runs, w.errors, wo.runs, wo.errors
        );
        let verdict = if d.pass_rate > 0.0 {
            "the skill improves the pass rate"
        } else if d.pass_rate < 0.0 {
            "the skill LOWERS the pass rate"
        } else {
            "the skill does not change the pass rate"
        };
        let _ = writeln!(out, "\nUplift: {} ({verdict}).\n", signed(d.pass_rate, 2));
        if w.skill_unused > 0 {
            let _ = writeln!(
                out,
                "Warning: in {} of {} with-skill run(s) the agent never opened SKILL.md; their results are not the skill's doing.\n",
                w.skill_unused, w.runs
            );
        }
    }
    if let Some(rep) = repeats {
        let _ = writeln!(out, "## Repeats: {} attempts per case\n", rep.repeats);
        let ks: Vec<&String> = rep.mean_pass_at.keys().collect();
        let hats: Vec<&String> = rep.mean_pass_all.keys().collect();
        let _ = write!(out, "| Case | Passed | Score mean ± sd (min–max) |");
        for k in ks.iter().chain(&hats) {
            let _ = write!(out, " {k} |");
        }
        let _ = write!(out, "\n|---|---|---|");
        for _ in ks.iter().chain(&hats) {
            out.push_str("---|");
        }
        out.push('\n');
        for c in &rep.cases {
            let flag = if c.flaky { " (flaky)" } else { "" };
            let _ = write!(
                out,
                "| `{}`{flag} | {}/{} | {:.3} ± {:.3} ({:.3}–{:.3}) |",
                c.test_case_id, c.c, c.n, c.score.mean, c.score.stddev, c.score.min, c.score.max
            );
            let cells = ks
                .iter()
                .map(|k| c.pass_at.get(*k))
                .chain(hats.iter().map(|k| c.pass_all.get(*k)));
            for cell in cells {
                match cell {
                    Some(p) => {
                        let _ = write!(out, " {p:.3} |");
                    }
                    None => out.push_str(" – |"),
                }
            }
            out.push('\n');
        }
        let _ = write!(out, "| **mean** | | |");
        for k in &ks {
            let _ = write!(out, " **{:.3}** |", rep.mean_pass_at[*k]);
        }
        for k in &hats {
            let _ = write!(out, " **{:.3}** |", rep.mean_pass_all[*k]);
        }
        out.push_str("\n\n");
        if !rep.flaky_cases.is_empty() {
            let _ = writeln!(
                out,
                "Flaky (passed in some attempts, not all): {}.\n",
                rep.flaky_cases.join(", ")
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use skilleval_execution::result::test_result;
    use skilleval_execution::variant::Variant;
    use skilleval_model::grade::Usage;

    pub(crate) fn result(
        id: &str,
        index: u32,
        status: CaseStatus,
        score: Option<f64>,
        tokens: u64,
        ms: u64,
    ) -> JobResult {
        JobResult {
            name: format!("case {id}"),
            case_index: index,
            duration_ms: ms,
            produce_usage: Usage {
                input_tokens: tokens,
                output_tokens: 0,
                cost_usd: 0.0,
            },
            ..test_result(id, status, score)
        }
    }

    #[test]
    fn reported_ks_are_1_3_5_10_and_n() {
        assert_eq!(reported_ks(4), vec![1, 3, 4]);
        assert_eq!(reported_ks(1), vec![1]);
        assert_eq!(reported_ks(12), vec![1, 3, 5, 10, 12]);
        assert_eq!(reported_ks(0), Vec::<u64>::new());
    }

    #[test]
    fn uplift_is_with_minus_without() {
        let with = [
            result("1", 0, CaseStatus::Passed, Some(1.0), 300, 2_000),
            result("2", 1, CaseStatus::Passed, Some(0.9), 500, 4_000),
        ];
        let without = [
            result("1", 0, CaseStatus::Failed, Some(0.2), 100, 1_000),
            result("2", 1, CaseStatus::Passed, Some(0.8), 100, 1_000),
        ];
        let mut runs: Vec<BenchmarkRun> = with
            .iter()
            .filter_map(|r| benchmark_run(Configuration::WithSkill, 1, r))
            .collect();
        runs.extend(
            without
                .iter()
                .filter_map(|r| benchmark_run(Configuration::WithoutSkill, 1, r)),
        );
        let s = run_summary(&runs);
        let w = s.with_skill.as_ref().unwrap();
        let wo = s.without_skill.as_ref().unwrap();
        assert_eq!((w.pass_rate.mean, wo.pass_rate.mean), (1.0, 0.5));
        assert!(
            (wo.pass_rate.stddev - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-12,
            "sample stddev of [0, 1]"
        );
        let d = s.delta.unwrap();
        assert!((d.pass_rate - 0.5).abs() < 1e-12);
        assert!((d.score - 0.45).abs() < 1e-12);
        assert!((d.tokens - 300.0).abs() < 1e-12);
        assert!((d.time_seconds - 2.0).abs() < 1e-12);
        let meta = BenchmarkMetadata::of("s", "/skills/s", "t", &with);
        assert_eq!(meta.executor_model, NO_EXECUTOR_MODEL);
        let doc = benchmark_json(&meta, &runs, &s, None, &[]);
        assert_eq!(doc["metadata"]["skill_path"], "/skills/s");
        assert_eq!(doc["metadata"]["analyzer_model"], NO_ANALYZER_MODEL);
        assert_eq!(doc["run_summary"]["delta"]["pass_rate"], "+0.50");
        assert_eq!(doc["run_summary"]["delta"]["tokens"], "+300");
        assert_eq!(doc["runs"][0]["eval_id"], 1, "numeric ids stay numbers");
        assert_eq!(doc["runs"][2]["configuration"], "without_skill");
        assert_eq!(doc["runs"][0]["result"]["tokens"], 300);
        assert_eq!(doc["metadata"]["evals_run"], json!([1, 2]));
        let md = markdown(&s, None);
        assert!(
            md.contains("| Pass rate (expectations) | 100.0% ± 0.0% | 50.0% ± 70.7% | +50.0 pts |"),
            "{md}"
        );
    }

    #[test]
    fn repeats_give_pass_at_k_and_spread() {
        let attempts = [
            result("a", 0, CaseStatus::Passed, Some(1.0), 0, 1),
            result("a", 0, CaseStatus::Failed, Some(0.0), 0, 1),
            result("a", 0, CaseStatus::Passed, Some(1.0), 0, 1),
            result("b", 1, CaseStatus::Failed, Some(0.5), 0, 1),
            result("b", 1, CaseStatus::Errored, None, 0, 1),
            result("b", 1, CaseStatus::Failed, Some(0.3), 0, 1),
        ];
        let refs: Vec<&JobResult> = attempts.iter().collect();
        let s = repeat_stats(3, &refs);
        let a = &s.cases[0];
        assert_eq!((a.n, a.c, a.flaky), (3, 2, true));
        assert!((a.pass_at["pass@1"] - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(a.pass_at["pass@3"], 1.0);
        let b = &s.cases[1];
        assert_eq!((b.n, b.c, b.errored, b.flaky), (3, 0, 1, false));
        assert!((b.score.mean - 0.4).abs() < 1e-12);
        assert!((s.mean_pass_at["pass@1"] - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.flaky_cases, vec!["a"]);
        let md = markdown(&run_summary(&[]), Some(&s));
        assert!(md.contains("| `a` (flaky) | 2/3 |"), "{md}");
    }

    #[test]
    fn pass_hat_k_is_the_chance_that_all_k_attempts_pass() {
        // n = 5, c = 3: pass^1 = 3/5; pass^2 = C(3,2)/C(5,2) = 3/10; pass^3 = 1/10.
        assert!((pass_hat_k(5, 3, 1).unwrap() - 0.6).abs() < 1e-12);
        assert!((pass_hat_k(5, 3, 2).unwrap() - 0.3).abs() < 1e-12);
        assert!((pass_hat_k(5, 3, 3).unwrap() - 0.1).abs() < 1e-12);
        assert_eq!(pass_hat_k(5, 3, 4), Some(0.0), "fewer passes than k");
        assert_eq!(pass_hat_k(4, 4, 4), Some(1.0));
        assert_eq!(pass_hat_k(3, 1, 4), None);
        assert_eq!(pass_hat_k(3, 1, 0), None);
        let attempts = [
            result("a", 0, CaseStatus::Passed, Some(1.0), 0, 1),
            result("a", 0, CaseStatus::Failed, Some(0.0), 0, 1),
            result("a", 0, CaseStatus::Passed, Some(1.0), 0, 1),
        ];
        let refs: Vec<&JobResult> = attempts.iter().collect();
        let s = repeat_stats(3, &refs);
        assert_eq!(s.cases[0].pass_all["pass^3"], 0.0, "one attempt failed");
        assert!((s.mean_pass_all["pass^1"] - 2.0 / 3.0).abs() < 1e-12);
        let md = markdown(&run_summary(&[]), Some(&s));
        assert!(md.contains("pass^3"), "{md}");
    }

    fn variant(mut r: JobResult, configuration: Configuration, run_number: u32) -> JobResult {
        r.variant = Variant {
            configuration,
            run_number,
        };
        r
    }

    #[test]
    fn uplift_per_case_and_criterion_pairs_the_attempts_of_each_case() {
        use Configuration::{WithSkill as W, WithoutSkill as O};
        let rubric = |clarity: f64| json!({"clarity": {"score": 4, "normalized": clarity}});
        let mut a1 = variant(result("a", 0, CaseStatus::Passed, Some(0.9), 0, 1), W, 1);
        a1.rubric_scores = Some(rubric(0.9));
        let mut a2 = variant(result("a", 0, CaseStatus::Failed, Some(0.5), 0, 1), W, 2);
        a2.rubric_scores = Some(rubric(0.5));
        let mut a3 = variant(result("a", 0, CaseStatus::Failed, Some(0.2), 0, 1), O, 1);
        a3.rubric_scores = Some(rubric(0.2));
        let mut a4 = variant(result("a", 0, CaseStatus::Failed, Some(0.4), 0, 1), O, 2);
        a4.rubric_scores = Some(rubric(0.4));
        let results = vec![
            a1,
            a2,
            variant(result("b", 1, CaseStatus::Passed, Some(1.0), 0, 1), W, 1),
            variant(result("b", 1, CaseStatus::Passed, Some(1.0), 0, 1), W, 2),
            a3,
            a4,
            // b's baseline was not run (its runner cannot leave the skill out).
            variant(result("b", 1, CaseStatus::Skipped, None, 0, 1), O, 1),
        ];
        let u = uplift_by_case(&results);
        assert_eq!(u.cases.len(), 1, "b has no baseline attempt that ran");
        let a = &u.cases[0];
        assert_eq!(a.test_case_id, "a");
        assert!((a.pass_rate - 0.5).abs() < 1e-12, "1/2 with, 0/2 without");
        assert!((a.score.unwrap() - (0.7 - 0.3)).abs() < 1e-12);
        assert!((a.criteria["clarity"] - 0.4).abs() < 1e-12);
        assert!((u.criteria["clarity"] - 0.4).abs() < 1e-12);
        let extras = Extras::build(&results, 2);
        assert_eq!(extras.uplift.as_ref(), Some(&u));
        let doc = extras.benchmark_json(&BenchmarkMetadata::of("s", "p", "t", &results), &[]);
        assert_eq!(doc["uplift"]["cases"][0]["test_case_id"], "a");
        // String case ids: numbered by position, the case's own id kept beside.
        assert_eq!(doc["runs"][0]["eval_id"], 1);
        assert_eq!(doc["runs"][0]["case_id"], "a");
        assert!(extras.markdown().contains("### Uplift per criterion"));
        assert_eq!(
            extras.repeats.as_ref().unwrap().cases.len(),
            2,
            "repeats are over the with-skill attempts"
        );
    }

    #[test]
    fn a_run_is_numbered_by_its_ids_only_when_every_id_is_a_number() {
        let numeric = EvalNumbering::of(["1", "7"]);
        assert_eq!(numeric.eval_id("7", 1), 7);
        assert!(numeric.is_case_id());
        let mixed = EvalNumbering::of(["1", "tc-2"]);
        assert_eq!(mixed.eval_id("1", 0), 1);
        assert_eq!(mixed.eval_id("tc-2", 4), 5);
        assert!(!mixed.is_case_id());
    }

    #[test]
    fn notes_tool_calls_and_models_come_from_the_results() {
        let mut r = result("a", 1, CaseStatus::Passed, Some(1.0), 10, 1_000);
        r.details = json!({
            "judge": {"model": "judge-1"},
            "runner": {"model": "exec-1", "skill_used": false, "limit_hit": "max_turns",
                       "transcript": {"tool_calls": [{"name": "bash"}, {"name": "bash"}, {"name": "read_file"}]}}
        });
        r.output_truncated = true;
        r.attempts = vec![
            skilleval_execution::result::Attempt {
                number: 1,
                status: CaseStatus::Failed,
                score: Some(0.0),
                duration_ms: 5,
                grade_ms: 1,
                error: None,
            },
            skilleval_execution::result::Attempt {
                number: 2,
                status: CaseStatus::Passed,
                score: Some(1.0),
                duration_ms: 5,
                grade_ms: 1,
                error: None,
            },
        ];
        let counts = tool_call_counts(&r);
        assert_eq!(counts.get("bash"), Some(&2));
        assert_eq!(counts.get("read_file"), Some(&1));
        let run = benchmark_run(Configuration::WithSkill, 1, &r).unwrap();
        assert_eq!(run.result.tool_calls, 3);
        assert_eq!(
            run.notes,
            [
                "passed after 2 attempts",
                "the output was cut at the stored size limit",
                "the agent stopped at its limit: max_turns",
                "the agent never opened the skill's SKILL.md",
            ]
        );
        let meta = BenchmarkMetadata::of("s", "p", "t", &[r]);
        assert_eq!(
            (meta.executor_model.as_str(), meta.analyzer_model.as_str()),
            ("exec-1", "judge-1")
        );
    }
}
