//! Making sure nothing of a run survives it: its process group is killed and its private uid
//! swept (`kill -KILL -1` as that uid, which also catches daemons that left the group) when
//! the run ends, and when the future running it is dropped mid-run (the executor's own
//! timeout), since [`Reaper`] does the same on drop.

use std::ffi::OsString;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;

use crate::lease::UidLease;

/// Kills a run's process group and sweeps its uid; on drop too, so an abandoned run is cleaned.
///
/// It holds the run's uid lease: the uid goes back to the pool only after the sweep, so a
/// sweep can never hit the next run that leases the same uid.
pub(crate) struct Reaper {
    pgid: Option<Pid>,
    sweep: Option<Vec<OsString>>,
    lease: Option<UidLease>,
    armed: bool,
}

impl Reaper {
    /// Armed for the group `pgid` (the run's first process leads it), sweeping with `sweep`
    /// (see [`crate::host::Host::sweep_command`]) and holding `lease` until it is done.
    pub(crate) fn new(
        pgid: Option<Pid>,
        sweep: Option<Vec<OsString>>,
        lease: Option<UidLease>,
    ) -> Reaper {
        Reaper {
            pgid,
            sweep,
            lease,
            armed: true,
        }
    }

    pub(crate) async fn kill(&self) {
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
    pub(crate) async fn finish(&mut self) {
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
