//! A chat request and its answer, and embeddings, provider-neutral: what callers build and
//! read, and what the provider modules translate to and from their wire formats.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use skilleval_model::grade::Usage;

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
}

/// One turn of the conversation (the system prompt is [`ChatRequest::system`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: content.into(),
        }
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            content: content.into(),
        }
    }
}

/// The JSON Schema a structured answer must follow, and its name (the tool name for
/// Anthropic, `json_schema.name` for OpenAI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSchema {
    pub name: String,
    pub schema: Value,
}

impl OutputSchema {
    pub fn new(name: &str, schema: Value) -> Self {
        OutputSchema {
            name: name.to_string(),
            schema,
        }
    }
}

/// A chat request, provider-neutral.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatRequest {
    pub system: Option<String>,
    pub messages: Vec<Message>,
    /// `None`: the provider's configured temperature (judges pass `Some(0.0)`).
    pub temperature: Option<f64>,
    /// `None`: the provider's `max_tokens`.
    pub max_tokens: Option<u32>,
    /// Ask for JSON following this schema.
    pub schema: Option<OutputSchema>,
    /// Extra cache-key material: requests that must not share an answer although they are
    /// otherwise equal (repeat 2 of a case is not repeat 1).
    pub cache_salt: Option<String>,
}

/// A chat answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The text (for a structured Anthropic answer, the tool input as JSON text).
    pub text: String,
    /// The answer as JSON when the provider returned it structured (Anthropic tool input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<Value>,
    /// Tokens and cost of this call (zero on a cache hit).
    #[serde(default)]
    pub usage: Usage,
    /// The model stopped at `max_tokens`.
    #[serde(default)]
    pub truncated: bool,
    /// The model that answered, as the provider reports it.
    #[serde(default)]
    pub model: String,
    /// Served from the response cache.
    #[serde(default)]
    pub cached: bool,
}

/// Embedding vectors, in input order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub usage: Usage,
    pub model: String,
    /// Every vector came from the cache.
    pub cached: bool,
}
