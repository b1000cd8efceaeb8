//! `tests.json` v1 (the marketplace's original format): a list, or `{"tests": [...]}`, of
//! `{name, description?, input: string, expectedOutput?, expectedPatterns?, timeout? (ms)}`.
//!
//! Conversion to v2, chosen so a v1 file means what its author meant:
//! - `id` is `v1-NNN`, the 1-based position padded to three digits (`v1-001`): v1 has no ids,
//!   names may repeat, and the prefix shows in reports that the id was generated.
//! - `input` becomes `input.prompt`, kept verbatim: v1 had no templating, so `{{x}}` in a v1
//!   prompt is literal text.
//! - `expectedOutput` only: `exact_match`. `expectedPatterns` only: `regex_match`.
//! - Both: `hybrid` of `exact_match` and `regex_match`, weights 0.5/0.5, passing threshold 1.0:
//!   both checks must hold (as v1 required), while the score still shows partial credit.
//! - Neither: `regex_match` with the one pattern `\S`: the case passes when the skill produced
//!   any non-blank output, which is all a v1 case without expectations ever checked.
//! - `timeout` becomes `evaluation.timeout`; absent, the model's 30 s default applies (v1's too).
//! - Profile `deterministic`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::{convert_cases, CaseShape, Converted, EvalFormat, Renames};
use crate::definition::{Evaluation, Expected, Input, Profile, TestCase};
use crate::problem::Problem;

/// The pattern a v1 case without expectations is graded with: "some non-blank output".
pub const NON_EMPTY_PATTERN: &str = r"\S";

const RENAMES: Renames = &[
    ("/input/prompt", "/input"),
    ("/expected/output", "/expectedOutput"),
    ("/expected/patterns", "/expectedPatterns"),
    ("/evaluation/timeout", "/timeout"),
    ("/name", "/name"),
    ("/description", "/description"),
];

const SHAPE: CaseShape = CaseShape {
    keys: &[
        "name",
        "description",
        "input",
        "expectedOutput",
        "expectedPatterns",
        "timeout",
    ],
    a_noun: "a test",
    noun: "v1 test",
};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V1Case {
    name: String,
    #[serde(default)]
    description: Option<String>,
    input: String,
    #[serde(default)]
    expected_output: Option<String>,
    #[serde(default)]
    expected_patterns: Option<Vec<String>>,
    #[serde(default)]
    timeout: Option<u64>,
}

pub fn convert(value: &Value, file: &str) -> Converted {
    let (items, base) = match value {
        Value::Array(items) => (items, ""),
        Value::Object(obj) => match obj.get("tests") {
            Some(Value::Array(items)) => (items, "/tests"),
            _ => {
                let mut out = Converted::empty(EvalFormat::V1, "/tests");
                out.problems.push(Problem::error(
                    file,
                    "/tests",
                    "`tests` must be a list of tests",
                ));
                return out;
            }
        },
        _ => {
            let mut out = Converted::empty(EvalFormat::V1, "");
            out.problems.push(Problem::error(
                file,
                "",
                "a v1 tests.json must be a list of tests",
            ));
            return out;
        }
    };
    let mut out = Converted::empty(EvalFormat::V1, base);
    out.config.profile = Profile::Deterministic;
    convert_cases(&mut out, items, file, &SHAPE, |i, case: V1Case, _, _| {
        (to_v2(i, case), RENAMES)
    });
    out
}

fn to_v2(index: usize, case: V1Case) -> TestCase {
    let patterns = case.expected_patterns.unwrap_or_default();
    let has_output = case.expected_output.is_some();
    let has_patterns = !patterns.is_empty();
    let mut evaluation = Evaluation {
        timeout: case.timeout,
        ..Evaluation::default()
    };
    let mut expected = Expected {
        output: case.expected_output,
        patterns,
        ..Expected::default()
    };
    match (has_output, has_patterns) {
        (true, false) => evaluation.strategy = "exact_match".to_string(),
        (false, true) => evaluation.strategy = "regex_match".to_string(),
        (true, true) => {
            evaluation.strategy = "hybrid".to_string();
            evaluation.weights = BTreeMap::from([
                ("exact_match".to_string(), 0.5),
                ("regex_match".to_string(), 0.5),
            ]);
            evaluation.passing_threshold = Some(1.0);
        }
        (false, false) => {
            evaluation.strategy = "regex_match".to_string();
            expected.patterns = vec![NON_EMPTY_PATTERN.to_string()];
        }
    }
    TestCase {
        id: format!("v1-{:03}", index + 1),
        name: case.name,
        description: case.description,
        input: Input {
            prompt: case.input,
            ..Input::default()
        },
        expected,
        evaluation,
        weight: 1.0,
        ..TestCase::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn object_form_and_type_errors() {
        let value = json!({"tests": [{"name": "a", "input": "hi"}, {"name": "b", "input": {"text": "hi"}}, {"input": "x"}]});
        let out = convert(&value, "tests.json");
        assert_eq!(out.list_pointer, "/tests");
        assert_eq!(out.config.test_cases.len(), 1);
        assert_eq!(out.config.test_cases[0].id, "v1-001");
        assert_eq!(
            out.config.test_cases[0].expected.patterns,
            [NON_EMPTY_PATTERN]
        );
        assert_eq!(out.problems.len(), 2);
        assert_eq!(out.problems[0].pointer, "/tests/1/input");
        assert!(
            out.problems[0].message.contains("expected a string"),
            "{}",
            out.problems[0].message
        );
        assert_eq!(out.problems[1].pointer, "/tests/2");
        assert!(out.problems[1].message.contains("missing field `name`"));
    }
}
