//! The policy's limits, each met by a script that goes past it: the wall-clock timeout, the
//! output cap, the process, memory, CPU-time, file-size and `/tmp` limits.

use std::time::{Duration, Instant};

use skilleval_sandbox::SandboxPolicy;

use crate::helpers::{
    bwrap_sandbox, marker, package, request, run, stderr, stdout, survivors, unsandboxed, NEVER,
};

#[tokio::test]
async fn a_script_that_sleeps_forever_is_killed_at_its_timeout() {
    let pkg = package(&[("sleep.py", "import time\nwhile True:\n    time.sleep(60)\n")]);
    let sandbox = bwrap_sandbox(SandboxPolicy::default());
    let mark = marker();
    let start = Instant::now();
    // Only its timeout ends it (`run` fails a run that never ends at the hang guard).
    let out = run(
        &sandbox,
        request(
            &pkg,
            &["python3", "sleep.py", &mark],
            Duration::from_secs(1),
        ),
    )
    .await;
    let elapsed = start.elapsed();
    assert!(out.timed_out, "not flagged as timed out: {out:?}");
    assert_eq!(out.exit_code, None, "killed by the sandbox");
    // A lower bound: a loaded machine only makes it truer.
    assert!(
        elapsed >= Duration::from_secs(1),
        "returned before the timeout: {elapsed:?}"
    );
    let left = survivors(&mark).await;
    assert!(left.is_empty(), "the script outlived its timeout: {left:?}");
}

#[tokio::test]
async fn an_unsandboxed_run_is_still_killed_at_its_timeout() {
    let pkg = package(&[(
        "sleep.sh",
        "python3 -c 'import time; time.sleep(300)' \"$1\"\n",
    )]);
    let sandbox = unsandboxed();
    let mark = marker();
    // Only its timeout ends it (`run` fails a run that never ends at the hang guard).
    let out = run(
        &sandbox,
        request(&pkg, &["sh", "sleep.sh", &mark], Duration::from_secs(1)),
    )
    .await;
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None, "killed by the sandbox");
    let left = survivors(&mark).await;
    assert!(left.is_empty(), "the script outlived its timeout: {left:?}");
}

#[tokio::test]
async fn a_flood_of_output_is_cut_at_the_limit_and_flagged() {
    let pkg = package(&[(
        "flood.py",
        "import sys\nchunk = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
    )]);
    let limit = 1 << 20;
    let sandbox = bwrap_sandbox(SandboxPolicy {
        max_output_bytes: limit,
        ..SandboxPolicy::default()
    });
    let mark = marker();
    // Its timeout is never reached: only the cut ends it before the hang guard.
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "flood.py", &mark], NEVER),
    )
    .await;
    assert!(out.stdout_truncated, "not flagged");
    assert_eq!(out.stdout.len(), limit);
    assert!(!out.timed_out, "ran to its timeout instead of being cut");
    assert_eq!(out.exit_code, None, "killed by the sandbox");
    let left = survivors(&mark).await;
    assert!(left.is_empty(), "the flood outlived its cut: {left:?}");
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
async fn a_fork_bomb_is_stopped_by_the_process_limit() {
    let script = r#"
import errno, os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(600)
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
    let mark = marker();
    // Its timeout is never reached: the children (asleep for 600 s) holding its output would
    // keep the run past the hang guard, were they not killed once the script has exited.
    let out = run(
        &sandbox,
        request(&pkg, &["python3", "bomb.py", &mark], NEVER),
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
    assert!(!out.timed_out, "{out:?}");
    let left = survivors(&mark).await;
    assert!(left.is_empty(), "forked children survived: {left:?}");
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
    // Its timeout is never reached: only the CPU limit ends it before the hang guard.
    let out = run(&sandbox, request(&pkg, &["python3", "spin.py"], NEVER)).await;
    assert!(!out.timed_out);
    // SIGXCPU (24) at the soft limit, SIGKILL (9) at the hard one; bwrap reports 128 + N.
    assert!(
        matches!(out.exit_code, Some(152) | Some(137)),
        "exit {:?}",
        out.exit_code
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
