//! `sentiment`: is the output's tone what the case wants? (the evaluator seed's sentiment
//! evaluator, AFINN-style).
//!
//! Each word found in the built-in lexicon ([`super::sentiment_lexicon`]) adds its valence
//! (-5..5); a negator (`not`, `never`, `don't`...) flips the valence of a lexicon word up to two
//! words later in the same clause (`not good`, `not very good`; clauses end at `. , ; : ! ?`).
//! `comparative` = sum / number of words; the normalised sentiment score is
//! `(clamp(comparative, -5, 5) + 5) / 10`, in [0, 1] with 0.5 neutral. The category is
//! `positive` when comparative > 0.05, `negative` when < -0.05, else `neutral` (one
//! clearly-valenced word in ~40 tips a text); options `positiveThreshold` and
//! `negativeThreshold` move those cut-offs.
//!
//! Option `outputType` says which measure the case judges (the seed's three output types):
//! `comparativeNormalized` (default: the normalised score, in [0, 1]), `rawScore` (`total`, the
//! sum of valences, unbounded) or `category`. The case says what it wants with option
//! `expected` (`positive`, `negative`, `neutral`) and/or `min`/`max` bounds on that measure (not
//! with `category`, which needs `expected`). `sourceField` (default `output`) names the text
//! read (see `field`). Score is 1 when every wanted condition holds, else 0 (the measured
//! sentiment is in the details); passed likewise. Details: `output_type`, `value` (the judged
//! measure), `score` (normalised), `comparative`, `category`, `total`, `words` (the scored
//! words, at most 50), `source_field`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::field::Field;
use super::options::OptionReader;
use super::sentiment_lexicon::{is_negator, valence};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

/// Default comparative cut-offs for the categories.
pub const POSITIVE_THRESHOLD: f64 = 0.05;
pub const NEGATIVE_THRESHOLD: f64 = -0.05;
/// Most scored words listed in details.
const MAX_LISTED_WORDS: usize = 50;
/// How many words after a negator it still applies to.
const NEGATION_REACH: u8 = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Category {
    Positive,
    Negative,
    Neutral,
}

impl Category {
    pub fn parse(s: &str) -> Option<Category> {
        match s.trim().to_ascii_lowercase().as_str() {
            "positive" => Some(Category::Positive),
            "negative" => Some(Category::Negative),
            "neutral" => Some(Category::Neutral),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Positive => "positive",
            Category::Negative => "negative",
            Category::Neutral => "neutral",
        }
    }
}

/// Which measure of the sentiment a case judges (option `outputType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputType {
    /// `(clamp(comparative, -5, 5) + 5) / 10`, in [0, 1].
    ComparativeNormalized,
    /// The sum of the valences.
    RawScore,
    /// `positive`, `negative` or `neutral`, by the thresholds on `comparative`.
    Category,
}

impl OutputType {
    pub fn parse(s: &str) -> Option<OutputType> {
        match s.trim() {
            "comparativeNormalized" => Some(OutputType::ComparativeNormalized),
            "rawScore" => Some(OutputType::RawScore),
            "category" => Some(OutputType::Category),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            OutputType::ComparativeNormalized => "comparativeNormalized",
            OutputType::RawScore => "rawScore",
            OutputType::Category => "category",
        }
    }
}

/// The sentiment of a text.
#[derive(Debug, Clone, PartialEq)]
pub struct Analysis {
    /// Sum of the valences of the scored words (after negation).
    pub total: i64,
    /// Number of words in the text.
    pub words: usize,
    /// `total / words` (0 for no words).
    pub comparative: f64,
    /// Scored words with the valence they contributed, in order.
    pub scored: Vec<(String, i64)>,
}

impl Analysis {
    /// `(clamp(comparative, -5, 5) + 5) / 10`.
    pub fn normalized(&self) -> f64 {
        (self.comparative.clamp(-5.0, 5.0) + 5.0) / 10.0
    }

    pub fn category(&self, positive: f64, negative: f64) -> Category {
        if self.comparative > positive {
            Category::Positive
        } else if self.comparative < negative {
            Category::Negative
        } else {
            Category::Neutral
        }
    }
}

