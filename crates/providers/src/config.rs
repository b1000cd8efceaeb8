//! Provider configuration: which model endpoints exist, by name, and what they cost.
//!
//! A provider is one endpoint + model: an OpenAI-compatible chat-completions server (OpenAI,
//! vLLM, Ollama, llama.cpp's server, LiteLLM) or the Anthropic Messages API. It is configured by
//! name — in a TOML file (`skilleval.toml`, `[providers.<name>]` tables) or from the
//! `SKILLEVAL_PROVIDER_*` environment variables — and picked by name by a test case
//! (`evaluation.options.provider`), a file's runner (`settings.runner.provider`) or a run.
//!
//! The API key is never part of the configuration: `api_key_env` names the environment
//! variable that holds it, read once when the client is built ([`ApiKey::from_env`]) and held in
//! an [`ApiKey`] whose `Debug` prints nothing of it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use skilleval_model::grade::Usage;

/// Default `max_tokens` of a completion.
pub const DEFAULT_MAX_TOKENS: u32 = 2048;
/// Default per-request timeout.
pub const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Default ceiling of the adaptive concurrency limiter (requests in flight per provider).
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;
/// Default retries of a transient fault within one call (429, 5xx, timeouts).
pub const DEFAULT_MAX_RETRIES: u32 = 4;
/// Longest single wait the call layer accepts; a longer `Retry-After` is handed to the caller.
pub const DEFAULT_MAX_RETRY_WAIT_MS: u64 = 60_000;

/// The name the environment-configured provider gets.
pub const ENV_PROVIDER_NAME: &str = "env";

/// Which wire protocol a provider speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// `POST {base_url}/chat/completions` and `{base_url}/embeddings`.
    #[default]
    Openai,
    /// `POST {base_url}/messages` (Anthropic Messages API).
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }

    /// The public endpoint, used when `base_url` is left empty.
    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::Openai => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com/v1",
        }
    }

    /// The variable conventionally holding this kind's key.
    pub fn default_key_env(self) -> &'static str {
        match self {
            ProviderKind::Openai => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "openai" | "openai-compatible" | "openai_compatible" | "vllm" | "ollama" => {
                Some(ProviderKind::Openai)
            }
            "anthropic" | "claude" => Some(ProviderKind::Anthropic),
            _ => None,
        }
    }
}

/// One model endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The name cases and runs pick it by; filled from the TOML table's key.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub kind: ProviderKind,
    /// Up to and including the API version segment (`https://api.openai.com/v1`,
    /// `http://localhost:11434/v1`); empty for the kind's public endpoint.
    #[serde(default)]
    pub base_url: String,
    pub model: String,
    /// Name of the environment variable holding the API key (not the key). `None` for local
    /// servers that need none.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Sampling temperature for producing outputs; judges always use 0. `None`: the server's
    /// default.
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Per HTTP request; a request past it is a transient fault and is retried.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// USD per million input (prompt) tokens.
    #[serde(default)]
    pub price_input_per_mtok: f64,
    /// USD per million output (completion) tokens.
    #[serde(default)]
    pub price_output_per_mtok: f64,
    /// Model for `/embeddings` (`semantic_sim`); `None` when this provider does not embed.
    #[serde(default)]
    pub embedding_model: Option<String>,
    /// Ceiling of the adaptive concurrency limit (it starts here, halves on 429s).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Requests per minute this process may send (in-process limiter; the service shares
    /// its limits across workers).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute this process may use (estimated before, corrected after each call).
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Retries of a transient fault within one call.
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Longest wait the call layer sleeps through before a retry.
    #[serde(default)]
    pub max_retry_wait_ms: Option<u64>,
}

fn default_max_tokens() -> u32 {
    DEFAULT_MAX_TOKENS
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}

impl ProviderConfig {
    /// A provider of `kind` for `model` with every other field at its default.
    pub fn new(name: &str, kind: ProviderKind, model: &str) -> Self {
        ProviderConfig {
            name: name.to_string(),
            kind,
            base_url: String::new(),
            model: model.to_string(),
            api_key_env: None,
            temperature: None,
            max_tokens: DEFAULT_MAX_TOKENS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            price_input_per_mtok: 0.0,
            price_output_per_mtok: 0.0,
            embedding_model: None,
            max_concurrency: None,
            requests_per_minute: None,
            tokens_per_minute: None,
            max_retries: None,
            max_retry_wait_ms: None,
        }
    }

