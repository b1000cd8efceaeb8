//! What a caller hands the sandbox and gets back: the limits ([`SandboxPolicy`]), one process
//! to run ([`SandboxRequest`]) and what it left ([`SandboxOutput`]), an extra mount
//! ([`SandboxBind`]), how this host runs processes ([`SandboxMode`]) and what can go wrong
//! ([`SandboxError`]). Plain values: nothing here starts a process.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits applied to every sandboxed process. Missing fields take their defaults, so a
/// configuration file may set only what it changes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct SandboxPolicy {
    /// Address-space limit in bytes (`RLIMIT_AS`). Node reserves a lot of address space up
    /// front and does not start below roughly 1 GiB.
    pub memory_bytes: u64,
    /// CPU-time limit in seconds, per process (`RLIMIT_CPU`).
    pub cpu_seconds: u64,
    /// Largest file the process may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: u64,
    /// Most processes (threads count) the sandbox may hold (`RLIMIT_NPROC`), including the
    /// two bubblewrap processes that supervise it.
    pub max_processes: u64,
    /// Stdout beyond this is cut and flagged, and the process is killed.
    pub max_output_bytes: usize,
    /// Run without bubblewrap when it is absent (otherwise refuse).
    pub allow_unsandboxed: bool,
    /// Size of the sandbox's private, memory-backed `/tmp` (bubblewrap only).
    pub tmp_bytes: u64,
    /// The bubblewrap binary; unset: `bwrap` from the system directories, then PATH.
    pub bwrap: Option<PathBuf>,
    /// Whether a session's allowed hosts may resolve to loopback, private, link-local and
    /// other non-public addresses (see [`crate::egress`]). Off: an allowed name cannot reach
    /// the worker's own network or a cloud metadata endpoint.
    pub allow_private_egress: bool,
    /// Where sessions (the `agent` runner) keep each case's workspace and control files;
    /// unset: `/dev/shm` when it is a writable directory (memory-backed: no inode churn on
    /// a disk for the per-call files), else the temporary directory.
    pub session_dir: Option<PathBuf>,
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
            tmp_bytes: 64 << 20,
            bwrap: None,
            allow_private_egress: false,
            session_dir: None,
        }
    }
}

/// One process to run.
#[derive(Debug, Clone)]
pub struct SandboxRequest {
    /// Program and arguments; paths inside the package are given relative to the package root.
    /// A bare `python3`, `node` or `sh` is the interpreter the sandbox resolved at start.
    pub argv: Vec<String>,
    /// Mounted read-only; the working directory.
    pub package_root: PathBuf,
    pub stdin: Vec<u8>,
    /// Wall-clock limit; past it the whole process group is killed.
    pub timeout: Duration,
    /// The only environment the process sees (plus PATH, HOME, LANG, TMPDIR set by the
    /// sandbox; PATH, HOME and TMPDIR cannot be overridden, LANG can).
    pub env: BTreeMap<String, String>,
}

/// What a finished process left behind.
#[derive(Debug, Clone, Default)]
pub struct SandboxOutput {
    /// Exit code; a process killed by signal N reports 128 + N (bubblewrap's convention, used
    /// in both modes). `None` when the sandbox killed it (timeout, output limit).
    pub exit_code: Option<i32>,
    pub stdout: Vec<u8>,
    /// The last 64 KiB of stderr.
    pub stderr: Vec<u8>,
    /// Stdout was cut at `max_output_bytes` (and the process killed).
    pub stdout_truncated: bool,
    /// Stderr was longer than what is kept.
    pub stderr_truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
    /// The sandbox reached the skill's program (its start marker: see "Whose fault" in the
    /// `command` module): whatever went wrong after that is the program's doing.
    pub started: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("refusing to run untrusted code without a sandbox: bubblewrap (`bwrap`) is not installed or cannot create namespaces here; install it (Debian package `bubblewrap`) or allow unsandboxed execution explicitly")]
    NoSandbox,
    #[error("could not start `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("sandbox i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("`{tool}` (util-linux) is not installed; it is needed to apply the sandbox's limits")]
    MissingTool { tool: &'static str },
    #[error("package directory {path} cannot be read by the sandbox user: {reason}; packages must be extracted with directories 0755 and files 0644")]
    PackageNotReadable { path: PathBuf, reason: String },
    #[error("interpreter `{name}` cannot be used in the sandbox: {reason}")]
    Interpreter { name: String, reason: String },
    #[error("no free sandbox uid: {0} sandboxed processes are already running or their uids still hold processes")]
    Busy(u32),
    /// The sandbox's own tools failed before the program started.
    #[error("the sandbox could not start the program ({status}): {diagnostics}")]
    Machinery { status: String, diagnostics: String },
    /// The session's allowed hosts cannot be served on this host (a configuration problem).
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressError),
}

