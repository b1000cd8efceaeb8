//! The A/B comparator: two outputs for the same task, judged side by side, in the JSON-shapes
//! seed's `comparison.json` shape (criteria scores 1–5 with justifications, totals, winner,
//! key differentiators, summary).
//!
//! Judges favour whichever answer they read first (or second). So the pair is judged **in both
//! orders** — A shown as "Response 1", then B shown as "Response 1" — and each criterion's score
//! is the mean of its two positions. A judge that only rewards position gives each output the
//! same combined score: a tie, as it should be. `position_consistent` says whether both orders
//! picked the same winner.

use std::fmt::Write;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::llm_judge::JUDGE_SYSTEM;
use crate::rubric::default_creative_rubric;
use skilleval_model::grade::{Fault, Usage};
use skilleval_providers::ask::{ask_json, object_list_schema};
use skilleval_providers::chat::{ChatRequest, Message, OutputSchema};
use skilleval_providers::client::LlmClient;
use skilleval_providers::fence::Fence;

/// A criterion the two outputs are compared on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparisonCriterion {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

/// The creative rubric's criteria (completeness, coherence, professionalism, accuracy).
pub fn default_criteria() -> Vec<ComparisonCriterion> {
    default_creative_rubric()
        .criteria
        .into_iter()
        .map(|c| ComparisonCriterion {
            name: c.name,
            description: c.description,
        })
        .collect()
}

/// What is compared.
#[derive(Debug, Clone)]
pub struct CompareInput<'a> {
    pub comparison_id: String,
    pub test_case_id: &'a str,
    pub prompt: &'a str,
    pub context: Option<&'a Value>,
    pub output_a: &'a str,
    pub output_b: &'a str,
    /// Description versions (or any label) of A and B.
    pub version_a: Value,
    pub version_b: Value,
    pub criteria: &'a [ComparisonCriterion],
}

/// Which shown position won one judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Position {
    First,
    Second,
    Tie,
}

/// One criterion in one order: scores of the first and second shown response.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionalScore {
    pub criterion: String,
    pub first: f64,
    pub second: f64,
    pub justification_first: String,
    pub justification_second: String,
}

/// One judgement, in the order shown.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionalJudgement {
    pub scores: Vec<PositionalScore>,
    pub winner: Position,
    pub key_differentiators: Vec<String>,
    pub summary: String,
}

/// `comparison.json`'s per-criterion entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CriterionComparison {
    pub criterion: String,
    pub score_a: f64,
    pub score_b: f64,
    pub justification_a: String,
    pub justification_b: String,
}

/// `comparison.json`, plus how the two orders agreed and what judging cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub comparison_id: String,
    pub timestamp: String,
    pub version_a: Value,
    pub version_b: Value,
    pub test_case_id: String,
    pub criteria_scores: Vec<CriterionComparison>,
    pub total_score_a: f64,
    pub total_score_b: f64,
    /// `A`, `B` or `tie`.
    pub winner: String,
    pub key_differentiators: Vec<String>,
    pub summary: String,
    /// Both orders picked the same winner.
    pub position_consistent: bool,
    /// The winner of each order: `[A shown first, B shown first]`, as `A`/`B`/`tie`.
    pub order_winners: [String; 2],
    #[serde(default)]
    pub usage: Usage,
}

pub fn answer_schema(criteria: &[ComparisonCriterion]) -> Value {
    let names: Vec<&str> = criteria.iter().map(|c| c.name.as_str()).collect();
    let scored = object_list_schema(
        json!({
            "criterion": {"type": "string", "enum": names},
            "score_1": {"type": "number", "minimum": 1, "maximum": 5},
            "score_2": {"type": "number", "minimum": 1, "maximum": 5},
            "justification_1": {"type": "string"},
            "justification_2": {"type": "string"}
        }),
        &[
            "criterion",
            "score_1",
            "score_2",
            "justification_1",
            "justification_2",
        ],
    );
    json!({
        "type": "object",
        "properties": {
            "criteria": scored,
            "winner": {"type": "string", "enum": ["1", "2", "tie"]},
            "key_differentiators": {"type": "array", "items": {"type": "string"}},
            "summary": {"type": "string"}
        },
        "required": ["criteria", "winner", "key_differentiators", "summary"]
    })
}

