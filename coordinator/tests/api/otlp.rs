//! Trace ingest (issue 31, item 2): GenAI spans sent by the real OpenTelemetry SDK, configured
//! as an application configures it (an OTLP/HTTP span exporter with a bearer token header,
//! gzip, a batch processor), to `POST /v1/otlp/v1/traces` of a coordinator started here. The
//! exports pass through a loopback proxy that keeps each exchange, so the test reads the OTLP
//! responses the SDK got (the partial success) and can send an export again byte for byte,
//! as a collector's retry does. Then the limits (item 4): 413 naming the key for an export
//! over the samples or (inflated) bytes limit, 400/415 for bodies that are not OTLP, and 429
//! with `Retry-After` past the request rate.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Router;
use opentelemetry::trace::{
    Span as _, SpanContext, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Compression, Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceResponse,
};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use prost::Message as _;
use serde_json::Value;

use crate::e2e::start_worker_with;
use crate::helpers::{spawn_app_with, AppOptions, TestApp};
use crate::sampling::{monitored_package, says_ok};

const TOKEN: &str = "otlp-test-token";

/// One request the proxy forwarded, and the coordinator's answer.
#[derive(Debug, Clone)]
struct Exchange {
    headers: HeaderMap,
    body: Bytes,
    status: u16,
    content_type: String,
    answer: Bytes,
}

#[derive(Clone)]
struct Proxy {
    target: String,
    client: reqwest::Client,
    seen: Arc<Mutex<Vec<Exchange>>>,
}

async fn forward(State(proxy): State<Proxy>, request: Request) -> axum::response::Response {
    let path = request.uri().path().to_string();
    let headers = request.headers().clone();
    let body = axum::body::to_bytes(request.into_body(), usize::MAX)
        .await
        .expect("the request body");
    let mut out = proxy
        .client
        .post(format!("{}{path}", proxy.target))
        .body(body.clone());
    for name in ["content-type", "content-encoding", "authorization"] {
        if let Some(v) = headers.get(name) {
            out = out.header(name, v);
        }
    }
    let answer = out.send().await.expect("the coordinator answers");
    let status = answer.status().as_u16();
    let content_type = answer
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = answer.bytes().await.expect("the answer's body");
    proxy.seen.lock().expect("lock").push(Exchange {
        headers,
        body,
        status,
        content_type: content_type.clone(),
        answer: bytes.clone(),
    });
    (
        axum::http::StatusCode::from_u16(status).expect("a status"),
        [("content-type", content_type)],
        bytes,
    )
        .into_response()
}

async fn start_proxy(app: &TestApp) -> (String, Arc<Mutex<Vec<Exchange>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let proxy = Proxy {
        target: app.address.clone(),
        client: reqwest::Client::new(),
        seen: seen.clone(),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let router = Router::new().fallback(forward).with_state(proxy);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{addr}"), seen)
}

/// A tracer provider as an application sets one up: OTLP/HTTP to `endpoint` with its token,
/// gzip, a batch processor (its delay longer than the test: the flush sends one export).
fn provider(endpoint: &str, protocol: Protocol) -> SdkTracerProvider {
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_endpoint(format!("{endpoint}/v1/otlp/v1/traces"))
        .with_headers(HashMap::from([(
            "authorization".to_string(),
            format!("Bearer {TOKEN}"),
        )]));
    if protocol == Protocol::HttpBinary {
        builder = builder.with_compression(Compression::Gzip);
    }
    let exporter = builder.build().expect("the OTLP exporter");
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(Duration::from_secs(600))
                .build(),
        )
        .build();
    SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name("shop").build())
        .with_span_processor(processor)
        .build()
}

