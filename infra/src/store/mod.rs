//! PostgreSQL: the pool, the migrations, and every SQL statement of the service.
//!
//! Queries are checked at run time (`sqlx::query`, not the compile-time macros), so the
//! workspace builds without a database; the integration tests run each of them against a real
//! one. [`results`] holds the workers' writes (result upserts and run counters), [`runs`] the
//! coordinator's (skills, versions, runs, queries, finalisation), [`llm`] the model response
//! cache and the fleet-wide provider rate limits.
//!
//! Migrations are embedded from `migrations/` at the repository root. Applying them takes
//! sqlx's Postgres advisory lock, so several replicas starting at once apply them exactly once
//! and the others wait, then find nothing to do.

use std::time::Duration;

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::config::{redact_url, DatabaseSettings};

pub mod llm;
pub mod results;
pub mod runs;

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

    /// Whether the same call could succeed later: a lost connection, a pool timeout, a
    /// deadlock or serialisation failure, a server shutting down. Not: a constraint violation,
    /// a bad query, a value that does not decode.
    pub fn is_transient(&self) -> bool {
        let source = match self {
            StoreError::Connect { .. } => return true,
            StoreError::Migrate(_) => return false,
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
    /// Connects a pool as configured (one connection is opened now, to fail early).
    pub async fn connect(settings: &DatabaseSettings) -> Result<Store, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(settings.max_connections)
            .acquire_timeout(Duration::from_secs(settings.acquire_timeout_secs))
            .connect(settings.url.expose())
            .await
            .map_err(|source| StoreError::Connect {
                url: settings.url.redacted(),
                source,
            })?;
        Ok(Store { pool })
    }

    /// Connects a small pool to `url` (tools and tests).
    pub async fn connect_url(url: &str, max_connections: u32) -> Result<Store, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(|source| StoreError::Connect {
                url: redact_url(url),
                source,
            })?;
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

    /// The stored ZIP of a package, by content hash (what workers fetch and cache).
    pub async fn package_bytes(&self, package_hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        runs::package_bytes(&self.pool, package_hash)
            .await
            .map_err(StoreError::query("reading a package"))
    }
}
