//! A first eval for a skill that has none: a starter definition in skill-creator's
//! `evals/evals.json` shape and trigger queries (`evals/triggers.json`), drafted from the
//! skill's `SKILL.md` (what `skilleval init` writes).
//!
//! Two ways, same shapes:
//! - [`from_skill_md`], no model: a few prompts taken from what `SKILL.md` says the skill is
//!   for (requests quoted in it, the list after "Use when …" in its description, its section
//!   headings), each with `expectations` left empty for the author to write (validation refuses
//!   a case with none and says what to add), and trigger queries: those requests as
//!   should-trigger, and a few unrelated requests as should-not-trigger placeholders;
//! - [`with_model`]: the model reads `SKILL.md` and writes realistic prompts, an expected output
//!   and verifiable expectations for each, and should- and should-not-trigger queries (near
//!   misses), answered as JSON of a fixed schema ([`skilleval_providers::ask::ask_json`]).
//!
//! Either way the result is a starting point for the author to edit, never a verdict.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use skilleval_model::grade::{Fault, Usage};
use skilleval_model::package::formats::TriggerCase;
use skilleval_model::package::skill_md::SkillManifest;
use skilleval_providers::ask::{ask_json, object_list_schema};
use skilleval_providers::chat::{ChatRequest, Message, OutputSchema};
use skilleval_providers::client::LlmClient;

/// Evals a draft has at most.
pub const MAX_EVALS: usize = 3;
/// Should-trigger queries a draft without a model takes from `SKILL.md` at most.
const MAX_TRIGGER_QUERIES: usize = 5;
/// Words a quoted request of `SKILL.md` has, at least and at most, to be taken as a prompt.
const QUOTED_WORDS: std::ops::RangeInclusive<usize> = 4..=40;
/// Most characters of `SKILL.md` shown to the model.
const MAX_SKILL_MD_CHARS: usize = 24_000;

/// Should-not-trigger placeholders of a draft without a model: requests no skill is for. The
/// useful negatives are near misses, which only someone (or a model) who knows the domain can
/// write; `skilleval init` says so.
const UNRELATED_QUERIES: &[&str] = &[
    "What's a good name for a grey cat who likes to sleep in the sun?",
    "Translate 'where is the train station' into Portuguese.",
    "How many minutes should I boil an egg for a runny yolk?",
];

/// Section headings that say nothing about what the skill is for.
const GENERIC_HEADINGS: &[&str] = &[
    "overview",
    "introduction",
    "purpose",
    "examples",
    "example",
    "notes",
    "references",
    "reference",
    "resources",
    "dependencies",
    "guidelines",
    "keywords",
    "quick reference",
    "quick start",
    "next steps",
    "best practices",
    "tips",
    "philosophy",
    "features",
    "technical details",
    "when to use this skill",
    "how to use this skill",
];

/// One drafted eval (skill-creator's `evals[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftEval {
    pub id: u32,
    pub name: String,
    pub prompt: String,
    /// What a good answer looks like, in words; empty when not drafted.
    pub expected_output: String,
    /// Statements a good output satisfies; empty when left for the author.
    pub expectations: Vec<String>,
}

/// A starter eval definition and trigger queries.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub skill_name: String,
    pub evals: Vec<DraftEval>,
    pub triggers: Vec<TriggerCase>,
    /// The model that drafted it; `None` when drafted from `SKILL.md` alone.
    pub model: Option<String>,
    /// What asking the model cost.
    pub usage: Usage,
}

impl Draft {
    /// `evals/evals.json` (skill-creator's shape).
    pub fn evals_json(&self) -> Value {
        json!({
            "skill_name": self.skill_name,
            "evals": self.evals.iter().map(|e| json!({
                "id": e.id,
                "name": e.name,
                "prompt": e.prompt,
                "expected_output": e.expected_output,
                "files": [],
                "expectations": e.expectations,
            })).collect::<Vec<_>>(),
        })
    }

    /// `evals/triggers.json` (skill-creator's `[{query, should_trigger}]`).
    pub fn triggers_json(&self) -> Value {
        Value::Array(
            self.triggers
                .iter()
                .map(|t| json!({"query": t.query, "should_trigger": t.should_trigger}))
                .collect(),
        )
    }

