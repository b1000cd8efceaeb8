//! LLM-judge rubrics: the creative profile's default rubric and the checks every rubric must
//! pass before a judge may use it (the rubric seed: weights sum to 1.0 within ±0.001, each
//! criterion's scale is a known one or a `{min, max}` range with min < max).
//!
//! Shared by the `llm_judge` placeholder (validation without a model) and the model-backed
//! judge, so both accept and refuse exactly the same rubrics.

use std::collections::{BTreeMap, HashSet};

use crate::scale;
use skilleval_model::definition::{Criterion, Rubric, Scale};

/// How far the rubric's weights may sum from 1.0.
pub const WEIGHT_TOLERANCE: f64 = 0.001;

/// Pass threshold of the default rubric.
pub const DEFAULT_PASSING_THRESHOLD: f64 = 0.7;

/// The creative profile's rubric (design §3): completeness .30, coherence .25,
/// professionalism .25, accuracy .20, each on a 1..5 scale; passes at 0.7.
pub fn default_creative_rubric() -> Rubric {
    let criterion = |name: &str, description: &str, weight: f64| Criterion {
        name: name.to_string(),
        description: description.to_string(),
        weight,
        scale: Scale::Range {
            min: 1.0,
            max: 5.0,
            descriptions: BTreeMap::new(),
        },
    };
    Rubric {
        criteria: vec![
            criterion(
                "completeness",
                "Addresses every part of the request; nothing asked for is missing.",
                0.30,
            ),
            criterion(
                "coherence",
                "Well organised and logically consistent from start to end.",
                0.25,
            ),
            criterion(
                "professionalism",
                "Tone, formatting and language suit the audience and purpose.",
                0.25,
            ),
            criterion(
                "accuracy",
                "Statements are correct and consistent with the prompt and context.",
                0.20,
            ),
        ],
        passing_threshold: DEFAULT_PASSING_THRESHOLD,
        overall_feedback: false,
    }
}

/// The sum of the criteria's weights.
pub fn weight_sum(criteria: &[Criterion]) -> f64 {
    criteria.iter().map(|c| c.weight).sum()
}

/// `Ok` when the weights sum to 1.0 within [`WEIGHT_TOLERANCE`]; else the message naming the
/// actual sum.
pub fn check_weights(criteria: &[Criterion]) -> Result<(), String> {
    let sum = weight_sum(criteria);
    if sum.is_finite() && (sum - 1.0).abs() <= WEIGHT_TOLERANCE {
        Ok(())
    } else {
        let shown = (sum * 1e6).round() / 1e6;
        Err(format!(
            "rubric weights must sum to 1.0 (±{WEIGHT_TOLERANCE}); they sum to {shown}"
        ))
    }
}

/// One thing wrong with a rubric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RubricIssue {
    /// Pointer relative to the rubric (`/criteria`, `/criteria/2/scale`).
    pub pointer: String,
    pub message: String,
}

fn issue(pointer: impl Into<String>, message: impl Into<String>) -> RubricIssue {
    RubricIssue {
        pointer: pointer.into(),
        message: message.into(),
    }
}

