//! `skilleval init ./skill`: a first eval definition for a skill that has none.
//!
//! Writes `evals/evals.json` (skill-creator's shape) and, unless the skill has trigger queries
//! already, `evals/triggers.json`, drafted from `SKILL.md` by
//! [`skilleval_execution::draft`]: by the configured model when there is one (prompts, expected
//! outputs, expectations, should- and should-not-trigger queries), else from the text alone
//! (prompts and should-trigger queries, expectations left for the author: validation refuses a
//! case without any and says what to add). Then it validates what it wrote and says what is
//! left to do. It never overwrites an eval definition.

use std::path::{Path, PathBuf};

use clap::Args;
use skilleval_execution::draft::{self, Draft};
use skilleval_execution::validate::validate;
use skilleval_grading::StrategyRegistry;
use skilleval_model::package::skill_md::{self, SKILL_MD};
use skilleval_model::package::{Package, PackageLimits, EVAL_FILES, TRIGGER_FILES};

use crate::providers::{self, ProviderFlags};
use crate::{EXIT_BAD_INPUT, EXIT_PASS};

/// Where `init` writes the definition.
pub const EVALS_FILE: &str = "evals/evals.json";
/// Where `init` writes the trigger queries.
pub const TRIGGERS_FILE: &str = "evals/triggers.json";

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// The skill folder (with its SKILL.md).
    pub path: PathBuf,
    /// Draft from SKILL.md alone, even when a model provider is configured.
    #[arg(long)]
    pub no_model: bool,
    /// `--providers`, `--no-cache`, `--cache-dir`, as for `run`.
    #[command(flatten)]
    pub provider: ProviderFlags,
}

/// Why `init` wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{}: {message}", path.display())]
    Skill { path: PathBuf, message: String },
    #[error("{}: already has an eval definition ({file}); init writes one only for a skill that has none", path.display())]
    HasEval { path: PathBuf, file: String },
    #[error("{0}")]
    Provider(String),
    #[error("the model could not draft the evals: {0}")]
    Model(String),
    #[error("could not write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Runs `skilleval init`; returns the exit code.
pub async fn init(args: &InitArgs) -> u8 {
    match init_steps(args).await {
        Ok(()) => EXIT_PASS,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

async fn init_steps(args: &InitArgs) -> Result<(), InitError> {
    let root = &args.path;
    let skill_error = |message: String| InitError::Skill {
        path: root.clone(),
        message,
    };
    if !root.is_dir() {
        return Err(skill_error(
            "not a folder: init writes into a skill folder (unzip a package first)".into(),
        ));
    }
    let text = std::fs::read_to_string(root.join(SKILL_MD))
        .map_err(|e| skill_error(format!("cannot read SKILL.md: {e}")))?;
    let (manifest, problems) = skill_md::parse(&text);
    let Some(manifest) = manifest else {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(skill_error(format!(
            "SKILL.md has no front matter to draft from: {}",
            listed.join("; ")
        )));
    };
    if let Some(file) = EVAL_FILES.iter().find(|f| root.join(f).is_file()) {
        return Err(InitError::HasEval {
            path: root.clone(),
            file: (*file).to_string(),
        });
    }
    let draft = draft_for(args, &manifest).await?;
    let evals_path = root.join(EVALS_FILE);
    write_json(&evals_path, &draft.evals_json())?;
    println!(
        "wrote {} ({} eval(s){})",
        evals_path.display(),
        draft.evals.len(),
        draft
            .model
            .as_ref()
            .map_or(" drafted from SKILL.md".to_string(), |m| format!(
                " drafted by {m}"
            ))
    );
    match TRIGGER_FILES.iter().find(|f| root.join(f).is_file()) {
        Some(existing) => println!("kept {existing}: the skill has trigger queries already"),
        None => {
            let path = root.join(TRIGGERS_FILE);
            write_json(&path, &draft.triggers_json())?;
            println!(
                "wrote {} ({} trigger queries)",
                path.display(),
                draft.triggers.len()
            );
        }
    }
    next_steps(root, &draft);
    Ok(())
}

/// The draft: by the model when one is configured (and not `--no-model`), else from the text.
async fn draft_for(
    args: &InitArgs,
    manifest: &skill_md::SkillManifest,
) -> Result<Draft, InitError> {
    if args.no_model {
        return Ok(draft::from_skill_md(manifest));
    }
    let setup = providers::load_with(&args.provider, &args.path, &args.path.join("eval"))
        .map_err(InitError::Provider)?;
    let Some(setup) = setup else {
        return Ok(draft::from_skill_md(manifest));
    };
    let client = setup
        .clients
        .pick(None, skilleval_providers::Purpose::Produce)
        .map_err(InitError::Provider)?;
    eprintln!("asking {} to draft the evals…", client.config().model);
    draft::with_model(&client, manifest)
        .await
        .map_err(|fault| InitError::Model(fault.to_string()))
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<(), InitError> {
    let write = || -> std::io::Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(
            path,
            serde_json::to_string_pretty(value).unwrap_or_default() + "\n",
        )
    };
    write().map_err(|source| InitError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Validates what was written and says what is left to do.
fn next_steps(root: &Path, draft: &Draft) {
    let missing = draft.evals_without_expectations();
    if missing > 0 {
        println!(
            "\nNext: write the expectations. Each eval in {EVALS_FILE} has an empty `expectations` list: add \
             the statements a good output must satisfy, one string each (for example \"The summary lists \
             the decision and its owner\"), and edit the prompts to be what a real user would ask. \
             Replace the should_trigger: false queries in {TRIGGERS_FILE} with near misses (requests that \
             share words with the skill but need something else). Until then `skilleval validate` refuses \
             the {missing} eval(s) without expectations and says where."
        );
        return;
    }
    match Package::open(root, &PackageLimits::default()) {
        Ok(package) => {
            let v = validate(&package, &StrategyRegistry::builtin().build());
            if v.is_ok() {
                println!(
                    "\nThe definition validates ({} case(s)). Read and edit it, then: skilleval run {}",
                    package.config.test_cases.len(),
                    root.display()
                );
            } else {
                println!("\nThe drafted definition has problems to fix:");
                for p in v.problems.iter().filter(|p| p.is_error()) {
                    println!("  {p}");
                }
            }
        }
        Err(e) => println!("\nThe package does not open yet: {e}"),
    }
}
