//! Alert rules: is the last window's pass rate credibly below the baseline's? A pure state
//! machine, evaluated on the windows it is given, so the service's scheduler, the CLI and the
//! tests all drive it the same way.
//!
//! One evaluation ([`evaluate`]) compares the last `window_hours` with the `baseline_days`
//! before them (the window excluded, so a drop does not drag its own baseline down): fewer than
//! `min_samples` graded samples in the window (or none in the baseline) is `no_data`; otherwise
//! it is a breach when the pass rate fell at least `min_drop` below the baseline's and the
//! one-sided two-proportion z-test ([`crate::stats::two_proportion_z_test`]) gives
//! `p < max_p_value`. The [`AlertTracker`] fires when `breaches` of the last `of_last`
//! evaluations breached and resolves when fewer than that do; each transition is returned once,
//! never once per evaluation. A firing alert is not resolved by `no_data`: silence is not
//! evidence of recovery. A history younger than the window plus the baseline is not judged
//! ([`AlertRule::ready_at`]): a baseline of a few hours is not the skill's normal.

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::stats::two_proportion_z_test;
use skilleval_execution::monitor::definition::AlertRule;

/// Graded samples in a window and how many passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowCounts {
    pub passed: u64,
    pub n: u64,
}

impl WindowCounts {
    pub fn rate(&self) -> Option<f64> {
        (self.n > 0).then(|| self.passed as f64 / self.n as f64)
    }
}

/// What one evaluation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Too few samples to judge.
    NoData,
    /// Judged, not breached.
    Ok,
    Breached,
}

/// One evaluation of a rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    pub at: DateTime<Utc>,
    pub finding: Finding,
    pub window: WindowCounts,
    pub baseline: WindowCounts,
    /// `baseline rate − window rate` (positive on a drop), when both have samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
}

/// Judges one window against its baseline.
pub fn evaluate(
    rule: &AlertRule,
    at: DateTime<Utc>,
    window: WindowCounts,
    baseline: WindowCounts,
) -> Evaluation {
    let mut e = Evaluation {
        at,
        finding: Finding::NoData,
        window,
        baseline,
        drop: None,
        p_value: None,
    };
    if window.n < rule.min_samples || baseline.n == 0 {
        return e;
    }
    let Ok(test) = two_proportion_z_test(baseline.passed, baseline.n, window.passed, window.n)
    else {
        // Counts where passed > n: nothing sound to judge.
        return e;
    };
    let drop = -test.difference;
    e.drop = Some(drop);
    e.p_value = Some(test.p_value);
    // A hair's tolerance: a drop of exactly `min_drop` points counts despite float rounding.
    e.finding = if drop + 1e-12 >= rule.min_drop && test.p_value < rule.max_p_value {
        Finding::Breached
    } else {
        Finding::Ok
    };
    e
}

/// The state of a rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// Never evaluated with enough data, or the last evaluation had too little.
    #[default]
    NoData,
    Ok,
    Firing,
    /// Was firing, recovered; stays so until it fires again.
    Resolved,
}

impl AlertState {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::NoData => "no_data",
            AlertState::Ok => "ok",
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }
}

/// A transition worth telling someone about (one webhook each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    pub rule: String,
    pub from: AlertState,
    pub to: AlertState,
    pub evaluation: Evaluation,
}

/// A rule's state across evaluations; serialisable so a service can keep it between them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AlertTracker {
    pub state: AlertState,
    /// Whether each of the last `of_last` evaluations breached, oldest first.
    pub recent: VecDeque<bool>,
}

