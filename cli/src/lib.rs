//! The `skilleval` command line: evaluate a skill locally (`run`), check it without running
//! (`validate`), write a first eval definition for a skill that has none (`init`), compare two local runs (`compare`), estimate a run before it starts (`plan`),
//! hand a skill to a skilleval server (`submit`), grade a log of its production samples with
//! its monitor (`monitor`), or send such a log to a server (`samples push`), write a stored run
//! as skill-creator's files (`export --skill-creator`) and send back the reviews written in
//! skill-creator's viewer (`feedback push`), and list a server's skills and runs (`skills
//! list`, `runs list`).
//!
//! Local runs use the same domain crates' code path as the service's workers: open and
//! validate the package, plan one job per case, execute jobs on an in-process pool, summarise,
//! render the report and write the skill-creator compatible files.
//!
//! Exit codes: 0 the verdict (or `compare`'s gate) is `pass`, 1 it is `fail`, 2 bad input or
//! configuration, 3 the skill has no eval definition (`skilleval init` writes a first one).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub mod collisions;
pub mod compare;
pub mod export;
pub mod init;
pub mod lists;
pub mod matrix;
pub mod monitor;
pub mod plan;
pub mod providers;
pub mod run;
pub mod samples;
pub mod sandbox_check;
pub mod submit;
pub mod table;
pub mod validate;
pub mod variants;
pub mod view;

/// The Zod converter's folder (`expected.zodSchema`): `tools/zod` in the current directory or
/// the nearest of its parents that has one (a checkout of this repository, where
/// `scripts/test.sh` runs `npm ci` in it), else `tools/zod` as a relative path, which then
/// reports that the converter is not installed when a case needs it.
pub fn zod_dir() -> PathBuf {
    let relative = PathBuf::from("tools/zod");
    std::env::current_dir()
        .ok()
        .and_then(|cwd| {
            cwd.ancestors()
                .map(|dir| dir.join(&relative))
                .find(|dir| dir.join(skilleval_grading::zod::SCRIPT).is_file())
        })
        .unwrap_or(relative)
}

