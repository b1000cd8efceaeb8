//! `skilleval plan ./skill`: what a run would cost and what it could detect, before it starts.
//!
//! Counts the cases and the model calls the package's runner and strategies make (producing
//! with an `llm` runner, judging with a model-backed strategy, a bare-model attempt per `llm`
//! case with `--baseline`, the trigger evals), prices them from the skill's last local run
//! (`eval/runs/<id>/results.jsonl`: measured tokens and cost per attempt), and gives the
//! minimum detectable drop in pass rate at 80 % power for the planned cases and repeats, from
//! the last local run's pass rate, with [`skilleval_analysis::stats::power_advice`]'s advice. The
//! arithmetic is [`skilleval_analysis::forecast`]'s, which the service's dry runs use too.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;
use skilleval_analysis::forecast::{forecast, CallCounts, Measured, Shape};
use skilleval_execution::plan::{plan as plan_jobs, CaseFilter};
use skilleval_execution::result::JobResult;
use skilleval_grading::StrategyRegistry;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_reports::artifacts::{self, RunRecord};
use uuid::Uuid;

use crate::run::report_package_error;
use crate::{EXIT_BAD_INPUT, EXIT_PASS};

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
    #[arg(long, default_value_t = skilleval_execution::triggers::DEFAULT_RUNS_PER_QUERY, value_name = "N")]
    pub trigger_runs: u32,
    /// Where earlier runs are (`runs/<run-id>/…`); default: the skill's `eval/` folder.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
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

/// What the last local run measured.
fn history(runs_dir: &Path) -> Option<Measured> {
    let (record, results) = last_run(runs_dir)?;
    Measured::from_results(format!("the last local run {}", record.run_id), &results)
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
    if jobs.is_empty() {
        eprintln!("error: the eval definition has no test case to plan");
        return EXIT_BAD_INPUT;
    }
    let mut counts = CallCounts::default();
    counts.add(&jobs, &StrategyRegistry::builtin().build());
    let runs_dir = match &args.out {
        Some(dir) => dir.join("runs"),
        None => package.root().join("eval").join("runs"),
    };
    let last = history(&runs_dir);
    let shape = Shape {
        repeats: args.repeats,
        baseline: args.baseline,
        trigger_queries: package.triggers.len() as u64,
        trigger_runs: args.trigger_runs,
    };
    let f = match forecast(&counts, shape, last.as_ref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let calls = f.model_calls;

    if args.json {
        let mut doc = json!(f);
        doc["skill_name"] = json!(package.manifest.name);
        println!(
            "{}",
            // Plain data: serialising cannot fail.
            serde_json::to_string_pretty(&doc).unwrap_or_default()
        );
        return EXIT_PASS;
    }
    println!("plan for {}", package.manifest.name);
    println!(
        "cases: {} × {} repeat(s){} = {} attempt(s)",
        f.cases,
        f.repeats,
        if f.baseline_cases > 0 {
            format!(" (+{} baseline case(s))", f.baseline_cases)
        } else {
            String::new()
        },
        f.attempts
    );
    println!(
        "model calls: {} ({} producing, {} judging, {} trigger)",
        calls.total, calls.producing, calls.judging, calls.triggers
    );
    match (&last, f.estimated_tokens, f.estimated_cost_usd) {
        (Some(m), Some(tokens), Some(cost)) => println!(
            "expected: ~{tokens} tokens, ~${cost:.4} (measured per attempt in {})",
            m.source
        ),
        _ => println!("expected cost: unknown until a local run has measured tokens per case"),
    }
    println!(
        "pass rate: {:.0} % ({})",
        f.baseline_pass_rate * 100.0,
        f.pass_rate_source
    );
    if f.mde_reachable {
        println!(
            "minimum detectable drop at 80 % power: {:.1} points of pass rate",
            f.mde_pass_rate * 100.0
        );
    } else {
        println!("minimum detectable drop at 80 % power: none (even a fall to 0 % is not reliably detected)");
    }
    println!("advice: {}", f.advice);
    EXIT_PASS
}
