//! Which configuration and attempt a job is: with or without the skill (a baseline), which
//! repeat, or a trigger eval query. A variant travels with the job as runner options, which the
//! runners interpret, and is recorded with its result, so a case has one row per variant. The
//! arithmetic over variants (uplift, pass@k) is the analysis layer's; this module only names
//! them, expands a run's jobs into them, and reads them back from a runner configuration.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::plan::Job;
use skilleval_model::definition::RunnerConfig;

/// Runner option: produce without the skill (the baseline configuration).
pub const WITHOUT_SKILL_OPTION: &str = "withoutSkill";
/// Runner option: which attempt of a repeated run this is (1-based).
pub const REPEAT_OPTION: &str = "repeat";
/// The runner's name.
pub const TRIGGER_RUNNER: &str = "trigger";

/// Whether a runner kind asks a model, so it has a baseline without the skill and repeats
/// that differ: `llm` (no system prompt) and `agent` (the skill left out of the catalogue).
pub fn has_baseline(kind: &str) -> bool {
    matches!(kind, "llm" | "agent")
}

/// Whether a runner configuration asks for the baseline (no skill).
pub fn without_skill(runner: &RunnerConfig) -> bool {
    runner
        .extra
        .get(WITHOUT_SKILL_OPTION)
        .and_then(Value::as_bool)
        == Some(true)
}

/// The repeat number a runner configuration carries, if any.
pub fn repeat_of(runner: &RunnerConfig) -> Option<u64> {
    runner.extra.get(REPEAT_OPTION).and_then(Value::as_u64)
}

/// A copy of `runner` set for one configuration and attempt (used to plan baselines and
/// repeats).
pub fn runner_for(runner: &RunnerConfig, without: bool, repeat: u32) -> RunnerConfig {
    let mut r = runner.clone();
    if without {
        r.extra.insert(WITHOUT_SKILL_OPTION.into(), json!(true));
    } else {
        r.extra.remove(WITHOUT_SKILL_OPTION);
    }
    if repeat > 1 {
        r.extra.insert(REPEAT_OPTION.into(), json!(repeat));
    } else {
        r.extra.remove(REPEAT_OPTION);
    }
    r
}

/// Whether a job is a trigger eval query.
pub fn is_trigger(runner: &RunnerConfig) -> bool {
    runner.kind == TRIGGER_RUNNER
}

/// With or without the skill loaded; or a trigger eval query (a job of the run that is no
/// case: it asks whether the skill's description gets it selected).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Configuration {
    WithSkill,
    WithoutSkill,
    Trigger,
}

impl Configuration {
    pub fn as_str(self) -> &'static str {
        match self {
            Configuration::WithSkill => "with_skill",
            Configuration::WithoutSkill => "without_skill",
            Configuration::Trigger => "trigger",
        }
    }

    /// The configuration [`Configuration::as_str`] names.
    pub fn parse(s: &str) -> Option<Configuration> {
        match s {
            "with_skill" => Some(Configuration::WithSkill),
            "without_skill" => Some(Configuration::WithoutSkill),
            "trigger" => Some(Configuration::Trigger),
            _ => None,
        }
    }
}

/// Which configuration and attempt a job (and its result) is: what a baseline and repeats
/// add to a case. Carried by the job as runner options ([`WITHOUT_SKILL_OPTION`],
/// [`REPEAT_OPTION`]), which the runner interprets, and recorded with the
/// result, so a case's row is one per (configuration, attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Variant {
    pub configuration: Configuration,
    /// 1-based attempt number.
    pub run_number: u32,
}

impl Default for Variant {
    fn default() -> Self {
        Variant::PRIMARY
    }
}

impl Variant {
    /// With the skill, attempt 1: the only variant of a run without baseline or repeats.
    pub const PRIMARY: Variant = Variant {
        configuration: Configuration::WithSkill,
        run_number: 1,
    };

    pub fn is_primary(&self) -> bool {
        *self == Variant::PRIMARY
    }

    /// The variant a job's runner options ask for.
    pub fn of(runner: &RunnerConfig) -> Variant {
        if is_trigger(runner) {
            return Variant {
                configuration: Configuration::Trigger,
                run_number: 1,
            };
        }
        Variant {
            configuration: if without_skill(runner) {
                Configuration::WithoutSkill
            } else {
                Configuration::WithSkill
            },
            run_number: repeat_of(runner)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(1)
                .max(1),
        }
    }

    /// The variants of a run, in planning order: every with-skill attempt, then (with
    /// `baseline`) every without-skill one, so a budget stop cuts the comparison first.
    pub fn all(repeats: u32, baseline: bool) -> Vec<Variant> {
        let repeats = repeats.max(1);
        let mut out = Vec::new();
        for configuration in [Configuration::WithSkill, Configuration::WithoutSkill] {
            if configuration == Configuration::WithoutSkill && !baseline {
                continue;
            }
            for run_number in 1..=repeats {
                out.push(Variant {
                    configuration,
                    run_number,
                });
            }
        }
        out
    }

    /// `job` set to run as this variant (its runner options say so; the runner interprets
    /// them, see [`crate::runner::OutputRunner::runs_without_skill`]).
    pub fn apply(self, job: &mut Job) {
        job.runner = runner_for(
            &job.runner,
            self.configuration == Configuration::WithoutSkill,
            self.run_number,
        );
    }
}

/// Serde helper: a result's variant is written only when it is not the primary one.
pub fn skip_primary(v: &Variant) -> bool {
    v.is_primary()
}

/// The jobs of a run with `repeats` attempts each and, with `baseline`, as many without the
/// skill for the jobs `can_baseline` accepts, each set to its variant, in [`Variant::all`]'s
/// order. Returns the jobs and how many cases got no baseline.
pub fn expand(
    jobs: &[Job],
    repeats: u32,
    baseline: bool,
    can_baseline: impl Fn(&Job) -> bool,
) -> (Vec<Job>, usize) {
    let mut out = Vec::new();
    for variant in Variant::all(repeats, baseline) {
        for job in jobs {
            if variant.configuration == Configuration::WithoutSkill && !can_baseline(job) {
                continue;
            }
            let mut j = job.clone();
            variant.apply(&mut j);
            out.push(j);
        }
    }
    let no_baseline = if baseline {
        jobs.iter().filter(|j| !can_baseline(j)).count()
    } else {
        0
    };
    (out, no_baseline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runner_options_for_baseline_and_repeats() {
        let base = RunnerConfig {
            kind: "llm".into(),
            ..RunnerConfig::default()
        };
        let r = runner_for(&base, true, 3);
        assert!(without_skill(&r));
        assert_eq!(repeat_of(&r), Some(3));
        let r = runner_for(&r, false, 1);
        assert!(!without_skill(&r));
        assert_eq!(repeat_of(&r), None);
    }
}
