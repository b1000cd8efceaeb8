//! A run's plan, and the one interface every run kind plans behind.
//!
//! A run's plan says what its jobs are, the same every time it is asked: a position in the
//! plan names the same case every time, which the published watermark, the write-off of a
//! stopped run and the list of pending cases all count on. What differs by kind is where the
//! jobs come from, which the lifecycle names ([`Planning`]): a stored definition (upload and
//! manual runs, [`crate::runs::upload`]), stored outputs graded again
//! ([`crate::runs::rescore`]), production samples ([`crate::runs::samples`]). Each of those
//! modules implements [`KindPlan`] for its kind and plans a run the same way: it prepares a
//! new run ([`PreparedRun`], with the settings the run's row records) and plans a created run
//! again from its row (`reload`). [`crate::runs::planner`] picks the module by the kind's
//! [`Planning`], in one exhaustive `match`, so a new way of planning does not compile until
//! each step names it; finalising is chosen by the lifecycle's `Finalising` the same way
//! (`crate::aggregate`).
//!
//! A trait rather than an enum of the kinds' plans: an enum would name every kind's plan type,
//! so this module, which each kind needs ([`RunPlan`], [`RunRequest`], [`PreparedRun`]),
//! would import every kind's module and the arrows would run both ways. With the trait the
//! kinds build on this module and nothing here knows them.
//!
//! [`Planning`]: skilleval_infra::store::lifecycle::Planning

use std::sync::Arc;

use serde_json::Value;
use skilleval_execution::plan::{CaseFilter, DefinitionText, Job};
use skilleval_execution::runner::trigger::TriggerPlan;
use skilleval_execution::variant::Variant;
use skilleval_infra::store::lifecycle::RunKind;
use skilleval_infra::topology::Lane;
use skilleval_model::definition::{EvalConfig, RunnerConfig, RunnerSpec};
use skilleval_model::gate::{GateConfig, GateSpec};
use uuid::Uuid;

use super::error::LaunchError;
use super::sequence::Chains;

/// Jobs planned, published and confirmed at a time; the watermark moves once per chunk.
pub const PUBLISH_CHUNK: usize = 2_000;

/// A run's jobs as they are planned, a chunk at a time.
pub type JobChunks = tokio::sync::mpsc::Receiver<Result<Vec<Job>, LaunchError>>;

/// What one run kind's plan is: where its jobs come from and how the run records it. One
/// implementation per way of planning the lifecycle names (`Planning`), each in that kind's
/// module.
pub trait KindPlan: std::fmt::Debug + Send + Sync {
    /// The plan's jobs from position `from`, at most `limit` of them, in chunks of at most
    /// [`PUBLISH_CHUNK`] in plan order, planned a chunk or two ahead of the receiver;
    /// dropping the receiver stops the planning.
    fn chunks(&self, run_id: Uuid, package_hash: &str, from: usize, limit: usize) -> JobChunks;

    /// The lane its jobs are published on.
    fn lane(&self) -> Lane;

    /// What `runs.request` records to plan the run again.
    fn recorded_request(&self) -> Value;

    /// The runner the jobs run with instead of the definition's (`runs.runner`).
    fn runner(&self) -> Option<&RunnerConfig> {
        None
    }

    /// The trigger evals it runs.
    fn triggers(&self) -> Option<&TriggerPlan> {
        None
    }

    /// Whether plan order is the results' order (case index, then variant): not so when
    /// cases run as more than one variant (a baseline, repeats) or trigger eval queries
    /// follow them.
    fn in_case_order(&self) -> bool {
        true
    }

    /// The definition (without its cases) whose `runInSequence` suites the run honours, when
    /// it has any: their cases are published one at a time ([`RunPlan::chains`]).
    fn sequenced(&self) -> Option<&EvalConfig> {
        None
    }
}

/// A run's plan: what its jobs are planned from, the same every time (so a position in the
/// plan names the same case every time).
#[derive(Debug)]
pub struct RunPlan {
    run_id: Uuid,
    package_hash: String,
    /// The kind's part: where the jobs come from.
    kind: Box<dyn KindPlan>,
    /// The W3C trace context of the request that created the run: later passes (releases,
    /// the sweeper) publish in its trace.
    traceparent: Option<String>,
    /// Its `runInSequence` chains, computed on first use.
    chains: tokio::sync::OnceCell<Arc<Chains>>,
}

impl RunPlan {
    pub(crate) fn new(
        run_id: Uuid,
        package_hash: String,
        kind: Box<dyn KindPlan>,
        traceparent: Option<String>,
    ) -> Self {
        RunPlan {
            run_id,
            package_hash,
            kind,
            traceparent,
            chains: tokio::sync::OnceCell::new(),
        }
    }

    /// The run's `runInSequence` chains (none for a definition without such suites),
    /// computed once from every job of the plan (grouping them is CPU work, done in a
    /// blocking thread) and kept with the plan.
    pub async fn chains(&self) -> Result<Arc<Chains>, LaunchError> {
        self.chains
            .get_or_try_init(|| async {
                let Some(config) = self.kind.sequenced() else {
                    return Ok(Arc::new(Chains::default()));
                };
                let config = config.clone();
                let jobs = self.all().await?;
                let chains = tokio::task::spawn_blocking(move || Chains::of(&config, jobs)).await?;
                Ok(Arc::new(chains))
            })
            .await
            .cloned()
    }

