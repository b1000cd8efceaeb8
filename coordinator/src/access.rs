//! Who may do what, and how much (docs/security.md): one middleware authenticates each `/v1`
//! request, checks the route's scope, the per-second rate limits and that every object the
//! path names is visible to the caller's publisher (in SQL: another publisher's object is not
//! found, 404), then audits every state-changing request with its outcome. The durable quotas
//! (uploads per hour, concurrent runs, cases and spend per day) are counted in PostgreSQL by
//! the handlers that create uploads and runs, so they hold across replicas.

use std::time::Duration;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::{HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use skilleval_infra::store::tenancy::{QuotaKind, Scope, Usage, Viewer};

use crate::auth::{
    bearer, challenge, cookie_token, cross_site_refusal, identify, is_open, same_origin, Principal,
};
use crate::error::ApiError;
use crate::metrics::LimitLabels;
use crate::state::AppState;

/// The request id header: taken from the caller when it sends a sane one, else generated;
/// echoed on the response and recorded in the audit log.
pub const REQUEST_ID: &str = "x-request-id";

/// How long a run creation waits for the publisher's other creations under the
/// concurrent-runs quota before it is refused (429, `Retry-After: 1`).
const CREATION_WAIT: Duration = Duration::from_secs(5);

/// What a concurrent-runs refusal suggests waiting: runs have no fixed end.
const CONCURRENT_RETRY_SECS: u64 = 30;

/// The scope a route needs (`None`: no route matched; the fallback answers 404).
fn required_scope(method: &Method, route: &str) -> Option<Scope> {
    if route == "unmatched" {
        return None;
    }
    Some(if route.starts_with("/v1/admin/") {
        Scope::Admin
    } else if matches!(*method, Method::GET | Method::HEAD) {
        Scope::Read
    } else if route == "/v1/skills/{name}/samples" || route == "/v1/otlp/v1/traces" {
        Scope::SamplesWrite
    } else if route.starts_with("/v1/skills") || route == "/v1/schemas/check" {
        // Checking a schema stores nothing, but it is the test-case editor's, whose other
        // requests (preview, package) are skills work.
        Scope::SkillsWrite
    } else if route.starts_with("/v1/runs")
        || route.starts_with("/v1/comparisons")
        || route.starts_with("/v1/reports")
        || route.starts_with("/v1/matrix")
        || route.starts_with("/ui/runs/")
        || route == "/ui/compare"
    {
        // Reviews (`/ui/runs/{id}/cases/{index}/review`) are a run's state, like its cancel.
        Scope::RunsWrite
    } else if route == "/ui/logout" {
        // Signing out only clears the browser's cookie.
        Scope::Read
    } else {
        // A state-changing route nobody classified yet: only `admin` until someone does.
        Scope::Admin
    })
}

/// 404 unless every object the path names belongs to the viewer's publisher (each lookup
/// filters on the publisher in SQL). A parameter of a route not known here answers 404 to
/// every non-admin caller: a new route is closed until it is classified.
async fn check_visible(
    state: &AppState,
    viewer: Viewer,
    route: &str,
    params: &[(String, String)],
) -> Result<(), ApiError> {
    if viewer == Viewer::All || route.starts_with("/v1/admin/") {
        return Ok(());
    }
    for (key, value) in params {
        let visible = match (key.as_str(), route) {
            ("name", r)
                if r.starts_with("/v1/skills/{name}") || r.starts_with("/ui/skills/{name}") =>
            {
                state.store.visible_skill(viewer, value).await?.is_some()
            }
            // The version label is resolved within the (visible) skill by its handler.
            ("version", r)
                if r.starts_with("/v1/skills/{name}/versions/{version}")
                    || r.starts_with("/ui/skills/{name}/versions/{version}") =>
            {
                true
            }
            // A case of a (visible) run is resolved within the run by its page.
            ("index", r) if r.starts_with("/ui/runs/{id}/cases/{index}") => true,
            ("id", r) if r.starts_with("/v1/runs/{id}") || r.starts_with("/ui/runs/{id}") => {
                match uuid::Uuid::parse_str(value) {
                    Ok(id) => state.store.visible_run(viewer, id).await?,
                    // Not an id: the handler names the field and the rule (400).
                    Err(_) => true,
                }
            }
            ("id", "/v1/reports/{id}") => match uuid::Uuid::parse_str(value) {
                Ok(id) => state.store.visible_report(viewer, id).await?,
                Err(_) => true,
            },
            ("id", "/v1/matrix/{id}" | "/ui/matrix/{id}") => match uuid::Uuid::parse_str(value) {
                Ok(id) => state.store.visible_matrix(viewer, id).await?,
                Err(_) => true,
            },
            ("id", "/v1/comparisons/{id}" | "/ui/comparisons/{id}") => {
                match uuid::Uuid::parse_str(value) {
                    Ok(id) => state.store.visible_comparison(viewer, id).await?,
                    Err(_) => true,
                }
            }
            _ => false,
        };
        if !visible {
            let what = match key.as_str() {
                "name" => "skill",
                _ if route.starts_with("/v1/runs") || route.starts_with("/ui/runs") => "run",
                _ if route.contains("/comparisons") => "comparison",
                _ if route.starts_with("/v1/reports") => "report",
                _ if route.contains("/matrix") => "matrix",
                _ => "object",
            };
            return Err(ApiError::not_found(what, value));
        }
    }
    Ok(())
}

fn retry_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// The per-second limits of the principal's publisher and token.
fn check_rate(state: &AppState, principal: &Principal) -> Result<(), ApiError> {
    match state.access.rate_limited(principal) {
        Some((name, wait)) => Err(refuse(
            state,
            name,
            "too many requests per second",
            retry_secs(wait),
        )),
        None => Ok(()),
    }
}

/// A 429 naming the limit, counted in `skilleval_coordinator_quota_refused{limit}`.
fn refuse(state: &AppState, limit: &str, message: &str, retry_after_secs: u64) -> ApiError {
    state
        .metrics
        .quota_refused
        .get_or_create(&LimitLabels {
            limit: limit.to_string(),
        })
        .inc();
    ApiError::too_many_requests(
        limit,
        format!("{message} (limit {limit})"),
        retry_after_secs,
    )
}

/// Seconds until the oldest counted moment leaves a window of `window` seconds.
fn until_window_frees(oldest: Option<DateTime<Utc>>, window: i64) -> u64 {
    oldest.map_or(1, |at| {
        let frees = at + chrono::Duration::seconds(window);
        u64::try_from((frees - Utc::now()).num_seconds()).unwrap_or(0) + 1
    })
}

fn cap<T: TryFrom<u64>>(limit: Option<impl Into<u64>>) -> Option<T> {
    limit.and_then(|l| T::try_from(l.into()).ok())
}

/// Counts an upload against `uploads_per_hour` (publisher and token), or refuses it.
pub async fn reserve_upload(state: &AppState, principal: &Principal) -> Result<(), ApiError> {
    let q = &state.access.quotas;
    let (publisher, token) = (
        cap::<i64>(q.publisher.uploads_per_hour),
        cap::<i64>(q.token.uploads_per_hour),
    );
    if publisher.is_none() && token.is_none() {
        return Ok(());
    }
    let reserved = state
        .store
        .reserve_quota(
            principal.holder(),
            QuotaKind::Upload,
            1,
            3_600,
            publisher,
            token,
        )
        .await?;
    match reserved {
        Ok(()) => Ok(()),
        Err(usage) => Err(window_refusal(
            state,
            &usage,
            publisher,
            1,
            "uploads_per_hour",
            3_600,
        )),
    }
}

/// Which side (publisher or token) of a windowed quota was reached, as a 429.
fn window_refusal(
    state: &AppState,
    usage: &Usage<i64>,
    publisher_limit: Option<i64>,
    amount: i64,
    key: &str,
    window: i64,
) -> ApiError {
    let publisher_over = publisher_limit.is_some_and(|l| usage.publisher + amount > l);
    let (side, used, oldest) = if publisher_over {
        ("publisher", usage.publisher, usage.publisher_oldest)
    } else {
        ("token", usage.token, usage.token_oldest)
    };
    refuse(
        state,
        &format!("coordinator.quotas.{side}.{key}"),
        &format!("{used} already counted, {amount} more asked"),
        until_window_frees(oldest, window),
    )
}

/// Held while a run is created under the concurrent-runs quota: the publisher's run creations
/// take turns on every replica until it is dropped (after the run is committed).
#[must_use = "drop it only once the run is created"]
pub struct RunSlot(#[allow(dead_code)] Option<sqlx::Transaction<'static, sqlx::Postgres>>);

/// Checks the run quotas before a run of `cases` cases is created: concurrent runs and
/// spend per day, then counts the cases against `cases_per_day`. Keep the answer until the
/// run is created.
pub async fn reserve_run(
    state: &AppState,
    principal: &Principal,
    cases: i64,
) -> Result<RunSlot, ApiError> {
    reserve_runs(state, principal, 1, cases).await
}

/// [`reserve_run`] for `runs` runs created together (a matrix's cells) of `cases` cases in
/// all: refused unless every one of them fits (`concurrent_runs` counts them all, the cases
/// are counted at once), so a refusal creates none. Keep the answer until all are created.
pub async fn reserve_runs(
    state: &AppState,
    principal: &Principal,
    runs: i64,
    cases: i64,
) -> Result<RunSlot, ApiError> {
    if runs < 1 {
        return Ok(RunSlot(None));
    }
    let q = &state.access.quotas;
    let holder = principal.holder();
    let (pub_runs, tok_runs) = (
        cap::<i64>(q.publisher.concurrent_runs),
        cap::<i64>(q.token.concurrent_runs),
    );
    let mut slot = RunSlot(None);
    if pub_runs.is_some() || tok_runs.is_some() {
        let Some(lock) = state
            .store
            .lock_run_creation(principal.publisher_id, CREATION_WAIT)
            .await?
        else {
            return Err(refuse(
                state,
                "coordinator.quotas.publisher.concurrent_runs",
                "other runs of this publisher are being created",
                1,
            ));
        };
        slot = RunSlot(Some(lock));
        let (p, t) = state.store.unfinished_runs(holder).await?;
        for (side, used, limit) in [("publisher", p, pub_runs), ("token", t, tok_runs)] {
            if limit.is_some_and(|l| used + runs > l) {
                let message = if runs == 1 {
                    format!("{used} runs are not finished yet")
                } else {
                    format!("{used} runs are not finished yet and {runs} more are asked together")
                };
                return Err(refuse(
                    state,
                    &format!("coordinator.quotas.{side}.concurrent_runs"),
                    &message,
                    CONCURRENT_RETRY_SECS,
                ));
            }
        }
    }
    let (pub_spend, tok_spend) = (q.publisher.spend_usd_per_day, q.token.spend_usd_per_day);
    if pub_spend.is_some() || tok_spend.is_some() {
        let spend = state.store.spend_today(holder).await?;
        let sides = [
            (
                "publisher",
                spend.publisher,
                spend.publisher_oldest,
                pub_spend,
            ),
            ("token", spend.token, spend.token_oldest, tok_spend),
        ];
        for (side, used, oldest, limit) in sides {
            if limit.is_some_and(|l| used >= l) {
                return Err(refuse(
                    state,
                    &format!("coordinator.quotas.{side}.spend_usd_per_day"),
                    &format!("{used:.4} USD spent by runs of the last 24 hours"),
                    until_window_frees(oldest, 86_400),
                ));
            }
        }
    }
    let (pub_cases, tok_cases) = (
        cap::<i64>(q.publisher.cases_per_day),
        cap::<i64>(q.token.cases_per_day),
    );
    if pub_cases.is_none() && tok_cases.is_none() {
        return Ok(slot);
    }
    match state
        .store
        .reserve_quota(
            holder,
            QuotaKind::Cases,
            cases,
            86_400,
            pub_cases,
            tok_cases,
        )
        .await?
    {
        Ok(()) => Ok(slot),
        Err(usage) => Err(window_refusal(
            state,
            &usage,
            pub_cases,
            cases,
            "cases_per_day",
            86_400,
        )),
    }
}

/// A request id worth keeping: short, visible ASCII.
fn sane_request_id(value: &HeaderValue) -> Option<String> {
    let s = value.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| s.to_string())
}

/// Whether a request of `method` may change state (and so is checked for its origin and
/// audited).
fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// A refusal as its caller reads it: a page of the web interface (a form posted to `/ui/…`
/// lands the browser on it) gets the HTML error page, the API its JSON error.
fn refusal_for(path: &str, e: ApiError) -> Response {
    if path.starts_with("/ui") {
        crate::ui::PageError(e).into_response()
    } else {
        e.into_response()
    }
}

/// The middleware: request id, authentication, scope, rate limits, visibility, audit.
pub async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let changes_state = changes_state(request.method());
    // A browser's request from another site never changes state here, signed in or not.
    if changes_state && same_origin(&request) == Some(false) {
        return refusal_for(&path, cross_site_refusal());
    }
    if is_open(&path) {
        return next.run(request).await;
    }
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(sane_request_id)
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let (principal, response) = match admit(&state, request, &method, &route, changes_state).await {
        Ok((principal, mut request)) => {
            request.extensions_mut().insert(principal.clone());
            (Some(principal), next.run(request).await)
        }
        Err((None, e))
            if path.starts_with("/ui") && e.status == axum::http::StatusCode::UNAUTHORIZED =>
        {
            // A page asked for without a session: the sign-in form, not a JSON 401.
            (None, Redirect::to("/ui/login").into_response())
        }
        Err((principal, e)) => (principal, challenge(refusal_for(&path, e))),
    };
    let mut response = response;
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    if changes_state {
        let entry = skilleval_infra::store::tenancy::NewAudit {
            publisher_id: principal.as_ref().map(|p| p.publisher_id),
            token_prefix: principal.as_ref().and_then(|p| p.token_prefix.as_deref()),
            request_id: &request_id,
            method: method.as_str(),
            route: &route,
            path: &path,
            status: response.status().as_u16(),
        };
        if let Err(e) = state.store.record_audit(&entry).await {
            tracing::error!(error = %e, %request_id, "recording the audit entry failed");
        }
    }
    response
}

