//! Packages and sandboxes for tests, of this crate and of the crates above it (`test-util`):
//! packages laid out as loaders extract them, sandboxes in each mode, requests and their
//! outputs as text.
#![allow(clippy::expect_used, clippy::panic)] // Test fixtures: a failed setup should fail the test.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use tempfile::TempDir;

use crate::{Sandbox, SandboxMode, SandboxOutput, SandboxPolicy, SandboxRequest};

/// A package directory laid out as loaders extract it (dirs 0755, files 0644).
pub fn package(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rel, content) in files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, content).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod file");
    }
    for entry in walk_dirs(dir.path()) {
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755))
            .expect("chmod dir");
    }
    dir
}

pub fn walk_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(entries) = std::fs::read_dir(&out[i]) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

pub fn bwrap_sandbox(policy: SandboxPolicy) -> Sandbox {
    let sandbox = Sandbox::detect(policy);
    assert_eq!(
        sandbox.mode(),
        SandboxMode::Bubblewrap,
        "bubblewrap must be installed and working for these tests: {:?}",
        sandbox.unavailable_reason()
    );
    sandbox
}

/// As if bubblewrap were not installed, with unsandboxed runs allowed.
pub fn unsandboxed() -> Sandbox {
    let sandbox = Sandbox::with_bwrap_path(
        SandboxPolicy {
            allow_unsandboxed: true,
            ..SandboxPolicy::default()
        },
        None,
    );
    assert_eq!(sandbox.mode(), SandboxMode::Unsandboxed);
    sandbox
}

pub fn request(pkg: &TempDir, argv: &[&str], timeout: Duration) -> SandboxRequest {
    SandboxRequest {
        argv: argv.iter().map(|s| (*s).to_string()).collect(),
        package_root: pkg.path().to_path_buf(),
        stdin: Vec::new(),
        timeout,
        env: BTreeMap::new(),
    }
}

/// How long a test waits for something that happens at once unless what it tests is broken
/// (a run that should end by itself, processes that should be gone): a hang guard, never a
/// measure of speed. A loaded machine is slow, not this slow.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A run's timeout that no test reaches unless what it tests is broken: past the hang guard,
/// so a run held to its timeout fails the guard instead of passing late.
pub const NEVER: Duration = Duration::from_secs(600);

/// Runs `req` to its end; fails if the run fails, or if it has not ended after the hang guard
/// (dropping it then kills what it started).
pub async fn run(sandbox: &Sandbox, req: SandboxRequest) -> SandboxOutput {
    match tokio::time::timeout(HANG_GUARD, sandbox.run(req)).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => panic!("sandbox run failed: {e}"),
        Err(_) => panic!("hang guard: the run had not ended after {HANG_GUARD:?}"),
    }
}

pub fn stdout(out: &SandboxOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &SandboxOutput) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
