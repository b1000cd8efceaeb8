//! The canonical test-case model (`eval/tests.json` v2).
//!
//! Every accepted eval format (v2, v1, `eval_metadata.json`, skill-creator's `evals.json`) is
//! converted into these types on load, so strategies, the executor and the reports only ever
//! see one shape. Field names follow the enterprise format seed (camelCase on the wire).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Default per-case timeout when neither the case nor the file sets one.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// A whole eval definition, as `eval/tests.json` v2 has it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvalConfig {
    /// Format version; always `"2.0"` once loaded.
    #[serde(default = "default_version")]
    pub version: String,
    /// Gives the default strategy of cases that name none.
    #[serde(default)]
    pub profile: Profile,
    #[serde(default)]
    pub settings: EvalSettings,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Setup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<Teardown>,
    #[serde(default)]
    pub test_cases: Vec<TestCase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suites: Vec<Suite>,
}

fn default_version() -> String {
    "2.0".to_string()
}

/// Skill evaluation profiles (design §3).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    #[default]
    Deterministic,
    Structured,
    Flexible,
    Creative,
    Enterprise,
}

impl Profile {
    /// The strategy a case of this profile gets when it names none.
    pub fn default_strategy(self) -> &'static str {
        match self {
            Profile::Deterministic => "exact_match",
            Profile::Structured => "json_schema",
            Profile::Flexible => "semantic_sim",
            Profile::Creative => "llm_judge",
            Profile::Enterprise => "hybrid",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Deterministic => "deterministic",
            Profile::Structured => "structured",
            Profile::Flexible => "flexible",
            Profile::Creative => "creative",
            Profile::Enterprise => "enterprise",
        }
    }
}

/// The eval file's `settings` (timeouts, concurrency, failFast, runner), not the service
/// configuration (`skilleval_infra::config::Settings`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EvalSettings {
    /// Milliseconds; a case without its own timeout gets this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_timeout: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_execution: Option<bool>,
    /// Caps how many of this run's cases are in flight at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_tests: Option<u32>,
    /// Stop the run at the first case that does not pass.
    #[serde(default)]
    pub fail_fast: bool,
    /// Re-run failing cases once more even when they set no `retryCount`.
    #[serde(default)]
    pub retry_failed: bool,
    /// How the skill's output is produced; the run request may override it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerSpec>,
    /// Minimum pass rate (0..1) for a `pass` verdict. Default 1.0: every case must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_threshold: Option<f64>,
    /// Minimum weighted mean score (0..1) for a `pass` verdict. Default: not checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_threshold: Option<f64>,
    /// The regression gate every run of this definition applies in the service
    /// (`"no_regression"` or `{"rule": "no_regression", "alpha": .., "scoreMargin": ..}`);
    /// a run request may set its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<crate::gate::GateSpec>,
}

