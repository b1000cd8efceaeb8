//! The `agent` runner: the skill exercised the way agents use skills — a tool-calling loop.
//!
//! - **Catalogue.** The system prompt lists the available skills by name and description (this
//!   skill at `/skill`, plus the run's `decoys` at `/skills/<name>`), sorted by name so the
//!   position gives nothing away. The agent opens `SKILL.md` itself (progressive disclosure).
//!   The baseline (`withoutSkill: true`) leaves the skill out of the catalogue *and* out of
//!   the sandbox (`/skill` is an empty directory), so it measures the same agent without it.
//! - **Tools.** `bash`, `read_file`, `write_file`, `list_files`, all run inside ONE sandbox per
//!   case ([`SandboxSession`]): the skill read-only at `/skill`, a writable `/workspace` seeded
//!   with the case's `input.files` (by file name), the decoys' stubs read-only at `/skills`, no
//!   network, the sandbox policy's memory/CPU/file-size/process limits, a time limit and an
//!   output cap per call. The file tools are confined to `/skill`, `/skills` and `/workspace`
//!   (writes to `/workspace` only) and also run inside the sandbox, so a symlink the agent
//!   planted cannot reach the host.
//! - **Limits per case:** `maxTurns` (model requests), `maxTokens` (input + output, summed over
//!   the case), `wallTimeMs` (never past the case's own timeout). Hitting one ends the case
//!   `errored` with the reason, or, with `onLimit: "grade"`, grades what the agent has. Either
//!   way the case keeps what it spent, its transcript up to the stop and which limit it hit
//!   ([`AgentLimit`]): a stopped case is returned as [`Produced`] with `stopped` set, never as
//!   a bare fault, so budgets count its tokens. So is a fault in the middle of the loop (a
//!   provider error at the fifth turn) once something was spent.
//! - **Record.** `Produced.tool_calls` holds every call (so `tool_usage` checks it unchanged);
//!   `details.transcript` is the `{output, tool_calls}` transcript shape with each call's
//!   result, exit code and duration; `details.turns` the model turns; `details.skill_used`
//!   whether the agent opened `/skill/SKILL.md` (by `read_file`, or a `bash` command naming
//!   `/skill/SKILL.md`); `details.skill_opened` which catalogue entry's `SKILL.md` the agent
//!   opened first, by name (this skill's, or a decoy's at `/skills/<name>/SKILL.md`, recognised
//!   the same way), or `null`; `details.artifacts` the files left in `/workspace` with sizes and
//!   SHA-256, whose content (within [`ARTIFACTS_MAX_BYTES`]) is kept in `Produced.files`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{OutputRunner, ProduceRequest};
use crate::runner::llm::{prompt_with_context, resolve_inside};
use crate::variant::{repeat_of, without_skill};
use skilleval_grading::GradeEnv;
use skilleval_model::definition::RunnerConfig;
use skilleval_model::grade::{Fault, ToolCall, Usage};
use skilleval_model::output::{Produced, ProducedFile};
use skilleval_model::package::skill_md;
use skilleval_providers::tools::{AgentMessage, AgentRequest, ToolResult, ToolSpec, ToolUse};
use skilleval_providers::{LlmClient, ProviderClients, Purpose};
use skilleval_sandbox::egress::AllowedHosts;
use skilleval_sandbox::{Sandbox, SandboxBind, SandboxError, SandboxSession, SESSION_CONTROL_DIR};

/// Where the skill is mounted, and the file whose opening counts as using it.
pub const SKILL_DIR: &str = "/skill";
pub const SKILL_MD_PATH: &str = "/skill/SKILL.md";
pub const WORKSPACE_DIR: &str = "/workspace";
/// Where decoy skills are mounted (`/skills/<name>/SKILL.md`).
pub const DECOYS_DIR: &str = "/skills";
/// Where the read-only tools may look: the skill, the decoys, the workspace.
const READ_ROOTS: [&str; 3] = [SKILL_DIR, DECOYS_DIR, WORKSPACE_DIR];
/// Total bytes of workspace files whose content is kept with the result.
pub const ARTIFACTS_MAX_BYTES: u64 = 1 << 20;
/// Files listed from the workspace at most.
const ARTIFACTS_MAX_FILES: usize = 200;

