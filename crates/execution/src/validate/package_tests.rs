//! Packages validated: format conversion round trips, templating, every problem at once with
//! its pointer, chunked checking of a streamed definition.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::*;
use skilleval_grading::{CompileContext, GradeEnv, GradeInput, Grader, Strategy, StrategyRegistry};
use skilleval_model::definition::{
    EvalConfig, EvalSettings, Evaluation, Expected, Input, Metadata, Profile, TestCase,
};
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::package::fixtures::{open, package, SKILL};
use skilleval_model::package::{EvalFormat, Package, PackageLimits, SkillManifest, TriggerCase};

/// A stand-in for the real strategies: checks the fields the real ones check first.
struct Stub(&'static str);

#[derive(Debug)]
struct Pass;

#[async_trait]
impl Grader for Pass {
    async fn grade(&self, _input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        Ok(Grade::new(1.0, true, Value::Null))
    }
}

impl Strategy for Stub {
    fn name(&self) -> &'static str {
        self.0
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut problems = Vec::new();
        match self.0 {
            "exact_match" if case.expected.output.is_none() => {
                problems.push(ctx.problem("/expected/output", "exact_match needs expected.output"));
            }
            "regex_match" => {
                for (i, p) in case.expected.patterns.iter().enumerate() {
                    if let Err(e) = regex::Regex::new(p) {
                        problems.push(ctx.problem(
                            &format!("/expected/patterns/{i}"),
                            format!("invalid regex: {e}"),
                        ));
                    }
                }
            }
            _ => {}
        }
        if problems.is_empty() {
            Ok(Arc::new(Pass))
        } else {
            Err(problems)
        }
    }
}

/// Stubs for the deterministic strategies, and the real model-backed ones without a provider
/// (as `skilleval validate` has them).
fn registry() -> StrategyRegistry {
    let real = StrategyRegistry::builtin().build();
    let model_backed = |name: &str| real.get(name).expect("a built-in strategy").clone();
    StrategyRegistry::builder()
        .register(Arc::new(Stub("exact_match")))
        .register(Arc::new(Stub("regex_match")))
        .register(Arc::new(Stub("hybrid")))
        .register(model_backed("llm_judge"))
        .register(model_backed("assertions"))
        .register(model_backed("semantic_sim"))
        .build()
}

fn pointers(problems: &[Problem]) -> Vec<(&str, &str, bool)> {
    problems
        .iter()
        .map(|p| (p.file.as_str(), p.pointer.as_str(), p.is_error()))
        .collect()
}