impl AlertTracker {
    /// Records an evaluation; returns the transition it caused, if any (`→ firing` or
    /// `firing → resolved`; quiet state changes such as `no_data → ok` return nothing).
    pub fn step(&mut self, rule: &AlertRule, evaluation: Evaluation) -> Option<Transition> {
        let keep = rule.of_last.max(1) as usize;
        let firing = self.state == AlertState::Firing;
        if evaluation.finding == Finding::NoData && firing {
            return None;
        }
        self.recent
            .push_back(evaluation.finding == Finding::Breached);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        let breached = self.recent.iter().filter(|b| **b).count() as u32;
        let from = self.state;
        let to = match (firing, breached >= rule.breaches, evaluation.finding) {
            (false, true, _) => AlertState::Firing,
            (true, true, _) => AlertState::Firing,
            (true, false, _) => AlertState::Resolved,
            (false, false, _) if from == AlertState::Resolved => AlertState::Resolved,
            (false, false, Finding::NoData) => AlertState::NoData,
            (false, false, _) => AlertState::Ok,
        };
        self.state = to;
        let signalled = (from != AlertState::Firing && to == AlertState::Firing)
            || (from == AlertState::Firing && to == AlertState::Resolved);
        signalled.then(|| Transition {
            rule: rule.name.clone(),
            from,
            to,
            evaluation,
        })
    }
}

/// Counts the graded samples observed in `[start, end)`.
pub fn counts_in<'a>(
    samples: impl IntoIterator<Item = &'a crate::quality::GradedSample>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> WindowCounts {
    let mut c = WindowCounts::default();
    for s in samples {
        if s.observed_at >= start && s.observed_at < end {
            if let Some(passed) = s.passed() {
                c.n += 1;
                c.passed += u64::from(passed);
            }
        }
    }
    c
}

