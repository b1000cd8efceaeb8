//! The `trigger` runner: one trigger eval query as a job (the service's trigger evals).
//!
//! A run asked for trigger evals plans one job per query of the package's trigger file
//! ([`trigger_job`]): the query is the case's prompt, whether it should trigger and the runs
//! per query are runner options. The runner evaluates the query as `skilleval run` does
//! ([`triggers::evaluate_query`]: the skill's name and description from its `SKILL.md` among
//! the decoys, each run a model call) and answers [`TRIGGERED`] or [`NOT_TRIGGERED`], which
//! `exact_match` grades against what the query should do; the query's result (runs, picks,
//! errors) goes in the details, from which the run's report is assembled
//! ([`query_result`], [`triggers::report`]). A query no run got an answer for is a fault (the
//! case errors), as the CLI counts it errored.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::plan::Job;
use crate::result::{CaseStatus, JobResult};
use crate::runner::{OutputRunner, ProduceRequest};
use crate::triggers::{self, QueryResult, SkillCard, TriggerOptions};
use crate::variant::TRIGGER_RUNNER;
use skilleval_grading::GradeEnv;
use skilleval_model::definition::{Evaluation, Expected, Input, RunnerConfig, TestCase};
use skilleval_model::grade::Fault;
use skilleval_model::output::Produced;
use skilleval_model::package::{skill_md, TriggerCase};
use skilleval_providers::{ProviderClients, Purpose};

/// Runner option: the query should select the skill.
pub const SHOULD_TRIGGER_OPTION: &str = "shouldTrigger";
/// Runner option: runs per query.
pub const RUNS_OPTION: &str = "runsPerQuery";
/// The output of a query that selected the skill.
pub const TRIGGERED: &str = "triggered";
/// The output of a query that did not.
pub const NOT_TRIGGERED: &str = "not triggered";
/// Wall-clock limit per run of a query (a model call, retries included).
const TRIGGER_TIMEOUT_MS: u64 = 120_000;
/// How a trigger job's case id begins (`trigger:<n>`, n the query's position, from 1).
pub const TRIGGER_ID_PREFIX: &str = "trigger:";

/// The trigger evals a run asked for: the package's queries and the runs per query.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TriggerPlan {
    pub queries: Vec<TriggerCase>,
    pub runs_per_query: u32,
}

impl TriggerPlan {
    /// The jobs of the queries from position `from` (at most `limit`), for run `run_id` of
    /// the package `package_hash`.
    pub fn jobs(
        &self,
        run_id: uuid::Uuid,
        package_hash: &str,
        profile: skilleval_model::definition::Profile,
        from: usize,
        limit: usize,
    ) -> Vec<Job> {
        self.queries
            .iter()
            .enumerate()
            .skip(from)
            .take(limit)
            .map(|(i, case)| {
                trigger_job(run_id, package_hash, profile, i, case, self.runs_per_query)
            })
            .collect()
    }

    /// The options the queries run with (the CLI's, with these runs per query).
    pub fn options(&self) -> TriggerOptions {
        TriggerOptions {
            runs_per_query: self.runs_per_query.max(1),
            ..TriggerOptions::default()
        }
    }
}

/// The job of the `index`-th query (from 0) of run `run_id`.
pub fn trigger_job(
    run_id: uuid::Uuid,
    package_hash: &str,
    profile: skilleval_model::definition::Profile,
    index: usize,
    case: &TriggerCase,
    runs_per_query: u32,
) -> Job {
    let mut runner = RunnerConfig {
        kind: TRIGGER_RUNNER.into(),
        ..RunnerConfig::default()
    };
    runner
        .extra
        .insert(SHOULD_TRIGGER_OPTION.into(), json!(case.should_trigger));
    runner
        .extra
        .insert(RUNS_OPTION.into(), json!(runs_per_query.max(1)));
    Job {
        run_id,
        case: TestCase {
            id: format!("{TRIGGER_ID_PREFIX}{}", index + 1),
            name: case.query.clone(),
            input: Input {
                prompt: case.query.clone(),
                ..Input::default()
            },
            expected: Expected {
                output: Some(
                    if case.should_trigger {
                        TRIGGERED
                    } else {
                        NOT_TRIGGERED
                    }
                    .into(),
                ),
                ..Expected::default()
            },
            evaluation: Evaluation {
                strategy: "exact_match".into(),
                ..Evaluation::default()
            },
            ..TestCase::default()
        },
        case_index: u32::try_from(index).unwrap_or(u32::MAX),
        profile,
        runner,
        timeout_ms: TRIGGER_TIMEOUT_MS.saturating_mul(u64::from(runs_per_query.max(1))),
        retry_count: 0,
        package_hash: package_hash.to_string(),
        environment: Default::default(),
        scripts: Default::default(),
        dependencies: Vec::new(),
        given: None,
        suites: Vec::new(),
        attempt: 1,
    }
}

