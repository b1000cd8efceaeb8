//! Trigger evals: does the skill's *description* make a model pick it for a query?
//!
//! For each `{query, should_trigger}` the model sees the skill's name and description among a
//! few decoy skills (the list rotated per run, so the skill's position varies) and names the
//! one it would load, or `none`. Each query runs several times; it counts as triggered when the
//! skill was picked in at least half of the runs that got an answer (design §11). Precision and
//! recall are those of "triggered" against `should_trigger`. Runs that fail are reported and
//! left out; a query none of whose runs answered is reported as errored and left out of the
//! metrics.
//!
//! **Agent mode** ([`TriggerOptions::agent`]): instead of asking the model to name a skill,
//! each run gives the query to the `agent` runner ([`crate::runner::agent`]) with the skill and
//! the decoys in its catalogue, and the run picked the skill when the agent opened this skill's
//! `SKILL.md` (opening a decoy's, or any other file, does not count). That observes what skill
//! authors care about: does an agent actually load the skill for this query.

use std::fmt::Write;

use futures::stream::{self, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use skilleval_model::grade::Usage;
use skilleval_model::package::TriggerCase;
use skilleval_providers::ask::ask_json;
use skilleval_providers::chat::{ChatRequest, Message, OutputSchema};
use skilleval_providers::client::LlmClient;

/// Runs per query when not set.
pub const DEFAULT_RUNS_PER_QUERY: u32 = 3;

/// A skill as a model choosing skills sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkillCard {
    pub name: String,
    pub description: String,
}

impl SkillCard {
    pub fn new(name: &str, description: &str) -> Self {
        SkillCard {
            name: name.to_string(),
            description: description.to_string(),
        }
    }
}

/// Plausible neighbours a skill must stand out from.
pub fn default_decoys() -> Vec<SkillCard> {
    vec![
        SkillCard::new("pdf-tools", "Extracts text and tables from PDF files, fills PDF forms, and merges or splits PDFs. Use when the user works with .pdf files."),
        SkillCard::new("spreadsheet-analyst", "Reads, cleans and analyses spreadsheets and CSV files: pivots, charts, formulas. Use for .xlsx or .csv data questions."),
        SkillCard::new("email-drafter", "Drafts and polishes emails in the user's tone: replies, follow-ups, announcements. Use when the user wants an email written."),
        SkillCard::new("calendar-scheduler", "Finds meeting slots, creates and moves calendar events, sends invitations. Use when the user wants to schedule something."),
        SkillCard::new("code-reviewer", "Reviews code changes for bugs, security issues and style, and suggests fixes. Use when the user shares a diff or asks for a review."),
        SkillCard::new("brand-writer", "Writes marketing copy, taglines and social posts in the company's brand voice. Use for creative or promotional writing."),
    ]
}

/// How trigger evals run.
#[derive(Debug, Clone)]
pub struct TriggerOptions {
    pub runs_per_query: u32,
    pub decoys: Vec<SkillCard>,
    /// Model calls in flight at once.
    pub concurrency: usize,
    /// Agent mode (see the module docs); `None`: the model names a skill.
    pub agent: Option<AgentTriggers>,
}

/// What agent-mode trigger runs (and agent-mode catalogue evals,
/// [`crate::catalogue::Picker::Agent`]) need besides the model.
#[derive(Debug, Clone)]
pub struct AgentTriggers {
    pub sandbox: std::sync::Arc<skilleval_sandbox::Sandbox>,
    /// The skill package on disk.
    pub package_root: std::path::PathBuf,
    /// Model requests per run: the agent only has to get as far as opening a skill.
    pub max_turns: u32,
    pub timeout: std::time::Duration,
}

