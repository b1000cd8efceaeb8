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
use skilleval_execution::environment::EnvironmentConfig;
use skilleval_model::package::risk::RiskPolicy;
use skilleval_model::package::PackageLimits;
use skilleval_providers::Providers;
use skilleval_sandbox::SandboxPolicy;

/// `x-delivery-limit` of the jobs queue ([`crate::topology`] declares it). A constant, not a
/// setting: both binaries declare the queue, and a declaration with different arguments than
/// the existing queue's fails, so the arguments must not depend on configuration that could
/// differ between them. It is defined here, below the topology, because
/// `worker.max_redeliveries` is checked against it when the settings load.
pub const DELIVERY_LIMIT: u32 = 20;

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

    /// The URL with the password masked (each one's, in a comma-separated list).
    pub fn redacted(&self) -> String {
        self.0
            .split(',')
            .map(|one| redact_url(one.trim()))
            .collect::<Vec<_>>()
            .join(",")
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
    /// Traces: where they are exported and what they may carry.
    #[serde(default)]
    pub telemetry: TelemetrySettings,
    /// Limits of sandboxed processes (custom graders, `command` runners).
    pub sandbox: SandboxPolicy,
    /// Limits applied to uploaded packages (and to packages a worker extracts).
    pub limits: PackageLimits,
    /// The environments of packages that declare dependencies: the cache and the index.
    #[serde(default)]
    pub environments: EnvironmentConfig,
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
    /// `postgres://user:password@host:port/db`; `DATABASE_URL` overrides it. libpq's TLS
    /// parameters work in it too (`?sslmode=verify-full&sslrootcert=/etc/ssl/pg-ca.pem`).
    pub url: SecretUrl,
    pub max_connections: u32,
    /// How long a query waits for a pooled connection before failing.
    pub acquire_timeout_secs: u64,
    /// TLS to the server (libpq's `sslmode`); replaces the URL's. None: the URL's, else
    /// `prefer`.
    #[serde(default)]
    pub ssl_mode: Option<PgSslMode>,
    /// PEM file of the CA(s) the server's certificate must chain to, on top of the system's
    /// roots (libpq's `sslrootcert`); replaces the URL's.
    #[serde(default)]
    pub ssl_root_cert: Option<PathBuf>,
    /// A client certificate (PEM) and its key (PEM), for servers that ask for one (libpq's
    /// `sslcert` and `sslkey`); both or neither.
    #[serde(default)]
    pub ssl_cert: Option<PathBuf>,
    #[serde(default)]
    pub ssl_key: Option<PathBuf>,
}

impl Default for DatabaseSettings {
    fn default() -> Self {
        DatabaseSettings {
            url: SecretUrl::new("postgres://postgres@127.0.0.1:5432/skilleval"),
            max_connections: 10,
            acquire_timeout_secs: 10,
            ssl_mode: None,
            ssl_root_cert: None,
            ssl_cert: None,
            ssl_key: None,
        }
    }
}

/// libpq's `sslmode` values, as PostgreSQL documents them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PgSslMode {
    /// Never TLS.
    Disable,
    /// Plain first, TLS if the server insists.
    Allow,
    /// TLS if the server offers it, without verifying its certificate.
    Prefer,
    /// TLS or nothing, without verifying the certificate.
    Require,
    /// TLS, the certificate chaining to a trusted CA.
    VerifyCa,
    /// TLS, the certificate chaining to a trusted CA and naming the host connected to.
    VerifyFull,
}

impl PgSslMode {
    /// The value of the URL's `sslmode` parameter.
    pub fn as_str(self) -> &'static str {
        match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Allow => "allow",
            PgSslMode::Prefer => "prefer",
            PgSslMode::Require => "require",
            PgSslMode::VerifyCa => "verify-ca",
            PgSslMode::VerifyFull => "verify-full",
        }
    }
}

