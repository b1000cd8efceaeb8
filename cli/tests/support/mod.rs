//! Helpers shared by the CLI's test binaries: copies of the example skills as a fresh clone
//! has them.
#![allow(clippy::unwrap_used, dead_code)] // Test helpers: a failed setup should panic.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Files a local `skilleval run` writes into a skill's `eval/` folder (ignored by git): a copy
/// of an example starts as a fresh clone has it.
const LOCAL_RUN_FILES: [&str; 2] = ["benchmark.json", "version-history.json"];

pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/skills")
}

/// Copies a skill folder, leaving out its `runs/` folders and the files local runs write.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "runs" {
                copy_dir(&entry.path(), &target);
            }
        } else if !LOCAL_RUN_FILES.iter().any(|f| entry.file_name() == *f) {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A copy of an example skill in a temp dir (world-readable, as the sandbox needs).
pub fn example_copy(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join(name);
    copy_dir(&examples().join(name), &root);
    let _ = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir.path())
        .status();
    (dir, root)
}

/// Serves `router` on a free port of 127.0.0.1 from a thread of its own (the CLI under test
/// runs as a child process, so the server outlives each test's own runtime); returns its
/// address.
pub fn serve_on_thread(router: axum::Router) -> std::net::SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let _ = axum::serve(listener, router).await;
        });
    });
    rx.recv().unwrap()
}