/// The comparison prompt with `first` shown as Response 1.
pub fn compare_prompt(input: &CompareInput<'_>, first: &str, second: &str) -> String {
    let mut s = format!("## Task\n\n{}\n\n", input.prompt.trim());
    if let Some(ctx) = input.context.filter(|c| !c.is_null()) {
        let _ = writeln!(
            s,
            "## Context\n\n```json\n{}\n```\n",
            serde_json::to_string_pretty(ctx).unwrap_or_default()
        );
    }
    // Both responses are outputs under evaluation: fenced as data, one marker for the two.
    let fence = Fence::for_texts(&[first, second]);
    let _ = writeln!(
        s,
        "## Responses\n\n{}\n\n## Response 1\n\n{}\n\n## Response 2\n\n{}\n",
        fence.rule(),
        fence.wrap("response_1", first),
        fence.wrap("response_2", second)
    );
    let _ = writeln!(
        s,
        "## Criteria (score each response from 1 = very poor to 5 = excellent)\n"
    );
    for c in input.criteria {
        let _ = writeln!(s, "- **{}**: {}", c.name, c.description.trim());
    }
    s.push_str(
        "\nCompare the two responses blind: judge only their content, not their order or length. Answer with one JSON object and nothing else:\n\
{\"criteria\": [{\"criterion\": \"<name>\", \"score_1\": 1-5, \"score_2\": 1-5, \"justification_1\": \"...\", \"justification_2\": \"...\"}, ...], \
\"winner\": \"1\"|\"2\"|\"tie\", \"key_differentiators\": [\"...\"], \"summary\": \"...\"}\n",
    );
    s
}

fn score(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|f: &f64| f.is_finite())
    .map(|f| f.clamp(1.0, 5.0))
}

/// Reads one judgement; every criterion must be scored for both responses.
pub fn interpret(
    value: &Value,
    criteria: &[ComparisonCriterion],
) -> Result<PositionalJudgement, String> {
    let items = value
        .get("criteria")
        .or_else(|| value.get("criteria_scores"))
        .and_then(Value::as_array)
        .ok_or("the answer has no `criteria` list")?;
    let mut scores = Vec::with_capacity(criteria.len());
    for c in criteria {
        let want = c.name.trim().to_lowercase();
        let item = items
            .iter()
            .find(|i| {
                i.get("criterion")
                    .or_else(|| i.get("name"))
                    .and_then(Value::as_str)
                    .is_some_and(|n| n.trim().to_lowercase() == want)
            })
            .ok_or(format!("no scores for criterion `{}`", c.name))?;
        let (Some(first), Some(second)) = (score(item.get("score_1")), score(item.get("score_2")))
        else {
            return Err(format!(
                "criterion `{}` needs numeric `score_1` and `score_2`",
                c.name
            ));
        };
        let text = |k: &str| {
            item.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        scores.push(PositionalScore {
            criterion: c.name.clone(),
            first,
            second,
            justification_first: text("justification_1"),
            justification_second: text("justification_2"),
        });
    }
    let winner = match value.get("winner").map(|w| match w {
        Value::String(s) => s.trim().to_ascii_lowercase(),
        other => other.to_string(),
    }) {
        Some(w) if w == "1" || w == "response 1" => Position::First,
        Some(w) if w == "2" || w == "response 2" => Position::Second,
        _ => Position::Tie,
    };
    let key_differentiators = value
        .get("key_differentiators")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(PositionalJudgement {
        scores,
        winner,
        key_differentiators,
        summary: value
            .get("summary")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
    })
}

/// Rewrites "Response 1/2" into A/B for one order.
fn relabel(text: &str, a_first: bool) -> String {
    let (one, two) = if a_first { ("A", "B") } else { ("B", "A") };
    text.replace("Response 1", "\u{0}1")
        .replace("Response 2", "\u{0}2")
        .replace("response 1", "\u{0}1")
        .replace("response 2", "\u{0}2")
        .replace("\u{0}1", &format!("Response {one}"))
        .replace("\u{0}2", &format!("Response {two}"))
}

fn label(p: Position, a_first: bool) -> &'static str {
    match (p, a_first) {
        (Position::Tie, _) => "tie",
        (Position::First, true) | (Position::Second, false) => "A",
        _ => "B",
    }
}

