//! Catalogue collisions: how long finding an upload's nearest neighbours takes in a catalogue
//! of 10,000 skills (docs/performance.md; target: within the upload's 2 s answer budget, though
//! the coordinator runs it after the answer, on its catalogue lane).
//!
//! Run with `cargo run --release -p skilleval-bench --bin collisions_bench`. It builds 10,000
//! synthetic descriptions of about 200 characters (seeded), then times, each over several
//! rounds, printing the median and the slowest:
//! - `lexical`: the fallback without an embeddings provider (Sørensen-Dice over the catalogue);
//! - `embedding cold`: embedding the whole catalogue through the OpenAI-compatible client
//!   against a local `/v1/embeddings` server (256-dimension vectors, 256 texts per request) plus
//!   the cosine search, with no response cache;
//! - `embedding warm`: the same with every catalogue vector already in the client's response
//!   cache on disk (`skilleval collisions` with its default cache; the coordinator's clients
//!   have no response cache, so an upload pays the cold figure).
//!
//! The local server computes its vectors in microseconds, so the embedding figures are the
//! client's and the search's cost, not a real model's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Json, Router};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use skilleval_execution::catalogue::{nearest_embedded, nearest_lexical};
use skilleval_execution::triggers::SkillCard;
use skilleval_providers::{
    DirCache, LlmClient, NoCache, ProviderConfig, ProviderKind, ResponseCache,
};

const CATALOGUE: usize = 10_000;
const K: usize = 5;
const DIMENSIONS: usize = 256;
const ROUNDS: usize = 5;

/// The vocabulary of the synthetic descriptions.
const WORDS: &str =
    "extract tables invoice pdf spreadsheet email draft reply calendar meeting notes \
    transcript summary refund triage ticket support answer code review diff security brand copy \
    social post sales report chart forecast weather city contact address slug url translate \
    language legal contract clause receipt expense travel booking recipe nutrition workout plan \
    budget tax form image caption audio";

fn description(rng: &mut StdRng, words: &[&str]) -> String {
    let mut s = String::from("Use when the user asks to");
    while s.len() < 200 {
        s.push(' ');
        s.push_str(words[rng.gen_range(0..words.len())]);
    }
    s
}

/// A deterministic embedding: hashed bag of words, so similar texts get similar vectors.
fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0f32; DIMENSIONS];
    for w in text.split_whitespace() {
        let h = w.bytes().fold(1_469_598_103_934_665_603u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(1_099_511_628_211)
        });
        v[(h % DIMENSIONS as u64) as usize] += 1.0;
    }
    v
}

async fn embeddings(Json(body): Json<Value>) -> Json<Value> {
    let inputs: Vec<String> = match &body["input"] {
        Value::Array(items) => items
            .iter()
            .filter_map(|i| i.as_str().map(String::from))
            .collect(),
        Value::String(s) => vec![s.clone()],
        _ => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"index": i, "embedding": embed(t)}))
        .collect();
    Json(
        json!({"model": "hash-embed", "data": data, "usage": {"prompt_tokens": inputs.len() * 40, "total_tokens": inputs.len() * 40}}),
    )
}

/// [`ROUNDS`] timed neighbour searches through the embeddings client.
async fn embedded_rounds(
    client: &LlmClient,
    skill: &SkillCard,
    catalogue: &[SkillCard],
) -> anyhow::Result<Vec<Duration>> {
    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let (n, _) = nearest_embedded(client, skill, catalogue, K)
            .await
            .map_err(|f| anyhow::anyhow!("{f}"))?;
        times.push(started.elapsed());
        assert_eq!(n.len(), K);
    }
    Ok(times)
}

fn report(name: &str, mut times: Vec<Duration>) {
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<16} catalogue {CATALOGUE}  median {:>8.1} ms  max {:>8.1} ms",
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1])
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(33);
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let catalogue: Vec<SkillCard> = (0..CATALOGUE)
        .map(|i| SkillCard::new(&format!("skill-{i:05}"), &description(&mut rng, &words)))
        .collect();
    let skill = SkillCard::new("new-skill", &description(&mut rng, &words));

    let mut times = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let n = nearest_lexical(&skill, &catalogue, K);
        times.push(started.elapsed());
        assert_eq!(n.len(), K);
    }
    report("lexical", times);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            Router::new().route("/v1/embeddings", post(embeddings)),
        )
        .await;
    });
    let mut config = ProviderConfig::new("embed", ProviderKind::Openai, "chat-unused");
    config.base_url = format!("http://{addr}/v1");
    config.embedding_model = Some("hash-embed".into());
    config.timeout_ms = 60_000;

    let cold: Arc<dyn ResponseCache> = Arc::new(NoCache);
    let client = LlmClient::new(config.clone(), None)?.with_cache(cold);
    report(
        "embedding cold",
        embedded_rounds(&client, &skill, &catalogue).await?,
    );

    let cache_dir = tempfile::tempdir()?;
    let warm: Arc<dyn ResponseCache> = Arc::new(DirCache::new(cache_dir.path().to_path_buf()));
    let client = LlmClient::new(config, None)?.with_cache(warm);
    nearest_embedded(&client, &skill, &catalogue, K)
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    report(
        "embedding warm",
        embedded_rounds(&client, &skill, &catalogue).await?,
    );
    server.abort();
    Ok(())
}
