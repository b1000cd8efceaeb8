//! Placeholders for the model-backed strategies (`llm_judge`, `assertions`, `semantic_sim`)
//! while no model provider is configured.
//!
//! They validate a case exactly as the real strategies will, so a package is accepted or
//! refused at upload the same way with or without a provider:
//! - `llm_judge`: `expected.rubric` (or, when absent, the creative default rubric) must pass
//!   [`super::rubric::validate`]: weights sum to 1.0 ±0.001, scales known with min < max;
//! - `assertions`: `expected.assertions` must hold at least one non-empty assertion;
//! - `semantic_sim`: `expected.output` is required, `expected.semanticThreshold` (default 0.8)
//!   must be in [0, 1].
//!
//! Grading returns a permanent fault saying a model provider is needed. Registering the real
//! strategy under the same name (after [`super::StrategyRegistry::builtin`]) replaces these.

use std::sync::Arc;

use async_trait::async_trait;

use super::options::OptionReader;
use super::rubric::{self, default_creative_rubric};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use crate::grade::{Fault, Grade};
use crate::model::TestCase;
use crate::problem::Problem;

/// `semantic_sim`'s threshold when the case sets none (design §3, flexible profile).
pub const DEFAULT_SEMANTIC_THRESHOLD: f64 = 0.8;

/// A model-backed strategy with no model: validates, and refuses to grade.
pub struct ModelRequired {
    name: &'static str,
}

impl ModelRequired {
    pub fn new(name: &'static str) -> Self {
        ModelRequired { name }
    }
}

impl Strategy for ModelRequired {
    fn name(&self) -> &'static str {
        self.name
    }

    fn needs_model(&self) -> bool {
        true
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, self.name);
        opts.passing_threshold();
        match self.name {
            "llm_judge" => {
                let rubric = case
                    .expected
                    .rubric
                    .clone()
                    .unwrap_or_else(default_creative_rubric);
                for issue in rubric::validate(&rubric) {
                    opts.problem(&format!("/expected/rubric{}", issue.pointer), issue.message);
                }
            }
            "assertions" => {
                if case.expected.assertions.is_empty() {
                    opts.problem(
                        "/expected/assertions",
                        "assertions needs at least one assertion in expected.assertions",
                    );
                }
                for (i, a) in case.expected.assertions.iter().enumerate() {
                    if a.trim().is_empty() {
                        opts.problem(
                            &format!("/expected/assertions/{i}"),
                            "an assertion must not be empty",
                        );
                    }
                }
            }
            "semantic_sim" => {
                if case.expected.output.is_none() {
                    opts.problem(
                        "/expected/output",
                        "semantic_sim needs expected.output: the reference answer to compare meaning with",
                    );
                }
                let t = case
                    .expected
                    .semantic_threshold
                    .unwrap_or(DEFAULT_SEMANTIC_THRESHOLD);
                if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
                    opts.problem(
                        "/expected/semanticThreshold",
                        format!("semantic_sim: semanticThreshold must be between 0 and 1, not {t}"),
                    );
                }
            }
            _ => {}
        }
        opts.finish(Arc::new(NoModel { name: self.name }) as Arc<dyn Grader>)
    }
}

#[derive(Debug)]
struct NoModel {
    name: &'static str,
}

#[async_trait]
impl Grader for NoModel {
    async fn grade(&self, _input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        Err(Fault::permanent(format!(
            "strategy `{}` needs a model provider; none is configured (see docs/providers.md)",
            self.name
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{case, pointers, Fixture};
    use super::super::MODEL_STRATEGIES;
    use crate::grade::Fault;

    #[test]
    fn every_model_strategy_is_registered_and_needs_a_model() {
        let f = Fixture::new();
        for name in MODEL_STRATEGIES {
            let s = f.registry.get(name).unwrap();
            assert!(s.needs_model(), "{name}");
            assert_eq!(s.name(), *name);
        }
    }

    #[tokio::test]
    async fn llm_judge_uses_the_default_rubric_and_refuses_to_grade() {
        let f = Fixture::new();
        let c = case(json!({"evaluation": {"strategy": "llm_judge"}}));
        let fault = f.grade(&c, "text").await.unwrap_err();
        assert_eq!(
            fault,
            Fault::permanent("strategy `llm_judge` needs a model provider; none is configured (see docs/providers.md)")
        );
    }

    #[test]
    fn llm_judge_rubric_weights_are_checked() {
        let f = Fixture::new();
        let rubric = |w2: f64| {
            case(json!({
                "expected": {"rubric": {"criteria": [
                    {"name": "a", "weight": 0.5, "scale": "likert5"},
                    {"name": "b", "weight": w2, "scale": {"min": 0, "max": 10}}
                ]}},
                "evaluation": {"strategy": "llm_judge"}
            }))
        };
        let problems = f.problems(&rubric(0.49));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/rubric/criteria"]
        );
        assert!(
            problems[0].message.contains("they sum to 0.99"),
            "{}",
            problems[0].message
        );
        assert!(f.compile(&rubric(0.5005)).is_ok());

        let c = case(json!({
            "expected": {"rubric": {"criteria": [{"name": "a", "weight": 1.0, "scale": {"min": 3, "max": 3}}]}},
            "evaluation": {"strategy": "llm_judge"}
        }));
        assert_eq!(
            pointers(&f.problems(&c)),
            vec!["/testCases/0/expected/rubric/criteria/0/scale"]
        );
    }

    #[test]
    fn assertions_and_semantic_sim_requirements() {
        let f = Fixture::new();
        let problems = f.problems(&case(json!({"evaluation": {"strategy": "assertions"}})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/assertions"]
        );
        let problems = f.problems(&case(json!({"expected": {"assertions": ["ok", " "]}, "evaluation": {"strategy": "assertions"}})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/assertions/1"]
        );
        assert!(f
            .compile(&case(json!({"expected": {"assertions": ["mentions the refund"]}, "evaluation": {"strategy": "assertions"}})))
            .is_ok());

        let problems = f.problems(&case(json!({"expected": {"semanticThreshold": 1.2}, "evaluation": {"strategy": "semantic_sim"}})));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/expected/output",
                "/testCases/0/expected/semanticThreshold"
            ]
        );
        assert!(f
            .compile(&case(
                json!({"expected": {"output": "a cat"}, "evaluation": {"strategy": "semantic_sim"}})
            ))
            .is_ok());
    }
}
