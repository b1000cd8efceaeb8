//! Catalogue collisions: does a skill steal (or lose) trigger queries to the skills it will
//! live beside?
//!
//! Two steps, the same for `skilleval collisions` and the coordinator:
//!
//! 1. [`nearest`]: the skill's description is compared with every catalogue skill's, by
//!    cosine similarity of embeddings when an embedding provider is configured, else by the
//!    local lexical fallback ([`lexical_similarity`]: Sørensen-Dice over character bigrams,
//!    the `lexical_similarity` strategy's measure), and the top `k` become its neighbours.
//! 2. [`evaluate_catalogue`]: every should-trigger query of the skill and of each neighbour
//!    is put to the model `runs_per_query` times with all of them (the skill and its
//!    neighbours, rotated per run) in the lineup, exactly as a trigger eval asks
//!    ([`crate::triggers::selection_request`]); each run records which skill was picked.
//!    In **agent mode** ([`Picker::Agent`]) each run instead gives the query to the `agent`
//!    runner with the evaluated skill's real package at `/skill` and the neighbours as decoys
//!    (`/skills/<name>/SKILL.md`, their name and description), and the pick is the skill whose
//!    `SKILL.md` the agent opened first (`details.skill_opened`), or `none`.
//!
//! What the picks add up to (per pair confusion rates with their intervals, the gate) is
//! `skilleval_analysis::collisions`.

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};

use skilleval_model::grade::{Fault, Usage};
use skilleval_model::package::TriggerCase;
use skilleval_providers::ask::ask_json;
use skilleval_providers::client::LlmClient;

use crate::triggers::{observe_agent, selection_request, AgentTriggers, SkillCard};

/// Neighbours kept when not configured.
pub const DEFAULT_NEIGHBOURS: usize = 5;

/// Texts per embeddings request.
const EMBED_BATCH: usize = 256;

/// How descriptions were compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SimilarityMethod {
    /// Cosine similarity of the embedding provider's vectors.
    Embedding,
    /// Sørensen-Dice over character bigrams (no provider needed).
    Lexical,
}

/// A catalogue skill close to the evaluated one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Neighbour {
    pub name: String,
    /// In [0, 1] for lexical, [-1, 1] for embeddings; higher is closer.
    pub similarity: f64,
}

/// A skill in a catalogue eval: its card and its trigger queries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogueSkill {
    pub card: SkillCard,
    pub queries: Vec<TriggerCase>,
}

/// The local fallback: Sørensen-Dice similarity of two descriptions, case folded.
pub fn lexical_similarity(a: &str, b: &str) -> f64 {
    skilleval_grading::lexical_similarity::sorensen_dice(&a.to_lowercase(), &b.to_lowercase())
}

/// Cosine similarity (the `semantic_sim` strategy's); 0 when either vector is zero or their
/// lengths differ.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    skilleval_grading::semantic_sim::cosine(a, b).unwrap_or(0.0)
}

/// The `k` highest scores, best first (ties by name, so the result does not depend on the
/// catalogue's order); the skill itself (same name) is never its own neighbour.
fn top_k(skill: &str, scored: Vec<(String, f64)>, k: usize) -> Vec<Neighbour> {
    let mut scored: Vec<(String, f64)> = scored
        .into_iter()
        .filter(|(name, _)| !name.eq_ignore_ascii_case(skill))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    scored.truncate(k);
    scored
        .into_iter()
        .map(|(name, similarity)| Neighbour { name, similarity })
        .collect()
}

/// The `k` catalogue skills whose descriptions are closest to `skill`'s, lexically.
pub fn nearest_lexical(skill: &SkillCard, catalogue: &[SkillCard], k: usize) -> Vec<Neighbour> {
    let scored = catalogue
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                lexical_similarity(&skill.description, &c.description),
            )
        })
        .collect();
    top_k(&skill.name, scored, k)
}

/// The `k` nearest by embeddings: the descriptions are embedded in batches (each vector is
/// cached by the client, so a catalogue is embedded once per provider and model).
pub async fn nearest_embedded(
    embedder: &LlmClient,
    skill: &SkillCard,
    catalogue: &[SkillCard],
    k: usize,
) -> Result<(Vec<Neighbour>, Usage), Fault> {
    let mut usage = Usage::default();
    let own = embedder.embed(&[skill.description.as_str()]).await?;
    usage.add(&own.usage);
    let Some(own) = own.vectors.into_iter().next() else {
        return Err(Fault::permanent(
            "the embeddings provider returned no vector",
        ));
    };
    let mut scored = Vec::with_capacity(catalogue.len());
    for batch in catalogue.chunks(EMBED_BATCH) {
        let texts: Vec<&str> = batch.iter().map(|c| c.description.as_str()).collect();
        let got = embedder.embed(&texts).await?;
        usage.add(&got.usage);
        if got.vectors.len() != batch.len() {
            return Err(Fault::permanent(format!(
                "the embeddings provider returned {} vectors for {} texts",
                got.vectors.len(),
                batch.len()
            )));
        }
        for (c, v) in batch.iter().zip(&got.vectors) {
            scored.push((c.name.clone(), cosine(&own, v)));
        }
    }
    Ok((top_k(&skill.name, scored, k), usage))
}

