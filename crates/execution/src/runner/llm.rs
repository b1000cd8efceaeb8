//! The `llm` runner: the skill's output is a model's answer with the skill loaded.
//!
//! - System prompt: the body of the package's `SKILL.md` (front matter stripped), followed by
//!   the package files it references by relative path (Markdown links, `code` spans) — within
//!   [`MAX_REFERENCED_BYTES`], text files only, never outside the package nor under `eval/` or
//!   `evals/` (that is where the expected answers live). Read once per package root and cached.
//! - User message: the templated prompt, then the case's `input.context` as JSON, then its
//!   `input.files` (package-relative), each in a `<file path="…">` block, within
//!   [`MAX_INPUT_BYTES`].
//! - Runner options (`RunnerConfig`, set by the run): `provider` picks the provider;
//!   [`WITHOUT_SKILL_OPTION`](crate::variant::WITHOUT_SKILL_OPTION) (`withoutSkill: true`) sends no system prompt — the baseline,
//!   "the bare model"; [`REPEAT_OPTION`](crate::variant::REPEAT_OPTION) (`repeat: n`) marks the n-th attempt of a repeated run,
//!   so the response cache does not hand every attempt the same answer.
//!
//! `Produced.usage` is what producing cost; `Produced.details` says which provider and model
//! answered, whether the skill was loaded, which files were included and whether the answer was
//! cut at `max_tokens` (then `truncated` is set too).

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{json, Value};

use crate::runner::{OutputRunner, ProduceRequest};
use crate::variant::{repeat_of, without_skill};
use skilleval_grading::GradeEnv;
use skilleval_model::definition::TestCase;
use skilleval_model::grade::Fault;
use skilleval_model::output::Produced;
use skilleval_model::package::skill_md;
use skilleval_providers::chat::{ChatRequest, Message};
use skilleval_providers::{ProviderClients, Purpose};

/// Budget for the files SKILL.md references, added to the system prompt.
pub const MAX_REFERENCED_BYTES: usize = 48 * 1024;
/// Budget for a case's input files, added to the user message.
pub const MAX_INPUT_BYTES: usize = 256 * 1024;
/// Package roots whose system prompt is kept.
const PROMPT_CACHE_CAPACITY: usize = 256;

/// The skill as a system prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillPrompt {
    pub system: String,
    /// Referenced files included, package-relative.
    pub included: Vec<String>,
    /// Referenced files left out (over budget, not text), with why.
    pub skipped: Vec<(String, String)>,
}

/// The `llm` runner, producing with the providers of `clients` (none: it refuses to produce
/// and [`OutputRunner::missing_provider`] says so).
pub struct LlmRunner {
    clients: Option<Arc<ProviderClients>>,
    prompts: Mutex<HashMap<PathBuf, Arc<SkillPrompt>>>,
}

impl LlmRunner {
    pub fn new(clients: Option<Arc<ProviderClients>>) -> Self {
        LlmRunner {
            clients,
            prompts: Mutex::new(HashMap::new()),
        }
    }

    fn skill_prompt(&self, root: &Path) -> Result<Arc<SkillPrompt>, Fault> {
        if let Some(p) = self.prompts.lock().ok().and_then(|m| m.get(root).cloned()) {
            return Ok(p);
        }
        let prompt = Arc::new(load_skill_prompt(root)?);
        if let Ok(mut m) = self.prompts.lock() {
            if m.len() >= PROMPT_CACHE_CAPACITY {
                m.clear();
            }
            m.insert(root.to_path_buf(), prompt.clone());
        }
        Ok(prompt)
    }
}

/// Reads `SKILL.md` under `root` and builds the system prompt.
pub fn load_skill_prompt(root: &Path) -> Result<SkillPrompt, Fault> {
    let path = root.join(skill_md::SKILL_MD);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Fault::permanent(format!("runner `llm`: cannot read {}: {e}", path.display()))
    })?;
    let (manifest, _) = skill_md::parse(&text);
    let body = manifest.map(|m| m.body).unwrap_or(text);
    let mut system = body.trim().to_string();
    let mut included = Vec::new();
    let mut skipped = Vec::new();
    let mut used = 0usize;
    for rel in referenced_paths(&system) {
        let Some(file) = resolve_inside(root, &rel) else {
            continue;
        };
        let lower = rel.to_ascii_lowercase();
        if lower == "skill.md"
            || lower.starts_with("eval/")
            || lower.starts_with("evals/")
            || included.contains(&rel)
        {
            continue;
        }
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        let Ok(content) = String::from_utf8(bytes) else {
            skipped.push((rel, "not UTF-8 text".to_string()));
            continue;
        };
        if used + content.len() > MAX_REFERENCED_BYTES {
            skipped.push((
                rel,
                format!("over the {MAX_REFERENCED_BYTES}-byte budget for referenced files"),
            ));
            continue;
        }
        used += content.len();
        let _ = write!(
            system,
            "\n\n<skill_file path=\"{rel}\">\n{}\n</skill_file>",
            content.trim_end()
        );
        included.push(rel);
    }
    Ok(SkillPrompt {
        system,
        included,
        skipped,
    })
}

