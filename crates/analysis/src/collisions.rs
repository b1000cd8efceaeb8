//! The collision matrix of a catalogue eval (`skilleval_execution::catalogue`): for each query
//! which skill was picked, and for each pair of the evaluated skill and a neighbour the
//! confusion rate in both directions with its Wilson interval; the `no_collision` gate; and the
//! views a publisher may see of another's skill (counts and rates, never queries).
//!
//! A pair's rate counts runs: of the answered runs of the owner's should-trigger queries, the
//! share that picked the other skill. Runs of one query are not independent evidence, so with
//! few queries the interval is narrower than a case-clustered one would be; it is the honest
//! first-order figure and says "few runs" by its width.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use skilleval_execution::catalogue::{CatalogueRun, Neighbour, PickMode, SimilarityMethod};
use skilleval_model::grade::Usage;

use crate::stats::proportion::{wilson_interval, Interval};

/// The confidence of the pair intervals.
pub const CONFIDENCE: f64 = 0.95;

/// The `no_collision` gate's share when not configured: the evaluated skill may take at most
/// this share of a neighbour's query runs.
pub const DEFAULT_MAX_SHARE: f64 = 0.2;

/// A neighbour as the matrix shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeighbourRow {
    pub name: String,
    pub similarity: f64,
    /// Owned by another publisher: its queries are never shown (counts and rates only).
    pub foreign: bool,
}

/// One query: whose it is, and how often each skill (or `none`) was picked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryRow {
    pub owner: String,
    pub query: String,
    /// Picks per skill name (`none` included), over the answered runs.
    pub picks: BTreeMap<String, u32>,
    /// The pick of most runs (ties: the owner, else by name); `None` when no run answered.
    pub picked: Option<String>,
    pub errors: u32,
}

/// How often the queries of `owner` picked `picked`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairRate {
    pub owner: String,
    pub picked: String,
    /// Runs of `owner`'s queries that picked `picked`.
    pub hits: u64,
    /// Answered runs of `owner`'s queries.
    pub runs: u64,
    /// `hits / runs`; `None` without an answered run.
    pub rate: Option<f64>,
    /// Wilson interval at [`CONFIDENCE`]; `None` without an answered run.
    pub interval: Option<Interval>,
}

/// The collision matrix of a skill against its neighbours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollisionMatrix {
    pub skill: String,
    pub method: SimilarityMethod,
    /// How the runs picked a skill: a model naming one, or an agent opening one (matrices
    /// stored before agent mode read as `model`).
    #[serde(default)]
    pub mode: PickMode,
    pub runs_per_query: u32,
    pub confidence: f64,
    pub neighbours: Vec<NeighbourRow>,
    /// The evaluated skill's and same-publisher neighbours' queries; a foreign neighbour's
    /// are left out (see `hidden_queries`).
    pub queries: Vec<QueryRow>,
    /// Queries of foreign neighbours, counted in `pairs` but not listed.
    pub hidden_queries: u64,
    /// For each neighbour, both directions: its queries picking the skill, and the skill's
    /// queries picking it.
    pub pairs: Vec<PairRate>,
    pub usage: Usage,
}

fn pair(owner: &str, picked: &str, queries: &[QueryRow]) -> PairRate {
    let (mut hits, mut runs) = (0u64, 0u64);
    for q in queries.iter().filter(|q| q.owner == owner) {
        runs += u64::from(q.picks.values().sum::<u32>());
        hits += u64::from(q.picks.get(picked).copied().unwrap_or(0));
    }
    let interval = wilson_interval(hits, runs, CONFIDENCE).ok();
    PairRate {
        owner: owner.to_string(),
        picked: picked.to_string(),
        hits,
        runs,
        rate: (runs > 0).then(|| hits as f64 / runs as f64),
        interval,
    }
}

fn majority(owner: &str, picks: &BTreeMap<String, u32>) -> Option<String> {
    let top = *picks.values().max()?;
    if picks.get(owner) == Some(&top) {
        return Some(owner.to_string());
    }
    picks
        .iter()
        .find(|(_, n)| **n == top)
        .map(|(name, _)| name.clone())
}

