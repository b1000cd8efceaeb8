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
    deserialize_id, name_from_prompt, CaseShape, Converted, EvalFormat, NamedListFormat, Renames,
};
use crate::definition::{Evaluation, Expected, Input, TestCase};

const RENAMES: Renames = &[
    ("/input/prompt", "/prompt"),
    ("/expected/assertions", "/assertions"),
    ("/tags", "/tags"),
    ("/weight", "/weight"),
    ("/id", "/id"),
    ("/name", "/name"),
];

const FORMAT: NamedListFormat = NamedListFormat {
    format: EvalFormat::EvalMetadata,
    list_key: "test_cases",
    top_keys: &["skill_name", "version", "test_cases"],
    not_object: "eval_metadata.json must be a JSON object",
    case: CaseShape {
        keys: &["id", "name", "prompt", "assertions", "tags", "weight"],
        a_noun: "a test case",
        noun: "test case",
    },
};

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
    FORMAT.convert(value, file, |_, case: MetaCase, _, _| {
        (to_v2(case), RENAMES)
    })
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
