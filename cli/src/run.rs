//! `skilleval run`: evaluate a skill in-process.
//!
//! Cases that need a model provider when none is configured are not run: they are listed by
//! id before the run starts, so the author knows exactly what was left out and why. With a
//! provider ([`crate::providers`]), the `llm` runner and the model-backed strategies are
//! registered; `--baseline` and `--repeats` add attempts ([`crate::variants`]), trigger evals
//! run when the package has trigger queries, and `--max-cost` / `--max-tokens` stop the run
//! (the rest recorded as skipped, the verdict `fail` with the reason).
//!
//! [`run`] reads as the run's outline: one step function per stage, in order. A step that cannot
//! go on returns a [`RunError`] (bad input or configuration, exit 2), which reports itself; a run
//! that reaches its verdict exits 0 or 1 by it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::Utc;
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use skilleval_analysis::benchmark;
use skilleval_analysis::budget::{self, Budget, BudgetLimits};
use skilleval_analysis::summary::{summarize, Verdict};
use skilleval_execution::environment::{EnvironmentConfig, Environments};
use skilleval_execution::executor::{Executor, ExecutorBuilder};
use skilleval_execution::plan::{plan, CaseFilter, Job};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::triggers;
use skilleval_execution::validate::validate;
use skilleval_model::definition::RunnerConfig;
use skilleval_model::grade::{RetryPolicy, Usage};
use skilleval_model::package::{Package, PackageError, PackageLimits, RiskReport};
use skilleval_model::problem::Problem;
use skilleval_reports::artifacts;
use skilleval_reports::{render_with, ReportContext, ReportExtras, ReportFormat};
use skilleval_sandbox::{Sandbox, SandboxPolicy};
use uuid::Uuid;

use crate::providers::{self, LlmSetup};
use crate::{table, variants, RunArgs, EXIT_BAD_INPUT, EXIT_FAIL, EXIT_NO_EVAL, EXIT_PASS};

/// Default cases in flight when neither the flag nor the file says.
const DEFAULT_CONCURRENCY: usize = 4;

/// Why `skilleval run` stopped before a verdict. Every variant is bad input or configuration
/// (the package, a flag, the providers file, the run folder), so the run never reaches a
/// verdict; a failing skill is a [`Verdict::Fail`], never one of these.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The package could not be opened (unreadable, not a skill, or its definition invalid).
    #[error("{}: {source}", path.display())]
    Package { path: PathBuf, source: PackageError },
    /// The package opened but the validator found errors.
    #[error("{}: invalid package", path.display())]
    Invalid {
        path: PathBuf,
        problems: Vec<Problem>,
    },
    /// The skill has no eval definition yet (its other problems, if any, with it).
    #[error("{}: no eval definition", path.display())]
    NoEval {
        path: PathBuf,
        problems: Vec<Problem>,
    },
    /// A flag, the providers file or the plan's selection is unusable.
    #[error("{0}")]
    Config(String),
    /// The run's files could not be written.
    #[error(transparent)]
    Write(#[from] artifacts::ArtifactError),
}

impl RunError {
    /// The process exit code this error ends the run with.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Package { .. }
            | RunError::Invalid { .. }
            | RunError::Config(_)
            | RunError::Write(_) => EXIT_BAD_INPUT,
            RunError::NoEval { .. } => EXIT_NO_EVAL,
        }
    }

    /// Tells the user on stderr, in the words the CLI has always used.
    pub fn report(&self) {
        match self {
            RunError::Package { path, source } => {
                report_package_error(path, source);
            }
            RunError::Invalid { path, problems } => print_problems(path, problems),
            RunError::NoEval { path, problems } => {
                print_problems(path, problems);
                eprintln!("{}", no_eval_hint(path));
            }
            RunError::Config(_) | RunError::Write(_) => eprintln!("error: {self}"),
        }
    }
}

/// The exit code of a run that reached its verdict.
pub fn verdict_exit_code(verdict: Verdict) -> u8 {
    match verdict {
        Verdict::Pass => EXIT_PASS,
        Verdict::Fail => EXIT_FAIL,
    }
}