    /// The base URL without a trailing slash, the kind's public one when unset.
    pub fn base_url(&self) -> &str {
        let url = self.base_url.trim().trim_end_matches('/');
        if url.is_empty() {
            self.kind.default_base_url()
        } else {
            url
        }
    }

    /// What `input_tokens` in and `output_tokens` out cost, as a [`Usage`].
    pub fn usage(&self, input_tokens: u64, output_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            cost_usd: cost_usd(
                input_tokens,
                output_tokens,
                self.price_input_per_mtok,
                self.price_output_per_mtok,
            ),
        }
    }

    /// Every problem with this provider, each naming the field.
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let who = format!("provider `{}`", self.name);
        if self.model.trim().is_empty() {
            problems.push(format!("{who}: `model` must not be empty"));
        }
        let url = self.base_url();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            problems.push(format!(
                "{who}: `base_url` must start with http:// or https:// (got `{url}`)"
            ));
        }
        if let Some(t) = self.temperature {
            if !(t.is_finite() && (0.0..=2.0).contains(&t)) {
                problems.push(format!(
                    "{who}: `temperature` must be between 0 and 2, not {t}"
                ));
            }
        }
        if self.max_tokens == 0 {
            problems.push(format!("{who}: `max_tokens` must be at least 1"));
        }
        if self.timeout_ms == 0 {
            problems.push(format!("{who}: `timeout_ms` must be at least 1"));
        }
        for (field, price) in [
            ("price_input_per_mtok", self.price_input_per_mtok),
            ("price_output_per_mtok", self.price_output_per_mtok),
        ] {
            if !(price.is_finite() && price >= 0.0) {
                problems.push(format!(
                    "{who}: `{field}` must be a price in USD per million tokens (>= 0), not {price}"
                ));
            }
        }
        if self.max_concurrency == Some(0) {
            problems.push(format!("{who}: `max_concurrency` must be at least 1"));
        }
        if let Some(var) = &self.api_key_env {
            if var.trim().is_empty() || var.contains('=') {
                problems.push(format!(
                    "{who}: `api_key_env` must name an environment variable (e.g. OPENAI_API_KEY), not the key itself"
                ));
            }
        }
        problems
    }
}

/// `input x price_in / 1e6 + output x price_out / 1e6`, in USD.
pub fn cost_usd(input_tokens: u64, output_tokens: u64, price_in: f64, price_out: f64) -> f64 {
    (input_tokens as f64 * price_in + output_tokens as f64 * price_out) / 1_000_000.0
}

/// A provider configuration problem, saying what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{0}")]
    Invalid(String),
    #[error("provider `{provider}` reads its API key from ${var}, which is not set (export it, or set `api_key_env` to the variable that holds the key)")]
    MissingKey { provider: String, var: String },
}

/// Providers by name, with the ones used by default, for judging and for embeddings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Providers {
    /// The provider producing outputs when a run or case names none (the only one, when
    /// there is one; else required when there are several).
    #[serde(default)]
    pub default: Option<String>,
    /// The provider judging (`llm_judge`, `assertions`, comparator, triggers); the default one
    /// when unset.
    #[serde(default)]
    pub judge: Option<String>,
    /// The provider embedding (`semantic_sim`); the default one when unset.
    #[serde(default)]
    pub embeddings: Option<String>,
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
}

