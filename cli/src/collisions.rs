//! `skilleval collisions ./skill --catalogue DIR`: which skills of a local catalogue (a folder
//! of skill folders) steal the skill's trigger queries, and which of theirs it steals.
//!
//! The same code as the coordinator runs after an upload: the nearest `--neighbours` catalogue
//! skills by description ([`skilleval_execution::catalogue::nearest`]: embeddings when the
//! configured embeddings provider has an `embedding_model`, else the lexical fallback), then
//! every should-trigger query of the skill and of those neighbours put to the judge provider
//! with all of them in the lineup, and the collision matrix of
//! [`skilleval_analysis::collisions`]. With `--max-share` it gates like the service's
//! `gate=no_collision`: exit 1 when the skill takes more than that share of a neighbour's
//! query runs.
//!
//! With `--agent` each run gives the query to the `agent` runner instead (the skill's package
//! at `/skill`, the neighbours as decoys, in the sandbox) and the pick is the skill whose
//! `SKILL.md` the agent opened first ([`catalogue::Picker::Agent`]). A machine without a
//! working sandbox is a configuration problem (exit 2, naming what to install), checked before
//! any model is asked.

use std::path::{Path, PathBuf};

use clap::Args;
use skilleval_analysis::collisions::{self, CollisionGate, CollisionMatrix};
use skilleval_execution::catalogue::{self, CatalogueSkill, Picker, DEFAULT_NEIGHBOURS};
use skilleval_execution::triggers::{AgentTriggers, SkillCard};
use skilleval_model::package::skill_md::SKILL_MD;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_providers::Purpose;
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy};

use crate::providers::{self, ProviderFlags};
use crate::{EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS};

#[derive(Debug, Clone, Args)]
pub struct CollisionsArgs {
    /// The skill folder or ZIP.
    pub path: PathBuf,
    /// A folder of skill folders (each with its SKILL.md and trigger queries).
    #[arg(long, value_name = "DIR")]
    pub catalogue: PathBuf,
    /// How many of the nearest catalogue skills become decoys (1 to 50).
    #[arg(long, default_value_t = DEFAULT_NEIGHBOURS as u64, value_parser = clap::value_parser!(u64).range(1..=50))]
    pub neighbours: u64,
    /// Runs per query (1 to 10).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub runs: u32,
    /// Gate: exit 1 when the skill takes more than this share (0 to 1) of a neighbour's
    /// query runs.
    #[arg(long, value_name = "SHARE")]
    pub max_share: Option<f64>,
    /// Compare descriptions lexically even when an embeddings provider is configured.
    #[arg(long)]
    pub lexical: bool,
    /// Print the matrix (and gate) as JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// `--providers`, `--no-cache`, `--cache-dir`, as for `run`.
    #[command(flatten)]
    pub provider: ProviderFlags,
    /// Agent mode: give each query to the `agent` runner (the skill at /skill, the neighbours
    /// as decoys, in the sandbox) and count the SKILL.md it opens first as its pick.
    #[arg(long)]
    pub agent: bool,
    /// Agent mode: model requests per run (1 to 20); the agent only has to open a skill.
    #[arg(long, default_value_t = AGENT_TURNS, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=20), requires = "agent")]
    pub max_turns: u32,
    /// Agent mode: seconds one run may take (1 to 600).
    #[arg(long, default_value_t = 120, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=600), requires = "agent")]
    pub run_timeout: u64,
    /// Agent mode: run the agent's tools without bubblewrap when it is not installed (NOT
    /// isolated).
    #[arg(long, env = "SKILLEVAL_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    /// The bubblewrap binary (as for `run`).
    #[arg(long, env = "SKILLEVAL_BWRAP", value_name = "PATH")]
    pub bwrap: Option<PathBuf>,
}

/// Model turns of one agent-mode run when not set: enough to look around and open a skill
/// (the same as `run --trigger-mode agent`).
pub const AGENT_TURNS: u32 = 4;

