//! Asking a model for a JSON answer of a known shape, robustly.
//!
//! [`ask_json`] sends the request with a schema (a forced tool call for Anthropic, a
//! `response_format` for OpenAI-compatible servers), then reads the answer: structured JSON as
//! is, text through [`extract_json`] (fenced, embedded or truncated JSON is recovered). The
//! caller's `interpret` checks the shape (every criterion scored, every assertion judged). When
//! either step fails, the model is asked once more with the reason, in the same conversation;
//! when that fails too, the call ends in a permanent fault whose message carries the raw answer,
//! so the case is reported `errored` with what the judge said — never a silent zero.

use serde::Serialize;
use serde_json::Value;

use super::chat::{ChatRequest, ChatResponse, Message};
use super::client::LlmClient;
use super::json::{extract_json, Recovery};
use skilleval_model::grade::{Fault, Usage};

/// The schema of a list of objects with these `properties`, all `required` (a judge's
/// per-criterion or per-assertion answers).
pub fn object_list_schema(properties: Value, required: &[&str]) -> Value {
    let mut items = serde_json::Map::new();
    items.insert("type".into(), "object".into());
    items.insert("properties".into(), properties);
    items.insert("required".into(), required.into());
    let mut list = serde_json::Map::new();
    list.insert("type".into(), "array".into());
    list.insert("items".into(), Value::Object(items));
    Value::Object(list)
}

/// Most characters of a judge's raw answer kept in a fault message.
pub const MAX_RAW_CHARS: usize = 4_000;

/// A usable answer and what it took to get it.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonAnswer<T> {
    pub value: T,
    /// Both calls' usage when a correction was needed.
    pub usage: Usage,
    pub recovery: Recovery,
    /// The first answer was not usable; this is the corrected one.
    pub corrected: bool,
    pub cached: bool,
    /// The model's answer as text (for details and debugging).
    pub raw: String,
}

/// Facts about how an answer was obtained, for a grade's details.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AnswerNotes {
    pub recovery: Recovery,
    pub corrected: bool,
    pub cached: bool,
    pub truncated: bool,
}

impl<T> JsonAnswer<T> {
    pub fn notes(&self) -> AnswerNotes {
        AnswerNotes {
            recovery: self.recovery,
            corrected: self.corrected,
            cached: self.cached,
            truncated: self.recovery == Recovery::Repaired,
        }
    }
}

/// The JSON in a response: the structured answer, else what can be recovered from the text.
fn json_of(resp: &ChatResponse) -> Result<(Value, Recovery), String> {
    if let Some(v) = &resp.structured {
        return Ok((v.clone(), Recovery::Clean));
    }
    match extract_json(&resp.text) {
        Some(found) => Ok(found),
        None if resp.text.trim().is_empty() => Err("the answer was empty".into()),
        None if resp.truncated => Err(
            "the answer was cut off at max_tokens before any JSON object could be recovered".into(),
        ),
        None => Err("the answer holds no JSON object".into()),
    }
}

/// Asks, reads, checks; corrects once; else a permanent fault carrying the raw answer.
pub async fn ask_json<T, F>(
    client: &LlmClient,
    req: &ChatRequest,
    interpret: F,
) -> Result<JsonAnswer<T>, Fault>
where
    F: Fn(&Value) -> Result<T, String> + Send + Sync,
{
    let usable =
        |resp: &ChatResponse| json_of(resp).and_then(|(v, r)| interpret(&v).map(|t| (t, r)));
    let first = client
        .chat_accepting(req, |resp| usable(resp).is_ok())
        .await?;
    let why = match usable(&first) {
        Ok((value, recovery)) => {
            return Ok(JsonAnswer {
                value,
                usage: first.usage,
                recovery,
                corrected: false,
                cached: first.cached,
                raw: first.text,
            })
        }
        Err(why) => why,
    };
    tracing::info!(provider = client.name(), reason = %why, "the judge's answer is not usable; asking once more");
    let mut retry = req.clone();
    retry
        .messages
        .push(Message::assistant(if first.text.is_empty() {
            "(no answer)".to_string()
        } else {
            first.text.clone()
        }));
    retry.messages.push(Message::user(format!(
        "Your previous answer could not be used: {why}. Answer again with only one complete JSON object that follows the schema, with no text before or after it."
    )));
    let second = client
        .chat_accepting(&retry, |resp| usable(resp).is_ok())
        .await?;
    let mut usage = first.usage;
    usage.add(&second.usage);
    match usable(&second) {
        Ok((value, recovery)) => Ok(JsonAnswer {
            value,
            usage,
            recovery,
            corrected: true,
            cached: second.cached,
            raw: second.text,
        }),
        Err(why2) => Err(Fault::permanent(format!(
            "the judge's answer could not be used, even after one correction ({why2}); raw answer: {}",
            cut(&second.text, MAX_RAW_CHARS)
        ))),
    }
}

pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max).collect();
        t.push('…');
        t
    }
}
