//! The one place strategies are registered by name.
//!
//! The model-backed ones (`llm_judge`, `assertions`, `semantic_sim`) get the provider clients
//! the registry is built with; without, they validate the same and report the missing
//! provider instead of grading.

use std::sync::Arc;

use super::assertions::Assertions;
use super::contains::Contains;
use super::custom::Custom;
use super::exact_match::ExactMatch;
use super::hybrid::Hybrid;
use super::json_schema::JsonSchema;
use super::keyword_coverage::KeywordCoverage;
use super::lexical_similarity::LexicalSimilarity;
use super::llm_judge::LlmJudge;
use super::provider::ModelBacked;
use super::regex_match::RegexMatch;
use super::semantic_sim::SemanticSim;
use super::sentiment::Sentiment;
use super::tool_usage::ToolUsage;
use super::toxicity::Toxicity;
use super::StrategyRegistryBuilder;
use skilleval_providers::ProviderClients;

pub(super) fn register(
    builder: StrategyRegistryBuilder,
    providers: Option<&Arc<ProviderClients>>,
) -> StrategyRegistryBuilder {
    builder
        .register(Arc::new(ExactMatch))
        .register(Arc::new(RegexMatch))
        .register(Arc::new(JsonSchema))
        .register(Arc::new(Contains))
        .alias("rule_based", "contains")
        .register(Arc::new(LexicalSimilarity))
        .register(Arc::new(KeywordCoverage))
        .register(Arc::new(Sentiment))
        .register(Arc::new(Toxicity))
        .register(Arc::new(ToolUsage))
        .register(Arc::new(Hybrid))
        .register(Arc::new(Custom))
        .register(Arc::new(ModelBacked::<LlmJudge>::new(providers.cloned())))
        .register(Arc::new(ModelBacked::<Assertions>::new(providers.cloned())))
        .register(Arc::new(ModelBacked::<SemanticSim>::new(
            providers.cloned(),
        )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use std::sync::Arc;

    use super::super::StrategyRegistry;
    use skilleval_model::definition::TestCase;
    use skilleval_providers::ProviderClients;

    #[test]
    fn every_design_strategy_is_registered() {
        let registry = StrategyRegistry::builtin().build();
        assert_eq!(
            registry.names(),
            vec![
                "assertions",
                "contains",
                "custom",
                "exact_match",
                "hybrid",
                "json_schema",
                "keyword_coverage",
                "lexical_similarity",
                "llm_judge",
                "regex_match",
                "semantic_sim",
                "sentiment",
                "tool_usage",
                "toxicity",
            ]
        );
        assert_eq!(
            registry.get("rule_based").map(|s| s.name()),
            Some("contains")
        );
        let case = TestCase::default();
        let needs_model = |registry: &StrategyRegistry| -> Vec<&str> {
            registry
                .names()
                .into_iter()
                .filter_map(|n| registry.missing_provider(n, &case))
                .collect()
        };
        assert_eq!(
            needs_model(&registry),
            vec!["assertions", "llm_judge", "semantic_sim"]
        );
        let clients = Arc::new(ProviderClients::default());
        let configured = StrategyRegistry::with_providers(Some(&clients)).build();
        assert_eq!(configured.names(), registry.names());
        assert!(needs_model(&configured).is_empty());
    }
}
