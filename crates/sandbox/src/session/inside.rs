//! A session's processes as the host sees them: bubblewrap's init, the session's loop, and the
//! pid namespace they share. A call's time limit is enforced from here, by killing every other
//! process of that namespace.

use std::path::PathBuf;
use std::time::Duration;

use crate::lease::proc_entries;

/// Bubblewrap's init (pid 1 of the sandbox's pid namespace, pinned by a pidfd), the session's
/// loop, and the namespace's identity (the `/proc/PID/ns/pid` link).
pub(super) struct Inside {
    pub(super) init: u32,
    pub(super) init_fd: std::os::fd::OwnedFd,
    driver: u32,
    pid_ns: PathBuf,
}

impl Inside {
    /// Finds them from bubblewrap's (host) pid.
    pub(super) fn find(bwrap: u32) -> std::io::Result<Inside> {
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
    pub(super) fn kill_commands(&self) -> usize {
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
