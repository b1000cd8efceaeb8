//! The web interface in a real headless Chromium (Debian's `chromium` and `chromium-driver`),
//! driven over WebDriver with `fantoccini`, against a coordinator on port 0 with its own
//! database and queues and an in-process worker. Every page visited is checked for console
//! errors (the browser's log: script errors, CSP violations, failed loads), and every test
//! writes screenshots under `$CARGO_TARGET_TMPDIR/ui-screenshots/`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use crate::e2e::start_worker_with;
use crate::helpers::{serve_local, spawn_app_with, AppOptions, TestApp};
use crate::packages::{given_tests, skill_md, zip_of};

const TOKEN: &str = "browser-test-token";

/// chromedriver on a free port, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start_driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver is not installed: run scripts/test.sh, which installs Debian's chromium and chromium-driver");
    let driver = Driver { child, port };
    let client = reqwest::Client::new();
    for _ in 0..300 {
        if client
            .get(format!("http://127.0.0.1:{port}/status"))
            .send()
            .await
            .is_ok()
        {
            return driver;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: chromedriver was not up on port {port} after 30 s");
}

async fn browser(driver: &Driver) -> Client {
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--no-first-run", "--disable-extensions"]
        },
        "goog:loggingPrefs": { "browser": "ALL" }
    }))
    .unwrap();
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session")
}

/// chromedriver's browser log (`POST /session/{id}/se/log`), which holds console messages,
/// uncaught errors, CSP violations and failed resource loads. Reading it empties it.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _request_url: &url::Url) -> (axum::http::Method, Option<String>) {
        (
            axum::http::Method::POST,
            Some(r#"{"type":"browser"}"#.to_string()),
        )
    }
}

/// Fails the test when the page logged an error (SEVERE) since the last check.
async fn assert_no_console_errors(c: &Client, page: &str) {
    let log = c.issue_cmd(BrowserLog).await.expect("read the browser log");
    let severe: Vec<&Value> = log
        .as_array()
        .map(|entries| entries.iter().filter(|e| e["level"] == "SEVERE").collect())
        .unwrap_or_default();
    assert!(severe.is_empty(), "console errors on {page}: {severe:?}");
}

fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).unwrap();
}

