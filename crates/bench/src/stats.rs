//! Summaries of measured latencies: median, percentiles and throughput.

use std::time::Duration;

/// What one benchmark row reports: how many operations, how long they took
/// in total, and the latency distribution of one operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub wall: Duration,
    pub median: Duration,
    pub p99: Duration,
    pub max: Duration,
    /// Operations per second over the wall time (all clients together).
    pub ops_per_sec: f64,
}

impl Summary {
    /// Summarises `latencies` measured during `wall`; `None` when empty.
    pub fn new(mut latencies: Vec<Duration>, wall: Duration) -> Option<Self> {
        latencies.sort_unstable();
        let max = *latencies.last()?;
        Some(Summary {
            count: latencies.len(),
            wall,
            median: median(&latencies)?,
            p99: percentile(&latencies, 99.0)?,
            max,
            ops_per_sec: throughput(latencies.len(), wall),
        })
    }
}

/// The middle of sorted samples; the mean of the two middle ones when the
/// count is even.
pub fn median(sorted: &[Duration]) -> Option<Duration> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2),
    }
}

/// The nearest-rank percentile `p` (0 < p <= 100) of sorted samples: the
/// smallest sample with at least p% of the samples at or below it.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() || !(p > 0.0 && p <= 100.0) {
        return None;
    }
    // Rank in 1..=len; the float is small and positive, so the cast is exact enough.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Operations per second; 0 when no time passed.
pub fn throughput(count: usize, wall: Duration) -> f64 {
    let seconds = wall.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(values: &[u64]) -> Vec<Duration> {
        values.iter().map(|v| Duration::from_millis(*v)).collect()
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&ms(&[1, 2, 9])), Some(Duration::from_millis(2)));
        assert_eq!(median(&ms(&[1, 2, 4, 9])), Some(Duration::from_millis(3)));
        assert_eq!(median(&ms(&[7])), Some(Duration::from_millis(7)));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&samples, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(
            percentile(&samples, 100.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(percentile(&samples, 0.5), Some(Duration::from_millis(1)));
        // With few samples p99 is the largest one.
        assert_eq!(
            percentile(&ms(&[1, 2, 3]), 99.0),
            Some(Duration::from_millis(3))
        );
        assert_eq!(percentile(&samples, 0.0), None);
        assert_eq!(percentile(&samples, 101.0), None);
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn throughput_counts_per_second_of_wall_time() {
        assert_eq!(throughput(500, Duration::from_millis(250)), 2000.0);
        assert_eq!(throughput(5, Duration::ZERO), 0.0);
    }

    #[test]
    fn summary_sorts_its_samples() {
        let summary = Summary::new(ms(&[9, 1, 5, 3, 7]), Duration::from_secs(1)).unwrap();
        assert_eq!(summary.count, 5);
        assert_eq!(summary.median, Duration::from_millis(5));
        assert_eq!(summary.p99, Duration::from_millis(9));
        assert_eq!(summary.max, Duration::from_millis(9));
        assert_eq!(summary.ops_per_sec, 5.0);
        assert_eq!(Summary::new(Vec::new(), Duration::from_secs(1)), None);
    }
}