fn join_two(a: &str, b: &str) -> String {
    match (a.trim(), b.trim()) {
        ("", b) => b.to_string(),
        (a, "") => a.to_string(),
        (a, b) if a == b => a.to_string(),
        (a, b) => format!("{a} / {b}"),
    }
}

/// Combines the judgement with A first (`ab`) and with B first (`ba`): each criterion's score
/// is the mean of its two positions; the winner follows the totals.
pub fn combine(
    input: &CompareInput<'_>,
    ab: &PositionalJudgement,
    ba: &PositionalJudgement,
    usage: Usage,
) -> Comparison {
    let criteria_scores: Vec<CriterionComparison> = ab
        .scores
        .iter()
        .zip(&ba.scores)
        .map(|(x, y)| CriterionComparison {
            criterion: x.criterion.clone(),
            score_a: (x.first + y.second) / 2.0,
            score_b: (x.second + y.first) / 2.0,
            justification_a: join_two(&x.justification_first, &y.justification_second),
            justification_b: join_two(&x.justification_second, &y.justification_first),
        })
        .collect();
    let total_a: f64 = criteria_scores.iter().map(|c| c.score_a).sum();
    let total_b: f64 = criteria_scores.iter().map(|c| c.score_b).sum();
    let winner = if (total_a - total_b).abs() < 1e-9 {
        "tie"
    } else if total_a > total_b {
        "A"
    } else {
        "B"
    };
    let order_winners = [
        label(ab.winner, true).to_string(),
        label(ba.winner, false).to_string(),
    ];
    let position_consistent = order_winners[0] == order_winners[1];
    let mut key_differentiators: Vec<String> = Vec::new();
    for d in ab
        .key_differentiators
        .iter()
        .map(|d| relabel(d, true))
        .chain(ba.key_differentiators.iter().map(|d| relabel(d, false)))
    {
        if !key_differentiators.contains(&d) {
            key_differentiators.push(d);
        }
    }
    let consistency = if position_consistent {
        "both orders agree".to_string()
    } else {
        format!(
            "the orders disagree (A first: {}, B first: {}), a sign of position bias",
            order_winners[0], order_winners[1]
        )
    };
    let summary = format!(
        "Over both presentation orders A totals {total_a:.2} and B {total_b:.2}: {}; {consistency}. {}",
        match winner {
            "tie" => "a tie".to_string(),
            w => format!("{w} wins"),
        },
        relabel(&ab.summary, true)
    )
    .trim()
    .to_string();
    Comparison {
        comparison_id: input.comparison_id.clone(),
        timestamp: chrono::Utc::now().to_rfc3339(),
        version_a: input.version_a.clone(),
        version_b: input.version_b.clone(),
        test_case_id: input.test_case_id.to_string(),
        criteria_scores,
        total_score_a: total_a,
        total_score_b: total_b,
        winner: winner.to_string(),
        key_differentiators,
        summary,
        position_consistent,
        order_winners,
        usage,
    }
}