/// What to do about a skill with no eval definition.
pub(crate) fn no_eval_hint(path: &Path) -> String {
    format!(
        "{p} has no eval definition yet. `skilleval init {p}` writes a first one (evals/evals.json \
         and trigger queries) from its SKILL.md, drafted by your model provider when one is \
         configured; see docs/test-format.md for the formats.",
        p = path.display()
    )
}

/// Prints a package error for people; returns the exit code for it.
pub(crate) fn report_package_error(path: &Path, err: &PackageError) -> u8 {
    match err {
        PackageError::Invalid(problems) => print_problems(path, problems),
        other => eprintln!("error: {}: {other}", path.display()),
    }
    EXIT_BAD_INPUT
}

/// The package's risk findings on stderr, one a line (nothing when there are none).
pub(crate) fn print_risk(path: &Path, risk: &RiskReport) {
    if risk.is_empty() {
        return;
    }
    let (low, medium, high) = risk.counts();
    eprintln!(
        "{}: package risk: {high} high, {medium} medium, {low} low finding(s)",
        path.display()
    );
    for finding in &risk.findings {
        eprintln!("  {finding}");
    }
}

pub(crate) fn print_problems(path: &Path, problems: &[Problem]) {
    let errors = problems.iter().filter(|p| p.is_error()).count();
    let warnings = problems.len() - errors;
    eprintln!(
        "{}: {errors} error(s), {warnings} warning(s)",
        path.display()
    );
    for p in problems {
        eprintln!("  {p}");
    }
}

/// Evaluates the skill at `args.path`; returns the exit code.
pub async fn run(args: &RunArgs) -> u8 {
    match run_steps(args).await {
        Ok(verdict) => verdict_exit_code(verdict),
        Err(e) => {
            e.report();
            e.exit_code()
        }
    }
}

/// The run, one step per line; each step is a function below, in this order.
async fn run_steps(args: &RunArgs) -> Result<Verdict, RunError> {
    let package = open_package(args)?;
    let out_dir = artifact_base(args);
    let llm = load_providers(args, &package, &out_dir)?;
    let executor = build_executor(args, &package, llm.as_ref())?;
    let run_id = Uuid::now_v7();
    let jobs = plan_jobs(args, &package, run_id)?;
    let Some(runnable) = runnable_cases(&executor, jobs) else {
        // Every case needs a model and none is configured: validated, nothing to grade.
        return Ok(Verdict::Pass);
    };
    // Before anything runs: every case needing the sandbox can have it (a machine without
    // bubblewrap is a configuration problem, not a failing skill).
    crate::sandbox_check::require(&runnable, executor.sandbox()).map_err(RunError::Config)?;
    let executed = execute_cases(args, &package, &executor, &runnable).await;
    let extras = report_extras(args, &package, llm.as_ref(), &executed).await;
    let risk = package.risk_report();
    if !args.quiet {
        print_risk(&args.path, &risk);
    }
    let ctx = ReportContext {
        run_id,
        skill_name: &package.manifest.name,
        skill_description: &package.manifest.description,
        version: None,
        profile: package.config.profile.as_str(),
        package_hash: &package.content_hash,
        created_at: executed.started,
        results: &executed.results,
        summary: &executed.summary,
        risk: Some(&risk),
    };
    print_summary(args, &ctx, &executed, runnable.len(), &extras);
    if !args.no_write {
        let run_dir = write_all_run_files(
            args,
            &out_dir,
            &ctx,
            &extras,
            &executed,
            &package,
            llm.as_ref(),
            args.repeats,
        )?;
        eprintln!("run files: {}", run_dir.display());
    }
    match args.format {
        // One self-contained page (inline CSS and script), opened offline or attached to a
        // CI run: written beside the run files, its path said on stderr.
        Some(ReportFormat::Html) => {
            let path = out_dir.join("report.html");
            std::fs::create_dir_all(&out_dir)
                .and_then(|()| {
                    std::fs::write(&path, skilleval_reports::render(&ctx, ReportFormat::Html))
                })
                .map_err(|source| artifacts::ArtifactError::Write {
                    path: path.clone(),
                    source,
                })?;
            eprintln!("html report: {}", path.display());
        }
        Some(format) => println!("{}", render_with(&ctx, format, &extras)),
        None => {}
    }
    Ok(executed.summary.verdict)
}

