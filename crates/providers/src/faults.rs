//! How a provider's HTTP answer becomes a [`Fault`], and how long it asked us to wait.
//!
//! - 429: transient, with the wait from `retry-after-ms`, `Retry-After` (seconds or an HTTP
//!   date), OpenAI's `x-ratelimit-reset-requests` / `-tokens` (Go durations such as `1s`,
//!   `6m0s`, `20ms`) or Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339 instants), first
//!   found in that order.
//! - 408, 409, 5xx (Anthropic's 529 "overloaded" included), connection failures and request
//!   timeouts: transient (a `Retry-After` on a 503 is honoured too).
//! - Any other 4xx (400, 401, 403, 404, 422...): permanent, with the provider's own error
//!   message, so the author sees "model not found" rather than "HTTP 404".
//!
//! Messages never carry the API key: providers that echo a key back have it replaced.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::header::HeaderMap;
use serde_json::Value;

use skilleval_model::grade::Fault;

/// Longest provider error message kept in a fault.
const MAX_MESSAGE_CHARS: usize = 500;

/// The fault for an HTTP error status.
pub fn fault_from_status(
    provider: &str,
    status: u16,
    headers: &HeaderMap,
    body: &str,
    now: DateTime<Utc>,
) -> Fault {
    let message = error_message(body);
    let detail = if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    };
    match status {
        429 => Fault::Transient {
            message: format!("provider `{provider}` rate limited the request (HTTP 429){detail}"),
            retry_after_ms: retry_after(headers, now).map(duration_ms),
        },
        408 | 409 | 500..=599 => Fault::Transient {
            message: format!("provider `{provider}` answered HTTP {status}{detail}"),
            retry_after_ms: retry_after(headers, now).map(duration_ms),
        },
        401 | 403 => Fault::permanent(format!(
            "provider `{provider}` refused the credentials (HTTP {status}){detail}; check the key in its `api_key_env` variable"
        )),
        404 => Fault::permanent(format!(
            "provider `{provider}` answered HTTP 404{detail}; check its `base_url` and `model`"
        )),
        _ => Fault::permanent(format!(
            "provider `{provider}` rejected the request (HTTP {status}){detail}"
        )),
    }
}

/// The fault for a request that got no HTTP answer.
pub fn fault_from_transport(provider: &str, err: &reqwest::Error, timeout_ms: u64) -> Fault {
    if err.is_timeout() {
        Fault::transient(format!(
            "provider `{provider}` did not answer within {timeout_ms} ms (its `timeout_ms`)"
        ))
    } else if err.is_connect() {
        Fault::transient(format!(
            "could not connect to provider `{provider}`: {}",
            error_chain(err)
        ))
    } else {
        Fault::transient(format!(
            "request to provider `{provider}` failed: {}",
            error_chain(err)
        ))
    }
}

/// The error and its causes, without the URL's query (never holds a key here, but short).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// The provider's error message from an error body: OpenAI's `{"error": {"message"}}`,
/// Anthropic's `{"type": "error", "error": {"message"}}`, `{"message"}`, `{"detail"}`, or the
/// text itself; cut to a few hundred characters.
pub fn error_message(body: &str) -> String {
    let text = match serde_json::from_str::<Value>(body) {
        Ok(v) => {
            let found = [
                v.pointer("/error/message"),
                v.get("error").filter(|e| e.is_string()),
                v.get("message"),
                v.get("detail"),
            ]
            .into_iter()
            .flatten()
            .find_map(|m| match m {
                Value::String(s) => Some(s.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            });
            found.unwrap_or_else(|| body.trim().to_string())
        }
        Err(_) => body.trim().to_string(),
    };
    cut(&text, MAX_MESSAGE_CHARS)
}

/// Replaces every occurrence of `secret` in `text`.
pub fn redact(text: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if s.len() >= 4 && text.contains(s) => text.replace(s, "[redacted]"),
        _ => text.to_string(),
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// How long the provider asked us to wait, from the first header that says.
pub fn retry_after(headers: &HeaderMap, now: DateTime<Utc>) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if ms.is_finite() && ms >= 0.0 {
            return Some(Duration::from_secs_f64(ms / 1000.0));
        }
    }
    if let Some(v) = get("retry-after") {
        if let Ok(secs) = v.parse::<f64>() {
            if secs.is_finite() && secs >= 0.0 {
                return Some(Duration::from_secs_f64(secs));
            }
        } else if let Ok(at) = DateTime::parse_from_rfc2822(v) {
            return Some(until(at.with_timezone(&Utc), now));
        }
    }
    // OpenAI: the reset of whichever budget ran out; the later one when neither says.
    let openai: Vec<(Option<&str>, Duration)> = [
        (
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ),
        ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ]
    .into_iter()
    .filter_map(|(remaining, reset)| {
        get(reset)
            .and_then(parse_go_duration)
            .map(|d| (get(remaining), d))
    })
    .collect();
    if let Some(d) = pick_reset(&openai) {
        return Some(d);
    }
    let anthropic: Vec<(Option<&str>, Duration)> = [
        (
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
        ),
        (
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ),
        (
            "anthropic-ratelimit-input-tokens-remaining",
            "anthropic-ratelimit-input-tokens-reset",
        ),
        (
            "anthropic-ratelimit-output-tokens-remaining",
            "anthropic-ratelimit-output-tokens-reset",
        ),
    ]
    .into_iter()
    .filter_map(|(remaining, reset)| {
        get(reset)
            .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
            .map(|at| (get(remaining), until(at.with_timezone(&Utc), now)))
    })
    .collect();
    pick_reset(&anthropic)
}

