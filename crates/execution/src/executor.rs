//! Executing one job: produce the output, grade it, under the case's timeout.
//!
//! This is the one code path that grades, whether the job came from the CLI's in-process pool or
//! from RabbitMQ. It never sleeps or retries a *fault* itself: a transient fault comes back in
//! the [`JobResult`] (`status: errored`, `error.kind: transient`) and the caller decides — the
//! CLI with [`RetryPolicy`](skilleval_model::grade::RetryPolicy), the worker through its delay queues. What the executor does repeat
//! is a *failing* case with `retryCount` (flaky cases), keeping every attempt.
//!
//! Graders are compiled once per definition ([`DefinitionKey`]: package, strategy, `expected`,
//! grading options) and cached, so a regex or schema validator is built once per distinct
//! definition — shared by every case that repeats it — never per output.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use tracing::Instrument as _;

use crate::case_scripts::{self, CaseWorkspace, Phase, Step};
use crate::environment::{EnvironmentConfig, Environments};
use crate::plan::Job;
use crate::result::{Attempt, CaseStatus, JobResult, NO_BASELINE};
use crate::runner::{ProduceRequest, RunnerRegistry};
use skilleval_grading::{
    CompileContext, DefinitionKey, GradeEnv, GradeInput, Grader, StrategyRegistry,
};
use skilleval_model::definition::{Profile, TestCase};
use skilleval_model::grade::{Fault, Grade, Usage};
use skilleval_model::output::Produced;
use skilleval_model::package::dependencies::read_from_dir;
use skilleval_model::package::Dependencies;
use skilleval_providers::ProviderClients;
use skilleval_sandbox::Sandbox;

/// Outputs longer than this are cut in stored results (the grade saw the whole output).
pub const MAX_STORED_OUTPUT_BYTES: usize = 256 * 1024;

/// Most compiled graders kept; past it the cache is emptied (cheap to rebuild, bounded memory).
/// A compiled regex case weighs tens of KB (docs/performance.md measured ~65 KB per
/// `regex_match` case), so this bounds the cache to well under 100 MB while still holding every
/// case of the packages a worker is busy with.
pub const GRADER_CACHE_CAPACITY: usize = 1_024;

/// Builds the [`Executor`] of `skilleval run` and of the worker: every strategy and runner,
/// registered by name in one place ([`StrategyRegistry::with_providers`],
/// [`RunnerRegistry::with_providers`]), the model-backed ones on the given provider clients.
/// The CLI gives clients on a folder cache and in-process limits, the worker on the fleet's
/// Postgres cache and rate limits; without clients those strategies and the `llm` runner say a
/// provider is needed ([`Executor::needs_missing_model`]).
#[derive(Debug, Default)]
pub struct ExecutorBuilder {
    providers: Option<Arc<ProviderClients>>,
    sandbox: Arc<Sandbox>,
    /// The Zod converter's folder, when `expected.zodSchema` is to be converted.
    zod_dir: Option<std::path::PathBuf>,
    /// Where the environments of packages that declare dependencies come from.
    environments: Option<Arc<Environments>>,
}

impl ExecutorBuilder {
    pub fn new() -> Self {
        ExecutorBuilder::default()
    }

    /// The configured providers' clients (`None`: no provider is configured).
    pub fn providers(mut self, providers: Option<Arc<ProviderClients>>) -> Self {
        self.providers = providers;
        self
    }

    /// Where custom graders and command runners run (default: [`Sandbox::default`]).
    pub fn sandbox(mut self, sandbox: Sandbox) -> Self {
        self.sandbox = Arc::new(sandbox);
        self
    }

    /// Converts `expected.zodSchema` with the converter in `dir` (`tools/zod`), run in this
    /// builder's sandbox.
    pub fn zod_dir(mut self, dir: std::path::PathBuf) -> Self {
        self.zod_dir = Some(dir);
        self
    }

    /// The environment cache (default: [`EnvironmentConfig::default`]'s, the public indexes).
    pub fn environments(mut self, environments: Arc<Environments>) -> Self {
        self.environments = Some(environments);
        self
    }

    pub fn build(self) -> Executor {
        let providers = self.providers.as_ref();
        let mut strategies = StrategyRegistry::with_providers(providers);
        if let Some(dir) = self.zod_dir {
            strategies = strategies.zod(Arc::new(skilleval_grading::zod::ZodConverter::new(
                self.sandbox.clone(),
                dir,
            )));
        }
        let executor = Executor::new(
            strategies.build(),
            RunnerRegistry::with_providers(providers),
            self.sandbox,
        );
        match self.environments {
            Some(environments) => executor.with_environments(environments),
            None => executor,
        }
    }
}

/// Produces and grades jobs.
pub struct Executor {
    strategies: StrategyRegistry,
    runners: RunnerRegistry,
    sandbox: Arc<Sandbox>,
    /// Compiled graders by definition (not by case: cases with the same definition share one).
    graders: Mutex<HashMap<DefinitionKey, Arc<dyn Grader>>>,
    /// Whether the runner call's span carries the prompt and the output text.
    capture_content: bool,
    environments: Arc<Environments>,
    /// The dependencies each package on disk declares (package hash and folder to them).
    declared: Mutex<HashMap<(String, std::path::PathBuf), Arc<Dependencies>>>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("strategies", &self.strategies)
            .field("runners", &self.runners)
            .finish()
    }
}

