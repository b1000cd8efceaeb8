//! No sandbox, no grading: before `skilleval run` starts, every case that runs untrusted code
//! from the package (a `command` runner, a `custom` grader script, a setup or teardown
//! script) must be able to have the sandbox. Without one, running would error each such case
//! and call it a verdict; a missing sandbox is a problem of this machine, so the run is refused
//! with what to install instead.

use skilleval_execution::plan::Job;
use skilleval_sandbox::{Sandbox, SandboxMode};

/// Cases listed by id in the refusal, at most.
const LISTED: usize = 5;

/// What in a job runs untrusted code, if anything.
pub fn untrusted_code(job: &Job) -> Option<String> {
    if job.runner.kind == "command" || job.runner.kind == "agent" {
        return Some(format!("runner `{}`", job.runner.kind));
    }
    if !job.scripts.is_empty() {
        return Some("`setup.script` / `teardown.script`".to_string());
    }
    let custom = job.strategy() == "custom"
        || (job.strategy() == "hybrid" && job.case.evaluation.weights.contains_key("custom"));
    custom.then(|| "strategy `custom`".to_string())
}

/// `Err` with the message to print when some of `jobs` need a sandbox this machine cannot
/// give them.
pub fn require(jobs: &[Job], sandbox: &Sandbox) -> Result<(), String> {
    if sandbox.mode() != SandboxMode::Refusing {
        return Ok(());
    }
    let needing: Vec<(String, String)> = jobs
        .iter()
        .filter_map(|j| untrusted_code(j).map(|why| (j.case.id.clone(), why)))
        .collect();
    if needing.is_empty() {
        return Ok(());
    }
    let mut listed: Vec<String> = needing
        .iter()
        .take(LISTED)
        .map(|(id, why)| format!("{id} ({why})"))
        .collect();
    if needing.len() > LISTED {
        listed.push(format!("and {} more", needing.len() - LISTED));
    }
    let reason = sandbox
        .unavailable_reason()
        .unwrap_or_else(|| "bubblewrap is not usable".to_string());
    Err(format!(
        "{} case(s) run untrusted code from the package ({}), and this machine has no working sandbox: {reason}.\n\
         Install bubblewrap (Debian/Ubuntu: `sudo apt-get install bubblewrap`; Fedora: `sudo dnf install bubblewrap`), \
         or pass --allow-unsandboxed to run them WITHOUT isolation.",
        needing.len(),
        listed.join(", ")
    ))
}