#[test]
fn v1_converts_to_the_expected_v2_model() {
    let v1 = json!([
        {"name": "exact", "input": "2+2?", "expectedOutput": "4"},
        {"name": "patterns", "description": "d", "input": "list", "expectedPatterns": ["a", "b+"], "timeout": 5000},
        {"name": "both", "input": "say hi", "expectedOutput": "hi", "expectedPatterns": ["h"]},
        {"name": "neither", "input": "anything {{x}}"}
    ]);
    let dir = package(&[("SKILL.md", SKILL), ("tests.json", &v1.to_string())]);
    let pkg = open(dir.path());

    let case =
        |id: &str, name: &str, prompt: &str, expected: Expected, evaluation: Evaluation| TestCase {
            id: id.to_string(),
            name: name.to_string(),
            description: None,
            tags: vec![],
            input: Input {
                prompt: prompt.to_string(),
                context: None,
                variables: BTreeMap::new(),
                files: vec![],
            },
            expected,
            evaluation,
            metadata: Metadata::default(),
            weight: 1.0,
            given: None,
        };
    let mut patterns_case = case(
        "v1-002",
        "patterns",
        "list",
        Expected {
            patterns: vec!["a".into(), "b+".into()],
            ..Expected::default()
        },
        Evaluation {
            strategy: "regex_match".into(),
            timeout: Some(5000),
            ..Evaluation::default()
        },
    );
    patterns_case.description = Some("d".into());
    let expected = EvalConfig {
        version: "2.0".into(),
        profile: Profile::Deterministic,
        settings: EvalSettings::default(),
        setup: None,
        teardown: None,
        test_cases: vec![
            case(
                "v1-001",
                "exact",
                "2+2?",
                Expected {
                    output: Some("4".into()),
                    ..Expected::default()
                },
                Evaluation {
                    strategy: "exact_match".into(),
                    ..Evaluation::default()
                },
            ),
            patterns_case,
            case(
                "v1-003",
                "both",
                "say hi",
                Expected {
                    output: Some("hi".into()),
                    patterns: vec!["h".into()],
                    ..Expected::default()
                },
                Evaluation {
                    strategy: "hybrid".into(),
                    weights: BTreeMap::from([
                        ("exact_match".into(), 0.5),
                        ("regex_match".into(), 0.5),
                    ]),
                    passing_threshold: Some(1.0),
                    ..Evaluation::default()
                },
            ),
            case(
                "v1-004",
                "neither",
                "anything {{x}}",
                Expected {
                    patterns: vec![r"\S".into()],
                    ..Expected::default()
                },
                Evaluation {
                    strategy: "regex_match".into(),
                    ..Evaluation::default()
                },
            ),
        ],
        suites: vec![],
    };
    assert_eq!(pkg.format, Some(EvalFormat::V1));
    assert_eq!(pkg.eval_file, "tests.json");
    assert_eq!(pkg.case_pointers, ["/0", "/1", "/2", "/3"]);
    // v1 prompts are not templated: `{{x}}` is literal text, not an unknown variable.
    assert_eq!(pkg.config, expected);
    assert!(pkg.problems.is_empty(), "{:?}", pkg.problems);
    let v = validate(&pkg, &registry());
    assert!(v.is_ok(), "{:?}", v.problems);
    assert_eq!(v.graders.len(), 4);
}

#[test]
fn skill_creator_evals_convert_to_the_expected_v2_model() {
    let evals = json!({
        "skill_name": "demo-skill",
        "evals": [
            {"id": 1, "prompt": "Make a chart from data.csv", "expected_output": "A bar chart",
             "files": ["evals/files/data.csv"], "expectations": ["Has a title", "Uses bars"]},
            {"id": 2, "prompt": "Summarise\nthe doc", "assertions": ["Is short"]},
            {"id": 3, "prompt": "Describe it", "expected_output": "A friendly description"},
            {"id": 4, "prompt": "Anything"}
        ]
    });
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("evals/evals.json", &evals.to_string()),
        ("evals/files/data.csv", "a,b\n1,2\n"),
    ]);
    let pkg = open(dir.path());
    let case = |id: &str,
                name: &str,
                prompt: &str,
                files: Vec<String>,
                expected: Expected,
                strategy: &str| TestCase {
        id: id.to_string(),
        name: name.to_string(),
        description: None,
        tags: vec![],
        input: Input {
            prompt: prompt.to_string(),
            context: None,
            variables: BTreeMap::new(),
            files,
        },
        expected,
        evaluation: Evaluation {
            strategy: strategy.to_string(),
            ..Evaluation::default()
        },
        metadata: Metadata::default(),
        weight: 1.0,
        given: None,
    };
    let expected = EvalConfig {
        version: "2.0".into(),
        profile: Profile::Deterministic,
        settings: EvalSettings::default(),
        setup: None,
        teardown: None,
        test_cases: vec![
            case(
                "1",
                "Make a chart from data.csv",
                "Make a chart from data.csv",
                vec!["evals/files/data.csv".into()],
                Expected {
                    output: Some("A bar chart".into()),
                    assertions: vec!["Has a title".into(), "Uses bars".into()],
                    ..Expected::default()
                },
                "assertions",
            ),
            case(
                "2",
                "Summarise",
                "Summarise\nthe doc",
                vec![],
                Expected {
                    assertions: vec!["Is short".into()],
                    ..Expected::default()
                },
                "assertions",
            ),
            case(
                "3",
                "Describe it",
                "Describe it",
                vec![],
                Expected {
                    output: Some("A friendly description".into()),
                    assertions: vec!["A friendly description".into()],
                    ..Expected::default()
                },
                "assertions",
            ),
            case(
                "4",
                "Anything",
                "Anything",
                vec![],
                Expected::default(),
                "assertions",
            ),
        ],
        suites: vec![],
    };
    assert_eq!(pkg.format, Some(EvalFormat::SkillCreator));
    assert_eq!(pkg.eval_file, "evals/evals.json");
    assert_eq!(
        pkg.case_pointers,
        ["/evals/0", "/evals/1", "/evals/2", "/evals/3"]
    );
    assert_eq!(pkg.config, expected);
    assert!(pkg.problems.is_empty(), "{:?}", pkg.problems);
    // `assertions` has no provider here: accepted, fields checked, graded by nothing but a
    // grader that says a provider is needed; the eval with neither expectations nor an
    // expected output is refused where its expectations go, saying what to add.
    let registry = registry();
    let v = validate(&pkg, &registry);
    assert!(!v.is_ok());
    assert_eq!(
        pointers(&v.problems),
        [("evals/evals.json", "/evals/3/expectations", true)]
    );
    assert!(
        v.problems[0]
            .message
            .contains("add the statements a good output must satisfy"),
        "{}",
        v.problems[0].message
    );
    let missing: Vec<_> = pkg
        .config
        .test_cases
        .iter()
        .map(|c| registry.missing_provider(c.strategy_name(pkg.config.profile), c))
        .collect();
    assert_eq!(missing, [Some("assertions"); 4]);
}