    /// Evals whose expectations are still to write.
    pub fn evals_without_expectations(&self) -> usize {
        self.evals
            .iter()
            .filter(|e| e.expectations.is_empty())
            .count()
    }
}

/// The first sentence of a text (up to its first `. `), trimmed.
fn first_sentence(text: &str) -> &str {
    let text = text.trim();
    match text.find(". ") {
        Some(i) => &text[..=i],
        None => text,
    }
}

/// Words a user's request has and a skill's own wording rarely does.
const FIRST_PERSON: &[&str] = &[
    "me",
    "my",
    "please",
    "i want",
    "i need",
    "i'd like",
    "can you",
    "could you",
    "help me",
];

/// Requests quoted in the text (`"make me a GIF of X for Slack"`): straight or curly double
/// quotes, a few words, no code, in a user's first person (a quoted heading, reply or file
/// line is not a request).
fn quoted_requests(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (open, close) in [('"', '"'), ('\u{201c}', '\u{201d}')] {
        let mut rest = text;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else { break };
            let quoted = after[..end].trim();
            rest = &after[end + close.len_utf8()..];
            let words: Vec<String> = quoted
                .split(|c: char| !(c.is_alphanumeric() || c == '\''))
                .filter(|w| !w.is_empty())
                .map(str::to_lowercase)
                .collect();
            let joined = format!(" {} ", words.join(" "));
            let first_person = FIRST_PERSON
                .iter()
                .any(|p| joined.contains(&format!(" {p} ")));
            let code_like = quoted.chars().any(|c| {
                matches!(
                    c,
                    '{' | '}' | '=' | '<' | '>' | '`' | '$' | '\\' | '|' | '#' | '['
                )
            });
            if QUOTED_WORDS.contains(&words.len())
                && first_person
                && !code_like
                && !quoted.contains('\n')
            {
                out.push(quoted.to_string());
            }
        }
    }
    out
}

/// The things a description says to use the skill for: the list after "Use when", "use this
/// skill whenever", "Trigger when"… up to the sentence's end, split on commas and "or".
fn use_cases(description: &str) -> Vec<String> {
    let lower = description.to_lowercase();
    let markers = [
        "use this skill whenever",
        "use this skill when",
        "use this skill for",
        "use this when",
        "use it when",
        "use when",
        "use for",
        "should use this skill when",
        "should use this skill whenever",
        "trigger when",
        "whenever",
    ];
    // A marker is whole words ("trigger when" is not the start of "trigger whenever").
    let whole_word_at = |m: &str| {
        lower.match_indices(m).map(|(i, _)| i).find(|i| {
            !lower[i + m.len()..]
                .chars()
                .next()
                .is_some_and(char::is_alphanumeric)
        })
    };
    let Some((at, marker)) = markers
        .iter()
        .filter_map(|m| whole_word_at(m).map(|i| (i, *m)))
        .min_by_key(|(i, m)| (*i, std::cmp::Reverse(m.len())))
    else {
        return Vec::new();
    };
    let rest = &description[at + marker.len()..];
    // Up to the sentence's end, before any quoted example (taken apart as a request) or
    // aside (" - not for …"); parenthesised examples are items of their own.
    let clause = rest
        .split(['.', ';', ':', '"', '\u{201c}'])
        .next()
        .unwrap_or(rest);
    let clause = clause
        .split(" - ")
        .next()
        .unwrap_or(clause)
        .split(" \u{2014} ")
        .next()
        .unwrap_or(clause)
        .trim_end()
        .trim_end_matches(" like")
        .trim_end_matches(" such as")
        .replace(['(', ')'], ",");
    let mut items = Vec::new();
    for part in clause.split(',') {
        for piece in part.split(" or ") {
            let mut item = piece.trim().trim_start_matches("and ").trim();
            for lead in [
                "asked to ",
                "the user wants to ",
                "the user asks to ",
                "the user asks for ",
                "the user asks ",
                "users want to ",
                "users request ",
                "users ask for ",
                "user wants to ",
                "the user ",
                "users ",
                "user ",
            ] {
                if item.to_lowercase().starts_with(lead) {
                    item = item[lead.len()..].trim();
                    break;
                }
            }
            let words = item.split_whitespace().count();
            // "whether in Python", "even if …", "etc": qualifiers of the list, not tasks.
            let qualifier = ["whether ", "even ", "not ", "etc", "including "]
                .iter()
                .any(|q| item.to_lowercase().starts_with(q));
            if (2..=20).contains(&words) && !qualifier {
                items.push(item.to_string());
            }
        }
    }
    items
}

