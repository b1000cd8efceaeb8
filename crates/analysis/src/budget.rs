//! A per-run spending cap: at most this much money or this many tokens (producing and grading
//! together).
//!
//! The run records what each finished case spent ([`Budget::record`]) and asks before starting
//! the next one ([`Budget::exceeded`]); once over, no case starts — those not started are
//! recorded as skipped with the reason, and [`mark_stopped`] makes the verdict `fail` with a
//! line saying the budget stopped the run. Cases already in flight finish, so a run may end a
//! little over its cap (by at most what the in-flight cases spend).

use std::sync::Mutex;

use crate::summary::{RunSummary, Verdict};
use skilleval_model::grade::Usage;

/// What every skip reason of a budget stop starts with.
pub const BUDGET_EXCEEDED: &str = "budget exceeded";

/// The caps; either may be absent.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BudgetLimits {
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
}

impl BudgetLimits {
    pub fn is_unlimited(&self) -> bool {
        self.max_cost_usd.is_none() && self.max_tokens.is_none()
    }
}

/// What a run has spent against its caps.
#[derive(Debug, Default)]
pub struct Budget {
    limits: BudgetLimits,
    spent: Mutex<Usage>,
}

impl Budget {
    pub fn new(limits: BudgetLimits) -> Self {
        Budget {
            limits,
            spent: Mutex::new(Usage::default()),
        }
    }

    pub fn limits(&self) -> BudgetLimits {
        self.limits
    }

    pub fn record(&self, usage: &Usage) {
        if let Ok(mut s) = self.spent.lock() {
            s.add(usage);
        }
    }

    pub fn spent(&self) -> Usage {
        self.spent.lock().map(|s| *s).unwrap_or_default()
    }

    /// `Some(reason)` once a cap is reached: the skip reason of cases not started.
    pub fn exceeded(&self) -> Option<String> {
        let spent = self.spent();
        if let Some(max) = self.limits.max_cost_usd {
            if spent.cost_usd >= max {
                return Some(format!(
                    "{BUDGET_EXCEEDED}: spent ${:.4} of the ${max:.4} limit (--max-cost)",
                    spent.cost_usd
                ));
            }
        }
        if let Some(max) = self.limits.max_tokens {
            if spent.total_tokens() >= max {
                return Some(format!(
                    "{BUDGET_EXCEEDED}: spent {} of the {max} token limit (--max-tokens)",
                    spent.total_tokens()
                ));
            }
        }
        None
    }
}

/// Makes the verdict `fail` with a reason saying the budget stopped the run and how many cases
/// did not run.
pub fn mark_stopped(summary: &mut RunSummary, reason: &str, not_run: u64) {
    summary.verdict = Verdict::Fail;
    summary.verdict_reasons.insert(
        0,
        format!("the run was stopped: {reason}; {not_run} case(s) not run (recorded as skipped)"),
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn caps_on_cost_and_tokens() {
        let b = Budget::new(BudgetLimits {
            max_cost_usd: Some(0.01),
            max_tokens: None,
        });
        assert_eq!(b.exceeded(), None);
        b.record(&Usage {
            input_tokens: 1_000,
            output_tokens: 100,
            cost_usd: 0.006,
        });
        assert_eq!(b.exceeded(), None);
        b.record(&Usage {
            input_tokens: 1_000,
            output_tokens: 100,
            cost_usd: 0.006,
        });
        assert_eq!(
            b.exceeded().unwrap(),
            "budget exceeded: spent $0.0120 of the $0.0100 limit (--max-cost)"
        );
        let t = Budget::new(BudgetLimits {
            max_cost_usd: None,
            max_tokens: Some(500),
        });
        t.record(&Usage {
            input_tokens: 400,
            output_tokens: 100,
            cost_usd: 0.0,
        });
        assert!(t.exceeded().unwrap().contains("500 of the 500 token limit"));
        assert!(Budget::default().limits().is_unlimited());
    }
}