/// Runs `skilleval collisions`; returns the exit code.
pub async fn collisions(args: &CollisionsArgs) -> u8 {
    match steps(args).await {
        Ok((matrix, gate)) => {
            if args.json {
                let out = serde_json::json!({"matrix": matrix, "gate": gate});
                println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            } else {
                print!("{}", collisions::markdown(&matrix, gate.as_ref()));
            }
            match gate {
                Some(g) if !g.passed => EXIT_FAIL,
                _ => EXIT_PASS,
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

fn open(path: &Path) -> Result<CatalogueSkill, String> {
    open_package(path).map(|(skill, _)| skill)
}

/// The skill and its package (which holds a ZIP's extracted files while it lives).
fn open_package(path: &Path) -> Result<(CatalogueSkill, Package), String> {
    let package = Package::open(path, &PackageLimits::default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let skill = CatalogueSkill {
        card: SkillCard::new(&package.manifest.name, &package.manifest.description),
        queries: package.triggers.clone(),
    };
    Ok((skill, package))
}

/// Every skill folder directly under `dir` (a folder with a `SKILL.md`).
fn read_catalogue(dir: &Path) -> Result<Vec<CatalogueSkill>, String> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("--catalogue {}: cannot read the folder: {e}", dir.display()))?;
    let mut folders: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join(SKILL_MD).is_file())
        .collect();
    folders.sort();
    if folders.is_empty() {
        return Err(format!(
            "--catalogue {}: holds no skill folder (a folder with a {SKILL_MD})",
            dir.display()
        ));
    }
    folders.iter().map(|p| open(p)).collect()
}

/// The picker the flags ask for; agent mode refuses a machine without a working sandbox.
fn picker(args: &CollisionsArgs, package_root: &Path) -> Result<Picker, String> {
    if !args.agent {
        return Ok(Picker::Model);
    }
    let sandbox = Sandbox::detect(SandboxPolicy {
        allow_unsandboxed: args.allow_unsandboxed,
        bwrap: args.bwrap.clone(),
        ..SandboxPolicy::default()
    });
    if sandbox.mode() == SandboxMode::Refusing {
        let reason = sandbox
            .unavailable_reason()
            .unwrap_or_else(|| "bubblewrap is not usable".to_string());
        return Err(format!(
            "--agent runs the agent's tools in a sandbox, and this machine has no working sandbox: {reason}.\n\
             Install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install bubblewrap`), \
             or pass --allow-unsandboxed to run them WITHOUT isolation."
        ));
    }
    Ok(Picker::Agent(AgentTriggers {
        sandbox: std::sync::Arc::new(sandbox),
        package_root: package_root.to_path_buf(),
        max_turns: args.max_turns,
        timeout: std::time::Duration::from_secs(args.run_timeout),
    }))
}

async fn steps(args: &CollisionsArgs) -> Result<(CollisionMatrix, Option<CollisionGate>), String> {
    if let Some(share) = args.max_share {
        if !(0.0..=1.0).contains(&share) {
            return Err("--max-share: must lie between 0 and 1".into());
        }
    }
    // `package` lives until the eval is done: the agent reads a ZIP's files from it.
    let (skill, package) = open_package(&args.path)?;
    // Before any model is asked: agent mode needs the sandbox.
    let picker = picker(args, package.root())?;
    if !skill.queries.iter().any(|q| q.should_trigger) {
        return Err(format!(
            "{}: has no should-trigger query (evals/triggers.json); a collision eval puts the skill's own queries to the model",
            args.path.display()
        ));
    }
    let catalogue = read_catalogue(&args.catalogue)?;
    let out_dir = std::env::temp_dir();
    let setup = providers::load_with(&args.provider, &args.path, &out_dir)?
    .ok_or("collisions needs a model provider (--providers FILE or SKILLEVAL_PROVIDER_* variables) to pick skills")?;
    let judge = setup.clients.pick(None, Purpose::Judge)?;
    let embedder = if args.lexical {
        None
    } else {
        setup
            .clients
            .pick(None, Purpose::Embed)
            .ok()
            .filter(|c| c.config().embedding_model.is_some())
    };
    let cards: Vec<SkillCard> = catalogue.iter().map(|c| c.card.clone()).collect();
    let (neighbours, method, _) = catalogue::nearest(
        embedder.as_deref(),
        &skill.card,
        &cards,
        usize::try_from(args.neighbours).unwrap_or(DEFAULT_NEIGHBOURS),
    )
    .await
    .map_err(|f| format!("embedding the descriptions: {f}"))?;
    let decoys: Vec<CatalogueSkill> = neighbours
        .iter()
        .filter_map(|n| catalogue.iter().find(|c| c.card.name == n.name).cloned())
        .collect();
    // Agent mode produces (the `agent` runner's provider); model mode judges, as before.
    let client = match &picker {
        Picker::Agent(_) => setup.clients.pick(None, Purpose::Produce)?,
        Picker::Model => judge,
    };
    let run = catalogue::evaluate_catalogue(&client, &skill, &decoys, args.runs, 4, &picker).await;
    let matrix = collisions::matrix(&run, &neighbours, method, |_| false);
    let gate = args.max_share.map(|s| collisions::gate(&matrix, s));
    Ok((matrix, gate))
}
