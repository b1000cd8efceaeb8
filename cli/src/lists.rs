//! `skilleval skills list --server URL` and `skilleval runs list --server URL`: a server's
//! `GET /v1/skills` and `GET /v1/runs`, printed as a table (or JSON lines with `--json`).
//!
//! The flags are the lists' query parameters, sent as they are: the server checks them and
//! its refusal (the parameter and the values it accepts) is printed as the error. `--all`
//! follows `next_cursor` to the last page; otherwise one page is printed and, when more
//! follow, the `--cursor` that continues it.
//!
//! Exit codes: 0 the list was printed, 2 the server refused the query or could not be used.

use std::fmt::Write as _;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::{EXIT_BAD_INPUT, EXIT_PASS};

/// Pages `--all` follows at most (a guard against a server that never ends a list).
const MAX_PAGES: usize = 10_000;

/// Where the lists are and who asks.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The coordinator's base URL, e.g. http://localhost:8080.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Items per page (1..100; the server's default is 20).
    #[arg(long)]
    pub limit: Option<u32>,
    /// Continue a listing from the `next_cursor` a previous page printed.
    #[arg(long)]
    pub cursor: Option<String>,
    /// Follow every page to the end.
    #[arg(long)]
    pub all: bool,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SkillsArgs {
    #[command(subcommand)]
    pub command: SkillsCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SkillsCommand {
    /// A server's skills: search, filter by profile, verdict or model, sort.
    List(SkillsListArgs),
}

#[derive(Debug, Clone, Args)]
pub struct SkillsListArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Words in the name or the latest version's description.
    #[arg(long)]
    pub search: Option<String>,
    /// deterministic, structured, flexible, creative or enterprise.
    #[arg(long)]
    pub profile: Option<String>,
    /// pass, fail or none (no finished run).
    #[arg(long)]
    pub verdict: Option<String>,
    /// A model some version's definition names.
    #[arg(long)]
    pub model: Option<String>,
    /// name, created, updated or pass_rate.
    #[arg(long)]
    pub sort: Option<String>,
    /// asc or desc.
    #[arg(long)]
    pub order: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum RunsCommand {
    /// A server's runs: filter by skill, version, status, kind, verdict, creation time; sort.
    List(RunsListArgs),
}

#[derive(Debug, Clone, Args)]
pub struct RunsListArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// The skill's name.
    #[arg(long)]
    pub skill: Option<String>,
    /// A version id, or a version label together with --skill.
    #[arg(long)]
    pub version: Option<String>,
    /// creating, running, completed, cancelled or failed.
    #[arg(long)]
    pub status: Option<String>,
    /// upload, manual, rescore or samples.
    #[arg(long)]
    pub kind: Option<String>,
    /// pass or fail.
    #[arg(long)]
    pub verdict: Option<String>,
    /// Created at or after this RFC 3339 time.
    #[arg(long)]
    pub created_after: Option<String>,
    /// Created before this RFC 3339 time.
    #[arg(long)]
    pub created_before: Option<String>,
    /// created or score.
    #[arg(long)]
    pub sort: Option<String>,
    /// asc or desc.
    #[arg(long)]
    pub order: Option<String>,
}

/// The items of a listing and the cursor that continues it (none after the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct Listing {
    pub items: Vec<Value>,
    pub next_cursor: Option<String>,
}

/// Fetches `route` with `params` (and the page flags): one page, or every page with `--all`.
pub async fn fetch(
    server: &ServerArgs,
    route: &str,
    items_key: &str,
    params: &[(&str, Option<&String>)],
) -> Result<Listing, String> {
    let url = format!("{}{route}", server.server.trim_end_matches('/'));
    let client = reqwest::Client::new();
    let mut query: Vec<(&str, String)> = params
        .iter()
        .filter_map(|(k, v)| v.map(|v| (*k, v.clone())))
        .collect();
    if let Some(limit) = server.limit {
        query.push(("limit", limit.to_string()));
    }
    let mut cursor = server.cursor.clone();
    let mut items = Vec::new();
    for _ in 0..MAX_PAGES {
        let mut page_query = query.clone();
        if let Some(c) = &cursor {
            page_query.push(("cursor", c.clone()));
        }
        let request = client.get(&url).query(&page_query);
        let body = answer(request, server.token.as_deref(), &url).await?;
        let page = body
            .get(items_key)
            .and_then(Value::as_array)
            .ok_or_else(|| format!("{url} answered without `{items_key}`"))?;
        items.extend(page.iter().cloned());
        cursor = body
            .get("next_cursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if !server.all || cursor.is_none() {
            return Ok(Listing {
                items,
                next_cursor: cursor,
            });
        }
    }
    Err(format!(
        "{url} did not end its list after {MAX_PAGES} pages"
    ))
}