/// `## ` headings of the body that name a task rather than a part of the document.
fn task_headings(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.trim_matches(|c: char| !c.is_alphanumeric() && c != ')')
                .trim()
                .to_string()
        })
        .filter(|h| {
            let lower = h.to_lowercase();
            h.split_whitespace().count() >= 2
                && !GENERIC_HEADINGS.contains(&lower.as_str())
                && h.chars().any(char::is_lowercase)
        })
        .collect()
}

/// A request asking for help with `task`, which may be a noun or a verb phrase ("creating art
/// using code" → "Help me with this: creating art using code.").
fn request_for(task: &str) -> String {
    let task = task.trim().trim_end_matches('.');
    let mut chars = task.chars();
    let lowered = match chars.next() {
        Some(first) if chars.clone().next().is_some_and(char::is_lowercase) => {
            first.to_lowercase().chain(chars).collect::<String>()
        }
        _ => task.to_string(),
    };
    format!("Help me with this: {lowered}.")
}

/// A case name from a prompt: its first words, at most 60 characters.
fn name_of(prompt: &str) -> String {
    let mut name = String::new();
    for word in prompt.split_whitespace() {
        if name.len() + word.len() + 1 > 60 {
            break;
        }
        if !name.is_empty() {
            name.push(' ');
        }
        name.push_str(word);
    }
    name.trim_end_matches(['.', ',', ':']).to_string()
}

/// A draft from `SKILL.md` alone: prompts, no expectations (see the module's doc).
pub fn from_skill_md(manifest: &SkillManifest) -> Draft {
    let quoted: Vec<String> = quoted_requests(&manifest.description)
        .into_iter()
        .chain(quoted_requests(&manifest.body))
        .collect();
    let uses = use_cases(&manifest.description);
    let headings = task_headings(&manifest.body);
    let mut prompts: Vec<String> = Vec::new();
    let candidates = quoted
        .iter()
        .cloned()
        .chain(uses.iter().map(|u| request_for(u)))
        // The first sentence, unless it is the "Use when" list already taken apart.
        .chain(
            Some(first_sentence(&manifest.description))
                .filter(|s| use_cases(s).is_empty())
                .map(request_for),
        )
        .chain(headings.iter().map(|h| request_for(h)));
    for p in candidates {
        if prompts.len() >= MAX_EVALS {
            break;
        }
        if !p.trim().is_empty() && !prompts.iter().any(|q| q.eq_ignore_ascii_case(&p)) {
            prompts.push(p);
        }
    }
    let evals = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| DraftEval {
            id: u32::try_from(i + 1).unwrap_or(u32::MAX),
            name: name_of(p),
            prompt: p.clone(),
            expected_output: String::new(),
            expectations: Vec::new(),
        })
        .collect();
    let mut should: Vec<String> = Vec::new();
    for q in quoted
        .iter()
        .cloned()
        .chain(uses.iter().map(|u| request_for(u)))
        .chain(prompts.iter().cloned())
    {
        if should.len() >= MAX_TRIGGER_QUERIES {
            break;
        }
        if !should.iter().any(|s| s.eq_ignore_ascii_case(&q)) {
            should.push(q);
        }
    }
    let triggers = should
        .into_iter()
        .map(|query| TriggerCase {
            query,
            should_trigger: true,
        })
        .chain(UNRELATED_QUERIES.iter().map(|q| TriggerCase {
            query: (*q).to_string(),
            should_trigger: false,
        }))
        .collect();
    Draft {
        skill_name: manifest.name.clone(),
        evals,
        triggers,
        model: None,
        usage: Usage::default(),
    }
}

/// What the model is asked to answer.
#[derive(Debug, Deserialize)]
struct ModelDraft {
    evals: Vec<ModelEval>,
    triggers: Vec<TriggerCase>,
}

#[derive(Debug, Deserialize)]
struct ModelEval {
    #[serde(default)]
    name: String,
    prompt: String,
    #[serde(default)]
    expected_output: String,
    expectations: Vec<String>,
}

