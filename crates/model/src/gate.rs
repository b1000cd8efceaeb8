//! The regression gate as a definition or a run request states it: which rule, with which
//! thresholds. The gate's decision (a comparison of two runs) is made in `compare`; this module
//! only holds what is asked for, so the definition can name a gate without knowing statistics.

use serde::{Deserialize, Serialize};

/// When the regression gate fails.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateConfig {
    /// The McNemar test's significance level for "the pass rate fell" (0.05).
    pub alpha: f64,
    /// The gate fails when the mean-score interval lies entirely below this (−0.02).
    pub score_margin: f64,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            alpha: 0.05,
            score_margin: -0.02,
        }
    }
}

/// Which regression gate a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateRule {
    /// Fail when the run is significantly worse than the last version whose run passed.
    NoRegression,
    /// No gate (overrides a definition's).
    None,
    /// An upload's catalogue gate (docs/catalogue.md): fail when the new skill takes more than
    /// the configured share of a neighbour's trigger queries. It is decided by the version's
    /// collision eval, not by comparing runs, so it sets no regression gate.
    NoCollision,
}

/// A gate as a request or a definition states it: its rule alone (the default thresholds),
/// or the rule with its thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GateSpec {
    Rule(GateRule),
    Detailed {
        rule: GateRule,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        alpha: Option<f64>,
        #[serde(
            default,
            alias = "scoreMargin",
            skip_serializing_if = "Option::is_none"
        )]
        score_margin: Option<f64>,
    },
}

/// A gate threshold out of its range: the field (under the gate) and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {rule}")]
pub struct GateSpecError {
    pub field: &'static str,
    pub rule: &'static str,
}

impl GateSpec {
    /// The thresholds to gate with; `None` for the `none` rule. The significance level must
    /// lie in (0, 1), the score margin in [−1, 0].
    pub fn config(&self) -> Result<Option<GateConfig>, GateSpecError> {
        let (rule, alpha, margin) = match *self {
            GateSpec::Rule(rule) => (rule, None, None),
            GateSpec::Detailed {
                rule,
                alpha,
                score_margin,
            } => (rule, alpha, score_margin),
        };
        if matches!(rule, GateRule::None | GateRule::NoCollision) {
            return Ok(None);
        }
        let defaults = GateConfig::default();
        let alpha = alpha.unwrap_or(defaults.alpha);
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(GateSpecError {
                field: "alpha",
                rule: "must be a number between 0 and 1 (exclusive)",
            });
        }
        let score_margin = margin.unwrap_or(defaults.score_margin);
        if !(-1.0..=0.0).contains(&score_margin) {
            return Err(GateSpecError {
                field: "score_margin",
                rule: "must be a number between -1 and 0",
            });
        }
        Ok(Some(GateConfig {
            alpha,
            score_margin,
        }))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_gate_is_a_rule_or_a_rule_with_thresholds_in_range() {
        let named: GateSpec = serde_json::from_value(json!("no_regression")).unwrap();
        assert_eq!(named.config().unwrap(), Some(GateConfig::default()));
        let detailed: GateSpec = serde_json::from_value(
            json!({"rule": "no_regression", "alpha": 0.01, "scoreMargin": -0.1}),
        )
        .unwrap();
        assert_eq!(
            detailed.config().unwrap(),
            Some(GateConfig {
                alpha: 0.01,
                score_margin: -0.1
            })
        );
        let none: GateSpec = serde_json::from_value(json!("none")).unwrap();
        assert_eq!(none.config().unwrap(), None);
        assert!(serde_json::from_value::<GateSpec>(json!("no_regresion")).is_err());
        let bad_alpha: GateSpec =
            serde_json::from_value(json!({"rule": "no_regression", "alpha": 1.0})).unwrap();
        assert_eq!(bad_alpha.config().unwrap_err().field, "alpha");
        let bad_margin: GateSpec =
            serde_json::from_value(json!({"rule": "no_regression", "score_margin": 0.5})).unwrap();
        assert_eq!(bad_margin.config().unwrap_err().field, "score_margin");
    }
}