type Refusal = (Option<Principal>, ApiError);

async fn admit(
    state: &AppState,
    request: Request,
    method: &Method,
    route: &str,
    changes_state: bool,
) -> Result<(Principal, Request), Refusal> {
    // The bearer header first; a signed-in browser's session cookie otherwise. A cookie is sent
    // by the browser on its own, so a state change it authenticates must prove that this
    // server's page asked for it.
    let (presented, by_cookie) = match bearer(&request) {
        Some(token) => (Some(token.to_string()), false),
        None => match cookie_token(&request) {
            Some(token) => (Some(token), true),
            None => (None, false),
        },
    };
    if by_cookie && changes_state && same_origin(&request) != Some(true) {
        return Err((None, cross_site_refusal()));
    }
    let principal = identify(&state.access.auth, &state.store, presented.as_deref())
        .await
        .map_err(|e| (None, e))?;
    let refused = |e: ApiError| (Some(principal.clone()), e);
    if let Some(scope) = required_scope(method, route) {
        if !principal.has(scope) {
            return Err(refused(ApiError::forbidden_scope(scope.as_str())));
        }
    }
    check_rate(state, &principal).map_err(refused)?;
    let (mut parts, body) = request.into_parts();
    let params: Vec<(String, String)> =
        match RawPathParams::from_request_parts(&mut parts, &()).await {
            Ok(raw) => raw
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Err(_) => Vec::new(),
        };
    check_visible(state, principal.viewer(), route, &params)
        .await
        .map_err(refused)?;
    Ok((principal.clone(), Request::from_parts(parts, body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_the_route() {
        assert_eq!(
            required_scope(&Method::GET, "/v1/runs/{id}"),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/skills"),
            Some(Scope::SkillsWrite)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/skills/{name}/samples"),
            Some(Scope::SamplesWrite)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/otlp/v1/traces"),
            Some(Scope::SamplesWrite)
        );
        assert_eq!(
            required_scope(&Method::DELETE, "/v1/runs/{id}"),
            Some(Scope::RunsWrite)
        );
        assert_eq!(
            required_scope(&Method::GET, "/v1/admin/audit"),
            Some(Scope::Admin)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/schemas/check"),
            Some(Scope::SkillsWrite)
        );
        assert_eq!(
            required_scope(&Method::GET, "/ui/skills/{name}/versions/{version}/edit"),
            Some(Scope::Read)
        );
        assert_eq!(
            required_scope(&Method::POST, "/v1/elsewhere"),
            Some(Scope::Admin)
        );
        assert_eq!(required_scope(&Method::GET, "unmatched"), None);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_secs(Duration::from_secs(2)), 2);
        assert_eq!(until_window_frees(None, 60), 1);
        let oldest = Utc::now() - chrono::Duration::seconds(10);
        assert!((50..=51).contains(&until_window_frees(Some(oldest), 60)));
    }
}
