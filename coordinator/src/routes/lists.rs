//! The API's two lists: `GET /v1/skills` (search, filters on profile, verdict and model, four
//! sorts) and `GET /v1/runs` (filters on skill, version, status, kind, verdict and a created
//! range, two sorts), both scoped to the caller's publisher and keyset-paginated
//! ([`skilleval_infra::store::listing`]).
//!
//! Parameters are read by hand rather than through a `deny_unknown_fields` struct so that an
//! unknown one is refused naming *it* and the parameters the list accepts (serde's error names
//! neither the field nor, for a query string, where it was). A cursor carries the query it
//! came from as a fingerprint (the caller's publisher and every parameter but `cursor` and
//! `limit`): a cursor handed to
//! another query is refused, never read as a position in a list it does not belong to.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use skilleval_infra::store::lifecycle::{RunKind, RunStatus};
use skilleval_infra::store::listing::{
    KeyValue, Keyset, RunQuery, RunSortKey, SkillQuery, SkillSortKey, SortOrder, VerdictFilter,
    VersionFilter,
};
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::state::AppState;
use crate::views::{RunList, RunListItem, SkillList, SkillListItem};

/// Items per page when the request names no limit, and the most it may name.
const DEFAULT_PAGE: i64 = 20;
const MAX_PAGE: i64 = 100;

/// Longest search string accepted.
const MAX_SEARCH_CHARS: usize = 200;

const SKILL_PARAMS: &[&str] = &[
    "search", "profile", "verdict", "model", "sort", "order", "limit", "cursor",
];
const RUN_PARAMS: &[&str] = &[
    "skill",
    "version",
    "status",
    "kind",
    "verdict",
    "created_after",
    "created_before",
    "sort",
    "order",
    "limit",
    "cursor",
];

const PROFILES: &[&str] = &[
    "deterministic",
    "structured",
    "flexible",
    "creative",
    "enterprise",
];

fn bad(field: &str, rule: impl Into<String>) -> ApiError {
    ApiError::invalid_field("invalid_query", field, rule)
}

/// The query's parameters by name: an unknown or repeated one is refused naming it.
fn parameters(raw: Option<&str>, accepted: &[&str]) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (key, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if !accepted.contains(&key.as_ref()) {
            return Err(bad(
                &key,
                format!("unknown parameter; accepted: {}", accepted.join(", ")),
            ));
        }
        if out.insert(key.to_string(), value.to_string()).is_some() {
            return Err(bad(&key, "given more than once"));
        }
    }
    Ok(out)
}

/// The value of `name`, which must be one of `choices`.
fn one_of<T: Copy>(
    params: &BTreeMap<String, String>,
    name: &str,
    choices: &[(&str, T)],
) -> Result<Option<T>, ApiError> {
    let Some(value) = params.get(name) else {
        return Ok(None);
    };
    choices
        .iter()
        .find(|(label, _)| label == value)
        .map(|(_, v)| Some(*v))
        .ok_or_else(|| {
            let labels: Vec<&str> = choices.iter().map(|(l, _)| *l).collect();
            bad(
                name,
                format!("must be one of {}, got `{value}`", labels.join(", ")),
            )
        })
}

fn limit(params: &BTreeMap<String, String>) -> Result<i64, ApiError> {
    let Some(value) = params.get("limit") else {
        return Ok(DEFAULT_PAGE);
    };
    value
        .parse::<i64>()
        .ok()
        .filter(|n| (1..=MAX_PAGE).contains(n))
        .ok_or_else(|| {
            bad(
                "limit",
                format!("must be an integer between 1 and {MAX_PAGE}"),
            )
        })
}

fn order(params: &BTreeMap<String, String>, default: SortOrder) -> Result<SortOrder, ApiError> {
    Ok(one_of(
        params,
        "order",
        &[("asc", SortOrder::Asc), ("desc", SortOrder::Desc)],
    )?
    .unwrap_or(default))
}