/// Opens the package (folder or ZIP) within the default limits; a skill with no eval
/// definition stops here, with every problem found so far.
fn open_package(args: &RunArgs) -> Result<Package, RunError> {
    let package = Package::open(&args.path, &PackageLimits::default()).map_err(|source| {
        RunError::Package {
            path: args.path.clone(),
            source,
        }
    })?;
    if package.format.is_none() {
        return Err(RunError::NoEval {
            path: args.path.clone(),
            problems: package.problems,
        });
    }
    Ok(package)
}

/// Loads the model providers, refuses model-only flags that cannot work, and says which
/// providers the run uses.
fn load_providers(
    args: &RunArgs,
    package: &Package,
    out_dir: &Path,
) -> Result<Option<LlmSetup>, RunError> {
    let llm = providers::load(args, package.root(), out_dir).map_err(RunError::Config)?;
    check_model_flags(args, llm.as_ref())?;
    if let Some(setup) = &llm {
        let names: Vec<&str> = setup
            .clients
            .providers()
            .providers
            .keys()
            .map(String::as_str)
            .collect();
        let cache = setup
            .cache_dir
            .as_ref()
            .map_or("off".to_string(), |d| d.display().to_string());
        eprintln!(
            "model providers: {} (from {}); response cache: {cache}",
            names.join(", "),
            setup.source
        );
    }
    Ok(llm)
}

/// The sandbox the run's options ask for (`--allow-unsandboxed`, `--bwrap`): the cases and the
/// agent-mode trigger queries run in the same one.
fn sandbox_for(args: &RunArgs) -> Sandbox {
    Sandbox::detect(SandboxPolicy {
        allow_unsandboxed: args.allow_unsandboxed,
        bwrap: args.bwrap.clone(),
        ..SandboxPolicy::default()
    })
}

/// The environment cache of a run: the index, registry and folder the flags name.
fn environments_for(args: &RunArgs) -> Environments {
    let defaults = EnvironmentConfig::default();
    Environments::new(EnvironmentConfig {
        dir: args.env_dir.clone(),
        python_index: args
            .index_url
            .clone()
            .unwrap_or(defaults.python_index.clone()),
        npm_registry: args
            .npm_registry
            .clone()
            .unwrap_or(defaults.npm_registry.clone()),
        ..defaults
    })
}

/// Registers the strategies and runners (the model-backed ones when a provider is
/// configured), validates the package against them, prints its warnings, and builds the
/// executor primed with the compiled graders.
fn build_executor(
    args: &RunArgs,
    package: &Package,
    llm: Option<&LlmSetup>,
) -> Result<Executor, RunError> {
    let executor = ExecutorBuilder::new()
        .providers(llm.map(|setup| setup.clients.clone()))
        .sandbox(sandbox_for(args))
        .zod_dir(crate::zod_dir())
        .environments(Arc::new(environments_for(args)))
        .build();
    let validation = validate(package, executor.strategies());
    if !validation.is_ok() {
        return Err(RunError::Invalid {
            path: args.path.clone(),
            problems: validation.problems,
        });
    }
    for warning in validation.problems.iter().filter(|p| !p.is_error()) {
        eprintln!("{warning}");
    }
    executor.prime(
        &package.content_hash,
        package.config.profile,
        &package.config.test_cases,
        validation.graders,
    );
    Ok(executor)
}

/// One job per selected case (tags, ids, suite), with `--runner` overriding the definition's.
fn plan_jobs(args: &RunArgs, package: &Package, run_id: Uuid) -> Result<Vec<Job>, RunError> {
    let filter = CaseFilter {
        tags: args.tags.clone(),
        case_ids: args.cases.clone(),
        suite: args.suite.clone(),
    };
    let runner_override = args.runner.as_ref().map(|kind| RunnerConfig {
        kind: kind.clone(),
        ..package
            .config
            .settings
            .runner
            .as_ref()
            .map(skilleval_model::definition::RunnerSpec::config)
            .unwrap_or_default()
    });
    let jobs = plan(
        &package.config,
        &package.content_hash,
        run_id,
        &filter,
        runner_override.as_ref(),
    )
    .map_err(|e| RunError::Config(e.to_string()))?;
    match &args.rescore_of {
        Some(run_dir) => with_recorded_outputs(args, run_dir, jobs),
        None => Ok(jobs),
    }
}

