//! `POST /v1/skills/{name}/preview`: one case of a stored version graded against a pasted
//! output, by the same executor and strategies as a worker (the `given` runner carries the
//! output), storing nothing. What a test-case editor shows before a definition is changed.
//!
//! The coordinator has no model providers: a case whose strategy needs a model comes back
//! `errored` with the provider error, as it would on a worker without providers.

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::plan::CaseFilter;
use skilleval_model::definition::{Given, RunnerConfig};
use skilleval_model::package::Package;

use super::editor::find_version;
use super::validation::stored_package;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::runs::definition::read_definition;
use crate::state::AppState;

/// Longest output accepted.
const MAX_OUTPUT_BYTES: usize = 512 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreviewBody {
    /// The version label (default: the newest version).
    #[serde(default)]
    pub version: Option<String>,
    pub test_case_id: String,
    pub output: String,
    /// Tool calls the output made (for `tool_usage`), as a run records them.
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// An edited eval definition (`eval/tests.json` v2) to take the case from instead of the
    /// stored one: validated as an upload's (422 `package_invalid` listing every problem, file
    /// `eval_config`), in the version's package. What the test-case editor sends.
    #[serde(default)]
    pub definition: Option<Value>,
}

fn unprocessable(field: &str, rule: impl Into<String>) -> ApiError {
    ApiError::unprocessable_field("invalid_preview", field, rule)
}

/// `POST /v1/skills/{name}/preview` → **200** the case's result (`JobResult`), nothing stored.
#[tracing::instrument(skip_all, fields(skill = %name))]
pub async fn preview(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<PreviewBody>,
) -> Result<Json<Value>, ApiError> {
    if body.output.len() > MAX_OUTPUT_BYTES {
        return Err(unprocessable(
            "/output",
            format!("at most {MAX_OUTPUT_BYTES} bytes"),
        ));
    }
    let version = find_version(&state, &name, body.version.as_deref())
        .await?
        .ok_or_else(|| unprocessable("/version", format!("`{name}` has no such version")))?;
    let package_bytes = stored_package(&state, &version.package_hash).await?;
    let edited = match &body.definition {
        None => None,
        Some(d) if !d.is_object() => {
            return Err(unprocessable(
                "/definition",
                "must be a JSON object (an eval/tests.json v2)",
            ))
        }
        Some(d) => Some(
            crate::routes::validation::inline_definition(&state, &version.package_hash, d).await?,
        ),
    };
    let limits = state.limits.clone();
    let case_id = body.test_case_id.clone();
    let hash = version.package_hash.clone();
    // Parsing the definition and extracting the package are blocking work.
    let planned = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let definition = match edited {
            Some(d) => d,
            None => read_definition(version.config)?,
        };
        let mut found = None;
        definition.plan_chunks(
            &hash,
            uuid::Uuid::nil(),
            &CaseFilter {
                case_ids: vec![case_id],
                ..CaseFilter::default()
            },
            None,
            1,
            |jobs| {
                found = jobs.into_iter().next();
                false
            },
        )?;
        let package = Package::from_zip_bytes(&package_bytes, &limits, None)?;
        Ok((found, package))
    })
    .await
    .map_err(|e| ApiError::internal(anyhow::anyhow!("preview task failed: {e}")))??;
    let (Some(mut job), package) = planned else {
        return Err(unprocessable(
            "/test_case_id",
            format!(
                "`{}` is no case of this version{}",
                body.test_case_id,
                if body.definition.is_some() {
                    "'s edited definition"
                } else {
                    ""
                }
            ),
        ));
    };
    job.runner = RunnerConfig {
        kind: "given".into(),
        script: None,
        provider: None,
        extra: Default::default(),
    };
    job.given = Some(Given {
        output: body.output,
        tool_calls: body.tool_calls,
    });
    job.retry_count = 0;
    let executor = ExecutorBuilder::new().build();
    let result = executor.execute(&job, package.root()).await;
    Ok(Json(json!(result)))
}