/// The runner's options (`settings.runner`), camelCase; every field has a default.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentOptions {
    /// Model requests per case.
    pub max_turns: u32,
    /// Input + output tokens per case.
    pub max_tokens: u64,
    /// Wall time per case in milliseconds (the case's timeout wins when shorter).
    pub wall_time_ms: Option<u64>,
    /// Time limit of one tool call.
    pub tool_timeout_ms: u64,
    /// Bytes of a tool's output sent back to the model.
    pub tool_output_bytes: usize,
    /// What hitting a limit does.
    pub on_limit: OnLimit,
    /// Other skills listed in the catalogue, for trigger realism.
    pub decoys: Vec<Decoy>,
    /// Hosts the sandbox may reach through its proxy (see [`skilleval_sandbox::egress`]); empty: no
    /// network at all.
    pub allowed_hosts: Vec<String>,
    /// Output tokens per model request (`None`: the provider's `max_tokens`).
    pub max_tokens_per_turn: Option<u32>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            max_turns: 20,
            max_tokens: 200_000,
            wall_time_ms: None,
            tool_timeout_ms: 30_000,
            tool_output_bytes: 16 * 1024,
            on_limit: OnLimit::Error,
            decoys: Vec::new(),
            allowed_hosts: Vec::new(),
            max_tokens_per_turn: None,
        }
    }
}

/// What a case that hits a limit becomes.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// `errored`, with the limit as the reason.
    #[default]
    Error,
    /// Graded on the agent's last answer and the files it left.
    Grade,
}

/// Which of the case's limits stopped the agent (`details.limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentLimit {
    MaxTurns,
    MaxTokens,
    WallTime,
}

impl AgentLimit {
    /// As `details.limit` records it.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentLimit::MaxTurns => "max_turns",
            AgentLimit::MaxTokens => "max_tokens",
            AgentLimit::WallTime => "wall_time",
        }
    }
}

/// A skill listed in the catalogue that is not the one under test.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Decoy {
    pub name: String,
    pub description: String,
}

impl AgentOptions {
    /// Reads the options from a runner configuration; the error names the field.
    pub fn from_runner(runner: &RunnerConfig) -> Result<Self, String> {
        Self::check(runner).map_err(|e| e.to_string())
    }

    /// [`AgentOptions::from_runner`], with the option at fault apart (validation points at it).
    pub fn check(runner: &RunnerConfig) -> Result<Self, OptionError> {
        let known = [
            "maxTurns",
            "maxTokens",
            "wallTimeMs",
            "toolTimeoutMs",
            "toolOutputBytes",
            "onLimit",
            "decoys",
            "allowedHosts",
            "maxTokensPerTurn",
        ];
        let map: serde_json::Map<String, Value> = runner
            .extra
            .iter()
            .filter(|(k, _)| known.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let opts: AgentOptions =
            serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| OptionError {
                field: e.path().to_string(),
                message: e.into_inner().to_string(),
            })?;
        let bad = |field: &str, message: String| OptionError {
            field: field.to_string(),
            message,
        };
        if opts.max_turns == 0 {
            return Err(bad("maxTurns", "must be at least 1".into()));
        }
        AllowedHosts::parse(&opts.allowed_hosts).map_err(|e| bad("allowedHosts", e))?;
        for (i, d) in opts.decoys.iter().enumerate() {
            if d.name.is_empty()
                || !d
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(
                    &format!("decoys[{i}].name"),
                    format!("`{}` must be letters, digits, `-` or `_`", d.name),
                ));
            }
        }
        Ok(opts)
    }
}

/// A bad option of the `agent` runner: which one (`maxTurns`, `decoys[0].name`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "runner `agent`: `{}`: {}", self.field, self.message)
    }
}

/// One catalogue entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogueEntry {
    pub name: String,
    pub description: String,
    pub location: String,
}

