//! The `agent` runner against a real local model server that speaks each tool-use protocol
//! (OpenAI `tools`/`tool_calls`, Anthropic `tool_use`/`tool_result`) and follows a script, with
//! the tools running in a real bubblewrap sandbox. Needs bubblewrap and python3, like
//! `tests/sandbox.rs`: a host without them fails loudly rather than skipping.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::needless_pass_by_value
)]

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use axum::Router;
use serde_json::{json, Value};
use skilleval_execution::catalogue::{evaluate_catalogue, CatalogueSkill, Picker};
use skilleval_execution::executor::ExecutorBuilder;
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::triggers::fixtures::agent_location_by_word_overlap;
use skilleval_execution::triggers::{evaluate_triggers, AgentTriggers, SkillCard, TriggerOptions};
use skilleval_execution::validate::validate;
use skilleval_execution::variant::runner_for;
use skilleval_model::package::{Package, PackageLimits, TriggerCase};
use skilleval_providers::{ApiKey, LlmClient, ProviderClients, ProviderConfig, ProviderKind};
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy};

/// What the scripted model does at a turn.
#[derive(Debug, Clone)]
enum Step {
    /// Tool calls: (name, arguments).
    Call(Vec<(&'static str, Value)>),
    Answer(&'static str),
    /// A body no protocol can read (the turn fails).
    Garbage,
}

type Script = Arc<dyn Fn(&Value, usize) -> Step + Send + Sync>;

#[derive(Clone)]
struct ServerState {
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    script: Script,
}

/// A model server following a script: the turn is the number of assistant messages already in
/// the conversation, so any number of conversations can run through it at once.
struct ScriptedModel {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedModel {
    async fn start(script: impl Fn(&Value, usize) -> Step + Send + Sync + 'static) -> Self {
        let requests = Arc::new(Mutex::new(Vec::new()));
        let state = ServerState {
            requests: requests.clone(),
            script: Arc::new(script),
        };
        let app = Router::new().fallback(answer).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedModel {
            addr,
            requests,
            task,
        }
    }

    fn requests(&self) -> Vec<(String, Value)> {
        self.requests.lock().unwrap().clone()
    }

    fn clients(&self, kind: ProviderKind) -> Arc<ProviderClients> {
        let config = ProviderConfig {
            base_url: format!("http://{}/v1", self.addr),
            ..ProviderConfig::new("mock", kind, "mock-model")
        };
        let mut c = ProviderClients::default();
        c.insert(LlmClient::new(config, Some(ApiKey::new("sk-test"))).unwrap());
        Arc::new(c)
    }
}

async fn answer(State(state): State<ServerState>, uri: Uri, body: Bytes) -> axum::Json<Value> {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let anthropic = uri.path().ends_with("/messages");
    let turn = body["messages"]
        .as_array()
        .map_or(0, |m| m.iter().filter(|m| m["role"] == "assistant").count())
        + 1;
    let step = (state.script)(&body, turn);
    state
        .requests
        .lock()
        .unwrap()
        .push((uri.path().to_string(), body));
    let reply = match (step, anthropic) {
        (Step::Garbage, _) => json!({"nothing": "useful"}),
        (Step::Answer(text), false) => json!({
            "model": "mock-model",
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}
        }),
        (Step::Answer(text), true) => json!({
            "model": "mock-model",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 100, "output_tokens": 10}
        }),
        (Step::Call(calls), false) => json!({
            "model": "mock-model",
            "choices": [{"message": {"role": "assistant", "content": null, "tool_calls":
                calls.iter().enumerate().map(|(i, (name, args))| json!({
                    "id": format!("call_{turn}_{i}"), "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}
                })).collect::<Vec<_>>()}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 10}
        }),
        (Step::Call(calls), true) => json!({
            "model": "mock-model",
            "content": calls.iter().enumerate().map(|(i, (name, args))| json!({
                "type": "tool_use", "id": format!("toolu_{turn}_{i}"), "name": name, "input": args
            })).collect::<Vec<_>>(),
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 100, "output_tokens": 10}
        }),
    };
    axum::Json(reply)
}

/// The tool results a request carries, in either protocol: (call id, content, is_error).
fn tool_results(body: &Value) -> Vec<(String, String, bool)> {
    let mut out = Vec::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        if m["role"] == "tool" {
            out.push((
                m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
                false,
            ));
        }
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_result" {
                out.push((
                    b["tool_use_id"].as_str().unwrap_or_default().to_string(),
                    b["content"].as_str().unwrap_or_default().to_string(),
                    b["is_error"].as_bool().unwrap_or(false),
                ));
            }
        }
    }
    out
}

