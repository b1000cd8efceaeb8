//! A sandbox that stays up across many commands: the `agent` runner's tools run in one
//! bubblewrap, under one leased uid and one set of limits, for the whole of a case.
//!
//! The session is a shell loop inside the sandbox ([`SESSION_DRIVER`]) that the host talks to
//! over its stdin and stdout; each command and its output pass through a control directory
//! mounted at [`SESSION_CONTROL_DIR`]. Opening one
//! ([`Sandbox::open_session`](crate::Sandbox::open_session)) is in `open`; finding and killing
//! the sandbox's processes from the host is in `inside`.

mod inside;
mod open;

use std::fmt;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use self::inside::Inside;
use crate::egress::EgressProxy;
use crate::output::Tail;
use crate::policy::SandboxError;
use crate::reaper::Reaper;

/// Where a session's control directory is mounted: the commands to run and their output
/// pass through it.
pub const SESSION_CONTROL_DIR: &str = "/run/skilleval";

/// The long-lived process of a session: a shell loop that reads `ID` lines, runs the command
/// file `ID.sh` of the control directory in a subshell (a fork of the loop, no `exec`) with its
/// output in `ID.out`, and answers `ID EXIT_CODE`. One sandbox (namespaces, uid, limits) serves
/// every call. The time limit is the host's: past it, the host kills every process of the
/// sandbox's pid namespace but bubblewrap's init and this loop ([`SandboxSession::run`]), and
/// the loop answers 137. Every `exec` pays a dynamic loader's start-up, which on a virtual
/// machine (its CPU-feature probing traps to the hypervisor) was most of a call's cost when a
/// `timeout` and an `sh` were started per call.
const SESSION_DRIVER: &str = r#"cd /workspace 2>/dev/null || cd /
echo ready
while read -r id; do
  ( . "/run/skilleval/$id.sh" ) </dev/null >"/run/skilleval/$id.out" 2>&1
  echo "$id $?"
done
"#;

/// Slack on top of a call's own time limit before the host gives up on the session.
const SESSION_CALL_SLACK: Duration = Duration::from_secs(5);
/// How long a session may take to start.
const SESSION_START_TIMEOUT: Duration = Duration::from_secs(15);

/// What one command of a session did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionOutput {
    /// Exit code (137 after the time limit, 128 + N after signal N).
    pub exit_code: i32,
    /// Stdout and stderr, interleaved, cut at the session's output limit.
    pub output: Vec<u8>,
    pub truncated: bool,
    pub timed_out: bool,
    pub duration: Duration,
}

/// A sandbox that stays up across many commands (the `agent` runner's tools): one bubblewrap,
/// one leased uid, one set of limits for its whole life; everything in it is killed when it is
/// dropped or [`SandboxSession::close`]d.
pub struct SandboxSession {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::BufReader<tokio::process::ChildStdout>,
    ctl: PathBuf,
    guard: Reaper,
    next: u64,
    max_output: usize,
    stderr: Arc<Mutex<Tail>>,
    broken: bool,
    /// The allowed-hosts proxy, when the session has one; it stops when the session goes.
    egress: Option<EgressProxy>,
    /// The sandbox's processes as the host sees them, found once it is up.
    inside: Option<Arc<Inside>>,
}

impl fmt::Debug for SandboxSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxSession")
            .field("ctl", &self.ctl)
            .field("calls", &self.next)
            .finish()
    }
}

impl SandboxSession {
    /// The host directory mounted at [`SESSION_CONTROL_DIR`].
    pub fn control_dir(&self) -> &Path {
        &self.ctl
    }

    /// Runs `script` with `sh` in the session (working directory `/workspace`); past `timeout`
    /// every process of the sandbox but its init and the session's loop is killed (so a
    /// process an earlier call left in the background goes too). `Err` when the session
    /// itself is gone (killed by a limit, or it stopped answering): the case cannot go on.
    pub async fn run(
        &mut self,
        script: &str,
        timeout: Duration,
    ) -> Result<SessionOutput, SandboxError> {
        if self.broken {
            return Err(self.gone("the session was stopped after an earlier failure"));
        }
        self.next += 1;
        let id = self.next;
        let script_path = self.ctl.join(format!("{id}.sh"));
        let out_path = self.ctl.join(format!("{id}.out"));
        std::fs::write(&script_path, script)?;
        std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o644))?;
        let start = Instant::now();
        let sent = self.stdin.write_all(format!("{id}\n").as_bytes()).await;
        if let Err(e) = sent {
            self.broken = true;
            return Err(self.gone(&format!("could not send the command: {e}")));
        }
        // The loop writes its answer in one write of a few bytes, so a read that times out has
        // taken nothing of it (`read_line` is not cancel-safe for partial lines).
        let mut line = String::new();
        let mut timed_out = false;
        let answer = match tokio::time::timeout(
            timeout,
            tokio::io::AsyncBufReadExt::read_line(&mut self.stdout, &mut line),
        )
        .await
        {
            Ok(answer) => Ok(answer),
            Err(_) => {
                timed_out = true;
                if let Some(inside) = self.inside.clone() {
                    let _ = tokio::task::spawn_blocking(move || inside.kill_commands()).await;
                }
                tokio::time::timeout(
                    SESSION_CALL_SLACK,
                    tokio::io::AsyncBufReadExt::read_line(&mut self.stdout, &mut line),
                )
                .await
            }
        };
        let duration = start.elapsed();
        let code = match answer {
            Ok(Ok(n)) if n > 0 => line
                .trim()
                .split_once(' ')
                .filter(|(got, _)| *got == id.to_string())
                .and_then(|(_, code)| code.parse::<i32>().ok()),
            _ => None,
        };
        let Some(exit_code) = code else {
            self.broken = true;
            let _ = std::fs::remove_file(&script_path);
            return Err(self.gone("the session stopped answering"));
        };
        let (output, truncated) = read_prefix(&out_path, self.max_output)?;
        let _ = std::fs::remove_file(&script_path);
        let _ = std::fs::remove_file(&out_path);
        Ok(SessionOutput {
            exit_code,
            output,
            truncated,
            timed_out,
            duration,
        })
    }

    /// Kills everything in the session and gives its uid back.
    pub async fn close(mut self) {
        self.egress = None;
        // The kernel kills every process of a pid namespace when its init dies.
        if let Some(inside) = &self.inside {
            let _ =
                rustix::process::pidfd_send_signal(&inside.init_fd, rustix::process::Signal::KILL);
        }
        self.guard.kill().await;
        let _ = self.child.wait().await;
        self.guard.finish().await;
    }

    fn diagnostics(&self) -> String {
        let text = self
            .stderr
            .lock()
            .map(|t| String::from_utf8_lossy(t.diagnostics()).trim().to_string())
            .unwrap_or_default();
        if text.is_empty() {
            "(no diagnostics)".to_string()
        } else {
            text
        }
    }

    fn gone(&self, why: &str) -> SandboxError {
        SandboxError::Io(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            format!(
                "the agent's sandbox is gone ({why}; a per-case limit may have killed it): {}",
                self.diagnostics()
            ),
        ))
    }
}

/// Up to `limit` bytes of a file, and whether there was more.
fn read_prefix(path: &Path, limit: usize) -> Result<(Vec<u8>, bool), SandboxError> {
    use std::io::Read;
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(e.into()),
    };
    let size = file.metadata()?.len();
    let mut buf = Vec::new();
    file.take(limit as u64).read_to_end(&mut buf)?;
    Ok((buf, size > limit as u64))
}
