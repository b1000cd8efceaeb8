//! `skilleval run` with a model provider: a real HTTP server on 127.0.0.1:0 speaks the OpenAI
//! chat-completions protocol, and the binary is pointed at it through the
//! `SKILLEVAL_PROVIDER_*` variables.

#![allow(clippy::unwrap_used, clippy::needless_pass_by_value)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::Router;
use serde_json::{json, Value};
use skilleval_execution::fixtures::chat_user_text as user_text;

mod support;
use support::example_copy;

type Respond = Arc<dyn Fn(usize, &Value) -> Value + Send + Sync>;

#[derive(Clone)]
struct MockState {
    log: Arc<Mutex<Vec<Value>>>,
    respond: Respond,
}

/// A chat-completions server in a thread of its own (the binary under test is synchronous).
struct Mock {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Value>>>,
}

impl Mock {
    fn start(respond: impl Fn(usize, &Value) -> Value + Send + Sync + 'static) -> Mock {
        let log = Arc::new(Mutex::new(Vec::new()));
        let state = MockState {
            log: log.clone(),
            respond: Arc::new(respond),
        };
        Mock {
            addr: support::serve_on_thread(Router::new().fallback(handle).with_state(state)),
            log,
        }
    }

    fn requests(&self) -> Vec<Value> {
        self.log.lock().unwrap().clone()
    }

    fn count(&self, pred: impl Fn(&Value) -> bool) -> usize {
        self.requests().iter().filter(|r| pred(r)).count()
    }