/// The request [`with_model`] sends.
pub fn draft_request(manifest: &SkillManifest) -> ChatRequest {
    let body: String = manifest.body.chars().take(MAX_SKILL_MD_CHARS).collect();
    let system =
        "You write evaluations for agent skills: packaged instructions a model loads for a \
                  kind of task. You answer with JSON only.";
    let user = format!(
        "Here is a skill.\n\n<skill_name>{}</skill_name>\n<description>{}</description>\n<instructions>\n{}\n</instructions>\n\n\
         Write a first evaluation for it.\n\
         1. `evals`: {MAX_EVALS} test cases. Each has a `prompt` a real user would type (concrete, with the details a \
         real request has: names, numbers, file contents pasted in when the task needs input), a short `name`, an \
         `expected_output` describing in one or two sentences what a good answer contains, and 2 to 4 `expectations`: \
         statements about the output that a grader can check true or false by reading it (not \"is good\" or \"is \
         helpful\").\n\
         2. `triggers`: 8 requests, 4 that should make a model load this skill (`should_trigger: true`, phrased \
         differently from each other) and 4 near misses that share words with the skill but need something else \
         (`should_trigger: false`).\n\
         Answer with one JSON object: {{\"evals\": [{{\"name\", \"prompt\", \"expected_output\", \"expectations\": \
         [..]}}], \"triggers\": [{{\"query\", \"should_trigger\"}}]}}.",
        manifest.name,
        manifest.description.trim(),
        body.trim()
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "evals": object_list_schema(
                json!({
                    "name": {"type": "string"},
                    "prompt": {"type": "string"},
                    "expected_output": {"type": "string"},
                    "expectations": {"type": "array", "items": {"type": "string"}}
                }),
                &["name", "prompt", "expected_output", "expectations"],
            ),
            "triggers": object_list_schema(
                json!({"query": {"type": "string"}, "should_trigger": {"type": "boolean"}}),
                &["query", "should_trigger"],
            ),
        },
        "required": ["evals", "triggers"]
    });
    ChatRequest {
        system: Some(system.into()),
        messages: vec![Message::user(user)],
        schema: Some(OutputSchema::new("draft_evals", schema)),
        ..ChatRequest::default()
    }
}

/// Checks the model's answer: at least one eval, each with a prompt and an expectation.
fn interpret(v: &Value) -> Result<ModelDraft, String> {
    let draft: ModelDraft =
        serde_json::from_value(v.clone()).map_err(|e| format!("the answer's shape: {e}"))?;
    if draft.evals.is_empty() {
        return Err("`evals` is empty: write at least one test case".into());
    }
    for (i, e) in draft.evals.iter().enumerate() {
        if e.prompt.trim().is_empty() {
            return Err(format!("evals[{i}].prompt is empty"));
        }
        if e.expectations.iter().all(|x| x.trim().is_empty()) {
            return Err(format!(
                "evals[{i}].expectations is empty: give each case 2 to 4 checkable statements"
            ));
        }
    }
    Ok(draft)
}

