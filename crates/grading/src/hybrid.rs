//! `hybrid`: a weighted blend of other strategies (the enterprise profile's default).
//!
//! `evaluation.weights` names the sub-strategies and their weights (`{"regex_match": 2,
//! "json_schema": 1}`); weights must be positive and are normalised by their sum. Each
//! sub-strategy is compiled once, against the same case, so it reads the same `expected`
//! fields; options meant for one sub-strategy only can be put in `evaluation.options.<name>`
//! (an object merged over the case's options for that sub-strategy). The case's
//! `evaluation.passingThreshold` is the hybrid's own threshold and is not passed down: each
//! sub-strategy uses its own default or `threshold` option.
//!
//! Score = sum of normalised weight x sub-score. Passed when the score reaches
//! `evaluation.passingThreshold` (default 0.7) and no sub-strategy named in option `mustPass`
//! failed. A sub-strategy that faults makes the hybrid fault the same way. `hybrid` cannot
//! include itself. Details: `components: [{strategy, weight, score, passed, details}]`,
//! `threshold`, `must_pass`, `failed_must_pass`.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::options::{option_pointer, OptionReader};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy, StrategyRegistry};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::{escape_token, Problem};

/// Pass threshold when the case sets none.
pub const DEFAULT_THRESHOLD: f64 = 0.7;

pub struct Hybrid;

#[derive(Debug)]
struct Component {
    name: String,
    /// Normalised: the weights of all components sum to 1.
    weight: f64,
    must_pass: bool,
    grader: Arc<dyn Grader>,
}

impl Strategy for Hybrid {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    /// The first part (in `evaluation.weights` order) that lacks its provider.
    fn missing_provider(
        &self,
        case: &TestCase,
        registry: &StrategyRegistry,
    ) -> Option<&'static str> {
        case.evaluation
            .weights
            .keys()
            .filter(|name| name.as_str() != self.name())
            .find_map(|name| registry.missing_provider(name, case))
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "hybrid");
        let threshold = opts.passing_threshold().unwrap_or(DEFAULT_THRESHOLD);
        let must_pass = opts.string_list("mustPass").unwrap_or_default();
        let weights = &case.evaluation.weights;
        if weights.is_empty() {
            opts.problem(
                "/evaluation/weights",
                "hybrid needs evaluation.weights: the sub-strategies to blend, e.g. {\"regex_match\": 0.5, \"json_schema\": 0.5}",
            );
        }
        for (i, name) in must_pass.iter().enumerate() {
            if !weights.contains_key(name) {
                let pointer = format!("{}/{i}", option_pointer(case, "mustPass"));
                opts.problem(
                    &pointer,
                    format!("hybrid: mustPass names `{name}`, which is not in evaluation.weights"),
                );
            }
        }

        let mut sub_case = case.clone();
        sub_case.evaluation.passing_threshold = None;
        sub_case.evaluation.weights.clear();
        sub_case.evaluation.options.remove("mustPass");

        let mut components = Vec::with_capacity(weights.len());
        let mut total = 0.0;
        for (name, &weight) in weights {
            let pointer = format!("/evaluation/weights/{}", escape_token(name));
            if name == self.name() {
                opts.problem(&pointer, "hybrid cannot include hybrid");
                continue;
            }
            if !(weight.is_finite() && weight > 0.0) {
                opts.problem(
                    &pointer,
                    format!("hybrid: weight of `{name}` must be a positive number, not {weight}"),
                );
                continue;
            }
            if ctx.registry.get(name).is_none() {
                opts.problem(
                    &pointer,
                    format!(
                        "hybrid: unknown strategy `{name}`; known: {}",
                        ctx.registry.names().join(", ")
                    ),
                );
                continue;
            }
            let mut case_for = sub_case.clone();
            case_for.evaluation.strategy = name.clone();
            if let Some(Value::Object(own)) = case.evaluation.options.get(name) {
                for (k, v) in own {
                    case_for.evaluation.options.insert(k.clone(), v.clone());
                }
            }
            match ctx.registry.compile(name, &case_for, ctx) {
                Ok(grader) => {
                    total += weight;
                    components.push(Component {
                        name: name.clone(),
                        weight,
                        must_pass: must_pass.contains(name),
                        grader,
                    });
                }
                Err(problems) => opts.problems.extend(problems),
            }
        }
        if !opts.problems.is_empty() {
            return Err(opts.problems);
        }
        for c in &mut components {
            c.weight /= total;
        }
        Ok(Arc::new(HybridGrader {
            components,
            threshold,
        }))
    }
}

#[derive(Debug)]
struct HybridGrader {
    components: Vec<Component>,
    threshold: f64,
}

