//! The `command` runner: a script of the package produces the output.
//!
//! Design §3: `settings.runner = {"type": "command", "script": "scripts/run.py"}` runs that
//! script in the [`Sandbox`](skilleval_sandbox::Sandbox) with the test input as JSON on stdin
//! (`{"test_case_id", "prompt", "context", "variables", "files"}`) and `setup.environment` as its
//! environment. Its stdout is the output, read as a transcript when it is one
//! ([`transcript::parse`]), so a script can report the tool calls its agent made.
//!
//! The interpreter follows the extension: `.py` runs under `python3`, `.js` under `node`, `.sh`
//! under `sh`. Nothing else is accepted, so that what runs is always one of the interpreters the
//! sandbox knows how to mount, never an arbitrary binary shipped in the upload.

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{OutputRunner, ProduceRequest};
use crate::case_scripts::{interpreter_of, tail_text};
use skilleval_grading::GradeEnv;
use skilleval_model::grade::Fault;
use skilleval_model::output::{transcript, Produced};
use skilleval_sandbox::{check_package_relative, SandboxBind, SandboxError, SandboxRequest};

/// How much of stderr goes into faults and details.
const STDERR_TAIL_BYTES: usize = 2048;

#[derive(Debug, Clone, Copy, Default)]
pub struct CommandRunner;

#[async_trait]
impl OutputRunner for CommandRunner {
    fn name(&self) -> &'static str {
        "command"
    }

    async fn produce(&self, req: &ProduceRequest<'_>, env: &GradeEnv) -> Result<Produced, Fault> {
        let script = req
            .runner
            .script
            .as_deref()
            .ok_or_else(|| Fault::permanent("runner `command` needs `script`: the package-relative script that produces the output, e.g. `scripts/run.py`"))?;
        let relative = check_package_relative(script)
            .map_err(|why| Fault::permanent(format!("runner `command`: bad script path: {why}")))?;
        let interpreter = interpreter_for(script)?;
        if !env.package_root.join(&relative).is_file() {
            return Err(Fault::permanent(format!(
                "runner `command`: script `{script}` does not exist in the package"
            )));
        }

        let input = &req.case.input;
        let mut stdin = json!({
            "test_case_id": req.case.id,
            "prompt": input.prompt,
            "context": input.context.clone().unwrap_or(Value::Null),
            "variables": input.variables,
            "files": input.files,
        });
        // The case workspace a setup script prepared: mounted, and named on stdin.
        let binds: Vec<SandboxBind> = req.workspace.iter().map(|w| w.bind()).collect();
        if let Some(w) = req.workspace {
            stdin["workspace"] = json!(w.seen_from(&env.sandbox));
        }
        let sandbox_req = SandboxRequest {
            argv: vec![
                interpreter.to_string(),
                relative.to_string_lossy().into_owned(),
            ],
            package_root: env.package_root.to_path_buf(),
            stdin: stdin.to_string().into_bytes(),
            timeout: req.timeout,
            env: req.environment.clone(),
        };
        let limit = env.sandbox.policy.max_output_bytes;
        let out = env
            .sandbox
            .run_with_binds(sandbox_req, &binds)
            .await
            .map_err(|e| fault_from(&e))?;

        let stderr_tail = tail_text(&out.stderr, STDERR_TAIL_BYTES);
        if out.timed_out {
            return Err(Fault::Timeout {
                timeout_ms: u64::try_from(req.timeout.as_millis()).unwrap_or(u64::MAX),
            });
        }
        // A truncated run was killed by the sandbox on purpose: its exit status says nothing
        // about the script, and the output so far is still graded (flagged).
        if !out.stdout_truncated && out.exit_code != Some(0) {
            let code = out
                .exit_code
                .map_or_else(|| "no exit code".to_string(), |c| format!("exit code {c}"));
            let stderr = if stderr_tail.trim().is_empty() {
                "(no stderr)".to_string()
            } else {
                stderr_tail.trim_end().to_string()
            };
            return Err(Fault::permanent(format!(
                "runner `command`: `{script}` failed with {code}; stderr: {stderr}"
            )));
        }

        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut produced = transcript::parse_stdout(&stdout);
        let mut details = json!({
            "exit_code": out.exit_code,
            "stderr_tail": stderr_tail,
            "duration_ms": u64::try_from(out.duration.as_millis()).unwrap_or(u64::MAX),
        });
        if out.stdout_truncated {
            produced.truncated = true;
            if let Value::Object(map) = &mut details {
                map.insert("truncated".into(), Value::Bool(true));
                map.insert("limit_bytes".into(), json!(limit));
            }
        }
        produced.details = details;
        Ok(produced)
    }
}

fn interpreter_for(script: &str) -> Result<&'static str, Fault> {
    interpreter_of(script).ok_or_else(|| {
        Fault::permanent(format!(
            "runner `command`: script `{script}` must end in .py (python3), .js (node) or .sh (sh)"
        ))
    })
}

/// Whatever the sandbox itself fails with happened before the script ran (see
/// [`skilleval_sandbox`]): the host's fault, never the skill's.
fn fault_from(e: &SandboxError) -> Fault {
    Fault::host(format!("runner `command`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreters_by_extension() {
        assert_eq!(interpreter_for("a/b.py"), Ok("python3"));
        assert_eq!(interpreter_for("run.js"), Ok("node"));
        assert_eq!(interpreter_for("run.sh"), Ok("sh"));
        let err = interpreter_for("run.rb")
            .err()
            .map(|f| f.to_string())
            .unwrap_or_default();
        assert!(
            err.contains(".py") && err.contains(".js") && err.contains(".sh"),
            "{err}"
        );
        assert!(interpreter_for("run").is_err());
    }
}
