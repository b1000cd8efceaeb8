//! The one place built-in strategies are registered by name.

use super::StrategyRegistryBuilder;

pub(super) fn register(builder: StrategyRegistryBuilder) -> StrategyRegistryBuilder {
    builder
}
