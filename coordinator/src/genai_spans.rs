//! Production GenAI traces as samples: the spans of one OTLP export mapped to [`Sample`]s of
//! skills, for trace ingest (`POST /v1/otlp/v1/traces`, [`crate::routes::otlp`]).
//!
//! **Which spans.** A span is a GenAI operation when it has `gen_ai.operation.name` (the
//! GenAI semantic conventions). The outermost GenAI operation of a trace in the export that is
//! not a tool execution (usually `invoke_agent`, else a `chat`) is one sample; its GenAI
//! descendants are folded into it: their messages stand in for its own when it has none (the
//! first model call's input, the last one's output), and its `execute_tool` descendants are its
//! tool calls, in start order. So a trace's spans must arrive in one export (the collector's
//! `groupbytrace` processor, `deploy/otel-collector.yaml`).
//!
//! **What a sample gets.** The skill: the first of the configured attributes
//! (`coordinator.sampling.otlp_skill_attributes`) on the span, else on its resource. The input
//! and output: the captured messages in the current attribute forms (`gen_ai.input.messages`,
//! `gen_ai.output.messages`, as JSON text or structured values; also on a
//! `gen_ai.client.inference.operation.details` span event) or the older forms (span events
//! `gen_ai.system.message`, `gen_ai.user.message`, `gen_ai.assistant.message`,
//! `gen_ai.tool.message`, `gen_ai.choice`; `gen_ai.content.prompt` / `gen_ai.content.completion`
//! events with `gen_ai.prompt` / `gen_ai.completion`; indexed `gen_ai.prompt.<n>.content`
//! attributes). A single user message becomes the input text; a conversation, its messages
//! as `[{role, content}]`. The output is the text of the first output message. `sample_id` is
//! `<trace id>-<span id>` (a re-sent export is a duplicate), `observed_at` the span's end,
//! `traceparent` the span itself (its evaluation events are parented to it), the version
//! `skilleval.version` or `gen_ai.agent.version`, and the metadata (for the monitor's filters)
//! a few well-known attributes ([`METADATA_KEYS`]).
//!
//! Every other span is rejected with a reason: a span that is not a GenAI operation, an
//! `execute_tool` span without its operation in the export, and every span of an operation
//! that cannot be mapped (no skill attribute, no messages, invalid ids).

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{json, Map, Value};
use skilleval_execution::monitor::Sample;
use skilleval_model::grade::ToolCall;

/// The attribute that makes a span a GenAI operation.
pub const OPERATION: &str = "gen_ai.operation.name";

/// Attributes (span first, then resource) copied into a sample's metadata.
pub const METADATA_KEYS: &[&str] = &[
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.system",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gen_ai.agent.name",
    "service.name",
    "service.version",
    "deployment.environment",
    "deployment.environment.name",
];

/// One sample and how many spans of the export it was made of.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedSample {
    pub skill: String,
    pub sample: Sample,
    pub spans: u64,
}

/// What one export maps to.
#[derive(Debug, Default)]
pub struct Mapping {
    pub samples: Vec<MappedSample>,
    /// Rejected spans by reason.
    pub rejected: BTreeMap<String, u64>,
}

impl Mapping {
    pub fn reject(&mut self, reason: impl Into<String>, spans: u64) {
        *self.rejected.entry(reason.into()).or_default() += spans;
    }

    pub fn rejected_spans(&self) -> u64 {
        self.rejected.values().sum()
    }

