//! The test-case editor's endpoints: a stored version's eval definition as JSON, a JSON
//! Schema compiled as typed, and the version's package rebuilt around an edited definition.
//!
//! An edited definition always becomes `eval/tests.json` (v2, the canonical model every
//! format converts into); the package's other eval files are dropped, as for a rescore's
//! inline `eval_config`. The rebuilt ZIP is validated by the upload's own code
//! ([`super::validation::open_package`]) before it is handed out.

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use skilleval_model::package::{EvalFormat, Package, PackageError, PackageLimits};

use super::package_files;
use super::validation::{open_package, package_error, stored_package, Opening};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use skilleval_infra::store::versions::VersionForRun;

/// `name`'s version labelled `label` (the newest when `None`) with its definition: 404 when
/// there is no such skill, `None` when it has no such version.
pub(crate) async fn find_version(
    state: &AppState,
    name: &str,
    label: Option<&str>,
) -> Result<Option<VersionForRun>, ApiError> {
    let (_, versions) = state
        .store
        .versions_of(name)
        .await?
        .ok_or_else(|| ApiError::not_found("skill", name))?;
    // Newest first.
    let row = match label {
        None => versions.first(),
        Some(label) => versions.iter().find(|v| v.version == label),
    };
    let Some(row) = row else {
        return Ok(None);
    };
    let mut conn = state.store.pool().acquire().await?;
    let version = state
        .store
        .version_for_run(&mut conn, row.version_id)
        .await?
        .ok_or_else(|| ApiError::not_found("version", row.version_id))?;
    Ok(Some(version))
}

/// The stored package (hash, ZIP bytes) of `name`'s version labelled `label`.
pub(crate) async fn version_package(
    state: &AppState,
    name: &str,
    label: &str,
) -> Result<(String, Vec<u8>), ApiError> {
    let version = find_version(state, name, Some(label))
        .await?
        .ok_or_else(|| ApiError::not_found("version", label))?;
    let bytes = stored_package(state, &version.package_hash).await?;
    Ok((version.package_hash, bytes))
}

/// `GET /v1/skills/{name}/versions/{version}/definition` → **200** `{skill, version,
/// eval_file, converted, definition}`: a v2 `eval/tests.json` as written (every field kept);
/// any other format as converted into v2 (`converted: true`; prompts already templated).
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn definition(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let (_, bytes) = version_package(&state, &name, &version).await?;
    let limits = state.limits.clone();
    let (eval_file, converted, definition) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<(String, bool, Value)> {
            let package = Package::from_zip_bytes(&bytes, &limits, None)?;
            if package.format == Some(EvalFormat::V2) {
                let text = std::fs::read(package.root().join(&package.eval_file))?;
                return Ok((package.eval_file, false, serde_json::from_slice(&text)?));
            }
            Ok((
                package.eval_file.clone(),
                true,
                serde_json::to_value(&package.config)?,
            ))
        })
        .await
        .map_err(|e| ApiError::internal(anyhow::anyhow!("reading the definition failed: {e}")))?
        .map_err(ApiError::internal)?;
    Ok(Json(json!({
        "skill": name,
        "version": version,
        "eval_file": eval_file,
        "converted": converted,
        "definition": definition,
    })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaBody {
    pub schema: Value,
}

/// `POST /v1/schemas/check` → **200** `{valid, draft?, errors}`: the schema checked against its
/// draft's meta-schema and compiled as the `json_schema` strategy compiles it (offline, no
/// remote `$ref`). A schema that does not compile is a successful check listing why.
pub async fn check_schema(ApiJson(body): ApiJson<SchemaBody>) -> Json<Value> {
    use skilleval_schema::{compile_schema, declared_draft};
    let draft = declared_draft(&body.schema).ok().flatten();
    match compile_schema(&body.schema) {
        Ok(_) => Json(json!({
            "valid": true,
            "draft": draft.map_or("2020-12", draft_label),
            "errors": [],
        })),
        Err(errors) => Json(json!({ "valid": false, "errors": errors })),
    }
}

fn draft_label(draft: jsonschema::Draft) -> &'static str {
    match draft {
        jsonschema::Draft::Draft4 => "4",
        jsonschema::Draft::Draft6 => "6",
        jsonschema::Draft::Draft7 => "7",
        jsonschema::Draft::Draft201909 => "2019-09",
        _ => "2020-12",
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackageBody {
    /// The edited eval definition (`eval/tests.json` v2).
    pub definition: Value,
}

/// `POST /v1/skills/{name}/versions/{version}/package` → **200** `application/zip`: the
/// version's stored package with `definition` as its `eval/tests.json`, validated as an
/// upload is; **422** `package_invalid` listing every problem (file and JSON pointer).
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn package(
    State(state): State<AppState>,
    Path((name, version)): Path<(String, String)>,
    ApiJson(body): ApiJson<PackageBody>,
) -> Result<Response, ApiError> {
    if !body.definition.is_object() {
        return Err(ApiError::unprocessable_field(
            "invalid_body",
            "/definition",
            "must be a JSON object (an eval/tests.json v2)",
        ));
    }
    let (_, bytes) = version_package(&state, &name, &version).await?;
    let zip = rebuild(state.limits.clone(), bytes, body.definition).await?;
    let zip = axum::body::Bytes::from(zip);
    match open_package(zip.clone(), state.limits.clone(), state.strategies.clone()).await {
        Ok(_) => {}
        Err(Opening::Package(e)) => return Err(package_error(e)),
        Err(Opening::Failed(e)) => return Err(e),
    }
    let file_name: String = format!("{name}-{version}-edited.zip")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut response = (StatusCode::OK, zip).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/zip"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{file_name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}

/// The stored ZIP with its eval files replaced by `definition` as `eval/tests.json`.
async fn rebuild(
    limits: std::sync::Arc<PackageLimits>,
    bytes: Vec<u8>,
    definition: Value,
) -> Result<Vec<u8>, ApiError> {
    let text = serde_json::to_vec_pretty(&definition)
        .map_err(|e| ApiError::internal(anyhow::Error::from(e)))?;
    let built = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, PackageError> {
        let package = package_files::extract(&bytes, &limits)?;
        package_files::replace_definition(&package.root, &text)?;
        package_files::zip_tree(&package.root)
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("rebuilding the package failed: {e}")))?;
    built.map_err(package_error)
}
