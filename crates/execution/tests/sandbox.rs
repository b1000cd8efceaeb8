//! The sandbox and the `command` runner against real processes: each test runs a hostile (or
//! ordinary) script and checks the property from outside the sandbox.
//!
//! These need bubblewrap (`apt-get install bubblewrap`), python3 and node; a host without
//! bubblewrap fails them loudly rather than skipping, since a skipped isolation test proves
//! nothing.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use skilleval_execution::runner::command::CommandRunner;
use skilleval_execution::runner::{OutputRunner, ProduceRequest};
use skilleval_grading::GradeEnv;
use skilleval_model::definition::{RunnerConfig, TestCase};
use skilleval_model::grade::Fault;
use skilleval_sandbox::{
    Sandbox, SandboxError, SandboxMode, SandboxOutput, SandboxPolicy, SandboxRequest,
};
use tempfile::TempDir;

/// A package directory laid out as loaders extract it (dirs 0755, files 0644).
fn package(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rel, content) in files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, content).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
            .expect("chmod file");
    }
    for entry in walk_dirs(dir.path()) {
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(0o755))
            .expect("chmod dir");
    }
    dir
}

fn walk_dirs(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if let Ok(entries) = std::fs::read_dir(&out[i]) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(e.path());
                }
            }
        }
        i += 1;
    }
    out
}

fn bwrap_sandbox(policy: SandboxPolicy) -> Sandbox {
    let sandbox = Sandbox::detect(policy);
    assert_eq!(
        sandbox.mode(),
        SandboxMode::Bubblewrap,
        "bubblewrap must be installed and working for these tests: {:?}",
        sandbox.unavailable_reason()
    );
    sandbox
}

/// As if bubblewrap were not installed, with unsandboxed runs allowed.
fn unsandboxed() -> Sandbox {
    let sandbox = Sandbox::with_bwrap_path(
        SandboxPolicy {
            allow_unsandboxed: true,
            ..SandboxPolicy::default()
        },
        None,
    );
    assert_eq!(sandbox.mode(), SandboxMode::Unsandboxed);
    sandbox
}

fn request(pkg: &TempDir, argv: &[&str], timeout: Duration) -> SandboxRequest {
    SandboxRequest {
        argv: argv.iter().map(|s| (*s).to_string()).collect(),
        package_root: pkg.path().to_path_buf(),
        stdin: Vec::new(),
        timeout,
        env: BTreeMap::new(),
    }
}

async fn run(sandbox: &Sandbox, req: SandboxRequest) -> SandboxOutput {
    match sandbox.run(req).await {
        Ok(out) => out,
        Err(e) => panic!("sandbox run failed: {e}"),
    }
}

fn stdout(out: &SandboxOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &SandboxOutput) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Host processes whose command line contains `marker`, polled until none are left or 3 s pass,
/// without blocking the runtime (cleanup of a dropped run is a task on it).
async fn survivors(marker: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let found = survivors_now(marker);
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Host processes whose command line contains `marker`, right now.
fn survivors_now(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.chars().all(|c| c.is_ascii_digit()))
        else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
    }
    found
}

fn marker() -> String {
    format!("skilleval-marker-{}", uuid::Uuid::new_v4().simple())
}

// ---------------------------------------------------------------------------------------------
// Sandbox properties
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_script_that_sleeps_forever_is_killed_at_its_timeout() {
    let pkg = package(&[("sleep.py", "import time\nwhile True:\n    time.sleep(60)\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let start = Instant::now();
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "sleep.py"], Duration::from_secs(1)),
    )
    .await;
    let elapsed = start.elapsed();
    assert!(out.timed_out, "not flagged as timed out: {out:?}");
    assert_eq!(out.exit_code, None);
    assert!(
        elapsed >= Duration::from_secs(1),
        "returned before the timeout: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "took {elapsed:?} for a 1 s timeout"
    );
}

const NET_SCRIPT: &str = r#"
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("CONNECTED")
except OSError as e:
    print("BLOCKED", e.errno, e)