    /// The reasons with their counts, most frequent first, for the partial-success message.
    pub fn message(&self) -> String {
        let mut reasons: Vec<(&String, &u64)> = self.rejected.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        reasons
            .iter()
            .map(|(reason, n)| format!("{n} span(s): {reason}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

struct Flat<'a> {
    span: &'a Span,
    resource: &'a [KeyValue],
}

/// The spans of `request` as samples of skills (and the spans rejected, with reasons).
pub fn map_export(request: &ExportTraceServiceRequest, skill_attributes: &[String]) -> Mapping {
    let mut flat = Vec::new();
    for rs in &request.resource_spans {
        let resource = rs.resource.as_ref().map_or(&[][..], |r| &r.attributes[..]);
        for ss in &rs.scope_spans {
            for span in &ss.spans {
                flat.push(Flat { span, resource });
            }
        }
    }
    let by_id: HashMap<(&[u8], &[u8]), usize> = flat
        .iter()
        .enumerate()
        .map(|(i, f)| ((&f.span.trace_id[..], &f.span.span_id[..]), i))
        .collect();
    let parent_of = |i: usize| -> Option<usize> {
        let s = flat[i].span;
        if s.parent_span_id.is_empty() {
            return None;
        }
        by_id
            .get(&(&s.trace_id[..], &s.parent_span_id[..]))
            .copied()
    };
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    for i in 0..flat.len() {
        if let Some(p) = parent_of(i) {
            children.entry(p).or_default().push(i);
        }
    }
    let is_operation = |i: usize| {
        str_attr(&flat[i].span.attributes, OPERATION).is_some_and(|op| op != "execute_tool")
    };
    let mut mapping = Mapping::default();
    let mut covered: HashSet<usize> = HashSet::new();
    for root in 0..flat.len() {
        if !is_operation(root) {
            continue;
        }
        // The outermost operation of its trace in this export (a loop in the parent ids is
        // cut after as many steps as there are spans).
        let mut up = parent_of(root);
        let mut steps = 0;
        let mut nested = false;
        while let Some(p) = up {
            if is_operation(p) {
                nested = true;
                break;
            }
            steps += 1;
            if steps > flat.len() {
                break;
            }
            up = parent_of(p);
        }
        if nested {
            continue;
        }
        let mut members = vec![root];
        let mut next = 0;
        while next < members.len() {
            if let Some(kids) = children.get(&members[next]) {
                for k in kids {
                    if !members.contains(k) {
                        members.push(*k);
                    }
                }
            }
            next += 1;
        }
        covered.extend(members.iter().copied());
        let spans = members.len() as u64;
        match sample_of(&flat, root, &members, skill_attributes) {
            Ok((skill, sample)) => mapping.samples.push(MappedSample {
                skill,
                sample,
                spans,
            }),
            Err(reason) => mapping.reject(reason, spans),
        }
    }
    for (i, f) in flat.iter().enumerate() {
        if covered.contains(&i) {
            continue;
        }
        let reason = match str_attr(&f.span.attributes, OPERATION) {
            Some("execute_tool") => {
                "an execute_tool span whose GenAI operation span is not in this export"
            }
            Some(_) => "a GenAI span nested in one that is not in this export",
            None => "not a GenAI operation span (no gen_ai.operation.name)",
        };
        mapping.reject(reason, 1);
    }
    mapping
}

fn sample_of(
    flat: &[Flat<'_>],
    root: usize,
    members: &[usize],
    skill_attributes: &[String],
) -> Result<(String, Sample), String> {
    let Flat { span, resource } = &flat[root];
    if span.trace_id.len() != 16
        || span.span_id.len() != 8
        || span.trace_id.iter().all(|b| *b == 0)
        || span.span_id.iter().all(|b| *b == 0)
    {
        return Err("a GenAI span with an invalid trace or span id".into());
    }
    let skill = skill_attributes
        .iter()
        .find_map(|key| {
            str_attr(&span.attributes, key)
                .or_else(|| str_attr(resource, key))
                .filter(|s| !s.trim().is_empty())
        })
        .ok_or_else(|| {
            format!(
                "a GenAI span without a skill attribute (tried {} on the span and its resource)",
                skill_attributes.join(", ")
            )
        })?;
    // Messages: the operation's own, else its model calls' (first input, last output).
    let mut calls: Vec<usize> = members[1..]
        .iter()
        .copied()
        .filter(|&i| {
            str_attr(&flat[i].span.attributes, OPERATION).is_some_and(|op| op != "execute_tool")
        })
        .collect();
    calls.sort_by_key(|&i| flat[i].span.start_time_unix_nano);
    let input = input_messages(span)
        .or_else(|| calls.iter().find_map(|&i| input_messages(flat[i].span)))
        .ok_or_else(|| {
            "a GenAI span without input messages (gen_ai.input.messages or the older prompt events)"
                .to_string()
        })?;
    let output = output_text(span)
        .or_else(|| calls.iter().rev().find_map(|&i| output_text(flat[i].span)))
        .ok_or_else(|| {
            "a GenAI span without output text (gen_ai.output.messages or the older choice events)"
                .to_string()
        })?;
    let mut tools: Vec<usize> = members[1..]
        .iter()
        .copied()
        .filter(|&i| str_attr(&flat[i].span.attributes, OPERATION) == Some("execute_tool"))
        .collect();
    tools.sort_by_key(|&i| flat[i].span.start_time_unix_nano);
    let tool_calls: Vec<ToolCall> = tools.iter().map(|&i| tool_call(flat[i].span)).collect();
    let trace = hex(&span.trace_id);
    let id = hex(&span.span_id);
    let mut metadata = Map::new();
    for key in METADATA_KEYS {
        if let Some(v) = str_attr(&span.attributes, key).or_else(|| str_attr(resource, key)) {
            metadata.insert((*key).to_string(), Value::String(v.to_string()));
        }
    }
    let version = ["skilleval.version", "gen_ai.agent.version"]
        .iter()
        .find_map(|k| str_attr(&span.attributes, k).or_else(|| str_attr(resource, k)))
        .map(str::to_string);
    let observed_at = i64::try_from(span.end_time_unix_nano)
        .ok()
        .filter(|n| *n > 0)
        .map(DateTime::<Utc>::from_timestamp_nanos);
    Ok((
        skill.to_string(),
        Sample {
            sample_id: format!("{trace}-{id}"),
            version,
            observed_at,
            input,
            output,
            tool_calls: (!tool_calls.is_empty()).then_some(tool_calls),
            context: None,
            metadata: (!metadata.is_empty()).then_some(metadata),
            // An exported span was sampled.
            traceparent: Some(format!("00-{trace}-{id}-01")),
        },
    ))
}

fn tool_call(span: &Span) -> ToolCall {
    let name = str_attr(&span.attributes, "gen_ai.tool.name")
        .map(str::to_string)
        .unwrap_or_else(|| {
            span.name
                .strip_prefix("execute_tool ")
                .unwrap_or(&span.name)
                .to_string()
        });
    let arguments = attr(&span.attributes, "gen_ai.tool.call.arguments")
        .map(json_of)
        .map(|v| match v {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        })
        .unwrap_or(Value::Null);
    ToolCall { name, arguments }
}

/// One message, normalised.
#[derive(Debug, Clone, PartialEq)]
struct Message {
    role: String,
    text: String,
}

/// The input as a sample holds it: a lone user message's text, else the conversation.
fn input_messages(span: &Span) -> Option<Value> {
    let messages = current_messages(span, "gen_ai.input.messages")
        .or_else(|| older_input(span))
        .filter(|m| !m.is_empty())?;
    let asked: Vec<&Message> = messages.iter().filter(|m| m.role != "system").collect();
    if let [only] = asked.as_slice() {
        if only.role == "user" && messages.len() == 1 {
            return Some(Value::String(only.text.clone()));
        }
    }
    Some(Value::Array(
        messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.text}))
            .collect(),
    ))
}

fn output_text(span: &Span) -> Option<String> {
    current_messages(span, "gen_ai.output.messages")
        .or_else(|| older_output(span))
        .and_then(|m| m.into_iter().next())
        .map(|m| m.text)
}

/// `gen_ai.input.messages` / `gen_ai.output.messages` on the span, or on its
/// `gen_ai.client.inference.operation.details` event.
fn current_messages(span: &Span, key: &str) -> Option<Vec<Message>> {
    let value = attr(&span.attributes, key).or_else(|| {
        span.events
            .iter()
            .filter(|e| e.name == "gen_ai.client.inference.operation.details")
            .find_map(|e| attr(&e.attributes, key))
    })?;
    let parsed = match json_of(value) {
        Value::String(text) => serde_json::from_str(&text).ok()?,
        other => other,
    };
    let messages: Vec<Message> = parsed
        .as_array()?
        .iter()
        .filter_map(|m| {
            Some(Message {
                role: m.get("role")?.as_str()?.to_string(),
                text: text_of(m)?,
            })
        })
        .collect();
    Some(messages)
}

/// A message's text: its `text` parts (current form), or its `content` (older forms: a
/// string, or parts with `text`).
fn text_of(message: &Value) -> Option<String> {
    let parts = message
        .get("parts")
        .or_else(|| message.get("content").filter(|c| c.is_array()));
    if let Some(Value::Array(parts)) = parts {
        let texts: Vec<&str> = parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str).unwrap_or("text") == "text")
            .filter_map(|p| {
                p.get("content")
                    .or_else(|| p.get("text"))
                    .and_then(Value::as_str)
            })
            .collect();
        return (!texts.is_empty()).then(|| texts.join("\n"));
    }
    match message.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

