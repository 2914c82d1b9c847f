//! Latency percentiles: every sample is kept and sorted (exact nearest-rank
//! percentiles; a run of minutes at a few hundred requests/s is small).

use std::time::Duration;

#[derive(Debug, Clone, Default)]
pub struct Latencies {
    micros: Vec<u64>,
    sorted: bool,
}

impl Latencies {
    pub fn record(&mut self, d: Duration) {
        self.micros.push(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self.sorted = false;
    }

    pub fn merge(&mut self, other: Latencies) {
        self.micros.extend(other.micros);
        self.sorted = false;
    }

    pub fn len(&self) -> usize {
        self.micros.len()
    }

    pub fn is_empty(&self) -> bool {
        self.micros.is_empty()
    }

    /// The nearest-rank `p`-th percentile (0 < p <= 100); `None` without samples.
    pub fn percentile(&mut self, p: f64) -> Option<Duration> {
        if self.micros.is_empty() {
            return None;
        }
        if !self.sorted {
            self.micros.sort_unstable();
            self.sorted = true;
        }
        let rank = ((p / 100.0) * self.micros.len() as f64).ceil() as usize;
        let idx = rank.clamp(1, self.micros.len()) - 1;
        Some(Duration::from_micros(self.micros[idx]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut l = Latencies::default();
        assert_eq!(l.percentile(50.0), None);
        for ms in (1..=100).rev() {
            l.record(Duration::from_millis(ms));
        }
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(50)));
        assert_eq!(l.percentile(95.0), Some(Duration::from_millis(95)));
        assert_eq!(l.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(l.percentile(100.0), Some(Duration::from_millis(100)));
        let mut one = Latencies::default();
        one.record(Duration::from_millis(7));
        l.merge(one);
        assert_eq!(l.len(), 101);
        assert_eq!(l.percentile(0.5), Some(Duration::from_millis(1)));
    }
}
