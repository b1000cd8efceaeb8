//! Environments of declared dependencies: what a build costs, what a cache hit costs, and what
//! a mounted environment adds to a case.
//!
//! Run with `cargo run --release -p skilleval-bench --bin env_bench` (root, bubblewrap, uv and
//! python3 installed). No internet: the wheels come from a PEP 503 index this process serves on
//! loopback ([`skilleval_execution::environment::fixtures`]), each a pure-Python wheel the
//! benchmark builds.
//!
//! Printed:
//! 1. **Cold build**: `Environments::get` for a dependency set no cache holds — `uv venv`,
//!    `uv pip install` of one wheel from the index, `uv pip freeze`, in a sandbox session
//!    with the egress proxy — `BUILDS` times, each a new key (the cache's folder, its copy of uv
//!    and the interpreter probe ready, as on a worker that has built before); min, median, max.
//!    Also the very first build of a fresh cache (which copies uv and probes the interpreters).
//! 2. **Warm hit**: `Environments::get` for a held key, `HITS` times: mean µs.
//! 3. **Per-case overhead**: `CASES` `command` cases (a Python script that prints a line),
//!    through `Executor::execute` one after the other, alternating a package that declares a
//!    dependency (environment mounted) with the same package declaring none; median and mean
//!    per case of each, and the difference (target: ≤ 5 ms).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;
use skilleval_execution::environment::{fixtures, EnvironmentConfig, Environments};
use skilleval_execution::executor::{Executor, ExecutorBuilder};
use skilleval_execution::plan::{plan, CaseFilter, Job};
use skilleval_execution::result::CaseStatus;
use skilleval_model::package::{Dependencies, Package, PackageLimits};
use skilleval_sandbox::{Sandbox, SandboxMode, SandboxPolicy};

const BUILDS: usize = 5;
const HITS: u32 = 10_000;
const CASES: usize = 100;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn summary(mut v: Vec<Duration>) -> (f64, f64, f64, f64) {
    v.sort();
    let mean = v.iter().map(|d| ms(*d)).sum::<f64>() / v.len() as f64;
    (ms(v[0]), ms(v[v.len() / 2]), ms(v[v.len() - 1]), mean)
}

fn deps(name: &str) -> Dependencies {
    Dependencies {
        python: vec![name.to_string()],
        ..Dependencies::default()
    }
}

