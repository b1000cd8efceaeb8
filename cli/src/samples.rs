//! `skilleval samples push FILE.jsonl --server URL --skill NAME`: send a JSON Lines log of
//! production samples to a skilleval server, in batches.
//!
//! Lines are sent as they are (the server validates each item and answers per item); a line
//! that is not JSON is reported locally with its line number and not sent. A batch is cut at
//! `--batch-size` items or 4 MB, under the server's default limits (1,000 items, 5 MB). A
//! batch the server did not answer (a connection error, 408, 429, 5xx) is sent again, the same
//! items with the same `sample_id`s, with exponential backoff: the server counts what it had
//! already stored as duplicates, so a retry never grades anything twice. The summary adds up
//! the server's answers; item errors are printed with their line numbers.
//!
//! Exit codes: 0 every line was delivered and accepted or a duplicate, 1 some lines were
//! refused (not JSON, or an invalid sample), 2 the file or the server could not be used
//! (unknown skill, no monitor, unreachable after the retries).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Deserialize;
use serde_json::Value;

use crate::{EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS};

/// Largest batch body the client builds (under the server's default 5 MB).
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

#[derive(Debug, Clone, Args)]
pub struct SamplesArgs {
    #[command(subcommand)]
    pub command: SamplesCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum SamplesCommand {
    /// Send a JSONL log of production samples to a server (batches, retries, a summary).
    Push(PushArgs),
}

#[derive(Debug, Clone, Args)]
pub struct PushArgs {
    /// The log: one sample per line (`{sample_id, input, output, ...}`).
    pub file: PathBuf,
    /// The coordinator's base URL, e.g. http://localhost:8080.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: String,
    /// The skill the samples belong to.
    #[arg(long)]
    pub skill: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Samples per request (at most the server's `max_batch_samples`, 1,000 by default).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub batch_size: u32,
    /// Attempts per batch when the server does not answer (the first included).
    #[arg(long, default_value_t = 6)]
    pub attempts: u32,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// What the server answered for one batch (the fields the summary adds up).
#[derive(Debug, Default, Clone, Deserialize)]
struct BatchAnswer {
    #[serde(default)]
    accepted: u64,
    #[serde(default)]
    sampled: u64,
    #[serde(default)]
    duplicates: u64,
    #[serde(default)]
    dropped_unsampled: u64,
    #[serde(default)]
    dropped_filtered: u64,
    #[serde(default)]
    dropped_over_hourly_cap: u64,
    #[serde(default)]
    dropped_over_daily_cost: u64,
    #[serde(default)]
    errors: Vec<ItemError>,
}

#[derive(Debug, Clone, Deserialize)]
struct ItemError {
    index: usize,
    #[serde(default)]
    pointer: String,
    message: String,
}

/// The whole push, added up.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PushSummary {
    pub lines: u64,
    pub batches: u64,
    /// Batches sent again after no answer.
    pub retries: u64,
    pub accepted: u64,
    pub sampled: u64,
    pub duplicates: u64,
    /// Not graded: unsampled, filtered, or over a cap.
    pub dropped: u64,
    /// `line N: message` for every refused line.
    pub errors: Vec<String>,
}

/// Runs `samples <command>`; returns the exit code.
pub async fn samples(args: &SamplesArgs) -> u8 {
    match &args.command {
        SamplesCommand::Push(push_args) => match push(push_args).await {
            Ok(summary) => {
                print_summary(&summary);
                if summary.errors.is_empty() {
                    EXIT_PASS
                } else {
                    EXIT_FAIL
                }
            }
            Err(message) => {
                eprintln!("error: {message}");
                EXIT_BAD_INPUT
            }
        },
    }
}

fn print_summary(s: &PushSummary) {
    for e in &s.errors {
        eprintln!("{e}");
    }
    println!(
        "{} lines in {} batches ({} retried): {} accepted ({} sampled, {} not graded), {} duplicates, {} errors",
        s.lines,
        s.batches,
        s.retries,
        s.accepted,
        s.sampled,
        s.dropped,
        s.duplicates,
        s.errors.len()
    );
}

/// One batch: the items and the line number (1-based) of each.
struct Batch {
    items: Vec<Value>,
    lines: Vec<usize>,
}

/// Reads the log, cuts it into batches, sends each (retrying with the same items), and adds
/// up the answers.
pub async fn push(args: &PushArgs) -> Result<PushSummary, String> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let mut summary = PushSummary::default();
    let mut batches = Vec::new();
    let mut current = Batch {
        items: Vec::new(),
        lines: Vec::new(),
    };
    let mut bytes = 0;
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        summary.lines += 1;
        let item: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                summary
                    .errors
                    .push(format!("line {}: not JSON: {e}", i + 1));
                continue;
            }
        };
        if !current.items.is_empty()
            && (current.items.len() >= args.batch_size as usize
                || bytes + line.len() > MAX_BATCH_BYTES)
        {
            batches.push(std::mem::replace(
                &mut current,
                Batch {
                    items: Vec::new(),
                    lines: Vec::new(),
                },
            ));
            bytes = 0;
        }
        bytes += line.len() + 1;
        current.items.push(item);
        current.lines.push(i + 1);
    }
    if !current.items.is_empty() {
        batches.push(current);
    }

    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .user_agent(concat!("skilleval-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let url = format!(
        "{}/v1/skills/{}/samples",
        args.server.trim_end_matches('/'),
        url_segment(&args.skill)
    );
    let total: u64 = batches.iter().map(|b| b.items.len() as u64).sum();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:30} {pos}/{len} samples sent {msg} [{elapsed}]")
        {
            bar.set_style(style);
        }
        bar
    };
    for batch in &batches {
        let (answer, retries) = send(&client, &url, args, &batch.items).await?;
        summary.batches += 1;
        summary.retries += retries;
        summary.accepted += answer.accepted;
        summary.sampled += answer.sampled;
        summary.duplicates += answer.duplicates;
        summary.dropped += answer.dropped_unsampled
            + answer.dropped_filtered
            + answer.dropped_over_hourly_cap
            + answer.dropped_over_daily_cost;
        for e in &answer.errors {
            let line = batch.lines.get(e.index).copied().unwrap_or(0);
            summary
                .errors
                .push(format!("line {line}: {}: {}", e.pointer, e.message));
        }
        bar.inc(batch.items.len() as u64);
        bar.set_message(format!("({} accepted)", summary.accepted));
    }
    bar.finish_and_clear();
    Ok(summary)
}

