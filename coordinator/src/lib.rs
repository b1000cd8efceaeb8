//! The skilleval coordinator: the HTTP API, run creation and publishing, aggregation, reports
//! and webhooks. `main.rs` only wires configuration and telemetry to [`startup::Application`].
//!
//! Layout:
//!
//! - [`startup`] builds the [`startup::Application`]: database pool and migrations, broker
//!   topology and publisher, the router, and the background tasks (publish sweeper, events
//!   consumer, finalisation sweep), all stopped by one cancellation token.
//! - [`collisions`] is the catalogue lane (collision evals after uploads; [`catalogue_agent`] its
//!   agent mode).
//! - [`routes`] holds the API, one file per area, registered from one table that the OpenAPI
//!   test compares with [`openapi`]'s document; what several areas take sits below them
//!   ([`routes::fields`]: shared field checks; `routes::validation`: a package opened and
//!   validated as an upload is). [`error::ApiError`] is the one error type; [`extract`] makes
//!   extractor rejections JSON errors naming the field; [`auth`] checks bearer tokens and
//!   [`access`] applies the [`policy::AccessPolicy`] (scopes, rate limits, visibility, quotas,
//!   audit) that the shared [`state::AppState`] holds.
//! - [`runs`] takes a run from its creation to its last job: [`runs::planner::RunPlanner`]
//!   plans each kind behind one interface ([`runs::plan::KindPlan`]: [`runs::upload`],
//!   [`runs::rescore`], [`runs::samples`]) and commits the run with its plan (no row per
//!   case); [`runs::publish::RunPublisher`] publishes its jobs chunk by chunk with confirms
//!   through one pipeline (creation, releases under `maxConcurrentTests`); and
//!   [`runs::sweep::RunSweeper`] resumes passes from the published watermark and writes off
//!   the unrecorded cases of a stopped run. The run's states and transitions are owned by
//!   `skilleval_infra::store::lifecycle`.
//! - [`aggregate::RunAggregator`] turns case-finished events (and a periodic sweep) into
//!   failFast stops, further releases, and exactly-once finalisation with a signed
//!   [`webhook`].
//! - [`webhook::WebhookOutbox`] sends the webhook outbox's deliveries (any replica, claimed
//!   with a lease, retried with backoff); [`parked`] drains the parking queue into `errored`
//!   results and requeues parked jobs for operators.
//! - Production monitoring: [`routes::monitoring`] serves monitors, sample ingest (each batch's
//!   sampled items become one `samples` run, published on the samples lane by the same
//!   pipeline), quality reports and alerts; [`alerts::AlertScheduler`] evaluates the alert
//!   rules on a schedule, one coordinator of the fleet at a time. [`routes::otlp`] takes
//!   production GenAI traces over OTLP/HTTP, [`genai_spans`] maps their spans to samples, and
//!   they go through the same ingest.
//! - [`ui`] is the web interface under `/ui/`: server-rendered pages sharing the run page's
//!   rendering with the CLI's `report.html`, behind the same authentication.
//! - [`results`] reads a run's stored results and summary back (below aggregation, comparisons
//!   and views, which read them); [`comparing`] compares runs and judges the regression gate.
//! - [`views`] are the response bodies; [`metrics`] the Prometheus metrics.
//!
//! The SQL lives in `skilleval_infra::store`, as methods of its `Store` (the run types of
//! `store::runs` are re-exported here as [`db`]).

pub use skilleval_infra::store::runs as db;

pub mod access;
pub mod aggregate;
pub mod alerts;
pub mod auth;
pub mod broker;
pub mod catalogue_agent;
pub mod collisions;
pub mod comparing;
pub mod error;
pub mod extract;
pub mod genai_spans;
pub mod jobs;
pub mod metrics;
pub mod openapi;
pub mod parked;
pub mod policy;
pub mod results;
pub mod routes;
pub mod runs;
pub mod startup;
pub mod state;
pub mod ui;
pub mod views;
pub mod webhook;