/// How a case's output is produced.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum RunnerSpec {
    /// `"agent"`, `"command"`, `"given"`, `"llm"`.
    Name(String),
    Detailed(RunnerConfig),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerConfig {
    /// `agent`, `command`, `given` or `llm`.
    #[serde(rename = "type")]
    pub kind: String,
    /// For `command`: the package-relative script, e.g. `scripts/run.py`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// For `llm`: the provider name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Runner-specific options kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl RunnerSpec {
    pub fn config(&self) -> RunnerConfig {
        match self {
            RunnerSpec::Name(name) => RunnerConfig {
                kind: name.clone(),
                ..RunnerConfig::default()
            },
            RunnerSpec::Detailed(cfg) => cfg.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Setup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Teardown {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
}

/// A named group of test cases.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Suite {
    pub name: String,
    #[serde(default)]
    pub test_ids: Vec<String>,
    #[serde(default)]
    pub run_in_sequence: bool,
}

/// One test case (v2).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TestCase {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub input: Input,
    #[serde(default)]
    pub expected: Expected,
    #[serde(default)]
    pub evaluation: Evaluation,
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// Weight of this case in the run's weighted mean.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: f64,
    /// A recorded output for the `given` runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<Given>,
}

fn one() -> f64 {
    1.0
}

fn is_one(v: &f64) -> bool {
    (*v - 1.0).abs() < f64::EPSILON
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Input {
    #[serde(default)]
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, String>,
    /// Package-relative input files (skill-creator's `files`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

/// A recorded output supplied with the case (or the job) instead of being produced.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Given {
    #[serde(default)]
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
}

/// Expected-output configuration; which fields matter depends on the strategy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Expected {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<Value>,
    /// A Zod schema's source (Zod 3 or 4 syntax), in place of `json_schema`: converted to
    /// JSON Schema once, at validation, then graded exactly as `json_schema` (the `json_schema`
    /// strategy checks that it is a string that converts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zod_schema: Option<Value>,
    /// Files the runner must leave, checked before grading (the `agent` runner's workspace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ExpectedFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantic_threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rubric: Option<Rubric>,
    /// Package-relative `.py` or `.js` grader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_script: Option<String>,
    /// Natural-language assertions (the `assertions` strategy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assertions: Vec<String>,
    /// Strategy-specific options that have no field of their own (keywords, rules, tools...).
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// A file the runner must produce: its path (relative to the workspace) and, optionally, its
/// size bounds and SHA-256.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExpectedFile {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u64>,
    /// Hex SHA-256 the file must have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// LLM-judge rubric.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Rubric {
    pub criteria: Vec<Criterion>,
    #[serde(default = "default_passing_threshold")]
    pub passing_threshold: f64,
    #[serde(default)]
    pub overall_feedback: bool,
}

fn default_passing_threshold() -> f64 {
    0.7
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Criterion {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub weight: f64,
    #[serde(default)]
    pub scale: Scale,
}

/// A score scale, normalised to [0, 1] by `skilleval_grading::scale::normalize`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Scale {
    /// `"binary"`, `"pass/fail"`, `"likert5"`, `"numeric"`, `"percent"`.
    Named(String),
    Range {
        min: f64,
        max: f64,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        descriptions: BTreeMap<String, String>,
    },
}

impl Default for Scale {
    fn default() -> Self {
        Scale::Range {
            min: 1.0,
            max: 5.0,
            descriptions: BTreeMap::new(),
        }
    }
}

/// How a case is graded.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Evaluation {
    /// Strategy name; empty means the profile's default.
    #[serde(default)]
    pub strategy: String,
    /// Milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// Extra attempts for a *failing* (not erroring) flaky case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<u32>,
    /// For `hybrid`: strategy name -> weight.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, f64>,
    /// Minimum score for a graded strategy to pass; the strategy's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passing_threshold: Option<f64>,
    /// Strategy options (case sensitivity, algorithm, ...).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, Value>,
    /// What is graded: the final answer (absent, or `"output"`), or a file the runner left,
    /// `"file:report.json"` (its extracted text; see `skilleval_grading::extract`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub difficulty: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// Some files put tags under metadata; they are merged into the case's tags on load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Metadata {
    pub fn is_empty(&self) -> bool {
        *self == Metadata::default()
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    Critical,
    High,
    Medium,
    Low,
}

impl TestCase {
    /// The strategy this case is graded with, after the profile default.
    pub fn strategy_name(&self, profile: Profile) -> &str {
        if self.evaluation.strategy.is_empty() {
            profile.default_strategy()
        } else {
            &self.evaluation.strategy
        }
    }

    /// Timeout in milliseconds: the case's, then the file default, then 30 s.
    pub fn timeout_ms(&self, settings: &EvalSettings) -> u64 {
        self.evaluation
            .timeout
            .or(settings.default_timeout)
            .unwrap_or(DEFAULT_TIMEOUT_MS)
    }

    pub fn is_critical(&self) -> bool {
        self.metadata.priority == Some(Priority::Critical)
    }

    /// A strategy option from `evaluation.options`, falling back to `expected`'s extra fields.
    pub fn option(&self, key: &str) -> Option<&Value> {
        self.evaluation
            .options
            .get(key)
            .or_else(|| self.expected.extra.get(key))
    }
}

impl EvalConfig {
    /// Suites that contain a case id.
    pub fn suites_of(&self, case_id: &str) -> Vec<&str> {
        self.suites
            .iter()
            .filter(|s| s.test_ids.iter().any(|t| t == case_id))
            .map(|s| s.name.as_str())
            .collect()
    }
}