fn system_of(body: &Value) -> String {
    body["system"]
        .as_str()
        .or_else(|| body["messages"][0]["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

const SKILL_MD: &str = "---\nname: sales-report\ndescription: Builds a JSON sales report from a CSV of sales. Use when asked for a sales report.\n---\n# Sales report\n\nRun `python3 /skill/scripts/report.py INPUT.csv > report.json` in /workspace.\n";

const REPORT_PY: &str = r#"import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total = sum(int(r["amount"]) for r in rows)
print(json.dumps({"total": total, "count": len(rows), "regions": sorted({r["region"] for r in rows})}))
"#;

const SALES_CSV: &str = "region,amount\nnorth,10\nsouth,20\nnorth,30\n";

/// A package laid out as loaders extract it (dirs 0755, files 0644).
fn package(tests: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("SKILL.md", SKILL_MD.to_string()),
        ("scripts/report.py", REPORT_PY.to_string()),
        ("evals/files/sales.csv", SALES_CSV.to_string()),
        (
            "eval/tests.json",
            serde_json::to_string_pretty(&tests).unwrap(),
        ),
    ];
    for (rel, content) in files {
        let p = dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    for d in ["", "scripts", "evals", "evals/files", "eval"] {
        std::fs::set_permissions(dir.path().join(d), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    dir
}

fn sandbox() -> Sandbox {
    let s = Sandbox::detect(SandboxPolicy::default());
    assert_eq!(
        s.mode(),
        SandboxMode::Bubblewrap,
        "bubblewrap must work for these tests: {:?}",
        s.unavailable_reason()
    );
    s
}

/// The happy path: read SKILL.md, run the skill's script, write a note, answer.
fn report_script(_: &Value, turn: usize) -> Step {
    match turn {
        1 => Step::Call(vec![("read_file", json!({"path": "/skill/SKILL.md"}))]),
        2 => Step::Call(vec![(
            "bash",
            json!({"command": "python3 /skill/scripts/report.py sales.csv > report.json && cat report.json"}),
        )]),
        3 => Step::Call(vec![(
            "write_file",
            json!({"path": "notes/summary.md", "content": "Report built."}),
        )]),
        _ => Step::Answer("The report is in report.json."),
    }
}

fn report_tests(runner: Value) -> Value {
    json!({
        "version": "2.0",
        "settings": {"runner": runner, "defaultTimeout": 60000},
        "testCases": [
            {
                "id": "report-file",
                "input": {"prompt": "Build the sales report.", "files": ["evals/files/sales.csv"]},
                "expected": {
                    "jsonSchema": {"type": "object", "required": ["total", "count"],
                                   "properties": {"total": {"const": 60}, "count": {"const": 3}}},
                    "files": [{"path": "report.json", "minSize": 10}, {"path": "notes/summary.md"}]
                },
                "evaluation": {"strategy": "json_schema", "target": "file:report.json"}
            },
            {
                "id": "report-tools",
                "input": {"prompt": "Build the sales report.", "files": ["evals/files/sales.csv"]},
                "expected": {
                    "tools": [
                        {"name": "read_file", "arguments": {"type": "object", "properties": {"path": {"const": "/skill/SKILL.md"}}}},
                        "bash", "write_file"
                    ],
                    "order": ["read_file", "bash", "write_file"],
                    "forbidden": ["list_files"]
                },
                "evaluation": {"strategy": "tool_usage"}
            }
        ]
    })
}

/// A definition with one case (prompt `go`) that passes when the answer includes `answer`.
fn one_case(id: &str, runner: Value, answer: &str) -> Value {
    json!({
        "version": "2.0",
        "settings": {"runner": runner, "defaultTimeout": 60000},
        "testCases": [{"id": id, "input": {"prompt": "go"},
                       "expected": {"includes": [answer]}, "evaluation": {"strategy": "contains"}}]
    })
}

/// Plans and executes every case of the package with `clients`.
async fn run_package(
    root: &Path,
    clients: Arc<ProviderClients>,
    adjust: impl Fn(&mut skilleval_execution::plan::Job),
) -> Vec<JobResult> {
    run_package_in(sandbox(), root, clients, adjust).await
}

/// [`run_package`] in a sandbox of the caller's.
async fn run_package_in(
    sandbox: Sandbox,
    root: &Path,
    clients: Arc<ProviderClients>,
    adjust: impl Fn(&mut skilleval_execution::plan::Job),
) -> Vec<JobResult> {
    let executor = ExecutorBuilder::new()
        .providers(Some(clients))
        .sandbox(sandbox)
        .build();
    let package = Package::open(root, &PackageLimits::default()).unwrap();
    let validation = validate(&package, executor.strategies());
    assert!(validation.is_ok(), "{:?}", validation.problems);
    let mut jobs = plan(
        &package.config,
        &package.content_hash,
        uuid::Uuid::nil(),
        &CaseFilter::default(),
        None,
    )
    .unwrap();
    let mut out = Vec::new();
    for j in &mut jobs {
        adjust(j);
        out.push(executor.execute(j, root).await);
    }
    out
}

async fn the_script_runs_through_the_sandbox_and_the_file_is_graded(kind: ProviderKind) {
    let model = ScriptedModel::start(report_script).await;
    let pkg = package(report_tests(json!({
        "type": "agent",
        "decoys": [{"name": "pdf-tools", "description": "Works with PDF files."}]
    })));
    let results = run_package(pkg.path(), model.clients(kind), |_| {}).await;

    let file = &results[0];
    assert_eq!(file.status, CaseStatus::Passed, "{file:#?}");
    assert_eq!(file.score, Some(1.0));
    let runner = &file.details["runner"];
    assert_eq!(runner["skill_used"], true, "{runner:#}");
    assert_eq!(runner["skill_opened_at_turn"], 1);
    let artifacts = runner["artifacts"].as_array().unwrap();
    let report = artifacts
        .iter()
        .find(|a| a["path"] == "report.json")
        .unwrap();
    let text = report["text"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(text).unwrap(),
        json!({"total": 60, "count": 3, "regions": ["north", "south"]})
    );
    use sha2::Digest as _;
    assert_eq!(
        report["sha256"],
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    );
    assert!(artifacts.iter().any(|a| a["path"] == "notes/summary.md"));
    assert!(artifacts.iter().any(|a| a["path"] == "sales.csv"));
    assert_eq!(
        file.details["files"][0]["passed"], true,
        "{:#}",
        file.details
    );
    let calls = runner["transcript"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[1]["exit_code"], 0);
    assert!(calls[1]["duration_ms"].as_u64().is_some());
    assert_eq!(
        runner["transcript"]["output"],
        "The report is in report.json."
    );

    let tools = &results[1];
    assert_eq!(tools.status, CaseStatus::Passed, "{:#}", tools.details);

    // Each tool's result came back in the next request, under the call's id.
    let requests = model.requests();
    assert_eq!(requests.len(), 8, "two cases, four turns each");
    let first = &requests[0].1;
    let system = system_of(first);
    assert!(system.contains("<name>sales-report</name>"), "{system}");
    assert!(system.contains("<name>pdf-tools</name>"), "{system}");
    assert!(
        !system.contains("Run `python3"),
        "the catalogue lists the skill; its body is read with a tool"
    );
    let (id, content, is_error) = tool_results(&requests[1].1).pop().unwrap();
    assert!(id.ends_with("_1_0"), "{id}");
    assert!(content.contains("# Sales report"), "{content}");
    assert!(!is_error);
    let (_, content, _) = tool_results(&requests[2].1).pop().unwrap();
    assert!(content.starts_with("exit code: 0"), "{content}");
    assert!(content.contains("\"total\": 60"), "{content}");
    let (_, content, _) = tool_results(&requests[3].1).pop().unwrap();
    assert!(content.contains("wrote 13 bytes"), "{content}");
    let tools_listed = &first["tools"];
    assert_eq!(tools_listed.as_array().unwrap().len(), 4);
    match kind {
        ProviderKind::Openai => {
            assert_eq!(requests[0].0, "/v1/chat/completions");
            assert_eq!(tools_listed[0]["function"]["name"], "bash");
        }
        ProviderKind::Anthropic => {
            assert_eq!(requests[0].0, "/v1/messages");
            assert_eq!(tools_listed[0]["name"], "bash");
            assert!(tools_listed[0]["input_schema"].is_object());
        }
    }
}

#[tokio::test]
async fn openai_tool_calls_reach_the_sandbox_and_the_produced_file_is_graded() {
    the_script_runs_through_the_sandbox_and_the_file_is_graded(ProviderKind::Openai).await;
}

#[tokio::test]
async fn anthropic_tool_use_reaches_the_sandbox_and_the_produced_file_is_graded() {
    the_script_runs_through_the_sandbox_and_the_file_is_graded(ProviderKind::Anthropic).await;
}

#[tokio::test]
async fn hostile_tool_calls_fail_inside_the_loop_and_leave_the_host_alone() {
    let model = ScriptedModel::start(|_, turn| match turn {
        1 => Step::Call(vec![(
            "bash",
            json!({"command": "python3 -c \"import urllib.request; urllib.request.urlopen('http://example.com', timeout=3)\""}),
        )]),
        2 => Step::Call(vec![
            ("bash", json!({"command": "echo pwned > /skill/pwned.txt"})),
            ("write_file", json!({"path": "/etc/skilleval-pwned", "content": "x"})),
            ("bash", json!({"command": "echo pwned > /etc/skilleval-pwned"})),
            ("read_file", json!({"path": "/workspace/../etc/passwd"})),
        ]),
        3 => Step::Call(vec![("bash", json!({"command": "sleep 30; echo late"}))]),
        _ => Step::Answer("done"),
    })
    .await;
    let tests = one_case(
        "hostile",
        json!({"type": "agent", "toolTimeoutMs": 1000}),
        "done",
    );
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "the loop went on: {r:#?}");
    let calls = r.details["runner"]["transcript"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(calls.len(), 6);
    for c in &calls {
        assert_eq!(c["is_error"], true, "every hostile call fails: {c:#}");
    }
    let result = |i: usize| calls[i]["result"].as_str().unwrap().to_string();
    assert!(
        result(0).contains("URLError") || result(0).contains("resolution"),
        "no network: {}",
        result(0)
    );
    assert!(result(1).contains("Read-only"), "{}", result(1));
    assert!(result(2).contains("outside"), "{}", result(2));
    assert!(result(4).contains("not allowed"), "{}", result(4));
    assert!(
        result(5).contains("timed out after 1000 ms"),
        "{}",
        result(5)
    );
    assert!(!result(5).contains("late"));
    assert_eq!(
        calls[5]["exit_code"], 137,
        "the sleeping call was killed at its limit"
    );
    assert!(!pkg.path().join("pwned.txt").exists());
    assert!(!Path::new("/etc/skilleval-pwned").exists());
    // The results came back to the model flagged as errors.
    let last = model.requests().pop().unwrap().1;
    assert_eq!(tool_results(&last).len(), 6);
}

/// Fetches a URL and prints the body, the HTTP error or the failure; `--direct` ignores the
/// proxy variables; `--tunnel` goes through `CONNECT` (as HTTPS would) with plain HTTP inside.
const FETCH_PY: &str = r#"import http.client, os, sys, urllib.parse, urllib.request
url = sys.argv[-1]
try:
    if "--tunnel" in sys.argv:
        proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
        target = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=5)
        conn.set_tunnel(target.hostname, target.port)
        conn.request("GET", target.path)
        print("TUNNEL", conn.getresponse().read().decode())
    else:
        handlers = [urllib.request.ProxyHandler({})] if "--direct" in sys.argv else []
        print("BODY", urllib.request.build_opener(*handlers).open(url, timeout=5).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode())
except Exception as e:
    print("FAILED", type(e).__name__, e)
"#;

/// A plain HTTP server on the host's loopback answering `text` to every request.
async fn origin(text: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(move || async move { text });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// Runs one agent case that writes `fetch.py` and then runs `python3 fetch.py ARGS` for each
/// of `fetches`; returns the results of those calls.
async fn fetch_through_the_sandbox(
    allowed: Value,
    allow_private_egress: bool,
    fetches: Vec<String>,
) -> Vec<String> {
    let fetches = Arc::new(fetches);
    let script_fetches = fetches.clone();
    let model = ScriptedModel::start(move |_, turn| match turn {
        1 => Step::Call(vec![(
            "write_file",
            json!({"path": "fetch.py", "content": FETCH_PY}),
        )]),
        2 => Step::Call(
            script_fetches
                .iter()
                .map(|args| {
                    (
                        "bash",
                        json!({"command": format!("python3 fetch.py {args}")}),
                    )
                })
                .collect(),
        ),
        _ => Step::Answer("fetched"),
    })
    .await;
    let tests = one_case(
        "fetch",
        json!({"type": "agent", "allowedHosts": allowed, "toolTimeoutMs": 20000}),
        "fetched",
    );
    let pkg = package(tests);
    let sandbox = Sandbox::detect(SandboxPolicy {
        allow_private_egress,
        ..SandboxPolicy::default()
    });
    let results = run_package_in(
        sandbox,
        pkg.path(),
        model.clients(ProviderKind::Openai),
        |_| {},
    )
    .await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    let calls = r.details["runner"]["transcript"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(calls.len(), 1 + fetches.len(), "{calls:#?}");
    calls[1..]
        .iter()
        .map(|c| c["result"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn allowed_hosts_are_reached_through_the_proxy_and_nothing_else() {
    let (allowed, _a) = origin("hello from the allowed host").await;
    let (other, _b) = origin("the other host answered").await;
    let results = fetch_through_the_sandbox(
        json!([format!("127.0.0.1:{}", allowed.port())]),
        true,
        vec![
            format!("http://127.0.0.1:{}/ok", allowed.port()),
            format!("--tunnel http://127.0.0.1:{}/ok", allowed.port()),
            format!("http://127.0.0.1:{}/ok", other.port()),
            format!("--tunnel http://127.0.0.1:{}/ok", other.port()),
            format!("--direct http://127.0.0.1:{}/ok", allowed.port()),
            format!("http://localhost:{}/ok", allowed.port()),
        ],
    )
    .await;
    assert!(
        results[0].contains("BODY hello from the allowed host"),
        "plain HTTP through the proxy: {}",
        results[0]
    );
    assert!(
        results[1].contains("TUNNEL hello from the allowed host"),
        "CONNECT tunnel: {}",
        results[1]
    );
    assert!(
        results[2].contains("HTTP 403") && results[2].contains("not in the case's allowedHosts"),
        "another port of the same address is refused: {}",
        results[2]
    );
    // Python reports a refused CONNECT by its status line only.
    assert!(
        results[3].contains("Tunnel connection failed: 403"),
        "a tunnel to another port is refused: {}",
        results[3]
    );
    for r in &results[2..4] {
        assert!(!r.contains("the other host answered"), "{r}");
    }
    assert!(
        results[4].contains("FAILED") && !results[4].contains("hello"),
        "without the proxy there is no route to the host: {}",
        results[4]
    );
    assert!(
        results[5].contains("403") && results[5].contains("localhost"),
        "the name is matched, not the address it resolves to: {}",
        results[5]
    );
}

#[tokio::test]
async fn an_allowed_host_on_a_private_address_is_refused_by_default() {
    let (allowed, _a) = origin("hello from the allowed host").await;
    let results = fetch_through_the_sandbox(
        json!([format!("127.0.0.1:{}", allowed.port())]),
        false,
        vec![format!("http://127.0.0.1:{}/ok", allowed.port())],
    )
    .await;
    assert!(
        results[0].contains("403") && results[0].contains("private or local addresses"),
        "{}",
        results[0]
    );
    assert!(!results[0].contains("hello"), "{}", results[0]);
}

#[tokio::test]
async fn a_call_past_its_time_limit_loses_every_process_it_started_and_the_case_goes_on() {
    let model = ScriptedModel::start(|_, turn| match turn {
        1 => Step::Call(vec![(
            "bash",
            json!({"command": "(sleep 60; echo x) & setsid sleep 61 & sleep 62; echo late"}),
        )]),
        2 => Step::Call(vec![(
            "bash",
            json!({"command": "for p in /proc/[0-9]*; do cat $p/comm; done; echo alive"}),
        )]),
        _ => Step::Answer("done"),
    })
    .await;
    let tests = one_case(
        "slow",
        json!({"type": "agent", "toolTimeoutMs": 1000}),
        "done",
    );
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    let calls = r.details["runner"]["transcript"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    let first = calls[0]["result"].as_str().unwrap();
    assert!(first.contains("timed out after 1000 ms"), "{first}");
    assert!(!first.contains("late"), "{first}");
    assert_eq!(calls[0]["exit_code"], 137);
    let second = calls[1]["result"].as_str().unwrap();
    assert!(
        second.contains("alive"),
        "the session still runs calls: {second}"
    );
    assert!(
        !second.contains("sleep"),
        "background and setsid'd processes of the timed-out call are gone: {second}"
    );
}

#[test]
fn bad_agent_options_are_validation_errors_at_their_field() {
    for (runner, pointer, words) in [
        (
            json!({"type": "agent", "allowedHosts": ["ok.example.com", "bad host"]}),
            "/settings/runner/allowedHosts",
            "`bad host`",
        ),
        (
            json!({"type": "agent", "maxTurns": "many"}),
            "/settings/runner/maxTurns",
            "invalid type",
        ),
        (
            json!({"type": "agent", "decoys": [{"name": "a b", "description": "x"}]}),
            "/settings/runner/decoys/0/name",
            "letters, digits",
        ),
    ] {
        let pkg = package(one_case("c", runner.clone(), "x"));
        let package = Package::open(pkg.path(), &PackageLimits::default()).unwrap();
        let executor = ExecutorBuilder::new().build();
        let validation = validate(&package, executor.strategies());
        let problem = validation
            .problems
            .iter()
            .find(|p| p.pointer == pointer)
            .unwrap_or_else(|| panic!("{runner}: {:?}", validation.problems));
        assert!(problem.message.contains(words), "{}", problem.message);
        assert!(!validation.is_ok());
    }
}

#[tokio::test]
async fn max_turns_ends_the_case_errored_with_the_reason() {
    let model =
        ScriptedModel::start(|_, _| Step::Call(vec![("bash", json!({"command": "true"}))])).await;
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "agent", "maxTurns": 3}},
        "testCases": [{"id": "loop", "input": {"prompt": "go"},
                       "expected": {"includes": ["x"]}, "evaluation": {"strategy": "contains"}}]
    });
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Anthropic), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Errored);
    let error = r.error.as_ref().unwrap().to_string();
    assert_eq!(
        error, "agent stopped: max turns reached (3) after 3 tool calls",
        "the message docs/runners.md quotes"
    );
    assert_eq!(model.requests().len(), 3);
    // What the three turns spent (100 in + 10 out each) is the case's, as is what it did.
    assert_eq!(r.produce_usage.input_tokens, 300);
    assert_eq!(r.produce_usage.output_tokens, 30);
    let runner = &r.details["runner"];
    assert_eq!(runner["limit"], "max_turns", "{runner:#}");
    assert_eq!(runner["limit_hit"], "max turns reached (3)");
    assert_eq!(runner["turns"].as_array().unwrap().len(), 3);
    let calls = runner["transcript"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3);
    assert!(calls
        .iter()
        .all(|c| c["name"] == "bash" && c["exit_code"] == 0));
}

#[tokio::test]
async fn the_agent_works_in_the_workspace_its_setup_prepared() {
    let model = ScriptedModel::start(|_, turn| match turn {
        1 => Step::Call(vec![("bash", json!({"command": "cat fixture.txt"}))]),
        _ => Step::Answer("done"),
    })
    .await;
    let mut tests = one_case("fixture", json!({"type": "agent"}), "done");
    tests["setup"] = json!({"script": "scripts/setup.sh"});
    let pkg = package(tests);
    let setup = pkg.path().join("scripts/setup.sh");
    std::fs::write(&setup, "echo 'made by setup' > fixture.txt\n").unwrap();
    std::fs::set_permissions(&setup, std::fs::Permissions::from_mode(0o644)).unwrap();
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    let calls = r.details["runner"]["transcript"]["tool_calls"]
        .as_array()
        .unwrap();
    let result = calls[0]["result"].as_str().unwrap();
    assert!(result.contains("made by setup"), "{result}");
    // The file the setup left is in the workspace the agent leaves behind.
    assert!(r.details["runner"]["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["path"] == "fixture.txt"));
}

#[tokio::test]
async fn max_tokens_ends_the_case_errored_with_what_it_spent() {
    let model =
        ScriptedModel::start(|_, _| Step::Call(vec![("bash", json!({"command": "true"}))])).await;
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "agent", "maxTurns": 50, "maxTokens": 250}},
        "testCases": [{"id": "loop", "input": {"prompt": "go"},
                       "expected": {"includes": ["x"]}, "evaluation": {"strategy": "contains"}}]
    });
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Errored);
    let error = r.error.as_ref().unwrap().to_string();
    assert_eq!(
        error,
        "agent stopped: max tokens reached (330 of 250) after 3 tool calls"
    );
    assert_eq!(model.requests().len(), 3);
    assert_eq!(r.produce_usage.total_tokens(), 330);
    assert_eq!(r.details["runner"]["limit"], "max_tokens");
    assert_eq!(
        r.details["runner"]["transcript"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn on_limit_grade_grades_what_the_agent_has() {
    let model = ScriptedModel::start(|_, turn| match turn {
        1 => Step::Call(vec![(
            "write_file",
            json!({"path": "report.json", "content": "{\"total\": 60, \"count\": 3}"}),
        )]),
        _ => Step::Call(vec![("bash", json!({"command": "true"}))]),
    })
    .await;
    let mut tests = report_tests(json!({"type": "agent", "maxTurns": 2, "onLimit": "grade"}));
    tests["testCases"][0]["expected"]["files"] = json!([]);
    tests["testCases"].as_array_mut().unwrap().truncate(1);
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |_| {}).await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    assert_eq!(r.details["runner"]["limit_hit"], "max turns reached (2)");
    assert_eq!(r.details["runner"]["limit"], "max_turns");
    assert_eq!(r.produce_usage.total_tokens(), 220);
}

#[tokio::test]
async fn the_baseline_catalogue_lacks_the_skill_and_its_files() {
    let model = ScriptedModel::start(|_, turn| match turn {
        1 => Step::Call(vec![("read_file", json!({"path": "/skill/SKILL.md"}))]),
        _ => Step::Answer("no skill"),
    })
    .await;
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "agent", "decoys": [{"name": "pdf-tools", "description": "PDFs."}]}},
        "testCases": [{"id": "b", "input": {"prompt": "Build the sales report."},
                       "expected": {"includes": ["skill"]}, "evaluation": {"strategy": "contains"}}]
    });
    let pkg = package(tests);
    let results = run_package(pkg.path(), model.clients(ProviderKind::Openai), |j| {
        j.runner = runner_for(&j.runner, true, 1);
    })
    .await;
    let r = &results[0];
    assert_eq!(r.status, CaseStatus::Passed, "{r:#?}");
    let runner = &r.details["runner"];
    assert_eq!(runner["configuration"], "without_skill");
    assert_eq!(runner["catalogue"], json!(["pdf-tools"]));
    assert_eq!(runner["skill_used"], false);
    let requests = model.requests();
    let system = system_of(&requests[0].1);
    assert!(!system.contains("sales-report"), "{system}");
    assert!(system.contains("<name>pdf-tools</name>"), "{system}");
    let (_, content, _) = tool_results(&requests[1].1).pop().unwrap();
    assert!(
        content.contains("No such file"),
        "the skill is not in the baseline's sandbox: {content}"
    );
}

