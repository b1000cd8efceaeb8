//! Bearer-token authentication for the `/v1` API, on only when tokens are configured.
//!
//! Health, readiness, metrics and the OpenAPI document stay open: probes and scrapers carry no
//! token, and the document describes how to authenticate.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The accepted tokens; empty means authentication is off.
#[derive(Clone, Default)]
pub struct Tokens(Arc<Vec<Vec<u8>>>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} configured)", self.0.len())
    }
}

impl Tokens {
    pub fn new<I, S>(tokens: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Tokens(Arc::new(
            tokens
                .into_iter()
                .map(|t| t.as_ref().trim().as_bytes().to_vec())
                .filter(|t| !t.is_empty())
                .collect(),
        ))
    }

    pub fn enabled(&self) -> bool {
        !self.0.is_empty()
    }

    /// Whether `candidate` is one of the tokens, comparing in constant time per token.
    pub fn accepts(&self, candidate: &[u8]) -> bool {
        self.0.iter().fold(false, |found, token| {
            found | constant_time_eq(token, candidate)
        })
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Paths served without a token.
fn is_open(path: &str) -> bool {
    matches!(
        path,
        "/healthz" | "/readyz" | "/metrics" | "/v1/openapi.json"
    ) || !path.starts_with("/v1/")
}

/// Rejects `/v1` requests without a configured bearer token (when any is configured).
pub async fn require_bearer(
    State(tokens): State<Tokens>,
    request: Request,
    next: Next,
) -> Response {
    if !tokens.enabled() || is_open(request.uri().path()) {
        return next.run(request).await;
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    match presented {
        Some(token) if tokens.accepts(token.as_bytes()) => next.run(request).await,
        _ => {
            let mut response = ApiError::unauthorized().into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_exactly() {
        let t = Tokens::new(["alpha", " beta ", ""]);
        assert!(t.enabled());
        assert!(t.accepts(b"alpha"));
        assert!(t.accepts(b"beta"));
        assert!(!t.accepts(b"alph"));
        assert!(!t.accepts(b""));
        assert!(!Tokens::new(Vec::<String>::new()).enabled());
    }

    #[test]
    fn probes_are_open() {
        assert!(is_open("/healthz"));
        assert!(is_open("/v1/openapi.json"));
        assert!(!is_open("/v1/runs"));
    }
}
