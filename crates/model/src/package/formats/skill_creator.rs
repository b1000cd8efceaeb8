//! skill-creator's `evals/evals.json`: `{skill_name, evals: [{id (integer), prompt,
//! expected_output?, files?: [paths], expectations?: [strings]}]}` (some write `assertions` for
//! `expectations`).
//!
//! Conversion, strategy `assertions` throughout:
//! - `id` -> the id's decimal string (`1` -> `"1"`), so grading files and benchmarks use the
//!   same id skill-creator does and results round-trip between the two tools;
//! - `prompt` -> `input.prompt` (verbatim: no templating), `files` -> `input.files`
//!   (package-relative, checked to exist), `expected_output` -> `expected.output` (kept for
//!   reference and for the judge);
//! - `expectations` (or `assertions`) -> `expected.assertions`. With both, `expectations` wins
//!   and a warning says `assertions` is ignored;
//! - no expectations but an `expected_output`: skill-creator's `expected_output` describes a
//!   good answer rather than giving it verbatim, so it becomes the single assertion (an exact
//!   or embedding match against a description would fail good outputs);
//! - neither: strategy `assertions` with no assertion, which validation refuses at
//!   `/evals/N/expectations`, saying what to add (skill-creator's own first drafts, and
//!   `skilleval init`'s without a model, leave expectations for the author to write; a case
//!   that checked nothing would pass anything).
//!
//! Names: an extra `name` field, else the prompt's first line (at most 80 characters).

use serde::Deserialize;
use serde_json::Value;

use super::{
    deserialize_id, name_from_prompt, CaseShape, Converted, EvalFormat, NamedListFormat, Renames,
};
use crate::definition::{Evaluation, Expected, Input, TestCase};
use crate::problem::Problem;

const WITH_EXPECTATIONS: Renames = &[
    ("/input/prompt", "/prompt"),
    ("/input/files", "/files"),
    ("/expected/output", "/expected_output"),
    ("/expected/assertions", "/expectations"),
    ("/id", "/id"),
    ("/name", "/name"),
];
const WITH_ASSERTIONS: Renames = &[
    ("/input/prompt", "/prompt"),
    ("/input/files", "/files"),
    ("/expected/output", "/expected_output"),
    ("/expected/assertions", "/assertions"),
    ("/id", "/id"),
    ("/name", "/name"),
];
const FROM_EXPECTED_OUTPUT: Renames = &[
    ("/input/prompt", "/prompt"),
    ("/input/files", "/files"),
    ("/expected/output", "/expected_output"),
    ("/expected/assertions/0", "/expected_output"),
    ("/expected/assertions", "/expected_output"),
    ("/id", "/id"),
    ("/name", "/name"),
];

const FORMAT: NamedListFormat = NamedListFormat {
    format: EvalFormat::SkillCreator,
    list_key: "evals",
    top_keys: &["skill_name", "evals"],
    not_object: "evals.json must be a JSON object with `evals`",
    case: CaseShape {
        keys: &[
            "id",
            "name",
            "prompt",
            "expected_output",
            "files",
            "expectations",
            "assertions",
        ],
        a_noun: "an eval",
        noun: "eval",
    },
};

#[derive(Debug, Deserialize)]
struct Eval {
    #[serde(deserialize_with = "deserialize_id")]
    id: String,
    #[serde(default)]
    name: Option<String>,
    prompt: String,
    #[serde(default)]
    expected_output: Option<String>,
    #[serde(default)]
    files: Vec<String>,
    #[serde(default)]
    expectations: Option<Vec<String>>,
    #[serde(default)]
    assertions: Option<Vec<String>>,
}

pub fn convert(value: &Value, file: &str) -> Converted {
    FORMAT.convert(value, file, |_, eval: Eval, at, problems| {
        to_v2(eval, file, at, problems)
    })
}

fn to_v2(eval: Eval, file: &str, at: &str, problems: &mut Vec<Problem>) -> (TestCase, Renames) {
    let evaluation = Evaluation {
        strategy: "assertions".to_string(),
        ..Evaluation::default()
    };
    let mut expected = Expected {
        output: eval.expected_output.clone(),
        ..Expected::default()
    };
    if eval.expectations.is_some() && eval.assertions.is_some() {
        problems.push(Problem::warning(
            file,
            format!("{at}/assertions"),
            "both `expectations` and `assertions` are given; `assertions` is ignored",
        ));
    }
    // Where an empty list is reported: the field the author wrote, `expectations` by default.
    let empty_at = if eval.expectations.is_none() && eval.assertions.is_some() {
        WITH_ASSERTIONS
    } else {
        WITH_EXPECTATIONS
    };
    let renames = match (eval.expectations, eval.assertions) {
        (Some(list), _) if !list.is_empty() => {
            expected.assertions = list;
            WITH_EXPECTATIONS
        }
        (None, Some(list)) if !list.is_empty() => {
            expected.assertions = list;
            WITH_ASSERTIONS
        }
        _ => match eval.expected_output.filter(|o| !o.trim().is_empty()) {
            Some(output) => {
                expected.assertions = vec![output];
                FROM_EXPECTED_OUTPUT
            }
            None => empty_at,
        },
    };
    let case = TestCase {
        name: eval.name.unwrap_or_else(|| name_from_prompt(&eval.prompt)),
        id: eval.id,
        input: Input {
            prompt: eval.prompt,
            files: eval.files,
            ..Input::default()
        },
        expected,
        evaluation,
        weight: 1.0,
        ..TestCase::default()
    };
    (case, renames)
}
