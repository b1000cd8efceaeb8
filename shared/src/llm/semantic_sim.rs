//! `semantic_sim`: cosine similarity of the embeddings of the output and `expected.output`.
//!
//! Passed when the similarity reaches `expected.semanticThreshold` (default 0.8). Score = the
//! similarity, clamped into [0, 1] (a negative cosine scores 0). Embeddings come from the
//! `embeddings` provider (else the case's `provider`, else the default one), which needs an
//! `embedding_model`; each text's vector is cached, so the reference is embedded once. An empty
//! output scores 0 without a call.
//!
//! `needs_model()` is false: see [`super::llm_judge`].

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::client::LlmClient;
use super::config::ProviderKind;
use super::{case_client, ProviderClients, Purpose};
use crate::grade::{Fault, Grade};
use crate::model::TestCase;
use crate::problem::Problem;
use crate::strategy::model_required::{ModelRequired, DEFAULT_SEMANTIC_THRESHOLD};
use crate::strategy::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};

/// The `semantic_sim` strategy.
pub struct SemanticSim {
    clients: Arc<ProviderClients>,
}

impl SemanticSim {
    pub fn new(clients: Arc<ProviderClients>) -> Self {
        SemanticSim { clients }
    }
}

impl Strategy for SemanticSim {
    fn name(&self) -> &'static str {
        "semantic_sim"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        ModelRequired::new("semantic_sim").compile(case, ctx)?;
        let client = case_client(&self.clients, case, ctx, Purpose::Embed, "semantic_sim")?;
        if client.config().kind == ProviderKind::Anthropic {
            return Err(vec![ctx.problem(
                "/evaluation/strategy",
                format!(
                    "semantic_sim: provider `{}` is an Anthropic provider, which has no embeddings API; set `embeddings` to an OpenAI-compatible provider with an `embedding_model`",
                    client.name()
                ),
            )]);
        }
        if client.config().embedding_model.is_none() {
            return Err(vec![ctx.problem(
                "/evaluation/strategy",
                format!(
                    "semantic_sim: provider `{}` has no `embedding_model`; set one, or set `embeddings` to a provider that has",
                    client.name()
                ),
            )]);
        }
        Ok(Arc::new(SimGrader {
            client,
            expected: case.expected.output.clone().unwrap_or_default(),
            threshold: case
                .expected
                .semantic_threshold
                .unwrap_or(DEFAULT_SEMANTIC_THRESHOLD),
        }))
    }
}

#[derive(Debug)]
struct SimGrader {
    client: Arc<LlmClient>,
    expected: String,
    threshold: f64,
}

/// Cosine similarity; 0 when either vector is all zeros. Vectors of different lengths are an
/// error (two different embedding models were mixed).
pub fn cosine(a: &[f32], b: &[f32]) -> Result<f64, String> {
    if a.len() != b.len() {
        return Err(format!(
            "embeddings of different sizes ({} and {})",
            a.len(),
            b.len()
        ));
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return Ok(0.0);
    }
    Ok((dot / (na.sqrt() * nb.sqrt())).clamp(-1.0, 1.0))
}

#[async_trait]
impl Grader for SimGrader {
    #[tracing::instrument(skip_all, fields(test_case_id = %input.case.id, strategy = "semantic_sim"))]
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let model = self
            .client
            .config()
            .embedding_model
            .clone()
            .unwrap_or_default();
        if input.output.trim().is_empty() {
            return Ok(Grade::new(
                0.0,
                false,
                json!({"similarity": 0.0, "threshold": self.threshold, "model": model, "note": "the output is empty"}),
            ));
        }
        let e = self.client.embed(&[input.output, &self.expected]).await?;
        let (Some(out), Some(exp)) = (e.vectors.first(), e.vectors.get(1)) else {
            return Err(Fault::permanent(format!(
                "semantic_sim: provider `{}` answered {} embedding vector(s) for 2 texts (the output and `expected.output`)",
                self.client.name(),
                e.vectors.len()
            )));
        };
        let similarity = cosine(out, exp).map_err(|m| {
            Fault::permanent(format!(
                "semantic_sim: {m}; is `embedding_model` the same for every text?"
            ))
        })?;
        let mut grade = Grade::new(
            similarity,
            similarity + 1e-9 >= self.threshold,
            json!({
                "similarity": similarity,
                "threshold": self.threshold,
                "model": e.model,
                "provider": self.client.name(),
                "cached": e.cached,
            }),
        );
        grade.usage = e.usage;
        Ok(grade)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn cosine_of_known_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).unwrap().abs() < 1e-12);
        assert!(
            (cosine(&[1.0, 1.0], &[1.0, 0.0]).unwrap() - std::f64::consts::FRAC_1_SQRT_2).abs()
                < 1e-6
        );
        assert!((cosine(&[1.0, 2.0], &[-1.0, -2.0]).unwrap() + 1.0).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 2.0]).unwrap(), 0.0);
        assert!(cosine(&[1.0], &[1.0, 2.0]).is_err());
    }
}
