//! `skilleval compare BASE HEAD`: two local runs (`eval/runs/<run-id>` folders) compared case by
//! case with the statistics of [`skilleval_analysis::compare`], printed as the Markdown table a pull
//! request comment can carry (or as `comparison.json`), gated on "no regression".
//!
//! Also [`record_run`]: what `skilleval run` writes so that a run can be compared later.

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use skilleval_analysis::compare::{self, CompareError, CompareOptions, RunSide};
use skilleval_analysis::summary::Verdict;
use skilleval_execution::result::JobResult;
use skilleval_model::package::Package;
use skilleval_providers::Purpose;
use skilleval_reports::artifacts::{self, ArtifactError, RunRecord};
use uuid::Uuid;

use crate::providers::LlmSetup;
use crate::{EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Gate {
    /// Exit 1 when the head is significantly worse than the base.
    #[value(name = "no_regression")]
    NoRegression,
    /// Report only; exit 0 whatever the comparison says.
    #[value(name = "none")]
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompareFormat {
    /// The Markdown comparison (a pull-request comment).
    Md,
    /// The `comparison.json` shape.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// The base run: an `eval/runs/<run-id>` folder written by `skilleval run` (with
    /// `--server`: a run id or a version id on that server).
    pub base: PathBuf,
    /// The head run, compared against the base.
    pub head: PathBuf,
    /// Compare on a skilleval server: BASE and HEAD are run or version ids there (a version
    /// stands for its latest completed run); the comparison is stored on the server.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: Option<String>,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// What stdout carries.
    #[arg(long, short = 'f', value_enum, default_value_t = CompareFormat::Md)]
    pub format: CompareFormat,
    /// Also write the comparison to FILE in the `comparison.json` shape.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The regression gate deciding the exit code.
    #[arg(long, value_enum, default_value_t = Gate::NoRegression)]
    pub gate: Gate,
    /// Compare cases whose definition, grader or judge model changed between the runs.
    #[arg(long)]
    pub force: bool,
    /// With --server: also judge each pair of outputs with the server's blind comparator.
    #[arg(long, requires = "server")]
    pub comparator: bool,
    /// The seed of the comparator's presentation orders (default: random, recorded).
    #[arg(long, requires = "comparator", value_name = "N")]
    pub comparator_seed: Option<u64>,
    /// Judge every pair in both orders (twice the calls).
    #[arg(long, requires = "comparator")]
    pub both_orders: bool,
}

/// Writes `run.json` and `results.jsonl` for a finished local run: every with-skill attempt
/// (repeats included, baseline attempts left out: they measure the bare model) and the
/// fingerprints of the package's definition under the run's judge model.
#[allow(clippy::too_many_arguments)]
pub fn record_run(
    run_dir: &Path,
    run_id: Uuid,
    package: &Package,
    llm: Option<&LlmSetup>,
    results: &[JobResult],
    repeats: u32,
    skill_path: &str,
    started: chrono::DateTime<chrono::Utc>,
) -> Result<RunRecord, ArtifactError> {
    let judge_model = llm
        .and_then(|setup| setup.clients.pick(None, Purpose::Judge).ok())
        .map(|client| client.config().model.clone());
    let inputs = package
        .config
        .test_cases
        .iter()
        .map(|c| {
            (
                c.id.clone(),
                artifacts::EvalInput {
                    prompt: c.input.prompt.clone(),
                    files: c.input.files.clone(),
                    assertions: c.expected.assertions.clone(),
                },
            )
        })
        .collect();
    let record = RunRecord {
        run_id,
        skill_name: package.manifest.name.clone(),
        skill_version: package
            .manifest
            .metadata
            .get("version")
            .and_then(|v| v.as_str().map(str::to_string)),
        description_hash: artifacts::description_hash(&package.manifest.description),
        package_hash: package.content_hash.clone(),
        judge_model: judge_model.clone(),
        repeats,
        timestamp: started,
        fingerprints: compare::fingerprints(&package.config, judge_model.as_deref()),
        inputs,
        skill_path: Some(skill_path.to_string()),
    };
    artifacts::write_run_record(run_dir, &record, results)?;
    Ok(record)
}

/// One side of a comparison from its run folder.
pub fn load_side(run_dir: &Path) -> Result<RunSide, ArtifactError> {
    let (record, results) = artifacts::read_run_record(run_dir)?;
    // What the table calls the side: the skill's version where SKILL.md states one, the run
    // otherwise (two runs of one version differ only by run id).
    let short = |s: &str| s.chars().take(8).collect::<String>();
    let version = serde_json::Value::String(match &record.skill_version {
        Some(v) => format!("{} {v} (run {})", record.skill_name, record.run_id),
        None => format!(
            "{} description {} (run {})",
            record.skill_name,
            short(&record.description_hash),
            record.run_id
        ),
    });
    Ok(RunSide::from_results(
        record.run_id.to_string(),
        version,
        &results,
        &record.fingerprints,
    ))
}

/// Runs `skilleval compare`; returns the exit code.
pub async fn compare(args: &CompareArgs) -> u8 {
    if let Some(server) = &args.server {
        return match on_server(args, server).await {
            Ok(comparison) => finish(args, &comparison),
            Err(message) => {
                eprintln!("error: {message}");
                EXIT_BAD_INPUT
            }
        };
    }
    let mut sides = Vec::with_capacity(2);
    for (which, dir) in [("BASE", &args.base), ("HEAD", &args.head)] {
        match load_side(dir) {
            Ok(side) => sides.push(side),
            Err(e) => {
                eprintln!(
                    "error: {which} {} is not a run folder skilleval can compare: {e}\n\
                     (give an eval/runs/<run-id> folder written by `skilleval run`)",
                    dir.display()
                );
                return EXIT_BAD_INPUT;
            }
        }
    }
    let (base, head) = (&sides[0], &sides[1]);
    let mut options = CompareOptions::new(Uuid::now_v7().to_string(), &base.run_id, &head.run_id);
    options.force = args.force;
    let comparison = match compare::compare(base, head, &options) {
        Ok(c) => c,
        Err(e @ CompareError::NotComparable { .. }) => {
            eprintln!("error: {e}: pass --force to compare them anyway");
            return EXIT_BAD_INPUT;
        }
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    finish(args, &comparison)
}

/// `POST /v1/comparisons` on the server; the comparison it answered.
async fn on_server(args: &CompareArgs, server: &str) -> Result<compare::Comparison, String> {
    let id = |which: &str, p: &Path| {
        let text = p.to_string_lossy();
        Uuid::parse_str(&text)
            .map_err(|_| format!("{which} `{text}` is not a run or version id (with --server)"))
    };
    let (base, head) = (id("BASE", &args.base)?, id("HEAD", &args.head)?);
    let url = format!("{}/v1/comparisons", server.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(120))
        .user_agent(concat!("skilleval-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let mut request = client.post(&url).json(&serde_json::json!({
        "base": base,
        "head": head,
        "force": args.force,
        "comparator": args.comparator,
        "comparator_seed": args.comparator_seed,
        "both_orders": args.both_orders,
    }));
    if let Some(token) = &args.token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {server}: {e}"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        let hint = if body["error"]["code"] == "not_comparable" {
            ": pass --force to compare them anyway"
        } else {
            ""
        };
        return Err(format!("the server answered {status}: {message}{hint}"));
    }
    serde_json::from_value(body).map_err(|e| format!("the server's comparison does not parse: {e}"))
}

/// Writes and prints the comparison; the exit code by the gate.
fn finish(args: &CompareArgs, comparison: &compare::Comparison) -> u8 {
    // Serialising plain data (numbers, strings, JSON values) cannot fail.
    let json = serde_json::to_string_pretty(comparison).unwrap_or_default() + "\n";
    if let Some(path) = &args.output {
        if let Err(e) = std::fs::write(path, &json) {
            eprintln!("error: could not write {}: {e}", path.display());
            return EXIT_BAD_INPUT;
        }
    }
    match args.format {
        CompareFormat::Md => print!("{}", compare::markdown(comparison)),
        CompareFormat::Json => print!("{json}"),
    }
    if !comparison.not_comparable.is_empty() {
        eprintln!(
            "note: {} case(s) changed their definition, grader or judge model{}",
            comparison.not_comparable.len(),
            if args.force {
                " (compared anyway: --force)"
            } else {
                " and are not compared (--force compares them)"
            }
        );
    }
    match (args.gate, comparison.gate.verdict) {
        (Gate::NoRegression, Verdict::Fail) => {
            eprintln!(
                "gate no_regression: fail ({})",
                comparison.gate.reasons.join("; ")
            );
            EXIT_FAIL
        }
        _ => EXIT_PASS,
    }
}
