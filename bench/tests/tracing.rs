//! Traces end to end (issue 19's must-show): a real OTLP receiver on loopback (the collector's
//! HTTP protocol, bodies decoded with the OTLP protobuf messages), the real coordinator and
//! worker processes exporting to it, one skill uploaded whose `llm` runner's provider (a test
//! server speaking the OpenAI protocol) fails the first call with a 503. The upload's trace
//! must hold, under one trace id, the coordinator's SERVER span, its PRODUCER `send` span
//! parenting the worker's CONSUMER `process` spans, their runner (`gen_ai.*`), grader and
//! commit children, the retry (a `send` from the failed attempt's `process` span parenting the
//! second attempt's), the run's finalisation and its webhook delivery. The spans reach the
//! receiver because both processes flush on SIGTERM (the batch delay is longer than the test).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::{json, Value};
use skilleval_bench::cluster::Proc;
use skilleval_infra::topology::{Topology, DELIVERY_LIMIT};
use skilleval_test_support::{amqp_url, Scratch};

/// One exported span, flattened with its process's `service.name`.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, AttrValue>,
}

#[derive(Debug, Clone, PartialEq)]
enum AttrValue {
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Got {
    fn str(&self, key: &str) -> Option<&str> {
        match self.attrs.get(key) {
            Some(AttrValue::Str(s)) => Some(s),
            _ => None,
        }
    }

    fn int(&self, key: &str) -> Option<i64> {
        match self.attrs.get(key) {
            Some(AttrValue::Int(n)) => Some(*n),
            _ => None,
        }
    }
}

fn attr_map(attrs: &[KeyValue]) -> HashMap<String, AttrValue> {
    attrs
        .iter()
        .filter_map(|kv| {
            let v = match kv.value.as_ref()?.value.as_ref()? {
                AnyValue::StringValue(s) => AttrValue::Str(s.clone()),
                AnyValue::IntValue(n) => AttrValue::Int(*n),
                AnyValue::DoubleValue(f) => AttrValue::Float(*f),
                AnyValue::BoolValue(b) => AttrValue::Bool(*b),
                _ => return None,
            };
            Some((kv.key.clone(), v))
        })
        .collect()
}

/// `POST /v1/traces`: decodes the protobuf request, keeps its spans, answers as a collector.
async fn receive(
    State(spans): State<Arc<Mutex<Vec<Got>>>>,
    body: Bytes,
) -> axum::response::Response {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut got = Vec::new();
    for rs in request.resource_spans {
        let resource = rs
            .resource
            .map(|r| attr_map(&r.attributes))
            .unwrap_or_default();
        let service = match resource.get("service.name") {
            Some(AttrValue::Str(s)) => s.clone(),
            _ => String::new(),
        };
        for ss in rs.scope_spans {
            for s in ss.spans {
                got.push(Got {
                    service: service.clone(),
                    name: s.name,
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    attrs: attr_map(&s.attributes),
                });
            }
        }
    }
    spans.lock().expect("the spans lock").extend(got);
    (
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The provider: HTTP 503 on the first chat request, then `pong` with usage.
async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> impl IntoResponse {
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"error": {"message": "overloaded, try again"}})),
        );
    }
    let model = body["model"].as_str().unwrap_or("unknown").to_string();
    (
        StatusCode::OK,
        Json(json!({
            "id": "chatcmpl-trace",
            "object": "chat.completion",
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
        })),
    )
}

/// The webhook receiver: counts deliveries.
async fn hook(State(hooks): State<Arc<AtomicUsize>>) -> StatusCode {
    hooks.fetch_add(1, Ordering::SeqCst);
    StatusCode::NO_CONTENT
}

async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