#[test]
fn eval_metadata_converts_to_assertion_cases() {
    let meta = json!({
        "skill_name": "other-name",
        "version": "1.2.0",
        "test_cases": [
            {"id": "tc-a", "prompt": "Write a haiku", "assertions": ["Has three lines"], "tags": ["poetry"], "weight": 2.0},
            {"id": "tc-b", "prompt": "Write a limerick", "assertions": []}
        ]
    });
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("eval/eval_metadata.json", &meta.to_string()),
    ]);
    let pkg = open(dir.path());
    assert_eq!(pkg.format, Some(EvalFormat::EvalMetadata));
    assert_eq!(pkg.case_pointers, ["/test_cases/0", "/test_cases/1"]);
    let expected_first = TestCase {
        id: "tc-a".into(),
        name: "Write a haiku".into(),
        description: None,
        tags: vec!["poetry".into()],
        input: Input {
            prompt: "Write a haiku".into(),
            ..Input::default()
        },
        expected: Expected {
            assertions: vec!["Has three lines".into()],
            ..Expected::default()
        },
        evaluation: Evaluation {
            strategy: "assertions".into(),
            ..Evaluation::default()
        },
        metadata: Metadata::default(),
        weight: 2.0,
        given: None,
    };
    assert_eq!(pkg.config.test_cases[0], expected_first);
    assert_eq!(pkg.config.test_cases[1].weight, 1.0);
    // skill_name differs from SKILL.md: a warning; the empty assertion list: an error at the
    // source field `assertions`, not the converted `expected/assertions`.
    let v = validate(&pkg, &registry());
    assert_eq!(
        pointers(&v.problems),
        [
            ("eval/eval_metadata.json", "/skill_name", false),
            ("eval/eval_metadata.json", "/test_cases/1/assertions", true),
        ]
    );
}

#[test]
fn v2_templating_resolves_prompts() {
    let tests = json!({
        "version": "2.0",
        "testCases": [
            {"id": "a", "input": {"prompt": "Add {{ x }} and {{y}}", "variables": {"x": "1", "y": "2"}},
             "expected": {"output": "3"}}
        ]
    });
    let dir = package(&[("SKILL.md", SKILL), ("eval/tests.json", &tests.to_string())]);
    let pkg = open(dir.path());
    assert_eq!(pkg.config.test_cases[0].input.prompt, "Add 1 and 2");
    assert!(validate(&pkg, &registry()).is_ok());
}