/// Relative paths a Markdown body points at: link targets `](path)` and `code` spans that look
/// like a path (a `/` or a file extension, no spaces, no scheme).
pub fn referenced_paths(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut push = |candidate: &str| {
        let c = candidate.trim().trim_start_matches("./");
        let c = c.split('#').next().unwrap_or_default();
        let looks_like_path = !c.is_empty()
            && !c.contains(char::is_whitespace)
            && !c.contains("://")
            && !c.starts_with("mailto:")
            && !c.starts_with('/')
            && !c.starts_with('~')
            && !c.contains('\\')
            && (c.contains('/')
                || c.rsplit_once('.').is_some_and(|(stem, ext)| {
                    !stem.is_empty()
                        && (1..=5).contains(&ext.len())
                        && ext.chars().all(|x| x.is_ascii_alphanumeric())
                }));
        if looks_like_path && !out.iter().any(|o| o == c) {
            out.push(c.to_string());
        }
    };
    let mut rest = body;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        push(target.trim_matches(|c| c == '<' || c == '>'));
        rest = &after[end.min(after.len())..];
    }
    for (i, span) in body.split('`').enumerate() {
        if i % 2 == 1 && !span.contains('\n') {
            push(span);
        }
    }
    out
}

/// `root/rel` when `rel` is a plain relative path to a file that stays inside `root` (links
/// resolved).
pub(crate) fn resolve_inside(root: &Path, rel: &str) -> Option<PathBuf> {
    let rel_path = Path::new(rel);
    if rel_path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return None;
    }
    let root = root.canonicalize().ok()?;
    let full = root.join(rel_path).canonicalize().ok()?;
    (full.starts_with(&root) && full.is_file()).then_some(full)
}

/// The case's prompt, and its `input.context` (pretty JSON in a `<context>` block) when it
/// has one.
pub(crate) fn prompt_with_context(case: &TestCase) -> String {
    let mut s = case.input.prompt.trim().to_string();
    if let Some(ctx) = case.input.context.as_ref().filter(|c| !c.is_null()) {
        let _ = write!(
            s,
            "\n\n<context>\n{}\n</context>",
            serde_json::to_string_pretty(ctx).unwrap_or_default()
        );
    }
    s
}

/// The user message: prompt, context, input files. Returns the files included and skipped.
pub fn user_message(case: &TestCase, root: &Path) -> (String, Vec<String>, Vec<(String, String)>) {
    let mut s = prompt_with_context(case);
    let mut included = Vec::new();
    let mut skipped = Vec::new();
    let mut used = 0usize;
    for rel in &case.input.files {
        let rel = rel.trim().trim_start_matches("./");
        let Some(file) = resolve_inside(root, rel) else {
            skipped.push((rel.to_string(), "not a file inside the package".to_string()));
            continue;
        };
        match std::fs::read(&file) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) if used + text.len() <= MAX_INPUT_BYTES => {
                    used += text.len();
                    let _ = write!(s, "\n\n<file path=\"{rel}\">\n{}\n</file>", text.trim_end());
                    included.push(rel.to_string());
                }
                Ok(text) => {
                    let _ = write!(s, "\n\n<file path=\"{rel}\">(not shown: {} bytes, over the input budget)</file>", text.len());
                    skipped.push((
                        rel.to_string(),
                        format!("over the {MAX_INPUT_BYTES}-byte input budget"),
                    ));
                }
                Err(e) => {
                    let _ = write!(
                        s,
                        "\n\n<file path=\"{rel}\">(binary file, {} bytes, not shown)</file>",
                        e.as_bytes().len()
                    );
                    skipped.push((rel.to_string(), "not UTF-8 text".to_string()));
                }
            },
            Err(e) => skipped.push((rel.to_string(), e.to_string())),
        }
    }
    (s, included, skipped)
}

