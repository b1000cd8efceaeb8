//! Planning: one validated eval definition becomes one [`Job`] per selected test case.
//!
//! A job is self-contained — the resolved case (templated prompt, strategy name filled in), the
//! runner, the timeout and the package's content hash — so a worker needs no database read to
//! start it and the CLI needs nothing else to execute it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::model::{EvalConfig, Given, Profile, RunnerConfig, TestCase};

/// One test case to produce and grade.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Job {
    pub run_id: Uuid,
    /// The case as it will run: prompt templated, `evaluation.strategy` resolved.
    pub case: TestCase,
    /// Position in the eval file, for stable report ordering.
    pub case_index: u32,
    pub profile: Profile,
    pub runner: RunnerConfig,
    /// Wall-clock limit for producing and grading one attempt.
    pub timeout_ms: u64,
    /// Extra attempts for a failing (not erroring) case.
    pub retry_count: u32,
    /// SHA-256 of the package content; workers fetch and cache packages by it.
    pub package_hash: String,
    /// `setup.environment`, passed to the command runner.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub environment: BTreeMap<String, String>,
    /// A recorded output sent with the job (production samples), overriding the case's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<Given>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suites: Vec<String>,
    /// Which delivery of this job this is (1 on first publish), counted by whoever retries.
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

fn first_attempt() -> u32 {
    1
}

impl Job {
    pub fn strategy(&self) -> &str {
        self.case.strategy_name(self.profile)
    }
}

/// Which cases of a definition to run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CaseFilter {
    /// Keep cases carrying any of these tags (empty: all).
    #[serde(default)]
    pub tags: Vec<String>,
    /// Keep only these case ids (empty: all).
    #[serde(default)]
    pub case_ids: Vec<String>,
    /// Keep only the cases of this suite.
    #[serde(default)]
    pub suite: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PlanError {
    #[error("unknown suite `{0}`; the eval definition has: {1}")]
    UnknownSuite(String, String),
    #[error("unknown test case id `{0}`")]
    UnknownCase(String),
    #[error(
        "no test case matches the filter (tags: {tags:?}, cases: {cases:?}, suite: {suite:?})"
    )]
    Empty {
        tags: Vec<String>,
        cases: Vec<String>,
        suite: Option<String>,
    },
}

/// The runner a case uses when the run names none: the file's `settings.runner`, else `given`
/// when the case carries a recorded output, else `llm`.
pub fn default_runner(config: &EvalConfig, case: &TestCase) -> RunnerConfig {
    match &config.settings.runner {
        Some(spec) => spec.config(),
        None if case.given.is_some() => RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        },
        None => RunnerConfig {
            kind: "llm".into(),
            ..RunnerConfig::default()
        },
    }
}

/// Plans the jobs of a run. `config` must be the resolved (templated) definition.
pub fn plan(
    config: &EvalConfig,
    package_hash: &str,
    run_id: Uuid,
    filter: &CaseFilter,
    runner_override: Option<&RunnerConfig>,
) -> Result<Vec<Job>, PlanError> {
    let suite_ids = check_filter(config, &config.test_cases, filter)?;
    let cases = config.test_cases.iter().map(Cow::Borrowed);
    let planner = Planner {
        config,
        package_hash,
        run_id,
        runner_override,
    };
    planner.plan(cases, filter, suite_ids.as_deref())
}

/// [`plan`] for a caller done with the definition's cases: they are moved into the jobs, not
/// copied, and `config.test_cases` is left empty (also on an error). A large upload then holds
/// its cases once, as jobs, instead of twice.
pub fn plan_owned(
    config: &mut EvalConfig,
    package_hash: &str,
    run_id: Uuid,
    filter: &CaseFilter,
    runner_override: Option<&RunnerConfig>,
) -> Result<Vec<Job>, PlanError> {
    let cases = std::mem::take(&mut config.test_cases);
    let config = &*config;
    let suite_ids = check_filter(config, &cases, filter)?;
    let planner = Planner {
        config,
        package_hash,
        run_id,
        runner_override,
    };
    planner.plan(
        cases.into_iter().map(Cow::Owned),
        filter,
        suite_ids.as_deref(),
    )
}

