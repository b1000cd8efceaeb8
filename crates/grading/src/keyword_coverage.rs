//! `keyword_coverage`: the fraction of a list of keywords that a text mentions (the evaluator
//! seed's keyword coverage evaluator).
//!
//! Options: `keywordsSource` — where the keywords come from: `config` (default: option
//! `keywords`, an array of strings), `groundTruth` (the case's `expected.output`, split at
//! commas and line breaks) or `input.context.<path>` (a value of the case's context, read per
//! output: an array of strings, or a string split like `groundTruth`'s; plain `context` means
//! `input.context.keywords`); `sourceField` (default `output`: the text searched, see
//! `field`); `caseSensitive` (default false); `matchWholeWord` (default true: word boundaries
//! at the keyword's word-character ends, so `cat` is not found in `concatenate` but `C++` is
//! found in `C++ code`); `normalizeWhitespace` (default true: whitespace inside a keyword
//! matches any run of whitespace; false: exactly as written); `threshold` (default 1.0, else
//! `evaluation.passingThreshold`). Keywords known at compile time are compiled once into one
//! regex set, matched in one pass. Score = found / keywords; passed when it reaches the
//! threshold. Details: `found`, `missing`, `threshold`, `source_field`, `keywords_source`.

use std::sync::Arc;

use async_trait::async_trait;
use regex::RegexSet;
use serde_json::{json, Value};

use super::field::Field;
use super::options::OptionReader;
use super::text::{keyword_pattern, user_regex_set};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

/// Where the keywords come from (option `keywordsSource`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Config,
    GroundTruth,
    /// A path inside `input.context`.
    Context(Vec<String>),
}

impl Source {
    fn parse(name: &str) -> Option<Source> {
        match name.trim() {
            "config" => Some(Source::Config),
            "groundTruth" | "expected.output" | "expected" => Some(Source::GroundTruth),
            "context" => Some(Source::Context(vec!["keywords".to_string()])),
            other => match Field::parse(other) {
                Ok(Field::Context(path)) => Some(Source::Context(path)),
                _ => None,
            },
        }
    }

    fn name(&self) -> String {
        match self {
            Source::Config => "config".to_string(),
            Source::GroundTruth => "groundTruth".to_string(),
            Source::Context(path) => Field::Context(path.clone()).name(),
        }
    }
}

/// Keywords written in one string: split at commas and line breaks, trimmed, empty ones
/// dropped.
fn split_keywords(text: &str) -> Vec<String> {
    text.split([',', '\n'])
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .map(str::to_string)
        .collect()
}

/// How keywords become patterns: the matching options.
#[derive(Debug, Clone, Copy)]
struct Matching {
    case_sensitive: bool,
    whole_word: bool,
    normalize_whitespace: bool,
}

impl Matching {
    fn compile(self, keywords: &[String]) -> Result<RegexSet, regex::Error> {
        let patterns: Vec<String> = keywords
            .iter()
            .map(|k| keyword_pattern(k, self.whole_word, self.normalize_whitespace))
            .collect();
        user_regex_set(&patterns, !self.case_sensitive)
    }
}

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
        let matching = Matching {
            case_sensitive: opts.bool("caseSensitive", false),
            whole_word: opts.bool("matchWholeWord", true),
            normalize_whitespace: opts.bool("normalizeWhitespace", true),
        };
        let threshold = opts.threshold(1.0);
        let source_field = opts.field("sourceField", Field::Output);
        let source = match opts.string("keywordsSource") {
            None => Source::Config,
            Some(name) => Source::parse(name).unwrap_or_else(|| {
                opts.option_problem(
                    "keywordsSource",
                    format!("keyword_coverage: option `keywordsSource` must be `config`, `groundTruth` or `input.context.<path>`, not `{name}`"),
                );
                Source::Config
            }),
        };
        let keywords = match &source {
            Source::Config => Some(config_keywords(&mut opts)),
            Source::GroundTruth | Source::Context(_) if opts.has("keywords") => {
                opts.option_problem(
                    "keywords",
                    format!(
                        "keyword_coverage: option `keywords` is read only when keywordsSource is `config`, and this case's is `{}`",
                        source.name()
                    ),
                );
                None
            }
            Source::GroundTruth => match case.expected.output.as_deref() {
                None => {
                    opts.problem(
                        "/expected/output",
                        "keyword_coverage: keywordsSource `groundTruth` reads the keywords from expected.output, which this case does not set",
                    );
                    None
                }
                Some(text) => {
                    let keywords = split_keywords(text);
                    if keywords.is_empty() {
                        opts.problem(
                            "/expected/output",
                            "keyword_coverage: keywordsSource `groundTruth` found no keyword in expected.output (keywords are separated by commas or line breaks)",
                        );
                    }
                    Some(keywords)
                }
            },
            Source::Context(_) => None,
        };
        let fixed = match keywords {
            Some(keywords) if !keywords.is_empty() => match matching.compile(&keywords) {
                Ok(set) => Some(Fixed {
                    set,
                    keywords: keywords.into_iter().map(Value::String).collect(),
                }),
                Err(e) => {
                    opts.option_problem(
                        "keywords",
                        format!("keyword_coverage: keywords cannot be compiled: {e}"),
                    );
                    None
                }
            },
            _ => None,
        };
        if !opts.problems.is_empty() {
            return Err(opts.problems);
        }
        let keywords = match (fixed, &source) {
            (Some(fixed), _) => Keywords::Fixed(fixed),
            (None, Source::Context(path)) => Keywords::PerOutput(path.clone()),
            // Unreachable without a problem above; reported as one rather than a panic.
            (None, _) => {
                opts.option_problem("keywords", "keyword_coverage: no keywords");
                return Err(opts.problems);
            }
        };
        Ok(Arc::new(KeywordGrader {
            keywords,
            matching,
            threshold,
            source_field,
            source_name: source.name(),
        }))
    }
}

