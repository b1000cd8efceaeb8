//! What a sandboxed script cannot reach: the host's network, files outside its private
//! `/tmp`, the package (read-only), the parent's environment; and what it can (its
//! interpreters, its stdin).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use skilleval_sandbox::SandboxPolicy;

use crate::helpers::{bwrap_sandbox, marker, package, request, run, stderr, stdout, unsandboxed};

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
