//! Which model providers `skilleval run` may use, and with what response cache.
//!
//! Configuration, later sources winning: `--providers FILE`, else a `skilleval.toml` in the skill
//! folder, else one in the working directory; then the `SKILLEVAL_PROVIDER_*` variables, which
//! add a provider named `env` and make it the default. An API key alone never configures a
//! provider (a stray `OPENAI_API_KEY` in CI spends nothing); keys are read from the variable a
//! provider names in `api_key_env`, once, when its client is built.
//!
//! A `skilleval.toml` inside the skill folder travels with the skill, so it is not trusted with
//! keys: a provider there that reads a key must use its kind's public endpoint or a loopback
//! address, else the file must be passed explicitly with `--providers` (otherwise a downloaded
//! skill could send your key to a server of its choosing).
//!
//! The response cache is `--cache-dir`, else `$XDG_CACHE_HOME/skilleval/llm` or
//! `~/.cache/skilleval/llm`, else `<out>/.cache/llm`; `--no-cache` turns it off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use skilleval_providers::{
    ConfigError, DirCache, NoCache, ProviderClients, Providers, ResponseCache,
};

use crate::RunArgs;

/// The file name looked for in the skill folder and the working directory.
pub const PROVIDERS_FILE: &str = "skilleval.toml";

/// Providers ready to use.
pub struct LlmSetup {
    pub clients: Arc<ProviderClients>,
    /// Where the configuration came from, for the run's header line.
    pub source: String,
    /// The cache folder, `None` with `--no-cache`.
    pub cache_dir: Option<PathBuf>,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok()
}

/// Whether a base URL is a loopback address (a local vLLM, Ollama or llama.cpp server).
fn is_loopback(url: &str) -> bool {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let host = rest.split(['/', '?']).next().unwrap_or_default();
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let host = if host.starts_with('[') {
        host.split(']')
            .next()
            .map(|h| h.trim_start_matches('['))
            .unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or_default()
    };
    host == "localhost" || host == "::1" || host.starts_with("127.")
}

/// Refuses a skill-folder file that would send a key to an arbitrary server.
fn check_untrusted(providers: &Providers, file: &Path) -> Result<(), String> {
    for p in providers.providers.values() {
        let public = p.base_url.trim().is_empty() || p.base_url() == p.kind.default_base_url();
        if p.api_key_env.is_some() && !public && !is_loopback(p.base_url()) {
            return Err(format!(
                "{}: provider `{}` would send the key in ${} to {}; a skilleval.toml inside the skill folder may not do that. \
                 If you trust this file, pass it explicitly: --providers {}",
                file.display(),
                p.name,
                p.api_key_env.as_deref().unwrap_or_default(),
                p.base_url(),
                file.display()
            ));
        }
    }
    Ok(())
}

fn read_file(path: &Path) -> Result<Providers, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Providers::from_toml_str(&path.display().to_string(), &text).map_err(|e| e.to_string())
}

/// The flags that say which providers and response cache a command uses: one definition,
/// flattened into every command that calls a model (`run`, `rescore`, `init`, `collisions`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ProviderFlags {
    /// Model providers file (TOML; default: skilleval.toml in the skill folder, else in the
    /// working directory). SKILLEVAL_PROVIDER_* variables add one (see docs/providers.md).
    #[arg(long, value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// Send every model request; neither read nor write the response cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Response cache folder (default: ~/.cache/skilleval/llm).
    #[arg(long, value_name = "DIR", env = "SKILLEVAL_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
}

/// Reads the provider configuration; `Ok(None)` when there is none.
pub fn load(args: &RunArgs, skill_dir: &Path, out_dir: &Path) -> Result<Option<LlmSetup>, String> {
    load_with(&args.provider, skill_dir, out_dir)
}

/// [`load`] for any command's options.
pub fn load_with(
    args: &ProviderFlags,
    skill_dir: &Path,
    out_dir: &Path,
) -> Result<Option<LlmSetup>, String> {
    let mut sources = Vec::new();
    let mut providers = match args.providers.as_deref() {
        Some(path) => {
            sources.push(path.display().to_string());
            read_file(path)?
        }
        None => {
            let in_skill = skill_dir.join(PROVIDERS_FILE);
            let in_cwd = PathBuf::from(PROVIDERS_FILE);
            if in_skill.is_file() {
                let p = read_file(&in_skill)?;
                check_untrusted(&p, &in_skill)?;
                sources.push(in_skill.display().to_string());
                p
            } else if in_cwd.is_file() {
                sources.push(in_cwd.display().to_string());
                read_file(&in_cwd)?
            } else {
                Providers::default()
            }
        }
    };
    if let Some(p) = Providers::from_env(env).map_err(|e| e.to_string())? {
        sources.push("SKILLEVAL_PROVIDER_* variables".into());
        providers.insert(p, true);
    }
    if providers.is_empty() {
        return Ok(None);
    }
    let cache_dir = if args.no_cache {
        None
    } else {
        Some(
            args.cache_dir
                .clone()
                .or_else(|| DirCache::default_dir(env))
                .unwrap_or_else(|| out_dir.join(".cache").join("llm")),
        )
    };
    let cache: Arc<dyn ResponseCache> = match &cache_dir {
        Some(dir) => Arc::new(DirCache::new(dir.clone())),
        None => Arc::new(NoCache),
    };
    let clients = ProviderClients::connect(&providers, &cache, None).map_err(|e| match e {
        ConfigError::MissingKey { .. } => e.to_string(),
        other => format!("provider configuration: {other}"),
    })?;
    Ok(Some(LlmSetup {
        clients: Arc::new(clients),
        source: sources.join(" + "),
        cache_dir,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for url in [
            "http://localhost:11434/v1",
            "http://127.0.0.1:8000/v1",
            "http://[::1]:8080/v1",
            "https://user@localhost/v1",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "https://api.example.com/v1",
            "http://localhost.evil.com/v1",
            "http://10.0.0.1/v1",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }

    #[test]
    fn a_skill_folder_file_may_not_send_keys_elsewhere() {
        let text = "[providers.x]\nbase_url = \"https://collector.example.com/v1\"\nmodel = \"m\"\napi_key_env = \"OPENAI_API_KEY\"\n";
        let p = Providers::from_toml_str("skilleval.toml", text).expect("parses");
        let err = check_untrusted(&p, Path::new("skill/skilleval.toml")).expect_err("refused");
        assert!(err.contains("--providers skill/skilleval.toml"), "{err}");
        let local = "[providers.x]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"m\"\napi_key_env = \"K\"\n";
        assert!(check_untrusted(
            &Providers::from_toml_str("f", local).expect("parses"),
            Path::new("f")
        )
        .is_ok());
        let public = "[providers.x]\nkind = \"anthropic\"\nmodel = \"m\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n";
        assert!(check_untrusted(
            &Providers::from_toml_str("f", public).expect("parses"),
            Path::new("f")
        )
        .is_ok());
    }
}
