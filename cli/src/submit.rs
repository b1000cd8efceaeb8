//! `skilleval submit PATH --server URL [--wait]`: hand a skill to a skilleval server.
//!
//! A folder is zipped in memory (skipping what the package loader skips: VCS and build folders,
//! the CLI's own run files); a `.zip` is sent as is. The server validates it: a refused or
//! invalid package comes back as 422 and every problem is printed, one per line. Otherwise the
//! run id is printed on stdout and, with `--wait`, the run is polled (with a progress bar on
//! stderr) until it finishes, then its Markdown report is printed.
//!
//! Exit codes: 0 the verdict is `pass` (or the run was queued, without `--wait`), 1 the verdict
//! is `fail` (or the run was cancelled), 2 bad input (a bad package, a bad flag, an unreachable
//! or unexpected server).
//!
//! The module depends on nothing else in the crate so it can be reused as is.

use std::io::{Cursor, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

/// The verdict is `pass`.
const EXIT_PASS: u8 = 0;
/// The verdict is `fail`.
const EXIT_FAIL: u8 = 1;
/// Bad input, or the server could not be used.
const EXIT_BAD_INPUT: u8 = 2;

/// Folder names never uploaded, at any depth (as the package loader skips them).
const SKIPPED_DIRS: &[&str] = &[".git", "target", "node_modules", "__pycache__", "__MACOSX"];
/// File names never uploaded.
const SKIPPED_FILES: &[&str] = &[".DS_Store"];
/// Package-relative paths never uploaded (the CLI's own run files).
const SKIPPED_PATHS: &[&str] = &[
    "eval/runs",
    "eval/benchmark.json",
    "eval/version-history.json",
];

#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    /// The skill: a folder with SKILL.md, or a ZIP of one.
    pub path: PathBuf,
    /// The coordinator's base URL, e.g. http://localhost:8080.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: String,
    /// Wait for the run to finish, print its report and exit by its verdict.
    #[arg(long)]
    pub wait: bool,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Give up waiting after this many seconds (exit 2).
    #[arg(long, default_value_t = 3600)]
    pub timeout_secs: u64,
    /// Seconds between polls while waiting.
    #[arg(long, default_value_t = 1.0)]
    pub poll_secs: f64,
    /// Hide the progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// Uploads the skill and, with `--wait`, follows its run; returns the exit code.
pub async fn submit(args: &SubmitArgs) -> u8 {
    match submit_inner(args).await {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            EXIT_BAD_INPUT
        }
    }
}

async fn submit_inner(args: &SubmitArgs) -> Result<u8, String> {
    let zip = package_bytes(&args.path)?;
    let base = args.server.trim_end_matches('/').to_string();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .user_agent(concat!("skilleval-cli/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let auth = |req: reqwest::RequestBuilder| match &args.token {
        Some(token) => req.bearer_auth(token),
        None => req,
    };

    let response = auth(client.post(format!("{base}/v1/skills")))
        .header(reqwest::header::CONTENT_TYPE, "application/zip")
        .body(zip)
        .send()
        .await
        .map_err(|e| format!("cannot reach {base}: {e}"))?;
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status.as_u16() == 422 {
        print_problems(&args.path, &body);
        return Ok(EXIT_BAD_INPUT);
    }
    if !status.is_success() {
        return Err(format!(
            "the server answered {status}: {}",
            error_message(&body)
        ));
    }
    for warning in body["warnings"].as_array().into_iter().flatten() {
        eprintln!("{}", problem_line(warning));
    }
    let Some(run_id) = body["run_id"].as_str().map(str::to_string) else {
        return Err("the server stored the skill but started no run".into());
    };
    eprintln!(
        "uploaded {} version {} ({} test cases)",
        body["name"].as_str().unwrap_or("?"),
        body["version"].as_str().unwrap_or("?"),
        body["test_cases"].as_u64().unwrap_or(0)
    );
    println!("{run_id}");
    if !args.wait {
        return Ok(EXIT_PASS);
    }

    let run = wait_for_run(&client, &auth, &base, &run_id, args).await?;
    let report = auth(client.get(format!("{base}/v1/runs/{run_id}/report?format=markdown")))
        .send()
        .await
        .map_err(|e| format!("cannot fetch the report: {e}"))?;
    if report.status().is_success() {
        let text = report
            .text()
            .await
            .map_err(|e| format!("cannot read the report: {e}"))?;
        println!("{text}");
    } else {
        eprintln!("warning: the report is not available ({})", report.status());
    }
    let verdict = run["verdict"].as_str().unwrap_or_default();
    let status = run["status"].as_str().unwrap_or_default();
    eprintln!(
        "run {run_id}: {status}, verdict {}",
        if verdict.is_empty() { "none" } else { verdict }
    );
    Ok(if status == "completed" && verdict == "pass" {
        EXIT_PASS
    } else {
        EXIT_FAIL
    })
}

/// Polls the run until it is finalised (it has a verdict) or the timeout passes.
async fn wait_for_run(
    client: &reqwest::Client,
    auth: &impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    base: &str,
    run_id: &str,
    args: &SubmitArgs,
) -> Result<Value, String> {
    let bar = ProgressBar::new(0);
    if args.quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} cases {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let poll = Duration::from_secs_f64(args.poll_secs.clamp(0.05, 60.0));
    loop {
        let response = auth(client.get(format!("{base}/v1/runs/{run_id}")))
            .send()
            .await
            .map_err(|e| format!("cannot poll the run: {e}"))?;
        let status = response.status();
        let run: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bar.abandon();
            return Err(format!(
                "polling the run: {status}: {}",
                error_message(&run)
            ));
        }
        let counters = &run["counters"];
        bar.set_length(counters["total"].as_u64().unwrap_or(0));
        bar.set_position(counters["completed"].as_u64().unwrap_or(0));
        bar.set_message(format!(
            "({} passed, {} failed, {} errored)",
            counters["passed"].as_u64().unwrap_or(0),
            counters["failed"].as_u64().unwrap_or(0),
            counters["errored"].as_u64().unwrap_or(0)
        ));
        if !run["verdict"].is_null() || run["finished_at"].is_string() {
            bar.finish();
            return Ok(run);
        }
        if Instant::now() >= deadline {
            bar.abandon();
            return Err(format!(
                "the run did not finish within {}s (--timeout-secs; raise it to wait longer)",
                args.timeout_secs
            ));
        }
        tokio::time::sleep(poll).await;
    }
}

