//! `skilleval monitor FILE.jsonl PATH`: grade a log of production samples in-process with the
//! skill's `monitoring` section and print the quality report.
//!
//! The same steps as the service will take, without it: read the samples (a bad line is
//! reported and skipped), drop repeated `sample_id`s, apply the monitor's metadata filters, its
//! deterministic sampling and its hourly cap, turn each sampled item into a `given` job, grade
//! the jobs with the executor `skilleval run` uses, then summarise them into the quality report
//! and replay the monitor's alert rules over the log, hour by hour.
//!
//! Exit codes: 0 the report was produced, 2 bad input or configuration (no monitor, an invalid
//! package or monitor, an unreadable log, no readable sample).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use chrono::{Duration, Utc};
use clap::{Args, ValueEnum};
use skilleval_analysis::quality::{
    alert, graded_sample, quality, render, BucketSize, QualityQuery,
};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::monitor::{
    self, is_sampled, parse_jsonl, sample_job, CriteriaSelection, SampleJobContext,
};
use skilleval_execution::validate::validate;
use skilleval_model::grade::RetryPolicy;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_sandbox::{Sandbox, SandboxPolicy};
use uuid::Uuid;

use crate::run::{print_problems, report_package_error};
use crate::{providers, EXIT_BAD_INPUT, EXIT_PASS};

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MonitorFormat {
    Md,
    Json,
    Html,
}

