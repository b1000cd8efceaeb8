//! `/healthz`, `/readyz` and `/metrics` for supervisors and Prometheus.
//!
//! `/healthz` answers while the process runs. `/readyz` answers 200 only while the sandbox works
//! ([`crate::sandbox_gate`]), a broker session is consuming and the database answers a query:
//! a worker that lost any of them is alive (it is reconnecting, or probing its sandbox) but
//! not doing work, and the 503's body says why. The 200's body names the broker node the
//! worker consumes from (`ready: broker node 10.0.0.2:5672`), which changes when it fails over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use skilleval_infra::failover::BrokerNodes;
use skilleval_infra::store::Store;
use tokio_util::sync::CancellationToken;

use crate::metrics::WorkerMetrics;
use crate::sandbox_gate::SandboxGate;

#[derive(Debug, Clone)]
pub struct HttpState {
    pub metrics: Arc<WorkerMetrics>,
    /// Set while a broker session is consuming.
    pub consuming: Arc<AtomicBool>,
    /// The node the broker session is on.
    pub nodes: Arc<BrokerNodes>,
    pub store: Store,
    pub gate: Arc<SandboxGate>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if let Some(reason) = state.gate.reason() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}"),
        );
    }
    if !state.consuming.load(Ordering::SeqCst) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not consuming: no broker session".to_string(),
        );
    }
    match state.store.ping().await {
        Ok(()) => match state.nodes.current() {
            Some(node) => (StatusCode::OK, format!("ready: broker node {node}")),
            None => (StatusCode::OK, "ready".to_string()),
        },
        Err(e) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "database unreachable".to_string(),
            )
        }
    }
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    match state.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "encoding metrics");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// Binds `0.0.0.0:port` (0: any free port) and serves until `shutdown`.
pub async fn serve(
    port: u16,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let addr = listener.local_addr()?;
    let app = router(state);
    let handle = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "health/metrics server stopped");
        }
    });
    Ok((addr, handle))
}
