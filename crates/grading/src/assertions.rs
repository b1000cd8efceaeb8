//! `assertions`: a model judges each natural-language assertion about the output as pass or
//! fail, with its confidence and evidence quoted from the output, and critiques the eval.
//!
//! The judge answers `{assertions: [{assertion, result: pass|fail, confidence:
//! high|medium|low, evidence}], factual_issues: [..], eval_critique: {vague_assertions,
//! missing_coverage, suggested_assertions}}` — the JSON-shapes seed's `grading.json` — and
//! `details` keeps that shape, so the artefacts write it as both that file's `assertions` and
//! skill-creator's `expectations[{text, passed, evidence}]`. Each verdict also says whether its
//! evidence really occurs in the output (`evidence_in_output`), since a quote the output does
//! not contain is a sign of a confabulating judge.
//!
//! Score = assertions passed / assertions. Passed when all pass, or, when
//! `evaluation.passingThreshold` is set, when the score reaches it. A judge that skips an
//! assertion is asked once more, then the case errors with its raw answer.
//!
//! Checked with or without a provider ([`super::provider`]): `expected.assertions` holds at
//! least one assertion, none of them empty.

use std::fmt::Write;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::llm_judge::{ask_judge, task_section};
use super::options::OptionReader;
use super::provider::ModelStrategy;
use super::GradeInput;
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_providers::chat::OutputSchema;
use skilleval_providers::client::LlmClient;
use skilleval_providers::Purpose;

/// The `assertions` strategy (registered wrapped in `ModelBacked`, which gives it its provider).
pub struct Assertions;

#[async_trait]
impl ModelStrategy for Assertions {
    const NAME: &'static str = "assertions";
    const PURPOSE: Purpose = Purpose::Judge;
    /// The assertions and the case's pass threshold (none: all must pass).
    type Checked = (Vec<String>, Option<f64>);

    fn check(case: &TestCase, opts: &mut OptionReader<'_, '_>) -> (Vec<String>, Option<f64>) {
        if case.expected.assertions.is_empty() {
            opts.problem(
                "/expected/assertions",
                "there is nothing to check: add the statements a good output must satisfy (for \
                 example \"The summary lists the decision and its owner\"), one string each",
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
        (
            case.expected.assertions.clone(),
            case.evaluation.passing_threshold,
        )
    }

    async fn grade(
        (assertions, threshold): &(Vec<String>, Option<f64>),
        client: &LlmClient,
        input: &GradeInput<'_>,
    ) -> Result<Grade, Fault> {
        ask_judge(
            client,
            assertions_prompt(input, assertions),
            OutputSchema::new("record_assertion_verdicts", answer_schema(assertions.len())),
            |v| interpret(v, assertions),
            |answer| grade_answer(answer, input.output, *threshold),
        )
        .await
    }
}

/// One assertion's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub assertion: String,
    pub passed: bool,
    /// `high`, `medium` or `low`.
    pub confidence: String,
    pub evidence: String,
}

/// The judge's whole answer.
#[derive(Debug, Clone, PartialEq)]
pub struct AssertionsAnswer {
    pub verdicts: Vec<Verdict>,
    pub factual_issues: Vec<String>,
    pub vague_assertions: Vec<String>,
    pub missing_coverage: Vec<String>,
    pub suggested_assertions: Vec<String>,
}

pub fn answer_schema(count: usize) -> Value {
    let strings = json!({"type": "array", "items": {"type": "string"}});
    json!({
        "type": "object",
        "properties": {
            "assertions": {
                "type": "array",
                "minItems": count,
                "maxItems": count,
                "items": {
                    "type": "object",
                    "properties": {
                        "assertion": {"type": "string"},
                        "result": {"type": "string", "enum": ["pass", "fail"]},
                        "confidence": {"type": "string", "enum": ["high", "medium", "low"]},
                        "evidence": {"type": "string"}
                    },
                    "required": ["assertion", "result", "confidence", "evidence"]
                }
            },
            "factual_issues": strings,
            "eval_critique": {
                "type": "object",
                "properties": {
                    "vague_assertions": strings,
                    "missing_coverage": strings,
                    "suggested_assertions": strings
                },
                "required": ["vague_assertions", "missing_coverage", "suggested_assertions"]
            }
        },
        "required": ["assertions", "factual_issues", "eval_critique"]
    })
}

pub fn assertions_prompt(input: &GradeInput<'_>, assertions: &[String]) -> String {
    let mut s = task_section(input);
    let _ = writeln!(s, "\n## Assertions to check against the response\n");
    for (i, a) in assertions.iter().enumerate() {
        let _ = writeln!(s, "{}. {}", i + 1, a.trim());
    }
    let _ = write!(
        s,
        "\nFor each assertion, in order, decide `pass` or `fail`. A pass needs concrete evidence: quote the exact words of the response that show it \
(for a fail, quote what contradicts it, or say what is missing). A section heading with no real content does not pass. Give your confidence: high, medium or low.\n\
Then list factual_issues: statements in the response that are wrong or not supported by the task and its context.\n\
Then critique the eval itself: vague_assertions (assertions too vague to check reliably), missing_coverage (important aspects no assertion checks), \
suggested_assertions (better or additional assertions).\n\n\
Answer with one JSON object and nothing else:\n\
{{\"assertions\": [{{\"assertion\": \"<the assertion>\", \"result\": \"pass\"|\"fail\", \"confidence\": \"high\"|\"medium\"|\"low\", \"evidence\": \"<quote from the response>\"}}, ...], \
\"factual_issues\": [\"...\"], \"eval_critique\": {{\"vague_assertions\": [], \"missing_coverage\": [], \"suggested_assertions\": []}}}}\n\
There must be exactly {} entries in `assertions`, one per assertion, in the order given.\n",
        assertions.len()
    );
    s
}

fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|i| match i {
                Value::String(s) => Some(s.trim().to_string()),
                Value::Null => None,
                other => Some(other.to_string()),
            })
            .filter(|s| !s.is_empty())
            .collect(),
        Some(Value::String(s)) if !s.trim().is_empty() => vec![s.trim().to_string()],
        _ => Vec::new(),
    }
}

