//! A package's `setup.script` and `teardown.script`, run around every attempt of a case.
//!
//! An attempt of a case with either script gets a **case workspace**: a fresh host directory
//! mounted writable at `/workspace` in each sandbox of the attempt, in this order:
//!
//! 1. `setup.script`, with the workspace as its working directory, the case on stdin
//!    (`{"phase": "setup", "workspace", "test_case_id", "prompt", "variables", "files"}`) and
//!    `setup.environment`. A non-zero exit fails the case `errored`, as the skill's fault, with
//!    the script's stderr; the runner never starts.
//! 2. The runner, in the same workspace: the `agent` runner's `/workspace` is it (the case's
//!    input files are copied in after the setup ran), the `command` runner has it mounted at
//!    `/workspace` and named in its stdin.
//! 3. Grading, as for any case.
//! 4. `teardown.script`, in the workspace, told how the attempt ended (`{"phase":
//!    "teardown", "workspace", "test_case_id", "status", "score"}`). It runs whatever the
//!    attempt became (a failed setup included) and outside the case's timeout; what it did is
//!    recorded on the result (`details.teardown`), and its failure never changes the grade.
//!
//! Each step is a sandboxed process of its own (a uid of its own, the workspace handed to it),
//! so nothing a step leaves running outlives it. Like the `command` runner, a script runs
//! under `python3` (`.py`), `node` (`.js`) or `sh` (`.sh`); a failure of the sandbox machinery
//! is the host's fault, never the skill's.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use skilleval_model::grade::Fault;
use skilleval_sandbox::{
    check_package_relative, Sandbox, SandboxBind, SandboxMode, SandboxRequest, SANDBOX_PACKAGE_DIR,
};

/// Where the case workspace is mounted in each step's sandbox.
pub const CASE_WORKSPACE_DIR: &str = "/workspace";

/// Bytes of a step's stdout and stderr kept with the result.
const TAIL_BYTES: usize = 2048;

/// The scripts a job runs around its runner (`setup.script`, `teardown.script`), as
/// package-relative paths.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CaseScripts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teardown: Option<String>,
}

impl CaseScripts {
    pub fn is_empty(&self) -> bool {
        self.setup.is_none() && self.teardown.is_none()
    }
}

/// The interpreter a package script runs under, by its extension (`None`: not one of them).
pub fn interpreter_of(script: &str) -> Option<&'static str> {
    match Path::new(script).extension().and_then(|e| e.to_str()) {
        Some("py") => Some("python3"),
        Some("js") => Some("node"),
        Some("sh") => Some("sh"),
        _ => None,
    }
}

/// One attempt's workspace on the host; removed when dropped.
#[derive(Debug)]
pub struct CaseWorkspace {
    _root: tempfile::TempDir,
    path: PathBuf,
}

impl CaseWorkspace {
    pub fn create(sandbox: &Sandbox) -> std::io::Result<Self> {
        let root = sandbox.session_scratch("skilleval-case-")?;
        // Each step's uid must pass through to the workspace (handed to it as it runs).
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711))?;
        let path = root.path().join("workspace");
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        Ok(CaseWorkspace { _root: root, path })
    }

    /// The directory on the host.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The workspace as a sandboxed process names it: [`CASE_WORKSPACE_DIR`] under bubblewrap,
    /// the host path when the sandbox runs unsandboxed (mounts need bubblewrap).
    pub fn seen_from(&self, sandbox: &Sandbox) -> String {
        if sandbox.mode() == SandboxMode::Bubblewrap {
            CASE_WORKSPACE_DIR.to_string()
        } else {
            self.path.to_string_lossy().into_owned()
        }
    }

    /// The mount of the workspace for a step's sandbox.
    pub fn bind(&self) -> SandboxBind {
        SandboxBind {
            source: self.path.clone(),
            dest: CASE_WORKSPACE_DIR,
            writable: true,
        }
    }
}

/// Which step a script is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Setup,
    Teardown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Teardown => "teardown",
        }
    }

    /// The definition's field, as errors name it.
    fn field(self) -> &'static str {
        match self {
            Phase::Setup => "setup.script",
            Phase::Teardown => "teardown.script",
        }
    }
}

/// One step to run: which script, in which package and workspace, with what on stdin.
pub struct Step<'a> {
    pub phase: Phase,
    pub script: &'a str,
    pub sandbox: &'a Sandbox,
    pub package_root: &'a Path,
    pub workspace: &'a CaseWorkspace,
    pub stdin: Value,
    pub environment: &'a BTreeMap<String, String>,
    pub timeout: Duration,
}

/// What a step did, as the result records it (`details.setup`, `details.teardown`).
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    pub script: String,
    /// `None` when the sandbox killed it (timeout, output limit).
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

impl StepReport {
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }

    pub fn to_json(&self) -> Value {
        json!({
            "script": self.script,
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "duration_ms": self.duration_ms,
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
        })
    }

    /// How it failed, in one sentence that carries its stderr.
    fn failure(&self, field: &str) -> String {
        let how = if self.timed_out {
            "timed out".to_string()
        } else {
            self.exit_code.map_or_else(
                || "was killed".to_string(),
                |c| format!("failed with exit code {c}"),
            )
        };
        let stderr = if self.stderr_tail.trim().is_empty() {
            "(no stderr)"
        } else {
            self.stderr_tail.trim_end()
        };
        format!("{field} `{}` {how}; stderr: {stderr}", self.script)
    }
}