/// Every problem with a rubric: no criteria, an unnamed or duplicate criterion, a negative or
/// non-finite weight, an unknown or inverted scale, weights not summing to 1.0 (±0.001), a
/// passing threshold outside [0, 1].
pub fn validate(rubric: &Rubric) -> Vec<RubricIssue> {
    let mut issues = Vec::new();
    if rubric.criteria.is_empty() {
        issues.push(issue("/criteria", "a rubric needs at least one criterion"));
    }
    let mut names = HashSet::new();
    let mut weights_ok = true;
    for (i, c) in rubric.criteria.iter().enumerate() {
        if c.name.trim().is_empty() {
            issues.push(issue(
                format!("/criteria/{i}/name"),
                "a rubric criterion needs a name",
            ));
        } else if !names.insert(c.name.as_str()) {
            issues.push(issue(
                format!("/criteria/{i}/name"),
                format!(
                    "rubric criterion names must be unique; `{}` is repeated",
                    c.name
                ),
            ));
        }
        if !c.weight.is_finite() || c.weight < 0.0 {
            issues.push(issue(
                format!("/criteria/{i}/weight"),
                format!(
                    "a rubric criterion's weight must be a number from 0 to 1, not {}",
                    c.weight
                ),
            ));
            weights_ok = false;
        }
        if let Err(e) = scale::check(&c.scale) {
            issues.push(issue(format!("/criteria/{i}/scale"), e));
        }
    }
    if weights_ok && !rubric.criteria.is_empty() {
        if let Err(e) = check_weights(&rubric.criteria) {
            issues.push(issue("/criteria", e));
        }
    }
    let t = rubric.passing_threshold;
    if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
        issues.push(issue(
            "/passingThreshold",
            format!("a rubric's passingThreshold must be between 0 and 1, not {t}"),
        ));
    }
    issues
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use super::*;

    fn rubric(weights: &[f64]) -> Rubric {
        let mut r = default_creative_rubric();
        r.criteria = weights
            .iter()
            .enumerate()
            .map(|(i, w)| Criterion {
                name: format!("c{i}"),
                description: String::new(),
                weight: *w,
                scale: Scale::default(),
            })
            .collect();
        r
    }

    #[test]
    fn default_rubric_is_valid_and_as_designed() {
        let r = default_creative_rubric();
        assert!(validate(&r).is_empty());
        let names: Vec<(&str, f64)> = r
            .criteria
            .iter()
            .map(|c| (c.name.as_str(), c.weight))
            .collect();
        assert_eq!(
            names,
            vec![
                ("completeness", 0.30),
                ("coherence", 0.25),
                ("professionalism", 0.25),
                ("accuracy", 0.20)
            ]
        );
        assert_eq!(r.passing_threshold, 0.7);
    }

    #[test]
    fn weights_off_by_a_hundredth_are_rejected() {
        let issues = validate(&rubric(&[0.5, 0.49]));
        assert_eq!(issues.len(), 1);
        assert_eq!(issues[0].pointer, "/criteria");
        assert_eq!(
            issues[0].message,
            "rubric weights must sum to 1.0 (±0.001); they sum to 0.99"
        );
        let issues = validate(&rubric(&[0.5, 0.51]));
        assert!(
            issues[0].message.ends_with("they sum to 1.01"),
            "{}",
            issues[0].message
        );
    }

    #[test]
    fn weights_within_tolerance_are_accepted() {
        assert!(validate(&rubric(&[0.5, 0.5005])).is_empty());
        assert!(validate(&rubric(&[0.3333, 0.3333, 0.3334])).is_empty());
        assert!(check_weights(&rubric(&[0.4995, 0.5]).criteria).is_ok());
    }

    #[test]
    fn criteria_names_weights_scales_and_threshold_are_checked() {
        let mut r = rubric(&[0.5, 0.5, 0.0]);
        r.criteria[1].name = "c0".into();
        r.criteria[2].name = " ".into();
        r.criteria[0].scale = Scale::Range {
            min: 5.0,
            max: 1.0,
            descriptions: BTreeMap::new(),
        };
        r.criteria[1].scale = Scale::Named("stars".into());
        r.passing_threshold = 70.0;
        let pointers: Vec<String> = validate(&r).into_iter().map(|i| i.pointer).collect();
        assert_eq!(
            pointers,
            vec![
                "/criteria/0/scale",
                "/criteria/1/name",
                "/criteria/1/scale",
                "/criteria/2/name",
                "/passingThreshold"
            ]
        );
        let issues = validate(&rubric(&[-0.5, 1.5]));
        assert_eq!(issues[0].pointer, "/criteria/0/weight");
        // The sum is not also reported when a weight is itself wrong.
        assert_eq!(issues.len(), 1);
        assert_eq!(
            validate(&rubric(&[]))[0].message,
            "a rubric needs at least one criterion"
        );
    }
}
