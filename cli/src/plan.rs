//! `skilleval plan ./skill`: what a run would cost and what it could detect, before it starts.
//!
//! Counts the cases and the model calls the package's runner and strategies make (producing
//! with an `llm` runner, judging with a model-backed strategy, a bare-model attempt per `llm`
//! case with `--baseline`, the trigger evals), prices them from the skill's last local run
//! (`eval/runs/<id>/results.jsonl`: measured tokens and cost per attempt), and gives the
//! minimum detectable drop in pass rate at 80 % power for the planned cases and repeats, from
//! the last local run's pass rate, with [`skilleval::stats::power_advice`]'s advice.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;
use skilleval::artifacts::{self, RunRecord};
use skilleval::executor::{CaseStatus, JobResult};
use skilleval::package::{Package, PackageLimits};
use skilleval::plan::{plan as plan_jobs, CaseFilter, Job};
use skilleval::stats::{power_advice, Design};
use skilleval::strategy::StrategyRegistry;
use uuid::Uuid;

use crate::run::report_package_error;
use crate::{EXIT_BAD_INPUT, EXIT_PASS};

/// The drop the advice aims at (five points of pass rate).
const TARGET_DROP: f64 = 0.05;
/// The pass rate assumed when the skill has no local run yet.
const ASSUMED_PASS_RATE: f64 = 0.8;

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// The skill: a folder with SKILL.md, or a ZIP of one.
    pub path: PathBuf,
    /// Attempts per case the run would make.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeats: u32,
    /// The run would also run each `llm` case without the skill.
    #[arg(long)]
    pub baseline: bool,
    /// Runs per trigger query (0: no trigger evals).
    #[arg(long, default_value_t = skilleval::llm::triggers::DEFAULT_RUNS_PER_QUERY, value_name = "N")]
    pub trigger_runs: u32,
    /// Where earlier runs are (`runs/<run-id>/…`); default: the skill's `eval/` folder.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// What the last local run measured.
struct History {
    run_id: Uuid,
    pass_rate: f64,
    attempts: u64,
    tokens: u64,
    cost_usd: f64,
}

/// The newest run folder under `runs_dir` with a readable `run.json` (run ids are UUIDv7, so
/// the newest sorts last); older runs without one are skipped.
fn last_run(runs_dir: &Path) -> Option<(RunRecord, Vec<JobResult>)> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runs_dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join(artifacts::RUN_RECORD_FILE).is_file())
        .collect();
    dirs.sort();
    dirs.iter()
        .rev()
        .find_map(|d| artifacts::read_run_record(d).ok())
}

fn history(runs_dir: &Path) -> Option<History> {
    let (record, results) = last_run(runs_dir)?;
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
    Some(History {
        run_id: record.run_id,
        pass_rate: passed as f64 / ran.len() as f64,
        attempts: ran.len() as u64,
        tokens,
        cost_usd,
    })
}