/// What one agent-mode run observed (trigger evals and catalogue evals read it differently).
#[derive(Debug, Clone)]
pub(crate) struct AgentObservation {
    /// The agent opened the skill's own `SKILL.md` (`details.skill_used`).
    pub skill_used: bool,
    /// The catalogue entry whose `SKILL.md` it opened first (`details.skill_opened`).
    pub opened_first: Option<String>,
    /// Why the loop stopped early, if it did (a fault in the middle of it).
    pub stopped: Option<String>,
    pub usage: Usage,
}

/// Gives `query` to the `agent` runner once, with the skill at `/skill` (its package on disk,
/// `agent.package_root`) and `decoys` (leaving out any named like the skill, `skill_name`) as
/// stub skills in its catalogue; `Err` when the run produced nothing at all.
pub(crate) async fn observe_agent(
    client: &LlmClient,
    agent: &AgentTriggers,
    skill_name: &str,
    query: &str,
    decoys: &[SkillCard],
    run: u32,
) -> Result<AgentObservation, String> {
    use crate::runner::agent::{agent_runner_config, run_agent};
    let decoys: Vec<Value> = decoys
        .iter()
        .filter(|d| !d.name.eq_ignore_ascii_case(skill_name))
        .map(|d| json!({"name": d.name, "description": d.description}))
        .collect();
    let runner = agent_runner_config(
        Some(client.name()),
        [
            ("maxTurns".to_string(), json!(agent.max_turns)),
            ("onLimit".to_string(), json!("grade")),
            ("decoys".to_string(), Value::Array(decoys)),
            ("repeat".to_string(), json!(run)),
        ]
        .into(),
    );
    let case = skilleval_model::definition::TestCase {
        id: format!("trigger-{run}"),
        input: skilleval_model::definition::Input {
            prompt: query.to_string(),
            ..Default::default()
        },
        ..Default::default()
    };
    let environment = std::collections::BTreeMap::new();
    let req = crate::runner::ProduceRequest {
        case: &case,
        runner: &runner,
        given: None,
        environment: &environment,
        timeout: agent.timeout,
        workspace: None,
    };
    let env = skilleval_grading::GradeEnv {
        sandbox: agent.sandbox.clone(),
        package_root: std::sync::Arc::from(agent.package_root.as_path()),
    };
    let produced = run_agent(client, &req, &env)
        .await
        .map_err(|f| f.to_string())?;
    Ok(AgentObservation {
        skill_used: produced.details.get("skill_used").and_then(Value::as_bool) == Some(true),
        opened_first: produced
            .details
            .get("skill_opened")
            .and_then(Value::as_str)
            .map(str::to_string),
        // `onLimit: grade` leaves only a fault in the middle of the loop to stop it.
        stopped: produced.stopped.map(|f| f.to_string()),
        usage: produced.usage,
    })
}

/// One agent-mode run: the skill's name when the agent opened its `SKILL.md`, else `none`.
async fn agent_run(
    client: &LlmClient,
    agent: &AgentTriggers,
    skill: &SkillCard,
    query: &str,
    decoys: &[SkillCard],
    run: u32,
) -> RunOutcome {
    let seen = observe_agent(client, agent, &skill.name, query, decoys, run).await?;
    // A run that failed before opening the skill made no pick.
    if let (Some(fault), false) = (seen.stopped, seen.skill_used) {
        return Err(fault);
    }
    let pick = if seen.skill_used {
        skill.name.clone()
    } else {
        "none".to_string()
    };
    Ok((pick, seen.usage))
}

impl Default for TriggerOptions {
    fn default() -> Self {
        TriggerOptions {
            runs_per_query: DEFAULT_RUNS_PER_QUERY,
            decoys: default_decoys(),
            concurrency: 4,
            agent: None,
        }
    }
}

/// One query over its runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryResult {
    pub query: String,
    pub should_trigger: bool,
    /// Runs that got an answer.
    pub runs: u32,
    /// Runs that picked the skill.
    pub selected: u32,
    /// `None` when no run got an answer.
    pub triggered: Option<bool>,
    /// What each answered run picked.
    pub choices: Vec<String>,
    pub errors: Vec<String>,
}

