//! The service's configuration: one typed [`Settings`], loaded in one place.
//!
//! Layers, lowest first:
//!
//! 1. built-in defaults ([`Settings::default`]), good for a laptop with local services;
//! 2. `config/default.toml`, then `config/{SKILLEVAL_ENV}.toml` (both optional; the folder is
//!    `SKILLEVAL_CONFIG_DIR`, default `config`);
//! 3. `SKILLEVAL__SECTION__KEY` variables (`SKILLEVAL__WORKER__CONCURRENCY=8`; lists are
//!    comma-separated: `SKILLEVAL__WORKER__RETRY_TIERS_MS=1000,5000`);
//! 4. the standard variables users expect to work: `DATABASE_URL`, `AMQP_URL`, `RUST_LOG`, and
//!    `SKILLEVAL_LOG_FORMAT` (`json`, `text` or `auto`).
//!
//! [`Settings::load`] is the only code in the service that reads the environment; tests use
//! [`Settings::load_from`] with a map instead. Secrets (passwords inside URLs, the webhook
//! secret) are wrapped so `Debug` and logs never show them.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use skilleval::llm::Providers;
use skilleval::package::PackageLimits;
use skilleval::sandbox::SandboxPolicy;

/// The longest AMQP heartbeat allowed: a dead peer must be noticed within seconds, not minutes.
pub const MAX_HEARTBEAT_SECS: u16 = 15;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("invalid configuration: {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

/// A secret string: `Debug` and `Display` print `[redacted]`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself: call it where it is used, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// A connection URL that may carry a password: `Debug` and `Display` show it with the password
/// replaced by `***`, so a URL can be logged to say where we connect.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(value: impl Into<String>) -> Self {
        SecretUrl(value.into())
    }

    /// The URL with its password, for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with the password masked.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `scheme://user:password@host/...` -> `scheme://user:***@host/...`; a query parameter named
/// `password` is masked too. Anything unparseable is masked whole.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "***".to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("{userinfo}@{host}"),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// Everything the coordinator and the worker are configured with.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Settings {
    pub database: DatabaseSettings,
    pub amqp: AmqpSettings,
    pub worker: WorkerSettings,
    pub coordinator: CoordinatorSettings,
    pub log: LogSettings,
    /// Limits of sandboxed processes (custom graders, `command` runners).
    pub sandbox: SandboxPolicy,
    /// Limits applied to uploaded packages (and to packages a worker extracts).
    pub limits: PackageLimits,
    /// Model providers for the `llm` runner and the model-backed strategies.
    #[serde(default)]
    pub llm: LlmSettings,
}

/// The model providers the workers call, with the fleet's shared cache and limits.
///
/// Providers are shared's [`Providers`] (the CLI's `skilleval.toml` format): either inline,
/// `[llm.providers] default = "openai"` plus `[llm.providers.providers.openai] model = ...`,
/// or, simpler, `llm.providers_file` naming a `skilleval.toml`, which then replaces the inline
/// ones (read once, when the settings load). Each provider's `requests_per_minute` and
/// `tokens_per_minute` are fleet-wide limits here, shared by every worker through PostgreSQL.
/// API keys stay in the environment variables the providers name in `api_key_env`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LlmSettings {
    /// A providers TOML file (`SKILLEVAL__LLM__PROVIDERS_FILE`).
    #[serde(default)]
    pub providers_file: Option<PathBuf>,
    #[serde(default)]
    pub providers: Providers,
    /// Cached model answers expire after this long; none: kept until deleted.
    #[serde(default)]
    pub cache_ttl_secs: Option<u64>,
}