/// Scores `text` with the built-in lexicon.
pub fn analyze(text: &str) -> Analysis {
    let mut total = 0i64;
    let mut words = 0usize;
    let mut scored = Vec::new();
    let mut negation_left = 0u8;
    let mut token = String::new();

    let mut flush = |token: &mut String, negation_left: &mut u8| {
        let word = token.trim_matches('\'');
        if word.is_empty() {
            token.clear();
            return;
        }
        words += 1;
        if is_negator(word) {
            *negation_left = NEGATION_REACH;
        } else {
            if let Some(v) = valence(word) {
                let v = i64::from(v);
                let v = if *negation_left > 0 { -v } else { v };
                total += v;
                scored.push((word.to_string(), v));
            }
            *negation_left = negation_left.saturating_sub(1);
        }
        token.clear();
    };

    for c in text.chars() {
        if c.is_alphanumeric() {
            token.extend(c.to_lowercase());
        } else if c == '\'' || c == '\u{2019}' {
            token.push('\'');
        } else {
            flush(&mut token, &mut negation_left);
            if matches!(c, '.' | ',' | ';' | ':' | '!' | '?' | '\n') {
                negation_left = 0;
            }
        }
    }
    flush(&mut token, &mut negation_left);

    let comparative = if words == 0 {
        0.0
    } else {
        total as f64 / words as f64
    };
    Analysis {
        total,
        words,
        comparative,
        scored,
    }
}

pub struct Sentiment;

impl Strategy for Sentiment {
    fn name(&self) -> &'static str {
        "sentiment"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "sentiment");
        let expected = match opts.string("expected") {
            None => None,
            Some(s) => {
                match Category::parse(s) {
                    Some(c) => Some(c),
                    None => {
                        opts.option_problem(
                        "expected",
                        format!("sentiment: unknown category `{s}`; use positive, negative or neutral"),
                    );
                        None
                    }
                }
            }
        };
        let output_type = match opts.string("outputType") {
            None => OutputType::ComparativeNormalized,
            Some(s) => OutputType::parse(s).unwrap_or_else(|| {
                opts.option_problem(
                    "outputType",
                    format!("sentiment: option `outputType` must be `comparativeNormalized`, `rawScore` or `category`, not `{s}`"),
                );
                OutputType::ComparativeNormalized
            }),
        };
        let source = opts.field("sourceField", Field::Output);
        let (min, max) = match output_type {
            OutputType::ComparativeNormalized => (opts.unit("min"), opts.unit("max")),
            OutputType::RawScore => (opts.f64("min"), opts.f64("max")),
            OutputType::Category => {
                for key in ["min", "max"] {
                    if opts.has(key) {
                        opts.option_problem(
                            key,
                            format!("sentiment: option `{key}` bounds a number, and outputType `category` judges a category: set `expected` instead"),
                        );
                    }
                }
                if !opts.has("expected") {
                    opts.problem(
                        "/evaluation/options/expected",
                        "sentiment: outputType `category` needs option `expected` (positive, negative or neutral)",
                    );
                }
                (None, None)
            }
        };
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                opts.option_problem(
                    "min",
                    format!("sentiment: min ({lo}) must not be above max ({hi})"),
                );
            }
        }
        let positive = opts.f64("positiveThreshold").unwrap_or(POSITIVE_THRESHOLD);
        let negative = opts.f64("negativeThreshold").unwrap_or(NEGATIVE_THRESHOLD);
        if negative > positive {
            opts.option_problem(
                "negativeThreshold",
                format!("sentiment: negativeThreshold ({negative}) must not be above positiveThreshold ({positive})"),
            );
        }
        if expected.is_none() && min.is_none() && max.is_none() && opts.problems.is_empty() {
            opts.problem(
                "/evaluation/options/expected",
                "sentiment needs option `expected` (positive, negative or neutral) or `min`/`max` bounds on the measure `outputType` names",
            );
        }
        opts.finish(Arc::new(SentimentGrader {
            output_type,
            source,
            expected,
            min,
            max,
            positive,
            negative,
        }) as Arc<dyn Grader>)
    }
}

#[derive(Debug)]
struct SentimentGrader {
    output_type: OutputType,
    /// The text read (option `sourceField`).
    source: Field,
    expected: Option<Category>,
    /// Bounds on the measure `output_type` names (never set for `category`).
    min: Option<f64>,
    max: Option<f64>,
    positive: f64,
    negative: f64,
}

