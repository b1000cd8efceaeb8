//! Evaluation events end to end (issue 31, item 1): the real coordinator and worker processes
//! export to an OTLP receiver on loopback (the collector's HTTP protocol, bodies decoded with
//! the OTLP protobuf messages). Every graded case's `gen_ai.evaluation.result` events arrive
//! as log records with the convention's attributes and ours, parented to the case's CONSUMER
//! `process` span of the run's trace; with only a traces endpoint configured the spans arrive
//! and no event does. Both processes flush on SIGTERM (the batch delays are longer than the
//! test), so what the receiver holds after they exit is everything they emitted.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
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

#[derive(Debug, Clone, PartialEq)]
enum Attr {
    Str(String),
    Float(f64),
    Other,
}

/// One exported span.
#[derive(Debug, Clone)]
struct SpanGot {
    service: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    attrs: HashMap<String, Attr>,
}

/// One exported log record.
#[derive(Debug, Clone)]
struct EventGot {
    service: String,
    scope: String,
    event_name: String,
    trace_id: String,
    span_id: String,
    attrs: HashMap<String, Attr>,
}

impl EventGot {
    fn str(&self, key: &str) -> Option<&str> {
        match self.attrs.get(key) {
            Some(Attr::Str(s)) => Some(s),
            _ => None,
        }
    }
}

#[derive(Debug, Default)]
struct Received {
    spans: Vec<SpanGot>,
    events: Vec<EventGot>,
}

type Shared = Arc<Mutex<Received>>;

fn attr_map(attrs: &[KeyValue]) -> HashMap<String, Attr> {
    attrs
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => Attr::Str(s.clone()),
                Some(AnyValue::DoubleValue(f)) => Attr::Float(*f),
                _ => Attr::Other,
            };
            (kv.key.clone(), v)
        })
        .collect()
}

