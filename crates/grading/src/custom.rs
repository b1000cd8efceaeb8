//! `custom`: a grader script shipped in the package decides (`expected.customScript`).
//!
//! The script is a package-relative `.py` (run with `python3`) or `.js` (run with `node`) file;
//! at compile its path must stay inside the package (not absolute, no `..`, not a symlink out)
//! and the file must exist. At grade it runs in the [`skilleval_sandbox`] with the package as its
//! read-only working directory, an empty environment, a timeout (option `timeout` in ms, else
//! `evaluation.timeout`, else 30 s), and on stdin the JSON
//! `{"output", "prompt", "context", "expected", "tool_calls", "test_case_id", "workspace",
//! "files"}`: when the runner left files (the `agent` runner), `workspace` is where the grader
//! finds them read-only (`/workspace` in bubblewrap) and `files` lists them with sizes and
//! SHA-256; otherwise `null` and `[]`.
//!
//! It must print one JSON object: `{"score": 0..1, "passed": bool, "details": any,
//! "feedback": string}`; only `score` is required. Without `passed`, the case passes when the
//! score reaches `evaluation.passingThreshold`, else 0.5. The grade's details are the script's
//! `details`. A non-zero exit, output that is not such an object, or output cut at the sandbox
//! limit is a permanent fault carrying the end of stderr; running past the timeout is a
//! timeout fault; a failure of the sandbox itself (none on this host, bubblewrap unable to
//! start) is a fault of the host, retried, never the skill's.

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::options::OptionReader;
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::{TestCase, DEFAULT_TIMEOUT_MS};
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::output::ProducedFile;
use skilleval_model::problem::Problem;
use skilleval_sandbox::{SandboxBind, SandboxError, SandboxOutput, SandboxRequest};

/// Pass threshold for a script that reports no `passed`, when the case sets none.
pub const DEFAULT_THRESHOLD: f64 = 0.5;
/// How much of stderr a fault message carries.
const STDERR_TAIL_BYTES: usize = 2000;

pub struct Custom;

impl Strategy for Custom {
    fn name(&self) -> &'static str {
        "custom"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "custom");
        let threshold = opts.passing_threshold().unwrap_or(DEFAULT_THRESHOLD);
        let timeout_ms = opts
            .u64("timeout")
            .or(case.evaluation.timeout)
            .unwrap_or(DEFAULT_TIMEOUT_MS)
            .max(1);
        let Some(script) = case.expected.custom_script.as_deref() else {
            opts.problem(
                "/expected/customScript",
                "custom needs expected.customScript: a package-relative .py or .js grader",
            );
            return Err(opts.problems);
        };
        let interpreter = match check_script_path(script, ctx.package_root) {
            Ok(interpreter) => interpreter,
            Err(messages) => {
                for m in messages {
                    opts.problem("/expected/customScript", m);
                }
                return Err(opts.problems);
            }
        };
        opts.finish(Arc::new(CustomGrader {
            script: script.to_string(),
            interpreter,
            timeout: Duration::from_millis(timeout_ms),
            threshold,
        }) as Arc<dyn Grader>)
    }
}

/// Checks a custom grader's path and returns the interpreter that runs it (`python3` or
/// `node`); `Err` lists every rule the path breaks.
pub fn check_script_path(script: &str, package_root: &Path) -> Result<&'static str, Vec<String>> {
    let mut errors = Vec::new();
    let path = Path::new(script);
    if script.trim().is_empty() {
        return Err(vec!["customScript must not be empty".to_string()]);
    }
    let escapes = path.is_absolute()
        || script.starts_with('/')
        || script.starts_with('\\')
        || path.components().any(|c| {
            matches!(
                c,
                Component::ParentDir | Component::RootDir | Component::Prefix(_)
            )
        })
        || script.split(['/', '\\']).any(|seg| seg == "..");
    if escapes {
        errors.push(format!(
            "customScript `{script}` must be a path inside the package (relative, without `..`)"
        ));
    }
    let interpreter = match path.extension().and_then(|e| e.to_str()) {
        Some("py") => Some("python3"),
        Some("js") => Some("node"),
        _ => {
            errors.push(format!("customScript `{script}` must be a .py or .js file"));
            None
        }
    };
    if !escapes {
        let full = package_root.join(path);
        if !full.is_file() {
            errors.push(format!(
                "customScript `{script}` is not a file in the package"
            ));
        } else if let (Ok(real), Ok(root)) = (full.canonicalize(), package_root.canonicalize()) {
            if !real.starts_with(&root) {
                errors.push(format!(
                    "customScript `{script}` resolves outside the package"
                ));
            }
        }
    }
    match interpreter {
        Some(i) if errors.is_empty() => Ok(i),
        _ => Err(errors),
    }
}