/// `skilleval rescore`: the jobs of the cases the run at `run_dir` recorded an output for,
/// each carrying that output to the `given` runner (nothing is produced again).
fn with_recorded_outputs(
    args: &RunArgs,
    run_dir: &Path,
    jobs: Vec<Job>,
) -> Result<Vec<Job>, RunError> {
    if args.baseline || args.repeats > 1 {
        return Err(RunError::Config(
            "rescore grades recorded outputs once: --baseline and --repeats produce new ones"
                .into(),
        ));
    }
    let (record, results) =
        skilleval_reports::artifacts::read_run_record(run_dir).map_err(|e| {
            RunError::Config(format!(
                "{} is not a run folder skilleval can rescore: {e}",
                run_dir.display()
            ))
        })?;
    let outputs: std::collections::HashMap<String, String> = results
        .into_iter()
        .filter(|r| !matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued))
        .filter_map(|r| Some((r.test_case_id, r.output?)))
        .collect();
    let jobs: Vec<Job> = jobs
        .into_iter()
        .filter_map(|mut job| {
            let output = outputs.get(&job.case.id)?.clone();
            job.runner = RunnerConfig {
                kind: "given".into(),
                ..RunnerConfig::default()
            };
            job.given = Some(skilleval_model::definition::Given {
                output,
                tool_calls: None,
            });
            Some(job)
        })
        .collect();
    if jobs.is_empty() {
        return Err(RunError::Config(format!(
            "run {} recorded no output for any selected case of the definition",
            record.run_id
        )));
    }
    eprintln!(
        "rescoring {} recorded output(s) of run {}",
        jobs.len(),
        record.run_id
    );
    Ok(jobs)
}

/// The jobs that can run here, after listing those that need a model provider none is
/// configured for; `None` when that leaves nothing.
fn runnable_cases(executor: &Executor, jobs: Vec<Job>) -> Option<Vec<Job>> {
    let (runnable, need_model) = split_model_cases(executor, jobs);
    if !need_model.is_empty() {
        eprintln!(
            "note: {} case(s) need a model provider and will not run here (none is configured; see docs/providers.md):",
            need_model.len()
        );
        for (job, why) in &need_model {
            eprintln!("  - {}: {why}", job.case.id);
        }
    }
    if runnable.is_empty() {
        eprintln!(
            "nothing to run without a model provider: {} case(s) validated, 0 run.",
            need_model.len()
        );
        return None;
    }
    Some(runnable)
}

/// What executing the cases produced.
struct Executed {
    /// Every attempt, baseline included (each result says its variant).
    all_results: Vec<JobResult>,
    /// The run proper: the with-skill attempts.
    results: Vec<JobResult>,
    summary: skilleval_analysis::summary::RunSummary,
    started: chrono::DateTime<Utc>,
    budget: Budget,
    /// Cases with no baseline because their runner is neither `llm` nor `agent`.
    no_baseline: usize,
    /// Attempts (baseline included) the budget stopped.
    stopped: usize,
}

