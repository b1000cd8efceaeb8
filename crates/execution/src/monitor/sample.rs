//! Production samples: what a sampling job sends, checked item by item.
//!
//! A batch is read as a list of JSON values; each item becomes a [`Sample`] or a
//! [`SampleError`] with its index, the JSON pointer of the broken field and the rule, so one bad
//! item never rejects the others. [`BatchLimits`] bounds a batch before any item is read.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use skilleval_model::grade::ToolCall;

/// Longest `sample_id` (the idempotency key).
pub const MAX_SAMPLE_ID: usize = 256;

/// One production sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// Unique per skill: a re-sent sample is a duplicate, never graded twice.
    pub sample_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// When the skill produced the output (ingest time when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<DateTime<Utc>>,
    /// What the skill was asked: a string, or any JSON (a message list, a request body).
    pub input: Value,
    /// What it answered (a JSON answer is kept as its compact text).
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// W3C trace context of the production request, to link the grade to its trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Sample {
    /// The prompt a grader sees: the input's text, or its compact JSON.
    pub fn prompt(&self) -> String {
        match &self.input {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// Why one item of a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleError {
    /// Position of the item in the batch (0-based; a line number − 1 in a JSONL file).
    pub index: usize,
    /// RFC 6901 pointer into the item.
    pub pointer: String,
    pub message: String,
}

impl std::fmt::Display for SampleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "item {}#{}: {}", self.index, self.pointer, self.message)
    }
}

const KEYS: &[&str] = &[
    "sample_id",
    "version",
    "observed_at",
    "input",
    "output",
    "tool_calls",
    "context",
    "metadata",
    "traceparent",
];

/// Reads one item; every broken field is reported (the item is refused when any is).
pub fn parse_sample(index: usize, item: &Value) -> Result<Sample, Vec<SampleError>> {
    let mut errors = Vec::new();
    let mut err = |pointer: &str, message: String| {
        errors.push(SampleError {
            index,
            pointer: pointer.to_string(),
            message,
        });
    };
    let Value::Object(obj) = item else {
        err("", "a sample must be a JSON object".into());
        return Err(errors);
    };
    if let Some(pointer) = skilleval_model::text::first_nul(item) {
        err(&pointer, skilleval_model::text::NUL_RULE.into());
        return Err(errors);
    }
    for key in obj.keys() {
        if !KEYS.contains(&key.as_str()) {
            err(
                &format!("/{}", skilleval_model::problem::escape_token(key)),
                format!("unknown field `{key}`; known: {}", KEYS.join(", ")),
            );
        }
    }
    let sample_id = match obj.get("sample_id") {
        Some(Value::String(s)) if !s.trim().is_empty() && s.len() <= MAX_SAMPLE_ID => {
            Some(s.clone())
        }
        Some(Value::String(_)) => {
            err(
                "/sample_id",
                format!("sample_id must be non-empty and at most {MAX_SAMPLE_ID} bytes"),
            );
            None
        }
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(_) => {
            err("/sample_id", "sample_id must be a string".into());
            None
        }
        None => {
            err(
                "/sample_id",
                "sample_id is required (the idempotency key)".into(),
            );
            None
        }
    };
    let version = match obj.get("version") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            err("/version", "version must be a non-empty string".into());
            None
        }
    };
    let observed_at = match obj.get("observed_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => match DateTime::parse_from_rfc3339(s) {
            Ok(t) => Some(t.with_timezone(&Utc)),
            Err(e) => {
                err(
                    "/observed_at",
                    format!(
                        "observed_at must be an RFC 3339 timestamp (2026-03-01T12:00:00Z): {e}"
                    ),
                );
                None
            }
        },
        Some(_) => {
            err(
                "/observed_at",
                "observed_at must be an RFC 3339 timestamp string".into(),
            );
            None
        }
    };
    let input = match obj.get("input") {
        None | Some(Value::Null) => {
            err("/input", "input is required".into());
            Value::Null
        }
        Some(v) => v.clone(),
    };
    let output = match obj.get("output") {
        None | Some(Value::Null) => {
            err(
                "/output",
                "output is required (what the skill answered)".into(),
            );
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut calls = Vec::with_capacity(items.len());
            for (i, call) in items.iter().enumerate() {
                match call {
                    Value::Object(c) => match c.get("name") {
                        Some(Value::String(name)) if !name.is_empty() => calls.push(ToolCall {
                            name: name.clone(),
                            arguments: c.get("arguments").cloned().unwrap_or(Value::Null),
                        }),
                        _ => err(
                            &format!("/tool_calls/{i}/name"),
                            "a tool call needs a non-empty `name`".into(),
                        ),
                    },
                    _ => err(
                        &format!("/tool_calls/{i}"),
                        "a tool call must be an object {\"name\", \"arguments\"}".into(),
                    ),
                }
            }
            Some(calls)
        }
        Some(_) => {
            err("/tool_calls", "tool_calls must be a list".into());
            None
        }
    };
    let metadata = match obj.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => {
            err("/metadata", "metadata must be an object".into());
            None
        }
    };
    let traceparent = match obj.get("traceparent") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if is_traceparent(s) => Some(s.clone()),
        Some(_) => {
            err(
                "/traceparent",
                "traceparent must be a W3C trace context (00-<32 hex>-<16 hex>-<2 hex>)".into(),
            );
            None
        }
    };
    match (sample_id, output) {
        (Some(sample_id), Some(output)) if errors.is_empty() => Ok(Sample {
            sample_id,
            version,
            observed_at,
            input,
            output,
            tool_calls,
            context: obj.get("context").filter(|v| !v.is_null()).cloned(),
            metadata,
            traceparent,
        }),
        _ => Err(errors),
    }
}

