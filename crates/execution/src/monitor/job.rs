//! A sampled item as a job: the same [`Job`] the executor grades for runs, with runner `given`
//! (the sample's output and tool calls) and one test case whose grading is the monitor's
//! criteria, so nothing is graded two ways.
//!
//! The criteria become one `hybrid` case: each criterion is a component weighted by its
//! weight, its `expected` fields shared (a named field belongs to one criterion, which
//! [`super::definition::parse`] checks) and its options under `evaluation.options.<strategy>`;
//! every component must pass (`mustPass`) and the hybrid's own threshold is 0, so a sample
//! passes when every criterion passes and its score is the weighted mean. The case's
//! `metadata.monitor` records the monitor revision and the sample's version and time, so the
//! job alone says how its result is to be stored.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::definition::Monitor;
use super::sample::Sample;

use crate::plan::Job;
use skilleval_model::definition::{Given, Input, Profile, RunnerConfig, TestCase};

/// Which criteria grade a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CriteriaSelection {
    All,
    /// The day's `max_cost_usd_per_day` is spent: the model-backed criteria stop.
    WithoutModel,
}

/// What every job of a samples run shares.
#[derive(Debug, Clone, Copy)]
pub struct SampleJobContext<'a> {
    pub run_id: Uuid,
    pub package_hash: &'a str,
    /// The monitor revision the job is graded with.
    pub monitor_revision: u32,
    pub selection: CriteriaSelection,
}

/// What the job's case carries under `metadata.monitor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleJobInfo {
    pub monitor_revision: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<DateTime<Utc>>,
    /// Criteria left out (by the cost cap), named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_criteria: Vec<String>,
    /// Criterion name per strategy, to read the hybrid's components back.
    pub criteria: BTreeMap<String, String>,
    /// The sample's production span (W3C trace context), which its evaluation events are
    /// parented to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

const INFO_KEY: &str = "monitor";

/// The job that grades `sample` with `monitor`; `None` when the selection leaves no criterion
/// (every criterion needs a model and the day's budget is spent).
pub fn sample_job(
    monitor: &Monitor,
    sample: &Sample,
    index: u32,
    ctx: &SampleJobContext<'_>,
) -> Option<Job> {
    let (used, skipped): (Vec<_>, Vec<_>) = monitor
        .criteria
        .iter()
        .partition(|c| ctx.selection == CriteriaSelection::All || !c.needs_model());
    if used.is_empty() {
        return None;
    }
    let mut case = TestCase {
        id: sample.sample_id.clone(),
        name: sample.sample_id.clone(),
        input: Input {
            prompt: sample.prompt(),
            context: sample.context.clone(),
            ..Input::default()
        },
        ..TestCase::default()
    };
    case.evaluation.strategy = "hybrid".into();
    case.evaluation.passing_threshold = Some(0.0);
    let mut must_pass = Vec::new();
    for c in &used {
        case.evaluation.weights.insert(c.strategy.clone(), c.weight);
        must_pass.push(Value::String(c.strategy.clone()));
        let e = &c.expected;
        let shared = &mut case.expected;
        if e.output.is_some() {
            shared.output.clone_from(&e.output);
        }
        if !e.patterns.is_empty() {
            shared.patterns.clone_from(&e.patterns);
        }
        if e.json_schema.is_some() {
            shared.json_schema.clone_from(&e.json_schema);
        }
        if e.semantic_threshold.is_some() {
            shared.semantic_threshold = e.semantic_threshold;
        }
        if e.rubric.is_some() {
            shared.rubric.clone_from(&e.rubric);
        }
        if e.custom_script.is_some() {
            shared.custom_script.clone_from(&e.custom_script);
        }
        if !e.assertions.is_empty() {
            shared.assertions.clone_from(&e.assertions);
        }
        // A criterion's short-form options (`expected.includes`) and `options` stay its own.
        let mut own: serde_json::Map<String, Value> = e.extra.clone().into_iter().collect();
        own.extend(c.options.clone());
        if !own.is_empty() {
            case.evaluation
                .options
                .insert(c.strategy.clone(), Value::Object(own));
        }
    }
    case.evaluation
        .options
        .insert("mustPass".into(), Value::Array(must_pass));
    let info = SampleJobInfo {
        monitor_revision: ctx.monitor_revision,
        version: sample.version.clone(),
        observed_at: sample.observed_at,
        skipped_criteria: skipped.iter().map(|c| c.name.clone()).collect(),
        criteria: used
            .iter()
            .map(|c| (c.strategy.clone(), c.name.clone()))
            .collect(),
        traceparent: sample.traceparent.clone(),
    };
    case.metadata.extra.insert(
        INFO_KEY.into(),
        serde_json::to_value(&info).unwrap_or(Value::Null),
    );
    Some(Job {
        run_id: ctx.run_id,
        case,
        case_index: index,
        profile: Profile::default(),
        runner: RunnerConfig {
            kind: "given".into(),
            ..RunnerConfig::default()
        },
        timeout_ms: monitor.timeout_ms,
        retry_count: 0,
        package_hash: ctx.package_hash.to_string(),
        environment: BTreeMap::new(),
        scripts: Default::default(),
        dependencies: Vec::new(),
        given: Some(Given {
            output: sample.output.clone(),
            tool_calls: sample
                .tool_calls
                .as_ref()
                .and_then(|calls| serde_json::to_value(calls).ok()),
        }),
        suites: Vec::new(),
        attempt: 1,
    })
}

/// What a sample job's case records about the monitor (`None` for a job that is not one).
pub fn job_info(job: &Job) -> Option<SampleJobInfo> {
    job.case
        .metadata
        .extra
        .get(INFO_KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}