/// Confusion counts, precision and recall.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TriggerMetrics {
    pub true_positives: u64,
    pub false_positives: u64,
    pub false_negatives: u64,
    pub true_negatives: u64,
    /// `None` when nothing triggered.
    pub precision: Option<f64>,
    /// `None` when no query should trigger.
    pub recall: Option<f64>,
    pub accuracy: Option<f64>,
    /// Harmonic mean of precision and recall; `None` when either is.
    #[serde(default)]
    pub f1: Option<f64>,
    pub errored: u64,
}

/// The trigger evals of a skill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TriggerReport {
    pub skill: String,
    pub runs_per_query: u32,
    /// Skills in each lineup (the decoys and this one).
    pub skills_offered: usize,
    pub queries: Vec<QueryResult>,
    pub metrics: TriggerMetrics,
    pub usage: Usage,
}

/// One run: the skill picked and what asking cost, or why it failed.
type RunOutcome = Result<(String, Usage), String>;

/// Triggered when picked in at least half of the answered runs.
pub fn triggered(selected: u32, runs: u32) -> Option<bool> {
    (runs > 0).then_some(2 * selected >= runs)
}

/// Precision and recall of the triggered queries.
pub fn metrics(results: &[QueryResult]) -> TriggerMetrics {
    let mut m = TriggerMetrics::default();
    for r in results {
        match (r.triggered, r.should_trigger) {
            (None, _) => m.errored += 1,
            (Some(true), true) => m.true_positives += 1,
            (Some(true), false) => m.false_positives += 1,
            (Some(false), true) => m.false_negatives += 1,
            (Some(false), false) => m.true_negatives += 1,
        }
    }
    let ratio = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    m.precision = ratio(m.true_positives, m.true_positives + m.false_positives);
    m.recall = ratio(m.true_positives, m.true_positives + m.false_negatives);
    m.accuracy = ratio(
        m.true_positives + m.true_negatives,
        m.true_positives + m.true_negatives + m.false_positives + m.false_negatives,
    );
    m.f1 = match (m.precision, m.recall) {
        (Some(p), Some(r)) if p + r > 0.0 => Some(2.0 * p * r / (p + r)),
        (Some(_), Some(_)) => Some(0.0),
        _ => None,
    };
    m
}

/// The skills shown in run `run`: decoys and the skill, rotated by the run number.
fn lineup(skill: &SkillCard, decoys: &[SkillCard], run: u32) -> Vec<SkillCard> {
    let mut all: Vec<SkillCard> = decoys
        .iter()
        .filter(|d| !d.name.eq_ignore_ascii_case(&skill.name))
        .cloned()
        .collect();
    all.push(skill.clone());
    let n = all.len();
    if n > 0 {
        let shift = (run as usize * 2 + 1) % n;
        all.rotate_left(shift);
    }
    all
}

/// The request for one run of one query.
pub fn selection_request(query: &str, skills: &[SkillCard], run: u32) -> ChatRequest {
    let mut list = String::new();
    for s in skills {
        let _ = writeln!(
            list,
            "- name: {}\n  description: {}",
            s.name,
            s.description.trim()
        );
    }
    let mut names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
    names.push("none");
    ChatRequest {
        system: Some("You are an AI assistant that can load skills: packaged instructions for specific tasks. You load a skill only when its description says it fits the user's request.".into()),
        messages: vec![Message::user(format!(
            "Available skills:\n{list}\nThe user writes:\n<query>\n{}\n</query>\n\nWhich one skill would you load for this request? Answer `none` if no skill fits. Answer with one JSON object and nothing else: {{\"skill\": \"<skill name or none>\", \"reason\": \"<one sentence>\"}}",
            query.trim()
        ))],
        schema: Some(OutputSchema::new(
            "choose_skill",
            json!({
                "type": "object",
                "properties": {"skill": {"type": "string", "enum": names}, "reason": {"type": "string"}},
                "required": ["skill"]
            }),
        )),
        cache_salt: Some(format!("trigger-run={run}")),
        ..ChatRequest::default()
    }
}