impl Executor {
    pub fn new(
        strategies: StrategyRegistry,
        runners: RunnerRegistry,
        sandbox: Arc<Sandbox>,
    ) -> Self {
        Executor {
            strategies,
            runners,
            sandbox,
            graders: Mutex::new(HashMap::new()),
            capture_content: false,
            environments: Arc::new(Environments::new(EnvironmentConfig::default())),
            declared: Mutex::new(HashMap::new()),
        }
    }

    /// Builds and caches the environments of packages that declare dependencies here.
    #[must_use]
    pub fn with_environments(mut self, environments: Arc<Environments>) -> Self {
        self.environments = environments;
        self
    }

    /// The environment cache.
    pub fn environments(&self) -> &Arc<Environments> {
        &self.environments
    }

    /// The dependencies the package at `package_root` declares, with the job's
    /// `setup.dependencies` (read once per package; the walk of its files runs off the
    /// runtime's threads).
    async fn declared(&self, job: &Job, package_root: &Path) -> Result<Arc<Dependencies>, Fault> {
        let key = (job.package_hash.clone(), package_root.to_path_buf());
        if let Some(d) = self.declared.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(d);
        }
        let (root, setup) = (package_root.to_path_buf(), job.dependencies.clone());
        let deps = tokio::task::spawn_blocking(move || read_from_dir(&root, &setup))
            .await
            .map(Arc::new)
            .map_err(|e| {
                Fault::host(format!(
                    "reading the package's declared dependencies did not finish: {e}"
                ))
            })?;
        if let Ok(mut m) = self.declared.lock() {
            if m.len() >= GRADER_CACHE_CAPACITY {
                m.clear();
            }
            m.insert(key, deps.clone());
        }
        Ok(deps)
    }

    /// The sandbox a job's package code runs in: the executor's, with the package's
    /// environment mounted when it declares dependencies (built first if needed); with it,
    /// what `details.environment` records. A recorded output runs none of the package's code
    /// but a custom grader's, which gets the environment too.
    async fn sandbox_for(
        &self,
        job: &Job,
        package_root: &Path,
    ) -> Result<(Arc<Sandbox>, Option<Value>), Fault> {
        let deps = self.declared(job, package_root).await?;
        if deps.is_empty() {
            return Ok((self.sandbox.clone(), None));
        }
        // Boxed: a build's future is large, and most jobs never await one.
        let (built, now) = Box::pin(self.environments.get(&self.sandbox, &deps)).await?;
        let sandbox = Arc::new(self.sandbox.with_environment(built.mount.clone()));
        Ok((sandbox, Some(built.details(now))))
    }

    /// Puts the prompt and the produced text on the runner call's span (`gen_ai.input.messages`,
    /// `gen_ai.output.messages`). Off by default: test inputs and outputs may be confidential.
    #[must_use]
    pub fn with_content_capture(mut self, capture: bool) -> Self {
        self.capture_content = capture;
        self
    }

    /// Whether the runner named `kind` can run a job without the skill (a baseline).
    pub fn runs_without_skill(&self, kind: &str) -> bool {
        self.runners.runs_without_skill(kind)
    }

    pub fn strategies(&self) -> &StrategyRegistry {
        &self.strategies
    }

    pub fn runners(&self) -> &RunnerRegistry {
        &self.runners
    }

    /// The sandbox untrusted code runs in (callers probe it to decide whether to take work).
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// Whether producing or grading this job needs a model provider that is not configured:
    /// the runner and the strategy (a `hybrid`'s parts included) say so themselves.
    pub fn needs_missing_model(&self, job: &Job) -> Option<String> {
        let kind = &job.runner.kind;
        if self.runners.get(kind).is_some_and(|r| r.missing_provider()) {
            return Some(format!("runner `{kind}` (no model provider configured)"));
        }
        self.strategies
            .missing_provider(job.strategy(), &job.case)
            .map(|name| format!("strategy `{name}` (no model provider configured)"))
    }

    /// Seeds the grader cache with graders compiled at validation time (case id -> grader,
    /// as [`Validation::graders`](crate::validate::Validation) holds them).
    pub fn prime(
        &self,
        package_hash: &str,
        profile: Profile,
        cases: &[TestCase],
        mut graders: BTreeMap<String, Arc<dyn Grader>>,
    ) {
        if let Ok(mut cache) = self.graders.lock() {
            for case in cases {
                if cache.len() >= GRADER_CACHE_CAPACITY {
                    // The rest compile lazily, once per definition, when their jobs run.
                    break;
                }
                if let Some(grader) = graders.remove(&case.id) {
                    cache
                        .entry(DefinitionKey::of(package_hash, profile, case))
                        .or_insert(grader);
                }
            }
        }
    }

    /// The compiled grader of a job's case, built once per definition ([`DefinitionKey`]).
    pub fn grader_for(&self, job: &Job, package_root: &Path) -> Result<Arc<dyn Grader>, Fault> {
        let key = DefinitionKey::of(&job.package_hash, job.profile, &job.case);
        if let Some(g) = self.graders.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(g);
        }
        let ctx = CompileContext {
            registry: &self.strategies,
            package_root,
            file: "test case",
            pointer: format!("/{}", skilleval_model::problem::escape_token(&job.case.id)),
            profile: job.profile,
        };
        let grader = self
            .strategies
            .compile(job.strategy(), &job.case, &ctx)
            .map_err(|problems| {
                Fault::permanent(format!(
                    "the test case does not compile: {}",
                    problems
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; ")
                ))
            })?;
        if let Ok(mut cache) = self.graders.lock() {
            if cache.len() >= GRADER_CACHE_CAPACITY {
                cache.clear();
            }
            cache.insert(key, grader.clone());
        }
        Ok(grader)
    }

    /// Why `job` cannot run: it asks for the baseline (no skill) of a runner that cannot
    /// leave the skill out ([`crate::runner::OutputRunner::runs_without_skill`]).
    pub fn no_baseline(&self, job: &Job) -> Option<String> {
        let kind = &job.runner.kind;
        (crate::variant::without_skill(&job.runner)
            && self.runners.get(kind).is_some()
            && !self.runners.runs_without_skill(kind))
        .then(|| format!("{NO_BASELINE}: runner `{kind}` cannot run without the skill"))
    }

    /// Produces and grades one job. Never panics and never returns without a result: faults
    /// become an `errored` result whose `error` says whether a retry could help.
    #[tracing::instrument(skip_all, fields(run_id = %job.run_id, test_case_id = %job.case.id))]
    pub async fn execute(&self, job: &Job, package_root: &Path) -> JobResult {
        if let Some(reason) = self.no_baseline(job) {
            return JobResult::skipped(job, &reason);
        }
        let started = Utc::now();
        let mut result = JobResult::for_job(job, started);
        let (sandbox, environment) = match self.sandbox_for(job, package_root).await {
            Ok(found) => found,
            Err(fault) => {
                let mut result = finish_errored(result, 1, fault, 0);
                record_steps(
                    &mut result,
                    [("environment", Some(serde_json::json!({"failed": true})))],
                );
                return result;
            }
        };
        let env = GradeEnv {
            sandbox,
            package_root: Arc::from(package_root),
        };
        let grader = match self.grader_for(job, package_root) {
            Ok(g) => g,
            Err(fault) => return finish_errored(result, 1, fault, 0),
        };
        let max_attempts = job.retry_count.saturating_add(1);
        for n in 1..=max_attempts {
            let t0 = Instant::now();
            let timeout = Duration::from_millis(job.timeout_ms);
            // Setup and teardown scripts get a fresh case workspace per attempt; a recorded
            // output (a rescore, a preview, a production sample) is graded without them.
            let workspace = if job.scripts.is_empty() || job.given.is_some() {
                None
            } else {
                match CaseWorkspace::create(&env.sandbox) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        let fault = Fault::host(format!("creating the case's workspace: {e}"));
                        return finish_errored(result, n, fault, 0);
                    }
                }
            };
            let mut setup = None;
            let outcome = tokio::time::timeout(
                timeout,
                self.attempt(
                    job,
                    grader.as_ref(),
                    &env,
                    timeout,
                    workspace.as_ref(),
                    &mut setup,
                ),
            )
            .await;
            let elapsed = duration_ms(t0.elapsed());
            let number = n;
            // After grading, outside the case's timeout: it cannot change the grade.
            let teardown = match (&job.scripts.teardown, &workspace) {
                (Some(script), Some(ws)) => Some(
                    self.teardown(job, &env, ws, script, &outcome, timeout)
                        .await,
                ),
                _ => None,
            };
            let steps = [
                ("setup", setup),
                ("teardown", teardown),
                ("environment", environment.clone()),
            ];
            match outcome {
                Err(_) => {
                    let mut result = finish_errored(
                        result,
                        number,
                        Fault::Timeout {
                            timeout_ms: job.timeout_ms,
                        },
                        elapsed,
                    );
                    record_steps(&mut result, steps);
                    return result;
                }
                Ok((produce_usage, Err(Unfinished { fault, produced }))) => {
                    result.produce_usage.add(&produce_usage);
                    let mut result = finish_errored(result, number, fault, elapsed);
                    if let Some(produced) = produced {
                        keep_partial(&mut result, produced);
                    }
                    record_steps(&mut result, steps);
                    return result;
                }
                Ok((produce_usage, Ok((produced, grade, grade_ms)))) => {
                    result.produce_usage.add(&produce_usage);
                    result.grade_usage.add(&grade.usage);
                    let status = if grade.passed {
                        CaseStatus::Passed
                    } else {
                        CaseStatus::Failed
                    };
                    result.attempts.push(Attempt {
                        number,
                        status,
                        score: Some(grade.score),
                        duration_ms: elapsed,
                        grade_ms,
                        error: None,
                    });
                    apply_grade(&mut result, produced, grade, elapsed);
                    record_steps(&mut result, steps);
                    result.status = status;
                    if status == CaseStatus::Passed {
                        break;
                    }
                }
            }
        }
        result.finished_at = Utc::now();
        result
    }

    /// One attempt: produce, then grade. Returns what producing cost even when grading fails
    /// or the runner stopped short, and with the grade, the milliseconds grading took.
    /// With a `workspace`, the package's setup script runs first, in it (what it did goes to
    /// `setup`); its failure ends the attempt before the runner starts.
    async fn attempt(
        &self,
        job: &Job,
        grader: &dyn Grader,
        env: &GradeEnv,
        timeout: Duration,
        workspace: Option<&CaseWorkspace>,
        setup: &mut Option<Value>,
    ) -> (Usage, Result<(Produced, Grade, u64), Unfinished>) {
        let Some(runner) = self.runners.get(&job.runner.kind) else {
            let known = self.runners.names().join(", ");
            let msg = format!("unknown runner `{}`; known: {known}", job.runner.kind);
            return (Usage::default(), Err(Fault::permanent(msg).into()));
        };
        let started = Instant::now();
        if let (Some(script), Some(ws)) = (&job.scripts.setup, workspace) {
            let input = &job.case.input;
            let step = Step {
                phase: Phase::Setup,
                script,
                sandbox: &env.sandbox,
                package_root: &env.package_root,
                workspace: ws,
                stdin: serde_json::json!({
                    "phase": "setup",
                    "workspace": ws.seen_from(&env.sandbox),
                    "test_case_id": job.case.id,
                    "prompt": input.prompt,
                    "variables": input.variables,
                    "files": input.files,
                }),
                environment: &job.environment,
                timeout,
            };
            match case_scripts::setup(step).await {
                Ok(report) => *setup = Some(report.to_json()),
                Err(fault) => return (Usage::default(), Err(fault.into())),
            }
        }
        let req = ProduceRequest {
            case: &job.case,
            runner: &job.runner,
            given: job.given.as_ref(),
            environment: &job.environment,
            // What the setup left of the attempt's time (an agent stops itself before it).
            timeout: timeout.saturating_sub(started.elapsed()),
            workspace,
        };
        let span = produce_span(job);
        let mut produced = match runner.produce(&req, env).instrument(span.clone()).await {
            Ok(p) => p,
            Err(fault) => {
                record_fault(&span, &fault);
                return (Usage::default(), Err(fault.into()));
            }
        };
        self.record_produced(&span, job, &produced);
        if let Some(fault) = produced.stopped.take() {
            record_fault(&span, &fault);
            return (
                produced.usage,
                Err(Unfinished {
                    fault,
                    produced: Some(produced),
                }),
            );
        }
        drop(span);
        let usage = produced.usage;
        // Files the case expects, and the file it grades, before the strategy runs: a missing
        // or unreadable file fails the case (the skill did not deliver), it is not an error.
        let file_checks =
            skilleval_grading::extract::check_files(&job.case.expected.files, &produced.files);
        let target = skilleval_grading::extract::target_text(&job.case, &produced.files);
        let failed_checks: Vec<&(String, bool, String)> =
            file_checks.iter().filter(|c| !c.1).collect();
        if !failed_checks.is_empty() || target.is_err() {
            let mut problems: Vec<String> = failed_checks
                .iter()
                .map(|(p, _, d)| format!("expected file `{p}`: {d}"))
                .collect();
            if let Err(e) = &target {
                problems.push(e.clone());
            }
            let grade = Grade::new(
                0.0,
                false,
                serde_json::json!({"files": file_checks_json(&file_checks), "problems": problems}),
            );
            return (usage, Ok((produced, grade, 0)));
        }
        let graded_text = target.ok().flatten();
        let input = GradeInput {
            output: graded_text.as_deref().unwrap_or(&produced.output),
            prompt: &job.case.input.prompt,
            context: job.case.input.context.as_ref(),
            tool_calls: produced.tool_calls.as_deref(),
            case: &job.case,
            files: &produced.files,
        };
        let grading = Instant::now();
        let span = tracing::info_span!(
            "grade",
            otel.name = %format_args!("grade {}", job.strategy()),
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
            skilleval.run_id = %job.run_id,
            skilleval.test_case_id = %job.case.id,
            skilleval.strategy = job.strategy(),
            skilleval.score = tracing::field::Empty,
            skilleval.passed = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
        );
        let graded = grader.grade(&input, env).instrument(span.clone()).await;
        match &graded {
            Ok(g) => {
                span.record("skilleval.score", g.score);
                span.record("skilleval.passed", g.passed);
                if !g.usage.is_zero() {
                    record_tokens(&span, &g.usage);
                }
            }
            Err(fault) => record_fault(&span, fault),
        }
        drop(span);
        let grade_ms = duration_ms(grading.elapsed());
        let graded = graded.map(|mut g| {
            if !file_checks.is_empty() {
                if let Value::Object(map) = &mut g.details {
                    map.insert("files".into(), file_checks_json(&file_checks));
                }
            }
            g
        });
        (
            usage,
            graded
                .map(|g| (produced, g, grade_ms))
                .map_err(Unfinished::from),
        )
    }

    /// Runs the package's teardown script in the attempt's workspace, told how the attempt
    /// ended; what it did, as `details.teardown` records it.
    async fn teardown(
        &self,
        job: &Job,
        env: &GradeEnv,
        workspace: &CaseWorkspace,
        script: &str,
        outcome: &AttemptOutcome,
        timeout: Duration,
    ) -> Value {
        let (status, score) = match outcome {
            Ok((_, Ok((_, grade, _)))) if grade.passed => (CaseStatus::Passed, Some(grade.score)),
            Ok((_, Ok((_, grade, _)))) => (CaseStatus::Failed, Some(grade.score)),
            _ => (CaseStatus::Errored, None),
        };
        case_scripts::teardown(Step {
            phase: Phase::Teardown,
            script,
            sandbox: &env.sandbox,
            package_root: &env.package_root,
            workspace,
            stdin: serde_json::json!({
                "phase": "teardown",
                "workspace": workspace.seen_from(&env.sandbox),
                "test_case_id": job.case.id,
                "status": status.as_str(),
                "score": score,
            }),
            environment: &job.environment,
            timeout,
        })
        .await
    }

    /// What the runner call's span learns from its answer: for a model call (a runner that
    /// names its provider and model), the GenAI semantic conventions' attributes.
    fn record_produced(&self, span: &tracing::Span, job: &Job, produced: &Produced) {
        let text = |key: &str| produced.details.get(key).and_then(Value::as_str);
        if let (Some(provider), Some(model)) = (text("provider"), text("model")) {
            span.record("gen_ai.operation.name", "chat");
            span.record("gen_ai.provider.name", provider);
            span.record("gen_ai.request.model", model);
            span.record("gen_ai.response.model", model);
        }
        if !produced.usage.is_zero() {
            record_tokens(span, &produced.usage);
        }
        if self.capture_content {
            let message = |role: &str, content: &str| {
                serde_json::json!([{"role": role, "parts": [{"type": "text", "content": content}]}])
                    .to_string()
            };
            span.record(
                "gen_ai.input.messages",
                message("user", &job.case.input.prompt),
            );
            span.record(
                "gen_ai.output.messages",
                message("assistant", &produced.output),
            );
        }
    }
}