/// The skills the agent is told about: the skill under test (unless `without`) and decoys.
pub fn catalogue(root: &Path, decoys: &[Decoy], without: bool) -> Vec<CatalogueEntry> {
    let mut entries: Vec<CatalogueEntry> = decoys
        .iter()
        .map(|d| CatalogueEntry {
            name: d.name.clone(),
            description: d.description.clone(),
            location: format!("{DECOYS_DIR}/{}/SKILL.md", d.name),
        })
        .collect();
    if !without {
        let manifest = std::fs::read_to_string(root.join(skill_md::SKILL_MD))
            .ok()
            .and_then(|t| skill_md::parse(&t).0);
        let (name, description) = manifest.map_or_else(
            || ("skill".to_string(), String::new()),
            |m| (m.name, m.description),
        );
        entries.push(CatalogueEntry {
            name,
            description,
            location: SKILL_MD_PATH.to_string(),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    entries
}

/// The system prompt: how to work, and the catalogue.
pub fn system_prompt(entries: &[CatalogueEntry]) -> String {
    let mut s = String::from(
        "You are an agent working on a task with tools: `bash` (a shell command), `read_file`, \
         `write_file` and `list_files`. Your working directory is /workspace; the task's input \
         files are there, and any file you are asked to produce must be written there.\n\n\
         Skills are folders of instructions, scripts and resources. When a skill's description \
         matches the task, read its SKILL.md with `read_file` before doing anything else and \
         follow it; paths in it are relative to the skill's folder. Do not open skills that \
         do not match.\n\n<available_skills>\n",
    );
    for e in entries {
        let _ = writeln!(
            s,
            "<skill>\n<name>{}</name>\n<description>{}</description>\n<location>{}</location>\n</skill>",
            e.name, e.description, e.location
        );
    }
    s.push_str("</available_skills>");
    s
}

/// The four tools.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "bash",
            description: "Run a shell command in /workspace and get its exit code and output (stdout and stderr). No network.",
            parameters: json!({"type": "object", "properties": {"command": {"type": "string", "description": "The command"}}, "required": ["command"]}),
        },
        ToolSpec {
            name: "read_file",
            description: "Read a text file under /skill, /skills or /workspace.",
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        },
        ToolSpec {
            name: "write_file",
            description: "Write a text file under /workspace (parent directories are created).",
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}),
        },
        ToolSpec {
            name: "list_files",
            description: "List the files under a directory of /skill, /skills or /workspace (default /workspace).",
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        },
    ]
}

/// An absolute sandbox path for `path` (relative: under `/workspace`) when it stays under one
/// of `roots`; `..` and other tricks are refused.
pub fn confine(path: &str, roots: &[&str]) -> Result<String, String> {
    let p = path.trim();
    let full = if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{WORKSPACE_DIR}/{p}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(&full).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_str().ok_or("the path is not UTF-8")?),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("`{path}`: `..` is not allowed"));
            }
        }
    }
    let norm = format!("/{}", parts.join("/"));
    if roots
        .iter()
        .any(|r| norm == *r || norm.starts_with(&format!("{r}/")))
    {
        Ok(norm)
    } else {
        Err(format!("`{path}` is outside {}", roots.join(" and ")))
    }
}

/// A path quoted for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The `agent` runner (see the module docs).
pub struct AgentRunner {
    clients: Option<Arc<ProviderClients>>,
}

impl AgentRunner {
    pub fn new(clients: Option<Arc<ProviderClients>>) -> Self {
        AgentRunner { clients }
    }
}

/// One executed tool call, as recorded.
#[derive(Debug, Clone)]
struct CallRecord {
    turn: u32,
    name: String,
    arguments: Value,
    result: String,
    exit_code: Option<i32>,
    is_error: bool,
    duration_ms: u64,
}

/// The case's directories on the host.
struct CaseDirs {
    _root: tempfile::TempDir,
    workspace: PathBuf,
    control: PathBuf,
    decoys: PathBuf,
    empty: PathBuf,
}