#[derive(Debug)]
struct CustomGrader {
    script: String,
    interpreter: &'static str,
    timeout: Duration,
    threshold: f64,
}

#[async_trait]
impl Grader for CustomGrader {
    async fn grade(&self, input: &GradeInput<'_>, env: &GradeEnv) -> Result<Grade, Fault> {
        // The runner's files, read-only at /workspace (bubblewrap) or in a host directory.
        let workspace = if input.files.is_empty() {
            None
        } else {
            Some(write_workspace(input.files).map_err(|e| {
                Fault::host(format!(
                    "custom: cannot lay out the workspace for the grader: {e}"
                ))
            })?)
        };
        let sandboxed = env.sandbox.mode() == skilleval_sandbox::SandboxMode::Bubblewrap;
        let workspace_path = workspace.as_ref().map(|w| {
            if sandboxed {
                "/workspace".to_string()
            } else {
                w.path().to_string_lossy().into_owned()
            }
        });
        let binds: Vec<SandboxBind> = workspace
            .iter()
            .filter(|_| sandboxed)
            .map(|w| SandboxBind {
                source: w.path().to_path_buf(),
                dest: "/workspace",
                writable: false,
            })
            .collect();
        let files: Vec<Value> = input
            .files
            .iter()
            .map(|f| json!({"path": f.path, "size": f.size, "sha256": f.sha256}))
            .collect();
        let stdin = json!({
            "workspace": workspace_path,
            "files": files,
            "output": input.output,
            "prompt": input.prompt,
            "context": input.context,
            "expected": input.case.expected,
            "tool_calls": input.tool_calls,
            "test_case_id": input.case.id,
        });
        let stdin = serde_json::to_vec(&stdin).map_err(|e| {
            Fault::permanent(format!("custom: cannot encode the script's input: {e}"))
        })?;
        let request = SandboxRequest {
            argv: vec![self.interpreter.to_string(), self.script.clone()],
            package_root: env.package_root.to_path_buf(),
            stdin,
            timeout: self.timeout,
            env: BTreeMap::new(),
        };
        let timeout_ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        match env.sandbox.run_with_binds(request, &binds).await {
            Ok(out) => parse_script_output(&out, timeout_ms, self.threshold),
            Err(e) => Err(sandbox_fault(&self.script, &e)),
        }
    }
}

/// The kept content of the runner's files in a fresh world-readable directory.
fn write_workspace(files: &[ProducedFile]) -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("skilleval-grader-")
        .tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    for f in files {
        let Some(content) = &f.content else {
            continue;
        };
        let rel = Path::new(&f.path);
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            continue;
        }
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
    }
    Ok(dir)
}

/// A sandbox failure happened before the grader script ran (see [`skilleval_sandbox`]): the
/// host's fault, never the skill's.
fn sandbox_fault(script: &str, error: &SandboxError) -> Fault {
    Fault::host(format!("custom grader `{script}`: {error}"))
}

