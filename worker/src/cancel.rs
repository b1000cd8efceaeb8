//! Whether a run was cancelled, asked of the database at most once per TTL per run.
//!
//! Every job checks before it runs; a cancelled run's remaining jobs then finish as `skipped`
//! in milliseconds. A stopped run records no further result, and the coordinator writes its
//! unrecorded cases off as `skipped` itself, so a stale "not cancelled" answer costs at most
//! one needless execution whose result changes nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use skilleval_infra::store::Store;
use uuid::Uuid;

/// Runs remembered at most; past it the cache starts over (cheap to refill).
const CAPACITY: usize = 10_000;

#[derive(Debug)]
pub struct CancelCache {
    ttl: Duration,
    runs: Mutex<HashMap<Uuid, (bool, Instant)>>,
}

impl CancelCache {
    pub fn new(ttl: Duration) -> CancelCache {
        CancelCache {
            ttl,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the run was cancelled; a database error counts as "not cancelled" (the job
    /// runs, and recording its result is idempotent).
    pub async fn is_cancelled(&self, store: &Store, run_id: Uuid) -> bool {
        let now = Instant::now();
        if let Ok(runs) = self.runs.lock() {
            if let Some((cancelled, at)) = runs.get(&run_id) {
                if now.duration_since(*at) < self.ttl {
                    return *cancelled;
                }
            }
        }
        let cancelled = match store.is_cancelled(run_id).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%run_id, error = %e, "could not check whether the run was cancelled");
                return false;
            }
        };
        if let Ok(mut runs) = self.runs.lock() {
            if runs.len() >= CAPACITY {
                runs.clear();
            }
            runs.insert(run_id, (cancelled, now));
        }
        cancelled
    }
}
