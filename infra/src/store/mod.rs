//! PostgreSQL: the pool, the migrations, and every SQL statement of the service.
//!
//! Queries are checked at run time (`sqlx::query`, not the compile-time macros), so the
//! workspace builds without a database; the integration tests run each of them against a real
//! one. Every statement is a method of [`Store`] returning [`StoreError`] with context, one
//! file per concern: [`lifecycle`] (a run's states and every transition), [`versions`]
//! (skills, versions, definitions), [`runs`] (creating and reading runs and their results),
//! [`publishing`] (watermarks, the publish lock, the sweeper's lists), [`samples`]
//! (monitors, production samples, alerts, retention), [`results`] (the workers' writes), [`llm`]
//! (the model response cache and fleet-wide provider rate limits), [`outbox`] (webhook
//! deliveries), [`parked`] (jobs drained from the parking queue), [`tenancy`] (publishers,
//! tokens, visibility, quotas, deletion, retention, the audit log), [`reviews`] (human reviews
//! of grades), [`pages`] (what the web interface's pages read), [`listing`] (the API's skills
//! and runs lists), [`reports`] (reports over chosen runs), [`matrix`] (model matrices),
//! [`catalogue`] (catalogue cards and collision matrices).
//!
//! Migrations are embedded from `migrations/` at the repository root. Applying them takes
//! sqlx's Postgres advisory lock, so several replicas starting at once apply them exactly once
//! and the others wait, then find nothing to do. [`Store::schema_status`] compares the applied
//! ones with the embedded ones (workers refuse to consume on a mismatch), and
//! [`create_database_if_missing`] is `migrate --create-database`.

use std::fmt;
use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::config::{redact_url, DatabaseSettings};

pub mod catalogue;
pub mod comparisons;
pub mod lifecycle;
pub mod listing;
pub mod llm;
pub mod matrix;
pub mod outbox;
pub mod pages;
pub mod parked;
pub mod publishing;
pub mod reports;
pub mod results;
pub mod reviews;
pub mod runs;
pub mod samples;
pub mod tenancy;
pub mod versions;

pub use results::{CaseState, Changed};

/// The schema, embedded at build time.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("connecting to PostgreSQL at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// The TLS handshake failed on a certificate, or TLS is configured in a way the server
    /// cannot meet: a configuration problem, not retried.
    #[error(
        "connecting to PostgreSQL at {url}: TLS configuration problem: {problem} \
         (database.ssl_mode, database.ssl_root_cert, or sslmode/sslrootcert in the URL)"
    )]
    Tls {
        url: String,
        problem: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Config(crate::config::ConfigError),
    #[error("applying migrations: {0}")]
    Migrate(#[from] MigrateError),
    #[error("{context}: {source}")]
    Query {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

impl StoreError {
    pub(crate) fn query(context: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| StoreError::Query { context, source }
    }

    /// A failed connection to `url` (already redacted): [`StoreError::Tls`] when TLS is why.
    pub(crate) fn connect(url: String) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| {
            let problem = match &source {
                // sqlx's own TLS errors: the server does not offer TLS where it is required,
                // an unreadable CA or key, a client certificate without its key.
                sqlx::Error::Tls(e) => Some(
                    crate::tls::certificate_problem(e.as_ref()).unwrap_or_else(|| e.to_string()),
                ),
                // The handshake itself, as an I/O error wrapping rustls's.
                sqlx::Error::Io(e) => crate::tls::certificate_problem(e),
                _ => None,
            };
            match problem {
                Some(problem) => StoreError::Tls {
                    url,
                    problem,
                    source,
                },
                None => StoreError::Connect { url, source },
            }
        }
    }

    /// Whether this is a configuration problem that no retry can fix (TLS, the URL).
    pub fn is_configuration(&self) -> bool {
        matches!(self, StoreError::Tls { .. } | StoreError::Config(_))
    }

    /// Whether the same call could succeed later: a lost connection, a pool timeout, a
    /// deadlock or serialisation failure, a server shutting down. Not: a constraint violation,
    /// a bad query, a value that does not decode.
    pub fn is_transient(&self) -> bool {
        let source = match self {
            StoreError::Connect { .. } => return true,
            StoreError::Tls { .. } | StoreError::Config(_) | StoreError::Migrate(_) => {
                return false
            }
            StoreError::Query { source, .. } => source,
        };
        match source {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                // 40001 serialization_failure, 40P01 deadlock_detected, 08* connection
                // exceptions, 57P0* admin/crash shutdown and cannot_connect_now, 53* resources.
                code == "40001"
                    || code == "40P01"
                    || code.starts_with("08")
                    || code.starts_with("57P")
                    || code.starts_with("53")
            }),
            _ => false,
        }
    }
}

