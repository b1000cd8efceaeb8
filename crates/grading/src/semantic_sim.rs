//! `semantic_sim`: cosine similarity of the embeddings of the output and `expected.output`.
//!
//! Passed when the similarity reaches `expected.semanticThreshold` (default 0.8). Score = the
//! similarity, clamped into [0, 1] (a negative cosine scores 0). Embeddings come from the
//! `embeddings` provider (else the case's `provider`, else the default one), which needs an
//! `embedding_model`; each text's vector is cached, so the reference is embedded once. An empty
//! output scores 0 without a call.
//!
//! Checked with or without a provider ([`super::provider`]): `expected.output` is required and
//! the threshold must be in [0, 1].

use async_trait::async_trait;
use serde_json::json;

use super::options::OptionReader;
use super::provider::ModelStrategy;
use super::{CompileContext, GradeInput};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;
use skilleval_providers::{LlmClient, ProviderKind, Purpose};

/// The threshold when the case sets none (design §3, flexible profile).
pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// The `semantic_sim` strategy (registered wrapped in `ModelBacked`, which gives it its provider).
pub struct SemanticSim;

#[async_trait]
impl ModelStrategy for SemanticSim {
    const NAME: &'static str = "semantic_sim";
    const PURPOSE: Purpose = Purpose::Embed;
    /// The reference answer and the similarity threshold.
    type Checked = (String, f64);

    fn check(case: &TestCase, opts: &mut OptionReader<'_, '_>) -> (String, f64) {
        if case.expected.output.is_none() {
            opts.problem(
                "/expected/output",
                "semantic_sim needs expected.output: the reference answer to compare meaning with",
            );
        }
        let threshold = case
            .expected
            .semantic_threshold
            .unwrap_or(DEFAULT_THRESHOLD);
        if !(threshold.is_finite() && (0.0..=1.0).contains(&threshold)) {
            opts.problem(
                "/expected/semanticThreshold",
                format!("semantic_sim: semanticThreshold must be between 0 and 1, not {threshold}"),
            );
        }
        (case.expected.output.clone().unwrap_or_default(), threshold)
    }

    /// Refuses a provider that cannot embed: an Anthropic one, or one without
    /// `embedding_model`.
    fn accepts(client: &LlmClient, ctx: &CompileContext<'_>) -> Result<(), Vec<Problem>> {
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
        Ok(())
    }

    async fn grade(
        (expected, threshold): &(String, f64),
        client: &LlmClient,
        input: &GradeInput<'_>,
    ) -> Result<Grade, Fault> {
        let threshold = *threshold;
        let model = client.config().embedding_model.clone().unwrap_or_default();
        if input.output.trim().is_empty() {
            return Ok(Grade::new(
                0.0,
                false,
                json!({"similarity": 0.0, "threshold": threshold, "model": model, "note": "the output is empty"}),
            ));
        }
        let e = client.embed(&[input.output, expected]).await?;
        let (Some(out), Some(exp)) = (e.vectors.first(), e.vectors.get(1)) else {
            return Err(Fault::permanent(format!(
                "semantic_sim: provider `{}` answered {} embedding vector(s) for 2 texts (the output and `expected.output`)",
                client.name(),
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
            similarity + 1e-9 >= threshold,
            json!({
                "similarity": similarity,
                "threshold": threshold,
                "model": e.model,
                "provider": client.name(),
                "cached": e.cached,
            }),
        );
        grade.usage = e.usage;
        Ok(grade)
    }
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
