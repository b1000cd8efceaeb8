//! How the sandbox runs on this host: refusing without bubblewrap unless allowed, refusing a
//! package its uid cannot read, telling a started program from a failed start, and the command
//! line it would spawn.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use skilleval_sandbox::{Sandbox, SandboxError, SandboxMode, SandboxPolicy, SandboxRequest};

use crate::helpers::{bwrap_sandbox, is_root, package, request, run, stderr, stdout, unsandboxed};

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
