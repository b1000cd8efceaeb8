//! For tests of this crate and of the crates above (`test-util`): a package on disk turned into
//! its jobs as a run would, the package checked first.
#![allow(clippy::expect_used, clippy::panic)] // Test fixtures: a failed setup should fail the test.

use std::path::Path;

use skilleval_grading::StrategyRegistry;
use skilleval_model::package::{Package, PackageLimits};

use crate::plan::{plan, CaseFilter, Job};
use crate::validate::validate;

/// Opens the package at `root`, checks it against `strategies` (panicking with its problems)
/// and plans one job per case, every case, for a nil run id.
pub fn planned_jobs(root: &Path, strategies: &StrategyRegistry) -> Vec<Job> {
    let package = Package::open(root, &PackageLimits::default()).expect("the package opens");
    let validation = validate(&package, strategies);
    assert!(validation.is_ok(), "{:?}", validation.problems);
    plan(
        &package.config,
        &package.content_hash,
        uuid::Uuid::nil(),
        &CaseFilter::default(),
        None,
    )
    .expect("the package plans")
}