    /// The binary, pointed at this server, with prices of $2 / $10 per million tokens.
    fn skilleval(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skilleval"));
        for var in [
            "SKILLEVAL_PROVIDER_KIND",
            "SKILLEVAL_PROVIDER_API_KEY_ENV",
            "SKILLEVAL_CACHE_DIR",
            "OPENAI_API_KEY",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("SKILLEVAL_PROVIDER_MODEL", "mock-model")
            .env(
                "SKILLEVAL_PROVIDER_BASE_URL",
                format!("http://{}/v1", self.addr),
            )
            .env("SKILLEVAL_PROVIDER_PRICE_INPUT", "2")
            .env("SKILLEVAL_PROVIDER_PRICE_OUTPUT", "10");
        cmd
    }

    /// `skilleval run --quiet --trigger-runs 0 <flags> <root>` against this server.
    fn run(&self, root: &Path, flags: &[&str]) -> Output {
        self.skilleval()
            .args(["run", "--quiet", "--trigger-runs", "0"])
            .args(flags)
            .arg(root)
            .output()
            .unwrap()
    }
}

async fn handle(State(state): State<MockState>, body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let index = {
        let mut log = state.log.lock().unwrap();
        log.push(body.clone());
        log.len() - 1
    };
    axum::Json((state.respond)(index, &body))
}

fn reply(content: &str, input_tokens: u64, output_tokens: u64) -> Value {
    json!({
        "model": "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens}
    })
}

fn schema_name(body: &Value) -> Option<&str> {
    body.pointer("/response_format/json_schema/name")
        .and_then(Value::as_str)
}

fn has_skill(body: &Value) -> bool {
    body["messages"][0]["role"] == "system"
        && body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .contains("# Meeting notes")
}

const GOOD_NOTES: &str = "## Summary\nWe launch on the 14th.\n\n## Decisions\n- Launch on the 14th\n\n## Action items\n- [ ] Fix the flaky payments test — Marco, due Wednesday\n\n## Open questions\n- Legal sign-off";
const BARE_NOTES: &str = "The team talked about a launch and some tests.";

/// Assertion verdicts for a judge request: all pass when the notes have a Decisions section.
fn verdicts(body: &Value) -> Value {
    let count = body
        .pointer("/response_format/json_schema/schema/properties/assertions/minItems")
        .and_then(Value::as_u64)
        .unwrap();
    let pass = user_text(body).contains("## Decisions");
    let items: Vec<Value> = (0..count)
        .map(|i| json!({"assertion": format!("a{i}"), "result": if pass { "pass" } else { "fail" }, "confidence": "high", "evidence": if pass { "## Decisions" } else { "no sections" }}))
        .collect();
    let answer = json!({"assertions": items, "factual_issues": [], "eval_critique": {"vague_assertions": [], "missing_coverage": [], "suggested_assertions": []}});
    reply(&answer.to_string(), 500, 100)
}

/// Picks meeting-notes for queries about transcripts or decisions.
fn trigger_choice(body: &Value) -> Value {
    let text = user_text(body);
    let query = text.split("<query>").nth(1).unwrap_or_default();
    let pick = if query.contains("transcript") || query.contains("decisions") {
        "meeting-notes"
    } else {
        "none"
    };
    reply(&json!({"skill": pick, "reason": "r"}).to_string(), 50, 5)
}

/// A provider that writes good notes with the skill and bare ones without it.
fn skill_sensitive(_: usize, body: &Value) -> Value {
    match schema_name(body) {
        Some("record_assertion_verdicts") => verdicts(body),
        Some("choose_skill") => trigger_choice(body),
        _ if has_skill(body) => reply(GOOD_NOTES, 1_000, 200),
        _ => reply(BARE_NOTES, 800, 50),
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn run_dir(root: &Path) -> PathBuf {
    let runs: Vec<_> = std::fs::read_dir(root.join("eval/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

#[test]
fn meeting_notes_runs_its_assertions_and_trigger_evals_through_a_provider() {
    let mock = Mock::start(skill_sensitive);
    let (_tmp, root) = example_copy("meeting-notes");
    let out = mock
        .skilleval()
        .args(["run", "--quiet", "--no-cache", "--trigger-runs", "1"])
        .arg(&root)
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("3 cases: 3 passed"), "{err}");
    assert!(err.contains("Precision 100.0% · recall 100.0%"), "{err}");

    let produced: Vec<Value> = mock
        .requests()
        .into_iter()
        .filter(|r| schema_name(r).is_none())
        .collect();
    assert_eq!(produced.len(), 3);
    assert!(
        produced.iter().all(has_skill),
        "SKILL.md is the system prompt"
    );
    let standup = produced
        .iter()
        .find(|r| user_text(r).starts_with("Write up notes for this standup transcript."))
        .unwrap();
    assert!(
        user_text(standup).contains("<file path=\"evals/files/standup.txt\">"),
        "{}",
        user_text(standup)
    );
    assert_eq!(mock.count(|r| schema_name(r) == Some("choose_skill")), 4);

    let dir = run_dir(&root);
    let grading = read_json(&dir.join("grading/1.json"));
    assert_eq!(grading["strategy"], "assertions");
    assert_eq!(
        grading["expectations"][0]["text"],
        "The notes have Summary, Decisions, Action items and Open questions sections"
    );
    assert_eq!(grading["expectations"][0]["passed"], true);
    assert_eq!(grading["assertions"][1]["confidence"], "high");
    assert_eq!(grading["summary"]["total"], 5);
    let report = read_json(&dir.join("report.json"));
    // Producing: 3 x (1000 x $2 + 200 x $10) / 1e6; grading: 3 x (500 x $2 + 100 x $10) / 1e6.
    let produce = report["runSummary"]["produce_usage"]["cost_usd"]
        .as_f64()
        .unwrap();
    let grade = report["runSummary"]["grade_usage"]["cost_usd"]
        .as_f64()
        .unwrap();
    assert!(
        (produce - 0.012).abs() < 1e-9 && (grade - 0.006).abs() < 1e-9,
        "{produce} {grade}"
    );
    assert_eq!(report["triggers"]["metrics"]["recall"], 1.0);
    assert!(dir.join("triggers.json").exists());
    assert!(std::fs::read_to_string(dir.join("report.md"))
        .unwrap()
        .contains("## Trigger evals"));
}

#[test]
fn a_second_run_is_served_from_the_response_cache() {
    let mock = Mock::start(skill_sensitive);
    let (tmp, root) = example_copy("meeting-notes");
    let cache = tmp.path().join("cache");
    let cache_arg = cache.to_str().unwrap();
    for _ in 0..2 {
        let out = mock.run(
            &root,
            &["--no-write", "--case", "1", "--cache-dir", cache_arg],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(
        mock.requests().len(),
        2,
        "one producing and one judging request, the second run sent none"
    );
    let out = mock.run(
        &root,
        &[
            "--no-write",
            "--case",
            "1",
            "--no-cache",
            "--cache-dir",
            cache_arg,
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(mock.requests().len(), 4, "--no-cache sends them again");
}

#[test]
fn baseline_reports_the_uplift_in_benchmark_json() {
    let mock = Mock::start(skill_sensitive);
    let (_tmp, root) = example_copy("meeting-notes");
    let out = mock.run(&root, &["--no-cache", "--baseline"]);
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the verdict is the with-skill run's: {err}"
    );
    assert!(
        err.contains("## Baseline: with vs without the skill"),
        "{err}"
    );
    assert_eq!(
        mock.count(|r| schema_name(r).is_none() && !has_skill(r)),
        3,
        "three bare-model runs"
    );

    let dir = run_dir(&root);
    let bench = read_json(&dir.join("benchmark.json"));
    assert_eq!(bench["runs"].as_array().unwrap().len(), 6);
    assert_eq!(bench["runs"][0]["configuration"], "with_skill");
    assert_eq!(bench["runs"][0]["eval_id"], 1);
    assert_eq!(bench["runs"][3]["configuration"], "without_skill");
    assert_eq!(bench["runs"][3]["result"]["pass_rate"], 0.0);
    let s = &bench["run_summary"];
    assert_eq!(s["with_skill"]["pass_rate"]["mean"], 1.0);
    assert_eq!(s["without_skill"]["pass_rate"]["mean"], 0.0);
    assert_eq!(s["delta"]["pass_rate"], "+1.00");
    // 1200 tokens with the skill, 850 without.
    assert_eq!(s["delta"]["tokens"], "+350");
    assert!(dir.join("eval-2/without_skill/run-1/grading.json").exists());
    assert!(dir.join("grading/2.json").exists());
    // What a comparison reads: the judge model in each model-graded case's fingerprint, and
    // only the with-skill attempts (the bare model's say nothing about the skill's version).
    let record = read_json(&dir.join("run.json"));
    assert_eq!(record["judge_model"], "mock-model");
    let judged = record["fingerprints"]
        .as_object()
        .unwrap()
        .values()
        .filter(|f| f["judge_model"] == "mock-model")
        .count();
    assert!(judged > 0, "{record}");
    let lines = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    assert_eq!(
        lines.lines().count(),
        6,
        "every attempt, the baseline's too"
    );
}

#[test]
fn repeats_report_pass_at_k_and_flaky_cases() {
    // Every other producing request writes bare notes: with -j 1 the attempts alternate.
    let mock = Mock::start(|_, body| match schema_name(body) {
        Some("record_assertion_verdicts") => verdicts(body),
        _ => {
            let produced_before = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if produced_before % 2 == 0 {
                reply(GOOD_NOTES, 10, 10)
            } else {
                reply(BARE_NOTES, 10, 10)
            }
        }
    });
    static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let (_tmp, root) = example_copy("meeting-notes");
    let out = mock.run(&root, &["--no-cache", "--repeats", "3", "-j", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "some attempts fail: {err}");
    assert!(err.contains("## Repeats: 3 attempts per case"), "{err}");
    assert!(err.contains("9 cases: 5 passed, 4 failed"), "{err}");
    let dir = run_dir(&root);
    // Attempt 1 keeps the seed's grading path; every attempt has its skill-creator folder.
    assert_eq!(read_json(&dir.join("grading/1.json"))["status"], "passed");
    assert_eq!(
        read_json(&dir.join("eval-1/with_skill/run-2/grading.json"))["status"],
        "failed"
    );
    assert_eq!(
        read_json(&dir.join("eval-1/with_skill/run-3/grading.json"))["status"],
        "passed"
    );
    let bench = read_json(&dir.join("benchmark.json"));
    let cases = bench["repeats"]["cases"].as_array().unwrap();
    let counts: Vec<(u64, u64)> = cases
        .iter()
        .map(|c| (c["n"].as_u64().unwrap(), c["c"].as_u64().unwrap()))
        .collect();
    assert_eq!(counts, vec![(3, 2), (3, 1), (3, 2)]);
    let p1 = bench["repeats"]["mean_pass_at"]["pass@1"].as_f64().unwrap();
    assert!((p1 - 5.0 / 9.0).abs() < 1e-9, "{p1}");
    assert_eq!(bench["repeats"]["mean_pass_at"]["pass@3"], 1.0);
    assert_eq!(bench["repeats"]["flaky_cases"], json!(["1", "2", "3"]));
    assert_eq!(bench["metadata"]["runs_per_configuration"], 3);
}

#[test]
fn a_budget_stops_the_run_and_the_verdict_says_so() {
    let mock = Mock::start(skill_sensitive);
    let (_tmp, root) = example_copy("meeting-notes");
    let out = mock.run(
        &root,
        &[
            "--no-cache",
            "--no-write",
            "-j",
            "1",
            "--max-tokens",
            "1000",
            "--format",
            "json",
        ],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("3 cases: 1 passed, 0 failed, 0 errored, 2 skipped"),
        "{err}"
    );
    assert!(err.contains("the run was stopped: budget exceeded: spent 1800 of the 1000 token limit (--max-tokens); 2 case(s) not run"), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "fail");
    assert_eq!(report["results"][1]["status"], "skipped");
    assert!(report["results"][1]["details"]["skipped"]
        .as_str()
        .unwrap()
        .starts_with("budget exceeded"));
    assert_eq!(
        mock.requests().len(),
        2,
        "nothing was sent after the budget ran out"
    );

    let out = mock.run(
        &root,
        &["--no-cache", "--no-write", "-j", "1", "--max-cost", "0.001"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("budget exceeded: spent $0.0060 of the $0.0010 limit (--max-cost)"),
        "{err}"
    );
}

/// An agent that never stops: every turn calls `bash true` and costs 1,000 + 100 tokens.
fn runaway_agent(index: usize, _: &Value) -> Value {
    json!({
        "model": "mock-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": format!("call_{index}"), "type": "function",
             "function": {"name": "bash", "arguments": "{\"command\": \"true\"}"}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 1_000, "completion_tokens": 100}
    })
}

#[test]
fn a_runaway_agent_case_is_counted_by_the_budget_that_then_stops_the_run() {
    let mock = Mock::start(runaway_agent);
    // sales-report: three agent cases, `maxTurns: 12`.
    let (_tmp, root) = example_copy("sales-report");
    let out = mock.run(
        &root,
        &[
            "--no-cache",
            "--no-write",
            "-j",
            "1",
            "--max-tokens",
            "5000",
            "--format",
            "json",
        ],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(mock.requests().len(), 12, "one case ran to its turn limit");
    assert!(
        err.contains("3 cases: 0 passed, 0 failed, 1 errored, 2 skipped"),
        "{err}"
    );
    assert!(
        err.contains("budget exceeded: spent 13200 of the 5000 token limit (--max-tokens)"),
        "{err}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &report["results"][0];
    assert_eq!(first["status"], "errored");
    assert_eq!(first["produce_usage"]["input_tokens"], 12_000);
    assert_eq!(first["produce_usage"]["output_tokens"], 1_200);
    let cost = first["produce_usage"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.036).abs() < 1e-9, "{cost}");
    assert_eq!(first["details"]["runner"]["limit"], "max_turns");
    assert_eq!(
        first["details"]["runner"]["transcript"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        12
    );
    assert!(first["details"]["error"]
        .as_str()
        .unwrap()
        .contains("max turns reached (12) after 12 tool calls"));
    for skipped in &report["results"].as_array().unwrap()[1..] {
        assert_eq!(skipped["status"], "skipped");
    }
}

#[test]
fn model_examples_validate_and_are_listed_without_a_provider() {
    for name in ["meeting-notes", "launch-announcement", "support-answers"] {
        let (_tmp, root) = example_copy(name);
        let out = Command::new(env!("CARGO_BIN_EXE_skilleval"))
            .env_remove("SKILLEVAL_PROVIDER_MODEL")
            .arg("validate")
            .arg(&root)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        let out = Command::new(env!("CARGO_BIN_EXE_skilleval"))
            .env_remove("SKILLEVAL_PROVIDER_MODEL")
            .args(["run", "--quiet", "--no-write"])
            .arg(&root)
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{name}: {err}");
        assert!(err.contains("need a model provider"), "{name}: {err}");
    }
}

#[test]
fn baseline_without_a_provider_is_bad_input() {
    let (_tmp, root) = example_copy("meeting-notes");
    let out = Command::new(env!("CARGO_BIN_EXE_skilleval"))
        .env_remove("SKILLEVAL_PROVIDER_MODEL")
        .args(["run", "--quiet", "--no-write", "--baseline"])
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--baseline runs every case without the skill"),
        "{}",
        stderr(&out)
    );
}

/// The model's draft for `skilleval init`: two cases with expectations, four trigger queries.
fn drafted_evals() -> Value {
    let answer = json!({
        "evals": [
            {"name": "standup", "prompt": "Write up notes for this standup: we launch on the 14th; Marco fixes the flaky test by Wednesday.",
             "expected_output": "Notes with the launch decision and Marco's action item.",
             "expectations": ["The notes have a Decisions section", "Marco's action item has a due date"]},
            {"name": "retro", "prompt": "Summarise our retro: deploys were slow, we decided to cache builds.",
             "expected_output": "Notes listing the caching decision.",
             "expectations": ["The caching decision is listed under Decisions"]}
        ],
        "triggers": [
            {"query": "turn this meeting transcript into notes", "should_trigger": true},
            {"query": "what did we decide in the standup? here is the transcript", "should_trigger": true},
            {"query": "write a meeting invite for Tuesday", "should_trigger": false},
            {"query": "transcribe this audio file", "should_trigger": false}
        ]
    });
    reply(&answer.to_string(), 2_000, 400)
}

#[test]
fn init_asks_the_model_for_a_first_eval_that_validates_and_runs() {
    let mock = Mock::start(|_, body| match schema_name(body) {
        Some("draft_evals") => drafted_evals(),
        Some("record_assertion_verdicts") => verdicts(body),
        _ => reply(GOOD_NOTES, 100, 50),
    });
    let (_tmp, root) = example_copy("meeting-notes");
    for generated in ["evals", "eval"] {
        let _ = std::fs::remove_dir_all(root.join(generated));
    }
    let out = mock
        .skilleval()
        .args(["init", "--no-cache"])
        .arg(&root)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}{}", stderr(&out));
    assert!(said.contains("2 eval(s) drafted by mock-model"), "{said}");
    assert!(
        said.contains("The definition validates (2 case(s))"),
        "{said}"
    );
    // The request showed the model the skill and asked for the draft's schema.
    let asked = mock.requests();
    assert_eq!(asked.len(), 1);
    assert!(user_text(&asked[0]).contains("<skill_name>meeting-notes</skill_name>"));
    assert!(user_text(&asked[0]).contains("# Meeting notes"));

    let evals = read_json(&root.join("evals/evals.json"));
    assert_eq!(evals["skill_name"], "meeting-notes");
    assert_eq!(evals["evals"][0]["id"], 1);
    assert_eq!(
        evals["evals"][0]["expectations"],
        json!([
            "The notes have a Decisions section",
            "Marco's action item has a due date"
        ])
    );
    let triggers = read_json(&root.join("evals/triggers.json"));
    assert_eq!(triggers.as_array().unwrap().len(), 4);

    let out = mock
        .skilleval()
        .arg("validate")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = mock.run(&root, &["--no-cache"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("2 cases: 2 passed"), "{err}");
}

/// The keys of a JSON object, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

/// Asserts that `v` has every field of `fields`, each of the JSON type named (`"string"`,
/// `"number"`, `"integer"`, `"boolean"`, `"array"`, `"object"`).
fn assert_fields(v: &Value, what: &str, fields: &[(&str, &str)]) {
    for (name, kind) in fields {
        let f = v
            .get(*name)
            .unwrap_or_else(|| panic!("{what}: no `{name}`: {v}"));
        let ok = match *kind {
            "string" => f.is_string(),
            "number" => f.is_number(),
            "integer" => f.is_u64(),
            "boolean" => f.is_boolean(),
            "array" => f.is_array(),
            "object" => f.is_object(),
            other => panic!("unknown kind {other}"),
        };
        assert!(ok, "{what}: `{name}` is not {kind}: {f}");
    }
}

/// A run's numbers the way skill-creator's aggregator reads a workspace: the pass rate from
/// grading.json's `summary`; the time from grading.json's `timing.total_duration_seconds`,
/// or when that is absent from timing.json together with its `total_tokens`; the tokens
/// otherwise from `execution_metrics.output_chars`; errors and tool calls from
/// `execution_metrics`.
fn as_skill_creator_reads(run_dir: &Path) -> (f64, f64, f64) {
    let grading = read_json(&run_dir.join("grading.json"));
    let pass_rate = grading["summary"]["pass_rate"].as_f64().unwrap_or(0.0);
    let mut time = grading["timing"]["total_duration_seconds"]
        .as_f64()
        .unwrap_or(0.0);
    let mut tokens = None;
    if time == 0.0 && run_dir.join("timing.json").exists() {
        let timing = read_json(&run_dir.join("timing.json"));
        time = timing["total_duration_seconds"].as_f64().unwrap_or(0.0);
        tokens = timing["total_tokens"].as_f64().filter(|t| *t != 0.0);
    }
    let tokens = tokens.unwrap_or_else(|| {
        grading["execution_metrics"]["output_chars"]
            .as_f64()
            .unwrap_or(0.0)
    });
    (pass_rate, time, tokens)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

#[test]
fn a_run_with_baseline_and_repeats_is_a_skill_creator_workspace_field_by_field() {
    let mock = Mock::start(skill_sensitive);
    let (_tmp, root) = example_copy("meeting-notes");
    let out = mock.run(&root, &["--no-cache", "--baseline", "--repeats", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = run_dir(&root);
    let evals = read_json(&root.join("evals/evals.json"));

    // benchmark.json (schemas.md "benchmark.json").
    let bench = read_json(&dir.join("benchmark.json"));
    let meta = &bench["metadata"];
    assert_fields(
        meta,
        "metadata",
        &[
            ("skill_name", "string"),
            ("skill_path", "string"),
            ("executor_model", "string"),
            ("analyzer_model", "string"),
            ("timestamp", "string"),
            ("evals_run", "array"),
            ("runs_per_configuration", "integer"),
        ],
    );
    assert_eq!(meta["skill_name"], "meeting-notes");
    assert_eq!(
        Path::new(meta["skill_path"].as_str().unwrap()),
        root.canonicalize().unwrap()
    );
    assert_eq!(meta["executor_model"], "mock-model");
    assert_eq!(meta["analyzer_model"], "mock-model");
    assert!(chrono::DateTime::parse_from_rfc3339(meta["timestamp"].as_str().unwrap()).is_ok());
    assert_eq!(meta["evals_run"], json!([1, 2, 3]));
    assert_eq!(meta["runs_per_configuration"], 3);
    let runs = bench["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 18, "3 evals x 2 configurations x 3 runs");
    for r in runs {
        assert_fields(
            r,
            "runs[]",
            &[
                ("eval_id", "integer"),
                ("eval_name", "string"),
                ("configuration", "string"),
                ("run_number", "integer"),
                ("result", "object"),
                ("expectations", "array"),
                ("notes", "array"),
            ],
        );
        assert!(r["configuration"] == "with_skill" || r["configuration"] == "without_skill");
        assert_fields(
            &r["result"],
            "runs[].result",
            &[
                ("pass_rate", "number"),
                ("passed", "integer"),
                ("failed", "integer"),
                ("total", "integer"),
                ("time_seconds", "number"),
                ("tokens", "integer"),
                ("tool_calls", "integer"),
                ("errors", "integer"),
            ],
        );
        for e in r["expectations"].as_array().unwrap() {
            assert_fields(
                e,
                "expectations[]",
                &[
                    ("text", "string"),
                    ("passed", "boolean"),
                    ("evidence", "string"),
                ],
            );
        }
    }
    let summary = &bench["run_summary"];
    for config in ["with_skill", "without_skill"] {
        for metric in ["pass_rate", "time_seconds", "tokens"] {
            assert_fields(
                &summary[config][metric],
                &format!("run_summary.{config}.{metric}"),
                &[
                    ("mean", "number"),
                    ("stddev", "number"),
                    ("min", "number"),
                    ("max", "number"),
                ],
            );
        }
    }
    assert_fields(
        &summary["delta"],
        "run_summary.delta",
        &[
            ("pass_rate", "string"),
            ("time_seconds", "string"),
            ("tokens", "string"),
        ],
    );
    assert_eq!(summary["delta"]["pass_rate"], "+1.00");
    assert!(bench["notes"].is_array());

    // Per eval and run: eval_metadata.json, grading.json, timing.json, outputs/.
    let mut read: std::collections::BTreeMap<&str, Vec<(f64, f64, f64)>> = Default::default();
    for (i, eval) in evals["evals"].as_array().unwrap().iter().enumerate() {
        let id = i + 1;
        let eval_dir = dir.join(format!("eval-{id}"));
        let metadata = read_json(&eval_dir.join("eval_metadata.json"));
        assert_fields(
            &metadata,
            "eval_metadata.json",
            &[
                ("eval_id", "integer"),
                ("eval_name", "string"),
                ("prompt", "string"),
                ("assertions", "array"),
            ],
        );
        assert_eq!(metadata["eval_id"], id);
        assert_eq!(metadata["prompt"], eval["prompt"]);
        assert_eq!(metadata["assertions"], eval["expectations"]);
        for config in ["with_skill", "without_skill"] {
            for n in 1..=3 {
                let run = eval_dir.join(config).join(format!("run-{n}"));
                assert_eq!(
                    read_json(&run.join("eval_metadata.json")),
                    metadata,
                    "the viewer reads it beside the run"
                );
                let grading = read_json(&run.join("grading.json"));
                assert_fields(
                    &grading,
                    "grading.json",
                    &[
                        ("expectations", "array"),
                        ("summary", "object"),
                        ("execution_metrics", "object"),
                        ("timing", "object"),
                        ("claims", "array"),
                        ("user_notes_summary", "object"),
                    ],
                );
                assert_eq!(
                    grading["expectations"].as_array().unwrap().len(),
                    eval["expectations"].as_array().unwrap().len()
                );
                for e in grading["expectations"].as_array().unwrap() {
                    assert_eq!(keys(e), ["evidence", "passed", "text"].map(String::from));
                }
                assert_fields(
                    &grading["summary"],
                    "grading.summary",
                    &[
                        ("passed", "integer"),
                        ("failed", "integer"),
                        ("total", "integer"),
                        ("pass_rate", "number"),
                    ],
                );
                assert_fields(
                    &grading["execution_metrics"],
                    "grading.execution_metrics",
                    &[
                        ("tool_calls", "object"),
                        ("total_tool_calls", "integer"),
                        ("total_steps", "integer"),
                        ("errors_encountered", "integer"),
                        ("output_chars", "integer"),
                        ("transcript_chars", "integer"),
                    ],
                );
                assert_fields(
                    &grading["timing"],
                    "grading.timing",
                    &[
                        ("executor_duration_seconds", "number"),
                        ("grader_duration_seconds", "number"),
                    ],
                );
                // The total is timing.json's, so that skill-creator reads the tokens from there.
                assert!(grading["timing"].get("total_duration_seconds").is_none());
                assert_fields(
                    &grading["user_notes_summary"],
                    "grading.user_notes_summary",
                    &[
                        ("uncertainties", "array"),
                        ("needs_review", "array"),
                        ("workarounds", "array"),
                    ],
                );
                let timing = read_json(&run.join("timing.json"));
                assert_fields(
                    &timing,
                    "timing.json",
                    &[
                        ("total_tokens", "integer"),
                        ("duration_ms", "integer"),
                        ("total_duration_seconds", "number"),
                        ("executor_start", "string"),
                        ("executor_end", "string"),
                        ("executor_duration_seconds", "number"),
                        ("grader_start", "string"),
                        ("grader_end", "string"),
                        ("grader_duration_seconds", "number"),
                    ],
                );
                let metrics = read_json(&run.join("outputs/metrics.json"));
                assert_fields(
                    &metrics,
                    "metrics.json",
                    &[
                        ("tool_calls", "object"),
                        ("total_tool_calls", "integer"),
                        ("total_steps", "integer"),
                        ("files_created", "array"),
                        ("errors_encountered", "integer"),
                        ("output_chars", "integer"),
                        ("transcript_chars", "integer"),
                    ],
                );
                // The output is kept for both configurations.
                let output = std::fs::read_to_string(run.join("outputs/output.md")).unwrap();
                let expected = if config == "with_skill" {
                    GOOD_NOTES
                } else {
                    BARE_NOTES
                };
                assert_eq!(output, expected);
                read.entry(if config == "with_skill" {
                    "with_skill"
                } else {
                    "without_skill"
                })
                .or_default()
                .push(as_skill_creator_reads(&run));
            }
        }
    }
    // What skill-creator's aggregator computes from the folders is what benchmark.json says.
    for config in ["with_skill", "without_skill"] {
        let runs = &read[config];
        assert_eq!(runs.len(), 9);
        let s = &summary[config];
        let pass = mean(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
        let time = mean(&runs.iter().map(|r| r.1).collect::<Vec<_>>());
        let tokens = mean(&runs.iter().map(|r| r.2).collect::<Vec<_>>());
        assert!(
            (pass - s["pass_rate"]["mean"].as_f64().unwrap()).abs() < 1e-9,
            "{config} pass rate"
        );
        assert!(
            (time - s["time_seconds"]["mean"].as_f64().unwrap()).abs() < 1e-9,
            "{config} time"
        );
        assert!(
            (tokens - s["tokens"]["mean"].as_f64().unwrap()).abs() < 1e-9,
            "{config} tokens"
        );
    }
    assert_eq!(summary["with_skill"]["tokens"]["mean"], 1200.0);
    assert_eq!(summary["without_skill"]["tokens"]["mean"], 850.0);
}

/// Every file under `dir`, by its path below it.
fn files_under(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

#[test]
fn export_writes_a_stored_local_run_as_the_same_skill_creator_folder() {
    let mock = Mock::start(skill_sensitive);
    let (tmp, root) = example_copy("meeting-notes");
    let out = mock.run(&root, &["--no-cache", "--baseline"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let dir = run_dir(&root);
    let target = tmp.path().join("iteration-1");
    let out = mock
        .skilleval()
        .args(["export", "--skill-creator"])
        .arg(&dir)
        .arg(&target)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let exported = files_under(&target);
    let own = files_under(&dir);
    assert_eq!(
        exported.len(),
        3 * 2 * 5 + 3 + 1,
        "per run 5 files, per eval its metadata, the benchmark"
    );
    for (path, bytes) in &exported {
        assert_eq!(
            own.get(path),
            Some(bytes),
            "{path}: the export is the file the run wrote"
        );
    }
    assert!(exported.contains_key("eval-2/without_skill/run-1/outputs/output.md"));
    // Not a run folder, or a folder already written: bad input.
    let out = mock
        .skilleval()
        .args(["export", "--skill-creator"])
        .arg(tmp.path())
        .arg(tmp.path().join("elsewhere"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not a run folder"),
        "{}",
        stderr(&out)
    );
    let out = mock
        .skilleval()
        .args(["export", "--skill-creator"])
        .arg(&dir)
        .arg(&target)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
}
