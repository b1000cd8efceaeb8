//! Nothing of a run survives it: children, daemons that left its process group, and the
//! processes of a run its caller abandoned.

use std::time::{Duration, Instant};

use skilleval_sandbox::{Sandbox, SandboxPolicy};

use crate::helpers::{
    bwrap_sandbox, marker, package, request, run, stderr, stdout, survivors, survivors_now,
    unsandboxed, HANG_GUARD, NEVER,
};

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
    // Its timeout is never reached: were the run held by a leftover child (which sleeps
    // 300 s), the hang guard in `run` would fail it first.
    let out = run(
        sandbox,
        request(&pkg, &["python3", "fork.py", &mark], NEVER),
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
        let deadline = Instant::now() + HANG_GUARD;
        while survivors_now(&daemon).is_empty() {
            assert!(
                Instant::now() < deadline,
                "hang guard: {:?}: the daemon had not started after {HANG_GUARD:?}",
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