/// The database.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
}

impl Store {
    /// Connects a pool as configured, TLS included (one connection is opened now, to fail
    /// early).
    pub async fn connect(settings: &DatabaseSettings) -> Result<Store, StoreError> {
        let url = settings.connect_url().map_err(StoreError::Config)?;
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(Duration::from_secs(settings.acquire_timeout_secs))
            .connect(url.expose())
            .await
            .map_err(StoreError::connect(url.redacted()))?;
        Ok(Store { pool })
    }

    /// Connects a small pool to `url` (tools and tests).
    pub async fn connect_url(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(StoreError::connect(redact_url(url)))?;
        Ok(Store { pool })
    }

    pub fn from_pool(pool: PgPool) -> Store {
        Store { pool }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations (safe to call from several processes at once).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// A round trip to the database (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(StoreError::query("pinging the database"))?;
        Ok(())
    }
}

/// How the database's applied migrations compare with the ones this binary embeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaStatus {
    /// Every embedded migration is applied, and nothing else.
    Current,
    /// Embedded migrations not applied yet (all of them on an empty database): run `migrate`.
    Behind { missing: Vec<i64> },
    /// Applied migrations this binary does not know: a newer release migrated the database.
    Ahead { unknown: Vec<i64> },
}

impl fmt::Display for SchemaStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
        match self {
            SchemaStatus::Current => write!(f, "the schema is current"),
            SchemaStatus::Behind { missing } => write!(
                f,
                "the database schema is older than this binary: migration(s) {} not applied; \
                 run `skilleval-coordinator migrate` (add --create-database for a new database)",
                list(missing)
            ),
            SchemaStatus::Ahead { unknown } => write!(
                f,
                "the database schema is newer than this binary: migration(s) {} applied by a \
                 newer release; run that release's binaries",
                list(unknown)
            ),
        }
    }
}

/// Creates the database `url` names when it does not exist (on the same server, through its
/// `postgres` maintenance database); returns whether it created it.
pub async fn create_database_if_missing(url: &str) -> Result<bool, StoreError> {
    use sqlx::migrate::MigrateDatabase as _;
    if sqlx::Postgres::database_exists(url)
        .await
        .map_err(StoreError::connect(redact_url(url)))?
    {
        return Ok(false);
    }
    match sqlx::Postgres::create_database(url).await {
        Ok(()) => Ok(true),
        // 42P04 duplicate_database: another process created it meanwhile.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("42P04") => Ok(false),
        Err(source) => Err(StoreError::Query {
            context: "creating the database",
            source,
        }),
    }
}

impl Store {
    /// Compares the migrations applied (sqlx's `_sqlx_migrations`, successful rows) with the
    /// embedded ones. A database without that table has none applied.
    pub async fn schema_status(&self) -> Result<SchemaStatus, StoreError> {
        let table: Option<String> =
            sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::text")
                .fetch_one(&self.pool)
                .await
                .map_err(StoreError::query("looking for the migrations table"))?;
        let applied: Vec<i64> = if table.is_some() {
            sqlx::query_scalar(
                "SELECT version FROM _sqlx_migrations WHERE success ORDER BY version",
            )
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::query("reading the applied migrations"))?
        } else {
            Vec::new()
        };
        let embedded: Vec<i64> = MIGRATOR
            .iter()
            .filter(|m| m.migration_type.is_up_migration())
            .map(|m| m.version)
            .collect();
        let unknown: Vec<i64> = applied
            .iter()
            .filter(|v| !embedded.contains(v))
            .copied()
            .collect();
        if !unknown.is_empty() {
            return Ok(SchemaStatus::Ahead { unknown });
        }
        let missing: Vec<i64> = embedded
            .iter()
            .filter(|v| !applied.contains(v))
            .copied()
            .collect();
        if !missing.is_empty() {
            return Ok(SchemaStatus::Behind { missing });
        }
        Ok(SchemaStatus::Current)
    }
}