/// Runs one step to its end. `Err` is a fault: of the package when the script cannot run
/// (a path or an extension no validation let through), of the host when the sandbox failed.
pub async fn run_step(step: Step<'_>) -> Result<StepReport, Fault> {
    let field = step.phase.field();
    let relative = check_package_relative(step.script)
        .map_err(|why| Fault::permanent(format!("{field}: bad path `{}`: {why}", step.script)))?;
    let interpreter = interpreter_of(step.script).ok_or_else(|| {
        Fault::permanent(format!(
            "{field}: `{}` must end in .py (python3), .js (node) or .sh (sh)",
            step.script
        ))
    })?;
    if !step.package_root.join(&relative).is_file() {
        return Err(Fault::permanent(format!(
            "{field}: `{}` does not exist in the package",
            step.script
        )));
    }
    // The sandbox starts processes in the package; the step starts in the workspace, so it
    // names its script by the package's path as the process sees it.
    let package_dir = if step.sandbox.mode() == SandboxMode::Bubblewrap {
        PathBuf::from(SANDBOX_PACKAGE_DIR)
    } else {
        std::fs::canonicalize(step.package_root)
            .map_err(|e| Fault::host(format!("{field}: reading the package: {e}")))?
    };
    let script_path = package_dir.join(&relative);
    let request = SandboxRequest {
        argv: vec![
            "sh".to_string(),
            "-c".to_string(),
            "cd \"$1\" || exit 125; shift; exec \"$@\"".to_string(),
            step.phase.as_str().to_string(),
            step.workspace.seen_from(step.sandbox),
            interpreter.to_string(),
            script_path.to_string_lossy().into_owned(),
        ],
        package_root: step.package_root.to_path_buf(),
        stdin: step.stdin.to_string().into_bytes(),
        timeout: step.timeout,
        env: step.environment.clone(),
    };
    let out = step
        .sandbox
        .run_with_binds(request, &[step.workspace.bind()])
        .await
        .map_err(|e| Fault::host(format!("{field}: {e}")))?;
    Ok(StepReport {
        script: step.script.to_string(),
        exit_code: out.exit_code,
        timed_out: out.timed_out,
        duration_ms: u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
        stdout_tail: tail_text(&out.stdout, TAIL_BYTES),
        stderr_tail: tail_text(&out.stderr, TAIL_BYTES),
    })
}

/// Runs the setup: `Ok` with its report when it succeeded, else the fault that fails the case
/// (the skill's, carrying the script's stderr; the host's when the sandbox failed).
pub async fn setup(step: Step<'_>) -> Result<StepReport, Fault> {
    let field = step.phase.field();
    let report = run_step(step).await?;
    if report.succeeded() {
        Ok(report)
    } else {
        Err(Fault::permanent(report.failure(field)))
    }
}

/// Runs the teardown and says what it did, as `details.teardown` records it; never a fault
/// (a teardown does not change the grade): a failure is recorded with `"failed": true` and,
/// when the script never ran, the reason.
pub async fn teardown(step: Step<'_>) -> Value {
    let field = step.phase.field();
    let script = step.script.to_string();
    match run_step(step).await {
        Ok(report) => {
            let mut v = report.to_json();
            v["failed"] = json!(!report.succeeded());
            if !report.succeeded() {
                v["error"] = json!(report.failure(field));
            }
            v
        }
        Err(fault) => json!({
            "script": script,
            "failed": true,
            "error": fault.to_string(),
            "error_kind": fault.kind(),
        }),
    }
}

/// The last `max` bytes as text, starting on a character boundary.
pub(crate) fn tail_text(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    let text = String::from_utf8_lossy(&bytes[start..]);
    text.trim_start_matches('\u{FFFD}').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_by_extension() {
        assert_eq!(interpreter_of("scripts/setup.py"), Some("python3"));
        assert_eq!(interpreter_of("setup.js"), Some("node"));
        assert_eq!(interpreter_of("setup.sh"), Some("sh"));
        assert_eq!(interpreter_of("setup.rb"), None);
        assert_eq!(interpreter_of("setup"), None);
    }

    #[test]
    fn a_failure_names_the_field_the_script_and_its_stderr() {
        let mut report = StepReport {
            script: "scripts/setup.sh".into(),
            exit_code: Some(3),
            timed_out: false,
            duration_ms: 1,
            stdout_tail: String::new(),
            stderr_tail: "no fixture\n".into(),
        };
        assert!(!report.succeeded());
        assert_eq!(
            report.failure("setup.script"),
            "setup.script `scripts/setup.sh` failed with exit code 3; stderr: no fixture"
        );
        report.timed_out = true;
        report.exit_code = None;
        report.stderr_tail.clear();
        assert_eq!(
            report.failure("setup.script"),
            "setup.script `scripts/setup.sh` timed out; stderr: (no stderr)"
        );
    }

    #[test]
    fn tail_starts_on_a_char_boundary() {
        let s = "é".repeat(10);
        let t = tail_text(s.as_bytes(), 5);
        assert_eq!(t, "éé");
    }

    #[test]
    fn scripts_are_empty_without_either() {
        assert!(CaseScripts::default().is_empty());
        let s = CaseScripts {
            teardown: Some("t.sh".into()),
            ..CaseScripts::default()
        };
        assert!(!s.is_empty());
    }
}