/// Judges A against B in both orders and combines the two judgements.
#[tracing::instrument(skip_all, fields(test_case_id = input.test_case_id))]
pub async fn compare(client: &LlmClient, input: &CompareInput<'_>) -> Result<Comparison, Fault> {
    let request = |first: &str, second: &str| ChatRequest {
        system: Some(JUDGE_SYSTEM.to_string()),
        messages: vec![Message::user(compare_prompt(input, first, second))],
        temperature: Some(0.0),
        schema: Some(OutputSchema::new(
            "record_comparison",
            answer_schema(input.criteria),
        )),
        ..ChatRequest::default()
    };
    let ab_req = request(input.output_a, input.output_b);
    let ba_req = request(input.output_b, input.output_a);
    let criteria = input.criteria;
    let (ab, ba) = futures::join!(
        ask_json(client, &ab_req, |v| interpret(v, criteria)),
        ask_json(client, &ba_req, |v| interpret(v, criteria)),
    );
    let (ab, ba) = (ab?, ba?);
    let mut usage = ab.usage;
    usage.add(&ba.usage);
    Ok(combine(input, &ab.value, &ba.value, usage))
}

/// One pair a comparison's blind comparator judges: the two runs' outputs for one case.
#[derive(Debug, Clone)]
pub struct BlindPair {
    pub test_case_id: String,
    pub prompt: String,
    pub output_a: String,
    pub output_b: String,
}

/// How the blind comparator runs over a comparison's pairs.
#[derive(Debug, Clone)]
pub struct BlindOptions {
    /// Seeds which output is shown first in each pair (ChaCha8: the same seed, the same
    /// orders, on every platform).
    pub seed: u64,
    /// Judge every pair in both orders (twice the calls; position bias cancels).
    pub both_orders: bool,
    pub criteria: Vec<ComparisonCriterion>,
    /// Pairs judged at once.
    pub concurrency: usize,
}

/// One pair's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlindVerdict {
    pub test_case_id: String,
    /// `both`, or which output was shown first: `A` (the base) or `B` (the head).
    pub shown_first: String,
    /// `A`, `B` or `tie`; `error` when the judge gave no usable answer.
    pub winner: String,
    pub total_score_a: f64,
    pub total_score_b: f64,
    /// With both orders: whether they picked the same winner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_consistent: Option<bool>,
    pub summary: String,
}

/// The blind comparator's verdicts over a comparison's pairs, summarised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlindSummary {
    pub seed: u64,
    pub both_orders: bool,
    pub judge_model: String,
    pub pairs: u64,
    /// Pairs whose winner is A (the base), B (the head), or neither.
    pub wins_a: u64,
    pub wins_b: u64,
    pub ties: u64,
    pub errors: u64,
    /// With both orders: pairs whose two orders agreed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_consistent: Option<u64>,
    /// Share of the decided pairs (not tied, not errored) the head won.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_win_rate: Option<f64>,
    pub verdicts: Vec<BlindVerdict>,
    pub usage: Usage,
}

/// Judges A against B once, in the order given (`a_first`: A is shown as Response 1).
pub async fn compare_one_order(
    client: &LlmClient,
    input: &CompareInput<'_>,
    a_first: bool,
) -> Result<Comparison, Fault> {
    let (first, second) = if a_first {
        (input.output_a, input.output_b)
    } else {
        (input.output_b, input.output_a)
    };
    let req = ChatRequest {
        system: Some(JUDGE_SYSTEM.to_string()),
        messages: vec![Message::user(compare_prompt(input, first, second))],
        temperature: Some(0.0),
        schema: Some(OutputSchema::new(
            "record_comparison",
            answer_schema(input.criteria),
        )),
        ..ChatRequest::default()
    };
    let criteria = input.criteria;
    let answer = ask_json(client, &req, |v| interpret(v, criteria)).await?;
    // The one order, as both: `combine` averages a judgement with itself, mirrored.
    let j = answer.value;
    let mirrored = PositionalJudgement {
        scores: j
            .scores
            .iter()
            .map(|s| PositionalScore {
                criterion: s.criterion.clone(),
                first: s.second,
                second: s.first,
                justification_first: s.justification_second.clone(),
                justification_second: s.justification_first.clone(),
            })
            .collect(),
        winner: match j.winner {
            Position::First => Position::Second,
            Position::Second => Position::First,
            Position::Tie => Position::Tie,
        },
        key_differentiators: j.key_differentiators.clone(),
        summary: j.summary.clone(),
    };
    let (ab, ba) = if a_first {
        (&j, &mirrored)
    } else {
        (&mirrored, &j)
    };
    Ok(combine(input, ab, ba, answer.usage))
}

