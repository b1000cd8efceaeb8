//! The OpenAI-compatible wire format: chat completions and embeddings, as OpenAI, vLLM,
//! Ollama, llama.cpp's server and LiteLLM speak them.
//!
//! Structured output is asked for with `response_format: {type: "json_schema", json_schema:
//! {name, schema}}`. Servers that reject it (HTTP 400) are asked again with `{type:
//! "json_object"}`, then with no `response_format` at all; the prompt always states the schema,
//! so the last form still works with any model. Which form a provider accepts is remembered by
//! the client ([`StructuredMode`]).

use serde_json::{json, Map, Value};

use super::chat::{ChatRequest, Role};
use super::config::ProviderConfig;

/// How structured output is requested from an OpenAI-compatible server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StructuredMode {
    JsonSchema = 0,
    JsonObject = 1,
    PromptOnly = 2,
}

impl StructuredMode {
    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            0 => StructuredMode::JsonSchema,
            1 => StructuredMode::JsonObject,
            _ => StructuredMode::PromptOnly,
        }
    }

    /// The next, more widely supported form.
    pub(crate) fn fallback(self) -> Option<Self> {
        match self {
            StructuredMode::JsonSchema => Some(StructuredMode::JsonObject),
            StructuredMode::JsonObject => Some(StructuredMode::PromptOnly),
            StructuredMode::PromptOnly => None,
        }
    }
}

/// What a chat completion said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedChat {
    pub text: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `finish_reason: length`.
    pub truncated: bool,
    pub model: String,
}

/// The body of `POST /chat/completions`.
pub(crate) fn chat_body(
    config: &ProviderConfig,
    req: &ChatRequest,
    temperature: Option<f64>,
    mode: StructuredMode,
) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = req.system.as_deref().filter(|s| !s.is_empty()) {
        messages.push(json!({"role": "system", "content": system}));
    }
    for m in &req.messages {
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        messages.push(json!({"role": role, "content": m.content}));
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(config.max_tokens)),
    );
    if let Some(t) = temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(schema) = &req.schema {
        match mode {
            StructuredMode::JsonSchema => {
                body.insert(
                    "response_format".into(),
                    json!({
                        "type": "json_schema",
                        "json_schema": {"name": schema.name, "schema": schema.schema},
                    }),
                );
            }
            StructuredMode::JsonObject => {
                body.insert("response_format".into(), json!({"type": "json_object"}));
            }
            StructuredMode::PromptOnly => {}
        }
    }
    Value::Object(body)
}

/// Reads a chat completion.
pub(crate) fn parse_chat(body: &Value) -> Result<ParsedChat, String> {
    let choice = body
        .pointer("/choices/0")
        .ok_or("the answer has no `choices[0]`")?;
    let message = choice
        .get("message")
        .ok_or("`choices[0]` has no `message`")?;
    let text = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        // Content as a list of parts (some servers).
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => match message.get("refusal").and_then(Value::as_str) {
            Some(r) => r.to_string(),
            None => String::new(),
        },
    };
    let usage = body.get("usage");
    let tokens = |k: &str| {
        usage
            .and_then(|u| u.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ParsedChat {
        text,
        input_tokens: tokens("prompt_tokens"),
        output_tokens: tokens("completion_tokens"),
        truncated: choice.get("finish_reason").and_then(Value::as_str) == Some("length"),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

/// The body of `POST /embeddings`.
pub(crate) fn embeddings_body(model: &str, inputs: &[&str]) -> Value {
    json!({"model": model, "input": inputs})
}

/// Reads an embeddings answer: vectors in input order, and the input tokens.
pub(crate) fn parse_embeddings(
    body: &Value,
    expected: usize,
) -> Result<(Vec<Vec<f32>>, u64), String> {
    let data = body
        .get("data")
        .and_then(Value::as_array)
        .ok_or("the answer has no `data` list")?;
    let mut out: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (pos, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map_or(pos, |i| i as usize);
        let vector: Vec<f32> = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or("a `data` item has no `embedding` list")?
            .iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or("an embedding holds a non-number")
            })
            .collect::<Result<_, _>>()?;
        match out.get_mut(index) {
            Some(slot) => *slot = Some(vector),
            None => return Err(format!("embedding index {index} is out of range")),
        }
    }
    let vectors = out
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or(format!("no embedding came back for input {i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let tokens = body
        .pointer("/usage/prompt_tokens")
        .or_else(|| body.pointer("/usage/total_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok((vectors, tokens))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::chat::{Message, OutputSchema};
    use super::super::config::ProviderKind;
    use super::*;

    #[test]
    fn body_carries_system_messages_and_the_response_format() {
        let config = ProviderConfig::new("p", ProviderKind::Openai, "gpt-x");
        let req = ChatRequest {
            system: Some("be brief".into()),
            messages: vec![Message::user("hi")],
            schema: Some(OutputSchema::new("verdict", json!({"type": "object"}))),
            ..ChatRequest::default()
        };
        let b = chat_body(&config, &req, Some(0.0), StructuredMode::JsonSchema);
        assert_eq!(
            b["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(b["messages"][1], json!({"role": "user", "content": "hi"}));
        assert_eq!(b["response_format"]["json_schema"]["name"], "verdict");
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["max_tokens"], 2048);
        let b = chat_body(&config, &req, None, StructuredMode::JsonObject);
        assert_eq!(b["response_format"], json!({"type": "json_object"}));
        assert!(b.get("temperature").is_none());
        let b = chat_body(&config, &req, None, StructuredMode::PromptOnly);
        assert!(b.get("response_format").is_none());
    }

    #[test]
    fn answers_are_read() {
        let body = json!({
            "model": "gpt-x-2025",
            "choices": [{"message": {"role": "assistant", "content": "hello"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}
        });
        let p = parse_chat(&body).unwrap();
        assert_eq!(
            (
                p.text.as_str(),
                p.input_tokens,
                p.output_tokens,
                p.truncated
            ),
            ("hello", 12, 3, true)
        );
        assert!(parse_chat(&json!({"choices": []})).is_err());
        let e = json!({"data": [{"index": 1, "embedding": [0.0, 1.0]}, {"index": 0, "embedding": [1.0, 0.0]}], "usage": {"prompt_tokens": 7}});
        let (v, t) = parse_embeddings(&e, 2).unwrap();
        assert_eq!(v, vec![vec![1.0, 0.0], vec![0.0, 1.0]]);
        assert_eq!(t, 7);
        assert!(parse_embeddings(&e, 3).is_err());
    }
}