const MESSAGE_EVENTS: &[(&str, &str)] = &[
    ("gen_ai.system.message", "system"),
    ("gen_ai.user.message", "user"),
    ("gen_ai.assistant.message", "assistant"),
    ("gen_ai.tool.message", "tool"),
];

/// An older event's message: `content`, or the JSON of `gen_ai.event.content` / `message`.
fn event_text(attributes: &[KeyValue]) -> Option<String> {
    if let Some(text) = str_attr(attributes, "content") {
        return Some(text.to_string());
    }
    for key in ["gen_ai.event.content", "message"] {
        let Some(value) = attr(attributes, key).map(json_of) else {
            continue;
        };
        let value = match value {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        let inner = value.get("message").cloned().unwrap_or(value);
        match &inner {
            Value::String(s) => return Some(s.clone()),
            other => {
                if let Some(text) = text_of(other) {
                    return Some(text);
                }
            }
        }
    }
    None
}

fn older_input(span: &Span) -> Option<Vec<Message>> {
    let from_events: Vec<Message> = span
        .events
        .iter()
        .filter_map(|e| {
            let role = MESSAGE_EVENTS.iter().find(|(name, _)| *name == e.name)?.1;
            Some(Message {
                role: role.to_string(),
                text: event_text(&e.attributes)?,
            })
        })
        .collect();
    if !from_events.is_empty() {
        return Some(from_events);
    }
    if let Some(prompt) = span
        .events
        .iter()
        .filter(|e| e.name == "gen_ai.content.prompt")
        .find_map(|e| attr(&e.attributes, "gen_ai.prompt"))
    {
        return Some(loose_messages(json_of(prompt), "user"));
    }
    indexed(&span.attributes, "gen_ai.prompt", "user")
}

fn older_output(span: &Span) -> Option<Vec<Message>> {
    if let Some(text) = span
        .events
        .iter()
        .filter(|e| e.name == "gen_ai.choice")
        .find_map(|e| event_text(&e.attributes))
    {
        return Some(vec![Message {
            role: "assistant".into(),
            text,
        }]);
    }
    if let Some(completion) = span
        .events
        .iter()
        .filter(|e| e.name == "gen_ai.content.completion")
        .find_map(|e| attr(&e.attributes, "gen_ai.completion"))
    {
        return Some(loose_messages(json_of(completion), "assistant"));
    }
    indexed(&span.attributes, "gen_ai.completion", "assistant")
}

/// `gen_ai.prompt` / `gen_ai.completion` of the oldest events: JSON messages or plain text.
fn loose_messages(value: Value, role: &str) -> Vec<Message> {
    let value = match value {
        Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
        other => other,
    };
    match value {
        Value::Array(items) => items
            .iter()
            .filter_map(|m| {
                Some(Message {
                    role: m
                        .get("role")
                        .and_then(Value::as_str)
                        .unwrap_or(role)
                        .to_string(),
                    text: text_of(m)?,
                })
            })
            .collect(),
        Value::String(text) => vec![Message {
            role: role.into(),
            text,
        }],
        other => text_of(&other)
            .map(|text| {
                vec![Message {
                    role: role.into(),
                    text,
                }]
            })
            .unwrap_or_default(),
    }
}

/// `<prefix>.<n>.role` / `<prefix>.<n>.content` attributes, in index order.
fn indexed(attributes: &[KeyValue], prefix: &str, role: &str) -> Option<Vec<Message>> {
    let mut found: BTreeMap<u32, Message> = BTreeMap::new();
    for kv in attributes {
        let Some(rest) = kv
            .key
            .strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('.'))
        else {
            continue;
        };
        let Some((n, field)) = rest.split_once('.') else {
            continue;
        };
        let Ok(n) = n.parse::<u32>() else { continue };
        let Some(Value::String(v)) = kv.value.as_ref().map(json_of) else {
            continue;
        };
        let m = found.entry(n).or_insert_with(|| Message {
            role: role.into(),
            text: String::new(),
        });
        match field {
            "role" => m.role = v,
            "content" => m.text = v,
            _ => {}
        }
    }
    let messages: Vec<Message> = found.into_values().filter(|m| !m.text.is_empty()).collect();
    (!messages.is_empty()).then_some(messages)
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a AnyValue> {
    attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
}

fn str_attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attributes, key)?.value.as_ref()? {
        Any::StringValue(s) => Some(s),
        _ => None,
    }
}