impl DatabaseSettings {
    /// The URL to connect with: the configured one with the TLS settings set here written
    /// into its query (each replacing the URL's own parameter of that name), so everything
    /// that connects by URL (the pool, `migrate --create-database`) uses the same TLS.
    pub fn connect_url(&self) -> Result<SecretUrl, ConfigError> {
        let files = [
            ("sslrootcert", &self.ssl_root_cert),
            ("sslcert", &self.ssl_cert),
            ("sslkey", &self.ssl_key),
        ];
        let mut set: Vec<(&str, String)> = files
            .iter()
            .filter_map(|(name, path)| {
                path.as_ref()
                    .map(|p| (*name, p.to_string_lossy().into_owned()))
            })
            .collect();
        if let Some(mode) = self.ssl_mode {
            set.push(("sslmode", mode.as_str().to_string()));
        }
        if set.is_empty() {
            return Ok(self.url.clone());
        }
        let mut url = url::Url::parse(self.url.expose()).map_err(|e| ConfigError::Invalid {
            key: "database.url",
            message: format!("not a URL ({e}): {}", self.url.redacted()),
        })?;
        let kept: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| !set.iter().any(|(name, _)| k == name))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(kept)
            .extend_pairs(set);
        Ok(SecretUrl::new(String::from(url)))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AmqpSettings {
    /// `amqp://user:password@host:port/vhost`, or several such addresses separated by commas
    /// (the nodes of a cluster, tried in turn: [`crate::failover`]); `AMQP_URL` overrides it.
    pub url: SecretUrl,
    /// Every queue is a quorum queue, replicated over the cluster's nodes: the samples lane,
    /// the delay queues, the parking and events queues, not only the jobs queue (which always
    /// is). For a cluster, where a classic queue lives on one node and is gone with it. A
    /// queue's type cannot change once declared: switching this deploys under a new
    /// `prefix` (docs/operations.md, "Running on a RabbitMQ cluster").
    #[serde(default)]
    pub replicated_queues: bool,
    /// Prefix of every exchange and queue name, so several deployments (or tests) can share a
    /// broker: `<prefix>.jobs`, `<prefix>.retry.1000`, ...
    pub prefix: String,
    /// AMQP heartbeat, at most [`MAX_HEARTBEAT_SECS`]: a broker that stops answering is
    /// noticed after two missed beats.
    pub heartbeat_secs: u16,
    /// Shown by `rabbitmqctl list_connections` (default: the binary's name, host and pid).
    pub connection_name: Option<String>,
    /// With an `amqps://` URL: a PEM file of the CA(s) the broker's certificate must chain to,
    /// on top of the system's roots. The certificate must name the URL's host.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// With an `amqps://` URL: a client certificate (PEM, the chain from the leaf) and its
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1), for brokers that verify their peers; both
    /// or neither.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        AmqpSettings {
            url: SecretUrl::new("amqp://guest:guest@127.0.0.1:5672/%2f"),
            replicated_queues: false,
            prefix: "skilleval".into(),
            heartbeat_secs: 10,
            connection_name: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
        }
    }
}

impl AmqpSettings {
    /// The addresses to connect to, in the configured order: each configured URL plus
    /// `heartbeat` unless it sets its own. Never empty once the settings validated.
    pub fn connect_urls(&self) -> Vec<SecretUrl> {
        self.addresses()
            .map(|url| {
                if url.contains("heartbeat=") {
                    return SecretUrl::new(url);
                }
                let sep = if url.contains('?') { '&' } else { '?' };
                SecretUrl::new(format!("{url}{sep}heartbeat={}", self.heartbeat_secs))
            })
            .collect()
    }

    /// The configured URLs, split on commas and trimmed (empty ones included, for
    /// [`Settings::validate`] to refuse).
    fn addresses(&self) -> impl Iterator<Item = &str> {
        self.url.expose().split(',').map(str::trim)
    }