fn service_of(attrs: &[KeyValue]) -> String {
    match attr_map(attrs).remove("service.name") {
        Some(Attr::Str(s)) => s,
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn traces(State(got): State<Shared>, body: Bytes) -> axum::response::Response {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut spans = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .map(|r| service_of(&r.attributes))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                spans.push(SpanGot {
                    service: service.clone(),
                    kind: s.kind,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    attrs: attr_map(&s.attributes),
                });
            }
        }
    }
    got.lock().expect("lock").spans.extend(spans);
    (
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

async fn logs(State(got): State<Shared>, body: Bytes) -> axum::response::Response {
    let Ok(request) = ExportLogsServiceRequest::decode(body) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut events = Vec::new();
    for rl in request.resource_logs {
        let service = rl
            .resource
            .map(|r| service_of(&r.attributes))
            .unwrap_or_default();
        for sl in rl.scope_logs {
            for l in sl.log_records {
                events.push(EventGot {
                    service: service.clone(),
                    scope: sl
                        .scope
                        .as_ref()
                        .map(|s| s.name.clone())
                        .unwrap_or_default(),
                    event_name: l.event_name,
                    trace_id: hex(&l.trace_id),
                    span_id: hex(&l.span_id),
                    attrs: attr_map(&l.attributes),
                });
            }
        }
    }
    got.lock().expect("lock").events.extend(events);
    (
        [("content-type", "application/x-protobuf")],
        ExportLogsServiceResponse::default().encode_to_vec(),
    )
        .into_response()
}

async fn collector(got: Shared) -> SocketAddr {
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/logs", post(logs))
        .with_state(got);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the bound address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Two recorded outputs: `exact` passes `exact_match`; `blend` is a hybrid of `exact_match`
/// (fails: the output is not exactly `pong`) and `contains` (passes), 0.5 < 0.7, so it fails.
fn package() -> Vec<u8> {
    use std::io::Write as _;
    let tests = json!({
        "version": "2.0",
        "profile": "deterministic",
        "settings": {"runner": "given"},
        "testCases": [
            {"id": "exact", "name": "exact", "input": {"prompt": "ping"},
             "expected": {"output": "pong"}, "evaluation": {"strategy": "exact_match"},
             "given": {"output": "pong"}},
            {"id": "blend", "name": "blend", "input": {"prompt": "ping"},
             "expected": {"output": "pong"},
             "evaluation": {"strategy": "hybrid", "weights": {"exact_match": 1, "contains": 1},
                            "options": {"contains": {"includes": ["pong"]}}},
             "given": {"output": "ping pong"}}
        ]
    });
    let files: [(&str, Vec<u8>); 2] = [
        (
            "SKILL.md",
            b"---\nname: evaluated-skill\ndescription: Answers pong, for the evaluation events test.\n---\n\nAnswer pong.\n".to_vec(),
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

/// Runs the coordinator and the worker with `otel` added to their environment, uploads the
/// package, waits for the run's verdict and stops both (flushing their exporters). Returns
/// the run id.
async fn upload_and_grade(otel: &[(&str, String)]) -> String {
    let mut scratch = Scratch::create().await;
    scratch.owns(Topology::new(
        scratch.prefix.clone(),
        vec![200, 400],
        DELIVERY_LIMIT,
    ));
    let dir = tempfile::tempdir().expect("a temporary directory");
    let cache = dir.path().join("cache");
    let mut env: Vec<(String, String)> = [
        ("DATABASE_URL", scratch.db_url.clone()),
        ("AMQP_URL", amqp_url()),
        ("SKILLEVAL__AMQP__PREFIX", scratch.prefix.clone()),
        ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
        ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
        ("SKILLEVAL__WORKER__BATCH_MAX_WAIT_MS", "10".into()),
        (
            "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
            cache.display().to_string(),
        ),
        // Longer than the test: spans and events arrive only through the flush on SIGTERM.
        ("OTEL_BSP_SCHEDULE_DELAY", "600000".into()),
        ("OTEL_BLRP_SCHEDULE_DELAY", "600000".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    env.extend(otel.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_soak"));
    let (coordinator, port) = Proc::spawn_exe(exe, "coordinator", &env).expect("coordinator");
    let port = port.expect("the coordinator's port");
    let (worker, _) = Proc::spawn_exe(exe, "worker", &env).expect("worker");

    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let upload: Value = http
        .post(format!("{base}/v1/skills"))
        .header("Content-Type", "application/zip")
        .body(package())
        .send()
        .await
        .expect("upload")
        .json()
        .await
        .expect("upload answer");
    let run_id = upload["run_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a run id in {upload}"))
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    let run = loop {
        let run: Value = http
            .get(format!("{base}/v1/runs/{run_id}"))
            .send()
            .await
            .expect("the run")
            .json()
            .await
            .expect("the run's JSON");
        if run["verdict"].is_string() || Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        run["verdict"].is_string(),
        "(no verdict: the 60 s wait is a hang guard) {run:#}"
    );
    assert!(stop(worker).await, "the worker exits cleanly on SIGTERM");
    assert!(
        stop(coordinator).await,
        "the coordinator exits cleanly on SIGTERM"
    );
    run_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_graded_case_emits_evaluation_events_parented_to_its_span() {
    let got: Shared = Arc::default();
    let addr = collector(got.clone()).await;
    let run_id =
        upload_and_grade(&[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))]).await;
    let got = got.lock().expect("lock");

    // The case spans: the worker's CONSUMER `process` span of each case.
    let case_span = |case: &str| -> &SpanGot {
        let spans: Vec<&SpanGot> = got
            .spans
            .iter()
            .filter(|s| {
                s.kind == SpanKind::Consumer as i32
                    && s.attrs.get("skilleval.test_case_id") == Some(&Attr::Str(case.into()))
                    && s.attrs.get("skilleval.run_id") == Some(&Attr::Str(run_id.clone()))
            })
            .collect();
        assert_eq!(spans.len(), 1, "one delivery of `{case}`: {spans:#?}");
        assert_eq!(spans[0].service, "skilleval-worker");
        spans[0]
    };
    let events: Vec<&EventGot> = got
        .events
        .iter()
        .filter(|e| e.event_name == "gen_ai.evaluation.result")
        .collect();
    assert_eq!(
        events.len(),
        5,
        "exact: strategy + case; blend: two components + case: {events:#?}"
    );
    for e in &events {
        assert_eq!(e.service, "skilleval-worker");
        assert_eq!(e.scope, "skilleval");
        assert_eq!(e.str("skilleval.skill"), Some("evaluated-skill"));
        assert_eq!(e.str("skilleval.version"), Some("1"), "{e:#?}");
        assert_eq!(e.str("skilleval.run_id"), Some(run_id.as_str()));
        let case = e.str("skilleval.test_case_id").expect("the case");
        let span = case_span(case);
        assert_eq!(
            (e.trace_id.as_str(), e.span_id.as_str()),
            (span.trace_id.as_str(), span.span_id.as_str()),
            "parented to the case's span: {e:#?}"
        );
        assert!(!e.attrs.contains_key("error.type"), "{e:#?}");
    }
    let find = |case: &str, name: &str| -> &EventGot {
        events
            .iter()
            .copied()
            .find(|e| {
                e.str("skilleval.test_case_id") == Some(case)
                    && e.str("gen_ai.evaluation.name") == Some(name)
            })
            .unwrap_or_else(|| panic!("no `{name}` event for `{case}` in {events:#?}"))
    };
    let exact = find("exact", "exact_match");
    assert_eq!(exact.str("gen_ai.evaluation.score.label"), Some("pass"));
    assert_eq!(
        exact.attrs.get("gen_ai.evaluation.score.value"),
        Some(&Attr::Float(1.0))
    );
    assert_eq!(exact.str("skilleval.evaluation.level"), Some("strategy"));
    let exact_case = find("exact", "skilleval.case");
    assert_eq!(
        exact_case.str("gen_ai.evaluation.score.label"),
        Some("pass")
    );
    assert_eq!(exact_case.str("skilleval.evaluation.level"), Some("case"));

    let component = find("blend", "exact_match");
    assert_eq!(component.str("gen_ai.evaluation.score.label"), Some("fail"));
    assert_eq!(
        component.attrs.get("gen_ai.evaluation.score.value"),
        Some(&Attr::Float(0.0))
    );
    assert!(
        component.str("gen_ai.evaluation.explanation").is_some(),
        "a failed component explains itself: {component:#?}"
    );
    let contains = find("blend", "contains");
    assert_eq!(contains.str("gen_ai.evaluation.score.label"), Some("pass"));
    let blend = find("blend", "skilleval.case");
    assert_eq!(blend.str("gen_ai.evaluation.score.label"), Some("fail"));
    assert_eq!(
        blend.attrs.get("gen_ai.evaluation.score.value"),
        Some(&Attr::Float(0.5))
    );
    let explanation = blend
        .str("gen_ai.evaluation.explanation")
        .expect("a failed case explains itself");
    assert!(explanation.contains("hybrid"), "{explanation}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_evaluation_event_leaves_without_a_logs_endpoint() {
    let got: Shared = Arc::default();
    let addr = collector(got.clone()).await;
    // Traces only: the spans arrive (the receiver works and was reached), the events stay off.
    let run_id = upload_and_grade(&[(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        format!("http://{addr}/v1/traces"),
    )])
    .await;
    let got = got.lock().expect("lock");
    let consumers = got
        .spans
        .iter()
        .filter(|s| {
            s.kind == SpanKind::Consumer as i32
                && s.attrs.get("skilleval.run_id") == Some(&Attr::Str(run_id.clone()))
        })
        .count();
    assert_eq!(consumers, 2, "both cases' spans were exported");
    assert!(
        got.events.is_empty(),
        "no log record without a logs endpoint: {:#?}",
        got.events
    );
}
