//! Running untrusted code (custom graders, `command` runners) from uploaded packages.
//!
//! Design §5: such code gets JSON on stdin, a wall-clock timeout that kills every process it
//! started, CPU/memory/file-size/process-count limits, a scrubbed environment, no network and a
//! read-only view of its package. The workspace forbids `unsafe`, so nothing is done between
//! `fork` and `exec` in this process; instead the limits are composed from stock tools on the
//! command line (util-linux `prlimit` and `setpriv`, and bubblewrap), each of which applies one
//! property and `exec`s the next:
//!
//! ```text
//! prlimit --as=M --cpu=C --fsize=F --nproc=P --core=0 --
//!   setpriv --reuid=U --regid=U --clear-groups --no-new-privs --inh-caps=-all --bounding-set=-all --
//!   bwrap --unshare-all --unshare-user --disable-userns --die-with-parent --new-session
//!         --ro-bind /usr /usr --symlink usr/bin /bin ... --ro-bind-try /etc/ssl /etc/ssl ...
//!         --ro-bind PACKAGE /skill --size T --tmpfs /tmp --proc /proc --dev /dev --remount-ro /
//!         --chdir /skill --clearenv --setenv PATH ... --setenv HOME /tmp ... -- python3 scripts/run.py
//! ```
//!
//! `setpriv` is there because the kernel does not enforce `RLIMIT_NPROC` for root: when this
//! process runs as root, every sandboxed run gets a uid of its own (leased from a pool, locked
//! across processes with `flock`), so one run's fork bomb cannot eat another run's process
//! budget, and after the run everything that uid still owns is killed (`kill -KILL -1` as that
//! uid), which catches daemons that left the process group. Where such uids cannot be used (a
//! container with a narrow uid map) all runs share `nobody` (65534) and the process budget.
//! Not running as root, no uid change is possible: limits then count the invoking user's
//! processes too, which is documented rather than hidden.
//!
//! **Clean identities.** The kernel counts processes per uid (`RLIMIT_NPROC` is checked against
//! every task of the real uid, zombies included, until their parent reaps them), so a uid is
//! leased only when no task of it exists: a lease scans `/proc` once, skips every pool uid that
//! still owns a task, and kills the live leftovers of an unlocked uid so it is clean for a
//! later lease. Leftovers are routine: bubblewrap's inner process outlives the outer one by a
//! moment and is re-parented to pid 1, which reaps it when it gets to it (a soak saw 50-230
//! such zombies of sandbox uids at any time), and a worker killed mid-run leaves all of its
//! sandboxes' processes the same way, while its lock files are released at once. Processes start leasing at a random slot, so a
//! replacement worker does not begin with the uids its predecessor just left. The start-up
//! probe leases its uid like any run. Each bubblewrap run's `/tmp` is a fresh tmpfs of its own
//! namespace and each unsandboxed run gets a fresh scratch directory, so nothing else of an
//! identity outlives its run.
//!
//! **Whose fault.** The program is started through `sh -c 'printf MARKER >&2; exec "$0" "$@"'`
//! inside the sandbox (`exec`, so no extra process stays): the marker on stderr is the proof
//! that the sandbox machinery (prlimit, setpriv, bubblewrap) got as far as the skill's
//! program. A run that ends without it failed before any of the skill's code ran (bubblewrap
//! could not fork or create its namespaces, setpriv could not exec it): that is
//! [`SandboxError::Machinery`], a fault of the host, with the tools' own diagnostics. What
//! happens after the marker (a crash, the skill's own fork bomb hitting the process limit) is
//! the skill's. The marker is removed from the stderr the caller sees.
//!
//! Because the sandbox runs under another uid, a package directory must be world-readable:
//! package loaders extract with directories 0755 and files 0644, and [`Sandbox::run`] refuses a
//! package root that uid cannot reach, with an error saying so.
//!
//! Without bubblewrap (or with one that cannot create namespaces here) the sandbox refuses to
//! run anything ([`SandboxError::NoSandbox`]) unless the policy allows unsandboxed execution;
//! then the process still gets the limits, its own uid, a process group, the timeout, the output
//! cap and the scrubbed environment, but it can use the network and see the host's files.

pub mod egress;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::egress::{AllowedHosts, EgressProxy};

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
    /// The sandbox reached the skill's program (see the module docs): whatever went wrong
    /// after that is the program's doing.
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

/// How [`Sandbox::run`] runs processes on this host.
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

/// Runs processes under a [`SandboxPolicy`]. Cheap to clone: what was found out about the
/// host (tools, interpreters, whether bubblewrap works) is shared and probed once per process
/// and bubblewrap binary; [`Sandbox::probe`] looks again after a failure.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub policy: SandboxPolicy,
    host: Arc<HostCell>,
}

/// What is known about the host for one bubblewrap binary; replaced when a probe finds the
/// host changed (bubblewrap installed or repaired).
#[derive(Debug)]
struct HostCell {
    bwrap: Option<PathBuf>,
    current: std::sync::RwLock<Arc<Host>>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox::detect(SandboxPolicy::default())
    }
}

/// Where the package is mounted inside bubblewrap.
const SANDBOX_PACKAGE_DIR: &str = "/skill";
/// Stderr kept (its tail: that is where tracebacks are).
const STDERR_KEEP: usize = 64 * 1024;
/// After the main process exits, how long leftover children may keep its pipes open.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// After a kill, how long to keep reading what was already written to the pipes.
const KILL_DRAIN: Duration = Duration::from_secs(1);
/// Private sandbox uids: far above any real account, one per concurrent run.
const UID_POOL_BASE: u32 = 2_000_000_000;
const UID_POOL_SIZE: u32 = 1024;
/// The fallback identity when private uids cannot be used.
const NOBODY: u32 = 65534;
/// System directories bubblewrap mirrors from the host (as directories or `/usr` symlinks).
const SYSTEM_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// The parts of `/etc` interpreters need; the rest of `/etc` (service configs, credentials)
/// stays out of view.
const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "mime.types",
    "os-release",
];
/// What the sandbox prints on stderr just before it `exec`s the program (as a `printf` format
/// and as the bytes that come out).
const STARTED_MARKER_PRINTF: &str = "\\036skilleval-sandbox: exec\\n";
const STARTED_MARKER: &[u8] = b"\x1eskilleval-sandbox: exec\n";
/// Diagnostics kept from the sandbox's tools (before the marker).
const DIAGNOSTICS_KEEP: usize = 8 * 1024;
/// Interpreters a request may name by bare name.
const INTERPRETERS: &[&str] = &["python3", "node", "sh"];

impl Sandbox {
    /// Same as [`Sandbox::detect`].
    pub fn new(policy: SandboxPolicy) -> Self {
        Sandbox::detect(policy)
    }

    /// Finds bubblewrap (the policy's `bwrap`, else the system directories, then PATH) and
    /// checks once per process that it works here.
    pub fn detect(policy: SandboxPolicy) -> Self {
        let bwrap = match &policy.bwrap {
            Some(path) => Some(path.clone()),
            None => find_tool("bwrap"),
        };
        Sandbox::with_bwrap_path(policy, bwrap)
    }

    /// Uses this bubblewrap binary, or none (`None`: as if bubblewrap were not installed).
    pub fn with_bwrap_path(policy: SandboxPolicy, bwrap: Option<PathBuf>) -> Self {
        static HOSTS: OnceLock<Mutex<BTreeMap<Option<PathBuf>, Arc<HostCell>>>> = OnceLock::new();
        let hosts = HOSTS.get_or_init(Mutex::default);
        let mut hosts = hosts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let host = hosts
            .entry(bwrap.clone())
            .or_insert_with(|| {
                Arc::new(HostCell {
                    current: std::sync::RwLock::new(Arc::new(Host::discover(bwrap.clone()))),
                    bwrap,
                })
            })
            .clone();
        Sandbox { policy, host }
    }

