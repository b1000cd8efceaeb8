//! A stored eval definition as runs plan from it, shared by the kinds that do (upload and
//! manual runs, rescores): the definition read back ([`read_definition`], which comparisons,
//! the preview and the UI use too), its case ids, the variants each selected case runs as,
//! the filter `runs.request` records, and [`DefinitionJobs`], the chunker of a definition's
//! selected cases.
//!
//! A kind planning from a definition prepares a run with [`read_version`] (or the definition
//! in hand) and [`prepare_counted`], and plans it again with [`reload`]; what it adds is its
//! own [`KindPlan`] around the [`DefinitionJobs`].

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use skilleval_execution::plan::{CaseFilter, DefinitionText, PlanError, TextError};
use skilleval_execution::runner::trigger::TriggerPlan;
use skilleval_execution::variant::{Configuration, Variant};
use skilleval_infra::store::runs::RunPlanRequest;
use skilleval_infra::store::versions::StoredDefinition;
use skilleval_infra::store::Store;
use skilleval_model::definition::{EvalConfig, Given, RunnerConfig, RunnerSpec};
use sqlx::PgConnection;
use uuid::Uuid;

use super::error::LaunchError;
use super::plan::{
    JobChunks, KindPlan, PlannedVersion, PreparedRun, RunPlan, RunRequest, PUBLISH_CHUNK,
};

/// Recorded outputs by test case id (what a rescore's jobs carry).
pub(crate) type Givens = Arc<HashMap<String, Given>>;

/// A version's stored definition, read for planning.
pub(crate) fn read_definition(stored: StoredDefinition) -> Result<DefinitionText, TextError> {
    match stored {
        StoredDefinition::Deflated(bytes) => DefinitionText::from_deflated(bytes),
        StoredDefinition::Text(text) => DefinitionText::parse(text),
    }
}

/// Every case id of a definition, in definition order.
pub(crate) fn case_ids(definition: &DefinitionText) -> Result<Vec<String>, TextError> {
    let mut ids = Vec::with_capacity(definition.cases());
    definition.plan_chunks(
        "",
        Uuid::nil(),
        &CaseFilter::default(),
        None,
        PUBLISH_CHUNK,
        |jobs| {
            ids.extend(jobs.into_iter().map(|j| j.case.id));
            true
        },
    )?;
    Ok(ids)
}

/// A runner named in a request keeps the definition's runner options (its script) unless the
/// request gives a full runner.
fn resolve_runner(spec: &RunnerSpec, config: &EvalConfig) -> RunnerConfig {
    match spec {
        RunnerSpec::Name(kind) => RunnerConfig {
            kind: kind.clone(),
            ..config
                .settings
                .runner
                .as_ref()
                .map(RunnerSpec::config)
                .unwrap_or_default()
        },
        RunnerSpec::Detailed(cfg) => cfg.clone(),
    }
}

/// The version a request on a stored version plans from, with its definition read (the
/// request's own when it has one) and the request's jobs counted. `select` narrows the filter
/// first, given the definition (a rescore keeps the cases it has outputs for). Reading the
/// definition, and counting a filter's jobs, parses all of it: CPU work, kept off the async
/// threads. Returns the version, the filter as narrowed, and the count (or why the filter
/// does not fit the definition).
pub(crate) async fn read_version(
    store: &Store,
    conn: &mut PgConnection,
    request: &RunRequest,
    select: impl FnOnce(&DefinitionText, &mut CaseFilter) -> Result<(), TextError> + Send + 'static,
) -> Result<(PlannedVersion, CaseFilter, Result<usize, PlanError>), LaunchError> {
    let version = store
        .version_for_run(conn, request.version_id)
        .await?
        .ok_or(LaunchError::VersionNotFound(request.version_id))?;
    let mut filter = request.filter.clone();
    let own = request.definition.clone();
    let (definition, filter, total) = tokio::task::spawn_blocking(move || {
        let definition = match own {
            Some(own) => own,
            None => Arc::new(read_definition(version.config)?),
        };
        select(&definition, &mut filter)?;
        let total = definition.count(&filter)?;
        Ok::<_, TextError>((definition, filter, total))
    })
    .await??;
    let planned = PlannedVersion {
        version_id: version.version_id,
        package_hash: version.package_hash,
        definition,
    };
    Ok((planned, filter, total))
}

