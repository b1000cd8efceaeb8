//! `skilleval-worker`: configuration, telemetry, signals; everything else is in the library.

use std::sync::Arc;

use anyhow::Context as _;
use skilleval_infra::config::Settings;
use skilleval_infra::store::Store;
use skilleval_infra::telemetry;
use skilleval_worker::Worker;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = Settings::load().context("loading configuration")?;
    let mut telemetry = telemetry::init(&settings.log, &settings.telemetry, "skilleval-worker")
        .context("setting up logging and tracing")?;
    let store = Store::connect(&settings.database)
        .await
        .context("connecting to the database")?;
    let worker = Arc::new(
        Worker::new(settings, store)
            .context("building the worker")?
            .with_evaluation_events(telemetry.evaluations()),
    );

    let shutdown = CancellationToken::new();
    tokio::spawn(signal_shutdown(shutdown.clone()));
    let (addr, http) = worker
        .serve_http(shutdown.clone())
        .await
        .context("starting the health/metrics server")?;
    tracing::info!(%addr, "health and metrics listening");

    let outcome = worker.run(shutdown.clone()).await;
    shutdown.cancel();
    let _ = http.await;
    // After a SIGTERM too: the last jobs' spans are exported before the exit.
    telemetry.shutdown();
    outcome.context("the worker stopped")
}

/// Cancels `shutdown` on SIGTERM or ctrl-c.
async fn signal_shutdown(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only ctrl-c stops the worker");
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("ctrl-c: shutting down"),
    }
    shutdown.cancel();
}
