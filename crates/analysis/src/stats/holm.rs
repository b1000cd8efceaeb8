//! Holm's step-down correction: several criteria compared at once, one family-wise error rate.
//!
//! Comparing six rubric criteria at 5 % each finds a "significant" change by chance in about a
//! quarter of comparisons of identical skills. Holm (1979) controls the chance of any false
//! finding at α while rejecting at least as much as Bonferroni: sort the p-values, multiply the
//! i-th smallest by `m − i`, and keep the adjusted values non-decreasing.

/// Holm-adjusted p-values, in the order given (compare each with α). NaN counts as 1.
pub fn holm_adjust(p_values: &[f64]) -> Vec<f64> {
    let m = p_values.len();
    let clean = |p: f64| if p.is_nan() { 1.0 } else { p.clamp(0.0, 1.0) };
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|a, b| clean(p_values[*a]).total_cmp(&clean(p_values[*b])));
    let mut adjusted = vec![1.0; m];
    let mut running = 0.0f64;
    for (rank, &i) in order.iter().enumerate() {
        let p = (clean(p_values[i]) * (m - rank) as f64).min(1.0);
        running = running.max(p);
        adjusted[i] = running;
    }
    adjusted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textbook_example() {
        // Four hypotheses with p = 0.01, 0.04, 0.03, 0.005 (the example in Holm's Wikipedia
        // article, and R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") = 0.03 0.06 0.06 0.02).
        // Sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max(0.06, 0.04).
        let adj = holm_adjust(&[0.01, 0.04, 0.03, 0.005]);
        let want = [0.03, 0.06, 0.06, 0.02];
        for (a, w) in adj.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adj:?}");
        }
        // At α = 0.05 the two smallest are rejected; 0.03 is not (0.03 x 2 = 0.06).
        assert_eq!(adj.iter().filter(|p| **p < 0.05).count(), 2);
    }

    #[test]
    fn caps_at_one_and_handles_edges() {
        assert!(holm_adjust(&[]).is_empty());
        assert_eq!(holm_adjust(&[0.2]), vec![0.2]);
        assert_eq!(holm_adjust(&[0.6, 0.7]), vec![1.0, 1.0]);
        assert_eq!(holm_adjust(&[f64::NAN, 0.01]), vec![1.0, 0.02]);
    }
}
