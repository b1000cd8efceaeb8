//! `lexical_similarity`: how close the output's text is to `expected.output`, by string
//! similarity (the evaluator seed's lexical similarity evaluator).
//!
//! Options: `algorithm` — `sorensen_dice` (default; bigram overlap, whitespace ignored),
//! `jaro_winkler` or `levenshtein` (normalised: 1 - distance / longer length); `sourceField`
//! (default `output`) and `referenceField` (default `expected.output`): the two texts compared
//! (see `field`); `caseSensitive` (default false); `normalizeWhitespace` (default true);
//! `threshold` (default 0.8, else `evaluation.passingThreshold`). Score = the similarity;
//! passed when it reaches the threshold. Details: `similarity`, `algorithm`, `threshold`,
//! `source_field`, `reference_field`.
//!
//! Sørensen-Dice is computed here over characters (strsim 0.11 divides by byte lengths, which
//! understates similarity for non-ASCII text); Jaro-Winkler and Levenshtein are strsim's. Those
//! two are quadratic, so when the texts are large (more than [`MAX_QUADRATIC_CELLS`] character
//! pairs) the similarity is first bounded from the lengths alone: a bound under the threshold is
//! a certain fail and is reported as is (`"bounded": true`); otherwise the grade is a permanent
//! fault asking for `sorensen_dice`, rather than minutes of CPU.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::field::Field;
use super::options::OptionReader;
use super::text::prepare;
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

/// Largest `chars(output) x chars(expected)` computed by the quadratic algorithms.
pub const MAX_QUADRATIC_CELLS: u64 = 50_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    SorensenDice,
    JaroWinkler,
    Levenshtein,
}

impl Algorithm {
    pub fn parse(name: &str) -> Option<Algorithm> {
        match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "sorensen_dice" | "dice" | "sorensen" => Some(Algorithm::SorensenDice),
            "jaro_winkler" | "jarowinkler" => Some(Algorithm::JaroWinkler),
            "levenshtein" | "normalized_levenshtein" => Some(Algorithm::Levenshtein),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::SorensenDice => "sorensen_dice",
            Algorithm::JaroWinkler => "jaro_winkler",
            Algorithm::Levenshtein => "levenshtein",
        }
    }
}

pub struct LexicalSimilarity;

impl Strategy for LexicalSimilarity {
    fn name(&self) -> &'static str {
        "lexical_similarity"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "lexical_similarity");
        let algorithm = match opts.string("algorithm") {
            None => Algorithm::SorensenDice,
            Some(name) => Algorithm::parse(name).unwrap_or_else(|| {
                opts.option_problem(
                    "algorithm",
                    format!("lexical_similarity: unknown algorithm `{name}`; use sorensen_dice, jaro_winkler or levenshtein"),
                );
                Algorithm::SorensenDice
            }),
        };
        let case_sensitive = opts.bool("caseSensitive", false);
        let normalize_whitespace = opts.bool("normalizeWhitespace", true);
        let threshold = opts.threshold(0.8);
        let source = opts.field("sourceField", Field::Output);
        let reference_field = if opts.has("referenceField") {
            opts.field("referenceField", Field::Expected)
        } else {
            if case.expected.output.is_none() {
                opts.problem(
                    "/expected/output",
                    "lexical_similarity needs expected.output: the reference text (or option `referenceField` naming another)",
                );
            }
            Field::Expected
        };
        // The reference is prepared once when it is the case's own expected output.
        let reference = match (&reference_field, case.expected.output.as_deref()) {
            (Field::Expected, Some(expected)) => {
                let expected = prepare(expected, case_sensitive, normalize_whitespace).into_owned();
                Reference::Fixed {
                    chars: expected.chars().count(),
                    bigrams: match algorithm {
                        Algorithm::SorensenDice => Some(Bigrams::of(&expected)),
                        _ => None,
                    },
                    text: expected,
                }
            }
            _ => Reference::PerOutput(reference_field.clone()),
        };
        opts.finish(Arc::new(LexicalGrader {
            algorithm,
            case_sensitive,
            normalize_whitespace,
            threshold,
            source,
            reference_field,
            reference,
        }) as Arc<dyn Grader>)
    }
}

