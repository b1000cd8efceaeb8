//! `GET /v1/skills/{name}/collisions` (the view is [`crate::collisions::collisions_view`], which
//! the skill page shows too).

use axum::extract::{Path, State};
use axum::{Extension, Json};

use crate::auth::Principal;
use crate::collisions::{collisions_view, CollisionsView};
use crate::error::ApiError;
use crate::state::AppState;

/// `GET /v1/skills/{name}/collisions`.
pub async fn get_collisions(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<CollisionsView>, ApiError> {
    Ok(Json(
        collisions_view(&state.store, &principal, &name).await?,
    ))
}
