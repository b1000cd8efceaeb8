//! A package opened and validated as an upload is, for every route that takes or rebuilds one:
//! the upload and `validate` (a ZIP from the body), the editor's download (a rebuilt ZIP), and
//! a rescore's or a preview's inline definition (the stored package with its definition
//! replaced). A refused or invalid package is the one 422 [`package_error`] makes of it, every
//! problem listed with its file and JSON pointer.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::json;
use skilleval_execution::plan::{DefinitionText, DefinitionWriter, TextError};
use skilleval_execution::validate::check_in_chunks;
use skilleval_grading::StrategyRegistry;
use skilleval_model::package::{Package, PackageError, PackageLimits, RiskReport};
use skilleval_model::problem::Problem;

use super::package_files;
use crate::error::ApiError;
use crate::state::AppState;

/// Opens and validates on the blocking pool (file system work); refusals and invalid packages
/// are 422 with every problem.
pub(crate) async fn open_package(
    zip: Bytes,
    limits: Arc<PackageLimits>,
    strategies: Arc<StrategyRegistry>,
) -> Result<OpenedPackage, Opening> {
    type Opened = (
        Package,
        Result<DefinitionText, TextError>,
        Vec<Problem>,
        Option<PackageMonitor>,
        RiskReport,
        Vec<String>,
    );
    let opened = tokio::task::spawn_blocking(move || -> Result<Opened, PackageError> {
        let mut package = Package::from_zip_bytes_streamed(&zip, &limits)?;
        // The cases are checked and written to the stored text a chunk at a time: a large
        // definition is never held whole, as the model or as text.
        let mut writer = DefinitionWriter::new();
        let mut models = BTreeSet::new();
        let validation = check_in_chunks(&mut package, &strategies, CHECK_CHUNK, |cases| {
            for case in &cases {
                add_model(&mut models, case.evaluation.options.get("model"));
                add_model(&mut models, case.metadata.extra.get("model"));
            }
            writer.write_cases(cases);
        })?;
        if let Some(runner) = &package.config.settings.runner {
            add_model(&mut models, runner.config().extra.get("model"));
        }
        if !validation.is_ok() {
            return Err(PackageError::Invalid(validation.problems));
        }
        let definition = writer.finish(&package.config);
        // Validation passed, so a `monitoring` section present is a valid monitor.
        let monitor = match skilleval_execution::monitor::from_package(&package, &strategies) {
            Ok(Some((monitor, _))) => package
                .format
                .filter(|f| *f == skilleval_model::package::EvalFormat::V2)
                .and_then(|_| {
                    skilleval_execution::monitor::definition::read_section(
                        &package.root().join(&package.eval_file),
                    )
                    .ok()
                    .flatten()
                })
                .map(|document| PackageMonitor { document, monitor }),
            _ => None,
        };
        let risk = package.risk_report();
        Ok((
            package,
            definition,
            validation.problems,
            monitor,
            risk,
            models.into_iter().collect(),
        ))
    })
    .await
    .map_err(|e| {
        Opening::Failed(ApiError::internal(anyhow::anyhow!(
            "package validation task failed: {e}"
        )))
    })?;
    let (package, definition, warnings, monitor, risk, models) =
        opened.map_err(Opening::Package)?;
    let definition =
        definition.map_err(|e| Opening::Failed(ApiError::internal(anyhow::Error::from(e))))?;
    Ok((package, definition, warnings, monitor, risk, models))
}

/// What [`open_package`] gives: the package, its definition as text, the warnings, its
/// monitor when the definition has a `monitoring` section, its risk report, and the models
/// its definition names (sorted, once each: what `GET /v1/skills?model=` filters on).
pub(crate) type OpenedPackage = (
    Package,
    DefinitionText,
    Vec<Problem>,
    Option<PackageMonitor>,
    RiskReport,
    Vec<String>,
);

/// Adds a named model (a non-empty string) to `models`: a runner's `model` option
/// (`settings.runner`), a case's `evaluation.options.model` or `metadata.model`. The cases
/// are read as validation streams them, since the package keeps none of them afterwards.
fn add_model(models: &mut BTreeSet<String>, value: Option<&serde_json::Value>) {
    if let Some(m) = value.and_then(serde_json::Value::as_str).map(str::trim) {
        if !m.is_empty() {
            models.insert(m.to_string());
        }
    }
}