/// The spans one shop request makes, as its instrumentation records them; the span contexts
/// of the samples they should become (the agent, the older-form chat).
fn shop_traffic(provider: &SdkTracerProvider) -> (SpanContext, SpanContext) {
    let tracer = provider.tracer("shop-agent");
    // An agent (current conventions) calling a model and a tool.
    let agent = tracer
        .span_builder("invoke_agent support")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "invoke_agent"),
            KeyValue::new("gen_ai.agent.name", "support"),
        ])
        .start(&tracer);
    let agent_cx = opentelemetry::Context::current_with_span(agent);
    let mut chat = tracer
        .span_builder("chat shop-model")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.request.model", "shop-model"),
            KeyValue::new(
                "gen_ai.input.messages",
                r#"[{"role":"user","parts":[{"type":"text","content":"Where is order 42?"}]}]"#,
            ),
            KeyValue::new(
                "gen_ai.output.messages",
                r#"[{"role":"assistant","parts":[{"type":"text","content":"ok, order 42 ships today"}],"finish_reason":"stop"}]"#,
            ),
        ])
        .start_with_context(&tracer, &agent_cx);
    chat.end();
    let mut tool = tracer
        .span_builder("execute_tool lookup_order")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", "lookup_order"),
            KeyValue::new("gen_ai.tool.call.arguments", r#"{"order": 42}"#),
        ])
        .start_with_context(&tracer, &agent_cx);
    tool.end();
    let agent_ids = agent_cx.span().span_context().clone();
    agent_cx.span().end();

    // A model call in the older event forms, naming its skill with skilleval.skill.
    let mut older = tracer
        .span_builder("chat old-model")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.system", "openai"),
            KeyValue::new("skilleval.skill", "support"),
        ])
        .start(&tracer);
    older.add_event(
        "gen_ai.user.message",
        vec![KeyValue::new("content", "Can I return shoes?")],
    );
    older.add_event(
        "gen_ai.choice",
        vec![KeyValue::new(
            "message",
            r#"{"role":"assistant","content":"No idea."}"#,
        )],
    );
    let older_ids = older.span_context().clone();
    older.end();

    // Unmappable: a model call that names no skill, and one for a skill that does not exist.
    let mut anonymous = tracer
        .span_builder("chat anonymous")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new(
                "gen_ai.input.messages",
                r#"[{"role":"user","parts":[{"type":"text","content":"hi"}]}]"#,
            ),
            KeyValue::new(
                "gen_ai.output.messages",
                r#"[{"role":"assistant","parts":[{"type":"text","content":"hello"}]}]"#,
            ),
        ])
        .start(&tracer);
    anonymous.end();
    let mut stranger = tracer
        .span_builder("chat stranger")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("skilleval.skill", "no-such-skill"),
            KeyValue::new(
                "gen_ai.input.messages",
                r#"[{"role":"user","parts":[{"type":"text","content":"hi"}]}]"#,
            ),
            KeyValue::new(
                "gen_ai.output.messages",
                r#"[{"role":"assistant","parts":[{"type":"text","content":"ok"}]}]"#,
            ),
        ])
        .start(&tracer);
    stranger.end();
    (agent_ids, older_ids)
}

/// One JSON-encoded export: a single model call.
fn json_traffic(provider: &SdkTracerProvider) -> SpanContext {
    let tracer = provider.tracer("shop-agent");
    let mut chat = tracer
        .span_builder("chat shop-model")
        .with_attributes(vec![
            KeyValue::new("gen_ai.operation.name", "chat"),
            KeyValue::new("gen_ai.agent.name", "support"),
            KeyValue::new(
                "gen_ai.input.messages",
                r#"[{"role":"user","parts":[{"type":"text","content":"Is the shop open?"}]}]"#,
            ),
            KeyValue::new(
                "gen_ai.output.messages",
                r#"[{"role":"assistant","parts":[{"type":"text","content":"ok, until six"}]}]"#,
            ),
        ])
        .start(&tracer);
    let ids = chat.span_context().clone();
    chat.end();
    ids
}