/// Sends a request to a coordinator (with the bearer token, if any) and reads its JSON answer;
/// an error answer becomes the server's `error.message`, as every command that talks to a server
/// reports it.
pub async fn answer(
    request: reqwest::RequestBuilder,
    token: Option<&str>,
    url: &str,
) -> Result<Value, String> {
    let request = match token {
        Some(t) => request.bearer_auth(t),
        None => request,
    };
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("{url} answered {status} without JSON: {e}"))?;
    if !status.is_success() {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no error message");
        return Err(format!("the server answered {status}: {message}"));
    }
    Ok(body)
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("-")
}

fn rate(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .map_or_else(|| "-".to_string(), |r| format!("{:.1}%", r * 100.0))
}

fn score(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .map_or_else(|| "-".to_string(), |s| format!("{s:.3}"))
}

/// The skills as a table: name, latest version, profile, verdict, pass rate, updated.
pub fn skills_table(items: &[Value]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32}  {:<10}  {:<13}  {:<7}  {:>9}  updated",
        "skill", "version", "profile", "verdict", "pass rate"
    );
    for s in items {
        let _ = writeln!(
            out,
            "{:<32}  {:<10}  {:<13}  {:<7}  {:>9}  {}",
            text(s, "/name"),
            text(s, "/latest_version/version"),
            text(s, "/latest_version/profile"),
            text(s, "/verdict"),
            rate(s, "/pass_rate"),
            text(s, "/updated_at"),
        );
    }
    out
}

/// The runs as a table: id, skill and version, kind, status, verdict, score, created.
pub fn runs_table(items: &[Value]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<36}  {:<24}  {:<8}  {:<9}  {:<7}  {:>6}  created",
        "run", "skill@version", "kind", "status", "verdict", "score"
    );
    for r in items {
        let _ = writeln!(
            out,
            "{:<36}  {:<24}  {:<8}  {:<9}  {:<7}  {:>6}  {}",
            text(r, "/run_id"),
            format!("{}@{}", text(r, "/skill"), text(r, "/version")),
            text(r, "/kind"),
            text(r, "/status"),
            text(r, "/verdict"),
            score(r, "/score"),
            text(r, "/created_at"),
        );
    }
    out
}

/// Prints a listing: a table or JSON lines, then how to continue it.
fn print(listing: &Listing, json: bool, table: fn(&[Value]) -> String) {
    if json {
        for item in &listing.items {
            println!("{item}");
        }
    } else {
        print!("{}", table(&listing.items));
    }
    if let Some(c) = &listing.next_cursor {
        eprintln!("more: continue with --cursor {c}");
    }
}

/// The query parameters of `skills list`.
pub fn skills_params(a: &SkillsListArgs) -> Vec<(&'static str, Option<&String>)> {
    vec![
        ("search", a.search.as_ref()),
        ("profile", a.profile.as_ref()),
        ("verdict", a.verdict.as_ref()),
        ("model", a.model.as_ref()),
        ("sort", a.sort.as_ref()),
        ("order", a.order.as_ref()),
    ]
}

/// The query parameters of `runs list`.
pub fn runs_params(a: &RunsListArgs) -> Vec<(&'static str, Option<&String>)> {
    vec![
        ("skill", a.skill.as_ref()),
        ("version", a.version.as_ref()),
        ("status", a.status.as_ref()),
        ("kind", a.kind.as_ref()),
        ("verdict", a.verdict.as_ref()),
        ("created_after", a.created_after.as_ref()),
        ("created_before", a.created_before.as_ref()),
        ("sort", a.sort.as_ref()),
        ("order", a.order.as_ref()),
    ]
}

/// Runs `skills <command>`; returns the exit code.
pub async fn skills(args: &SkillsArgs) -> u8 {
    let SkillsCommand::List(a) = &args.command;
    match fetch(&a.server, "/v1/skills", "skills", &skills_params(a)).await {
        Ok(listing) => {
            print(&listing, a.server.json, skills_table);
            EXIT_PASS
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

/// Runs `runs <command>`; returns the exit code.
pub async fn runs(args: &RunsArgs) -> u8 {
    let RunsCommand::List(a) = &args.command;
    match fetch(&a.server, "/v1/runs", "runs", &runs_params(a)).await {
        Ok(listing) => {
            print(&listing, a.server.json, runs_table);
            EXIT_PASS
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
