//! Evaluation results as OpenTelemetry events: `gen_ai.evaluation.result` (GenAI semantic
//! conventions [`SEMCONV_VERSION`], status Development), one OTLP log record per evaluation.
//!
//! The event carries `gen_ai.evaluation.name`, `gen_ai.evaluation.score.value` (0–1),
//! `gen_ai.evaluation.score.label` (`pass`/`fail`), `gen_ai.evaluation.explanation` (cut to
//! `telemetry.evaluation_explanation_max_chars`), `error.type` for an evaluation that errored,
//! and the `skilleval.*` attributes the caller adds. Its trace context is the span it
//! evaluates: the convention says an evaluation event SHOULD be parented to the operation span
//! it evaluates, and a log record has exactly one trace context (no links).
//!
//! Built by [`crate::telemetry::init`] only when a logs endpoint is configured
//! ([`crate::config::TelemetrySettings::logs_url`]); without one there is no
//! [`EvaluationEvents`] at all, so nothing is built, queued or sent. The logger provider's
//! batch processor exports from a thread of its own; [`crate::telemetry::Telemetry::shutdown`]
//! flushes it.

use std::sync::Arc;

use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::trace::SpanContext;
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::logs::{SdkLogger, SdkLoggerProvider};

/// The event's name.
pub const EVENT_NAME: &str = "gen_ai.evaluation.result";

/// The semantic conventions release whose `gen_ai.evaluation.result` these events follow
/// (also the instrumentation scope's schema URL, which the OTLP exporter of opentelemetry 0.31
/// replaces with the resource's in batched exports).
pub const SEMCONV_VERSION: &str = "1.38.0";

/// The pass/fail label of an evaluation (`gen_ai.evaluation.score.label`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Pass,
    Fail,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Pass => "pass",
            Label::Fail => "fail",
        }
    }
}

/// One evaluation result, before it becomes a log record.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// `gen_ai.evaluation.name`: the strategy, the monitor's criterion, or the case.
    pub name: String,
    /// Normalised to 0–1 (clamped when emitted); absent for an evaluation that errored.
    pub score: Option<f64>,
    /// Absent for an evaluation that errored.
    pub label: Option<Label>,
    /// The grader's reasoning or a failure summary (cut when emitted).
    pub explanation: Option<String>,
    /// `error.type`: the fault's kind (`transient`, `permanent`, `timeout`, `host`).
    pub error_type: Option<&'static str>,
    /// `skilleval.*` attributes (string values).
    pub attributes: Vec<(&'static str, String)>,
}

/// Emits [`Evaluation`]s as `gen_ai.evaluation.result` log records. Cheap to clone.
#[derive(Clone)]
pub struct EvaluationEvents {
    logger: Arc<SdkLogger>,
    max_explanation: usize,
}

impl std::fmt::Debug for EvaluationEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvaluationEvents")
            .field("max_explanation", &self.max_explanation)
            .finish_non_exhaustive()
    }
}

impl EvaluationEvents {
    /// Events through `provider`'s processors; explanations cut to `max_explanation` chars.
    pub fn new(provider: &SdkLoggerProvider, max_explanation: usize) -> EvaluationEvents {
        let scope = InstrumentationScope::builder("skilleval")
            .with_version(env!("CARGO_PKG_VERSION"))
            .with_schema_url(format!(
                "https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
            ))
            .build();
        EvaluationEvents {
            logger: Arc::new(provider.logger_with_scope(scope)),
            max_explanation,
        }
    }

    /// Emits one event parented to `parent` (no trace context when it is `None` or invalid).
    pub fn emit(&self, parent: Option<&SpanContext>, evaluation: &Evaluation) {
        let mut record = self.logger.create_log_record();
        record.set_event_name(EVENT_NAME);
        record.set_timestamp(std::time::SystemTime::now());
        if evaluation.error_type.is_some() {
            record.set_severity_number(Severity::Warn);
            record.set_severity_text("WARN");
        } else {
            record.set_severity_number(Severity::Info);
            record.set_severity_text("INFO");
        }
        record.add_attribute("gen_ai.evaluation.name", evaluation.name.clone());
        if let Some(score) = evaluation.score.filter(|s| s.is_finite()) {
            record.add_attribute(
                "gen_ai.evaluation.score.value",
                AnyValue::Double(score.clamp(0.0, 1.0)),
            );
        }
        if let Some(label) = evaluation.label {
            record.add_attribute("gen_ai.evaluation.score.label", label.as_str());
        }
        if let Some(text) = evaluation
            .explanation
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty() && self.max_explanation > 0)
        {
            record.add_attribute(
                "gen_ai.evaluation.explanation",
                cut(text, self.max_explanation),
            );
        }
        if let Some(kind) = evaluation.error_type {
            record.add_attribute("error.type", kind);
        }
        for (key, value) in &evaluation.attributes {
            record.add_attribute(*key, value.clone());
        }
        // Set explicitly, so the emitting thread's current span never stands in for it.
        if let Some(cx) = parent.filter(|cx| cx.is_valid()) {
            record.set_trace_context(cx.trace_id(), cx.span_id(), Some(cx.trace_flags()));
        }
        self.logger.emit(record);
    }
}

/// `text` cut to at most `max` characters, the last one `…` when it was cut.
pub fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explanations_are_cut_to_the_limit_and_marked() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("éééé", 3).chars().count(), 3);
        assert_eq!(cut("abc", 3), "abc");
    }
}