/// Option `keywords`, required when the keywords come from the configuration.
fn config_keywords(opts: &mut OptionReader<'_, '_>) -> Vec<String> {
    match opts.string_list("keywords") {
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
                    "keyword_coverage needs option `keywords`: an array of the words the output must mention (or option `keywordsSource`)",
                );
            }
            Vec::new()
        }
    }
}

/// Keywords compiled once.
#[derive(Debug)]
struct Fixed {
    /// One pattern per keyword, in order.
    set: RegexSet,
    keywords: Vec<Value>,
}

#[derive(Debug)]
enum Keywords {
    Fixed(Fixed),
    /// Read from this path of the case's context for each output, compiled then.
    PerOutput(Vec<String>),
}

#[derive(Debug)]
struct KeywordGrader {
    keywords: Keywords,
    matching: Matching,
    threshold: f64,
    source_field: Field,
    source_name: String,
}

impl KeywordGrader {
    /// The keywords a context value holds: an array of strings, or one string split.
    fn context_keywords(&self, path: &[String], input: &GradeInput<'_>) -> Result<Fixed, Fault> {
        let name = Field::Context(path.to_vec()).name();
        let fault =
            |why: String| Fault::permanent(format!("keyword_coverage: keywordsSource: {why}"));
        let keywords = match Field::context_value(path, input.context) {
            None => {
                return Err(fault(format!(
                    "`{name}` names nothing in this case's input.context"
                )))
            }
            Some(Value::String(s)) => split_keywords(s),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for item in items {
                    match item.as_str().map(str::trim) {
                        Some("") => {}
                        Some(k) => out.push(k.to_string()),
                        None => {
                            return Err(fault(format!(
                                "`{name}` must hold strings, not {}",
                                super::options::describe(item)
                            )))
                        }
                    }
                }
                out
            }
            Some(other) => {
                return Err(fault(format!(
                    "`{name}` must be an array of strings or a string, not {}",
                    super::options::describe(other)
                )))
            }
        };
        if keywords.is_empty() {
            return Err(fault(format!("`{name}` holds no keyword")));
        }
        let set = self
            .matching
            .compile(&keywords)
            .map_err(|e| fault(format!("`{name}`: keywords cannot be compiled: {e}")))?;
        Ok(Fixed {
            set,
            keywords: keywords.into_iter().map(Value::String).collect(),
        })
    }
}

