//! The `given` runner: the output was recorded elsewhere (a production sample, a stored run)
//! and travels with the job or the test case.

use async_trait::async_trait;
use serde_json::Value;

use super::{OutputRunner, ProduceRequest};
use skilleval_grading::GradeEnv;
use skilleval_model::grade::Fault;
use skilleval_model::output::{transcript, Produced};

#[derive(Debug, Clone, Copy, Default)]
pub struct GivenRunner;

#[async_trait]
impl OutputRunner for GivenRunner {
    fn name(&self) -> &'static str {
        "given"
    }

    async fn produce(&self, req: &ProduceRequest<'_>, _env: &GradeEnv) -> Result<Produced, Fault> {
        let Some(given) = req.given.or(req.case.given.as_ref()) else {
            return Err(Fault::permanent(format!(
                "runner `given` needs a recorded output, but test case `{}` has no `given.output` and the job carried none",
                req.case.id
            )));
        };
        let mut produced = match &given.tool_calls {
            Some(calls) => Produced {
                output: given.output.clone(),
                tool_calls: Some(transcript::tool_calls_from_value(calls)),
                ..Produced::default()
            },
            None => transcript::parse(&given.output),
        };
        produced.details = Value::Null;
        Ok(produced)
    }
}
