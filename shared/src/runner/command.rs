//! The `command` runner. PLACEHOLDER — implemented by the sandbox work item.

use async_trait::async_trait;

use super::{OutputRunner, ProduceRequest, Produced};
use crate::grade::Fault;
use crate::strategy::GradeEnv;

#[derive(Debug, Clone, Copy, Default)]
pub struct CommandRunner;

#[async_trait]
impl OutputRunner for CommandRunner {
    fn name(&self) -> &'static str {
        "command"
    }

    async fn produce(&self, _req: &ProduceRequest<'_>, _env: &GradeEnv) -> Result<Produced, Fault> {
        Err(Fault::permanent("command runner not implemented yet"))
    }
}
