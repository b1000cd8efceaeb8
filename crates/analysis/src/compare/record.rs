//! What the regression gate decided for a run, as its summary records it
//! (`summary.regression_gate`): the rule, the verdict, the thresholds, the run it was compared
//! with and why it failed. The service writes it at finalisation; the run view, the
//! `run.finished` webhook and the run's report read it back, so it lives below all of them.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::summary::Verdict;
use skilleval_model::gate::{GateConfig, GateRule};

/// Regressed cases a gate's verdict reason names before it counts the rest.
const REASON_CASES: usize = 20;

/// The gate's record in a run's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRecord {
    pub rule: GateRule,
    pub verdict: Verdict,
    pub config: GateConfig,
    /// The run compared with: the latest completed run of the last earlier version that passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_run: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_version: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison_id: Option<String>,
    /// Each rule that failed, in words.
    #[serde(default)]
    pub reasons: Vec<String>,
    /// The paired cases that regressed, worst first.
    #[serde(default)]
    pub regressed_cases: Vec<String>,
    /// Why the gate had nothing to judge, when it had not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl GateRecord {
    /// A `no_regression` gate that has judged nothing yet: it passes until a comparison says
    /// otherwise.
    pub fn no_regression(config: GateConfig) -> Self {
        GateRecord {
            rule: GateRule::NoRegression,
            verdict: Verdict::Pass,
            config,
            base_run: None,
            base_version: None,
            comparison_id: None,
            reasons: Vec::new(),
            regressed_cases: Vec::new(),
            note: None,
        }
    }

    /// The verdict reason a failed gate adds, naming the regressed cases.
    pub fn reason(&self) -> String {
        let shown: Vec<&str> = self
            .regressed_cases
            .iter()
            .take(REASON_CASES)
            .map(String::as_str)
            .collect();
        let more = self.regressed_cases.len().saturating_sub(shown.len());
        format!(
            "regression gate no_regression failed against run {}: {}; regressed cases: {}{}",
            self.base_run.map(|r| r.to_string()).unwrap_or_default(),
            self.reasons.join("; "),
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_what_the_summary_stored() {
        let mut record = GateRecord::no_regression(GateConfig::default());
        record.verdict = Verdict::Fail;
        record.base_run = Some(Uuid::nil());
        record.reasons = vec!["pass rate fell".into()];
        record.regressed_cases = (0..22).map(|i| format!("case-{i:03}")).collect();
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["rule"], "no_regression");
        assert_eq!(json["verdict"], "fail");
        assert!(json.get("note").is_none());
        let back: GateRecord = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
        let reason = record.reason();
        assert!(
            reason.contains("case-019") && !reason.contains("case-020"),
            "{reason}"
        );
        assert!(reason.ends_with(" and 2 more"), "{reason}");
    }
}