    pub fn run_id(&self) -> Uuid {
        self.run_id
    }

    /// The trace context of the request that created the run.
    pub(crate) fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// Whether plan order is the results' order ([`KindPlan::in_case_order`]).
    pub(crate) fn in_case_order(&self) -> bool {
        self.kind.in_case_order()
    }

    /// The trigger evals it runs.
    pub fn triggers(&self) -> Option<&TriggerPlan> {
        self.kind.triggers()
    }

    /// The lane its jobs are published on: samples go to the lower-priority one.
    pub fn lane(&self) -> Lane {
        self.kind.lane()
    }

    pub(crate) fn runner(&self) -> Option<&RunnerConfig> {
        self.kind.runner()
    }

    /// What `runs.request` records to plan the run again.
    pub(crate) fn recorded_request(&self) -> Value {
        self.kind.recorded_request()
    }

    /// The plan's jobs from position `from`, at most `limit` of them, in chunks of at most
    /// [`PUBLISH_CHUNK`] in case order, planned a chunk or two ahead of the receiver (from a
    /// definition in a blocking thread, parsing is CPU work; from samples rows a page at a
    /// time); dropping the receiver stops the planning.
    pub fn chunks(&self, from: usize, limit: usize) -> JobChunks {
        self.kind
            .chunks(self.run_id, &self.package_hash, from, limit)
    }

    /// Every job of the plan at once (tests).
    pub async fn all(&self) -> Result<Vec<Job>, LaunchError> {
        let mut chunks = self.chunks(0, usize::MAX);
        let mut jobs = Vec::new();
        while let Some(chunk) = chunks.recv().await {
            jobs.extend(chunk?);
        }
        Ok(jobs)
    }
}

/// What a run is asked to do.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub version_id: Uuid,
    pub runner: Option<RunnerSpec>,
    pub filter: CaseFilter,
    pub callback_url: Option<String>,
    pub idempotency_key: Option<String>,
    pub kind: RunKind,
    /// Budget: the run stops once its cases spent more than this (`None`: no cap). Validated
    /// by the route (`> 0`, `>= 1`); the database's CHECKs hold the same rules.
    pub max_cost_usd: Option<f64>,
    pub max_tokens: Option<i64>,
    /// The regression gate asked for (`None`: the definition's `settings.gate`, if any).
    pub gate: Option<GateSpec>,
    /// A rescore's source run: its stored outputs are graded again (kind `rescore` only).
    pub rescore_of: Option<Uuid>,
    /// Each case also run without the skill (the runner leaves it out), to report the uplift.
    pub baseline: bool,
    /// Attempts per case (1: no repeats), to report pass@k and pass^k.
    pub repeats: u32,
    /// The package's trigger eval queries to run, one job each after the cases.
    pub triggers: Option<TriggerPlan>,
    /// A definition of the run's own instead of the version's (a rescore's inline
    /// `eval_config`, validated like an upload's); the run keeps it.
    pub definition: Option<Arc<DefinitionText>>,
    /// The stored token that asked for the run, recorded with it in the same insert: the
    /// per-token `concurrent_runs` quota counts its unfinished runs.
    pub token_id: Option<Uuid>,
}

impl RunRequest {
    /// A request for every case of a version, nothing else set.
    pub fn all_cases(version_id: Uuid, kind: RunKind) -> Self {
        RunRequest {
            version_id,
            runner: None,
            filter: CaseFilter::default(),
            callback_url: None,
            idempotency_key: None,
            kind,
            max_cost_usd: None,
            max_tokens: None,
            gate: None,
            rescore_of: None,
            baseline: false,
            repeats: 1,
            triggers: None,
            definition: None,
            token_id: None,
        }
    }

    /// The variants each planned case runs as ([`Variant::all`]).
    pub fn variants(&self) -> Vec<Variant> {
        Variant::all(self.repeats, self.baseline)
    }
}

/// A version to plan a run of: its definition as text.
#[derive(Debug)]
pub struct PlannedVersion {
    pub version_id: Uuid,
    pub package_hash: String,
    pub definition: Arc<DefinitionText>,
}

/// A planned run, ready to insert (`RunPlanner::insert`) and start (`RunPublisher::start`).
#[derive(Debug)]
pub struct PreparedRun {
    pub run_id: Uuid,
    pub(crate) version_id: Uuid,
    pub(crate) kind: RunKind,
    pub(crate) callback_url: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) max_in_flight: Option<i32>,
    pub(crate) fail_fast: bool,
    pub(crate) max_cost_usd: Option<f64>,
    pub(crate) max_tokens: Option<i64>,
    pub(crate) gate: Option<GateConfig>,
    /// The run's own definition (kept with the run), when it is not its version's.
    pub(crate) own_definition: Option<Arc<DefinitionText>>,
    /// The stored token that asked for the run.
    pub(crate) token_id: Option<Uuid>,
    /// How many jobs the filter selects.
    pub total: usize,
    /// What its jobs are planned from.
    pub plan: Arc<RunPlan>,
}

/// Each job's (case, variant): what its result row is keyed by.
pub(crate) fn variant_keys(jobs: &[Job]) -> Vec<(&str, Variant)> {
    jobs.iter()
        .map(|j| (j.case.id.as_str(), Variant::of(&j.runner)))
        .collect()
}