/// Runs `skilleval plan`; returns the exit code.
pub fn plan(args: &PlanArgs) -> u8 {
    if args.repeats == 0 {
        eprintln!("error: --repeats must be at least 1");
        return EXIT_BAD_INPUT;
    }
    let package = match Package::open(&args.path, &PackageLimits::default()) {
        Ok(p) => p,
        Err(e) => return report_package_error(&args.path, &e),
    };
    let jobs = match plan_jobs(
        &package.config,
        &package.content_hash,
        Uuid::nil(),
        &CaseFilter::default(),
        None,
    ) {
        Ok(jobs) => jobs,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let cases = jobs.len() as u64;
    if cases == 0 {
        eprintln!("error: the eval definition has no test case to plan");
        return EXIT_BAD_INPUT;
    }
    let repeats = u64::from(args.repeats);
    let registry = StrategyRegistry::builtin().build();
    let llm_runner = jobs.iter().filter(|j| j.runner.kind == "llm").count() as u64;
    let judged = |j: &Job| {
        let strategy = j.case.strategy_name(j.profile);
        registry.missing_provider(strategy, &j.case).is_some()
    };
    let judged_cases = jobs.iter().filter(|j| judged(j)).count() as u64;
    let (baseline_cases, judged_baseline) = if args.baseline {
        let llm: Vec<&Job> = jobs.iter().filter(|j| j.runner.kind == "llm").collect();
        (
            llm.len() as u64,
            llm.iter().filter(|j| judged(j)).count() as u64,
        )
    } else {
        (0, 0)
    };
    let attempts = (cases + baseline_cases) * repeats;
    let producing = (llm_runner + baseline_cases) * repeats;
    let judging = (judged_cases + judged_baseline) * repeats;
    let trigger_calls = package.triggers.len() as u64 * u64::from(args.trigger_runs);
    let model_calls = producing + judging + trigger_calls;

    let runs_dir = match &args.out {
        Some(dir) => dir.join("runs"),
        None => package.root().join("eval").join("runs"),
    };
    let last = history(&runs_dir);
    let (pass_rate, rate_source) = match &last {
        Some(h) if h.pass_rate > 0.0 => (h.pass_rate, format!("the last local run {}", h.run_id)),
        Some(h) => (
            ASSUMED_PASS_RATE,
            format!(
                "assumed: the last local run {} passed nothing, there is no drop to detect",
                h.run_id
            ),
        ),
        None => (
            ASSUMED_PASS_RATE,
            "assumed: no local run with run.json yet".to_string(),
        ),
    };
    let estimate = last.as_ref().map(|h| {
        let per_attempt = |v: f64| v / h.attempts as f64;
        (
            per_attempt(h.tokens as f64) * attempts as f64,
            per_attempt(h.cost_usd) * attempts as f64,
        )
    });
    let design = Design::paired(cases, args.repeats, pass_rate);
    let advice = match power_advice(&design, TARGET_DROP) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };

    if args.json {
        let doc = json!({
            "skill_name": package.manifest.name,
            "cases": cases,
            "repeats": args.repeats,
            "baseline": args.baseline,
            "attempts": attempts,
            "model_calls": {
                "producing": producing,
                "judging": judging,
                "triggers": trigger_calls,
                "total": model_calls,
            },
            "estimated_tokens": estimate.map(|(t, _)| t.round() as u64),
            "estimated_cost_usd": estimate.map(|(_, c)| c),
            "baseline_pass_rate": pass_rate,
            "pass_rate_source": rate_source,
            "mde_pass_rate": advice.mde.drop,
            "mde_reachable": advice.mde.reachable,
            "advice": advice.text,
            "power": advice,
        });
        println!(
            "{}",
            // Plain data: serialising cannot fail.
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
        return EXIT_PASS;
    }
    println!("plan for {}", package.manifest.name);
    println!(
        "cases: {cases} × {} repeat(s){} = {attempts} attempt(s)",
        args.repeats,
        if baseline_cases > 0 {
            format!(" (+{baseline_cases} baseline case(s))")
        } else {
            String::new()
        }
    );
    println!(
        "model calls: {model_calls} ({producing} producing, {judging} judging, {trigger_calls} trigger)"
    );
    match (&last, estimate) {
        (Some(h), Some((tokens, cost))) => println!(
            "expected: ~{:.0} tokens, ~${cost:.4} (measured per attempt in run {})",
            tokens, h.run_id
        ),
        _ => println!("expected cost: unknown until a local run has measured tokens per case"),
    }
    println!("pass rate: {:.0} % ({rate_source})", pass_rate * 100.0);
    if advice.mde.reachable {
        println!(
            "minimum detectable drop at 80 % power: {:.1} points of pass rate",
            advice.mde.drop * 100.0
        );
    } else {
        println!("minimum detectable drop at 80 % power: none (even a fall to 0 % is not reliably detected)");
    }
    println!("advice: {}", advice.text);
    EXIT_PASS
}