fn package() -> Vec<u8> {
    use std::io::Write as _;
    let case = |id: &str| {
        json!({
            "id": id, "name": id,
            "input": {"prompt": format!("ping {id}")},
            "expected": {"output": "pong"},
            "evaluation": {"strategy": "exact_match"}
        })
    };
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {"defaultTimeout": 20_000, "runner": {"type": "llm", "provider": "mock"}},
        "testCases": [case("first"), case("second")]
    });
    let files: [(&str, Vec<u8>); 2] = [
        (
            "SKILL.md",
            b"---\nname: traced-skill\ndescription: Answers pong, for the tracing test.\n---\n\nAnswer pong.\n".to_vec(),
        ),
        ("eval/tests.json", serde_json::to_vec(&tests).expect("tests.json")),
    ];
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default();
    for (name, bytes) in &files {
        w.start_file(*name, options).expect("zip entry");
        w.write_all(bytes).expect("zip write");
    }
    w.finish().expect("zip finish").into_inner()
}

/// Sends SIGTERM and waits for the process to exit: whether it exited cleanly, or `false`
/// after 60 s, a guard against a hang.
async fn stop(mut p: Proc) -> bool {
    p.signal(nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(ok) = p.try_exit() {
            return ok;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upload_is_one_trace_from_the_request_through_the_queue_to_the_worker_and_back() {
    let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
    let collector = serve(
        Router::new()
            .route("/v1/traces", post(receive))
            .with_state(spans.clone()),
    )
    .await;
    let calls = Arc::new(AtomicUsize::new(0));
    let provider = serve(
        Router::new()
            .route("/v1/chat/completions", post(chat))
            .with_state(calls.clone()),
    )
    .await;

    let hooks = Arc::new(AtomicUsize::new(0));
    let webhook = serve(
        Router::new()
            .route("/hook", post(hook))
            .with_state(hooks.clone()),
    )
    .await;

    let mut scratch = Scratch::create().await;
    let tiers = vec![200u64, 400];
    scratch.owns(Topology::new(
        scratch.prefix.clone(),
        tiers.clone(),
        DELIVERY_LIMIT,
    ));
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers.toml");
    // No retries in the client: the 503 reaches the worker, which retries the job.
    std::fs::write(
        &providers,
        format!(
            "default = \"mock\"\n[providers.mock]\nkind = \"openai\"\nbase_url = \"http://{provider}/v1\"\nmodel = \"mock-model\"\nmax_retries = 0\n"
        ),
    )
    .unwrap();
    let cache = dir.path().join("cache");
    let env: Vec<(String, String)> = [
        ("DATABASE_URL", scratch.db_url.clone()),
        ("AMQP_URL", amqp_url()),
        ("SKILLEVAL__AMQP__PREFIX", scratch.prefix.clone()),
        ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
        ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
        ("SKILLEVAL__WORKER__RETRY_TIERS_MS", "200,400".into()),
        ("SKILLEVAL__WORKER__BATCH_MAX_WAIT_MS", "10".into()),
        (
            "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
            cache.display().to_string(),
        ),
        (
            "SKILLEVAL__LLM__PROVIDERS_FILE",
            providers.display().to_string(),
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{collector}")),
        // Longer than the test: the spans arrive only through the flush on SIGTERM.
        ("OTEL_BSP_SCHEDULE_DELAY", "600000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_soak"));
    let (coordinator, port) = Proc::spawn_exe(exe, "coordinator", &env).expect("coordinator");
    let port = port.expect("the coordinator's port");
    let (worker, _) = Proc::spawn_exe(exe, "worker", &env).expect("worker");

    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let upload: Value = http
        .post(format!(
            "{base}/v1/skills?callback_url=http://{webhook}/hook"
        ))
        .header("Content-Type", "application/zip")
        .body(package())
        .send()
        .await
        .expect("upload")
        .json()
        .await
        .expect("upload answer");
    let run_id = upload["run_id"].as_str().expect("a run id").to_string();
    // A hang guard for a run of child processes: generous, so a busy machine is not a failure.
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        let run: Value = http
            .get(format!("{base}/v1/runs/{run_id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if run["verdict"].is_string() || Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        run["verdict"], "pass",
        "(no verdict: the 120 s wait is a hang guard) {run:#}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "one failed call, two answers"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while hooks.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        hooks.load(Ordering::SeqCst),
        1,
        "the webhook was delivered (hang guard: waited up to 120 s)"
    );
    assert!(stop(worker).await, "the worker exits cleanly on SIGTERM");
    assert!(
        stop(coordinator).await,
        "the coordinator exits cleanly on SIGTERM"
    );

    let spans = spans.lock().unwrap().clone();
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32 && s.name == "POST /v1/skills")
        .unwrap_or_else(|| panic!("no SERVER span for the upload in {spans:#?}"));
    assert_eq!(server.service, "skilleval-coordinator");
    assert_eq!(server.str("http.request.method"), Some("POST"));
    assert_eq!(server.str("http.route"), Some("/v1/skills"));
    assert_eq!(server.int("http.response.status_code"), Some(201));
    assert_eq!(server.str("skilleval.run_id"), Some(run_id.as_str()));
    let trace = server.trace_id.clone();
    let in_trace: Vec<&Got> = spans.iter().filter(|s| s.trace_id == trace).collect();
    let by_id: HashMap<&str, &Got> = in_trace.iter().map(|s| (s.span_id.as_str(), *s)).collect();
    for s in &in_trace {
        assert_eq!(
            s.str("skilleval.run_id"),
            Some(run_id.as_str()),
            "every span of the trace names the run: {s:#?}"
        );
    }

    // The coordinator's batch publish: one PRODUCER span, a child of the request.
    let sends: Vec<&&Got> = in_trace
        .iter()
        .filter(|s| s.kind == SpanKind::Producer as i32 && s.service == "skilleval-coordinator")
        .collect();
    assert_eq!(sends.len(), 1, "{sends:#?}");
    let send = sends[0];
    let jobs_exchange = format!("{}.jobs", scratch.prefix);
    assert_eq!(send.name, format!("send {jobs_exchange}"));
    assert_eq!(send.parent, server.span_id);
    assert_eq!(send.str("messaging.system"), Some("rabbitmq"));
    assert_eq!(send.str("messaging.operation.type"), Some("send"));
    assert_eq!(
        send.str("messaging.destination.name"),
        Some(jobs_exchange.as_str())
    );
    assert_eq!(
        send.str("messaging.rabbitmq.destination.routing_key"),
        Some("job")
    );
    assert_eq!(send.int("messaging.batch.message_count"), Some(2));

    // The worker: one CONSUMER span per delivery, all in the trace; three deliveries (two cases,
    // one retried).
    let processes: Vec<&Got> = in_trace
        .iter()
        .copied()
        .filter(|s| s.kind == SpanKind::Consumer as i32)
        .collect();
    assert_eq!(processes.len(), 3, "{processes:#?}");
    let jobs_queue = format!("{}.jobs", scratch.prefix);
    for p in &processes {
        assert_eq!(p.service, "skilleval-worker");
        assert_eq!(p.name, format!("process {jobs_queue}"));
        assert_eq!(p.str("messaging.system"), Some("rabbitmq"));
        assert_eq!(p.str("messaging.operation.type"), Some("process"));
        let case = p.str("skilleval.test_case_id").expect("a test case id");
        let attempt = p.int("skilleval.attempt").expect("an attempt");
        assert_eq!(
            p.str("messaging.message.id"),
            Some(format!("{run_id}/{case}/{attempt}").as_str())
        );
    }
    let first_attempts: Vec<&&Got> = processes
        .iter()
        .filter(|p| p.int("skilleval.attempt") == Some(1))
        .collect();
    assert_eq!(first_attempts.len(), 2);
    for p in &first_attempts {
        assert_eq!(p.parent, send.span_id, "producer -> consumer: {p:#?}");
    }

    // The retry: the failed attempt's span published it; the second attempt is the child of
    // that publish, in the same trace.
    let retried = processes
        .iter()
        .find(|p| p.int("skilleval.attempt") == Some(2))
        .expect("a second attempt");
    assert_eq!(retried.str("skilleval.disposition"), Some("passed"));
    let retry_send = by_id
        .get(retried.parent.as_str())
        .expect("the retry's send span");
    assert_eq!(retry_send.kind, SpanKind::Producer as i32);
    assert_eq!(retry_send.service, "skilleval-worker");
    assert_eq!(retry_send.name, "send amq.default");
    let delay_queue = retry_send
        .str("messaging.rabbitmq.destination.routing_key")
        .unwrap_or_default();
    assert!(
        delay_queue.starts_with(&format!("{}.retry.", scratch.prefix)),
        "the retry goes to a delay queue: {retry_send:#?}"
    );
    assert_eq!(retry_send.int("skilleval.attempt"), Some(2));
    let failed = by_id
        .get(retry_send.parent.as_str())
        .expect("the failed attempt's span");
    assert_eq!(failed.kind, SpanKind::Consumer as i32);
    assert_eq!(failed.int("skilleval.attempt"), Some(1));
    assert_eq!(failed.str("skilleval.disposition"), Some("retried"));
    assert_eq!(
        failed.str("skilleval.test_case_id"),
        retried.str("skilleval.test_case_id")
    );

    // The children of each delivery, with the case's ids.
    let children_of = |p: &Got, name: &str| -> Vec<&Got> {
        in_trace
            .iter()
            .copied()
            .filter(|s| s.parent == p.span_id && s.name.starts_with(name))
            .collect()
    };
    let failed_call = children_of(failed, "chat")
        .pop()
        .expect("the failed runner call's span");
    assert_eq!(failed_call.str("error.type"), Some("transient"));
    for p in processes
        .iter()
        .filter(|p| p.str("skilleval.disposition") == Some("passed"))
    {
        let case = p.str("skilleval.test_case_id");
        let runner = children_of(p, "chat");
        assert_eq!(runner.len(), 1, "one runner call under {p:#?}");
        let runner = runner[0];
        assert_eq!(runner.str("gen_ai.operation.name"), Some("chat"));
        assert_eq!(runner.str("gen_ai.provider.name"), Some("mock"));
        assert_eq!(runner.str("gen_ai.request.model"), Some("mock-model"));
        assert_eq!(runner.int("gen_ai.usage.input_tokens"), Some(11));
        assert_eq!(runner.int("gen_ai.usage.output_tokens"), Some(3));
        assert_eq!(runner.str("skilleval.test_case_id"), case);
        assert!(
            !runner.attrs.contains_key("gen_ai.input.messages")
                && !runner.attrs.contains_key("gen_ai.output.messages"),
            "no prompt or output text unless enabled: {runner:#?}"
        );
        let grade = children_of(p, "grade exact_match");
        assert_eq!(grade.len(), 1, "one grader under {p:#?}");
        assert_eq!(grade[0].str("skilleval.strategy"), Some("exact_match"));
        assert_eq!(
            grade[0].attrs.get("skilleval.score"),
            Some(&AttrValue::Float(1.0))
        );
        assert_eq!(
            grade[0].attrs.get("skilleval.passed"),
            Some(&AttrValue::Bool(true))
        );
        assert_eq!(grade[0].str("skilleval.test_case_id"), case);
        let commit = children_of(p, "commit result");
        assert_eq!(commit.len(), 1, "one commit under {p:#?}");
        assert_eq!(
            commit[0].attrs.get("skilleval.committed"),
            Some(&AttrValue::Bool(true))
        );
        assert_eq!(commit[0].str("skilleval.test_case_id"), case);
    }

    // The aggregation joins the trace of the request that created the run.
    let finalise = in_trace
        .iter()
        .find(|s| s.name == "finalise run")
        .unwrap_or_else(|| panic!("no finalisation span in the trace: {in_trace:#?}"));
    assert_eq!(finalise.service, "skilleval-coordinator");
    assert_eq!(finalise.parent, server.span_id);
    assert_eq!(finalise.str("skilleval.verdict"), Some("pass"));
    let delivery = in_trace
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap_or_else(|| panic!("no webhook span in the trace: {in_trace:#?}"));
    assert_eq!(delivery.name, "POST run.finished webhook");
    assert_eq!(delivery.parent, finalise.span_id);
    assert_eq!(delivery.str("skilleval.webhook.outcome"), Some("delivered"));
    drop(scratch);
}