/// The text compared against.
#[derive(Debug)]
enum Reference {
    /// The case's expected output, prepared once, with its length in characters and (for
    /// Sørensen-Dice) its bigrams.
    Fixed {
        text: String,
        chars: usize,
        bigrams: Option<Bigrams>,
    },
    /// A field read for each output (the prompt, a context value, the output itself).
    PerOutput(Field),
}

#[derive(Debug)]
struct LexicalGrader {
    algorithm: Algorithm,
    case_sensitive: bool,
    normalize_whitespace: bool,
    threshold: f64,
    /// The text graded (option `sourceField`).
    source: Field,
    /// Where the reference comes from (option `referenceField`), for details.
    reference_field: Field,
    reference: Reference,
}

#[async_trait]
impl Grader for LexicalGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let source = self
            .source
            .text(input)
            .map_err(|why| Fault::permanent(format!("lexical_similarity: sourceField: {why}")))?;
        let actual = prepare(&source, self.case_sensitive, self.normalize_whitespace);
        let read: String;
        let (expected, expected_chars, expected_bigrams) = match &self.reference {
            Reference::Fixed {
                text,
                chars,
                bigrams,
            } => (text.as_str(), *chars, bigrams.as_ref()),
            Reference::PerOutput(field) => {
                let text = field.text(input).map_err(|why| {
                    Fault::permanent(format!("lexical_similarity: referenceField: {why}"))
                })?;
                read = prepare(&text, self.case_sensitive, self.normalize_whitespace).into_owned();
                (read.as_str(), read.chars().count(), None)
            }
        };
        let mut bounded = false;
        let similarity = match (self.algorithm, expected_bigrams) {
            (Algorithm::SorensenDice, Some(bigrams)) => bigrams.dice(&Bigrams::of(&actual)),
            (Algorithm::SorensenDice, None) => sorensen_dice(&actual, expected),
            (quadratic, _) => {
                let actual_chars = actual.chars().count();
                let cells = actual_chars as u64 * expected_chars as u64;
                if cells <= MAX_QUADRATIC_CELLS {
                    match quadratic {
                        Algorithm::JaroWinkler => strsim::jaro_winkler(&actual, expected),
                        _ => strsim::normalized_levenshtein(&actual, expected),
                    }
                } else {
                    let bound = length_bound(quadratic, actual_chars, expected_chars);
                    if bound >= self.threshold {
                        return Err(Fault::permanent(format!(
                            "lexical_similarity: {} on {actual_chars} x {expected_chars} characters is more than {MAX_QUADRATIC_CELLS} character pairs; use algorithm sorensen_dice for long texts",
                            quadratic.as_str(),
                        )));
                    }
                    bounded = true;
                    bound
                }
            }
        };
        let passed = similarity >= self.threshold;
        let mut details = json!({
            "similarity": similarity,
            "algorithm": self.algorithm.as_str(),
            "threshold": self.threshold,
            "source_field": self.source.name(),
            "reference_field": self.reference_field.name(),
        });
        if bounded {
            details["bounded"] = json!(true);
        }
        Ok(Grade::new(similarity, passed, details))
    }
}

/// An upper bound of the similarity of texts of these lengths, from the lengths alone.
fn length_bound(algorithm: Algorithm, a: usize, b: usize) -> f64 {
    let (short, long) = if a < b { (a, b) } else { (b, a) };
    if long == 0 {
        return 1.0;
    }
    let ratio = short as f64 / long as f64;
    match algorithm {
        // distance >= long - short, so 1 - distance / long <= short / long.
        Algorithm::Levenshtein => ratio,
        // Jaro: matches <= short, transpositions >= 0; Winkler adds at most 4 x 0.1 of the rest,
        // and only above 0.7.
        _ => {
            let jaro = (1.0 + ratio + 1.0) / 3.0;
            if jaro > 0.7 {
                jaro + 0.4 * (1.0 - jaro)
            } else {
                jaro
            }
        }
    }
}

