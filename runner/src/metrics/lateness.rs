//! Firing lateness in buckets: their bounds, the bucket of a lateness, and quantiles of merged
//! bucket counts (the dashboard's history).

/// Upper bounds of the firing-lateness buckets (ms).
pub(super) const LATENESS_MS: [f64; 13] = [
    0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 5000.0, 60000.0,
];
/// The lateness quantile (ms) of merged bucket counts (`counts[i]` for `LATENESS_MS[i]`, then
/// one for everything later), interpolated within its bucket; None without samples. With the
/// buckets' sums of lateness (`sums`, 0 where unknown), the estimate is kept where the samples
/// of its bucket can be: none above `sum − (n−1)·low`, none below `sum − (n−1)·high`. So a
/// single task 1.02 s late is 1,020 ms, not a point interpolated inside the 1–5 s bucket.
pub fn lateness_quantile(counts: &[u64], sums: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let want = (q * total as f64).max(1.0);
    let mut seen = 0.0;
    for (i, c) in counts.iter().enumerate() {
        let c = *c as f64;
        if c > 0.0 && seen + c >= want {
            let lo = if i == 0 { 0.0 } else { LATENESS_MS[i - 1] };
            let hi = LATENESS_MS
                .get(i)
                .copied()
                .unwrap_or(LATENESS_MS[LATENESS_MS.len() - 1]);
            let mut q = lo + (hi - lo) * ((want - seen) / c);
            if let Some(sum) = sums.get(i).map(|s| *s as f64).filter(|s| *s > 0.0) {
                let most = sum - (c - 1.0) * lo;
                let least = if i < LATENESS_MS.len() {
                    sum - (c - 1.0) * hi
                } else {
                    0.0 // the open bucket past the last bound
                };
                q = q.min(most).max(least);
            }
            return Some(q);
        }
        seen += c;
    }
    Some(LATENESS_MS[LATENESS_MS.len() - 1])
}

/// How many lateness buckets the history keeps (`LATENESS_MS` and one beyond).
pub const LATENESS_BUCKETS: usize = LATENESS_MS.len() + 1;

/// The bucket of a lateness (ms): the first whose bound it does not exceed, or the last one.
pub(super) fn bucket_of(lateness_ms: i64) -> usize {
    LATENESS_MS
        .iter()
        .position(|b| lateness_ms as f64 <= *b)
        .unwrap_or(LATENESS_MS.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_quantiles_interpolate_within_a_bucket() {
        let mut counts = [0u64; LATENESS_BUCKETS];
        assert_eq!(lateness_quantile(&counts, &[], 0.5), None);
        counts[3] = 100; // (2, 5] ms
        assert_eq!(lateness_quantile(&counts, &[], 0.5), Some(3.5));
        counts[LATENESS_BUCKETS - 1] = 100; // beyond the last bound
        assert_eq!(lateness_quantile(&counts, &[], 0.99), Some(60000.0));
    }

    #[test]
    fn lateness_quantiles_stay_where_the_samples_can_be() {
        // one task 1.02 s late: not 4,960 ms interpolated inside (1 s, 5 s]
        let mut counts = [0u64; LATENESS_BUCKETS];
        let mut sums = [0u64; LATENESS_BUCKETS];
        counts[11] = 1;
        sums[11] = 1020;
        assert_eq!(lateness_quantile(&counts, &sums, 0.99), Some(1020.0));
        assert_eq!(lateness_quantile(&counts, &sums, 0.5), Some(1020.0));
        // two, at 1.02 and 1.03 s: at most 2,050 − 1,000
        counts[11] = 2;
        sums[11] = 2050;
        assert_eq!(lateness_quantile(&counts, &sums, 0.99), Some(1050.0));
        // many spread over the bucket: the interpolation stands
        counts[3] = 100;
        sums[3] = 350;
        counts[11] = 0;
        sums[11] = 0;
        assert_eq!(lateness_quantile(&counts, &sums, 0.5), Some(3.5));
        // all near the top of the bucket: not below what their sum allows
        sums[3] = 498;
        assert_eq!(
            lateness_quantile(&counts, &sums, 0.01),
            Some(498.0 - 99.0 * 5.0)
        );
    }
}
