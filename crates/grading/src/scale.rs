//! Score scales, normalised to [0, 1] so scores from different criteria and strategies can be
//! compared and averaged (design §4, "Scales normalise to [0,1]", and the evaluator seed's
//! normalisation rules).
//!
//! - `binary`, `pass/fail` (also `boolean`, `pass_fail`): 0 or 1; a number counts as 1 at 0.5 or
//!   above. [`normalize_value`] also takes booleans and the strings `pass`/`fail`/`true`/`false`/
//!   `yes`/`no`.
//! - `likert5` (also `likert`): `(s - 1) / 4`.
//! - `numeric`: within 0..1 as is; within 0..100 divided by 100 (so a `numeric` 1 is a perfect
//!   score, never 1 %).
//! - `percent` (also `percentage`): `s / 100`.
//! - `{min, max}`: `(s - min) / (max - min)`.
//!
//! Every result is clamped into [0, 1]; NaN becomes 0. An unknown named scale normalises as
//! `numeric` ([`check`] reports it as a problem at validation, so it only happens for data
//! written by hand).

use serde_json::Value;

use skilleval_model::definition::Scale;
use skilleval_model::grade::clamp_unit;

/// Scale names [`normalize`] understands, as an author would write them.
pub const KNOWN_SCALES: &[&str] = &["binary", "pass/fail", "likert5", "numeric", "percent"];

/// What a named scale means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Named {
    Binary,
    Likert5,
    Numeric,
    Percent,
}

fn named(name: &str) -> Option<Named> {
    match name.trim().to_ascii_lowercase().as_str() {
        "binary" | "boolean" | "bool" | "pass/fail" | "pass_fail" | "passfail" | "pass-fail" => {
            Some(Named::Binary)
        }
        "likert5" | "likert" | "likert-5" | "likert_5" => Some(Named::Likert5),
        "numeric" | "number" => Some(Named::Numeric),
        "percent" | "percentage" => Some(Named::Percent),
        _ => None,
    }
}