/// Runs `traffic` against a new provider on a thread of its own (the exporter's HTTP client
/// is a blocking one), flushes and shuts it down.
async fn export_with<T: Send + 'static>(
    endpoint: String,
    protocol: Protocol,
    traffic: fn(&SdkTracerProvider) -> T,
) -> T {
    tokio::task::spawn_blocking(move || {
        let provider = provider(&endpoint, protocol);
        let out = traffic(&provider);
        provider.force_flush().expect("the export is flushed");
        provider.shutdown().expect("the provider shuts down");
        out
    })
    .await
    .expect("the exporting thread")
}

fn sample_id(cx: &SpanContext) -> String {
    format!("{}-{}", cx.trace_id(), cx.span_id())
}

async fn count(app: &TestApp, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&app.pool)
        .await
        .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn genai_spans_from_the_sdk_become_graded_samples_and_a_resent_export_is_all_duplicates() {
    let app = spawn_app_with(AppOptions {
        background: true,
        auth_tokens: vec![TOKEN.into()],
        ..AppOptions::default()
    })
    .await;
    let uploaded = app
        .upload_zip_as(monitored_package("support", says_ok(1.0)), TOKEN)
        .await;
    assert!(uploaded["run_id"].is_string(), "{uploaded}");
    let (proxy, seen) = start_proxy(&app).await;

    let (agent, older) = export_with(proxy.clone(), Protocol::HttpBinary, shop_traffic).await;
    let first: Vec<Exchange> = seen.lock().expect("lock").clone();
    assert!(!first.is_empty(), "the SDK exported");
    let export = &first[0];
    assert_eq!(
        export
            .headers
            .get("content-encoding")
            .and_then(|v| v.to_str().ok()),
        Some("gzip")
    );
    let mut partial = ExportTracePartialSuccess::default();
    for exchange in &first {
        assert_eq!(
            exchange.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&exchange.answer)
        );
        assert_eq!(exchange.content_type, "application/x-protobuf");
        let answer =
            ExportTraceServiceResponse::decode(exchange.answer.clone()).expect("an OTLP answer");
        if let Some(p) = answer.partial_success {
            partial.rejected_spans += p.rejected_spans;
            partial.error_message.push_str(&p.error_message);
        }
    }
    assert_eq!(partial.rejected_spans, 2, "{}", partial.error_message);
    assert!(
        partial.error_message.contains("without a skill attribute"),
        "{}",
        partial.error_message
    );
    assert!(
        partial
            .error_message
            .contains("`no-such-skill` does not exist"),
        "{}",
        partial.error_message
    );

    // The JSON encoding, from the SDK too.
    let json_sample = export_with(proxy.clone(), Protocol::HttpJson, json_traffic).await;
    let second = seen.lock().expect("lock")[first.len()].clone();
    assert_eq!(
        second.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&second.answer)
    );
    assert!(second.content_type.starts_with("application/json"));
    let answer: Value = serde_json::from_slice(&second.answer).expect("a JSON answer");
    assert!(
        answer.get("partialSuccess").is_none_or(Value::is_null),
        "every span mapped: {answer}"
    );

    let sampled = count(
        &app,
        "SELECT count(*) FROM samples WHERE disposition = 'sampled'",
    )
    .await;
    assert_eq!(sampled, 3);
    let runs_before = count(&app, "SELECT count(*) FROM runs WHERE kind = 'samples'").await;
    assert_eq!(runs_before, 2, "one samples run per export");

    // The same export again, byte for byte, as a collector retries it: all duplicates.
    let mut again = app
        .client
        .post(format!("{}/v1/otlp/v1/traces", app.address))
        .body(export.body.clone());
    for name in ["content-type", "content-encoding", "authorization"] {
        if let Some(v) = export.headers.get(name) {
            again = again.header(name, v);
        }
    }
    let again = again.send().await.expect("the re-send");
    assert_eq!(again.status().as_u16(), 200);
    assert_eq!(
        count(&app, "SELECT count(*) FROM samples").await,
        3,
        "nothing new stored"
    );
    assert_eq!(
        count(&app, "SELECT count(*) FROM runs WHERE kind = 'samples'").await,
        runs_before,
        "no new samples run: nothing was sampled twice"
    );
    // Behind the same tokens.
    let anonymous = app
        .client
        .post(format!("{}/v1/otlp/v1/traces", app.address))
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", "gzip")
        .body(export.body.clone())
        .send()
        .await
        .expect("an anonymous send");
    assert_eq!(anonymous.status().as_u16(), 401);

    // The worker grades them with the skill's monitor, on the samples lane.
    let cache = tempfile::tempdir().expect("a cache dir");
    let (stop, worker) = start_worker_with(app.settings.clone(), cache.path()).await;
    let mut graded = 0;
    for _ in 0..600 {
        graded = count(&app, "SELECT count(*) FROM sample_results").await;
        if graded >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(graded, 3, "hang guard: waited up to 60 s");
    let statuses: HashMap<String, String> =
        sqlx::query_as::<_, (String, String)>("SELECT sample_id, status FROM sample_results")
            .fetch_all(&app.pool)
            .await
            .expect("the results")
            .into_iter()
            .collect();
    assert_eq!(
        statuses.get(&sample_id(&agent)).map(String::as_str),
        Some("passed")
    );
    assert_eq!(
        statuses.get(&sample_id(&older)).map(String::as_str),
        Some("failed")
    );
    assert_eq!(
        statuses.get(&sample_id(&json_sample)).map(String::as_str),
        Some("passed")
    );
    let body: String = sqlx::query_scalar("SELECT body FROM samples WHERE sample_id = $1")
        .bind(sample_id(&agent))
        .fetch_one(&app.pool)
        .await
        .expect("the agent's sample");
    let body: Value = serde_json::from_str(&body).expect("a sample");
    assert_eq!(body["input"], "Where is order 42?");
    assert_eq!(body["output"], "ok, order 42 ships today");
    assert_eq!(body["tool_calls"][0]["name"], "lookup_order");
    assert_eq!(body["tool_calls"][0]["arguments"]["order"], 42);
    assert_eq!(
        body["traceparent"],
        format!("00-{}-{}-01", agent.trace_id(), agent.span_id())
    );
    let older_body: String = sqlx::query_scalar("SELECT body FROM samples WHERE sample_id = $1")
        .bind(sample_id(&older))
        .fetch_one(&app.pool)
        .await
        .expect("the older sample");
    let older_body: Value = serde_json::from_str(&older_body).expect("a sample");
    assert_eq!(older_body["input"], "Can I return shoes?");
    assert_eq!(older_body["output"], "No idea.");
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), worker).await;
    app.cleanup().await;
}

