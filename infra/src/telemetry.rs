//! Logging, set up in one place for every binary.
//!
//! The filter is an `EnvFilter` directive from [`LogSettings::filter`] (which `RUST_LOG`
//! overrides, see [`crate::config`]). The format is JSON lines when asked for
//! (`SKILLEVAL_LOG_FORMAT=json`) or, with the default `auto`, whenever stderr is not a terminal:
//! a process under a supervisor, in a container or in CI writes machine-readable lines that
//! carry the fields of the enclosing spans (`run_id`, `test_case_id`), and a person at a
//! terminal reads text. Logs go to stderr so stdout stays free for a binary's own output.

use std::io::IsTerminal;

use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogSettings};

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("invalid log filter `{filter}`: {source}")]
    Filter {
        filter: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
}

/// Whether logs will be JSON lines under these settings on this process.
pub fn uses_json(settings: &LogSettings) -> bool {
    match settings.format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    }
}

/// Installs the global subscriber. A second call (tests) keeps the first one.
pub fn init(settings: &LogSettings) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(&settings.filter).map_err(|source| TelemetryError::Filter {
        filter: settings.filter.clone(),
        source,
    })?;
    let registry = tracing_subscriber::registry().with(filter);
    // `try_init` fails only when a subscriber is already set, which is fine to ignore.
    if uses_json(settings) {
        let layer = tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .flatten_event(true)
            .with_span_events(FmtSpan::NONE)
            .with_writer(std::io::stderr);
        let _ = registry.with(layer).try_init();
    } else {
        // Colour only for a person at a terminal: escape codes in a file or a pipe are noise.
        let layer = tracing_subscriber::fmt::layer()
            .with_target(true)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr);
        let _ = registry.with(layer).try_init();
    }
    Ok(())
}
