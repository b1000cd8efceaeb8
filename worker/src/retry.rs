//! When a transiently faulted job runs again.
//!
//! Delivery `n` that faulted waits `base * 2^(n-1)` (base: the smallest tier), capped at the
//! largest tier, with full jitter over the upper half, and never less than a provider's
//! `Retry-After`. The broker can only delay by whole tiers (one delay queue per TTL), so the
//! wait is rounded up to the smallest tier that covers it; jitter still spreads a burst of
//! failures across neighbouring tiers.

use std::time::Duration;

use skilleval_infra::topology::Topology;
use skilleval_model::grade::Fault;

/// The backoff after delivery `attempt` (1-based) faulted with `fault`.
pub fn backoff(topology: &Topology, attempt: u32, fault: &Fault) -> Duration {
    let tiers = topology.retry_tiers_ms();
    let base = tiers.first().copied().unwrap_or(1_000);
    let cap = tiers.last().copied().unwrap_or(base);
    let exp = base
        .saturating_mul(1u64 << attempt.saturating_sub(1).min(20))
        .min(cap);
    let jittered = Duration::from_millis(exp).mul_f64(0.5 + rand::random::<f64>() * 0.5);
    match fault.retry_after() {
        Some(asked) => jittered.max(asked),
        None => jittered,
    }
}

/// The delay queue tier the job goes to after delivery `attempt` faulted.
pub fn tier(topology: &Topology, attempt: u32, fault: &Fault) -> u64 {
    topology.tier_for(backoff(topology, attempt, fault))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo() -> Topology {
        Topology::new("t", vec![1_000, 5_000, 30_000], 10)
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let t = topo();
        let f = Fault::transient("x");
        for _ in 0..50 {
            let d1 = backoff(&t, 1, &f);
            assert!(
                d1 >= Duration::from_millis(500) && d1 <= Duration::from_millis(1_000),
                "{d1:?}"
            );
            let d3 = backoff(&t, 3, &f);
            assert!(
                d3 >= Duration::from_millis(2_000) && d3 <= Duration::from_millis(4_000),
                "{d3:?}"
            );
            assert!(backoff(&t, 30, &f) <= Duration::from_secs(30));
            assert_eq!(tier(&t, 1, &f), 1_000);
            assert_eq!(tier(&t, 3, &f), 5_000);
            assert_eq!(tier(&t, 9, &f), 30_000);
        }
    }

    #[test]
    fn retry_after_is_honoured() {
        let t = topo();
        let f = Fault::Transient {
            message: "429".into(),
            retry_after_ms: Some(12_000),
        };
        assert!(backoff(&t, 1, &f) >= Duration::from_secs(12));
        assert_eq!(tier(&t, 1, &f), 30_000);
    }
}