/// An export of `n` GenAI operations (one span each) built from the OTLP messages, for the
/// limits: what the SDK sends is covered above.
fn operations(
    n: u8,
) -> opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue as Kv};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    let kv = |k: &str, v: &str| Kv {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.into())),
        }),
    };
    let spans = (1..=n)
        .map(|i| Span {
            trace_id: vec![i; 16],
            span_id: vec![i; 8],
            name: "chat".into(),
            end_time_unix_nano: 1,
            attributes: vec![
                kv("gen_ai.operation.name", "chat"),
                kv("skilleval.skill", "limited"),
                kv(
                    "gen_ai.input.messages",
                    r#"[{"role":"user","parts":[{"type":"text","content":"hi"}]}]"#,
                ),
                kv(
                    "gen_ai.output.messages",
                    r#"[{"role":"assistant","parts":[{"type":"text","content":"ok"}]}]"#,
                ),
            ],
            ..Span::default()
        })
        .collect();
    opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).expect("gzip");
    gz.finish().expect("gzip")
}

async fn post_export(
    app: &TestApp,
    content_type: &str,
    encoding: Option<&str>,
    body: Vec<u8>,
) -> (u16, Value) {
    let mut request = app
        .client
        .post(format!("{}/v1/otlp/v1/traces", app.address))
        .header("content-type", content_type)
        .body(body);
    if let Some(e) = encoding {
        request = request.header("content-encoding", e);
    }
    let r = request.send().await.expect("a send");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn exports_over_the_limits_are_413_naming_the_key_and_bad_bodies_are_400_or_415() {
    let app = crate::helpers::spawn_app_configured(AppOptions::default(), |s| {
        s.coordinator.sampling.max_batch_samples = 2;
        s.coordinator.sampling.max_batch_bytes = 4_000;
    })
    .await;
    // Three operations for a limit of two.
    let (status, body) = post_export(
        &app,
        "application/x-protobuf",
        None,
        operations(3).encode_to_vec(),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"]["details"]["limit"],
        "coordinator.sampling.max_batch_samples"
    );
    // Small compressed, over the limit once inflated: refused without inflating it whole.
    let mut padded = operations(1);
    padded.resource_spans[0].scope_spans[0].spans[0].name = "x".repeat(50_000);
    let compressed = gzip(&padded.encode_to_vec());
    assert!(compressed.len() < 4_000);
    let (status, body) =
        post_export(&app, "application/x-protobuf", Some("gzip"), compressed).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body["error"]["details"]["limit"],
        "coordinator.sampling.max_batch_bytes"
    );
    // Within the limits, JSON and gzip: answered with a partial success (no such skill).
    let json = serde_json::to_vec(&operations(2)).expect("OTLP JSON");
    let r = app
        .client
        .post(format!("{}/v1/otlp/v1/traces", app.address))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(gzip(&json))
        .send()
        .await
        .expect("a send");
    assert_eq!(r.status().as_u16(), 200);
    let answer: Value = r.json().await.expect("a JSON answer");
    assert_eq!(answer["partialSuccess"]["rejectedSpans"], 2, "{answer}");
    // Bodies that are not OTLP.
    let (status, body) = post_export(&app, "text/plain", None, b"hello".to_vec()).await;
    assert_eq!(
        (status, body["error"]["details"]["field"].as_str()),
        (415, Some("content-type"))
    );
    let (status, body) =
        post_export(&app, "application/x-protobuf", Some("br"), b"x".to_vec()).await;
    assert_eq!(
        (status, body["error"]["details"]["field"].as_str()),
        (415, Some("content-encoding"))
    );
    let (status, body) = post_export(
        &app,
        "application/x-protobuf",
        None,
        b"\xff\xff\xff".to_vec(),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = post_export(
        &app,
        "application/x-protobuf",
        Some("gzip"),
        b"not gzip".to_vec(),
    )
    .await;
    assert_eq!(status, 400);
    app.cleanup().await;
}

#[tokio::test]
async fn exports_past_the_request_rate_are_429_with_retry_after() {
    let app = crate::helpers::spawn_app_configured(
        AppOptions {
            auth_tokens: vec![TOKEN.into()],
            ..AppOptions::default()
        },
        |s| s.coordinator.quotas.token.requests_per_second = Some(1),
    )
    .await;
    let mut refused = None;
    for _ in 0..4 {
        let r = app
            .client
            .post(format!("{}/v1/otlp/v1/traces", app.address))
            .bearer_auth(TOKEN)
            .header("content-type", "application/x-protobuf")
            .body(operations(1).encode_to_vec())
            .send()
            .await
            .expect("a send");
        if r.status().as_u16() == 429 {
            refused = Some(r);
            break;
        }
        assert_eq!(r.status().as_u16(), 200);
    }
    let refused = refused.expect("a 429 within 4 requests at 1 per second");
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in whole seconds");
    assert!(retry_after >= 1);
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(
        body["error"]["details"]["limit"],
        "coordinator.quotas.token.requests_per_second"
    );
    app.cleanup().await;
}
