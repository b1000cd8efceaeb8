//! What grading produces and how it fails.
//!
//! A [`Grade`] is one strategy's verdict on one output. A [`Fault`] is a failure to produce or
//! grade at all; it says whether trying again could help ([`Fault::is_transient`]) and, for rate
//! limits, when. Strategies and runners never retry or sleep themselves: the executor (locally)
//! or the worker's delay queues (in the service) own retries.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One strategy's verdict on one output.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Grade {
    /// In [0, 1].
    pub score: f64,
    pub passed: bool,
    /// Strategy-specific details (design §4, "details" column).
    #[serde(default)]
    pub details: Value,
    /// Per rubric criterion: `{name: {score, scale, normalized, weight, reasoning}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric_scores: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_patterns: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_errors: Option<Vec<SchemaError>>,
    /// Tokens and cost spent grading (LLM-backed strategies).
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

impl Grade {
    /// A grade with the score clamped into [0, 1] (NaN becomes 0).
    pub fn new(score: f64, passed: bool, details: Value) -> Self {
        Grade {
            score: clamp_unit(score),
            passed,
            details,
            ..Grade::default()
        }
    }
}

/// Clamps into [0, 1]; NaN becomes 0.
pub fn clamp_unit(v: f64) -> f64 {
    if v.is_nan() {
        0.0
    } else {
        v.clamp(0.0, 1.0)
    }
}

/// A JSON Schema violation, as the report spec seed has it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SchemaError {
    /// JSON pointer into the instance.
    pub path: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
}

/// Tokens and money spent on one step.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cost_usd: f64,
}

impl Usage {
    pub fn is_zero(&self) -> bool {
        self.input_tokens == 0 && self.output_tokens == 0 && self.cost_usd == 0.0
    }

    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }

    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

/// A failure to produce or grade an output.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Trying again may succeed: a timeout, HTTP 429/5xx, a dropped connection.
    #[error("transient: {message}")]
    Transient {
        message: String,
        /// The provider asked us to wait this long (`Retry-After`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// Trying again will fail the same way: a crashing script, a bad definition.
    #[error("{message}")]
    Permanent { message: String },
    /// The case ran past its timeout.
    #[error("timed out after {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// The host could not run the case: the sandbox machinery failed before any of the
    /// skill's code ran (bubblewrap could not start, no uid to lease, a tool or interpreter
    /// missing, the package cache unreadable). Never the skill's fault: retried, on any
    /// worker, and stored only when the retries run out.
    #[error("host fault, not the skill's: {message}")]
    Host { message: String },
}

impl Fault {
    pub fn transient(message: impl Into<String>) -> Self {
        Fault::Transient {
            message: message.into(),
            retry_after_ms: None,
        }
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        Fault::Permanent {
            message: message.into(),
        }
    }

    pub fn host(message: impl Into<String>) -> Self {
        Fault::Host {
            message: message.into(),
        }
    }

    /// Whether a later attempt could succeed. Timeouts count: a hang may be a passing blip;
    /// so do faults of the host, which another attempt (or worker) may not have.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Fault::Transient { .. } | Fault::Timeout { .. } | Fault::Host { .. }
        )
    }

    pub fn is_host(&self) -> bool {
        matches!(self, Fault::Host { .. })
    }

    /// The fault's kind as it is serialised (`transient`, `permanent`, `timeout`, `host`).
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Transient { .. } => "transient",
            Fault::Permanent { .. } => "permanent",
            Fault::Timeout { .. } => "timeout",
            Fault::Host { .. } => "host",
        }
    }

    /// Whose fault it is, for a person reading an errored case: the host's (the machinery),
    /// a model provider's (its faults name it: "provider `x` …", as the provider clients
    /// write them), else the skill's (its script crashed or ran past the case's timeout, or
    /// its definition asks for something that cannot run).
    pub fn origin(&self) -> FaultOrigin {
        match self {
            Fault::Host { .. } => FaultOrigin::Host,
            Fault::Transient { message, .. } | Fault::Permanent { message }
                if message.contains("provider `") =>
            {
                FaultOrigin::Provider
            }
            _ => FaultOrigin::Skill,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Fault::Transient {
                retry_after_ms: Some(ms),
                ..
            } => Some(Duration::from_millis(*ms)),
            _ => None,
        }
    }
}

/// Whose fault an error is ([`Fault::origin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOrigin {
    Skill,
    Host,
    Provider,
}

impl FaultOrigin {
    /// Who, as a page says it: "the skill's", "the host's", "the model provider's".
    pub fn label(self) -> &'static str {
        match self {
            FaultOrigin::Skill => "the skill's",
            FaultOrigin::Host => "the host's",
            FaultOrigin::Provider => "the model provider's",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FaultOrigin::Skill => "skill",
            FaultOrigin::Host => "host",
            FaultOrigin::Provider => "provider",
        }
    }
}

/// A tool call read from a transcript (for `tool_usage`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
}

/// How the CLI retries transient faults (the worker uses delay queues instead).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Total deliveries, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Delay before delivery `next_attempt` (2, 3, ...): exponential with full jitter,
    /// at least what the provider asked for with `Retry-After`.
    pub fn delay(&self, next_attempt: u32, fault: &Fault) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << next_attempt.saturating_sub(2).min(16))
            .min(self.max_delay);
        let jittered = exp.mul_f64(0.5 + rand::random::<f64>() * 0.5);
        match fault.retry_after() {
            Some(asked) => jittered.max(asked),
            None => jittered,
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_fault_says_whose_it_is() {
        assert_eq!(
            Fault::host("bwrap could not start").origin(),
            FaultOrigin::Host
        );
        assert_eq!(
            Fault::transient("provider `openai` answered HTTP 503").origin(),
            FaultOrigin::Provider
        );
        assert_eq!(
            Fault::permanent("provider `x` refused the credentials (HTTP 401)").origin(),
            FaultOrigin::Provider
        );
        assert_eq!(
            Fault::permanent("script exited 1").origin(),
            FaultOrigin::Skill
        );
        assert_eq!(
            Fault::Timeout { timeout_ms: 5 }.origin(),
            FaultOrigin::Skill
        );
    }

    use std::time::Duration;

    use super::*;

    #[test]
    fn retry_delay_grows_and_honours_retry_after() {
        let p = RetryPolicy::default();
        let f = Fault::transient("x");
        let d2 = p.delay(2, &f);
        assert!(
            d2 >= Duration::from_millis(250) && d2 <= Duration::from_millis(500),
            "{d2:?}"
        );
        let d4 = p.delay(4, &f);
        assert!(
            d4 >= Duration::from_millis(1_000) && d4 <= Duration::from_millis(2_000),
            "{d4:?}"
        );
        let asked = Fault::Transient {
            message: "429".into(),
            retry_after_ms: Some(7_000),
        };
        assert!(p.delay(2, &asked) >= Duration::from_secs(7));
        assert!(p.delay(40, &f) <= p.max_delay);
    }
}
