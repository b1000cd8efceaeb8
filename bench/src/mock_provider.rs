//! The 50 ms OpenAI-compatible provider both model-backed benchmarks (`llm_bench` and
//! `pipeline_bench`) run against, so the two measure against the same server: a child process on a multi-threaded runtime answering every
//! chat completion after [`LATENCY`] with a valid completion, counting what it served.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};

/// How long the provider takes to answer.
pub const LATENCY: Duration = Duration::from_millis(50);

/// What the provider counts.
#[derive(Default)]
struct Load {
    served: AtomicU64,
    in_flight: AtomicU64,
    peak: AtomicU64,
}

async fn complete(State(load): State<Arc<Load>>, body: Bytes) -> axum::Json<Value> {
    let now = load.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    load.peak.fetch_max(now, Ordering::SeqCst);
    // Read the request as a provider would.
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock-model")
        .to_string();
    tokio::time::sleep(LATENCY).await;
    load.in_flight.fetch_sub(1, Ordering::SeqCst);
    load.served.fetch_add(1, Ordering::SeqCst);
    axum::Json(json!({
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Your refund for order 4217 was approved; the money reaches your card within five business days."},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 120, "completion_tokens": 24, "total_tokens": 144}
    }))
}

/// `GET /stats`: `{"served": completions answered so far, "peak": the most requests in flight
/// at once since the last call (then reset)}`.
async fn stats(State(load): State<Arc<Load>>) -> axum::Json<Value> {
    let peak = load
        .peak
        .swap(load.in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
    axum::Json(json!({ "served": load.served.load(Ordering::SeqCst), "peak": peak }))
}

/// Serves on 127.0.0.1:0 until killed; prints the address on stdout first.
pub fn serve() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("{}", listener.local_addr()?);
        std::io::stdout().flush()?;
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/stats", get(stats))
            .with_state(Arc::new(Load::default()));
        axum::serve(listener, app).await?;
        Ok(())
    })
}
