//! A run's `runInSequence` chains: which plan positions the publishing pipeline holds back
//! from its watermark pass and publishes one at a time instead, each once the case before it
//! in its chain is recorded (`crate::runs::publish`).
//!
//! The chains are the groups of `skilleval_execution::plan::run_order` that have more than one
//! job, the same grouping `skilleval run` executes: a suite's cases in its `testIds` order, a
//! case's variants together at its place, a case listed by two such suites in the first. They
//! are computed once per plan from every job of it (only for a definition that has such a
//! suite) and keep only the chains' jobs. A chain's index is its order among the run's chains,
//! the same every time the plan is read, which the store's cursors are keyed by.

use skilleval_execution::plan::{run_order, Job};
use skilleval_model::definition::EvalConfig;

/// The chains of one run's plan.
#[derive(Debug, Default)]
pub struct Chains {
    /// Per chain, in chain order: (plan position, job).
    chains: Vec<Vec<(usize, Job)>>,
    /// Every chain member's plan position, sorted.
    positions: Vec<usize>,
}

impl Chains {
    /// The chains of a plan whose jobs, in plan order, are `jobs` (position = index).
    pub fn of(config: &EvalConfig, jobs: Vec<Job>) -> Chains {
        let groups: Vec<Vec<usize>> = run_order(config, &jobs)
            .into_iter()
            .filter(|g| g.len() > 1)
            .collect();
        let mut slots: Vec<Option<Job>> = jobs.into_iter().map(Some).collect();
        let mut positions = Vec::new();
        let chains = groups
            .into_iter()
            .map(|group| {
                group
                    .into_iter()
                    .filter_map(|p| {
                        positions.push(p);
                        slots.get_mut(p).and_then(Option::take).map(|job| (p, job))
                    })
                    .collect()
            })
            .collect();
        positions.sort_unstable();
        Chains { chains, positions }
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// The chains, in chain order: (plan position, job) each, in the order they run.
    pub fn chains(&self) -> &[Vec<(usize, Job)>] {
        &self.chains
    }

    /// Each chain's length, as the store's cursors record it.
    pub fn lengths(&self) -> Vec<i32> {
        self.chains
            .iter()
            .map(|c| i32::try_from(c.len()).unwrap_or(i32::MAX))
            .collect()
    }

    /// Whether plan position `p` belongs to a chain (the watermark pass skips it).
    pub fn holds(&self, p: usize) -> bool {
        self.positions.binary_search(&p).is_ok()
    }

    /// How many chain positions lie below plan position `end`.
    pub fn below(&self, end: usize) -> usize {
        self.positions.partition_point(|&p| p < end)
    }

    /// How many positions from `from` a watermark pass covers to publish `room` jobs that are
    /// not chain members (at most to `total`): `room` plus the chain positions it skips.
    pub fn span(&self, from: usize, room: usize, total: usize) -> usize {
        let end_max = total.max(from);
        let mut limit = room;
        loop {
            let end = from.saturating_add(limit).min(end_max);
            let skipped = self.below(end) - self.below(from);
            let wanted = room.saturating_add(skipped);
            if wanted <= limit || end == end_max {
                return end - from;
            }
            limit = wanted;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::Chains;
    use skilleval_execution::plan::{plan, CaseFilter};
    use skilleval_model::definition::EvalConfig;
    use uuid::Uuid;

    fn config(n: usize, order: &[usize]) -> EvalConfig {
        let cases: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                serde_json::json!({
                    "id": format!("c{i}"),
                    "input": {"prompt": "p"},
                    "expected": {"output": "ok"},
                    "evaluation": {"strategy": "exact_match"},
                    "given": {"output": "ok"},
                })
            })
            .collect();
        let ids: Vec<String> = order.iter().map(|i| format!("c{i}")).collect();
        serde_json::from_value(serde_json::json!({
            "version": "2.0",
            "settings": {"runner": "given"},
            "testCases": cases,
            "suites": [{"name": "ordered", "testIds": ids, "runInSequence": true}],
        }))
        .unwrap()
    }

    #[test]
    fn a_chain_is_its_suites_order_and_its_positions_are_held_back() {
        let config = config(6, &[4, 1, 3]);
        let jobs = plan(&config, "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        let chains = Chains::of(&config, jobs);
        assert_eq!(chains.lengths(), vec![3]);
        let order: Vec<(usize, &str)> = chains.chains()[0]
            .iter()
            .map(|(p, j)| (*p, j.case.id.as_str()))
            .collect();
        assert_eq!(order, vec![(4, "c4"), (1, "c1"), (3, "c3")]);
        assert!(chains.holds(1) && chains.holds(3) && chains.holds(4));
        assert!(!chains.holds(0) && !chains.holds(2) && !chains.holds(5));
        assert_eq!(chains.below(4), 2);
        // Two jobs that are not chain members from position 0: positions 0..3 (1 skipped).
        assert_eq!(chains.span(0, 2, 6), 3);
        // Three from 0: 0, 2 and 5, skipping 1, 3 and 4.
        assert_eq!(chains.span(0, 3, 6), 6);
        // Never past the plan.
        assert_eq!(chains.span(2, 10, 6), 4);
        assert_eq!(chains.span(6, 1, 6), 0);
    }

    #[test]
    fn a_definition_without_sequences_has_no_chains() {
        let mut config = config(3, &[0, 1]);
        config.suites[0].run_in_sequence = false;
        let jobs = plan(&config, "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        let chains = Chains::of(&config, jobs);
        assert!(chains.is_empty());
        assert_eq!(chains.span(0, 2, 3), 2);
    }
}