    /// Whether the URLs are `amqps://` (validation makes them all one scheme).
    pub fn is_tls(&self) -> bool {
        self.addresses().any(|url| url.starts_with("amqps://"))
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
    /// A job still running this long after it started claims its case in the store
    /// (`case_claims`), so a copy the broker delivers again meanwhile (its consumer
    /// acknowledgement timeout passed, or the connection was lost) does not run it too; a
    /// copy delivered again claims at once. Must be below the brokers' `consumer_timeout`.
    pub claim_after_ms: u64,
    /// How long a claim lasts unless renewed; its holder renews it every third of that while
    /// the job runs. A copy delivered again while the holder is gone waits about this long.
    pub claim_lease_secs: u64,
    /// The brokers' `consumer_timeout` (ms), when known: the worker refuses to start when
    /// `claim_after_ms` is not below it, and warns for a job whose timeout is longer than
    /// half of it (it may be delivered again while it runs or waits for a slot).
    pub broker_consumer_timeout_ms: Option<u64>,
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
            claim_after_ms: 10_000,
            claim_lease_secs: 60,
            broker_consumer_timeout_ms: None,
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

    pub fn claim_after(&self) -> Duration {
        Duration::from_millis(self.claim_after_ms)
    }

    pub fn claim_lease(&self) -> Duration {
        Duration::from_secs(self.claim_lease_secs)
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
    /// Attempts of a webhook delivery before it is `failed` (backoff between them).
    pub webhook_max_attempts: u32,
    /// Timeout of one webhook attempt.
    pub webhook_timeout_secs: u64,
    /// How often every coordinator looks for due webhook deliveries (retries, and those of a
    /// coordinator that died before sending).
    pub webhook_poll_interval_ms: u64,
    /// A webhook delivery is left alone until it is this old. 0 in production; tests set it
    /// to hold a delivery between the run's finalisation and its sending (to kill the
    /// coordinator in that window).
    pub webhook_hold_ms: u64,
    /// Production sampling: ingest limits, alert schedule, retention.
    #[serde(default)]
    pub sampling: SamplingSettings,
    /// Require a bearer token on `/v1` even when `auth_tokens` is empty (publisher tokens
    /// only). Authentication is on when this is set or `auth_tokens` is not empty.
    #[serde(default)]
    pub require_auth: bool,
    /// Quotas and rate limits per publisher and per token (docs/security.md).
    #[serde(default)]
    pub quotas: QuotaSettings,
    /// How long run results, outputs, packages and the audit log are kept.
    #[serde(default)]
    pub retention: RetentionSettings,
    /// The package risk report's policy at upload (`coordinator.risk.refuse_at`): off by
    /// default, every finding is reported and the upload accepted.
    #[serde(default)]
    pub risk: RiskPolicy,
    /// Catalogue collisions after each upload (docs/catalogue.md).
    #[serde(default)]
    pub catalogue: CatalogueSettings,
    /// The Zod converter's folder (`convert.cjs` and the pinned Zod in its `node_modules`,
    /// `npm ci` there): `expected.zodSchema` is converted with it at upload. Relative paths
    /// are taken from the working directory.
    #[serde(default = "default_zod_dir")]
    pub zod_dir: PathBuf,
}

fn default_zod_dir() -> PathBuf {
    PathBuf::from("tools/zod")
}

/// `coordinator.quotas`: the same limits applied to each publisher and to each token.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaSettings {
    pub publisher: QuotaLimits,
    pub token: QuotaLimits,
}

/// Limits of one publisher or one token; none: unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaLimits {
    /// API requests per second (burst: the same number), counted per coordinator replica.
    pub requests_per_second: Option<u32>,
    /// Skill uploads in any sliding hour.
    pub uploads_per_hour: Option<u32>,
    /// Runs not yet finished at once.
    pub concurrent_runs: Option<u32>,
    /// Test cases of runs created in any sliding 24 hours.
    pub cases_per_day: Option<u64>,
    /// Model spend (USD) of runs created in the last 24 hours.
    pub spend_usd_per_day: Option<f64>,
}

/// `coordinator.retention` (days; none: kept forever), enforced by the periodic sweep.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Finished runs (with their results) older than this are deleted.
    pub results_days: Option<u32>,
    /// Outputs of results finished longer ago than this are cleared (the results stay).
    pub outputs_days: Option<u32>,
    /// Versions older than this, other than each skill's newest, are deleted with their
    /// package and runs.
    pub packages_days: Option<u32>,
    /// Audit log entries older than this are deleted.
    pub audit_days: Option<u32>,
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
    /// Trace ingest (`POST /v1/otlp/v1/traces`): the attributes that name a GenAI span's
    /// skill, tried in order on the span, then on its resource.
    pub otlp_skill_attributes: Vec<String>,
}

impl Default for SamplingSettings {
    fn default() -> Self {
        SamplingSettings {
            max_batch_samples: 1_000,
            max_batch_bytes: 5 * 1024 * 1024,
            retention_days: 90,
            alert_interval_secs: 3_600,
            otlp_skill_attributes: vec!["skilleval.skill".into(), "gen_ai.agent.name".into()],
        }
    }
}

/// `coordinator.catalogue`: the collision eval each upload gets after its answer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogueSettings {
    /// Run it at all (it needs `llm.providers`; without them nothing runs).
    pub enabled: bool,
    /// Nearest published skills that become decoys (1 to 50).
    pub neighbours: usize,
    /// Runs per trigger query (1 to 10).
    pub runs_per_query: u32,
    /// `gate=no_collision` fails when the new skill takes more than this share of a
    /// neighbour's query runs.
    pub max_share: f64,
    /// Collision evals running at once in this coordinator (its catalogue lane).
    pub concurrency: usize,
    /// Attempts of an eval whose judge or embeddings provider fails (a host fault) before it
    /// is recorded `failed`.
    pub max_attempts: u32,
    /// Seconds before a coordinator claims an eval again after a host fault.
    pub retry_after_secs: u64,
    /// Seconds a coordinator's claim on a running eval lasts without renewal (renewed every
    /// third of it): an eval whose coordinator stopped is claimed again by another
    /// coordinator's sweep once it lapses.
    pub lease_secs: u64,
    /// How a run picks a skill: `model` (the judge names one) or `agent` (the `agent` runner,
    /// in the coordinator's sandbox, opens one; the coordinator needs bubblewrap).
    pub mode: CatalogueMode,
    /// `agent` mode: model requests per run (1 to 20).
    pub agent_max_turns: u32,
    /// `agent` mode: seconds one run may take.
    pub agent_timeout_secs: u64,
}

/// `coordinator.catalogue.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatalogueMode {
    /// The judge model names one skill of the lineup.
    #[default]
    Model,
    /// The `agent` runner gets the query; the skill whose `SKILL.md` it opens first is the pick.
    Agent,
}