#[test]
fn validation_reports_every_problem_at_once() {
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {"passThreshold": 1.5, "runner": {"type": "command", "script": "scripts/missing.py"}},
        "testCases": [
            {"id": "a", "input": {"prompt": "Hi {{who}}"}, "expected": {"output": "x"}},
            {"id": "a", "input": {"prompt": "x", "files": ["../secret"],
                                  "context": {"doc": "fixtures/missing.pdf", "ok": "fixtures/there.txt"}},
             "expected": {"output": "x"}, "weight": -1},
            {"id": "c", "expected": {"patterns": ["ok", "("]}, "evaluation": {"strategy": "regex_match", "timeout": 0}},
            {"id": "d", "evaluation": {"strategy": "no_such"}}
        ],
        "suites": [{"name": "smoke", "testIds": ["a", "zzz"]}]
    });
    let dir = package(&[
        ("SKILL.md", "---\nname: Bad_Name\ndescription: ok\n---\n"),
        ("eval/tests.json", &tests.to_string()),
        ("eval/fixtures/there.txt", "x"),
    ]);
    let pkg = open(dir.path());
    let v = validate(&pkg, &registry());
    assert!(!v.is_ok());
    let got = pointers(&v.problems);
    let want = [
        ("SKILL.md", "/name", true),
        ("eval/tests.json", "/testCases/0/input/prompt", true),
        ("eval/tests.json", "/testCases/1/id", true),
        ("eval/tests.json", "/testCases/1/input/files/0", true),
        ("eval/tests.json", "/testCases/1/input/context/doc", true),
        ("eval/tests.json", "/testCases/1/weight", true),
        ("eval/tests.json", "/testCases/2/expected/patterns/1", true),
        ("eval/tests.json", "/testCases/2/evaluation/timeout", true),
        ("eval/tests.json", "/testCases/3/evaluation/strategy", true),
        ("eval/tests.json", "/settings/passThreshold", true),
        ("eval/tests.json", "/settings/runner/script", true),
        ("eval/tests.json", "/suites/0/testIds/1", true),
    ];
    assert_eq!(got, want, "{:#?}", v.problems);
    let message = |ptr: &str| {
        v.problems
            .iter()
            .find(|p| p.pointer == ptr)
            .map(|p| p.message.clone())
            .unwrap_or_default()
    };
    assert!(message("/testCases/0/input/prompt").contains("unknown template variable `who`"));
    assert!(message("/testCases/1/id").contains("duplicate test case id `a`"));
    assert!(message("/testCases/1/input/files/0").contains("would leave the package"));
    assert!(message("/testCases/1/input/context/doc").contains("does not exist"));
    assert!(message("/testCases/2/expected/patterns/1").starts_with("invalid regex"));
    assert!(message("/testCases/3/evaluation/strategy").contains("unknown strategy `no_such`"));
    assert_eq!(message("/suites/0/testIds/1"), "unknown test case id `zzz`");
    // Cases that compiled have graders, keyed by id (the duplicate keeps the first).
    assert_eq!(v.graders.keys().collect::<Vec<_>>(), ["a"]);
}

/// Counts compiles, to see which cases share one.
struct Counting(std::sync::atomic::AtomicUsize);

impl Strategy for Counting {
    fn name(&self) -> &'static str {
        "regex_match"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Stub("regex_match").compile(case, ctx)
    }
}

