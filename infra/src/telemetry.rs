//! Logging and tracing, set up in one place for every binary.
//!
//! **Logs.** The filter is an `EnvFilter` directive from [`LogSettings::filter`] (which
//! `RUST_LOG` overrides, see [`crate::config`]). The format is JSON lines when asked for
//! (`SKILLEVAL_LOG_FORMAT=json`) or, with the default `auto`, whenever stderr is not a terminal:
//! a process under a supervisor, in a container or in CI writes machine-readable lines that
//! carry the fields of the enclosing spans (`skilleval.run_id`, `skilleval.test_case_id`) and
//! the OpenTelemetry `trace_id` and `span_id` of the nearest traced span, and a person at a
//! terminal reads text. Logs go to stderr so stdout stays free for a binary's own output.
//!
//! **Traces.** `tracing` spans become OpenTelemetry spans through `tracing-opentelemetry`. Only
//! the spans that make up a run's trace are traced ([`TRACED_FIELDS`]): the HTTP request, the
//! broker's send and process spans, and the job's runner call, graders and result commit; the
//! finer spans of the code stay in the logs. The W3C trace context travels in the AMQP message
//! headers ([`crate::topology`]) and is stored with each run, so a job on any worker and the
//! run's aggregation join the trace of the request that created the run.
//!
//! Spans are exported over OTLP (HTTP, protobuf) only when an endpoint is configured
//! ([`TelemetrySettings::traces_url`]); then a batch processor exports them from a thread of its
//! own, and [`Telemetry::shutdown`] flushes what is left when the process stops. Without an
//! endpoint no exporter or processor is installed: span and trace ids are still made (they go
//! into the message headers and the logs), nothing is queued or sent.
//!
//! **Evaluation events.** With a logs endpoint ([`TelemetrySettings::logs_url`]) a logger
//! provider exports OTLP log records the same way, and [`Telemetry::evaluations`] hands out the
//! emitter of `gen_ai.evaluation.result` events ([`crate::evaluations`]); without one there is
//! no emitter. The process's own log lines stay on stderr either way.

use std::io::IsTerminal;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::{OpenTelemetrySpanExt, OtelData};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::{LookupSpan, SpanRef};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, LogSettings, TelemetrySettings};
use crate::evaluations::EvaluationEvents;

/// A span is traced when it declares one of these fields: the ids of the job it is about, or
/// its OpenTelemetry kind (the request and broker spans).
pub const TRACED_FIELDS: &[&str] = &["skilleval.run_id", "otel.kind"];

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter `{filter}`: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error("setting up the OTLP exporter for {url}: {source}")]
    Exporter {
        url: String,
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The installed tracer provider (and logger provider, when evaluation events are exported).
/// [`Telemetry::shutdown`] (or dropping it) exports the spans and events still queued; call it
/// once the process's work is done.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
    exporting: bool,
    logs: Option<SdkLoggerProvider>,
    evaluations: Option<EvaluationEvents>,
}

impl Telemetry {
    /// Whether spans are exported (an OTLP endpoint is configured).
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// The emitter of `gen_ai.evaluation.result` events, when a logs endpoint is configured.
    pub fn evaluations(&self) -> Option<EvaluationEvents> {
        self.evaluations.clone()
    }

