//! Comparisons in the service: a run's stored results become a [`RunSide`] (cases with their
//! attempts and fingerprints), two sides go through `skilleval_analysis::compare` exactly as the CLI's
//! run folders do, and the answer is stored in `comparisons`.
//!
//! Fingerprints come from the run's version's stored definition (what each case asks and how
//! it is graded) and from its results (the judge model a case's grading recorded), so a case
//! whose definition, grader or judge changed between two versions is flagged `not_comparable`.

use std::collections::BTreeMap;

use anyhow::Context as _;
use serde_json::{json, Value};
use skilleval_analysis::compare::{
    self, CaseFingerprint, CompareError, CompareOptions, Comparison, GateRecord, RunSide,
};
use skilleval_execution::plan::CaseFilter;
use skilleval_execution::result::JobResult;
use skilleval_grading::comparator::{judge_pairs, BlindOptions, BlindPair};
use skilleval_infra::store::comparisons::NewComparison;
use skilleval_infra::store::lifecycle::RunStatus;
use skilleval_infra::store::runs::RunRow;
use skilleval_infra::store::Store;
use skilleval_model::gate::GateConfig;
use skilleval_providers::client::LlmClient;
use uuid::Uuid;

use crate::results::load_results;
use crate::runs::definition::read_definition;

