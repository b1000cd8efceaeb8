//! How the model-backed strategies (`llm_judge`, `assertions`, `semantic_sim`) reach a model.
//!
//! Each is a [`ModelStrategy`] (its own checks, and the grader it builds on a client) wrapped
//! in [`ModelBacked`], which holds the provider clients the registry was built with
//! ([`super::StrategyRegistry::with_providers`]), or none. Compiling checks the case's fields
//! first, the same way either way, so a package is accepted or refused at upload alike with or
//! without a provider; then the case's client is resolved (option `provider`, else the
//! purpose's default), an unknown provider being a problem of the case. Without any provider
//! the case compiles to a grader that refuses to grade, and [`super::Strategy::missing_provider`]
//! names the strategy, so callers report a configuration problem instead of a failing skill.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;

use super::options::OptionReader;
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy, StrategyRegistry};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;
use skilleval_providers::{LlmClient, ProviderClients, Purpose, PROVIDER_OPTION};

/// A strategy that grades with a model, apart from reaching it.
#[async_trait]
pub(crate) trait ModelStrategy: Send + Sync + 'static {
    /// The name test cases use in `evaluation.strategy`.
    const NAME: &'static str;
    /// Which provider grades by default (`judge` or `embeddings`).
    const PURPOSE: Purpose;
    /// What the checks keep for grading.
    type Checked: fmt::Debug + Send + Sync + 'static;

    /// Checks the case's own fields, pushing problems into `opts` (the case's
    /// `evaluation.passingThreshold` is checked already).
    fn check(case: &TestCase, opts: &mut OptionReader<'_, '_>) -> Self::Checked;

    /// Refuses, at compile time, a provider that cannot serve this strategy (any will do
    /// unless a strategy says otherwise).
    fn accepts(_client: &LlmClient, _ctx: &CompileContext<'_>) -> Result<(), Vec<Problem>> {
        Ok(())
    }

    /// Grades one output with the case's client.
    async fn grade(
        checked: &Self::Checked,
        client: &LlmClient,
        input: &GradeInput<'_>,
    ) -> Result<Grade, Fault>;
}

/// A [`ModelStrategy`] with the provider clients it grades with (none: it validates and
/// reports the missing provider).
pub(crate) struct ModelBacked<S> {
    clients: Option<Arc<ProviderClients>>,
    strategy: PhantomData<S>,
}

impl<S: ModelStrategy> ModelBacked<S> {
    pub(crate) fn new(clients: Option<Arc<ProviderClients>>) -> Self {
        ModelBacked {
            clients,
            strategy: PhantomData,
        }
    }
}

impl<S: ModelStrategy> Strategy for ModelBacked<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn missing_provider(
        &self,
        _case: &TestCase,
        _registry: &StrategyRegistry,
    ) -> Option<&'static str> {
        self.clients.is_none().then_some(S::NAME)
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, S::NAME);
        opts.passing_threshold();
        let checked = S::check(case, &mut opts);
        let checked = opts.finish(checked)?;
        match client_for(self.clients.as_deref(), case, ctx, S::PURPOSE, S::NAME)? {
            Some(client) => {
                S::accepts(&client, ctx)?;
                Ok(Arc::new(ModelGrader::<S> { client, checked }))
            }
            None => Ok(Arc::new(Unconfigured { strategy: S::NAME })),
        }
    }
}

/// A compiled model-backed case: its client and what its checks kept.
struct ModelGrader<S: ModelStrategy> {
    client: Arc<LlmClient>,
    checked: S::Checked,
}

impl<S: ModelStrategy> fmt::Debug for ModelGrader<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelGrader")
            .field("strategy", &S::NAME)
            .field("provider", &self.client.name())
            .field("checked", &self.checked)
            .finish()
    }
}

