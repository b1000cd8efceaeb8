//! Request fields that more than one area takes, each checked once, with the 422 that names
//! the field and the rule: a callback URL, the attempts per case, the runs per trigger query,
//! and the trigger evals a package offers. The upload (`skills`), run creation and rescores
//! (`runs`) and the monitor (`monitoring`) take them from here.

use axum::http::StatusCode;
use serde_json::json;
use skilleval_execution::runner::trigger::TriggerPlan;

use crate::error::ApiError;

/// Whether `name` is a plain name of 1 to `max` bytes: ASCII letters, digits, `-`, `_`, `.`
/// (publisher and provider names).
pub fn is_plain_name(name: &str, max: usize) -> bool {
    (1..=max).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// A callback URL must be absolute http(s).
pub fn check_callback_url(field: &str, url: &str) -> Result<(), ApiError> {
    let ok = reqwest::Url::parse(url)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some());
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid_field(
            "invalid_body",
            field,
            "must be an absolute http or https URL",
        ))
    }
}

/// The most attempts per case a run may ask for.
pub const MAX_REPEATS: i64 = 20;
/// The most runs per trigger query a run may ask for.
pub const MAX_TRIGGER_RUNS: i64 = 10;

fn invalid_triggers(field: &str, rule: &str) -> ApiError {
    ApiError::unprocessable_field("invalid_triggers", field, rule)
}

/// Runs per trigger query in range (1 to [`MAX_TRIGGER_RUNS`]; absent: the CLI's default), or
/// a 422 naming `field` and the rule.
pub(crate) fn check_trigger_runs(field: &str, runs: Option<i64>) -> Result<u32, ApiError> {
    match runs {
        None => Ok(skilleval_execution::triggers::DEFAULT_RUNS_PER_QUERY),
        Some(n) if (1..=MAX_TRIGGER_RUNS).contains(&n) => Ok(u32::try_from(n).unwrap_or(1)),
        Some(_) => Err(invalid_triggers(
            field,
            &format!("must be an integer from 1 to {MAX_TRIGGER_RUNS}"),
        )),
    }
}

/// The trigger evals over the package's `queries`, or a 422 naming `field` when the package
/// has no trigger file.
pub(crate) fn trigger_plan(
    field: &str,
    runs_per_query: u32,
    queries: Vec<skilleval_model::package::TriggerCase>,
) -> Result<TriggerPlan, ApiError> {
    if queries.is_empty() {
        return Err(invalid_triggers(
            field,
            "the package has no trigger evals (eval/triggers.json or evals/triggers.json)",
        ));
    }
    Ok(TriggerPlan {
        queries,
        runs_per_query,
    })
}

/// `repeats` in range (1 to [`MAX_REPEATS`]; absent: 1), or a 422 naming `field` and the rule.
pub(crate) fn check_repeats(field: &str, repeats: Option<i64>) -> Result<u32, ApiError> {
    match repeats {
        None => Ok(1),
        Some(n) if (1..=MAX_REPEATS).contains(&n) => Ok(u32::try_from(n).unwrap_or(1)),
        Some(_) => {
            let rule = format!("must be an integer from 1 to {MAX_REPEATS}");
            Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_repeats",
                format!("`{field}`: {rule}"),
            )
            .with_details(json!({ "field": field, "rule": rule })))
        }
    }
}