/// A package with one `command` case whose script prints `ok` (declaring `dependency` with
/// PEP 723 when given).
fn package(dir: &Path, dependency: Option<&str>) -> anyhow::Result<()> {
    let header = dependency
        .map(|d| format!("# /// script\n# dependencies = [\"{d}\"]\n# ///\n"))
        .unwrap_or_default();
    let tests = json!({
        "version": "2.0",
        "settings": {"runner": {"type": "command", "script": "scripts/run.py"}, "defaultTimeout": 120000},
        "testCases": [{"id": "c", "input": {"prompt": "go"}, "expected": {"output": "ok"},
                       "evaluation": {"strategy": "exact_match"}}],
    });
    for (rel, content) in [
        (
            "SKILL.md",
            "---\nname: env-bench\ndescription: Prints ok.\n---\n# Bench\n".to_string(),
        ),
        ("scripts/run.py", format!("{header}print('ok')\n")),
        ("eval/tests.json", tests.to_string()),
    ] {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().context("parent")?)?;
        std::fs::write(&p, content)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644))?;
    }
    for d in ["", "scripts", "eval"] {
        std::fs::set_permissions(dir.join(d), std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

fn job(executor: &Executor, root: &Path) -> anyhow::Result<Job> {
    let package = Package::open(root, &PackageLimits::default())?;
    let v = skilleval_execution::validate::validate(&package, executor.strategies());
    if !v.is_ok() {
        bail!("invalid bench package: {:?}", v.problems);
    }
    let jobs = plan(
        &package.config,
        &package.content_hash,
        uuid::Uuid::nil(),
        &CaseFilter::default(),
        None,
    )?;
    jobs.into_iter().next().context("no job")
}

fn environments(scratch: &Path, index: &str, name: &str) -> anyhow::Result<Environments> {
    let dir = scratch.join(name);
    Ok(Environments::new(EnvironmentConfig {
        dir: Some(dir),
        python_index: index.to_string(),
        ..EnvironmentConfig::default()
    }))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let sandbox = Sandbox::detect(SandboxPolicy::default());
    if sandbox.mode() != SandboxMode::Bubblewrap {
        bail!(
            "bubblewrap is needed: {}",
            sandbox.unavailable_reason().unwrap_or_default()
        );
    }
    let index = fixtures::serve().await;
    for i in 0..=BUILDS {
        index.add_wheel(
            &format!("skbench{i}"),
            "1.0.0",
            "def hello():\n    return 'ok'\n",
        );
    }
    let scratch = tempfile::Builder::new()
        .prefix("skilleval-env-bench-")
        .tempdir_in("/tmp")?;
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))?;
    let url = index.simple_url();

    // 1. Cold builds.
    let first_cache = environments(scratch.path(), &url, "first")?;
    let t = Instant::now();
    first_cache
        .get(&sandbox, &deps("skbench0"))
        .await
        .map_err(|f| anyhow::anyhow!("{f}"))?;
    let first = t.elapsed();
    let mut cold = Vec::new();
    for i in 1..=BUILDS {
        let t = Instant::now();
        let (_, built) = first_cache
            .get(&sandbox, &deps(&format!("skbench{i}")))
            .await
            .map_err(|f| anyhow::anyhow!("{f}"))?;
        cold.push(t.elapsed());
        if !built {
            bail!("skbench{i} was not built");
        }
    }
    let (min, median, max, _) = summary(cold);
    println!(
        "cold build, first of a fresh cache (copies uv, probes interpreters): {:.0} ms",
        ms(first)
    );
    println!("cold build, new key ({BUILDS} builds of one wheel from the loopback index): min {min:.0} ms, median {median:.0} ms, max {max:.0} ms");

    // 2. Warm hits.
    let held = deps("skbench1");
    let t = Instant::now();
    for _ in 0..HITS {
        let (_, built) = first_cache
            .get(&sandbox, &held)
            .await
            .map_err(|f| anyhow::anyhow!("{f}"))?;
        if built {
            bail!("a held key was built again");
        }
    }
    let hit = t.elapsed() / HITS;
    println!(
        "warm hit ({HITS} gets of a held key): {:.1} µs each",
        hit.as_secs_f64() * 1e6
    );

    // 3. Per-case overhead through the executor.
    let executor = ExecutorBuilder::new()
        .sandbox(sandbox.clone())
        .environments(Arc::new(environments(scratch.path(), &url, "cases")?))
        .build();
    let with_dir = scratch.path().join("pkg-with");
    let without_dir = scratch.path().join("pkg-without");
    package(&with_dir, Some("skbench0"))?;
    package(&without_dir, None)?;
    let with_job = job(&executor, &with_dir)?;
    let without_job = job(&executor, &without_dir)?;
    // Warm both (the environment is built here, outside the measure).
    for (j, root) in [(&with_job, &with_dir), (&without_job, &without_dir)] {
        let r = executor.execute(j, root).await;
        if r.status != CaseStatus::Passed {
            bail!("warm-up case {:?}: {:?} {}", r.status, r.error, r.details);
        }
    }
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..CASES {
        for (j, root, into) in [
            (&with_job, &with_dir, &mut with),
            (&without_job, &without_dir, &mut without),
        ] {
            let t = Instant::now();
            let r = executor.execute(j, root).await;
            into.push(t.elapsed());
            if r.status != CaseStatus::Passed {
                bail!("case {:?}: {:?}", r.status, r.error);
            }
        }
    }
    let (_, med_with, _, mean_with) = summary(with);
    let (_, med_without, _, mean_without) = summary(without);
    println!("per case, {CASES} `command` cases each, alternating (python3 prints a line):");
    println!("  no environment:      median {med_without:.1} ms, mean {mean_without:.1} ms");
    println!("  environment mounted: median {med_with:.1} ms, mean {mean_with:.1} ms");
    println!(
        "  overhead: median {:+.1} ms, mean {:+.1} ms (target ≤ 5 ms)",
        med_with - med_without,
        mean_with - mean_without
    );
    Ok(())
}
