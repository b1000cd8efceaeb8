//! The command line of a sandboxed run, composed from stock tools.
//!
//! Design §5: untrusted code gets JSON on stdin, a wall-clock timeout that kills every process
//! it started, CPU/memory/file-size/process-count limits, a scrubbed environment, no network
//! and a read-only view of its package. The workspace forbids `unsafe`, so nothing is done
//! between `fork` and `exec` in this process; instead the limits are composed from stock tools
//! on the command line (util-linux `prlimit` and `setpriv`, and bubblewrap), each of which
//! applies one property and `exec`s the next:
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
//! Why `setpriv` and which uid it drops to: see the `lease` module. The program itself is
//! started through `sh -c 'printf MARKER >&2; exec "$0" "$@"'` (see "Whose fault" in the
//! `command` module). Without bubblewrap the same line runs without its `bwrap` part, in a
//! scratch directory of its own.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use std::process::Stdio;

use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::policy::{SandboxBind, SandboxEnvironment, SandboxError, SandboxPolicy, SandboxRequest};
use crate::tools::Tools;

/// Where the package is mounted inside bubblewrap (the working directory a process starts in).
pub const SANDBOX_PACKAGE_DIR: &str = "/skill";
/// What the sandbox prints on stderr just before it `exec`s the program (as a `printf` format
/// and as the bytes that come out).
pub(crate) const STARTED_MARKER_PRINTF: &str = "\\036skilleval-sandbox: exec\\n";
pub(crate) const STARTED_MARKER: &[u8] = b"\x1eskilleval-sandbox: exec\n";

/// The command line for one run.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) argv: Vec<OsString>,
    /// Set on the spawned process (bubblewrap gets the sandbox's env through `--setenv`).
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) cwd: Option<PathBuf>,
}

impl Plan {
    /// Starts the plan's process: its environment cleared then set, stdin, stdout and stderr
    /// piped, in a process group of its own (so the whole tree can be signalled at once),
    /// killed if dropped. Returns the child and its process group.
    pub(crate) fn spawn(&self) -> Result<(Child, Option<Pid>), SandboxError> {
        let (program, args) = self.argv.split_first().ok_or_else(|| SandboxError::Spawn {
            program: String::new(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command line"),
        })?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd);
        }
        let child = cmd.spawn().map_err(|source| SandboxError::Spawn {
            program: program.to_string_lossy().into_owned(),
            source,
        })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        Ok((child, pgid))
    }
}

/// The command line for running `program` (already resolved) as `req` asks, with bubblewrap
/// when `bwrap` is given (one that passed its check) and without it otherwise; `uid` is the
/// run's leased identity (`None`: keep ours) and `scratch` an unsandboxed run's HOME.
// Each argument is one independent input of the command line; a struct of them would only
// be built to be taken apart here.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan(
    tools: &Tools,
    bwrap: Option<&Path>,
    policy: &SandboxPolicy,
    req: &SandboxRequest,
    program: &Path,
    package: &Path,
    uid: Option<u32>,
    scratch: Option<&Path>,
    binds: &[SandboxBind],
    environment: Option<&SandboxEnvironment>,
) -> Result<Plan, SandboxError> {
    let prlimit = tools
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
        let setpriv = tools
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
    let vars = environment.map(|e| &e.vars).into_iter().flatten();
    for (k, v) in vars.chain(&req.env) {
        // A name bwrap or execve would choke on is dropped rather than failing the run.
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            tracing::warn!(name = %k, "sandbox: skipping invalid environment variable");
            continue;
        }
        env.insert(k.into(), v.into());
    }
    let path = match environment {
        Some(e) if !e.path.is_empty() => format!("{}:{}", e.path.join(":"), tools.path_env),
        _ => tools.path_env.clone(),
    };
    env.insert("PATH".into(), path.into());
    env.insert("HOME".into(), home.clone());
    env.insert("TMPDIR".into(), home);

    match bwrap {
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
            argv.extend(tools.system_mounts.iter().cloned());
            for interp in tools.interpreters.values() {
                if let (Some(bind), None) = (&interp.bind, &interp.problem) {
                    argv.extend(["--ro-bind".into(), bind.into(), bind.into()]);
                }
            }
            argv.extend([
                "--ro-bind".into(),
                package.into(),
                SANDBOX_PACKAGE_DIR.into(),
            ]);
            if let Some(e) = environment {
                argv.extend([
                    "--ro-bind".into(),
                    e.source.clone().into(),
                    e.dest.clone().into(),
                ]);
            }
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
            argv.extend(exec_with_marker(tools, program, req)?);
            Ok(Plan {
                argv,
                env: Vec::new(),
                cwd: None,
            })
        }
        None => {
            argv.extend(exec_with_marker(tools, program, req)?);
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
    tools: &Tools,
    program: &Path,
    req: &SandboxRequest,
) -> Result<Vec<OsString>, SandboxError> {
    let sh = tools
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

/// The command that kills everything `uid` still owns, as that uid; `None` without the tools.
pub(crate) fn sweep_for_uid(tools: &Tools, uid: u32) -> Option<Vec<OsString>> {
    let setpriv = tools.setpriv.as_ref()?;
    let kill = tools.kill.as_ref()?;
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

/// For error messages: the command line as one string.
pub fn display_argv(argv: &[OsString]) -> String {
    argv.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}
