//! The sandbox: the one way skilleval runs code it did not write. Custom graders, `command`
//! runners and the `agent` runner's tool calls come from uploaded packages, and they run only
//! through this crate: under bubblewrap with no network (or only a proxy to the hosts a case
//! allows), the package read-only, a private `/tmp`, a scrubbed environment, a uid of its own,
//! CPU, memory, file-size and process-count limits, a wall-clock timeout that kills everything
//! it started, and capped output (the limits documented under "Sandboxing" in
//! docs/strategies.md and "The sandbox" in docs/runners.md); without a usable bubblewrap it
//! refuses unless the policy explicitly allows unsandboxed runs. It knows processes, files and
//! uids only: nothing of skills, strategies or runners, which are its callers' business.
//!
//! Layout, from the bottom up (a module takes only from those before it in this list):
//! `egress` (the allowed-hosts proxy), `policy` (what a caller hands in and gets back),
//! `tools` (the programs and interpreters found on the host), `lease` (which uid a run gets,
//! and leasing a clean one), `argv` (the command line composed from those tools), `output`
//! (reading a process's output under caps), `reaper` (killing what a run leaves), `host` (what
//! is known about the host, with the start-up probe), `sandbox` (the [`Sandbox`] handle),
//! `command` (one process run to its end), `session` (a sandbox that serves many commands).

pub mod egress;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;

mod argv;
mod command;
mod host;
mod lease;
mod output;
mod policy;
mod reaper;
mod sandbox;
mod session;
mod tools;

pub use argv::{display_argv, SANDBOX_PACKAGE_DIR};
pub use policy::{
    check_package_relative, SandboxBind, SandboxEnvironment, SandboxError, SandboxMode,
    SandboxOutput, SandboxPolicy, SandboxRequest,
};
pub use sandbox::Sandbox;
pub use session::{SandboxSession, SessionOutput, SESSION_CONTROL_DIR};
