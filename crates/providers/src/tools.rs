//! Tool use: one turn of an agent conversation, in each provider's native protocol.
//!
//! The conversation is kept provider-neutral ([`AgentMessage`]) and written out per request:
//! - OpenAI-compatible chat completions: `tools: [{type: "function", function: {name,
//!   description, parameters}}]`; the answer's `message.tool_calls[].function.arguments` is a
//!   JSON *string*; each result goes back as a `{"role": "tool", "tool_call_id", "content"}`
//!   message.
//! - Anthropic Messages: `tools: [{name, description, input_schema}]`; the answer's `content`
//!   holds `tool_use` blocks (`id`, `name`, `input` as JSON); the results go back in one user
//!   message of `tool_result` blocks (`tool_use_id`, `content`, `is_error`).
//!
//! Agent turns are never served from the response cache: each depends on what the sandbox did.

use serde_json::{json, Map, Value};

use super::config::ProviderConfig;
use super::openai::ParsedChat;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// One tool call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    /// The provider's id, echoed with the result.
    pub id: String,
    pub name: String,
    /// The arguments object (`Value::Null` when the model sent something that is not JSON;
    /// `raw_arguments` keeps what it sent).
    pub arguments: Value,
    pub raw_arguments: Option<String>,
}

/// The result of one tool call, sent back in the next request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub id: String,
    pub content: String,
    pub is_error: bool,
}

/// One message of an agent conversation (the system prompt is [`AgentRequest::system`]).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentMessage {
    User(String),
    Assistant { text: String, calls: Vec<ToolUse> },
    ToolResults(Vec<ToolResult>),
}

/// One request of the loop.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRequest {
    pub system: String,
    pub messages: Vec<AgentMessage>,
    pub tools: Vec<ToolSpec>,
    /// `None`: the provider's `max_tokens`.
    pub max_tokens: Option<u32>,
}

/// The model's answer to one request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentReply {
    pub text: String,
    pub calls: Vec<ToolUse>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Stopped at `max_tokens`.
    pub truncated: bool,
    pub model: String,
}

pub(crate) fn openai_body(
    config: &ProviderConfig,
    req: &AgentRequest,
    temperature: Option<f64>,
) -> Value {
    let mut messages = vec![json!({"role": "system", "content": req.system})];
    for m in &req.messages {
        match m {
            AgentMessage::User(text) => messages.push(json!({"role": "user", "content": text})),
            AgentMessage::Assistant { text, calls } => {
                let mut msg = Map::new();
                msg.insert("role".into(), json!("assistant"));
                msg.insert(
                    "content".into(),
                    if text.is_empty() {
                        Value::Null
                    } else {
                        json!(text)
                    },
                );
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| {
                            let args = c
                                .raw_arguments
                                .clone()
                                .unwrap_or_else(|| c.arguments.to_string());
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": args}})
                        })
                        .collect();
                    msg.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(msg));
            }
            AgentMessage::ToolResults(results) => {
                for r in results {
                    messages
                        .push(json!({"role": "tool", "tool_call_id": r.id, "content": r.content}));
                }
            }
        }
    }
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}})
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("tools".into(), Value::Array(tools));
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(config.max_tokens)),
    );
    if let Some(t) = temperature {
        body.insert("temperature".into(), json!(t));
    }
    Value::Object(body)
}

pub(crate) fn parse_openai(body: &Value) -> Result<AgentReply, String> {
    let parsed: ParsedChat = super::openai::parse_chat(body)?;
    let mut calls = Vec::new();
    let listed = body
        .pointer("/choices/0/message/tool_calls")
        .and_then(Value::as_array);
    for (i, call) in listed.into_iter().flatten().enumerate() {
        let function = call
            .get("function")
            .ok_or("a `tool_calls` item has no `function`")?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a tool call has no `function.name`")?;
        let (arguments, raw) = match function.get("arguments") {
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(v) => (v, Some(s.clone())),
                Err(_) => (Value::Null, Some(s.clone())),
            },
            Some(v @ Value::Object(_)) => (v.clone(), None),
            _ => (json!({}), None),
        };
        calls.push(ToolUse {
            id: call
                .get("id")
                .and_then(Value::as_str)
                .map_or_else(|| format!("call_{i}"), str::to_string),
            name: name.to_string(),
            arguments,
            raw_arguments: raw,
        });
    }
    Ok(AgentReply {
        text: parsed.text,
        calls,
        input_tokens: parsed.input_tokens,
        output_tokens: parsed.output_tokens,
        truncated: parsed.truncated,
        model: parsed.model,
    })
}