/// An attribute value as JSON (bytes as hex).
fn json_of(value: &AnyValue) -> Value {
    match &value.value {
        None => Value::Null,
        Some(Any::StringValue(s)) => Value::String(s.clone()),
        Some(Any::BoolValue(b)) => Value::Bool(*b),
        Some(Any::IntValue(n)) => json!(n),
        Some(Any::DoubleValue(f)) => json!(f),
        Some(Any::ArrayValue(a)) => Value::Array(a.values.iter().map(json_of).collect()),
        Some(Any::KvlistValue(kv)) => Value::Object(
            kv.values
                .iter()
                .map(|kv| {
                    (
                        kv.key.clone(),
                        kv.value.as_ref().map_or(Value::Null, json_of),
                    )
                })
                .collect(),
        ),
        Some(Any::BytesValue(b)) => Value::String(hex(b)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::span::Event;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans};

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue {
            key: key.into(),
            value: Some(AnyValue {
                value: Some(Any::StringValue(value.into())),
            }),
        }
    }

    fn span(trace: u8, id: u8, parent: Option<u8>, attrs: Vec<KeyValue>) -> Span {
        Span {
            trace_id: vec![trace; 16],
            span_id: vec![id; 8],
            parent_span_id: parent.map(|p| vec![p; 8]).unwrap_or_default(),
            name: "span".into(),
            start_time_unix_nano: u64::from(id) * 1_000,
            end_time_unix_nano: 1_764_000_000_000_000_000,
            attributes: attrs,
            ..Span::default()
        }
    }

    fn export(resource: Vec<KeyValue>, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource,
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
    }

    fn keys() -> Vec<String> {
        vec!["skilleval.skill".into(), "gen_ai.agent.name".into()]
    }

    #[test]
    fn an_agent_with_a_model_call_and_tools_is_one_sample_and_other_spans_are_rejected() {
        let agent = span(
            1,
            1,
            Some(9),
            vec![
                kv(OPERATION, "invoke_agent"),
                kv("gen_ai.agent.name", "support"),
            ],
        );
        let chat = span(
            1,
            2,
            Some(1),
            vec![
                kv(OPERATION, "chat"),
                kv("gen_ai.request.model", "m"),
                kv(
                    "gen_ai.input.messages",
                    r#"[{"role":"user","parts":[{"type":"text","content":"Where is my order?"}]}]"#,
                ),
                kv(
                    "gen_ai.output.messages",
                    r#"[{"role":"assistant","parts":[{"type":"text","content":"It ships today."}],"finish_reason":"stop"}]"#,
                ),
            ],
        );
        let tool = span(
            1,
            3,
            Some(1),
            vec![
                kv(OPERATION, "execute_tool"),
                kv("gen_ai.tool.name", "lookup_order"),
                kv("gen_ai.tool.call.arguments", r#"{"id": 42}"#),
            ],
        );
        let http = span(1, 9, None, vec![kv("http.request.method", "POST")]);
        let stray_tool = span(2, 5, Some(6), vec![kv(OPERATION, "execute_tool")]);
        let m = map_export(
            &export(
                vec![kv("service.name", "shop")],
                vec![http, agent, chat, tool, stray_tool],
            ),
            &keys(),
        );
        assert_eq!(m.samples.len(), 1, "{m:#?}");
        let s = &m.samples[0];
        assert_eq!(s.skill, "support");
        assert_eq!(s.spans, 3);
        assert_eq!(s.sample.input, json!("Where is my order?"));
        assert_eq!(s.sample.output, "It ships today.");
        let calls = s.sample.tool_calls.as_ref().expect("tool calls");
        assert_eq!(calls[0].name, "lookup_order");
        assert_eq!(calls[0].arguments, json!({"id": 42}));
        assert_eq!(
            s.sample.sample_id,
            format!("{}-{}", "01".repeat(16), "01".repeat(8))
        );
        assert_eq!(
            s.sample.traceparent.as_deref(),
            Some(format!("00-{}-{}-01", "01".repeat(16), "01".repeat(8)).as_str())
        );
        let metadata = s.sample.metadata.as_ref().expect("metadata");
        assert_eq!(metadata["service.name"], "shop");
        assert!(s.sample.observed_at.is_some());
        assert_eq!(m.rejected_spans(), 2, "{m:#?}");
        assert!(
            m.message().contains("not a GenAI operation span"),
            "{}",
            m.message()
        );
        assert!(m.message().contains("execute_tool"), "{}", m.message());
    }

    #[test]
    fn the_older_event_forms_and_indexed_attributes_are_read() {
        let mut events_span = span(
            3,
            1,
            None,
            vec![kv(OPERATION, "chat"), kv("skilleval.skill", "greeter")],
        );
        events_span.events = vec![
            Event {
                name: "gen_ai.system.message".into(),
                attributes: vec![kv("content", "Be brief.")],
                ..Event::default()
            },
            Event {
                name: "gen_ai.user.message".into(),
                attributes: vec![kv("content", "Hello")],
                ..Event::default()
            },
            Event {
                name: "gen_ai.choice".into(),
                attributes: vec![kv("message", r#"{"role":"assistant","content":"Hi!"}"#)],
                ..Event::default()
            },
        ];
        let indexed_span = span(
            4,
            1,
            None,
            vec![
                kv(OPERATION, "chat"),
                kv("gen_ai.prompt.0.role", "user"),
                kv("gen_ai.prompt.0.content", "What is 2+2?"),
                kv("gen_ai.completion.0.content", "4"),
            ],
        );
        let m = map_export(
            &export(
                vec![kv("skilleval.skill", "calculator")],
                vec![events_span, indexed_span],
            ),
            &keys(),
        );
        assert_eq!(m.samples.len(), 2, "{m:#?}");
        let greeter = m.samples.iter().find(|s| s.skill == "greeter").unwrap();
        assert_eq!(
            greeter.sample.input,
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
        );
        assert_eq!(greeter.sample.output, "Hi!");
        let calc = m.samples.iter().find(|s| s.skill == "calculator").unwrap();
        assert_eq!(calc.sample.input, json!("What is 2+2?"));
        assert_eq!(calc.sample.output, "4");
    }

    #[test]
    fn a_span_without_skill_or_messages_is_rejected_with_its_reason() {
        let no_skill = span(5, 1, None, vec![kv(OPERATION, "chat")]);
        let no_messages = span(
            6,
            1,
            None,
            vec![kv(OPERATION, "chat"), kv("skilleval.skill", "x")],
        );
        let m = map_export(&export(vec![], vec![no_skill, no_messages]), &keys());
        assert!(m.samples.is_empty());
        assert_eq!(m.rejected_spans(), 2);
        assert!(
            m.message().contains("without a skill attribute"),
            "{}",
            m.message()
        );
        assert!(
            m.message().contains("without input messages"),
            "{}",
            m.message()
        );
    }
}