/// Checks a scale is one [`normalize`] knows and, for a range, that `min < max`.
pub fn check(scale: &Scale) -> Result<(), String> {
    match scale {
        Scale::Named(name) => match named(name) {
            Some(_) => Ok(()),
            None => Err(format!(
                "unknown scale `{name}`; use one of {} or {{\"min\", \"max\"}}",
                KNOWN_SCALES.join(", ")
            )),
        },
        Scale::Range { min, max, .. } => {
            if !min.is_finite() || !max.is_finite() {
                Err(format!(
                    "scale bounds must be finite numbers (min {min}, max {max})"
                ))
            } else if min >= max {
                Err(format!(
                    "scale min must be below max (min {min}, max {max})"
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Normalises a score on `scale` into [0, 1].
pub fn normalize(score: f64, scale: &Scale) -> f64 {
    if score.is_nan() {
        return 0.0;
    }
    let v = match scale {
        Scale::Named(name) => match named(name).unwrap_or(Named::Numeric) {
            Named::Binary => {
                if score >= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Named::Likert5 => (score - 1.0) / 4.0,
            Named::Numeric => {
                if (0.0..=1.0).contains(&score) {
                    score
                } else {
                    score / 100.0
                }
            }
            Named::Percent => score / 100.0,
        },
        Scale::Range { min, max, .. } => {
            let span = max - min;
            if span > 0.0 && span.is_finite() {
                (score - min) / span
            } else if score >= *max {
                // A degenerate range: only the top is a pass.
                1.0
            } else {
                0.0
            }
        }
    };
    clamp_unit(v)
}

/// Normalises a JSON score (a number, a boolean, or a string such as `"pass"`, `"false"` or
/// `"4"`) on `scale`. `None` when the value carries no score.
pub fn normalize_value(value: &Value, scale: &Scale) -> Option<f64> {
    match value {
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Value::Number(n) => n.as_f64().map(|f| normalize(f, scale)),
        Value::String(s) => {
            let t = s.trim();
            match t.to_ascii_lowercase().as_str() {
                "pass" | "passed" | "true" | "yes" => Some(1.0),
                "fail" | "failed" | "false" | "no" => Some(0.0),
                _ => t
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(|f| normalize(f, scale)),
            }
        }
        _ => None,
    }
}

/// The weighted mean of `(score, weight)` pairs. Pairs with a NaN score, or a weight that is not
/// a finite positive number, are left out; `None` when nothing is left.
pub fn weighted_mean(items: &[(f64, f64)]) -> Option<f64> {
    let mut total = 0.0;
    let mut weights = 0.0;
    for &(score, weight) in items {
        if score.is_nan() || !weight.is_finite() || weight <= 0.0 {
            continue;
        }
        total += score * weight;
        weights += weight;
    }
    if weights > 0.0 {
        Some(total / weights)
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    fn named_scale(n: &str) -> Scale {
        Scale::Named(n.to_string())
    }

    fn range(min: f64, max: f64) -> Scale {
        Scale::Range {
            min,
            max,
            descriptions: BTreeMap::new(),
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn binary_and_pass_fail_are_zero_or_one() {
        for name in ["binary", "pass/fail", "Pass_Fail", "boolean"] {
            let s = named_scale(name);
            assert_eq!(normalize(1.0, &s), 1.0, "{name}");
            assert_eq!(normalize(0.0, &s), 0.0, "{name}");
            assert_eq!(normalize(0.7, &s), 1.0, "{name}");
            assert_eq!(normalize(0.2, &s), 0.0, "{name}");
        }
    }

    #[test]
    fn likert5_maps_one_to_five_onto_unit() {
        let s = named_scale("likert5");
        assert_eq!(normalize(1.0, &s), 0.0);
        assert_eq!(normalize(3.0, &s), 0.5);
        assert_eq!(normalize(5.0, &s), 1.0);
        assert!(close(normalize(4.0, &s), 0.75));
        // Out of range is clamped.
        assert_eq!(normalize(7.0, &s), 1.0);
        assert_eq!(normalize(0.0, &s), 0.0);
    }

    #[test]
    fn numeric_keeps_unit_scores_and_divides_hundreds() {
        let s = named_scale("numeric");
        assert_eq!(normalize(0.42, &s), 0.42);
        assert_eq!(normalize(1.0, &s), 1.0);
        assert_eq!(normalize(85.0, &s), 0.85);
        assert_eq!(normalize(100.0, &s), 1.0);
        assert_eq!(normalize(250.0, &s), 1.0);
        assert_eq!(normalize(-3.0, &s), 0.0);
    }

    #[test]
    fn percent_divides_by_hundred() {
        let s = named_scale("percent");
        assert_eq!(normalize(1.0, &s), 0.01);
        assert_eq!(normalize(50.0, &s), 0.5);
        assert_eq!(normalize(120.0, &s), 1.0);
    }

    #[test]
    fn range_is_linear_and_clamped() {
        let s = range(0.0, 10.0);
        assert_eq!(normalize(7.0, &s), 0.7);
        assert_eq!(normalize(11.0, &s), 1.0);
        assert_eq!(normalize(-1.0, &s), 0.0);
        let s = range(1.0, 5.0);
        assert_eq!(normalize(2.0, &s), 0.25);
        // The default criterion scale is 1..5.
        assert_eq!(normalize(5.0, &Scale::default()), 1.0);
        // Degenerate ranges do not divide by zero.
        assert_eq!(normalize(3.0, &range(3.0, 3.0)), 1.0);
        assert_eq!(normalize(2.0, &range(3.0, 3.0)), 0.0);
    }

    #[test]
    fn nan_and_unknown_names() {
        assert_eq!(normalize(f64::NAN, &named_scale("numeric")), 0.0);
        // Unknown names behave as numeric.
        assert_eq!(normalize(40.0, &named_scale("stars")), 0.4);
    }

    #[test]
    fn check_rejects_unknown_names_and_inverted_ranges() {
        assert!(check(&named_scale("likert5")).is_ok());
        assert!(check(&range(0.0, 1.0)).is_ok());
        let e = check(&named_scale("stars")).unwrap_err();
        assert!(e.contains("unknown scale `stars`"), "{e}");
        let e = check(&range(5.0, 1.0)).unwrap_err();
        assert!(e.contains("min must be below max"), "{e}");
        assert!(check(&range(2.0, 2.0)).is_err());
    }

    #[test]
    fn normalize_value_accepts_bools_strings_and_numbers() {
        let bin = named_scale("pass/fail");
        assert_eq!(normalize_value(&json!(true), &bin), Some(1.0));
        assert_eq!(normalize_value(&json!(false), &bin), Some(0.0));
        assert_eq!(normalize_value(&json!("PASS"), &bin), Some(1.0));
        assert_eq!(normalize_value(&json!("fail"), &bin), Some(0.0));
        assert_eq!(normalize_value(&json!("true"), &bin), Some(1.0));
        assert_eq!(normalize_value(&json!("false"), &bin), Some(0.0));
        let likert = named_scale("likert5");
        assert_eq!(normalize_value(&json!(4), &likert), Some(0.75));
        assert_eq!(normalize_value(&json!(" 3 "), &likert), Some(0.5));
        assert_eq!(normalize_value(&json!("excellent"), &likert), None);
        assert_eq!(normalize_value(&json!(null), &likert), None);
        assert_eq!(normalize_value(&json!([1]), &likert), None);
    }

    #[test]
    fn weighted_mean_weights_and_skips_bad_pairs() {
        let m = weighted_mean(&[(1.0, 0.3), (0.5, 0.7)]).unwrap();
        assert!(close(m, 0.65), "{m}");
        // Weights need not sum to one.
        let m = weighted_mean(&[(1.0, 3.0), (0.0, 1.0)]).unwrap();
        assert!(close(m, 0.75), "{m}");
        // Zero, negative and NaN weights and NaN scores are skipped.
        let m = weighted_mean(&[
            (1.0, 1.0),
            (0.0, 0.0),
            (0.0, -2.0),
            (0.0, f64::NAN),
            (f64::NAN, 1.0),
        ])
        .unwrap();
        assert!(close(m, 1.0), "{m}");
        assert_eq!(weighted_mean(&[]), None);
        assert_eq!(weighted_mean(&[(0.5, 0.0)]), None);
    }
}