fn result_of(item: &Value) -> Option<bool> {
    let v = item
        .get("result")
        .or_else(|| item.get("passed"))
        .or_else(|| item.get("verdict"))?;
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "pass" | "passed" | "true" | "yes" => Some(true),
            "fail" | "failed" | "false" | "no" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// Reads the judge's answer: exactly one verdict per assertion, in order.
pub fn interpret(value: &Value, assertions: &[String]) -> Result<AssertionsAnswer, String> {
    let items = value
        .get("assertions")
        .or_else(|| value.get("expectations"))
        .and_then(Value::as_array)
        .ok_or("the answer has no `assertions` list")?;
    if items.len() != assertions.len() {
        return Err(format!(
            "the answer judges {} assertion(s), but there are {}",
            items.len(),
            assertions.len()
        ));
    }
    let mut verdicts = Vec::with_capacity(items.len());
    for (i, (item, text)) in items.iter().zip(assertions).enumerate() {
        let passed = result_of(item).ok_or(format!(
            "assertion {} has no `result` of pass or fail",
            i + 1
        ))?;
        let confidence = match item
            .get("confidence")
            .and_then(Value::as_str)
            .map(|c| c.trim().to_ascii_lowercase())
        {
            Some(c) if matches!(c.as_str(), "high" | "medium" | "low") => c,
            _ => "medium".to_string(),
        };
        let evidence = match item.get("evidence") {
            Some(Value::String(s)) => s.trim().to_string(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        verdicts.push(Verdict {
            assertion: text.clone(),
            passed,
            confidence,
            evidence,
        });
    }
    let critique = value.get("eval_critique");
    Ok(AssertionsAnswer {
        verdicts,
        factual_issues: strings(value.get("factual_issues")),
        vague_assertions: strings(critique.and_then(|c| c.get("vague_assertions"))),
        missing_coverage: strings(critique.and_then(|c| c.get("missing_coverage"))),
        suggested_assertions: strings(critique.and_then(|c| c.get("suggested_assertions"))),
    })
}

fn normalise(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Whether the evidence (or a quoted fragment of it, at least 8 characters long) occurs in the
/// output, ignoring case and whitespace differences.
pub fn evidence_in_output(evidence: &str, output: &str) -> bool {
    let out = normalise(output);
    let trimmed = evidence
        .trim()
        .trim_matches(|c| matches!(c, '"' | '\'' | '“' | '”' | '`'))
        .trim_end_matches("...")
        .trim_end_matches('…');
    let whole = normalise(trimmed);
    if whole.len() >= 3 && out.contains(&whole) {
        return true;
    }
    let mut fragments = Vec::new();
    for (open, close) in [('"', '"'), ('“', '”'), ('`', '`')] {
        let mut rest = evidence;
        while let Some(a) = rest.find(open) {
            let after = &rest[a + open.len_utf8()..];
            let Some(b) = after.find(close) else { break };
            fragments.push(&after[..b]);
            rest = &after[b + close.len_utf8()..];
        }
    }
    fragments
        .into_iter()
        .map(normalise)
        .any(|f| f.chars().count() >= 8 && out.contains(&f))
}

/// Turns the verdicts into a grade in the seed's `grading.json` shape.
pub fn grade_answer(answer: &AssertionsAnswer, output: &str, threshold: Option<f64>) -> Grade {
    let total = answer.verdicts.len();
    let passed_count = answer.verdicts.iter().filter(|v| v.passed).count();
    let score = if total == 0 {
        0.0
    } else {
        passed_count as f64 / total as f64
    };
    let passed = match threshold {
        Some(t) => score + 1e-9 >= t,
        None => passed_count == total,
    };
    let items: Vec<Value> = answer
        .verdicts
        .iter()
        .map(|v| {
            json!({
                "assertion": v.assertion,
                "result": if v.passed { "pass" } else { "fail" },
                "confidence": v.confidence,
                "evidence": v.evidence,
                "evidence_in_output": evidence_in_output(&v.evidence, output),
            })
        })
        .collect();
    Grade::new(
        score,
        passed,
        json!({
            "assertions": items,
            "passed": passed_count,
            "total": total,
            "factual_issues": answer.factual_issues,
            "eval_critique": {
                "vague_assertions": answer.vague_assertions,
                "missing_coverage": answer.missing_coverage,
                "suggested_assertions": answer.suggested_assertions,
            },
        }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn texts() -> Vec<String> {
        vec!["mentions the refund".into(), "is polite".into()]
    }

    #[test]
    fn verdicts_become_the_grading_shapes() {
        let v = json!({
            "assertions": [
                {"assertion": "mentions the refund", "result": "pass", "confidence": "high", "evidence": "\"your refund of $20 is on its way\""},
                {"assertion": "is polite", "result": "FAIL", "confidence": "sure", "evidence": "It says \"whatever, read the manual\""}
            ],
            "factual_issues": ["claims a 3-day delay not in the context"],
            "eval_critique": {"vague_assertions": ["is polite"], "missing_coverage": [], "suggested_assertions": ["states the amount"]}
        });
        let answer = interpret(&v, &texts()).unwrap();
        let output = "Hi! Your refund of $20 is on its way. Whatever, read the manual.";
        let g = grade_answer(&answer, output, None);
        assert_eq!(g.score, 0.5);
        assert!(!g.passed);
        assert_eq!(g.details["assertions"][1]["result"], "fail");
        assert_eq!(
            g.details["assertions"][1]["confidence"], "medium",
            "unknown confidence becomes medium"
        );
        assert_eq!(g.details["assertions"][0]["evidence_in_output"], true);
        assert_eq!(g.details["assertions"][1]["evidence_in_output"], true);
        assert_eq!(
            g.details["eval_critique"]["suggested_assertions"][0],
            "states the amount"
        );
        assert!(grade_answer(&answer, output, Some(0.5)).passed);
    }

    #[test]
    fn a_skipped_assertion_is_an_error() {
        let v = json!({"assertions": [{"assertion": "x", "result": "pass", "confidence": "high", "evidence": "e"}]});
        assert_eq!(
            interpret(&v, &texts()).unwrap_err(),
            "the answer judges 1 assertion(s), but there are 2"
        );
        let v = json!({"assertions": [{"result": "maybe"}, {"result": "pass"}]});
        assert!(interpret(&v, &texts()).unwrap_err().contains("assertion 1"));
    }

    #[test]
    fn invented_evidence_is_flagged() {
        assert!(!evidence_in_output(
            "\"we will refund twice\"",
            "Your refund is on its way."
        ));
        assert!(!evidence_in_output("", "anything"));
        assert!(evidence_in_output(
            "Your   REFUND is on its way…",
            "your refund is on its way."
        ));
    }
}