#[test]
fn each_distinct_definition_compiles_once_and_check_keeps_no_grader() {
    // Four cases, two definitions (ids, names and prompts differ), and one bad definition
    // used twice: each bad case still gets its own problem at its own pointer.
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "testCases": [
            {"id": "a", "name": "A", "input": {"prompt": "one"}, "expected": {"patterns": ["x+"]}, "evaluation": {"strategy": "regex_match"}},
            {"id": "b", "name": "B", "input": {"prompt": "two"}, "expected": {"patterns": ["x+"]}, "evaluation": {"strategy": "regex_match"}},
            {"id": "c", "expected": {"patterns": ["y"]}, "evaluation": {"strategy": "regex_match"}},
            {"id": "d", "expected": {"patterns": ["x+"]}, "evaluation": {"strategy": "regex_match"}},
            {"id": "e", "expected": {"patterns": ["("]}, "evaluation": {"strategy": "regex_match"}},
            {"id": "f", "expected": {"patterns": ["("]}, "evaluation": {"strategy": "regex_match"}}
        ]
    });
    let dir = package(&[
        ("SKILL.md", "---\nname: shared\ndescription: ok\n---\n"),
        ("eval/tests.json", &tests.to_string()),
    ]);
    let pkg = open(dir.path());
    let counting = Arc::new(Counting(0.into()));
    let registry = StrategyRegistry::builder()
        .register(counting.clone())
        .build();
    let compiles = || counting.0.load(std::sync::atomic::Ordering::SeqCst);

    let v = validate(&pkg, &registry);
    // x+ once, y once, ( twice (a failed compile is not shared: each case reports its own).
    assert_eq!(compiles(), 4);
    assert_eq!(v.graders.keys().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    assert!(Arc::ptr_eq(&v.graders["a"], &v.graders["b"]));
    assert!(Arc::ptr_eq(&v.graders["a"], &v.graders["d"]));
    assert!(!Arc::ptr_eq(&v.graders["a"], &v.graders["c"]));
    let bad = [
        ("eval/tests.json", "/testCases/4/expected/patterns/0", true),
        ("eval/tests.json", "/testCases/5/expected/patterns/0", true),
    ];
    assert_eq!(pointers(&v.problems), bad);

    let checked = check(&pkg, &registry);
    assert_eq!(compiles(), 8, "check compiles each definition once too");
    assert!(checked.graders.is_empty(), "check keeps no grader");
    assert_eq!(checked.problems, v.problems);
}

#[test]
fn v1_problems_point_at_the_fields_the_author_wrote() {
    let v1 = json!({"tests": [
        {"name": "ok", "input": "x", "expectedOutput": "y"},
        {"name": "bad regex", "input": "x", "expectedPatterns": ["fine", "[unclosed"]}
    ]});
    let dir = package(&[("SKILL.md", SKILL), ("eval/tests.json", &v1.to_string())]);
    let pkg = open(dir.path());
    assert_eq!(pkg.format, Some(EvalFormat::V1));
    assert_eq!(pkg.case_pointers, ["/tests/0", "/tests/1"]);
    assert_eq!(
        pkg.source_pointer(1, "/input/prompt").as_deref(),
        Some("/tests/1/input")
    );
    assert_eq!(pkg.source_pointer(1, "/evaluation/strategy"), None);
    let v = validate(&pkg, &registry());
    assert_eq!(
        pointers(&v.problems),
        [("eval/tests.json", "/tests/1/expectedPatterns/1", true)]
    );

    // A strategy the registry does not know: the generated field points at the case.
    let empty = StrategyRegistry::builder().build();
    let v = validate(&pkg, &empty);
    assert_eq!(v.problems[0].pointer, "/tests/0");
    assert!(
        v.problems[0]
            .message
            .ends_with("(converted field `evaluation/strategy`)"),
        "{}",
        v.problems[0].message
    );
}

#[test]
fn missing_skill_md_and_eval_definition() {
    let dir = package(&[("skill.md", SKILL), ("README.md", "x")]);
    let pkg = open(dir.path());
    assert_eq!(pkg.manifest, SkillManifest::default());
    assert_eq!(pkg.name(), None);
    assert_eq!(pkg.format, None);
    let v = validate(&pkg, &registry());
    assert_eq!(
        pointers(&v.problems),
        [("SKILL.md", "", true), ("eval/tests.json", "", true)]
    );
    assert!(v.problems[0].message.contains("found `skill.md`"));
    assert!(v.problems[1].message.contains("no eval definition found"));
}

#[test]
fn empty_case_list_is_an_error() {
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", r#"{"version": "2.0", "testCases": []}"#),
    ]);
    let v = validate(&open(dir.path()), &registry());
    assert_eq!(
        pointers(&v.problems),
        [("eval/tests.json", "/testCases", true)]
    );
}

