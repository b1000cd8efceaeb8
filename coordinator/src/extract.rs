//! Extractors whose rejections are [`ApiError`]s naming the field and the rule it broke,
//! instead of axum's plain-text rejections.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
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

/// Deserializes JSON, naming the failing field as a JSON pointer.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
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
}
