//! Running untrusted code (custom graders, `command` runners) from uploaded packages.
//!
//! PLACEHOLDER API — implemented by the sandbox work item. See `Sandbox::run`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits applied to every sandboxed process.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SandboxPolicy {
    /// Address-space limit in bytes.
    pub memory_bytes: u64,
    /// CPU-time limit in seconds.
    pub cpu_seconds: u64,
    /// Largest file the process may write, in bytes.
    pub file_size_bytes: u64,
    /// Most processes (threads count) the sandbox may hold.
    pub max_processes: u64,
    /// Stdout beyond this is cut and flagged.
    pub max_output_bytes: usize,
    /// Run without bubblewrap when it is absent (otherwise refuse).
    pub allow_unsandboxed: bool,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy {
            memory_bytes: 1 << 30,
            cpu_seconds: 60,
            file_size_bytes: 16 << 20,
            max_processes: 64,
            max_output_bytes: 1 << 20,
            allow_unsandboxed: false,
        }
    }
}

/// One process to run.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    /// Program and arguments; paths inside the package are given relative to the package root.
    pub argv: Vec<String>,
    /// Mounted read-only; the working directory.
    pub package_root: PathBuf,
    pub stdin: Vec<u8>,
    /// Wall-clock limit; past it the whole process group is killed.
    pub timeout: Duration,
    /// The only environment the process sees (plus PATH, HOME, LANG set by the sandbox).
    pub env: BTreeMap<String, String>,
}

/// What a finished process left behind.
#[derive(Debug, Clone, Default)]
pub struct SandboxOutput {
    /// Exit code, `None` when killed by a signal.
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Stdout was cut at `max_output_bytes`.
    pub stdout_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("refusing to run untrusted code without a sandbox: bubblewrap (`bwrap`) is not installed; install it (Debian package `bubblewrap`) or allow unsandboxed execution explicitly")]
    NoSandbox,
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs processes under a [`SandboxPolicy`].
#[derive(Debug, Clone, Default)]
pub struct Sandbox {
    pub policy: SandboxPolicy,
}

impl Sandbox {
    pub fn new(policy: SandboxPolicy) -> Self {
        Sandbox { policy }
    }

    pub async fn run(&self, _req: SandboxRequest) -> Result<SandboxOutput, SandboxError> {
        Err(SandboxError::NoSandbox)
    }
}