/// `version-traceid-parentid-flags`, lowercase hex, ids not all zero (W3C Trace Context §3.2).
fn is_traceparent(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    let hex = |p: &str, n: usize| {
        p.len() == n
            && p.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1].bytes().any(|b| b != b'0')
        && hex(parts[2], 16)
        && parts[2].bytes().any(|b| b != b'0')
        && hex(parts[3], 2)
}

/// The readable items of a batch and the errors of the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedBatch {
    /// `(index, sample)` in batch order.
    pub samples: Vec<(usize, Sample)>,
    pub errors: Vec<SampleError>,
}

/// Reads every item of a batch.
pub fn parse_batch(items: &[Value]) -> ParsedBatch {
    let mut out = ParsedBatch::default();
    for (i, item) in items.iter().enumerate() {
        match parse_sample(i, item) {
            Ok(s) => out.samples.push((i, s)),
            Err(mut e) => out.errors.append(&mut e),
        }
    }
    out
}

/// Reads a JSON Lines log: one sample per line, blank lines skipped; the index of an item is
/// its line number − 1, so an error points at its line.
pub fn parse_jsonl(text: &str) -> ParsedBatch {
    let mut out = ParsedBatch::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(line) {
            Ok(item) => match parse_sample(i, &item) {
                Ok(s) => out.samples.push((i, s)),
                Err(mut e) => out.errors.append(&mut e),
            },
            Err(e) => out.errors.push(SampleError {
                index: i,
                pointer: String::new(),
                message: format!("not JSON: {e}"),
            }),
        }
    }
    out
}

/// How big one ingest batch may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchLimits {
    pub max_samples: usize,
    pub max_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_samples: 1_000,
            max_bytes: 5 * 1024 * 1024,
        }
    }
}

/// A batch over its limits (the whole batch is refused: nothing in it was read).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("the batch is {bytes} bytes; the limit max_bytes is {limit}: send smaller batches")]
    TooLarge { bytes: usize, limit: usize },
    #[error(
        "the batch has {count} samples; the limit max_samples is {limit}: send smaller batches"
    )]
    TooMany { count: usize, limit: usize },
}

impl BatchLimits {
    /// Checks the body's size before parsing it.
    pub fn check_bytes(&self, bytes: usize) -> Result<(), BatchError> {
        if bytes > self.max_bytes {
            return Err(BatchError::TooLarge {
                bytes,
                limit: self.max_bytes,
            });
        }
        Ok(())
    }

