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

use std::path::{Path, PathBuf};

use clap::Args;
use skilleval_analysis::collisions::{self, CollisionGate, CollisionMatrix};
use skilleval_execution::catalogue::{self, CatalogueSkill, DEFAULT_NEIGHBOURS};
use skilleval_execution::triggers::SkillCard;
use skilleval_model::package::skill_md::SKILL_MD;
use skilleval_model::package::{Package, PackageLimits};
use skilleval_providers::Purpose;

use crate::providers::{self, ProviderOptions};
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
    /// Model providers file (as for `run`; SKILLEVAL_PROVIDER_* variables add one).
    #[arg(long, value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// Send requests to the model even when the response cache has them.
    #[arg(long)]
    pub no_cache: bool,
    /// Response cache folder (default: ~/.cache/skilleval/llm).
    #[arg(long, value_name = "DIR", env = "SKILLEVAL_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

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
    let package = Package::open(path, &PackageLimits::default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(CatalogueSkill {
        card: SkillCard::new(&package.manifest.name, &package.manifest.description),
        queries: package.triggers,
    })
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

async fn steps(args: &CollisionsArgs) -> Result<(CollisionMatrix, Option<CollisionGate>), String> {
    if let Some(share) = args.max_share {
        if !(0.0..=1.0).contains(&share) {
            return Err("--max-share: must lie between 0 and 1".into());
        }
    }
    let skill = open(&args.path)?;
    if !skill.queries.iter().any(|q| q.should_trigger) {
        return Err(format!(
            "{}: has no should-trigger query (evals/triggers.json); a collision eval puts the skill's own queries to the model",
            args.path.display()
        ));
    }
    let catalogue = read_catalogue(&args.catalogue)?;
    let out_dir = std::env::temp_dir();
    let setup = providers::load_with(
        ProviderOptions {
            providers: args.providers.as_deref(),
            no_cache: args.no_cache,
            cache_dir: args.cache_dir.as_deref(),
        },
        &args.path,
        &out_dir,
    )?
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
    let run = catalogue::evaluate_catalogue(&judge, &skill, &decoys, args.runs, 4).await;
    let matrix = collisions::matrix(&run, &neighbours, method, |_| false);
    let gate = args.max_share.map(|s| collisions::gate(&matrix, s));
    Ok((matrix, gate))
}