/// Runs the cases (with `--repeats` and `--baseline` variants) under the run's concurrency,
/// failFast and budget, and summarises the with-skill attempts.
async fn execute_cases(
    args: &RunArgs,
    package: &Package,
    executor: &Executor,
    runnable: &[Job],
) -> Executed {
    let concurrency = args
        .concurrency
        .or_else(|| match package.config.settings.parallel_execution {
            Some(false) => Some(1),
            _ => package
                .config
                .settings
                .max_concurrent_tests
                .map(|n| n as usize),
        })
        .unwrap_or(DEFAULT_CONCURRENCY)
        .max(1);

    let (jobs, no_baseline) = variants::expand(executor, runnable, args.repeats, args.baseline);
    if no_baseline > 0 {
        eprintln!("note: --baseline skips {no_baseline} case(s) whose runner cannot leave the skill out (there is no skill-less way to run a script)");
    }
    let budget = Budget::new(BudgetLimits {
        max_cost_usd: args.max_cost,
        max_tokens: args.max_tokens,
    });
    let started = Utc::now();
    let order = skilleval_execution::plan::run_order(&package.config, &jobs);
    let all_results = execute_all(
        executor,
        jobs,
        order,
        package.root(),
        concurrency,
        package.config.settings.fail_fast,
        RetryPolicy {
            max_attempts: args.max_attempts.max(1),
            ..RetryPolicy::default()
        },
        args.quiet,
        Some(&budget),
    )
    .await;
    // The run is the with-skill attempts; the baseline is only compared against.
    let results: Vec<JobResult> = benchmark::with_skill(&all_results);
    let mut summary = summarize(&results, &package.config.settings);
    let by_budget =
        |r: &&JobResult| skip_reason(r).is_some_and(|s| s.starts_with(budget::BUDGET_EXCEEDED));
    let stopped = all_results.iter().filter(by_budget).count();
    // Only cutting the run's own cases fails it; a cut baseline is a note in benchmark.json.
    let stopped_in_run = results.iter().filter(by_budget).count();
    if stopped_in_run > 0 {
        let reason = results
            .iter()
            .find_map(|r| skip_reason(r).filter(|s| s.starts_with(budget::BUDGET_EXCEEDED)))
            .unwrap_or(budget::BUDGET_EXCEEDED)
            .to_string();
        budget::mark_stopped(&mut summary, &reason, stopped_in_run as u64);
    } else if stopped > 0 {
        eprintln!(
            "note: the budget ran out during the baseline: {stopped} baseline attempt(s) not run"
        );
    }
    Executed {
        all_results,
        results,
        summary,
        started,
        budget,
        no_baseline,
        stopped,
    }
}

/// The report's extra sections: baseline and repeats, then the trigger evals.
async fn report_extras(
    args: &RunArgs,
    package: &Package,
    llm: Option<&LlmSetup>,
    executed: &Executed,
) -> ReportExtras {
    let mut extras = ReportExtras::default();
    if args.baseline || args.repeats > 1 {
        let built = benchmark::Extras::build(&executed.all_results, args.repeats);
        extras.markdown.push_str(&built.markdown());
        extras.benchmark = Some(built.benchmark_json(
            &benchmark_metadata(args, package, executed),
            &benchmark_notes(executed),
        ));
    }
    if let Some(setup) = llm {
        if let Some(report) = run_triggers(args, package, setup, &executed.budget).await {
            extras.markdown.push_str(&triggers::markdown(&report));
            extras.triggers = serde_json::to_value(&report).ok();
        }
    }
    extras
}

/// What a reader of the run's `benchmark.json` should know that its runs do not say.
fn benchmark_notes(executed: &Executed) -> Vec<String> {
    let mut notes = Vec::new();
    if executed.no_baseline > 0 {
        notes.push(format!(
            "{} case(s) have no baseline: their runner cannot leave the skill out",
            executed.no_baseline
        ));
    }
    if executed.stopped > 0 {
        notes.push(format!(
            "the run was stopped by its budget: {} attempt(s) not run",
            executed.stopped
        ));
    }
    notes
}

/// skill-creator's `metadata` of this run: the skill's path as given, the models from the
/// results.
fn benchmark_metadata(
    args: &RunArgs,
    package: &Package,
    executed: &Executed,
) -> benchmark::BenchmarkMetadata {
    benchmark::BenchmarkMetadata::of(
        &package.manifest.name,
        &skill_path(args),
        &executed
            .started
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        &executed.all_results,
    )
}

/// The skill's path as a reader of the run's files can use it: absolute when it resolves.
fn skill_path(args: &RunArgs) -> String {
    std::fs::canonicalize(&args.path)
        .unwrap_or_else(|_| args.path.clone())
        .display()
        .to_string()
}