    /// Checks the item count.
    pub fn check_count(&self, count: usize) -> Result<(), BatchError> {
        if count > self.max_samples {
            return Err(BatchError::TooMany {
                count,
                limit: self.max_samples,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_bad_item_does_not_reject_the_others() {
        let batch = json!([
            {"sample_id": "a", "input": "hi", "output": "hello", "observed_at": "2026-03-01T10:00:00Z",
             "tool_calls": [{"name": "lookup", "arguments": {"id": 1}}], "metadata": {"region": "eu"},
             "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
            {"input": "hi", "output": "x", "observed_at": "yesterday", "tool_calls": [{"arguments": {}}]},
            "not an object",
            {"sample_id": "d", "input": {"messages": []}, "output": {"answer": 42}, "traceparent": "nope", "extra": 1},
            {"sample_id": "e", "input": "q", "output": "a"},
            {"sample_id": "f", "input": "q", "output": {"text": ["fine", "nul\0here"]}}
        ]);
        let parsed = parse_batch(batch.as_array().unwrap());
        let ids: Vec<(usize, &str)> = parsed
            .samples
            .iter()
            .map(|(i, s)| (*i, s.sample_id.as_str()))
            .collect();
        assert_eq!(ids, [(0, "a"), (4, "e")]);
        let errs: Vec<(usize, &str)> = parsed
            .errors
            .iter()
            .map(|e| (e.index, e.pointer.as_str()))
            .collect();
        assert_eq!(
            errs,
            [
                (1, "/sample_id"),
                (1, "/observed_at"),
                (1, "/tool_calls/0/name"),
                (2, ""),
                (3, "/extra"),
                (3, "/traceparent"),
                (5, "/output/text/1")
            ]
        );
        assert_eq!(
            parsed.errors.last().unwrap().message,
            skilleval_model::text::NUL_RULE
        );
        let a = &parsed.samples[0].1;
        assert_eq!(a.tool_calls.as_ref().unwrap()[0].name, "lookup");
        assert_eq!(
            a.observed_at.unwrap().to_rfc3339(),
            "2026-03-01T10:00:00+00:00"
        );
        // A JSON output is kept as its text; a JSON input is the prompt's text.
        let d = parse_sample(
            0,
            &json!({"sample_id": "d", "input": {"q": 1}, "output": {"answer": 42}}),
        )
        .unwrap();
        assert_eq!(d.output, r#"{"answer":42}"#);
        assert_eq!(d.prompt(), r#"{"q":1}"#);
    }

    #[test]
    fn jsonl_errors_point_at_their_line() {
        let text = "{\"sample_id\": \"a\", \"input\": \"q\", \"output\": \"x\"}\n\n{broken\n{\"sample_id\": \"b\", \"input\": \"q\"}\n";
        let parsed = parse_jsonl(text);
        assert_eq!(parsed.samples.len(), 1);
        assert_eq!(parsed.errors.len(), 2);
        assert_eq!(
            (parsed.errors[0].index, parsed.errors[0].pointer.as_str()),
            (2, "")
        );
        assert!(parsed.errors[0].message.starts_with("not JSON"));
        assert_eq!(
            (parsed.errors[1].index, parsed.errors[1].pointer.as_str()),
            (3, "/output")
        );
    }

    #[test]
    fn batch_limits_are_typed() {
        let limits = BatchLimits::default();
        assert!(limits.check_count(1_000).is_ok());
        assert_eq!(
            limits.check_count(1_001),
            Err(BatchError::TooMany {
                count: 1_001,
                limit: 1_000
            })
        );
        assert!(limits.check_bytes(5 * 1024 * 1024).is_ok());
        let e = limits.check_bytes(5 * 1024 * 1024 + 1).unwrap_err();
        assert!(e.to_string().contains("max_bytes"), "{e}");
        let small = BatchLimits {
            max_samples: 2,
            max_bytes: 10,
        };
        assert!(small.check_count(3).is_err() && small.check_bytes(11).is_err());
    }
}