pub(crate) fn anthropic_body(
    config: &ProviderConfig,
    req: &AgentRequest,
    temperature: Option<f64>,
) -> Value {
    let mut messages = Vec::new();
    for m in &req.messages {
        match m {
            AgentMessage::User(text) => messages.push(json!({"role": "user", "content": text})),
            AgentMessage::Assistant { text, calls } => {
                let mut blocks = Vec::new();
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for c in calls {
                    let input = if c.arguments.is_object() {
                        c.arguments.clone()
                    } else {
                        json!({})
                    };
                    blocks.push(
                        json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}),
                    );
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            AgentMessage::ToolResults(results) => {
                let blocks: Vec<Value> = results
                    .iter()
                    .map(|r| {
                        json!({"type": "tool_result", "tool_use_id": r.id,
                               "content": r.content, "is_error": r.is_error})
                    })
                    .collect();
                messages.push(json!({"role": "user", "content": blocks}));
            }
        }
    }
    let tools: Vec<Value> = req
        .tools
        .iter()
        .map(
            |t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}),
        )
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "max_tokens".into(),
        json!(req.max_tokens.unwrap_or(config.max_tokens)),
    );
    body.insert("system".into(), json!(req.system));
    body.insert("messages".into(), Value::Array(messages));
    body.insert("tools".into(), Value::Array(tools));
    if let Some(t) = temperature {
        body.insert("temperature".into(), json!(t.clamp(0.0, 1.0)));
    }
    Value::Object(body)
}

pub(crate) fn parse_anthropic(body: &Value) -> Result<AgentReply, String> {
    let (parsed, _) = super::anthropic::parse_messages(body, None)?;
    let mut calls = Vec::new();
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if block.get("type").and_then(Value::as_str) != Some("tool_use") {
            continue;
        }
        calls.push(ToolUse {
            id: block
                .get("id")
                .and_then(Value::as_str)
                .ok_or("a `tool_use` block has no `id`")?
                .to_string(),
            name: block
                .get("name")
                .and_then(Value::as_str)
                .ok_or("a `tool_use` block has no `name`")?
                .to_string(),
            arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
            raw_arguments: None,
        });
    }
    Ok(AgentReply {
        text: parsed.text,
        calls,
        input_tokens: parsed.input_tokens,
        output_tokens: parsed.output_tokens,
        truncated: parsed.truncated,
        model: parsed.model,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::config::ProviderKind;
    use super::*;

    fn conversation() -> AgentRequest {
        AgentRequest {
            system: "sys".into(),
            messages: vec![
                AgentMessage::User("do it".into()),
                AgentMessage::Assistant {
                    text: String::new(),
                    calls: vec![ToolUse {
                        id: "c1".into(),
                        name: "bash".into(),
                        arguments: json!({"command": "ls"}),
                        raw_arguments: Some("{\"command\":\"ls\"}".into()),
                    }],
                },
                AgentMessage::ToolResults(vec![ToolResult {
                    id: "c1".into(),
                    content: "a.txt".into(),
                    is_error: false,
                }]),
            ],
            tools: vec![ToolSpec {
                name: "bash",
                description: "run",
                parameters: json!({"type": "object"}),
            }],
            max_tokens: None,
        }
    }

    #[test]
    fn openai_shape_round_trips_tool_calls() {
        let config = ProviderConfig::new("p", ProviderKind::Openai, "m");
        let b = openai_body(&config, &conversation(), None);
        assert_eq!(b["messages"][0]["role"], "system");
        assert_eq!(
            b["messages"][2]["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"ls\"}"
        );
        assert_eq!(
            b["messages"][3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
        );
        assert_eq!(b["tools"][0]["function"]["name"], "bash");
        let reply = parse_openai(&json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"/skill/SKILL.md\"}"}}]},
            "finish_reason": "tool_calls"}]})).unwrap();
        assert_eq!(reply.calls[0].arguments["path"], "/skill/SKILL.md");
        assert_eq!(reply.calls[0].id, "x");
    }

    #[test]
    fn anthropic_shape_round_trips_tool_use() {
        let config = ProviderConfig::new("p", ProviderKind::Anthropic, "m");
        let b = anthropic_body(&config, &conversation(), None);
        assert_eq!(b["system"], "sys");
        assert_eq!(b["messages"][1]["content"][0]["type"], "tool_use");
        assert_eq!(b["messages"][2]["content"][0]["type"], "tool_result");
        assert_eq!(b["messages"][2]["content"][0]["tool_use_id"], "c1");
        assert_eq!(b["tools"][0]["input_schema"], json!({"type": "object"}));
        let reply = parse_anthropic(&json!({"content": [{"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t", "name": "bash", "input": {"command": "ls"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 2}}))
        .unwrap();
        assert_eq!(reply.text, "ok");
        assert_eq!(reply.calls[0].arguments["command"], "ls");
        assert_eq!(reply.input_tokens, 3);
    }
}