/// An attempt as the case's timeout left it: what producing cost, and the graded output or
/// why there is none.
type AttemptOutcome =
    Result<(Usage, Result<(Produced, Grade, u64), Unfinished>), tokio::time::error::Elapsed>;

/// Puts what the setup and teardown scripts did on the result (`details.setup`,
/// `details.teardown`), whatever the attempt became.
fn record_steps<const N: usize>(result: &mut JobResult, steps: [(&str, Option<Value>); N]) {
    for (key, value) in steps {
        let Some(value) = value else { continue };
        if !result.details.is_object() {
            let grade = std::mem::take(&mut result.details);
            result.details = if grade.is_null() {
                serde_json::json!({})
            } else {
                serde_json::json!({ "grade": grade })
            };
        }
        if let Value::Object(map) = &mut result.details {
            map.insert(key.into(), value);
        }
    }
}

/// Why an attempt ended without a grade, with what the runner had produced when it stopped
/// short ([`Produced::stopped`]; `None` for a runner that failed outright or a grader's fault).
struct Unfinished {
    fault: Fault,
    produced: Option<Produced>,
}

impl From<Fault> for Unfinished {
    fn from(fault: Fault) -> Self {
        Unfinished {
            fault,
            produced: None,
        }
    }
}

/// Keeps on an errored result what its runner produced before it stopped short: the runner's
/// details (an agent's transcript, turns and the limit it hit) beside the error, and the text
/// it had. Its usage is already in `produce_usage`.
fn keep_partial(result: &mut JobResult, produced: Produced) {
    if !produced.details.is_null() {
        if let Value::Object(map) = &mut result.details {
            map.insert("runner".into(), produced.details);
        }
    }
    if !produced.output.is_empty() {
        let (output, cut) = cap_output(produced.output);
        result.output = Some(output);
        result.output_truncated = produced.truncated || cut;
    }
}