/// A non-empty text filter (`None` when absent).
fn text(params: &BTreeMap<String, String>, name: &str) -> Result<Option<String>, ApiError> {
    match params.get(name).map(|v| v.trim()) {
        None => Ok(None),
        Some("") => Err(bad(name, "must not be empty")),
        Some(v) => Ok(Some(v.to_string())),
    }
}

fn time(params: &BTreeMap<String, String>, name: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
    params
        .get(name)
        .map(|v| {
            DateTime::parse_from_rfc3339(v)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|_| {
                    bad(
                        name,
                        format!("must be an RFC 3339 time such as 2026-11-26T10:00:00Z, got `{v}`"),
                    )
                })
        })
        .transpose()
}

/// What identifies a query for its cursors: the list, who asks (the publisher: a cursor is not
/// handed from one caller to another) and every parameter but the page's own.
fn fingerprint(list: &str, publisher: Uuid, params: &BTreeMap<String, String>) -> String {
    let mut hash = Sha256::new();
    hash.update(list.as_bytes());
    hash.update(publisher.as_bytes());
    for (k, v) in params {
        if k != "cursor" && k != "limit" {
            hash.update([0]);
            hash.update(k.as_bytes());
            hash.update([1]);
            hash.update(v.as_bytes());
        }
    }
    hex::encode(&hash.finalize()[..8])
}

