//! A recorded result as `gen_ai.evaluation.result` events ([`skilleval_infra::evaluations`]):
//! one per strategy (a hybrid's components, a monitor's criteria by their names) and one for
//! the case, emitted once the result is committed for the first time (a redelivery that finds
//! its case recorded emits nothing).
//!
//! Each event is parented to the case's span: the job's CONSUMER `process` span, in the run's
//! trace. A production sample that names the span it came from (a `traceparent`, which trace
//! ingest always sets) is parented to that span instead, as the convention asks of an
//! evaluation of a GenAI operation, and its events carry the case span's ids as
//! `skilleval.case.trace_id` / `skilleval.case.span_id`. A skipped case was not graded and
//! emits nothing.

use std::collections::BTreeMap;

use opentelemetry::trace::SpanContext;
use serde_json::Value;
use skilleval_execution::monitor::job_info;
use skilleval_execution::plan::Job;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::evaluations::{Evaluation, Label};

/// `gen_ai.evaluation.name` of the event for a whole case.
pub const CASE_EVALUATION: &str = "skilleval.case";

/// What the events of one job's result need besides the result.
#[derive(Debug, Clone, Default)]
pub struct EventContext {
    /// The job's `process` span.
    pub case_span: Option<SpanContext>,
    /// The production span a sample came from.
    pub production: Option<SpanContext>,
    /// A sample's criterion names by strategy (empty for a run's case).
    pub criteria: BTreeMap<String, String>,
    /// Whether the job grades a production sample.
    pub sample: bool,
}

impl EventContext {
    /// The context of `job`, run under `span`.
    pub fn of(job: &Job, span: &tracing::Span) -> EventContext {
        let info = job_info(job);
        EventContext {
            case_span: skilleval_infra::telemetry::span_context(span),
            production: info
                .as_ref()
                .and_then(|i| i.traceparent.as_deref())
                .and_then(skilleval_infra::telemetry::span_context_of),
            criteria: info
                .as_ref()
                .map(|i| i.criteria.clone())
                .unwrap_or_default(),
            sample: info.is_some(),
        }
    }

    /// The span the events are parented to.
    pub fn parent(&self) -> Option<&SpanContext> {
        self.production.as_ref().or(self.case_span.as_ref())
    }
}