/// Plans a run of `total` selected cases of `version`'s definition: the runner, the cap on
/// jobs in flight, failFast and the gate from the request and the definition's settings, and
/// the kind's plan that `kind` makes of the definition's jobs.
pub(crate) fn prepare_counted(
    version: PlannedVersion,
    request: &RunRequest,
    total: usize,
    kind: impl FnOnce(DefinitionJobs) -> Box<dyn KindPlan>,
) -> Result<PreparedRun, LaunchError> {
    let header = version.definition.header();
    let runner = request
        .runner
        .as_ref()
        .map(|spec| resolve_runner(spec, header));
    let max_in_flight = match header.settings.parallel_execution {
        Some(false) => Some(1),
        _ => header
            .settings
            .max_concurrent_tests
            .filter(|n| *n > 0)
            .map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
    };
    let gate = match (request.gate, header.settings.gate) {
        (Some(spec), _) => spec.config().map_err(|error| LaunchError::Gate {
            error,
            in_definition: false,
        })?,
        (None, Some(spec)) => spec.config().map_err(|error| LaunchError::Gate {
            error,
            in_definition: true,
        })?,
        (None, None) => None,
    };
    let fail_fast = header.settings.fail_fast;
    let run_id = Uuid::now_v7();
    let variants = request.variants();
    let total_jobs = total
        .saturating_mul(variants.len())
        .saturating_add(request.triggers.as_ref().map_or(0, |t| t.queries.len()));
    let jobs = DefinitionJobs {
        definition: version.definition,
        filter: request.filter.clone(),
        runner,
        variants: Variants {
            each: variants,
            cases: total,
        },
        triggers: request.triggers.clone(),
    };
    Ok(PreparedRun {
        gate,
        own_definition: request.definition.clone(),
        token_id: request.token_id,
        run_id,
        version_id: version.version_id,
        kind: request.kind,
        callback_url: request.callback_url.clone(),
        idempotency_key: request.idempotency_key.clone(),
        max_in_flight,
        fail_fast,
        max_cost_usd: request.max_cost_usd,
        max_tokens: request.max_tokens,
        total: total_jobs,
        plan: Arc::new(RunPlan::new(
            run_id,
            version.package_hash,
            kind(jobs),
            skilleval_infra::telemetry::current_traceparent(),
        )),
    })
}

/// A created run's definition jobs again, from its stored request and its version's
/// definition (or the run's own). Returns them with the package they run and the source run
/// the request recorded (a rescore's).
pub(crate) async fn reload(
    store: &Store,
    run_id: Uuid,
    stored: RunPlanRequest,
) -> Result<(String, DefinitionJobs, Option<Uuid>), LaunchError> {
    let mut conn = store
        .pool()
        .acquire()
        .await
        .map_err(LaunchError::database("taking a connection to read a plan"))?;
    let version = store
        .version_for_run(&mut conn, stored.version_id)
        .await?
        .ok_or(LaunchError::VersionNotFound(stored.version_id))?;
    drop(conn);
    let recorded = serde_json::from_value::<RecordedFilter>(stored.request).map_err(|e| {
        LaunchError::Corrupt {
            run_id,
            what: format!("its stored request does not parse: {e}"),
        }
    })?;
    let each = Variant::all(recorded.repeats, recorded.baseline);
    let triggers = recorded.triggers.clone();
    let variants = match recorded.cases {
        Some(cases) => Variants { each, cases },
        None if each.len() == 1 && triggers.is_none() => Variants::primary(usize::MAX),
        None => {
            return Err(LaunchError::Corrupt {
                run_id,
                what: "its stored request has variants but no case count".into(),
            })
        }
    };
    let rescore_of = recorded.rescore_of;
    let filter: CaseFilter = recorded.into();
    let runner: Option<RunnerConfig> = stored
        .runner
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| LaunchError::Corrupt {
            run_id,
            what: format!("its stored runner does not parse: {e}"),
        })?;
    // A run with a definition of its own (a rescore's inline eval_config) plans from it.
    let config = match stored.definition {
        Some(deflated) => StoredDefinition::Deflated(deflated),
        None => version.config,
    };
    let definition = tokio::task::spawn_blocking(move || read_definition(config)).await??;
    let jobs = DefinitionJobs {
        definition: Arc::new(definition),
        filter,
        runner,
        variants,
        triggers,
    };
    Ok((version.package_hash, jobs, rescore_of))
}