/// Judges every pair blind: the order each is shown in is drawn from `opts.seed` (or both
/// orders), and the verdicts are summarised. A pair the judge gives no usable answer for is
/// counted as an error, never as a verdict.
pub async fn judge_pairs(
    client: &LlmClient,
    comparison_id: &str,
    version_a: &Value,
    version_b: &Value,
    pairs: &[BlindPair],
    opts: &BlindOptions,
) -> BlindSummary {
    use futures::stream::{self, StreamExt};
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
    let orders: Vec<bool> = pairs.iter().map(|_| rng.gen_bool(0.5)).collect();
    // Futures made by an `async fn` (not a closure), so the whole is `Send` wherever it runs.
    let judging: Vec<_> = pairs
        .iter()
        .zip(orders)
        .map(|(pair, a_first)| {
            judge_pair(
                client,
                comparison_id,
                version_a,
                version_b,
                pair,
                a_first,
                opts,
            )
        })
        .collect();
    let judged: Vec<(BlindVerdict, Usage)> = stream::iter(judging)
        .buffered(opts.concurrency.max(1))
        .collect()
        .await;
    let mut usage = Usage::default();
    let mut verdicts = Vec::with_capacity(judged.len());
    for (v, u) in judged {
        usage.add(&u);
        verdicts.push(v);
    }
    let count = |w: &str| verdicts.iter().filter(|v| v.winner == w).count() as u64;
    let (wins_a, wins_b, ties, errors) = (count("A"), count("B"), count("tie"), count("error"));
    BlindSummary {
        seed: opts.seed,
        both_orders: opts.both_orders,
        judge_model: client.config().model.clone(),
        pairs: verdicts.len() as u64,
        wins_a,
        wins_b,
        ties,
        errors,
        position_consistent: opts.both_orders.then(|| {
            verdicts
                .iter()
                .filter(|v| v.position_consistent == Some(true))
                .count() as u64
        }),
        head_win_rate: (wins_a + wins_b > 0).then(|| wins_b as f64 / (wins_a + wins_b) as f64),
        verdicts,
        usage,
    }
}

/// One pair's verdict, in the order drawn (`a_first`) or both.
async fn judge_pair(
    client: &LlmClient,
    comparison_id: &str,
    version_a: &Value,
    version_b: &Value,
    pair: &BlindPair,
    a_first: bool,
    opts: &BlindOptions,
) -> (BlindVerdict, Usage) {
    let input = CompareInput {
        comparison_id: comparison_id.to_string(),
        test_case_id: &pair.test_case_id,
        prompt: &pair.prompt,
        context: None,
        output_a: &pair.output_a,
        output_b: &pair.output_b,
        version_a: version_a.clone(),
        version_b: version_b.clone(),
        criteria: &opts.criteria,
    };
    let shown_first = if opts.both_orders {
        "both"
    } else if a_first {
        "A"
    } else {
        "B"
    };
    let outcome = if opts.both_orders {
        compare(client, &input).await
    } else {
        compare_one_order(client, &input, a_first).await
    };
    match outcome {
        Ok(c) => (
            BlindVerdict {
                test_case_id: pair.test_case_id.clone(),
                shown_first: shown_first.into(),
                winner: c.winner.clone(),
                total_score_a: c.total_score_a,
                total_score_b: c.total_score_b,
                position_consistent: opts.both_orders.then_some(c.position_consistent),
                summary: c.summary.clone(),
            },
            c.usage,
        ),
        Err(fault) => (
            BlindVerdict {
                test_case_id: pair.test_case_id.clone(),
                shown_first: shown_first.into(),
                winner: "error".into(),
                total_score_a: 0.0,
                total_score_b: 0.0,
                position_consistent: None,
                summary: fault.to_string(),
            },
            Usage::default(),
        ),
    }
}