    /// Flushes and stops the exporters. Blocks until the queued spans and events are sent (or
    /// the export timeout passes). Idempotent.
    pub fn shutdown(&mut self) {
        self.evaluations = None;
        if let Some(logs) = self.logs.take() {
            if let Err(e) = logs.shutdown() {
                eprintln!("warning: flushing evaluation events on shutdown: {e}");
            }
        }
        if let Some(provider) = self.provider.take() {
            if self.exporting {
                if let Err(e) = provider.shutdown() {
                    eprintln!("warning: flushing traces on shutdown: {e}");
                }
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Whether logs will be JSON lines under these settings on this process.
pub fn uses_json(settings: &LogSettings) -> bool {
    match settings.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    }
}

/// Installs the global subscriber (logs, and traces as [`TelemetrySettings`] say) for the
/// process `service` (the default `service.name`; `OTEL_SERVICE_NAME` wins). A second call
/// (tests) keeps the first subscriber.
pub fn init(
    log: &LogSettings,
    telemetry: &TelemetrySettings,
    service: &str,
) -> Result<Telemetry, TelemetryError> {
    let filter = EnvFilter::try_new(&log.filter).map_err(|source| TelemetryError::Filter {
        filter: log.filter.clone(),
        source,
    })?;
    let resource = resource(service);
    let (provider, exporting) = tracer_provider(telemetry, resource.clone())?;
    let logs = logger_provider(telemetry, resource)?;
    let evaluations = logs
        .as_ref()
        .map(|p| EvaluationEvents::new(p, telemetry.evaluation_explanation_max_chars));
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let registry = tracing_subscriber::registry()
        .with(LogOrTraced(filter))
        .with(otel_layer(&provider, tracing::Level::INFO));
    // `try_init` fails only when a subscriber is already set, which is fine to ignore.
    if uses_json(log) {
        let _ = registry.with(json_layer(std::io::stderr)).try_init();
    } else {
        // Colour only for a person at a terminal: escape codes in a file or a pipe are noise.
        let layer = tracing_subscriber::fmt::layer()
            .with_target(true)
            .with_ansi(std::io::stderr().is_terminal())
            .with_span_events(FmtSpan::NONE)
            .with_writer(std::io::stderr);
        let _ = registry.with(layer).try_init();
    }
    Ok(Telemetry {
        provider: Some(provider),
        exporting,
        logs,
        evaluations,
    })
}

/// Whether spans of this callsite are traced.
fn is_traced_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span()
        && TRACED_FIELDS
            .iter()
            .any(|name| meta.fields().field(name).is_some())
}

/// The log filter as the global filter, letting the traced spans through whatever it says:
/// `RUST_LOG=warn` keeps every trace. Written by hand because `tracing-subscriber`'s filter
/// combinators are per-layer only; every span hook is forwarded so the filter's span-scoped
/// directives keep working.
struct LogOrTraced(EnvFilter);

impl<S> Layer<S> for LogOrTraced
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if is_traced_span(meta) {
            return tracing::subscriber::Interest::always();
        }
        Layer::<S>::register_callsite(&self.0, meta)
    }

    fn enabled(
        &self,
        meta: &tracing::Metadata<'_>,
        cx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        is_traced_span(meta) || Layer::<S>::enabled(&self.0, meta, cx)
    }

    fn max_level_hint(&self) -> Option<tracing_subscriber::filter::LevelFilter> {
        // The traced spans are INFO spans.
        Layer::<S>::max_level_hint(&self.0)
            .map(|l| l.max(tracing_subscriber::filter::LevelFilter::INFO))
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        Layer::<S>::on_new_span(&self.0, attrs, id, cx);
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        Layer::<S>::on_record(&self.0, id, values, cx);
    }

    fn on_enter(&self, id: &tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        Layer::<S>::on_enter(&self.0, id, cx);
    }

    fn on_exit(&self, id: &tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        Layer::<S>::on_exit(&self.0, id, cx);
    }

    fn on_close(&self, id: tracing::span::Id, cx: tracing_subscriber::layer::Context<'_, S>) {
        Layer::<S>::on_close(&self.0, id, cx);
    }
}

/// The layer that turns the traced spans into OpenTelemetry spans. The log filter does not
/// decide what is traced (`RUST_LOG=warn` keeps every trace): the traced spans always, and as
/// span events the log lines of level `events` and above.
fn otel_layer<S>(provider: &SdkTracerProvider, events: tracing::Level) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    // Decided from the callsite alone (cached per callsite): no per-event cost.
    let traced = filter_fn(move |meta| {
        if meta.is_event() {
            return *meta.level() <= events;
        }
        is_traced_span(meta)
    });
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("skilleval"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_tracked_inactivity(false)
        .with_filter(traced)
}

/// JSON log lines as `tracing-subscriber` writes them (fields flattened, the current span and
/// the span list), plus the `trace_id` and `span_id` of the nearest traced span.
fn json_layer<S, W>(writer: W) -> json_subscriber::fmt::Layer<S, W>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + 'static,
{
    let mut layer = json_subscriber::fmt::layer()
        .with_current_span(true)
        .with_span_list(true)
        .flatten_event(true)
        .with_writer(writer);
    layer
        .inner_layer_mut()
        .add_from_span("trace_id", |span| traced_ids(span).map(|(t, _)| t));
    layer
        .inner_layer_mut()
        .add_from_span("span_id", |span| traced_ids(span).map(|(_, s)| s));
    layer
}