/// The summary table, token use and extra sections on stderr.
fn print_summary(
    args: &RunArgs,
    ctx: &ReportContext<'_>,
    executed: &Executed,
    cases: usize,
    extras: &ReportExtras,
) {
    eprint!("{}", table::summary_table(ctx));
    if args.repeats > 1 {
        eprintln!(
            "(--repeats {}: every attempt counts; {cases} case(s) x {} attempts)",
            args.repeats, args.repeats
        );
    }
    let (produce, grade) = (executed.summary.produce_usage, executed.summary.grade_usage);
    if produce.total_tokens() + grade.total_tokens() > 0 {
        eprintln!(
            "tokens: {} producing, {} grading · cost ${:.4}{}",
            produce.total_tokens(),
            grade.total_tokens(),
            produce.cost_usd + grade.cost_usd,
            if executed.all_results.len() > executed.results.len() {
                format!(
                    " (run); ${:.4} with the baseline and trigger evals",
                    executed.budget.spent().cost_usd
                )
            } else {
                String::new()
            }
        );
    }
    if !extras.markdown.is_empty() {
        eprint!("\n{}", extras.markdown);
    }
}

/// Writes every run file: attempt 1's grading, the reports and the version history entry,
/// the run record (every attempt), and the run's folder as a skill-creator iteration.
/// Returns the run's folder.
#[allow(clippy::too_many_arguments)]
fn write_all_run_files(
    args: &RunArgs,
    out_dir: &Path,
    ctx: &ReportContext<'_>,
    extras: &ReportExtras,
    executed: &Executed,
    package: &Package,
    llm: Option<&LlmSetup>,
    repeats: u32,
) -> Result<PathBuf, RunError> {
    let first: Vec<JobResult> = executed
        .all_results
        .iter()
        .filter(|r| r.variant.is_primary())
        .cloned()
        .collect();
    let run_dir = write_run_files(out_dir, ctx, extras, &first)?;
    let record = crate::compare::record_run(
        &run_dir,
        ctx.run_id,
        package,
        llm,
        &executed.all_results,
        repeats,
        &skill_path(args),
        executed.started,
    )?;
    let files = skilleval_reports::skill_creator::workspace(
        &executed.all_results,
        &record.inputs,
        &benchmark_metadata(args, package, executed),
        &benchmark_notes(executed),
    );
    skilleval_reports::skill_creator::write_workspace(&run_dir, &files)?;
    Ok(run_dir)
}

/// Refuses model-only flags that cannot work, before anything runs.
fn check_model_flags(args: &RunArgs, llm: Option<&LlmSetup>) -> Result<(), RunError> {
    let bad = |msg: &str| RunError::Config(msg.to_string());
    if args.baseline && llm.is_none() {
        return Err(bad("--baseline runs every case without the skill on a model: configure a provider (see docs/providers.md)"));
    }
    if args.repeats == 0 {
        return Err(bad("--repeats must be at least 1"));
    }
    if let Some(c) = args.max_cost {
        if !(c.is_finite() && c > 0.0) {
            return Err(bad("--max-cost must be a positive amount of USD"));
        }
    }
    if args.max_tokens == Some(0) {
        return Err(bad("--max-tokens must be at least 1"));
    }
    Ok(())
}

/// Why a result was skipped, when it was.
fn skip_reason(r: &JobResult) -> Option<&str> {
    (r.status == CaseStatus::Skipped)
        .then(|| r.details.get("skipped").and_then(serde_json::Value::as_str))
        .flatten()
}

/// Model turns of one agent-mode trigger run: enough to look around and open a skill.
const AGENT_TRIGGER_TURNS: u32 = 4;