/// The blind comparator's section of a comparison's Markdown.
pub fn blind_markdown(b: &BlindSummary) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n### Blind comparator ({})\n", b.judge_model);
    let _ = writeln!(
        out,
        "{} pair(s) judged {} (seed {}): head (B) won {}, base (A) won {}, {} tie(s){}.{}\n",
        b.pairs,
        if b.both_orders {
            "in both orders"
        } else {
            "once each, the order shuffled"
        },
        b.seed,
        b.wins_b,
        b.wins_a,
        b.ties,
        if b.errors > 0 {
            format!(", {} without a usable answer", b.errors)
        } else {
            String::new()
        },
        b.position_consistent
            .map(|n| format!(" Both orders agreed on {n} of {} pair(s).", b.pairs))
            .unwrap_or_default(),
    );
    let _ = writeln!(
        out,
        "| Case | Shown first | Winner | A | B |\n|---|---|---|---|---|"
    );
    for v in &b.verdicts {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {:.2} | {:.2} |",
            v.test_case_id, v.shown_first, v.winner, v.total_score_a, v.total_score_b
        );
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn input(criteria: &[ComparisonCriterion]) -> CompareInput<'_> {
        CompareInput {
            comparison_id: "c1".into(),
            test_case_id: "t1",
            prompt: "p",
            context: None,
            output_a: "a",
            output_b: "b",
            version_a: json!(1),
            version_b: json!(2),
            criteria,
        }
    }

    fn judgement(first: f64, second: f64, winner: Position) -> PositionalJudgement {
        PositionalJudgement {
            scores: vec![PositionalScore {
                criterion: "accuracy".into(),
                first,
                second,
                justification_first: "j1".into(),
                justification_second: "j2".into(),
            }],
            winner,
            key_differentiators: vec!["Response 1 is shorter".into()],
            summary: "Response 1 is better.".into(),
        }
    }

    #[test]
    fn pure_position_bias_cancels_out() {
        let criteria = vec![ComparisonCriterion {
            name: "accuracy".into(),
            description: String::new(),
        }];
        let ab = judgement(5.0, 3.0, Position::First);
        let ba = judgement(5.0, 3.0, Position::First);
        let c = combine(&input(&criteria), &ab, &ba, Usage::default());
        assert_eq!(
            (c.criteria_scores[0].score_a, c.criteria_scores[0].score_b),
            (4.0, 4.0)
        );
        assert_eq!(c.winner, "tie");
        assert!(!c.position_consistent);
        assert_eq!(c.order_winners, ["A".to_string(), "B".to_string()]);
        assert_eq!(
            c.key_differentiators,
            vec!["Response A is shorter", "Response B is shorter"]
        );
    }

    #[test]
    fn a_real_preference_survives_the_swap() {
        let criteria = vec![ComparisonCriterion {
            name: "accuracy".into(),
            description: String::new(),
        }];
        let ab = judgement(5.0, 2.0, Position::First);
        let ba = judgement(3.0, 4.0, Position::Second);
        let c = combine(&input(&criteria), &ab, &ba, Usage::default());
        assert_eq!((c.total_score_a, c.total_score_b), (4.5, 2.5));
        assert_eq!(c.winner, "A");
        assert!(c.position_consistent);
        let v = serde_json::to_value(&c).unwrap();
        for key in [
            "comparison_id",
            "timestamp",
            "version_a",
            "version_b",
            "test_case_id",
            "criteria_scores",
            "total_score_a",
            "total_score_b",
            "winner",
            "key_differentiators",
            "summary",
        ] {
            assert!(v.get(key).is_some(), "comparison.json needs {key}");
        }
    }

    #[test]
    fn interpret_needs_every_criterion() {
        let criteria = default_criteria();
        let err = interpret(&json!({"criteria": [], "winner": "1"}), &criteria).unwrap_err();
        assert_eq!(err, "no scores for criterion `completeness`");
    }
}
