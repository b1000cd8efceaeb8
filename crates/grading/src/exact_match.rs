//! `exact_match`: the output, trimmed, must equal `expected.output`, trimmed.
//!
//! Options: `caseSensitive` (default true), `normalizeWhitespace` (default false: when true,
//! every run of whitespace counts as one space). Score is 1 when equal, else 0; passed when
//! equal. Details: `expected`, `actual` (the trimmed output, cut at 4 KB), and on a mismatch
//! `first_difference`, the character offset where the compared texts part.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::options::OptionReader;
use super::text::{details_text, prepare};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

pub struct ExactMatch;

impl Strategy for ExactMatch {
    fn name(&self) -> &'static str {
        "exact_match"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "exact_match");
        let case_sensitive = opts.bool("caseSensitive", true);
        let normalize_whitespace = opts.bool("normalizeWhitespace", false);
        let Some(expected) = case.expected.output.as_deref() else {
            opts.problem(
                "/expected/output",
                "exact_match needs expected.output: the text the output must equal",
            );
            return Err(opts.problems);
        };
        let compared = prepare(expected, case_sensitive, normalize_whitespace).into_owned();
        let grader = ExactMatchGrader {
            expected_shown: details_text(expected.trim()),
            expected: compared,
            case_sensitive,
            normalize_whitespace,
        };
        opts.finish(Arc::new(grader) as Arc<dyn Grader>)
    }
}

#[derive(Debug)]
struct ExactMatchGrader {
    /// The expected text as compared (trimmed, normalised as the options say).
    expected: String,
    /// The expected text as shown in details.
    expected_shown: Value,
    case_sensitive: bool,
    normalize_whitespace: bool,
}

#[async_trait]
impl Grader for ExactMatchGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let actual = input.output.trim();
        let compared = prepare(actual, self.case_sensitive, self.normalize_whitespace);
        let equal = compared.as_ref() == self.expected;
        let mut details = Map::with_capacity(3);
        details.insert("expected".to_string(), self.expected_shown.clone());
        details.insert("actual".to_string(), details_text(actual));
        if !equal {
            let at = first_difference(&compared, &self.expected);
            details.insert("first_difference".to_string(), Value::from(at));
        }
        Ok(Grade::new(
            if equal { 1.0 } else { 0.0 },
            equal,
            Value::Object(details),
        ))
    }
}

/// Character offset of the first difference between `a` and `b`.
fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{case, megabyte_text, pointers, Fixture};

    #[tokio::test]
    async fn equal_after_trim_passes() {
        let f = Fixture::new();
        let c = case(
            json!({"expected": {"output": "Hello, World"}, "evaluation": {"strategy": "exact_match"}}),
        );
        let g = f.ok(&c, "  Hello, World\n").await;
        assert!(g.passed);
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["expected"], "Hello, World");
        assert_eq!(g.details["actual"], "Hello, World");
        assert!(g.details.get("first_difference").is_none());
    }

    #[tokio::test]
    async fn different_text_fails_with_offset() {
        let f = Fixture::new();
        let c = case(
            json!({"expected": {"output": "Hello, World"}, "evaluation": {"strategy": "exact_match"}}),
        );
        let g = f.ok(&c, "Hello, world").await;
        assert!(!g.passed);
        assert_eq!(g.score, 0.0);
        assert_eq!(g.details["first_difference"], 7);
        assert_eq!(g.details["actual"], "Hello, world");
    }

    #[tokio::test]
    async fn case_and_whitespace_options() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"output": "Naïve  Café\n日本"},
            "evaluation": {"strategy": "exact_match", "options": {"caseSensitive": false, "normalizeWhitespace": true}}
        }));
        assert!(f.ok(&c, "naïve café 日本").await.passed);
        assert!(f.ok(&c, "NAÏVE\tCAFÉ   日本 ").await.passed);
        assert!(!f.ok(&c, "naive cafe 日本").await.passed);
        // Without normalisation, inner whitespace matters.
        let strict =
            case(json!({"expected": {"output": "a b"}, "evaluation": {"strategy": "exact_match"}}));
        assert!(!f.ok(&strict, "a  b").await.passed);
        assert!(!f.ok(&strict, "A b").await.passed);
    }

    #[tokio::test]
    async fn options_may_sit_in_expected() {
        let f = Fixture::new();
        let c = case(
            json!({"expected": {"output": "YES", "caseSensitive": false}, "evaluation": {"strategy": "exact_match"}}),
        );
        assert!(f.ok(&c, "yes").await.passed);
    }

    #[tokio::test]
    async fn empty_and_huge_outputs() {
        let f = Fixture::new();
        let c =
            case(json!({"expected": {"output": ""}, "evaluation": {"strategy": "exact_match"}}));
        assert!(f.ok(&c, "  \n ").await.passed);
        let c = case(
            json!({"expected": {"output": "short"}, "evaluation": {"strategy": "exact_match"}}),
        );
        assert!(!f.ok(&c, "").await.passed);
        let big = megabyte_text();
        let g = f.ok(&c, &big).await;
        assert!(!g.passed);
        // Details never carry the whole megabyte.
        assert!(g.details["actual"].as_str().unwrap().len() < 5000);
    }

    #[test]
    fn missing_expected_output_and_bad_option_types_are_problems() {
        let f = Fixture::new();
        let c = case(
            json!({"evaluation": {"strategy": "exact_match", "options": {"caseSensitive": "no"}}}),
        );
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/caseSensitive",
                "/testCases/0/expected/output"
            ]
        );
        assert!(problems[1].message.contains("needs expected.output"));
        assert!(problems[0].message.contains("must be true or false"));
    }
}