/// Why a comparison could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ComparingError {
    /// The id is neither a run nor a version.
    #[error("`{0}` is neither a run nor a version")]
    Unknown(Uuid),
    /// A version without a completed run has nothing to compare.
    #[error("version `{0}` has no completed run")]
    NoCompletedRun(Uuid),
    /// A run still going, failed or cancelled: its results are not the version's.
    #[error("run `{run}` is {status}, not completed")]
    NotCompleted { run: Uuid, status: RunStatus },
    #[error(transparent)]
    Compare(#[from] CompareError),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

/// A run or a version (its latest completed run), resolved to a completed run.
pub async fn resolve(store: &Store, id: Uuid) -> Result<RunRow, ComparingError> {
    let run_id = if store.get_run(id).await.context("reading a run")?.is_some() {
        id
    } else if store
        .version_exists(id)
        .await
        .context("reading a version")?
    {
        store
            .latest_completed_run(id)
            .await
            .context("finding a version's run")?
            .ok_or(ComparingError::NoCompletedRun(id))?
    } else {
        return Err(ComparingError::Unknown(id));
    };
    let run = store
        .get_run(run_id)
        .await
        .context("reading a run")?
        .ok_or(ComparingError::Unknown(id))?;
    if run.status != RunStatus::Completed {
        return Err(ComparingError::NotCompleted {
            run: run.id,
            status: run.status,
        });
    }
    Ok(run)
}

/// One side of a comparison from a stored run: its results grouped by case, fingerprinted
/// from its version's definition.
pub async fn load_side(store: &Store, run: &RunRow) -> anyhow::Result<RunSide> {
    let results = load_results(store, run.id).await?;
    let fingerprints = run_fingerprints(store, run.version_id, &results).await?;
    let version = Value::String(format!("{} {} (run {})", run.skill, run.version, run.id));
    Ok(RunSide::from_results(
        run.id.to_string(),
        version,
        &results,
        &fingerprints,
    ))
}

/// The judge model each case's grading recorded (`details.judge.model`), by case id.
fn judges(results: &[JobResult]) -> BTreeMap<String, String> {
    results
        .iter()
        .filter_map(|r| {
            let model = r.details.pointer("/judge/model")?.as_str()?;
            Some((r.test_case_id.clone(), model.to_string()))
        })
        .collect()
}

/// Every case of the version's definition fingerprinted as planned (prompt templated,
/// strategy resolved), with the judge model its result recorded.
async fn run_fingerprints(
    store: &Store,
    version_id: Uuid,
    results: &[JobResult],
) -> anyhow::Result<BTreeMap<String, CaseFingerprint>> {
    let mut conn = store
        .pool()
        .acquire()
        .await
        .context("taking a connection")?;
    let version = store
        .version_for_run(&mut conn, version_id)
        .await?
        .with_context(|| format!("version {version_id} is gone"))?;
    drop(conn);
    let judges = judges(results);
    // Reading the definition parses all of it: CPU work, off the async threads.
    tokio::task::spawn_blocking(move || {
        let definition = read_definition(version.config)?;
        let mut out = BTreeMap::new();
        definition.plan_chunks(
            &version.package_hash,
            Uuid::nil(),
            &CaseFilter::default(),
            None,
            2_000,
            |jobs| {
                for job in jobs {
                    let judge = judges.get(&job.case.id).map(String::as_str);
                    let print = compare::fingerprint(&job.case, job.profile, judge);
                    out.insert(job.case.id.clone(), print);
                }
                true
            },
        )?;
        Ok::<_, anyhow::Error>(out)
    })
    .await
    .context("fingerprinting a definition")?
}

/// Compares `head` with `base` (both completed runs), stores the comparison and returns it.
pub async fn compare_and_store(
    store: &Store,
    base: &RunRow,
    head: &RunRow,
    force: bool,
    gate: GateConfig,
    blind: Option<&Blind>,
) -> Result<Comparison, ComparingError> {
    let (base_side, head_side) = tokio::try_join!(load_side(store, base), load_side(store, head))?;
    let id = Uuid::now_v7();
    let mut options = CompareOptions::new(id.to_string(), &base_side.run_id, &head_side.run_id);
    options.force = force;
    options.gate = gate;
    // Ten thousand resamples per statistic: CPU work, off the async threads.
    let mut comparison =
        tokio::task::spawn_blocking(move || compare::compare(&base_side, &head_side, &options))
            .await
            .context("comparing two runs")??;
    if let Some(blind) = blind {
        let paired: Vec<String> = comparison
            .cases
            .iter()
            .map(|c| c.test_case_id.clone())
            .collect();
        let pairs = blind_pairs(store, base, head, &paired).await?;
        comparison.blind_comparator = Some(
            judge_pairs(
                &blind.client,
                &comparison.comparison_id,
                &comparison.version_a,
                &comparison.version_b,
                &pairs,
                &blind.options,
            )
            .await,
        );
    }
    let result = serde_json::to_value(&comparison).context("serialising a comparison")?;
    store
        .insert_comparison(&NewComparison {
            id,
            base_run: base.id,
            head_run: head.id,
            base_version: base.version_id,
            head_version: head.version_id,
            forced: force,
            result: &result,
        })
        .await
        .context("storing a comparison")?;
    Ok(comparison)
}

/// The blind comparator of a comparison: the judge and how it runs.
pub struct Blind {
    pub client: std::sync::Arc<LlmClient>,
    pub options: BlindOptions,
}

/// The pairs the blind comparator judges: for each paired case (in `paired`'s order) the
/// first with-skill attempt's output of each run, with the head's prompt as planned. Cases
/// without an output on either side are left out.
async fn blind_pairs(
    store: &Store,
    base: &RunRow,
    head: &RunRow,
    paired: &[String],
) -> anyhow::Result<Vec<BlindPair>> {
    let (a, b) = tokio::try_join!(load_results(store, base.id), load_results(store, head.id))?;
    let outputs = |results: Vec<JobResult>| -> BTreeMap<String, String> {
        results
            .into_iter()
            .filter(|r| r.variant.is_primary())
            .filter_map(|r| Some((r.test_case_id, r.output?)))
            .collect()
    };
    let (a, b) = (outputs(a), outputs(b));
    let prompts = case_prompts(store, head.version_id).await?;
    Ok(paired
        .iter()
        .filter_map(|id| {
            Some(BlindPair {
                test_case_id: id.clone(),
                prompt: prompts.get(id).cloned().unwrap_or_default(),
                output_a: a.get(id)?.clone(),
                output_b: b.get(id)?.clone(),
            })
        })
        .collect())
}

/// Every case's prompt as planned (templated), by case id, from the version's definition.
async fn case_prompts(store: &Store, version_id: Uuid) -> anyhow::Result<BTreeMap<String, String>> {
    let mut conn = store
        .pool()
        .acquire()
        .await
        .context("taking a connection")?;
    let version = store
        .version_for_run(&mut conn, version_id)
        .await?
        .with_context(|| format!("version {version_id} is gone"))?;
    drop(conn);
    tokio::task::spawn_blocking(move || {
        let definition = read_definition(version.config)?;
        let mut out = BTreeMap::new();
        definition.plan_chunks(
            &version.package_hash,
            Uuid::nil(),
            &CaseFilter::default(),
            None,
            2_000,
            |jobs| {
                for job in jobs {
                    out.insert(job.case.id, job.case.input.prompt);
                }
                true
            },
        )?;
        Ok::<_, anyhow::Error>(out)
    })
    .await
    .context("reading prompts")?
}

/// The stored comparison of `head` against `base` with the default options, or a new one
/// (computed and stored) when there is none. `None` when the two cannot be compared (no
/// shared case, or none comparable): the history shows no verdict for them.
pub async fn comparison_between(
    store: &Store,
    base_run: Uuid,
    head_run: Uuid,
) -> anyhow::Result<Option<Value>> {
    let defaults = json!(GateConfig::default());
    if let Some(stored) = store
        .find_comparison(base_run, head_run, false, &defaults)
        .await?
    {
        if let Some(result) = stored.result {
            return Ok(Some(result));
        }
    }
    let (Some(base), Some(head)) = (
        store.get_run(base_run).await?,
        store.get_run(head_run).await?,
    ) else {
        return Ok(None);
    };
    match compare_and_store(store, &base, &head, false, GateConfig::default(), None).await {
        Ok(c) => Ok(Some(json!(c))),
        Err(ComparingError::Compare(_)) => Ok(None),
        Err(ComparingError::Internal(e)) => Err(e),
        Err(e) => Err(anyhow::Error::new(e)),
    }
}

/// The `no_regression` gate for a finished (not yet finalised) run: its results compared with
/// the last earlier version of the skill whose run passed. Passes, with a note, when there is
/// no such version or nothing the two share can be compared.
pub async fn regression_gate(
    store: &Store,
    run: &RunRow,
    config: GateConfig,
) -> anyhow::Result<GateRecord> {
    let mut report = GateRecord::no_regression(config);
    let Some((base_version, base_run)) = store.previous_run(run.version_id, true).await? else {
        report.note = Some("no earlier version of the skill has a passing run".into());
        return Ok(report);
    };
    report.base_version = Some(base_version);
    report.base_run = Some(base_run);
    let base = store
        .get_run(base_run)
        .await?
        .with_context(|| format!("run {base_run} is gone"))?;
    match compare_and_store(store, &base, run, false, config, None).await {
        Ok(c) => {
            report.comparison_id = Some(c.comparison_id);
            report.verdict = c.gate.verdict;
            report.reasons = c.gate.reasons;
            report.regressed_cases = c.gate.regressed_cases;
        }
        Err(ComparingError::Compare(e)) => {
            report.note = Some(format!("nothing to compare with run {base_run}: {e}"));
        }
        Err(ComparingError::Internal(e)) => return Err(e),
        Err(e) => return Err(anyhow::Error::new(e)),
    }
    Ok(report)
}
