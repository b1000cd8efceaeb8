//! Grading: every strategy behind one trait ([`Strategy`]), registered by name in one place
//! (`builtin.rs`), plus what graders share (scales, rubrics, the text of produced files, the
//! blind A/B [`comparator`]). A strategy checks a case's fields at compile time and scores one
//! output at grade time; it never retries, sleeps or decides a case's status (the executor
//! does), and code of a package (custom graders) runs only through `skilleval_sandbox`.
//!
//! A strategy has two phases. [`Strategy::compile`] runs once per test-case definition (at
//! validation and when a worker first sees a case): it checks the case's fields, reports every
//! problem with a JSON pointer, and builds a [`Grader`] holding the compiled artefacts (regexes,
//! schema validators). [`Grader::grade`] then runs once per output and never recompiles.
//! Graders are async so strategies that call HTTP (LLM judges, embeddings) plug in like any
//! other without touching the executor or the runners. Those (`llm_judge`, `assertions`,
//! `semantic_sim`) receive the provider clients the registry is built with; built without,
//! they check their fields all the same and report the missing provider ([`provider`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use skilleval_model::definition::{Profile, TestCase};
use skilleval_model::grade::{Fault, Grade, ToolCall};
use skilleval_model::problem::Problem;
use skilleval_providers::ProviderClients;
use skilleval_sandbox::Sandbox;

/// A grading strategy, registered by name.
pub trait Strategy: Send + Sync {
    /// The name test cases use in `evaluation.strategy`.
    fn name(&self) -> &'static str;

    /// The strategy grading `case` would need a model provider for that this registry was
    /// built without (this one, or a part of a `hybrid`). Such a case compiles but cannot be
    /// graded: callers report it as a configuration problem, not a failing case.
    fn missing_provider(
        &self,
        _case: &TestCase,
        _registry: &StrategyRegistry,
    ) -> Option<&'static str> {
        None
    }

    /// Checks the case and builds its grader. Problems carry pointers under `ctx.pointer`.
    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>>;
}

/// A compiled grader for one test-case definition.
#[async_trait]
pub trait Grader: Send + Sync + fmt::Debug {
    async fn grade(&self, input: &GradeInput<'_>, env: &GradeEnv) -> Result<Grade, Fault>;
}

/// What [`Strategy::compile`] may look at besides the case.
pub struct CompileContext<'a> {
    /// To compile sub-strategies (`hybrid`).
    pub registry: &'a StrategyRegistry,
    /// The package on disk (custom scripts must exist in it).
    pub package_root: &'a Path,
    /// The file problems are reported against.
    pub file: &'a str,
    /// Pointer to the test case in that file, e.g. `/testCases/3`.
    pub pointer: String,
    pub profile: Profile,
}

impl CompileContext<'_> {
    /// A problem at `suffix` below this case (`/expected/patterns/0`).
    pub fn problem(&self, suffix: &str, message: impl Into<String>) -> Problem {
        Problem::error(self.file, format!("{}{}", self.pointer, suffix), message)
    }

    /// A check at `suffix` the host could not make (a tool it needs is missing or failed): a
    /// configuration problem, never the package's.
    pub fn host_problem(&self, suffix: &str, message: impl Into<String>) -> Problem {
        Problem::host(self.file, format!("{}{}", self.pointer, suffix), message)
    }
}

/// One output to grade, with what the grader may compare it to.
#[derive(Debug, Clone, Copy)]
pub struct GradeInput<'a> {
    pub output: &'a str,
    /// The templated prompt the output answers.
    pub prompt: &'a str,
    pub context: Option<&'a Value>,
    /// Tool calls read from the transcript, when the runner produced one.
    pub tool_calls: Option<&'a [ToolCall]>,
    pub case: &'a TestCase,
    /// Files the runner left (the `agent` runner's workspace); empty for other runners.
    pub files: &'a [skilleval_model::output::ProducedFile],
}

/// Process-level facilities a grader may use.
#[derive(Debug, Clone)]
pub struct GradeEnv {
    /// Runs untrusted scripts (custom graders, command runners).
    pub sandbox: Arc<Sandbox>,
    /// Root of the package on disk, mounted read-only into the sandbox.
    pub package_root: Arc<Path>,
}

/// Strategies by name.
#[derive(Clone, Default)]
pub struct StrategyRegistry {
    by_name: BTreeMap<&'static str, Arc<dyn Strategy>>,
    aliases: BTreeMap<&'static str, &'static str>,
    /// Converts `expected.zodSchema` for `json_schema`; without, such a case is a problem.
    zod: Option<Arc<zod::ZodConverter>>,
}