/// The process's resource. The SDK's detectors read OTEL_SERVICE_NAME and
/// OTEL_RESOURCE_ATTRIBUTES; the binary's name stands in only for the SDK's `unknown_service`
/// placeholder.
fn resource(service: &str) -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|v| !v.as_str().starts_with("unknown_service"));
    if named {
        detected
    } else {
        Resource::builder()
            .with_service_name(service.to_string())
            .build()
    }
}

/// The logger provider of the evaluation events: OTLP over HTTP with protobuf bodies, batched,
/// only when a logs endpoint is configured.
fn logger_provider(
    telemetry: &TelemetrySettings,
    resource: Resource,
) -> Result<Option<SdkLoggerProvider>, TelemetryError> {
    let Some(url) = telemetry.logs_url() else {
        return Ok(None);
    };
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::LogExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|source| TelemetryError::Exporter { url, source })?;
    Ok(Some(
        SdkLoggerProvider::builder()
            .with_resource(resource)
            .with_batch_exporter(exporter)
            .build(),
    ))
}

fn tracer_provider(
    telemetry: &TelemetrySettings,
    resource: Resource,
) -> Result<(SdkTracerProvider, bool), TelemetryError> {
    // The sampler comes from OTEL_TRACES_SAMPLER / _ARG (the SDK's default configuration).
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let Some(url) = telemetry.traces_url() else {
        return Ok((builder.build(), false));
    };
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|source| TelemetryError::Exporter { url, source })?;
    Ok((builder.with_batch_exporter(exporter).build(), true))
}

/// The trace and span ids (hex) of the nearest traced span from `span` up.
fn traced_ids<S>(span: &SpanRef<'_, S>) -> Option<(String, String)>
where
    S: for<'a> LookupSpan<'a>,
{
    span.scope().find_map(|s| {
        let ext = s.extensions();
        let data = ext.get::<OtelData>()?;
        Some((data.trace_id()?.to_string(), data.span_id()?.to_string()))
    })
}

/// The W3C `traceparent` of `span`'s context, when it has a valid one (a subscriber with
/// tracing installed).
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = TraceparentCarrier::default();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.traceparent
}

/// The W3C `traceparent` of the innermost traced span entered on this thread (the spans that
/// are not traced do not enter the OpenTelemetry context).
pub fn current_traceparent() -> Option<String> {
    let cx = opentelemetry::Context::current();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = TraceparentCarrier::default();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.traceparent
}

/// `future` in the current `tracing` span and the current trace context, for a task spawned
/// from inside a span that is not traced itself: the spans it opens keep their traced
/// ancestor as parent (a span that is not traced does not carry the context into a new task).
pub fn in_current_trace<F: std::future::Future>(
    future: F,
) -> impl std::future::Future<Output = F::Output> {
    use opentelemetry::trace::FutureExt as _;
    use tracing::Instrument as _;
    future.in_current_span().with_current_context()
}

/// Sets an attribute on the innermost traced span entered on this thread (a no-op without
/// one).
pub fn set_current_attribute(key: &'static str, value: String) {
    opentelemetry::Context::current()
        .span()
        .set_attribute(opentelemetry::KeyValue::new(key, value));
}