impl Providers {
    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// Parses a `skilleval.toml`:
    ///
    /// ```toml
    /// default = "openai"
    /// [providers.openai]
    /// kind = "openai"
    /// model = "gpt-4o-mini"
    /// api_key_env = "OPENAI_API_KEY"
    /// ```
    pub fn from_toml_str(file: &str, text: &str) -> Result<Providers, ConfigError> {
        let mut providers: Providers = toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.to_string(),
            message: e.to_string(),
        })?;
        for (name, p) in &mut providers.providers {
            p.name.clone_from(name);
        }
        providers.check()?;
        Ok(providers)
    }

    /// The provider the `SKILLEVAL_PROVIDER_*` variables describe, read through `lookup` (so
    /// this one function is where they are interpreted). `None` when
    /// `SKILLEVAL_PROVIDER_MODEL` is not set: an API key alone never configures a provider,
    /// so a stray `OPENAI_API_KEY` in CI spends nothing.
    pub fn from_env(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<ProviderConfig>, ConfigError> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let Some(model) = get("SKILLEVAL_PROVIDER_MODEL") else {
            return Ok(None);
        };
        let kind = match get("SKILLEVAL_PROVIDER_KIND") {
            None => ProviderKind::Openai,
            Some(k) => ProviderKind::parse(&k).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "SKILLEVAL_PROVIDER_KIND must be `openai` or `anthropic`, not `{k}`"
                ))
            })?,
        };
        let mut p = ProviderConfig::new(ENV_PROVIDER_NAME, kind, &model);
        p.base_url = get("SKILLEVAL_PROVIDER_BASE_URL").unwrap_or_default();
        // A local server (a base URL on localhost) usually needs no key; a public endpoint does.
        p.api_key_env = match get("SKILLEVAL_PROVIDER_API_KEY_ENV") {
            Some(var) => Some(var),
            None if lookup(kind.default_key_env()).is_some() => {
                Some(kind.default_key_env().to_string())
            }
            None if p.base_url.is_empty() => Some(kind.default_key_env().to_string()),
            None => None,
        };
        p.embedding_model = get("SKILLEVAL_PROVIDER_EMBEDDING_MODEL");
        let number = |key: &str| -> Result<Option<f64>, ConfigError> {
            match get(key) {
                None => Ok(None),
                Some(v) => v.parse::<f64>().map(Some).map_err(|_| {
                    ConfigError::Invalid(format!("{key} must be a number, not `{v}`"))
                }),
            }
        };
        p.temperature = number("SKILLEVAL_PROVIDER_TEMPERATURE")?;
        p.price_input_per_mtok = number("SKILLEVAL_PROVIDER_PRICE_INPUT")?.unwrap_or(0.0);
        p.price_output_per_mtok = number("SKILLEVAL_PROVIDER_PRICE_OUTPUT")?.unwrap_or(0.0);
        if let Some(ms) = number("SKILLEVAL_PROVIDER_TIMEOUT_MS")? {
            p.timeout_ms = ms.max(1.0) as u64;
        }
        if let Some(n) = number("SKILLEVAL_PROVIDER_MAX_TOKENS")? {
            p.max_tokens = n.max(1.0) as u32;
        }
        let problems = p.check();
        if !problems.is_empty() {
            return Err(ConfigError::Invalid(problems.join("; ")));
        }
        Ok(Some(p))
    }

    /// Adds (or replaces) a provider; it becomes the default when it is the only one or
    /// `make_default` is set.
    pub fn insert(&mut self, provider: ProviderConfig, make_default: bool) {
        let name = provider.name.clone();
        self.providers.insert(name.clone(), provider);
        if make_default || self.default.is_none() && self.providers.len() == 1 {
            self.default = Some(name);
        }
    }

    /// Checks every provider and that `default`, `judge` and `embeddings` name one.
    pub fn check(&self) -> Result<(), ConfigError> {
        let mut problems: Vec<String> = Vec::new();
        for p in self.providers.values() {
            problems.extend(p.check());
        }
        let known = || {
            self.providers
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (field, value) in [
            ("default", &self.default),
            ("judge", &self.judge),
            ("embeddings", &self.embeddings),
        ] {
            if let Some(name) = value {
                if !self.providers.contains_key(name) {
                    problems.push(format!(
                        "`{field}` names provider `{name}`, which is not configured (configured: {})",
                        known()
                    ));
                }
            }
        }
        if self.default.is_none() && self.providers.len() > 1 {
            problems.push(format!(
                "several providers are configured ({}); set `default` to the one that produces outputs",
                known()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("; ")))
        }
    }

    pub fn get(&self, name: &str) -> Option<&ProviderConfig> {
        self.providers.get(name)
    }

    /// The name of the default provider (the only one when there is one).
    pub fn default_name(&self) -> Option<&str> {
        self.default
            .as_deref()
            .or_else(|| match self.providers.len() {
                1 => self.providers.keys().next().map(String::as_str),
                _ => None,
            })
    }

    pub fn judge_name(&self) -> Option<&str> {
        self.judge.as_deref().or_else(|| self.default_name())
    }

    pub fn embeddings_name(&self) -> Option<&str> {
        self.embeddings.as_deref().or_else(|| self.default_name())
    }
}