fn case_dirs(sandbox: &Sandbox) -> std::io::Result<CaseDirs> {
    let root = sandbox.session_scratch("skilleval-agent-")?;
    // The sandbox's uid must pass through to the mounted directories.
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
    let mk = |name: &str| -> std::io::Result<PathBuf> {
        let p = root.path().join(name);
        std::fs::create_dir(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
        Ok(p)
    };
    Ok(CaseDirs {
        workspace: mk("workspace")?,
        control: mk("control")?,
        decoys: mk("decoys")?,
        empty: mk("empty")?,
        _root: root,
    })
}

fn io_fault(what: &str, e: &std::io::Error) -> Fault {
    Fault::Host {
        message: format!("runner `agent`: {what}: {e}"),
    }
}

fn sandbox_fault(e: SandboxError) -> Fault {
    match e {
        SandboxError::NoSandbox | SandboxError::MissingTool { .. } => {
            Fault::permanent(format!("runner `agent` needs bubblewrap: {e}"))
        }
        SandboxError::PackageNotReadable { .. } => Fault::permanent(e.to_string()),
        other => Fault::Host {
            message: format!("runner `agent`: {other}"),
        },
    }
}

/// Copies the case's input files into the workspace, by file name.
fn seed_workspace(root: &Path, files: &[String], workspace: &Path) -> Result<Vec<String>, Fault> {
    let mut seeded = Vec::new();
    for rel in files {
        let rel = rel.trim().trim_start_matches("./");
        let src = resolve_inside(root, rel).ok_or_else(|| {
            Fault::permanent(format!(
                "input.files: `{rel}` is not a file inside the package"
            ))
        })?;
        let name = src
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if seeded.contains(&name) {
            return Err(Fault::permanent(format!(
                "input.files: two files are named `{name}`; the agent's /workspace holds them by file name"
            )));
        }
        let dst = workspace.join(&name);
        std::fs::copy(&src, &dst).map_err(|e| io_fault("seeding /workspace", &e))?;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| io_fault("seeding /workspace", &e))?;
        seeded.push(name);
    }
    Ok(seeded)
}

fn write_decoys(dir: &Path, decoys: &[Decoy]) -> Result<(), Fault> {
    for d in decoys {
        let p = dir.join(&d.name);
        std::fs::create_dir_all(&p).map_err(|e| io_fault("writing decoys", &e))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io_fault("writing decoys", &e))?;
        let f = p.join("SKILL.md");
        std::fs::write(
            &f,
            format!(
                "---\nname: {}\ndescription: {}\n---\n# {}\n\nThis skill has no instructions for this task.\n",
                d.name,
                d.description.replace('\n', " "),
                d.name
            ),
        )
        .map_err(|e| io_fault("writing decoys", &e))?;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| io_fault("writing decoys", &e))?;
    }
    Ok(())
}