/// The neighbours by embeddings when `embedder` is given, else lexically.
pub async fn nearest(
    embedder: Option<&LlmClient>,
    skill: &SkillCard,
    catalogue: &[SkillCard],
    k: usize,
) -> Result<(Vec<Neighbour>, SimilarityMethod, Usage), Fault> {
    match embedder {
        Some(e) => {
            let (n, usage) = nearest_embedded(e, skill, catalogue, k).await?;
            Ok((n, SimilarityMethod::Embedding, usage))
        }
        None => Ok((
            nearest_lexical(skill, catalogue, k),
            SimilarityMethod::Lexical,
            Usage::default(),
        )),
    }
}

/// One query of the catalogue eval: whose it is and what each answered run picked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryPicks {
    /// The skill the query belongs to (one of its should-trigger queries).
    pub owner: String,
    pub query: String,
    /// A skill's name or `none`, per answered run.
    pub picks: Vec<String>,
    /// Runs that failed, and why.
    pub errors: Vec<String>,
}

/// How the eval's runs picked: what a matrix says it measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PickMode {
    /// A model named one skill of the lineup.
    #[default]
    Model,
    /// An agent opened one skill's `SKILL.md`.
    Agent,
}

/// What the catalogue eval observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogueRun {
    /// The evaluated skill.
    pub skill: String,
    /// Every skill in the lineup: the evaluated one first, then its neighbours.
    pub lineup: Vec<String>,
    pub runs_per_query: u32,
    /// How the runs picked (absent in matrices stored before agent mode: `model`).
    #[serde(default)]
    pub mode: PickMode,
    pub queries: Vec<QueryPicks>,
    pub usage: Usage,
}

/// One run's pick and what asking cost, or why it failed.
type RunAnswer = Result<(String, Usage), String>;

/// How a run picks a skill.
#[derive(Debug, Clone, Default)]
pub enum Picker {
    /// The model names one skill of the lineup (the trigger eval's selection prompt).
    #[default]
    Model,
    /// The `agent` runner gets the query with the skill and its neighbours in its catalogue;
    /// the pick is the skill whose `SKILL.md` it opened first.
    Agent(AgentTriggers),
}

impl Picker {
    /// As `mode` names it in configuration and reports.
    pub fn mode(&self) -> PickMode {
        match self {
            Picker::Model => PickMode::Model,
            Picker::Agent(_) => PickMode::Agent,
        }
    }
}

/// One agent-mode run of `query`: the skill opened first (the evaluated one at `/skill`, a
/// neighbour among the decoys) or `none`. A run that stopped on a fault before opening any
/// skill made no pick: it is an error, as in a trigger eval's agent mode.
async fn agent_pick(
    client: &LlmClient,
    agent: &AgentTriggers,
    skill: &SkillCard,
    neighbours: &[SkillCard],
    query: &str,
    run: u32,
) -> RunAnswer {
    let seen = observe_agent(client, agent, &skill.name, query, neighbours, run).await?;
    let pick = match (&seen.opened_first, seen.stopped) {
        (None, Some(fault)) => return Err(fault),
        (None, None) => "none".to_string(),
        // A decoy is listed by its card's name; any other entry is the package at /skill.
        (Some(opened), _) => neighbours
            .iter()
            .find(|n| n.name.eq_ignore_ascii_case(opened))
            .map_or_else(|| skill.name.clone(), |n| n.name.clone()),
    };
    Ok((pick, seen.usage))
}

/// The lineup of run `run`: every skill, rotated by the run's number so that consecutive
/// runs put a different skill first, whatever the lineup's length (a skill and one
/// neighbour alternate).
fn rotated(cards: &[SkillCard], run: u32) -> Vec<SkillCard> {
    let mut all = cards.to_vec();
    if !all.is_empty() {
        let shift = run as usize % all.len();
        all.rotate_left(shift);
    }
    all
}

fn pick_of(v: &serde_json::Value, cards: &[SkillCard]) -> Result<String, String> {
    let pick = v
        .get("skill")
        .and_then(serde_json::Value::as_str)
        .ok_or("the answer has no `skill`")?
        .trim()
        .trim_matches('`');
    if pick.eq_ignore_ascii_case("none") {
        return Ok("none".into());
    }
    cards
        .iter()
        .find(|c| c.name.eq_ignore_ascii_case(pick))
        .map(|c| c.name.clone())
        .ok_or_else(|| format!("`{pick}` is not one of the listed skills"))
}