fn chosen(v: &Value, skills: &[SkillCard]) -> Result<String, String> {
    let pick = v
        .get("skill")
        .or_else(|| v.get("name"))
        .and_then(Value::as_str)
        .ok_or("the answer has no `skill`")?
        .trim()
        .trim_matches('`');
    if pick.eq_ignore_ascii_case("none") {
        return Ok("none".into());
    }
    skills
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(pick))
        .map(|s| s.name.clone())
        .ok_or(format!("`{pick}` is not one of the listed skills"))
}

/// Runs every query `runs_per_query` times and scores the selections (what `skilleval run`
/// does; the service runs one query per job with [`evaluate_query`] and assembles the same
/// report with [`report`]).
#[tracing::instrument(skip_all, fields(skill = %skill.name, queries = cases.len()))]
pub async fn evaluate_triggers(
    client: &LlmClient,
    skill: &SkillCard,
    cases: &[TriggerCase],
    opts: &TriggerOptions,
) -> TriggerReport {
    let queries: Vec<(QueryResult, Usage)> = stream::iter(cases)
        .map(|case| evaluate_query(client, skill, case, opts))
        .buffered(opts.concurrency.max(1))
        .collect()
        .await;
    let mut usage = Usage::default();
    let queries = queries
        .into_iter()
        .map(|(q, u)| {
            usage.add(&u);
            q
        })
        .collect();
    report(skill, opts, queries, usage)
}