/// How [`Sandbox::run`](crate::Sandbox::run) runs processes on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// Bubblewrap works: namespaces, read-only package, no network.
    Bubblewrap,
    /// No usable bubblewrap and the policy allows running anyway (limits, no isolation).
    Unsandboxed,
    /// No usable bubblewrap and the policy does not allow running without it.
    Refusing,
}

impl fmt::Display for SandboxMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SandboxMode::Bubblewrap => "bubblewrap",
            SandboxMode::Unsandboxed => "unsandboxed",
            SandboxMode::Refusing => "refusing",
        })
    }
}

/// An extra host directory bubblewrap mounts into a session (see
/// [`Sandbox::open_session`](crate::Sandbox::open_session)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxBind {
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub dest: &'static str,
    /// Mounted read-write (and, when the sandbox has a uid of its own, handed to that uid).
    pub writable: bool,
}

/// A directory mounted read-only into every process of a sandbox (an environment of the
/// packages a skill imports), with the variables that make its programs and modules found.
/// Given to [`Sandbox::with_environment`](crate::Sandbox::with_environment).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SandboxEnvironment {
    /// The host directory.
    pub source: PathBuf,
    /// Where processes see it: an absolute path inside bubblewrap; without bubblewrap, the
    /// host directory itself (nothing is mounted then).
    pub dest: PathBuf,
    /// Directories (as processes see them) put before the sandbox's own `PATH`.
    pub path: Vec<String>,
    /// Variables set for every process (`VIRTUAL_ENV`, `PYTHONPATH`, `NODE_PATH`); a
    /// request's own variables of the same name win.
    pub vars: BTreeMap<String, String>,
}

/// Checks a package-relative path: relative, no `..`, no root or prefix; `Err` says why.
pub fn check_package_relative(path: &str) -> Result<PathBuf, String> {
    let p = Path::new(path);
    if path.is_empty() {
        return Err("path is empty".to_string());
    }
    let mut clean = PathBuf::new();
    for component in p.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err(format!("`{path}` contains `..`")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "`{path}` is absolute; give it relative to the package root"
                ))
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(format!("`{path}` names no file"));
    }
    Ok(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_relative_paths() {
        assert_eq!(
            check_package_relative("scripts/run.py"),
            Ok(PathBuf::from("scripts/run.py"))
        );
        assert_eq!(
            check_package_relative("./run.py"),
            Ok(PathBuf::from("run.py"))
        );
        assert!(check_package_relative("../x.py").is_err());
        assert!(check_package_relative("a/../../x.py").is_err());
        assert!(check_package_relative("/etc/x.py").is_err());
        assert!(check_package_relative("").is_err());
        assert!(check_package_relative(".").is_err());
    }

    #[test]
    fn a_partial_policy_keeps_the_other_defaults() {
        let policy: SandboxPolicy =
            serde_json::from_str(r#"{"allow_unsandboxed": true}"#).expect("policy");
        assert!(policy.allow_unsandboxed);
        assert_eq!(policy.memory_bytes, SandboxPolicy::default().memory_bytes);
        assert_eq!(policy.tmp_bytes, SandboxPolicy::default().tmp_bytes);
    }
}