impl fmt::Debug for StrategyRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StrategyRegistry")
            .field("strategies", &self.by_name.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Builds a registry (tests register their own strategies; the product's are in
/// [`StrategyRegistry::with_providers`]).
#[derive(Default)]
pub struct StrategyRegistryBuilder {
    registry: StrategyRegistry,
}

impl StrategyRegistryBuilder {
    pub fn register(mut self, strategy: Arc<dyn Strategy>) -> Self {
        self.registry.by_name.insert(strategy.name(), strategy);
        self
    }

    pub fn alias(mut self, alias: &'static str, target: &'static str) -> Self {
        self.registry.aliases.insert(alias, target);
        self
    }

    /// Zod sources (`expected.zodSchema`) are converted with `converter`.
    pub fn zod(mut self, converter: Arc<zod::ZodConverter>) -> Self {
        self.registry.zod = Some(converter);
        self
    }

    pub fn build(self) -> StrategyRegistry {
        self.registry
    }
}

impl StrategyRegistry {
    pub fn builder() -> StrategyRegistryBuilder {
        StrategyRegistryBuilder::default()
    }

    /// Every strategy of the design, the model-backed ones without a provider (they validate
    /// and report the missing provider).
    pub fn builtin() -> StrategyRegistryBuilder {
        StrategyRegistry::with_providers(None)
    }

    /// Every strategy of the design under its name, the model-backed ones grading with
    /// `providers`' clients.
    pub fn with_providers(providers: Option<&Arc<ProviderClients>>) -> StrategyRegistryBuilder {
        builtin::register(StrategyRegistry::builder(), providers)
    }

    /// The strategy grading `case` needs a model provider for and this registry has none for
    /// (see [`Strategy::missing_provider`]); `None` also for an unknown strategy name.
    pub fn missing_provider(&self, name: &str, case: &TestCase) -> Option<&'static str> {
        self.get(name)?.missing_provider(case, self)
    }

    /// The Zod converter this registry was built with.
    pub fn zod(&self) -> Option<&Arc<zod::ZodConverter>> {
        self.zod.as_ref()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Strategy>> {
        let name = self.aliases.get(name).copied().unwrap_or(name);
        self.by_name.get(name)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }

    /// Compiles a case with its named strategy; an unknown name is a problem at `/evaluation/strategy`.
    pub fn compile(
        &self,
        name: &str,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        match self.get(name) {
            Some(strategy) => strategy.compile(case, ctx),
            None => Err(vec![ctx.problem(
                "/evaluation/strategy",
                format!(
                    "unknown strategy `{name}`; known: {}",
                    self.names().join(", ")
                ),
            )]),
        }
    }
}

/// What a compiled grader depends on, hashed: the package (custom scripts live in it), the
/// profile, the resolved strategy name, `expected` and the grading part of `evaluation`
/// (weights, threshold, options). Compiling reads nothing else of a case (not its id, name,
/// input or given output), so cases with the same key share one compiled grader: a suite of
/// 100,000 cases checking one JSON Schema compiles it once. SHA-256, so two definitions never
/// share a grader by collision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DefinitionKey([u8; 32]);

impl DefinitionKey {
    pub fn of(
        package_hash: &str,
        profile: skilleval_model::definition::Profile,
        case: &TestCase,
    ) -> DefinitionKey {
        use sha2::{Digest, Sha256};
        let e = &case.evaluation;
        let grading = (&e.weights, &e.passing_threshold, &e.options);
        let mut h = Sha256::new();
        for part in [
            package_hash.as_bytes(),
            profile.as_str().as_bytes(),
            case.strategy_name(profile).as_bytes(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        // Serialising these plain data types does not fail; if it did, the error text goes
        // into the hash (a distinct key), never a panic.
        for json in [
            serde_json::to_vec(&case.expected),
            serde_json::to_vec(&grading),
        ] {
            match json {
                Ok(bytes) => {
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(&bytes);
                }
                Err(e) => h.update(e.to_string().as_bytes()),
            }
        }
        DefinitionKey(h.finalize().into())
    }
}

pub mod assertions;
mod builtin;
pub mod comparator;
pub mod contains;
pub mod custom;
pub mod exact_match;
pub mod extract;
mod field;
pub mod hybrid;
pub mod json_schema;
pub mod keyword_coverage;
pub mod lexical_similarity;
pub mod llm_judge;
mod options;
pub(crate) mod provider;
pub mod regex_match;
pub mod rubric;
pub mod scale;
pub mod semantic_sim;
pub mod sentiment;
mod sentiment_lexicon;
#[cfg(test)]
pub(crate) mod test_support;
mod text;
pub mod tool_usage;
pub mod toxicity;
pub mod zod;
