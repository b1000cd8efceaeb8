//! The one HTTP error type: every handler and extractor fails with an [`ApiError`], which renders
//! as `{"error": {"code", "message", "details"}}`.
//!
//! A 4xx says which field broke which rule (`details.field`, `details.rule`). A 5xx body is
//! generic: its cause rides in the response's extensions to [`log_server_errors`], which logs
//! it once, so internals never reach a client and no error is logged twice.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use skilleval_execution::plan::PlanError;

use skilleval_infra::store::runs::RunRow;
use skilleval_infra::store::StoreError;

use crate::runs::error::LaunchError;

/// An HTTP error response (boxed: handlers return it in `Result`s, keep those small).
#[derive(Debug)]
pub struct ApiError(Box<ApiErrorBody>);

/// What an [`ApiError`] says.
#[derive(Debug)]
pub struct ApiErrorBody {
    pub status: StatusCode,
    /// Stable, machine-readable (`not_found`, `invalid_body`, `package_invalid`, ...).
    pub code: &'static str,
    pub message: String,
    pub details: Value,
    /// For 5xx only: what really happened, logged, never sent.
    cause: Option<anyhow::Error>,
}

/// The cause of a 5xx, carried from [`ApiError::into_response`] to [`log_server_errors`].
#[derive(Debug, Clone)]
pub struct ServerErrorCause(pub Arc<anyhow::Error>);

impl std::ops::Deref for ApiError {
    type Target = ApiErrorBody;

