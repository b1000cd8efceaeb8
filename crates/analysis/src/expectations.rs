//! A graded case as skill-creator's expectations: one line per assertion, check, rule or
//! hybrid component the strategy judged, else one line for the whole grade. skill-creator's
//! `grading.json` lists them, and its benchmark computes a run's pass rate over them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use skilleval_execution::result::{CaseStatus, JobResult};

/// One expectation in skill-creator's shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Expectation {
    pub text: String,
    pub passed: bool,
    pub evidence: String,
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => s.chars().take(300).collect(),
        other => other.to_string().chars().take(300).collect(),
    }
}

/// The expectations a grade stands for: per assertion when the strategy judged assertions, per
/// check/rule/component when it has them, otherwise one line for the whole grade.
pub fn expectations(r: &JobResult) -> Vec<Expectation> {
    let d = &r.details;
    if let Some(items) = d.get("assertions").and_then(Value::as_array) {
        return items
            .iter()
            .map(|a| Expectation {
                text: a
                    .get("assertion")
                    .or_else(|| a.get("text"))
                    .map(short)
                    .unwrap_or_default(),
                passed: a.get("result").and_then(Value::as_str) == Some("pass")
                    || a.get("passed").and_then(Value::as_bool) == Some(true),
                evidence: a.get("evidence").map(short).unwrap_or_default(),
            })
            .collect();
    }
    for key in ["checks", "rules", "components"] {
        if let Some(items) = d.get(key).and_then(Value::as_array) {
            if !items.is_empty() {
                return items
                    .iter()
                    .map(|c| Expectation {
                        text: c
                            .get("check")
                            .or_else(|| c.get("rule"))
                            .or_else(|| c.get("strategy"))
                            .map(short)
                            .unwrap_or_else(|| short(c)),
                        passed: c.get("passed").and_then(Value::as_bool).unwrap_or(false),
                        evidence: c
                            .get("detail")
                            .or_else(|| c.get("details"))
                            .map(short)
                            .unwrap_or_default(),
                    })
                    .collect();
            }
        }
    }
    let evidence = match (&r.error, r.status) {
        (Some(e), _) => e.to_string(),
        (None, CaseStatus::Passed | CaseStatus::Failed) => short(&r.details),
        _ => String::new(),
    };
    vec![Expectation {
        text: format!("{} grading of `{}`", r.strategy, r.test_case_id),
        passed: r.passed(),
        evidence,
    }]
}
