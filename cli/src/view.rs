//! `skilleval view [DIR]`: the run pages of a skill's local runs (`eval/runs/<run-id>/
//! report.json`), served on 127.0.0.1 with no services: a list of the runs, and each run's
//! page, rendered by the same code as the coordinator's run page and `report.html`
//! (`skilleval_reports::html`), with its stylesheet and script served beside it so the
//! Content-Security-Policy forbids inline script.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use clap::Args;
use skilleval_analysis::quality::render::html_escape;
use skilleval_reports::html::{report_page, Assets, REPORT_SCRIPT, STYLE};
use skilleval_reports::{EvaluationReport, ReportContext};

use crate::EXIT_BAD_INPUT;

#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    /// A skill folder (its `eval/runs/`), an `eval/` folder, or a folder of runs.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The port on 127.0.0.1 (0: any free port, printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src data:; \
                   form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// The folder holding the run folders.
pub fn runs_dir(dir: &Path) -> PathBuf {
    for candidate in [dir.join("eval/runs"), dir.join("runs")] {
        if candidate.is_dir() {
            return candidate;
        }
    }
    dir.to_path_buf()
}

/// Serves until interrupted.
pub async fn view(args: &ViewArgs) -> u8 {
    let runs = runs_dir(&args.dir);
    if !runs.is_dir() {
        eprintln!(
            "error: {} is not a folder of runs (eval/runs/<run-id>/)",
            runs.display()
        );
        return EXIT_BAD_INPUT;
    }
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", args.port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: cannot listen on 127.0.0.1:{}: {e}", args.port);
            return EXIT_BAD_INPUT;
        }
    };
    match listener.local_addr() {
        Ok(addr) => eprintln!(
            "serving the runs in {} on http://{addr}/ (ctrl-c stops)",
            runs.display()
        ),
        Err(e) => eprintln!("serving the runs in {} ({e})", runs.display()),
    }
    let serve = axum::serve(listener, router(runs)).with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    match serve.await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: serving: {e}");
            EXIT_BAD_INPUT
        }
    }
}

/// The pages over `runs` (a folder of run folders).
pub fn router(runs: PathBuf) -> Router {
    Router::new()
        .route("/", get(list))
        .route("/runs/{id}", get(run_page))
        .route(
            "/static/style.css",
            get(|| async { asset(STYLE, "text/css; charset=utf-8") }),
        )
        .route(
            "/static/report.js",
            get(|| async { asset(REPORT_SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .layer(axum::middleware::from_fn(
            |request: axum::extract::Request, next: axum::middleware::Next| async move {
                let mut response = next.run(request).await;
                response.headers_mut().insert(
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static(CSP),
                );
                response
            },
        ))
        .with_state(Arc::new(runs))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// A run folder's `report.json`, when it has a readable one.
fn read_report(dir: &Path) -> Option<EvaluationReport> {
    let text = std::fs::read_to_string(dir.join("report.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// What the run list shows of a `report.json` (named as `EvaluationReport` writes them): read
/// as a stream, everything else (the results) skipped without being kept.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    task: ListedTask,
    verdict: String,
    run_summary: ListedSummary,
    created_at: chrono::DateTime<chrono::Utc>,
}

#[derive(serde::Deserialize)]
struct ListedTask {
    name: String,
}

#[derive(serde::Deserialize)]
struct ListedSummary {
    pass_rate: f64,
}

/// The run folders under `runs` with a readable `report.json`, newest first.
fn listed_runs(runs: &Path) -> Vec<(String, Listed)> {
    let mut rows: Vec<(String, Listed)> = std::fs::read_dir(runs)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| {
                    let file = std::fs::File::open(e.path().join("report.json")).ok()?;
                    let listed: Listed =
                        serde_json::from_reader(std::io::BufReader::new(file)).ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), listed))
                })
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1.created_at));
    rows
}

async fn list(State(runs): State<Arc<PathBuf>>) -> Html<String> {
    let rows = tokio::task::spawn_blocking(move || listed_runs(&runs))
        .await
        .unwrap_or_default();
    // Escaped by hand: a list of links is all this page is (the run page uses the shared
    // renderer, which escapes through maud).
    let mut body = String::from(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>skilleval runs</title>\
         <link rel=\"icon\" href=\"data:,\"><link rel=\"stylesheet\" href=\"/static/style.css\"></head>\
         <body><header><h1>skilleval · local runs</h1></header><main><table id=\"runs\">\
         <tr><th>run</th><th>skill</th><th>verdict</th><th>pass rate</th><th>created</th></tr>",
    );
    for (name, r) in &rows {
        body.push_str(&format!(
            "<tr><td><a href=\"/runs/{0}\">{0}</a></td><td>{1}</td><td class=\"verdict {2}\">{2}</td><td>{3:.1} %</td><td>{4}</td></tr>",
            html_escape(name),
            html_escape(&r.task.name),
            html_escape(&r.verdict),
            r.run_summary.pass_rate * 100.0,
            r.created_at.to_rfc3339(),
        ));
    }
    if rows.is_empty() {
        body.push_str("<tr><td colspan=\"5\">No runs with a report.json here yet.</td></tr>");
    }
    body.push_str("</table></main></body></html>");
    Html(body)
}

async fn run_page(State(runs): State<Arc<PathBuf>>, UrlPath(id): UrlPath<String>) -> Response {
    // Only a run id names a folder: nothing else of the disk is reachable.
    let Ok(run_id) = uuid::Uuid::parse_str(&id) else {
        return (StatusCode::NOT_FOUND, "no such run").into_response();
    };
    let Some(report) = read_report(&runs.join(run_id.to_string())) else {
        return (
            StatusCode::NOT_FOUND,
            "no such run (or its report.json does not read)",
        )
            .into_response();
    };
    let ctx = ReportContext {
        run_id,
        skill_name: &report.task.name,
        skill_description: &report.task.description,
        version: report.task.version.as_deref(),
        profile: &report.task.profile,
        package_hash: &report.task.package_hash,
        created_at: report.created_at,
        results: &report.results,
        summary: &report.run_summary,
        risk: report.risk.as_ref(),
    };
    Html(report_page(
        &ctx,
        Assets::Linked { prefix: "/static/" },
        Some("/"),
    ))
    .into_response()
}
