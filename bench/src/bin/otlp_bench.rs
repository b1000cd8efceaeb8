//! Trace ingest throughput (issue 31): OTLP exports of GenAI traces against JSON sample
//! batches, on the same coordinator in the same run.
//!
//! Run with `cargo run --release -p skilleval-bench --bin otlp_bench -- [--samples 20000]
//! [--spans-per-trace 3] [--rounds 3]`.
//!
//! One coordinator (a child process configured like the binary) on the local PostgreSQL and
//! RabbitMQ (`SKILLEVAL_BENCH_PG` / `SKILLEVAL_BENCH_AMQP`), in a database and queue prefix of
//! its own, both removed at the end. Two skills with the same monitor (`sample_rate` 1, one
//! `contains` criterion), so every sample is stored with its body and planned into a samples
//! run either way; no worker runs (grading is the same `given` job whichever way a sample came,
//! measured by `sampling_bench`).
//!
//! - **JSON**: `--samples` samples in batches of 1,000 to `POST /v1/skills/{name}/samples`.
//! - **OTLP**: as many GenAI operations, each a trace of `--spans-per-trace` spans (an
//!   `invoke_agent` with `gen_ai.agent.name`, a `chat` child carrying the messages, then
//!   `execute_tool` children), 1,000 operations per export, protobuf with gzip as a
//!   collector's `otlphttp` exporter sends them, to `POST /v1/otlp/v1/traces`.
//!
//! The exports are encoded before the clock starts; each side's time is its requests, sent
//! one after the other. The two alternate for `--rounds` rounds (fresh ids each round) and
//! every round's figures are printed: spans/s and samples/s for OTLP, samples/s for JSON, and
//! the ratio of samples/s.

use std::io::Write as _;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message as _;
use serde_json::{json, Value};
use skilleval_bench::cluster::{self, amqp_url, Proc};
use skilleval_infra::store::Store;
use zip::write::SimpleFileOptions;
use zip::ZipWriter;

const BATCH: usize = 1_000;

struct Options {
    samples: usize,
    spans_per_trace: usize,
    rounds: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        samples: 20_000,
        spans_per_trace: 3,
        rounds: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--samples" => o.samples = value()?.parse()?,
            "--spans-per-trace" => o.spans_per_trace = value()?.parse::<usize>()?.max(2),
            "--rounds" => o.rounds = value()?.parse::<usize>()?.max(1),
            other => bail!("unknown option {other}"),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    if let Some(outcome) = cluster::child_main() {
        return outcome;
    }
    let opts = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(cluster::in_scratch("obench", |db_url, prefix| async move {
        Box::pin(bench(&db_url, &prefix, &opts)).await
    }))
}

fn package(name: &str) -> anyhow::Result<Vec<u8>> {
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": "given"},
        "testCases": [{"id": "one", "input": {"prompt": "refund?"}, "given": {"output": "refund approved"},
                       "expected": {"includes": ["refund"]}, "evaluation": {"strategy": "contains"}}],
        "monitoring": {"sample_rate": 1.0, "criteria": [
            {"name": "mentions-refund", "strategy": "contains", "options": {"includes": ["refund"]}}
        ]}
    });
    let skill = format!(
        "---\nname: {name}\ndescription: Refund answers, for the trace ingest benchmark.\n---\n\nAnswer.\n"
    );
    let mut w = ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default();
    w.start_file(format!("{name}/SKILL.md"), options)?;
    w.write_all(skill.as_bytes())?;
    w.start_file(format!("{name}/eval/tests.json"), options)?;
    w.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(w.finish()?.into_inner())
}

fn output(i: usize) -> String {
    format!(
        "The refund for order {} was approved; the money reaches your card within five business days.",
        10_000 + i
    )
}

fn kv(key: &str, value: String) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(Any::StringValue(value)),
        }),
    }
}

/// One export of `count` GenAI operations from `first` on, gzip-compressed protobuf.
fn export(
    round: usize,
    first: usize,
    count: usize,
    spans_per_trace: usize,
) -> anyhow::Result<Vec<u8>> {
    let mut spans = Vec::with_capacity(count * spans_per_trace);
    for i in first..first + count {
        let mut trace = [0u8; 16];
        trace[..8].copy_from_slice(&(round as u64 + 1).to_be_bytes());
        trace[8..].copy_from_slice(&(i as u64 + 1).to_be_bytes());
        let id = |n: u64| (n + 1).to_be_bytes().to_vec();
        let start = 1_764_000_000_000_000_000u64 + i as u64 * 1_000_000;
        let span = |n: u64, parent: Option<u64>, name: String, attributes: Vec<KeyValue>| Span {
            trace_id: trace.to_vec(),
            span_id: id(n),
            parent_span_id: parent.map(id).unwrap_or_default(),
            name,
            kind: 1,
            start_time_unix_nano: start + n,
            end_time_unix_nano: start + 500_000 + n,
            attributes,
            ..Span::default()
        };
        spans.push(span(
            0,
            None,
            "invoke_agent refunds".into(),
            vec![
                kv("gen_ai.operation.name", "invoke_agent".into()),
                kv("gen_ai.agent.name", "traced".into()),
            ],
        ));
        spans.push(span(
            1,
            Some(0),
            "chat refund-model".into(),
            vec![
                kv("gen_ai.operation.name", "chat".into()),
                kv("gen_ai.request.model", "refund-model".into()),
                kv(
                    "gen_ai.input.messages",
                    json!([{"role": "user", "parts": [{"type": "text", "content": format!("Where is the refund for order {}?", 10_000 + i)}]}]).to_string(),
                ),
                kv(
                    "gen_ai.output.messages",
                    json!([{"role": "assistant", "parts": [{"type": "text", "content": output(i)}], "finish_reason": "stop"}]).to_string(),
                ),
            ],
        ));
        for t in 2..spans_per_trace as u64 {
            spans.push(span(
                t,
                Some(0),
                "execute_tool lookup_order".into(),
                vec![
                    kv("gen_ai.operation.name", "execute_tool".into()),
                    kv("gen_ai.tool.name", "lookup_order".into()),
                    kv(
                        "gen_ai.tool.call.arguments",
                        format!("{{\"order\": {}}}", 10_000 + i),
                    ),
                ],
            ));
        }
    }
    let request = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "refund-desk".into())],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&request.encode_to_vec())?;
    Ok(gz.finish()?)
}

