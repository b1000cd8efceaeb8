//! `keyword_coverage`: the fraction of the keywords in option `keywords` that the output
//! mentions (the evaluator seed's keyword coverage evaluator).
//!
//! Options: `keywords` (array of strings, required), `caseSensitive` (default false),
//! `matchWholeWord` (default true: word boundaries at the keyword's word-character ends, so
//! `cat` is not found in `concatenate` but `C++` is found in `C++ code`), `threshold` (default
//! 1.0, else `evaluation.passingThreshold`). Whitespace inside a keyword matches any run of
//! whitespace. All keywords are compiled once into one regex set, matched in one pass.
//! Score = found / keywords; passed when it reaches the threshold. Details: `found`,
//! `missing`, `threshold`.

use std::sync::Arc;

use async_trait::async_trait;
use regex::RegexSet;
use serde_json::{json, Value};

use super::options::OptionReader;
use super::text::{term_pattern, user_regex_set};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

pub struct KeywordCoverage;

impl Strategy for KeywordCoverage {
    fn name(&self) -> &'static str {
        "keyword_coverage"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "keyword_coverage");
        let case_sensitive = opts.bool("caseSensitive", false);
        let whole_word = opts.bool("matchWholeWord", true);
        let threshold = opts.threshold(1.0);
        let keywords = match opts.string_list("keywords") {
            Some(k) if !k.is_empty() => k,
            Some(_) => {
                opts.option_problem(
                    "keywords",
                    "keyword_coverage needs at least one keyword in `keywords`",
                );
                Vec::new()
            }
            None => {
                if !opts.has("keywords") {
                    opts.problem(
                        "/evaluation/options/keywords",
                        "keyword_coverage needs option `keywords`: an array of the words the output must mention",
                    );
                }
                Vec::new()
            }
        };
        let patterns: Vec<String> = keywords
            .iter()
            .map(|k| term_pattern(k, whole_word))
            .collect();
        let set = match user_regex_set(&patterns, !case_sensitive) {
            Ok(set) => Some(set),
            Err(e) => {
                opts.option_problem(
                    "keywords",
                    format!("keyword_coverage: keywords cannot be compiled: {e}"),
                );
                None
            }
        };
        let keywords = keywords.into_iter().map(Value::String).collect();
        match set {
            Some(set) if opts.problems.is_empty() => Ok(Arc::new(KeywordGrader {
                set,
                keywords,
                threshold,
            })),
            _ => Err(opts.problems),
        }
    }
}

#[derive(Debug)]
struct KeywordGrader {
    /// One pattern per keyword, in order.
    set: RegexSet,
    keywords: Vec<Value>,
    threshold: f64,
}

#[async_trait]
impl Grader for KeywordGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let matches = self.set.matches(input.output);
        let mut found = Vec::with_capacity(self.keywords.len());
        let mut missing = Vec::new();
        for (i, keyword) in self.keywords.iter().enumerate() {
            if matches.matched(i) {
                found.push(keyword.clone());
            } else {
                missing.push(keyword.clone());
            }
        }
        let score = found.len() as f64 / self.keywords.len().max(1) as f64;
        let passed = score >= self.threshold;
        Ok(Grade::new(
            score,
            passed,
            json!({"found": found, "missing": missing, "threshold": self.threshold}),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};

    fn kw(options: serde_json::Value) -> skilleval_model::definition::TestCase {
        case(json!({"evaluation": {"strategy": "keyword_coverage", "options": options}}))
    }

    #[tokio::test]
    async fn all_keywords_found_case_insensitively() {
        let f = Fixture::new();
        let c = kw(json!({"keywords": ["refund", "Order Number", "C++"]}));
        let g = f
            .ok(&c, "Your REFUND for order\nnumber 5 (written in C++).")
            .await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["missing"], json!([]));
        assert_eq!(g.details["threshold"], 1.0);
    }

    #[tokio::test]
    async fn whole_words_only_by_default() {
        let f = Fixture::new();
        let c = kw(json!({"keywords": ["cat", "dog"]}));
        let g = f.ok(&c, "concatenate the dogs").await;
        assert_eq!(g.score, 0.0);
        assert_eq!(g.details["missing"], json!(["cat", "dog"]));
        let c = kw(json!({"keywords": ["cat", "dog"], "matchWholeWord": false}));
        let g = f.ok(&c, "concatenate the dogs").await;
        assert_eq!(g.score, 1.0);
    }

    #[tokio::test]
    async fn threshold_and_case_sensitivity() {
        let f = Fixture::new();
        let c = kw(
            json!({"keywords": ["Alpha", "beta", "gamma"], "caseSensitive": true, "threshold": 0.6}),
        );
        let g = f.ok(&c, "alpha beta gamma").await;
        assert_close(g.score, 2.0 / 3.0);
        assert!(g.passed);
        assert_eq!(g.details["found"], json!(["beta", "gamma"]));
        assert_eq!(g.details["missing"], json!(["Alpha"]));
        let g = f.ok(&c, "beta only").await;
        assert!(!g.passed);
    }

    #[tokio::test]
    async fn unicode_empty_and_huge() {
        let f = Fixture::new();
        let c = kw(json!({"keywords": ["naïve", "CAFÉ", "日本"]}));
        assert_eq!(f.ok(&c, "naïve café 日本").await.score, 1.0);
        // "naïve" is not a whole word inside "naïveté".
        let g = f.ok(&c, "naïveté").await;
        assert_eq!(g.score, 0.0);
        assert_eq!(f.ok(&c, "").await.score, 0.0);
        let c = kw(json!({"keywords": ["amet", "zebra"]}));
        assert_eq!(f.ok(&c, &megabyte_text()).await.score, 0.5);
    }

    #[test]
    fn keywords_are_required() {
        let f = Fixture::new();
        let problems = f.problems(&kw(json!({})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/keywords"]
        );
        let problems = f.problems(&kw(json!({"keywords": []})));
        assert!(problems[0].message.contains("at least one keyword"));
        let problems = f.problems(&kw(json!({"keywords": ["ok", 3, " "]})));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/keywords/1",
                "/testCases/0/evaluation/options/keywords/2"
            ]
        );
    }
}