/// A package's `monitoring` section: as written, and validated.
pub(crate) struct PackageMonitor {
    pub(crate) document: serde_json::Value,
    pub(crate) monitor: skilleval_execution::monitor::Monitor,
}

/// Why an upload's package could not be opened: the package's fault (counted as refused or
/// invalid), or the service's.
pub(crate) enum Opening {
    Package(PackageError),
    Failed(ApiError),
}

/// Cases checked (and converted, templated, written) at a time by an upload.
const CHECK_CHUNK: usize = 2_000;

pub(crate) fn package_error(e: PackageError) -> ApiError {
    match &e {
        PackageError::Refused {
            limit,
            entry,
            message,
        } => {
            let problem = json!({
                "file": entry.clone().unwrap_or_default(),
                "pointer": "",
                "message": message,
                "severity": "error",
                "limit": limit,
            });
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "package_refused",
                e.to_string(),
            )
            .with_details(json!({ "limit": limit, "problems": [problem] }))
        }
        // A check the service could not make is its own configuration's problem: 503, never a
        // verdict on the package.
        PackageError::Invalid(problems) if problems.iter().any(Problem::is_host) => {
            let host: Vec<&Problem> = problems.iter().filter(|p| p.is_host()).collect();
            let said: Vec<String> = host.iter().map(|p| p.message.clone()).collect();
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!(
                    "the service cannot check this package (a problem of its configuration, not of the package): {}",
                    said.join("; ")
                ),
            )
            .with_details(json!({ "problems": host }))
        }
        PackageError::Invalid(problems) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "package_invalid",
            e.to_string(),
        )
        .with_details(json!({ "problems": problems })),
        PackageError::Io { .. } => ApiError::internal(anyhow::Error::from(e)),
    }
}

/// The stored ZIP of a package the store lists (a 500 if it is gone: the rows reference it).
pub(crate) async fn stored_package(state: &AppState, hash: &str) -> Result<Vec<u8>, ApiError> {
    state
        .store
        .package_bytes(hash)
        .await?
        .ok_or_else(|| ApiError::internal(anyhow::anyhow!("package {hash} is gone")))
}

/// The file name an inline definition's problems are reported against.
pub const INLINE_DEFINITION: &str = "eval_config";

/// An inline eval definition (a rescore's `eval_config`), validated exactly as an upload's: it
/// replaces the definition in the stored package `package_hash` (so custom graders and
/// referenced files resolve as in the package), which is then opened and checked by the
/// upload's code. Problems are a **422** listing each as `{file: "eval_config", pointer,
/// message}`; the definition as text otherwise.
pub(crate) async fn inline_definition(
    state: &AppState,
    package_hash: &str,
    eval_config: &serde_json::Value,
) -> Result<DefinitionText, ApiError> {
    let bytes = stored_package(state, package_hash).await?;
    let text =
        serde_json::to_vec(eval_config).map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let limits = state.limits.clone();
    let strategies = state.strategies.clone();
    let opened = tokio::task::spawn_blocking(move || -> Result<_, PackageError> {
        let extracted = package_files::extract(&bytes, &limits)?;
        package_files::replace_definition(&extracted.root, &text)?;
        let mut package = Package::open_dir(&extracted.root, &limits)?;
        let mut writer = DefinitionWriter::new();
        let validation = check_in_chunks(&mut package, &strategies, CHECK_CHUNK, |cases| {
            writer.write_cases(cases);
        })?;
        if !validation.is_ok() {
            return Err(PackageError::Invalid(validation.problems));
        }
        Ok(writer.finish(&package.config))
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("validating eval_config failed: {e}")))?;
    match opened {
        Ok(definition) => definition.map_err(|e| ApiError::internal(anyhow::Error::from(e))),
        Err(PackageError::Invalid(problems)) => Err(package_error(PackageError::Invalid(
            problems
                .into_iter()
                .map(|mut p| {
                    if p.file == "eval/tests.json" {
                        p.file = INLINE_DEFINITION.into();
                    }
                    p
                })
                .collect(),
        ))),
        Err(e) => Err(package_error(e)),
    }
}