/// The latest reset among the budgets that are exhausted (`remaining` 0), else among all.
fn pick_reset(resets: &[(Option<&str>, Duration)]) -> Option<Duration> {
    let exhausted = resets
        .iter()
        .filter(|(remaining, _)| remaining.is_some_and(|r| r.parse::<f64>().ok() == Some(0.0)))
        .map(|(_, d)| *d)
        .max();
    exhausted.or_else(|| resets.iter().map(|(_, d)| *d).max())
}

fn until(at: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (at - now).to_std().unwrap_or(Duration::ZERO)
}

/// Parses a Go duration as OpenAI sends it: `1s`, `6m0s`, `20ms`, `1h2m3.5s`, `250us`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0.0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let factor = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += value * factor;
        rest = &rest[unit_len..];
    }
    total.is_finite().then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("20ms"), Some(Duration::from_millis(20)));
        assert_eq!(
            parse_go_duration("1h2m3.5s"),
            Some(Duration::from_millis(3_723_500))
        );
        assert_eq!(parse_go_duration("0"), Some(Duration::ZERO));
        assert_eq!(parse_go_duration("soon"), None);
        assert_eq!(parse_go_duration("5 s"), None);
    }

    #[test]
    fn retry_after_sources_in_order() {
        let n = now();
        assert_eq!(
            retry_after(&headers(&[("retry-after", "2")]), n),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "2"), ("retry-after-ms", "150")]),
                n
            ),
            Some(Duration::from_millis(150))
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Thu, 01 Jan 2026 00:00:07 GMT")]),
                n
            ),
            Some(Duration::from_secs(7))
        );
        // A date in the past means "now".
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "Wed, 31 Dec 2025 23:00:00 GMT")]),
                n
            ),
            Some(Duration::ZERO)
        );
        let openai = headers(&[
            ("x-ratelimit-remaining-requests", "12"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "20ms"),
        ]);
        assert_eq!(retry_after(&openai, n), Some(Duration::from_millis(20)));
        let openai = headers(&[
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "3s"),
        ]);
        assert_eq!(retry_after(&openai, n), Some(Duration::from_secs(3)));
        let anthropic = headers(&[
            ("anthropic-ratelimit-requests-remaining", "0"),
            ("anthropic-ratelimit-requests-reset", "2026-01-01T00:00:04Z"),
        ]);
        assert_eq!(retry_after(&anthropic, n), Some(Duration::from_secs(4)));
        assert_eq!(retry_after(&headers(&[]), n), None);
    }

    #[test]
    fn statuses_map_to_faults() {
        let h = headers(&[("retry-after", "3")]);
        let f = fault_from_status("p", 429, &h, r#"{"error":{"message":"slow down"}}"#, now());
        assert!(f.is_transient());
        assert_eq!(f.retry_after(), Some(Duration::from_secs(3)));
        assert!(f.to_string().contains("slow down"), "{f}");
        for status in [500, 502, 503, 529, 408] {
            assert!(fault_from_status("p", status, &HeaderMap::new(), "", now()).is_transient());
        }
        let f = fault_from_status(
            "p",
            404,
            &HeaderMap::new(),
            r#"{"type":"error","error":{"type":"not_found_error","message":"model: nope"}}"#,
            now(),
        );
        assert!(!f.is_transient());
        assert!(
            f.to_string().contains("model: nope") && f.to_string().contains("base_url"),
            "{f}"
        );
        let f = fault_from_status("p", 401, &HeaderMap::new(), "bad key", now());
        assert!(
            !f.is_transient() && f.to_string().contains("api_key_env"),
            "{f}"
        );
        let f = fault_from_status(
            "p",
            400,
            &HeaderMap::new(),
            r#"{"detail":"max_tokens too large"}"#,
            now(),
        );
        assert!(
            matches!(f, Fault::Permanent { .. }) && f.to_string().contains("max_tokens too large")
        );
    }

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(
            redact("Incorrect API key sk-abc123", Some("sk-abc123")),
            "Incorrect API key [redacted]"
        );
        assert_eq!(redact("fine", None), "fine");
        assert!(error_message(&"x".repeat(2_000)).chars().count() <= MAX_MESSAGE_CHARS + 1);
    }
}