/// The jobs of a definition's selected cases: once per variant, variant after variant, then
/// the trigger eval queries.
#[derive(Debug)]
pub(crate) struct DefinitionJobs {
    definition: Arc<DefinitionText>,
    filter: CaseFilter,
    /// The runner override.
    pub(crate) runner: Option<RunnerConfig>,
    /// What each selected case runs as (baseline, repeats).
    variants: Variants,
    /// Trigger eval queries, planned after every case's variants.
    triggers: Option<TriggerPlan>,
}

impl DefinitionJobs {
    /// The trigger evals it runs.
    pub(crate) fn triggers(&self) -> Option<&TriggerPlan> {
        self.triggers.as_ref()
    }

    /// The definition's header when one of its suites has `runInSequence`.
    pub(crate) fn sequenced(&self) -> Option<&EvalConfig> {
        let header = self.definition.header();
        header
            .suites
            .iter()
            .any(|s| s.run_in_sequence)
            .then_some(header)
    }

    /// Whether plan order is the results' order: one variant, no trigger eval queries.
    pub(crate) fn in_case_order(&self) -> bool {
        self.variants.is_primary_only() && self.triggers.is_none()
    }

    /// What `runs.request` records to plan the run again; `rescore_of`: a rescore's source
    /// run.
    pub(crate) fn recorded_request(&self, rescore_of: Option<Uuid>) -> serde_json::Value {
        let (baseline, repeats) = self.variants.asked();
        json!(RecordedFilter {
            rescore_of,
            baseline,
            repeats,
            cases: (!self.in_case_order()).then_some(self.variants.cases),
            triggers: self.triggers.clone(),
            ..RecordedFilter::from(&self.filter)
        })
    }

    /// The jobs from position `from`, at most `limit` ([`KindPlan::chunks`]), planned in a
    /// blocking thread (parsing is CPU work); each job carries its case's recorded output
    /// from `givens` when there are any.
    pub(crate) fn chunks(
        &self,
        run_id: Uuid,
        package_hash: &str,
        from: usize,
        limit: usize,
        givens: Option<Givens>,
    ) -> JobChunks {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let definition = Arc::clone(&self.definition);
        let filter = self.filter.clone();
        let runner = self.runner.clone();
        let variants = self.variants.clone();
        let triggers = self.triggers.clone();
        let package_hash = package_hash.to_string();
        tokio::task::spawn_blocking(move || {
            let mut position = 0usize;
            let mut left = limit;
            // One pass over the definition per variant; positions of variants wholly before
            // `from` are skipped without reading the definition.
            for variant in &variants.each {
                if left == 0 {
                    return;
                }
                if position.saturating_add(variants.cases) <= from {
                    position = position.saturating_add(variants.cases);
                    continue;
                }
                let mut going = true;
                let planned = definition.plan_chunks(
                    &package_hash,
                    run_id,
                    &filter,
                    runner.as_ref(),
                    PUBLISH_CHUNK,
                    |mut jobs| {
                        let start = position;
                        position += jobs.len();
                        if position <= from {
                            return true;
                        }
                        if start < from {
                            jobs.drain(..from - start);
                        }
                        jobs.truncate(left);
                        left -= jobs.len();
                        for job in &mut jobs {
                            if let Some(givens) = &givens {
                                job.given = givens.get(&job.case.id).cloned();
                            }
                            if !variant.is_primary() {
                                variant.apply(job);
                            }
                        }
                        going = tx.blocking_send(Ok(jobs)).is_ok() && left > 0;
                        going
                    },
                );
                if let Err(e) = planned {
                    // The receiver may be gone; then nobody needs the error either.
                    let _ = tx.blocking_send(Err(e.into()));
                    return;
                }
                if !going {
                    return;
                }
            }
            // The trigger eval queries, after every case's variants.
            if let Some(triggers) = triggers {
                let jobs = triggers.jobs(
                    run_id,
                    &package_hash,
                    definition.header().profile,
                    from.saturating_sub(position),
                    left,
                );
                if !jobs.is_empty() {
                    let _ = tx.blocking_send(Ok(jobs));
                }
            }
        });
        rx
    }
}

