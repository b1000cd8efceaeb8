//! Why a run could not be planned, created or published: one error for the whole of `runs`,
//! which the routes map to HTTP (`crate::error`) and the background passes log.

use skilleval_execution::plan::{PlanError, TextError};
use skilleval_infra::store::lifecycle::TransitionError;
use skilleval_infra::store::StoreError;
use skilleval_model::gate::GateSpecError;
use uuid::Uuid;

/// Why a run could not be created or published; the routes map it to HTTP.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("version {0} not found")]
    VersionNotFound(Uuid),
    #[error("run {0} not found")]
    RunNotFound(Uuid),
    /// The request's filter does not fit the definition.
    #[error(transparent)]
    Filter(#[from] PlanError),
    /// A samples run is created by ingest only (`POST /v1/skills/{name}/samples`).
    #[error(
        "runs of kind `samples` are created by ingesting samples, not planned from a definition"
    )]
    IngestOnly,
    #[error("reading the stored eval definition: {0}")]
    Definition(#[from] TextError),
    #[error("run {run_id}: {what}")]
    Corrupt { run_id: Uuid, what: String },
    #[error("{context}: {source}")]
    Database {
        context: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("a background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A rescore names no source run.
    #[error("a rescore run needs the run whose outputs it grades")]
    RescoreWithoutSource,
    /// None of the source run's recorded outputs belongs to a case of the definition.
    #[error("run {source_run} recorded no output for any test case of the definition")]
    NothingToRescore { source_run: Uuid },
    /// The gate's thresholds are out of range; `in_definition`: the definition's
    /// `settings.gate`, not the request's.
    #[error("the regression gate: {error}")]
    Gate {
        error: GateSpecError,
        in_definition: bool,
    },
}

impl LaunchError {
    /// A database error of the pool itself (a connection, a transaction), with what was being
    /// done: `.map_err(LaunchError::database("..."))`.
    pub(crate) fn database(context: &'static str) -> impl FnOnce(sqlx::Error) -> LaunchError {
        move |source| LaunchError::Database { context, source }
    }
}