/// The matrix of a catalogue run; `foreign(name)` says whether a neighbour belongs to another
/// publisher (its queries are then counted but not listed).
pub fn matrix(
    run: &CatalogueRun,
    neighbours: &[Neighbour],
    method: SimilarityMethod,
    foreign: impl Fn(&str) -> bool,
) -> CollisionMatrix {
    let all: Vec<QueryRow> = run
        .queries
        .iter()
        .map(|q| {
            let mut picks = BTreeMap::new();
            for p in &q.picks {
                *picks.entry(p.clone()).or_insert(0u32) += 1;
            }
            QueryRow {
                owner: q.owner.clone(),
                query: q.query.clone(),
                picked: majority(&q.owner, &picks),
                picks,
                errors: u32::try_from(q.errors.len()).unwrap_or(u32::MAX),
            }
        })
        .collect();
    let rows: Vec<NeighbourRow> = neighbours
        .iter()
        .filter(|n| run.lineup.contains(&n.name))
        .map(|n| NeighbourRow {
            name: n.name.clone(),
            similarity: n.similarity,
            foreign: foreign(&n.name),
        })
        .collect();
    let pairs = rows
        .iter()
        .flat_map(|n| {
            [
                pair(&n.name, &run.skill, &all),
                pair(&run.skill, &n.name, &all),
            ]
        })
        .collect();
    let is_hidden = |owner: &str| rows.iter().any(|n| n.foreign && n.name == owner);
    let hidden_queries = all.iter().filter(|q| is_hidden(&q.owner)).count() as u64;
    CollisionMatrix {
        skill: run.skill.clone(),
        method,
        mode: run.mode,
        runs_per_query: run.runs_per_query,
        confidence: CONFIDENCE,
        neighbours: rows.clone(),
        queries: all.into_iter().filter(|q| !is_hidden(&q.owner)).collect(),
        hidden_queries,
        pairs,
        usage: run.usage,
    }
}

/// A neighbour whose queries the skill takes past the gate's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Collision {
    pub neighbour: String,
    /// The share of the neighbour's query runs that picked the evaluated skill.
    pub share: f64,
    pub hits: u64,
    pub runs: u64,
}

/// The `no_collision` gate's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollisionGate {
    pub max_share: f64,
    pub passed: bool,
    pub collisions: Vec<Collision>,
}

impl CollisionGate {
    /// Why the gate failed, naming each neighbour whose queries the skill takes, for a run's
    /// verdict reasons; `None` when it passed.
    pub fn reason(&self) -> Option<String> {
        if self.passed {
            return None;
        }
        let taken: Vec<String> = self
            .collisions
            .iter()
            .map(|c| {
                format!(
                    "{:.0}% of `{}`'s trigger query runs ({} of {})",
                    c.share * 100.0,
                    c.neighbour,
                    c.hits,
                    c.runs
                )
            })
            .collect();
        Some(format!(
            "gate no_collision failed: the skill took {}; at most {:.0}% is allowed",
            taken.join("; "),
            self.max_share * 100.0
        ))
    }
}

/// Fails when the skill takes more than `max_share` of some neighbour's query runs.
pub fn gate(matrix: &CollisionMatrix, max_share: f64) -> CollisionGate {
    let collisions: Vec<Collision> = matrix
        .pairs
        .iter()
        .filter(|p| p.picked == matrix.skill && p.owner != matrix.skill)
        .filter_map(|p| {
            let share = p.rate?;
            (share > max_share).then(|| Collision {
                neighbour: p.owner.clone(),
                share,
                hits: p.hits,
                runs: p.runs,
            })
        })
        .collect();
    CollisionGate {
        max_share,
        passed: collisions.is_empty(),
        collisions,
    }
}

