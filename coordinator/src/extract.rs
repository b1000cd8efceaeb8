//! Extractors whose rejections are [`ApiError`]s naming the field and the rule it broke,
//! instead of axum's plain-text rejections.

use axum::extract::{FromRequest, FromRequestParts, MatchedPath, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use percent_encoding::percent_decode_str;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Largest JSON body accepted by [`ApiJson`] (run requests are small).
const MAX_JSON_BODY_BYTES: usize = 1024 * 1024;

/// A JSON body; a type or shape error names the JSON pointer of the field that broke.
#[derive(Debug, Clone)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let is_json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| {
                let mime = ct
                    .split(';')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_ascii_lowercase();
                mime == "application/json" || mime.ends_with("+json")
            });
        if !is_json {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON: send `Content-Type: application/json`",
            )
            .with_details(
                serde_json::json!({ "field": "Content-Type", "rule": "must be application/json" }),
            ));
        }
        let bytes = axum::body::to_bytes(req.into_body(), MAX_JSON_BODY_BYTES)
            .await
            .map_err(|_| {
                ApiError::payload_too_large("max_json_body_bytes", MAX_JSON_BODY_BYTES as u64)
            })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Deserializes JSON, naming the failing field as a JSON pointer. A string holding the NUL
/// character is refused, naming where it is ([`skilleval_model::text::NUL_RULE`]): JSON can
/// only carry it escaped, so bodies without the escape `\u0000` skip the search.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Some(pointer) = skilleval_model::text::nul_in_json(bytes) {
        return Err(ApiError::invalid_field(
            "invalid_body",
            &pointer,
            skilleval_model::text::NUL_RULE,
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let pointer = json_pointer(&e.path().to_string());
        let rule = e.inner().to_string();
        // serde_json appends " at line L column C": useful for syntax errors only.
        let rule = if e.inner().is_syntax() || e.inner().is_eof() {
            rule
        } else {
            strip_position(&rule)
        };
        ApiError::invalid_field("invalid_body", &pointer, rule)
    })
}

/// Query parameters; a bad value names the parameter and the rule.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de)
            .map(ApiQuery)
            .map_err(|e| {
                let field = e.path().to_string();
                let field = if field == "." { String::new() } else { field };
                ApiError::invalid_field("invalid_query", &field, e.inner().to_string())
            })
    }
}

/// Middleware: refuses a request whose path or query holds the NUL character (`%00`), which
/// no stored name, label or id can hold ([`skilleval_model::text::NUL_RULE`]); **400** naming
/// the path parameter (by the matched route) or the query parameter. One check for every
/// route, so no handler's database query meets it.
pub async fn refuse_nul(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let uri = request.uri();
    let found =
        nul_in_path(uri.path(), route).or_else(|| nul_in_query(uri.query().unwrap_or_default()));
    match found {
        Some(e) => e.into_response(),
        None => next.run(request).await,
    }
}

/// The path's first segment holding `%00`, named by the route's parameter there.
fn nul_in_path(path: &str, route: Option<&str>) -> Option<ApiError> {
    let i = path
        .split('/')
        .position(|segment| percent_decode_str(segment).any(|b| b == 0))?;
    let field = route
        .and_then(|r| r.split('/').nth(i))
        .and_then(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .unwrap_or("path");
    Some(ApiError::invalid_field(
        "invalid_path",
        field,
        skilleval_model::text::NUL_RULE,
    ))
}

/// The first query parameter whose name or value holds the NUL character.
fn nul_in_query(query: &str) -> Option<ApiError> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
        .map(|(name, _)| {
            ApiError::invalid_field("invalid_query", &name, skilleval_model::text::NUL_RULE)
        })
}

/// Parses a path parameter that must be a UUID.
pub fn parse_uuid(param: &str, value: &str) -> Result<uuid::Uuid, ApiError> {
    uuid::Uuid::parse_str(value).map_err(|_| {
        ApiError::invalid_field(
            "invalid_path",
            param,
            format!("must be a UUID, got `{value}`"),
        )
    })
}

/// `a.b[2].c` (serde_path_to_error) -> `/a/b/2/c`; `.` (the root) -> ``.
fn json_pointer(path: &str) -> String {
    if path == "." {
        return String::new();
    }
    let mut out = String::new();
    for segment in path.split('.') {
        let mut rest = segment;
        let name_end = rest.find('[').unwrap_or(rest.len());
        let (name, tail) = rest.split_at(name_end);
        if !name.is_empty() {
            out.push('/');
            out.push_str(&skilleval_model::problem::escape_token(name));
        }
        rest = tail;
        while let Some(stripped) = rest.strip_prefix('[') {
            let end = stripped.find(']').unwrap_or(stripped.len());
            out.push('/');
            out.push_str(&stripped[..end]);
            rest = stripped.get(end + 1..).unwrap_or_default();
        }
    }
    out
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        version_id: uuid::Uuid,
        tags: Option<Vec<String>>,
    }

    #[test]
    fn pointer_conversion() {
        assert_eq!(json_pointer("."), "");
        assert_eq!(json_pointer("tags[2]"), "/tags/2");
        assert_eq!(json_pointer("a.b[0][1].c"), "/a/b/0/1/c");
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = parse_json::<Body>(
            br#"{"version_id": "00000000-0000-0000-0000-000000000000", "tags": [1]}"#,
        )
        .unwrap_err();
        assert_eq!(e.details["field"], "/tags/0");
        assert!(
            e.details["rule"].as_str().unwrap().contains("invalid type"),
            "{e}"
        );
        let e = parse_json::<Body>(br#"{"tags": []}"#).unwrap_err();
        assert!(e.message.contains("missing field `version_id`"), "{e}");
        let e = parse_json::<Body>(br#"{"version_id": "x"}"#).unwrap_err();
        assert_eq!(e.details["field"], "/version_id");
    }

    #[test]
    fn a_nul_in_the_path_names_the_routes_parameter() {
        let e = nul_in_path(
            "/v1/skills/a%00b/history",
            Some("/v1/skills/{name}/history"),
        )
        .unwrap();
        assert_eq!(e.details["field"], "name");
        assert_eq!(e.code, "invalid_path");
        assert!(nul_in_path("/v1/skills/a%20b/history", None).is_none());
        assert_eq!(nul_in_path("/x%00", None).unwrap().details["field"], "path");
        let e = nul_in_query("limit=2&search=a%00b").unwrap();
        assert_eq!(e.details["field"], "search");
        assert!(
            nul_in_query("search=a%2500b").is_none(),
            "`%2500` is the text %00"
        );
    }

    #[test]
    fn a_nul_character_is_refused_naming_its_field() {
        let e = parse_json::<Body>(
            br#"{"version_id": "00000000-0000-0000-0000-000000000000", "tags": ["a", "b\u0000"]}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.details["field"], "/tags/1");
        assert_eq!(e.details["rule"], skilleval_model::text::NUL_RULE);
        // An escaped backslash before `u0000` is text: the body parses.
        let ok = parse_json::<Body>(
            br#"{"version_id": "00000000-0000-0000-0000-000000000000", "tags": ["\\u0000"]}"#,
        )
        .unwrap();
        assert_eq!(ok.tags.unwrap(), vec!["\\u0000".to_string()]);
    }
}