"#;

#[tokio::test]
async fn a_script_cannot_reach_the_hosts_network() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let pkg = package(&[("net.py", NET_SCRIPT)]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "net.py", &port], Duration::from_secs(10)),
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "stderr: {}", stderr(&out));
    assert!(
        stdout(&out).starts_with("BLOCKED"),
        "stdout: {}",
        stdout(&out)
    );
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("the listener received a connection from {peer}"),
        Err(e) => panic!("accept: {e}"),
    }
}

#[tokio::test]
async fn the_network_check_detects_a_connection_when_there_is_no_sandbox() {
    // The control for the test above: the same script, unsandboxed, does connect.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port().to_string();
    let pkg = package(&[("net.py", NET_SCRIPT)]);
    let sandbox = unsandboxed();
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "net.py", &port], Duration::from_secs(10)),
    )
    .await;
    assert!(
        stdout(&out).starts_with("CONNECTED"),
        "stdout: {} stderr: {}",
        stdout(&out),
        stderr(&out)
    );
    assert!(listener.accept().is_ok(), "the listener saw no connection");
}

const WRITE_SCRIPT: &str = r#"
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as e:
        print("DENIED", path, e.errno)
"#;

#[tokio::test]
async fn a_script_cannot_write_outside_its_temp_dir() {
    let pkg = package(&[("write.py", WRITE_SCRIPT), ("data.txt", "original\n")]);
    let probe = marker();
    let targets = [
        "/skill/data.txt".to_string(),
        "/skill/new.txt".to_string(),
        format!("/etc/{probe}"),
        format!("/root/{probe}"),
        format!("/usr/{probe}"),
        format!("/{probe}"),
        "/tmp/ok.txt".to_string(),
    ];
    let mut argv = vec!["python3", "write.py"];
    argv.extend(targets.iter().map(String::as_str));
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let out = run(&sandbox, request(&pkg, &argv, Duration::from_secs(10))).await;
    let text = stdout(&out);
    assert_eq!(out.exit_code, Some(0), "stderr: {}", stderr(&out));
    for target in &targets[..targets.len() - 1] {
        assert!(
            text.contains(&format!("DENIED {target} ")),
            "{target} was not denied:\n{text}"
        );
    }
    assert!(
        text.contains("WROTE /tmp/ok.txt"),
        "the private /tmp must be writable:\n{text}"
    );
    assert_eq!(
        std::fs::read_to_string(pkg.path().join("data.txt")).expect("read"),
        "original\n"
    );
    assert!(!pkg.path().join("new.txt").exists());
    assert!(!Path::new(&format!("/etc/{probe}")).exists());
    assert!(!Path::new(&format!("/root/{probe}")).exists());
}

#[tokio::test]
async fn the_package_is_read_only_unsandboxed_too() {
    // Without bubblewrap the script runs as a private uid that owns nothing in the package.
    let pkg = package(&[("write.py", WRITE_SCRIPT), ("data.txt", "original\n")]);
    let data = pkg.path().join("data.txt").to_string_lossy().into_owned();
    let probe = format!("/etc/{}", marker());
    let sandbox = unsandboxed();
    let out = run(
        &sandbox,
        request(
            &pkg,
            &["python3", "write.py", &data, &probe],
            Duration::from_secs(10),
        ),
    )
    .await;
    let text = stdout(&out);
    assert!(
        text.contains(&format!("DENIED {data} ")),
        "{text} {}",
        stderr(&out)
    );
    assert!(text.contains(&format!("DENIED {probe} ")), "{text}");
    assert_eq!(std::fs::read_to_string(&data).expect("read"), "original\n");
}

const FORK_SCRIPT: &str = r#"
import os, subprocess, sys, time
marker = sys.argv[1]
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
# A plain background child, which keeps our stdout open.
subprocess.Popen(sleeper + [marker + "-child"])
# A daemon: double fork, new session, stdio detached, so it is in no group of ours.
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(os.devnull, os.O_RDWR)
        for i in (0, 1, 2):
            os.dup2(fd, i)
        os.execv(sys.executable, sleeper + [marker + "-daemon"])
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(0.5)
alive = 0
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        try:
            if (marker + "-").encode() in open("/proc/%s/cmdline" % p, "rb").read():
                alive += 1
        except OSError:
            pass
