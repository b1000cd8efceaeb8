//! The Anthropic Messages API wire format (`POST {base_url}/messages`).
//!
//! Authentication is `x-api-key` with an `anthropic-version` header. Structured output is a
//! forced tool call: the schema becomes the only tool's `input_schema`, `tool_choice` names it,
//! and the answer is that tool call's `input` — already JSON, no text to parse.

use serde_json::{json, Map, Value};

use super::chat::{ChatRequest, Role};
use super::config::ProviderConfig;
use super::openai::ParsedChat;

/// The API version sent in `anthropic-version`.
pub(crate) const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The body of `POST /messages`.
pub(crate) fn messages_body(
    config: &ProviderConfig,
    req: &ChatRequest,
    temperature: Option<f64>,
) -> Value {
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| {
            let role = match m.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            json!({"role": role, "content": m.content})
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(config.max_tokens)),
    );
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        body.insert("system".into(), json!(system));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = temperature {
        // Anthropic's range is 0..1.
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    if let Some(schema) = &req.schema {
        body.insert(
            "tools".into(),
            json!([{
                "name": schema.name,
                "description": "Record your answer. Call this tool exactly once with the complete answer.",
                "input_schema": schema.schema,
            }]),
        );
        body.insert(
            "tool_choice".into(),
            json!({"type": "tool", "name": schema.name}),
        );
    }
    Value::Object(body)
}

/// Reads a Messages answer: the forced tool call's input (when `tool` is given and the model
/// called it) and the text blocks.
pub(crate) fn parse_messages(
    body: &Value,
    tool: Option<&str>,
) -> Result<(ParsedChat, Option<Value>), String> {
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or("the answer has no `content` list")?;
    let mut text = String::new();
    let mut structured = None;
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = block.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            Some("tool_use") => {
                let name = block.get("name").and_then(Value::as_str);
                if tool.is_some() && name == tool && structured.is_none() {
                    structured = block.get("input").cloned();
                }
            }
            _ => {}
        }
    }
    let usage = body.get("usage");
    let tokens = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let parsed = ParsedChat {
        text: match &structured {
            Some(v) => v.to_string(),
            None => text,
        },
        input_tokens: tokens("input_tokens")
            + tokens("cache_creation_input_tokens")
            + tokens("cache_read_input_tokens"),
        output_tokens: tokens("output_tokens"),
        truncated: body.get("stop_reason").and_then(Value::as_str) == Some("max_tokens"),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    };
    Ok((parsed, structured))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::chat::{Message, OutputSchema};
    use super::super::config::ProviderKind;
    use super::*;

    #[test]
    fn forced_tool_call_shape() {
        let config = ProviderConfig::new("c", ProviderKind::Anthropic, "claude-x");
        let schema = json!({"type": "object", "properties": {"score": {"type": "number"}}});
        let req = ChatRequest {
            system: Some("judge".into()),
            messages: vec![Message::user("grade this")],
            schema: Some(OutputSchema::new("record_grade", schema.clone())),
            ..ChatRequest::default()
        };
        let b = messages_body(&config, &req, Some(1.5));
        assert_eq!(b["system"], "judge");
        assert_eq!(
            b["messages"],
            json!([{"role": "user", "content": "grade this"}])
        );
        assert_eq!(b["tools"][0]["name"], "record_grade");
        assert_eq!(b["tools"][0]["input_schema"], schema);
        assert_eq!(
            b["tool_choice"],
            json!({"type": "tool", "name": "record_grade"})
        );
        assert_eq!(b["temperature"], 1.0);
        assert_eq!(b["max_tokens"], 2048);
    }

    #[test]
    fn tool_input_is_the_answer() {
        let body = json!({
            "model": "claude-x",
            "content": [
                {"type": "text", "text": "Let me record it."},
                {"type": "tool_use", "id": "t1", "name": "record_grade", "input": {"score": 4}}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 100, "output_tokens": 20}
        });
        let (p, s) = parse_messages(&body, Some("record_grade")).unwrap();
        assert_eq!(s, Some(json!({"score": 4})));
        assert_eq!(p.text, r#"{"score":4}"#);
        assert_eq!(
            (p.input_tokens, p.output_tokens, p.truncated),
            (100, 20, false)
        );
        let (p, s) = parse_messages(&body, None).unwrap();
        assert_eq!((p.text.as_str(), s), ("Let me record it.", None));
    }
}