#[async_trait]
impl Grader for HybridGrader {
    async fn grade(&self, input: &GradeInput<'_>, env: &GradeEnv) -> Result<Grade, Fault> {
        let mut score = 0.0;
        let mut details = Vec::with_capacity(self.components.len());
        let mut failed_must_pass = Vec::new();
        let mut grade = Grade::default();
        let mut feedback = Vec::new();
        for c in &self.components {
            let sub = c.grader.grade(input, env).await?;
            score += c.weight * sub.score;
            if c.must_pass && !sub.passed {
                failed_must_pass.push(c.name.clone());
            }
            grade.usage.add(&sub.usage);
            if grade.matched_patterns.is_none() {
                grade.matched_patterns = sub.matched_patterns;
            }
            if grade.schema_errors.is_none() {
                grade.schema_errors = sub.schema_errors;
            }
            if grade.rubric_scores.is_none() {
                grade.rubric_scores = sub.rubric_scores;
            }
            if let Some(f) = sub.feedback {
                feedback.push(format!("{}: {f}", c.name));
            }
            details.push(json!({
                "strategy": c.name,
                "weight": c.weight,
                "score": sub.score,
                "passed": sub.passed,
                "details": sub.details,
            }));
        }
        let passed = score >= self.threshold && failed_must_pass.is_empty();
        let must_pass: Vec<&str> = self
            .components
            .iter()
            .filter(|c| c.must_pass)
            .map(|c| c.name.as_str())
            .collect();
        let mut out = Grade::new(
            score,
            passed,
            json!({
                "components": details,
                "threshold": self.threshold,
                "must_pass": must_pass,
                "failed_must_pass": failed_must_pass,
            }),
        );
        out.usage = grade.usage;
        out.matched_patterns = grade.matched_patterns;
        out.schema_errors = grade.schema_errors;
        out.rubric_scores = grade.rubric_scores;
        if !feedback.is_empty() {
            out.feedback = Some(feedback.join("\n"));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, pointers, Fixture};
    use skilleval_model::grade::Fault;

    fn blend() -> skilleval_model::definition::TestCase {
        case(json!({
            "expected": {
                "output": "Order 42 shipped",
                "patterns": ["Order \\d+", "shipped", "tracking"],
                "includes": ["42"]
            },
            "evaluation": {
                "strategy": "hybrid",
                "weights": {"regex_match": 3, "exact_match": 1}
            }
        }))
    }

    #[tokio::test]
    async fn weights_are_normalised_and_scores_blended() {
        let f = Fixture::new();
        let c = blend();
        // regex 2/3 (weight .75), exact 1 (weight .25): 0.5 + 0.25 = 0.75.
        let g = f.ok(&c, "Order 42 shipped").await;
        assert_close(g.score, 0.75 * (2.0 / 3.0) + 0.25);
        assert!(g.passed);
        let comps = g.details["components"].as_array().unwrap();
        assert_eq!(comps.len(), 2);
        // BTreeMap order: exact_match, regex_match.
        assert_eq!(comps[0]["strategy"], "exact_match");
        assert_close(comps[0]["weight"].as_f64().unwrap(), 0.25);
        assert_close(comps[1]["weight"].as_f64().unwrap(), 0.75);
        assert_eq!(comps[1]["details"]["unmatched"], json!(["tracking"]));
        // Sub-grade extras are carried.
        assert_eq!(g.matched_patterns.as_ref().unwrap().len(), 2);

        // regex 1/3, exact 0: 0.25 < 0.7.
        let g = f.ok(&c, "order shipped").await;
        assert_close(g.score, 0.75 / 3.0);
        assert!(!g.passed);
    }

    #[tokio::test]
    async fn passing_threshold_belongs_to_hybrid_and_must_pass_is_enforced() {
        let f = Fixture::new();
        let mut c = blend();
        c.evaluation.passing_threshold = Some(0.5);
        c.evaluation
            .options
            .insert("mustPass".into(), json!(["exact_match"]));
        // 0.75 x 1 + 0.25 x 0 = 0.75 >= 0.5, but exact_match must pass.
        let g = f.ok(&c, "Order 42 shipped with tracking ABC").await;
        assert_close(g.score, 0.75);
        assert!(!g.passed);
        assert_eq!(g.details["failed_must_pass"], json!(["exact_match"]));
        // regex_match was not given the 0.5 threshold: it fails at 2/3 (not all matched).
        let g = f.ok(&c, "Order 42 shipped").await;
        assert!(g.passed);
        assert_eq!(g.details["components"][1]["passed"], false);
    }

    #[tokio::test]
    async fn empty_unicode_and_huge_outputs() {
        let f = Fixture::new();
        let c = blend();
        let g = f.ok(&c, "").await;
        assert_eq!(g.score, 0.0);
        assert!(!g.passed);
        // "Order 42" and "shipped" match inside a megabyte: regex 2/3, exact 0.
        let big = format!("naïve café 日本 Order 42 shipped {}", "x".repeat(1 << 20));
        let g = f.ok(&c, &big).await;
        assert_close(g.score, 0.5);
        assert!(!g.passed);
    }

    #[tokio::test]
    async fn per_strategy_options_are_merged() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"output": "HELLO world"},
            "evaluation": {
                "strategy": "hybrid",
                "weights": {"exact_match": 1, "lexical_similarity": 1},
                "options": {"exact_match": {"caseSensitive": false}}
            }
        }));
        let g = f.ok(&c, "hello world").await;
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["components"][0]["passed"], true);
    }

    #[tokio::test]
    async fn sub_strategy_faults_propagate() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"output": "x"},
            "evaluation": {"strategy": "hybrid", "weights": {"exact_match": 1, "semantic_sim": 1}}
        }));
        let fault = f.grade(&c, "x").await.unwrap_err();
        assert!(matches!(fault, Fault::Permanent { .. }));
        assert!(
            fault.to_string().contains("needs a model provider"),
            "{fault}"
        );
    }

    #[test]
    fn problems_cover_weights_recursion_and_sub_strategies() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"patterns": ["("]},
            "evaluation": {
                "strategy": "hybrid",
                "weights": {"hybrid": 1, "exact_match": 0, "nope": 1, "regex_match": 1},
                "options": {"mustPass": ["json_schema"]}
            }
        }));
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/mustPass/0",
                "/testCases/0/evaluation/weights/exact_match",
                "/testCases/0/evaluation/weights/hybrid",
                "/testCases/0/evaluation/weights/nope",
                "/testCases/0/expected/patterns/0",
            ]
        );
        assert_eq!(problems[2].message, "hybrid cannot include hybrid");
        assert!(problems[3].message.contains("unknown strategy `nope`"));
        let problems = f.problems(&case(json!({"evaluation": {"strategy": "hybrid"}})));
        assert_eq!(pointers(&problems), vec!["/testCases/0/evaluation/weights"]);
    }
}