/// Trigger evals, when the package has trigger queries and the budget allows.
async fn run_triggers(
    args: &RunArgs,
    package: &Package,
    setup: &LlmSetup,
    budget: &Budget,
) -> Option<triggers::TriggerReport> {
    if package.triggers.is_empty() || args.trigger_runs == 0 {
        return None;
    }
    if let Some(reason) = budget.exceeded() {
        eprintln!("note: trigger evals not run: {reason}");
        return None;
    }
    let client = match setup
        .clients
        .pick(None, skilleval_providers::Purpose::Produce)
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("note: trigger evals not run: {e}");
            return None;
        }
    };
    let skill = triggers::SkillCard::new(&package.manifest.name, &package.manifest.description);
    let agent = (args.trigger_mode == crate::TriggerMode::Agent).then(|| triggers::AgentTriggers {
        sandbox: std::sync::Arc::new(sandbox_for(args)),
        package_root: package.root().to_path_buf(),
        max_turns: AGENT_TRIGGER_TURNS,
        timeout: std::time::Duration::from_secs(120),
    });
    let opts = triggers::TriggerOptions {
        runs_per_query: args.trigger_runs,
        agent,
        ..triggers::TriggerOptions::default()
    };
    let report = triggers::evaluate_triggers(&client, &skill, &package.triggers, &opts).await;
    budget.record(&report.usage);
    Some(report)
}

fn split_model_cases(executor: &Executor, jobs: Vec<Job>) -> (Vec<Job>, Vec<(Job, String)>) {
    let mut runnable = Vec::with_capacity(jobs.len());
    let mut need_model = Vec::new();
    for job in jobs {
        match executor.needs_missing_model(&job) {
            Some(why) => need_model.push((job, why)),
            None => runnable.push(job),
        }
    }
    (runnable, need_model)
}

fn artifact_base(args: &RunArgs) -> PathBuf {
    match &args.out {
        Some(out) => out.clone(),
        None if args.path.is_dir() => args.path.join("eval"),
        None => PathBuf::from("skilleval-runs"),
    }
}

/// Writes the run's files. `first` is attempt 1 with the skill (all of `ctx.results` unless
/// `--repeats`): its grading files (the JSON-shapes seed's per-case files) and version
/// history entry are one per case; every attempt is in the skill-creator folder written after.
fn write_run_files(
    base: &Path,
    ctx: &ReportContext<'_>,
    extras: &ReportExtras,
    first: &[JobResult],
) -> Result<PathBuf, artifacts::ArtifactError> {
    let run_dir = base.join("runs").join(ctx.run_id.to_string());
    artifacts::write_grading(&run_dir, first)?;
    let write = |name: &str, text: String| {
        let path = run_dir.join(name);
        std::fs::write(&path, text)
            .map_err(|source| artifacts::ArtifactError::Write { path, source })
    };
    write(
        "report.md",
        render_with(ctx, ReportFormat::Markdown, extras),
    )?;
    write("report.json", render_with(ctx, ReportFormat::Json, extras))?;
    if let Some(doc) = &extras.triggers {
        write(
            "triggers.json",
            serde_json::to_string_pretty(doc).unwrap_or_default() + "\n",
        )?;
    }
    let history = base.join(artifacts::VERSION_HISTORY_FILE);
    continue_legacy_history(base, &history);
    artifacts::append_benchmark(
        &history,
        ctx.skill_name,
        ctx.skill_description,
        ctx.run_id,
        first,
        ctx.summary,
        Utc::now(),
    )?;
    Ok(run_dir)
}

/// A skill whose runs wrote the version history as `eval/benchmark.json` (before that name
/// went to skill-creator's file) continues it: the old file is copied once to the new name,
/// so description versions keep counting. Anything else there is left alone.
fn continue_legacy_history(base: &Path, history: &Path) {
    let legacy = base.join("benchmark.json");
    if history.exists() || !legacy.is_file() {
        return;
    }
    let is_history = std::fs::read_to_string(&legacy)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .is_some_and(|doc| doc.get("entries").is_some_and(serde_json::Value::is_array));
    if is_history {
        if let Err(e) = std::fs::copy(&legacy, history) {
            eprintln!(
                "note: could not continue {} as {}: {e}",
                legacy.display(),
                history.display()
            );
        }
    }
}

