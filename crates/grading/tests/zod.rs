//! `expected.zodSchema` through the `json_schema` strategy, against the real converter: the
//! pinned Zod of `tools/zod` (installed by `scripts/test.sh` with `npm ci`) run by Node under
//! bubblewrap. A source converts and grades exactly as its hand-written JSON Schema; one that
//! is not a schema is a problem at its pointer with Node's message; conversions are cached by
//! the source's hash and inlined into the stored definition.

#![allow(clippy::unwrap_used, clippy::needless_pass_by_value)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};

use skilleval_grading::zod::{inline_converted, ZodConverter, SOURCE_KEY};
use skilleval_grading::{CompileContext, GradeEnv, GradeInput, StrategyRegistry};
use skilleval_model::definition::{Profile, TestCase};
use skilleval_model::grade::Grade;
use skilleval_model::problem::Problem;
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy};

fn zod_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/zod");
    assert!(
        dir.join("node_modules/zod").is_dir(),
        "the Zod converter is not installed: run `npm ci` in {} (scripts/test.sh does)",
        dir.display()
    );
    dir
}

fn sandbox() -> Arc<Sandbox> {
    let sandbox = Sandbox::detect(SandboxPolicy::default());
    assert_eq!(
        sandbox.mode(),
        SandboxMode::Bubblewrap,
        "bubblewrap must be installed and working for these tests: {:?}",
        sandbox.unavailable_reason()
    );
    Arc::new(sandbox)
}

struct Fixture {
    registry: StrategyRegistry,
    converter: Arc<ZodConverter>,
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let converter = Arc::new(ZodConverter::new(sandbox(), zod_dir()));
        Fixture {
            registry: StrategyRegistry::builtin().zod(converter.clone()).build(),
            converter,
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn ctx(&self) -> CompileContext<'_> {
        CompileContext {
            registry: &self.registry,
            package_root: self.dir.path(),
            file: "eval/tests.json",
            pointer: "/testCases/0".to_string(),
            profile: Profile::Structured,
        }
    }

    fn compile(&self, case: &TestCase) -> Result<Arc<dyn skilleval_grading::Grader>, Vec<Problem>> {
        self.registry.compile("json_schema", case, &self.ctx())
    }

    fn problems(&self, case: &TestCase) -> Vec<Problem> {
        match self.compile(case) {
            Ok(_) => panic!("expected problems"),
            Err(problems) => problems,
        }
    }

    async fn grade(&self, case: &TestCase, output: &str) -> Grade {
        let grader = self.compile(case).unwrap();
        let input = GradeInput {
            output,
            prompt: "",
            context: None,
            tool_calls: None,
            case,
            files: &[],
        };
        let env = GradeEnv {
            sandbox: Arc::new(Sandbox::default()),
            package_root: Arc::from(self.dir.path()),
        };
        grader.grade(&input, &env).await.unwrap()
    }
}

fn case(expected: Value) -> TestCase {
    serde_json::from_value(json!({
        "id": "t1",
        "expected": expected,
        "evaluation": {"strategy": "json_schema"}
    }))
    .unwrap()
}

