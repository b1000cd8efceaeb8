//! skilleval's execution layer: everything that turns a validated package into graded results.
//! It is the one code path that produces and grades an output, whether the job came from the
//! CLI's in-process pool or from RabbitMQ; it holds no SQL, no broker and no HTTP server, and
//! decides nothing about retries across deliveries (a transient fault comes back in the
//! result for the caller to schedule).
//!
//! - [`validate`] checks a package against the strategies and runners that will execute it,
//!   every problem at once with its JSON pointer;
//! - [`plan`] turns it into [`plan::Job`]s, one per test case (and [`variant`]: per baseline
//!   configuration and repeat), each carrying the resolved case;
//! - [`executor`] runs one job: a [`runner`] produces the output (sandboxed when the code is the
//!   package's), a strategy of `skilleval_grading` grades it under the case's timeout, and the
//!   outcome is a [`result::JobResult`];
//! - [`case_scripts`]: a package's `setup.script` and `teardown.script` around each attempt,
//!   in the case's workspace;
//! - [`environment`]: the packages a skill's code imports, installed once per set (cached,
//!   built in the sandbox from the configured index) and mounted read-only into its sandboxes;
//! - [`triggers`]: does the skill's description get it picked among others;
//! - [`catalogue`]: its nearest catalogue neighbours and a trigger eval with all of them;
//! - [`monitor`]: a skill's production monitor and its samples as `given` jobs;
//! - [`draft`]: a starter eval definition for a skill that has none (`skilleval init`).
//!
//! The CLI feeds jobs from an in-process pool, the worker from RabbitMQ; both call the same
//! [`executor::Executor`].

pub mod case_scripts;
pub mod catalogue;
pub mod draft;
pub mod environment;
pub mod executor;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;
pub mod monitor;
pub mod plan;
pub mod result;
pub mod runner;
pub mod triggers;
pub mod validate;
pub mod variant;

#[cfg(test)]
mod model_backed_tests;