print("ALIVE", alive, flush=True)
"#;

async fn assert_forked_children_are_gone(sandbox: &Sandbox) {
    let pkg = package(&[("fork.py", FORK_SCRIPT)]);
    let mark = marker();
    let start = Instant::now();
    let out = run(
        sandbox,
        request(
            &pkg,
            &["python3", "fork.py", &mark],
            Duration::from_secs(20),
        ),
    )
    .await;
    assert_eq!(
        stdout(&out).trim(),
        "ALIVE 2",
        "the children did not start: {}",
        stderr(&out)
    );
    assert!(
        !out.timed_out,
        "a leftover child held the run to its timeout"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    let left = survivors(&mark).await;
    assert!(left.is_empty(), "processes survived the run: {left:?}");
}

#[tokio::test]
async fn forked_and_daemonized_children_do_not_survive_the_run() {
    assert_forked_children_are_gone(&bwrap_sandbox(SandboxPolicy::default())).await;
}

#[tokio::test]
async fn forked_and_daemonized_children_do_not_survive_an_unsandboxed_run() {
    assert_forked_children_are_gone(&unsandboxed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_abandoned_by_its_caller_leaves_nothing_behind() {
    // The executor enforces the case timeout itself and drops the run's future when it fires.
    let script = FORK_SCRIPT.to_string() + "time.sleep(300)\n";
    let pkg = package(&[("fork.py", &script)]);
    for sandbox in [bwrap_sandbox(SandboxPolicy::default()), unsandboxed()] {
        let mark = marker();
        let req = request(
            &pkg,
            &["python3", "fork.py", &mark],
            Duration::from_secs(60),
        );
        let task = tokio::spawn({
            let sandbox = sandbox.clone();
            async move { sandbox.run(req).await }
        });
        // Wait until the daemon is up, so that the test would see it survive.
        let daemon = format!("{mark}-daemon");
        let deadline = Instant::now() + Duration::from_secs(10);
        while survivors_now(&daemon).is_empty() {
            assert!(
                Instant::now() < deadline,
                "{:?}: the daemon never started",
                sandbox.mode()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        task.abort();
        assert!(task.await.is_err_and(|e| e.is_cancelled()));
        let left = survivors(&mark).await;
        assert!(
            left.is_empty(),
            "{:?}: processes survived: {left:?}",
            sandbox.mode()
        );
    }
}

#[tokio::test]
async fn a_flood_of_output_is_cut_at_the_limit_quickly_and_flagged() {
    let pkg = package(&[(
        "flood.py",
        "import sys\nchunk = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
    )]);
    let limit = 1 << 20;
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_output_bytes: limit,
        ..SandboxPolicy::default()
    });
    let start = Instant::now();
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "flood.py"], Duration::from_secs(30)),
    )
    .await;
    assert!(out.stdout_truncated, "not flagged");
    assert_eq!(out.stdout.len(), limit);
    assert!(!out.timed_out, "ran to its timeout instead of being cut");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn exactly_the_limit_is_not_truncation() {
    let pkg = package(&[("exact.py", "import sys\nsys.stdout.write('y' * 1000)\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_output_bytes: 1000,
        ..SandboxPolicy::default()
    });
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "exact.py"], Duration::from_secs(10)),
    )
    .await;
    assert!(!out.stdout_truncated);
    assert_eq!(out.stdout.len(), 1000);
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn the_parent_environment_does_not_leak_in() {
    // Safe in edition 2021; this is the service credential the script must not see.
    std::env::set_var("SKILLEVAL_TEST_SECRET", "hunter2");
    let pkg = package(&[(
        "env.py",
        "import os, json\nprint(json.dumps(dict(os.environ)))\n",
    )]);
    for sandbox in [bwrap_sandbox(SandboxPolicy::default()), unsandboxed()] {
        let mut req = request(&pkg, &["python3", "env.py"], Duration::from_secs(10));
        req.env.insert("GIVEN_VAR".into(), "visible".into());
        let out = run(&sandbox, req).await;
        let text = stdout(&out);
        assert!(
            !text.contains("hunter2"),
            "{:?} leaked the secret: {text}",
            sandbox.mode()
        );
        let env: BTreeMap<String, String> = serde_json::from_str(&text).expect("env json");
        assert_eq!(env.get("GIVEN_VAR").map(String::as_str), Some("visible"));
        assert_eq!(env.get("LANG").map(String::as_str), Some("C.UTF-8"));
        let allowed = [
            "PATH",
            "HOME",
            "LANG",
            "TMPDIR",
            "GIVEN_VAR",
            "PWD",
            "LC_CTYPE",
        ];
        for key in env.keys() {
            assert!(
                allowed.contains(&key.as_str()),
                "{:?}: unexpected variable {key}",
                sandbox.mode()
            );
        }
    }
}

