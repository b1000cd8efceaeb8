//! Probes, metrics and the OpenAPI document: unauthenticated.

use crate::db as runs;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::metrics::StatusLabels;
use crate::openapi::OPENAPI_JSON;
use crate::state::AppState;

/// Liveness: the process answers HTTP.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: PostgreSQL answers a query and the broker connection is up.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let database = match sqlx::query("SELECT 1").execute(&state.pool).await {
        Ok(_) => "ok".to_string(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            "unreachable".to_string()
        }
    };
    let broker = match state.sink.check().await {
        Ok(()) => "ok".to_string(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: broker unavailable");
            "unavailable".to_string()
        }
    };
    let ok = database == "ok" && broker == "ok";
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "status": if ok { "ok" } else { "unavailable" },
            "checks": { "database": database, "broker": broker },
        })),
    )
        .into_response()
}

/// Prometheus text exposition; the run gauges are refreshed from the database first.
pub async fn metrics(State(state): State<AppState>) -> Response {
    match runs::gauges(&state.pool).await {
        Ok((by_status, unpublished)) => {
            for (status, n) in by_status {
                state
                    .metrics
                    .runs_by_status
                    .get_or_create(&StatusLabels { status })
                    .set(n);
            }
            state.metrics.jobs_unpublished.set(unpublished);
        }
        Err(e) => tracing::warn!(error = %e, "metrics: could not read run gauges"),
    }
    match state.metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => crate::error::ApiError::internal(anyhow::anyhow!("encoding metrics: {e}"))
            .into_response(),
    }
}

/// The OpenAPI 3.1 document of this API.
pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON).into_response()
}