/// A cursor as encoded: the query's fingerprint, the last row's sort key and id.
#[derive(Debug, Serialize, Deserialize)]
struct CursorDoc {
    q: String,
    k: CursorKey,
    i: Uuid,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum CursorKey {
    Text(String),
    /// Microseconds since the epoch (PostgreSQL's precision).
    Time(i64),
    Number(f64),
}

/// Cuts `rows` (fetched one past the page) to the page and returns the cursor of the next page,
/// when there is one: the keyset of the page's last row, bound to `query_id`.
fn next_page<T>(
    rows: &mut Vec<T>,
    limit: i64,
    query_id: &str,
    keyset: impl Fn(&T) -> Keyset,
) -> Option<String> {
    let page = usize::try_from(limit).unwrap_or(usize::MAX);
    if rows.len() <= page {
        return None;
    }
    rows.truncate(page);
    rows.last().map(|r| encode_cursor(query_id, &keyset(r)))
}

fn encode_cursor(query: &str, keyset: &Keyset) -> String {
    let k = match &keyset.key {
        KeyValue::Text(s) => CursorKey::Text(s.clone()),
        KeyValue::Time(t) => CursorKey::Time(t.timestamp_micros()),
        KeyValue::Number(n) => CursorKey::Number(*n),
    };
    let doc = CursorDoc {
        q: query.to_string(),
        k,
        i: keyset.id,
    };
    // Hex of a small JSON document: opaque to clients, safe in a URL without escaping.
    hex::encode(serde_json::to_vec(&doc).unwrap_or_default())
}

/// The keyset a cursor names, checked against the query it is used with.
fn decode_cursor(
    params: &BTreeMap<String, String>,
    query: &str,
    time_key: bool,
    text_key: bool,
) -> Result<Option<Keyset>, ApiError> {
    let Some(raw) = params.get("cursor") else {
        return Ok(None);
    };
    let malformed = || {
        bad(
            "cursor",
            "malformed: must be the `next_cursor` of a previous page of this list",
        )
    };
    let doc: CursorDoc = hex::decode(raw)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .ok_or_else(malformed)?;
    if doc.q != query {
        return Err(bad(
            "cursor",
            "belongs to another query: a cursor continues only the query it came from (the same \
             filters, sort and order); drop it to start this query from its first page",
        ));
    }
    let key = match doc.k {
        CursorKey::Text(s) if text_key => KeyValue::Text(s),
        CursorKey::Time(m) if time_key => {
            KeyValue::Time(DateTime::from_timestamp_micros(m).ok_or_else(malformed)?)
        }
        CursorKey::Number(n) if !time_key && !text_key && n.is_finite() => KeyValue::Number(n),
        _ => return Err(malformed()),
    };
    Ok(Some(Keyset { key, id: doc.i }))
}

/// `GET /v1/skills`: the caller's skills, each with its latest version, verdict and pass rate.
#[tracing::instrument(skip_all)]
pub async fn skills(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<SkillList>, ApiError> {
    let params = parameters(raw.as_deref(), SKILL_PARAMS)?;
    let search = text(&params, "search")?;
    if search
        .as_ref()
        .is_some_and(|s| s.chars().count() > MAX_SEARCH_CHARS)
    {
        return Err(bad(
            "search",
            format!("must be at most {MAX_SEARCH_CHARS} characters"),
        ));
    }
    let profiles: Vec<(&str, &str)> = PROFILES.iter().map(|p| (*p, *p)).collect();
    let profile = one_of(&params, "profile", &profiles)?.map(str::to_string);
    let verdict = one_of(
        &params,
        "verdict",
        &[
            ("pass", VerdictFilter::Pass),
            ("fail", VerdictFilter::Fail),
            ("none", VerdictFilter::None),
        ],
    )?;
    let model = text(&params, "model")?;
    let sort = one_of(
        &params,
        "sort",
        &[
            ("name", SkillSortKey::Name),
            ("created", SkillSortKey::Created),
            ("updated", SkillSortKey::Updated),
            ("pass_rate", SkillSortKey::PassRate),
        ],
    )?
    .unwrap_or(SkillSortKey::Name);
    let default_order = if sort == SkillSortKey::Name {
        SortOrder::Asc
    } else {
        SortOrder::Desc
    };
    let order = order(&params, default_order)?;
    let limit = limit(&params)?;
    let query_id = fingerprint("skills", principal.publisher_id, &params);
    let after = decode_cursor(
        &params,
        &query_id,
        matches!(sort, SkillSortKey::Created | SkillSortKey::Updated),
        sort == SkillSortKey::Name,
    )?;
    let query = SkillQuery {
        search,
        profile,
        verdict,
        model,
        sort,
        order,
        after,
        limit: limit + 1,
    };
    let mut rows = state.store.list_skills(principal.viewer(), &query).await?;
    let next_cursor = next_page(&mut rows, limit, &query_id, |r| Keyset {
        key: r.key.clone(),
        id: r.skill_id,
    });
    Ok(Json(SkillList {
        skills: rows.into_iter().map(SkillListItem::from_item).collect(),
        next_cursor,
    }))
}

/// `GET /v1/runs`: the caller's runs, newest first unless asked otherwise.
#[tracing::instrument(skip_all)]
pub async fn runs(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(raw): RawQuery,
) -> Result<Json<RunList>, ApiError> {
    let params = parameters(raw.as_deref(), RUN_PARAMS)?;
    let skill = text(&params, "skill")?;
    let version = match text(&params, "version")? {
        None => None,
        Some(v) => match Uuid::parse_str(&v) {
            Ok(id) => Some(VersionFilter::Id(id)),
            Err(_) if skill.is_some() => Some(VersionFilter::Label(v)),
            Err(_) => {
                return Err(bad(
                    "version",
                    "must be a version id, or a version label together with `skill`",
                ))
            }
        },
    };
    let statuses: Vec<(&str, RunStatus)> =
        RunStatus::ALL.iter().map(|s| (s.as_str(), *s)).collect();
    let status = one_of(&params, "status", &statuses)?;
    let kinds: Vec<(&str, RunKind)> = [
        RunKind::Upload,
        RunKind::Manual,
        RunKind::Rescore,
        RunKind::Samples,
    ]
    .iter()
    .map(|k| (k.as_str(), *k))
    .collect();
    let kind = one_of(&params, "kind", &kinds)?;
    let verdict =
        one_of(&params, "verdict", &[("pass", "pass"), ("fail", "fail")])?.map(str::to_string);
    let created_after = time(&params, "created_after")?;
    let created_before = time(&params, "created_before")?;
    if let (Some(a), Some(b)) = (created_after, created_before) {
        if a >= b {
            return Err(bad("created_before", "must be later than `created_after`"));
        }
    }
    let sort = one_of(
        &params,
        "sort",
        &[
            ("created", RunSortKey::Created),
            ("score", RunSortKey::Score),
        ],
    )?
    .unwrap_or(RunSortKey::Created);
    let order = order(&params, SortOrder::Desc)?;
    let limit = limit(&params)?;
    let query_id = fingerprint("runs", principal.publisher_id, &params);
    let after = decode_cursor(&params, &query_id, sort == RunSortKey::Created, false)?;
    let query = RunQuery {
        skill,
        version,
        status,
        kind,
        verdict,
        created_after,
        created_before,
        sort,
        order,
        after,
        limit: limit + 1,
    };
    let mut rows = state.store.list_runs(principal.viewer(), &query).await?;
    let next_cursor = next_page(&mut rows, limit, &query_id, |r| Keyset {
        key: r.key.clone(),
        id: r.run_id,
    });
    Ok(Json(RunList {
        runs: rows.into_iter().map(RunListItem::from_item).collect(),
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(q: &str) -> BTreeMap<String, String> {
        parameters(Some(q), RUN_PARAMS).unwrap()
    }

    #[test]
    fn a_cursor_reads_back_only_with_its_query() {
        let p = params("skill=a&sort=score&limit=5");
        let id = fingerprint("runs", Uuid::nil(), &p);
        let keyset = Keyset {
            key: KeyValue::Number(0.25),
            id: Uuid::now_v7(),
        };
        let cursor = encode_cursor(&id, &keyset);
        let mut with = p.clone();
        with.insert("cursor".into(), cursor.clone());
        // Another page size is the same query.
        with.insert("limit".into(), "50".into());
        let back = decode_cursor(
            &with,
            &fingerprint("runs", Uuid::nil(), &with),
            false,
            false,
        )
        .unwrap();
        assert_eq!(back, Some(keyset));
        let mut other = params("skill=b&sort=score");
        other.insert("cursor".into(), cursor);
        let e = decode_cursor(
            &other,
            &fingerprint("runs", Uuid::nil(), &other),
            false,
            false,
        )
        .unwrap_err();
        assert_eq!(e.details["field"], "cursor");
        assert!(e.message.contains("another query"), "{e}");
        // The same parameters on the other list are another query too.
        assert_ne!(
            fingerprint("skills", Uuid::nil(), &p),
            fingerprint("runs", Uuid::nil(), &p)
        );
        // And so are they for another caller.
        assert_ne!(
            fingerprint("runs", Uuid::nil(), &p),
            fingerprint("runs", Uuid::max(), &p)
        );
    }

    #[test]
    fn unknown_repeated_and_malformed_parameters_name_themselves() {
        let e = parameters(Some("colour=red"), RUN_PARAMS).unwrap_err();
        assert_eq!(e.details["field"], "colour");
        assert!(e.message.contains("accepted: skill, version"), "{e}");
        let e = parameters(Some("skill=a&skill=b"), RUN_PARAMS).unwrap_err();
        assert_eq!(e.details["field"], "skill");
        let mut p = params("");
        p.insert("cursor".into(), "zz".into());
        let e = decode_cursor(&p, "x", true, false).unwrap_err();
        assert!(e.message.contains("malformed"), "{e}");
        let e = one_of(
            &params("sort=size"),
            "sort",
            &[("created", 1), ("score", 2)],
        )
        .unwrap_err();
        assert_eq!(e.details["field"], "sort");
        assert!(e.message.contains("created, score"), "{e}");
    }
}
