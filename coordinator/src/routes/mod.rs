//! The HTTP API: one file per area, all registered here from one table.
//!
//! [`ROUTES`] and [`router`] come from the same macro invocation, so the list of what the
//! router serves cannot drift from the router; the OpenAPI test compares that list with the
//! document's paths both ways.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use axum::Router;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::access::guard;
use crate::error::{log_server_errors, ApiError};
use crate::extract::refuse_nul;
use crate::metrics::HttpLabels;
use crate::state::AppState;

pub mod admin;
pub mod collisions;
pub mod comparisons;
pub mod editor;
pub mod exports;
pub mod fields;
pub mod health;
pub mod history;
pub mod lists;
pub mod matrix;
pub mod monitoring;
pub mod otlp;
pub(crate) mod package_files;
pub mod preview;
pub mod reports;
pub mod reviews;
pub mod runs;
pub mod skills;
pub mod tenancy;
pub(crate) mod validation;

/// Longest a request may take (uploads included) before it gets a 408.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

macro_rules! routes {
    ($($method:ident $path:literal => $handler:path;)*) => {
        /// Every (method, path template) the router serves.
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),*];

        fn api_routes() -> Router<AppState> {
            Router::new()$(.route($path, $method($handler)))*
        }
    };
}

routes! {
    post "/v1/skills" => skills::upload;
    get "/v1/skills" => lists::skills;
    get "/v1/runs" => lists::runs;
    get "/v1/skills/{name}/versions" => skills::versions;
    get "/v1/skills/{name}/history" => history::history;
    get "/v1/skills/{name}/benchmark" => history::benchmark;
    get "/v1/skills/{name}/collisions" => collisions::get_collisions;
    post "/v1/comparisons" => comparisons::create;
    get "/v1/comparisons/{id}" => comparisons::get_comparison;
    put "/v1/skills/{name}/monitor" => monitoring::put_monitor;
    get "/v1/skills/{name}/monitor" => monitoring::get_monitor;
    post "/v1/skills/{name}/samples" => monitoring::ingest;
    get "/v1/skills/{name}/quality" => monitoring::quality;
    get "/v1/skills/{name}/alerts" => monitoring::alerts;
    post "/v1/otlp/v1/traces" => otlp::traces;
    post "/v1/runs" => runs::create;
    get "/v1/runs/{id}" => runs::get_run;
    get "/v1/runs/{id}/results" => runs::results;
    get "/v1/runs/{id}/report" => runs::report;
    post "/v1/runs/{id}/cancel" => runs::cancel;
    get "/v1/admin/parked" => admin::list_parked;
    post "/v1/admin/parked/{id}/requeue" => admin::requeue_parked;
    post "/v1/runs/{id}/rescore" => runs::rescore;
    get "/v1/openapi.json" => health::openapi;
    get "/healthz" => health::healthz;
    get "/readyz" => health::readyz;
    get "/metrics" => health::metrics;
    delete "/v1/runs/{id}" => tenancy::delete_run;
    delete "/v1/skills/{name}" => tenancy::delete_skill;
    delete "/v1/skills/{name}/versions/{version}" => tenancy::delete_version;
    post "/v1/admin/tokens" => tenancy::create_token;
    get "/v1/admin/tokens" => tenancy::list_tokens;
    delete "/v1/admin/tokens/{id}" => tenancy::revoke_token;
    get "/v1/admin/audit" => tenancy::audit;
    post "/v1/skills/validate" => skills::validate;
    post "/v1/runs/{id}/reviews" => reviews::create;
    get "/v1/runs/{id}/reviews" => reviews::list;
    get "/v1/runs/{id}/feedback" => reviews::feedback;
    get "/v1/runs/{id}/workspace" => exports::workspace_zip;
    get "/v1/skills/{name}/agreement" => reviews::agreement;
    post "/v1/skills/{name}/preview" => preview::preview;
    get "/v1/skills/{name}/versions/{version}/definition" => editor::definition;
    post "/v1/skills/{name}/versions/{version}/package" => editor::package;
    post "/v1/schemas/check" => editor::check_schema;
    post "/v1/reports" => reports::create;
    get "/v1/reports/{id}" => reports::get_report;
    post "/v1/matrix" => matrix::create;
    get "/v1/matrix/{id}" => matrix::get_matrix;
}

/// The whole application: routes, access (auth, scopes, limits, visibility, audit), error logging, metrics, tracing, timeouts.
pub fn router(state: AppState) -> Router {
    api_routes()
        .merge(crate::ui::routes())
        .fallback(not_found)
        .layer(middleware::from_fn(refuse_nul))
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        .layer(middleware::from_fn(log_server_errors))
        .layer(TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(server_span)
                .on_response(record_response),
        )
        .with_state(state)
}

/// The SERVER span of a request (HTTP semantic conventions), continuing the caller's trace
/// when it sent a `traceparent`.
fn server_span<B>(request: &Request<B>) -> tracing::Span {
    let method = request.method().as_str();
    let path = request.uri().path();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let span = tracing::info_span!(
        "HTTP request",
        otel.name = %format_args!("{method} {}", route.unwrap_or(path)),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method,
        http.route = route,
        url.path = path,
        http.response.status_code = tracing::field::Empty,
    );
    let traceparent = request
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok());
    skilleval_infra::telemetry::set_parent(&span, traceparent);
    span
}

fn record_response<B>(
    response: &axum::http::Response<B>,
    _latency: Duration,
    span: &tracing::Span,
) {
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
}

async fn not_found(request: Request) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no route for {} {}", request.method(), request.uri().path()),
    )
    .with_details(serde_json::json!({ "see": "/v1/openapi.json" }))
}

async fn record_metrics(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let labels = HttpLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    state.metrics.http_requests.get_or_create(&labels).inc();
    state
        .metrics
        .http_duration
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}
