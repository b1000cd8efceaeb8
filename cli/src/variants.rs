//! Baseline and repeats for `skilleval run`: every planned job becomes one job per
//! (configuration, attempt), and the results come back labelled so the run can report the
//! skill's uplift and pass@k in skill-creator's `benchmark.json`.
//!
//! The `with_skill` attempts are the run: its summary and verdict are over them (with repeats,
//! every attempt counts). The `without_skill` attempts (`--baseline`, `llm` runner only: the
//! same model, no SKILL.md) are only compared against. Attempt 1 with the skill writes the
//! usual `runs/<run-id>/grading/`; the others write `runs/<run-id>/<configuration>/run-<n>/
//! grading/`.

use std::path::{Path, PathBuf};

use serde_json::Value;
use skilleval::artifacts;
use skilleval::executor::JobResult;
use skilleval::llm::benchmark::{
    self, BaselineSummary, BenchmarkRun, Configuration, RepeatsSummary,
};
use skilleval::llm::runner::runner_for;
use skilleval::plan::Job;

/// Which configuration and attempt a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub configuration: Configuration,
    pub run_number: u32,
}

impl Variant {
    pub fn is_primary(self) -> bool {
        self.configuration == Configuration::WithSkill && self.run_number == 1
    }
}

/// The jobs of a run with `repeats` attempts each and, with `baseline`, as many without the
/// skill. With-skill attempts come first, so a budget stop cuts the comparison before the run.
/// Returns the labels, the jobs, and how many cases got no baseline (not an `llm` runner).
pub fn expand(jobs: &[Job], repeats: u32, baseline: bool) -> (Vec<Variant>, Vec<Job>, usize) {
    let repeats = repeats.max(1);
    let mut labels = Vec::new();
    let mut out = Vec::new();
    let is_llm = |j: &Job| skilleval::llm::runner::has_baseline(&j.runner.kind);
    for configuration in [Configuration::WithSkill, Configuration::WithoutSkill] {
        if configuration == Configuration::WithoutSkill && !baseline {
            continue;
        }
        for run_number in 1..=repeats {
            for job in jobs {
                let without = configuration == Configuration::WithoutSkill;
                if without && !is_llm(job) {
                    continue;
                }
                let mut j = job.clone();
                if is_llm(&j) {
                    j.runner = runner_for(&j.runner, without, run_number);
                }
                labels.push(Variant {
                    configuration,
                    run_number,
                });
                out.push(j);
            }
        }
    }
    let no_baseline = if baseline {
        jobs.iter().filter(|j| !is_llm(j)).count()
    } else {
        0
    };
    (labels, out, no_baseline)
}

/// What the baseline and repeats add to a run's outputs.
pub struct Extras {
    pub runs: Vec<BenchmarkRun>,
    pub summary: BaselineSummary,
    pub repeats: Option<RepeatsSummary>,
}

impl Extras {
    pub fn build(labels: &[Variant], results: &[JobResult], repeats: u32) -> Extras {
        let runs: Vec<BenchmarkRun> = labels
            .iter()
            .zip(results)
            .filter_map(|(v, r)| benchmark::benchmark_run(v.configuration, v.run_number, r))
            .collect();
        let summary = benchmark::run_summary(&runs);
        let repeats = (repeats > 1).then(|| {
            let with: Vec<&JobResult> = labels
                .iter()
                .zip(results)
                .filter(|(v, _)| v.configuration == Configuration::WithSkill)
                .map(|(_, r)| r)
                .collect();
            benchmark::repeat_stats(repeats, &with)
        });
        Extras {
            runs,
            summary,
            repeats,
        }
    }

    pub fn markdown(&self) -> String {
        benchmark::markdown(&self.summary, self.repeats.as_ref())
    }

    pub fn benchmark_json(&self, skill_name: &str, timestamp: &str, notes: &[String]) -> Value {
        benchmark::benchmark_json(
            skill_name,
            timestamp,
            &self.runs,
            &self.summary,
            self.repeats.as_ref(),
            notes,
        )
    }
}

/// Writes the grading files of the non-primary attempts; returns the folders written.
pub fn write_other_grading(
    run_dir: &Path,
    labels: &[Variant],
    results: &[JobResult],
) -> Result<Vec<PathBuf>, artifacts::ArtifactError> {
    let mut groups: Vec<(Variant, Vec<JobResult>)> = Vec::new();
    for (v, r) in labels.iter().zip(results) {
        if v.is_primary() {
            continue;
        }
        match groups.iter_mut().find(|(g, _)| g == v) {
            Some((_, rs)) => rs.push(r.clone()),
            None => groups.push((*v, vec![r.clone()])),
        }
    }
    let mut dirs = Vec::with_capacity(groups.len());
    for (v, rs) in groups {
        let dir = run_dir
            .join(v.configuration.as_str())
            .join(format!("run-{}", v.run_number));
        artifacts::write_grading(&dir, &rs)?;
        dirs.push(dir);
    }
    Ok(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval::llm::runner::{repeat_of, without_skill};
    use skilleval::model::{RunnerConfig, TestCase};

    fn job(id: &str, runner: &str) -> Job {
        Job {
            run_id: uuid::Uuid::nil(),
            case: TestCase {
                id: id.into(),
                ..TestCase::default()
            },
            case_index: 0,
            profile: skilleval::model::Profile::Creative,
            runner: RunnerConfig {
                kind: runner.into(),
                ..RunnerConfig::default()
            },
            timeout_ms: 1_000,
            retry_count: 0,
            package_hash: "h".into(),
            environment: Default::default(),
            given: None,
            suites: vec![],
            attempt: 1,
        }
    }

    #[test]
    fn with_skill_attempts_come_first_and_baselines_only_for_llm() {
        let jobs = vec![job("a", "llm"), job("b", "command")];
        let (labels, out, no_baseline) = expand(&jobs, 2, true);
        let shape: Vec<(&str, Configuration, u32)> = labels
            .iter()
            .zip(&out)
            .map(|(v, j)| (j.case.id.as_str(), v.configuration, v.run_number))
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
            out[3].runner.extra.len(),
            0,
            "a command runner is left as it is"
        );
        let (labels, out, _) = expand(&jobs, 1, false);
        assert_eq!((labels.len(), out.len()), (2, 2));
        assert!(labels.iter().all(|v| v.is_primary()));
    }
}