/// Executes jobs `concurrency` at a time, retrying transient faults locally with backoff;
/// results come back in the order of `jobs`. `order` groups jobs that run one at a time, in
/// the group's order ([`skilleval_execution::plan::run_order`]: a suite with `runInSequence`);
/// a group takes one of the `concurrency` slots, and a job in no group runs alone. With
/// `fail_fast`, the first case that does not pass stops new cases from starting; with a
/// `budget`, so does reaching it. Cases not started are recorded as skipped, with the reason.
#[allow(clippy::too_many_arguments)]
pub async fn execute_all(
    executor: &Executor,
    jobs: Vec<Job>,
    order: Vec<Vec<usize>>,
    package_root: &Path,
    concurrency: usize,
    fail_fast: bool,
    retry: RetryPolicy,
    quiet: bool,
    budget: Option<&Budget>,
) -> Vec<JobResult> {
    let bar = progress_bar(jobs.len() as u64, quiet);
    let stop = AtomicBool::new(false);
    let one = |index: usize, job: Job| {
        let bar = &bar;
        let stop = &stop;
        async move {
            if stop.load(Ordering::SeqCst) {
                bar.inc(1);
                return (
                    index,
                    JobResult::skipped(&job, "failFast: an earlier case did not pass"),
                );
            }
            if let Some(reason) = budget.and_then(Budget::exceeded) {
                bar.inc(1);
                return (index, JobResult::skipped(&job, &reason));
            }
            let result = execute_with_retry(executor, job, package_root, retry).await;
            if let Some(b) = budget {
                b.record(&result.produce_usage);
                b.record(&result.grade_usage);
            }
            if fail_fast && result.status != CaseStatus::Passed {
                stop.store(true, Ordering::SeqCst);
            }
            bar.set_message(format!(
                "{} {}",
                result.test_case_id,
                result.status.as_str()
            ));
            bar.inc(1);
            (index, result)
        }
    };
    let mut slots: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
    let mut groups: Vec<Vec<(usize, Job)>> = order
        .into_iter()
        .map(|group| {
            group
                .into_iter()
                .filter_map(|i| slots.get_mut(i).and_then(Option::take).map(|j| (i, j)))
                .collect()
        })
        .collect();
    groups.extend(
        slots
            .into_iter()
            .enumerate()
            .filter_map(|(i, job)| job.map(|j| vec![(i, j)])),
    );
    let one = &one;
    let done: Vec<Vec<(usize, JobResult)>> = stream::iter(groups)
        .map(|group| async move {
            let mut out = Vec::with_capacity(group.len());
            for (index, job) in group {
                out.push(one(index, job).await);
            }
            out
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut results: Vec<(usize, JobResult)> = done.into_iter().flatten().collect();
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, r)| r).collect()
}

async fn execute_with_retry(
    executor: &Executor,
    mut job: Job,
    package_root: &Path,
    retry: RetryPolicy,
) -> JobResult {
    let mut previous: Vec<skilleval_execution::result::Attempt> = Vec::new();
    // What the attempts retried away spent (an agent that failed at its fifth turn billed
    // four): the case's, so budgets and reports count it.
    let (mut produced, mut graded) = (Usage::default(), Usage::default());
    loop {
        let mut result = executor.execute(&job, package_root).await;
        produced.add(&result.produce_usage);
        graded.add(&result.grade_usage);
        let transient = result.status == CaseStatus::Errored
            && result.error.as_ref().is_some_and(|e| e.is_transient());
        if !transient || job.attempt >= retry.max_attempts {
            result.produce_usage = produced;
            result.grade_usage = graded;
            if !previous.is_empty() {
                previous.append(&mut result.attempts);
                for (i, a) in previous.iter_mut().enumerate() {
                    a.number = u32::try_from(i + 1).unwrap_or(u32::MAX);
                }
                result.attempts = previous;
            }
            return result;
        }
        let fault = result
            .error
            .clone()
            .unwrap_or_else(|| skilleval_model::grade::Fault::transient("unknown"));
        let delay = retry.delay(job.attempt + 1, &fault);
        tracing::info!(case = %job.case.id, attempt = job.attempt, ?delay, error = %fault, "transient fault; retrying");
        previous.append(&mut result.attempts);
        tokio::time::sleep(delay).await;
        job.attempt += 1;
    }
}

fn progress_bar(len: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar
}