/// The verdict is `pass` (or `validate` found no error).
pub const EXIT_PASS: u8 = 0;
/// The verdict is `fail`.
pub const EXIT_FAIL: u8 = 1;
/// Bad input or configuration: the package, a flag, the server's answer.
pub const EXIT_BAD_INPUT: u8 = 2;
/// `validate` / `run`: the skill has no eval definition; `skilleval init` writes a first one.
pub const EXIT_NO_EVAL: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "skilleval",
    version,
    about = "Evaluate agent skills: locally, in CI, or on a skilleval server"
)]
pub struct Cli {
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Evaluate a skill folder or ZIP in-process and gate on the verdict.
    Run(RunArgs),
    /// Check a skill folder or ZIP without running it; lists every problem.
    Validate(ValidateArgs),
    /// Write a first eval definition (evals/evals.json and trigger queries) for a skill that
    /// has none, drafted from its SKILL.md (by the configured model, if any).
    Init(init::InitArgs),
    /// Upload a skill to a skilleval server; with --wait, follow the run and gate on its verdict.
    Submit(submit::SubmitArgs),
    /// Compare two local runs (eval/runs/<run-id> folders), or with --server two run or
    /// version ids on a server; exit 1 when the head regressed.
    Compare(compare::CompareArgs),
    /// Estimate a run before starting it: cases, model calls, cost, detectable drop.
    Plan(plan::PlanArgs),
    /// Grade a JSONL log of production samples with the skill's monitor; print the quality report.
    Monitor(monitor::MonitorArgs),
    /// Grade a local run's recorded outputs (eval/runs/<run-id>) against the skill's current
    /// definition, producing nothing again; writes a new run like `run`.
    Rescore(RescoreArgs),
    /// Production samples on a server: `samples push FILE.jsonl --server URL --skill NAME`.
    Samples(samples::SamplesArgs),
    /// Serve the run pages of a skill's local runs (eval/runs/) on 127.0.0.1, no services.
    View(view::ViewArgs),
    /// Write a stored run (a local eval/runs/<run-id>, or with --server a run id) as
    /// skill-creator's iteration folder: --skill-creator RUN OUT.
    Export(export::ExportArgs),
    /// Reviews written in skill-creator's viewer: `feedback push FEEDBACK.json --run ID --server URL`.
    Feedback(export::FeedbackArgs),
    /// A server's skills: `skills list --server URL [--search W] [--sort pass_rate] ...`.
    Skills(lists::SkillsArgs),
    /// A server's runs: `runs list --server URL [--skill NAME] [--status running] ...`.
    Runs(lists::RunsArgs),
    /// A server's model matrix: `matrix --server URL --skill a --skill b --model m1 --model m2`
    /// runs each skill's latest passing version with each model and prints which got worse;
    /// exit 1 when some cell is significantly worse than the skill's reference run.
    Matrix(matrix::MatrixArgs),
    /// Which skills of a local catalogue (a folder of skills) steal the skill's trigger
    /// queries, and whose it steals: `collisions ./skill --catalogue DIR`.
    Collisions(collisions::CollisionsArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RescoreArgs {
    /// The run whose outputs are graded again: an `eval/runs/<run-id>` folder.
    pub run_dir: PathBuf,
    /// The skill whose definition grades them, and every `run` option.
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The skill: a folder with SKILL.md, or a ZIP of one.
    pub path: PathBuf,
    /// `skilleval rescore`: the run folder whose recorded outputs are graded instead of
    /// producing new ones.
    #[arg(skip)]
    pub rescore_of: Option<PathBuf>,
    /// Cases in flight at once (default: the file's maxConcurrentTests, else 4; 1 when
    /// parallelExecution is false).
    #[arg(long, short = 'j')]
    pub concurrency: Option<usize>,
    /// Run only cases carrying this tag (repeatable: any of them).
    #[arg(long = "tag", short = 't')]
    pub tags: Vec<String>,
    /// Run only this case id (repeatable).
    #[arg(long = "case", short = 'c')]
    pub cases: Vec<String>,
    /// Run only the cases of this suite.
    #[arg(long)]
    pub suite: Option<String>,
    /// Print the full report in this format on stdout (`md` or `json`), or write it as one
    /// self-contained `report.html` in the output folder (`html`: `eval/report.html`).
    #[arg(long, short = 'f')]
    pub format: Option<skilleval_reports::ReportFormat>,
    /// Where run files go (`runs/<run-id>/…`, `benchmark.json`); default: the skill's `eval/`
    /// folder, or `./skilleval-runs/` for a ZIP.
    #[arg(long, short = 'o')]
    pub out: Option<PathBuf>,
    /// Override the definition's runner (`command`, `given`, `llm`).
    #[arg(long)]
    pub runner: Option<String>,
    /// Run untrusted scripts without bubblewrap when it is not installed (NOT isolated).
    #[arg(long, env = "SKILLEVAL_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// The bubblewrap binary (default: `bwrap` from /usr/bin, /bin, /usr/sbin, /sbin,
    /// /usr/local/bin, then PATH).
    #[arg(long, env = "SKILLEVAL_BWRAP", value_name = "PATH")]
    pub bwrap: Option<PathBuf>,
    /// The Python package index the environments of packages that declare dependencies are
    /// installed from (PEP 503 "simple" API; default: PyPI's).
    #[arg(long, env = "SKILLEVAL_INDEX_URL", value_name = "URL")]
    pub index_url: Option<String>,
    /// The npm registry those environments' Node packages come from (default: npm's).
    #[arg(long, env = "SKILLEVAL_NPM_REGISTRY", value_name = "URL")]
    pub npm_registry: Option<String>,
    /// Where built environments are cached (default: `skilleval-environments` in the
    /// temporary directory).
    #[arg(long, env = "SKILLEVAL_ENV_DIR", value_name = "DIR")]
    pub env_dir: Option<PathBuf>,
    /// Deliveries of a case whose fault is transient (timeouts, 429, 5xx), the first included.
    #[arg(long, default_value_t = 3)]
    pub max_attempts: u32,
    /// Write no run files (grading, benchmark.json, report).
    #[arg(long)]
    pub no_write: bool,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// `--providers`, `--no-cache`, `--cache-dir`.
    #[command(flatten)]
    pub provider: providers::ProviderFlags,
    /// Also run every case without the skill (the bare model) and report the uplift.
    #[arg(long)]
    pub baseline: bool,
    /// Attempts per case; reports pass@k and the spread of scores.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeats: u32,
    /// Stop starting cases once the run has spent this much (USD, producing + grading).
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// Stop starting cases once the run has used this many tokens (producing + grading).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Runs per trigger query (0: skip the trigger evals).
    #[arg(long, default_value_t = skilleval_execution::triggers::DEFAULT_RUNS_PER_QUERY, value_name = "N")]
    pub trigger_runs: u32,
    /// How trigger evals decide "triggered": `select` asks the model to name a skill from the
    /// catalogue; `agent` gives the query to the `agent` runner and counts an opened SKILL.md.
    #[arg(long, value_enum, default_value_t = TriggerMode::Select)]
    pub trigger_mode: TriggerMode,
}

/// See [`RunArgs::trigger_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TriggerMode {
    Select,
    Agent,
}

#[derive(Debug, Clone, Args)]
pub struct ValidateArgs {
    /// The skill: a folder with SKILL.md, or a ZIP of one.
    pub path: PathBuf,
    /// Print the problems as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs a parsed command line; returns the process exit code.
pub async fn dispatch(cli: Cli) -> u8 {
    match cli.command {
        Command::Run(args) => run::run(&args).await,
        Command::Validate(args) => validate::validate(&args),
        Command::Init(args) => init::init(&args).await,
        Command::Collisions(args) => collisions::collisions(&args).await,
        Command::Submit(args) => submit::submit(&args).await,
        Command::Compare(args) => compare::compare(&args).await,
        Command::Plan(args) => plan::plan(&args),
        Command::Monitor(args) => monitor::monitor(&args).await,
        Command::Rescore(args) => {
            let mut run_args = args.run;
            run_args.rescore_of = Some(args.run_dir);
            run::run(&run_args).await
        }
        Command::Samples(args) => samples::samples(&args).await,
        Command::View(args) => view::view(&args).await,
        Command::Export(args) => export::export(&args).await,
        Command::Feedback(args) => export::feedback(&args).await,
        Command::Skills(args) => lists::skills(&args).await,
        Command::Runs(args) => lists::runs(&args).await,
        Command::Matrix(args) => matrix::matrix(&args).await,
    }
}

/// Logs go to stderr so stdout stays the report; coloured only on a terminal.
pub fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