    fn host(&self) -> Arc<Host> {
        self.host
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How processes are run under this policy on this host.
    pub fn mode(&self) -> SandboxMode {
        self.mode_of(&self.host())
    }

    /// Why bubblewrap is not used, when it is not.
    pub fn unavailable_reason(&self) -> Option<String> {
        self.host().bwrap_problem.clone()
    }

    /// Which uid sandboxed processes run as, for logs.
    pub fn identity(&self) -> String {
        match &self.host().identity {
            Identity::Pool { .. } => format!(
                "a private uid per run ({UID_POOL_BASE}..{})",
                UID_POOL_BASE + UID_POOL_SIZE
            ),
            Identity::Shared(uid) => format!("uid {uid}, shared by every run"),
            Identity::Inherit => "this process's uid".to_string(),
        }
    }

    /// Checks that a run can be had right now: `true` through the whole machinery (lease,
    /// limits, bubblewrap). A sandbox that refuses (no usable bubblewrap) looks at the host
    /// again first, so installing or repairing bubblewrap is noticed without a restart.
    /// `Err` says what failed.
    pub async fn probe(&self) -> Result<(), String> {
        if self.mode() == SandboxMode::Refusing {
            let bwrap = self.host.bwrap.clone();
            let fresh = tokio::task::spawn_blocking(move || Host::discover(bwrap))
                .await
                .map_err(|e| format!("looking at the host: {e}"))?;
            if fresh.bwrap.is_none() {
                return Err(fresh
                    .bwrap_problem
                    .unwrap_or_else(|| "bubblewrap is not usable".to_string()));
            }
            *self
                .host
                .current
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(fresh);
        }
        let req = SandboxRequest {
            argv: vec!["sh".into(), "-c".into(), "exit 0".into()],
            package_root: PathBuf::from("/usr"),
            stdin: Vec::new(),
            timeout: Duration::from_secs(10),
            env: BTreeMap::new(),
        };
        match self.run(req).await {
            Ok(out) if out.exit_code == Some(0) => Ok(()),
            Ok(out) => Err(format!(
                "a trivial program failed ({}): {}",
                out.exit_code
                    .map_or_else(|| "killed".to_string(), |c| format!("exit code {c}")),
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Runs one process to completion, timeout, or output limit, and reaps everything it
    /// started.
    pub async fn run(&self, req: SandboxRequest) -> Result<SandboxOutput, SandboxError> {
        self.run_with_binds(req, &[]).await
    }

    /// [`Sandbox::run`] with extra directories mounted (bubblewrap only: an unsandboxed run
    /// sees the host, so the caller passes host paths instead).
    pub async fn run_with_binds(
        &self,
        req: SandboxRequest,
        binds: &[SandboxBind],
    ) -> Result<SandboxOutput, SandboxError> {
        // One view of the host for the whole run, even if a probe replaces it meanwhile.
        let host = self.host();
        let mode = self.mode_of(&host);
        if mode == SandboxMode::Refusing {
            return Err(SandboxError::NoSandbox);
        }
        if mode == SandboxMode::Unsandboxed {
            static WARNED: AtomicBool = AtomicBool::new(false);
            if !WARNED.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    reason = host.bwrap_problem.as_deref().unwrap_or("not installed"),
                    "bubblewrap is not usable: running untrusted package code WITHOUT a sandbox (resource limits only; network and host files are reachable)"
                );
            }
        }
        let Some(program) = req.argv.first() else {
            return Err(SandboxError::Spawn {
                program: String::new(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty argv"),
            });
        };
        let package = std::fs::canonicalize(&req.package_root)?;
        let lease = Host::lease_off_runtime(&host).await?;
        let uid = lease.as_ref().map(|l| l.uid);
        if let Some(uid) = uid {
            check_world_readable(&package).map_err(|reason| SandboxError::PackageNotReadable {
                path: package.clone(),
                reason: format!("{reason} (the sandbox runs as uid {uid})"),
            })?;
        }
        let program = host.resolve_program(program)?;
        // Unsandboxed, HOME and TMPDIR are a private scratch directory on the host.
        let scratch = match mode {
            SandboxMode::Unsandboxed => Some(scratch_dir(uid)?),
            _ => None,
        };
        let plan = host.plan(
            &self.policy,
            &req,
            &program,
            &package,
            uid,
            scratch.as_ref().map(tempfile::TempDir::path),
            binds,
        )?;
        tracing::debug!(argv = ?plan.argv, "sandbox: spawning");
        let out = self.execute(&host, plan, &req, lease).await;
        drop(scratch);
        let out = out?;
        if !out.started && !out.timed_out && !out.stdout_truncated {
            let status = out
                .exit_code
                .map_or_else(|| "killed".to_string(), |c| format!("exit code {c}"));
            let diagnostics = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return Err(SandboxError::Machinery {
                status,
                diagnostics: if diagnostics.is_empty() {
                    "(no diagnostics)".to_string()
                } else {
                    diagnostics
                },
            });
        }
        Ok(out)
    }

    fn mode_of(&self, host: &Host) -> SandboxMode {
        if host.bwrap.is_some() {
            SandboxMode::Bubblewrap
        } else if self.policy.allow_unsandboxed {
            SandboxMode::Unsandboxed
        } else {
            SandboxMode::Refusing
        }
    }

    async fn execute(
        &self,
        host: &Host,
        plan: Plan,
        req: &SandboxRequest,
        lease: Option<UidLease>,
    ) -> Result<SandboxOutput, SandboxError> {
        let (program, args) = plan.argv.split_first().ok_or_else(|| SandboxError::Spawn {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command line"),
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so the whole tree can be signalled at once.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &plan.cwd {
            cmd.current_dir(cwd);
        }
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        // Kills the group (and the run's uid) if this future is dropped mid-run, e.g. by the
        // executor's own timeout.
        let mut guard = Reaper {
            pgid,
            sweep: host.sweep_command(lease.as_ref()),
            lease,
            armed: true,
        };

        let stdin_task = child.stdin.take().map(|mut stdin| {
            let data = req.stdin.clone();
            // A script that never reads stdin must not block the run: write concurrently and
            // ignore a closed pipe.
            tokio::spawn(async move {
                let _ = stdin.write_all(&data).await;
                let _ = stdin.shutdown().await;
            })
        });
        let mut stdout = child.stdout.take();
        let mut stderr = child.stderr.take();

        let limit = self.policy.max_output_bytes;
        let mut out_buf = Vec::new();
        let mut err_tail = Tail::with_marker(STDERR_KEEP, STARTED_MARKER);
        let mut status = None;
        let mut timed_out = false;
        let mut truncated = false;
        let mut killed = false;
        {
            let out_fut = read_capped(stdout.as_mut(), &mut out_buf, limit);
            let err_fut = read_tail(stderr.as_mut(), &mut err_tail);
            tokio::pin!(out_fut, err_fut);
            let timer = tokio::time::sleep_until((start + req.timeout).into());
            tokio::pin!(timer);
            let mut out_done = false;
            let mut err_done = false;
            let mut draining = false;
            loop {
                if out_done && err_done && status.is_some() {
                    break;
                }
                tokio::select! {
                    cut = &mut out_fut, if !out_done => {
                        out_done = true;
                        if cut && !killed {
                            // A flood of output: stop it now rather than read it all.
                            truncated = true;
                            killed = true;
                            guard.kill().await;
                            timer.as_mut().reset((Instant::now() + KILL_DRAIN).into());
                        }
                    }
                    () = &mut err_fut, if !err_done => err_done = true,
                    st = child.wait(), if status.is_none() => {
                        status = Some(st?);
                        let pipes_open = !(out_done && err_done);
                        if pipes_open && !killed && !draining {
                            // The main process is gone but something it started still holds
                            // its pipes; give it a moment, then kill it.
                            draining = true;
                            let grace = (Instant::now() + EXIT_GRACE).min(start + req.timeout);
                            timer.as_mut().reset(grace.into());
                        }
                    }
                    () = &mut timer => {
                        if killed {
                            // Pipes still open after a kill (an escaped daemon): stop reading.
                            break;
                        }
                        timed_out = status.is_none();
                        killed = true;
                        guard.kill().await;
                        timer.as_mut().reset((Instant::now() + KILL_DRAIN).into());
                    }
                }
            }
        }
        // Always reap the child, even when the loop gave up on its pipes.
        let status = match status {
            Some(st) => st,
            None => {
                guard.kill().await;
                child.wait().await?
            }
        };
        guard.finish().await;
        if let Some(task) = stdin_task {
            task.abort();
        }
        let duration = start.elapsed();
        let exit_code = match (status.code(), status.signal()) {
            (Some(code), _) => Some(code),
            (None, Some(_)) if killed => None,
            (None, Some(sig)) => Some(128 + sig),
            (None, None) => None,
        };
        let started = err_tail.started();
        let (stderr, stderr_truncated) = err_tail.finish();
        Ok(SandboxOutput {
            exit_code,
            stdout: out_buf,
            stderr,
            stderr_truncated,
            stdout_truncated: truncated,
            timed_out,
            duration,
            started,
        })
    }
}

/// The command line for one run.
#[derive(Debug)]
struct Plan {
    argv: Vec<OsString>,
    /// Set on the spawned process (bubblewrap gets the sandbox's env through `--setenv`).
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
}

/// What was found out about this host, once per process.
#[derive(Debug)]
struct Host {
    /// A bubblewrap that passed the functional check.
    bwrap: Option<PathBuf>,
    bwrap_problem: Option<String>,
    prlimit: Option<PathBuf>,
    setpriv: Option<PathBuf>,
    kill: Option<PathBuf>,
    identity: Identity,
    /// bwrap arguments giving the read-only system view.
    system_mounts: Vec<OsString>,
    interpreters: BTreeMap<&'static str, Interpreter>,
    /// PATH inside the sandbox.
    path_env: String,
}

#[derive(Debug, Clone)]
struct Interpreter {
    path: PathBuf,
    /// An install prefix outside the system directories, bound read-only at the same path.
    bind: Option<PathBuf>,
    /// Why it cannot be used from the sandbox.
    problem: Option<String>,
}

/// Which uid sandboxed processes run as.
#[derive(Debug, Clone)]
enum Identity {
    /// A private uid per run, leased under `lock_dir`.
    Pool { lock_dir: PathBuf },
    /// Every run shares this uid (and so the process budget); no sweep.
    Shared(u32),
    /// Not root: processes keep this process's uid.
    Inherit,
}

struct UidLease {
    uid: u32,
    /// Its place in the pool.
    slot: u32,
    /// Nothing else runs as this uid, so everything it owns may be killed after the run.
    private: bool,
    _lock: Option<Flock<File>>,
}

impl fmt::Debug for UidLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UidLease")
            .field("uid", &self.uid)
            .field("private", &self.private)
            .finish()
    }
}

/// The private uid pool: `size` uids from `base`, leased under `lock_dir`.
#[derive(Debug, Clone)]
struct UidPool<'a> {
    lock_dir: &'a Path,
    base: u32,
    size: u32,
}

impl UidPool<'_> {
    /// Leases a uid no other run (in this or another process on the host) is using and no
    /// task of which exists (see the module docs). The lock is a `flock` on a per-uid file,
    /// released by the kernel even if this process dies; the task census is what makes that
    /// safe, since a dead holder's processes may outlive its lock. A uid that still has live
    /// tasks and no holder gets them killed (`kill` runs `sweep`) and is skipped this time.
    fn lease(&self, start: u32, kill: &dyn Fn(u32)) -> Result<UidLease, SandboxError> {
        let busy = census(&(self.base..self.base + self.size));
        for i in 0..self.size {
            let slot = start.wrapping_add(i) % self.size;
            let uid = self.base + slot;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(self.lock_dir.join(format!("{uid}.lock")))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => match busy.get(&uid).map(|pids| classify(pids)) {
                    None => {
                        return Ok(UidLease {
                            uid,
                            slot,
                            private: true,
                            _lock: Some(lock),
                        })
                    }
                    Some(tasks) => {
                        tracing::debug!(
                            uid,
                            live = tasks.live,
                            zombies = tasks.zombies,
                            "sandbox: uid still has processes from an earlier holder; skipped"
                        );
                        if tasks.live > 0 {
                            kill(uid);
                        }
                    }
                },
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, errno)) => return Err(SandboxError::Io(std::io::Error::from(errno))),
            }
        }
        Err(SandboxError::Busy(self.size))
    }
}