#[test]
fn json_syntax_error_is_one_problem_with_position() {
    let dir = package(&[
        ("SKILL.md", SKILL),
        (
            "eval/tests.json",
            "{\n  \"version\": \"2.0\",\n  \"testCases\": [,]\n}",
        ),
    ]);
    let v = validate(&open(dir.path()), &registry());
    assert_eq!(v.problems.len(), 1, "{:?}", v.problems);
    assert!(
        v.problems[0]
            .message
            .starts_with("invalid JSON at line 3, column 17"),
        "{}",
        v.problems[0].message
    );
}

#[test]
fn model_strategies_without_a_provider_are_accepted_with_their_fields_checked() {
    let tests = json!({
        "version": "2.0",
        "profile": "creative",
        "testCases": [
            {"id": "judge-default-rubric", "input": {"prompt": "x"}},
            {"id": "judge-bad-weights", "expected": {"rubric": {"criteria": [
                {"name": "a", "weight": 0.5}, {"name": "b", "weight": 0.2}]}}},
            {"id": "sim", "evaluation": {"strategy": "semantic_sim"}}
        ]
    });
    let dir = package(&[("SKILL.md", SKILL), ("eval/tests.json", &tests.to_string())]);
    let v = validate(&open(dir.path()), &registry());
    assert_eq!(
        pointers(&v.problems),
        [
            (
                "eval/tests.json",
                "/testCases/1/expected/rubric/criteria",
                true
            ),
            ("eval/tests.json", "/testCases/2/expected/output", true),
        ]
    );
    assert!(
        v.problems[0].message.contains("they sum to 0.7"),
        "{}",
        v.problems[0].message
    );
}

#[test]
fn runner_and_triggers() {
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": "telepathy"},
        "testCases": [{"id": "a", "expected": {"output": "x"}}]
    });
    let dir = package(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", &tests.to_string()),
        (
            "evals/triggers.json",
            r#"[{"query": "demo please", "should_trigger": true}]"#,
        ),
    ]);
    let pkg = open(dir.path());
    assert_eq!(
        pkg.triggers,
        [TriggerCase {
            query: "demo please".into(),
            should_trigger: true
        }]
    );
    assert_eq!(pkg.trigger_file.as_deref(), Some("evals/triggers.json"));
    let v = validate(&pkg, &registry());
    assert_eq!(
        pointers(&v.problems),
        [("eval/tests.json", "/settings/runner", true)]
    );
    assert!(v.problems[0].message.contains("unknown runner `telepathy`"));
}

#[test]
fn open_validated_lists_all_problems() {
    let tests = json!({"version": "2.0", "testCases": [{"id": "a"}, {"id": "a", "expected": {"output": "x"}}]});
    let dir = package(&[("SKILL.md", SKILL), ("eval/tests.json", &tests.to_string())]);
    let err =
        open_validated(dir.path(), &PackageLimits::default(), &registry()).expect_err("invalid");
    assert_eq!(
        pointers(err.problems()),
        [
            ("eval/tests.json", "/testCases/0/expected/output", true),
            ("eval/tests.json", "/testCases/1/id", true)
        ]
    );
    assert!(err
        .to_string()
        .starts_with("package is invalid: 2 errors\n  error: eval/tests.json#/testCases/0"));
    let good = json!({"version": "2.0", "testCases": [{"id": "a", "expected": {"output": "x"}}]});
    std::fs::write(dir.path().join("eval/tests.json"), good.to_string()).expect("write");
    let (pkg, v) =
        open_validated(dir.path(), &PackageLimits::default(), &registry()).expect("valid");
    assert!(v.is_ok());
    assert_eq!(pkg.name(), Some("demo-skill"));
}

/// A ZIP of these files.
fn zip_of(files: &[(&str, &str)]) -> Vec<u8> {
    use std::io::Write as _;
    let mut w = ::zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = ::zip::write::SimpleFileOptions::default();
    for (path, content) in files {
        w.start_file(*path, options).expect("entry");
        w.write_all(content.as_bytes()).expect("write");
    }
    w.finish().expect("zip").into_inner()
}

/// The definition a stored text holds, parsed back.
fn stored_config(text: &crate::plan::DefinitionText) -> skilleval_model::definition::EvalConfig {
    use std::io::Read as _;
    let mut json = String::new();
    flate2::read::DeflateDecoder::new(text.deflated())
        .read_to_string(&mut json)
        .expect("inflates");
    serde_json::from_str(&json).expect("parses")
}