#[tokio::test]
async fn a_fork_bomb_is_stopped_by_the_process_limit() {
    let script = r#"
import errno, os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    print("UNLIMITED", n)
except OSError as e:
    print("LIMITED", n, errno.errorcode.get(e.errno))
"#;
    let pkg = package(&[("bomb.py", script)]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_processes: 24,
        ..SandboxPolicy::default()
    });
    let start = Instant::now();
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "bomb.py"], Duration::from_secs(30)),
    )
    .await;
    let text = stdout(&out);
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        parts.first(),
        Some(&"LIMITED"),
        "stdout: {text} stderr: {}",
        stderr(&out)
    );
    let forks: u32 = parts
        .get(1)
        .and_then(|n| n.parse().ok())
        .expect("fork count");
    assert!(forks < 24, "forked {forks} times under a limit of 24");
    assert_eq!(parts.get(2), Some(&"EAGAIN"));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_memory_hog_hits_the_memory_limit() {
    let pkg = package(&[(
        "mem.py",
        "small = bytearray(32 << 20)\nprint('SMALL OK', flush=True)\nbig = bytearray(2 << 30)\nprint('BIG OK')\n",
    )]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        memory_bytes: 512 << 20,
        ..SandboxPolicy::default()
    });
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "mem.py"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!(stdout(&out).trim(), "SMALL OK");
    assert!(
        stderr(&out).contains("MemoryError"),
        "stderr: {}",
        stderr(&out)
    );
    assert_eq!(out.exit_code, Some(1));
}

#[tokio::test]
async fn a_cpu_spinner_hits_the_cpu_limit_before_the_timeout() {
    let pkg = package(&[("spin.py", "while True:\n    pass\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        cpu_seconds: 1,
        ..SandboxPolicy::default()
    });
    let start = Instant::now();
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "spin.py"], Duration::from_secs(30)),
    )
    .await;
    assert!(!out.timed_out);
    // SIGXCPU (24) at the soft limit, SIGKILL (9) at the hard one; bwrap reports 128 + N.
    assert!(
        matches!(out.exit_code, Some(152) | Some(137)),
        "exit {:?}",
        out.exit_code
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn file_size_and_tmp_space_are_limited() {
    let script = r#"
import errno, sys
def attempt(label, fn):
    try:
        fn()
        print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno))
def big_file():
    with open("/tmp/big", "wb") as f:
        f.write(b"z" * (4 << 20))
def many_files():
    for i in range(64):
        with open("/tmp/part%d" % i, "wb") as f:
            f.write(b"z" * (512 << 10))
