//! Runs from their creation to their last job: planning, publishing with confirms, and the
//! sweeper. The modules build on each other one way, lowest first:
//!
//! - [`error`]: [`error::LaunchError`], why a run could not be planned, created or published.
//! - [`sequence`]: a plan's `runInSequence` chains ([`sequence::Chains`]), the positions
//!   published one at a time instead of from the watermark.
//! - [`plan`]: a run's plan ([`plan::RunPlan`]: its jobs a chunk at a time), the one
//!   interface every run kind plans behind ([`plan::KindPlan`]), what a run is asked to do
//!   ([`plan::RunRequest`]) and a planned run ready to insert ([`plan::PreparedRun`]).
//! - [`definition`]: a stored eval definition as the kinds that plan from one use it.
//! - One module per way of planning the lifecycle names
//!   (`skilleval_infra::store::lifecycle::Planning`): [`upload`] (upload and manual runs: a
//!   stored definition), [`rescore`] (stored outputs graded again), [`samples`] (production
//!   samples on the lower-priority lane).
//! - [`planner`]: [`planner::RunPlanner`] plans a run of any kind (choosing the kind's module
//!   in one place), inserts it with its plan, and gives a run's plan back.
//! - [`publish`]: [`publish::RunPublisher`], the one confirmed-publish pipeline: a run's
//!   creation, its releases under `maxConcurrentTests`, the sweeper's resumptions.
//! - [`sweep`]: [`sweep::RunSweeper`] resumes the passes nobody finished and writes off the
//!   unrecorded cases of stopped runs.
//!
//! The run's states and their transitions are `skilleval_infra::store::lifecycle`'s; nothing
//! here changes a run's status but through it. This file only declares the modules: each
//! takes what it needs from the module that defines it, never through here.

pub mod definition;
pub mod error;
pub mod plan;
pub mod planner;
pub mod publish;
pub mod rescore;
pub mod samples;
pub mod sequence;
pub mod sweep;
pub mod upload;
