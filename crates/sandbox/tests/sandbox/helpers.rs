//! What the sandbox's tests share: packages laid out as loaders extract them, sandboxes in
//! each mode, requests, and a look at the host's processes from outside the sandbox.

use std::time::{Duration, Instant};

pub use skilleval_sandbox::fixtures::*;

/// Host processes whose command line contains `marker`, polled until none are left, without
/// blocking the runtime (cleanup of a dropped run is a task on it). What is still there after
/// 30 s is returned: that deadline only guards against a hang.
pub async fn survivors(marker: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = survivors_now(marker);
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Host processes whose command line contains `marker`, right now.
pub fn survivors_now(marker: &str) -> Vec<String> {
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

pub fn marker() -> String {
    format!("skilleval-marker-{}", uuid::Uuid::new_v4().simple())
}

pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}