attempt("BIGFILE", big_file)
attempt("MANYFILES", many_files)
"#;
    let pkg = package(&[("fill.py", script)]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        file_size_bytes: 1 << 20,
        tmp_bytes: 8 << 20,
        ..SandboxPolicy::default()
    });
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "fill.py"], Duration::from_secs(20)),
    )
    .await;
    let text = stdout(&out);
    assert!(text.contains("BIGFILE EFBIG"), "{text} {}", stderr(&out));
    assert!(text.contains("MANYFILES ENOSPC"), "{text} {}", stderr(&out));
}

#[tokio::test]
async fn stdin_is_delivered_and_a_script_that_ignores_it_does_not_hang() {
    let pkg = package(&[
        ("cat.py", "import sys\nsys.stdout.write(sys.stdin.read())\n"),
        ("ignore.py", "print('ignored')\n"),
    ]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let mut req = request(&pkg, &["python3", "cat.py"], Duration::from_secs(10));
    req.stdin = b"{\"hello\": \"world\"}".to_vec();
    let out = run(&sandbox, req).await;
    assert_eq!(stdout(&out), "{\"hello\": \"world\"}");

    let mut req = request(&pkg, &["python3", "ignore.py"], Duration::from_secs(10));
    req.stdin = vec![b'a'; 4 << 20];
    let out = run(&sandbox, req).await;
    assert_eq!(stdout(&out).trim(), "ignored");
    assert!(!out.timed_out);
}

#[tokio::test]
async fn node_and_sh_run_in_the_sandbox() {
    let pkg = package(&[
        ("hello.js", "console.log('node ' + process.cwd());\n"),
        ("hello.sh", "echo \"sh $(pwd) $HOME\"\n"),
    ]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let out = run(
        &sandbox,
        request(&pkg, &["node", "hello.js"], Duration::from_secs(20)),
    )
    .await;
    assert_eq!(
        stdout(&out).trim(),
        "node /skill",
        "stderr: {}",
        stderr(&out)
    );
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "hello.sh"], Duration::from_secs(10)),
    )
    .await;
    assert_eq!(
        stdout(&out).trim(),
        "sh /skill /tmp",
        "stderr: {}",
        stderr(&out)
    );
}

#[tokio::test]
async fn without_bubblewrap_it_refuses_unless_allowed() {
    let pkg = package(&[("hi.py", "import os\nprint('hi', os.getcwd())\n")]);
    let refusing = Sandbox::with_bwrap_path(SandboxPolicy::default(), None);
    assert_eq!(refusing.mode(), SandboxMode::Refusing);
    match refusing
        .run(request(
            &pkg,
            &["python3", "hi.py"],
            Duration::from_secs(10),
        ))
        .await
    {
        Err(e @ SandboxError::NoSandbox) => assert!(e.to_string().contains("bubblewrap"), "{e}"),
        other => panic!("expected NoSandbox, got {other:?}"),
    }

    let allowed = unsandboxed();
    let out = run(
        &allowed,
        request(&pkg, &["python3", "hi.py"], Duration::from_secs(10)),
    )
    .await;
    let canonical = std::fs::canonicalize(pkg.path()).expect("canonical");
    assert_eq!(
        stdout(&out).trim(),
        format!("hi {}", canonical.display()),
        "stderr: {}",
        stderr(&out)
    );
    assert_eq!(out.exit_code, Some(0));
}