fn error_message(body: &Value) -> String {
    body["error"]["message"]
        .as_str()
        .map_or_else(|| body.to_string(), str::to_string)
}

/// One problem as `severity: file#pointer: message`, on one line (multi-line messages, such as
/// a regex parser's, are joined).
fn problem_line(p: &Value) -> String {
    let message = p["message"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "{}: {}#{}: {}",
        p["severity"].as_str().unwrap_or("error"),
        p["file"].as_str().unwrap_or_default(),
        p["pointer"].as_str().unwrap_or_default(),
        message
    )
}

fn print_problems(path: &Path, body: &Value) {
    let problems = body["error"]["details"]["problems"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if problems.is_empty() {
        eprintln!("{}: {}", path.display(), error_message(body));
        return;
    }
    let what = match body["error"]["code"].as_str() {
        Some("package_refused") => "refused",
        _ => "invalid",
    };
    eprintln!("{}: the server found the package {what}:", path.display());
    for p in &problems {
        eprintln!("{}", problem_line(p));
    }
}

/// The bytes to upload: a ZIP file as is, a folder zipped.
pub fn package_bytes(path: &Path) -> Result<Vec<u8>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        zip_folder(path)
    } else {
        std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

fn is_skipped(rel: &str) -> bool {
    SKIPPED_PATHS
        .iter()
        .any(|p| rel == *p || rel.starts_with(&format!("{p}/")))
        || rel
            .rsplit('/')
            .next()
            .is_some_and(|name| SKIPPED_FILES.contains(&name))
        || rel
            .split('/')
            .any(|segment| SKIPPED_DIRS.contains(&segment))
}

/// Zips a folder in memory, paths relative to it with `/` separators, in a stable order.
/// Symbolic links are not followed (the server refuses them; say so here first).
pub fn zip_folder(root: &Path) -> Result<Vec<u8>, String> {
    let mut files = Vec::new();
    collect(root, root, &mut files)?;
    files.sort();
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (rel, full) in files {
        let bytes = std::fs::read(&full).map_err(|e| format!("{}: {e}", full.display()))?;
        writer
            .start_file(rel.as_str(), options)
            .map_err(|e| format!("zipping {rel}: {e}"))?;
        writer
            .write_all(&bytes)
            .map_err(|e| format!("zipping {rel}: {e}"))?;
    }
    let cursor = writer
        .finish()
        .map_err(|e| format!("zipping {}: {e}", root.display()))?;
    Ok(cursor.into_inner())
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = entry.path();
        let rel = path
            .strip_prefix(root)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        if is_skipped(&rel) {
            continue;
        }
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_symlink() {
            return Err(format!(
                "{}: symbolic links are not allowed in a skill package (replace it with the file)",
                path.display()
            ));
        } else if kind.is_dir() {
            collect(root, &path, out)?;
        } else if kind.is_file() {
            out.push((rel, path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zips_a_folder_without_local_run_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("SKILL.md"),
            "---\nname: x\ndescription: y\n---\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("eval/runs/r1")).unwrap();
        std::fs::write(dir.path().join("eval/runs/r1/report.md"), "x").unwrap();
        std::fs::write(dir.path().join("eval/tests.json"), "{}").unwrap();
        let bytes = zip_folder(dir.path()).unwrap();
        let archive = zip::ZipArchive::new(Cursor::new(bytes)).unwrap();
        let mut names: Vec<String> = archive
            .file_names()
            .map(|n| n.unwrap().to_string())
            .collect();
        names.sort();
        assert_eq!(names, vec!["SKILL.md", "eval/tests.json"]);
    }

    #[test]
    fn multi_line_messages_print_on_one_line() {
        let p = serde_json::json!({"file": "t.json", "pointer": "/a", "message": "bad regex:\n    ([\n     ^\nunclosed", "severity": "error"});
        assert_eq!(
            problem_line(&p),
            "error: t.json#/a: bad regex: ([ ^ unclosed"
        );
    }

    #[test]
    fn problems_print_one_per_line() {
        let p = serde_json::json!({"file": "eval/tests.json", "pointer": "/testCases/0/id", "message": "duplicate", "severity": "error"});
        assert_eq!(
            problem_line(&p),
            "error: eval/tests.json#/testCases/0/id: duplicate"
        );
    }
}