/// The skill name as one path segment.
fn url_segment(s: &str) -> String {
    // Skill names are kebab-case, but a name the server does not know is still its 404 to
    // give, not a malformed URL: percent-encode everything outside the unreserved set.
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether an HTTP status means "no answer for this batch yet": send it again.
fn retryable(status: reqwest::StatusCode) -> bool {
    status.is_server_error()
        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
        || status == reqwest::StatusCode::REQUEST_TIMEOUT
}

/// Sends one batch, again and again (the same items) while the server gives no answer;
/// returns the answer and how many times it was re-sent.
async fn send(
    client: &reqwest::Client,
    url: &str,
    args: &PushArgs,
    items: &[Value],
) -> Result<(BatchAnswer, u64), String> {
    let mut last = String::new();
    let attempts = args.attempts.max(1);
    for attempt in 1..=attempts {
        if attempt > 1 {
            // 0.5 s, 1 s, 2 s, ... capped at 30 s.
            let wait = Duration::from_millis(500u64.saturating_mul(1 << (attempt - 2).min(6)));
            tokio::time::sleep(wait.min(Duration::from_secs(30))).await;
        }
        let mut request = client.post(url).json(items);
        if let Some(token) = &args.token {
            request = request.bearer_auth(token);
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if status.is_success() {
                    let answer = serde_json::from_value(body)
                        .map_err(|e| format!("unexpected answer from the server: {e}"))?;
                    return Ok((answer, u64::from(attempt - 1)));
                }
                let message = body["error"]["message"]
                    .as_str()
                    .map_or_else(|| status.to_string(), str::to_string);
                if !retryable(status) {
                    return Err(format!("the server answered {status}: {message}"));
                }
                last = format!("{status}: {message}");
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(format!(
        "no answer for a batch after {attempts} attempts: {last}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_answers_that_are_not_final_are_retried() {
        assert!(retryable(reqwest::StatusCode::SERVICE_UNAVAILABLE));
        assert!(retryable(reqwest::StatusCode::TOO_MANY_REQUESTS));
        assert!(!retryable(reqwest::StatusCode::NOT_FOUND));
        assert!(!retryable(reqwest::StatusCode::CONFLICT));
        assert!(!retryable(reqwest::StatusCode::PAYLOAD_TOO_LARGE));
    }

    #[test]
    fn a_skill_name_is_one_path_segment() {
        assert_eq!(url_segment("refund-triage"), "refund-triage");
        assert_eq!(url_segment("a/b c"), "a%2Fb%20c");
    }
}