/// Puts every should-trigger query of `skill` and of `neighbours` to the model (or, with
/// [`Picker::Agent`], to the agent), `runs` times each (at least once), with all of them in
/// the lineup; at most `concurrency` runs in flight. A run that fails is recorded with its
/// query and left out of the picks.
#[tracing::instrument(skip_all, fields(skill = %skill.card.name, neighbours = neighbours.len(), mode = ?picker.mode()))]
pub async fn evaluate_catalogue(
    client: &LlmClient,
    skill: &CatalogueSkill,
    neighbours: &[CatalogueSkill],
    runs: u32,
    concurrency: usize,
    picker: &Picker,
) -> CatalogueRun {
    let runs = runs.max(1);
    let mut cards = vec![skill.card.clone()];
    cards.extend(
        neighbours
            .iter()
            .filter(|n| !n.card.name.eq_ignore_ascii_case(&skill.card.name))
            .map(|n| n.card.clone()),
    );
    let owned: Vec<(&str, &str)> = std::iter::once(skill)
        .chain(neighbours)
        .flat_map(|s| {
            s.queries
                .iter()
                .filter(|q| q.should_trigger)
                .map(move |q| (s.card.name.as_str(), q.query.as_str()))
        })
        .collect();
    let asks: Vec<(usize, u32, String, Vec<SkillCard>)> = owned
        .iter()
        .enumerate()
        .flat_map(|(i, (_, query))| {
            let cards = &cards;
            (1..=runs).map(move |run| (i, run, (*query).to_string(), rotated(cards, run)))
        })
        .collect();
    let (own, others) = (&cards[0], &cards[1..]);
    let mut answers: Vec<(usize, u32, RunAnswer)> = stream::iter(asks)
        .map(|(i, run, query, lineup)| async move {
            if let Picker::Agent(agent) = picker {
                let answer = agent_pick(client, agent, own, others, &query, run).await;
                return (i, run, answer);
            }
            let req = selection_request(&query, &lineup, run);
            let answer = ask_json(client, &req, |v| pick_of(v, &lineup)).await;
            (
                i,
                run,
                answer
                    .map(|a| (a.value, a.usage))
                    .map_err(|f| f.to_string()),
            )
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    answers.sort_by_key(|(i, run, _)| (*i, *run));
    let mut queries: Vec<QueryPicks> = owned
        .iter()
        .map(|(owner, query)| QueryPicks {
            owner: (*owner).to_string(),
            query: (*query).to_string(),
            picks: Vec::new(),
            errors: Vec::new(),
        })
        .collect();
    let mut usage = Usage::default();
    for (i, _, outcome) in answers {
        match outcome {
            Ok((pick, u)) => {
                usage.add(&u);
                queries[i].picks.push(pick);
            }
            Err(e) => queries[i].errors.push(e),
        }
    }
    CatalogueRun {
        skill: skill.card.name.clone(),
        lineup: cards.iter().map(|c| c.name.clone()).collect(),
        runs_per_query: runs,
        mode: picker.mode(),
        queries,
        usage,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn card(name: &str, d: &str) -> SkillCard {
        SkillCard::new(name, d)
    }

    #[test]
    fn the_lexically_nearest_come_first_and_the_skill_is_not_its_own_neighbour() {
        let skill = card("pdf-a", "Extract tables from PDF files");
        let catalogue = vec![
            card("pdf-a", "Extract tables from PDF files"),
            card("weather", "Tells the weather forecast for a city"),
            card("pdf-b", "Extracts tables out of PDF documents"),
            card("email", "Drafts emails"),
        ];
        let n = nearest_lexical(&skill, &catalogue, 2);
        assert_eq!(n.len(), 2);
        assert_eq!(n[0].name, "pdf-b");
        assert!(n[0].similarity > n[1].similarity);
        assert!(n.iter().all(|n| n.name != "pdf-a"));
        assert_eq!(
            lexical_similarity("Same Words", "same words"),
            1.0,
            "case is folded"
        );
    }

    #[test]
    fn cosine_of_known_vectors() {
        assert!((cosine(&[1.0, 0.0], &[1.0, 0.0]) - 1.0).abs() < 1e-12);
        assert!(cosine(&[1.0, 0.0], &[0.0, 1.0]).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[1.0, 0.0]) - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
    }

    #[test]
    fn every_skill_moves_through_the_lineup() {
        let cards = vec![card("a", ""), card("b", ""), card("c", "")];
        let firsts: Vec<String> = (1..=3)
            .map(|r| rotated(&cards, r)[0].name.clone())
            .collect();
        assert_eq!(firsts, ["b", "c", "a"]);
        let pair = vec![card("a", ""), card("b", "")];
        let firsts: Vec<String> = (1..=3).map(|r| rotated(&pair, r)[0].name.clone()).collect();
        assert_eq!(firsts, ["b", "a", "b"], "two skills alternate");
        assert_eq!(
            pick_of(&serde_json::json!({"skill": "B"}), &cards).unwrap(),
            "b"
        );
        assert!(pick_of(&serde_json::json!({"skill": "z"}), &cards).is_err());
    }
}