/// The span of a runner call; [`Executor::record_produced`] fills in what the answer says.
fn produce_span(job: &Job) -> tracing::Span {
    tracing::info_span!(
        "produce",
        // A model call is named as the GenAI conventions name it (the model is known only
        // from the answer, and a started span keeps its name).
        otel.name = %if job.runner.kind == "llm" {
            "chat".to_string()
        } else {
            format!("produce {}", job.runner.kind)
        },
        otel.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
        skilleval.run_id = %job.run_id,
        skilleval.test_case_id = %job.case.id,
        skilleval.runner = job.runner.kind.as_str(),
        gen_ai.operation.name = tracing::field::Empty,
        gen_ai.provider.name = tracing::field::Empty,
        gen_ai.request.model = tracing::field::Empty,
        gen_ai.response.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.input.messages = tracing::field::Empty,
        gen_ai.output.messages = tracing::field::Empty,
    )
}

/// Token counts as `i64` (`tracing-opentelemetry` exports unsigned integers as text).
fn record_tokens(span: &tracing::Span, usage: &Usage) {
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", int(usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", int(usage.output_tokens));
}

/// Marks a span failed with the fault's kind (`transient`, `permanent`, ...).
fn record_fault(span: &tracing::Span, fault: &Fault) {
    span.record("otel.status_code", "ERROR");
    span.record("error.type", fault.kind());
}