/// A draft written by the model behind `client` (see the module's doc). A provider failure,
/// or an answer still unusable after one correction, is the returned fault.
pub async fn with_model(client: &LlmClient, manifest: &SkillManifest) -> Result<Draft, Fault> {
    let answer = ask_json(client, &draft_request(manifest), interpret).await?;
    let evals = answer
        .value
        .evals
        .into_iter()
        .take(MAX_EVALS)
        .enumerate()
        .map(|(i, e)| DraftEval {
            id: u32::try_from(i + 1).unwrap_or(u32::MAX),
            name: if e.name.trim().is_empty() {
                name_of(&e.prompt)
            } else {
                e.name.trim().to_string()
            },
            prompt: e.prompt,
            expected_output: e.expected_output,
            expectations: e
                .expectations
                .into_iter()
                .filter(|x| !x.trim().is_empty())
                .collect(),
        })
        .collect();
    let triggers = answer
        .value
        .triggers
        .into_iter()
        .filter(|t| !t.query.trim().is_empty())
        .collect();
    Ok(Draft {
        skill_name: manifest.name.clone(),
        evals,
        triggers,
        model: Some(client.config().model.clone()),
        usage: answer.usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(description: &str, body: &str) -> SkillManifest {
        SkillManifest {
            name: "demo".into(),
            description: description.into(),
            body: body.into(),
            ..SkillManifest::default()
        }
    }

    #[test]
    fn prompts_come_from_quoted_requests_the_use_when_list_and_task_headings() {
        let m = manifest(
            "Knowledge for animated GIFs. Use when users request animated GIFs for Slack like \"make me a GIF of a cat waving for Slack.\"",
            "# GIFs\n\n## Overview\n\n## Drawing Graphics\n\ntext\n",
        );
        let d = from_skill_md(&m);
        let prompts: Vec<&str> = d.evals.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(
            prompts,
            [
                "make me a GIF of a cat waving for Slack.",
                "Help me with this: animated GIFs for Slack.",
                "Help me with this: knowledge for animated GIFs.",
            ]
        );
        // Section headings that name a task come last; generic ones never.
        let d = from_skill_md(&manifest(
            "Toolkit for GIFs.",
            "## Overview\n## Drawing Graphics\n## Quick Start\n",
        ));
        let prompts: Vec<&str> = d.evals.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(
            prompts,
            [
                "Help me with this: toolkit for GIFs.",
                "Help me with this: drawing Graphics."
            ]
        );
        assert!(d.evals.iter().all(|e| e.expectations.is_empty()));
        assert_eq!(d.evals_without_expectations(), 2);
        assert_eq!(d.evals[1].id, 2);
        assert!(d.triggers.iter().any(|t| t.should_trigger));
        assert_eq!(
            d.triggers.iter().filter(|t| !t.should_trigger).count(),
            UNRELATED_QUERIES.len()
        );
    }

    #[test]
    fn quoted_text_is_a_request_only_in_a_users_first_person() {
        let text = "Say \"Source: Annual Report 2024\", then ask \"I want to make a skill for X\" or \"It must be pristine and complete\".";
        assert_eq!(quoted_requests(text), ["I want to make a skill for X"]);
    }

    #[test]
    fn use_when_markers_are_whole_words_and_asides_are_cut() {
        assert_eq!(
            use_cases("Trigger whenever the user mentions decks or slide outlines."),
            ["mentions decks", "slide outlines"]
        );
        assert_eq!(
            use_cases("Use when asked to write internal communications (status reports, leadership updates)."),
            ["write internal communications", "status reports", "leadership updates"]
        );
        assert_eq!(
            use_cases("Use for complex artifacts requiring state, or shadcn/ui components - not for simple HTML."),
            ["complex artifacts requiring state", "shadcn/ui components"]
        );
    }

    #[test]
    fn a_list_after_use_when_gives_one_prompt_per_item() {
        let m = manifest(
            "Create new skills and measure them. Use when users want to create a skill from scratch, edit, or optimize an existing skill, run evals to test a skill.",
            "",
        );
        let d = from_skill_md(&m);
        let prompts: Vec<&str> = d.evals.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(
            prompts,
            [
                "Help me with this: create a skill from scratch.",
                "Help me with this: optimize an existing skill.",
                "Help me with this: run evals to test a skill.",
            ]
        );
    }

    #[test]
    fn a_bare_description_still_gives_one_prompt() {
        let d = from_skill_md(&manifest(
            "Replace with description of the skill and when Claude should use it.",
            "# Insert instructions below\n",
        ));
        assert_eq!(d.evals.len(), 1);
        assert_eq!(
            d.evals[0].prompt,
            "Help me with this: replace with description of the skill and when Claude should use it."
        );
        let doc = d.evals_json();
        assert_eq!(doc["skill_name"], "demo");
        assert_eq!(doc["evals"][0]["expectations"], json!([]));
        assert_eq!(doc["evals"][0]["files"], json!([]));
    }

    #[test]
    fn the_model_answer_must_give_every_case_an_expectation() {
        let ok = json!({"evals": [{"name": "a", "prompt": "p", "expected_output": "o", "expectations": ["x"]}],
                        "triggers": [{"query": "q", "should_trigger": true}]});
        assert!(interpret(&ok).is_ok());
        let empty = json!({"evals": [{"name": "a", "prompt": "p", "expected_output": "o", "expectations": [" "]}],
                           "triggers": []});
        assert!(interpret(&empty)
            .unwrap_err()
            .contains("evals[0].expectations"));
        assert!(interpret(&json!({"evals": [], "triggers": []})).is_err());
    }
}