/// Reads a finished grader script's result (see the module docs for the contract).
/// `threshold` decides `passed` when the script does not.
pub fn parse_script_output(
    out: &SandboxOutput,
    timeout_ms: u64,
    threshold: f64,
) -> Result<Grade, Fault> {
    if out.timed_out {
        return Err(Fault::Timeout { timeout_ms });
    }
    let tail = stderr_tail(&out.stderr);
    let with_stderr = |msg: String| {
        if tail.is_empty() {
            Fault::permanent(msg)
        } else {
            Fault::permanent(format!("{msg}; stderr: {tail}"))
        }
    };
    if out.stdout_truncated {
        return Err(with_stderr(format!(
            "custom grader printed more than the sandbox's output limit ({} bytes kept); print one small JSON object",
            out.stdout.len()
        )));
    }
    match out.exit_code {
        Some(0) => {}
        Some(code) => {
            return Err(with_stderr(format!(
                "custom grader exited with status {code}"
            )))
        }
        None => {
            return Err(with_stderr(
                "custom grader was killed by the sandbox".to_string(),
            ))
        }
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let value: Value = match serde_json::from_str(text.trim()) {
        Ok(v) => v,
        Err(e) => {
            return Err(with_stderr(format!(
                "custom grader must print a JSON object {{\"score\", \"passed\", \"details\"}}; its output is not JSON ({e})"
            )))
        }
    };
    let Value::Object(mut obj) = value else {
        return Err(with_stderr(
            "custom grader must print a JSON object {\"score\", \"passed\", \"details\"}, not another JSON value".to_string(),
        ));
    };
    let score = match obj.get("score").and_then(Value::as_f64) {
        Some(s) if s.is_finite() && (0.0..=1.0).contains(&s) => s,
        Some(s) => {
            return Err(with_stderr(format!(
                "custom grader's score must be between 0 and 1, not {s}"
            )))
        }
        None => {
            return Err(with_stderr(
                "custom grader's JSON needs a numeric `score` between 0 and 1".to_string(),
            ))
        }
    };
    let passed = match obj.get("passed") {
        None | Some(Value::Null) => score >= threshold,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(with_stderr(format!(
                "custom grader's `passed` must be true or false, not {other}"
            )))
        }
    };
    let feedback = match obj.get("feedback") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let details = obj.remove("details").unwrap_or(Value::Null);
    let mut grade = Grade::new(score, passed, details);
    grade.feedback = feedback;
    Ok(grade)
}

