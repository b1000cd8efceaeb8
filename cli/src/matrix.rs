//! `skilleval matrix --server URL --skill a --skill b --model m1 --model m2`: a server's model
//! matrix (`POST /v1/matrix`): each skill's latest passing version run against each model (a
//! provider the server's workers are configured with), then, unless `--no-wait`, the matrix
//! polled until every cell is compared with its skill's reference run and printed as a table.
//!
//! Exit codes: 0 no cell got significantly worse (or `--dry-run` / `--no-wait`), 1 some cell
//! did, 2 the server refused the request, could not be used, or the wait timed out.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use crate::lists::answer;
use crate::{EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS};

#[derive(Debug, Clone, Args)]
pub struct MatrixArgs {
    /// The coordinator's base URL, e.g. http://localhost:8080.
    #[arg(long, env = "SKILLEVAL_SERVER")]
    pub server: String,
    /// Bearer token, when the server requires one.
    #[arg(long, env = "SKILLEVAL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A skill by name (repeatable); or --publisher instead.
    #[arg(long = "skill")]
    pub skills: Vec<String>,
    /// Every skill of this publisher instead of --skill.
    #[arg(long, conflicts_with = "skills")]
    pub publisher: Option<String>,
    /// A model: the name of a provider the server's workers are configured with (repeatable).
    #[arg(long = "model", required = true)]
    pub models: Vec<String>,
    /// Refuse to start when the estimate is over this many US dollars; each run gets an equal
    /// share as its own budget.
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
    /// The same bound in tokens.
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<i64>,
    /// Print the estimate; create nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The server answers the matrix this key (per publisher) already created instead of
    /// creating another, completing it if its creation stopped half-way: re-run the same
    /// command safely after a failure.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the matrix id and return once it is created.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 3_600, value_name = "SECS")]
    pub timeout: u64,
    /// Print the server's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The `POST /v1/matrix` body the flags ask for.
pub fn request_body(args: &MatrixArgs) -> Value {
    let mut body = json!({ "models": args.models, "versions": "latest" });
    match &args.publisher {
        Some(p) => body["publisher"] = json!(p),
        None => body["skills"] = json!(args.skills),
    }
    if args.max_cost.is_some() || args.max_tokens.is_some() {
        let mut budget = json!({});
        if let Some(c) = args.max_cost {
            budget["max_cost_usd"] = json!(c);
        }
        if let Some(t) = args.max_tokens {
            budget["max_tokens"] = json!(t);
        }
        body["budget"] = budget;
    }
    if let Some(key) = &args.idempotency_key {
        body["idempotency_key"] = json!(key);
    }
    body
}

/// The matrix as a table: a row per skill, a column per model; each cell the pass rate and the
/// change against the reference run (`WORSE`, `better`, `=`, `…` not compared yet).
pub fn matrix_table(matrix: &Value) -> String {
    let models: Vec<&str> = matrix["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let cells: Vec<&Value> = matrix["cells"].as_array().into_iter().flatten().collect();
    let mut skills: Vec<&str> = Vec::new();
    for c in &cells {
        if let Some(s) = c["skill"].as_str() {
            if !skills.contains(&s) {
                skills.push(s);
            }
        }
    }
    let width = skills.iter().map(|s| s.len()).max().unwrap_or(5).max(5);
    let col = models.iter().map(|m| m.len()).max().unwrap_or(0).max(16);
    let mut out = String::new();
    let _ = write!(out, "{:<width$}", "skill");
    for m in &models {
        let _ = write!(out, "  {m:<col$}");
    }
    out.push('\n');
    for skill in &skills {
        let _ = write!(out, "{skill:<width$}");
        for model in &models {
            let cell = cells
                .iter()
                .find(|c| c["skill"] == *skill && c["model"] == *model);
            let shown = cell.map_or_else(|| "-".to_string(), |c| cell_text(c));
            let _ = write!(out, "  {shown:<col$}");
        }
        out.push('\n');
    }
    out
}

fn cell_text(c: &Value) -> String {
    let rate = c["pass_rate"]
        .as_f64()
        .map_or_else(|| "-".to_string(), |r| format!("{:.0}%", r * 100.0));
    let change = match c["change"].as_str() {
        Some("worse") => "WORSE",
        Some("better") => "better",
        Some("no_change") => "=",
        _ => "…",
    };
    format!("{rate} {change}")
}

/// Whether some cell got significantly worse.
pub fn any_worse(matrix: &Value) -> bool {
    matrix["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["change"] == "worse")
}

pub async fn matrix(args: &MatrixArgs) -> u8 {
    match matrix_inner(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}

async fn matrix_inner(args: &MatrixArgs) -> Result<u8, String> {
    if args.skills.is_empty() && args.publisher.is_none() {
        return Err("give --skill (repeatable) or --publisher".into());
    }
    let base = args.server.trim_end_matches('/');
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/matrix");
    let post = client
        .post(&url)
        .query(&[("dry_run", args.dry_run)])
        .json(&request_body(args));
    let created = answer(post, args.token.as_deref(), &url).await?;
    if args.dry_run {
        if args.json {
            println!("{created}");
        } else {
            let e = &created["estimate"];
            println!(
                "estimate: {} runs, {} tokens, {} USD",
                e["cells"].as_array().map_or(0, Vec::len),
                e["estimated_tokens"],
                e["estimated_cost_usd"]
            );
        }
        return Ok(EXIT_PASS);
    }
    let id = created["matrix_id"]
        .as_str()
        .ok_or_else(|| format!("{url} answered without `matrix_id`"))?
        .to_string();
    let replayed = if created["created"] == false {
        " (created before with this idempotency key)"
    } else {
        ""
    };
    eprintln!("matrix {id}: {} runs{replayed}", created["cells"]);
    if args.no_wait {
        println!("{id}");
        return Ok(EXIT_PASS);
    }
    let get_url = format!("{base}/v1/matrix/{id}");
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let matrix = answer(client.get(&get_url), args.token.as_deref(), &get_url).await?;
        // `completed`: every cell's run finished, and the same answer compared each one.
        if matrix["status"] == "completed" {
            if args.json {
                println!("{matrix}");
            } else {
                print!("{}", matrix_table(&matrix));
            }
            return Ok(if any_worse(&matrix) {
                EXIT_FAIL
            } else {
                EXIT_PASS
            });
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "matrix {id} did not finish within {} s",
                args.timeout
            ));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> MatrixArgs {
        MatrixArgs {
            server: "http://x".into(),
            token: None,
            skills: vec!["a".into(), "b".into()],
            publisher: None,
            models: vec!["m1".into()],
            max_cost: Some(2.5),
            max_tokens: None,
            dry_run: false,
            idempotency_key: None,
            no_wait: false,
            timeout: 1,
            json: false,
        }
    }

    #[test]
    fn the_body_carries_the_skills_models_and_budget() {
        assert_eq!(
            request_body(&args()),
            json!({"skills": ["a", "b"], "models": ["m1"], "versions": "latest",
                   "budget": {"max_cost_usd": 2.5}})
        );
        let by_publisher = MatrixArgs {
            publisher: Some("acme".into()),
            skills: vec![],
            max_cost: None,
            ..args()
        };
        assert_eq!(
            request_body(&by_publisher),
            json!({"publisher": "acme", "models": ["m1"], "versions": "latest"})
        );
        let keyed = MatrixArgs {
            idempotency_key: Some("nightly-1".into()),
            max_cost: None,
            ..args()
        };
        assert_eq!(
            request_body(&keyed),
            json!({"skills": ["a", "b"], "models": ["m1"], "versions": "latest",
                   "idempotency_key": "nightly-1"})
        );
    }

    #[test]
    fn the_table_puts_skills_in_rows_and_models_in_columns() {
        let matrix = json!({
            "models": ["steady", "shaky"],
            "cells": [
                {"skill": "alpha", "model": "steady", "pass_rate": 1.0, "change": "no_change"},
                {"skill": "alpha", "model": "shaky", "pass_rate": 0.25, "change": "worse"},
                {"skill": "beta", "model": "steady", "pass_rate": null, "change": null},
            ]
        });
        let table = matrix_table(&matrix);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(
            lines[0].starts_with("skill")
                && lines[0].contains("steady")
                && lines[0].contains("shaky")
        );
        assert!(
            lines[1].starts_with("alpha")
                && lines[1].contains("100% =")
                && lines[1].contains("25% WORSE"),
            "{table}"
        );
        assert!(
            lines[2].starts_with("beta")
                && lines[2].contains("- …")
                && lines[2].trim_end().ends_with('-'),
            "{table}"
        );
        assert!(any_worse(&matrix));
    }
}