/// Tasks of one uid found in `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct UidTasks {
    live: u32,
    /// Dead, not yet reaped by their parent: still counted against the uid's process limit.
    zombies: u32,
}

/// The pids of every uid in `range` that owns a process, by real uid (what `RLIMIT_NPROC`
/// counts).
///
/// `/proc/<pid>` belongs to the task's effective uid, or to root while the task is not dumpable
/// (for a moment after a uid change, or after `prctl(PR_SET_DUMPABLE, 0)`). A sandbox task
/// cannot make its real and effective uids differ (no capabilities, no new privileges, one uid
/// mapped), so the directory's owner is its real uid unless it is root: one `stat` per task
/// decides, and only root-owned tasks have their `status` read. Reading every task's `status`
/// (which the kernel renders with signal masks and CPU lists) made a lease cost milliseconds
/// with a few hundred sandboxes up.
fn census(range: &std::ops::Range<u32>) -> BTreeMap<u32, Vec<u32>> {
    let mut found: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (pid, entry) in proc_entries() {
        // A process that exits meanwhile simply has no entry any more.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let uid = match meta.uid() {
            owner if range.contains(&owner) => Some(owner),
            0 => real_uid(pid).filter(|u| range.contains(u)),
            _ => None,
        };
        if let Some(uid) = uid {
            found.entry(uid).or_default().push(pid);
        }
    }
    found
}

/// The pid entries of `/proc` (one per process), with their pids; none when `/proc` cannot
/// be read.
fn proc_entries() -> impl Iterator<Item = (u32, std::fs::DirEntry)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e)))
}

/// The real uid of a task, from its `status`.
fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().next())
        .and_then(|u| u.parse::<u32>().ok())
}

