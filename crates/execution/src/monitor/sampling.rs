//! Deterministic, nested sampling: whether a sample is graded is decided from a hash of
//! (monitor identity, `sample_id`) alone.
//!
//! The hash maps each sample to a fixed point `u` in [0, 1); the sample is taken when
//! `u < sample_rate`. So a retried batch takes exactly the same items (no state, no
//! randomness), and raising the rate from 0.1 to 0.2 keeps every item 0.1 took and adds
//! others (the samples are nested), which keeps a quality series comparable across a rate
//! change. The identity is the monitor's (in the service: the skill's monitor id), not its
//! revision, so editing the criteria does not reshuffle which traffic is graded.

use sha2::{Digest, Sha256};

/// The sample's fixed point in [0, 1): the first 53 bits of SHA-256(identity, sample_id),
/// length-prefixed so no two (identity, id) pairs hash the same bytes.
pub fn sample_point(monitor_identity: &str, sample_id: &str) -> f64 {
    let mut h = Sha256::new();
    for part in [monitor_identity, sample_id] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // 53 bits: every value is exactly representable, and the result is < 1.
    (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64
}

/// Whether the sample is graded at `sample_rate` (0 takes nothing, 1 everything).
pub fn is_sampled(monitor_identity: &str, sample_id: &str, sample_rate: f64) -> bool {
    sample_point(monitor_identity, sample_id) < sample_rate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("req-{i:06}")).collect()
    }

    #[test]
    fn a_retried_batch_samples_the_same_items() {
        let batch = ids(5_000);
        let first: Vec<&String> = batch
            .iter()
            .filter(|id| is_sampled("skill-a", id, 0.1))
            .collect();
        let again: Vec<&String> = batch
            .iter()
            .filter(|id| is_sampled("skill-a", id, 0.1))
            .collect();
        assert_eq!(first, again);
        // Near the rate: 5,000 draws at 0.1 have a standard deviation of ~21 items.
        assert!((400..=600).contains(&first.len()), "{}", first.len());
        // Another monitor samples other items.
        let other: Vec<&String> = batch
            .iter()
            .filter(|id| is_sampled("skill-b", id, 0.1))
            .collect();
        assert_ne!(first, other);
    }

    #[test]
    fn raising_the_rate_keeps_the_earlier_samples() {
        let batch = ids(5_000);
        let low: Vec<&String> = batch
            .iter()
            .filter(|id| is_sampled("m", id, 0.05))
            .collect();
        let high: Vec<&String> = batch.iter().filter(|id| is_sampled("m", id, 0.2)).collect();
        assert!(low.iter().all(|id| high.contains(id)));
        assert!(high.len() > 2 * low.len());
        assert!(batch.iter().all(|id| !is_sampled("m", id, 0.0)));
        assert!(batch.iter().all(|id| is_sampled("m", id, 1.0)));
        assert!(batch
            .iter()
            .all(|id| (0.0..1.0).contains(&sample_point("m", id))));
    }
}