/// The last [`STDERR_TAIL_BYTES`] of stderr, trimmed.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    if text.len() <= STDERR_TAIL_BYTES {
        return text.to_string();
    }
    let mut start = text.len() - STDERR_TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use std::fs;

    use serde_json::json;

    use super::super::test_support::{case, pointers, Fixture};
    use super::*;

    fn output(stdout: &str) -> SandboxOutput {
        SandboxOutput {
            exit_code: Some(0),
            stdout: stdout.as_bytes().to_vec(),
            ..SandboxOutput::default()
        }
    }

    #[test]
    fn parses_score_passed_details_feedback() {
        let g = parse_script_output(
            &output(r#"{"score": 0.8, "passed": false, "details": {"checked": 3}, "feedback": "close"}"#),
            1000,
            0.5,
        )
        .unwrap();
        assert_eq!(g.score, 0.8);
        assert!(!g.passed);
        assert_eq!(g.details, json!({"checked": 3}));
        assert_eq!(g.feedback.as_deref(), Some("close"));
    }

    #[test]
    fn passed_defaults_to_threshold() {
        let g = parse_script_output(&output(r#"{"score": 0.5}"#), 1000, 0.5).unwrap();
        assert!(g.passed);
        assert_eq!(g.details, Value::Null);
        let g = parse_script_output(&output("  {\"score\": 0.49}\n"), 1000, 0.5).unwrap();
        assert!(!g.passed);
        let g = parse_script_output(&output(r#"{"score": 0.6}"#), 1000, 0.7).unwrap();
        assert!(!g.passed);
    }

    #[test]
    fn bad_outputs_are_permanent_faults_with_stderr() {
        let mut out = output("not json");
        out.stderr = b"Traceback: boom".to_vec();
        let f = parse_script_output(&out, 1000, 0.5).unwrap_err();
        assert!(matches!(f, Fault::Permanent { .. }));
        assert!(f.to_string().contains("not JSON"), "{f}");
        assert!(f.to_string().contains("stderr: Traceback: boom"), "{f}");

        for (stdout, needle) in [
            ("[1]", "not another JSON value"),
            (r#"{"passed": true}"#, "numeric `score`"),
            (r#"{"score": 85}"#, "between 0 and 1, not 85"),
            (
                r#"{"score": 1, "passed": "yes"}"#,
                "`passed` must be true or false",
            ),
            ("", "not JSON"),
        ] {
            let f = parse_script_output(&output(stdout), 1000, 0.5).unwrap_err();
            assert!(f.to_string().contains(needle), "{stdout}: {f}");
        }

        let mut out = output(r#"{"score": 1}"#);
        out.exit_code = Some(2);
        out.stderr = "x".repeat(5000).into_bytes();
        let f = parse_script_output(&out, 1000, 0.5).unwrap_err();
        let msg = f.to_string();
        assert!(
            msg.starts_with("custom grader exited with status 2"),
            "{msg}"
        );
        assert!(msg.len() < 2200, "{}", msg.len());

        let mut out = output(r#"{"score": 1"#);
        out.stdout_truncated = true;
        assert!(parse_script_output(&out, 1000, 0.5)
            .unwrap_err()
            .to_string()
            .contains("output limit"));

        let mut out = output("");
        out.exit_code = None;
        assert!(parse_script_output(&out, 1000, 0.5)
            .unwrap_err()
            .to_string()
            .contains("killed"));
    }

    #[test]
    fn timeout_is_a_timeout_fault() {
        let mut out = output("");
        out.timed_out = true;
        out.exit_code = None;
        assert_eq!(
            parse_script_output(&out, 1234, 0.5).unwrap_err(),
            Fault::Timeout { timeout_ms: 1234 }
        );
    }

    #[test]
    fn script_paths_are_checked() {
        let f = Fixture::new();
        fs::create_dir_all(f.root().join("graders")).unwrap();
        fs::write(f.root().join("graders/check.py"), "print('{}')").unwrap();
        fs::write(f.root().join("graders/check.sh"), "echo").unwrap();
        assert_eq!(
            check_script_path("graders/check.py", f.root()),
            Ok("python3")
        );

        let c = |s: &str| {
            case(json!({"expected": {"customScript": s}, "evaluation": {"strategy": "custom"}}))
        };
        for (script, needle) in [
            ("graders/missing.js", "not a file in the package"),
            ("graders/check.sh", "must be a .py or .js file"),
            ("../outside.py", "inside the package"),
            ("/etc/grader.py", "inside the package"),
            ("graders/../../x.js", "inside the package"),
        ] {
            let problems = f.problems(&c(script));
            assert!(problems
                .iter()
                .all(|p| p.pointer == "/testCases/0/expected/customScript"));
            assert!(
                problems.iter().any(|p| p.message.contains(needle)),
                "{script}: {problems:#?}"
            );
        }
        let problems = f.problems(&case(json!({"evaluation": {"strategy": "custom"}})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/customScript"]
        );
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_out_of_the_package_are_refused() {
        let f = Fixture::new();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("evil.py"), "").unwrap();
        std::os::unix::fs::symlink(outside.path().join("evil.py"), f.root().join("link.py"))
            .unwrap();
        let errors = check_script_path("link.py", f.root()).unwrap_err();
        assert!(
            errors[0].contains("resolves outside the package"),
            "{errors:?}"
        );
    }

    #[tokio::test]
    async fn grading_goes_through_the_sandbox() {
        let f = Fixture::new();
        fs::write(
            f.root().join("grade.js"),
            "console.log(JSON.stringify({score: 1, details: {ok: true}}))",
        )
        .unwrap();
        let c = case(
            json!({"expected": {"customScript": "grade.js"}, "evaluation": {"strategy": "custom"}}),
        );
        match f.grade(&c, "anything").await {
            // A host with a sandbox and node runs the script.
            Ok(g) => {
                assert_eq!(g.score, 1.0);
                assert_eq!(g.details, json!({"ok": true}));
            }
            // Without one (or without node) it is the host's fault, naming the script.
            Err(fault @ Fault::Host { .. }) => {
                assert!(fault.to_string().contains("custom grader"), "{fault}");
            }
            Err(other) => panic!("unexpected fault {other:?}"),
        }
    }
}