/// One query, `runs_per_query` times (at most `opts.concurrency` in flight): what each run
/// picked, whether the query triggered, and what asking cost.
pub async fn evaluate_query(
    client: &LlmClient,
    skill: &SkillCard,
    case: &TriggerCase,
    opts: &TriggerOptions,
) -> (QueryResult, Usage) {
    let runs = opts.runs_per_query.max(1);
    let mut outcomes: Vec<(u32, RunOutcome)> = stream::iter(1..=runs)
        .map(|run| async move {
            if let Some(agent) = &opts.agent {
                let outcome = agent_run(client, agent, skill, &case.query, &opts.decoys, run).await;
                return (run, outcome);
            }
            let skills = lineup(skill, &opts.decoys, run);
            let req = selection_request(&case.query, &skills, run);
            let answer = ask_json(client, &req, |v| chosen(v, &skills)).await;
            (
                run,
                answer
                    .map(|a| (a.value, a.usage))
                    .map_err(|f| f.to_string()),
            )
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    // In run order, whichever answered first.
    outcomes.sort_by_key(|(run, _)| *run);
    let mut usage = Usage::default();
    let mut r = QueryResult {
        query: case.query.clone(),
        should_trigger: case.should_trigger,
        runs: 0,
        selected: 0,
        triggered: None,
        choices: Vec::new(),
        errors: Vec::new(),
    };
    for (_, outcome) in outcomes {
        match outcome {
            Ok((pick, u)) => {
                usage.add(&u);
                r.runs += 1;
                if pick == skill.name {
                    r.selected += 1;
                }
                r.choices.push(pick);
            }
            Err(e) => r.errors.push(e),
        }
    }
    r.triggered = triggered(r.selected, r.runs);
    (r, usage)
}

/// The report of a skill's queries, each evaluated by [`evaluate_query`] with `opts`.
pub fn report(
    skill: &SkillCard,
    opts: &TriggerOptions,
    queries: Vec<QueryResult>,
    usage: Usage,
) -> TriggerReport {
    TriggerReport {
        skill: skill.name.clone(),
        runs_per_query: opts.runs_per_query.max(1),
        skills_offered: lineup(skill, &opts.decoys, 1).len(),
        metrics: metrics(&queries),
        queries,
        usage,
    }
}

fn opt_pct(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{:.1}%", v * 100.0))
}

/// The report section.
pub fn markdown(report: &TriggerReport) -> String {
    let m = &report.metrics;
    let mut out = format!(
        "## Trigger evals\n\nDoes the description make a model pick `{}` among {} skills? {} run(s) per query; triggered when picked in at least half.\n\n\
         Precision {} · recall {} · F1 {} · accuracy {} (TP {}, FP {}, FN {}, TN {}{}).\n\n| Query | Should trigger | Picked | Triggered |\n|---|---|---|---|\n",
        report.skill,
        report.skills_offered,
        report.runs_per_query,
        opt_pct(m.precision),
        opt_pct(m.recall),
        opt_pct(m.f1),
        opt_pct(m.accuracy),
        m.true_positives,
        m.false_positives,
        m.false_negatives,
        m.true_negatives,
        if m.errored > 0 { format!(", {} errored", m.errored) } else { String::new() }
    );
    for q in &report.queries {
        let mark = match (q.triggered, q.should_trigger) {
            (None, _) => "error".to_string(),
            (Some(t), s) if t == s => format!("{} ✓", if t { "yes" } else { "no" }),
            (Some(t), _) => format!("{} ✗", if t { "yes" } else { "no" }),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {}/{} | {mark} |",
            q.query.replace('|', "\\|").replace('\n', " "),
            if q.should_trigger { "yes" } else { "no" },
            q.selected,
            q.runs
        );
    }
    out.push('\n');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn q(should: bool, selected: u32, runs: u32) -> QueryResult {
        QueryResult {
            query: "q".into(),
            should_trigger: should,
            runs,
            selected,
            triggered: triggered(selected, runs),
            choices: vec![],
            errors: vec![],
        }
    }

    #[test]
    fn half_the_runs_trigger_and_metrics_follow() {
        assert_eq!(triggered(2, 4), Some(true));
        assert_eq!(triggered(1, 3), Some(false));
        assert_eq!(triggered(0, 0), None);
        let m = metrics(&[
            q(true, 3, 3),
            q(true, 1, 3),
            q(false, 2, 3),
            q(false, 0, 3),
            q(true, 0, 0),
        ]);
        assert_eq!(
            (
                m.true_positives,
                m.false_negatives,
                m.false_positives,
                m.true_negatives,
                m.errored
            ),
            (1, 1, 1, 1, 1)
        );
        assert_eq!(m.precision, Some(0.5));
        assert_eq!(m.recall, Some(0.5));
        assert_eq!(m.f1, Some(0.5));
        let m = metrics(&[q(true, 3, 3), q(true, 0, 3), q(false, 3, 3), q(false, 3, 3)]);
        // Precision 1/3, recall 1/2: F1 = 2 * (1/6) / (5/6) = 0.4.
        assert!((m.f1.unwrap() - 0.4).abs() < 1e-12);
        assert_eq!(metrics(&[q(false, 0, 3)]).precision, None);
    }

    #[test]
    fn the_skill_moves_through_the_lineup() {
        let skill = SkillCard::new("meeting-notes", "d");
        let decoys = default_decoys();
        let positions: Vec<usize> = (1..=3)
            .map(|r| {
                lineup(&skill, &decoys, r)
                    .iter()
                    .position(|s| s.name == "meeting-notes")
                    .unwrap()
            })
            .collect();
        assert_eq!(lineup(&skill, &decoys, 1).len(), decoys.len() + 1);
        assert!(
            positions[0] != positions[1] && positions[1] != positions[2],
            "{positions:?}"
        );
        let req = selection_request("notes please", &lineup(&skill, &decoys, 1), 1);
        assert!(req.messages[0].content.contains("name: meeting-notes"));
        assert_eq!(
            chosen(
                &json!({"skill": "Meeting-Notes"}),
                &lineup(&skill, &decoys, 1)
            )
            .unwrap(),
            "meeting-notes"
        );
        assert!(chosen(&json!({"skill": "other"}), &decoys).is_err());
    }
}

/// For tests of crates above (`test-util`): a model that answers a trigger prompt as one that
/// reads descriptions would, by word overlap.
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures {
    use std::collections::BTreeSet;

    use serde_json::{json, Value};

    /// The words of `text` longer than three characters, lower-cased.
    pub fn content_words(text: &str) -> BTreeSet<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| w.len() > 3)
            .map(str::to_lowercase)
            .collect()
    }

    /// The skill of a trigger prompt's list whose description shares the most words with the
    /// prompt's `<query>` (the first listed on a tie, so near-duplicates split the picks as the
    /// lineup rotates); `none` when no description shares a word.
    pub fn pick_by_word_overlap(prompt: &str) -> String {
        let query = prompt
            .split("<query>")
            .nth(1)
            .and_then(|q| q.split("</query>").next())
            .unwrap_or_default();
        let q = content_words(query);
        let (mut best, mut most, mut name) = ("none".to_string(), 0, String::new());
        for line in prompt.lines() {
            if let Some(n) = line.strip_prefix("- name: ") {
                name = n.trim().to_string();
            } else if let Some(d) = line.trim().strip_prefix("description: ") {
                let overlap = content_words(d).intersection(&q).count();
                if overlap > most {
                    (best, most) = (name.clone(), overlap);
                }
            }
        }
        best
    }

    /// A chat completion answering a trigger (or catalogue) selection request with
    /// [`pick_by_word_overlap`] of its user text.
    pub fn pick_reply_by_word_overlap(body: &Value) -> Value {
        let prompt = crate::fixtures::chat_user_text(body);
        let answer =
            json!({"skill": pick_by_word_overlap(&prompt), "reason": "overlap"}).to_string();
        json!({
            "model": "overlap",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 5}
        })
    }

    /// The `SKILL.md` an agent that reads descriptions would open for `query`, given the
    /// `agent` runner's system prompt: the location of the listed skill whose description
    /// shares the most words with the query (the first listed on a tie: the runner lists
    /// skills by name); `None` when no description shares a word.
    pub fn agent_location_by_word_overlap(system: &str, query: &str) -> Option<String> {
        let q = content_words(query);
        let (mut best, mut most) = (None, 0);
        for block in system.split("<skill>").skip(1) {
            let field = |tag: &str| {
                block
                    .split(&format!("<{tag}>"))
                    .nth(1)
                    .and_then(|rest| rest.split(&format!("</{tag}>")).next())
            };
            let (Some(description), Some(location)) = (field("description"), field("location"))
            else {
                continue;
            };
            let overlap = content_words(description).intersection(&q).count();
            if overlap > most {
                (best, most) = (Some(location.trim().to_string()), overlap);
            }
        }
        best
    }

    /// A chat-completions reply (OpenAI tool calls) of an agent that picks by word overlap:
    /// at its first turn it reads the `SKILL.md` [`agent_location_by_word_overlap`] names
    /// with `read_file` (or answers, opening none), and at the next it answers.
    pub fn agent_reply_by_word_overlap(body: &Value) -> Value {
        let messages: &[Value] = body["messages"].as_array().map_or(&[], Vec::as_slice);
        let content_of = |role: &str| {
            messages
                .iter()
                .find(|m| m["role"] == role)
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default()
        };
        let system = body["system"].as_str().unwrap_or(content_of("system"));
        let first_turn = !messages.iter().any(|m| m["role"] == "assistant");
        let usage = json!({"prompt_tokens": 100, "completion_tokens": 10});
        match agent_location_by_word_overlap(system, content_of("user")) {
            Some(location) if first_turn => json!({
                "model": "overlap-agent",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "read_file", "arguments": json!({"path": location}).to_string()}
                }]}, "finish_reason": "tool_calls"}],
                "usage": usage
            }),
            _ => json!({
                "model": "overlap-agent",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."}, "finish_reason": "stop"}],
                "usage": usage
            }),
        }
    }
}