impl LlmSettings {
    /// Reads `providers_file` when set; fills each inline provider's name from its key; checks
    /// the providers.
    fn resolve(&mut self) -> Result<(), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            key: "llm.providers",
            message,
        };
        if let Some(path) = &self.providers_file {
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Invalid {
                key: "llm.providers_file",
                message: format!("cannot read {}: {e}", path.display()),
            })?;
            self.providers = Providers::from_toml_str(&path.display().to_string(), &text)
                .map_err(|e| invalid(e.to_string()))?;
        }
        for (name, p) in &mut self.providers.providers {
            p.name.clone_from(name);
        }
        self.providers.check().map_err(|e| invalid(e.to_string()))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatabaseSettings {
    /// `postgres://user:password@host:port/db`; `DATABASE_URL` overrides it.
    pub url: SecretUrl,
    pub max_connections: u32,
    /// How long a query waits for a pooled connection before failing.
    pub acquire_timeout_secs: u64,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        DatabaseSettings {
            url: SecretUrl::new("postgres://postgres@127.0.0.1:5432/skilleval"),
            max_connections: 10,
            acquire_timeout_secs: 10,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AmqpSettings {
    /// `amqp://user:password@host:port/vhost`; `AMQP_URL` overrides it.
    pub url: SecretUrl,
    /// Prefix of every exchange and queue name, so several deployments (or tests) can share a
    /// broker: `<prefix>.jobs`, `<prefix>.retry.1000`, ...
    pub prefix: String,
    /// AMQP heartbeat, at most [`MAX_HEARTBEAT_SECS`]: a broker that stops answering is
    /// noticed after two missed beats.
    pub heartbeat_secs: u16,
    /// Shown by `rabbitmqctl list_connections` (default: the binary's name, host and pid).
    pub connection_name: Option<String>,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        AmqpSettings {
            url: SecretUrl::new("amqp://guest:guest@127.0.0.1:5672/%2f"),
            prefix: "skilleval".into(),
            heartbeat_secs: 10,
            connection_name: None,
        }
    }
}

impl AmqpSettings {
    /// The URL to connect with: the configured one plus `heartbeat` unless it sets its own.
    pub fn connect_url(&self) -> SecretUrl {
        let url = self.url.expose();
        if url.contains("heartbeat=") {
            return self.url.clone();
        }
        let sep = if url.contains('?') { '&' } else { '?' };
        SecretUrl::new(format!("{url}{sep}heartbeat={}", self.heartbeat_secs))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSettings {
    /// CI jobs executed at once (and the main queue's prefetch).
    pub concurrency: u16,
    /// Production samples executed at once, on top of `concurrency` (the samples queue's
    /// prefetch); default a quarter of `concurrency`, at least 1. Samples never take a CI slot.
    pub samples_concurrency: Option<u16>,
    /// Deliveries of a job that faults transiently, the first included; then it is `errored`.
    pub max_attempts: u32,
    /// Delay queues, one per tier: a retry waits in the smallest tier not shorter than its
    /// backoff (the largest when none is).
    pub retry_tiers_ms: Vec<u64>,
    /// A job the broker delivered this many times without it being settled (a worker died on
    /// it each time) is stored `errored` instead of being run again: the poison-message guard.
    pub max_redeliveries: u32,
    /// After SIGTERM, how long in-flight jobs may take to finish.
    pub shutdown_grace_secs: u64,
    /// Where packages are extracted, one folder per content hash.
    pub package_cache_dir: PathBuf,
    /// Results are committed in batches of at most this many...
    pub batch_size: usize,
    /// ...or after this long, whichever comes first.
    pub batch_max_wait_ms: u64,
    /// Port of `/healthz`, `/readyz` and `/metrics` (0: any free port). The default, 8081,
    /// sits beside the coordinator's 8080 and clear of Prometheus's own 9090.
    pub http_port: u16,
    /// How long a run's "cancelled" answer is reused before asking the database again.
    pub cancel_cache_ttl_ms: u64,
    /// Broker reconnects tried in a row before the worker gives up and exits non-zero.
    pub max_reconnect_attempts: u32,
    /// This many faults of the host (the sandbox failing before a skill's code ran) within
    /// `host_fault_window_secs` make the worker stop taking jobs until its sandbox probe
    /// passes again, so its jobs go to healthy workers instead of burning their retries.
    pub host_fault_threshold: u32,
    pub host_fault_window_secs: u64,
    /// While the worker takes no jobs for want of a working sandbox, how often it probes it.
    pub sandbox_probe_interval_ms: u64,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            concurrency: 4,
            samples_concurrency: None,
            max_attempts: 4,
            retry_tiers_ms: vec![1_000, 5_000, 30_000],
            max_redeliveries: 5,
            shutdown_grace_secs: 30,
            package_cache_dir: std::env::temp_dir().join("skilleval-packages"),
            batch_size: 50,
            batch_max_wait_ms: 20,
            http_port: 8081,
            cancel_cache_ttl_ms: 2_000,
            max_reconnect_attempts: 10,
            host_fault_threshold: 5,
            host_fault_window_secs: 30,
            sandbox_probe_interval_ms: 2_000,
        }
    }
}

impl WorkerSettings {
    /// Samples executed at once (`samples_concurrency`, default a quarter of `concurrency`).
    pub fn samples_slots(&self) -> u16 {
        self.samples_concurrency
            .unwrap_or((self.concurrency / 4).max(1))
            .max(1)
    }

    /// A lane's prefetch for `slots` jobs executing at once: twice the slots. The second half
    /// holds jobs that finished and wait for their batch's commit before the ack; were the
    /// prefetch equal to the slots, every executing slot would sit idle through that wait
    /// (a 50 ms model call plus a 20 ms batch window ran at 0.6 of `slots / 50 ms`).
    pub fn prefetch_for(slots: u16) -> u16 {
        slots.saturating_mul(2)
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(self.shutdown_grace_secs)
    }

    pub fn batch_max_wait(&self) -> Duration {
        Duration::from_millis(self.batch_max_wait_ms)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CoordinatorSettings {
    /// Address the HTTP API listens on (`0.0.0.0:8080`; port 0: any free port).
    pub bind: String,
    /// How clients reach the API (links in reports and webhooks).
    pub public_url: String,
    /// Largest upload accepted (413 beyond).
    pub max_upload_bytes: u64,
    /// Signs webhooks (`X-Skilleval-Signature`); none: webhooks are sent unsigned.
    pub webhook_secret: Option<Secret>,
    /// How often the sweeper looks for unpublished jobs and unfinalised runs.
    pub sweep_interval_secs: u64,
    /// A `queued` row unconfirmed for this long is published again by the sweeper.
    pub publish_grace_secs: u64,
    /// Bearer tokens accepted by the `/v1` API; empty: no authentication. Comma-separated in
    /// `SKILLEVAL__COORDINATOR__AUTH_TOKENS`.
    #[serde(default)]
    pub auth_tokens: Vec<Secret>,
    /// Production sampling: ingest limits, alert schedule, retention.
    #[serde(default)]
    pub sampling: SamplingSettings,
}

/// Production sampling (`coordinator.sampling.*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingSettings {
    /// Most samples in one `POST /v1/skills/{name}/samples` batch (413 beyond).
    pub max_batch_samples: usize,
    /// Largest batch body in bytes (413 beyond).
    pub max_batch_bytes: usize,
    /// Samples (and their samples runs and results) older than this many days are deleted
    /// by the sweeper.
    pub retention_days: u32,
    /// How often the alert rules are evaluated (by one coordinator of the fleet at a time).
    pub alert_interval_secs: u64,
}

impl Default for SamplingSettings {
    fn default() -> Self {
        SamplingSettings {
            max_batch_samples: 1_000,
            max_batch_bytes: 5 * 1024 * 1024,
            retention_days: 90,
            alert_interval_secs: 3_600,
        }
    }
}

impl Default for CoordinatorSettings {
    fn default() -> Self {
        CoordinatorSettings {
            bind: "0.0.0.0:8080".into(),
            public_url: "http://localhost:8080".into(),
            max_upload_bytes: PackageLimits::default().max_compressed_bytes,
            webhook_secret: None,
            sweep_interval_secs: 10,
            publish_grace_secs: 30,
            auth_tokens: Vec::new(),
            sampling: SamplingSettings::default(),
        }
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// JSON lines when stderr is not a terminal (containers, CI, log shippers), text otherwise.
    #[default]
    Auto,
    Json,
    Text,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogSettings {
    /// An `EnvFilter` directive (`info`, `skilleval_worker=debug,sqlx=warn`); `RUST_LOG`
    /// overrides it.
    pub filter: String,
    /// `SKILLEVAL_LOG_FORMAT` overrides it.
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            filter: "info,sqlx=warn,lapin=warn".into(),
            format: LogFormat::Auto,
        }
    }
}

/// Variables that override a setting directly, as users of Postgres, RabbitMQ and Rust tools
/// expect, and the key each one sets.
const STANDARD_VARIABLES: &[(&str, &str)] = &[
    ("DATABASE_URL", "database.url"),
    ("AMQP_URL", "amqp.url"),
    ("RUST_LOG", "log.filter"),
    ("SKILLEVAL_LOG_FORMAT", "log.format"),
];

/// Settings keys whose environment value is a comma-separated list.
const LIST_KEYS: &[&str] = &["worker.retry_tiers_ms", "coordinator.auth_tokens"];

impl Settings {
    /// Loads the settings from the files and the process environment.
    pub fn load() -> Result<Settings, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        Settings::load_from(&env)
    }

    /// Loads the settings with `env` standing for the process environment.
    pub fn load_from(env: &HashMap<String, String>) -> Result<Settings, ConfigError> {
        let dir = env
            .get("SKILLEVAL_CONFIG_DIR")
            .map_or_else(|| PathBuf::from("config"), PathBuf::from);
        let mut builder = config::Config::builder()
            .add_source(config::Config::try_from(&Settings::default())?)
            .add_source(file(&dir, "default"));
        if let Some(name) = env.get("SKILLEVAL_ENV").filter(|n| !n.is_empty()) {
            builder = builder.add_source(file(&dir, name));
        }
        let prefixed: config::Map<String, String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("SKILLEVAL__"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut environment = config::Environment::with_prefix("SKILLEVAL")
            .prefix_separator("__")
            .separator("__")
            .try_parsing(true)
            .list_separator(",")
            .source(Some(prefixed));
        for key in LIST_KEYS {
            environment = environment.with_list_parse_key(key);
        }
        builder = builder.add_source(environment);
        for (var, key) in STANDARD_VARIABLES {
            if let Some(value) = env.get(*var).filter(|v| !v.is_empty()) {
                builder = builder.set_override(*key, value.as_str())?;
            }
        }
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        settings.llm.resolve()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what deserialising cannot: ranges and relations between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, message: &str| {
            Err(ConfigError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if self.amqp.heartbeat_secs == 0 || self.amqp.heartbeat_secs > MAX_HEARTBEAT_SECS {
            return invalid(
                "amqp.heartbeat_secs",
                &format!("must be 1..={MAX_HEARTBEAT_SECS}"),
            );
        }
        if self.amqp.prefix.is_empty()
            || !self
                .amqp
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return invalid(
                "amqp.prefix",
                "must be non-empty ASCII letters, digits, `.`, `-` or `_`",
            );
        }
        if self.worker.concurrency == 0 {
            return invalid("worker.concurrency", "must be at least 1");
        }
        if self.worker.max_attempts == 0 {
            return invalid("worker.max_attempts", "must be at least 1");
        }
        let tiers = &self.worker.retry_tiers_ms;
        if tiers.is_empty() || tiers.contains(&0) || tiers.windows(2).any(|w| w[0] >= w[1]) {
            return invalid(
                "worker.retry_tiers_ms",
                "must be non-empty, positive and strictly increasing",
            );
        }
        if self.worker.max_redeliveries >= crate::topology::DELIVERY_LIMIT {
            return invalid(
                "worker.max_redeliveries",
                &format!(
                    "must be below the jobs queue's delivery limit ({})",
                    crate::topology::DELIVERY_LIMIT
                ),
            );
        }
        if self.worker.batch_size == 0 {
            return invalid("worker.batch_size", "must be at least 1");
        }
        if self.database.max_connections == 0 {
            return invalid("database.max_connections", "must be at least 1");
        }
        Ok(())
    }
}

fn file(dir: &Path, name: &str) -> config::File<config::FileSourceFile, config::FileFormat> {
    config::File::from(dir.join(name))
        .format(config::FileFormat::Toml)
        .required(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        // Point at a folder without files unless a test sets its own.
        map.entry("SKILLEVAL_CONFIG_DIR".into())
            .or_insert_with(|| "/nonexistent-skilleval-config".into());
        map
    }

    #[test]
    fn defaults_load_without_files_or_variables() {
        let s = Settings::load_from(&env(&[])).unwrap();
        assert_eq!(s.amqp.prefix, "skilleval");
        assert_eq!(s.worker.retry_tiers_ms, vec![1_000, 5_000, 30_000]);
        assert_eq!(s.sandbox, SandboxPolicy::default());
        assert_eq!(s.limits, PackageLimits::default());
    }

    /// The repository's `config/` folder, the one the images and manifests ship.
    fn repo_config() -> String {
        format!("{}/../config", env!("CARGO_MANIFEST_DIR"))
    }

    #[test]
    fn the_shipped_default_toml_is_the_built_in_defaults() {
        let dir = repo_config();
        assert!(Path::new(&dir).join("default.toml").is_file());
        let loaded = Settings::load_from(&env(&[("SKILLEVAL_CONFIG_DIR", &dir)])).unwrap();
        assert_eq!(
            serde_json::to_value(&loaded).unwrap(),
            serde_json::to_value(Settings::default()).unwrap()
        );
    }

    #[test]
    fn the_shipped_production_toml_loads_over_the_defaults() {
        let dir = repo_config();
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", &dir),
            ("SKILLEVAL_ENV", "production"),
        ]))
        .unwrap();
        assert_eq!(s.log.format, LogFormat::Json);
        assert_eq!(
            s.worker.package_cache_dir,
            PathBuf::from("/var/cache/skilleval")
        );
        assert_eq!(s.worker.shutdown_grace_secs, 120);
        assert_eq!(s.worker.http_port, 8081);
        assert_eq!(
            s.amqp.prefix, "skilleval",
            "the rest comes from default.toml"
        );
    }

    #[test]
    fn files_then_prefixed_variables_then_standard_variables() {
        let dir = tempfile_dir();
        std::fs::write(
            dir.join("default.toml"),
            "[worker]\nconcurrency = 3\nbatch_size = 7\n[amqp]\nprefix = \"fromfile\"\n[database]\nurl = \"postgres://file@h/db\"\n",
        )
        .unwrap();
        std::fs::write(dir.join("ci.toml"), "[worker]\nbatch_size = 9\n").unwrap();
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            ("SKILLEVAL_ENV", "ci"),
            ("SKILLEVAL__WORKER__CONCURRENCY", "8"),
            ("SKILLEVAL__WORKER__RETRY_TIERS_MS", "100,200"),
            ("SKILLEVAL__SANDBOX__ALLOW_UNSANDBOXED", "true"),
            ("SKILLEVAL__DATABASE__URL", "postgres://prefixed@h/db"),
            ("DATABASE_URL", "postgres://u:pw@standard/db"),
            ("RUST_LOG", "debug"),
        ]))
        .unwrap();
        assert_eq!(s.worker.concurrency, 8, "variable beats file");
        assert_eq!(
            s.worker.batch_size, 9,
            "environment file beats default file"
        );
        assert_eq!(s.amqp.prefix, "fromfile");
        assert_eq!(s.worker.retry_tiers_ms, vec![100, 200]);
        assert!(s.sandbox.allow_unsandboxed);
        assert_eq!(
            s.sandbox.memory_bytes,
            SandboxPolicy::default().memory_bytes,
            "other fields keep defaults"
        );
        assert_eq!(
            s.database.url.expose(),
            "postgres://u:pw@standard/db",
            "DATABASE_URL wins"
        );
        assert_eq!(s.log.filter, "debug");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn secrets_never_print() {
        let s = Settings::load_from(&env(&[
            (
                "DATABASE_URL",
                "postgres://user:hunter2@db:5432/x?sslmode=require&password=hunter3",
            ),
            ("SKILLEVAL__COORDINATOR__WEBHOOK_SECRET", "s3cr3t"),
        ]))
        .unwrap();
        let printed = format!("{s:?}");
        assert!(
            !printed.contains("hunter2")
                && !printed.contains("hunter3")
                && !printed.contains("s3cr3t"),
            "{printed}"
        );
        assert!(
            printed.contains("postgres://user:***@db:5432/x?sslmode=require&password=***"),
            "{printed}"
        );
        assert_eq!(
            s.coordinator.webhook_secret.as_ref().map(Secret::expose),
            Some("s3cr3t")
        );
    }

    #[test]
    fn heartbeat_is_bounded_and_added_to_the_url() {
        let err =
            Settings::load_from(&env(&[("SKILLEVAL__AMQP__HEARTBEAT_SECS", "60")])).unwrap_err();
        assert!(err.to_string().contains("amqp.heartbeat_secs"), "{err}");
        let s = Settings::load_from(&env(&[("AMQP_URL", "amqp://g:g@h:5672/%2f")])).unwrap();
        assert_eq!(
            s.amqp.connect_url().expose(),
            "amqp://g:g@h:5672/%2f?heartbeat=10"
        );
    }

    #[test]
    fn bad_tiers_are_refused() {
        let err = Settings::load_from(&env(&[("SKILLEVAL__WORKER__RETRY_TIERS_MS", "500,100")]))
            .unwrap_err();
        assert!(err.to_string().contains("retry_tiers_ms"), "{err}");
    }

    #[test]
    fn redaction_keeps_the_user_and_host() {
        assert_eq!(
            redact_url("amqp://guest:guest@localhost:5672/%2f"),
            "amqp://guest:***@localhost:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/test"),
            "postgres://postgres@127.0.0.1/test"
        );
        assert_eq!(redact_url("not a url"), "***");
    }

    #[test]
    fn providers_load_inline_or_from_a_file_with_their_limits() {
        let s = Settings::load_from(&env(&[])).unwrap();
        assert!(s.llm.providers.is_empty(), "no providers by default");

        let dir = tempfile_dir();
        std::fs::write(
            dir.join("default.toml"),
            "[llm]\ncache_ttl_secs = 60\n[llm.providers]\ndefault = \"local\"\n[llm.providers.providers.local]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"llama\"\nrequests_per_minute = 30\ntokens_per_minute = 9000\n",
        )
        .unwrap();
        let s =
            Settings::load_from(&env(&[("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap())])).unwrap();
        let p = s.llm.providers.get("local").unwrap();
        assert_eq!(p.name, "local", "named by its key");
        assert_eq!(p.model, "llama");
        assert_eq!(
            (p.requests_per_minute, p.tokens_per_minute),
            (Some(30), Some(9000))
        );
        assert_eq!(s.llm.providers.default_name(), Some("local"));
        assert_eq!(s.llm.cache_ttl_secs, Some(60));

        let file = dir.join("providers.toml");
        std::fs::write(
            &file,
            "[providers.judge]\nkind = \"anthropic\"\nmodel = \"claude\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n",
        )
        .unwrap();
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            ("SKILLEVAL__LLM__PROVIDERS_FILE", file.to_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(
            s.llm.providers.providers.keys().collect::<Vec<_>>(),
            vec!["judge"],
            "the file replaces the inline providers"
        );

        let err = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config"),
            (
                "SKILLEVAL__LLM__PROVIDERS_FILE",
                "/nonexistent/providers.toml",
            ),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("llm.providers_file"), "{err}");
    }

    fn tempfile_dir() -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("skilleval-config-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