/// The events of `result`: one per strategy, then the case's; none for a skipped case.
/// `skill` is the run's skill name and version, when known.
pub fn evaluations(
    result: &JobResult,
    ctx: &EventContext,
    skill: Option<&(String, String)>,
) -> Vec<Evaluation> {
    if matches!(result.status, CaseStatus::Skipped | CaseStatus::Queued) {
        return Vec::new();
    }
    let mut attributes: Vec<(&'static str, String)> = Vec::with_capacity(10);
    if let Some((name, version)) = skill {
        attributes.push(("skilleval.skill", name.clone()));
        attributes.push(("skilleval.version", version.clone()));
    }
    attributes.push(("skilleval.run_id", result.run_id.to_string()));
    attributes.push(("skilleval.test_case_id", result.test_case_id.clone()));
    if ctx.sample {
        attributes.push(("skilleval.sample_id", result.test_case_id.clone()));
    }
    if !result.variant.is_primary() {
        attributes.push((
            "skilleval.configuration",
            result.variant.configuration.as_str().to_string(),
        ));
        attributes.push((
            "skilleval.run_number",
            result.variant.run_number.to_string(),
        ));
    }
    if ctx.production.is_some() {
        if let Some(case) = &ctx.case_span {
            attributes.push(("skilleval.case.trace_id", case.trace_id().to_string()));
            attributes.push(("skilleval.case.span_id", case.span_id().to_string()));
        }
    }
    let name_of = |strategy: &str| {
        ctx.criteria
            .get(strategy)
            .cloned()
            .unwrap_or_else(|| strategy.to_string())
    };
    let with = |level: &str, strategy: Option<&str>| {
        let mut a = attributes.clone();
        a.push(("skilleval.evaluation.level", level.to_string()));
        if let Some(s) = strategy {
            a.push(("skilleval.strategy", s.to_string()));
        }
        a
    };
    let error_type = result.error.as_ref().map(|f| f.kind());
    let mut out = Vec::new();

    let components = result
        .details
        .get("components")
        .and_then(Value::as_array)
        .filter(|_| result.status != CaseStatus::Errored);
    if let Some(components) = components {
        for c in components {
            let Some(strategy) = c.get("strategy").and_then(Value::as_str) else {
                continue;
            };
            let passed = c.get("passed").and_then(Value::as_bool);
            out.push(Evaluation {
                name: name_of(strategy),
                score: c.get("score").and_then(Value::as_f64),
                label: passed.map(label),
                explanation: explain(c.get("details"), passed == Some(false)),
                error_type: None,
                attributes: with("strategy", Some(strategy)),
            });
        }
    } else if result.status == CaseStatus::Errored && !ctx.criteria.is_empty() {
        // An errored sample was graded by none of its criteria: each one errored.
        for (strategy, criterion) in &ctx.criteria {
            out.push(Evaluation {
                name: criterion.clone(),
                score: None,
                label: None,
                explanation: result.error.as_ref().map(ToString::to_string),
                error_type,
                attributes: with("strategy", Some(strategy.as_str())),
            });
        }
    } else {
        out.push(strategy_evaluation(
            result,
            error_type,
            with("strategy", Some(result.strategy.as_str())),
            &name_of(&result.strategy),
        ));
    }
    out.push(case_evaluation(result, error_type, with("case", None)));
    out
}

fn label(passed: bool) -> Label {
    if passed {
        Label::Pass
    } else {
        Label::Fail
    }
}

/// The one strategy of a case that is not a hybrid.
fn strategy_evaluation(
    result: &JobResult,
    error_type: Option<&'static str>,
    attributes: Vec<(&'static str, String)>,
    name: &str,
) -> Evaluation {
    if result.status == CaseStatus::Errored {
        return Evaluation {
            name: name.to_string(),
            score: None,
            label: None,
            explanation: result.error.as_ref().map(ToString::to_string),
            error_type,
            attributes,
        };
    }
    let failed = result.status == CaseStatus::Failed;
    Evaluation {
        name: name.to_string(),
        score: result.score,
        label: Some(label(!failed)),
        explanation: reasoning(result).or_else(|| explain(Some(&result.details), failed)),
        error_type: None,
        attributes,
    }
}

/// The case as a whole: its status and score.
fn case_evaluation(
    result: &JobResult,
    error_type: Option<&'static str>,
    attributes: Vec<(&'static str, String)>,
) -> Evaluation {
    match result.status {
        CaseStatus::Errored => Evaluation {
            name: CASE_EVALUATION.into(),
            score: None,
            label: None,
            explanation: result.error.as_ref().map(ToString::to_string),
            error_type,
            attributes,
        },
        status => {
            let failed = status == CaseStatus::Failed;
            let explanation = reasoning(result).or_else(|| {
                failed.then(|| {
                    let score = result
                        .score
                        .map_or_else(|| "no score".to_string(), |s| format!("score {s:.3}"));
                    let details = explain(Some(&result.details), true)
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default();
                    format!("failed `{}` ({score}){details}", result.strategy)
                })
            });
            Evaluation {
                name: CASE_EVALUATION.into(),
                score: result.score,
                label: Some(label(!failed)),
                explanation,
                error_type: None,
                attributes,
            }
        }
    }
}

/// A grader's own words: the judge's feedback, else each rubric criterion's reasoning.
fn reasoning(result: &JobResult) -> Option<String> {
    if let Some(feedback) = result.feedback.as_deref().filter(|f| !f.trim().is_empty()) {
        return Some(feedback.to_string());
    }
    let rubric = result.rubric_scores.as_ref()?.as_object()?;
    let lines: Vec<String> = rubric
        .iter()
        .filter_map(|(name, v)| {
            v.get("reasoning")
                .and_then(Value::as_str)
                .map(|r| format!("{name}: {r}"))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A component's or strategy's details as an explanation: its `feedback` or `reasoning` when
/// it has one, else (for a failure only) the details themselves as compact JSON.
fn explain(details: Option<&Value>, failed: bool) -> Option<String> {
    let details =
        details.filter(|d| !d.is_null() && d.as_object().is_none_or(|o| !o.is_empty()))?;
    for key in ["feedback", "reasoning"] {
        if let Some(text) = details.get(key).and_then(Value::as_str) {
            return Some(text.to_string());
        }
    }
    failed.then(|| details.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skilleval_execution::result::test_result;
    use skilleval_model::grade::Fault;

    fn skill() -> (String, String) {
        ("greeter".to_string(), "1.2.0".to_string())
    }

    fn attr<'a>(e: &'a Evaluation, key: &str) -> Option<&'a str> {
        e.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_hybrid_case_is_one_event_per_component_and_one_for_the_case() {
        let mut r = test_result("c1", CaseStatus::Failed, Some(0.5));
        r.strategy = "hybrid".into();
        r.details = json!({"components": [
            {"strategy": "exact_match", "weight": 0.5, "score": 1.0, "passed": true, "details": {}},
            {"strategy": "contains", "weight": 0.5, "score": 0.0, "passed": false,
             "details": {"rules": [{"rule": "includes `x`", "passed": false}]}}
        ]});
        let events = evaluations(&r, &EventContext::default(), Some(&skill()));
        assert_eq!(events.len(), 3, "{events:#?}");
        assert_eq!(events[0].name, "exact_match");
        assert_eq!(events[0].label, Some(Label::Pass));
        assert_eq!(
            events[0].explanation, None,
            "a pass without reasoning explains nothing"
        );
        assert_eq!(events[1].name, "contains");
        assert_eq!(events[1].label, Some(Label::Fail));
        assert!(events[1]
            .explanation
            .as_deref()
            .unwrap()
            .contains("includes `x`"));
        assert_eq!(attr(&events[1], "skilleval.strategy"), Some("contains"));
        assert_eq!(events[2].name, CASE_EVALUATION);
        assert_eq!(events[2].score, Some(0.5));
        assert_eq!(events[2].label, Some(Label::Fail));
        assert_eq!(attr(&events[2], "skilleval.evaluation.level"), Some("case"));
        for e in &events {
            assert_eq!(attr(e, "skilleval.skill"), Some("greeter"));
            assert_eq!(attr(e, "skilleval.version"), Some("1.2.0"));
            assert_eq!(attr(e, "skilleval.test_case_id"), Some("c1"));
            assert_eq!(attr(e, "skilleval.sample_id"), None);
        }
    }

    #[test]
    fn a_samples_criteria_are_named_and_an_errored_case_carries_the_error_type() {
        let mut r = test_result("s1", CaseStatus::Errored, None);
        r.strategy = "hybrid".into();
        r.error = Some(Fault::permanent("the grader crashed"));
        let ctx = EventContext {
            criteria: BTreeMap::from([("contains".to_string(), "mentions-order".to_string())]),
            sample: true,
            ..EventContext::default()
        };
        let events = evaluations(&r, &ctx, None);
        assert_eq!(events.len(), 2, "{events:#?}");
        assert_eq!(events[0].name, "mentions-order");
        assert_eq!(events[0].error_type, Some("permanent"));
        assert_eq!(events[0].score, None);
        assert_eq!(events[1].error_type, Some("permanent"));
        assert_eq!(attr(&events[1], "skilleval.sample_id"), Some("s1"));
    }

    #[test]
    fn a_skipped_case_emits_nothing_and_a_judges_feedback_is_the_explanation() {
        let skipped = test_result("c1", CaseStatus::Skipped, None);
        assert!(evaluations(&skipped, &EventContext::default(), None).is_empty());
        let mut judged = test_result("c2", CaseStatus::Passed, Some(0.9));
        judged.strategy = "llm_judge".into();
        judged.feedback = Some("Accurate and brief.".into());
        let events = evaluations(&judged, &EventContext::default(), None);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].name, "llm_judge");
        assert_eq!(
            events[0].explanation.as_deref(),
            Some("Accurate and brief.")
        );
        assert_eq!(
            events[1].explanation.as_deref(),
            Some("Accurate and brief.")
        );
    }
}
