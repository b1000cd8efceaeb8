//! `regex_match`: every pattern in `expected.patterns` must match somewhere in the output.
//!
//! Patterns use the `regex` crate's syntax (linear-time matching, no look-around or
//! back-references), are compiled once with a size limit, and an invalid one is reported at
//! `/expected/patterns/<i>` (all of them, not just the first). Option `caseSensitive` (default
//! true). Score = matched / total; passed when all match, or, when
//! `evaluation.passingThreshold` is set, when the score reaches it. Details: `matched` and
//! `unmatched` patterns; the grade's `matched_patterns` lists the matched ones.

use std::sync::Arc;

use async_trait::async_trait;
use regex::Regex;
use serde_json::{json, Value};

use super::options::OptionReader;
use super::text::user_regex;
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

pub struct RegexMatch;

impl Strategy for RegexMatch {
    fn name(&self) -> &'static str {
        "regex_match"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "regex_match");
        let case_sensitive = opts.bool("caseSensitive", true);
        let threshold = opts.passing_threshold();
        if case.expected.patterns.is_empty() {
            opts.problem(
                "/expected/patterns",
                "regex_match needs at least one pattern in expected.patterns",
            );
        }
        let mut patterns = Vec::with_capacity(case.expected.patterns.len());
        for (i, source) in case.expected.patterns.iter().enumerate() {
            match user_regex(source, !case_sensitive) {
                Ok(regex) => patterns.push((regex, Value::String(source.clone()))),
                Err(e) => opts.problem(
                    &format!("/expected/patterns/{i}"),
                    format!("invalid regex: {e}"),
                ),
            }
        }
        opts.finish(Arc::new(RegexMatchGrader {
            patterns,
            threshold,
        }) as Arc<dyn Grader>)
    }
}

#[derive(Debug)]
struct RegexMatchGrader {
    /// Compiled patterns with their source as a details string.
    patterns: Vec<(Regex, Value)>,
    /// `evaluation.passingThreshold`, when set.
    threshold: Option<f64>,
}

#[async_trait]
impl Grader for RegexMatchGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let mut matched = Vec::with_capacity(self.patterns.len());
        let mut unmatched = Vec::new();
        for (regex, source) in &self.patterns {
            if regex.is_match(input.output) {
                matched.push(source.clone());
            } else {
                unmatched.push(source.clone());
            }
        }
        let total = self.patterns.len().max(1) as f64;
        let score = matched.len() as f64 / total;
        let passed = match self.threshold {
            Some(t) => score >= t,
            None => unmatched.is_empty(),
        };
        let matched_patterns = matched
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        let mut grade = Grade::new(
            score,
            passed,
            json!({"matched": matched, "unmatched": unmatched}),
        );
        grade.matched_patterns = Some(matched_patterns);
        Ok(grade)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};

    fn rx(patterns: serde_json::Value) -> skilleval_model::definition::TestCase {
        case(json!({"expected": {"patterns": patterns}, "evaluation": {"strategy": "regex_match"}}))
    }

    #[tokio::test]
    async fn all_patterns_match() {
        let f = Fixture::new();
        let c = rx(json!([
            r"^Order #\d+",
            r"total: \$\d+\.\d{2}",
            "(?i)thank you"
        ]));
        let g = f
            .ok(&c, "Order #123 confirmed, total: $45.00. THANK YOU")
            .await;
        assert!(g.passed);
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["unmatched"], json!([]));
        assert_eq!(g.matched_patterns.as_ref().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn partial_match_scores_fraction_and_fails() {
        let f = Fixture::new();
        let c = rx(json!([r"\d{3}", "apple", "banana"]));
        let g = f.ok(&c, "I have 123 apples").await;
        assert!(!g.passed);
        assert_close(g.score, 2.0 / 3.0);
        assert_eq!(g.details["matched"], json!([r"\d{3}", "apple"]));
        assert_eq!(g.details["unmatched"], json!(["banana"]));
        assert_eq!(
            g.matched_patterns,
            Some(vec![r"\d{3}".to_string(), "apple".to_string()])
        );
    }

    #[tokio::test]
    async fn passing_threshold_allows_partial() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"patterns": ["a", "b", "c", "z"]},
            "evaluation": {"strategy": "regex_match", "passingThreshold": 0.75}
        }));
        let g = f.ok(&c, "abc").await;
        assert!(g.passed);
        assert_eq!(g.score, 0.75);
        let g = f.ok(&c, "ab").await;
        assert!(!g.passed);
    }

    #[tokio::test]
    async fn case_insensitive_option_and_unicode() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"patterns": ["CAFÉ", r"日本", r"\bnaïve\b"]},
            "evaluation": {"strategy": "regex_match", "options": {"caseSensitive": false}}
        }));
        let g = f.ok(&c, "naïve café 日本").await;
        assert!(g.passed, "{:?}", g.details);
    }

    #[tokio::test]
    async fn empty_and_huge_output() {
        let f = Fixture::new();
        let c = rx(json!(["^$"]));
        assert!(f.ok(&c, "").await.passed);
        let c = rx(json!([r"日本\s+lorem", "missing-word"]));
        let g = f.ok(&c, &megabyte_text()).await;
        assert_eq!(g.score, 0.5);
        assert!(!g.passed);
    }

    #[test]
    fn every_invalid_regex_is_reported_at_its_index() {
        let f = Fixture::new();
        let c = rx(json!(["ok", "(unclosed", "fine", "[z-a]"]));
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/expected/patterns/1",
                "/testCases/0/expected/patterns/3"
            ]
        );
        assert!(problems
            .iter()
            .all(|p| p.message.starts_with("invalid regex: ")));
    }

    #[test]
    fn pathological_pattern_hits_size_limit() {
        let f = Fixture::new();
        let c = rx(json!([r"(\w{100}){100}"]));
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/patterns/0"]
        );
        assert!(
            problems[0].message.contains("invalid regex"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn empty_pattern_list_is_a_problem() {
        let f = Fixture::new();
        let problems = f.problems(&rx(json!([])));
        assert_eq!(pointers(&problems), vec!["/testCases/0/expected/patterns"]);
        assert!(problems[0].message.contains("at least one pattern"));
    }
}