/// Checks that the filter's suite and cases exist; returns the suite's case ids when it names
/// one.
fn check_filter(
    config: &EvalConfig,
    cases: &[TestCase],
    filter: &CaseFilter,
) -> Result<Option<Vec<String>>, PlanError> {
    let suite_ids = match &filter.suite {
        None => None,
        Some(name) => match config.suites.iter().find(|s| &s.name == name) {
            Some(s) => Some(s.test_ids.clone()),
            None => {
                let names: Vec<&str> = config.suites.iter().map(|s| s.name.as_str()).collect();
                let known = if names.is_empty() {
                    "no suites".to_string()
                } else {
                    names.join(", ")
                };
                return Err(PlanError::UnknownSuite(name.clone(), known));
            }
        },
    };
    for id in &filter.case_ids {
        if !cases.iter().any(|c| &c.id == id) {
            return Err(PlanError::UnknownCase(id.clone()));
        }
    }
    Ok(suite_ids)
}

/// What every job of a run shares.
struct Planner<'a> {
    config: &'a EvalConfig,
    package_hash: &'a str,
    run_id: Uuid,
    runner_override: Option<&'a RunnerConfig>,
}

impl Planner<'_> {
    /// One job per selected case, in definition order (the index is the case's position in
    /// the definition, whatever the filter leaves out).
    fn plan<'c>(
        &self,
        cases: impl Iterator<Item = Cow<'c, TestCase>>,
        filter: &CaseFilter,
        suite_ids: Option<&[String]>,
    ) -> Result<Vec<Job>, PlanError> {
        let config = self.config;
        let retry_default = u32::from(config.settings.retry_failed);
        let environment = config
            .setup
            .as_ref()
            .map(|s| s.environment.clone())
            .unwrap_or_default();
        let jobs: Vec<Job> = cases
            .enumerate()
            .filter(|(_, c)| filter.case_ids.is_empty() || filter.case_ids.contains(&c.id))
            .filter(|(_, c)| {
                filter.tags.is_empty() || c.tags.iter().any(|t| filter.tags.contains(t))
            })
            .filter(|(_, c)| suite_ids.is_none_or(|ids| ids.contains(&c.id)))
            .map(|(index, c)| {
                let runner = self
                    .runner_override
                    .cloned()
                    .unwrap_or_else(|| default_runner(config, &c));
                let timeout_ms = c.timeout_ms(&config.settings);
                let retry_count = c.evaluation.retry_count.unwrap_or(retry_default);
                let suites = config
                    .suites_of(&c.id)
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                let strategy = c.strategy_name(config.profile).to_string();
                let mut case = c.into_owned();
                case.evaluation.strategy = strategy;
                Job {
                    run_id: self.run_id,
                    case_index: u32::try_from(index).unwrap_or(u32::MAX),
                    profile: config.profile,
                    runner,
                    timeout_ms,
                    retry_count,
                    package_hash: self.package_hash.to_string(),
                    environment: environment.clone(),
                    given: None,
                    suites,
                    attempt: 1,
                    case,
                }
            })
            .collect();
        if jobs.is_empty() {
            return Err(PlanError::Empty {
                tags: filter.tags.clone(),
                cases: filter.case_ids.clone(),
                suite: filter.suite.clone(),
            });
        }
        Ok(jobs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{RunnerSpec, Suite};

    fn config() -> EvalConfig {
        let case = |id: &str, tags: &[&str]| TestCase {
            id: id.into(),
            name: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            weight: 1.0,
            ..TestCase::default()
        };
        EvalConfig {
            version: "2.0".into(),
            profile: Profile::Structured,
            settings: crate::model::Settings {
                default_timeout: Some(5_000),
                runner: Some(RunnerSpec::Name("command".into())),
                ..Default::default()
            },
            setup: None,
            teardown: None,
            test_cases: vec![
                case("a", &["smoke"]),
                case("b", &["edge"]),
                case("c", &["smoke", "edge"]),
            ],
            suites: vec![Suite {
                name: "core".into(),
                test_ids: vec!["a".into(), "b".into()],
                run_in_sequence: false,
            }],
        }
    }

    #[test]
    fn plans_one_job_per_case_with_resolved_strategy_and_timeout() {
        let jobs = plan(&config(), "h", Uuid::nil(), &CaseFilter::default(), None).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!(jobs[0].strategy(), "json_schema");
        assert_eq!(jobs[0].case.evaluation.strategy, "json_schema");
        assert_eq!(jobs[0].timeout_ms, 5_000);
        assert_eq!(jobs[0].runner.kind, "command");
        assert_eq!(jobs[0].suites, vec!["core".to_string()]);
        assert!(jobs[2].suites.is_empty());
    }

    #[test]
    fn planning_owned_moves_the_cases_into_the_same_jobs() {
        let filters = [
            CaseFilter::default(),
            CaseFilter {
                tags: vec!["edge".into()],
                ..CaseFilter::default()
            },
            CaseFilter {
                suite: Some("core".into()),
                ..CaseFilter::default()
            },
        ];
        for filter in filters {
            let borrowed = plan(&config(), "h", Uuid::nil(), &filter, None).unwrap();
            let mut owned_config = config();
            let owned = plan_owned(&mut owned_config, "h", Uuid::nil(), &filter, None).unwrap();
            assert_eq!(owned, borrowed, "{filter:?}");
            assert!(owned_config.test_cases.is_empty());
            assert_eq!(owned_config.suites, config().suites, "the rest stays");
        }
        // Errors are the same too.
        let unknown = CaseFilter {
            case_ids: vec!["zz".into()],
            ..CaseFilter::default()
        };
        let mut refused = config();
        assert_eq!(
            plan_owned(&mut refused, "h", Uuid::nil(), &unknown, None).unwrap_err(),
            plan(&config(), "h", Uuid::nil(), &unknown, None).unwrap_err()
        );
        assert!(
            refused.test_cases.is_empty(),
            "taken also on an error, as documented"
        );
    }

    #[test]
    fn tag_suite_and_case_filters_combine() {
        let f = CaseFilter {
            tags: vec!["edge".into()],
            suite: Some("core".into()),
            ..CaseFilter::default()
        };
        let jobs = plan(&config(), "h", Uuid::nil(), &f, None).unwrap();
        let ids: Vec<_> = jobs.iter().map(|j| j.case.id.as_str()).collect();
        assert_eq!(ids, vec!["b"]);
    }

    #[test]
    fn unknown_suite_and_case_are_errors() {
        let f = CaseFilter {
            suite: Some("nope".into()),
            ..CaseFilter::default()
        };
        assert!(matches!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::UnknownSuite(..))
        ));
        let f = CaseFilter {
            case_ids: vec!["zzz".into()],
            ..CaseFilter::default()
        };
        assert_eq!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::UnknownCase("zzz".into()))
        );
        let f = CaseFilter {
            tags: vec!["none".into()],
            ..CaseFilter::default()
        };
        assert!(matches!(
            plan(&config(), "h", Uuid::nil(), &f, None),
            Err(PlanError::Empty { .. })
        ));
    }

    #[test]
    fn runner_override_wins() {
        let r = RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        };
        let jobs = plan(
            &config(),
            "h",
            Uuid::nil(),
            &CaseFilter::default(),
            Some(&r),
        )
        .unwrap();
        assert!(jobs.iter().all(|j| j.runner.kind == "given"));
    }
}