#[test]
fn checking_in_chunks_gives_what_checking_the_whole_package_gives() {
    let registry = registry();
    let case = |id: &str, extra: Value| {
        let mut case = json!({"id": id, "input": {"prompt": format!("say {id}")},
                              "expected": {"output": "x"}, "evaluation": {"strategy": "exact_match"}});
        if let (Value::Object(case), Value::Object(extra)) = (&mut case, extra) {
            case.extend(extra);
        }
        case
    };
    let broken = json!({
        "colour": "blue",
        "testCases": [
            case("a", json!({"input": {"prompt": "Hi {{name}}", "variables": {"name": "Ann", "spare": "x"}}})),
            case("b", json!({"weight": "heavy"})),
            7,
            case("a", json!({})),
            case(" ", json!({"input": {"prompt": "{{nope}}"}})),
            case("c", json!({"expected": {}, "input": {"prompt": "p", "context": {"doc": "fixtures/missing.pdf"}}})),
            case("d", json!({"evaluation": {"strategy": "regex_match", "timeout": 0},
                               "expected": {"patterns": ["(unclosed"]}})),
            case("e", json!({"metadata": {"tags": ["t"]}})),
        ],
        "version": "2.0",
        "settings": {"defaultTimeout": 0},
        "suites": [{"name": "s", "testIds": ["a", "zz", " "]}, {"name": "s", "testIds": []}]
    });
    let valid = json!({
        "version": "2.0",
        "profile": "deterministic",
        "suites": [{"name": "core", "testIds": ["a", "c"]}],
        "testCases": [
            case("a", json!({"given": {"output": "x"}})),
            case("b", json!({"input": {"prompt": "Hi {{who}}", "variables": {"who": "you"}}})),
            case("c", json!({})),
            case("d", json!({"tags": ["x"]})),
            case("e", json!({})),
        ]
    });
    let all_given = json!({"version": "2.0", "testCases": [
        case("a", json!({"given": {"output": "x"}})), case("b", json!({"given": {"output": "y"}}))
    ]});
    let all_broken = json!({"testCases": [{"id": "a", "weight": "heavy"}, 3]});
    let documents = [
        broken.to_string(),
        valid.to_string(),
        all_given.to_string(),
        all_broken.to_string(),
        json!({"version": "2.0", "testCases": []}).to_string(),
        // Read whole: not a list, not v2, not JSON.
        json!({"version": "2.0", "testCases": {"id": "a"}}).to_string(),
        json!([{"name": "t", "input": "hi", "expectedOutput": "hello"}]).to_string(),
        "{\"testCases\": [".to_string(),
        // A repeated `testCases`: the last one counts.
        format!(
            r#"{{"version": "2.0", "testCases": [{}], "testCases": [{}, {}]}}"#,
            case("a", json!({})),
            case("b", json!({})),
            case("c", json!({}))
        ),
        // A byte-order mark; text that is not ASCII.
        format!(
            "\u{feff}{}",
            json!({"testCases": [case("ü", json!({"name": "日本 🦀"}))]})
        ),
    ];
    for document in &documents {
        let files = [
            ("SKILL.md", SKILL),
            ("eval/tests.json", document.as_str()),
            ("scripts/run.py", "print('hi')"),
            ("eval/fixtures/there.txt", "x"),
            ("evals/triggers.json", r#"[{"query": "q"}]"#),
        ];
        let zip = zip_of(&files);
        let limits = PackageLimits::default();
        let mut whole = Package::from_zip_bytes(&zip, &limits, None).expect("opens");
        let whole_check = check(&whole, &registry);
        let whole_text = crate::plan::DefinitionText::from_config(&mut whole.config).expect("text");

        let mut streamed = Package::from_zip_bytes_streamed(&zip, &limits).expect("opens");
        let mut writer = crate::plan::DefinitionWriter::new();
        let mut chunks = Vec::new();
        let chunked = check_in_chunks(&mut streamed, &registry, 2, |cases| {
            chunks.push(cases.len());
            writer.write_cases(cases);
        })
        .expect("reads");
        let chunked_text = writer.finish(&streamed.config).expect("text");

        assert_eq!(chunked.problems, whole_check.problems, "{document}");
        assert_eq!(streamed.problems, whole.problems, "{document}");
        assert_eq!(streamed.config, whole.config, "{document}");
        assert_eq!(chunked_text.cases(), whole_text.cases(), "{document}");
        assert_eq!(chunked_text.header(), whole_text.header(), "{document}");
        assert_eq!(
            stored_config(&chunked_text),
            stored_config(&whole_text),
            "{document}"
        );
        assert!(chunks.iter().all(|n| *n <= 2), "{document}: {chunks:?}");
    }
    // A file that is not UTF-8 is refused the same way.
    let mut zip = Vec::new();
    {
        use std::io::Write as _;
        let mut w = ::zip::ZipWriter::new(std::io::Cursor::new(&mut zip));
        let options = ::zip::write::SimpleFileOptions::default();
        w.start_file("SKILL.md", options).expect("entry");
        w.write_all(SKILL.as_bytes()).expect("write");
        w.start_file("eval/tests.json", options).expect("entry");
        w.write_all(b"{\"testCases\": [{\"id\": \"\xff\"}]}")
            .expect("write");
        w.finish().expect("zip");
    }
    let whole =
        Package::from_zip_bytes(&zip, &PackageLimits::default(), None).expect_err("refused");
    let streamed =
        Package::from_zip_bytes_streamed(&zip, &PackageLimits::default()).expect_err("refused");
    assert_eq!(streamed.to_string(), whole.to_string());
    assert!(whole.to_string().contains("not UTF-8"), "{whole}");
    // Not vacuous: the broken definition has problems of every kind, read in chunks; the
    // valid one is valid and got the inferred runner.
    let zip = zip_of(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", &broken.to_string()),
    ]);
    let mut pkg = Package::from_zip_bytes_streamed(&zip, &PackageLimits::default()).expect("opens");
    let mut chunks = 0;
    let v = check_in_chunks(&mut pkg, &registry, 2, |_| chunks += 1).expect("reads");
    assert_eq!(chunks, 4, "eight items, two at a time");
    assert!(v.problems.len() >= 12, "{:#?}", v.problems);
    let kinds: Vec<&str> = v.problems.iter().map(|p| p.pointer.as_str()).collect();
    for pointer in [
        "/colour",
        "/testCases/1/weight",
        "/testCases/2",
        "/testCases/3/id",
        "/testCases/4/input/prompt",
        "/testCases/0/input/variables/spare",
        "/testCases/5/input/context/doc",
        "/testCases/6/expected/patterns/0",
        "/settings/defaultTimeout",
        "/suites/0/testIds/1",
        "/suites/1/name",
    ] {
        assert!(kinds.contains(&pointer), "{pointer} in {kinds:?}");
    }
    let zip = zip_of(&[
        ("SKILL.md", SKILL),
        ("eval/tests.json", &valid.to_string()),
        ("scripts/run.py", "print('hi')"),
    ]);
    let mut pkg = Package::from_zip_bytes_streamed(&zip, &PackageLimits::default()).expect("opens");
    let mut writer = crate::plan::DefinitionWriter::new();
    let v =
        check_in_chunks(&mut pkg, &registry, 2, |cases| writer.write_cases(cases)).expect("reads");
    assert!(v.is_ok(), "{:#?}", v.problems);
    let text = writer.finish(&pkg.config).expect("text");
    assert_eq!(text.cases(), 5);
    let runner = pkg
        .config
        .settings
        .runner
        .as_ref()
        .map(skilleval_model::definition::RunnerSpec::config);
    assert_eq!(
        runner.and_then(|r| r.script).as_deref(),
        Some("scripts/run.py")
    );
    let stored = stored_config(&text);
    assert_eq!(stored.test_cases[1].input.prompt, "Hi you", "templated");
    assert!(
        pkg.config.test_cases.is_empty(),
        "the cases were handed over"
    );
}
