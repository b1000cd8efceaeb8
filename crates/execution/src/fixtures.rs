//! For tests of this crate and of the crates above (`test-util`): a package on disk turned into
//! its jobs as a run would, the package checked first; what a local model server reads of a
//! chat request.
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

/// The text of a chat-completions request's user messages, joined by newlines: what a local
/// model server in a test reads to decide its answer.
pub fn chat_user_text(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