/// An API key. Its `Debug` and `Display` print nothing of it; only the HTTP clients read it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// Reads the key of `provider` from its `api_key_env` variable. `Ok(None)` when the provider
    /// names no variable (local servers).
    pub fn from_env(provider: &ProviderConfig) -> Result<Option<ApiKey>, ConfigError> {
        let Some(var) = &provider.api_key_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(v) if !v.trim().is_empty() => Ok(Some(ApiKey(v.trim().to_string()))),
            _ => Err(ConfigError::MissingKey {
                provider: provider.name.clone(),
                var: var.clone(),
            }),
        }
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_priced_per_million_tokens() {
        // 1,234 in at $3/M + 567 out at $15/M = 0.003702 + 0.008505
        let p = ProviderConfig {
            price_input_per_mtok: 3.0,
            price_output_per_mtok: 15.0,
            ..ProviderConfig::new("a", ProviderKind::Anthropic, "m")
        };
        let u = p.usage(1_234, 567);
        assert_eq!((u.input_tokens, u.output_tokens), (1_234, 567));
        assert!((u.cost_usd - 0.012_207).abs() < 1e-12, "{}", u.cost_usd);
        assert_eq!(cost_usd(1_000_000, 0, 0.15, 0.6), 0.15);
        assert_eq!(cost_usd(0, 0, 5.0, 5.0), 0.0);
    }

    #[test]
    fn toml_file_names_providers_and_picks_defaults() {
        let text = r#"
            default = "local"
            judge = "claude"
            [providers.local]
            base_url = "http://127.0.0.1:11434/v1/"
            model = "llama3.1"
            embedding_model = "nomic-embed-text"
            [providers.claude]
            kind = "anthropic"
            model = "claude-sonnet-4-5"
            api_key_env = "ANTHROPIC_API_KEY"
            price_input_per_mtok = 3.0
            price_output_per_mtok = 15.0
        "#;
        let p = Providers::from_toml_str("skilleval.toml", text).unwrap();
        assert_eq!(p.default_name(), Some("local"));
        assert_eq!(p.judge_name(), Some("claude"));
        assert_eq!(p.embeddings_name(), Some("local"));
        let local = p.get("local").unwrap();
        assert_eq!(local.name, "local");
        assert_eq!(local.base_url(), "http://127.0.0.1:11434/v1");
        assert_eq!(local.kind, ProviderKind::Openai);
        assert_eq!(local.max_tokens, DEFAULT_MAX_TOKENS);
        let claude = p.get("claude").unwrap();
        assert_eq!(claude.base_url(), "https://api.anthropic.com/v1");
    }

    #[test]
    fn toml_problems_say_what_to_fix() {
        let err = Providers::from_toml_str("x.toml", "[providers.a]\nmodle = \"m\"\n").unwrap_err();
        assert!(err.to_string().contains("modle"), "{err}");
        let err = Providers::from_toml_str(
            "x.toml",
            "default = \"b\"\n[providers.a]\nmodel = \"m\"\nprice_input_per_mtok = -1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`default` names provider `b`"), "{err}");
        assert!(err.contains("price_input_per_mtok"), "{err}");
        let err = Providers::from_toml_str(
            "x.toml",
            "[providers.a]\nmodel = \"m\"\n[providers.b]\nmodel = \"m\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("set `default`"), "{err}");
    }

    #[test]
    fn env_configures_a_provider_only_with_a_model() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Providers::from_env(env(&[("OPENAI_API_KEY", "sk-x")])).unwrap(),
            None
        );
        let p = Providers::from_env(env(&[
            ("SKILLEVAL_PROVIDER_MODEL", "qwen2.5"),
            ("SKILLEVAL_PROVIDER_BASE_URL", "http://localhost:8000/v1"),
            ("SKILLEVAL_PROVIDER_PRICE_INPUT", "0.5"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(p.name, ENV_PROVIDER_NAME);
        assert_eq!(p.base_url(), "http://localhost:8000/v1");
        assert_eq!(p.api_key_env, None, "a local server needs no key");
        assert_eq!(p.price_input_per_mtok, 0.5);
        let p = Providers::from_env(env(&[
            ("SKILLEVAL_PROVIDER_MODEL", "claude-haiku-4-5"),
            ("SKILLEVAL_PROVIDER_KIND", "anthropic"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(p.api_key_env.as_deref(), Some("ANTHROPIC_API_KEY"));
        let err = Providers::from_env(env(&[
            ("SKILLEVAL_PROVIDER_MODEL", "m"),
            ("SKILLEVAL_PROVIDER_KIND", "gemini"),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("SKILLEVAL_PROVIDER_KIND"), "{err}");
    }

    #[test]
    fn api_keys_never_print() {
        let key = ApiKey::new("sk-secret-123");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert_eq!(key.to_string(), "<redacted>");
        let p = ProviderConfig {
            api_key_env: Some("SKILLEVAL_TEST_SURELY_UNSET_VAR".into()),
            ..ProviderConfig::new("p", ProviderKind::Openai, "m")
        };
        let err = ApiKey::from_env(&p).unwrap_err().to_string();
        assert!(err.contains("$SKILLEVAL_TEST_SURELY_UNSET_VAR"), "{err}");
    }
}