impl Default for CatalogueSettings {
    fn default() -> Self {
        CatalogueSettings {
            enabled: true,
            neighbours: 5,
            runs_per_query: 3,
            max_share: 0.2,
            concurrency: 2,
            max_attempts: 3,
            retry_after_secs: 30,
            lease_secs: 120,
            mode: CatalogueMode::Model,
            agent_max_turns: 4,
            agent_timeout_secs: 120,
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
            webhook_max_attempts: 6,
            webhook_timeout_secs: 10,
            webhook_poll_interval_ms: 1_000,
            webhook_hold_ms: 0,
            sampling: SamplingSettings::default(),
            require_auth: false,
            quotas: QuotaSettings::default(),
            retention: RetentionSettings::default(),
            risk: RiskPolicy::default(),
            catalogue: CatalogueSettings::default(),
            zod_dir: default_zod_dir(),
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

/// OpenTelemetry traces. Nothing is exported unless an OTLP endpoint is set; the SDK reads the
/// other standard variables itself (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
/// `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`, `OTEL_EXPORTER_OTLP_HEADERS`,
/// `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_BSP_*`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TelemetrySettings {
    /// The collector's base URL (`OTEL_EXPORTER_OTLP_ENDPOINT`): traces go to
    /// `<endpoint>/v1/traces`, OTLP over HTTP with protobuf bodies.
    pub otlp_endpoint: Option<String>,
    /// The full traces URL (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), used as it is; it wins over
    /// `otlp_endpoint`.
    pub otlp_traces_endpoint: Option<String>,
    /// The full logs URL (`OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`), used as it is; it wins over
    /// `otlp_endpoint`. The worker's `gen_ai.evaluation.result` events go there.
    pub otlp_logs_endpoint: Option<String>,
    /// Whether the runner's spans carry the prompt and the model's output text
    /// (`OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`). Off by default: test inputs and
    /// outputs may be confidential, and a trace backend is seldom the place for them.
    pub capture_model_content: bool,
    /// Longest `gen_ai.evaluation.explanation` of an evaluation event, in characters (a
    /// judge's reasoning or a failure summary is cut there, marked with `…`).
    pub evaluation_explanation_max_chars: usize,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            otlp_endpoint: None,
            otlp_traces_endpoint: None,
            otlp_logs_endpoint: None,
            capture_model_content: false,
            evaluation_explanation_max_chars: 1_000,
        }
    }
}

impl TelemetrySettings {
    /// The URL spans are posted to, when exporting is on.
    pub fn traces_url(&self) -> Option<String> {
        fn set(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|v| !v.is_empty())
        }
        if let Some(url) = set(&self.otlp_traces_endpoint) {
            return Some(url.to_string());
        }
        set(&self.otlp_endpoint).map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
    }

    /// The URL log records (the evaluation events) are posted to, when exporting them is on:
    /// the logs endpoint, else `<endpoint>/v1/logs`. A traces endpoint alone turns no logs on.
    pub fn logs_url(&self) -> Option<String> {
        fn set(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|v| !v.is_empty())
        }
        if let Some(url) = set(&self.otlp_logs_endpoint) {
            return Some(url.to_string());
        }
        set(&self.otlp_endpoint).map(|base| format!("{}/v1/logs", base.trim_end_matches('/')))
    }
}

/// Variables that override a setting directly, as users of Postgres, RabbitMQ and Rust tools
/// expect, and the key each one sets.
const STANDARD_VARIABLES: &[(&str, &str)] = &[
    ("DATABASE_URL", "database.url"),
    ("AMQP_URL", "amqp.url"),
    ("RUST_LOG", "log.filter"),
    ("SKILLEVAL_LOG_FORMAT", "log.format"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "telemetry.otlp_endpoint"),
    (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "telemetry.otlp_traces_endpoint",
    ),
    (
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
        "telemetry.otlp_logs_endpoint",
    ),
    (
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        "telemetry.capture_model_content",
    ),
];