/// Files under `workspace` (symlinks are not followed), relative paths sorted.
fn collect_artifacts(workspace: &Path) -> Vec<ProducedFile> {
    let mut out = Vec::new();
    let mut stack = vec![workspace.to_path_buf()];
    let mut kept = 0u64;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && out.len() < ARTIFACTS_MAX_FILES {
                let rel = entry
                    .path()
                    .strip_prefix(workspace)
                    .map(|p| p.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let Ok(bytes) = std::fs::read(entry.path()) else {
                    continue;
                };
                let sha256 = hex::encode(Sha256::digest(&bytes));
                let size = bytes.len() as u64;
                let content = (kept + size <= ARTIFACTS_MAX_BYTES).then(|| {
                    kept += size;
                    bytes
                });
                out.push(ProducedFile {
                    path: rel,
                    size,
                    sha256,
                    content,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// Whether a tool call opens this skill's `SKILL.md`.
fn opens_skill_md(name: &str, arguments: &Value) -> bool {
    match name {
        "read_file" => arguments
            .get("path")
            .and_then(Value::as_str)
            .and_then(|p| confine(p, &[SKILL_DIR, WORKSPACE_DIR]).ok())
            .is_some_and(|p| p == SKILL_MD_PATH),
        "bash" => arguments
            .get("command")
            .and_then(Value::as_str)
            .is_some_and(|c| c.contains(SKILL_MD_PATH)),
        _ => false,
    }
}

/// The catalogue entry whose `SKILL.md` a tool call opens, if any: a `read_file` of its
/// location, or a `bash` command naming it (the one named first when it names several).
fn opened_entry<'a>(
    name: &str,
    arguments: &Value,
    entries: &'a [CatalogueEntry],
) -> Option<&'a CatalogueEntry> {
    match name {
        "read_file" => {
            let path = arguments
                .get("path")
                .and_then(Value::as_str)
                .and_then(|p| confine(p, &READ_ROOTS).ok())?;
            entries.iter().find(|e| e.location == path)
        }
        "bash" => {
            let command = arguments.get("command").and_then(Value::as_str)?;
            entries
                .iter()
                .filter_map(|e| command.find(&e.location).map(|at| (at, e)))
                .min_by_key(|(at, _)| *at)
                .map(|(_, e)| e)
        }
        _ => None,
    }
}

/// Text for the model, cut at `limit` bytes (on a character boundary).
fn cut(bytes: &[u8], limit: usize, truncated: bool) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= limit && !truncated {
        return text.into_owned();
    }
    let mut end = limit.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[output cut at {limit} bytes]", &text[..end])
}

/// Runs one tool call in the session: the result text, exit code, whether it failed.
async fn run_tool(
    session: &mut SandboxSession,
    call: &ToolUse,
    opts: &AgentOptions,
) -> Result<(String, Option<i32>, bool), Fault> {
    let timeout = Duration::from_millis(opts.tool_timeout_ms);
    let arg = |k: &str| call.arguments.get(k).and_then(Value::as_str);
    let script = match call.name.as_str() {
        "bash" => match arg("command") {
            Some(c) => c.to_string(),
            None => return Ok(("`bash` needs a `command` string".into(), None, true)),
        },
        "read_file" => match arg("path").map(|p| confine(p, &READ_ROOTS)) {
            Some(Ok(p)) => format!("cat -- {}", quote(&p)),
            Some(Err(e)) => return Ok((format!("read_file refused: {e}"), None, true)),
            None => return Ok(("`read_file` needs a `path` string".into(), None, true)),
        },
        "list_files" => match confine(arg("path").unwrap_or(WORKSPACE_DIR), &READ_ROOTS) {
            Ok(p) => format!(
                "find {} -maxdepth 4 -not -name '.*' | sort | head -n 500",
                quote(&p)
            ),
            Err(e) => return Ok((format!("list_files refused: {e}"), None, true)),
        },
        "write_file" => {
            let (Some(path), Some(content)) = (arg("path"), arg("content")) else {
                return Ok((
                    "`write_file` needs `path` and `content` strings".into(),
                    None,
                    true,
                ));
            };
            let p = match confine(path, &[WORKSPACE_DIR]) {
                Ok(p) if p != WORKSPACE_DIR => p,
                Ok(_) => return Ok(("write_file: give a file path".into(), None, true)),
                Err(e) => return Ok((format!("write_file refused: {e}"), None, true)),
            };
            let staged = format!("w{}.in", uuid::Uuid::new_v4().simple());
            let host = session.control_dir().join(&staged);
            std::fs::write(&host, content).map_err(|e| io_fault("staging write_file", &e))?;
            std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o644))
                .map_err(|e| io_fault("staging write_file", &e))?;
            let q = quote(&p);
            format!(
                "mkdir -p \"$(dirname -- {q})\" && cat {SESSION_CONTROL_DIR}/{staged} > {q} && echo \"wrote {} bytes to \"{q}",
                content.len()
            )
        }
        other => {
            return Ok((
                format!(
                    "unknown tool `{other}`; the tools are bash, read_file, write_file, list_files"
                ),
                None,
                true,
            ))
        }
    };
    let out = session.run(&script, timeout).await.map_err(sandbox_fault)?;
    let mut text = String::new();
    if call.name == "bash" {
        let _ = writeln!(text, "exit code: {}", out.exit_code);
    }
    if out.timed_out {
        let _ = writeln!(
            text,
            "timed out after {} ms; the command was killed",
            opts.tool_timeout_ms
        );
    }
    text.push_str(&cut(&out.output, opts.tool_output_bytes, out.truncated));
    Ok((text, Some(out.exit_code), out.exit_code != 0))
}

#[async_trait]
impl OutputRunner for AgentRunner {
    fn name(&self) -> &'static str {
        "agent"
    }

    /// The baseline is the same agent with the skill absent from its catalogue and sandbox.
    fn runs_without_skill(&self) -> bool {
        true
    }

    fn missing_provider(&self) -> bool {
        self.clients.is_none()
    }

    #[tracing::instrument(skip_all, fields(test_case_id = %req.case.id, runner = "agent"))]
    async fn produce(&self, req: &ProduceRequest<'_>, env: &GradeEnv) -> Result<Produced, Fault> {
        let Some(clients) = &self.clients else {
            return Err(Fault::permanent(
                "runner `agent` needs a model provider; none is configured (see docs/providers.md)",
            ));
        };
        let client = clients.pick_or_fault(req.runner.provider.as_deref(), Purpose::Produce)?;
        run_agent(&client, req, env).await
    }
}

