//! `tests.json` v2: already the canonical model. Decoding is done per case so every broken case
//! is reported; tags written under `metadata.tags` are moved into the case's `tags`; the loaded
//! `version` is always `"2.0"`. Unknown top-level and case fields are warnings (typos such as
//! `expectd` would otherwise be silently ignored).

use serde_json::Value;

use super::{typed_owned, warn_unknown_keys, CaseShape, CaseSource, Converted, EvalFormat};
use crate::definition::{EvalConfig, TestCase};
use crate::problem::Problem;

const TOP_KEYS: &[&str] = &[
    "$schema",
    "version",
    "profile",
    "settings",
    "setup",
    "teardown",
    "testCases",
    "suites",
    "monitoring",
];
const CASE_SHAPE: CaseShape = CaseShape {
    keys: &[
        "id",
        "name",
        "description",
        "tags",
        "input",
        "expected",
        "evaluation",
        "metadata",
        "weight",
        "given",
    ],
    a_noun: "a test case",
    noun: "test case",
};

/// Takes the parsed document by value: each case's JSON is moved into its typed form (no
/// string copied) and freed as soon as it is converted, so loading never holds the whole
/// document twice (as JSON values and as the model). [`super::convert`] does not build the
/// document at all: it converts each case as the parser reaches it ([`CaseList::push`]) and
/// hands the rest to [`convert_parts`].
pub fn convert(value: Value, file: &str) -> Converted {
    let Value::Object(mut obj) = value else {
        let mut out = Converted::empty(EvalFormat::V2, "/testCases");
        out.problems.push(Problem::error(
            file,
            "",
            "a v2 tests.json must be a JSON object",
        ));
        return out;
    };
    let cases = obj.remove("testCases").map(|cases| match cases {
        Value::Array(items) => {
            let mut list = CaseList::default();
            for (i, item) in items.into_iter().enumerate() {
                list.push(i, item, file);
            }
            list
        }
        _ => CaseList::not_a_list(),
    });
    convert_parts(obj, cases, file)
}

/// A v2 document's `testCases`, converted case by case.
#[derive(Debug, Default)]
pub struct CaseList {
    cases: Vec<TestCase>,
    sources: Vec<CaseSource>,
    problems: Vec<Problem>,
    not_a_list: bool,
}

impl CaseList {
    /// The converted cases, their sources and the problems of the cases that did not convert.
    pub fn into_parts(self) -> (Vec<TestCase>, Vec<CaseSource>, Vec<Problem>) {
        (self.cases, self.sources, self.problems)
    }

    /// No item was read into this list (converted or not).
    pub fn is_empty(&self) -> bool {
        self.cases.is_empty() && self.problems.is_empty()
    }

    /// `testCases` was there but not a list.
    pub fn not_a_list() -> Self {
        CaseList {
            not_a_list: true,
            ..CaseList::default()
        }
    }

    /// Converts the case at `index` of the list (its JSON moved in and freed here); a broken
    /// case becomes a problem and the next is read all the same.
    pub fn push(&mut self, index: usize, item: Value, file: &str) {
        let at = format!("/testCases/{index}");
        if !CASE_SHAPE.check(&item, file, &at, &mut self.problems) {
            return;
        }
        match typed_owned::<TestCase>(item, file, &at) {
            Ok(mut case) => {
                merge_metadata_tags(&mut case);
                self.cases.push(case);
                self.sources.push(CaseSource {
                    pointer: at,
                    renames: &[],
                });
            }
            Err(problem) => self.problems.push(problem),
        }
    }
}

/// A v2 document from its top level without `testCases` (`top`) and its cases, converted
/// already (`None` when the document has no `testCases`).
pub fn convert_parts(
    top: serde_json::Map<String, Value>,
    cases: Option<CaseList>,
    file: &str,
) -> Converted {
    let mut out = Converted::empty(EvalFormat::V2, "/testCases");
    let top = Value::Object(top);
    warn_unknown_keys(&top, TOP_KEYS, file, "", "top-level", &mut out.problems);
    if let Some(version) = top.get("version").and_then(Value::as_str) {
        if !version.starts_with('2') {
            out.problems.push(Problem::warning(
                file,
                "/version",
                format!("version `{version}` with `testCases`: read as v2 (\"2.0\")"),
            ));
        }
    }

    // Everything but the cases in one go; the cases were converted one by one.
    match typed_owned::<EvalConfig>(top, file, "") {
        Ok(config) => out.config = config,
        Err(problem) => out.problems.push(problem),
    }
    out.config.version = "2.0".to_string();
    let Some(mut list) = cases else {
        out.config.test_cases.clear();
        return out;
    };
    list.cases.shrink_to_fit();
    out.config.test_cases = list.cases;
    out.sources = list.sources;
    out.problems.append(&mut list.problems);
    if list.not_a_list {
        out.problems.push(Problem::error(
            file,
            "/testCases",
            "`testCases` must be a list of test cases",
        ));
    }
    out
}

/// Moves `metadata.tags` into `tags` (keeping order, without duplicates).
fn merge_metadata_tags(case: &mut TestCase) {
    for tag in std::mem::take(&mut case.metadata.tags) {
        if !case.tags.contains(&tag) {
            case.tags.push(tag);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_every_broken_case_and_keeps_the_good_ones() {
        let value = json!({
            "version": "2.0",
            "profile": "structured",
            "testCases": [
                {"id": "a", "input": {"prompt": "x"}},
                {"id": "b", "weight": "heavy"},
                {"name": "no id"},
                {"id": "c", "metadata": {"tags": ["pii"], "priority": "critical"}, "tags": ["x"], "expectd": {}}
            ]
        });
        let out = convert(value, "eval/tests.json");
        let ids: Vec<&str> = out
            .config
            .test_cases
            .iter()
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["a", "c"]);
        assert_eq!(out.sources[1].pointer, "/testCases/3");
        assert_eq!(out.config.test_cases[1].tags, ["x", "pii"]);
        assert!(out.config.test_cases[1].metadata.tags.is_empty());
        let pointers: Vec<(&str, bool)> = out
            .problems
            .iter()
            .map(|p| (p.pointer.as_str(), p.is_error()))
            .collect();
        assert_eq!(
            pointers,
            [
                ("/testCases/1/weight", true),
                ("/testCases/2", true),
                ("/testCases/3/expectd", false)
            ]
        );
        assert!(out.problems[1].message.contains("missing field `id`"));
    }

    #[test]
    fn bad_top_level_field_still_reads_cases() {
        let value = json!({"version": "2.0", "profile": "artsy", "testCases": [{"id": "a"}]});
        let out = convert(value, "eval/tests.json");
        assert_eq!(out.config.test_cases.len(), 1);
        assert_eq!(out.problems.len(), 1);
        assert_eq!(out.problems[0].pointer, "/profile");
        assert!(
            out.problems[0].message.contains("unknown variant `artsy`"),
            "{}",
            out.problems[0].message
        );
    }
}