/// The variants of a plan: every selected case runs once per variant, variant after variant
/// ([`Variant::all`]'s order), so plan position `p` is case `p % cases` as variant
/// `p / cases`.
#[derive(Debug, Clone)]
struct Variants {
    each: Vec<Variant>,
    /// Cases the filter selects (positions per variant).
    cases: usize,
}

impl Variants {
    /// Only the primary variant (no baseline, no repeats): one job per case.
    fn primary(cases: usize) -> Self {
        Variants {
            each: vec![Variant::PRIMARY],
            cases,
        }
    }

    fn is_primary_only(&self) -> bool {
        self.each.iter().all(Variant::is_primary)
    }

    /// The baseline and repeats these variants are: (baseline, attempts per case).
    fn asked(&self) -> (bool, u32) {
        let baseline = self
            .each
            .iter()
            .any(|v| v.configuration == Configuration::WithoutSkill);
        let repeats = self.each.iter().map(|v| v.run_number).max().unwrap_or(1);
        (baseline, repeats)
    }
}

/// A run's filter as `runs.request` records it (the API's field names): written at creation,
/// read back to plan the run again.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct RecordedFilter {
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    suite: Option<String>,
    #[serde(default)]
    test_cases: Vec<String>,
    /// A rescore's source run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rescore_of: Option<Uuid>,
    /// Each case also run without the skill.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    baseline: bool,
    /// Attempts per case.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    repeats: u32,
    /// Cases the filter selected at creation (the plan's positions per variant), recorded
    /// with a baseline, repeats or trigger evals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cases: Option<usize>,
    /// The trigger eval queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    triggers: Option<TriggerPlan>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl From<&CaseFilter> for RecordedFilter {
    fn from(filter: &CaseFilter) -> Self {
        RecordedFilter {
            tags: filter.tags.clone(),
            suite: filter.suite.clone(),
            test_cases: filter.case_ids.clone(),
            rescore_of: None,
            baseline: false,
            repeats: 1,
            cases: None,
            triggers: None,
        }
    }
}

impl From<RecordedFilter> for CaseFilter {
    fn from(recorded: RecordedFilter) -> Self {
        CaseFilter {
            tags: recorded.tags,
            case_ids: recorded.test_cases,
            suite: recorded.suite,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CaseFilter, RecordedFilter};
    use serde_json::json;

    #[test]
    fn a_recorded_filter_uses_the_api_names_and_plans_the_same_cases_again() {
        let filter = CaseFilter {
            tags: vec!["smoke".into()],
            case_ids: vec!["a".into(), "b".into()],
            suite: Some("nightly".into()),
        };
        let recorded = json!(RecordedFilter::from(&filter));
        assert_eq!(
            recorded,
            json!({"tags": ["smoke"], "suite": "nightly", "test_cases": ["a", "b"]})
        );
        let back: CaseFilter = serde_json::from_value::<RecordedFilter>(recorded)
            .unwrap()
            .into();
        assert_eq!(back, filter);
        // Runs recorded before a field existed read it as empty.
        let old: CaseFilter = serde_json::from_value::<RecordedFilter>(json!({}))
            .unwrap()
            .into();
        assert_eq!(old, CaseFilter::default());
    }
}
