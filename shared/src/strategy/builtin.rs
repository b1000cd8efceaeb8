//! The one place built-in strategies are registered by name.
//!
//! Model-backed strategies are registered here as [`ModelRequired`] placeholders that validate
//! but refuse to grade; registering the real ones later under the same names replaces them.

use std::sync::Arc;

use super::contains::Contains;
use super::custom::Custom;
use super::exact_match::ExactMatch;
use super::hybrid::Hybrid;
use super::json_schema::JsonSchema;
use super::keyword_coverage::KeywordCoverage;
use super::lexical_similarity::LexicalSimilarity;
use super::model_required::ModelRequired;
use super::regex_match::RegexMatch;
use super::sentiment::Sentiment;
use super::tool_usage::ToolUsage;
use super::toxicity::Toxicity;
use super::{StrategyRegistryBuilder, MODEL_STRATEGIES};

pub(super) fn register(builder: StrategyRegistryBuilder) -> StrategyRegistryBuilder {
    let builder = builder
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
        .register(Arc::new(Custom));
    MODEL_STRATEGIES.iter().fold(builder, |b, name| {
        b.register(Arc::new(ModelRequired::new(name)))
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use super::super::StrategyRegistry;

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
        let needs_model: Vec<&str> = registry
            .names()
            .into_iter()
            .filter(|n| registry.get(n).is_some_and(|s| s.needs_model()))
            .collect();
        assert_eq!(needs_model, vec!["assertions", "llm_judge", "semantic_sim"]);
    }
}