#[tokio::test]
async fn an_unsandboxed_run_is_still_killed_at_its_timeout() {
    let pkg = package(&[("sleep.sh", "sleep 300\n")]);
    let sandbox = unsandboxed();
    let start = Instant::now();
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "sleep.sh"], Duration::from_secs(1)),
    )
    .await;
    assert!(out.timed_out);
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_package_the_sandbox_user_cannot_read_is_refused_clearly() {
    if !is_root() {
        // Not root: no uid change, so the package needs no world permissions.
        return;
    }
    let pkg = package(&[("hi.py", "print('hi')\n")]);
    std::fs::set_permissions(pkg.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    match sandbox
        .run(request(
            &pkg,
            &["python3", "hi.py"],
            Duration::from_secs(10),
        ))
        .await
    {
        Err(e @ SandboxError::PackageNotReadable { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("0755") && msg.contains("700"), "{msg}");
        }
        other => panic!("expected PackageNotReadable, got {other:?}"),
    }
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// The `command` runner
// ---------------------------------------------------------------------------------------------

fn grade_env(pkg: &TempDir, sandbox: Sandbox) -> GradeEnv {
    GradeEnv {
        sandbox: Arc::new(sandbox),
        package_root: Arc::from(pkg.path()),
    }
}

fn case(prompt: &str) -> TestCase {
    let mut case = TestCase {
        id: "tc-1".into(),
        name: "one".into(),
        ..TestCase::default()
    };
    case.input.prompt = prompt.into();
    case.input.context = Some(json!({"doc": "ctx"}));
    case.input.variables.insert("who".into(), "world".into());
    case.input.files.push("eval/fixtures/a.txt".into());
    case
}

fn runner_config(script: &str) -> RunnerConfig {
    RunnerConfig {
        kind: "command".into(),
        script: Some(script.into()),
        ..RunnerConfig::default()
    }
}

async fn produce(
    pkg: &TempDir,
    sandbox: Sandbox,
    script: &str,
    environment: &BTreeMap<String, String>,
    timeout: Duration,
) -> Result<skilleval_model::output::Produced, Fault> {
    let tc = case("Say hello to {{who}}");
    let cfg = runner_config(script);
    let req = ProduceRequest {
        case: &tc,
        runner: &cfg,
        given: None,
        environment,
        timeout,
    };
    CommandRunner.produce(&req, &grade_env(pkg, sandbox)).await
}

#[tokio::test]
async fn command_runner_echoes_the_prompt_from_stdin_json() {
    let script = r#"
import json, os, sys
inp = json.load(sys.stdin)
assert inp["test_case_id"] == "tc-1", inp
assert inp["context"] == {"doc": "ctx"}, inp
assert inp["variables"] == {"who": "world"}, inp
assert inp["files"] == ["eval/fixtures/a.txt"], inp
sys.stdout.write(inp["prompt"] + " / " + os.environ.get("SETUP_VAR", "missing"))
"#;
    let pkg = package(&[("scripts/run.py", script)]);
    let env = BTreeMap::from([("SETUP_VAR".to_string(), "from-setup".to_string())]);
    let produced = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "scripts/run.py",
        &env,
        Duration::from_secs(10),
    )
    .await
    .expect("produced");
    assert_eq!(produced.output, "Say hello to {{who}} / from-setup");
    assert!(produced.tool_calls.is_none());
    assert!(!produced.truncated);
    assert_eq!(produced.details["exit_code"], json!(0));
}

#[tokio::test]
async fn command_runner_reads_tool_calls_from_a_json_transcript() {
    let script = r#"
import json
print(json.dumps({"output": "done", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}))
"#;
    let pkg = package(&[("scripts/agent.py", script)]);
    let produced = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "scripts/agent.py",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect("produced");
    assert_eq!(produced.output, "done");
    let calls = produced.tool_calls.expect("tool calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].name, "search");
    assert_eq!(calls[0].arguments, json!({"q": "x"}));
}

#[tokio::test]
async fn command_runner_runs_node_and_sh_scripts() {
    let pkg = package(&[
        (
            "run.js",
            "let d='';process.stdin.on('data',c=>d+=c).on('end',()=>process.stdout.write(JSON.parse(d).prompt.toUpperCase()));\n",
        ),
        ("run.sh", "echo shell-output\n"),
    ]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let produced = produce(
        &pkg,
        sandbox.clone(),
        "run.js",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect("node");
    assert_eq!(produced.output, "SAY HELLO TO {{WHO}}");
    let produced = produce(
        &pkg,
        sandbox,
        "run.sh",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect("sh");
    // The trailing newline of stdout is dropped, as shell command substitution does.
    assert_eq!(produced.output, "shell-output");
}

#[tokio::test]
async fn command_runner_turns_a_non_zero_exit_into_a_permanent_fault_with_stderr() {
    let script =
        "import sys\nsys.stderr.write('x' * 5000 + '\\nboom: bad input\\n')\nsys.exit(3)\n";
    let pkg = package(&[("fail.py", script)]);
    let fault = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "fail.py",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect_err("must fail");
    let Fault::Permanent { message } = &fault else {
        panic!("expected a permanent fault, got {fault:?}");
    };
    assert!(message.contains("exit code 3"), "{message}");
    assert!(message.contains("boom: bad input"), "{message}");
    assert!(
        message.len() < 2300,
        "the stderr tail is not capped: {} bytes",
        message.len()
    );
}

#[tokio::test]
async fn command_runner_reports_a_timeout() {
    let pkg = package(&[("hang.py", "import time\ntime.sleep(300)\n")]);
    let start = Instant::now();
    let fault = produce(
        &pkg,
        bwrap_sandbox(SandboxPolicy::default()),
        "hang.py",
        &BTreeMap::new(),
        Duration::from_millis(800),
    )
    .await
    .expect_err("must time out");
    assert_eq!(fault, Fault::Timeout { timeout_ms: 800 });
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn command_runner_flags_truncated_output() {
    let pkg = package(&[(
        "flood.py",
        "import sys\nwhile True:\n    sys.stdout.write('z' * 65536)\n",
    )]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_output_bytes: 10_000,
        ..SandboxPolicy::default()
    });
    let produced = produce(
        &pkg,
        sandbox,
        "flood.py",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect("truncated output is still an output");
    assert!(produced.truncated);
    assert_eq!(produced.output.len(), 10_000);
    assert_eq!(produced.details["truncated"], json!(true));
    assert_eq!(produced.details["limit_bytes"], json!(10_000));
}

#[tokio::test]
async fn command_runner_rejects_bad_scripts_before_running_anything() {
    let pkg = package(&[("run.rb", "puts 1\n"), ("ok.py", "print(1)\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    for (script, expect) in [
        ("../ok.py", ".."),
        ("/etc/ok.py", "absolute"),
        ("run.rb", ".py"),
        ("missing.py", "does not exist"),
    ] {
        let fault = produce(
            &pkg,
            sandbox.clone(),
            script,
            &BTreeMap::new(),
            Duration::from_secs(5),
        )
        .await
        .expect_err(script);
        let Fault::Permanent { message } = &fault else {
            panic!("{script}: expected a permanent fault, got {fault:?}");
        };
        assert!(message.contains(expect), "{script}: {message}");
    }
}

#[tokio::test]
async fn command_runner_without_a_sandbox_is_a_fault_of_the_host() {
    let pkg = package(&[("ok.py", "print(1)\n")]);
    let sandbox = Sandbox::with_bwrap_path(SandboxPolicy::default(), None);
    let fault = produce(
        &pkg,
        sandbox,
        "ok.py",
        &BTreeMap::new(),
        Duration::from_secs(5),
    )
    .await
    .expect_err("refused");
    let Fault::Host { message } = &fault else {
        panic!("expected a fault of the host, got {fault:?}");
    };
    assert!(message.contains("bubblewrap"), "{message}");
    assert!(fault.is_transient(), "another worker may have a sandbox");
}

// ---------------------------------------------------------------------------------------------
// Whose fault: the sandbox's machinery or the skill's code
// ---------------------------------------------------------------------------------------------

/// A stand-in for bubblewrap that is the real one, except that while `<dir>/broken` exists
/// it starts the real one with a process limit of 1 for its uid, so that bubblewrap's own
/// `clone` fails with EAGAIN exactly as on a uid already at its limit.
fn limited_bwrap() -> (TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let real = ["/usr/bin/bwrap", "/bin/bwrap"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("bubblewrap is installed");
    let path = dir.path().join("bwrap");
    let script = format!(
        "#!/bin/sh\nif [ -e '{dir}/broken' ]; then exec prlimit --nproc=1 -- {real} \"$@\"; fi\nexec {real} \"$@\"\n",
        dir = dir.path().display()
    );
    std::fs::write(&path, script).expect("write the stand-in");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    (dir, path)
}

#[tokio::test]
async fn a_sandbox_that_cannot_fork_before_the_program_is_a_machinery_error_and_a_host_fault() {
    let (dir, bwrap) = limited_bwrap();
    let sandbox = Sandbox::with_bwrap_path(SandboxPolicy::default(), Some(bwrap));
    assert_eq!(
        sandbox.mode(),
        SandboxMode::Bubblewrap,
        "{:?}",
        sandbox.unavailable_reason()
    );
    let pkg = package(&[("ok.sh", "echo fine\n")]);
    std::fs::write(dir.path().join("broken"), "").expect("break it");
    let err = sandbox
        .run(request(&pkg, &["sh", "ok.sh"], Duration::from_secs(10)))
        .await
        .expect_err("bubblewrap cannot fork");
    let SandboxError::Machinery { diagnostics, .. } = &err else {
        panic!("expected a machinery error, got {err:?}");
    };
    assert!(
        diagnostics.contains("bwrap") && diagnostics.contains("Resource temporarily unavailable"),
        "{diagnostics}"
    );
    let fault = produce(
        &pkg,
        sandbox.clone(),
        "ok.sh",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .await
    .expect_err("still broken");
    assert!(fault.is_host(), "{fault:?}");
    assert!(fault.to_string().contains("not the skill's"), "{fault}");
    assert!(sandbox.probe().await.is_err(), "the probe sees it too");

    std::fs::remove_file(dir.path().join("broken")).expect("repair it");
    assert_eq!(sandbox.probe().await, Ok(()));
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "ok.sh"], Duration::from_secs(10)),
    )
    .await;
    assert!(out.started);
    assert_eq!(stdout(&out).trim(), "fine");
    assert!(
        !stderr(&out).contains("skilleval-sandbox"),
        "the start marker is not shown: {}",
        stderr(&out)
    );
}

#[tokio::test]
async fn a_skill_that_fork_bombs_itself_fails_as_its_own_fault_with_its_reason() {
    // The classic shell fork bomb, bounded so a broken limit cannot take the host down.
    let script = "cat > /dev/null\nbomb() { bomb | bomb & }\nbomb\nsleep 2\nexit 1\n";
    let pkg = package(&[("bomb.sh", script)]);
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_processes: 32,
        ..SandboxPolicy::default()
    });
    let fault = produce(
        &pkg,
        sandbox,
        "bomb.sh",
        &BTreeMap::new(),
        Duration::from_secs(20),
    )
    .await
    .expect_err("a fork bomb does not produce an output");
    let Fault::Permanent { message } = &fault else {
        panic!("the skill's own fork bomb is the skill's fault, got {fault:?}");
    };
    assert!(
        message.contains("Cannot fork") || message.contains("Resource temporarily unavailable"),
        "the reason is the process limit: {message}"
    );
}

#[tokio::test]
async fn a_program_that_exits_at_once_is_still_started() {
    // The skill's program failing straight away is the skill's, even with nothing on stderr.
    let pkg = package(&[("quit.sh", "exit 7\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "quit.sh"], Duration::from_secs(10)),
    )
    .await;
    assert!(out.started);
    assert_eq!(out.exit_code, Some(7));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
}

#[test]
fn describe_shows_the_full_command_line() {
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let req = SandboxRequest {
        argv: vec!["python3".into(), "scripts/run.py".into()],
        package_root: "/pkg".into(),
        stdin: Vec::new(),
        timeout: Duration::from_secs(1),
        env: BTreeMap::new(),
    };
    let line = sandbox.describe(&req).expect("describe");
    println!("{line}");
    for part in [
        "prlimit --as=",
        "--nproc=64",
        "bwrap --unshare-all",
        "--ro-bind /pkg /skill",
        "--clearenv",
        "--chdir /skill",
    ] {
        assert!(line.contains(part), "missing {part}: {line}");
    }
}