async fn send_json(
    http: &reqwest::Client,
    base: &str,
    batches: &[Vec<Value>],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for batch in batches {
        let response = http
            .post(format!("{base}/v1/skills/sampled/samples"))
            .json(batch)
            .send()
            .await?;
        let answer = cluster::expect_status(response, 200, "a JSON batch").await?;
        if answer["sampled"].as_u64() != Some(batch.len() as u64) {
            bail!("not every sample was taken: {answer}");
        }
    }
    Ok(started.elapsed())
}

async fn send_otlp(
    http: &reqwest::Client,
    base: &str,
    exports: &[Vec<u8>],
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for body in exports {
        let response = http
            .post(format!("{base}/v1/otlp/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "gzip")
            .body(body.clone())
            .send()
            .await?;
        let status = response.status();
        let answer = response.bytes().await?;
        if !status.is_success() {
            bail!("an export: {status} {}", String::from_utf8_lossy(&answer));
        }
        let answer =
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse::decode(
                answer,
            )?;
        if let Some(p) = answer.partial_success.filter(|p| p.rejected_spans > 0) {
            bail!("{} spans rejected: {}", p.rejected_spans, p.error_message);
        }
    }
    Ok(started.elapsed())
}

async fn bench(db_url: &str, prefix: &str, opts: &Options) -> anyhow::Result<()> {
    let store = Store::connect_url(db_url, 2).await?;
    store.migrate().await?;
    let env: Vec<(String, String)> = [
        ("DATABASE_URL", db_url.to_string()),
        ("AMQP_URL", amqp_url()),
        ("SKILLEVAL__AMQP__PREFIX", prefix.to_string()),
        ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (_coordinator, port) = Proc::spawn("coordinator", &env)?;
    let base = format!("http://127.0.0.1:{}", port.context("no port")?);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    for name in ["sampled", "traced"] {
        cluster::upload_version(&http, &base, package(name)?).await?;
    }
    println!(
        "otlp_bench: {} samples per side per round ({} spans per trace, batches of {BATCH}), {} rounds, {} cores",
        opts.samples,
        opts.spans_per_trace,
        opts.rounds,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
    );
    for round in 0..opts.rounds {
        let batches: Vec<Vec<Value>> = (0..opts.samples)
            .step_by(BATCH)
            .map(|first| {
                (first..opts.samples.min(first + BATCH))
                    .map(|i| json!({"sample_id": format!("r{round}-{i:07}"),
                                    "input": format!("Where is the refund for order {}?", 10_000 + i),
                                    "output": output(i),
                                    "tool_calls": [{"name": "lookup_order", "arguments": {"order": 10_000 + i}}]}))
                    .collect()
            })
            .collect();
        let exports: Vec<Vec<u8>> = (0..opts.samples)
            .step_by(BATCH)
            .map(|first| {
                export(
                    round,
                    first,
                    BATCH.min(opts.samples - first),
                    opts.spans_per_trace,
                )
            })
            .collect::<anyhow::Result<_>>()?;
        let export_bytes: usize = exports.iter().map(Vec::len).sum();
        let json_time = send_json(&http, &base, &batches).await?;
        let otlp_time = send_otlp(&http, &base, &exports).await?;
        let n = opts.samples as f64;
        let spans = n * opts.spans_per_trace as f64;
        let json_rate = n / json_time.as_secs_f64();
        let otlp_rate = n / otlp_time.as_secs_f64();
        println!(
            "round {}: JSON {n:.0} samples in {:.2} s = {json_rate:.0} samples/s; OTLP {spans:.0} spans ({:.1} MB gzip) in {:.2} s = {:.0} spans/s = {otlp_rate:.0} samples/s ({:.2}x JSON samples/s)",
            round + 1,
            json_time.as_secs_f64(),
            export_bytes as f64 / 1e6,
            otlp_time.as_secs_f64(),
            spans / otlp_time.as_secs_f64(),
            otlp_rate / json_rate,
        );
    }
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM samples")
        .fetch_one(store.pool())
        .await?;
    let want = i64::try_from(opts.samples * opts.rounds * 2)?;
    if stored != want {
        bail!("{stored} samples stored, {want} expected");
    }
    Ok(())
}
