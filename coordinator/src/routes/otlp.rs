//! Trace ingest over OTLP/HTTP: `POST /v1/otlp/v1/traces`, so an OpenTelemetry Collector's
//! `otlphttp` exporter (endpoint `<service>/v1/otlp`) sends production GenAI traces straight
//! to the skills' monitors.
//!
//! The body is an `ExportTraceServiceRequest`, protobuf (`application/x-protobuf`) or OTLP
//! JSON (`application/json`), optionally gzip-compressed (`Content-Encoding: gzip`). Its
//! GenAI spans become samples ([`crate::genai_spans`]); each skill's samples then go through
//! that skill's monitor exactly as a JSON batch does ([`ingest_samples`]: duplicates,
//! filters, deterministic sampling, caps, one samples run per skill and export, alerts). The
//! answer is an `ExportTraceServiceResponse` in the request's encoding; spans that could not be
//! mapped (not GenAI, no skill attribute, no messages, a skill the caller cannot see or one
//! without a monitor) are counted in its `partial_success` with the reasons, never an error
//! for the whole export.
//!
//! Limits, as for JSON samples: the body after gzip is undone is at most
//! `coordinator.sampling.max_batch_bytes` and the samples it maps to at most
//! `max_batch_samples` (413 naming the key; a collector does not retry a 413); the per-second
//! request limits apply as to every request (429 with `Retry-After`, which the collector
//! honours). Each skill's samples commit in a transaction of their own, so a failure half-way
//! (a 5xx) may leave some skills ingested: the collector's retry is then a duplicate for those.

use std::collections::BTreeMap;
use std::io::Read as _;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message as _;
use skilleval_execution::monitor::{BatchError, Sample};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::genai_spans::{map_export, MappedSample};
use crate::routes::monitoring::{batch_error, ingest_samples, read_limited};
use crate::state::AppState;

/// How the export is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

fn encoding(headers: &HeaderMap) -> Result<Encoding, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    if content_type.starts_with("application/x-protobuf") {
        Ok(Encoding::Protobuf)
    } else if content_type.starts_with("application/json") {
        Ok(Encoding::Json)
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Type must be application/x-protobuf or application/json (OTLP/HTTP), not `{content_type}`"
            ),
        )
        .with_details(serde_json::json!({
            "field": "content-type",
            "rule": "application/x-protobuf or application/json",
        })))
    }
}

/// The body with `Content-Encoding` undone, at most `limit` bytes once inflated.
fn decoded(bytes: Bytes, headers: &HeaderMap, limit: usize) -> Result<Bytes, ApiError> {
    let coding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("identity")
        .trim()
        .to_ascii_lowercase();
    match coding.as_str() {
        "" | "identity" => Ok(bytes),
        "gzip" => {
            // Read one byte past the limit: a bomb is refused without inflating it whole.
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
                .read_to_end(&mut out)
                .map_err(|e| {
                    ApiError::invalid_field(
                        "invalid_body",
                        "content-encoding",
                        format!("the body is not valid gzip: {e}"),
                    )
                })?;
            if out.len() > limit {
                return Err(batch_error(&BatchError::TooLarge {
                    bytes: out.len(),
                    limit,
                }));
            }
            Ok(Bytes::from(out))
        }
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_encoding",
            format!("Content-Encoding `{other}` is not supported: send gzip or none"),
        )
        .with_details(serde_json::json!({
            "field": "content-encoding",
            "rule": "gzip or identity",
        }))),
    }
}

fn decode(bytes: &[u8], encoding: Encoding) -> Result<ExportTraceServiceRequest, ApiError> {
    match encoding {
        Encoding::Protobuf => ExportTraceServiceRequest::decode(bytes).map_err(|e| {
            ApiError::invalid_field(
                "invalid_body",
                "",
                format!("the body is not an OTLP ExportTraceServiceRequest (protobuf): {e}"),
            )
        }),
        Encoding::Json => serde_json::from_slice(bytes).map_err(|e| {
            ApiError::invalid_field(
                "invalid_body",
                "",
                format!("the body is not an OTLP ExportTraceServiceRequest (JSON): {e}"),
            )
        }),
    }
}

fn respond(encoding: Encoding, response: &ExportTraceServiceResponse) -> Response {
    match encoding {
        Encoding::Protobuf => (
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            response.encode_to_vec(),
        )
            .into_response(),
        Encoding::Json => match serde_json::to_vec(response) {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(e) => ApiError::internal(anyhow::Error::from(e)).into_response(),
        },
    }
}

/// `POST /v1/otlp/v1/traces`.
#[tracing::instrument(skip_all)]
pub async fn traces(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    request: Request,
) -> Result<Response, ApiError> {
    let headers = request.headers().clone();
    let encoding = encoding(&headers)?;
    let limit = state.sampling.max_batch_bytes;
    let raw = read_limited(request.into_body(), &headers, limit).await?;
    let body = decoded(raw, &headers, limit)?;
    let export = decode(&body, encoding)?;
    drop(body);
    let mut mapping = map_export(&export, &state.sampling.otlp_skill_attributes);
    drop(export);
    let max = state.sampling.max_batch_samples;
    if mapping.samples.len() > max {
        return Err(batch_error(&BatchError::TooMany {
            count: mapping.samples.len(),
            limit: max,
        }));
    }
    let mut by_skill: BTreeMap<String, Vec<MappedSample>> = BTreeMap::new();
    for mapped in std::mem::take(&mut mapping.samples) {
        by_skill
            .entry(mapped.skill.clone())
            .or_default()
            .push(mapped);
    }
    let viewer = principal.viewer();
    let (mut sampled, mut duplicates) = (0u64, 0u64);
    for (skill, mapped) in by_skill {
        let spans: u64 = mapped.iter().map(|m| m.spans).sum();
        let Some(skill_id) = state.store.visible_skill(viewer, &skill).await? else {
            mapping.reject(format!("skill `{skill}` does not exist"), spans);
            continue;
        };
        let Some(stored) = state.store.current_monitor(skill_id).await? else {
            mapping.reject(
                format!("skill `{skill}` has no monitor (PUT /v1/skills/{skill}/monitor)"),
                spans,
            );
            continue;
        };
        let samples: Vec<Sample> = mapped.into_iter().map(|m| m.sample).collect();
        let out = ingest_samples(&state, skill_id, &stored, samples, Vec::new()).await?;
        sampled += out.sampled;
        duplicates += out.duplicates;
    }
    let rejected = mapping.rejected_spans();
    tracing::info!(sampled, duplicates, rejected, "trace export ingested");
    let response = ExportTraceServiceResponse {
        partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
            rejected_spans: i64::try_from(rejected).unwrap_or(i64::MAX),
            error_message: mapping.message(),
        }),
    };
    Ok(respond(encoding, &response))
}
