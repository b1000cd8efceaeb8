//! Test helpers: a registry of the built-in strategies, a temporary package root, and shortcuts
//! to compile a case and grade an output with it.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use tempfile::TempDir;

use super::{CompileContext, GradeEnv, GradeInput, Grader, StrategyRegistry};
use skilleval_model::definition::{Profile, TestCase};
use skilleval_model::grade::{Fault, Grade, ToolCall};
use skilleval_model::problem::Problem;
use skilleval_sandbox::Sandbox;

pub(crate) const FILE: &str = "eval/tests.json";
pub(crate) const POINTER: &str = "/testCases/0";

pub(crate) struct Fixture {
    pub registry: StrategyRegistry,
    pub dir: TempDir,
}

impl Fixture {
    pub fn new() -> Self {
        Fixture {
            registry: StrategyRegistry::builtin().build(),
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn ctx(&self) -> CompileContext<'_> {
        CompileContext {
            registry: &self.registry,
            package_root: self.dir.path(),
            file: FILE,
            pointer: POINTER.to_string(),
            profile: Profile::Deterministic,
        }
    }

    pub fn env(&self) -> GradeEnv {
        GradeEnv {
            sandbox: Arc::new(Sandbox::default()),
            package_root: Arc::from(self.dir.path()),
        }
    }

    /// Compiles `case` with its own strategy.
    pub fn compile(&self, case: &TestCase) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let ctx = self.ctx();
        self.registry
            .compile(case.strategy_name(ctx.profile), case, &ctx)
    }

    /// Compiles, expecting success.
    pub fn grader(&self, case: &TestCase) -> Arc<dyn Grader> {
        match self.compile(case) {
            Ok(g) => g,
            Err(problems) => panic!("expected {} to compile, got {problems:#?}", case.id),
        }
    }

    /// Compiles, expecting problems.
    pub fn problems(&self, case: &TestCase) -> Vec<Problem> {
        match self.compile(case) {
            Ok(g) => panic!("expected {} not to compile, got {g:?}", case.id),
            Err(problems) => problems,
        }
    }

    pub async fn grade(&self, case: &TestCase, output: &str) -> Result<Grade, Fault> {
        self.grade_with_calls(case, output, None).await
    }

    pub async fn grade_with_calls(
        &self,
        case: &TestCase,
        output: &str,
        calls: Option<&[ToolCall]>,
    ) -> Result<Grade, Fault> {
        let grader = self.grader(case);
        let input = GradeInput {
            output,
            prompt: &case.input.prompt,
            context: case.input.context.as_ref(),
            tool_calls: calls,
            case,
            files: &[],
        };
        grader.grade(&input, &self.env()).await
    }

    /// Grades, expecting a grade.
    pub async fn ok(&self, case: &TestCase, output: &str) -> Grade {
        match self.grade(case, output).await {
            Ok(g) => g,
            Err(f) => panic!("expected a grade for {}, got fault {f:?}", case.id),
        }
    }
}

/// A test case from JSON (camelCase, as in `tests.json`).
pub(crate) fn case(json: Value) -> TestCase {
    let mut value = json;
    if let Value::Object(map) = &mut value {
        map.entry("id")
            .or_insert_with(|| Value::String("t1".to_string()));
    }
    serde_json::from_value(value).expect("test case JSON")
}

/// The problem pointers, for compact assertions.
pub(crate) fn pointers(problems: &[Problem]) -> Vec<&str> {
    problems.iter().map(|p| p.pointer.as_str()).collect()
}

/// Asserts `a` and `b` are within 1e-9.
#[track_caller]
pub(crate) fn assert_close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

/// A ~1 MB output made of words.
pub(crate) fn megabyte_text() -> String {
    "lorem ipsum dolor sit amet naïve café 日本 ".repeat(1 << 20 >> 5)
}