/// One case through the agent loop with `client` (the runner's body; trigger evals in agent
/// mode call it too).
pub async fn run_agent(
    client: &LlmClient,
    req: &ProduceRequest<'_>,
    env: &GradeEnv,
) -> Result<Produced, Fault> {
    let started = Instant::now();
    let opts = AgentOptions::from_runner(req.runner).map_err(Fault::permanent)?;
    let without = without_skill(req.runner);
    let wall = opts
        .wall_time_ms
        .map_or(req.timeout, |ms| Duration::from_millis(ms).min(req.timeout));
    // Stop a little before the executor's timeout, so a wall-time stop keeps its reason.
    let deadline = started + wall.saturating_sub(Duration::from_millis(200));

    let allowed = AllowedHosts::parse(&opts.allowed_hosts)
        .map_err(|e| Fault::permanent(format!("runner `agent`: {e}")))?;
    let dirs =
        case_dirs(&env.sandbox).map_err(|e| io_fault("creating the case's directories", &e))?;
    // The case workspace a setup script prepared, else the case's own.
    let workspace: &Path = req.workspace.map_or(dirs.workspace.as_path(), |w| w.path());
    let seeded = seed_workspace(&env.package_root, &req.case.input.files, workspace)?;
    write_decoys(&dirs.decoys, &opts.decoys)?;
    let entries = catalogue(&env.package_root, &opts.decoys, without);
    let skill_root: &Path = if without {
        &dirs.empty
    } else {
        &env.package_root
    };
    let binds = [
        SandboxBind {
            source: workspace.to_path_buf(),
            dest: WORKSPACE_DIR,
            writable: true,
        },
        SandboxBind {
            source: dirs.decoys.clone(),
            dest: DECOYS_DIR,
            writable: false,
        },
    ];
    let mut session = env
        .sandbox
        .open_session(
            skill_root,
            &binds,
            &dirs.control,
            req.environment.clone(),
            &allowed,
        )
        .await
        .map_err(sandbox_fault)?;

    let mut user = prompt_with_context(req.case);
    if !seeded.is_empty() {
        let _ = write!(user, "\n\nInput files in /workspace: {}", seeded.join(", "));
    }
    let mut request = AgentRequest {
        system: system_prompt(&entries),
        messages: vec![AgentMessage::User(user)],
        tools: tool_specs(),
        max_tokens: opts.max_tokens_per_turn,
    };
    let mut usage = Usage::default();
    let mut calls: Vec<CallRecord> = Vec::new();
    let mut turns: Vec<Value> = Vec::new();
    let mut skill_used_at: Option<u32> = None;
    let mut skill_opened: Option<String> = None;
    let mut answer = String::new();
    let mut limit: Option<(AgentLimit, String)> = None;
    let mut model = String::new();
    let mut truncated = false;
    let mut turn = 0u32;
    let outcome: Result<(), Fault> = async {
        loop {
            if turn >= opts.max_turns {
                limit = Some((
                    AgentLimit::MaxTurns,
                    format!("max turns reached ({})", opts.max_turns),
                ));
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                limit = Some((
                    AgentLimit::WallTime,
                    format!("wall time reached ({} ms)", wall.as_millis()),
                ));
                return Ok(());
            }
            turn += 1;
            let Ok(reply) = tokio::time::timeout(deadline - now, client.agent_turn(&request)).await
            else {
                limit = Some((
                    AgentLimit::WallTime,
                    format!("wall time reached ({} ms)", wall.as_millis()),
                ));
                return Ok(());
            };
            let (reply, spent) = reply?;
            usage.add(&spent);
            model = reply.model.clone();
            truncated = reply.truncated;
            turns.push(json!({
                "turn": turn,
                "text": reply.text,
                "tool_calls": reply.calls.iter().map(|c| c.id.clone()).collect::<Vec<_>>(),
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
            }));
            if !reply.text.trim().is_empty() {
                answer = reply.text.clone();
            }
            let done = reply.calls.is_empty();
            request.messages.push(AgentMessage::Assistant {
                text: reply.text.clone(),
                calls: reply.calls.clone(),
            });
            if done {
                return Ok(());
            }
            let mut results = Vec::new();
            for call in &reply.calls {
                if skill_used_at.is_none()
                    && !without
                    && opens_skill_md(&call.name, &call.arguments)
                {
                    skill_used_at = Some(turn);
                }
                if skill_opened.is_none() {
                    skill_opened =
                        opened_entry(&call.name, &call.arguments, &entries).map(|e| e.name.clone());
                }
                let t0 = Instant::now();
                let (content, exit_code, is_error) = if Instant::now() >= deadline {
                    (
                        "not run: the case's wall time is up".to_string(),
                        None,
                        true,
                    )
                } else {
                    run_tool(&mut session, call, &opts).await?
                };
                calls.push(CallRecord {
                    turn,
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    result: content.clone(),
                    exit_code,
                    is_error,
                    duration_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
                });
                results.push(ToolResult {
                    id: call.id.clone(),
                    content,
                    is_error,
                });
            }
            request.messages.push(AgentMessage::ToolResults(results));
            if usage.total_tokens() >= opts.max_tokens {
                limit = Some((
                    AgentLimit::MaxTokens,
                    format!(
                        "max tokens reached ({} of {})",
                        usage.total_tokens(),
                        opts.max_tokens
                    ),
                ));
                return Ok(());
            }
        }
    }
    .await;
    session.close().await;
    let stopped = match outcome {
        // Nothing was spent: the bare fault says all there is.
        Err(fault) if turns.is_empty() && calls.is_empty() && usage.is_zero() => return Err(fault),
        Err(fault) => Some(fault),
        Ok(()) => match (&limit, opts.on_limit) {
            (Some((_, reason)), OnLimit::Error) => Some(Fault::permanent(format!(
                "agent stopped: {reason} after {} tool calls",
                calls.len()
            ))),
            _ => None,
        },
    };
    let files = collect_artifacts(workspace);
    let transcript_calls: Vec<Value> = calls
        .iter()
        .map(|c| {
            json!({
                "turn": c.turn, "name": c.name, "arguments": c.arguments,
                "result": c.result, "exit_code": c.exit_code, "is_error": c.is_error,
                "duration_ms": c.duration_ms,
            })
        })
        .collect();
    let artifacts: Vec<Value> = files
            .iter()
            .map(|f| {
                let mut a = json!({"path": f.path, "size": f.size, "sha256": f.sha256, "kept": f.content.is_some()});
                if let Some(text) = f.content.as_deref().and_then(|b| std::str::from_utf8(b).ok()) {
                    a["text"] = json!(text);
                }
                a
            })
            .collect();
    Ok(Produced {
        tool_calls: Some(
            calls
                .iter()
                .map(|c| ToolCall {
                    name: c.name.clone(),
                    arguments: c.arguments.clone(),
                })
                .collect(),
        ),
        truncated,
        details: json!({
            "provider": client.name(),
            "model": model,
            "configuration": if without { "without_skill" } else { "with_skill" },
            "repeat": repeat_of(req.runner).unwrap_or(1),
            "catalogue": entries.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
            "skill_used": skill_used_at.is_some(),
            "skill_opened_at_turn": skill_used_at,
            "skill_opened": skill_opened,
            "turns": turns,
            "transcript": {"output": answer, "tool_calls": transcript_calls},
            "artifacts": artifacts,
            "input_files": seeded,
            "limit": limit.as_ref().map(|(which, _)| which.as_str()),
            "limit_hit": limit.as_ref().map(|(_, reason)| reason),
            "duration_ms": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        }),
        usage,
        output: answer,
        files,
        stopped,
    })
}