#[tokio::test]
async fn agent_mode_triggers_count_an_opened_skill_md_and_nothing_else() {
    // Opens this skill's SKILL.md for "sales" queries, a decoy's for "pdf" queries, a
    // reference file of the skill for "script" queries, nothing otherwise.
    let model = ScriptedModel::start(|body, turn| {
        let prompt = body["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        if turn > 1 {
            return Step::Answer("ok");
        }
        if prompt.contains("sales") {
            Step::Call(vec![("bash", json!({"command": "cat /skill/SKILL.md"}))])
        } else if prompt.contains("pdf") {
            Step::Call(vec![(
                "read_file",
                json!({"path": "/skills/pdf-tools/SKILL.md"}),
            )])
        } else if prompt.contains("script") {
            Step::Call(vec![(
                "read_file",
                json!({"path": "/skill/scripts/report.py"}),
            )])
        } else {
            Step::Answer("ok")
        }
    })
    .await;
    let pkg = package(json!({"version": "2.0", "testCases": []}));
    let clients = model.clients(ProviderKind::Openai);
    let client = clients.get("mock").unwrap().clone();
    let cases = vec![
        TriggerCase {
            query: "Make a sales report".into(),
            should_trigger: true,
        },
        TriggerCase {
            query: "Merge these pdf files".into(),
            should_trigger: false,
        },
        TriggerCase {
            query: "Show me the script".into(),
            should_trigger: false,
        },
        TriggerCase {
            query: "Write a haiku".into(),
            should_trigger: false,
        },
    ];
    let report = evaluate_triggers(
        &client,
        &SkillCard::new("sales-report", "Builds sales reports."),
        &cases,
        &TriggerOptions {
            runs_per_query: 2,
            agent: Some(AgentTriggers {
                sandbox: Arc::new(sandbox()),
                package_root: pkg.path().to_path_buf(),
                max_turns: 3,
                timeout: Duration::from_secs(30),
            }),
            ..TriggerOptions::default()
        },
    )
    .await;
    let selected: Vec<u32> = report.queries.iter().map(|q| q.selected).collect();
    assert_eq!(selected, vec![2, 0, 0, 0], "{report:#?}");
    let m = report.metrics;
    assert_eq!(
        (
            m.true_positives,
            m.false_positives,
            m.false_negatives,
            m.true_negatives,
            m.errored
        ),
        (1, 0, 0, 3, 0)
    );
    // The decoys were in the agent's catalogue.
    let system = system_of(&model.requests()[0].1);
    assert!(system.contains("<name>pdf-tools</name>"), "{system}");
    assert!(system.contains("<name>sales-report</name>"), "{system}");
}