/// Sørensen-Dice similarity over character bigrams, whitespace ignored (as the seed's
/// `string-similarity` does): 2 |A ∩ B| / (|A| + |B|).
pub fn sorensen_dice(a: &str, b: &str) -> f64 {
    Bigrams::of(a).dice(&Bigrams::of(b))
}

/// The multiset of character bigrams of a text with whitespace removed.
#[derive(Debug, Default)]
struct Bigrams {
    counts: HashMap<(char, char), u32>,
    total: usize,
    /// The text had fewer than two non-space characters: its one character, if any.
    short: Option<Option<char>>,
}

impl Bigrams {
    fn of(text: &str) -> Bigrams {
        let mut chars = text.chars().filter(|c| !c.is_whitespace());
        let Some(mut prev) = chars.next() else {
            return Bigrams {
                short: Some(None),
                ..Bigrams::default()
            };
        };
        let mut counts = HashMap::new();
        let mut total = 0;
        for c in chars {
            *counts.entry((prev, c)).or_insert(0) += 1;
            total += 1;
            prev = c;
        }
        let short = (total == 0).then_some(Some(prev));
        Bigrams {
            counts,
            total,
            short,
        }
    }

    fn dice(&self, other: &Bigrams) -> f64 {
        match (self.short, other.short) {
            // Equal short texts (both empty, or the same single character) are identical.
            (Some(a), Some(b)) => return if a == b { 1.0 } else { 0.0 },
            (Some(_), None) | (None, Some(_)) => return 0.0,
            (None, None) => {}
        }
        let (small, large) = if self.counts.len() <= other.counts.len() {
            (self, other)
        } else {
            (other, self)
        };
        let common: usize = small
            .counts
            .iter()
            .map(|(k, n)| (*n).min(large.counts.get(k).copied().unwrap_or(0)) as usize)
            .sum();
        (2 * common) as f64 / (self.total + other.total) as f64
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};
    use super::*;

    fn lex(expected: &str, options: serde_json::Value) -> TestCase {
        case(json!({
            "expected": {"output": expected},
            "evaluation": {"strategy": "lexical_similarity", "options": options}
        }))
    }

    #[test]
    fn dice_matches_known_values() {
        // strsim's documented values for ASCII.
        assert_eq!(sorensen_dice("", ""), 1.0);
        assert_eq!(sorensen_dice("", "a"), 0.0);
        assert_eq!(sorensen_dice("french", "quebec"), 0.0);
        assert_eq!(sorensen_dice("ferris", "ferris"), 1.0);
        assert_close(sorensen_dice("feris", "ferris"), 0.888_888_888_888_888_8);
        assert_close(
            sorensen_dice("feris", "ferris"),
            strsim::sorensen_dice("feris", "ferris"),
        );
        // Non-ASCII is not penalised: one differing bigram of 3 + 3.
        assert_close(sorensen_dice("日本語だ", "日本語か"), 4.0 / 6.0);
        assert_eq!(sorensen_dice("a", "a"), 1.0);
        assert_eq!(sorensen_dice("a b", "ab"), 1.0);
    }

    #[tokio::test]
    async fn dice_default_with_case_and_whitespace_normalised() {
        let f = Fixture::new();
        let c = lex("The quick brown fox", json!({}));
        let g = f.ok(&c, "the  QUICK brown fox\n").await;
        assert_eq!(g.score, 1.0);
        assert!(g.passed);
        assert_eq!(g.details["algorithm"], "sorensen_dice");
        assert_eq!(g.details["threshold"], 0.8);
        let g = f.ok(&c, "a slow red dog").await;
        assert!(!g.passed);
        assert!(g.score < 0.2, "{}", g.score);
    }

