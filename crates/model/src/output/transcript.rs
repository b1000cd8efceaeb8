//! Reading a runner's output as a transcript.
//!
//! A runner may print plain text (that text is the output) or a JSON transcript. Three transcript
//! shapes are understood, because those are what agents and SDKs write:
//! - `{"output": "...", "tool_calls": [{"name", "arguments"}]}` (our own, simplest shape);
//! - `{"messages": [...]}` in OpenAI chat shape (`tool_calls[].function.{name, arguments}` where
//!   `arguments` is a JSON string) or Anthropic shape (`content[]` blocks of `type: tool_use`
//!   with `name` and `input`);
//! - a bare array of such messages.
//!
//! The graded text of a message transcript is the last assistant message's text.

use serde_json::Value;

use super::Produced;
use crate::grade::ToolCall;

/// Parses a process's stdout: the trailing line terminators a `print` adds are dropped first,
/// as shell command substitution does, so `^42$` matches a script that printed `42\n`.
pub fn parse_stdout(stdout: &str) -> Produced {
    parse(stdout.trim_end_matches(['\n', '\r']))
}

/// Parses stdout into the graded output and the tool calls, if it is a transcript.
pub fn parse(stdout: &str) -> Produced {
    let trimmed = stdout.trim_start();
    if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
        return Produced {
            output: stdout.to_string(),
            ..Produced::default()
        };
    }
    let Ok(value) = serde_json::from_str::<Value>(trimmed) else {
        return Produced {
            output: stdout.to_string(),
            ..Produced::default()
        };
    };
    match &value {
        Value::Object(obj) if obj.contains_key("tool_calls") || obj.contains_key("toolCalls") => {
            let calls = obj
                .get("tool_calls")
                .or_else(|| obj.get("toolCalls"))
                .map(tool_calls_from_value)
                .unwrap_or_default();
            let output = match obj.get("output").or_else(|| obj.get("final")) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Produced {
                output,
                tool_calls: Some(calls),
                ..Produced::default()
            }
        }
        Value::Object(obj) if obj.get("messages").is_some_and(Value::is_array) => from_messages(
            obj.get("messages")
                .and_then(Value::as_array)
                .map_or(&[][..], Vec::as_slice),
        )
        .unwrap_or_else(|| plain(stdout)),
        Value::Array(items) if items.iter().all(is_message) && !items.is_empty() => {
            from_messages(items).unwrap_or_else(|| plain(stdout))
        }
        // Any other JSON is the output itself (json_schema grades it).
        _ => plain(stdout),
    }
}

fn plain(stdout: &str) -> Produced {
    Produced {
        output: stdout.to_string(),
        ..Produced::default()
    }
}

fn is_message(v: &Value) -> bool {
    v.get("role").is_some_and(Value::is_string)
}

fn from_messages(messages: &[Value]) -> Option<Produced> {
    if messages.is_empty() || !messages.iter().all(is_message) {
        return None;
    }
    let mut calls = Vec::new();
    let mut last_assistant_text = String::new();
    for msg in messages {
        if msg.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        if let Some(tc) = msg.get("tool_calls") {
            calls.extend(tool_calls_from_value(tc));
        }
        match msg.get("content") {
            Some(Value::String(s)) if !s.is_empty() => last_assistant_text = s.clone(),
            Some(Value::Array(blocks)) => {
                let mut text = String::new();
                for block in blocks {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            if let Some(t) = block.get("text").and_then(Value::as_str) {
                                text.push_str(t);
                            }
                        }
                        Some("tool_use") => {
                            if let Some(name) = block.get("name").and_then(Value::as_str) {
                                calls.push(ToolCall {
                                    name: name.to_string(),
                                    arguments: block.get("input").cloned().unwrap_or(Value::Null),
                                });
                            }
                        }
                        _ => {}
                    }
                }
                if !text.is_empty() {
                    last_assistant_text = text;
                }
            }
            _ => {}
        }
    }
    Some(Produced {
        output: last_assistant_text,
        tool_calls: Some(calls),
        ..Produced::default()
    })
}

/// Reads tool calls from an array in any of the understood shapes; entries without a name are skipped.
pub fn tool_calls_from_value(value: &Value) -> Vec<ToolCall> {
    let Some(items) = value.as_array() else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            // OpenAI: {"type":"function","function":{"name","arguments":"<json string>"}}
            let (name, args) = match item.get("function") {
                Some(f) => (f.get("name"), f.get("arguments")),
                None => (
                    item.get("name"),
                    item.get("arguments")
                        .or_else(|| item.get("input"))
                        .or_else(|| item.get("args")),
                ),
            };
            let name = name?.as_str()?.to_string();
            let arguments = match args {
                Some(Value::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
                }
                Some(v) => v.clone(),
                None => Value::Object(Default::default()),
            };
            Some(ToolCall { name, arguments })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stdout_loses_only_its_trailing_line_terminators() {
        assert_eq!(parse_stdout("  42\r\n\n").output, "  42");
        assert_eq!(parse_stdout("a\nb\n").output, "a\nb");
    }

    #[test]
    fn plain_text_is_the_output() {
        let p = parse("42\n");
        assert_eq!(p.output, "42\n");
        assert!(p.tool_calls.is_none());
    }

    #[test]
    fn json_that_is_not_a_transcript_stays_the_output() {
        let p = parse(r#"{"a": 1}"#);
        assert_eq!(p.output, r#"{"a": 1}"#);
        assert!(p.tool_calls.is_none());
    }

    #[test]
    fn simple_shape_gives_output_and_calls() {
        let p =
            parse(r#"{"output":"done","tool_calls":[{"name":"search","arguments":{"q":"x"}}]}"#);
        assert_eq!(p.output, "done");
        let calls = p.tool_calls.unwrap_or_default();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "search");
        assert_eq!(calls[0].arguments, json!({"q":"x"}));
    }

    #[test]
    fn openai_messages_decode_string_arguments() {
        let t = json!({"messages":[
            {"role":"user","content":"find it"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"lookup","arguments":"{\"id\":7}"}}]},
            {"role":"tool","content":"found"},
            {"role":"assistant","content":"It is 7."}
        ]});
        let p = parse(&t.to_string());
        assert_eq!(p.output, "It is 7.");
        let calls = p.tool_calls.unwrap_or_default();
        assert_eq!(calls[0].name, "lookup");
        assert_eq!(calls[0].arguments, json!({"id":7}));
    }

    #[test]
    fn anthropic_blocks_give_tool_use() {
        let t = json!([
            {"role":"user","content":"go"},
            {"role":"assistant","content":[{"type":"text","text":"Let me check."},{"type":"tool_use","id":"t1","name":"fetch","input":{"url":"u"}}]},
            {"role":"assistant","content":[{"type":"text","text":"Done."}]}
        ]);
        let p = parse(&t.to_string());
        assert_eq!(p.output, "Done.");
        let calls = p.tool_calls.unwrap_or_default();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "fetch");
    }
}
