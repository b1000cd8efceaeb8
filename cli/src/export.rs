//! skill-creator's files of a stored run, and reviews written in its viewer sent back.
//!
//! - `skilleval export --skill-creator RUN_DIR OUT`: a local run (`eval/runs/<run-id>`, as
//!   `skilleval run` left it) written to `OUT` as one skill-creator iteration folder
//!   ([`skilleval_reports::skill_creator`]), the same files `run` writes into the run's own
//!   folder; with `--server URL`, `RUN_DIR` is a run id of that server and the folder comes
//!   from `GET /v1/runs/{id}/workspace`.
//! - `skilleval feedback push FEEDBACK.json --run ID --server URL`: the `feedback.json` of
//!   skill-creator's viewer (or the server's own) posted to `POST /v1/runs/{id}/reviews`,
//!   which turns each entry into a review of the case's grade.
//!
//! Exit codes: 0 done, 2 bad input (not a run folder, `OUT` not empty, the server's refusal).

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::Value;
use skilleval_analysis::benchmark::BenchmarkMetadata;
use skilleval_reports::artifacts;
use skilleval_reports::skill_creator::{workspace, write_workspace};

use crate::{EXIT_BAD_INPUT, EXIT_PASS};

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// Write skill-creator's iteration folder (the only export there is; required so that the
    /// command says what it writes).
    #[arg(long, required = true)]
    pub skill_creator: bool,
    /// A local run folder (`eval/runs/<run-id>`), or with --server a run id.
    pub run: String,
    /// The folder to write (created; must be empty if it exists).
    pub out: PathBuf,
    /// Export a run stored on this skilleval server (RUN is its id).
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: Option<String>,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct FeedbackArgs {
    #[command(subcommand)]
    pub command: FeedbackCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum FeedbackCommand {
    /// Send a feedback.json (skill-creator's viewer's) to a server as reviews of a run.
    Push(FeedbackPushArgs),
}

#[derive(Debug, Clone, Args)]
pub struct FeedbackPushArgs {
    /// The feedback.json file.
    pub file: PathBuf,
    /// The run the feedback is about (the run whose workspace the viewer showed).
    #[arg(long)]
    pub run: String,
    /// Who reviewed, for entries that do not say.
    #[arg(long, default_value = "")]
    pub reviewer: String,
    /// The coordinator's base URL, e.g. http://localhost:8080.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Runs `skilleval export`; returns the exit code.
pub async fn export(args: &ExportArgs) -> u8 {
    match export_steps(args).await {
        Ok(written) => {
            println!("wrote {written} file(s) to {}", args.out.display());
            println!(
                "skill-creator reads it as an iteration folder: python -m scripts.aggregate_benchmark {} \
                 (from skill-creator's folder), or eval-viewer/generate_review.py {} --benchmark {}",
                args.out.display(),
                args.out.display(),
                args.out.join("benchmark.json").display()
            );
            EXIT_PASS
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

/// `OUT` must be new or empty: an iteration folder holds one run.
fn check_out(out: &Path) -> Result<(), String> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(format!(
                "{} is not empty: export writes one run per folder",
                out.display()
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot read {}: {e}", out.display())),
    }
}

async fn export_steps(args: &ExportArgs) -> Result<usize, String> {
    check_out(&args.out)?;
    match &args.server {
        Some(server) => export_from_server(server, args).await,
        None => export_local(Path::new(&args.run), &args.out),
    }
}

/// A local run folder to `out`.
fn export_local(run_dir: &Path, out: &Path) -> Result<usize, String> {
    let (record, results) = artifacts::read_run_attempts(run_dir).map_err(|e| {
        format!(
            "{} is not a run folder skilleval wrote: {e}",
            run_dir.display()
        )
    })?;
    // Runs recorded before the skill's path was kept: the skill folder holding eval/runs/.
    let skill_path = record.skill_path.clone().unwrap_or_else(|| {
        run_dir.ancestors().nth(3).map_or_else(
            || run_dir.display().to_string(),
            |p| p.display().to_string(),
        )
    });
    let meta = BenchmarkMetadata::of(
        &record.skill_name,
        &skill_path,
        &record
            .timestamp
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        &results,
    );
    let files = workspace(&results, &record.inputs, &meta, &[]);
    write_workspace(out, &files).map_err(|e| e.to_string())?;
    Ok(files.len())
}

fn client_request(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    req
}

/// The server's error body in one line.
async fn refusal(response: reqwest::Response) -> String {
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    let message = body
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or("no error message");
    format!("the server answered {status}: {message}")
}

/// A run of a server to `out`: its workspace ZIP, unpacked (entries that would leave `out`
/// are refused).
async fn export_from_server(server: &str, args: &ExportArgs) -> Result<usize, String> {
    let url = format!(
        "{}/v1/runs/{}/workspace",
        server.trim_end_matches('/'),
        args.run
    );
    let response = client_request(reqwest::Method::GET, &url, args.token.as_deref())
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(refusal(response).await);
    }
    let bytes = response.bytes().await.map_err(|e| format!("{url}: {e}"))?;
    unzip(&bytes, &args.out)
}

fn unzip(bytes: &[u8], out: &Path) -> Result<usize, String> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| format!("the server's answer is not a ZIP: {e}"))?;
    let mut written = 0;
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| format!("entry {i} of the ZIP: {e}"))?;
        let name = entry
            .name()
            .map_or_else(|_| format!("entry {i}"), |n| n.to_string());
        let Some(rel) = entry.enclosed_name() else {
            return Err(format!(
                "the ZIP entry `{name}` would leave {}",
                out.display()
            ));
        };
        if entry.is_dir() {
            continue;
        }
        let path = out.join(rel);
        let mut content = Vec::new();
        entry
            .read_to_end(&mut content)
            .map_err(|e| format!("reading `{name}` of the ZIP: {e}"))?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, content).map_err(|e| format!("writing {}: {e}", path.display()))?;
        written += 1;
    }
    Ok(written)
}

/// Runs `skilleval feedback push`; returns the exit code.
pub async fn feedback(args: &FeedbackArgs) -> u8 {
    let FeedbackCommand::Push(push) = &args.command;
    match push_feedback(push).await {
        Ok(answer) => {
            println!(
                "stored {} review(s) on run {}",
                answer["stored"].as_u64().unwrap_or(0),
                push.run
            );
            for i in answer["ignored"].as_array().into_iter().flatten() {
                println!(
                    "  not imported: {}: {}",
                    i["run_id"].as_str().unwrap_or(""),
                    i["reason"].as_str().unwrap_or("")
                );
            }
            EXIT_PASS
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

async fn push_feedback(args: &FeedbackPushArgs) -> Result<Value, String> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let mut body: Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not JSON: {e}", args.file.display()))?;
    if !body.get("reviews").is_some_and(Value::is_array) {
        return Err(format!(
            "{} is not a feedback.json: it has no `reviews` list",
            args.file.display()
        ));
    }
    if !args.reviewer.is_empty() {
        body["reviewer"] = Value::String(args.reviewer.clone());
    }
    let url = format!(
        "{}/v1/runs/{}/reviews",
        args.server.trim_end_matches('/'),
        args.run
    );
    let response = client_request(reqwest::Method::POST, &url, args.token.as_deref())
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        return Err(refusal(response).await);
    }
    response.json().await.map_err(|e| format!("{url}: {e}"))
}