fn file_checks_json(checks: &[(String, bool, String)]) -> Value {
    Value::Array(
        checks
            .iter()
            .map(|(path, passed, detail)| serde_json::json!({"path": path, "passed": passed, "detail": detail}))
            .collect(),
    )
}

fn apply_grade(result: &mut JobResult, produced: Produced, grade: Grade, elapsed: u64) {
    result.score = Some(grade.score);
    let mut details = grade.details;
    if !produced.details.is_null() {
        if let Value::Object(map) = &mut details {
            map.insert("runner".into(), produced.details);
        } else {
            details = serde_json::json!({ "grade": details, "runner": produced.details });
        }
    }
    result.details = details;
    result.rubric_scores = grade.rubric_scores;
    result.feedback = grade.feedback;
    result.matched_patterns = grade.matched_patterns;
    result.schema_errors = grade.schema_errors;
    let (output, cut) = cap_output(produced.output);
    result.output = Some(output);
    result.output_truncated = produced.truncated || cut;
    result.duration_ms = elapsed;
    result.error = None;
}

fn finish_errored(mut result: JobResult, number: u32, fault: Fault, elapsed: u64) -> JobResult {
    result.attempts.push(Attempt {
        number,
        status: CaseStatus::Errored,
        score: None,
        duration_ms: elapsed,
        grade_ms: 0,
        error: Some(fault.to_string()),
    });
    result.status = CaseStatus::Errored;
    result.score = None;
    result.details = serde_json::json!({ "error": fault.to_string() });
    result.duration_ms = elapsed;
    result.error = Some(fault);
    result.finished_at = Utc::now();
    result
}

