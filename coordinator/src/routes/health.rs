//! Probes, metrics and the OpenAPI document: unauthenticated.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use skilleval_infra::store::lifecycle::RunStatus;

use crate::metrics::{QueueLabels, StatusLabels};
use crate::openapi::OPENAPI_JSON;
use crate::state::AppState;

/// Liveness: the process answers HTTP.
pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Readiness: PostgreSQL answers a query and the broker connection is up; `broker_node` names
/// the node (`host:port`) the publisher is connected to, which changes when it fails over.
pub async fn readyz(State(state): State<AppState>) -> Response {
    let database = match state.store.ping().await {
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
    let node = state.sink.node().await;
    let ok = database == "ok" && broker == "ok";
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({
        "status": if ok { "ok" } else { "unavailable" },
        "checks": { "database": database, "broker": broker },
    });
    if let Some(node) = node {
        body["broker_node"] = json!(node);
    }
    (status, Json(body)).into_response()
}

/// Prometheus text exposition; the run gauges are refreshed from the database first.
pub async fn metrics(State(state): State<AppState>) -> Response {
    match state.store.gauges().await {
        Ok((by_status, unpublished)) => {
            // Every status the schema allows is reported, at 0 when no run has it, so a status
            // whose last run moved on drops to 0 instead of keeping its old count.
            for status in RunStatus::ALL {
                let n = by_status
                    .iter()
                    .find(|(s, _)| *s == status)
                    .map_or(0, |(_, n)| *n);
                state
                    .metrics
                    .runs_by_status
                    .get_or_create(&StatusLabels {
                        status: status.as_str().to_string(),
                    })
                    .set(n);
            }
            state.metrics.jobs_unpublished.set(unpublished);
        }
        Err(e) => tracing::warn!(error = %e, "metrics: could not read run gauges"),
    }
    match state.store.webhook_backlog().await {
        Ok((pending, oldest)) => {
            state.metrics.webhooks_pending.set(pending);
            state.metrics.webhooks_oldest_pending.set(oldest);
        }
        Err(e) => tracing::warn!(error = %e, "metrics: could not read the webhook backlog"),
    }
    match state.sink.queue_depths().await {
        Some(Ok(depths)) => {
            for d in depths {
                let labels = QueueLabels { queue: d.queue };
                let metrics = &state.metrics;
                metrics
                    .queue_ready
                    .get_or_create(&labels)
                    .set(i64::from(d.ready));
                metrics
                    .queue_consumers
                    .get_or_create(&labels)
                    .set(i64::from(d.consumers));
            }
            state.metrics.queue_scrape_ok.set(1);
        }
        Some(Err(e)) => {
            state.metrics.queue_scrape_ok.set(0);
            tracing::warn!(error = %e, "metrics: could not read the queues");
        }
        None => {}
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