    #[tokio::test]
    async fn levenshtein_and_jaro_winkler() {
        let f = Fixture::new();
        let c = lex(
            "kitten",
            json!({"algorithm": "levenshtein", "threshold": 0.5}),
        );
        let g = f.ok(&c, "sitting").await;
        assert_close(g.score, 1.0 - 3.0 / 7.0);
        assert!(g.passed);
        assert_eq!(g.details["algorithm"], "levenshtein");

        let c = lex(
            "cheeseburger",
            json!({"algorithm": "jaro_winkler", "threshold": 0.9}),
        );
        let g = f.ok(&c, "cheese fries").await;
        assert_close(
            g.score,
            strsim::jaro_winkler("cheeseburger", "cheese fries"),
        );
        assert!((g.score - 0.866).abs() < 0.001);
        assert!(!g.passed);
    }

    #[tokio::test]
    async fn case_sensitive_option_and_passing_threshold_fallback() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"output": "ABC"},
            "evaluation": {"strategy": "lexical_similarity", "passingThreshold": 0.3, "options": {"caseSensitive": true, "algorithm": "levenshtein"}}
        }));
        let g = f.ok(&c, "abc").await;
        assert_eq!(g.score, 0.0);
        assert_eq!(g.details["threshold"], 0.3);
        let g = f.ok(&c, "AbC").await;
        assert_close(g.score, 2.0 / 3.0);
        assert!(g.passed);
    }

    #[tokio::test]
    async fn empty_unicode_and_huge() {
        let f = Fixture::new();
        let c = lex("naïve café 日本", json!({}));
        assert_eq!(f.ok(&c, "NAÏVE CAFÉ 日本").await.score, 1.0);
        let g = f.ok(&c, "").await;
        assert_eq!(g.score, 0.0);
        assert!(!g.passed);
        let big = megabyte_text();
        let g = f.ok(&c, &big).await;
        assert!(!g.passed);
        // Levenshtein on a megabyte against a short reference is computed (few pairs)...
        let c = lex("naïve café 日本", json!({"algorithm": "levenshtein"}));
        let g = f.ok(&c, &big).await;
        assert!(!g.passed);
        assert!(g.score < 0.001);
        assert!(g.details.get("bounded").is_none());
        // ...against a longer one it is bounded from the lengths: a certain fail.
        let reference = "lorem ipsum ".repeat(10);
        for algorithm in ["levenshtein", "jaro_winkler"] {
            let c = lex(&reference, json!({"algorithm": algorithm}));
            let g = f.ok(&c, &big).await;
            assert!(!g.passed, "{algorithm}");
            assert_eq!(g.details["bounded"], true, "{algorithm}");
            assert!(g.score <= 0.7, "{algorithm}: {}", g.score);
        }
        // Two large texts of similar length: refused, not computed for minutes.
        let long = "abcdefghij".repeat(2000);
        let c = lex(&long, json!({"algorithm": "levenshtein", "threshold": 0.5}));
        let fault = f.grade(&c, &format!("{long}xyz")).await.unwrap_err();
        assert!(fault.to_string().contains("sorensen_dice"), "{fault}");
    }

    #[test]
    fn problems() {
        let f = Fixture::new();
        let c = case(
            json!({"evaluation": {"strategy": "lexical_similarity", "options": {"algorithm": "cosine", "threshold": 1.5}}}),
        );
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/algorithm",
                "/testCases/0/evaluation/options/threshold",
                "/testCases/0/expected/output",
            ]
        );
        assert!(problems[0].message.contains("unknown algorithm `cosine`"));
        assert!(problems[1].message.contains("between 0 and 1"));
    }

    #[tokio::test]
    async fn source_and_reference_fields() {
        let f = Fixture::new();
        // The context's draft against the expected output. Bigrams (whitespace removed):
        // "night" = ni ig gh ht, "nacht" = na ac ch ht; one in common:
        // 2 x 1 / (4 + 4) = 0.25.
        let c = case(json!({
            "input": {"prompt": "p", "context": {"draft": "night", "reference": "nigh"}},
            "expected": {"output": "nacht"},
            "evaluation": {"strategy": "lexical_similarity", "options": {"sourceField": "input.context.draft"}}
        }));
        let g = f.ok(&c, "ignored").await;
        assert_close(g.score, 0.25);
        assert!(!g.passed);
        assert_eq!(g.details["source_field"], "input.context.draft");
        assert_eq!(g.details["reference_field"], "expected.output");

        // The output against a context value, no expected output needed. "nigh" = ni ig gh,
        // all three in "night": 2 x 3 / (4 + 3) = 6/7.
        let c = case(json!({
            "input": {"prompt": "p", "context": {"reference": "nigh"}},
            "evaluation": {"strategy": "lexical_similarity", "options": {"referenceField": "context.reference"}}
        }));
        let g = f.ok(&c, "night").await;
        assert_close(g.score, 6.0 / 7.0);
        assert!(g.passed);
        assert_eq!(g.details["reference_field"], "input.context.reference");

        // A path the case's context lacks: the case errors, naming the path.
        let c = case(json!({
            "input": {"prompt": "p", "context": {"other": 1}},
            "evaluation": {"strategy": "lexical_similarity", "options": {"referenceField": "context.reference"}}
        }));
        let fault = f.grade(&c, "night").await.unwrap_err();
        assert!(
            fault.to_string().contains("referenceField")
                && fault.to_string().contains("input.context.reference"),
            "{fault}"
        );
    }

    #[tokio::test]
    async fn case_and_whitespace_normalisation_against_the_prompt() {
        let f = Fixture::new();
        let with = |options: serde_json::Value| {
            let mut o = json!({"algorithm": "levenshtein", "referenceField": "prompt"});
            o.as_object_mut()
                .unwrap()
                .extend(options.as_object().unwrap().clone());
            case(json!({
                "input": {"prompt": "hello world!"},
                "evaluation": {"strategy": "lexical_similarity", "options": o}
            }))
        };
        // Defaults (case folded, whitespace collapsed): "hello world" vs "hello world!",
        // one insertion over 12 characters: 1 - 1/12.
        let g = f.ok(&with(json!({})), "Hello   World").await;
        assert_close(g.score, 1.0 - 1.0 / 12.0);
        // Whitespace kept: "hello   world" (13) vs "hello world!" (12): two spaces deleted,
        // "!" inserted: 1 - 3/13.
        let g = f
            .ok(
                &with(json!({"normalizeWhitespace": false})),
                "Hello   World",
            )
            .await;
        assert_close(g.score, 1.0 - 3.0 / 13.0);
        // Case kept too: "Hello World" vs "hello world!": h/H and w/W substituted, "!"
        // inserted: 1 - 3/12.
        let g = f
            .ok(&with(json!({"caseSensitive": true})), "Hello World")
            .await;
        assert_close(g.score, 1.0 - 3.0 / 12.0);
    }

    #[test]
    fn field_problems_name_the_option() {
        let f = Fixture::new();
        let problems = f.problems(&case(json!({
            "expected": {"output": "x"},
            "evaluation": {"strategy": "lexical_similarity", "options": {"sourceField": "answer", "referenceField": 3}}
        })));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/sourceField",
                "/testCases/0/evaluation/options/referenceField",
            ]
        );
        assert!(problems[0].message.contains("unknown field `answer`"));
        assert!(problems[1].message.contains("must be a string"));
        let problems = f.problems(&case(json!({
            "evaluation": {"strategy": "lexical_similarity", "options": {"referenceField": "groundTruth"}}
        })));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/referenceField"]
        );
        assert!(problems[0].message.contains("reads expected.output"));
    }

    #[test]
    fn length_bounds() {
        assert_eq!(length_bound(Algorithm::Levenshtein, 10, 100), 0.1);
        assert!(length_bound(Algorithm::JaroWinkler, 1, 1_000_000) < 0.7);
        assert_eq!(length_bound(Algorithm::Levenshtein, 0, 0), 1.0);
    }
}