/// What the owner of a neighbour sees of another publisher's skill that collided with it:
/// the two rates, no queries of either side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeighbourReport {
    /// The skill whose upload ran the eval.
    pub skill: String,
    pub similarity: f64,
    /// The neighbour's queries picking `skill`.
    pub taken_from_you: PairRate,
    /// `skill`'s queries picking the neighbour.
    pub taken_by_you: PairRate,
}

/// The report for the owner of `neighbour`, if it is one of the matrix's neighbours.
pub fn for_neighbour(matrix: &CollisionMatrix, neighbour: &str) -> Option<NeighbourReport> {
    let row = matrix.neighbours.iter().find(|n| n.name == neighbour)?;
    let find = |owner: &str, picked: &str| {
        matrix
            .pairs
            .iter()
            .find(|p| p.owner == owner && p.picked == picked)
            .cloned()
    };
    Some(NeighbourReport {
        skill: matrix.skill.clone(),
        similarity: row.similarity,
        taken_from_you: find(neighbour, &matrix.skill)?,
        taken_by_you: find(&matrix.skill, neighbour)?,
    })
}

/// The Markdown section `skilleval collisions` prints.
pub fn markdown(matrix: &CollisionMatrix, gate: Option<&CollisionGate>) -> String {
    use std::fmt::Write;
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.0}%", v * 100.0));
    let ci = |i: Option<Interval>| {
        i.map_or(String::new(), |i| {
            format!(" [{:.0}–{:.0}%]", i.low * 100.0, i.high * 100.0)
        })
    };
    let mut out = format!(
        "## Catalogue collisions of `{}`\n\n{} neighbour(s) by {} similarity; {} run(s) per query, each {}; intervals are {:.0}% Wilson.\n\n\
         | Neighbour | Similarity | Its queries picking `{}` | `{}`'s queries picking it |\n|---|---|---|---|\n",
        matrix.skill,
        matrix.neighbours.len(),
        match matrix.method {
            SimilarityMethod::Embedding => "embedding",
            SimilarityMethod::Lexical => "lexical",
        },
        matrix.runs_per_query,
        match matrix.mode {
            PickMode::Model => "a model naming a skill",
            PickMode::Agent => "an agent opening a skill",
        },
        matrix.confidence * 100.0,
        matrix.skill,
        matrix.skill,
    );
    for n in &matrix.neighbours {
        let Some(r) = for_neighbour(matrix, &n.name) else {
            continue;
        };
        let _ = writeln!(
            out,
            "| {} | {:.2} | {}/{} = {}{} | {}/{} = {}{} |",
            n.name,
            n.similarity,
            r.taken_from_you.hits,
            r.taken_from_you.runs,
            pct(r.taken_from_you.rate),
            ci(r.taken_from_you.interval),
            r.taken_by_you.hits,
            r.taken_by_you.runs,
            pct(r.taken_by_you.rate),
            ci(r.taken_by_you.interval),
        );
    }
    out.push_str("\n| Query of | Query | Picked |\n|---|---|---|\n");
    for q in &matrix.queries {
        let picks: Vec<String> = q.picks.iter().map(|(k, v)| format!("{k} ×{v}")).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            q.owner,
            q.query.replace('|', "\\|").replace('\n', " "),
            picks.join(", ")
        );
    }
    if let Some(g) = gate {
        let _ = writeln!(
            out,
            "\nGate `no_collision` (max share {:.0}%): {}",
            g.max_share * 100.0,
            if g.passed { "passed" } else { "FAILED" }
        );
        for c in &g.collisions {
            let _ = writeln!(
                out,
                "- takes {}/{} ({:.0}%) of `{}`'s query runs",
                c.hits,
                c.runs,
                c.share * 100.0,
                c.neighbour
            );
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use skilleval_execution::catalogue::QueryPicks;

    fn q(owner: &str, query: &str, picks: &[&str]) -> QueryPicks {
        QueryPicks {
            owner: owner.into(),
            query: query.into(),
            picks: picks.iter().map(|p| p.to_string()).collect(),
            errors: vec![],
        }
    }

    fn run() -> CatalogueRun {
        CatalogueRun {
            skill: "new".into(),
            lineup: vec!["new".into(), "twin".into(), "far".into()],
            runs_per_query: 4,
            mode: PickMode::Agent,
            queries: vec![
                q("new", "mine 1", &["new", "new", "twin", "twin"]),
                q("new", "mine 2", &["new", "new", "new", "new"]),
                q("twin", "secret twin query", &["new", "new", "new", "twin"]),
                q(
                    "twin",
                    "another twin query",
                    &["twin", "new", "twin", "twin"],
                ),
                q("far", "far query", &["far", "far", "far", "far"]),
            ],
            usage: Usage::default(),
        }
    }

    fn neighbours() -> Vec<Neighbour> {
        vec![
            Neighbour {
                name: "twin".into(),
                similarity: 0.9,
            },
            Neighbour {
                name: "far".into(),
                similarity: 0.1,
            },
        ]
    }

    #[test]
    fn pair_rates_count_runs_and_carry_wilson_intervals() {
        let m = matrix(&run(), &neighbours(), SimilarityMethod::Lexical, |_| false);
        let twin = for_neighbour(&m, "twin").unwrap();
        // twin's 8 runs: 4 picked `new`.
        assert_eq!((twin.taken_from_you.hits, twin.taken_from_you.runs), (4, 8));
        assert_eq!(twin.taken_from_you.rate, Some(0.5));
        // Wilson 95% for 4/8 (scipy/statsmodels proportion_confint method="wilson"):
        // (0.2152...; 0.7847...).
        let i = twin.taken_from_you.interval.unwrap();
        assert!((i.low - 0.215_204).abs() < 1e-4, "{i:?}");
        assert!((i.high - 0.784_796).abs() < 1e-4, "{i:?}");
        assert_eq!((twin.taken_by_you.hits, twin.taken_by_you.runs), (2, 8));
        let far = for_neighbour(&m, "far").unwrap();
        assert_eq!(far.taken_from_you.hits, 0);
        assert_eq!(far.taken_from_you.interval.unwrap().low, 0.0);
        assert_eq!(m.queries[2].picked.as_deref(), Some("new"));
        assert_eq!(m.queries[3].picked.as_deref(), Some("twin"));
    }

    #[test]
    fn the_gate_fails_past_the_share_and_names_the_neighbour() {
        let m = matrix(&run(), &neighbours(), SimilarityMethod::Lexical, |_| false);
        let g = gate(&m, 0.2);
        assert!(!g.passed);
        assert_eq!(g.collisions.len(), 1);
        assert_eq!(g.collisions[0].neighbour, "twin");
        assert!(gate(&m, 0.5).passed, "0.5 is not more than 0.5");
        assert_eq!(
            g.reason().unwrap(),
            "gate no_collision failed: the skill took 50% of `twin`'s trigger query runs \
             (4 of 8); at most 20% is allowed"
        );
        assert_eq!(gate(&m, 0.5).reason(), None);
        assert_eq!(
            m.mode,
            PickMode::Agent,
            "the matrix says how the runs picked"
        );
        assert!(markdown(&m, None).contains("each an agent opening a skill"));
        let stored = serde_json::json!({"skill": "new", "method": "lexical", "runs_per_query": 1,
            "confidence": 0.95, "neighbours": [], "queries": [], "hidden_queries": 0, "pairs": [],
            "usage": serde_json::to_value(Usage::default()).unwrap()});
        let old: CollisionMatrix = serde_json::from_value(stored).unwrap();
        assert_eq!(
            old.mode,
            PickMode::Model,
            "a matrix stored before modes reads as model"
        );
    }

    #[test]
    fn a_foreign_neighbours_queries_are_counted_but_never_listed() {
        let m = matrix(&run(), &neighbours(), SimilarityMethod::Lexical, |n| {
            n == "twin"
        });
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("twin query"), "{text}");
        assert_eq!(m.hidden_queries, 2);
        assert_eq!(for_neighbour(&m, "twin").unwrap().taken_from_you.hits, 4);
        assert!(!markdown(&m, None).contains("twin query"));
    }
}