#[async_trait]
impl Grader for SentimentGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let text = self
            .source
            .text(input)
            .map_err(|why| Fault::permanent(format!("sentiment: sourceField: {why}")))?;
        let analysis = analyze(&text);
        let normalized = analysis.normalized();
        let category = analysis.category(self.positive, self.negative);
        let (measure, value) = match self.output_type {
            OutputType::ComparativeNormalized => (Some(normalized), json!(normalized)),
            OutputType::RawScore => (Some(analysis.total as f64), json!(analysis.total)),
            OutputType::Category => (None, json!(category.as_str())),
        };
        let passed = self.expected.is_none_or(|want| want == category)
            && measure.is_none_or(|m| {
                self.min.is_none_or(|lo| m >= lo) && self.max.is_none_or(|hi| m <= hi)
            });
        let words: Vec<Value> = analysis
            .scored
            .iter()
            .take(MAX_LISTED_WORDS)
            .map(|(w, v)| json!({"word": w, "valence": v}))
            .collect();
        let details = json!({
            "output_type": self.output_type.as_str(),
            "value": value,
            "score": normalized,
            "comparative": analysis.comparative,
            "category": category.as_str(),
            "total": analysis.total,
            "word_count": analysis.words,
            "words": words,
            "expected": self.expected.map(Category::as_str),
            "min": self.min,
            "max": self.max,
            "thresholds": {"positive": self.positive, "negative": self.negative},
            "source_field": self.source.name(),
        });
        Ok(Grade::new(if passed { 1.0 } else { 0.0 }, passed, details))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};
    use super::*;

    fn senti(options: serde_json::Value) -> TestCase {
        case(json!({"evaluation": {"strategy": "sentiment", "options": options}}))
    }

    #[test]
    fn analysis_sums_valences_and_negates() {
        let a = analyze("This is a good product");
        assert_eq!(a.total, 3);
        assert_eq!(a.words, 5);
        assert_close(a.comparative, 0.6);
        assert_close(a.normalized(), 0.56);
        assert_eq!(
            a.category(POSITIVE_THRESHOLD, NEGATIVE_THRESHOLD),
            Category::Positive
        );

        let a = analyze("This is not good.");
        assert_eq!(a.total, -3);
        assert_eq!(a.scored, vec![("good".to_string(), -3)]);

        let a = analyze("It is not very good");
        assert_eq!(a.total, -3);
        // Negation stops at a clause break.
        let a = analyze("Not now, good work");
        assert_eq!(a.total, 3);
        // "no problem" reads as mildly positive.
        assert_eq!(analyze("No problem!").total, 2);
        // Curly apostrophes are negators too.
        assert_eq!(analyze("I don\u{2019}t love it").total, -3);
    }

    #[test]
    fn neutral_and_empty_text() {
        let a = analyze("");
        assert_eq!((a.total, a.words, a.comparative), (0, 0, 0.0));
        assert_eq!(a.normalized(), 0.5);
        assert_eq!(
            a.category(POSITIVE_THRESHOLD, NEGATIVE_THRESHOLD),
            Category::Neutral
        );
        let a = analyze("The meeting is at 5pm in room 12 on Tuesday");
        assert_eq!(
            a.category(POSITIVE_THRESHOLD, NEGATIVE_THRESHOLD),
            Category::Neutral
        );
    }

    #[tokio::test]
    async fn expected_category() {
        let f = Fixture::new();
        let c = senti(json!({"expected": "positive"}));
        let g = f
            .ok(
                &c,
                "Thanks so much, this was a wonderful and helpful answer!",
            )
            .await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["category"], "positive");
        assert_eq!(g.details["total"], 2 + 4 + 2);
        let g = f
            .ok(&c, "Unfortunately the update failed and the app is broken.")
            .await;
        assert!(!g.passed);
        assert_eq!(g.score, 0.0);
        assert_eq!(g.details["category"], "negative");
        assert_eq!(
            g.details["words"][0],
            json!({"word": "unfortunately", "valence": -2})
        );
    }

    #[tokio::test]
    async fn range_on_normalised_score() {
        let f = Fixture::new();
        let c = senti(json!({"min": 0.45, "max": 0.55}));
        // Neutral text: 0.5.
        assert!(f.ok(&c, "The report lists three items.").await.passed);
        // "awful!" alone: comparative -3 -> 0.2.
        let g = f.ok(&c, "awful!").await;
        assert!(!g.passed);
        assert_close(g.details["score"].as_f64().unwrap(), 0.2);
    }

    #[tokio::test]
    async fn unicode_empty_and_huge() {
        let f = Fixture::new();
        let c = senti(json!({"expected": "neutral"}));
        assert!(f.ok(&c, "").await.passed);
        assert!(f.ok(&c, "naïve café 日本").await.passed);
        let g = f.ok(&c, &megabyte_text()).await;
        assert!(g.passed);
        assert_eq!(g.details["words"].as_array().unwrap().len(), 0);
        let big_positive = "great ".repeat(200_000);
        let g = f
            .ok(&senti(json!({"expected": "positive"})), &big_positive)
            .await;
        assert!(g.passed);
        assert_eq!(g.details["words"].as_array().unwrap().len(), 50);
    }

    #[tokio::test]
    async fn raw_score_output_type_bounds_the_sum() {
        let f = Fixture::new();
        let c = senti(json!({"outputType": "rawScore", "min": 2, "max": 5}));
        // good (3) + good (3) + bad (-3) = 3, inside [2, 5].
        let g = f.ok(&c, "good good bad").await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.details["value"], 3);
        assert_eq!(g.details["output_type"], "rawScore");
        // bad (-3) + bad (-3) = -6, under 2.
        let g = f.ok(&c, "bad bad").await;
        assert!(!g.passed);
        assert_eq!(g.details["value"], -6);
        // Raw bounds are not limited to [0, 1]: -7..-5 holds -6.
        let c = senti(json!({"outputType": "rawScore", "min": -7, "max": -5}));
        assert!(f.ok(&c, "bad bad").await.passed);
    }

    #[tokio::test]
    async fn comparative_normalized_output_type_bounds_the_normalised_score() {
        let f = Fixture::new();
        // "good day": total 3 over 2 words, comparative 1.5, normalised (1.5 + 5) / 10 = 0.65.
        let c = senti(json!({"outputType": "comparativeNormalized", "min": 0.6}));
        let g = f.ok(&c, "good day").await;
        assert!(g.passed);
        assert_close(g.details["value"].as_f64().unwrap(), 0.65);
        let c = senti(json!({"min": 0.7}));
        let g = f.ok(&c, "good day").await;
        assert!(!g.passed);
        assert_eq!(g.details["output_type"], "comparativeNormalized");
    }

    #[tokio::test]
    async fn category_output_type_with_thresholds() {
        let f = Fixture::new();
        // "good" among ten words: comparative 3 / 10 = 0.3, over the default 0.05: positive.
        let text = "the report is good and lists three items for tuesday";
        let c = senti(json!({"outputType": "category", "expected": "positive"}));
        let g = f.ok(&c, text).await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.details["value"], "positive");
        assert_close(g.details["comparative"].as_f64().unwrap(), 0.3);
        // With the positive cut-off at 0.5, 0.3 is neutral.
        let c = senti(
            json!({"outputType": "category", "expected": "neutral", "positiveThreshold": 0.5}),
        );
        let g = f.ok(&c, text).await;
        assert!(g.passed);
        assert_eq!(g.details["value"], "neutral");
        // "this is not good": negated good (-3) over 4 words, comparative -0.75: negative
        // by default, neutral when the negative cut-off is -1.
        let c = senti(json!({"outputType": "category", "expected": "negative"}));
        assert!(f.ok(&c, "this is not good").await.passed);
        let c = senti(
            json!({"outputType": "category", "expected": "neutral", "negativeThreshold": -1}),
        );
        assert!(f.ok(&c, "this is not good").await.passed);
    }

    #[tokio::test]
    async fn source_field_reads_the_context() {
        let f = Fixture::new();
        let c = case(json!({
            "input": {"prompt": "p", "context": {"reply": "terrible"}},
            "evaluation": {"strategy": "sentiment", "options": {"expected": "negative", "sourceField": "context.reply"}}
        }));
        // The output is positive; the context's reply ("terrible", -3) is what is judged.
        let g = f.ok(&c, "wonderful").await;
        assert!(g.passed);
        assert_eq!(g.details["total"], -3);
        assert_eq!(g.details["source_field"], "input.context.reply");
    }

    #[test]
    fn output_type_problems() {
        let f = Fixture::new();
        let problems = f.problems(&senti(
            json!({"outputType": "stars", "expected": "positive"}),
        ));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/outputType"]
        );
        assert!(problems[0].message.contains("not `stars`"));
        let problems = f.problems(&senti(json!({"outputType": "category", "min": 0.2})));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/min",
                "/testCases/0/evaluation/options/expected"
            ]
        );
        assert!(problems[0].message.contains("outputType `category`"));
        let problems = f.problems(&senti(
            json!({"outputType": "rawScore", "min": 5, "max": 2}),
        ));
        assert!(problems[0].message.contains("must not be above max"));
    }

    #[test]
    fn problems() {
        let f = Fixture::new();
        let problems = f.problems(&senti(json!({})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/expected"]
        );
        let problems = f.problems(&senti(json!({"expected": "happy", "min": 2})));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/expected",
                "/testCases/0/evaluation/options/min"
            ]
        );
        assert!(problems[0].message.contains("unknown category `happy`"));
        let problems = f.problems(&senti(json!({"min": 0.8, "max": 0.2})));
        assert!(problems[0].message.contains("must not be above max"));
    }
}