#[async_trait]
impl OutputRunner for LlmRunner {
    fn name(&self) -> &'static str {
        "llm"
    }

    fn runs_without_skill(&self) -> bool {
        true
    }

    fn missing_provider(&self) -> bool {
        self.clients.is_none()
    }

    #[tracing::instrument(skip_all, fields(test_case_id = %req.case.id, runner = "llm"))]
    async fn produce(&self, req: &ProduceRequest<'_>, env: &GradeEnv) -> Result<Produced, Fault> {
        let Some(clients) = &self.clients else {
            return Err(Fault::permanent(
                "runner `llm` needs a model provider; none is configured (see docs/providers.md)",
            ));
        };
        let client = clients.pick_or_fault(req.runner.provider.as_deref(), Purpose::Produce)?;
        let without = without_skill(req.runner);
        let repeat = repeat_of(req.runner);
        let skill = if without {
            None
        } else {
            Some(self.skill_prompt(&env.package_root)?)
        };
        let (user, files, skipped_files) = user_message(req.case, &env.package_root);
        let chat = ChatRequest {
            system: skill.as_ref().map(|s| s.system.clone()),
            messages: vec![Message::user(user)],
            cache_salt: repeat.map(|r| format!("repeat={r}")),
            ..ChatRequest::default()
        };
        let resp = client.chat(&chat).await?;
        let skipped: Vec<Value> = skipped_files
            .iter()
            .chain(skill.iter().flat_map(|s| s.skipped.iter()))
            .map(|(path, why)| json!({"path": path, "reason": why}))
            .collect();
        Ok(Produced {
            truncated: resp.truncated,
            details: json!({
                "provider": client.name(),
                "model": resp.model,
                "configuration": if without { "without_skill" } else { "with_skill" },
                "repeat": repeat.unwrap_or(1),
                "cached": resp.cached,
                "stopped_at_max_tokens": resp.truncated,
                "skill_files": skill.as_ref().map(|s| s.included.clone()).unwrap_or_default(),
                "input_files": files,
                "skipped_files": skipped,
            }),
            usage: resp.usage,
            output: resp.text,
            tool_calls: None,
            files: Vec::new(),
            stopped: None,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn referenced_paths_are_links_and_path_like_code() {
        let body = "See [the guide](references/guide.md#intro) and ![img](assets/logo.png \"Logo\").\n\
                    Run `scripts/run.py`, follow `STYLE.md`, not `pip install x` nor [site](https://x.io) or `/etc/passwd` or `e.g.`.";
        assert_eq!(
            referenced_paths(body),
            vec![
                "references/guide.md",
                "assets/logo.png",
                "scripts/run.py",
                "STYLE.md"
            ]
        );
    }

    #[test]
    fn skill_prompt_includes_referenced_files_but_not_evals_or_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(
            root.join("SKILL.md"),
            "---\nname: x\ndescription: d\n---\n# X\nFollow [style](references/style.md), see `evals/evals.json`, `../secret.txt`.\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("references")).unwrap();
        std::fs::create_dir_all(root.join("evals")).unwrap();
        std::fs::write(root.join("references/style.md"), "Use short sentences.\n").unwrap();
        std::fs::write(root.join("evals/evals.json"), "{\"answers\": 1}").unwrap();
        let p = load_skill_prompt(root).unwrap();
        assert!(p.system.starts_with("# X\nFollow"), "{}", p.system);
        assert!(!p.system.contains("name: x"), "front matter stripped");
        assert!(
            p.system.contains(
                "<skill_file path=\"references/style.md\">\nUse short sentences.\n</skill_file>"
            ),
            "{}",
            p.system
        );
        assert!(!p.system.contains("answers"));
        assert_eq!(p.included, vec!["references/style.md"]);
    }

    #[test]
    fn user_message_has_prompt_context_and_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("evals/files")).unwrap();
        std::fs::write(dir.path().join("evals/files/t.txt"), "ANA: hello\n").unwrap();
        let case = TestCase {
            id: "1".into(),
            input: skilleval_model::definition::Input {
                prompt: "Minutes please.".into(),
                context: Some(json!({"team": "core"})),
                files: vec!["evals/files/t.txt".into(), "../x".into()],
                ..Default::default()
            },
            ..TestCase::default()
        };
        let (m, files, skipped) = user_message(&case, dir.path());
        assert!(
            m.starts_with("Minutes please.\n\n<context>\n{\n  \"team\": \"core\"\n}\n</context>"),
            "{m}"
        );
        assert!(
            m.ends_with("<file path=\"evals/files/t.txt\">\nANA: hello\n</file>"),
            "{m}"
        );
        assert_eq!(files, vec!["evals/files/t.txt"]);
        assert_eq!(skipped[0].0, "../x");
    }
}