/// Settings keys whose environment value is a comma-separated list.
const LIST_KEYS: &[&str] = &[
    "worker.retry_tiers_ms",
    "coordinator.auth_tokens",
    "coordinator.sampling.otlp_skill_attributes",
];

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
        self.validate_amqp_addresses()?;
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
        if self.worker.max_redeliveries >= DELIVERY_LIMIT {
            return invalid(
                "worker.max_redeliveries",
                &format!(
                    "must be below the jobs queue's delivery limit ({})",
                    DELIVERY_LIMIT
                ),
            );
        }
        if self.worker.batch_size == 0 {
            return invalid("worker.batch_size", "must be at least 1");
        }
        if self.worker.claim_lease_secs == 0 {
            return invalid("worker.claim_lease_secs", "must be at least 1");
        }
        if let Some(timeout) = self.worker.broker_consumer_timeout_ms {
            if self.worker.claim_after_ms >= timeout {
                return invalid(
                    "worker.claim_after_ms",
                    &format!(
                        "must be below worker.broker_consumer_timeout_ms ({timeout}): a job must \
                         claim its case before the broker can deliver it again"
                    ),
                );
            }
        }
        if self.database.max_connections == 0 {
            return invalid("database.max_connections", "must be at least 1");
        }
        self.validate_tls()
    }

    /// `amqp.url`: one address or several, comma-separated, each an `amqp://` or `amqps://`
    /// URL, all of one scheme (one set of TLS settings serves them all), none twice.
    fn validate_amqp_addresses(&self) -> Result<(), ConfigError> {
        let invalid = |message: String| {
            Err(ConfigError::Invalid {
                key: "amqp.url",
                message,
            })
        };
        let addresses: Vec<&str> = self.amqp.addresses().collect();
        let mut seen = std::collections::HashSet::new();
        for (i, url) in addresses.iter().enumerate() {
            let n = i + 1;
            if url.is_empty() {
                return invalid(format!(
                    "address {n} of {} is empty (addresses are separated by single commas)",
                    addresses.len()
                ));
            }
            if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
                return invalid(format!(
                    "address {n} ({}) must start with amqp:// or amqps://",
                    redact_url(url)
                ));
            }
            if !seen.insert(*url) {
                return invalid(format!("address {n} ({}) is listed twice", redact_url(url)));
            }
        }
        let tls = addresses
            .iter()
            .filter(|u| u.starts_with("amqps://"))
            .count();
        if tls != 0 && tls != addresses.len() {
            return invalid(
                "mixes amqp:// and amqps:// addresses: every node must be reached the same way"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// TLS files: named ones exist, a certificate comes with its key, and the broker's are set
    /// only for an `amqps://` URL (they would be ignored silently on a plain one).
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let db = &self.database;
        let amqp = &self.amqp;
        let files = [
            ("database.ssl_root_cert", &db.ssl_root_cert),
            ("database.ssl_cert", &db.ssl_cert),
            ("database.ssl_key", &db.ssl_key),
            ("amqp.tls_ca_file", &amqp.tls_ca_file),
            ("amqp.tls_cert_file", &amqp.tls_cert_file),
            ("amqp.tls_key_file", &amqp.tls_key_file),
        ];
        for (key, path) in files {
            if let Some(path) = path.as_ref().filter(|p| !p.is_file()) {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!("{} is not a readable file", path.display()),
                });
            }
        }
        let pairs = [
            (
                "database.ssl_cert",
                &db.ssl_cert,
                "database.ssl_key",
                &db.ssl_key,
            ),
            (
                "amqp.tls_cert_file",
                &amqp.tls_cert_file,
                "amqp.tls_key_file",
                &amqp.tls_key_file,
            ),
        ];
        for (cert_key, cert, key_key, key) in pairs {
            if cert.is_some() != key.is_some() {
                let (set, missing) = if cert.is_some() {
                    (cert_key, key_key)
                } else {
                    (key_key, cert_key)
                };
                return Err(ConfigError::Invalid {
                    key: missing,
                    message: format!("must be set together with {set}"),
                });
            }
        }
        let amqp_tls = [
            ("amqp.tls_ca_file", &amqp.tls_ca_file),
            ("amqp.tls_cert_file", &amqp.tls_cert_file),
        ];
        if let Some((key, _)) = amqp_tls.iter().find(|(_, path)| path.is_some()) {
            if !amqp.is_tls() {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!(
                        "is set but amqp.url ({}) is not amqps://: TLS would not be used",
                        amqp.url.redacted()
                    ),
                });
            }
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
    use std::collections::{BTreeMap, BTreeSet};

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

    /// Keys whose built-in default depends on the machine: the file names them commented out.
    const MACHINE_DEFAULTS: &[&str] = &["worker.package_cache_dir"];

    /// Every leaf of `value` by dotted path. An empty table is a leaf: in the defaults it is a
    /// map keyed by names the operator chooses (`llm.providers.providers`).
    fn leaves(
        prefix: &str,
        value: &serde_json::Value,
        out: &mut BTreeMap<String, serde_json::Value>,
    ) {
        match value {
            serde_json::Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaves(&path, v, out);
                }
            }
            other => {
                out.insert(prefix.to_string(), other.clone());
            }
        }
    }

    /// Every key and section a TOML file names, set or commented out (`# key = example`), by
    /// dotted path.
    fn named_keys(text: &str) -> BTreeSet<String> {
        let mut section = String::new();
        let mut named = BTreeSet::new();
        for line in text.lines() {
            let line = line.trim_start().trim_start_matches('#').trim_start();
            if let Some(rest) = line.strip_prefix('[') {
                if let Some((name, _)) = rest.split_once(']') {
                    if name.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.'
                    }) {
                        section = name.to_string();
                        named.insert(section.clone());
                    }
                }
                continue;
            }
            let Some((key, _)) = line.split_once('=') else {
                continue;
            };
            let key = key.trim();
            if !key.is_empty()
                && key.starts_with(|c: char| c.is_ascii_lowercase())
                && key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                named.insert(if section.is_empty() {
                    key.to_string()
                } else {
                    format!("{section}.{key}")
                });
            }
        }
        named
    }

    #[test]
    fn the_shipped_default_toml_holds_every_key_with_its_default() {
        let text = std::fs::read_to_string(Path::new(&repo_config()).join("default.toml")).unwrap();
        let mut defaults = BTreeMap::new();
        leaves(
            "",
            &serde_json::to_value(Settings::default()).unwrap(),
            &mut defaults,
        );
        let table: toml::Table = toml::from_str(&text).unwrap();
        let mut written = BTreeMap::new();
        leaves("", &serde_json::to_value(&table).unwrap(), &mut written);
        let named = named_keys(&text);
        let is_open_map = |v: &serde_json::Value| v.as_object().is_some_and(|m| m.is_empty());
        let mut problems = Vec::new();
        for (key, default) in &defaults {
            match written.get(key) {
                Some(value) if value == default => {}
                Some(value) => problems.push(format!(
                    "{key} is {value} in the file, {default} in the code"
                )),
                None if default.is_null() || MACHINE_DEFAULTS.contains(&key.as_str()) => {
                    if !named.contains(key) {
                        problems.push(format!(
                            "{key} (unset or per machine) is not even commented out"
                        ));
                    }
                }
                None if is_open_map(default) => {
                    let under = format!("{key}.");
                    if !named.iter().any(|n| n == key || n.starts_with(&under)) {
                        problems.push(format!("{key} (a table of named entries) has no example"));
                    }
                }
                None => problems.push(format!("{key} = {default} is missing")),
            }
        }
        // A section holding only commented keys reads as an empty table: not a key.
        for (key, value) in &written {
            if !defaults.contains_key(key) && !is_open_map(value) {
                problems.push(format!("{key} is in the file but not in the code"));
            }
        }
        // A commented-out key must be a real one (or sit under a table of named entries).
        for key in &named {
            let known = defaults.contains_key(key)
                || defaults.keys().any(|d| d.starts_with(&format!("{key}.")))
                || defaults
                    .iter()
                    .any(|(d, v)| is_open_map(v) && key.starts_with(&format!("{d}.")));
            if !known {
                problems.push(format!(
                    "{key} is named in the file but is no key of the code"
                ));
            }
        }
        assert!(problems.is_empty(), "config/default.toml: {problems:#?}");
        // The check sees every section the code has.
        for section in [
            "coordinator.sampling",
            "sandbox",
            "limits",
            "telemetry",
            "llm.providers",
        ] {
            assert!(
                defaults
                    .keys()
                    .any(|k| k.starts_with(&format!("{section}."))),
                "{section}"
            );
        }
    }

    #[test]
    fn the_key_check_sees_a_missing_key_and_a_wrong_value() {
        let text = "[worker]\nconcurrency = 5\n# samples_concurrency = 2\n[llm.providers]\n# [llm.providers.providers.x]\n# model = \"m\"\n";
        let named = named_keys(text);
        assert!(named.contains("worker.samples_concurrency"));
        assert!(named.contains("llm.providers.providers.x.model"));
        let table: toml::Table = toml::from_str(text).unwrap();
        let mut written = BTreeMap::new();
        leaves("", &serde_json::to_value(&table).unwrap(), &mut written);
        assert_eq!(
            written.get("worker.concurrency"),
            Some(&serde_json::json!(5))
        );
        assert_eq!(written.get("llm.providers"), Some(&serde_json::json!({})));
        assert!(!written.contains_key("worker.max_attempts"));
    }

    #[test]
    fn the_catalogue_mode_is_model_unless_a_variable_says_agent() {
        let s = Settings::load_from(&env(&[])).unwrap();
        assert_eq!(s.coordinator.catalogue.mode, CatalogueMode::Model);
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL__COORDINATOR__CATALOGUE__MODE", "agent"),
            ("SKILLEVAL__COORDINATOR__CATALOGUE__AGENT_MAX_TURNS", "6"),
        ]))
        .unwrap();
        assert_eq!(s.coordinator.catalogue.mode, CatalogueMode::Agent);
        assert_eq!(s.coordinator.catalogue.agent_max_turns, 6);
        let e = Settings::load_from(&env(&[(
            "SKILLEVAL__COORDINATOR__CATALOGUE__MODE",
            "robot",
        )]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("mode") || e.contains("robot"), "{e}");
    }

    #[test]
    fn the_standard_opentelemetry_variables_set_the_telemetry_keys() {
        let dir = tempfile_dir();
        let s =
            Settings::load_from(&env(&[("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap())])).unwrap();
        assert_eq!(s.telemetry.traces_url(), None, "no endpoint, no export");
        assert!(!s.telemetry.capture_model_content);
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
        ]))
        .unwrap();
        assert_eq!(
            s.telemetry.traces_url().as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert!(s.telemetry.capture_model_content);
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://traces:4318/in",
            ),
        ]))
        .unwrap();
        assert_eq!(
            s.telemetry.traces_url().as_deref(),
            Some("http://traces:4318/in")
        );
        assert_eq!(
            s.telemetry.logs_url().as_deref(),
            Some("http://collector:4318/v1/logs"),
            "the base turns the evaluation events on"
        );
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            ("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://logs:4318/in"),
            (
                "SKILLEVAL__COORDINATOR__SAMPLING__OTLP_SKILL_ATTRIBUTES",
                "team.skill,gen_ai.agent.name",
            ),
        ]))
        .unwrap();
        assert_eq!(s.telemetry.traces_url(), None);
        assert_eq!(
            s.telemetry.logs_url().as_deref(),
            Some("http://logs:4318/in")
        );
        assert_eq!(
            s.coordinator.sampling.otlp_skill_attributes,
            ["team.skill", "gen_ai.agent.name"]
        );
    }

    #[test]
    fn quotas_and_retention_load_from_files_and_variables() {
        let dir = tempfile_dir();
        std::fs::write(
            dir.join("default.toml"),
            "[coordinator.quotas.publisher]\nuploads_per_hour = 5\nspend_usd_per_day = 2.5\n\
             [coordinator.retention]\naudit_days = 30\n",
        )
        .unwrap();
        let s = Settings::load_from(&env(&[
            ("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap()),
            (
                "SKILLEVAL__COORDINATOR__QUOTAS__TOKEN__CONCURRENT_RUNS",
                "2",
            ),
            ("SKILLEVAL__COORDINATOR__REQUIRE_AUTH", "true"),
        ]))
        .unwrap();
        let q = &s.coordinator.quotas;
        assert_eq!(q.publisher.uploads_per_hour, Some(5));
        assert_eq!(q.publisher.spend_usd_per_day, Some(2.5));
        assert_eq!(q.publisher.requests_per_second, None);
        assert_eq!(q.token.concurrent_runs, Some(2));
        assert_eq!(s.coordinator.retention.audit_days, Some(30));
        assert_eq!(s.coordinator.retention.results_days, None);
        assert!(s.coordinator.require_auth);
        // A misspelt limit is named, not ignored.
        std::fs::write(
            dir.join("default.toml"),
            "[coordinator.quotas.publisher]\nuploads_per_day = 5\n",
        )
        .unwrap();
        let e = Settings::load_from(&env(&[("SKILLEVAL_CONFIG_DIR", dir.to_str().unwrap())]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("uploads_per_day"), "{e}");
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
    fn a_claim_must_come_before_the_brokers_consumer_timeout() {
        let err = Settings::load_from(&env(&[
            ("SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS", "10000"),
            ("SKILLEVAL__WORKER__CLAIM_AFTER_MS", "10000"),
        ]))
        .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("worker.claim_after_ms") && text.contains("broker_consumer_timeout_ms"),
            "{text}"
        );
        let s = Settings::load_from(&env(&[(
            "SKILLEVAL__WORKER__BROKER_CONSUMER_TIMEOUT_MS",
            "7200000",
        )]))
        .unwrap();
        assert_eq!(s.worker.broker_consumer_timeout_ms, Some(7_200_000));
        assert!(s.worker.claim_after_ms < 7_200_000);
    }

    #[test]
    fn heartbeat_is_bounded_and_added_to_the_url() {
        let err =
            Settings::load_from(&env(&[("SKILLEVAL__AMQP__HEARTBEAT_SECS", "60")])).unwrap_err();
        assert!(err.to_string().contains("amqp.heartbeat_secs"), "{err}");
        let s = Settings::load_from(&env(&[("AMQP_URL", "amqp://g:g@h:5672/%2f")])).unwrap();
        assert_eq!(
            s.amqp.connect_urls(),
            vec![SecretUrl::new("amqp://g:g@h:5672/%2f?heartbeat=10")]
        );
    }

    #[test]
    fn database_tls_settings_are_written_into_the_url_over_its_own() {
        let dir = tempfile_dir();
        let ca = dir.join("ca dir&x.pem");
        std::fs::write(&ca, "not read here").unwrap();
        let s = Settings::load_from(&env(&[
            (
                "DATABASE_URL",
                "postgres://u:pw@db.example:5432/x?sslmode=require&application_name=se",
            ),
            ("SKILLEVAL__DATABASE__SSL_MODE", "verify-full"),
            ("SKILLEVAL__DATABASE__SSL_ROOT_CERT", ca.to_str().unwrap()),
        ]))
        .unwrap();
        assert_eq!(s.database.ssl_mode, Some(PgSslMode::VerifyFull));
        let url = s.database.connect_url().unwrap();
        let parsed = url::Url::parse(url.expose()).unwrap();
        let query: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
        assert_eq!(
            query,
            vec![
                ("application_name".into(), "se".into()),
                ("sslrootcert".into(), ca.to_str().unwrap().into()),
                ("sslmode".into(), "verify-full".into()),
            ],
            "the configured mode replaces the URL's; the path survives the round trip"
        );
        assert_eq!(parsed.password(), Some("pw"));

        let plain = Settings::load_from(&env(&[])).unwrap();
        assert_eq!(
            plain.database.connect_url().unwrap().expose(),
            plain.database.url.expose(),
            "no TLS settings: the URL as configured"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn tls_files_must_exist_pair_up_and_match_the_scheme() {
        let dir = tempfile_dir();
        let pem = dir.join("x.pem");
        std::fs::write(&pem, "").unwrap();
        let pem = pem.to_str().unwrap();

        let err = Settings::load_from(&env(&[(
            "SKILLEVAL__DATABASE__SSL_ROOT_CERT",
            "/nonexistent/ca.pem",
        )]))
        .unwrap_err();
        assert!(
            err.to_string().contains("database.ssl_root_cert")
                && err.to_string().contains("/nonexistent/ca.pem"),
            "{err}"
        );

        let err = Settings::load_from(&env(&[("SKILLEVAL__DATABASE__SSL_CERT", pem)])).unwrap_err();
        assert!(err.to_string().contains("database.ssl_key"), "{err}");

        let err = Settings::load_from(&env(&[("SKILLEVAL__AMQP__TLS_CA_FILE", pem)])).unwrap_err();
        assert!(
            err.to_string().contains("amqp.tls_ca_file") && err.to_string().contains("amqps://"),
            "{err}"
        );
        let err = Settings::load_from(&env(&[
            ("AMQP_URL", "amqps://g:g@h:5671/%2f"),
            ("SKILLEVAL__AMQP__TLS_KEY_FILE", pem),
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("amqp.tls_cert_file"), "{err}");

        let s = Settings::load_from(&env(&[
            ("AMQP_URL", "amqps://g:g@h:5671/%2f"),
            ("SKILLEVAL__AMQP__TLS_CA_FILE", pem),
            ("SKILLEVAL__AMQP__TLS_CERT_FILE", pem),
            ("SKILLEVAL__AMQP__TLS_KEY_FILE", pem),
        ]))
        .unwrap();
        assert_eq!(s.amqp.tls_ca_file.as_deref(), Some(Path::new(pem)));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn bad_tiers_are_refused() {
        let err = Settings::load_from(&env(&[("SKILLEVAL__WORKER__RETRY_TIERS_MS", "500,100")]))
            .unwrap_err();
        assert!(err.to_string().contains("retry_tiers_ms"), "{err}");
    }

    #[test]
    fn amqp_url_takes_a_comma_separated_list_of_nodes() {
        let s = Settings::load_from(&env(&[(
            "AMQP_URL",
            "amqp://g:pw@a:5672/%2f, amqp://g:pw@b:5673/%2f?heartbeat=5,amqp://g:pw@c/%2f",
        )]))
        .unwrap();
        assert_eq!(
            s.amqp.connect_urls(),
            vec![
                SecretUrl::new("amqp://g:pw@a:5672/%2f?heartbeat=10"),
                SecretUrl::new("amqp://g:pw@b:5673/%2f?heartbeat=5"),
                SecretUrl::new("amqp://g:pw@c/%2f?heartbeat=10"),
            ]
        );
        // Every password is masked, not only the first address's.
        let shown = format!("{:?}", s.amqp.url);
        assert!(!shown.contains("pw"), "{shown}");
        assert_eq!(shown.matches("g:***@").count(), 3, "{shown}");

        for (value, says) in [
            (
                "amqp://g:g@a/%2f,,amqp://g:g@b/%2f",
                "address 2 of 3 is empty",
            ),
            ("amqp://g:g@a/%2f,", "address 2 of 2 is empty"),
            (
                "amqp://g:g@a/%2f,http://b/",
                "address 2 (http://b/) must start with amqp://",
            ),
            (
                "amqp://g:g@a/%2f,amqp://g:g@a/%2f",
                "address 2 (amqp://g:***@a/%2f) is listed twice",
            ),
            (
                "amqp://g:g@a/%2f,amqps://g:g@b/%2f",
                "mixes amqp:// and amqps://",
            ),
        ] {
            let err = Settings::load_from(&env(&[("AMQP_URL", value)])).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("amqp.url") && text.contains(says),
                "{value}: {text}"
            );
        }
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
