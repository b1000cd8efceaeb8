//! A finished run as skill-creator's files: `GET /v1/runs/{id}/workspace` answers a ZIP of
//! the run as one skill-creator iteration folder (every attempt's `grading.json`,
//! `timing.json`, `eval_metadata.json` and `outputs/`, and `benchmark.json`), built by the code
//! `skilleval run` writes its own folder with ([`skilleval_reports::skill_creator`]);
//! `skilleval export --skill-creator --server` unpacks it.
//!
//! Results do not carry what their case asked; the prompts come from the run's plan.

use std::collections::BTreeMap;
use std::io::{Cursor, Write};

use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use skilleval_analysis::benchmark::BenchmarkMetadata;
use skilleval_reports::artifacts::EvalInput;
use skilleval_reports::skill_creator::{service_skill_path, workspace, WorkspaceFile};
use uuid::Uuid;

use crate::error::ApiError;
use crate::extract::parse_uuid;
use crate::results::load_results;
use crate::state::AppState;

/// What each case of the run asked, from its plan.
async fn inputs_of(
    state: &AppState,
    run_id: Uuid,
) -> Result<BTreeMap<String, EvalInput>, ApiError> {
    let plan = state.planner.plan_of(run_id).await?;
    let mut chunks = plan.chunks(0, usize::MAX);
    let mut inputs = BTreeMap::new();
    while let Some(chunk) = chunks.recv().await {
        for job in chunk? {
            inputs
                .entry(job.case.id.clone())
                .or_insert_with(|| EvalInput {
                    prompt: job.case.input.prompt.clone(),
                    files: job.case.input.files.clone(),
                    assertions: job.case.expected.assertions.clone(),
                });
        }
    }
    Ok(inputs)
}

/// The files as a ZIP, in the order given.
fn zip_files(files: &[WorkspaceFile]) -> std::io::Result<Vec<u8>> {
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    for f in files {
        writer
            .start_file(f.path.as_str(), options)
            .map_err(std::io::Error::other)?;
        writer.write_all(&f.bytes)?;
    }
    Ok(writer.finish().map_err(std::io::Error::other)?.into_inner())
}

/// `GET /v1/runs/{id}/workspace`: **200** `application/zip`; **409** `run_not_finished`.
#[tracing::instrument(skip_all, fields(run_id = %id))]
pub async fn workspace_zip(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run_id = parse_uuid("id", &id)?;
    let run = state
        .store
        .get_run(run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run", run_id))?;
    if !run.finalised {
        return Err(ApiError::run_not_finished(
            &run,
            ": its files are written once it has",
        ));
    }
    let results = load_results(&state.store, run_id).await?;
    let inputs = inputs_of(&state, run_id).await?;
    let meta = BenchmarkMetadata::of(
        &run.skill,
        &service_skill_path(&run.skill, &run.version),
        &run.created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        &results,
    );
    let files = workspace(&results, &inputs, &meta, &[]);
    let bytes = tokio::task::spawn_blocking(move || zip_files(&files))
        .await
        .map_err(|e| ApiError::internal(anyhow::anyhow!("zipping the workspace failed: {e}")))?
        .map_err(|e| ApiError::internal(anyhow::anyhow!("zipping the workspace failed: {e}")))?;
    let mut response = (StatusCode::OK, bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/zip"),
    );
    let file_name = format!("{}-{run_id}-skill-creator.zip", run.skill);
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{file_name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}
