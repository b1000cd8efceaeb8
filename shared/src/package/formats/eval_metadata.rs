//! `eval/eval_metadata.json` (the JSON-shapes seed): `{skill_name, version, test_cases: [{id,
//! prompt, assertions, tags?, weight?}]}`.
//!
//! Each case becomes a v2 case graded by the `assertions` strategy: `prompt` -> `input.prompt`
//! (verbatim, no templating), `assertions` -> `expected.assertions`, `tags` and `weight` as they
//! are (weight defaults to 1.0). The file has no names; `name` (an accepted extra) or else the
//! prompt's first line (at most 80 characters) names the case in reports. The file's `version`
//! is the eval definition's own semver and is not kept; `skill_name` is compared with `SKILL.md`.

use serde::Deserialize;
use serde_json::Value;

use super::{
    deserialize_id, name_from_prompt, typed, warn_unknown_keys, CaseSource, Converted, EvalFormat,
    Renames,
};
use crate::model::{Evaluation, Expected, Input, TestCase};
use crate::problem::Problem;

const RENAMES: Renames = &[
    ("/input/prompt", "/prompt"),
    ("/expected/assertions", "/assertions"),
    ("/tags", "/tags"),
    ("/weight", "/weight"),
    ("/id", "/id"),
    ("/name", "/name"),
];

const TOP_KEYS: &[&str] = &["skill_name", "version", "test_cases"];
const CASE_KEYS: &[&str] = &["id", "name", "prompt", "assertions", "tags", "weight"];

#[derive(Debug, Deserialize)]
struct Top {
    #[serde(default)]
    skill_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MetaCase {
    #[serde(deserialize_with = "deserialize_id")]
    id: String,
    #[serde(default)]
    name: Option<String>,
    prompt: String,
    #[serde(default)]
    assertions: Vec<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    weight: Option<f64>,
}

pub fn convert(value: &Value, file: &str) -> Converted {
    let mut out = Converted::empty(EvalFormat::EvalMetadata, "/test_cases");
    let Value::Object(obj) = value else {
        out.problems.push(Problem::error(
            file,
            "",
            "eval_metadata.json must be a JSON object",
        ));
        return out;
    };
    warn_unknown_keys(value, TOP_KEYS, file, "", "top-level", &mut out.problems);
    let mut top = obj.clone();
    let cases = top.remove("test_cases");
    match typed::<Top>(&Value::Object(top), file, "") {
        Ok(top) => out.skill_name = top.skill_name.map(|n| (n, "/skill_name".to_string())),
        Err(problem) => out.problems.push(problem),
    }
    let items = match cases {
        Some(Value::Array(items)) => items,
        Some(_) => {
            out.problems.push(Problem::error(
                file,
                "/test_cases",
                "`test_cases` must be a list",
            ));
            return out;
        }
        None => {
            out.problems.push(Problem::error(
                file,
                "/test_cases",
                "`test_cases` is required",
            ));
            return out;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let at = format!("/test_cases/{i}");
        if !item.is_object() {
            out.problems.push(Problem::error(
                file,
                &at,
                "a test case must be a JSON object",
            ));
            continue;
        }
        warn_unknown_keys(item, CASE_KEYS, file, &at, "test case", &mut out.problems);
        match typed::<MetaCase>(item, file, &at) {
            Ok(case) => {
                out.config.test_cases.push(to_v2(case));
                out.sources.push(CaseSource {
                    pointer: at,
                    renames: RENAMES,
                });
            }
            Err(problem) => out.problems.push(problem),
        }
    }
    out
}

fn to_v2(case: MetaCase) -> TestCase {
    TestCase {
        name: case.name.unwrap_or_else(|| name_from_prompt(&case.prompt)),
        id: case.id,
        tags: case.tags,
        input: Input {
            prompt: case.prompt,
            ..Input::default()
        },
        expected: Expected {
            assertions: case.assertions,
            ..Expected::default()
        },
        evaluation: Evaluation {
            strategy: "assertions".to_string(),
            ..Evaluation::default()
        },
        weight: case.weight.unwrap_or(1.0),
        ..TestCase::default()
    }
}
