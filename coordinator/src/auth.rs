//! Bearer-token authentication for the `/v1` API (docs/security.md): static tokens of the
//! implicit publisher (`coordinator.auth_tokens`) and stored publisher tokens with scopes.
//! Authentication is on when a static token is configured or `coordinator.require_auth` is
//! set; off, a request without a token acts as the implicit publisher.
//!
//! Health, readiness, metrics and the OpenAPI document stay open: probes and scrapers carry no
//! token, and the document describes how to authenticate. The `/ui/` pages take the same
//! tokens: a browser signs in once on `/ui/login`, which keeps the token in an `HttpOnly`,
//! `SameSite=Strict` cookie accepted like the bearer header. Requests that change state are
//! refused when they come from another site: an `Origin` (or `Sec-Fetch-Site`) that is not this
//! server's, or a cookie-authenticated one that carries neither.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::header;
use axum::response::Response;
use rand::RngCore;
use sha2::{Digest, Sha256};
use skilleval_infra::store::tenancy::{Holder, Scope, Viewer, DEFAULT_PUBLISHER};
use skilleval_infra::store::Store;
use uuid::Uuid;

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
        self.position(candidate).is_some()
    }

    /// Which of the tokens `candidate` is (every token compared, each in constant time).
    pub fn position(&self, candidate: &[u8]) -> Option<usize> {
        self.0.iter().enumerate().fold(None, |found, (i, token)| {
            if constant_time_eq(token, candidate) {
                Some(i)
            } else {
                found
            }
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
pub fn is_open(path: &str) -> bool {
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
pub fn cookie_token(request: &Request) -> Option<String> {
    request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .and_then(|(_, value)| hex::decode(value).ok())
        .and_then(|bytes| String::from_utf8(bytes).ok())
}

/// Whether a request comes from this server's own pages: its `Origin` names the host it was
/// sent to, or the browser says `Sec-Fetch-Site: same-origin`. `None` when the request carries
/// neither (not a browser's request).
pub fn same_origin(request: &Request) -> Option<bool> {
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

/// The 403 of a state-changing request that did not come from this server's pages.
pub fn cross_site_refusal() -> ApiError {
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "cross_site_request",
        "a request that changes state must come from this server's own pages",
    )
    .with_details(serde_json::json!({ "field": "Origin", "rule": "must be this server's origin" }))
}

/// Who is asking: the publisher whose objects the request sees and changes, the token (for
/// per-token quotas and the audit log) and what it may do.
#[derive(Debug, Clone)]
pub struct Principal {
    pub publisher_id: Uuid,
    /// A stored token's id; `None` for static tokens and unauthenticated development use.
    pub token_id: Option<Uuid>,
    /// What the audit log and listings show: a stored token's prefix, `static#N` for the
    /// N-th static token, none without a token.
    pub token_prefix: Option<String>,
    pub scopes: Vec<Scope>,
}

impl Principal {
    /// The implicit publisher, with every scope: the static tokens and, with authentication
    /// off, every request (the development default).
    fn implicit(token_prefix: Option<String>) -> Self {
        Principal {
            publisher_id: DEFAULT_PUBLISHER,
            token_id: None,
            token_prefix,
            scopes: Scope::ALL.to_vec(),
        }
    }

    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// `admin` implies every other scope.
    pub fn has(&self, scope: Scope) -> bool {
        self.is_admin() || self.scopes.contains(&scope)
    }

    /// Whose objects this principal sees.
    pub fn viewer(&self) -> Viewer {
        if self.is_admin() {
            Viewer::All
        } else {
            Viewer::Publisher(self.publisher_id)
        }
    }

    pub fn holder(&self) -> Holder {
        Holder {
            publisher_id: self.publisher_id,
            token_id: self.token_id,
        }
    }

    /// The key of this token in the per-token request-rate limiter.
    pub fn token_key(&self) -> String {
        match (self.token_id, &self.token_prefix) {
            (Some(id), _) => id.to_string(),
            (None, Some(prefix)) => prefix.clone(),
            (None, None) => String::new(),
        }
    }
}

/// How requests authenticate: the static tokens and whether a token is required at all.
#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub tokens: Tokens,
    /// `coordinator.require_auth`: a token is required even with no static token configured.
    pub require: bool,
}

impl AuthConfig {
    /// Authentication is on when a static token is configured or it is required.
    pub fn enabled(&self) -> bool {
        self.require || self.tokens.enabled()
    }
}

/// The bearer token of the request, when it carries one.
pub fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
}

/// The principal of a `/v1` request: a static token, a stored token (looked up by hash on
/// every request, no cache, so a revocation holds at once on every replica), or, with
/// authentication off and no token presented, the implicit publisher. `Err`: a 401.
pub async fn identify(
    config: &AuthConfig,
    store: &Store,
    presented: Option<&str>,
) -> Result<Principal, ApiError> {
    let Some(presented) = presented else {
        return if config.enabled() {
            Err(unauthorized())
        } else {
            Ok(Principal::implicit(None))
        };
    };
    if let Some(n) = config.tokens.position(presented.as_bytes()) {
        return Ok(Principal::implicit(Some(format!("static#{}", n + 1))));
    }
    match store.token_by_hash(&token_hash(presented)).await? {
        Some(token) => Ok(Principal {
            publisher_id: token.publisher_id,
            token_id: Some(token.id),
            token_prefix: Some(token.prefix),
            scopes: token.scopes,
        }),
        None => Err(unauthorized()),
    }
}

fn unauthorized() -> ApiError {
    ApiError::unauthorized()
}

/// Adds `WWW-Authenticate: Bearer` to a 401.
pub fn challenge(mut response: Response) -> Response {
    if response.status() == axum::http::StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// What stored tokens start with (recognisable in logs and by secret scanners).
pub const TOKEN_PREFIX: &str = "skev_";

/// A new token: the secret (shown once), its prefix (listed) and its hash (stored).
pub struct NewSecret {
    pub secret: String,
    pub prefix: String,
    pub hash: Vec<u8>,
}

/// Generates a token of 256 random bits from the operating system's generator.
pub fn generate_token() -> NewSecret {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let secret = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
    // `skev_` and 12 hex digits (48 random bits): unique in practice, useless to an attacker
    // without the other 208 bits.
    let prefix = secret[..TOKEN_PREFIX.len() + 12].to_string();
    let hash = token_hash(&secret);
    NewSecret {
        secret,
        prefix,
        hash,
    }
}

/// SHA-256 of a token. A plain, unsalted, fast hash is enough here, unlike for passwords:
/// tokens carry 256 random bits, so no dictionary or brute force reaches a preimage, and a
/// deterministic hash is what lets authentication find the token by an indexed equality
/// lookup. A slow KDF (argon2, bcrypt) would only add latency to every request.
pub fn token_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
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
        assert_eq!(t.position(b"beta"), Some(1));
    }

    #[test]
    fn generated_tokens_are_distinct_and_hashed() {
        let a = generate_token();
        let b = generate_token();
        assert_ne!(a.secret, b.secret);
        assert!(a.secret.starts_with(&a.prefix));
        assert_eq!(a.secret.len(), TOKEN_PREFIX.len() + 64);
        assert_eq!(a.hash, token_hash(&a.secret));
        assert_ne!(a.hash, token_hash(&b.secret));
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