/// How many of `pids` are alive and how many are zombies (from their `stat` state).
fn classify(pids: &[u32]) -> UidTasks {
    let mut tasks = UidTasks::default();
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) S ...`: the state follows the last `)` (comm may hold anything).
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if state == Some('Z') {
            tasks.zombies += 1;
        } else {
            tasks.live += 1;
        }
    }
    tasks
}

/// Every uid in `range` that owns a process, with how many live and zombie processes it has.
#[cfg(test)]
fn uids_with_tasks(range: std::ops::Range<u32>) -> BTreeMap<u32, UidTasks> {
    census(&range)
        .into_iter()
        .map(|(uid, pids)| (uid, classify(&pids)))
        .filter(|(_, t)| t.live + t.zombies > 0)
        .collect()
}

/// Where the next lease of this process starts looking: random at first, so processes that
/// start together (or one that replaces a killed one) do not all begin with the same uids.
fn next_slot() -> &'static AtomicU32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU32::new(rand::random::<u32>() % UID_POOL_SIZE))
}

impl Host {
    fn discover(bwrap: Option<PathBuf>) -> Host {
        let is_root = nix::unistd::geteuid().is_root();
        let mut host = Host {
            bwrap: None,
            bwrap_problem: None,
            prlimit: find_tool("prlimit"),
            setpriv: find_tool("setpriv"),
            kill: find_tool("kill"),
            identity: Identity::Inherit,
            system_mounts: system_mounts(),
            interpreters: BTreeMap::new(),
            path_env: String::new(),
        };
        let mut path_dirs = vec![
            "/usr/local/bin".to_string(),
            "/usr/bin".to_string(),
            "/bin".to_string(),
        ];
        for name in INTERPRETERS {
            if let Some(interp) = resolve_interpreter(name, is_root) {
                if let Some(dir) = interp
                    .path
                    .parent()
                    .map(|d| d.to_string_lossy().into_owned())
                {
                    if !path_dirs.contains(&dir) {
                        path_dirs.push(dir);
                    }
                }
                host.interpreters.insert(name, interp);
            }
        }
        host.path_env = path_dirs.join(":");

        // Identities to try, best first.
        let mut identities = Vec::new();
        if is_root && host.setpriv.is_some() {
            if let Some(lock_dir) = uid_lock_dir() {
                identities.push(Identity::Pool { lock_dir });
            }
            identities.push(Identity::Shared(NOBODY));
        } else {
            identities.push(Identity::Inherit);
        }

        let policy = SandboxPolicy::default();
        let mut problems = Vec::new();
        if let Some(bwrap) = bwrap {
            host.bwrap = Some(bwrap);
            for identity in &identities {
                host.identity = identity.clone();
                match host.probe(&policy) {
                    Ok(()) => {
                        tracing::info!(identity = ?host.identity, "sandbox: bubblewrap works");
                        return host;
                    }
                    Err(problem) => problems.push(format!("as {identity:?}: {problem}")),
                }
            }
            host.bwrap = None;
            let problem = format!("bubblewrap failed its check: {}", problems.join("; "));
            tracing::warn!(%problem, "sandbox: bubblewrap is not usable");
            host.bwrap_problem = Some(problem);
        } else {
            host.bwrap_problem = Some("`bwrap` is not on PATH".to_string());
        }
        // Pick the identity unsandboxed runs will use, should the policy allow them.
        for identity in &identities {
            host.identity = identity.clone();
            if host.probe(&policy).is_ok() {
                return host;
            }
        }
        host.identity = identities.last().cloned().unwrap_or(Identity::Inherit);
        host
    }

    /// [`Host::lease`] on a blocking thread: the census reads `/proc`, which must not hold up
    /// the runtime's workers (the agent runner opens sessions from many tasks at once).
    async fn lease_off_runtime(host: &Arc<Host>) -> Result<Option<UidLease>, SandboxError> {
        let host = host.clone();
        tokio::task::spawn_blocking(move || host.lease())
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(format!("leasing a uid: {e}"))))?
    }

    /// A uid for one run under this host's identity.
    fn lease(&self) -> Result<Option<UidLease>, SandboxError> {
        match &self.identity {
            Identity::Inherit => Ok(None),
            Identity::Shared(uid) => Ok(Some(UidLease {
                uid: *uid,
                slot: 0,
                private: false,
                _lock: None,
            })),
            Identity::Pool { lock_dir } => {
                let pool = UidPool {
                    lock_dir,
                    base: UID_POOL_BASE,
                    size: UID_POOL_SIZE,
                };
                let next = next_slot();
                let lease = pool.lease(next.fetch_add(1, Ordering::Relaxed), &|uid| {
                    self.kill_uid_blocking(uid);
                })?;
                next.store(lease.slot.wrapping_add(1), Ordering::Relaxed);
                Ok(Some(lease))
            }
        }
    }

    /// Kills every process of a private uid, waiting for `kill` itself (not for the victims
    /// to be reaped: that is their parent's business, and the census skips the uid until then).
    fn kill_uid_blocking(&self, uid: u32) {
        if let Some(sweep) = self.sweep_for_uid(uid) {
            if let Some((program, args)) = sweep.split_first() {
                // Failing (ESRCH: nothing left) is the usual outcome and changes nothing.
                let _ = std::process::Command::new(program)
                    .args(args)
                    .env_clear()
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }

    /// [`Host::probe_once`], up to three times: one failed start (a transient shortage) must
    /// not decide the identity for the life of the process.
    fn probe(&self, policy: &SandboxPolicy) -> Result<(), String> {
        let mut last = String::new();
        for attempt in 0..3 {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            match self.probe_once(policy) {
                Ok(()) => return Ok(()),
                Err(problem) => last = problem,
            }
        }
        Err(last)
    }

    /// Runs `true` through the full command line, synchronously, under a leased uid.
    fn probe_once(&self, policy: &SandboxPolicy) -> Result<(), String> {
        let lease = self.lease().map_err(|e| e.to_string())?;
        let uid = lease.as_ref().map(|l| l.uid);
        let req = SandboxRequest {
            argv: vec!["true".into()],
            package_root: PathBuf::from("/usr"),
            stdin: Vec::new(),
            timeout: Duration::from_secs(10),
            env: BTreeMap::new(),
        };
        let tmp = std::env::temp_dir();
        let scratch = if self.bwrap.is_some() {
            None
        } else {
            Some(tmp.as_path())
        };
        let program = find_tool("true").unwrap_or_else(|| PathBuf::from("/bin/true"));
        let plan = self
            .plan(policy, &req, &program, Path::new("/usr"), uid, scratch, &[])
            .map_err(|e| e.to_string())?;
        let (program, args) = plan.argv.split_first().ok_or("empty command line")?;
        let out = std::process::Command::new(program)
            .args(args)
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .current_dir(plan.cwd.as_deref().unwrap_or(Path::new("/")))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("could not start {}: {e}", program.to_string_lossy()))?;
        if let Some(lease) = lease.as_ref().filter(|l| l.private) {
            self.kill_uid_blocking(lease.uid);
        }
        drop(lease);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} ({})",
                String::from_utf8_lossy(&out.stderr).trim(),
                out.status
            ))
        }
    }

    /// `argv[0]`: a bare interpreter name becomes the resolved interpreter.
    fn resolve_program(&self, program: &str) -> Result<PathBuf, SandboxError> {
        match self.interpreters.get(program) {
            Some(Interpreter {
                problem: Some(reason),
                ..
            }) => Err(SandboxError::Interpreter {
                name: program.to_string(),
                reason: reason.clone(),
            }),
            Some(interp) => Ok(interp.path.clone()),
            None if INTERPRETERS.contains(&program) => Err(SandboxError::Interpreter {
                name: program.to_string(),
                reason: "not installed on this host".to_string(),
            }),
            None => Ok(PathBuf::from(program)),
        }
    }

    // Each argument is one independent input of the command line; a struct of them would only
    // be built to be taken apart here.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        policy: &SandboxPolicy,
        req: &SandboxRequest,
        program: &Path,
        package: &Path,
        uid: Option<u32>,
        scratch: Option<&Path>,
        binds: &[SandboxBind],
    ) -> Result<Plan, SandboxError> {
        let prlimit = self
            .prlimit
            .as_ref()
            .ok_or(SandboxError::MissingTool { tool: "prlimit" })?;
        let mut argv: Vec<OsString> = vec![
            prlimit.into(),
            format!("--as={}", policy.memory_bytes).into(),
            format!("--cpu={}", policy.cpu_seconds).into(),
            format!("--fsize={}", policy.file_size_bytes).into(),
            format!("--nproc={}", policy.max_processes).into(),
            "--core=0".into(),
            "--".into(),
        ];
        if let Some(uid) = uid {
            let setpriv = self
                .setpriv
                .as_ref()
                .ok_or(SandboxError::MissingTool { tool: "setpriv" })?;
            argv.extend([
                setpriv.into(),
                format!("--reuid={uid}").into(),
                format!("--regid={uid}").into(),
                "--clear-groups".into(),
                // No setuid binary may regain privileges, and no capability survives.
                "--no-new-privs".into(),
                "--inh-caps=-all".into(),
                "--bounding-set=-all".into(),
                "--".into(),
            ]);
        }
        let home = match scratch {
            Some(dir) => dir.as_os_str().to_owned(),
            None => OsString::from("/tmp"),
        };
        let mut env: BTreeMap<OsString, OsString> = BTreeMap::new();
        env.insert("LANG".into(), "C.UTF-8".into());
        for (k, v) in &req.env {
            // A name bwrap or execve would choke on is dropped rather than failing the run.
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                tracing::warn!(name = %k, "sandbox: skipping invalid environment variable");
                continue;
            }
            env.insert(k.into(), v.into());
        }
        env.insert("PATH".into(), self.path_env.clone().into());
        env.insert("HOME".into(), home.clone());
        env.insert("TMPDIR".into(), home);

        match &self.bwrap {
            Some(bwrap) => {
                argv.extend([
                    bwrap.into(),
                    // New user, pid, net (loopback only), ipc, uts and cgroup namespaces.
                    "--unshare-all".into(),
                    "--unshare-user".into(),
                    // No nested user namespaces: less kernel surface for the script.
                    "--disable-userns".into(),
                    // If we die, the sandbox's pid 1 dies, and with it every process inside.
                    "--die-with-parent".into(),
                    // No TIOCSTI into a terminal of ours.
                    "--new-session".into(),
                ]);
                argv.extend(self.system_mounts.iter().cloned());
                for interp in self.interpreters.values() {
                    if let (Some(bind), None) = (&interp.bind, &interp.problem) {
                        argv.extend(["--ro-bind".into(), bind.into(), bind.into()]);
                    }
                }
                argv.extend([
                    "--ro-bind".into(),
                    package.into(),
                    SANDBOX_PACKAGE_DIR.into(),
                ]);
                for b in binds {
                    let kind = if b.writable { "--bind" } else { "--ro-bind" };
                    argv.extend([kind.into(), b.source.clone().into(), b.dest.into()]);
                }
                argv.extend([
                    "--size".into(),
                    policy.tmp_bytes.to_string().into(),
                    "--tmpfs".into(),
                    "/tmp".into(),
                    "--proc".into(),
                    "/proc".into(),
                    "--dev".into(),
                    "/dev".into(),
                    // The root itself is a tmpfs bwrap made; nothing may be written there.
                    "--remount-ro".into(),
                    "/".into(),
                    "--chdir".into(),
                    SANDBOX_PACKAGE_DIR.into(),
                    "--clearenv".into(),
                ]);
                for (k, v) in env {
                    argv.extend(["--setenv".into(), k, v]);
                }
                argv.push("--".into());
                argv.extend(self.exec_with_marker(program, req)?);
                Ok(Plan {
                    argv,
                    env: Vec::new(),
                    cwd: None,
                })
            }
            None => {
                argv.extend(self.exec_with_marker(program, req)?);
                Ok(Plan {
                    argv,
                    env: env.into_iter().collect(),
                    cwd: Some(package.to_path_buf()),
                })
            }
        }
    }

    /// `sh -c 'print the marker; exec the program' program args...`: the marker proves the
    /// machinery got as far as the program, `exec` keeps the process count unchanged. A
    /// program that is itself `sh -c SCRIPT` (a session's loop, the probe) runs in that same
    /// shell, `sh -c 'print the marker; SCRIPT'`: one program start fewer.
    fn exec_with_marker(
        &self,
        program: &Path,
        req: &SandboxRequest,
    ) -> Result<Vec<OsString>, SandboxError> {
        let sh = self
            .interpreters
            .get("sh")
            .filter(|i| i.problem.is_none())
            .ok_or(SandboxError::MissingTool { tool: "sh" })?;
        if let [name, flag, script] = req.argv.as_slice() {
            if name == "sh" && flag == "-c" && program == sh.path {
                return Ok(vec![
                    sh.path.clone().into(),
                    "-c".into(),
                    format!("printf '{STARTED_MARKER_PRINTF}' >&2; {script}").into(),
                ]);
            }
        }
        let mut argv: Vec<OsString> = vec![
            sh.path.clone().into(),
            "-c".into(),
            format!("printf '{STARTED_MARKER_PRINTF}' >&2; exec \"$0\" \"$@\"").into(),
            program.into(),
        ];
        argv.extend(req.argv.iter().skip(1).map(OsString::from));
        Ok(argv)
    }

    /// The command that kills everything a private uid still owns.
    fn sweep_command(&self, lease: Option<&UidLease>) -> Option<Vec<OsString>> {
        let lease = lease.filter(|l| l.private)?;
        self.sweep_for_uid(lease.uid)
    }

    fn sweep_for_uid(&self, uid: u32) -> Option<Vec<OsString>> {
        let setpriv = self.setpriv.as_ref()?;
        let kill = self.kill.as_ref()?;
        Some(vec![
            setpriv.into(),
            format!("--reuid={uid}").into(),
            format!("--regid={uid}").into(),
            "--clear-groups".into(),
            "--".into(),
            kill.into(),
            "-KILL".into(),
            "--".into(),
            // kill(-1): every process this uid may signal, i.e. all of the run's, atomically
            // with respect to forks.
            "-1".into(),
        ])
    }
}

/// Kills a run's process group and sweeps its uid; on drop too, so an abandoned run is cleaned.
///
/// It holds the run's uid lease: the uid goes back to the pool only after the sweep, so a
/// sweep can never hit the next run that leases the same uid.
struct Reaper {
    pgid: Option<Pid>,
    sweep: Option<Vec<OsString>>,
    lease: Option<UidLease>,
    armed: bool,
}

impl Reaper {
    async fn kill(&self) {
        self.kill_group();
        if let Some(sweep) = &self.sweep {
            run_sweep(sweep).await;
        }
    }

    fn kill_group(&self) {
        if let Some(pgid) = self.pgid {
            // ESRCH (already gone) is the usual, fine outcome.
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }

    /// After the child is reaped: nothing of the run may survive it.
    async fn finish(&mut self) {
        self.kill().await;
        self.armed = false;
        self.lease = None;
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.kill_group();
        let Some(sweep) = self.sweep.take() else {
            return;
        };
        let lease = self.lease.take();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    run_sweep(&sweep).await;
                    drop(lease);
                });
            }
            Err(_) => {
                if let Some((program, args)) = sweep.split_first() {
                    let _ = std::process::Command::new(program)
                        .args(args)
                        .env_clear()
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                }
                drop(lease);
            }
        }
    }
}

async fn run_sweep(sweep: &[OsString]) {
    if let Some((program, args)) = sweep.split_first() {
        // A failure (no process left: ESRCH) is the usual outcome and changes nothing.
        let _ = Command::new(program)
            .args(args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await;
    }
}

/// Reads into `buf` until EOF or until more than `limit` bytes arrive; true when cut.
async fn read_capped<R: AsyncRead + Unpin>(
    reader: Option<&mut R>,
    buf: &mut Vec<u8>,
    limit: usize,
) -> bool {
    let Some(reader) = reader else {
        return false;
    };
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return false,
            Ok(n) => {
                let room = limit.saturating_sub(buf.len());
                if n > room {
                    buf.extend_from_slice(&chunk[..room]);
                    return true;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "sandbox: reading stdout failed");
                return false;
            }
        }
    }
}

/// Drains `reader` to EOF, keeping its tail (a chatty stderr must not block the process).
async fn read_tail<R: AsyncRead + Unpin>(reader: Option<&mut R>, tail: &mut Tail) {
    let Some(reader) = reader else {
        return;
    };
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) => return,
            Ok(n) => tail.push(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "sandbox: reading stderr failed");
                return;
            }
        }
    }
}

/// The last `keep` bytes of a stream. With a marker, what comes before it is kept apart
/// (the sandbox tools' diagnostics) and the tail starts after it.
#[derive(Debug)]
struct Tail {
    buf: Vec<u8>,
    keep: usize,
    dropped: bool,
    /// Waiting for this marker; `None` once seen (or when there is none).
    marker: Option<&'static [u8]>,
    /// Before the marker.
    pre: Vec<u8>,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Tail {
            buf: Vec::new(),
            keep,
            dropped: false,
            marker: None,
            pre: Vec::new(),
        }
    }

    fn with_marker(keep: usize, marker: &'static [u8]) -> Self {
        Tail {
            marker: Some(marker),
            ..Tail::new(keep)
        }
    }

    fn push(&mut self, data: &[u8]) {
        let data = match self.marker {
            Some(marker) => {
                self.pre.extend_from_slice(data);
                let Some(at) = self.pre.windows(marker.len()).position(|w| w == marker) else {
                    // Keep the diagnostics' tail, and enough to find a marker cut in two.
                    if self.pre.len() > DIAGNOSTICS_KEEP * 2 {
                        let excess = self.pre.len() - DIAGNOSTICS_KEEP;
                        self.pre.drain(..excess);
                    }
                    return;
                };
                self.marker = None;
                let after = self.pre.split_off(at + marker.len());
                self.pre.truncate(at);
                after
            }
            None => data.to_vec(),
        };
        self.buf.extend_from_slice(&data);
        // Trim in batches so a byte-at-a-time writer does not cost a memmove per byte.
        if self.buf.len() > self.keep * 2 {
            let excess = self.buf.len() - self.keep;
            self.buf.drain(..excess);
            self.dropped = true;
        }
    }

    /// Whether the marker was seen (always, without one).
    fn started(&self) -> bool {
        self.marker.is_none()
    }

    /// The kept bytes, and whether anything was dropped. Before the marker was seen, the
    /// kept bytes are the tools' diagnostics.
    fn finish(mut self) -> (Vec<u8>, bool) {
        if self.marker.is_some() {
            let mut pre = self.pre;
            if pre.len() > DIAGNOSTICS_KEEP {
                let excess = pre.len() - DIAGNOSTICS_KEEP;
                pre.drain(..excess);
            }
            return (pre, false);
        }
        if self.buf.len() > self.keep {
            let excess = self.buf.len() - self.keep;
            self.buf.drain(..excess);
            self.dropped = true;
        }
        (self.buf, self.dropped)
    }
}

/// A private HOME/TMPDIR for an unsandboxed run, owned by the run's uid.
fn scratch_dir(uid: Option<u32>) -> Result<tempfile::TempDir, SandboxError> {
    let dir = tempfile::Builder::new()
        .prefix("skilleval-sandbox-")
        .tempdir()?;
    if let Some(uid) = uid {
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(uid))?;
    }
    Ok(dir)
}

/// Where uid lease locks live: a root-owned directory nobody else can plant files in.
fn uid_lock_dir() -> Option<PathBuf> {
    let candidates = [
        PathBuf::from("/run/skilleval-sandbox"),
        std::env::temp_dir().join("skilleval-sandbox-uids"),
    ];
    let me = nix::unistd::geteuid().as_raw();
    candidates.into_iter().find(|dir| {
        if std::fs::create_dir_all(dir).is_err() {
            return false;
        }
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return false;
        };
        if !meta.is_dir() || meta.uid() != me {
            return false;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).is_ok()
    })
}

/// Whether a uid that is neither owner nor group can list and read `dir` (every ancestor
/// searchable, the directory itself readable and searchable).
fn check_world_readable(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.mode() & 0o005 != 0o005 {
        return Err(format!(
            "{} has mode {:o}, not world-readable",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    for ancestor in dir.ancestors().skip(1) {
        let meta =
            std::fs::metadata(ancestor).map_err(|e| format!("{}: {e}", ancestor.display()))?;
        if meta.mode() & 0o001 == 0 {
            return Err(format!(
                "{} has mode {:o}, not world-searchable",
                ancestor.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// A system tool: the standard directories first, so a hostile PATH cannot substitute one.
fn find_tool(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p))
        .or_else(|| search_path(name))
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Under the system directories bubblewrap always mounts.
fn is_system_path(path: &Path) -> bool {
    path.starts_with("/usr") || SYSTEM_DIRS.iter().any(|d| path.starts_with(d))
}

/// Finds an interpreter. The system one wins (`/usr/bin`, `/usr/local/bin`): it is what a
/// production image has and the sandbox can always reach it. Otherwise the one on PATH is
/// resolved to its real install prefix (for pyenv, asking Python itself, since PATH holds a
/// shell shim), which is then bound into the sandbox — provided another uid can reach it.
fn resolve_interpreter(name: &str, drops_privileges: bool) -> Option<Interpreter> {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let path = Path::new(dir).join(name);
        if is_executable(&path) {
            return Some(Interpreter {
                path,
                bind: None,
                problem: None,
            });
        }
    }
    let found = search_path(name)?;
    let (exe, prefix) = if name.starts_with("python") {
        let out = std::process::Command::new(&found)
            .args([
                "-c",
                "import sys; print(sys.executable); print(sys.base_prefix)",
            ])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let exe = PathBuf::from(lines.next()?);
        let prefix = PathBuf::from(lines.next()?);
        (exe, prefix)
    } else {
        let exe = std::fs::canonicalize(&found).ok()?;
        // <prefix>/bin/<name>
        let prefix = exe.parent()?.parent()?.to_path_buf();
        (exe, prefix)
    };
    if is_system_path(&exe) {
        return Some(Interpreter {
            path: exe,
            bind: None,
            problem: None,
        });
    }
    let problem = if drops_privileges {
        check_world_readable(&prefix).err().map(|reason| {
            format!(
                "{} lives in {}, which the sandbox user cannot reach ({reason}); install it system-wide (e.g. Debian's `python3`/`nodejs`) or under a world-readable prefix",
                exe.display(),
                prefix.display()
            )
        })
    } else {
        None
    };
    if let Some(problem) = &problem {
        tracing::warn!(interpreter = name, %problem, "sandbox: interpreter not usable");
    }
    Some(Interpreter {
        path: exe,
        bind: Some(prefix),
        problem,
    })
}

/// bwrap arguments mirroring the host's system directories read-only: `/usr`, the top-level
/// library and binary directories as they are on the host (real directories, or the symlinks
/// into `/usr` of a merged-/usr system), and the few `/etc` entries interpreters need.
fn system_mounts() -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--ro-bind".into(), "/usr".into(), "/usr".into()];
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(path) {
                args.extend(["--symlink".into(), target.into(), path.into()]);
            }
        } else if meta.is_dir() {
            args.extend(["--ro-bind".into(), path.into(), path.into()]);
        }
    }
    let mut etc: Vec<String> = ETC_ENTRIES.iter().map(|e| (*e).to_string()).collect();
    // Debian's per-version Python configuration (/etc/python3.11, ...).
    if let Ok(entries) = std::fs::read_dir("/etc") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("python") {
                etc.push(name);
            }
        }
    }
    etc.sort();
    etc.dedup();
    for name in etc {
        let path = Path::new("/etc").join(name);
        args.extend(["--ro-bind-try".into(), path.clone().into(), path.into()]);
    }
    args
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

/// For error messages: the command line as one string.
pub fn display_argv(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

impl Sandbox {
    /// The command line [`Sandbox::run`] would spawn for `req` (with a placeholder uid), for
    /// logs and diagnostics.
    pub fn describe(&self, req: &SandboxRequest) -> Result<String, SandboxError> {
        let host = self.host();
        let program = req
            .argv
            .first()
            .map_or(Ok(PathBuf::new()), |p| host.resolve_program(p))?;
        let uid = match &host.identity {
            Identity::Pool { .. } => Some(UID_POOL_BASE),
            Identity::Shared(uid) => Some(*uid),
            Identity::Inherit => None,
        };
        let scratch = (self.mode() == SandboxMode::Unsandboxed).then_some(Path::new("$SCRATCH"));
        let plan = host.plan(
            &self.policy,
            req,
            &program,
            &req.package_root,
            uid,
            scratch,
            &[],
        )?;
        Ok(display_argv(&plan.argv))
    }
}

/// An extra host directory bubblewrap mounts into a session (see [`Sandbox::open_session`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxBind {
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub dest: &'static str,
    /// Mounted read-write (and, when the sandbox has a uid of its own, handed to that uid).
    pub writable: bool,
}

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

/// Bubblewrap's init (pid 1 of the sandbox's pid namespace, pinned by a pidfd), the session's
/// loop, and the namespace's identity (the `/proc/PID/ns/pid` link).
struct Inside {
    init: u32,
    init_fd: std::os::fd::OwnedFd,
    driver: u32,
    pid_ns: PathBuf,
}

impl Inside {
    /// Finds them from bubblewrap's (host) pid.
    fn find(bwrap: u32) -> std::io::Result<Inside> {
        let first_child = |pid: u32| -> std::io::Result<u32> {
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))?
                .split_whitespace()
                .find_map(|p| p.parse::<u32>().ok())
                .ok_or_else(|| std::io::Error::other(format!("process {pid} has no child")))
        };
        let init = first_child(bwrap)?;
        let init_fd = pidfd(init)?;
        let driver = first_child(init)?;
        let pid_ns = std::fs::read_link(format!("/proc/{init}/ns/pid"))?;
        if pid_ns == std::fs::read_link("/proc/self/ns/pid")? {
            return Err(std::io::Error::other(
                "the sandbox shares the host's pid namespace",
            ));
        }
        Ok(Inside {
            init,
            init_fd,
            driver,
            pid_ns,
        })
    }

    /// SIGKILLs every process of the namespace but init and the loop, until none is left
    /// (a process may fork while a pass runs). Each victim is pinned by a pidfd and its
    /// namespace checked again before the signal, so a recycled pid is never hit.
    fn kill_commands(&self) -> usize {
        let mut killed = 0;
        for _ in 0..100 {
            let mut found = 0;
            for (pid, _) in proc_entries() {
                if pid == self.init || pid == self.driver {
                    continue;
                }
                let in_ns = || {
                    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                        .is_ok_and(|l| l == self.pid_ns)
                };
                if !in_ns() {
                    continue;
                }
                let Ok(fd) = pidfd(pid) else {
                    continue;
                };
                if in_ns()
                    && rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL)
                        .is_ok()
                {
                    found += 1;
                }
            }
            if found == 0 {
                break;
            }
            killed += found;
            std::thread::sleep(Duration::from_millis(2));
        }
        killed
    }
}

/// A pidfd of a (host) pid.
fn pidfd(pid: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| std::io::Error::other(format!("{pid} is not a pid")))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

impl fmt::Debug for SandboxSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxSession")
            .field("ctl", &self.ctl)
            .field("calls", &self.next)
            .finish()
    }
}

impl Sandbox {
    /// Starts a long-lived sandbox: `package_root` read-only at `/skill`, each of `binds`
    /// where it says, and `control` (an empty host directory) at [`SESSION_CONTROL_DIR`].
    /// Bubblewrap only: without it a session would run the model's commands on the host, so
    /// it is refused even when the policy allows unsandboxed runs.
    ///
    /// The sandbox has no network; with `allowed` hosts it gets the proxy of
    /// [`crate::egress`] on its loopback (`HTTP_PROXY`/`HTTPS_PROXY` set), which reaches those
    /// hosts only.
    pub async fn open_session(
        &self,
        package_root: &Path,
        binds: &[SandboxBind],
        control: &Path,
        mut env: BTreeMap<String, String>,
        allowed: &AllowedHosts,
    ) -> Result<SandboxSession, SandboxError> {
        let host = self.host();
        if self.mode_of(&host) != SandboxMode::Bubblewrap {
            return Err(SandboxError::NoSandbox);
        }
        let package = std::fs::canonicalize(package_root)?;
        let lease = Host::lease_off_runtime(&host).await?;
        let uid = lease.as_ref().map(|l| l.uid);
        let mut all = binds.to_vec();
        all.push(SandboxBind {
            source: control.to_path_buf(),
            dest: SESSION_CONTROL_DIR,
            writable: true,
        });
        if let Some(uid) = uid {
            check_world_readable(&package).map_err(|reason| SandboxError::PackageNotReadable {
                path: package.clone(),
                reason: format!("{reason} (the sandbox runs as uid {uid})"),
            })?;
            for b in all.iter().filter(|b| b.writable) {
                chown_tree(&b.source, uid)?;
            }
        }
        if !allowed.is_empty() {
            let proxy = format!("http://127.0.0.1:{}", egress::PROXY_PORT);
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.insert(name.to_string(), proxy.clone());
            }
            env.remove("NO_PROXY");
            env.remove("no_proxy");
        }
        let req = SandboxRequest {
            argv: vec!["sh".into(), "-c".into(), SESSION_DRIVER.into()],
            package_root: package.clone(),
            stdin: Vec::new(),
            timeout: Duration::MAX,
            env,
        };
        let program = host.resolve_program("sh")?;
        let plan = host.plan(&self.policy, &req, &program, &package, uid, None, &all)?;
        let (program, args) = plan.argv.split_first().ok_or_else(|| SandboxError::Spawn {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command line"),
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(plan.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| SandboxError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let guard = Reaper {
            pgid,
            // No `kill -1` sweep as the uid (two more programs to start per case): every
            // process of a session is in its pid namespace, which the kernel empties when its
            // init dies ([`SandboxSession::close`] kills it by pidfd; bubblewrap's
            // --die-with-parent kills it if we die), and the next lease's census still skips
            // the uid until its last task is gone.
            sweep: None,
            lease,
            armed: true,
        };
        let io_missing = || {
            SandboxError::Io(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the session's pipes were not set up",
            ))
        };
        let stdin = child.stdin.take().ok_or_else(io_missing)?;
        let stdout = child.stdout.take().ok_or_else(io_missing)?;
        let stderr_tail = Arc::new(Mutex::new(Tail::with_marker(STDERR_KEEP, STARTED_MARKER)));
        if let Some(mut err) = child.stderr.take() {
            let tail = stderr_tail.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 4096];
                while let Ok(n) = err.read(&mut chunk).await {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut t) = tail.lock() {
                        t.push(&chunk[..n]);
                    }
                }
            });
        }
        let mut session = SandboxSession {
            child,
            stdin,
            stdout: tokio::io::BufReader::new(stdout),
            ctl: control.to_path_buf(),
            guard,
            next: 0,
            max_output: self.policy.max_output_bytes,
            stderr: stderr_tail,
            broken: false,
            egress: None,
            inside: None,
        };
        let mut line = String::new();
        let ready = tokio::time::timeout(
            SESSION_START_TIMEOUT,
            tokio::io::AsyncBufReadExt::read_line(&mut session.stdout, &mut line),
        )
        .await;
        if !matches!(ready, Ok(Ok(_)) if line.trim() == "ready") {
            let diagnostics = session.diagnostics();
            session.close().await;
            return Err(SandboxError::Machinery {
                status: "the session did not start".to_string(),
                diagnostics,
            });
        }
        let found = session
            .child
            .id()
            .ok_or_else(|| std::io::Error::other("the session's bubblewrap has already exited"))
            .and_then(Inside::find);
        match found {
            Ok(inside) => session.inside = Some(Arc::new(inside)),
            Err(e) => {
                let diagnostics = format!("{e}; {}", session.diagnostics());
                session.close().await;
                return Err(SandboxError::Machinery {
                    status: "the session's processes could not be found".to_string(),
                    diagnostics,
                });
            }
        }
        if !allowed.is_empty() {
            match session
                .open_egress(allowed.clone(), self.policy.allow_private_egress)
                .await
            {
                Ok(proxy) => session.egress = Some(proxy),
                Err(e) => {
                    session.close().await;
                    return Err(e);
                }
            }
        }
        Ok(session)
    }
}

impl Sandbox {
    /// A fresh directory for one session's host-side files (see
    /// [`SandboxPolicy::session_dir`]), removed when dropped.
    pub fn session_scratch(&self, prefix: &str) -> std::io::Result<tempfile::TempDir> {
        let builder = {
            let mut b = tempfile::Builder::new();
            b.prefix(prefix);
            b
        };
        if let Some(dir) = &self.policy.session_dir {
            return builder.tempdir_in(dir);
        }
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            if let Ok(dir) = builder.tempdir_in(shm) {
                return Ok(dir);
            }
        }
        builder.tempdir()
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

    /// Serves the allowed-hosts proxy inside the session's network namespace: that of
    /// bubblewrap's init (bubblewrap itself stays in the host's namespaces).
    async fn open_egress(
        &self,
        allowed: AllowedHosts,
        allow_private: bool,
    ) -> Result<EgressProxy, SandboxError> {
        let setup = |why: String| SandboxError::Egress(egress::EgressError::Setup(why));
        let inside = self
            .inside
            .as_ref()
            .ok_or_else(|| setup("the sandbox's processes were not found".into()))?;
        let ours = std::fs::read_link("/proc/self/ns/net")?;
        let theirs = std::fs::read_link(format!("/proc/{}/ns/net", inside.init))
            .map_err(|e| setup(format!("reading the sandbox's network namespace: {e}")))?;
        if ours == theirs {
            return Err(setup(
                "the sandbox shares the host's network namespace".into(),
            ));
        }
        let listener = egress::listen_in(inside.init, egress::PROXY_PORT).await?;
        Ok(EgressProxy::serve(listener, allowed, allow_private))
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
            .map(|t| String::from_utf8_lossy(&t.pre).trim().to_string())
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

/// Hands a host directory tree to the sandbox's uid, so the sandboxed process may write it.
fn chown_tree(dir: &Path, uid: u32) -> Result<(), SandboxError> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    if dir.is_dir() && !dir.is_symlink() {
        for entry in std::fs::read_dir(dir)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end() {
        let mut t = Tail::new(4);
        t.push(b"abcdefghij");
        t.push(b"kl");
        assert_eq!(t.finish(), (b"ijkl".to_vec(), true));
        let mut t = Tail::new(4);
        t.push(b"abcde");
        assert_eq!(t.finish(), (b"bcde".to_vec(), true));
        let mut t = Tail::new(4);
        t.push(b"abcd");
        assert_eq!(t.finish(), (b"abcd".to_vec(), false));
    }

    #[test]
    fn the_start_marker_splits_diagnostics_from_the_programs_stderr() {
        let mut t = Tail::with_marker(1024, STARTED_MARKER);
        t.push(b"bwrap: some warning\n\x1eskilleval-sand");
        assert!(!t.started());
        t.push(b"box: exec\nTraceback: boom\n");
        assert!(t.started());
        assert_eq!(t.finish(), (b"Traceback: boom\n".to_vec(), false));

        let mut t = Tail::with_marker(1024, STARTED_MARKER);
        t.push(b"bwrap: Can't fork for pid 1: Resource temporarily unavailable\n");
        assert!(!t.started());
        assert_eq!(
            t.finish().0,
            b"bwrap: Can't fork for pid 1: Resource temporarily unavailable\n".to_vec()
        );
    }

    /// A process running as `uid` (we are root), killed and reaped on drop.
    struct Squatter(std::process::Child);

    impl Squatter {
        fn start(uid: u32) -> Squatter {
            let child = std::process::Command::new("setpriv")
                .args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".to_string(),
                    "--".to_string(),
                    "sleep".to_string(),
                    "60".to_string(),
                ])
                .spawn()
                .expect("setpriv sleep");
            let start = Instant::now();
            while !uids_with_tasks(uid..uid + 1).contains_key(&uid) {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "squatter not seen"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Squatter(child)
        }
    }

    impl Drop for Squatter {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_uid_is_not_leased_while_a_process_of_it_lives() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to run a process as another uid");
            return;
        }
        // A range no real sandbox uses, so this test cannot meet another test's runs.
        let base = 2_100_000_000 + (std::process::id() % 1000) * 8;
        let lock_dir = tempfile::tempdir().expect("lock dir");
        let pool = UidPool {
            lock_dir: lock_dir.path(),
            base,
            size: 4,
        };
        let mut squatter = Squatter::start(base);
        let killed = Mutex::new(Vec::new());
        let kill = |uid: u32| killed.lock().expect("not poisoned").push(uid);

        let lease = pool.lease(0, &kill).expect("a lease");
        assert_eq!(
            lease.uid,
            base + 1,
            "the uid with a live process is skipped"
        );
        assert_eq!(
            *killed.lock().expect("not poisoned"),
            vec![base],
            "and its leftovers killed"
        );
        drop(lease);

        // Killed but not reaped yet: a zombie still counts against the uid's process limit.
        squatter.0.kill().expect("kill");
        let start = Instant::now();
        while uids_with_tasks(base..base + 1)
            .get(&base)
            .map(|t| t.zombies)
            != Some(1)
        {
            assert!(start.elapsed() < Duration::from_secs(5), "no zombie seen");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pool.lease(0, &kill).expect("a lease").uid, base + 1);

        // Reaped: the uid is clean again and leased.
        squatter.0.wait().expect("reap");
        assert_eq!(pool.lease(0, &kill).expect("a lease").uid, base);
    }

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

    #[test]
    fn system_view_has_usr_and_no_whole_etc() {
        let mounts = system_mounts();
        let text = display_argv(&mounts);
        assert!(text.starts_with("--ro-bind /usr /usr"), "{text}");
        assert!(!text.contains("/etc /etc"), "{text}");
    }
}