#[async_trait]
impl Grader for KeywordGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let read;
        let fixed = match &self.keywords {
            Keywords::Fixed(fixed) => fixed,
            Keywords::PerOutput(path) => {
                read = self.context_keywords(path, input)?;
                &read
            }
        };
        let text = self
            .source_field
            .text(input)
            .map_err(|why| Fault::permanent(format!("keyword_coverage: sourceField: {why}")))?;
        let matches = fixed.set.matches(&text);
        let mut found = Vec::with_capacity(fixed.keywords.len());
        let mut missing = Vec::new();
        for (i, keyword) in fixed.keywords.iter().enumerate() {
            if matches.matched(i) {
                found.push(keyword.clone());
            } else {
                missing.push(keyword.clone());
            }
        }
        let score = found.len() as f64 / fixed.keywords.len().max(1) as f64;
        let passed = score >= self.threshold;
        Ok(Grade::new(
            score,
            passed,
            json!({
                "found": found,
                "missing": missing,
                "threshold": self.threshold,
                "source_field": self.source_field.name(),
                "keywords_source": self.source_name,
            }),
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

    #[tokio::test]
    async fn keywords_from_ground_truth_with_whitespace_normalisation() {
        let f = Fixture::new();
        let c = |options: serde_json::Value| {
            let mut o = json!({"keywordsSource": "groundTruth"});
            o.as_object_mut()
                .unwrap()
                .extend(options.as_object().unwrap().clone());
            case(json!({
                "expected": {"output": "refund, order number\nlabel,"},
                "evaluation": {"strategy": "keyword_coverage", "options": o}
            }))
        };
        // Keywords: "refund", "order number", "label" (split at the comma and the line
        // break, the empty last one dropped). The output has "refund" and "order  number"
        // (two spaces, which the default normalisation matches): 2 of 3.
        let out = "Your refund for the order  number is here";
        let g = f.ok(&c(json!({})), out).await;
        assert_close(g.score, 2.0 / 3.0);
        assert!(!g.passed, "the default threshold is 1.0");
        assert_eq!(g.details["missing"], json!(["label"]));
        assert_eq!(g.details["keywords_source"], "groundTruth");
        // Whitespace as written: "order number" (one space) is not in the output: 1 of 3.
        let g = f.ok(&c(json!({"normalizeWhitespace": false})), out).await;
        assert_close(g.score, 1.0 / 3.0);
        assert_eq!(g.details["found"], json!(["refund"]));
        // Case-sensitive and not whole-word: "Refund" misses, "label" is found in
        // "labelled": 2 of 3 ("order number" still found).
        let g = f
            .ok(
                &c(json!({"caseSensitive": true, "matchWholeWord": false})),
                "Refund: order number labelled",
            )
            .await;
        assert_close(g.score, 2.0 / 3.0);
        assert_eq!(g.details["missing"], json!(["refund"]));
    }

    #[tokio::test]
    async fn keywords_and_text_from_the_context() {
        let f = Fixture::new();
        let c = |context: serde_json::Value, options: serde_json::Value| {
            case(json!({
                "input": {"prompt": "p", "context": context},
                "evaluation": {"strategy": "keyword_coverage", "options": options}
            }))
        };
        // An array of keywords at a path: both found, case folded: 2 of 2.
        let case_a = c(
            json!({"must": ["alpha", "Beta"]}),
            json!({"keywordsSource": "context.must"}),
        );
        let g = f.ok(&case_a, "ALPHA beta gamma").await;
        assert_eq!(g.score, 1.0);
        assert!(g.passed);
        assert_eq!(g.details["keywords_source"], "input.context.must");
        // Plain `context` reads input.context.keywords; a string is split at commas:
        // "alpha", "delta"; only "alpha" is in the output: 1 of 2.
        let case_b = c(
            json!({"keywords": "alpha, delta"}),
            json!({"keywordsSource": "context", "threshold": 0.5}),
        );
        let g = f.ok(&case_b, "alpha beta").await;
        assert_close(g.score, 0.5);
        assert!(g.passed);
        // The text searched is a context value, not the output: "a reply about beta" has
        // "beta" of ["beta", "gamma"]: 1 of 2.
        let case_c = c(
            json!({"reply": "a reply about beta"}),
            json!({"keywords": ["beta", "gamma"], "sourceField": "input.context.reply"}),
        );
        let g = f.ok(&case_c, "gamma gamma").await;
        assert_close(g.score, 0.5);
        assert_eq!(g.details["source_field"], "input.context.reply");
        // A path the context lacks, or a value of the wrong type: the case errors.
        let fault = f
            .grade(
                &c(json!({}), json!({"keywordsSource": "context.must"})),
                "x",
            )
            .await
            .unwrap_err();
        assert!(fault.to_string().contains("input.context.must"), "{fault}");
        let fault = f
            .grade(
                &c(
                    json!({"must": [1]}),
                    json!({"keywordsSource": "context.must"}),
                ),
                "x",
            )
            .await
            .unwrap_err();
        assert!(fault.to_string().contains("must hold strings"), "{fault}");
    }

    #[test]
    fn keyword_source_problems_name_the_option() {
        let f = Fixture::new();
        let problems = f.problems(&kw(json!({"keywordsSource": "database"})));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/keywordsSource",
                "/testCases/0/evaluation/options/keywords"
            ]
        );
        assert!(problems[0].message.contains("not `database`"));
        let problems = f.problems(&kw(
            json!({"keywordsSource": "groundTruth", "keywords": ["a"]}),
        ));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/keywords"]
        );
        assert!(problems[0]
            .message
            .contains("only when keywordsSource is `config`"));
        let problems = f.problems(&kw(json!({"keywordsSource": "groundTruth"})));
        assert_eq!(pointers(&problems), vec!["/testCases/0/expected/output"]);
        let problems = f.problems(&case(json!({
            "expected": {"output": " , \n"},
            "evaluation": {"strategy": "keyword_coverage", "options": {"keywordsSource": "groundTruth"}}
        })));
        assert!(problems[0].message.contains("found no keyword"));
        let problems = f.problems(&kw(
            json!({"keywords": ["a"], "sourceField": "input.context"}),
        ));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/sourceField"]
        );
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
