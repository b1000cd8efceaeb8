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
    deserialize_id, name_from_prompt, named_case_list, typed, warn_unknown_keys, CaseSource,
    Converted, EvalFormat, Renames,
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
    let Some(items) = named_case_list(
        value,
        file,
        TOP_KEYS,
        "test_cases",
        "eval_metadata.json must be a JSON object",
        &mut out,
    ) else {
        return out;
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
