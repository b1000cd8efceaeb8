//! skilleval's domain: everything that evaluates a skill, with no process-level wiring.
//!
//! The flow every binary follows is `load package -> plan jobs -> execute one job -> aggregate
//! results -> render report`:
//!
//! - [`package`] opens a skill folder or ZIP (hardened against hostile archives), reads
//!   `SKILL.md`, converts any accepted eval format into the one [`model`], and validates it,
//!   reporting every [`problem`] at once with a JSON pointer.
//! - [`plan`] turns a validated package into [`plan::Job`]s, one per test case, each carrying
//!   the resolved case so whoever executes it needs nothing else.
//! - [`executor`] runs one job: a [`runner`] produces the output (sandboxed by [`sandbox`] when
//!   the code is the package's), a [`strategy`] grades it under the case's timeout.
//! - [`monitor`] judges production samples: a skill's monitor, deterministic sampling,
//!   samples as `given` jobs, quality over time and alert rules.
//! - [`summary`] aggregates job results into statistics and a verdict; [`report`] renders them
//!   as Markdown or JSON, and [`artifacts`] writes the skill-creator compatible files.
//!
//! The CLI feeds jobs from an in-process pool; the worker feeds them from RabbitMQ. Both call
//! the same [`executor::Executor`].

pub mod artifacts;
pub mod compare;
pub mod egress;
pub mod executor;
pub mod expectations;
pub mod extract;
pub mod forecast;
pub mod gate;
pub mod grade;
mod json_stream;
pub mod llm;
pub mod model;
pub mod monitor;
pub mod output;
pub mod package;
pub mod plan;
pub mod problem;
pub mod quality;
pub mod report;
pub mod result;
pub mod runner;
pub mod sandbox;
pub mod scale;
pub mod stats;
pub mod strategy;
pub mod summary;
pub mod validate;
pub mod variant;
