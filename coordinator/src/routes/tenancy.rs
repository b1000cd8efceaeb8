//! Deletion (`DELETE` of runs, versions and skills), publisher tokens and the audit log
//! (docs/security.md). Visibility was checked by `crate::access::guard` before any handler
//! here runs: a handler finds only the caller's publisher's objects (or any, for `admin`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use skilleval_infra::store::lifecycle::TransitionError;
use skilleval_infra::store::tenancy::{NewToken, Scope, TokenRow};
use uuid::Uuid;

use crate::auth::{generate_token, Principal};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::state::AppState;

/// Stops a live run the way `POST /v1/runs/{id}/cancel` does (cases never recorded are
/// written off); a run already finished is left as it is.
pub async fn stop_if_live(state: &AppState, run_id: Uuid) -> Result<(), ApiError> {
    match crate::routes::runs::cancel_run(state, run_id).await? {
        Ok(_) | Err(TransitionError::NotFound(_) | TransitionError::Illegal { .. }) => Ok(()),
        Err(TransitionError::Store(e)) => Err(ApiError::internal(e)),
    }
}

/// `DELETE /v1/runs/{id}`: cancels the run if it is live, then deletes it with its results,
/// outputs, comparisons, parked jobs, judged samples and webhook deliveries. 204; 404 when
/// there is no such run (any more), so repeating it changes nothing.
pub async fn delete_run(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let run_id = crate::extract::parse_uuid("id", &id)?;
    stop_if_live(&state, run_id).await?;
    if state.store.delete_run(run_id).await? {
        tracing::info!(%run_id, "run deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("run", run_id))
    }
}

/// `DELETE /v1/skills/{name}/versions/{version}`: the version's package, definition and runs
/// (live ones cancelled first) and the samples recorded against it.
pub async fn delete_version(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((name, version)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let viewer = principal.viewer();
    let Some((skill_id, version_id)) = state
        .store
        .visible_version_by_label(viewer, &name, &version)
        .await?
    else {
        return Err(ApiError::not_found("version", format!("{name}@{version}")));
    };
    for run_id in state.store.live_runs_of(skill_id, Some(version_id)).await? {
        stop_if_live(&state, run_id).await?;
    }
    if state.store.delete_version(version_id).await? {
        tracing::info!(skill = %name, %version, "version deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("version", format!("{name}@{version}")))
    }
}

/// `DELETE /v1/skills/{name}`: the skill with every version, run, sample, monitor and alert.
pub async fn delete_skill(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let Some(skill_id) = state.store.visible_skill(principal.viewer(), &name).await? else {
        return Err(ApiError::not_found("skill", name));
    };
    for run_id in state.store.live_runs_of(skill_id, None).await? {
        stop_if_live(&state, run_id).await?;
    }
    if state.store.delete_skill(skill_id).await? {
        tracing::info!(skill = %name, "skill deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("skill", name))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenBody {
    /// The publisher the token acts for (created on first use).
    pub publisher: String,
    pub scopes: Vec<String>,
}

/// Parses scope names, naming the field and the rule on a bad one.
pub fn parse_scopes(field: &str, names: &[String]) -> Result<Vec<Scope>, ApiError> {
    if names.is_empty() {
        return Err(ApiError::invalid_field(
            "invalid_body",
            field,
            "must name at least one scope",
        ));
    }
    let mut scopes = Vec::new();
    for name in names {
        let scope = Scope::parse(name).ok_or_else(|| {
            ApiError::invalid_field(
                "invalid_body",
                field,
                format!(
                    "unknown scope `{name}`: use skills:write, runs:write, read, samples:write or admin"
                ),
            )
        })?;
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }
    Ok(scopes)
}

/// Checks a publisher name: 1 to 100 characters, letters, digits, `-`, `_`, `.`.
pub fn check_publisher(field: &str, name: &str) -> Result<(), ApiError> {
    if crate::routes::fields::is_plain_name(name, 100) {
        Ok(())
    } else {
        Err(ApiError::invalid_field(
            "invalid_body",
            field,
            "must be 1 to 100 letters, digits, `-`, `_` or `.`",
        ))
    }
}

/// `POST /v1/admin/tokens`: a new token; the secret is in this answer only.
pub async fn create_token(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CreateTokenBody>,
) -> Result<Response, ApiError> {
    check_publisher("/publisher", &body.publisher)?;
    let scopes = parse_scopes("/scopes", &body.scopes)?;
    let secret = generate_token();
    let row = state
        .store
        .create_token(&NewToken {
            publisher: &body.publisher,
            prefix: &secret.prefix,
            hash: &secret.hash,
            scopes: &scopes,
        })
        .await?;
    let mut doc = json!(row);
    doc["token"] = json!(secret.secret);
    Ok((StatusCode::CREATED, Json(doc)).into_response())
}

/// `GET /v1/admin/tokens`: every token (prefix, scopes, last use), never a secret.
pub async fn list_tokens(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tokens: Vec<TokenRow> = state.store.list_tokens(None).await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// `DELETE /v1/admin/tokens/{id}` (an id or a prefix): revoked at once, on every replica.
pub async fn revoke_token(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<TokenRow>, ApiError> {
    state
        .store
        .revoke_token(&id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("token", id))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    #[serde(default)]
    pub limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `GET /v1/admin/audit`: the audit log, newest first, keyset-paginated.
pub async fn audit(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::invalid_field(
            "invalid_query",
            "limit",
            "must be 1 to 1000",
        ));
    }
    let before = match &query.cursor {
        None => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::invalid_field(
                "invalid_query",
                "cursor",
                "must be a `next_cursor` value from a previous page",
            )
        })?),
    };
    let entries = state.store.audit_page(before, limit).await?;
    let next = (entries.len() as i64 == limit)
        .then(|| entries.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(Json(json!({ "entries": entries, "next_cursor": next })))
}
