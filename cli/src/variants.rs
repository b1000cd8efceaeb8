//! Baseline and repeats for `skilleval run`: every planned job becomes one job per
//! (configuration, attempt) ([`skilleval_execution::variant::expand`]), each result labelled by its
//! [`Variant`], so the run can report the skill's uplift and pass@k in skill-creator's
//! `benchmark.json` ([`skilleval_analysis::benchmark::Extras`], the code the service reports with).
//!
//! The `with_skill` attempts are the run: its summary and verdict are over them (with repeats,
//! every attempt counts). The `without_skill` attempts (`--baseline`, runners that can leave
//! the skill out only: the same model, no SKILL.md) are only compared against. Every attempt
//! has its folder in the run's skill-creator layout
//! (`runs/<run-id>/eval-<id>/<configuration>/run-<n>/`, [`skilleval_reports::skill_creator`]).

use skilleval_execution::executor::Executor;
use skilleval_execution::plan::Job;
pub use skilleval_execution::variant::Variant;

/// The jobs of a run with `repeats` attempts each and, with `baseline`, as many without the
/// skill (for the runners that can leave it out). With-skill attempts come first, so a budget
/// stop cuts the comparison before the run. Returns the jobs and how many cases got no
/// baseline.
pub fn expand(
    executor: &Executor,
    jobs: &[Job],
    repeats: u32,
    baseline: bool,
) -> (Vec<Job>, usize) {
    skilleval_execution::variant::expand(jobs, repeats, baseline, |j| {
        executor.runs_without_skill(&j.runner.kind)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_execution::executor::ExecutorBuilder;
    use skilleval_execution::variant::Configuration;
    use skilleval_execution::variant::{repeat_of, without_skill};
    use skilleval_model::definition::{RunnerConfig, TestCase};

    fn job(id: &str, runner: &str) -> Job {
        Job {
            run_id: uuid::Uuid::nil(),
            case: TestCase {
                id: id.into(),
                ..TestCase::default()
            },
            case_index: 0,
            profile: skilleval_model::definition::Profile::Creative,
            runner: RunnerConfig {
                kind: runner.into(),
                ..RunnerConfig::default()
            },
            timeout_ms: 1_000,
            retry_count: 0,
            package_hash: "h".into(),
            environment: Default::default(),
            scripts: Default::default(),
            dependencies: Vec::new(),
            given: None,
            suites: vec![],
            attempt: 1,
        }
    }

    #[test]
    fn with_skill_attempts_come_first_and_baselines_only_for_runners_that_leave_the_skill_out() {
        let executor = ExecutorBuilder::new().build();
        let jobs = vec![job("a", "llm"), job("b", "command")];
        let (out, no_baseline) = expand(&executor, &jobs, 2, true);
        let shape: Vec<(&str, Configuration, u32)> = out
            .iter()
            .map(|j| {
                let v = Variant::of(&j.runner);
                (j.case.id.as_str(), v.configuration, v.run_number)
            })
            .collect();
        use Configuration::{WithSkill as W, WithoutSkill as O};
        assert_eq!(
            shape,
            vec![
                ("a", W, 1),
                ("b", W, 1),
                ("a", W, 2),
                ("b", W, 2),
                ("a", O, 1),
                ("a", O, 2)
            ]
        );
        assert_eq!(no_baseline, 1);
        assert!(!without_skill(&out[0].runner) && without_skill(&out[4].runner));
        assert_eq!(repeat_of(&out[2].runner), Some(2));
        assert_eq!(
            repeat_of(&out[3].runner),
            Some(2),
            "every runner's attempts are numbered, so each has its own result"
        );
        let (out, _) = expand(&executor, &jobs, 1, false);
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|j| Variant::of(&j.runner).is_primary()));
    }
}