fn cap_output(mut s: String) -> (String, bool) {
    if s.len() <= MAX_STORED_OUTPUT_BYTES {
        return (s, false);
    }
    let mut cut = MAX_STORED_OUTPUT_BYTES;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    (s, true)
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::OutputRunner;
    use async_trait::async_trait;
    use skilleval_grading::Strategy;
    use skilleval_model::definition::{Given, RunnerConfig, TestCase};
    use std::sync::atomic::{AtomicU32, Ordering};
    use uuid::Uuid;

    /// Passes when the output equals "ok"; counts its grades; takes `delay` to grade.
    #[derive(Debug, Default)]
    struct Equals {
        grades: Arc<AtomicU32>,
        delay: Duration,
    }

    impl Strategy for Equals {
        fn name(&self) -> &'static str {
            "equals_ok"
        }
        fn compile(
            &self,
            _case: &TestCase,
            _ctx: &CompileContext<'_>,
        ) -> Result<Arc<dyn Grader>, Vec<skilleval_model::problem::Problem>> {
            Ok(Arc::new(EqualsGrader {
                grades: self.grades.clone(),
                delay: self.delay,
            }))
        }
    }

    #[derive(Debug)]
    struct EqualsGrader {
        grades: Arc<AtomicU32>,
        delay: Duration,
    }

    #[async_trait]
    impl Grader for EqualsGrader {
        async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
            self.grades.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            let ok = input.output == "ok";
            Ok(Grade::new(if ok { 1.0 } else { 0.0 }, ok, Value::Null))
        }
    }

    /// Produces scripted outputs in order: "sleep" hangs, "fail" is a permanent fault.
    #[derive(Debug)]
    struct Scripted {
        outputs: Vec<&'static str>,
        calls: AtomicU32,
    }

    #[async_trait]
    impl OutputRunner for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        async fn produce(
            &self,
            _req: &ProduceRequest<'_>,
            _env: &GradeEnv,
        ) -> Result<Produced, Fault> {
            let i = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
            match self.outputs.get(i).copied().unwrap_or("ok") {
                "sleep" => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(Produced::default())
                }
                "fail" => Err(Fault::permanent("script crashed")),
                "stopped" => Ok(Produced {
                    output: "half done".to_string(),
                    usage: Usage {
                        input_tokens: 4_000,
                        output_tokens: 200,
                        cost_usd: 0.01,
                    },
                    details: serde_json::json!({"limit": "max_turns", "turns": [1, 2]}),
                    stopped: Some(Fault::permanent("agent stopped: max turns reached (2)")),
                    ..Produced::default()
                }),
                "429" => Err(Fault::Transient {
                    message: "rate limited".into(),
                    retry_after_ms: Some(2_000),
                }),
                out => Ok(Produced {
                    output: out.to_string(),
                    ..Produced::default()
                }),
            }
        }
    }

    fn executor(outputs: Vec<&'static str>) -> (Executor, Arc<AtomicU32>) {
        executor_grading_in(outputs, Duration::ZERO)
    }

    fn executor_grading_in(
        outputs: Vec<&'static str>,
        grade_delay: Duration,
    ) -> (Executor, Arc<AtomicU32>) {
        let grades = Arc::new(AtomicU32::new(0));
        let strategies = StrategyRegistry::builder()
            .register(Arc::new(Equals {
                grades: grades.clone(),
                delay: grade_delay,
            }))
            .build();
        let runners = RunnerRegistry::default().with(Arc::new(Scripted {
            outputs,
            calls: AtomicU32::new(0),
        }));
        (
            Executor::new(strategies, runners, Arc::new(Sandbox::default())),
            grades,
        )
    }

    fn job(retry_count: u32, timeout_ms: u64) -> Job {
        let mut case = TestCase {
            id: "tc-1".into(),
            name: "one".into(),
            weight: 2.0,
            ..TestCase::default()
        };
        case.evaluation.strategy = "equals_ok".into();
        Job {
            run_id: Uuid::nil(),
            case,
            case_index: 0,
            profile: skilleval_model::definition::Profile::Deterministic,
            runner: RunnerConfig {
                kind: "scripted".into(),
                ..RunnerConfig::default()
            },
            timeout_ms,
            retry_count,
            package_hash: "hash".into(),
            environment: Default::default(),
            scripts: Default::default(),
            dependencies: Vec::new(),
            given: None,
            suites: vec![],
            attempt: 1,
        }
    }

    /// An empty package folder: these jobs read no file of their package, and an empty folder
    /// declares no dependency (the root of the file system, which a PEP 723 script anywhere on
    /// the machine would make a package with dependencies, does).
    fn no_package() -> &'static Path {
        static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
        DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
    }

    #[tokio::test]
    async fn passing_case_is_graded_once() {
        let (ex, grades) = executor(vec!["ok"]);
        let r = ex.execute(&job(0, 1_000), no_package()).await;
        assert_eq!(r.status, CaseStatus::Passed);
        assert_eq!(r.score, Some(1.0));
        assert_eq!(r.output.as_deref(), Some("ok"));
        assert_eq!(r.attempts.len(), 1);
        assert_eq!(r.weight, 2.0);
        assert_eq!(grades.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_attempt_records_the_time_its_grader_took() {
        let (ex, _) = executor_grading_in(vec!["ok"], Duration::from_millis(60));
        let r = ex.execute(&job(0, 5_000), no_package()).await;
        let attempt = &r.attempts[0];
        assert!(attempt.grade_ms >= 60, "grade_ms = {}", attempt.grade_ms);
        assert!(attempt.grade_ms <= attempt.duration_ms);
    }

    #[tokio::test]
    async fn failing_flaky_case_is_retried_and_every_attempt_kept() {
        let (ex, _) = executor(vec!["no", "no", "ok"]);
        let r = ex.execute(&job(3, 1_000), no_package()).await;
        assert_eq!(r.status, CaseStatus::Passed);
        let statuses: Vec<_> = r.attempts.iter().map(|a| a.status).collect();
        assert_eq!(
            statuses,
            vec![CaseStatus::Failed, CaseStatus::Failed, CaseStatus::Passed]
        );
    }

    #[tokio::test]
    async fn failing_case_stops_after_retry_count() {
        let (ex, _) = executor(vec!["no", "no", "no", "ok"]);
        let r = ex.execute(&job(1, 1_000), no_package()).await;
        assert_eq!(r.status, CaseStatus::Failed);
        assert_eq!(r.attempts.len(), 2);
        assert_eq!(r.score, Some(0.0));
    }

    #[tokio::test(start_paused = true)]
    async fn hanging_runner_is_errored_at_the_timeout_not_failed() {
        let (ex, grades) = executor(vec!["sleep"]);
        let r = ex.execute(&job(2, 250), no_package()).await;
        assert_eq!(r.status, CaseStatus::Errored);
        assert_eq!(r.error, Some(Fault::Timeout { timeout_ms: 250 }));
        assert!(r.error.as_ref().is_some_and(Fault::is_transient));
        assert_eq!(r.score, None);
        // An erroring case is not re-run by retryCount (that is for failing cases).
        assert_eq!(r.attempts.len(), 1);
        assert_eq!(grades.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn permanent_fault_is_errored_and_not_transient() {
        let (ex, _) = executor(vec!["fail"]);
        let r = ex.execute(&job(0, 1_000), no_package()).await;
        assert_eq!(r.status, CaseStatus::Errored);
        assert!(!r.error.as_ref().is_some_and(Fault::is_transient));
        assert!(r.details["error"]
            .as_str()
            .unwrap_or_default()
            .contains("script crashed"));
    }

    #[tokio::test]
    async fn a_runner_stopped_short_is_errored_with_its_usage_and_details_kept() {
        let (ex, grades) = executor(vec!["stopped"]);
        let r = ex.execute(&job(2, 1_000), no_package()).await;
        assert_eq!(r.status, CaseStatus::Errored);
        assert_eq!(
            r.error,
            Some(Fault::permanent("agent stopped: max turns reached (2)"))
        );
        assert_eq!(r.produce_usage.total_tokens(), 4_200);
        assert!((r.produce_usage.cost_usd - 0.01).abs() < 1e-12);
        assert_eq!(r.details["runner"]["limit"], "max_turns");
        assert_eq!(r.details["runner"]["turns"], serde_json::json!([1, 2]));
        assert!(r.details["error"]
            .as_str()
            .unwrap_or_default()
            .contains("max turns reached"));
        assert_eq!(r.output.as_deref(), Some("half done"));
        assert_eq!(r.score, None);
        // Never graded, and not re-run by retryCount (an error, not a failure).
        assert_eq!(grades.load(Ordering::SeqCst), 0);
        assert_eq!(r.attempts.len(), 1);
    }

    #[tokio::test]
    async fn unknown_strategy_errors_with_the_known_names() {
        let (ex, _) = executor(vec!["ok"]);
        let mut j = job(0, 1_000);
        j.case.evaluation.strategy = "nope".into();
        let r = ex.execute(&j, no_package()).await;
        assert_eq!(r.status, CaseStatus::Errored);
        let msg = r.error.map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("unknown strategy `nope`") && msg.contains("equals_ok"),
            "{msg}"
        );
    }

    #[test]
    fn a_hybrid_with_a_model_part_needs_a_model() {
        let ex = ExecutorBuilder::new().build();
        let mut j = job(0, 1_000);
        j.runner.kind = "given".into();
        j.case.evaluation.strategy = "hybrid".into();
        j.case.evaluation.weights = [
            ("regex_match".to_string(), 0.5),
            ("llm_judge".to_string(), 0.5),
        ]
        .into();
        let why = ex.needs_missing_model(&j).unwrap_or_default();
        assert!(why.contains("`llm_judge`"), "{why}");
        j.case.evaluation.weights = [("regex_match".to_string(), 1.0)].into();
        assert_eq!(ex.needs_missing_model(&j), None);
        j.runner.kind = "llm".into();
        assert!(ex.needs_missing_model(&j).is_some());
    }

    #[tokio::test]
    async fn without_providers_the_llm_runner_refuses_as_a_configuration_problem() {
        let ex = ExecutorBuilder::new().build();
        let mut j = job(0, 1_000);
        j.runner.kind = "llm".into();
        j.case.evaluation.strategy = "exact_match".into();
        j.case.expected.output = Some("x".into());
        assert_eq!(
            ex.needs_missing_model(&j).as_deref(),
            Some("runner `llm` (no model provider configured)")
        );
        let r = ex.execute(&j, no_package()).await;
        assert_eq!(r.status, CaseStatus::Errored);
        assert_eq!(
            r.error,
            Some(Fault::permanent(
                "runner `llm` needs a model provider; none is configured (see docs/providers.md)"
            ))
        );
        j.runner.kind = "given".into();
        j.case.evaluation.strategy = "semantic_sim".into();
        assert_eq!(
            ex.needs_missing_model(&j).as_deref(),
            Some("strategy `semantic_sim` (no model provider configured)")
        );
    }

    #[tokio::test]
    async fn graders_are_compiled_once_per_definition() {
        let (ex, _) = executor(vec![]);
        let j = job(0, 1_000);
        let a = ex.grader_for(&j, no_package()).unwrap();
        let b = ex.grader_for(&j, no_package()).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        // Another case with the same definition (id, name, input differ) shares it.
        let mut other = job(0, 1_000);
        other.case.id = "tc-2".into();
        other.case.name = "two".into();
        other.case.input.prompt = "something else".into();
        assert!(Arc::ptr_eq(
            &a,
            &ex.grader_for(&other, no_package()).unwrap()
        ));
        // A different expectation, option or package is another definition.
        let mut expected = job(0, 1_000);
        expected.case.expected.output = Some("different".into());
        assert!(!Arc::ptr_eq(
            &a,
            &ex.grader_for(&expected, no_package()).unwrap()
        ));
        let mut option = job(0, 1_000);
        option
            .case
            .evaluation
            .options
            .insert("caseSensitive".into(), serde_json::json!(false));
        assert!(!Arc::ptr_eq(
            &a,
            &ex.grader_for(&option, no_package()).unwrap()
        ));
        let mut package = job(0, 1_000);
        package.package_hash = "another".into();
        assert!(!Arc::ptr_eq(
            &a,
            &ex.grader_for(&package, no_package()).unwrap()
        ));
        assert_eq!(ex.graders.lock().unwrap().len(), 4);
    }

    #[test]
    fn the_grader_cache_stays_within_its_capacity() {
        let (ex, _) = executor(vec![]);
        let grader = ex.grader_for(&job(0, 1_000), no_package()).unwrap();
        let cases: Vec<TestCase> = (0..GRADER_CACHE_CAPACITY + 10)
            .map(|i| {
                let mut c = job(0, 1_000).case;
                c.id = format!("c{i}");
                c.expected.output = Some(format!("out {i}"));
                c
            })
            .collect();
        let graders = cases
            .iter()
            .map(|c| (c.id.clone(), grader.clone()))
            .collect();
        ex.prime(
            "other",
            skilleval_model::definition::Profile::Deterministic,
            &cases,
            graders,
        );
        assert!(ex.graders.lock().unwrap().len() <= GRADER_CACHE_CAPACITY);
        let mut j = job(0, 1_000);
        j.package_hash = "third".into();
        ex.grader_for(&j, no_package()).unwrap();
        assert!(ex.graders.lock().unwrap().len() <= GRADER_CACHE_CAPACITY);
    }

    #[test]
    fn primed_graders_serve_the_jobs_of_their_cases() {
        let (ex, _) = executor(vec![]);
        let (other, _) = executor(vec![]);
        let j = job(0, 1_000);
        let grader = other.grader_for(&j, no_package()).unwrap();
        let mut case = j.case.clone();
        // Validation sees the case before planning resolves its strategy name.
        case.evaluation.strategy = "equals_ok".into();
        ex.prime(
            &j.package_hash,
            j.profile,
            std::slice::from_ref(&case),
            [(case.id.clone(), grader.clone())].into(),
        );
        assert!(Arc::ptr_eq(
            &grader,
            &ex.grader_for(&j, no_package()).unwrap()
        ));
    }

    #[test]
    fn given_output_travels_with_the_job() {
        let mut j = job(0, 1_000);
        j.given = Some(Given {
            output: "x".into(),
            tool_calls: None,
        });
        let back: Job = serde_json::from_str(&serde_json::to_string(&j).unwrap()).unwrap();
        assert_eq!(back, j);
    }

    #[test]
    fn stored_output_is_capped_on_a_char_boundary() {
        let s = "é".repeat(MAX_STORED_OUTPUT_BYTES);
        let (out, cut) = cap_output(s);
        assert!(cut);
        assert!(out.len() <= MAX_STORED_OUTPUT_BYTES);
    }
}