    fn deref(&self) -> &ApiErrorBody {
        &self.0
    }
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError(Box::new(ApiErrorBody {
            status,
            code,
            message: message.into(),
            details: Value::Null,
            cause: None,
        }))
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.0.details = details;
        self
    }

    /// The field a 4xx names (`details.field`), if it names one.
    pub fn field(&self) -> Option<&str> {
        self.0.details.get("field").and_then(Value::as_str)
    }

    /// The same error naming `field` instead, in its message and details (an HTML form names
    /// its inputs, not the JSON pointers of the API body it was turned into).
    pub fn naming_field(mut self, field: &str) -> Self {
        if let Some(rule) = self.0.details.get("rule").and_then(Value::as_str) {
            self.0.message = format!("`{field}`: {rule}");
        }
        if let Some(details) = self.0.details.as_object_mut() {
            details.insert("field".to_string(), Value::from(field));
        }
        self
    }

    fn with_cause(mut self, cause: anyhow::Error) -> Self {
        self.0.cause = Some(cause);
        self
    }

    /// 400 naming the field (a JSON pointer or parameter name) and the rule it broke.
    pub fn invalid_field(code: &'static str, field: &str, rule: impl Into<String>) -> Self {
        let rule = rule.into();
        let shown = if field.is_empty() {
            "the body".to_string()
        } else {
            format!("`{field}`")
        };
        ApiError::new(StatusCode::BAD_REQUEST, code, format!("{shown}: {rule}"))
            .with_details(json!({ "field": field, "rule": rule }))
    }

    /// 422 naming the field (a JSON pointer or parameter name) and the rule it broke: the
    /// request parsed, but asks for what the service does not have or allow.
    pub fn unprocessable_field(code: &'static str, field: &str, rule: impl Into<String>) -> Self {
        let rule = rule.into();
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            code,
            format!("`{field}`: {rule}"),
        )
        .with_details(json!({ "field": field, "rule": rule }))
    }

    pub fn not_found(what: &str, id: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} `{id}`"),
        )
        .with_details(json!({ "resource": what, "id": id.to_string() }))
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    /// 409 `run_not_finished`: what asks for a run's final results before it has them;
    /// `then` says what becomes available once it has finished.
    pub fn run_not_finished(run: &RunRow, then: &str) -> Self {
        ApiError::conflict(
            "run_not_finished",
            format!(
                "run {} has not finished ({} of {} cases done){then}",
                run.id, run.counters.completed, run.counters.total
            ),
        )
        .with_details(json!({ "status": run.status }))
    }

    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer <token>` header is required",
        )
    }

    /// 413 naming the configuration key that sets the limit.
    pub fn payload_too_large(limit_key: &str, limit_bytes: u64) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body is larger than {limit_bytes} bytes (limit {limit_key})"),
        )
        .with_details(json!({ "limit": limit_key, "limit_bytes": limit_bytes }))
    }

    /// 429 naming the limit (its configuration key) that was reached; the response carries
    /// `Retry-After` (whole seconds, at least 1) from `details.retry_after_secs`.
    pub fn too_many_requests(
        limit: &str,
        message: impl Into<String>,
        retry_after_secs: u64,
    ) -> Self {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
            .with_details(json!({ "limit": limit, "retry_after_secs": retry_after_secs.max(1) }))
    }

    /// 403: the token lacks the scope the route needs (a property of the route, not of any
    /// object, so it discloses nothing).
    pub fn forbidden_scope(scope: &str) -> Self {
        ApiError::new(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            format!("this request needs a token with the `{scope}` scope"),
        )
        .with_details(json!({ "scope": scope }))
    }

    /// 500 with a generic body; `cause` is logged once by [`log_server_errors`].
    pub fn internal(cause: impl Into<anyhow::Error>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; the cause has been logged",
        )
        .with_cause(cause.into())
    }

    /// 503 for a dependency that is down (readiness, a broker that refused a publish).
    pub fn unavailable(cause: impl Into<anyhow::Error>) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "a dependency of the service is unavailable; retry later",
        )
        .with_cause(cause.into())
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::internal(e)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::internal(e)
    }
}

impl From<LaunchError> for ApiError {
    fn from(e: LaunchError) -> Self {
        match e {
            LaunchError::VersionNotFound(id) => ApiError::not_found("version", id),
            LaunchError::RunNotFound(id) => ApiError::not_found("run", id),
            LaunchError::Filter(e) => {
                let field = match e {
                    PlanError::UnknownSuite(..) => "suite",
                    PlanError::UnknownCase(..) => "test_cases",
                    PlanError::Empty { .. } => "tags",
                };
                let rule = e.to_string();
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "plan_invalid",
                    rule.clone(),
                )
                .with_details(json!({ "field": field, "rule": rule }))
            }
            LaunchError::IngestOnly => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "kind_unsupported",
                LaunchError::IngestOnly.to_string(),
            )
            .with_details(json!({ "field": "kind", "rule": "samples runs are created by POST /v1/skills/{name}/samples" })),
            LaunchError::RescoreWithoutSource => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "kind_unsupported",
                e.to_string(),
            )
            .with_details(json!({ "field": "kind", "rule": "rescore runs are created by POST /v1/runs/{id}/rescore" })),
            LaunchError::NothingToRescore { .. } => {
                let rule = e.to_string();
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "nothing_to_rescore",
                    rule.clone(),
                )
                .with_details(json!({ "field": "/version_id", "rule": rule }))
            }
            LaunchError::Gate {
                error,
                in_definition,
            } => {
                let field = if in_definition {
                    format!("eval/tests.json#/settings/gate/{}", error.field)
                } else {
                    format!("/gate/{}", error.field)
                };
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_gate",
                    format!("`{field}`: {}", error.rule),
                )
                .with_details(json!({ "field": field, "rule": error.rule }))
            }
            other => ApiError::internal(other),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::internal(e)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let ApiErrorBody {
            status,
            code,
            message,
            details,
            cause,
        } = *self.0;
        let retry_after = (status == StatusCode::TOO_MANY_REQUESTS)
            .then(|| details.get("retry_after_secs").and_then(Value::as_u64))
            .flatten();
        let body = json!({ "error": { "code": code, "message": message, "details": details } });
        let mut response = (status, axum::Json(body)).into_response();
        if let Some(secs) = retry_after {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(secs),
            );
        }
        if let Some(cause) = cause {
            response
                .extensions_mut()
                .insert(ServerErrorCause(Arc::new(cause)));
        }
        response
    }
}

/// Logs the cause of every 5xx once, with the request it answered.
pub async fn log_server_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    if let Some(ServerErrorCause(cause)) = response.extensions().get::<ServerErrorCause>() {
        tracing::error!(%method, %path, status = response.status().as_u16(), error = ?cause, "request failed");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn server_errors_hide_their_cause() {
        let response = ApiError::internal(anyhow::anyhow!("password=hunter2")).into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.extensions().get::<ServerErrorCause>().is_some());
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("\"code\":\"internal\""));
    }

    #[test]
    fn invalid_field_names_field_and_rule() {
        let e = ApiError::invalid_field("invalid_body", "version_id", "must be a UUID");
        assert_eq!(e.message, "`version_id`: must be a UUID");
        assert_eq!(e.details["field"], "version_id");
        assert_eq!(e.details["rule"], "must be a UUID");
    }
}