/// Replays a rule over a history: evaluates it every `every` from `from` to `to` (inclusive)
/// and returns the final tracker and every transition, in order. Evaluations before the
/// history is [`AlertRule::ready_at`] are `no_data`.
pub fn replay(
    rule: &AlertRule,
    samples: &[crate::quality::GradedSample],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    every: Duration,
) -> (AlertTracker, Vec<Transition>) {
    let mut tracker = AlertTracker::default();
    let mut transitions = Vec::new();
    if every <= Duration::zero() {
        return (tracker, transitions);
    }
    let ready = samples
        .iter()
        .map(|s| s.observed_at)
        .min()
        .map(|first| rule.ready_at(first));
    let mut at = from;
    while at <= to {
        let (ws, we) = rule.window(at);
        let (bs, be) = rule.baseline(at);
        let mut e = evaluate(
            rule,
            at,
            counts_in(samples, ws, we),
            counts_in(samples, bs, be),
        );
        if ready.is_none_or(|r| at < r) {
            e.finding = Finding::NoData;
        }
        if let Some(t) = tracker.step(rule, e) {
            transitions.push(t);
        }
        at += every;
    }
    (tracker, transitions)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::quality::{GradedSample, SampleStatus};
    use chrono::TimeZone;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap()
    }

    fn eval_counts(rule: &AlertRule, passed: u64, n: u64) -> Evaluation {
        // Baseline 900/1000 = 90 %.
        evaluate(
            rule,
            t0(),
            WindowCounts { passed, n },
            WindowCounts {
                passed: 900,
                n: 1000,
            },
        )
    }

    #[test]
    fn the_default_rule_judges_size_drop_and_significance() {
        let rule = AlertRule::default();
        // 99 samples: too few, whatever they say.
        assert_eq!(eval_counts(&rule, 0, 99).finding, Finding::NoData);
        // 200 at 80 %: ten points down; pooled p̄ = 1060/1200, SE = 0.02487, z = −4.02, p ≈ 3e-5.
        let e = eval_counts(&rule, 160, 200);
        assert_eq!(e.finding, Finding::Breached);
        assert!((e.drop.unwrap() - 0.10).abs() < 1e-12);
        assert!(e.p_value.unwrap() < 1e-4);
        // 100 at 86 %: four points down: below the 5-point floor, not an alert.
        assert_eq!(eval_counts(&rule, 86, 100).finding, Finding::Ok);
        // 100 at 85 %: five points, but SE = 0.03209, z = −1.56, p ≈ 0.06: not significant.
        let e = eval_counts(&rule, 85, 100);
        assert_eq!(e.finding, Finding::Ok);
        assert!(e.p_value.unwrap() > 0.01);
        // A rise is never a breach.
        assert_eq!(eval_counts(&rule, 100, 100).finding, Finding::Ok);
        // No baseline: nothing to compare with.
        let e = evaluate(
            &rule,
            t0(),
            WindowCounts { passed: 1, n: 500 },
            WindowCounts::default(),
        );
        assert_eq!(e.finding, Finding::NoData);
    }

    fn step_all(findings: &[Finding]) -> (AlertTracker, Vec<(usize, AlertState, AlertState)>) {
        let rule = AlertRule::default();
        let mut tracker = AlertTracker::default();
        let mut out = Vec::new();
        for (i, f) in findings.iter().enumerate() {
            let mut e = eval_counts(&rule, 90, 100);
            e.finding = *f;
            if let Some(t) = tracker.step(&rule, e) {
                out.push((i, t.from, t.to));
            }
        }
        (tracker, out)
    }

    #[test]
    fn fires_on_two_of_three_and_resolves_once() {
        use Finding::{Breached as B, NoData as N, Ok as O};
        let (tracker, transitions) = step_all(&[O, B, O, B, B, B, N, B, O, O, O, O]);
        assert_eq!(
            transitions,
            vec![
                (3, AlertState::Ok, AlertState::Firing),
                (9, AlertState::Firing, AlertState::Resolved)
            ]
        );
        assert_eq!(tracker.state, AlertState::Resolved);
        // A single breach never fires.
        let (tracker, transitions) = step_all(&[O, B, O, O, B, O, O]);
        assert!(transitions.is_empty());
        assert_eq!(tracker.state, AlertState::Ok);
        // It can fire again after resolving, once more.
        let (_, transitions) = step_all(&[B, B, O, O, B, B, B]);
        assert_eq!(
            transitions,
            vec![
                (1, AlertState::Ok, AlertState::Firing),
                (3, AlertState::Firing, AlertState::Resolved),
                (5, AlertState::Resolved, AlertState::Firing)
            ]
        );
    }

    /// A synthetic history: `per_hour` samples an hour, passing at `rate(hour)`, spread evenly
    /// (passes first in each hour's order is irrelevant to the counts).
    fn history(hours: i64, per_hour: u64, rate: impl Fn(i64) -> f64) -> Vec<GradedSample> {
        let mut out = Vec::new();
        for h in 0..hours {
            let passes = (rate(h) * per_hour as f64).round() as u64;
            for i in 0..per_hour {
                let at =
                    t0() + Duration::hours(h) + Duration::seconds((i * 3600 / per_hour) as i64);
                out.push(GradedSample {
                    sample_id: format!("{h}-{i}"),
                    observed_at: at,
                    version: None,
                    monitor_revision: 1,
                    status: if i < passes {
                        SampleStatus::Passed
                    } else {
                        SampleStatus::Failed
                    },
                    score: Some(if i < passes { 1.0 } else { 0.0 }),
                    criteria: Default::default(),
                });
            }
        }
        out
    }

    #[test]
    fn an_injected_drop_fires_exactly_once_and_recovery_resolves_once() {
        let rule = AlertRule::default();
        // 10 days at 90 %, 2 days at 75 %, then 10 days back at 90 %; 20 samples an hour.
        let drop_start = 24 * 10;
        let drop_end = drop_start + 48;
        let samples = history(24 * 22, 20, |h| {
            if (drop_start..drop_end).contains(&h) {
                0.75
            } else {
                0.9
            }
        });
        let (tracker, transitions) = replay(
            &rule,
            &samples,
            t0() + Duration::days(8),
            t0() + Duration::hours(24 * 22),
            Duration::hours(1),
        );
        let kinds: Vec<(AlertState, AlertState)> =
            transitions.iter().map(|t| (t.from, t.to)).collect();
        assert_eq!(
            kinds,
            vec![
                (AlertState::Ok, AlertState::Firing),
                (AlertState::Firing, AlertState::Resolved)
            ],
            "{transitions:#?}"
        );
        let fired = &transitions[0].evaluation;
        assert!(fired.at > t0() + Duration::hours(drop_start));
        assert!(fired.at < t0() + Duration::hours(drop_end));
        assert!(transitions[1].evaluation.at > t0() + Duration::hours(drop_end));
        assert_eq!(tracker.state, AlertState::Resolved);
    }

    #[test]
    fn a_small_window_never_alerts() {
        let rule = AlertRule::default();
        // 3 samples an hour (72 a day, under the 100 floor), with a 40-point drop.
        let samples = history(24 * 14, 3, |h| if h >= 24 * 10 { 0.34 } else { 1.0 });
        let (tracker, transitions) = replay(
            &rule,
            &samples,
            t0() + Duration::days(8),
            t0() + Duration::days(14),
            Duration::hours(1),
        );
        assert!(transitions.is_empty(), "{transitions:#?}");
        assert_eq!(tracker.state, AlertState::NoData);
    }

    #[test]
    fn a_history_younger_than_its_baseline_is_not_judged() {
        let rule = AlertRule::default();
        // A 25-point drop on day 2, plenty of samples: but the baseline is a day old.
        let samples = history(24 * 3, 20, |h| if h >= 30 { 0.7 } else { 0.95 });
        let (tracker, transitions) = replay(
            &rule,
            &samples,
            t0() + Duration::hours(1),
            t0() + Duration::days(3),
            Duration::hours(1),
        );
        assert!(transitions.is_empty(), "{transitions:#?}");
        assert_eq!(tracker.state, AlertState::NoData);
        // The same windows judged directly do breach: it is the age that holds them back.
        let at = t0() + Duration::hours(60);
        let (ws, we) = rule.window(at);
        let (bs, be) = rule.baseline(at);
        let e = evaluate(
            &rule,
            at,
            counts_in(&samples, ws, we),
            counts_in(&samples, bs, be),
        );
        assert_eq!(e.finding, Finding::Breached);
        assert_eq!(rule.ready_at(t0()), t0() + Duration::days(8));
    }

    #[test]
    fn rule_problems_name_the_field() {
        let rule = AlertRule {
            breaches: 4,
            min_drop: 1.5,
            ..AlertRule::default()
        };
        let fields: Vec<&str> = rule.problems().iter().map(|(f, _)| *f).collect();
        assert_eq!(fields, ["min_drop", "breaches"]);
        assert!(AlertRule::default().problems().is_empty());
    }

    #[test]
    fn the_sizing_table_in_docs_monitoring_is_what_the_code_computes() {
        use crate::stats::{cases_for_drop, Design, Pairing, Sided};
        let doc = include_str!("../../../../docs/monitoring.md");
        let from = doc.find("<!-- monitoring-sizing -->").unwrap();
        let to = doc.find("<!-- /monitoring-sizing -->").unwrap();
        let rows: Vec<Vec<f64>> = doc[from..to]
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| Baseline"))
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_end_matches('%').trim().parse().unwrap())
                    .collect()
            })
            .collect();
        assert_eq!(rows.len(), 4);
        let rule = AlertRule::default();
        for row in rows {
            // As docs/comparing.md's window table: the baseline holds six times the window's
            // samples (seven days, counted conservatively for quieter days).
            let design = Design {
                cases: 100,
                repeats: 1,
                baseline_pass_rate: row[0] / 100.0,
                within_case_share: 0.0,
                pairing: Pairing::Unpaired { other_cases: 600 },
                alpha: rule.max_p_value,
                power: 0.8,
                sided: Sided::OneSided,
            };
            let five = cases_for_drop(&design, rule.min_drop).unwrap();
            let ten = cases_for_drop(&design, 0.10).unwrap();
            assert_eq!(
                [five as f64, ten as f64],
                [row[1], row[2]],
                "baseline {}",
                row[0]
            );
            assert_eq!((five as f64 / 0.1).round(), row[3]);
        }
    }
}