fn should(queries: &[&str]) -> Vec<TriggerCase> {
    queries
        .iter()
        .map(|q| TriggerCase {
            query: (*q).to_string(),
            should_trigger: true,
        })
        .collect()
}

#[tokio::test]
async fn agent_mode_catalogue_evals_pick_the_skill_md_opened_first() {
    // The agent opens the SKILL.md whose description shares the most words with the query
    // (the first listed, by name, on a tie). A query saying "explode" looks around and then
    // gets a reply no protocol can read; one saying "twice" opens this skill and then a decoy.
    let model = ScriptedModel::start(|body, turn| {
        let user = body["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string();
        if user.contains("explode") {
            return match turn {
                1 => Step::Call(vec![("list_files", json!({"path": "/skills"}))]),
                _ => Step::Garbage,
            };
        }
        if user.contains("twice") {
            return match turn {
                1 => Step::Call(vec![
                    ("read_file", json!({"path": "/skill/SKILL.md"})),
                    ("bash", json!({"command": "cat /skills/weather/SKILL.md"})),
                ]),
                _ => Step::Answer("ok"),
            };
        }
        match (
            turn,
            agent_location_by_word_overlap(&system_of(body), &user),
        ) {
            (1, Some(location)) => Step::Call(vec![("read_file", json!({"path": location}))]),
            _ => Step::Answer("ok"),
        }
    })
    .await;
    let pkg = package(json!({"version": "2.0", "testCases": []}));
    let clients = model.clients(ProviderKind::Openai);
    let client = clients.get("mock").unwrap().clone();
    // The package's own description (SKILL_MD), and a near-duplicate of it.
    let description =
        "Builds a JSON sales report from a CSV of sales. Use when asked for a sales report.";
    let skill = CatalogueSkill {
        card: SkillCard::new("sales-report", description),
        queries: should(&[
            "a sales report from this CSV of sales",
            "explode the report",
            "twice the sales",
        ]),
    };
    let neighbours = vec![
        CatalogueSkill {
            card: SkillCard::new("sales-summary", description),
            queries: should(&["sales report for the CSV of last month's sales"]),
        },
        CatalogueSkill {
            card: SkillCard::new("weather", "Tells the weather forecast for a city."),
            queries: should(&["what is the weather forecast for Paris", "write a haiku"]),
        },
    ];
    let agent = AgentTriggers {
        sandbox: Arc::new(sandbox()),
        package_root: pkg.path().to_path_buf(),
        max_turns: 3,
        timeout: Duration::from_secs(30),
    };
    let run = evaluate_catalogue(&client, &skill, &neighbours, 2, 4, &Picker::Agent(agent)).await;
    assert_eq!(run.lineup, ["sales-report", "sales-summary", "weather"]);
    let picks: Vec<(&str, &str, Vec<&str>, usize)> = run
        .queries
        .iter()
        .map(|q| {
            (
                q.owner.as_str(),
                q.query.as_str(),
                q.picks.iter().map(String::as_str).collect(),
                q.errors.len(),
            )
        })
        .collect();
    assert_eq!(
        picks,
        vec![
            (
                "sales-report",
                "a sales report from this CSV of sales",
                vec!["sales-report"; 2],
                0
            ),
            // Looked around, then failed before opening any skill: no pick, an error.
            ("sales-report", "explode the report", vec![], 2),
            // The skill opened first is the pick, not the decoy opened after it.
            (
                "sales-report",
                "twice the sales",
                vec!["sales-report"; 2],
                0
            ),
            // The near-duplicate's query went to the skill under test (listed first): a collision.
            (
                "sales-summary",
                "sales report for the CSV of last month's sales",
                vec!["sales-report"; 2],
                0
            ),
            (
                "weather",
                "what is the weather forecast for Paris",
                vec!["weather"; 2],
                0
            ),
            ("weather", "write a haiku", vec!["none"; 2], 0),
        ],
        "{run:#?}"
    );
    assert!(run.usage.total_tokens() > 0);
    let requests = model.requests();
    // The neighbours were in the agent's catalogue as decoys, and a decoy's SKILL.md could be read.
    let system = system_of(&requests[0].1);
    for name in ["sales-report", "sales-summary", "weather"] {
        assert!(system.contains(&format!("<name>{name}</name>")), "{system}");
    }
    let decoy_read = requests
        .iter()
        .flat_map(|(_, b)| tool_results(b))
        .find(|(_, content, _)| content.contains("name: weather"))
        .expect("the weather decoy's SKILL.md was read");
    assert!(!decoy_read.1.contains("refused"), "{decoy_read:?}");
}

#[tokio::test]
async fn the_sales_report_example_passes_when_the_agent_runs_its_script() {
    // The agent follows the example's SKILL.md; judge requests (structured output) get a
    // top verdict, and the test checks the judge was shown the file.
    let model = ScriptedModel::start(|body, turn| {
        if body.get("response_format").is_some() {
            return Step::Answer(
                r#"{"criteria": [{"name": "accuracy", "score": 5, "reasoning": "totals match"}, {"name": "completeness", "score": 5, "reasoning": "every field"}]}"#,
            );
        }
        match turn {
            1 => Step::Call(vec![("list_files", json!({}))]),
            2 => Step::Call(vec![("read_file", json!({"path": "/skill/SKILL.md"}))]),
            3 => Step::Call(vec![(
                "bash",
                json!({"command": "python3 /skill/scripts/build_report.py sales-q3.csv report.json"}),
            )]),
            _ => Step::Answer("7 rows, total 5596.50, top region north. The report is in report.json."),
        }
    })
    .await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/skills/sales-report");
    let pkg = tempfile::tempdir().unwrap();
    copy_tree(&root, pkg.path());
    let clients = model.clients(ProviderKind::Openai);
    let results = run_package(pkg.path(), clients, |j| {
        j.runner.provider = Some("mock".into());
    })
    .await;
    let by_id = |id: &str| results.iter().find(|r| r.test_case_id == id).unwrap();
    let schema = by_id("q3-report-schema");
    assert_eq!(schema.status, CaseStatus::Passed, "{schema:#?}");
    let tools = by_id("q3-report-tools");
    assert_eq!(tools.status, CaseStatus::Passed, "{:#}", tools.details);
    let judged = by_id("q3-report-judged");
    // The judge saw the file's text, not the agent's answer.
    let judge_request = model
        .requests()
        .into_iter()
        .find(|(_, b)| b.get("response_format").is_some())
        .expect("the judge was asked")
        .1;
    let shown = judge_request.to_string();
    assert!(shown.contains("by_product"), "{shown}");
    assert_eq!(judged.status, CaseStatus::Passed, "{judged:#?}");
}

fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).unwrap();
}
