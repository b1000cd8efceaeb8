//! `skilleval run`: evaluate a skill in-process.
//!
//! Cases that need a model provider when none is configured are not run: they are listed by
//! id before the run starts, so the author knows exactly what was left out and why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chrono::Utc;
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use skilleval::executor::{CaseStatus, Executor, JobResult, RetryPolicy};
use skilleval::model::RunnerConfig;
use skilleval::package::{validate, Package, PackageError, PackageLimits};
use skilleval::plan::{plan, CaseFilter, Job};
use skilleval::report::{render, ReportContext, ReportFormat};
use skilleval::runner::RunnerRegistry;
use skilleval::sandbox::{Sandbox, SandboxPolicy};
use skilleval::strategy::StrategyRegistry;
use skilleval::summary::{summarize, Verdict};
use skilleval::{artifacts, problem::Problem};
use uuid::Uuid;

use crate::{table, RunArgs, EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS};

/// Default cases in flight when neither the flag nor the file says.
const DEFAULT_CONCURRENCY: usize = 4;

/// Prints a package error for people; returns the exit code for it.
pub(crate) fn report_package_error(path: &Path, err: &PackageError) -> u8 {
    match err {
        PackageError::Invalid(problems) => print_problems(path, problems),
        other => eprintln!("error: {}: {other}", path.display()),
    }
    EXIT_BAD_INPUT
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
    match run_inner(args).await {
        Ok(code) => code,
        Err(code) => code,
    }
}

async fn run_inner(args: &RunArgs) -> Result<u8, u8> {
    let limits = PackageLimits::default();
    let package =
        Package::open(&args.path, &limits).map_err(|e| report_package_error(&args.path, &e))?;
    let registry = StrategyRegistry::builtin().build();
    let validation = validate(&package, &registry);
    if !validation.is_ok() {
        print_problems(&args.path, &validation.problems);
        return Err(EXIT_BAD_INPUT);
    }
    for warning in validation.problems.iter().filter(|p| !p.is_error()) {
        eprintln!("{warning}");
    }

    let sandbox = Sandbox::detect(SandboxPolicy {
        allow_unsandboxed: args.allow_unsandboxed,
        ..SandboxPolicy::default()
    });
    let executor = Executor::new(registry, RunnerRegistry::builtin(), Arc::new(sandbox));
    executor.prime(&package.content_hash, validation.graders);

    let run_id = Uuid::now_v7();
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
            .map(skilleval::model::RunnerSpec::config)
            .unwrap_or_default()
    });
    let jobs = plan(
        &package.config,
        &package.content_hash,
        run_id,
        &filter,
        runner_override.as_ref(),
    )
    .map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;

    let (runnable, need_model): (Vec<Job>, Vec<(Job, String)>) = split_model_cases(&executor, jobs);
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
        return Ok(EXIT_PASS);
    }

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

    let started = Utc::now();
    let results = execute_all(
        &executor,
        runnable,
        package.root(),
        concurrency,
        package.config.settings.fail_fast,
        RetryPolicy {
            max_attempts: args.max_attempts.max(1),
            ..RetryPolicy::default()
        },
        args.quiet,
    )
    .await;
    let summary = summarize(&results, &package.config.settings);

    let ctx = ReportContext {
        run_id,
        skill_name: &package.manifest.name,
        skill_description: &package.manifest.description,
        version: None,
        profile: package.config.profile.as_str(),
        package_hash: &package.content_hash,
        created_at: started,
        results: &results,
        summary: &summary,
    };
    eprint!("{}", table::summary_table(&ctx));

    if !args.no_write {
        let base = artifact_base(args, &package);
        match write_run_files(&base, &ctx) {
            Ok(run_dir) => eprintln!("run files: {}", run_dir.display()),
            Err(e) => {
                eprintln!("error: {e}");
                return Err(EXIT_BAD_INPUT);
            }
        }
    }
    if let Some(format) = args.format {
        println!("{}", render(&ctx, format));
    }
    Ok(match summary.verdict {
        Verdict::Pass => EXIT_PASS,
        Verdict::Fail => EXIT_FAIL,
    })
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

fn artifact_base(args: &RunArgs, package: &Package) -> PathBuf {
    match &args.out {
        Some(out) => out.clone(),
        None if args.path.is_dir() => args.path.join("eval"),
        None => {
            let _ = package;
            PathBuf::from("skilleval-runs")
        }
    }
}

fn write_run_files(
    base: &Path,
    ctx: &ReportContext<'_>,
) -> Result<PathBuf, artifacts::ArtifactError> {
    let run_dir = base.join("runs").join(ctx.run_id.to_string());
    artifacts::write_grading(&run_dir, ctx.results)?;
    for (name, format) in [
        ("report.md", ReportFormat::Markdown),
        ("report.json", ReportFormat::Json),
    ] {
        let path = run_dir.join(name);
        std::fs::write(&path, render(ctx, format))
            .map_err(|source| artifacts::ArtifactError::Write { path, source })?;
    }
    artifacts::append_benchmark(
        &base.join("benchmark.json"),
        ctx.skill_name,
        ctx.skill_description,
        ctx.run_id,
        ctx.results,
        ctx.summary,
        Utc::now(),
    )?;
    Ok(run_dir)
}

/// Executes jobs `concurrency` at a time, retrying transient faults locally with backoff.
/// With `fail_fast`, the first case that does not pass stops new cases from starting; those
/// are recorded as skipped.
pub async fn execute_all(
    executor: &Executor,
    jobs: Vec<Job>,
    package_root: &Path,
    concurrency: usize,
    fail_fast: bool,
    retry: RetryPolicy,
    quiet: bool,
) -> Vec<JobResult> {
    let bar = progress_bar(jobs.len() as u64, quiet);
    let stop = AtomicBool::new(false);
    let results: Vec<JobResult> = stream::iter(jobs)
        .map(|job| {
            let bar = &bar;
            let stop = &stop;
            async move {
                if stop.load(Ordering::SeqCst) {
                    bar.inc(1);
                    return JobResult::skipped(&job, "failFast: an earlier case did not pass");
                }
                let result = execute_with_retry(executor, job, package_root, retry).await;
                if fail_fast && result.status != CaseStatus::Passed {
                    stop.store(true, Ordering::SeqCst);
                }
                bar.set_message(format!(
                    "{} {}",
                    result.test_case_id,
                    result.status.as_str()
                ));
                bar.inc(1);
                result
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut results = results;
    results.sort_by_key(|r| r.case_index);
    results
}

async fn execute_with_retry(
    executor: &Executor,
    mut job: Job,
    package_root: &Path,
    retry: RetryPolicy,
) -> JobResult {
    let mut previous: Vec<skilleval::executor::Attempt> = Vec::new();
    loop {
        let mut result = executor.execute(&job, package_root).await;
        let transient = result.status == CaseStatus::Errored
            && result.error.as_ref().is_some_and(|e| e.is_transient());
        if !transient || job.attempt >= retry.max_attempts {
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
            .unwrap_or_else(|| skilleval::grade::Fault::transient("unknown"));
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
