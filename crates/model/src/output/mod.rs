//! What a runner produced for a case: the output text that is graded, the tool calls read from
//! its transcript ([`transcript`]), the files it left behind, and what producing it cost.
//! Runners fill these in; graders and reports read them. No runner code lives here.

use serde_json::Value;

use crate::grade::{Fault, ToolCall, Usage};

pub mod transcript;

/// A produced output.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Produced {
    /// The text that is graded.
    pub output: String,
    /// Tool calls read from the transcript, when there was one.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Tokens and cost spent producing the output.
    pub usage: Usage,
    /// The output was cut at the sandbox's size limit.
    pub truncated: bool,
    /// Extra facts for the result's details (stderr tail, exit code...).
    pub details: Value,
    /// Files the runner left behind (the `agent` runner's `/workspace`), for graders that
    /// read files.
    pub files: Vec<ProducedFile>,
    /// The runner stopped short (an agent at one of its limits, a provider failing mid-loop):
    /// the case is `errored` with this fault and is not graded, but everything above is what
    /// was produced up to the stop and stays with the result, its usage counted like any
    /// other case's (budgets see it).
    pub stopped: Option<Fault>,
}

/// A file a runner produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProducedFile {
    /// Relative to the workspace.
    pub path: String,
    pub size: u64,
    /// Hex SHA-256 of the whole file.
    pub sha256: String,
    /// The bytes, when within the kept-content budget.
    pub content: Option<Vec<u8>>,
}