/// The query result a trigger job's result carries: from its details when it ran, else (it
/// errored, or never ran) one with no answered run and the reason as its error.
pub fn query_result(r: &JobResult) -> QueryResult {
    if let Some(q) = r
        .details
        .get("runner")
        .and_then(|d| d.get("trigger"))
        .and_then(|q| serde_json::from_value::<QueryResult>(q.clone()).ok())
    {
        return q;
    }
    let reason = r
        .error
        .as_ref()
        .map(ToString::to_string)
        .or_else(|| {
            r.details
                .get("skipped")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| format!("the query {}", r.status.as_str()));
    QueryResult {
        query: r.name.clone(),
        should_trigger: r.expected_output.as_deref() == Some(TRIGGERED),
        runs: 0,
        selected: 0,
        triggered: None,
        choices: Vec::new(),
        errors: if r.status == CaseStatus::Passed {
            Vec::new()
        } else {
            vec![reason]
        },
    }
}

/// Produces a trigger query's outcome with a model.
pub struct TriggerRunner {
    clients: Option<Arc<ProviderClients>>,
}

impl TriggerRunner {
    pub fn new(clients: Option<Arc<ProviderClients>>) -> Self {
        TriggerRunner { clients }
    }
}

#[async_trait]
impl OutputRunner for TriggerRunner {
    fn name(&self) -> &'static str {
        TRIGGER_RUNNER
    }

    fn missing_provider(&self) -> bool {
        self.clients.is_none()
    }

    #[tracing::instrument(skip_all, fields(test_case_id = %req.case.id, runner = "trigger"))]
    async fn produce(&self, req: &ProduceRequest<'_>, env: &GradeEnv) -> Result<Produced, Fault> {
        let Some(clients) = &self.clients else {
            return Err(Fault::permanent(
                "trigger evals need a model provider; none is configured (see docs/providers.md)",
            ));
        };
        let client = clients.pick_or_fault(req.runner.provider.as_deref(), Purpose::Produce)?;
        let path = env.package_root.join(skill_md::SKILL_MD);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            Fault::permanent(format!(
                "trigger evals: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let (Some(manifest), _) = skill_md::parse(&text) else {
            return Err(Fault::permanent(format!(
                "trigger evals: {} has no valid front matter",
                path.display()
            )));
        };
        let skill = SkillCard::new(&manifest.name, &manifest.description);
        let case = TriggerCase {
            query: req.case.input.prompt.clone(),
            should_trigger: req
                .runner
                .extra
                .get(SHOULD_TRIGGER_OPTION)
                .and_then(Value::as_bool)
                .unwrap_or(false),
        };
        let opts = TriggerOptions {
            runs_per_query: req
                .runner
                .extra
                .get(RUNS_OPTION)
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(triggers::DEFAULT_RUNS_PER_QUERY),
            ..TriggerOptions::default()
        };
        let (result, usage) = triggers::evaluate_query(&client, &skill, &case, &opts).await;
        let Some(triggered) = result.triggered else {
            return Err(Fault::permanent(format!(
                "no run of the query got an answer: {}",
                result.errors.join("; ")
            )));
        };
        Ok(Produced {
            output: if triggered { TRIGGERED } else { NOT_TRIGGERED }.into(),
            tool_calls: None,
            usage,
            truncated: false,
            details: json!({ "trigger": result }),
            files: Vec::new(),
            stopped: None,
        })
    }
}

/// The trigger evals' report of a run from its trigger query results (in query order; other
/// results are ignored), assembled as `skilleval run` assembles its own; `None` when the run
/// has no trigger query result.
pub fn trigger_report(
    skill: &SkillCard,
    plan: &TriggerPlan,
    results: &[JobResult],
) -> Option<triggers::TriggerReport> {
    let mut rows: Vec<&JobResult> = results.iter().filter(|r| is_trigger_result(r)).collect();
    if rows.is_empty() {
        return None;
    }
    rows.sort_by_key(|r| r.case_index);
    let mut usage = skilleval_model::grade::Usage::default();
    let queries = rows
        .into_iter()
        .map(|r| {
            usage.add(&r.produce_usage);
            query_result(r)
        })
        .collect();
    Some(triggers::report(skill, &plan.options(), queries, usage))
}

/// Whether a result is a trigger query's.
pub fn is_trigger_result(r: &JobResult) -> bool {
    r.variant.configuration == crate::variant::Configuration::Trigger
}