async fn text_of(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Waits (at most `secs`) until the element's text satisfies `ok`.
async fn wait_text(c: &Client, css: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..secs * 10 {
        if let Ok(el) = c.find(Locator::Css(css)).await {
            last = el.text().await.unwrap_or_default();
            if ok(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = c.issue_cmd(BrowserLog).await.unwrap_or_default();
    panic!("`{css}` never satisfied the condition; last text: {last:?}; browser log: {log}");
}

async fn sign_in(c: &Client, app: &TestApp) {
    c.goto(&format!("{}/ui/", app.address)).await.unwrap();
    // Not signed in: the pages send the browser to the sign-in form.
    assert!(c.current_url().await.unwrap().path().ends_with("/ui/login"));
    c.find(Locator::Css("input[name=token]"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    c.find(Locator::Css("#login button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("header nav"))
        .await
        .unwrap();
    assert_eq!(c.current_url().await.unwrap().path(), "/ui/");
    assert_no_console_errors(c, "sign-in").await;
}

async fn app_with_worker() -> (
    TestApp,
    tempfile::TempDir,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let app = spawn_app_with(AppOptions {
        background: true,
        sweep_interval_secs: 1,
        auth_tokens: vec![TOKEN.to_string()],
        ..AppOptions::default()
    })
    .await;
    let cache = tempfile::tempdir().unwrap();
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    (app, cache, stop, worker)
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A package with exactly two problems: a duplicate case id and a bad regular expression.
fn two_problem_package() -> Vec<u8> {
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "testCases": [
            { "id": "a", "name": "A", "input": {"prompt": "x"}, "expected": {"output": "y"},
              "evaluation": {"strategy": "exact_match"} },
            { "id": "a", "name": "A again", "input": {"prompt": "x"}, "expected": {"output": "y"},
              "evaluation": {"strategy": "exact_match"} },
            { "id": "b", "name": "B", "input": {"prompt": "x"},
              "expected": {"patterns": ["([unclosed"]}, "evaluation": {"strategy": "regex_match"} }
        ]
    });
    zip_of(&[
        ("SKILL.md", skill_md("two-problems").as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
    ])
}

#[tokio::test]
async fn browser_upload_lists_problems_then_follows_the_calculator_live_to_its_verdict() {
    let (app, _cache, stop, worker) = Box::pin(app_with_worker()).await;
    let driver = start_driver().await;
    let c = browser(&driver).await;
    let files = tempfile::tempdir().unwrap();
    sign_in(&c, &app).await;

    // Two problems, both listed with their file and pointer; nothing stored.
    let broken = write_temp(files.path(), "broken.zip", &two_problem_package());
    c.goto(&format!("{}/ui/upload", app.address)).await.unwrap();
    c.find(Locator::Css("#package-file"))
        .await
        .unwrap()
        .send_keys(broken.to_str().unwrap())
        .await
        .unwrap();
    wait_text(&c, "#validation-status", 20, |t| t.contains("problem")).await;
    let problems = c
        .find_all(Locator::Css("#problems li.error"))
        .await
        .unwrap();
    let mut texts = Vec::new();
    for p in &problems {
        texts.push(p.text().await.unwrap());
    }
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(
        texts
            .iter()
            .any(|t| t.contains("eval/tests.json#/testCases/1")),
        "{texts:?}"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.contains("eval/tests.json#/testCases/2/expected/patterns/0")),
        "{texts:?}"
    );
    // Each problem once: the status line counts them and repeats none.
    let status = text_of(&c, "#validation-status").await;
    assert!(status.starts_with("2 problem(s) to fix"), "{status}");
    assert!(!status.contains("unclosed"), "{status}");
    // The regex error keeps its lines: the pattern, then the caret under it.
    let message = c
        .find(Locator::Css("#problems li.error:last-child .message"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lines: Vec<&str> = message.lines().collect();
    let pattern_line = lines
        .iter()
        .position(|l| l.contains("([unclosed"))
        .unwrap_or_else(|| panic!("{message}"));
    assert!(
        lines.get(pattern_line + 1).is_some_and(|l| l.trim() == "^"),
        "{message}"
    );
    assert_eq!(
        c.find(Locator::Css("#start-run"))
            .await
            .unwrap()
            .prop("disabled")
            .await
            .unwrap()
            .as_deref(),
        Some("true")
    );
    assert_eq!(app.count("skills").await, 0, "validation stores nothing");
    screenshot(&c, "upload-two-problems").await;
    assert_no_console_errors(&c, "upload (invalid)").await;

    // The calculator: valid, stored, run, followed live without a reload.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills/calculator");
    let zip = skilleval_cli::submit::zip_folder(&example).unwrap();
    let calculator = write_temp(files.path(), "calculator.zip", &zip);
    c.goto(&format!("{}/ui/upload", app.address)).await.unwrap();
    c.find(Locator::Css("#package-file"))
        .await
        .unwrap()
        .send_keys(calculator.to_str().unwrap())
        .await
        .unwrap();
    wait_text(&c, "#validation-status", 20, |t| t.starts_with("Valid")).await;
    c.execute("window.__samePage = true;", vec![])
        .await
        .unwrap();
    c.find(Locator::Css("#start-run"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let verdict = wait_text(&c, "#live-verdict", 60, |t| t.starts_with("Verdict:")).await;
    assert!(
        verdict == "Verdict: pass" || verdict == "Verdict: fail",
        "{verdict}"
    );
    // Followed in place: the page was never reloaded.
    assert_eq!(
        c.execute("return window.__samePage === true;", vec![])
            .await
            .unwrap(),
        json!(true)
    );
    let done = text_of(&c, "#run-completed").await;
    assert_eq!(done, text_of(&c, "#run-total").await);
    screenshot(&c, "upload-calculator-live-verdict").await;
    assert_no_console_errors(&c, "upload (calculator)").await;

    // Its run page.
    c.find(Locator::Css("#run-link"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#verdict"))
        .await
        .unwrap();
    assert!(c.find(Locator::Css("#histogram")).await.is_ok());
    // The progress bar reads at a glance: wider than the browser's default 160 px.
    let (_, _, width, _) = c
        .find(Locator::Css("#run-progress"))
        .await
        .unwrap()
        .rectangle()
        .await
        .unwrap();
    assert!(width > 300.0, "progress bar {width} px wide");
    screenshot(&c, "calculator-run").await;
    assert_no_console_errors(&c, "calculator run page").await;

    c.close().await.unwrap();
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

/// A `given` package whose outputs are `outputs` (every case expects "ok").
fn given_zip(name: &str, outputs: &[&str]) -> Vec<u8> {
    let tests = given_tests(outputs, json!({}));
    zip_of(&[
        ("SKILL.md", skill_md(name).as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
    ])
}

const HOSTILE: &str = "<script>window.__xss = 1</script><img src=x onerror=\"window.__xss = 2\">";

#[tokio::test]
async fn browser_filters_failures_reviews_compares_and_never_runs_an_output() {
    let (app, _cache, stop, worker) = Box::pin(app_with_worker()).await;
    // Version 1: two failures, one of them the hostile output. Version 2: all pass.
    let v1 = app
        .upload_zip_as(given_zip("reviewed", &["ok", HOSTILE, "ok", "nope"]), TOKEN)
        .await;
    let run1 = v1["run_id"].as_str().unwrap().to_string();
    wait_for_verdict_as(&app, &run1).await;
    let v2 = app
        .upload_zip_as(given_zip("reviewed", &["ok", "ok", "ok", "ok"]), TOKEN)
        .await;
    let run2 = v2["run_id"].as_str().unwrap().to_string();
    wait_for_verdict_as(&app, &run2).await;

    let driver = start_driver().await;
    let c = browser(&driver).await;
    sign_in(&c, &app).await;

    // The skills list, then the run table filtered to failures.
    assert!(text_of(&c, "#skills").await.contains("reviewed"));
    screenshot(&c, "skills").await;
    c.goto(&format!("{}/ui/runs/{run1}", app.address))
        .await
        .unwrap();
    assert_eq!(
        c.find_all(Locator::Css("#cases tbody tr"))
            .await
            .unwrap()
            .len(),
        4
    );
    c.find(Locator::Css("#filter-status"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    c.find(Locator::Css("#apply-filters"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#case-count", 10, |t| t.starts_with("2 matching")).await;
    let rows = c.find_all(Locator::Css("#cases tbody tr")).await.unwrap();
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(
            r.attr("data-status").await.unwrap().as_deref(),
            Some("failed")
        );
    }
    screenshot(&c, "run-failures").await;
    assert_no_console_errors(&c, "run page filtered").await;

    // The hostile case: its output is text, nothing in it ran.
    rows[0]
        .find(Locator::Css("a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#case-output"))
        .await
        .unwrap();
    assert_eq!(text_of(&c, "#case-output").await, HOSTILE);
    assert_eq!(
        text_of(&c, "#case-prompt").await,
        "Say ok (1)",
        "the case's prompt, as text"
    );
    assert_eq!(
        c.execute("return typeof window.__xss;", vec![])
            .await
            .unwrap(),
        json!("undefined")
    );
    assert!(c
        .find_all(Locator::Css("main img"))
        .await
        .unwrap()
        .is_empty());
    screenshot(&c, "case-hostile-output").await;
    assert_no_console_errors(&c, "hostile case").await;

    // No review yet; disagree with this failure's grade -> 0 % agreement.
    c.goto(&format!("{}/ui/skills/reviewed", app.address))
        .await
        .unwrap();
    assert!(c.find(Locator::Css("#agreement-none")).await.is_ok());
    c.back().await.unwrap();
    c.find(Locator::Css("#review-case-disagree"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#review-note"))
        .await
        .unwrap()
        .send_keys("the output is fine")
        .await
        .unwrap();
    c.find(Locator::Css("#review-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#review-saved"))
        .await
        .unwrap();
    assert!(text_of(&c, "#reviews").await.contains("disagree"));
    c.goto(&format!("{}/ui/skills/reviewed", app.address))
        .await
        .unwrap();
    assert_eq!(text_of(&c, "#agreement .agreement-pct").await, "0.0 %");
    // Agree with a passing case's grade -> 50 %.
    c.goto(&format!("{}/ui/runs/{run1}/cases/0", app.address))
        .await
        .unwrap();
    c.find(Locator::Css("#review-case-agree"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.find(Locator::Css("#review-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#review-saved"))
        .await
        .unwrap();
    c.goto(&format!("{}/ui/skills/reviewed", app.address))
        .await
        .unwrap();
    assert_eq!(text_of(&c, "#agreement .agreement-pct").await, "50.0 %");
    screenshot(&c, "skill-agreement").await;
    assert_no_console_errors(&c, "skill page").await;

    // Preview a grade against a pasted output, from the skill page (nothing stored).
    c.find(Locator::Css("#preview-link"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#preview-form"))
        .await
        .unwrap();
    c.find(Locator::Css("#preview-case"))
        .await
        .unwrap()
        .select_by_value("case-003")
        .await
        .unwrap();
    c.find(Locator::Css("#preview-output"))
        .await
        .unwrap()
        .send_keys("ok")
        .await
        .unwrap();
    c.find(Locator::Css("#preview-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        wait_text(&c, "#preview-status", 10, |t| !t.is_empty()).await,
        "passed"
    );
    assert_eq!(text_of(&c, "#preview-score").await, "1.000");
    c.find(Locator::Css("#preview-output"))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();
    c.find(Locator::Css("#preview-output"))
        .await
        .unwrap()
        .send_keys(HOSTILE)
        .await
        .unwrap();
    c.find(Locator::Css("#preview-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        wait_text(&c, "#preview-status", 10, |t| t != "passed").await,
        "failed"
    );
    assert_eq!(
        c.execute("return typeof window.__xss;", vec![])
            .await
            .unwrap(),
        json!("undefined")
    );
    screenshot(&c, "preview").await;
    assert_no_console_errors(&c, "preview").await;
    c.goto(&format!("{}/ui/skills/reviewed", app.address))
        .await
        .unwrap();

    // Compare version 2 with version 1 from the skill page: the changed cases (their
    // recorded outputs are part of the definition) are not comparable, the two others are.
    c.find(Locator::Css("button.compare"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#comparison-outcome"))
        .await
        .unwrap();
    assert!(c
        .current_url()
        .await
        .unwrap()
        .path()
        .starts_with("/ui/comparisons/"));
    assert_eq!(
        c.find_all(Locator::Css("#moved-cases tr"))
            .await
            .unwrap()
            .len(),
        3,
        "header and two paired cases"
    );
    assert_no_console_errors(&c, "comparison from the skill page").await;
    // Forced, all four are paired: the two that moved come first, outputs side by side.
    let forced: Value = app
        .client
        .post(format!("{}/v1/comparisons", app.address))
        .bearer_auth(TOKEN)
        .json(&json!({"base": run1, "head": run2, "force": true}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = forced["comparison_id"].as_str().unwrap();
    c.goto(&format!("{}/ui/comparisons/{id}", app.address))
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#comparison-outcome"))
        .await
        .unwrap();
    let moved = c.find_all(Locator::Css("#moved-cases tr")).await.unwrap();
    assert_eq!(moved.len(), 5, "header and four paired cases");
    let first_two: Vec<String> = {
        let mut v = Vec::new();
        for row in moved.iter().skip(1).take(2) {
            v.push(
                row.find(Locator::Css("td"))
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap(),
            );
        }
        v.sort();
        v
    };
    assert_eq!(first_two, ["case-001", "case-003"], "the moved cases first");
    let outputs = c.find_all(Locator::Css(".output-a")).await.unwrap();
    assert_eq!(outputs.len(), 2, "two cases moved");
    let mut base_outputs = Vec::new();
    for o in &outputs {
        base_outputs.push(o.text().await.unwrap());
    }
    assert!(
        base_outputs.contains(&HOSTILE.to_string()),
        "{base_outputs:?}"
    );
    // Side by side with the difference marked: the base's line removed, the head's added.
    assert_eq!(
        c.find_all(Locator::Css(".output-a span.del"))
            .await
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        c.find(Locator::Css(".output-b span.ins"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "ok"
    );
    assert_eq!(
        c.execute("return typeof window.__xss;", vec![])
            .await
            .unwrap(),
        json!("undefined")
    );
    screenshot(&c, "comparison").await;
    assert_no_console_errors(&c, "comparison").await;

    c.close().await.unwrap();
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

#[tokio::test]
async fn browser_opens_the_offline_html_report_with_histogram_and_table() {
    use clap::Parser as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("offline");
    std::fs::create_dir_all(root.join("eval")).unwrap();
    std::fs::write(root.join("SKILL.md"), skill_md("offline")).unwrap();
    std::fs::write(
        root.join("eval/tests.json"),
        serde_json::to_vec_pretty(&given_tests(&["ok", HOSTILE, "ok"], json!({}))).unwrap(),
    )
    .unwrap();
    let cli = skilleval_cli::Cli::try_parse_from([
        "skilleval",
        "run",
        "--quiet",
        "--format",
        "html",
        root.to_str().unwrap(),
    ])
    .unwrap();
    let skilleval_cli::Command::Run(args) = cli.command else {
        panic!("not a run command");
    };
    skilleval_cli::run::run(&args).await;
    let report = root.join("eval/report.html");
    assert!(report.is_file(), "report.html written");

    let driver = start_driver().await;
    let c = browser(&driver).await;
    c.goto(&format!("file://{}", report.display()))
        .await
        .unwrap();
    // The console check can fail: an error logged by the page is in the log it reads.
    c.execute("console.error('probe: the log reader sees this');", vec![])
        .await
        .unwrap();
    let log = c.issue_cmd(BrowserLog).await.unwrap();
    assert!(
        log.as_array()
            .unwrap()
            .iter()
            .any(|e| e["level"] == "SEVERE"
                && e["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("probe: the log reader")),
        "{log}"
    );
    c.wait()
        .for_element(Locator::Css("#histogram"))
        .await
        .unwrap();
    let bars = c
        .find_all(Locator::Css("#histogram rect.bar"))
        .await
        .unwrap();
    assert_eq!(bars.len(), 10);
    assert_eq!(
        c.find_all(Locator::Css("#cases tbody tr"))
            .await
            .unwrap()
            .len(),
        3
    );
    // The file's own filter works offline.
    c.find(Locator::Css("#filter-status"))
        .await
        .unwrap()
        .select_by_value("failed")
        .await
        .unwrap();
    let visible = c
        .execute("return Array.from(document.querySelectorAll('#cases tbody tr')).filter(r => !r.hidden).length;", vec![])
        .await
        .unwrap();
    assert_eq!(visible, json!(1));
    assert_eq!(
        c.execute("return typeof window.__xss;", vec![])
            .await
            .unwrap(),
        json!("undefined")
    );
    screenshot(&c, "offline-report").await;
    assert_no_console_errors(&c, "offline report").await;

    // `skilleval view`: the same page over the local runs, served on 127.0.0.1.
    let runs = skilleval_cli::view::runs_dir(&root);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        axum::serve(listener, skilleval_cli::view::router(runs))
            .await
            .unwrap();
    });
    c.goto(&format!("http://{addr}/")).await.unwrap();
    c.find(Locator::Css("#runs a"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#histogram"))
        .await
        .unwrap();
    assert_eq!(
        c.find_all(Locator::Css("#cases tbody tr"))
            .await
            .unwrap()
            .len(),
        3
    );
    c.find(Locator::Css("#filter-status"))
        .await
        .unwrap()
        .select_by_value("passed")
        .await
        .unwrap();
    let visible = c
        .execute("return Array.from(document.querySelectorAll('#cases tbody tr')).filter(r => !r.hidden).length;", vec![])
        .await
        .unwrap();
    assert_eq!(
        visible,
        json!(2),
        "the linked script runs under the strict policy"
    );
    assert_eq!(
        c.execute("return typeof window.__xss;", vec![])
            .await
            .unwrap(),
        json!("undefined")
    );
    screenshot(&c, "skilleval-view").await;
    assert_no_console_errors(&c, "skilleval view").await;
    server.abort();
    c.close().await.unwrap();
}

async fn wait_for_verdict_as(app: &TestApp, run_id: &str) -> Value {
    for _ in 0..600 {
        let run: Value = app
            .client
            .get(format!("{}/v1/runs/{run_id}", app.address))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if run["verdict"].is_string() {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("hang guard: run {run_id} has no verdict after 60 s");
}

/// A Chromium session that saves downloads into `dir` without asking.
async fn browser_downloading_to(driver: &Driver, dir: &Path) -> Client {
    let caps: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--no-first-run", "--disable-extensions"],
            "prefs": {
                "download.default_directory": dir.to_str().unwrap(),
                "download.prompt_for_download": false
            }
        },
        "goog:loggingPrefs": { "browser": "ALL" }
    }))
    .unwrap();
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session")
}

/// Replaces an input's value by typing (so the page sees `input` events).
async fn retype(c: &Client, css: &str, text: &str) {
    let el = c.find(Locator::Css(css)).await.unwrap();
    el.clear().await.unwrap();
    el.send_keys(text).await.unwrap();
}

#[tokio::test]
async fn browser_editor_checks_rubric_weights_live_previews_and_downloads_a_valid_package() {
    let app = spawn_app_with(AppOptions {
        auth_tokens: vec![TOKEN.to_string()],
        ..AppOptions::default()
    })
    .await;
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": { "runner": "given" },
        "testCases": [
            { "id": "case-000", "input": {"prompt": "Say ok"}, "expected": {"output": "ok"},
              "evaluation": {"strategy": "exact_match"}, "given": {"output": "ok"} },
            { "id": "case-001", "input": {"prompt": "Explain"},
              "expected": {"rubric": {"criteria": [
                  {"name": "accuracy", "description": "Correct", "weight": 0.6, "scale": "likert5"},
                  {"name": "clarity", "description": "Clear", "weight": 0.4, "scale": "likert5"}
              ], "passingThreshold": 0.7}},
              "evaluation": {"strategy": "llm_judge"}, "given": {"output": "text"} }
        ]
    });
    let zip = zip_of(&[
        ("SKILL.md", skill_md("edited").as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
    ]);
    let stored: Value = app
        .client
        .post(format!("{}/v1/skills?run=false", app.address))
        .header("Content-Type", "application/zip")
        .bearer_auth(TOKEN)
        .body(zip)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let version = stored["version"].as_str().expect("stored").to_string();
    let downloads = tempfile::tempdir().unwrap();
    let driver = start_driver().await;
    let c = browser_downloading_to(&driver, downloads.path()).await;
    sign_in(&c, &app).await;

    // From the skill page to the version's editor.
    c.goto(&format!("{}/ui/skills/edited", app.address))
        .await
        .unwrap();
    c.find(Locator::Css("a.edit-tests"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#editor[data-loaded=true]"))
        .await
        .unwrap();
    let rubric_case = "#editor-cases fieldset:nth-of-type(2)";
    assert_eq!(
        text_of(&c, &format!("{rubric_case} .rubric-sum")).await,
        "Weights sum to 1.000."
    );
    // A wrong weight: the warning shows as it is typed.
    retype(
        &c,
        &format!("{rubric_case} tr.criterion .criterion-weight"),
        "0.5",
    )
    .await;
    let warning = wait_text(&c, &format!("{rubric_case} .rubric-sum"), 5, |t| {
        t.contains("must sum to 1.0")
    })
    .await;
    assert!(warning.contains("0.900"), "{warning}");
    let class = c
        .find(Locator::Css(&format!("{rubric_case} .rubric-sum")))
        .await
        .unwrap()
        .attr("class")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(class.contains("warning"), "{class}");
    screenshot(&c, "editor-weight-warning").await;
    retype(
        &c,
        &format!("{rubric_case} tr.criterion .criterion-weight"),
        "0.6",
    )
    .await;
    wait_text(&c, &format!("{rubric_case} .rubric-sum"), 5, |t| {
        t == "Weights sum to 1.000."
    })
    .await;
    assert_no_console_errors(&c, "editor").await;

    // A JSON Schema checked as typed: its syntax in the browser, its compilation by the server.
    let schema = "#editor-cases fieldset:nth-of-type(1) .case-schema";
    let syntax = "#editor-cases fieldset:nth-of-type(1) .json-status";
    let compiled = "#editor-cases fieldset:nth-of-type(1) .schema-status";
    retype(&c, schema, "{\"type\": ").await;
    let schema_note = c.find_all(Locator::Css(syntax)).await.unwrap();
    let mut notes = Vec::new();
    for n in &schema_note {
        notes.push(n.text().await.unwrap());
    }
    assert!(
        notes.iter().any(|t| t.starts_with("JSON syntax")),
        "{notes:?}"
    );
    retype(&c, schema, "{\"type\": 5}").await;
    let refused = wait_text(&c, compiled, 10, |t| !t.is_empty()).await;
    assert!(refused.contains("invalid JSON Schema"), "{refused}");
    retype(&c, schema, "{\"type\": \"string\"}").await;
    wait_text(&c, compiled, 10, |t| t == "compiles (draft 2020-12)").await;
    screenshot(&c, "editor-schema").await;
    c.find(Locator::Css(schema))
        .await
        .unwrap()
        .clear()
        .await
        .unwrap();

    // Preview with the edited definition: case-000 now expects "fine".
    retype(
        &c,
        "#editor-cases fieldset:nth-of-type(1) .case-expected",
        "fine",
    )
    .await;
    c.find(Locator::Css("#editor-preview-case"))
        .await
        .unwrap()
        .select_by_value("case-000")
        .await
        .unwrap();
    retype(&c, "#editor-preview-output", "fine").await;
    c.find(Locator::Css("#editor-preview-submit"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(
        wait_text(&c, "#editor-preview-status", 10, |t| !t.is_empty()
            && t != "grading…")
        .await,
        "passed"
    );
    assert_eq!(text_of(&c, "#editor-preview-score").await, "1.000");
    assert_no_console_errors(&c, "editor preview").await;

    // Download: validated by the server, saved by the browser.
    c.find(Locator::Css("#download-package"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_text(&c, "#download-status", 10, |t| {
        t.starts_with("Valid: downloaded")
    })
    .await;
    screenshot(&c, "editor-downloaded").await;
    let expected = downloads
        .path()
        .join(format!("edited-{version}-edited.zip"));
    let mut bytes = None;
    for _ in 0..300 {
        if let Ok(b) = std::fs::read(&expected) {
            if !b.is_empty() {
                bytes = Some(b);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bytes = bytes.unwrap_or_else(|| {
        panic!(
            "hang guard: no download at {} after 30 s: {:?}",
            expected.display(),
            std::fs::read_dir(downloads.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect::<Vec<_>>()
        )
    });
    let package = skilleval_model::package::Package::from_zip_bytes(
        &bytes,
        &skilleval_model::package::PackageLimits::default(),
        None,
    )
    .unwrap();
    let validation = skilleval_execution::validate::validate(
        &package,
        &skilleval_grading::StrategyRegistry::builtin().build(),
    );
    assert!(validation.is_ok(), "{:?}", validation.problems);
    let case0 = &package.config.test_cases[0];
    assert_eq!(case0.expected.output.as_deref(), Some("fine"));
    let text = std::fs::read_to_string(package.root().join("eval/tests.json")).unwrap();
    let written: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        written["testCases"][1]["expected"]["rubric"]["criteria"][0]["weight"],
        json!(0.6)
    );
    assert_no_console_errors(&c, "editor download").await;
    c.close().await.unwrap();
    app.cleanup().await;
}

#[tokio::test]
async fn browser_upload_takes_a_folder_and_offers_the_open_profile() {
    let app = spawn_app_with(AppOptions {
        auth_tokens: vec![TOKEN.to_string()],
        ..AppOptions::default()
    })
    .await;
    // A folder whose eval/tests.json names no profile; its one case has no strategy.
    let folder = tempfile::tempdir().unwrap();
    let root = folder.path().join("open-folder");
    std::fs::create_dir_all(root.join("eval")).unwrap();
    std::fs::write(root.join("SKILL.md"), skill_md("open-folder")).unwrap();
    let tests = json!({
        "version": "2.0",
        "settings": { "runner": "given" },
        "testCases": [{
            "id": "tc-1", "input": { "prompt": "Give the total" },
            "expected": { "output": "{\"total\": 4}", "jsonSchema": { "type": "object" } },
            "given": { "output": "{\"total\": 4}" }
        }]
    });
    std::fs::write(
        root.join("eval/tests.json"),
        serde_json::to_vec(&tests).unwrap(),
    )
    .unwrap();
    let driver = start_driver().await;
    let c = browser(&driver).await;
    sign_in(&c, &app).await;
    c.goto(&format!("{}/ui/upload", app.address)).await.unwrap();
    c.find(Locator::Css("#package-folder"))
        .await
        .unwrap()
        .send_keys(root.to_str().unwrap())
        .await
        .unwrap();
    let status = wait_text(&c, "#validation-status", 20, |t| t.starts_with("Valid:")).await;
    assert!(status.contains("open-folder"), "{status}");
    assert!(status.contains("profile deterministic"), "{status}");
    let choice = c.find(Locator::Css("#profile-choice")).await.unwrap();
    assert!(choice.is_displayed().await.unwrap());
    c.find(Locator::Css("#package-profile"))
        .await
        .unwrap()
        .select_by_value("structured")
        .await
        .unwrap();
    wait_text(&c, "#validation-status", 20, |t| {
        t.contains("profile structured")
    })
    .await;
    screenshot(&c, "upload-folder-profile").await;
    assert_no_console_errors(&c, "upload of a folder").await;
    c.close().await.unwrap();
    app.cleanup().await;
}

/// A `command` skill whose script answers "Hello, world" and crashes on the case `crash`.
fn why_package() -> Vec<u8> {
    let script = "import json, sys\ncase = json.load(sys.stdin)\nif case[\"test_case_id\"] == \"crash\":\n    sys.stderr.write(\"the input has no numbers\\n\")\n    sys.exit(3)\nprint(\"Hello, world\")\n";
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": { "defaultTimeout": 10000, "runner": { "type": "command", "script": "scripts/run.py" } },
        "testCases": [
            { "id": "greet", "name": "Greeting", "description": "Greets the world in title case.",
              "input": { "prompt": "Say \"hello\" to the world", "context": { "audience": "everyone" } },
              "expected": { "output": "Hello, World" }, "evaluation": { "strategy": "exact_match" } },
            { "id": "crash", "name": "No numbers", "input": { "prompt": "Add nothing" },
              "expected": { "output": "0" }, "evaluation": { "strategy": "exact_match" } }
        ]
    });
    zip_of(&[
        ("SKILL.md", skill_md("why").as_bytes()),
        (
            "eval/tests.json",
            &serde_json::to_vec_pretty(&tests).unwrap(),
        ),
        ("scripts/run.py", script.as_bytes()),
    ])
}

#[tokio::test]
async fn browser_shows_why_a_case_failed_its_error_once_and_refuses_a_cross_site_form_with_a_page()
{
    let (app, _cache, stop, worker) = Box::pin(app_with_worker()).await;
    let upload = app.upload_zip_as(why_package(), TOKEN).await;
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    let run = wait_for_verdict_as(&app, &run_id).await;
    assert_eq!(run["counters"]["failed"], 1, "{run}");
    assert_eq!(run["counters"]["errored"], 1, "{run}");
    let driver = start_driver().await;
    let c = browser(&driver).await;
    sign_in(&c, &app).await;

    // The exact-match failure: prompt as text, its description, the difference marked.
    c.goto(&format!("{}/ui/runs/{run_id}/cases/0", app.address))
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#case-diff"))
        .await
        .unwrap();
    assert_eq!(
        text_of(&c, "#case-prompt").await,
        "Say \"hello\" to the world"
    );
    assert_eq!(
        text_of(&c, "#case-description").await,
        "Greets the world in title case."
    );
    assert!(text_of(&c, "#case-context")
        .await
        .contains("\"audience\": \"everyone\""));
    assert_eq!(
        text_of(&c, "#case-diff").await,
        "First difference at line 1, column 8: expected `W`, got `w`."
    );
    for (pane, marked) in [("#case-output", "w"), ("#case-expected", "W")] {
        let mark = c
            .find(Locator::Css(&format!("{pane} mark.diff-at")))
            .await
            .unwrap();
        assert!(
            mark.is_displayed().await.unwrap(),
            "{pane}'s mark is visible"
        );
        assert_eq!(mark.text().await.unwrap(), marked);
    }
    // Side by side: the two panes are next to each other, not one under the other.
    let top = |css: &'static str| {
        let c = c.clone();
        async move {
            c.find(Locator::Css(css))
                .await
                .unwrap()
                .rectangle()
                .await
                .unwrap()
                .1
        }
    };
    assert!((top("#case-output").await - top("#case-expected").await).abs() < 2.0);
    screenshot(&c, "case-exact-match-diff").await;
    assert_no_console_errors(&c, "exact-match case").await;

    // The errored case: its error once, with whose it is; no empty output box.
    c.goto(&format!("{}/ui/runs/{run_id}/cases/1", app.address))
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#case-error"))
        .await
        .unwrap();
    let heading = text_of(&c, "#case-error h3").await;
    assert_eq!(heading, "Error: the skill's (permanent)");
    assert!(text_of(&c, "#case-error-message")
        .await
        .contains("the input has no numbers"));
    let body = text_of(&c, "main").await;
    assert_eq!(
        body.matches("the input has no numbers").count(),
        1,
        "the error is shown once: {body}"
    );
    assert!(
        c.find(Locator::Css("#case-output")).await.is_err(),
        "no empty output box"
    );
    assert!(text_of(&c, "table.attempts")
        .await
        .contains("the error above"));
    screenshot(&c, "case-errored").await;
    assert_no_console_errors(&c, "errored case").await;

    // Another site's form posting to a page: the browser lands on the HTML error page.
    let target = format!("{}/ui/compare", app.address);
    let attacker = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let target = target.clone();
            async move {
                axum::response::Html(format!(
                    "<!doctype html><title>elsewhere</title><form method=post action=\"{target}\">\
                     <input name=base value=\"{run}\"><input name=head value=\"{run}\">\
                     <button id=go type=submit>go</button></form>",
                    run = uuid::Uuid::nil()
                ))
            }
        }),
    );
    let (addr, server) = serve_local(attacker).await;
    c.goto(&format!("http://{addr}/")).await.unwrap();
    c.find(Locator::Css("#go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    c.wait()
        .for_element(Locator::Css("#error-message"))
        .await
        .unwrap();
    assert_eq!(c.current_url().await.unwrap().path(), "/ui/compare");
    assert_eq!(c.title().await.unwrap(), "Error 403 · skilleval");
    assert!(
        text_of(&c, "#error-message")
            .await
            .contains("must come from this server's own pages"),
        "the refusal says why"
    );
    assert!(
        c.find(Locator::Css("header nav")).await.is_ok(),
        "the site's layout, not raw JSON"
    );
    screenshot(&c, "cross-site-form-refused").await;
    // The browser logs the 403 it was answered; that is the page's point, not an error of it.
    let _ = c.issue_cmd(BrowserLog).await;
    server.abort();

    c.close().await.unwrap();
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}
