//! Whether this worker can sandbox, and so whether it takes jobs.
//!
//! A worker whose sandbox does not work fails every job it takes, and each failure burns one
//! of the job's retries. So the gate closes in two cases: at start, when the sandbox refuses
//! to run anything (no usable bubblewrap and unsandboxed runs not allowed); and while running,
//! when `worker.host_fault_threshold` jobs within `worker.host_fault_window_secs` met a fault
//! of the host (the sandbox failing before a skill's code ran, see
//! [`skilleval_sandbox`]). While it is closed, `/readyz` answers 503 with the reason, the
//! consume loop has no consumers (the broker gives the jobs to other workers), and the sandbox
//! is probed every `worker.sandbox_probe_interval_ms`; the first probe that passes opens it
//! again and the consumers come back. Each closing is logged once, with its reason.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skilleval_infra::config::WorkerSettings;
use skilleval_sandbox::{Sandbox, SandboxMode};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
pub struct SandboxGate {
    sandbox: Arc<Sandbox>,
    threshold: usize,
    window: Duration,
    probe_interval: Duration,
    /// When recent host faults happened (within `window`).
    faults: Mutex<VecDeque<Instant>>,
    /// `Some(reason)` while closed.
    closed: watch::Sender<Option<String>>,
}

impl SandboxGate {
    /// A gate for `sandbox`, closed at once when it refuses to run anything.
    pub fn new(sandbox: Arc<Sandbox>, settings: &WorkerSettings) -> SandboxGate {
        let gate = SandboxGate {
            threshold: usize::try_from(settings.host_fault_threshold.max(1)).unwrap_or(1),
            window: Duration::from_secs(settings.host_fault_window_secs.max(1)),
            probe_interval: Duration::from_millis(settings.sandbox_probe_interval_ms.max(10)),
            faults: Mutex::new(VecDeque::new()),
            closed: watch::Sender::new(None),
            sandbox,
        };
        if gate.sandbox.mode() == SandboxMode::Refusing {
            let why = gate
                .sandbox
                .unavailable_reason()
                .unwrap_or_else(|| "bubblewrap is not usable".to_string());
            gate.close(format!(
                "no working sandbox: {why}; install bubblewrap (Debian: `apt-get install bubblewrap`) or set sandbox.allow_unsandboxed"
            ));
        } else {
            tracing::info!(
                mode = %gate.sandbox.mode(),
                identity = %gate.sandbox.identity(),
                "sandbox ready"
            );
        }
        gate
    }

    /// Why the worker takes no jobs, while it does not.
    pub fn reason(&self) -> Option<String> {
        self.closed.borrow().clone()
    }

    /// A job met a fault of the host; closes the gate when there were too many lately.
    pub fn host_fault(&self, message: &str) {
        let now = Instant::now();
        let recent = {
            let mut faults = self
                .faults
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            faults.push_back(now);
            while faults
                .front()
                .is_some_and(|t| now.duration_since(*t) > self.window)
            {
                faults.pop_front();
            }
            if faults.len() < self.threshold {
                return;
            }
            let n = faults.len();
            faults.clear();
            n
        };
        if self.reason().is_none() {
            self.close(format!(
                "the sandbox failed {recent} times within {}s before the skill's code ran; the last: {message}",
                self.window.as_secs()
            ));
        }
    }

    fn close(&self, reason: String) {
        tracing::error!(%reason, "not taking jobs until the sandbox works again");
        self.closed.send_replace(Some(reason));
    }

    /// Resolves once the gate is closed (at once if it is).
    pub async fn wait_closed(&self) {
        let mut rx = self.closed.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while we are borrowed.
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Probes the sandbox until a probe passes (the gate opens: `true`) or `shutdown`
    /// (`false`). Returns `true` at once when the gate is open.
    pub async fn reopen(&self, shutdown: &CancellationToken) -> bool {
        let mut failures = 0u32;
        loop {
            if self.reason().is_none() {
                return true;
            }
            match self.sandbox.probe().await {
                Ok(()) => {
                    tracing::info!(
                        identity = %self.sandbox.identity(),
                        "sandbox probe passed: taking jobs again"
                    );
                    self.closed.send_replace(None);
                    return true;
                }
                Err(problem) => {
                    failures += 1;
                    // Once in a while, not at every probe: the closing was logged already.
                    if failures.is_power_of_two() {
                        tracing::warn!(%problem, failures, "sandbox probe failed");
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(self.probe_interval) => {}
            }
        }
    }
}