#[derive(Debug, Clone, Args)]
pub struct MonitorArgs {
    /// The samples: JSON Lines, one `{sample_id, input, output, ...}` per line.
    pub samples: PathBuf,
    /// The skill: a folder with SKILL.md whose eval definition has a `monitoring` section, or a
    /// ZIP of one.
    pub path: PathBuf,
    /// Report format.
    #[arg(long, short = 'f', value_enum, default_value = "md")]
    pub format: MonitorFormat,
    /// Write the report to this file instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Bucket width.
    #[arg(long, default_value = "day")]
    pub bucket: BucketSize,
    /// Report only samples of this skill version.
    #[arg(long = "skill-version", value_name = "VERSION")]
    pub version: Option<String>,
    /// Judge by this criterion alone.
    #[arg(long)]
    pub criterion: Option<String>,
    /// Override the monitor's sample_rate (1 grades every sample).
    #[arg(long, value_name = "RATE")]
    pub sample_rate: Option<f64>,
    /// Samples graded at once.
    #[arg(long, short = 'j', default_value_t = 4)]
    pub concurrency: usize,
    /// Run custom graders without bubblewrap when it is not installed (NOT isolated).
    #[arg(long, env = "SKILLEVAL_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// Model providers file for model-backed criteria (as `skilleval run --providers`).
    #[arg(long, value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Grades the log and prints the report; returns the exit code.
pub async fn monitor(args: &MonitorArgs) -> u8 {
    match monitor_inner(args).await {
        Ok(()) => EXIT_PASS,
        Err(code) => code,
    }
}

fn bad(message: impl std::fmt::Display) -> u8 {
    eprintln!("error: {message}");
    EXIT_BAD_INPUT
}

/// The provider setup `skilleval run` would load for the same flags.
fn llm_setup(
    args: &MonitorArgs,
    root: &std::path::Path,
) -> Result<Option<providers::LlmSetup>, u8> {
    let mut argv = vec![
        "skilleval".to_string(),
        "run".to_string(),
        args.path.display().to_string(),
    ];
    if let Some(p) = &args.providers {
        argv.push("--providers".into());
        argv.push(p.display().to_string());
    }
    let run_args = match <crate::Cli as clap::Parser>::try_parse_from(argv) {
        Ok(crate::Cli {
            command: crate::Command::Run(a),
            ..
        }) => a,
        Ok(_) => return Err(bad("internal: provider flags did not parse as a run")),
        Err(e) => return Err(bad(e)),
    };
    providers::load(&run_args, root, root).map_err(bad)
}

async fn monitor_inner(args: &MonitorArgs) -> Result<(), u8> {
    if let Some(rate) = args.sample_rate {
        if !(0.0..=1.0).contains(&rate) {
            return Err(bad(format!(
                "--sample-rate must be between 0 and 1, not {rate}"
            )));
        }
    }
    let package = Package::open(&args.path, &PackageLimits::default())
        .map_err(|e| report_package_error(&args.path, &e))?;
    let llm = llm_setup(args, package.root())?;
    let executor = ExecutorBuilder::new()
        .providers(llm.as_ref().map(|setup| setup.clients.clone()))
        .sandbox(Sandbox::detect(SandboxPolicy {
            allow_unsandboxed: args.allow_unsandboxed,
            ..SandboxPolicy::default()
        }))
        .build();
    let registry = executor.strategies();
    let validation = validate(&package, registry);
    if !validation.is_ok() {
        print_problems(&args.path, &validation.problems);
        return Err(EXIT_BAD_INPUT);
    }
    let monitor = match monitor::from_package(&package, registry) {
        Ok(Some((m, _))) => m,
        Ok(None) => {
            return Err(bad(format!(
                "{}: the eval definition has no `monitoring` section (see docs/monitoring.md)",
                args.path.display()
            )))
        }
        Err(problems) => {
            print_problems(&args.path, &problems);
            return Err(EXIT_BAD_INPUT);
        }
    };
    let skill = package.name().unwrap_or("skill").to_string();

    let text = std::fs::read_to_string(&args.samples)
        .map_err(|e| bad(format!("cannot read {}: {e}", args.samples.display())))?;
    let parsed = parse_jsonl(&text);
    for e in &parsed.errors {
        eprintln!(
            "{}:{}: {}{}",
            args.samples.display(),
            e.index + 1,
            if e.pointer.is_empty() {
                String::new()
            } else {
                format!("{}: ", e.pointer)
            },
            e.message
        );
    }
    if parsed.samples.is_empty() {
        return Err(bad(format!(
            "{}: no readable sample ({} line(s) refused)",
            args.samples.display(),
            parsed.errors.len()
        )));
    }

    // As the service will: a repeated id is a duplicate, the filters and the sampling decide
    // which of the rest are graded, the hourly cap drops the excess.
    let rate = args.sample_rate.unwrap_or(monitor.sample_rate);
    let mut seen = HashSet::new();
    let (mut duplicates, mut filtered, mut unsampled, mut capped) = (0, 0, 0, 0);
    let mut per_hour: BTreeMap<i64, u64> = BTreeMap::new();
    let received_at = Utc::now();
    let mut chosen = Vec::new();
    for (_, sample) in parsed.samples {
        if !seen.insert(sample.sample_id.clone()) {
            duplicates += 1;
        } else if !monitor.accepts_metadata(sample.metadata.as_ref()) {
            filtered += 1;
        } else if !is_sampled(&skill, &sample.sample_id, rate) {
            unsampled += 1;
        } else {
            let hour = sample
                .observed_at
                .unwrap_or(received_at)
                .timestamp()
                .div_euclid(3600);
            let taken = per_hour.entry(hour).or_default();
            if monitor
                .max_samples_per_hour
                .is_some_and(|cap| *taken >= cap)
            {
                capped += 1;
            } else {
                *taken += 1;
                chosen.push(sample);
            }
        }
    }
    let selection = if llm.is_some() {
        CriteriaSelection::All
    } else {
        CriteriaSelection::WithoutModel
    };
    let model_criteria: Vec<&str> = monitor
        .criteria
        .iter()
        .filter(|c| c.needs_model())
        .map(|c| c.name.as_str())
        .collect();
    if selection == CriteriaSelection::WithoutModel && !model_criteria.is_empty() {
        eprintln!(
            "note: criteria {} need a model provider and are not graded here (none is configured; see docs/providers.md)",
            model_criteria.join(", ")
        );
    }
    let ctx = SampleJobContext {
        run_id: Uuid::now_v7(),
        package_hash: &package.content_hash,
        monitor_revision: 1,
        selection,
    };
    let jobs: Vec<_> = chosen
        .iter()
        .enumerate()
        .filter_map(|(i, s)| sample_job(&monitor, s, u32::try_from(i).unwrap_or(u32::MAX), &ctx))
        .collect();
    eprintln!(
        "{} sample(s) read, {} refused, {duplicates} duplicate(s), {filtered} filtered out, {unsampled} not sampled (rate {rate}), {capped} over max_samples_per_hour: grading {}",
        seen.len() + duplicates,
        parsed.errors.len(),
        jobs.len()
    );

    crate::sandbox_check::require(&jobs, executor.sandbox()).map_err(bad)?;
    let results = crate::run::execute_all(
        &executor,
        jobs.clone(),
        Vec::new(),
        package.root(),
        args.concurrency.max(1),
        false,
        RetryPolicy::default(),
        args.quiet,
        None,
    )
    .await;
    let graded: Vec<_> = jobs
        .iter()
        .zip(&results)
        .map(|(job, result)| graded_sample(job, result, received_at))
        .collect();
    for r in results.iter().filter(|r| r.error.is_some()).take(5) {
        if let Some(e) = &r.error {
            eprintln!("  not graded: {}: {e}", r.test_case_id);
        }
    }

    let query = QualityQuery {
        bucket: args.bucket,
        version: args.version.clone(),
        criterion: args.criterion.clone(),
        ..QualityQuery::default()
    };
    let report = quality(&skill, &graded, &query).map_err(bad)?;
    let mut alerts_md = String::new();
    if let (Some(first), Some(last)) = (
        graded.iter().map(|g| g.observed_at).min(),
        graded.iter().map(|g| g.observed_at).max(),
    ) {
        for rule in &monitor.alerts {
            let (tracker, transitions) = alert::replay(
                rule,
                &graded,
                first + Duration::hours(1),
                last + Duration::hours(1),
                Duration::hours(1),
            );
            let line = format!(
                "alert `{}`: {} at the end of the log, {} transition(s)",
                rule.name,
                tracker.state.as_str(),
                transitions.len()
            );
            eprintln!("{line}");
            alerts_md.push_str(&format!("- {line}\n"));
            for t in &transitions {
                let detail = format!(
                    "{}: {} → {} (window {}/{} vs baseline {}/{})",
                    t.evaluation.at.format("%Y-%m-%d %H:%M UTC"),
                    t.from.as_str(),
                    t.to.as_str(),
                    t.evaluation.window.passed,
                    t.evaluation.window.n,
                    t.evaluation.baseline.passed,
                    t.evaluation.baseline.n
                );
                eprintln!("  {detail}");
                alerts_md.push_str(&format!("  - {detail}\n"));
            }
        }
    }
    let body = match args.format {
        MonitorFormat::Md => {
            let mut md = render::markdown(&report);
            if !alerts_md.is_empty() {
                md.push_str("\n**Alerts** (replayed hourly over the log):\n\n");
                md.push_str(&alerts_md);
            }
            md
        }
        MonitorFormat::Json => serde_json::to_string_pretty(&report).map_err(bad)? + "\n",
        MonitorFormat::Html => render::html(&report),
    };
    match &args.out {
        Some(path) => std::fs::write(path, body)
            .map_err(|e| bad(format!("cannot write {}: {e}", path.display())))?,
        None => print!("{body}"),
    }
    Ok(())
}