/// The OpenTelemetry span context of `span`, when it is traced (and valid).
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// The span context a W3C `traceparent` names (marked remote), when it is a valid one.
pub fn span_context_of(traceparent: &str) -> Option<SpanContext> {
    let carrier = TraceparentCarrier {
        traceparent: Some(traceparent.to_string()),
    };
    let cx = TraceContextPropagator::new().extract(&carrier);
    let sc = cx.span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// Makes the context of `traceparent` the parent of `span` (nothing when it is absent or not
/// a valid trace context, or when `span` is not traced).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent else { return };
    let carrier = TraceparentCarrier {
        traceparent: Some(tp.to_string()),
    };
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// Carries the one header the W3C propagator writes and reads that we keep (`tracestate` is
/// neither set by us nor forwarded).
#[derive(Debug, Default)]
struct TraceparentCarrier {
    traceparent: Option<String>,
}

const TRACEPARENT: &str = "traceparent";

impl Injector for TraceparentCarrier {
    fn set(&mut self, key: &str, value: String) {
        if key == TRACEPARENT {
            self.traceparent = Some(value);
        }
    }
}

impl Extractor for TraceparentCarrier {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT)
            .then_some(self.traceparent.as_deref())
            .flatten()
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects what the JSON layer writes.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_carry_the_ids_of_the_nearest_traced_span_and_traced_spans_ignore_the_log_level() {
        let provider = SdkTracerProvider::builder().build();
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::registry()
            .with(LogOrTraced(EnvFilter::new("warn")))
            .with(otel_layer(&provider, tracing::Level::WARN))
            .with(json_layer(move || writer.clone()));
        let (traceparent, inner) = tracing::subscriber::with_default(subscriber, || {
            let traced = tracing::info_span!("process", skilleval.run_id = "r1");
            let _in = traced.enter();
            // Not traced: a log line inside it takes the ids of `process`.
            let inner = tracing::warn_span!("inner", detail = 1);
            let _inner = inner.enter();
            tracing::warn!("inside");
            (traceparent(&traced), current_traceparent())
        });
        let traceparent = traceparent.expect("a traced span has a trace context");
        assert_eq!(
            inner.as_ref(),
            Some(&traceparent),
            "the current context is `process`"
        );
        let parts: Vec<&str> = traceparent.split('-').collect();
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["message"] == "inside")
            .unwrap_or_else(|| panic!("no line: {text}"));
        assert_eq!(line["trace_id"], parts[1], "{line}");
        assert_eq!(line["span_id"], parts[2], "{line}");
        assert_eq!(line["span"]["name"], "inner", "{line}");
    }

    #[test]
    fn a_traceparent_becomes_the_parent_and_garbage_is_ignored() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(otel_layer(&provider, tracing::Level::ERROR));
        tracing::subscriber::with_default(subscriber, || {
            let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let span = tracing::info_span!("send", otel.kind = "producer");
            set_parent(&span, Some(parent));
            let child = traceparent(&span).expect("a context");
            assert!(child.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
            assert!(
                !child.contains("00f067aa0ba902b7"),
                "a span of its own: {child}"
            );
            let orphan = tracing::info_span!("send", otel.kind = "producer");
            set_parent(&orphan, Some("not a trace context"));
            let own = traceparent(&orphan).expect("a root context");
            assert!(!own.contains("4bf92f3577b34da6a3ce929d0e0e4736"));
            let untraced = tracing::info_span!("plain");
            assert_eq!(
                traceparent(&untraced),
                None,
                "spans without the fields are not traced"
            );
        });
    }

    #[test]
    fn the_traces_url_is_the_signal_url_or_the_base_with_the_traces_path() {
        let mut t = TelemetrySettings::default();
        assert_eq!(t.traces_url(), None);
        t.otlp_endpoint = Some("http://collector:4318/".into());
        assert_eq!(
            t.traces_url().as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        t.otlp_traces_endpoint = Some("http://other:4318/custom".into());
        assert_eq!(t.traces_url().as_deref(), Some("http://other:4318/custom"));
        t.otlp_traces_endpoint = Some(" ".into());
        t.otlp_endpoint = Some(String::new());
        assert_eq!(t.traces_url(), None);
    }

    #[test]
    fn the_logs_url_is_the_signal_url_or_the_base_and_a_traces_url_alone_sends_no_events() {
        let mut t = TelemetrySettings {
            otlp_traces_endpoint: Some("http://collector:4318/v1/traces".into()),
            ..TelemetrySettings::default()
        };
        assert_eq!(t.logs_url(), None, "a traces endpoint alone");
        t.otlp_endpoint = Some("http://collector:4318/".into());
        assert_eq!(
            t.logs_url().as_deref(),
            Some("http://collector:4318/v1/logs")
        );
        t.otlp_logs_endpoint = Some("http://other:4318/logs".into());
        assert_eq!(t.logs_url().as_deref(), Some("http://other:4318/logs"));
    }
}