/// Helper for [`BTreeMap`]-keyed options in tests and callers: an `agent` runner config.
pub fn agent_runner_config(provider: Option<&str>, extra: BTreeMap<String, Value>) -> RunnerConfig {
    RunnerConfig {
        kind: "agent".into(),
        provider: provider.map(str::to_string),
        extra,
        ..RunnerConfig::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn confine_keeps_paths_under_the_roots() {
        let roots = [SKILL_DIR, WORKSPACE_DIR];
        assert_eq!(confine("out.json", &roots).unwrap(), "/workspace/out.json");
        assert_eq!(
            confine("/skill/./SKILL.md", &roots).unwrap(),
            "/skill/SKILL.md"
        );
        assert!(confine("/etc/passwd", &roots).is_err());
        assert!(confine("/workspace/../etc/passwd", &roots).is_err());
        assert!(confine("/skillz/x", &roots).is_err());
        assert!(confine("/skill/x", &[WORKSPACE_DIR]).is_err());
    }

    #[test]
    fn opening_skill_md_is_recognised_and_decoys_are_not() {
        assert!(opens_skill_md(
            "read_file",
            &json!({"path": "/skill/SKILL.md"})
        ));
        assert!(opens_skill_md(
            "bash",
            &json!({"command": "cat /skill/SKILL.md"})
        ));
        assert!(!opens_skill_md(
            "read_file",
            &json!({"path": "/skills/other/SKILL.md"})
        ));
        assert!(!opens_skill_md(
            "read_file",
            &json!({"path": "/skill/references/x.md"})
        ));
        assert!(!opens_skill_md(
            "bash",
            &json!({"command": "cat /skills/other/SKILL.md"})
        ));
    }

    #[test]
    fn the_first_catalogue_entry_opened_is_named() {
        let entries = catalogue(
            Path::new("/nonexistent"),
            &[
                Decoy {
                    name: "pdf-tools".into(),
                    description: "PDFs".into(),
                },
                Decoy {
                    name: "pdf".into(),
                    description: "Also PDFs".into(),
                },
            ],
            false,
        );
        let opened =
            |tool: &str, args: Value| opened_entry(tool, &args, &entries).map(|e| e.name.clone());
        // The skill under test is listed under its manifest's name ("skill" without one).
        assert_eq!(
            opened("read_file", json!({"path": "/skill/SKILL.md"})).as_deref(),
            Some("skill")
        );
        assert_eq!(
            opened("read_file", json!({"path": "/skills/pdf-tools/./SKILL.md"})).as_deref(),
            Some("pdf-tools")
        );
        assert_eq!(
            opened(
                "bash",
                json!({"command": "head -n 20 /skills/pdf/SKILL.md"})
            )
            .as_deref(),
            Some("pdf"),
            "a name that prefixes another's is not confused with it"
        );
        assert_eq!(
            opened(
                "bash",
                json!({"command": "cat /skills/pdf-tools/SKILL.md /skill/SKILL.md"})
            )
            .as_deref(),
            Some("pdf-tools"),
            "the first named in the command"
        );
        assert_eq!(
            opened("read_file", json!({"path": "/skills/pdf-tools/notes.md"})),
            None
        );
        assert_eq!(
            opened("read_file", json!({"path": "/skills/../etc/passwd"})),
            None
        );
        assert_eq!(opened("list_files", json!({"path": "/skills/pdf"})), None);
        assert_eq!(
            opened("write_file", json!({"path": "/skill/SKILL.md"})),
            None
        );
        // Without the skill (the baseline), its SKILL.md is no entry.
        let without = catalogue(Path::new("/nonexistent"), &[], true);
        assert!(opened_entry("read_file", &json!({"path": "/skill/SKILL.md"}), &without).is_none());
        assert_eq!(
            confine("/skills/pdf/SKILL.md", &READ_ROOTS).unwrap(),
            "/skills/pdf/SKILL.md",
            "the decoys can be read"
        );
    }

    #[test]
    fn options_name_the_bad_field() {
        let cfg = agent_runner_config(None, [("maxTurns".to_string(), json!("x"))].into());
        let e = AgentOptions::from_runner(&cfg).unwrap_err();
        assert!(e.contains("maxTurns") || e.contains("invalid type"), "{e}");
        let cfg = agent_runner_config(None, [("allowedHosts".to_string(), json!(["x.io"]))].into());
        assert_eq!(
            AgentOptions::from_runner(&cfg).unwrap().allowed_hosts,
            vec!["x.io".to_string()]
        );
        let cfg = agent_runner_config(
            None,
            [("allowedHosts".to_string(), json!(["x.io", "bad host"]))].into(),
        );
        let e = AgentOptions::from_runner(&cfg).unwrap_err();
        assert!(
            e.contains("allowedHosts") && e.contains("`bad host`"),
            "{e}"
        );
    }
}
