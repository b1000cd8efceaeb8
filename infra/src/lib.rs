//! The process-level wiring the coordinator and the worker share; the domain stays in `crates/`.
//!
//! - [`config`] loads the one typed [`config::Settings`]: built-in defaults, then
//!   `config/default.toml` and `config/{SKILLEVAL_ENV}.toml`, then `SKILLEVAL__SECTION__KEY`
//!   variables, then the standard `DATABASE_URL`, `AMQP_URL`, `RUST_LOG` and OTLP endpoint
//!   variables. Nothing else in the service reads the environment, except the OpenTelemetry
//!   SDK, which reads its own standard `OTEL_*` variables (sampler, resource, batching).
//! - [`telemetry`] sets up `tracing` once (JSON lines in production, readable text on a
//!   terminal) and OpenTelemetry traces (exported over OTLP when an endpoint is set), with the
//!   W3C trace-context helpers the broker messages and the stored runs use.
//! - [`evaluations`] emits graded cases and samples as `gen_ai.evaluation.result` OTLP log
//!   events when a logs endpoint is set.
//! - [`store`] is where every SQL statement lives: the pool, the migrations, the workers' result
//!   writes ([`store::results`]) and the coordinator's runs ([`store::runs`]).
//! - [`topology`] names and declares every exchange and queue, connects, and publishes with
//!   confirms; [`failover`] says which node of the configured ones a process connects to and
//!   how long it waits between rounds of attempts.
//! - [`tls`] tells a certificate that does not verify from a network fault, for both.
//! - [`messages`] is the wire format of what travels over the broker: jobs and case events.

pub mod config;
pub mod evaluations;
pub mod failover;
pub mod messages;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod topology;

/// The allocator of every service process (coordinator, workers, and the benchmark that runs
/// them). Uploads and result batches allocate and free millions of small JSON values; glibc's
/// allocator spent a third of an upload's CPU in `free` consolidation (perf, 30,000 cases) and
/// kept the freed memory mapped.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