/// The error paths of a grade, sorted.
fn error_paths(g: &Grade) -> Vec<String> {
    let mut paths: Vec<String> = g.details["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap().to_string())
        .collect();
    paths.sort();
    paths
}

#[tokio::test]
async fn a_zod_4_schema_grades_like_its_json_schema() {
    let f = Fixture::new();
    let zod = case(json!({"zodSchema": r#"import { z } from "zod";
z.object({
  name: z.string().min(1),
  age: z.number().int().nonnegative(),
  tags: z.array(z.string()).optional(),
})"#}));
    // The same contract written by hand.
    let written = case(json!({"jsonSchema": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "age"]
    }}));
    let outputs = [
        (r#"{"name": "Ada", "age": 36}"#, 0),
        (
            r#"{"name": "Ada", "age": 36, "tags": ["x"], "extra": true}"#,
            0,
        ),
        (r#"{"name": "", "age": 36}"#, 1),
        (r#"{"age": -1}"#, 2),
        (r#"{"name": "Ada", "age": 1.5, "tags": [1, 2]}"#, 3),
        ("no json here", 1),
    ];
    for (output, errors) in outputs {
        let a = f.grade(&zod, output).await;
        let b = f.grade(&written, output).await;
        assert_eq!(a.passed, b.passed, "{output}");
        assert_eq!(a.score, b.score, "{output}");
        if output.starts_with('{') {
            assert_eq!(error_paths(&a), error_paths(&b), "{output}");
            assert_eq!(
                a.details["errors"].as_array().unwrap().len(),
                errors,
                "{output}"
            );
        }
    }
    // One source, converted once however often it is compiled.
    assert_eq!(f.converter.cached_len(), 1);
}

#[tokio::test]
async fn zod_3_syntax_converts_too() {
    let f = Fixture::new();
    // `.ip()` is Zod 3's (Zod 4 has `z.ipv4()`): evaluated with the Zod 3 API.
    let c = case(json!({"zodSchema": "z.object({ host: z.string().ip() }).strict()"}));
    let g = f.grade(&c, r#"{"host": "10.0.0.1"}"#).await;
    assert!(g.passed, "{:?}", g.details);
    let g = f.grade(&c, r#"{"host": "ten"}"#).await;
    assert!(!g.passed);
    // `.strict()`: an unknown key is an error.
    let g = f.grade(&c, r#"{"host": "10.0.0.1", "port": 1}"#).await;
    assert!(!g.passed);
}

#[test]
fn a_source_that_is_not_a_schema_is_a_problem_at_its_pointer_with_nodes_message() {
    let f = Fixture::new();
    let problems = f.problems(&case(json!({"zodSchema": "z.object({ name: z.strin() })"})));
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].pointer, "/testCases/0/expected/zodSchema");
    assert!(
        problems[0].message.contains("z.strin is not a function"),
        "{}",
        problems[0].message
    );
    let problems = f.problems(&case(json!({"zodSchema": "42"})));
    assert!(
        problems[0]
            .message
            .contains("evaluates to a number, not a Zod schema"),
        "{}",
        problems[0].message
    );
    // A schema JSON Schema cannot express.
    let problems = f.problems(&case(json!({"zodSchema": "z.object({ when: z.date() })"})));
    assert!(
        problems[0].message.contains("Date cannot be represented"),
        "{}",
        problems[0].message
    );
    // The source sees Zod and nothing else of Node.
    let problems = f.problems(&case(json!({"zodSchema": "process.exit(0)"})));
    assert!(
        problems[0].message.contains("process is not defined"),
        "{}",
        problems[0].message
    );
    let problems = f.problems(&case(json!({"zodSchema": {"type": "object"}})));
    assert_eq!(problems[0].pointer, "/testCases/0/expected/zodSchema");
    assert!(problems[0].message.contains("must be a string"));
    let problems = f.problems(&case(
        json!({"zodSchema": "z.string()", "jsonSchema": {"type": "string"}}),
    ));
    assert!(problems[0].message.contains("not both"));
}

#[test]
fn without_a_converter_a_zod_schema_is_a_problem() {
    let registry = StrategyRegistry::builtin().build();
    let dir = tempfile::tempdir().unwrap();
    let ctx = CompileContext {
        registry: &registry,
        package_root: dir.path(),
        file: "eval/tests.json",
        pointer: "/testCases/0".to_string(),
        profile: Profile::Structured,
    };
    let problems = registry
        .compile(
            "json_schema",
            &case(json!({"zodSchema": "z.string()"})),
            &ctx,
        )
        .unwrap_err();
    assert_eq!(problems[0].pointer, "/testCases/0/expected/zodSchema");
    assert!(problems[0].message.contains("without one"));
}

#[test]
fn converted_schemas_are_inlined_for_storage() {
    let f = Fixture::new();
    let source = "z.object({ id: z.string().uuid() })";
    let mut cases = vec![
        case(json!({"zodSchema": source})),
        case(json!({"zodSchema": "z.strin()"})),
        case(json!({"jsonSchema": {"type": "string"}})),
    ];
    for c in &cases {
        let _ = f.compile(c);
    }
    inline_converted(&f.registry, &mut cases);
    let converted = cases[0].expected.json_schema.as_ref().unwrap();
    assert_eq!(converted["properties"]["id"]["format"], "uuid");
    assert_eq!(cases[0].expected.zod_schema, None);
    assert_eq!(cases[0].expected.extra[SOURCE_KEY], source);
    // What failed to convert stays as written; a JSON Schema is untouched.
    assert_eq!(cases[1].expected.json_schema, None);
    assert!(cases[1].expected.zod_schema.is_some());
    assert_eq!(
        cases[2].expected.json_schema,
        Some(json!({"type": "string"}))
    );
    // The inlined case compiles as a plain JSON Schema case.
    assert!(f.compile(&cases[0]).is_ok());
    // The round trip through the stored text keeps it so.
    let stored: TestCase =
        serde_json::from_str(&serde_json::to_string(&cases[0]).unwrap()).unwrap();
    assert_eq!(stored.expected.json_schema.as_ref(), Some(converted));
}
