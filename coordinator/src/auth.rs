//! Bearer-token authentication for the `/v1` API and the `/ui/` pages, on only when tokens
//! are configured.
//!
//! Health, readiness, metrics and the OpenAPI document stay open: probes and scrapers carry no
//! token, and the document describes how to authenticate. A browser signs in once on
//! `/ui/login` with a token, which is kept in an `HttpOnly`, `SameSite=Strict` cookie and
//! accepted like the bearer header. Requests that change state are refused when they come
//! from another site: an `Origin` (or `Sec-Fetch-Site`) that is not this server's, or a
//! cookie-authenticated one that carries neither.

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
        "/healthz" | "/readyz" | "/metrics" | "/v1/openapi.json" | "/ui/login"
    ) || path.starts_with("/ui/static/")
        || !(path.starts_with("/v1/") || path.starts_with("/ui"))
}

/// The cookie a signed-in browser carries: the token, hex-encoded (a token may hold any
/// character; a cookie value may not).
pub const SESSION_COOKIE: &str = "skilleval_session";

/// The token in the session cookie, when there is one.
fn cookie_token(request: &Request) -> Option<Vec<u8>> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .and_then(|(_, value)| hex::decode(value).ok())
}

/// Whether a state-changing request comes from this server's own pages: its `Origin` names
/// the host it was sent to, or the browser says `Sec-Fetch-Site: same-origin`. `None` when
/// the request carries neither (not a browser's request).
fn same_origin(request: &Request) -> Option<bool> {
    let headers = request.headers();
    if let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let origin_host = origin
            .split_once("://")
            .map_or(origin, |(_, rest)| rest)
            .trim_end_matches('/');
        return Some(host.is_some_and(|h| h.eq_ignore_ascii_case(origin_host)));
    }
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(|site| matches!(site, "same-origin" | "none"))
}

fn forbidden_cross_site() -> Response {
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "cross_site_request",
        "a request that changes state must come from this server's own pages",
    )
    .with_details(serde_json::json!({ "field": "Origin", "rule": "must be this server's origin" }))
    .into_response()
}

/// Rejects `/v1` and `/ui` requests without a configured token (when any is configured), as
/// a bearer header or the session cookie; refuses cross-site requests that change state.
pub async fn require_bearer(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Response {
    let changes_state = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS
    );
    if changes_state && same_origin(&request) == Some(false) {
        return forbidden_cross_site();
    }
    request.extensions_mut().insert(tokens.clone());
    if !tokens.enabled() || is_open(request.uri().path()) {
        return next.run(request).await;
    }
    if let Some(token) = cookie_token(&request) {
        if tokens.accepts(&token) {
            // A cookie is sent by the browser on its own: a state change needs proof that
            // this server's page asked for it.
            if changes_state && same_origin(&request) != Some(true) {
                return forbidden_cross_site();
            }
            return next.run(request).await;
        }
    }
    if request.uri().path().starts_with("/ui") {
        return axum::response::Redirect::to("/ui/login").into_response();
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
        assert!(!is_open("/ui/"));
        assert!(!is_open("/ui/runs/x"));
        assert!(is_open("/ui/login"));
        assert!(is_open("/ui/static/style.css"));
    }
}
