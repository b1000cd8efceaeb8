//! skilleval's analysis layer: what graded results add up to. Pure functions over results: no
//! I/O, no database, no model calls; statistics are checked against known values (scipy's).
//!
//! - [`summary`]: a run's statistics and verdict; [`expectations`]: a result as skill-creator's
//!   expectations;
//! - [`benchmark`] and [`budget`]: baselines, repeats (pass@k) and token/cost budgets;
//! - [`stats`]: the statistics (paired tests, intervals, power), checked against known values;
//! - [`compare`]: two runs compared case by case, with the regression gate; [`forecast`]: what
//!   a run will cost and what it can detect;
//! - [`quality`]: production quality over time and its alerts;
//! - [`collisions`]: a catalogue eval's collision matrix, pair rates with intervals, its gate;
//! - [`across`]: several runs of a skill summed up (the report spec's `ReportSummary` over runs).

pub mod across;
pub mod benchmark;
pub mod budget;
pub mod collisions;
pub mod compare;
pub mod expectations;
pub mod forecast;
pub mod quality;
pub mod stats;
pub mod summary;