#[async_trait]
impl<S: ModelStrategy> Grader for ModelGrader<S> {
    #[tracing::instrument(skip_all, fields(test_case_id = %input.case.id, strategy = S::NAME))]
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        S::grade(&self.checked, &self.client, input).await
    }
}

/// The client a case of `strategy` is graded with: `Ok(None)` when no provider is configured
/// at all; a problem at option `provider` when it names none of the configured ones (or at
/// `/evaluation/strategy` when the purpose has no default).
fn client_for(
    clients: Option<&ProviderClients>,
    case: &TestCase,
    ctx: &CompileContext<'_>,
    purpose: Purpose,
    strategy: &str,
) -> Result<Option<Arc<LlmClient>>, Vec<Problem>> {
    let Some(clients) = clients else {
        return Ok(None);
    };
    let named = case.option(PROVIDER_OPTION);
    let pointer = if case.evaluation.options.contains_key(PROVIDER_OPTION) {
        "/evaluation/options/provider"
    } else {
        "/expected/provider"
    };
    let named = match named {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s.as_str()),
        Some(_) => {
            return Err(vec![ctx.problem(
                pointer,
                format!("{strategy}: option `provider` must be a provider name"),
            )])
        }
    };
    clients.pick(named, purpose).map(Some).map_err(|message| {
        let at = if named.is_some() {
            pointer
        } else {
            "/evaluation/strategy"
        };
        vec![ctx.problem(at, format!("{strategy}: {message}"))]
    })
}

/// The grader of a model-backed strategy without a provider.
#[derive(Debug)]
struct Unconfigured {
    strategy: &'static str,
}

#[async_trait]
impl Grader for Unconfigured {
    async fn grade(&self, _input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        Err(Fault::permanent(format!(
            "strategy `{}` needs a model provider; none is configured (see docs/providers.md)",
            self.strategy
        )))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{case, pointers, Fixture};
    use skilleval_model::grade::Fault;

    /// Without a provider, each model-backed strategy checks its fields (problems at the given
    /// pointers), compiles a valid case, names itself as missing its provider, and refuses to
    /// grade with a permanent fault that says so.
    #[tokio::test]
    async fn without_a_provider_fields_are_checked_and_grading_refused() {
        let f = Fixture::new();
        let table = [
            (
                "llm_judge",
                vec![(
                    json!({"expected": {"rubric": {"criteria": [{"name": "a", "weight": 0.5}]}}}),
                    vec!["/testCases/0/expected/rubric/criteria"],
                )],
                // The creative profile's default rubric applies.
                json!({}),
            ),
            (
                "assertions",
                vec![
                    (json!({}), vec!["/testCases/0/expected/assertions"]),
                    (
                        json!({"expected": {"assertions": ["ok", " "]}}),
                        vec!["/testCases/0/expected/assertions/1"],
                    ),
                ],
                json!({"expected": {"assertions": ["mentions the refund"]}}),
            ),
            (
                "semantic_sim",
                vec![(
                    json!({"expected": {"semanticThreshold": 1.2}}),
                    vec![
                        "/testCases/0/expected/output",
                        "/testCases/0/expected/semanticThreshold",
                    ],
                )],
                json!({"expected": {"output": "a cat"}}),
            ),
        ];
        for (name, bad, good) in table {
            let with_strategy = |mut v: serde_json::Value| {
                v["evaluation"] = json!({"strategy": name});
                case(v)
            };
            for (fields, expected) in bad {
                let problems = f.problems(&with_strategy(fields));
                assert_eq!(pointers(&problems), expected, "{name}");
            }
            let good = with_strategy(good);
            assert!(f.compile(&good).is_ok(), "{name}");
            assert_eq!(f.registry.missing_provider(name, &good), Some(name));
            assert_eq!(
                f.grade(&good, "text").await.unwrap_err(),
                Fault::permanent(format!(
                    "strategy `{name}` needs a model provider; none is configured (see docs/providers.md)"
                )),
                "{name}"
            );
        }
    }
}
